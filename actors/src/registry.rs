//! `ProxyRegistry`: keeps one supervised ProxyActor per existing Proxy,
//! driven by the object store's event stream. The stream is pumped into the
//! registry's mailbox from outside the actor, so a restarted registry keeps
//! receiving it; after a restart it also checks its actors against the
//! store's keys, in case the crash swallowed an event.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use actix::prelude::*;
use egress_proxies::reconcile;
use egress_proxies::resource::ObjectKey;
use egress_proxies::store::StoreEvent;
use tokio::sync::mpsc::UnboundedReceiver;

use crate::health_prober::HealthProber;
use crate::lease_store::LeaseStore;
use crate::proxy_actor::{ProxyActor, ProxyActorShared, Reconcile, Shutdown, Timing};
use crate::supervision::{self, Node};

/// How long a restarted registry waits before asking the store again when
/// it could not list the Proxies.
const RESYNC_RETRY: Duration = Duration::from_secs(5);

pub struct ProxyRegistry {
    shared: Arc<ProxyActorShared>,
    actors: HashMap<ObjectKey, Addr<ProxyActor>>,
    /// Set by a restart: check the actors against the store once started.
    resync: bool,
}

/// One event of the object store's stream.
#[derive(Message, Debug, Clone)]
#[rtype(result = "()")]
pub struct StoreChanged(pub StoreEvent);

/// The store's keys, listed after a restart.
#[derive(Message)]
#[rtype(result = "()")]
struct Listed(Vec<ObjectKey>);

/// How many ProxyActors run, and how often they were restarted.
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "RegistryStats")]
pub struct GetRegistryStats;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RegistryStats {
    pub actors: usize,
    pub restarts: u64,
}

impl ProxyRegistry {
    /// Without a prober, proxies stop at Running (tests of the reconcile alone).
    pub fn new(ctx: reconcile::Context, timing: Timing, prober: Option<Addr<HealthProber>>) -> Self {
        Self {
            shared: Arc::new(ProxyActorShared {
                ctx,
                timing,
                restarts: Arc::new(AtomicU64::new(0)),
                prober,
                leases: None,
                slots: Arc::new(tokio::sync::Semaphore::new(crate::proxy_actor::MAX_RUNNING_JOBS)),
            }),
            actors: HashMap::new(),
            resync: false,
        }
    }

    /// ProxyActors will keep this lease store informed.
    pub fn with_leases(mut self, leases: Addr<LeaseStore>) -> Self {
        self.shared = Arc::new(ProxyActorShared {
            leases: Some(leases),
            ..(*self.shared).clone()
        });
        self
    }

    /// Starts the registry under its supervisor, fed by `events`.
    pub fn run(self, mut events: UnboundedReceiver<StoreEvent>) -> Addr<Self> {
        let registry = supervision::start(Node::singleton("proxy_registry"), |_| self);
        let mailbox = registry.clone();
        actix::spawn(async move {
            while let Some(event) = events.recv().await {
                mailbox.do_send(StoreChanged(event));
            }
            tracing::info!("object store event stream ended");
        });
        registry
    }

    fn report_tree(&self) {
        supervision::report_singleton("proxy_registry", &format!("supervising {}", self.actors.len()), 0);
    }

    fn start_actor(&mut self, key: ObjectKey) {
        // Starting the actor reconciles once; no extra message needed.
        let (k, shared) = (key.clone(), self.shared.clone());
        let node = Node::member("proxy", key.to_string(), "proxy_registry");
        let addr = supervision::start(node, move |_| ProxyActor::new(k, shared));
        tracing::debug!(proxy = %key, "ProxyActor started");
        self.actors.insert(key, addr);
    }

    fn stop_actor(&mut self, key: &ObjectKey) {
        if let Some(actor) = self.actors.remove(key) {
            // Dropping the last address after Shutdown keeps the supervisor from restarting it.
            actor.do_send(Shutdown);
            tracing::debug!(proxy = %key, "ProxyActor stopped");
        }
    }

    /// Lists the store's keys (after a restart), retrying until it answers.
    fn list_keys(&self, ctx: &mut Context<Self>) {
        let store = self.shared.ctx.store.clone();
        ctx.spawn(async move { store.keys().await }.into_actor(self).map(
            |listed, _, ctx| match listed {
                Ok(keys) => ctx.notify(Listed(keys)),
                Err(e) => {
                    tracing::warn!(error = %e, retryIn = ?RESYNC_RETRY, "restarted registry could not list the Proxies");
                    ctx.run_later(RESYNC_RETRY, |registry, ctx| registry.list_keys(ctx));
                }
            },
        ));
    }
}

impl Actor for ProxyRegistry {
    type Context = Context<Self>;

    fn stopped(&mut self, _: &mut Self::Context) {
        supervision::stop_beating("proxy_registry");
    }

    fn started(&mut self, ctx: &mut Self::Context) {
        // In the tree from the start, then refreshed every second.
        self.report_tree();
        supervision::beat_while_running::<Self>("proxy_registry", ctx);
        ctx.run_interval(Duration::from_secs(1), |registry, _| registry.report_tree());
        if std::mem::take(&mut self.resync) {
            self.list_keys(ctx);
        }
    }
}

impl actix::Supervised for ProxyRegistry {
    fn restarting(&mut self, _: &mut Self::Context) {
        // The actors it started run on (their addresses are kept); what a
        // crash may have cost is one event, which the store's keys restore.
        self.actors.retain(|_, actor| actor.connected());
        self.resync = true;
    }
}

impl Handler<StoreChanged> for ProxyRegistry {
    type Result = ();

    fn handle(&mut self, StoreChanged(event): StoreChanged, _: &mut Self::Context) {
        match event {
            StoreEvent::Changed(key) => match self.actors.get(&key) {
                Some(actor) => actor.do_send(Reconcile),
                None => self.start_actor(key),
            },
            StoreEvent::Removed(key) => self.stop_actor(&key),
        }
    }
}

impl Handler<Listed> for ProxyRegistry {
    type Result = ();

    fn handle(&mut self, Listed(keys): Listed, _: &mut Self::Context) {
        let stored: HashSet<ObjectKey> = keys.into_iter().collect();
        let gone: Vec<ObjectKey> = self
            .actors
            .keys()
            .filter(|k| !stored.contains(*k))
            .cloned()
            .collect();
        let (mut started, stopped) = (0, gone.len());
        for key in gone {
            self.stop_actor(&key);
        }
        for key in stored {
            if !self.actors.contains_key(&key) {
                self.start_actor(key);
                started += 1;
            }
        }
        tracing::info!(
            started,
            stopped,
            running = self.actors.len(),
            "restarted registry checked its actors against the store"
        );
    }
}

impl Handler<GetRegistryStats> for ProxyRegistry {
    type Result = MessageResult<GetRegistryStats>;

    fn handle(&mut self, _: GetRegistryStats, _: &mut Self::Context) -> Self::Result {
        MessageResult(RegistryStats {
            actors: self.actors.len(),
            restarts: self.shared.restarts.load(Ordering::Relaxed),
        })
    }
}
