//! `LeaseStore`: owns the lease book. ProxyActors push availability into
//! it; discovery API handlers ask it for leases. Expired leases are swept
//! every second.

use std::time::{Duration, Instant};

use actix::prelude::*;
use egress_proxies::lease::{
    AcquireError, AcquireRequest, Availability, Footprint, Grant, LeaseBook, LeaseLimits, LeaseSettings,
    Outcome, ProxyView, RenewError, UnknownLease,
};
use egress_proxies::store::ObjectKey;
use egress_proxies::telemetry::events::LeaseEvent;
use egress_proxies::telemetry::metrics;

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

/// Returns whether a lease was held.
#[derive(Message, Debug, Clone)]
#[rtype(result = "bool")]
pub struct Release(pub String);

#[derive(Message, Debug, Clone)]
#[rtype(result = "Result<(), UnknownLease>")]
pub struct Report {
    pub id: String,
    pub outcome: Outcome,
    pub detail: Option<String>,
}

/// Extends a held lease from now; returns the TTL applied.
#[derive(Message, Debug, Clone)]
#[rtype(result = "Result<Duration, RenewError>")]
pub struct Renew {
    pub id: String,
    /// None: the lease's TTL as granted.
    pub ttl: Option<Duration>,
}

#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "Vec<ProxyView>")]
pub struct ListProxies;

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
    pub proxies: Vec<egress_proxies::lease::ProxyView>,
    pub stats: LeaseStats,
    /// The latest denials, newest first: (target, when).
    pub recent_denials: Vec<(String, jiff::Timestamp)>,
}

/// How many recent denials the dashboard keeps.
const RECENT_DENIALS: usize = 20;

/// Counters for tests, benchmarks and the dashboard.
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "LeaseStats")]
pub struct GetLeaseStats;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LeaseStats {
    pub active: usize,
    pub granted: u64,
    pub denied: u64,
    pub expired: u64,
    pub released: u64,
}

pub struct LeaseStore {
    book: LeaseBook,
    stats: LeaseStats,
    recent_denials: std::collections::VecDeque<(String, jiff::Timestamp)>,
}

impl LeaseStore {
    pub fn new(settings: LeaseSettings) -> Self {
        Self::with_limits(settings, LeaseLimits::default())
    }

    pub fn with_limits(settings: LeaseSettings, limits: LeaseLimits) -> Self {
        Self {
            book: LeaseBook::with_limits(settings, limits),
            stats: LeaseStats::default(),
            recent_denials: std::collections::VecDeque::new(),
        }
    }
}

impl Actor for LeaseStore {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        crate::supervision::report_singleton("lease_store", "running", 0);
        ctx.run_interval(Duration::from_secs(1), |store, _| {
            let expired = store.book.sweep(Instant::now());
            crate::supervision::report_singleton(
                "lease_store",
                &format!("{} active leases", store.book.active_leases()),
                0,
            );
            store.stats.expired += expired as u64;
            if expired > 0 {
                LeaseEvent::Expired { count: expired }.emit(store.book.active_leases());
            }
        });
    }
}

impl Handler<UpdateAvailability> for LeaseStore {
    type Result = ();
    fn handle(&mut self, msg: UpdateAvailability, _: &mut Self::Context) {
        self.book.upsert(msg.0, Instant::now());
    }
}

impl Handler<RemoveProxy> for LeaseStore {
    type Result = ();
    fn handle(&mut self, msg: RemoveProxy, _: &mut Self::Context) {
        self.book.remove(&msg.0, Instant::now());
    }
}

impl Handler<Acquire> for LeaseStore {
    type Result = Result<Grant, AcquireError>;
    fn handle(&mut self, msg: Acquire, _: &mut Self::Context) -> Self::Result {
        let result = self.book.acquire(&msg.0, Instant::now());
        let event = match &result {
            Ok(grant) => {
                self.stats.granted += 1;
                LeaseEvent::Granted {
                    proxy: &grant.proxy.name,
                    target: &grant.target,
                }
            }
            Err(AcquireError::NoCapacity { target }) => {
                self.stats.denied += 1;
                self.recent_denials
                    .push_front((target.clone(), jiff::Timestamp::now()));
                self.recent_denials.truncate(RECENT_DENIALS);
                LeaseEvent::Denied {
                    reason: "no_capacity",
                }
            }
            Err(AcquireError::Full(_)) => LeaseEvent::Denied { reason: "store_full" },
            Err(_) => LeaseEvent::Denied { reason: "invalid" },
        };
        event.emit(self.book.active_leases());
        result
    }
}

impl Handler<Release> for LeaseStore {
    type Result = bool;
    fn handle(&mut self, msg: Release, _: &mut Self::Context) -> bool {
        let held = self.book.release(&msg.0, Instant::now());
        if held {
            self.stats.released += 1;
            metrics().leases_active.set(self.book.active_leases() as i64);
        }
        held
    }
}

impl Handler<Report> for LeaseStore {
    type Result = Result<(), UnknownLease>;
    fn handle(&mut self, msg: Report, _: &mut Self::Context) -> Self::Result {
        self.book.report(&msg.id, msg.outcome, msg.detail, Instant::now())
    }
}

impl Handler<Renew> for LeaseStore {
    type Result = Result<Duration, RenewError>;
    fn handle(&mut self, msg: Renew, _: &mut Self::Context) -> Self::Result {
        self.book.renew(&msg.id, msg.ttl, Instant::now())
    }
}

impl Handler<GetLeaseFootprint> for LeaseStore {
    type Result = MessageResult<GetLeaseFootprint>;
    fn handle(&mut self, _: GetLeaseFootprint, _: &mut Self::Context) -> Self::Result {
        MessageResult(self.book.footprint())
    }
}

impl Handler<ListProxies> for LeaseStore {
    type Result = MessageResult<ListProxies>;
    fn handle(&mut self, _: ListProxies, _: &mut Self::Context) -> Self::Result {
        MessageResult(self.book.proxies())
    }
}

impl Handler<GetLeaseDashboard> for LeaseStore {
    type Result = MessageResult<GetLeaseDashboard>;
    fn handle(&mut self, _: GetLeaseDashboard, _: &mut Self::Context) -> Self::Result {
        let mut stats = self.stats;
        stats.active = self.book.active_leases();
        MessageResult(LeaseDashboard {
            proxies: self.book.proxies(),
            stats,
            recent_denials: self.recent_denials.iter().cloned().collect(),
        })
    }
}

impl Handler<GetLeaseStats> for LeaseStore {
    type Result = MessageResult<GetLeaseStats>;
    fn handle(&mut self, _: GetLeaseStats, _: &mut Self::Context) -> Self::Result {
        MessageResult(LeaseStats {
            active: self.book.active_leases(),
            ..self.stats
        })
    }
}
