//! `LeaseStore`: owns the lease book. ProxyActors push availability into
//! it; discovery API handlers ask it for leases. Expired leases are swept
//! every second. With a journal, every change is made durable before the
//! answer leaves: a grant the journal could not keep is taken back and
//! answered 503, so no client holds a lease a restart would forget.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use actix::prelude::*;
use egress_proxies::leader::Tenure;
use egress_proxies::lease::{
    AcquireError, AcquireRequest, Availability, Durable, Footprint, Grant, JournalError, LeaseBook,
    LeaseChange, LeaseJournal, LeaseLimits, LeaseSettings, Outcome, PoolFigures, ProxyView, RenewError,
    UnknownLease, is_gateway_client,
};
use egress_proxies::resource::ObjectKey;
use egress_proxies::resource::ProxyPoolStatus;
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
    pub proxies: Vec<egress_proxies::lease::ProxyView>,
    pub stats: LeaseStats,
    /// The latest denials, newest first: (target, when).
    pub recent_denials: Vec<(String, jiff::Timestamp)>,
    /// Every running pool's latest report, by key.
    pub pools: Vec<PoolReport>,
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

/// Changes kept for a journal that failed, retried with the next ones. Past
/// this many the oldest go (the journal has been failing for a long time).
const MAX_UNSAVED: usize = 100_000;
/// How often journaled state that has ended is pruned.
const PRUNE_EVERY: Duration = Duration::from_secs(60);
/// A grant whose journal has not made it durable by then is taken back (503).
const DURABLE_WITHIN: Duration = Duration::from_secs(5);

/// The lease store's state: the book, its journal and counters. Held
/// behind one lock, shared by the [`LeaseStore`] actor and the gateway's
/// [`LeaseDesk`], so that both lease from one book.
pub struct Ledger {
    book: LeaseBook,
    stats: LeaseStats,
    recent_denials: std::collections::VecDeque<(String, jiff::Timestamp)>,
    journal: Option<Box<dyn LeaseJournal>>,
    /// Changes the journal has not taken yet (it failed), oldest first.
    unsaved: Vec<LeaseChange>,
    last_prune: Instant,
    tenure: Option<Tenure>,
}

type Shared = Arc<Mutex<Ledger>>;

fn locked(ledger: &Shared) -> MutexGuard<'_, Ledger> {
    // A panic under the lock is what supervision restarts the store for;
    // its `restarting` rebuilds the book from its records.
    ledger.lock().unwrap_or_else(PoisonError::into_inner)
}

pub struct LeaseStore {
    ledger: Shared,
    pools: std::collections::BTreeMap<ObjectKey, PoolReport>,
}

impl LeaseStore {
    /// Leases in memory only: a restart forgets them.
    pub fn new(settings: LeaseSettings) -> Self {
        Self::with_limits(settings, LeaseLimits::default())
    }

    pub fn with_limits(settings: LeaseSettings, limits: LeaseLimits) -> Self {
        Self::holding(Ledger {
            book: LeaseBook::with_limits(settings, limits),
            stats: LeaseStats::default(),
            recent_denials: std::collections::VecDeque::new(),
            journal: None,
            unsaved: Vec::new(),
            last_prune: Instant::now(),
            tenure: None,
        })
    }

    fn holding(ledger: Ledger) -> Self {
        Self {
            ledger: Arc::new(Mutex::new(ledger)),
            pools: std::collections::BTreeMap::new(),
        }
    }

    /// Leases kept in `journal`: what it remembers is restored first.
    pub fn durable(
        settings: LeaseSettings,
        limits: LeaseLimits,
        mut journal: Box<dyn LeaseJournal>,
    ) -> Result<Self, JournalError> {
        let snapshot = journal.load(jiff::Timestamp::now())?;
        tracing::info!(
            leases = snapshot.leases.len(),
            rests = snapshot.target_rests.len() + snapshot.proxy_rests.len(),
            "lease state restored"
        );
        let store = Self::with_limits(settings, limits);
        {
            let mut ledger = store.ledger();
            ledger.book.restore(snapshot, Instant::now());
            ledger.book.journal_changes();
            ledger.journal = Some(journal);
            metrics().leases_active.set(ledger.book.active_leases() as i64);
        }
        Ok(store)
    }

    /// Grants only while `tenure` lasts, checked at the moment of each grant.
    pub fn with_tenure(self, tenure: Tenure) -> Self {
        self.ledger().tenure = Some(tenure);
        self
    }

    /// The gateway's way to the same book, without the mailbox.
    pub fn desk(&self) -> LeaseDesk {
        LeaseDesk(self.ledger.clone())
    }

    fn ledger(&self) -> MutexGuard<'_, Ledger> {
        locked(&self.ledger)
    }
}

impl Ledger {
    /// Hands the book's latest changes to the journal.
    fn persist(&mut self) -> Result<Durable, JournalError> {
        let Some(journal) = self.journal.as_mut() else {
            return Ok(Durable::Now);
        };
        self.unsaved.extend(self.book.take_changes());
        if self.unsaved.is_empty() {
            return Ok(Durable::Now);
        }
        match journal.record(&self.unsaved) {
            Ok(durable) => {
                self.unsaved.clear();
                Ok(durable)
            }
            Err(e) => {
                if self.unsaved.len() > MAX_UNSAVED {
                    let excess = self.unsaved.len() - MAX_UNSAVED;
                    self.unsaved.drain(..excess);
                }
                tracing::error!(error = %e, unsaved = self.unsaved.len(), "saving lease state failed; retrying with the next change");
                Err(e)
            }
        }
    }
}

/// The gateway's counter at the lease book: it takes, reports, renews and
/// gives back its leases on its own threads, under the book's lock,
/// instead of a mailbox round trip per request (two thread wake-ups each;
/// docs/benchmarks.md). Each call is done when it returns, so a failure
/// reported on one try is in the book before the next try is leased.
/// Gateway leases are never journaled (they end with the process), so no
/// call waits for a write; what else changed (a rest, a report) is written
/// behind, a failure logged there.
#[derive(Clone)]
pub struct LeaseDesk(Shared);

impl LeaseDesk {
    /// A gateway lease (`request.client` names the gateway), or why not.
    pub fn acquire(&self, request: &AcquireRequest) -> Result<Grant, AcquireError> {
        debug_assert!(request.client.as_deref().is_some_and(is_gateway_client));
        locked(&self.0).acquire_unjournaled(request)
    }

    /// Gives a lease back.
    pub fn release(&self, id: &str) {
        let mut ledger = locked(&self.0);
        ledger.release(id);
        let _ = ledger.persist();
    }

    /// Reports how a lease's proxy did.
    pub fn report(&self, id: &str, outcome: Outcome, detail: String) -> Result<(), UnknownLease> {
        let mut ledger = locked(&self.0);
        let result = ledger.book.report(id, outcome, Some(detail), Instant::now());
        let _ = ledger.persist();
        result
    }

    /// Extends a lease by its TTL.
    pub fn renew(&self, id: &str) -> Result<Duration, RenewError> {
        let mut ledger = locked(&self.0);
        if !ledger.leading() {
            return Err(RenewError::NotLeader);
        }
        let renewed = ledger.book.renew(id, None, Instant::now());
        let _ = ledger.persist();
        renewed
    }
}

impl Actor for LeaseStore {
    type Context = Context<Self>;

    fn stopped(&mut self, _: &mut Self::Context) {
        crate::supervision::stop_beating("lease_store");
    }

    fn started(&mut self, ctx: &mut Self::Context) {
        crate::supervision::report_singleton("lease_store", "running", 0);
        crate::supervision::beat_while_running::<Self>("lease_store", ctx);
        ctx.run_interval(Duration::from_secs(1), |store, _| {
            let mut ledger = store.ledger();
            let expired = ledger.book.sweep(Instant::now());
            let _ = ledger.persist();
            if ledger.last_prune.elapsed() >= PRUNE_EVERY
                && let Some(journal) = ledger.journal.as_mut()
            {
                if let Err(e) = journal.prune(jiff::Timestamp::now()) {
                    tracing::warn!(error = %e, "pruning ended lease state failed");
                }
                ledger.last_prune = Instant::now();
            }
            crate::supervision::report_singleton(
                "lease_store",
                &format!("{} active leases", ledger.book.active_leases()),
                0,
            );
            ledger.stats.expired += expired as u64;
            if expired > 0 {
                LeaseEvent::Expired { count: expired }.emit(ledger.book.active_leases());
            }
        });
    }
}

impl actix::Supervised for LeaseStore {
    fn restarting(&mut self, _: &mut Self::Context) {
        // Answers waiting on the journal went with the old context (their
        // callers hear 503). The book is rebuilt from its records: the crash
        // may have left its indexes half-updated.
        let mut ledger = self.ledger();
        let now = Instant::now();
        let mut book = ledger.book.rebuilt(now);
        if ledger.journal.is_some() {
            let changes = ledger.book.take_changes();
            ledger.unsaved.extend(changes);
            book.journal_changes();
        }
        ledger.book = book;
        let _ = ledger.persist();
        tracing::info!(
            leases = ledger.book.active_leases(),
            "lease store restarted with its leases and rests"
        );
    }
}

impl Handler<UpdateAvailability> for LeaseStore {
    type Result = ();
    fn handle(&mut self, msg: UpdateAvailability, _: &mut Self::Context) {
        self.ledger().book.upsert(msg.0, Instant::now());
    }
}

impl Handler<RemoveProxy> for LeaseStore {
    type Result = ();
    fn handle(&mut self, msg: RemoveProxy, _: &mut Self::Context) {
        let mut ledger = self.ledger();
        ledger.book.remove(&msg.0, Instant::now());
        let _ = ledger.persist();
    }
}

impl Ledger {
    /// Takes back a grant that could not be made durable: never hand out a
    /// lease a restart or failover would forget.
    fn take_back(&mut self, grant: &Grant, why: &JournalError) -> AcquireError {
        self.book.cancel(&grant.id, Instant::now());
        let _ = self.persist();
        AcquireError::Unavailable(format!("lease state could not be saved: {why}"))
    }

    /// Counts and logs the outcome of an acquire.
    fn account(&mut self, result: &Result<Grant, AcquireError>) {
        let event = match result {
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
            Err(AcquireError::Unavailable(_)) => LeaseEvent::Denied {
                reason: "unavailable",
            },
            Err(AcquireError::NotLeader) => LeaseEvent::Denied { reason: "not_leader" },
            Err(AcquireError::Full(_)) => LeaseEvent::Denied { reason: "store_full" },
            Err(_) => LeaseEvent::Denied { reason: "invalid" },
        };
        event.emit(self.book.active_leases());
    }

    /// A gateway lease: never journaled (it ends with this process), so
    /// nothing to wait for; whatever else changed is written behind (a
    /// failure is logged there).
    fn acquire_unjournaled(&mut self, request: &AcquireRequest) -> Result<Grant, AcquireError> {
        let result = if self.leading() {
            self.book.acquire(request, Instant::now())
        } else {
            Err(AcquireError::NotLeader)
        };
        let _ = self.persist();
        self.account(&result);
        result
    }

    fn leading(&self) -> bool {
        self.tenure.as_ref().is_none_or(Tenure::is_leading)
    }

    /// Ends a lease; whether it was held.
    fn release(&mut self, id: &str) -> bool {
        let held = self.book.release(id, Instant::now());
        if held {
            self.stats.released += 1;
            metrics().leases_active.set(self.book.active_leases() as i64);
        }
        held
    }
}

impl Handler<Acquire> for LeaseStore {
    type Result = ResponseActFuture<Self, Result<Grant, AcquireError>>;
    fn handle(&mut self, msg: Acquire, _: &mut Self::Context) -> Self::Result {
        let mut ledger = self.ledger();
        if msg.0.client.as_deref().is_some_and(is_gateway_client) {
            return Box::pin(fut::ready(ledger.acquire_unjournaled(&msg.0)));
        }
        if !ledger.leading() {
            let result = Err(AcquireError::NotLeader);
            ledger.account(&result);
            return Box::pin(fut::ready(result));
        }
        let grant = match ledger.book.acquire(&msg.0, Instant::now()) {
            Ok(grant) => grant,
            Err(e) => {
                let result = Err(e);
                ledger.account(&result);
                return Box::pin(fut::ready(result));
            }
        };
        drop(ledger);
        self.when_durable(move |outcome, ledger| {
            let result = match outcome {
                // Written, but leadership lapsed meanwhile: the next leader
                // may not have read it.
                Ok(()) if !ledger.leading() => {
                    ledger.book.cancel(&grant.id, Instant::now());
                    let _ = ledger.persist();
                    Err(AcquireError::NotLeader)
                }
                Ok(()) => Ok(grant),
                Err(e) => Err(ledger.take_back(&grant, &e)),
            };
            ledger.account(&result);
            result
        })
    }
}

impl LeaseStore {
    /// Waits (at most [`DURABLE_WITHIN`]) until the changes just made are
    /// durable, then answers with `finish(outcome, ledger)`.
    fn when_durable<T: 'static>(
        &mut self,
        finish: impl FnOnce(Result<(), JournalError>, &mut Ledger) -> T + 'static,
    ) -> ResponseActFuture<Self, T> {
        let mut ledger = self.ledger();
        match ledger.persist() {
            Ok(Durable::Now) => Box::pin(fut::ready(finish(Ok(()), &mut ledger))),
            Err(e) => Box::pin(fut::ready(finish(Err(e), &mut ledger))),
            Ok(Durable::Later(flush)) => {
                drop(ledger);
                Box::pin(
                    async move { tokio::time::timeout(DURABLE_WITHIN, flush).await }
                        .into_actor(self)
                        .map(|flushed, store, _| {
                            let outcome =
                                flushed.unwrap_or_else(|_| Err(JournalError::Timeout(DURABLE_WITHIN)));
                            finish(outcome, &mut store.ledger())
                        }),
                )
            }
        }
    }

    /// Answers `value` once the changes just made are durable. Should the
    /// journal fail, the change stands in memory (logged): a release or a
    /// rest a restart might forget errs on the side of resting a proxy.
    fn answer_when_durable<T: 'static>(&mut self, value: T) -> ResponseActFuture<Self, T> {
        self.when_durable(move |outcome, _| {
            if let Err(e) = outcome {
                tracing::warn!(error = %e, "a lease change may not survive a restart");
            }
            value
        })
    }
}

impl Handler<Release> for LeaseStore {
    type Result = ResponseActFuture<Self, bool>;
    fn handle(&mut self, msg: Release, _: &mut Self::Context) -> Self::Result {
        let held = self.ledger().release(&msg.0);
        self.answer_when_durable(held)
    }
}

impl Handler<Report> for LeaseStore {
    type Result = ResponseActFuture<Self, Result<(), UnknownLease>>;
    fn handle(&mut self, msg: Report, _: &mut Self::Context) -> Self::Result {
        let result = self
            .ledger()
            .book
            .report(&msg.id, msg.outcome, msg.detail, Instant::now());
        self.answer_when_durable(result)
    }
}

impl Handler<Renew> for LeaseStore {
    type Result = ResponseActFuture<Self, Result<Duration, RenewError>>;
    fn handle(&mut self, msg: Renew, _: &mut Self::Context) -> Self::Result {
        let mut ledger = self.ledger();
        if !ledger.leading() {
            return Box::pin(fut::ready(Err(RenewError::NotLeader)));
        }
        let ttl = match ledger.book.renew(&msg.id, msg.ttl, Instant::now()) {
            Ok(ttl) => ttl,
            Err(e) => return Box::pin(fut::ready(Err(e))),
        };
        drop(ledger);
        // Like a grant, a renewal is answered once durable: a forgotten one
        // would free the proxy while its crawler still uses it.
        self.when_durable(move |outcome, ledger| match outcome {
            Ok(()) if ledger.leading() => Ok(ttl),
            Ok(()) => Err(RenewError::NotLeader),
            Err(e) => Err(RenewError::Unavailable(format!(
                "the renewal could not be saved: {e}"
            ))),
        })
    }
}

impl Handler<GetLeaseFootprint> for LeaseStore {
    type Result = MessageResult<GetLeaseFootprint>;
    fn handle(&mut self, _: GetLeaseFootprint, _: &mut Self::Context) -> Self::Result {
        MessageResult(self.ledger().book.footprint())
    }
}

impl Handler<GetPoolFigures> for LeaseStore {
    type Result = MessageResult<GetPoolFigures>;
    fn handle(&mut self, ask: GetPoolFigures, _: &mut Self::Context) -> Self::Result {
        MessageResult(self.ledger().book.pool_figures(&ask.pool, &ask.members))
    }
}

impl Handler<ReportPool> for LeaseStore {
    type Result = ();
    fn handle(&mut self, ReportPool(report): ReportPool, _: &mut Self::Context) {
        if self.pools.len() >= MAX_POOL_REPORTS && !self.pools.contains_key(&report.key) {
            tracing::debug!(pool = %report.key, "too many pools reported; not shown on the dashboard");
            return;
        }
        self.pools.insert(report.key.clone(), report);
    }
}

impl Handler<ForgetPool> for LeaseStore {
    type Result = ();
    fn handle(&mut self, ForgetPool(key): ForgetPool, _: &mut Self::Context) {
        self.pools.remove(&key);
    }
}

impl Handler<ListProxies> for LeaseStore {
    type Result = MessageResult<ListProxies>;
    fn handle(&mut self, _: ListProxies, _: &mut Self::Context) -> Self::Result {
        MessageResult(self.ledger().book.proxies())
    }
}

impl Handler<GetLeaseDashboard> for LeaseStore {
    type Result = MessageResult<GetLeaseDashboard>;
    fn handle(&mut self, _: GetLeaseDashboard, _: &mut Self::Context) -> Self::Result {
        let ledger = self.ledger();
        let mut stats = ledger.stats;
        stats.active = ledger.book.active_leases();
        MessageResult(LeaseDashboard {
            proxies: ledger.book.proxies(),
            stats,
            recent_denials: ledger.recent_denials.iter().cloned().collect(),
            pools: self.pools.values().cloned().collect(),
        })
    }
}

impl Handler<GetLeaseStats> for LeaseStore {
    type Result = MessageResult<GetLeaseStats>;
    fn handle(&mut self, _: GetLeaseStats, _: &mut Self::Context) -> Self::Result {
        let ledger = self.ledger();
        MessageResult(LeaseStats {
            active: ledger.book.active_leases(),
            ..ledger.stats
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use egress_proxies::lease::{Availability, GATEWAY_CLIENT};

    fn ready(name: &str) -> Availability {
        Availability {
            key: ObjectKey::new("ns", name),
            ready: true,
            phase: "Ready".into(),
            healthy: Some(true),
            url: Some(format!("http://{name}:3128")),
            attributes: Default::default(),
            latency: Some(Duration::from_millis(5)),
            credentials: None,
            realm: None,
            retiring: false,
        }
    }

    fn ask(client: &str) -> AcquireRequest {
        AcquireRequest {
            target: "example.com".into(),
            client: Some(client.into()),
            ..Default::default()
        }
    }

    /// The desk and the mailbox lease from one book: a gateway lease fills
    /// the proxy for an API client and the other way round.
    #[actix_rt::test]
    async fn the_desk_and_the_mailbox_share_one_book() {
        let settings = LeaseSettings {
            capacity: 1,
            cooldown: Duration::ZERO,
            ..Default::default()
        };
        let store = LeaseStore::new(settings);
        let desk = store.desk();
        let store = store.start();
        store.send(UpdateAvailability(ready("p"))).await.unwrap();

        let gateway = desk.acquire(&ask(GATEWAY_CLIENT)).expect("a gateway lease");
        let api = store.send(Acquire(ask("crawler"))).await.unwrap();
        assert!(matches!(api, Err(AcquireError::NoCapacity { .. })), "{api:?}");

        desk.release(&gateway.id);
        let api = store.send(Acquire(ask("crawler"))).await.unwrap().expect("freed");
        let refused = desk.acquire(&ask(GATEWAY_CLIENT));
        assert!(
            matches!(refused, Err(AcquireError::NoCapacity { .. })),
            "{refused:?}"
        );

        assert!(store.send(Release(api.id)).await.unwrap());
        let stats = store.send(GetLeaseStats).await.unwrap();
        assert_eq!(
            (stats.granted, stats.denied, stats.released, stats.active),
            (2, 2, 2, 0)
        );
    }

    /// A report at the desk is in the book when it returns: the next
    /// acquire already avoids the proxy it rested.
    #[actix_rt::test]
    async fn a_report_at_the_desk_counts_before_the_next_acquire() {
        let settings = LeaseSettings {
            capacity: 0,
            cooldown: Duration::ZERO,
            ..Default::default()
        };
        let store = LeaseStore::new(settings);
        let desk = store.desk();
        let store = store.start();
        for name in ["a", "b"] {
            store.send(UpdateAvailability(ready(name))).await.unwrap();
        }
        let first = desk.acquire(&ask(GATEWAY_CLIENT)).unwrap();
        desk.report(&first.id, Outcome::Error, "gateway: refused".into())
            .unwrap();
        desk.release(&first.id);
        for _ in 0..10 {
            let next = desk.acquire(&ask(GATEWAY_CLIENT)).unwrap();
            assert_ne!(next.proxy, first.proxy, "the proxy reported failing rests");
            desk.release(&next.id);
        }
        assert!(matches!(desk.renew("no-such-lease"), Err(RenewError::Unknown(_))));
    }
}
