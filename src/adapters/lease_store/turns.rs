//! Turns at the lease store (docs/gateway.md, "Fair shares"): gateway
//! requests waiting for a proxy, the gateway leases fair shares may take
//! back, and the identities asking. Kept beside the book under the
//! [`LeaseStore`](super::LeaseStore)'s lock; what is fair is decided by
//! `crate::domain::lease::fair_share`, this holds the state it looks at.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use crate::adapters::gateway::{Revoker, Upstream, revocation};
use crate::domain::lease::fair_share::{self, Demand, Turn};
use crate::domain::lease::{AcquireRequest, FairShare, Grant, LeaseBook, owner_key};
use crate::domain::resource::ObjectKey;
use tokio::sync::{oneshot, watch};

/// A lease-API identity refused for lack of capacity counts as asking
/// (waiting) this long: API clients retry rather than wait in turn.
pub const API_ASKING_FOR: Duration = Duration::from_secs(10);

/// A gateway request waiting in turn.
struct Waiter {
    request: AcquireRequest,
    owner: String,
    give: oneshot::Sender<Upstream>,
}

/// A gateway lease that can be taken back.
struct Revocable {
    owner: String,
    proxy: ObjectKey,
    /// Grant order: the most recent is taken back first (it has served least).
    seq: u64,
    revoker: Revoker,
}

/// Waiters, revocable gateway leases and the identities asking.
pub struct Turns {
    next_seq: u64,
    /// By arrival.
    waiters: BTreeMap<u64, Waiter>,
    /// Waiters by identity.
    waiting_by: BTreeMap<String, usize>,
    revocable: HashMap<String, Revocable>,
    /// Leases taken back and not yet given back: lease → (its owner, the
    /// identity it was taken back for). Counted as moved already, so one
    /// waiter takes back one lease, not one per pass.
    reclaiming: HashMap<String, (String, String)>,
    /// Lease-API identities recently refused.
    api_asking: HashMap<String, Instant>,
    weights: FairShare,
    /// When the latest pass over the waiters ran.
    last_pass: Option<Instant>,
    /// When a rest ends that may let a waiter be served (after the latest
    /// pass): waiters wake then, without a lease ending.
    opening: watch::Sender<Option<Instant>>,
}

impl Default for Turns {
    fn default() -> Self {
        Self::new(FairShare::default())
    }
}

/// What a pass over the waiters did.
#[derive(Debug, Default)]
pub struct Pass {
    pub granted: Vec<Grant>,
    pub revoked: usize,
}

impl Turns {
    pub fn new(weights: FairShare) -> Self {
        Self {
            next_seq: 0,
            waiters: BTreeMap::new(),
            waiting_by: BTreeMap::new(),
            revocable: HashMap::new(),
            reclaiming: HashMap::new(),
            api_asking: HashMap::new(),
            weights,
            last_pass: None,
            opening: watch::channel(None).0,
        }
    }

    /// When waiters should look again without a lease ending (see [`Self::pass`]).
    pub fn watch_opening(&self) -> watch::Receiver<Option<Instant>> {
        self.opening.subscribe()
    }

    /// Whether a pass ran at or after `at` (a waiter woken then need not run another).
    pub fn passed_since(&self, at: Instant) -> bool {
        self.last_pass.is_some_and(|last| last >= at)
    }

    pub fn is_waiting(&self) -> bool {
        !self.waiters.is_empty()
    }

    /// Gateway requests waiting for a proxy.
    pub fn waiting_count(&self) -> usize {
        self.waiters.len()
    }

    /// Takes back every gateway lease that can be (its tunnel is cut);
    /// returns how many.
    pub fn revoke_all(&mut self) -> usize {
        let mut revoked = 0;
        for (id, r) in &self.revocable {
            if !self.reclaiming.contains_key(id) {
                r.revoker.revoke();
                revoked += 1;
            }
        }
        revoked
    }

    /// Queues a request; the receiver gets its lease when its turn comes.
    pub fn enqueue(&mut self, request: AcquireRequest) -> (u64, oneshot::Receiver<Upstream>) {
        let (give, receive) = oneshot::channel();
        let seq = self.next_seq();
        let owner = owner_key(request.owner.as_deref()).to_owned();
        *self.waiting_by.entry(owner.clone()).or_default() += 1;
        self.waiters.insert(seq, Waiter { request, owner, give });
        (seq, receive)
    }

    /// Takes a waiter out of the queue: whether it was still waiting.
    pub fn leave(&mut self, seq: u64) -> Option<AcquireRequest> {
        self.take_waiter(seq).map(|w| w.request)
    }

    fn take_waiter(&mut self, seq: u64) -> Option<Waiter> {
        let waiter = self.waiters.remove(&seq)?;
        if let Some(n) = self.waiting_by.get_mut(&waiter.owner) {
            *n -= 1;
            if *n == 0 {
                self.waiting_by.remove(&waiter.owner);
            }
        }
        Some(waiter)
    }

    fn next_seq(&mut self) -> u64 {
        self.next_seq += 1;
        self.next_seq
    }

    /// A lease-API identity was refused: it asks for a while.
    pub fn api_refused(&mut self, owner: &str, now: Instant) {
        self.api_asking.insert(owner.to_owned(), now);
    }

    /// The gateway lease just granted, revocable from now on: the
    /// upstream the gateway tries, with how it is taken back.
    pub fn granted_to_gateway(&mut self, grant: Grant, owner: Option<&str>) -> Upstream {
        let (revoker, revoked) = revocation();
        let seq = self.next_seq();
        self.revocable.insert(
            grant.id.clone(),
            Revocable {
                owner: owner_key(owner).to_owned(),
                proxy: grant.proxy.clone(),
                seq,
                revoker,
            },
        );
        Upstream {
            lease_id: grant.id,
            proxy: grant.proxy,
            url: grant.url,
            credentials: grant.credentials,
            ttl: grant.ttl,
            realm: grant.realm,
            revoked,
        }
    }

    /// Whether `lease` is being taken back for a waiter.
    pub fn reclaiming(&self, lease: &str) -> bool {
        self.reclaiming.contains_key(lease)
    }

    /// A lease ended.
    pub fn ended(&mut self, lease: &str) {
        self.revocable.remove(lease);
        self.reclaiming.remove(lease);
    }

    /// Forgets leases the book no longer holds (expired, their proxy gone)
    /// and API identities no longer asking.
    pub fn tidy(&mut self, book: &LeaseBook, now: Instant) {
        self.revocable.retain(|id, _| book.owner_of(id).is_some());
        self.reclaiming.retain(|id, _| book.owner_of(id).is_some());
        self.api_asking
            .retain(|_, at| now.saturating_duration_since(*at) < API_ASKING_FOR);
    }

    /// Holdings as fair shares count them: a lease being taken back already
    /// belongs to the identity it is taken back for.
    fn holdings(&self, book: &LeaseBook) -> BTreeMap<String, u32> {
        let mut held = book.holdings().clone();
        for (from, to) in self.reclaiming.values() {
            if let Some(n) = held.get_mut(from) {
                *n = n.saturating_sub(1);
            }
            *held.entry(to.clone()).or_default() += 1;
        }
        held
    }

    /// Identities waiting: queued, or refused through the API lately.
    fn waiting(&self, now: Instant) -> BTreeSet<String> {
        self.waiting_by
            .keys()
            .cloned()
            .chain(
                self.api_asking
                    .iter()
                    .filter(|(_, at)| now.saturating_duration_since(**at) < API_ASKING_FOR)
                    .map(|(owner, _)| owner.clone()),
            )
            .collect()
    }

    /// Whether `owner` may take one more lease now.
    pub fn turn(&self, book: &LeaseBook, owner: Option<&str>, now: Instant) -> Turn {
        if self.waiters.is_empty() && self.api_asking.is_empty() {
            return Turn::Take;
        }
        let (held, waiting) = (self.holdings(book), self.waiting(now));
        let demand = Demand {
            slots: book.slots(),
            held: &held,
            waiting: &waiting,
            weights: &self.weights,
        };
        fair_share::decide(owner_key(owner), &demand)
    }

    /// Serves waiters in turn from what is free, then takes back leases
    /// for those still waiting below their share. `grant` leases for one
    /// request (the book's acquire, under the store's checks).
    pub fn pass(
        &mut self,
        book: &mut LeaseBook,
        now: Instant,
        mut grant: impl FnMut(&mut LeaseBook, &AcquireRequest) -> Option<Grant>,
    ) -> Pass {
        let mut done = Pass::default();
        if self.waiters.is_empty() {
            return done;
        }
        self.last_pass = Some(now);
        let order = self.order(book, now);
        // A request no proxy was found for: the same again is not tried.
        let mut found_none: BTreeSet<(String, BTreeMap<String, String>)> = BTreeSet::new();
        for seq in &order {
            let Some(waiter) = self.waiters.get(seq) else {
                continue;
            };
            if waiter.give.is_closed() {
                self.take_waiter(*seq);
                continue;
            }
            let plain = waiter.request.prefer.is_none()
                && waiter.request.session.is_none()
                && waiter.request.avoid.is_empty();
            let shape = (waiter.request.target.clone(), waiter.request.selector.clone());
            if plain && found_none.contains(&shape) {
                continue;
            }
            if self.turn(book, waiter.request.owner.as_deref(), now) != Turn::Take {
                continue;
            }
            let Some(lease) = grant(book, &waiter.request) else {
                if plain {
                    found_none.insert(shape);
                }
                continue;
            };
            let Some(waiter) = self.take_waiter(*seq) else {
                continue;
            };
            let granted = self.granted_to_gateway(lease.clone(), Some(&waiter.owner));
            // Received unless the waiter left meanwhile; it takes the grant back then.
            if waiter.give.send(granted).is_ok() {
                done.granted.push(lease);
            } else {
                self.ended(&lease.id);
                book.cancel(&lease.id, now);
            }
        }
        done.revoked = self.reclaim(book, now);
        let opening = self.next_opening(book, now);
        self.opening
            .send_if_modified(|at| std::mem::replace(at, opening) != opening);
        done
    }

    /// Waiters in the order they are served.
    fn order(&self, book: &LeaseBook, now: Instant) -> Vec<u64> {
        let (held, waiting) = (self.holdings(book), self.waiting(now));
        let demand = Demand {
            slots: book.slots(),
            held: &held,
            waiting: &waiting,
            weights: &self.weights,
        };
        let mut order: Vec<(&str, u64)> = self
            .waiters
            .iter()
            .map(|(seq, w)| (w.owner.as_str(), *seq))
            .collect();
        order.sort_by(|a, b| fair_share::turn_order(*a, *b, &demand));
        order.into_iter().map(|(_, seq)| seq).collect()
    }

    /// For each identity waiting below its share, the most recent
    /// revocable lease of the identity furthest over its own, on a proxy
    /// the waiter could use, is taken back. Returns how many.
    fn reclaim(&mut self, book: &LeaseBook, now: Instant) -> usize {
        let mut revoked = 0;
        let mut seen = BTreeSet::new();
        for seq in self.order(book, now) {
            let Some(waiter) = self.waiters.get(&seq) else {
                continue;
            };
            if !seen.insert(waiter.owner.clone()) {
                continue;
            }
            let (held, waiting) = (self.holdings(book), self.waiting(now));
            let demand = Demand {
                slots: book.slots(),
                held: &held,
                waiting: &waiting,
                weights: &self.weights,
            };
            let hogs = fair_share::reclaim_from(&waiter.owner, &demand);
            let lease = hogs.iter().find_map(|hog| {
                self.revocable
                    .iter()
                    .filter(|(id, r)| {
                        &r.owner == hog
                            && !self.reclaiming.contains_key(*id)
                            && r.revoker.watched()
                            && book.would_serve(&waiter.request, &r.proxy, now)
                    })
                    .max_by_key(|(_, r)| r.seq)
                    .map(|(id, r)| (id.clone(), r.owner.clone()))
            });
            if let Some((id, hog)) = lease {
                if let Some(r) = self.revocable.get(&id) {
                    r.revoker.revoke();
                }
                tracing::info!(lease = %id, from = %hog, to = %waiter.owner, "gateway lease taken back for a crawler waiting below its fair share");
                self.reclaiming.insert(id, (hog, waiter.owner.clone()));
                revoked += 1;
            }
        }
        revoked
    }

    /// When a waiter may next be served without a lease ending: a rest
    /// ending for one of the waiters' targets.
    fn next_opening(&self, book: &LeaseBook, now: Instant) -> Option<Instant> {
        let targets: BTreeSet<&str> = self.waiters.values().map(|w| w.request.target.as_str()).collect();
        book.next_opening(targets.into_iter(), now)
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::ready;
    use super::*;
    use crate::domain::lease::LeaseSettings;

    fn book(proxies: &[&str]) -> LeaseBook {
        let mut book = LeaseBook::new(
            LeaseSettings {
                capacity: 1,
                cooldown: Duration::ZERO,
                ..Default::default()
            },
            crate::adapters::clock::now(),
        );
        for p in proxies {
            book.upsert(ready(p), Instant::now());
        }
        book
    }

    fn ask(owner: &str) -> AcquireRequest {
        AcquireRequest {
            target: "example.com".into(),
            client: Some("gateway".into()),
            owner: Some(owner.into()),
            ..Default::default()
        }
    }

    fn acquire(book: &mut LeaseBook, request: &AcquireRequest) -> Option<Grant> {
        book.try_acquire(request, Instant::now()).ok()
    }

    /// Freed proxies go to the identity furthest below its share first,
    /// first come within one identity.
    #[test]
    fn freed_proxies_go_furthest_below_share_first_then_first_come() {
        let mut book = book(&["p1", "p2"]);
        let mut turns = Turns::new(FairShare::default());
        let now = Instant::now();
        let a1 = book.try_acquire(&ask("a"), now).unwrap();
        let a2 = book.try_acquire(&ask("a"), now).unwrap();
        // a waits again (first), then b twice.
        let (_, mut a_rx) = turns.enqueue(ask("a"));
        let (_, mut b1_rx) = turns.enqueue(ask("b"));
        let (_, mut b2_rx) = turns.enqueue(ask("b"));
        assert_eq!(
            turns.pass(&mut book, now, acquire).granted.len(),
            0,
            "nothing free"
        );

        book.release(&a1.id, now);
        assert_eq!(turns.pass(&mut book, now, acquire).granted.len(), 1);
        assert!(
            b1_rx.try_recv().is_ok(),
            "b holds nothing: its first waiter is served"
        );
        assert!(b2_rx.try_recv().is_err() && a_rx.try_recv().is_err());

        book.release(&a2.id, now);
        assert_eq!(turns.pass(&mut book, now, acquire).granted.len(), 1);
        assert!(b2_rx.try_recv().is_err(), "b holds 1, a holds 0 now: a's turn");
        assert!(a_rx.try_recv().is_ok());
    }

    /// A waiter that gave up is skipped, and leaves no lease behind.
    #[test]
    fn a_waiter_that_left_gets_nothing() {
        let mut book = book(&["p1"]);
        let mut turns = Turns::new(FairShare::default());
        let now = Instant::now();
        let held = book.try_acquire(&ask("a"), now).unwrap();
        let (gone, _) = turns.enqueue(ask("b"));
        let (_, closed) = turns.enqueue(ask("c"));
        drop(closed);
        let (_, mut d_rx) = turns.enqueue(ask("d"));
        assert!(turns.leave(gone).is_some());
        book.release(&held.id, now);
        assert_eq!(turns.pass(&mut book, now, acquire).granted.len(), 1);
        assert!(d_rx.try_recv().is_ok(), "the next one still waiting is served");
        assert!(!turns.is_waiting());
        assert_eq!(book.active_leases(), 1);
    }

    /// An identity holding every proxy while another waits with none: its
    /// most recent revocable lease is taken back, once.
    #[test]
    fn a_hog_s_most_recent_lease_is_taken_back_for_a_waiter_below_its_share() {
        let mut book = book(&["p1", "p2", "p3"]);
        let mut turns = Turns::new(FairShare::default());
        let now = Instant::now();
        let mut revocations = Vec::new();
        for _ in 0..3 {
            let grant = book.try_acquire(&ask("a"), now).unwrap();
            let granted = turns.granted_to_gateway(grant, Some("a"));
            revocations.push((granted.lease_id.clone(), granted.revoked));
        }
        assert_eq!(turns.turn(&book, Some("a"), now), Turn::Take, "nobody waits");
        let (_, mut b_rx) = turns.enqueue(ask("b"));
        assert!(matches!(
            turns.turn(&book, Some("a"), now),
            Turn::OverShare { .. }
        ));
        let pass = turns.pass(&mut book, now, acquire);
        assert_eq!((pass.granted.len(), pass.revoked), (0, 1));
        let fired: Vec<bool> = revocations.iter().map(|(_, r)| r.is_revoked()).collect();
        assert_eq!(fired, [false, false, true], "the most recently granted");
        assert_eq!(turns.pass(&mut book, now, acquire).revoked, 0, "one is enough");

        // The tunnel closes: its lease goes back and b is served.
        let (id, _) = &revocations[2];
        book.release(id, now);
        turns.ended(id);
        assert_eq!(turns.pass(&mut book, now, acquire).granted.len(), 1);
        assert!(b_rx.try_recv().is_ok());
        // 2 against 1 of 3: nothing more moves.
        let (_, _b_again) = turns.enqueue(ask("b"));
        assert_eq!(turns.pass(&mut book, now, acquire).revoked, 0);
    }
}
