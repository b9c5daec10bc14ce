//! What the lease API's clients ask of the lease store (through the
//! operator's `LeaseStoreActor`): each change is answered once the journal
//! has made it durable, within [`DURABLE_WITHIN`].

use std::time::{Duration, Instant};

use futures::FutureExt;
use futures::future::BoxFuture;

use crate::domain::lease::{
    AcquireError, AcquireRequest, Act, Caller, Durable, Grant, JournalError, NotOwner, Outcome, RenewError,
    is_gateway_client, owner_key,
};

use super::{LeaseStore, RenewRefused, ReportRefused, State};

/// A grant whose journal has not made it durable by then is taken back (503).
pub const DURABLE_WITHIN: Duration = Duration::from_secs(5);

impl LeaseStore {
    /// A lease for a client of the lease API, answered once durable (a
    /// gateway client's lease is never journaled: answered at once).
    pub fn acquire_durably(
        &self,
        request: AcquireRequest,
    ) -> BoxFuture<'static, Result<Grant, AcquireError>> {
        let mut state = self.lock();
        if request.client.as_deref().is_some_and(is_gateway_client) {
            let result = state.acquire_unjournaled(&request);
            state.account(&result);
            return futures::future::ready(result).boxed();
        }
        if let Some(refusal) = state.refusal() {
            let result = Err(refusal.acquire());
            state.account(&result);
            return futures::future::ready(result).boxed();
        }
        // Waiting gateway requests first: an API acquire never takes a
        // proxy a waiter could use.
        state.serve_waiters();
        let grant = match state.acquire_fairly(&request, true) {
            Ok(grant) => grant,
            Err(e) => {
                if matches!(
                    e,
                    AcquireError::NoCapacity { .. } | AcquireError::OverShare { .. }
                ) {
                    let owner = owner_key(request.owner.as_deref()).to_owned();
                    state.turns.api_refused(&owner, Instant::now());
                    // Refused: it asks now, so hogs' tunnels may go back for it.
                    state.serve_waiters();
                }
                let result = Err(e);
                state.account(&result);
                return futures::future::ready(result).boxed();
            }
        };
        drop(state);
        self.when_durable(move |outcome, state| {
            let result = match outcome {
                // Written, but leadership lapsed meanwhile: the next leader
                // may not have read it.
                Ok(()) if !state.serving() => {
                    state.book.cancel(&grant.id, Instant::now());
                    let _ = state.persist();
                    Err(state.refusal().map_or(AcquireError::NotLeader, |r| r.acquire()))
                }
                Ok(()) => Ok(grant),
                Err(e) => Err(state.take_back(&grant, &e)),
            };
            state.account(&result);
            result
        })
    }

    /// Ends a lease if `by` may (its owner): whether it was held.
    pub fn release_durably(&self, id: &str, by: &Caller) -> BoxFuture<'static, Result<bool, NotOwner>> {
        let mut state = self.lock();
        // Checked under the same lock as the release: nothing between.
        if let Err(refused) = state.book.check_owner(id, by, Act::Release, Instant::now()) {
            return futures::future::ready(Err(refused)).boxed();
        }
        let held = state.release(id, None);
        drop(state);
        self.answer_when_durable(Ok(held))
    }

    /// Reports how a lease's proxy did, if `by` may.
    pub fn report_durably(
        &self,
        id: &str,
        outcome: Outcome,
        detail: Option<String>,
        by: &Caller,
    ) -> BoxFuture<'static, Result<(), ReportRefused>> {
        let mut state = self.lock();
        let now = Instant::now();
        if let Err(refused) = state.book.check_owner(id, by, Act::Report, now) {
            return futures::future::ready(Err(refused.into())).boxed();
        }
        let result = state
            .book
            .report(id, outcome, detail, now)
            .map_err(ReportRefused::from);
        drop(state);
        self.answer_when_durable(result)
    }

    /// Extends a held lease from now (`ttl` none: its TTL as granted), if
    /// `by` may; answers the TTL applied once durable.
    pub fn renew_durably(
        &self,
        id: &str,
        ttl: Option<Duration>,
        by: &Caller,
    ) -> BoxFuture<'static, Result<Duration, RenewRefused>> {
        let mut state = self.lock();
        if let Some(refusal) = state.refusal() {
            return futures::future::ready(Err(refusal.renew().into())).boxed();
        }
        let now = Instant::now();
        if let Err(refused) = state.book.check_owner(id, by, Act::Renew, now) {
            return futures::future::ready(Err(refused.into())).boxed();
        }
        let ttl = match state.book.renew(id, ttl, now) {
            Ok(ttl) => ttl,
            Err(e) => return futures::future::ready(Err(e.into())).boxed(),
        };
        drop(state);
        // Like a grant, a renewal is answered once durable: a forgotten one
        // would free the proxy while its crawler still uses it.
        self.when_durable(move |outcome, state| match outcome {
            Ok(()) => match state.refusal() {
                None => Ok(ttl),
                Some(refusal) => Err(refusal.renew().into()),
            },
            Err(e) => Err(RenewError::Unavailable(format!("the renewal could not be saved: {e}")).into()),
        })
    }

    /// Waits (at most [`DURABLE_WITHIN`]) until the changes just made are
    /// durable, then answers with `finish(outcome, state)`. The changes
    /// are handed to the journal now, before this returns.
    pub(super) fn when_durable<T: Send + 'static>(
        &self,
        finish: impl FnOnce(Result<(), JournalError>, &mut State) -> T + Send + 'static,
    ) -> BoxFuture<'static, T> {
        let mut state = self.lock();
        match state.persist() {
            Ok(Durable::Now) => futures::future::ready(finish(Ok(()), &mut state)).boxed(),
            Err(e) => futures::future::ready(finish(Err(e), &mut state)).boxed(),
            Ok(Durable::Later(flush)) => {
                drop(state);
                let store = self.clone();
                async move {
                    let flushed = tokio::time::timeout(DURABLE_WITHIN, flush).await;
                    let outcome = flushed.unwrap_or(Err(JournalError::Timeout(DURABLE_WITHIN)));
                    finish(outcome, &mut store.lock())
                }
                .boxed()
            }
        }
    }

    /// Answers `value` once the changes just made are durable. Should the
    /// journal fail, the change stands in memory (logged): a release or a
    /// rest a restart might forget errs on the side of resting a proxy.
    fn answer_when_durable<T: Send + 'static>(&self, value: T) -> BoxFuture<'static, T> {
        self.when_durable(move |outcome, _| {
            if let Err(e) = outcome {
                tracing::warn!(error = %e, "a lease change may not survive a restart");
            }
            value
        })
    }
}
