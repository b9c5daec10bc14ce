//! Capacity shares under every interleaving: replicas joining, dying and
//! being adopted, allocations delivered late, lost or out of order,
//! replicas taking and ending leases within their shares, and leader
//! failovers (a new allocator rebuilt from what the replicas report).
//! After every step, per proxy: the leases in use over all replicas, and
//! the slots every replica with a valid share may grant, stay within the
//! capacity.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use egress_proxies_domain::lease::{
    AcquireRequest, Allocation, Allocator, Availability, LeaseBook, LeaseSettings, Report, Slots,
};
use egress_proxies_domain::membership::MemberTag;
use egress_proxies_domain::now::Now;
use egress_proxies_domain::resource::ObjectKey;
use proptest::prelude::*;

const PROXIES: usize = 2;
const REPLICAS: usize = 3;
const TTL: Duration = Duration::from_secs(9);

fn proxy(i: usize) -> ObjectKey {
    ObjectKey::new("crawl", format!("p{i}"))
}

fn availability(i: usize) -> Availability {
    Availability {
        key: proxy(i),
        ready: true,
        phase: "Ready".into(),
        healthy: Some(true),
        url: Some(format!("http://p{i}:3128")),
        attributes: BTreeMap::new(),
        latency: None,
        credentials: None,
        realm: None,
        retiring: false,
    }
}

#[derive(Clone, Debug)]
enum Op {
    /// A replica process starts in slot i (when the slot is free).
    Start(u8),
    /// Replica i sends the leader its report (on the wire).
    Sync(u8),
    /// A report on the wire reaches the leader, whose answer goes on the
    /// wire (any of them: reordering).
    Ask(u8),
    /// An answer on the wire arrives (any of them: reordering).
    Deliver(u8),
    /// A report or an answer on the wire is lost.
    Lose(u8, bool),
    /// Replica i leases proxy p (an API lease, or a gateway tunnel).
    Acquire {
        replica: u8,
        proxy: u8,
        gateway: bool,
    },
    /// Replica i ends one of its leases.
    Release(u8, u8),
    /// Replica i is killed: its tunnels close, its API leases stay in its journal.
    Kill(u8),
    /// The leader declares dead replica i dead (its member Lease lapsed).
    DeclareDead(u8),
    /// The leader adopts dead replica i's journal.
    Adopt(u8),
    /// A live replica becomes the leader (when there is none).
    Elect(u8),
    /// Replica i tells the leader it wants n more slots (lending).
    Want(u8, u8),
    Wait(u8),
}

fn op() -> impl Strategy<Value = Op> {
    let r = 0u8..REPLICAS as u8;
    prop_oneof![
        3 => r.clone().prop_map(Op::Start),
        8 => r.clone().prop_map(Op::Sync),
        8 => any::<u8>().prop_map(Op::Ask),
        8 => any::<u8>().prop_map(Op::Deliver),
        1 => (any::<u8>(), any::<bool>()).prop_map(|(k, answer)| Op::Lose(k, answer)),
        8 => (r.clone(), 0u8..PROXIES as u8, any::<bool>())
            .prop_map(|(replica, proxy, gateway)| Op::Acquire { replica, proxy, gateway }),
        4 => (r.clone(), any::<u8>()).prop_map(|(i, k)| Op::Release(i, k)),
        1 => r.clone().prop_map(Op::Kill),
        2 => r.clone().prop_map(Op::DeclareDead),
        2 => r.clone().prop_map(Op::Adopt),
        3 => r.clone().prop_map(Op::Elect),
        3 => (r.clone(), 0u8..4).prop_map(|(i, n)| Op::Want(i, n)),
        2 => (1u8..6).prop_map(Op::Wait),
    ]
}

struct Replica {
    tag: MemberTag,
    book: LeaseBook,
    alive: bool,
    /// Declared dead by the current leader.
    declared_dead: bool,
    /// The leader term it syncs with, and the highest version applied.
    term: u64,
    applied: u64,
    /// Its share is valid until then (none yet: it grants nothing).
    valid_until: Option<Instant>,
    leases: Vec<(String, bool)>,
    targets: u64,
    /// Reports sent.
    reports: u64,
}

struct Leader {
    replica: usize,
    term: u64,
    allocator: Allocator,
}

/// A report on its way to the leader of `term`, sent at `asked_at`.
struct Request {
    replica: usize,
    tag: MemberTag,
    term: u64,
    asked_at: Instant,
    report: Report,
}

/// An answer on its way: to whom, in which term, sent for a request made when.
struct Answer {
    replica: usize,
    tag: MemberTag,
    term: u64,
    asked_at: Instant,
    allocation: Allocation,
}

struct World {
    capacity: u32,
    now: Instant,
    opened: Now,
    slots: Vec<Option<Replica>>,
    incarnations: u8,
    leader: Option<Leader>,
    terms: u64,
    requests: Vec<Request>,
    wire: Vec<Answer>,
}

impl World {
    fn new(capacity: u32) -> Self {
        let now = Instant::now();
        World {
            capacity,
            now,
            opened: Now {
                wall: jiff::Timestamp::now(),
                mono: now,
            },
            slots: (0..REPLICAS).map(|_| None).collect(),
            incarnations: 0,
            leader: None,
            terms: 0,
            requests: Vec::new(),
            wire: Vec::new(),
        }
    }

    fn settings(&self) -> LeaseSettings {
        LeaseSettings {
            capacity: self.capacity,
            ..LeaseSettings::default()
        }
    }

    fn live(&mut self, i: u8) -> Option<&mut Replica> {
        self.slots[i as usize % REPLICAS].as_mut().filter(|r| r.alive)
    }

    fn apply(&mut self, op: Op) {
        let now = self.now;
        match op {
            Op::Start(i) => {
                let slot = i as usize % REPLICAS;
                // A slot is reused only once its former replica was adopted.
                if self.slots[slot].is_some() {
                    return;
                }
                self.incarnations += 1;
                let tag = MemberTag::of(&format!("operator-{slot}"), &[self.incarnations; 8]);
                let mut book = LeaseBook::new(self.settings(), self.opened);
                book.set_share_mode(true, now);
                for p in 0..PROXIES {
                    book.upsert(availability(p), now);
                }
                if let Some(leader) = self.leader.as_mut() {
                    leader.allocator.join(&tag);
                }
                self.slots[slot] = Some(Replica {
                    tag,
                    book,
                    alive: true,
                    declared_dead: false,
                    term: 0,
                    applied: 0,
                    valid_until: None,
                    leases: Vec::new(),
                    targets: 0,
                    reports: 0,
                });
            }
            Op::Sync(i) => {
                let slot = i as usize % REPLICAS;
                let Some(leader) = self.leader.as_ref() else {
                    return;
                };
                let Some(replica) = self.slots[slot].as_mut().filter(|r| r.alive) else {
                    return;
                };
                // From now on it takes answers of this leader's term only.
                replica.term = leader.term;
                replica.reports += 1;
                self.requests.push(Request {
                    replica: slot,
                    tag: replica.tag.clone(),
                    term: leader.term,
                    asked_at: now,
                    report: Report {
                        seq: replica.reports,
                        applied: replica.applied,
                        claims: replica.book.claims(),
                    },
                });
            }
            Op::Want(i, n) => {
                let slot = i as usize % REPLICAS;
                if let (Some(leader), Some(replica)) = (self.leader.as_mut(), self.slots[slot].as_ref())
                    && replica.alive
                {
                    leader.allocator.want(&replica.tag, u32::from(n));
                }
            }
            Op::Ask(k) if !self.requests.is_empty() => {
                let request = self.requests.remove(k as usize % self.requests.len());
                let Some(leader) = self.leader.as_mut().filter(|l| l.term == request.term) else {
                    return; // its leader is gone
                };
                leader.allocator.report(&request.tag, &request.report);
                if let Some(allocation) = leader.allocator.allocation_for(&request.tag) {
                    self.wire.push(Answer {
                        replica: request.replica,
                        tag: request.tag,
                        term: leader.term,
                        asked_at: request.asked_at,
                        allocation,
                    });
                }
            }
            Op::Deliver(k) if !self.wire.is_empty() => {
                let answer = self.wire.remove(k as usize % self.wire.len());
                let Some(replica) = self.slots[answer.replica].as_mut() else {
                    return;
                };
                let current = replica.alive && replica.tag == answer.tag && replica.term == answer.term;
                if !current || answer.allocation.version <= replica.applied {
                    return;
                }
                replica.book.apply_allotted(&answer.allocation.slots, now);
                replica.applied = answer.allocation.version;
                replica.valid_until = Some(answer.asked_at + answer.allocation.ttl);
            }
            Op::Lose(k, true) if !self.wire.is_empty() => {
                self.wire.remove(k as usize % self.wire.len());
            }
            Op::Lose(k, false) if !self.requests.is_empty() => {
                self.requests.remove(k as usize % self.requests.len());
            }
            Op::Acquire {
                replica,
                proxy: p,
                gateway,
            } => {
                let Some(replica) = self.live(replica) else { return };
                if replica.valid_until.is_none_or(|until| until <= now) {
                    return; // no valid share: grants nothing
                }
                replica.targets += 1;
                let req = AcquireRequest {
                    target: format!("t{}", replica.targets),
                    prefer: Some(proxy(p as usize)),
                    client: gateway.then(|| "gateway".to_owned()),
                    ..AcquireRequest::default()
                };
                if let Ok(grant) = replica.book.acquire(&req, now) {
                    replica.leases.push((grant.id, gateway));
                }
            }
            Op::Release(i, k) => {
                let Some(replica) = self.live(i) else { return };
                if replica.leases.is_empty() {
                    return;
                }
                let (id, _) = replica.leases.swap_remove(k as usize % replica.leases.len());
                replica.book.release(&id, now);
            }
            Op::Kill(i) => {
                let slot = i as usize % REPLICAS;
                let Some(replica) = self.slots[slot].as_mut().filter(|r| r.alive) else {
                    return;
                };
                kill(replica, now);
                if self.leader.as_ref().is_some_and(|l| l.replica == slot) {
                    self.leader = None;
                }
            }
            Op::DeclareDead(i) => {
                let slot = i as usize % REPLICAS;
                let Some(leader) = self.leader.as_mut() else {
                    return;
                };
                if let Some(replica) = self.slots[slot].as_mut().filter(|r| !r.alive) {
                    replica.declared_dead = true;
                    leader.allocator.died(&replica.tag);
                }
            }
            Op::Adopt(i) => {
                let slot = i as usize % REPLICAS;
                let Some(leader) = self.leader.as_ref() else {
                    return;
                };
                let adopter = leader.replica;
                if !self.slots[slot].as_ref().is_some_and(|r| r.declared_dead) {
                    return;
                }
                let Some(dead) = self.slots[slot].take() else {
                    return;
                };
                let journal = dead.book.snapshot(now);
                let Some(own) = self.slots[adopter].as_mut() else {
                    return;
                };
                own.book.adopt(journal, now);
                own.leases
                    .extend(dead.leases.into_iter().filter(|(_, gateway)| !gateway));
                // The adopter's claims (with the adopted leases) first, then the dead bounds go.
                own.reports += 1;
                let report = Report {
                    seq: own.reports,
                    applied: own.applied,
                    claims: own.book.claims(),
                };
                if let Some(leader) = self.leader.as_mut() {
                    leader.allocator.report(&own.tag, &report);
                    leader.allocator.adopted(&dead.tag);
                }
            }
            Op::Elect(i) => {
                let slot = i as usize % REPLICAS;
                if self.leader.is_some() || !self.slots[slot].as_ref().is_some_and(|r| r.alive) {
                    return;
                }
                self.terms += 1;
                let mut allocator = Allocator::rebuilding(self.capacity, TTL);
                allocator.set_proxies((0..PROXIES).map(proxy));
                // Every member Lease still there: live replicas and dead ones not adopted.
                for replica in self.slots.iter().flatten() {
                    allocator.join(&replica.tag);
                }
                self.leader = Some(Leader {
                    replica: slot,
                    term: self.terms,
                    allocator,
                });
                // Who is dead, the new leader judges afresh.
                for replica in self.slots.iter_mut().flatten() {
                    replica.declared_dead = false;
                }
            }
            Op::Wait(seconds) => {
                self.now += Duration::from_secs(u64::from(seconds));
                let now = self.now;
                let mut leader_gone = false;
                for (slot, replica) in self.slots.iter_mut().enumerate() {
                    let Some(replica) = replica.as_mut().filter(|r| r.alive) else {
                        continue;
                    };
                    // Its share expired: it stops, and releases its member Lease.
                    if replica.valid_until.is_some_and(|until| until <= now) {
                        kill(replica, now);
                        leader_gone |= self.leader.as_ref().is_some_and(|l| l.replica == slot);
                    }
                }
                if leader_gone {
                    self.leader = None;
                }
            }
            _ => {}
        }
    }

    /// Per proxy, leases in use over every replica (a dead one's API leases
    /// until adopted), and slots the replicas with a valid share may grant.
    fn check(&self) -> Result<(), TestCaseError> {
        if self.capacity == 0 {
            return Ok(());
        }
        for p in 0..PROXIES {
            let key = proxy(p);
            let in_use: u32 = self.slots.iter().flatten().map(|r| r.book.leases_on(&key)).sum();
            prop_assert!(
                in_use <= self.capacity,
                "{} leases on {key} of capacity {}",
                in_use,
                self.capacity
            );
            let grantable: u32 = self
                .slots
                .iter()
                .flatten()
                .filter(|r| r.alive && r.valid_until.is_some_and(|until| until > self.now))
                .map(|r| match r.book.slots_of(&key) {
                    Slots::Granted(n) => n,
                    Slots::Whole => self.capacity,
                })
                .sum();
            prop_assert!(
                grantable <= self.capacity,
                "{} slots of {key} grantable, capacity {}",
                grantable,
                self.capacity
            );
        }
        if let Some(leader) = &self.leader {
            prop_assert_eq!(leader.allocator.over_capacity(), Vec::new());
        }
        Ok(())
    }
}

/// A replica stops: its tunnels close with it, its API leases stay in its journal.
fn kill(replica: &mut Replica, now: Instant) {
    replica.alive = false;
    for (id, gateway) in std::mem::take(&mut replica.leases) {
        if gateway {
            replica.book.release(&id, now);
        } else {
            replica.leases.push((id, false));
        }
    }
}

fn run(capacity: u32, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let mut world = World::new(capacity);
    world.apply(Op::Start(0));
    world.apply(Op::Elect(0));
    for op in ops {
        world.apply(op);
        world.check()?;
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: std::env::var("SHARE_CASES").ok().and_then(|n| n.parse().ok()).unwrap_or(512), ..ProptestConfig::default() })]

    #[test]
    fn shares_never_add_up_to_more_than_a_proxys_capacity(
        capacity in 0u32..4,
        ops in proptest::collection::vec(op(), 1..300),
    ) {
        run(capacity, ops)?;
    }
}
