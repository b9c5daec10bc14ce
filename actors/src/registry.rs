//! `ProxyRegistry`: keeps one supervised ProxyActor per existing Proxy,
//! driven by the object store's event stream.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use actix::prelude::*;
use egress_proxies::reconcile;
use egress_proxies::store::{ObjectKey, StoreEvent};

use crate::health_prober::HealthProber;
use crate::lease_store::LeaseStore;
use crate::messages::{GetRegistryStats, Reconcile, RegistryStats, Shutdown};
use crate::proxy_actor::{ProxyActor, Timing};

pub struct ProxyRegistry {
    ctx: reconcile::Context,
    timing: Timing,
    actors: HashMap<ObjectKey, Addr<ProxyActor>>,
    restarts: Arc<AtomicU64>,
    prober: Option<Addr<HealthProber>>,
    leases: Option<Addr<LeaseStore>>,
}

impl ProxyRegistry {
    /// Without a prober, proxies stop at Running (tests of the reconcile alone).
    pub fn new(ctx: reconcile::Context, timing: Timing, prober: Option<Addr<HealthProber>>) -> Self {
        Self {
            ctx,
            timing,
            actors: HashMap::new(),
            restarts: Arc::new(AtomicU64::new(0)),
            prober,
            leases: None,
        }
    }

    /// ProxyActors will keep this lease store informed.
    pub fn with_leases(mut self, leases: Addr<LeaseStore>) -> Self {
        self.leases = Some(leases);
        self
    }
}

impl ProxyRegistry {
    fn report_tree(&self) {
        crate::supervision::report_singleton(
            "proxy_registry",
            &format!("supervising {}", self.actors.len()),
            0,
        );
    }
}

impl Actor for ProxyRegistry {
    type Context = Context<Self>;

    fn stopped(&mut self, _: &mut Self::Context) {
        crate::supervision::stop_beating("proxy_registry");
    }

    fn started(&mut self, ctx: &mut Self::Context) {
        // In the tree from the start, then refreshed every second.
        self.report_tree();
        crate::supervision::beat_while_running::<Self>("proxy_registry", ctx);
        ctx.run_interval(std::time::Duration::from_secs(1), |registry, _| {
            registry.report_tree()
        });
    }
}

impl StreamHandler<StoreEvent> for ProxyRegistry {
    fn handle(&mut self, event: StoreEvent, _: &mut Self::Context) {
        match event {
            StoreEvent::Changed(key) => match self.actors.get(&key) {
                Some(actor) => actor.do_send(Reconcile),
                None => {
                    // Starting the actor reconciles once; no extra message needed.
                    let (k, ctx, timing, restarts, prober, leases) = (
                        key.clone(),
                        self.ctx.clone(),
                        self.timing,
                        self.restarts.clone(),
                        self.prober.clone(),
                        self.leases.clone(),
                    );
                    let addr =
                        Supervisor::start(move |_| ProxyActor::new(k, ctx, timing, restarts, prober, leases));
                    tracing::debug!(proxy = %key, "ProxyActor started");
                    self.actors.insert(key, addr);
                }
            },
            StoreEvent::Removed(key) => {
                if let Some(actor) = self.actors.remove(&key) {
                    // Dropping the last address after Shutdown keeps the supervisor from restarting it.
                    actor.do_send(Shutdown);
                    tracing::debug!(proxy = %key, "ProxyActor stopped");
                }
            }
        }
    }

    fn finished(&mut self, _: &mut Self::Context) {
        tracing::info!("object store event stream ended");
    }
}

impl Handler<GetRegistryStats> for ProxyRegistry {
    type Result = MessageResult<GetRegistryStats>;

    fn handle(&mut self, _: GetRegistryStats, _: &mut Self::Context) -> Self::Result {
        MessageResult(RegistryStats {
            actors: self.actors.len(),
            restarts: self.restarts.load(Ordering::Relaxed),
        })
    }
}
