//! The lease store: the lease book (`crate::domain::lease::LeaseBook`, the
//! pure decisions), its journal (a `LeaseJournal`: what a restart must not
//! forget), the gateway's waiting turns and the counters, behind one lock.
//! Every lease is taken here: by the gateway on its own threads, through
//! the [`Leases`](crate::adapters::gateway::Leases) port the store
//! implements ([`gateway_calls`]), and by the lease API's handlers through
//! the operator's `LeaseStoreActor`, which hosts the store, sweeps it every
//! second and rebuilds it when restarted ([`api_calls`]).
//!
//! ```text
//!  gateway ──Leases──► LeaseStore ◄── LeaseStoreActor ◄── lease API, ProxyActors, PoolActors
//!                        │ one lock: book · journal · turns · counters
//!                        ├─► LeaseBook (pure decisions)
//!                        └─► LeaseJournal ──► FileLeaseJournal | ConfigMapLeaseJournal
//! ```
//!
//! With a journal, an API client's change is durable before its answer
//! leaves: a grant the journal could not keep is taken back and answered
//! 503, so no client holds a lease a restart would forget.

mod api_calls;
mod gateway_calls;
mod shares;
#[cfg(test)]
mod shares_tests;
#[cfg(test)]
pub(super) mod tests;
mod turns;
mod waiting;

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crate::adapters::leader::Tenure;
use crate::domain::lease::fair_share::Turn;
use crate::domain::lease::{
    AcquireError, AcquireRequest, Availability, Durable, FairShare, Footprint, Grant, JournalError,
    LeaseBook, LeaseChange, LeaseJournal, LeaseLimits, LeaseSettings, NotOwner, PoolFigures, ProxyView,
    RenewError, UnknownLease,
};
use crate::domain::resource::ObjectKey;
use crate::telemetry::events::LeaseEvent;
use crate::telemetry::metrics;

pub use shares::{Allotment, FleetNews, ShareReport, ShareStatus, ShareUpdate};
pub use turns::API_ASKING_FOR;
use turns::Turns;

/// Why a report was not taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReportRefused {
    #[error(transparent)]
    Unknown(#[from] UnknownLease),
    #[error(transparent)]
    NotOwner(#[from] NotOwner),
}

/// Why a lease was not renewed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RenewRefused {
    #[error(transparent)]
    Renew(#[from] RenewError),
    #[error(transparent)]
    NotOwner(#[from] NotOwner),
}

/// Counters for tests, benchmarks and the dashboard.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LeaseStats {
    pub active: usize,
    pub granted: u64,
    pub denied: u64,
    pub expired: u64,
    pub released: u64,
}

/// What the dashboard shows of the lease store, read at one instant.
#[derive(Clone, Debug)]
pub struct LeaseOverview {
    pub proxies: Vec<ProxyView>,
    pub stats: LeaseStats,
    /// The latest denials, newest first: (target, when).
    pub recent_denials: Vec<(String, jiff::Timestamp)>,
}

/// How many recent denials the dashboard keeps.
const RECENT_DENIALS: usize = 20;
/// Changes kept for a journal that failed, retried with the next ones. Past
/// this many the oldest go (the journal has been failing for a long time).
const MAX_UNSAVED: usize = 100_000;
/// How often journaled state that has ended is pruned.
const PRUNE_EVERY: Duration = Duration::from_secs(60);

/// The lease store: a handle on its state, shared by the gateway's threads
/// and the actor that hosts it (clones are the same store).
#[derive(Clone)]
pub struct LeaseStore(Arc<Mutex<State>>);

/// What the lock guards: the book, its journal, the waiting turns, the counters.
struct State {
    book: LeaseBook,
    stats: LeaseStats,
    recent_denials: VecDeque<(String, jiff::Timestamp)>,
    journal: Option<Box<dyn LeaseJournal>>,
    /// Changes the journal has not taken yet (it failed), oldest first.
    unsaved: Vec<LeaseChange>,
    last_prune: Instant,
    tenure: Option<Tenure>,
    /// Gateway requests waiting in turn, and fair shares' state.
    turns: Turns,
    /// Serving from a capacity share (every replica serving).
    share: Option<shares::Share>,
}

impl LeaseStore {
    /// Leases in memory only: a restart forgets them.
    pub fn new(settings: LeaseSettings) -> Self {
        Self::with_limits(settings, LeaseLimits::default())
    }

    pub fn with_limits(settings: LeaseSettings, limits: LeaseLimits) -> Self {
        Self(Arc::new(Mutex::new(State {
            book: LeaseBook::with_limits(settings, limits, crate::adapters::clock::now()),
            stats: LeaseStats::default(),
            recent_denials: VecDeque::new(),
            journal: None,
            unsaved: Vec::new(),
            last_prune: Instant::now(),
            tenure: None,
            turns: Turns::default(),
            share: None,
        })))
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
            let mut state = store.lock();
            state.book.restore(snapshot, Instant::now());
            state.book.journal_changes();
            state.journal = Some(journal);
            metrics().leases_active.set(state.book.active_leases() as i64);
        }
        Ok(store)
    }

    /// Fair shares between crawler identities weighted so (default: equal).
    pub fn with_fair_share(self, weights: FairShare) -> Self {
        self.lock().turns = Turns::new(weights);
        self
    }

    /// Grants only while `tenure` lasts, checked at the moment of each grant.
    pub fn with_tenure(self, tenure: Tenure) -> Self {
        self.lock().tenure = Some(tenure);
        self
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic under the lock is what supervision restarts the store's
        // actor for; its restart rebuilds the book from its records
        // ([`Self::rebuild`]).
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A proxy's availability changed.
    pub fn upsert(&self, availability: Availability) {
        let mut state = self.lock();
        state.book.upsert(availability, Instant::now());
        state.serve_waiters();
    }

    /// A proxy is gone.
    pub fn remove(&self, proxy: &ObjectKey) {
        let mut state = self.lock();
        let now = Instant::now();
        state.book.remove(proxy, now);
        let State { turns, book, .. } = &mut *state;
        turns.tidy(book, now);
        let _ = state.persist();
    }

    /// The keeper's round, every second: expired leases swept, waiters
    /// served, changes written, ended state pruned now and then. Returns
    /// the leases active after it.
    pub fn tick(&self) -> usize {
        let mut state = self.lock();
        let now = Instant::now();
        let expired = state.book.sweep(now);
        state.cut_if_lapsed();
        let State { turns, book, .. } = &mut *state;
        turns.tidy(book, now);
        state.serve_waiters();
        let _ = state.persist();
        if state.last_prune.elapsed() >= PRUNE_EVERY
            && let Some(journal) = state.journal.as_mut()
        {
            if let Err(e) = journal.prune(jiff::Timestamp::now()) {
                tracing::warn!(error = %e, "pruning ended lease state failed");
            }
            state.last_prune = Instant::now();
        }
        state.stats.expired += expired as u64;
        if expired > 0 {
            LeaseEvent::Expired { count: expired }.emit(state.book.active_leases());
        }
        state.book.active_leases()
    }

    /// After a crash of its keeper: the book rebuilt from its records (the
    /// crash may have left its indexes half-updated). Answers that were
    /// waiting on the journal went with the crashed actor (their callers
    /// hear 503).
    pub fn rebuild(&self) {
        let mut state = self.lock();
        let now = Instant::now();
        let mut book = state.book.rebuilt(now);
        if state.journal.is_some() {
            let changes = state.book.take_changes();
            state.unsaved.extend(changes);
            book.journal_changes();
        }
        state.book = book;
        let _ = state.persist();
        tracing::info!(
            leases = state.book.active_leases(),
            "lease store restarted with its leases and rests"
        );
    }

    /// Every proxy the book knows, as listed.
    pub fn proxies(&self) -> Vec<ProxyView> {
        self.lock().book.proxies()
    }

    /// Sizes of the book's tables (tests show they stay bounded).
    pub fn footprint(&self) -> Footprint {
        self.lock().book.footprint()
    }

    /// A pool's members' lease figures and its refused acquires (taken:
    /// the next ask counts from here).
    pub fn pool_figures(&self, pool: &str, members: &[ObjectKey]) -> PoolFigures {
        self.lock().book.pool_figures(pool, members)
    }

    pub fn stats(&self) -> LeaseStats {
        let state = self.lock();
        LeaseStats {
            active: state.book.active_leases(),
            ..state.stats
        }
    }

    /// What the dashboard shows, under one lock.
    pub fn overview(&self) -> LeaseOverview {
        let state = self.lock();
        let mut stats = state.stats;
        stats.active = state.book.active_leases();
        LeaseOverview {
            proxies: state.book.proxies(),
            stats,
            recent_denials: state.recent_denials.iter().cloned().collect(),
        }
    }
}

impl State {
    /// Hands the book's latest changes to the journal.
    fn persist(&mut self) -> Result<Durable, JournalError> {
        let changes = self.book.take_changes();
        self.share_out(&changes);
        let Some(journal) = self.journal.as_mut() else {
            return Ok(Durable::Now);
        };
        self.unsaved.extend(changes);
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
        let result = match self.refusal() {
            None => {
                self.serve_waiters();
                self.acquire_fairly(request, false)
            }
            Some(refusal) => Err(refusal.acquire()),
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
        let result = if counts {
            self.book.acquire(request, now)
        } else {
            self.book.try_acquire(request, now)
        };
        if matches!(result, Err(AcquireError::NoCapacity { .. })) {
            self.note_refusal(now);
        }
        result
    }

    /// Freed proxies to the waiting gateway requests, in turn; leases
    /// taken back for those below their share.
    fn serve_waiters(&mut self) {
        if !self.turns.is_waiting() || self.refusal().is_some() {
            return;
        }
        let now = Instant::now();
        let State { turns, book, .. } = self;
        let pass = turns.pass(book, now, |book, request| book.try_acquire(request, now).ok());
        for grant in pass.granted {
            self.account(&Ok(grant));
        }
    }

    fn serving(&self) -> bool {
        self.refusal().is_none()
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
