//! The gateway's calls at the lease store: it takes, reports, renews and
//! gives back its leases on its own threads, under the store's lock,
//! instead of a mailbox round trip per request (two thread wake-ups each;
//! docs/benchmarks.md). Each call is done when it returns, so a failure
//! reported on one try is in the book before the next try is leased.
//! Gateway leases are never journaled (they end with the process), so no
//! call waits for a write; what else changed (a rest, a report) is written
//! behind, a failure logged there. The store is the gateway's [`Leases`].

use std::future::Future;
use std::time::{Duration, Instant};

use crate::adapters::gateway::{Ask, GatewayError, Leases, Upstream, Waiting};
use crate::domain::lease::{AcquireError, AcquireRequest, Act, Caller, Outcome, is_gateway_client};

use super::waiting::InTurn;
use super::{LeaseStore, RenewRefused, ReportRefused};

/// Asked for every gateway lease; the book caps it at `maxLeaseTtl`. A
/// tunnel's lease is renewed while it stays open, and every lease is
/// released the moment its request or tunnel ends.
const LEASE_TTL: Duration = Duration::from_secs(24 * 3600);

impl LeaseStore {
    /// A gateway lease (`request.client` names the gateway), or why not.
    pub fn acquire_for_gateway(&self, request: &AcquireRequest) -> Result<Upstream, AcquireError> {
        debug_assert!(request.client.as_deref().is_some_and(is_gateway_client));
        let mut state = self.lock();
        let result = state.acquire_unjournaled(request);
        state.account(&result);
        result.map(|grant| state.turns.granted_to_gateway(grant, request.owner.as_deref()))
    }

    /// A gateway lease as [`Self::acquire_for_gateway`], waiting in turn
    /// until `until` when no proxy is free (or the identity is over its
    /// fair share): freed proxies go to waiters in fair order. Dropping
    /// the future leaves the queue, cancelling a lease granted meanwhile.
    /// A wait that ends unserved counts as one denial.
    pub fn acquire_for_gateway_within(
        &self,
        request: AcquireRequest,
        until: Instant,
    ) -> impl Future<Output = Result<Upstream, AcquireError>> + Send + 'static {
        let store = self.clone();
        async move {
            let (seq, receive) = {
                let mut state = store.lock();
                let result = state.acquire_unjournaled(&request);
                match result {
                    Err(AcquireError::NoCapacity { .. } | AcquireError::OverShare { .. })
                        if Instant::now() < until =>
                    {
                        let (seq, receive) = state.turns.enqueue(request.clone());
                        // A hog's lease may be taken back for it at once.
                        state.serve_waiters();
                        (seq, receive)
                    }
                    other => {
                        state.account(&other);
                        return other
                            .map(|grant| state.turns.granted_to_gateway(grant, request.owner.as_deref()));
                    }
                }
            };
            let mut turn = InTurn::new(store.clone(), seq, receive);
            turn.wait(&request, until).await
        }
    }

    /// Gives a lease back (the gateway's own only); its proxy rests for
    /// the target for `rest` (none: the cooldown).
    pub fn release_for_gateway(&self, id: &str, rest: Option<Duration>) {
        let mut state = self.lock();
        if state
            .book
            .check_owner(id, &Caller::Gateway, Act::Release, Instant::now())
            .is_err()
        {
            return;
        }
        state.release(id, rest);
        let _ = state.persist();
    }

    /// Reports how a lease's proxy did (the gateway's own leases only).
    pub fn report_for_gateway(
        &self,
        id: &str,
        outcome: Outcome,
        detail: String,
    ) -> Result<(), ReportRefused> {
        let mut state = self.lock();
        let now = Instant::now();
        state.book.check_owner(id, &Caller::Gateway, Act::Report, now)?;
        let result = state.book.report(id, outcome, Some(detail), now);
        let _ = state.persist();
        Ok(result?)
    }

    /// Extends a lease by its TTL (the gateway's own leases only).
    pub fn renew_for_gateway(&self, id: &str) -> Result<Duration, RenewRefused> {
        let mut state = self.lock();
        if let Some(refusal) = state.refusal() {
            return Err(refusal.renew().into());
        }
        let now = Instant::now();
        state.book.check_owner(id, &Caller::Gateway, Act::Renew, now)?;
        let renewed = state.book.renew(id, None, now).map_err(RenewRefused::from);
        let _ = state.persist();
        renewed
    }
}

/// What one try of a gateway request asks the book for.
fn request(ask: Ask) -> AcquireRequest {
    AcquireRequest {
        target: ask.target,
        selector: ask.selector,
        ttl: Some(LEASE_TTL),
        client: Some(ask.client),
        owner: Some(ask.owner),
        prefer: ask.prefer,
        session: ask.session,
        avoid: ask.avoid,
    }
}

/// A refused acquire as the gateway answers it.
fn refused(e: AcquireError) -> GatewayError {
    match e {
        AcquireError::NoCapacity { target } | AcquireError::OverShare { target, .. } => {
            GatewayError::NoProxy { target }
        }
        other => GatewayError::LeaseStore(other.to_string()),
    }
}

impl Leases for LeaseStore {
    fn acquire(&self, ask: Ask) -> Result<Upstream, GatewayError> {
        self.acquire_for_gateway(&request(ask)).map_err(refused)
    }

    fn acquire_within(&self, ask: Ask, until: Instant) -> Waiting {
        let waiting = self.acquire_for_gateway_within(request(ask), until);
        Box::pin(async move { waiting.await.map_err(refused) })
    }

    fn release(&self, lease_id: String, rest: Option<Duration>) {
        self.release_for_gateway(&lease_id, rest);
    }

    fn report(&self, lease_id: String, outcome: Outcome, detail: String) {
        // Unknown: the lease ended meanwhile (expired); nothing to count.
        let _ = self.report_for_gateway(&lease_id, outcome, detail);
    }

    fn renew(&self, lease_id: String) -> Result<(), GatewayError> {
        self.renew_for_gateway(&lease_id)
            .map(|_| ())
            .map_err(|e| GatewayError::LeaseStore(e.to_string()))
    }
}
