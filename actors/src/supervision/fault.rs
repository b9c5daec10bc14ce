//! Fault injection for tests (cargo feature `fault-injection`, enabled only
//! by this crate's own tests): [`Crash`] makes an actor panic inside its
//! handler, as a bug would, so tests can show its supervisor restarting it
//! and the system recovering. The operator binary is built without it.

use actix::prelude::*;

/// Panic now, in the middle of whatever the actor has under way.
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "()")]
pub struct Crash;

macro_rules! crash_on_request {
    ($($actor:ty),+ $(,)?) => {$(
        impl Handler<Crash> for $actor {
            type Result = ();
            fn handle(&mut self, _: Crash, _: &mut Self::Context) {
                panic!("fault injection: {} told to crash", stringify!($actor));
            }
        }
    )+};
}

crash_on_request!(
    crate::proxy_registry::ProxyRegistry,
    crate::health_prober::HealthProber,
    crate::lease_store_actor::LeaseStoreActor,
    crate::gc_sweeper::GcSweeper,
    crate::proxy_actor::ProxyActor,
);
