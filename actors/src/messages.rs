//! Typed messages between the actors.

use actix::Message;

/// Look at the proxy again now (its object changed, or a caller asks).
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "()")]
pub struct Reconcile;

/// The object is gone: stop for good.
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "()")]
pub struct Shutdown;

/// How many ProxyActors run, and how often they were restarted.
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "RegistryStats")]
pub struct GetRegistryStats;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RegistryStats {
    pub actors: usize,
    pub restarts: u64,
}
