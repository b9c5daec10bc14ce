//! `LeaseStoreActor`: the lease store's actor. It hosts the store
//! (`egress_proxies::adapters::lease_store`) for the lease API's handlers,
//! the ProxyActors' availability and the PoolActors' figures and reports;
//! it sweeps the store every second, beats for supervision, and rebuilds
//! the store's book when its supervisor restarts it. The gateway leases
//! from the same store on its own threads, without a message.

use std::sync::Arc;

use egress_proxies::adapters::replicas::desk::ShareDesk;
use egress_proxies::adapters::replicas::wire::{AvailabilityBody, FleetItem};
use std::collections::BTreeMap;
use std::time::Duration;

use actix::prelude::*;
use egress_proxies::adapters::lease_store::{LeaseStats, LeaseStore, RenewRefused, ReportRefused};
use egress_proxies::domain::lease::{
    AcquireError, AcquireRequest, Availability, Caller, Footprint, Grant, NotOwner, Outcome, PoolFigures,
    ProxyView,
};
use egress_proxies::domain::resource::{ObjectKey, ProxyPoolStatus};

use crate::replicas::view::{ReplicaFigures, ReplicaView};

/// A proxy's availability changed.
#[derive(Message, Debug, Clone)]
#[rtype(result = "()")]
pub struct UpdateAvailability(pub Availability);

/// A proxy is gone.
#[derive(Message, Debug, Clone)]
#[rtype(result = "()")]
pub struct RemoveProxy(pub ObjectKey);

#[derive(Message, Debug, Clone)]
#[rtype(result = "Result<Grant, AcquireError>")]
pub struct Acquire(pub AcquireRequest);

/// Ends a lease if `by` may (its owner): whether it was held.
#[derive(Message, Debug, Clone)]
#[rtype(result = "Result<bool, NotOwner>")]
pub struct Release {
    pub id: String,
    pub by: Caller,
}

#[derive(Message, Debug, Clone)]
#[rtype(result = "Result<(), ReportRefused>")]
pub struct Report {
    pub id: String,
    pub outcome: Outcome,
    pub detail: Option<String>,
    pub by: Caller,
}

/// Extends a held lease from now, if `by` may; returns the TTL applied.
#[derive(Message, Debug, Clone)]
#[rtype(result = "Result<Duration, RenewRefused>")]
pub struct Renew {
    pub id: String,
    /// None: the lease's TTL as granted.
    pub ttl: Option<Duration>,
    pub by: Caller,
}

#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "Vec<ProxyView>")]
pub struct ListProxies;

/// A pool's members' lease figures and its refused acquires (taken: the
/// next ask counts from here).
#[derive(Message, Debug, Clone)]
#[rtype(result = "PoolFigures")]
pub struct GetPoolFigures {
    pub pool: String,
    pub members: Vec<ObjectKey>,
}

/// A pool's latest turn, for the dashboard: sent by its PoolActor when it
/// changed. Kept beside the leases its figures come from.
#[derive(Message, Debug, Clone)]
#[rtype(result = "()")]
pub struct ReportPool(pub PoolReport);

/// A pool is gone: forget its report.
#[derive(Message, Debug, Clone)]
#[rtype(result = "()")]
pub struct ForgetPool(pub ObjectKey);

/// What a PoolActor last decided and saw.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolReport {
    pub key: ObjectKey,
    /// The status its latest turn wrote (or found unchanged).
    pub status: ProxyPoolStatus,
    /// Acquires naming the pool refused for lack of capacity since its actor started.
    pub denied: u64,
    /// Leases one member may hold (`--max-leases-per-proxy`; 0: unlimited).
    pub leases_per_member: u32,
}

/// Pool reports kept at most (one per PoolActor; a bound all the same).
const MAX_POOL_REPORTS: usize = 10_000;

/// Sizes of the lease book's tables (tests show they stay bounded).
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "Footprint")]
pub struct GetLeaseFootprint;

/// Everything the dashboard shows of leases.
#[derive(Message)]
#[rtype(result = "LeaseDashboard")]
pub struct GetLeaseDashboard;

#[derive(Clone, Debug)]
pub struct LeaseDashboard {
    pub proxies: Vec<ProxyView>,
    pub stats: LeaseStats,
    /// The latest denials, newest first: (target, when).
    pub recent_denials: Vec<(String, jiff::Timestamp)>,
    /// Every running pool's latest report, by key.
    pub pools: Vec<PoolReport>,
    /// Every replica serving: this replica's view of the replicas.
    pub replicas: Option<ReplicaFigures>,
}

/// Counters for tests, benchmarks and the dashboard.
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "LeaseStats")]
pub struct GetLeaseStats;

pub struct LeaseStoreActor {
    store: LeaseStore,
    pools: BTreeMap<ObjectKey, PoolReport>,
    /// While this replica leads and every replica serves: availability goes
    /// to the leader's share desk, and reaches this store (and every other
    /// replica's) through the desk's feed.
    desk: Option<Arc<ShareDesk>>,
    /// Every replica serving: this replica's view of the replicas, for the dashboard.
    replicas: Option<ReplicaView>,
}

/// Sends availability to the share desk from now on (`None`: to the store).
#[derive(Message)]
#[rtype(result = "()")]
pub struct PublishTo(pub Option<Arc<ShareDesk>>);

/// The dashboard shows this replica's view of the replicas (every replica serving).
#[derive(Message)]
#[rtype(result = "()")]
pub struct ShowReplicas(pub ReplicaView);

impl LeaseStoreActor {
    /// Hosts `store` (the gateway keeps a clone of it).
    pub fn new(store: LeaseStore) -> Self {
        Self {
            store,
            pools: BTreeMap::new(),
            desk: None,
            replicas: None,
        }
    }
}

impl Actor for LeaseStoreActor {
    type Context = Context<Self>;

    fn stopped(&mut self, _: &mut Self::Context) {
        crate::supervision::stop_beating("lease_store");
    }

    fn started(&mut self, ctx: &mut Self::Context) {
        crate::supervision::report_singleton("lease_store", "running", 0);
        crate::supervision::beat_while_running::<Self>("lease_store", ctx);
        ctx.run_interval(Duration::from_secs(1), |actor, _| {
            let active = actor.store.tick();
            crate::supervision::report_singleton("lease_store", &format!("{active} active leases"), 0);
        });
    }
}

impl actix::Supervised for LeaseStoreActor {
    fn restarting(&mut self, _: &mut Self::Context) {
        // Answers waiting on the journal went with the old context (their
        // callers hear 503); the book is rebuilt from its records.
        self.store.rebuild();
    }
}

impl Handler<UpdateAvailability> for LeaseStoreActor {
    type Result = ();
    fn handle(&mut self, msg: UpdateAvailability, _: &mut Self::Context) {
        match &self.desk {
            Some(desk) => desk.publish(FleetItem::Available(Box::new(AvailabilityBody::from(&msg.0)))),
            None => self.store.upsert(msg.0),
        }
    }
}

impl Handler<PublishTo> for LeaseStoreActor {
    type Result = ();
    fn handle(&mut self, msg: PublishTo, _: &mut Self::Context) {
        self.desk = msg.0;
    }
}

impl Handler<ShowReplicas> for LeaseStoreActor {
    type Result = ();
    fn handle(&mut self, msg: ShowReplicas, _: &mut Self::Context) {
        self.replicas = Some(msg.0);
    }
}

impl Handler<RemoveProxy> for LeaseStoreActor {
    type Result = ();
    fn handle(&mut self, msg: RemoveProxy, _: &mut Self::Context) {
        match &self.desk {
            Some(desk) => desk.publish(FleetItem::Removed {
                proxy: egress_proxies::domain::lease::journal::key_string(&msg.0),
            }),
            None => self.store.remove(&msg.0),
        }
    }
}

// The answers that wait for the journal run on the actor's context, so a
// restart drops them (their callers hear 503) as it drops the rest of the
// crashed actor's work.

impl Handler<Acquire> for LeaseStoreActor {
    type Result = ResponseActFuture<Self, Result<Grant, AcquireError>>;
    fn handle(&mut self, msg: Acquire, _: &mut Self::Context) -> Self::Result {
        Box::pin(self.store.acquire_durably(msg.0).into_actor(self))
    }
}

impl Handler<Release> for LeaseStoreActor {
    type Result = ResponseActFuture<Self, Result<bool, NotOwner>>;
    fn handle(&mut self, msg: Release, _: &mut Self::Context) -> Self::Result {
        Box::pin(self.store.release_durably(&msg.id, &msg.by).into_actor(self))
    }
}

impl Handler<Report> for LeaseStoreActor {
    type Result = ResponseActFuture<Self, Result<(), ReportRefused>>;
    fn handle(&mut self, msg: Report, _: &mut Self::Context) -> Self::Result {
        let answer = self
            .store
            .report_durably(&msg.id, msg.outcome, msg.detail, &msg.by);
        Box::pin(answer.into_actor(self))
    }
}

impl Handler<Renew> for LeaseStoreActor {
    type Result = ResponseActFuture<Self, Result<Duration, RenewRefused>>;
    fn handle(&mut self, msg: Renew, _: &mut Self::Context) -> Self::Result {
        Box::pin(
            self.store
                .renew_durably(&msg.id, msg.ttl, &msg.by)
                .into_actor(self),
        )
    }
}

impl Handler<GetLeaseFootprint> for LeaseStoreActor {
    type Result = MessageResult<GetLeaseFootprint>;
    fn handle(&mut self, _: GetLeaseFootprint, _: &mut Self::Context) -> Self::Result {
        MessageResult(self.store.footprint())
    }
}

impl Handler<GetPoolFigures> for LeaseStoreActor {
    type Result = MessageResult<GetPoolFigures>;
    fn handle(&mut self, ask: GetPoolFigures, _: &mut Self::Context) -> Self::Result {
        let mut figures = self.store.pool_figures(&ask.pool, &ask.members);
        // Every replica serving: the members' leases are on every replica.
        if let Some(desk) = &self.desk {
            let in_use = desk.in_use(&ask.members);
            for (key, member) in figures.members.iter_mut() {
                if let Some(total) = in_use.get(key) {
                    member.leases = *total;
                }
            }
        }
        MessageResult(figures)
    }
}

impl Handler<ReportPool> for LeaseStoreActor {
    type Result = ();
    fn handle(&mut self, ReportPool(report): ReportPool, _: &mut Self::Context) {
        if self.pools.len() >= MAX_POOL_REPORTS && !self.pools.contains_key(&report.key) {
            tracing::debug!(pool = %report.key, "too many pools reported; not shown on the dashboard");
            return;
        }
        self.pools.insert(report.key.clone(), report);
    }
}

impl Handler<ForgetPool> for LeaseStoreActor {
    type Result = ();
    fn handle(&mut self, ForgetPool(key): ForgetPool, _: &mut Self::Context) {
        self.pools.remove(&key);
    }
}

impl Handler<ListProxies> for LeaseStoreActor {
    type Result = MessageResult<ListProxies>;
    fn handle(&mut self, _: ListProxies, _: &mut Self::Context) -> Self::Result {
        MessageResult(self.store.proxies())
    }
}

impl Handler<GetLeaseDashboard> for LeaseStoreActor {
    type Result = MessageResult<GetLeaseDashboard>;
    fn handle(&mut self, _: GetLeaseDashboard, _: &mut Self::Context) -> Self::Result {
        let overview = self.store.overview();
        MessageResult(LeaseDashboard {
            proxies: overview.proxies,
            stats: overview.stats,
            recent_denials: overview.recent_denials,
            pools: self.pools.values().cloned().collect(),
            replicas: self.replicas.as_ref().and_then(ReplicaView::get),
        })
    }
}

impl Handler<GetLeaseStats> for LeaseStoreActor {
    type Result = MessageResult<GetLeaseStats>;
    fn handle(&mut self, _: GetLeaseStats, _: &mut Self::Context) -> Self::Result {
        MessageResult(self.store.stats())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use egress_proxies::domain::lease::{GATEWAY_CLIENT, LeaseSettings};

    fn ask(client: &str) -> AcquireRequest {
        AcquireRequest {
            target: "example.com".into(),
            client: Some(client.into()),
            ..Default::default()
        }
    }

    /// The actor hosts the store the gateway leases from: a gateway lease
    /// taken without a message fills the proxy for the mailbox's acquire.
    #[actix_rt::test]
    async fn the_mailbox_and_the_gateway_lease_from_one_store() {
        let store = LeaseStore::new(LeaseSettings {
            capacity: 1,
            cooldown: Duration::ZERO,
            ..Default::default()
        });
        let actor = LeaseStoreActor::new(store.clone()).start();
        actor
            .send(UpdateAvailability(Availability {
                key: ObjectKey::new("ns", "p"),
                ready: true,
                phase: "Ready".into(),
                healthy: Some(true),
                url: Some("http://p:3128".into()),
                attributes: Default::default(),
                latency: None,
                credentials: None,
                realm: None,
                retiring: false,
            }))
            .await
            .unwrap();
        let gateway = store
            .acquire_for_gateway(&ask(GATEWAY_CLIENT))
            .expect("a gateway lease");
        let api = actor.send(Acquire(ask("crawler"))).await.unwrap();
        assert!(matches!(api, Err(AcquireError::NoCapacity { .. })), "{api:?}");
        store.release_for_gateway(&gateway.lease_id, None);
        actor.send(Acquire(ask("crawler"))).await.unwrap().expect("freed");
        let stats = actor.send(GetLeaseStats).await.unwrap();
        assert_eq!((stats.granted, stats.denied, stats.active), (2, 1, 1));
    }
}
