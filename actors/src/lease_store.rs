//! `LeaseStore`: owns the lease book. ProxyActors push availability into
//! it; discovery API handlers ask it for leases. Expired leases are swept
//! every second. With a journal, every change is made durable before the
//! answer leaves: a grant the journal could not keep is taken back and
//! answered 503, so no client holds a lease a restart would forget.

use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use actix::prelude::*;
use egress_proxies::adapters::leader::Tenure;
use egress_proxies::domain::lease::fair_share::Turn;
use egress_proxies::domain::lease::{
    AcquireError, AcquireRequest, Act, Availability, Caller, Durable, FairShare, Footprint, Grant,
    JournalError, LeaseBook, LeaseChange, LeaseJournal, LeaseLimits, LeaseSettings, NotOwner, Outcome,
    PoolFigures, ProxyView, RenewError, UnknownLease, is_gateway_client, owner_key,
};
use egress_proxies::domain::resource::ObjectKey;
use egress_proxies::domain::resource::ProxyPoolStatus;
use egress_proxies::telemetry::events::LeaseEvent;
use egress_proxies::telemetry::metrics;

pub use crate::lease_turns::Granted;
use crate::lease_turns::Turns;

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

/// Why a report was not taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReportRefused {
    #[error(transparent)]
    Unknown(#[from] UnknownLease),
    #[error(transparent)]
    NotOwner(#[from] NotOwner),
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

/// Why a lease was not renewed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RenewRefused {
    #[error(transparent)]
    Renew(#[from] RenewError),
    #[error(transparent)]
    NotOwner(#[from] NotOwner),
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
    pub proxies: Vec<egress_proxies::domain::lease::ProxyView>,
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
    /// Gateway requests waiting in turn, and fair shares' state.
    turns: Turns,
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
            book: LeaseBook::with_limits(settings, limits, egress_proxies::adapters::clock::now()),
            stats: LeaseStats::default(),
            recent_denials: std::collections::VecDeque::new(),
            journal: None,
            unsaved: Vec::new(),
            last_prune: Instant::now(),
            tenure: None,
            turns: Turns::default(),
        })
    }

    /// Fair shares between crawler identities weighted so (default: equal).
    pub fn with_fair_share(self, weights: FairShare) -> Self {
        self.ledger().turns = Turns::new(weights);
        self
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
    pub fn acquire(&self, request: &AcquireRequest) -> Result<Granted, AcquireError> {
        debug_assert!(request.client.as_deref().is_some_and(is_gateway_client));
        let mut ledger = locked(&self.0);
        let result = ledger.acquire_unjournaled(request);
        ledger.account(&result);
        result.map(|grant| ledger.turns.granted_to_gateway(grant, request.owner.as_deref()))
    }

    /// A gateway lease as [`Self::acquire`], waiting in turn until `until`
    /// when no proxy is free (or the identity is over its fair share):
    /// freed proxies go to waiters in fair order. Dropping the future
    /// leaves the queue, cancelling a lease granted meanwhile. A wait
    /// that ends unserved counts as one denial.
    pub fn acquire_within(
        &self,
        request: AcquireRequest,
        until: Instant,
    ) -> impl Future<Output = Result<Granted, AcquireError>> + Send + 'static {
        let desk = self.clone();
        async move {
            let (seq, receive) = {
                let mut ledger = locked(&desk.0);
                let result = ledger.acquire_unjournaled(&request);
                match result {
                    Err(AcquireError::NoCapacity { .. } | AcquireError::OverShare { .. })
                        if Instant::now() < until =>
                    {
                        let (seq, receive) = ledger.turns.enqueue(request.clone());
                        // A hog's lease may be taken back for it at once.
                        ledger.serve_waiters();
                        (seq, receive)
                    }
                    other => {
                        ledger.account(&other);
                        return other
                            .map(|grant| ledger.turns.granted_to_gateway(grant, request.owner.as_deref()));
                    }
                }
            };
            let mut turn = InTurn {
                desk: desk.clone(),
                seq,
                receive: Some(receive),
            };
            turn.wait(&request, until).await
        }
    }

    /// Gives a lease back (the gateway's own only); its proxy rests for
    /// the target for `rest` (none: the cooldown).
    pub fn release(&self, id: &str, rest: Option<Duration>) {
        let mut ledger = locked(&self.0);
        if ledger
            .book
            .check_owner(id, &Caller::Gateway, Act::Release, Instant::now())
            .is_err()
        {
            return;
        }
        ledger.release(id, rest);
        let _ = ledger.persist();
    }

    /// Reports how a lease's proxy did (the gateway's own leases only).
    pub fn report(&self, id: &str, outcome: Outcome, detail: String) -> Result<(), ReportRefused> {
        let mut ledger = locked(&self.0);
        let now = Instant::now();
        ledger.book.check_owner(id, &Caller::Gateway, Act::Report, now)?;
        let result = ledger.book.report(id, outcome, Some(detail), now);
        let _ = ledger.persist();
        Ok(result?)
    }

    /// Extends a lease by its TTL (the gateway's own leases only).
    pub fn renew(&self, id: &str) -> Result<Duration, RenewRefused> {
        let mut ledger = locked(&self.0);
        if !ledger.leading() {
            return Err(RenewError::NotLeader.into());
        }
        let now = Instant::now();
        ledger.book.check_owner(id, &Caller::Gateway, Act::Renew, now)?;
        let renewed = ledger.book.renew(id, None, now).map_err(RenewRefused::from);
        let _ = ledger.persist();
        renewed
    }
}

/// A gateway request waiting in turn; leaving the queue when dropped.
struct InTurn {
    desk: LeaseDesk,
    seq: u64,
    /// Taken once the lease arrived (or the wait ended).
    receive: Option<tokio::sync::oneshot::Receiver<Granted>>,
}

impl InTurn {
    async fn wait(&mut self, request: &AcquireRequest, until: Instant) -> Result<Granted, AcquireError> {
        let mut opening = Some(locked(&self.desk.0).turns.watch_opening());
        loop {
            let Some(receive) = self.receive.as_mut() else {
                return Err(AcquireError::NoCapacity {
                    target: request.target.clone(),
                });
            };
            // Woken by the lease (served at a release or a pass), by a
            // rest ending (a pass then, unless one ran since), or at the end.
            let wake = opening
                .as_ref()
                .and_then(|o| *o.borrow())
                .map_or(until, |at| at.min(until));
            let changed = async {
                match opening.as_mut() {
                    Some(o) => o.changed().await.is_ok(),
                    None => std::future::pending().await,
                }
            };
            let woke = tokio::select! {
                granted = receive => Woke::Served(Box::new(granted)),
                () = tokio::time::sleep_until(wake.into()) => Woke::At(wake),
                alive = changed => Woke::Changed(alive),
            };
            match woke {
                Woke::Served(granted) => {
                    self.receive = None;
                    return (*granted)
                        .map_err(|_| AcquireError::Unavailable("the lease store restarted".into()));
                }
                Woke::Changed(alive) => {
                    if !alive {
                        opening = None;
                    }
                    continue;
                }
                Woke::At(at) => {
                    let desk = self.desk.clone();
                    let mut ledger = locked(&desk.0);
                    if Instant::now() < until {
                        if !ledger.turns.passed_since(at) {
                            ledger.serve_waiters();
                        }
                        continue;
                    }
                    return self.time_up(&mut ledger, request);
                }
            }
        }
    }

    /// Out of time: one denial for the whole wait, unless the lease came
    /// just now.
    fn time_up(&mut self, ledger: &mut Ledger, request: &AcquireRequest) -> Result<Granted, AcquireError> {
        if let Some(receive) = self.receive.as_mut()
            && let Ok(granted) = receive.try_recv()
        {
            self.receive = None;
            return Ok(granted);
        }
        self.receive = None;
        ledger.turns.leave(self.seq);
        ledger.book.count_denial(request);
        let refused = AcquireError::NoCapacity {
            target: request.target.clone(),
        };
        ledger.account(&Err(refused.clone()));
        // Shares it held others back by may have changed.
        ledger.serve_waiters();
        Err(refused)
    }
}

/// What ended a waiter's sleep.
enum Woke {
    Served(Box<Result<Granted, tokio::sync::oneshot::error::RecvError>>),
    At(Instant),
    /// The next opening moved; false: it never will again.
    Changed(bool),
}

impl Drop for InTurn {
    fn drop(&mut self) {
        let Some(mut receive) = self.receive.take() else {
            return;
        };
        // Gave up: out of the queue, and a lease granted meanwhile back.
        let mut ledger = locked(&self.desk.0);
        if ledger.turns.leave(self.seq).is_some() {
            ledger.serve_waiters();
            return;
        }
        if let Ok(granted) = receive.try_recv() {
            ledger.turns.ended(&granted.grant.id);
            ledger.book.cancel(&granted.grant.id, Instant::now());
            ledger.serve_waiters();
        }
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
            let now = Instant::now();
            let expired = ledger.book.sweep(now);
            let Ledger { turns, book, .. } = &mut *ledger;
            turns.tidy(book, now);
            ledger.serve_waiters();
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
        let mut ledger = self.ledger();
        ledger.book.upsert(msg.0, Instant::now());
        ledger.serve_waiters();
    }
}

impl Handler<RemoveProxy> for LeaseStore {
    type Result = ();
    fn handle(&mut self, msg: RemoveProxy, _: &mut Self::Context) {
        let mut ledger = self.ledger();
        let now = Instant::now();
        ledger.book.remove(&msg.0, now);
        let Ledger { turns, book, .. } = &mut *ledger;
        turns.tidy(book, now);
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
            Err(AcquireError::NoCapacity { target } | AcquireError::OverShare { target, .. }) => {
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
    /// failure is logged there). Not yet accounted (a waiting request is
    /// counted when its wait ends).
    fn acquire_unjournaled(&mut self, request: &AcquireRequest) -> Result<Grant, AcquireError> {
        let result = if self.leading() {
            self.serve_waiters();
            self.acquire_fairly(request, false)
        } else {
            Err(AcquireError::NotLeader)
        };
        let _ = self.persist();
        result
    }

    /// A lease from the book if the owner's fair share allows; a request
    /// that `counts` (does not wait) is a denial for its pool if refused.
    fn acquire_fairly(&mut self, request: &AcquireRequest, counts: bool) -> Result<Grant, AcquireError> {
        let now = Instant::now();
        if let Turn::OverShare { held, share, .. } =
            self.turns.turn(&self.book, request.owner.as_deref(), now)
        {
            return Err(AcquireError::OverShare {
                target: request.target.clone(),
                held,
                share,
            });
        }
        if counts {
            self.book.acquire(request, now)
        } else {
            self.book.try_acquire(request, now)
        }
    }

    /// Freed proxies to the waiting gateway requests, in turn; leases
    /// taken back for those below their share.
    fn serve_waiters(&mut self) {
        if !self.turns.is_waiting() || !self.leading() {
            return;
        }
        let now = Instant::now();
        let Ledger { turns, book, .. } = self;
        let pass = turns.pass(book, now, |book, request| book.try_acquire(request, now).ok());
        for grant in pass.granted {
            self.account(&Ok(grant));
        }
    }

    fn leading(&self) -> bool {
        self.tenure.as_ref().is_none_or(Tenure::is_leading)
    }

    /// Ends a lease; whether it was held. Its proxy goes to a waiter first.
    fn release(&mut self, id: &str, rest: Option<Duration>) -> bool {
        // Taken back for a waiter: a rest for its target would keep the
        // waiter from the proxy it was freed for.
        let rest = if self.turns.reclaiming(id) {
            Some(Duration::ZERO)
        } else {
            rest
        };
        let held = match rest {
            Some(rest) => self.book.release_with_rest(id, rest, Instant::now()),
            None => self.book.release(id, Instant::now()),
        };
        self.turns.ended(id);
        if held {
            self.stats.released += 1;
            metrics().leases_active.set(self.book.active_leases() as i64);
            self.serve_waiters();
        }
        held
    }
}

impl Handler<Acquire> for LeaseStore {
    type Result = ResponseActFuture<Self, Result<Grant, AcquireError>>;
    fn handle(&mut self, msg: Acquire, _: &mut Self::Context) -> Self::Result {
        let mut ledger = self.ledger();
        if msg.0.client.as_deref().is_some_and(is_gateway_client) {
            let result = ledger.acquire_unjournaled(&msg.0);
            ledger.account(&result);
            return Box::pin(fut::ready(result));
        }
        if !ledger.leading() {
            let result = Err(AcquireError::NotLeader);
            ledger.account(&result);
            return Box::pin(fut::ready(result));
        }
        // Waiting gateway requests first: an API acquire never takes a
        // proxy a waiter could use.
        ledger.serve_waiters();
        let grant = match ledger.acquire_fairly(&msg.0, true) {
            Ok(grant) => grant,
            Err(e) => {
                if matches!(
                    e,
                    AcquireError::NoCapacity { .. } | AcquireError::OverShare { .. }
                ) {
                    let owner = owner_key(msg.0.owner.as_deref()).to_owned();
                    ledger.turns.api_refused(&owner, Instant::now());
                    // Refused: it asks now, so hogs' tunnels may go back for it.
                    ledger.serve_waiters();
                }
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
    type Result = ResponseActFuture<Self, Result<bool, NotOwner>>;
    fn handle(&mut self, msg: Release, _: &mut Self::Context) -> Self::Result {
        let mut ledger = self.ledger();
        // Checked under the same lock as the release: nothing between.
        if let Err(refused) = ledger
            .book
            .check_owner(&msg.id, &msg.by, Act::Release, Instant::now())
        {
            return Box::pin(fut::ready(Err(refused)));
        }
        let held = ledger.release(&msg.id, None);
        drop(ledger);
        self.answer_when_durable(Ok(held))
    }
}

impl Handler<Report> for LeaseStore {
    type Result = ResponseActFuture<Self, Result<(), ReportRefused>>;
    fn handle(&mut self, msg: Report, _: &mut Self::Context) -> Self::Result {
        let mut ledger = self.ledger();
        let now = Instant::now();
        if let Err(refused) = ledger.book.check_owner(&msg.id, &msg.by, Act::Report, now) {
            return Box::pin(fut::ready(Err(refused.into())));
        }
        let result = ledger
            .book
            .report(&msg.id, msg.outcome, msg.detail, now)
            .map_err(ReportRefused::from);
        drop(ledger);
        self.answer_when_durable(result)
    }
}

impl Handler<Renew> for LeaseStore {
    type Result = ResponseActFuture<Self, Result<Duration, RenewRefused>>;
    fn handle(&mut self, msg: Renew, _: &mut Self::Context) -> Self::Result {
        let mut ledger = self.ledger();
        if !ledger.leading() {
            return Box::pin(fut::ready(Err(RenewError::NotLeader.into())));
        }
        let now = Instant::now();
        if let Err(refused) = ledger.book.check_owner(&msg.id, &msg.by, Act::Renew, now) {
            return Box::pin(fut::ready(Err(refused.into())));
        }
        let ttl = match ledger.book.renew(&msg.id, msg.ttl, now) {
            Ok(ttl) => ttl,
            Err(e) => return Box::pin(fut::ready(Err(e.into()))),
        };
        drop(ledger);
        // Like a grant, a renewal is answered once durable: a forgotten one
        // would free the proxy while its crawler still uses it.
        self.when_durable(move |outcome, ledger| match outcome {
            Ok(()) if ledger.leading() => Ok(ttl),
            Ok(()) => Err(RenewError::NotLeader.into()),
            Err(e) => Err(RenewError::Unavailable(format!("the renewal could not be saved: {e}")).into()),
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
pub(crate) mod tests {
    use super::*;
    use egress_proxies::domain::lease::{Availability, GATEWAY_CLIENT};

    /// A Ready proxy `ns/<name>` as the ProxyActor reports it.
    pub(crate) fn ready(name: &str) -> Availability {
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

        let gateway = desk.acquire(&ask(GATEWAY_CLIENT)).expect("a gateway lease").grant;
        let api = store.send(Acquire(ask("crawler"))).await.unwrap();
        assert!(matches!(api, Err(AcquireError::NoCapacity { .. })), "{api:?}");

        desk.release(&gateway.id, None);
        let api = store.send(Acquire(ask("crawler"))).await.unwrap().expect("freed");
        let refused = desk.acquire(&ask(GATEWAY_CLIENT));
        assert!(
            matches!(refused, Err(AcquireError::NoCapacity { .. })),
            "{refused:?}"
        );

        let by = |who: &str| Caller::Identity(who.into());
        let refused = store
            .send(Release {
                id: gateway.id.clone(),
                by: by("default"),
            })
            .await
            .unwrap();
        assert!(refused.is_err(), "a gateway lease is the gateway's: {refused:?}");
        assert!(
            store
                .send(Release {
                    id: api.id,
                    by: by("anyone"),
                })
                .await
                .unwrap()
                .unwrap(),
            "an API lease without an owner: anyone's"
        );
        let stats = store.send(GetLeaseStats).await.unwrap();
        assert_eq!(
            (stats.granted, stats.denied, stats.released, stats.active),
            (2, 2, 2, 0)
        );
    }

    fn owned(owner: &str) -> AcquireRequest {
        AcquireRequest {
            owner: Some(owner.into()),
            ..ask(GATEWAY_CLIENT)
        }
    }

    fn one_proxy_store() -> (Addr<LeaseStore>, LeaseDesk) {
        let settings = LeaseSettings {
            capacity: 1,
            cooldown: Duration::ZERO,
            ..Default::default()
        };
        let store = LeaseStore::new(settings);
        let desk = store.desk();
        (store.start(), desk)
    }

    /// A waiting request gets the proxy the moment it is released, ahead
    /// of an API acquire; a wait that ends unserved is one denial however
    /// long it waited.
    #[actix_rt::test]
    async fn a_waiter_is_served_at_the_release_and_an_unserved_wait_is_one_denial() {
        let (store, desk) = one_proxy_store();
        store.send(UpdateAvailability(ready("p"))).await.unwrap();
        let held = desk.acquire(&owned("a")).unwrap().grant;

        let waiting = tokio::spawn(desk.acquire_within(owned("b"), Instant::now() + Duration::from_secs(10)));
        tokio::time::sleep(Duration::from_millis(50)).await;
        let released = Instant::now();
        desk.release(&held.id, None);
        let api = store.send(Acquire(ask("crawler"))).await.unwrap();
        assert!(
            matches!(api, Err(AcquireError::NoCapacity { .. })),
            "the waiter's first: {api:?}"
        );
        let granted = waiting.await.unwrap().expect("served");
        assert!(
            released.elapsed() < Duration::from_secs(1),
            "{:?}",
            released.elapsed()
        );

        let denied_before = store.send(GetLeaseStats).await.unwrap().denied;
        let refused = desk
            .acquire_within(owned("c"), Instant::now() + Duration::from_millis(1200))
            .await;
        assert!(
            matches!(refused, Err(AcquireError::NoCapacity { .. })),
            "{refused:?}"
        );
        let stats = store.send(GetLeaseStats).await.unwrap();
        assert_eq!(stats.denied - denied_before, 1, "one wait, one denial");
        desk.release(&granted.grant.id, None);
    }

    /// A waiter whose only proxy rests for its target (a gateway pacing
    /// rest) is served when the rest ends, without a lease ending.
    #[actix_rt::test]
    async fn a_waiter_is_served_when_a_rest_for_its_target_ends() {
        let (store, desk) = one_proxy_store();
        store.send(UpdateAvailability(ready("p"))).await.unwrap();
        let held = desk.acquire(&owned("a")).unwrap().grant;
        let waiting = tokio::spawn(desk.acquire_within(owned("b"), Instant::now() + Duration::from_secs(10)));
        tokio::time::sleep(Duration::from_millis(50)).await;
        let released = Instant::now();
        desk.release(&held.id, Some(Duration::from_millis(300)));
        waiting.await.unwrap().expect("served");
        let after = released.elapsed();
        assert!(
            after >= Duration::from_millis(300) && after < Duration::from_millis(420),
            "served {after:?} after the release, the rest being 300 ms"
        );
    }

    /// A hog's tunnel taken back for a waiter goes to it whatever rest the
    /// hog's release would leave (here the lease cooldown, 30 s).
    #[actix_rt::test]
    async fn a_lease_taken_back_goes_to_the_waiter_without_a_rest() {
        let store = LeaseStore::new(LeaseSettings {
            capacity: 1,
            cooldown: Duration::from_secs(30),
            ..Default::default()
        });
        let desk = store.desk();
        let store = store.start();
        for name in ["p1", "p2", "p3"] {
            store.send(UpdateAvailability(ready(name))).await.unwrap();
        }
        let hog: Vec<Granted> = (0..3).map(|_| desk.acquire(&owned("a")).unwrap()).collect();
        let waiting = tokio::spawn(desk.acquire_within(owned("b"), Instant::now() + Duration::from_secs(5)));
        let revoked = tokio::time::timeout(Duration::from_secs(2), hog[2].revoked.clone().revoked()).await;
        assert!(revoked.is_ok(), "the latest of the hog's leases is taken back");
        assert!(!hog[0].revoked.is_revoked() && !hog[1].revoked.is_revoked());
        // Its tunnel closes: released as a sticky session's would be, with the cooldown.
        desk.release(&hog[2].grant.id, None);
        let granted = tokio::time::timeout(Duration::from_secs(1), waiting)
            .await
            .expect("served at once")
            .unwrap()
            .expect("a lease");
        assert_eq!(granted.grant.proxy, hog[2].grant.proxy);
    }

    /// A waiter that gives up leaves the queue: the proxy freed later is
    /// not granted to it.
    #[actix_rt::test]
    async fn a_waiter_that_gave_up_leaves_no_lease_behind() {
        let (store, desk) = one_proxy_store();
        store.send(UpdateAvailability(ready("p"))).await.unwrap();
        let held = desk.acquire(&owned("a")).unwrap().grant;
        let gave_up = tokio::time::timeout(
            Duration::from_millis(100),
            desk.acquire_within(owned("b"), Instant::now() + Duration::from_secs(10)),
        )
        .await;
        assert!(gave_up.is_err());
        desk.release(&held.id, None);
        let stats = store.send(GetLeaseStats).await.unwrap();
        assert_eq!(stats.active, 0, "nothing granted to the one that left");
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
        let first = desk.acquire(&ask(GATEWAY_CLIENT)).unwrap().grant;
        desk.report(&first.id, Outcome::Error, "gateway: refused".into())
            .unwrap();
        desk.release(&first.id, None);
        for _ in 0..10 {
            let next = desk.acquire(&ask(GATEWAY_CLIENT)).unwrap().grant;
            assert_ne!(next.proxy, first.proxy, "the proxy reported failing rests");
            desk.release(&next.id, None);
        }
        assert!(matches!(
            desk.renew("no-such-lease"),
            Err(RenewRefused::Renew(RenewError::Unknown(_)))
        ));
    }
}
