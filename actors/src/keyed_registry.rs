//! `KeyedRegistry<K>`: one supervised member actor per stored object of a
//! kind — a ProxyActor per Proxy ([`ProxyRegistry`]), a PoolActor per
//! ProxyPool ([`PoolRegistry`]) — driven by the store's event stream for
//! that kind. The stream is pumped into the registry's mailbox from
//! outside the actor, so a restarted registry keeps receiving it; after a
//! restart it also checks its members against the store's keys, in case
//! the crash swallowed an event.
//!
//! [`ProxyRegistry`]: crate::proxy_actor::ProxyRegistry
//! [`PoolRegistry`]: crate::pool_actor::PoolRegistry

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use actix::prelude::*;
use egress_proxies::domain::backoff::{Attempts, ladders};
use egress_proxies::domain::resource::ObjectKey;
use egress_proxies::domain::resource_store::{StoreError, StoreEvent};
use futures::future::BoxFuture;
use tokio::sync::mpsc::UnboundedReceiver;

use crate::supervision::{self, Node};

/// A kind of object with one member actor each.
pub trait Kind: Unpin + 'static {
    type Member: Actor<Context = Context<Self::Member>> + actix::Supervised;
    /// What every member is made from, shared by all of them.
    type Shared: Clone + Unpin + 'static;
    /// The registry's name in the supervision tree, heartbeats and logs.
    const REGISTRY: &'static str;
    /// A member's kind in the supervision tree.
    const MEMBER: &'static str;

    fn member(key: ObjectKey, shared: Self::Shared) -> Self::Member;
    /// The object changed: the member looks again.
    fn changed(member: &Addr<Self::Member>);
    /// The object is gone: the member ends for good (its supervisor does
    /// not restart it).
    fn stop(member: Addr<Self::Member>);
    /// The keys of every stored object of the kind.
    fn keys(shared: &Self::Shared) -> BoxFuture<'static, Result<Vec<ObjectKey>, StoreError>>;
    /// How often members were restarted after a crash, if counted.
    fn restarts(_shared: &Self::Shared) -> u64 {
        0
    }
}

pub struct KeyedRegistry<K: Kind> {
    shared: K::Shared,
    members: HashMap<ObjectKey, Addr<K::Member>>,
    /// Set by a restart: check the members against the store once started.
    resync: bool,
}

/// One event of the store's stream for the registry's kind.
#[derive(Message, Debug, Clone)]
#[rtype(result = "()")]
pub struct StoreChanged(pub StoreEvent);

/// The store's keys, listed after a restart.
#[derive(Message)]
#[rtype(result = "()")]
struct Listed(Vec<ObjectKey>);

/// How many members run, and how often they were restarted.
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "RegistryStats")]
pub struct GetRegistryStats;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RegistryStats {
    pub actors: usize,
    pub restarts: u64,
}

impl<K: Kind> KeyedRegistry<K> {
    pub fn with_shared(shared: K::Shared) -> Self {
        Self {
            shared,
            members: HashMap::new(),
            resync: false,
        }
    }

    pub fn shared(&self) -> &K::Shared {
        &self.shared
    }

    /// Starts the registry under its supervisor, fed by `events`.
    pub fn run(self, mut events: UnboundedReceiver<StoreEvent>) -> Addr<Self> {
        let registry = supervision::start(Node::singleton(K::REGISTRY), |_| self);
        let mailbox = registry.clone();
        actix::spawn(async move {
            while let Some(event) = events.recv().await {
                mailbox.do_send(StoreChanged(event));
            }
            tracing::info!(registry = K::REGISTRY, "store event stream ended");
        });
        registry
    }

    fn report_tree(&self) {
        supervision::report_singleton(K::REGISTRY, &format!("supervising {}", self.members.len()), 0);
    }

    fn start_member(&mut self, key: ObjectKey) {
        // A member starts by looking at its object; no message needed.
        let (k, shared) = (key.clone(), self.shared.clone());
        let node = Node::member(K::MEMBER, key.to_string(), K::REGISTRY);
        let addr = supervision::start(node, move |_| K::member(k, shared));
        tracing::debug!(kind = K::MEMBER, key = %key, "member started");
        self.members.insert(key, addr);
    }

    fn stop_member(&mut self, key: &ObjectKey) {
        if let Some(member) = self.members.remove(key) {
            K::stop(member);
            tracing::debug!(kind = K::MEMBER, key = %key, "member stopped");
        }
    }

    /// Lists the store's keys (after a restart), retrying until it answers
    /// as [`ladders::REGISTRY_RELIST`] says; `failed` counts the lists that
    /// failed so far.
    fn list_keys(&self, mut failed: Attempts, ctx: &mut Context<Self>) {
        ctx.spawn(
            K::keys(&self.shared)
                .into_actor(self)
                .map(move |listed, _, ctx| match listed {
                    Ok(keys) => ctx.notify(Listed(keys)),
                    Err(e) => {
                        let retry_in = failed.next_step(&ladders::REGISTRY_RELIST);
                        tracing::warn!(
                            registry = K::REGISTRY, error = %e, retryIn = ?retry_in,
                            "restarted registry could not list the store's keys"
                        );
                        ctx.run_later(retry_in, move |registry, ctx| registry.list_keys(failed, ctx));
                    }
                }),
        );
    }
}

impl<K: Kind> Actor for KeyedRegistry<K> {
    type Context = Context<Self>;

    fn stopped(&mut self, _: &mut Self::Context) {
        supervision::stop_beating(K::REGISTRY);
    }

    fn started(&mut self, ctx: &mut Self::Context) {
        // In the tree from the start, then refreshed every second.
        self.report_tree();
        supervision::beat_while_running::<Self>(K::REGISTRY, ctx);
        ctx.run_interval(Duration::from_secs(1), |registry, _| registry.report_tree());
        if std::mem::take(&mut self.resync) {
            self.list_keys(Attempts::default(), ctx);
        }
    }
}

impl<K: Kind> actix::Supervised for KeyedRegistry<K> {
    fn restarting(&mut self, _: &mut Self::Context) {
        // The members it started run on (their addresses are kept); what a
        // crash may have cost is one event, which the store's keys restore.
        self.members.retain(|_, member| member.connected());
        self.resync = true;
    }
}

impl<K: Kind> Handler<StoreChanged> for KeyedRegistry<K> {
    type Result = ();

    fn handle(&mut self, StoreChanged(event): StoreChanged, _: &mut Self::Context) {
        match event {
            StoreEvent::Changed(key) => match self.members.get(&key) {
                Some(member) => K::changed(member),
                None => self.start_member(key),
            },
            StoreEvent::Removed(key) => self.stop_member(&key),
        }
    }
}

impl<K: Kind> Handler<Listed> for KeyedRegistry<K> {
    type Result = ();

    fn handle(&mut self, Listed(keys): Listed, _: &mut Self::Context) {
        let stored: HashSet<ObjectKey> = keys.into_iter().collect();
        let gone: Vec<ObjectKey> = self
            .members
            .keys()
            .filter(|k| !stored.contains(*k))
            .cloned()
            .collect();
        let (mut started, stopped) = (0, gone.len());
        for key in gone {
            self.stop_member(&key);
        }
        for key in stored {
            if !self.members.contains_key(&key) {
                self.start_member(key);
                started += 1;
            }
        }
        tracing::info!(
            registry = K::REGISTRY,
            started,
            stopped,
            running = self.members.len(),
            "restarted registry checked its members against the store"
        );
    }
}

impl<K: Kind> Handler<GetRegistryStats> for KeyedRegistry<K> {
    type Result = MessageResult<GetRegistryStats>;

    fn handle(&mut self, _: GetRegistryStats, _: &mut Self::Context) -> Self::Result {
        MessageResult(RegistryStats {
            actors: self.members.len(),
            restarts: K::restarts(&self.shared),
        })
    }
}
