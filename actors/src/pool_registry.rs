//! `PoolRegistry`: one supervised PoolActor per existing ProxyPool, driven
//! by the store's pool events. Like the ProxyRegistry, it is fed from
//! outside its mailbox, and after a restart checks its actors against the
//! store's pool keys.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use actix::prelude::*;
use egress_proxies::resource::ObjectKey;
use egress_proxies::store::StoreEvent;
use tokio::sync::mpsc::UnboundedReceiver;

use crate::pool_actor::{PoolActor, PoolContext, StopPool, Turn};
use crate::supervision::{self, Node};

/// How long a restarted registry waits before listing the pools again.
const RESYNC_RETRY: Duration = Duration::from_secs(5);

pub struct PoolRegistry {
    ctx: PoolContext,
    actors: HashMap<ObjectKey, Addr<PoolActor>>,
    resync: bool,
}

/// One event of the store's pool stream.
#[derive(Message, Debug, Clone)]
#[rtype(result = "()")]
pub struct PoolChanged(pub StoreEvent);

#[derive(Message)]
#[rtype(result = "()")]
struct Listed(Vec<ObjectKey>);

/// How many PoolActors run.
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "usize")]
pub struct CountPools;

impl PoolRegistry {
    pub fn new(ctx: PoolContext) -> Self {
        Self {
            ctx,
            actors: HashMap::new(),
            resync: false,
        }
    }

    /// Starts the registry under its supervisor, fed by `events`.
    pub fn run(self, mut events: UnboundedReceiver<StoreEvent>) -> Addr<Self> {
        let registry = supervision::start(Node::singleton("pool_registry"), |_| self);
        let mailbox = registry.clone();
        actix::spawn(async move {
            while let Some(event) = events.recv().await {
                mailbox.do_send(PoolChanged(event));
            }
        });
        registry
    }

    fn start_actor(&mut self, key: ObjectKey) {
        let (k, ctx) = (key.clone(), self.ctx.clone());
        let node = Node::member("pool", key.to_string(), "pool_registry");
        let addr = supervision::start(node, move |_| PoolActor::new(k, ctx));
        tracing::debug!(pool = %key, "PoolActor started");
        self.actors.insert(key, addr);
    }

    fn stop_actor(&mut self, key: &ObjectKey) {
        if let Some(actor) = self.actors.remove(key) {
            actor.do_send(StopPool);
        }
    }

    fn list_keys(&self, ctx: &mut Context<Self>) {
        let store = self.ctx.pools.clone();
        ctx.spawn(async move { store.pool_keys().await }.into_actor(self).map(
            |listed, _, ctx| match listed {
                Ok(keys) => ctx.notify(Listed(keys)),
                Err(e) => {
                    tracing::warn!(error = %e, retryIn = ?RESYNC_RETRY, "restarted pool registry could not list the pools");
                    ctx.run_later(RESYNC_RETRY, |registry, ctx| registry.list_keys(ctx));
                }
            },
        ));
    }
}

impl Actor for PoolRegistry {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        supervision::report_singleton("pool_registry", &format!("supervising {}", self.actors.len()), 0);
        if std::mem::take(&mut self.resync) {
            self.list_keys(ctx);
        }
    }
}

impl actix::Supervised for PoolRegistry {
    fn restarting(&mut self, _: &mut Self::Context) {
        self.actors.retain(|_, actor| actor.connected());
        self.resync = true;
    }
}

impl Handler<PoolChanged> for PoolRegistry {
    type Result = ();

    fn handle(&mut self, PoolChanged(event): PoolChanged, _: &mut Self::Context) {
        match event {
            StoreEvent::Changed(key) => match self.actors.get(&key) {
                Some(actor) => actor.do_send(Turn),
                None => self.start_actor(key),
            },
            StoreEvent::Removed(key) => self.stop_actor(&key),
        }
        supervision::report_singleton("pool_registry", &format!("supervising {}", self.actors.len()), 0);
    }
}

impl Handler<Listed> for PoolRegistry {
    type Result = ();

    fn handle(&mut self, Listed(keys): Listed, _: &mut Self::Context) {
        let stored: HashSet<ObjectKey> = keys.into_iter().collect();
        let gone: Vec<ObjectKey> = self
            .actors
            .keys()
            .filter(|k| !stored.contains(*k))
            .cloned()
            .collect();
        for key in gone {
            self.stop_actor(&key);
        }
        for key in stored {
            if !self.actors.contains_key(&key) {
                self.start_actor(key);
            }
        }
    }
}

impl Handler<CountPools> for PoolRegistry {
    type Result = usize;

    fn handle(&mut self, _: CountPools, _: &mut Self::Context) -> usize {
        self.actors.len()
    }
}
