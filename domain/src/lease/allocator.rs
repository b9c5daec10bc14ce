//! The leader's share of each proxy's capacity per member: what every
//! replica may lease, decided so that the members' shares never add up to
//! more than a proxy's capacity, whatever is delayed, lost or reordered on
//! the way.
//!
//! Safety rule: per member and proxy the allocator keeps a *bound*, the
//! most the member may be using — the larger of what it last reported
//! (`max(slots, in use)`) and every allocation sent to it that it has not
//! reported past yet. A member is given `n` slots of a proxy only if `n`
//! plus the others' bounds fits the capacity; lowering is always allowed.
//! A bound drops only by the member's own later report, or when the member
//! is dead *and* its journal has been adopted ([`Allocator::adopted`]):
//! nothing is freed on a timeout.
//!
//! Target: the live members split each ready proxy's capacity evenly, the
//! remainder going to the members ranking highest for the proxy
//! (rendezvous over the proxy's and the members' digests), so a member
//! that joins or leaves moves few slots; then moved toward use: a member
//! keeps the slots it has leases on, and idle slots are lent to members
//! that report wanting more ([`lending`]). A raise waits for room, so slots
//! move to another member only after their holder has reported the lowered
//! value.
//!
//! Rebuild: a new leader's allocator raises no bound until every member
//! has reported to it or (dead) been adopted. Not on a timeout: a member
//! unheard since the takeover may hold API leases, which outlive its share
//! until its journal is adopted (`domain/tests/share_invariant.rs` finds a
//! proxy over capacity when the rebuild ends after the share lifetime
//! instead). A member unheard for a share lifetime stops serving and
//! releases its member Lease, so it is adopted soon after; meanwhile every
//! member keeps what it holds, renewed.
//!
//! Use, on the leader: at takeover [`Allocator::rebuilding`] and
//! [`Allocator::join`] for every member Lease there is (live or not);
//! [`Allocator::set_proxies`] whenever the ready proxies change; per sync
//! request [`Allocator::report`] then [`Allocator::allocation_for`] (the
//! answer); [`Allocator::died`] when a member's Lease is judged lapsed;
//! after [`crate::lease::LeaseBook::adopt`] of its journal and the
//! leader's own report, [`Allocator::adopted`].

pub mod lending;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use super::shares::Claim;
use crate::membership::MemberTag;
use crate::rendezvous;
use crate::resource::ObjectKey;

/// What a member tells the leader in each sync request.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// Counts the member's reports (one higher each time it reports): one
    /// not newer than the last taken (delayed, retried) is ignored.
    pub seq: u64,
    /// The highest allocation version it has applied.
    pub applied: u64,
    /// What its book holds per proxy ([`crate::lease::LeaseBook::claims`]).
    pub claims: Vec<Claim>,
}

/// The slots of one allocation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Allotted {
    /// Per proxy; a proxy not named has none.
    Slots(BTreeMap<ObjectKey, u32>),
    /// Unlimited capacity: only the share's expiry counts.
    Unlimited,
}

/// A member's whole allocation, absolute: it replaces the one before.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Allocation {
    /// Applied only if higher than the member's applied version.
    pub version: u64,
    /// The share is valid until the send instant of the request its answer
    /// carried it + this (on the member's own monotonic clock).
    pub ttl: Duration,
    pub slots: Allotted,
}

/// A member as the leader's dashboard lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberShare {
    pub tag: MemberTag,
    pub live: bool,
    /// Whether it has reported to this leader (a rebuild waits for it).
    pub reported: bool,
    pub applied: u64,
    /// Slots in the last allocation sent to it, over all proxies.
    pub slots: u64,
    /// The most it may be using, over all proxies (what the others wait for).
    pub bound: u64,
    /// More slots it said it wants ([`Allocator::want`]).
    pub wanting: u32,
}

#[derive(Debug)]
struct Member {
    digest: u64,
    /// Not declared dead (a dead member keeps its bounds until adopted).
    live: bool,
    reported: bool,
    /// The last report taken ([`Report::seq`]).
    seq: u64,
    applied: u64,
    /// The last version sent to it (versions continue above what it reports).
    version: u64,
    /// Its last report's counted claims (`max(slots, in use)`), by proxy.
    claims: BTreeMap<ObjectKey, u32>,
    /// Its last report's leases in use, by proxy.
    in_use: BTreeMap<ObjectKey, u32>,
    /// More slots it said it wants ([`Allocator::want`]).
    wanting: u32,
    /// Allocations sent in versions at or above `applied`.
    sent: BTreeMap<u64, Allotted>,
    /// The slots it holds as last told: the latest allocation sent, or the
    /// slots it reported before any was sent.
    holds: Allotted,
    /// The most it may be using, per proxy (none named: 0).
    bound: HashMap<ObjectKey, u32>,
    /// Its allocation as last computed, and the allocator's generation then.
    computed: Option<(u64, Allotted)>,
}

impl Member {
    fn new(tag: &MemberTag) -> Self {
        Member {
            digest: tag.digest(),
            live: true,
            reported: false,
            seq: 0,
            applied: 0,
            version: 0,
            claims: BTreeMap::new(),
            in_use: BTreeMap::new(),
            wanting: 0,
            sent: BTreeMap::new(),
            holds: Allotted::Slots(BTreeMap::new()),
            bound: HashMap::new(),
            computed: None,
        }
    }

    fn holds(&self, key: &ObjectKey) -> u32 {
        match &self.holds {
            Allotted::Slots(slots) => slots.get(key).copied().unwrap_or(0),
            Allotted::Unlimited => 0,
        }
    }

    fn bound(&self, key: &ObjectKey) -> u32 {
        self.bound.get(key).copied().unwrap_or(0)
    }

    /// The bounds as its claims and the allocations it may still apply say.
    fn computed_bounds(&self) -> HashMap<ObjectKey, u32> {
        let mut bound: HashMap<ObjectKey, u32> = self.claims.iter().map(|(k, n)| (k.clone(), *n)).collect();
        for allotted in self.sent.values() {
            if let Allotted::Slots(slots) = allotted {
                for (key, n) in slots {
                    let b = bound.entry(key.clone()).or_default();
                    *b = (*b).max(*n);
                }
            }
        }
        bound.retain(|_, n| *n > 0);
        bound
    }
}

/// The leader's allocation of capacity to the members.
#[derive(Debug)]
pub struct Allocator {
    /// Per proxy; 0: unlimited.
    capacity: u32,
    /// A share's lifetime.
    ttl: Duration,
    /// Ready proxies (the ones given out), with their rendezvous digests.
    proxies: BTreeMap<ObjectKey, u64>,
    members: BTreeMap<MemberTag, Member>,
    /// Members whose journal was adopted: they never count again.
    adopted: BTreeSet<MemberTag>,
    /// Σ of the members' bounds, per proxy.
    totals: HashMap<ObjectKey, u32>,
    /// A new leader rebuilds (raises no bound) until every member reported.
    rebuilding: bool,
    /// Counts changes of the ready proxies or the live members.
    layout: u64,
    /// The members' parts ([`parts`]) for a layout.
    parts: Option<(u64, Parts)>,
    /// Counts changes of the live members' use or wants.
    usage: u64,
    /// The members' targets ([`lending::targets`]) for a layout and usage.
    targets: Option<((u64, u64), Parts)>,
    /// Counts changes that may change an allocation: one computed at the
    /// current generation is sent again as it is. (Sending one again
    /// never raises a bound, so a change missed here could only delay a
    /// move, never over-grant.)
    generation: u64,
}

impl Allocator {
    /// The allocator of a leader that knows every share there is (the
    /// first leader of an installation, or tests).
    pub fn new(capacity: u32, ttl: Duration) -> Self {
        Allocator {
            capacity,
            ttl,
            proxies: BTreeMap::new(),
            members: BTreeMap::new(),
            adopted: BTreeSet::new(),
            totals: HashMap::new(),
            rebuilding: false,
            generation: 0,
            layout: 0,
            parts: None,
            usage: 0,
            targets: None,
        }
    }

    /// The allocator of a leader that took over: the members' shares from
    /// the old leader are learnt from their reports. Join every member
    /// whose member Lease exists (live or not) before the first allocation:
    /// the rebuild waits for each.
    pub fn rebuilding(capacity: u32, ttl: Duration) -> Self {
        Allocator {
            rebuilding: true,
            ..Allocator::new(capacity, ttl)
        }
    }

    /// Capacity per proxy; 0: unlimited.
    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    /// Moves with every change that may change an allocation.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// A member is live (its member Lease is held, or it synced). Returns
    /// false for a member whose journal was adopted: that incarnation is
    /// gone for good.
    pub fn join(&mut self, tag: &MemberTag) -> bool {
        if self.adopted.contains(tag) {
            return false;
        }
        let member = self
            .members
            .entry(tag.clone())
            .or_insert_with(|| Member::new(tag));
        if !member.live || member.computed.is_none() {
            self.generation += 1;
            self.layout += 1;
        }
        member.live = true;
        true
    }

    /// A member was declared dead: it gets nothing more and leaves the
    /// split, but what it may be using still counts until
    /// [`Self::adopted`].
    pub fn died(&mut self, tag: &MemberTag) {
        if let Some(member) = self.members.get_mut(tag)
            && member.live
        {
            member.live = false;
            self.generation += 1;
            self.layout += 1;
        }
    }

    /// A dead member's journal was adopted (its leases are the leader's
    /// now, counted by the leader's own claims): its bounds are freed.
    /// Report the adopting member's claims, its book holding the adopted
    /// leases ([`crate::lease::LeaseBook::adopt`]), before this call: in
    /// between, those leases would count nowhere.
    pub fn adopted(&mut self, tag: &MemberTag) {
        if let Some(member) = self.members.remove(tag) {
            for (key, n) in &member.bound {
                self.lower_total(key, *n);
            }
            self.generation += 1;
            self.layout += 1;
        }
        self.adopted.insert(tag.clone());
    }

    /// The proxies given out: ready ones. Others are lowered to none.
    pub fn set_proxies(&mut self, ready: impl IntoIterator<Item = ObjectKey>) {
        let proxies: BTreeMap<ObjectKey, u64> = ready
            .into_iter()
            .map(|key| {
                let digest = self.proxies.get(&key).copied();
                let digest = digest.unwrap_or_else(|| rendezvous::proxy_digest(&key));
                (key, digest)
            })
            .collect();
        if proxies != self.proxies {
            self.proxies = proxies;
            self.generation += 1;
            self.layout += 1;
        }
    }

    /// A member's sync request: its applied version and its claims. A
    /// report older than one already taken (not a higher `seq`, or a lower
    /// applied version) is ignored: a stale one would count leases since
    /// ended. Returns whether it was taken. A member not known yet joins
    /// (unless adopted).
    pub fn report(&mut self, tag: &MemberTag, report: &Report) -> bool {
        if !self.join_quietly(tag) {
            return false;
        }
        let Some(member) = self.members.get_mut(tag) else {
            return false;
        };
        let newer = !member.reported || report.seq > member.seq;
        if !newer || report.applied < member.applied {
            return false;
        }
        member.seq = report.seq;
        let first = !member.reported;
        member.reported = true;
        member.applied = report.applied;
        member.version = member.version.max(report.applied);
        // What it applied and anything sent since may still be in use; older ones not.
        member.sent = member.sent.split_off(&report.applied);
        member.claims = report
            .claims
            .iter()
            .filter(|c| c.counted() > 0)
            .map(|c| (c.key.clone(), c.counted()))
            .collect();
        let in_use: BTreeMap<ObjectKey, u32> = report
            .claims
            .iter()
            .filter(|c| c.in_use > 0)
            .map(|c| (c.key.clone(), c.in_use))
            .collect();
        let use_changed = in_use != member.in_use;
        member.in_use = in_use;
        if first && member.sent.is_empty() {
            // What it holds from a former leader, until told otherwise.
            member.holds = Allotted::Slots(
                report
                    .claims
                    .iter()
                    .filter(|c| c.slots > 0)
                    .map(|c| (c.key.clone(), c.slots))
                    .collect(),
            );
        }
        let bound = member.computed_bounds();
        if first || bound != member.bound || use_changed {
            self.generation += 1;
        }
        if use_changed {
            self.usage += 1;
        }
        let old = std::mem::replace(&mut member.bound, bound);
        let new = member.bound.clone();
        for (key, n) in old {
            self.lower_total(&key, n);
        }
        for (key, n) in new {
            *self.totals.entry(key).or_default() += n;
        }
        true
    }

    /// How many more slots `tag` wants (its refusals for want of a share
    /// lately, its requests waiting): idle slots of members that want none
    /// are lent to it ([`lending`]). Returns whether that changed anything.
    pub fn want(&mut self, tag: &MemberTag, wanting: u32) -> bool {
        let Some(member) = self.members.get_mut(tag) else {
            return false;
        };
        if member.wanting == wanting {
            return false;
        }
        member.wanting = wanting;
        self.usage += 1;
        self.generation += 1;
        true
    }

    /// The allocation to send `tag` now (recorded as sent: its bounds rise
    /// with it). `None` for a member not known (or adopted). A dead member
    /// is lowered to nothing. The same allocation as last time keeps its
    /// version.
    pub fn allocation_for(&mut self, tag: &MemberTag) -> Option<Allocation> {
        let rebuilding = self.is_rebuilding();
        let member = self.members.get(tag)?;
        let allotted =
            if let Some((_, allotted)) = member.computed.as_ref().filter(|(g, _)| *g == self.generation) {
                allotted.clone()
            } else if !member.live {
                Allotted::Slots(BTreeMap::new())
            } else if self.capacity == 0 {
                Allotted::Unlimited
            } else {
                let digest = member.digest;
                let mine = self.current_targets().get(&digest).cloned().unwrap_or_default();
                let member = self.members.get(tag)?;
                let mut slots = BTreeMap::new();
                for key in self.proxies.keys() {
                    let target = mine.get(key).copied().unwrap_or(0);
                    let holds = member.holds(key);
                    let grant = if target <= holds {
                        target
                    } else {
                        let own = member.bound(key);
                        let room = if rebuilding {
                            own
                        } else {
                            let others = self.totals.get(key).copied().unwrap_or(0).saturating_sub(own);
                            self.capacity.saturating_sub(others)
                        };
                        holds.max(target.min(room))
                    };
                    if grant > 0 {
                        slots.insert(key.clone(), grant);
                    }
                }
                Allotted::Slots(slots)
            };
        let allocation = self.send(tag, allotted);
        // Computed again only after a change (its own raise changes nothing for it).
        if let (Some(member), Some(allocation)) = (self.members.get_mut(tag), allocation.as_ref()) {
            member.computed = Some((self.generation, allocation.slots.clone()));
        }
        allocation
    }

    /// Records `allotted` as sent to `tag` (a new version if it differs).
    fn send(&mut self, tag: &MemberTag, allotted: Allotted) -> Option<Allocation> {
        let member = self.members.get_mut(tag)?;
        let unchanged = member.version > 0 && member.sent.get(&member.version) == Some(&allotted);
        if !unchanged {
            self.generation += 1;
            member.version += 1;
            member.sent.insert(member.version, allotted.clone());
            member.holds = allotted.clone();
            if let Allotted::Slots(slots) = &allotted {
                for (key, n) in slots {
                    let b = member.bound.entry(key.clone()).or_default();
                    if *n > *b {
                        *self.totals.entry(key.clone()).or_default() += *n - *b;
                        *b = *n;
                    }
                }
            }
        }
        Some(Allocation {
            version: member.version,
            ttl: self.ttl,
            slots: allotted,
        })
    }

    /// Whether the allocator still waits for members' reports before it
    /// raises any bound. Ends for good once every member has reported or
    /// was adopted.
    pub fn is_rebuilding(&mut self) -> bool {
        if self.rebuilding && self.members.values().all(|m| m.reported) {
            self.rebuilding = false;
            self.generation += 1;
        }
        self.rebuilding
    }

    /// Proxies whose members' bounds add up to more than the capacity,
    /// with the sum. Must stay empty: the invariant the rule keeps.
    pub fn over_capacity(&self) -> Vec<(ObjectKey, u32)> {
        if self.capacity == 0 {
            return Vec::new();
        }
        let mut over: Vec<(ObjectKey, u32)> = self
            .totals
            .iter()
            .filter(|(_, n)| **n > self.capacity)
            .map(|(k, n)| (k.clone(), *n))
            .collect();
        over.sort();
        over
    }

    /// The most `tag` may be using of `key`.
    pub fn bound(&self, tag: &MemberTag, key: &ObjectKey) -> u32 {
        self.members.get(tag).map_or(0, |m| m.bound(key))
    }

    /// Every member, by tag.
    pub fn members(&self) -> Vec<MemberShare> {
        self.members
            .iter()
            .map(|(tag, m)| MemberShare {
                tag: tag.clone(),
                live: m.live,
                reported: m.reported,
                applied: m.applied,
                slots: match &m.holds {
                    Allotted::Slots(slots) => slots.values().map(|n| u64::from(*n)).sum(),
                    Allotted::Unlimited => 0,
                },
                bound: m.bound.values().map(|n| u64::from(*n)).sum(),
                wanting: m.wanting,
            })
            .collect()
    }

    /// [`Self::join`] without reviving a member declared dead.
    fn join_quietly(&mut self, tag: &MemberTag) -> bool {
        if self.adopted.contains(tag) {
            return false;
        }
        self.members
            .entry(tag.clone())
            .or_insert_with(|| Member::new(tag));
        true
    }

    /// The live members' parts of the ready proxies, computed again only
    /// when either changed.
    fn current_parts(&mut self) -> &Parts {
        if self
            .parts
            .as_ref()
            .is_some_and(|(layout, _)| *layout != self.layout)
        {
            self.parts = None;
        }
        let (layout, capacity, live) = (self.layout, self.capacity, self.live_digests());
        let proxies = &self.proxies;
        &self
            .parts
            .get_or_insert_with(|| (layout, parts(capacity, proxies, &live)))
            .1
    }

    /// The live members' targets: their parts moved toward use and wants,
    /// computed again only when the layout, a use or a want changed.
    fn current_targets(&mut self) -> &Parts {
        let key = (self.layout, self.usage);
        if self.targets.as_ref().is_none_or(|(k, _)| *k != key) {
            let parts = self.current_parts().clone();
            let members: HashMap<u64, lending::Use> = self
                .members
                .values()
                .filter(|m| m.live)
                .map(|m| {
                    (
                        m.digest,
                        lending::Use {
                            in_use: Some(&m.in_use),
                            wanting: m.wanting,
                        },
                    )
                })
                .collect();
            let targets = lending::targets(self.capacity, &parts, &self.proxies, &members);
            self.targets = Some((key, targets));
        }
        &self.targets.get_or_insert_with(|| (key, Parts::new())).1
    }

    fn live_digests(&self) -> Vec<u64> {
        self.members
            .values()
            .filter(|m| m.live)
            .map(|m| m.digest)
            .collect()
    }

    fn lower_total(&mut self, key: &ObjectKey, n: u32) {
        if let Some(total) = self.totals.get_mut(key) {
            *total = total.saturating_sub(n);
            if *total == 0 {
                self.totals.remove(key);
            }
        }
    }
}

/// Each member's slots per proxy, by the member's digest.
pub type Parts = HashMap<u64, BTreeMap<ObjectKey, u32>>;

/// Every live member's part of every proxy (by digests): ⌊c/R⌋ each, and
/// each proxy's c mod R remaining slots to the members holding the fewest
/// remaining slots so far, the highest-ranking for the proxy first. So
/// members' totals differ by one at most, and no member goes without
/// while the fleet has a slot for each: ranking alone would leave
/// a member without any slot of a small fleet now and then (with 3
/// proxies of capacity 2, one time in 27 for each of 3 members).
pub fn parts(capacity: u32, proxies: &BTreeMap<ObjectKey, u64>, live: &[u64]) -> Parts {
    let members = u32::try_from(live.len()).unwrap_or(u32::MAX);
    let mut parts: Parts = live.iter().map(|m| (*m, BTreeMap::new())).collect();
    if members == 0 || capacity == 0 {
        return parts;
    }
    let (even, remaining) = (capacity / members, capacity % members);
    let mut extra: HashMap<u64, u64> = live.iter().map(|m| (*m, 0)).collect();
    // By digest: where a proxy falls does not depend on its name's order.
    let mut order: Vec<(&ObjectKey, u64)> = proxies.iter().map(|(k, d)| (k, *d)).collect();
    order.sort_by_key(|(key, digest)| (*digest, (*key).clone()));
    for (key, digest) in order {
        // The fewest remaining slots so far first, then the highest rank.
        let mut ranked: Vec<u64> = live.to_vec();
        ranked.sort_by_key(|m| {
            (
                extra.get(m).copied().unwrap_or(0),
                std::cmp::Reverse((rendezvous::rank(digest, *m), *m)),
            )
        });
        for m in ranked.iter().take(remaining as usize) {
            if let Some(p) = parts.get_mut(m) {
                p.insert(key.clone(), even + 1);
            }
            *extra.entry(*m).or_default() += 1;
        }
        if even > 0 {
            for m in live {
                if let Some(p) = parts.get_mut(m) {
                    p.entry(key.clone()).or_insert(even);
                }
            }
        }
    }
    parts
}

/// A member's even part of `capacity` of `proxy` among the `live` members
/// (by digest): ⌊c/R⌋, plus one for the c mod R members ranking highest
/// for the proxy.
pub fn target(capacity: u32, proxy: &ObjectKey, member: u64, live: &[u64]) -> u32 {
    part(capacity, rendezvous::proxy_digest(proxy), member, live)
}

/// [`target`] by the proxy's digest.
fn part(capacity: u32, proxy: u64, member: u64, live: &[u64]) -> u32 {
    let members = u32::try_from(live.len()).unwrap_or(u32::MAX);
    if members == 0 || !live.contains(&member) {
        return 0;
    }
    let mine = (rendezvous::rank(proxy, member), member);
    let above = live
        .iter()
        .filter(|other| (rendezvous::rank(proxy, **other), **other) > mine)
        .count();
    let place = u32::try_from(above).unwrap_or(u32::MAX);
    capacity / members + u32::from(place < capacity % members)
}
