//! `ProxyRegistry`: one supervised ProxyActor per existing Proxy, driven by
//! the object store's event stream (a [`KeyedRegistry`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use actix::prelude::*;
use egress_proxies::domain::reconcile;
use egress_proxies::domain::resource::ObjectKey;
use egress_proxies::domain::resource_store::StoreError;
use futures::future::BoxFuture;

use crate::health_prober::Probes;
use crate::keyed_registry::{KeyedRegistry, Kind};
use crate::lease_store_actor::LeaseStoreActor;
use crate::proxy_actor::{MAX_RUNNING_JOBS, ProxyActor, ProxyActorShared, Reconcile, Shutdown, Timing};

pub use crate::keyed_registry::{GetRegistryStats, RegistryStats, StoreChanged};

/// Proxies, each with its ProxyActor.
pub struct Proxies;

pub type ProxyRegistry = KeyedRegistry<Proxies>;

impl Kind for Proxies {
    type Member = ProxyActor;
    type Shared = Arc<ProxyActorShared>;
    const REGISTRY: &'static str = "proxy_registry";
    const MEMBER: &'static str = "proxy";

    fn member(key: ObjectKey, shared: Self::Shared) -> ProxyActor {
        ProxyActor::new(key, shared)
    }

    fn changed(member: &Addr<ProxyActor>) {
        member.do_send(Reconcile);
    }

    fn stop(member: Addr<ProxyActor>) {
        // Dropping the last address after Shutdown keeps the supervisor from restarting it.
        member.do_send(Shutdown);
    }

    fn keys(shared: &Self::Shared) -> BoxFuture<'static, Result<Vec<ObjectKey>, StoreError>> {
        let store = shared.ctx.store.clone();
        Box::pin(async move { store.keys().await })
    }

    fn restarts(shared: &Self::Shared) -> u64 {
        shared.restarts.load(Ordering::Relaxed)
    }
}

impl KeyedRegistry<Proxies> {
    /// Without a prober, proxies stop at Running (tests of the reconcile alone).
    pub fn new(ctx: reconcile::ReconcileContext, timing: Timing, prober: Option<Probes>) -> Self {
        Self::with_shared(Arc::new(ProxyActorShared {
            ctx,
            timing,
            restarts: Arc::new(AtomicU64::new(0)),
            prober,
            leases: None,
            slots: Arc::new(tokio::sync::Semaphore::new(MAX_RUNNING_JOBS)),
        }))
    }

    /// ProxyActors will keep this lease store informed.
    pub fn with_leases(self, leases: Addr<LeaseStoreActor>) -> Self {
        Self::with_shared(Arc::new(ProxyActorShared {
            leases: Some(leases),
            ..(**self.shared()).clone()
        }))
    }
}
