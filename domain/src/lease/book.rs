//! The lease book. Available proxies (ready, not resting everywhere, below
//! capacity) are indexed by (active leases, latency). A request picks the
//! best proxy not resting for its target: fewest active leases, then one
//! never leased for the target, then the one leased for it longest ago,
//! then the lowest latency. See [`LeaseBook::select`] for how that stays
//! O(log n) for a hot target whose proxies nearly all rest.

mod fleet;
mod shares;
mod snapshot;
mod target;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

use jiff::Timestamp;

use self::target::TargetState;
use super::journal::{EndedRecord, LeaseChange, LeaseRecord};
use super::reports::RecentReports;
use super::shares::Slots;
use super::{
    AcquireError, AcquireRequest, Act, Availability, Caller, Footprint, Grant, LeaseLimits, LeaseSettings,
    MAX_BLOCKED_TARGETS, NotOwner, Outcome, PoolFigures, ProxyView, RecentReport, RenewError, ReportCounts,
    TableFull, UnknownLease, rendezvous, target_digest,
};
use crate::now::Now;
use crate::pool::LeaseFigures;
use crate::resource::ObjectKey;

type ProxyId = u32;

/// A proxy's place in the availability index: (active leases, latency, id).
type IndexKey = (u32, u64, ProxyId);

/// Pools whose refused acquires are counted at once.
const MAX_POOLS_COUNTED: usize = 4096;

/// Past the end of the index.
const INDEX_END: IndexKey = (u32::MAX, u64::MAX, ProxyId::MAX);

/// A walk for a never-used proxy that passes this many used ones marks
/// the target hot: it keeps where its next walk starts.
const HOT_WALK: usize = 32;
/// Hot targets that keep a starting point (each costs a lookup whenever a
/// proxy returns to the index).
const MAX_HOT_TARGETS: usize = 32;
/// Never-used proxies a hot target notes as back in the index before its
/// starting point; past this many it starts from the beginning once.
const MAX_RETURNED: usize = 1024;

/// Latency key for ordering: unknown latency sorts last.
fn latency_key(latency: Option<Duration>) -> u64 {
    latency.map(|l| l.as_micros() as u64).unwrap_or(u64::MAX)
}

#[derive(Debug)]
struct Entry {
    availability: Availability,
    active: u32,
    /// Resting for every target until then (`error` report).
    global_cooldown: Option<Instant>,
    /// (active, latency) of its key in `available`, if it is there.
    indexed: Option<(u32, u64)>,
    /// Distinct targets that reported it blocked (bounded), and error reports:
    /// what a pool rotates it on.
    blocked_targets: BTreeSet<u64>,
    errors: u32,
    /// Its [`rendezvous::proxy_digest`], which sticky sessions rank it by.
    digest: u64,
    /// How many leases this book may hold on it (its share in share mode).
    slots: Slots,
}

#[derive(Debug, Clone)]
struct Lease {
    proxy: ProxyId,
    target: String,
    expires: Instant,
    /// As granted (capped): what a renewal without a TTL extends by.
    ttl: Duration,
    client: Option<String>,
    /// The identity that took it (see [`super::owners`]); fair shares
    /// count it by [`owner_key`].
    owner: Option<String>,
    reports: ReportCounts,
}

/// An ended lease still taking reports: until when, on which proxy and
/// target, and whose it was (a report is its owner's only, as on a held one).
#[derive(Debug, Clone)]
struct Ended {
    until: Instant,
    proxy: ProxyId,
    target: String,
    gateway: bool,
    owner: Option<String>,
}

/// Leases, cooldowns and the eligible-proxy index.
#[derive(Debug)]
pub struct LeaseBook {
    settings: LeaseSettings,
    ids: HashMap<ObjectKey, ProxyId>,
    proxies: HashMap<ProxyId, Entry>,
    next_id: ProxyId,
    /// Available proxies.
    available: BTreeSet<IndexKey>,
    /// Attribute postings of every known proxy.
    postings: HashMap<(String, String), HashSet<ProxyId>>,
    targets: HashMap<String, TargetState>,
    /// Targets keeping where their walk for a never-used proxy starts.
    hot_targets: HashSet<String>,
    /// Proxies the last selection looked at (tests hold it to a bound).
    last_walk: usize,
    leases: HashMap<String, Lease>,
    expiry: BTreeSet<(Instant, String)>,
    /// Ended leases that still accept reports.
    ended: HashMap<String, Ended>,
    global_cooling: BTreeSet<(Instant, ProxyId)>,
    /// Proxies known only from restored leases or rests: their availability
    /// has not been reported (yet). Not listed, never leased.
    placeholders: HashSet<ProxyId>,
    /// Changes not yet taken by the journal; `None` when nothing journals them.
    changes: Option<Vec<LeaseChange>>,
    /// Changes other replicas' books must learn, not yet taken; `None`
    /// when this book is the only one.
    fleet: Option<Vec<super::fleet::FleetChange>>,
    /// One instant with its wall-clock time: how journaled times are converted.
    epoch: (Instant, Timestamp),
    limits: LeaseLimits,
    /// `ended` in the order leases ended (the grace is the same for all, so
    /// also in the order they stop taking reports).
    ended_order: VecDeque<(Instant, String)>,
    recent_reports: RecentReports,
    /// Acquires refused for lack of capacity, per pool named in the
    /// selector, since the pool last asked (its autoscaler's demand signal).
    pool_denials: HashMap<String, u32>,
    /// When a snapshot was last restored: placeholders holding only a tally
    /// wait [`TALLY_GRACE`] from then for their proxy to show up.
    restored_at: Option<Instant>,
    /// Leases held, by owning identity (none: absent): what fair shares count.
    held_by: BTreeMap<String, u32>,
    /// Slots of the proxies serving (ready, not retiring): the fleet fair
    /// shares divide (0 with unlimited capacity).
    serving_slots: u64,
    /// In share mode, the slots granted per proxy (a proxy not named has
    /// none); `None`: every proxy's whole capacity is this book's.
    shares: Option<HashMap<ObjectKey, u32>>,
    /// Where lease ids come from (marked with the member tag in share mode).
    lease_ids: super::lease_id::LeaseIds,
}

/// The identity a lease counts against: its owner, or the unnamed one.
pub fn owner_key(owner: Option<&str>) -> &str {
    owner.unwrap_or("")
}

/// What one serving proxy adds to [`LeaseBook::slots`] (0: unlimited).
fn serving_slots_of(slots: Slots, capacity: u32) -> u64 {
    slots.cap(capacity).map_or(0, u64::from)
}

/// A proxy the fleet counts on: ready and not being retired.
fn serves(availability: &Availability) -> bool {
    availability.ready && !availability.retiring
}

/// How long a restored tally waits for its proxy's availability before the
/// proxy is taken to have been deleted while the operator was down.
pub const TALLY_GRACE: Duration = Duration::from_secs(600);

impl LeaseBook {
    /// A book opened at `opened` (which maps its monotonic instants to
    /// wall-clock times).
    pub fn new(settings: LeaseSettings, opened: Now) -> Self {
        Self::with_limits(settings, LeaseLimits::default(), opened)
    }

    pub fn with_limits(settings: LeaseSettings, limits: LeaseLimits, opened: Now) -> Self {
        Self {
            limits,
            ended_order: VecDeque::new(),
            recent_reports: RecentReports::new(limits.recent_reports),
            settings,
            ids: HashMap::new(),
            proxies: HashMap::new(),
            next_id: 0,
            available: BTreeSet::new(),
            postings: HashMap::new(),
            targets: HashMap::new(),
            hot_targets: HashSet::new(),
            last_walk: 0,
            leases: HashMap::new(),
            expiry: BTreeSet::new(),
            ended: HashMap::new(),
            global_cooling: BTreeSet::new(),
            placeholders: HashSet::new(),
            changes: None,
            fleet: None,
            epoch: (opened.mono, opened.wall),
            pool_denials: HashMap::new(),
            restored_at: None,
            held_by: BTreeMap::new(),
            serving_slots: 0,
            shares: None,
            lease_ids: Default::default(),
        }
    }

    /// From now on, every change is kept for [`Self::take_changes`].
    pub fn journal_changes(&mut self) {
        self.changes.get_or_insert_with(Vec::new);
    }

    /// The changes made since the last call, oldest first.
    pub fn take_changes(&mut self) -> Vec<LeaseChange> {
        self.changes.as_mut().map(std::mem::take).unwrap_or_default()
    }

    fn note(&mut self, change: LeaseChange) {
        if let Some(changes) = self.changes.as_mut() {
            changes.push(change);
        }
    }

    /// The wall-clock time of `at`.
    fn wall(&self, at: Instant) -> Timestamp {
        let (instant, wall) = self.epoch;
        let offset = match at.checked_duration_since(instant) {
            Some(after) => jiff::SignedDuration::try_from(after).unwrap_or(jiff::SignedDuration::MAX),
            None => -jiff::SignedDuration::try_from(instant - at).unwrap_or(jiff::SignedDuration::MAX),
        };
        wall.checked_add(offset).unwrap_or(wall)
    }

    fn key_of(&self, id: ProxyId) -> Option<ObjectKey> {
        self.proxies.get(&id).map(|e| e.availability.key.clone())
    }

    /// Lease ids from now on are marked with `tag` (a replica serving from
    /// a share: any replica can tell the holder by the id).
    pub fn set_member(&mut self, tag: crate::membership::MemberTag) {
        self.lease_ids.tag = Some(tag);
    }

    /// The member this book's lease ids name, if any.
    pub fn member(&self) -> Option<&crate::membership::MemberTag> {
        self.lease_ids.tag.as_ref()
    }

    /// Lease ids draw from `random` from now on.
    pub fn set_random(&mut self, random: std::sync::Arc<dyn crate::credentials::RandomSource>) {
        self.lease_ids.random = Some(random);
    }

    pub fn settings(&self) -> &LeaseSettings {
        &self.settings
    }

    /// Leases currently held.
    pub fn active_leases(&self) -> usize {
        self.leases.len()
    }

    /// Whether `id` is a lease this book holds or ended lately.
    pub fn knows(&self, id: &str) -> bool {
        self.leases.contains_key(id) || self.ended.contains_key(id)
    }

    /// Every proxy's availability as last upserted (placeholders, known
    /// only from a restored record, aside).
    pub fn availabilities(&self) -> impl Iterator<Item = &Availability> {
        self.proxies
            .iter()
            .filter(|(id, _)| !self.placeholders.contains(*id))
            .map(|(_, entry)| &entry.availability)
    }

    /// Active leases on one proxy.
    pub fn leases_on(&self, key: &ObjectKey) -> u32 {
        self.ids
            .get(key)
            .and_then(|id| self.proxies.get(id))
            .map_or(0, |e| e.active)
    }

    /// Recomputes whether a proxy belongs in the index.
    fn reindex(&mut self, id: ProxyId, now: Instant) {
        let Some(entry) = self.proxies.get_mut(&id) else {
            return;
        };
        if let Some((active, latency)) = entry.indexed.take() {
            self.available.remove(&(active, latency, id));
        }
        let cooling = entry.global_cooldown.is_some_and(|until| until > now);
        let full = !entry.slots.has_room(self.settings.capacity, entry.active);
        if entry.availability.ready && !entry.availability.retiring && !cooling && !full {
            let key = (entry.active, latency_key(entry.availability.latency), id);
            self.available.insert(key);
            entry.indexed = Some((key.0, key.1));
            // A hot target's walk starts past proxies it used: a never-used
            // one coming back before that point is noted.
            for name in &self.hot_targets {
                if let Some(target) = self.targets.get_mut(name)
                    && target.untouched_from.is_some_and(|from| key < from)
                    && !target.touched(id)
                {
                    if target.returned.len() < MAX_RETURNED {
                        target.returned.insert(key);
                    } else {
                        target.forget_walk_start();
                    }
                }
            }
        }
    }

    /// Adds or updates a proxy.
    pub fn upsert(&mut self, availability: Availability, now: Instant) {
        let slots = self.slots_for(&availability.key);
        let capacity = self.settings.capacity;
        let next_id = &mut self.next_id;
        let id = *self.ids.entry(availability.key.clone()).or_insert_with(|| {
            *next_id += 1;
            *next_id - 1
        });
        let known = self.proxies.contains_key(&id);
        let entry = self.proxies.entry(id).or_insert_with(|| Entry {
            availability: availability.clone(),
            active: 0,
            global_cooldown: None,
            indexed: None,
            blocked_targets: BTreeSet::new(),
            errors: 0,
            digest: rendezvous::proxy_digest(&availability.key),
            slots,
        });
        let was_serving = known && !self.placeholders.contains(&id) && serves(&entry.availability);
        let now_serving = serves(&availability);
        let entry_slots = serving_slots_of(entry.slots, capacity);
        for (k, v) in &entry.availability.attributes {
            if let Some(set) = self.postings.get_mut(&(k.clone(), v.clone())) {
                set.remove(&id);
            }
        }
        for (k, v) in &availability.attributes {
            self.postings
                .entry((k.clone(), v.clone()))
                .or_default()
                .insert(id);
        }
        entry.availability = availability;
        self.placeholders.remove(&id);
        self.serving_slots = (self.serving_slots + u64::from(now_serving) * entry_slots)
            .saturating_sub(u64::from(was_serving) * entry_slots);
        self.reindex(id, now);
    }

    /// Forgets a deleted proxy. Its leases end (clients get a 404 on report later).
    pub fn remove(&mut self, key: &ObjectKey, now: Instant) {
        let Some(id) = self.ids.get(key).copied() else {
            return;
        };
        let leases: Vec<String> = self
            .leases
            .iter()
            .filter(|(_, l)| l.proxy == id)
            .map(|(k, _)| k.clone())
            .collect();
        for lease in leases {
            self.end(&lease, now, None);
        }
        self.ids.remove(key);
        self.note(LeaseChange::ProxyRemoved(key.clone()));
        let placeholder = self.placeholders.remove(&id);
        if let Some(entry) = self.proxies.remove(&id) {
            if !placeholder && serves(&entry.availability) {
                self.serving_slots = (self.serving_slots)
                    .saturating_sub(serving_slots_of(entry.slots, self.settings.capacity));
            }
            if let Some((a, l)) = entry.indexed {
                self.available.remove(&(a, l, id));
            }
            for (k, v) in &entry.availability.attributes {
                if let Some(set) = self.postings.get_mut(&(k.clone(), v.clone())) {
                    set.remove(&id);
                }
            }
        }
        for state in self.targets.values_mut() {
            state.forget_proxy(id);
        }
    }

    fn matches(&self, id: ProxyId, selector: &BTreeMap<String, String>) -> bool {
        let Some(entry) = self.proxies.get(&id) else {
            return false;
        };
        selector
            .iter()
            .all(|(k, v)| entry.availability.attributes.get(k) == Some(v))
    }

    /// Grants a lease on the best eligible proxy.
    pub fn acquire(&mut self, req: &AcquireRequest, now: Instant) -> Result<Grant, AcquireError> {
        let result = self.try_acquire(req, now);
        if matches!(result, Err(AcquireError::NoCapacity { .. })) {
            self.count_pool_denial(req);
        }
        result
    }

    /// [`Self::acquire`] for a request that waits: a refusal is not counted
    /// against its pool (it will be tried again); [`Self::count_denial`]
    /// counts it once when the wait ends unserved.
    pub fn try_acquire(&mut self, req: &AcquireRequest, now: Instant) -> Result<Grant, AcquireError> {
        if req.target.is_empty() {
            return Err(AcquireError::EmptyTarget);
        }
        if req.ttl.is_some_and(|t| t.is_zero()) {
            return Err(AcquireError::ZeroTtl);
        }
        self.release_cooled(now);
        if let Some(target) = self.targets.get_mut(&req.target) {
            target.settle(now);
            // Noted returns that were used or left the index since.
            while let Some(&key) = target.returned.first() {
                if self.available.contains(&key) && !target.touched(key.2) {
                    break;
                }
                target.returned.pop_first();
            }
        }
        if self.leases.len() >= self.limits.max_leases {
            return Err(TableFull {
                table: "leases",
                limit: self.limits.max_leases,
                retry_after: self.until_next_expiry(now).unwrap_or(Duration::from_secs(1)),
            }
            .into());
        }
        let Some(id) = self.select(req, now) else {
            return Err(AcquireError::NoCapacity {
                target: req.target.clone(),
            });
        };
        if !self.targets.contains_key(&req.target) {
            self.make_room_for_target(now)?;
        }
        let ttl = req
            .ttl
            .unwrap_or(self.settings.default_ttl)
            .min(self.settings.max_ttl);
        let lease_id = self
            .lease_ids
            .next()
            .map_err(|e| AcquireError::Unavailable(format!("no lease id: {e}")))?;
        let expires = now + ttl;
        self.leases.insert(
            lease_id.clone(),
            Lease {
                proxy: id,
                target: req.target.clone(),
                expires,
                ttl,
                client: req.client.clone(),
                owner: req.owner.clone(),
                reports: ReportCounts::default(),
            },
        );
        *self
            .held_by
            .entry(owner_key(req.owner.as_deref()).to_owned())
            .or_default() += 1;
        self.expiry.insert((expires, lease_id.clone()));
        let target = self.targets.entry(req.target.clone()).or_default();
        target.leased(id, now);
        target.refs += 1;
        #[expect(clippy::expect_used, reason = "select() only returns ids of known proxies")]
        let entry = self.proxies.get_mut(&id).expect("selected from the index");
        entry.active += 1;
        let grant = Grant {
            id: lease_id,
            proxy: entry.availability.key.clone(),
            url: entry.availability.url.clone().unwrap_or_default(),
            attributes: entry.availability.attributes.clone(),
            target: req.target.clone(),
            ttl,
            credentials: entry.availability.credentials.clone(),
            realm: entry.availability.realm.clone(),
        };
        self.reindex(id, now);
        // The gateway's leases end with its connections, so with the
        // process: a restart never restores them, and writing them down
        // would cost the journal a row per proxied request.
        if req.client.as_deref().is_some_and(super::is_gateway_client) {
            return Ok(grant);
        }
        self.note(LeaseChange::Granted(LeaseRecord {
            id: grant.id.clone(),
            proxy: grant.proxy.clone(),
            target: grant.target.clone(),
            expires: self.wall(expires),
            ttl_ms: u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX),
            client: req.client.clone(),
            owner: req.owner.clone(),
        }));
        Ok(grant)
    }

    /// The best eligible proxy: fewest active leases, then never leased for
    /// the target, then leased for it longest ago, then lowest latency.
    ///
    /// Proxies resting for the target are never walked past: they sit in
    /// the target's rest queue, not among its idle proxies. The best used
    /// proxy is the first idle one at the lowest level; the best never-used
    /// one is the first proxy of the index the target has not touched. For
    /// a hot target that walk would pass every proxy it used, so it keeps
    /// where the walk can start (everything before is used), moved back
    /// whenever an unused proxy returns to the index. An acquire costs
    /// O(log n), plus the used proxies that are now leased elsewhere or not
    /// ready — whatever rests. With a selector whose posting list is shorter
    /// than the index, that list is walked instead.
    fn select(&mut self, req: &AcquireRequest, now: Instant) -> Option<ProxyId> {
        let target = self.targets.get(&req.target);
        let avoided: HashSet<ProxyId> = req
            .avoid
            .iter()
            .filter_map(|key| self.ids.get(key).copied())
            .collect();
        let passed_over = |id: ProxyId| avoided.contains(&id);
        if req.prefer.is_some() || req.session.is_some() {
            // A sticky session's proxy: its rest after the session's own
            // last request does not count (that rest spreads a target over
            // proxies, which a session asks not to), a block for the target
            // does.
            let blocked = target_digest(&req.target);
            let eligible = |id: ProxyId, entry: &Entry| {
                entry.indexed.is_some()
                    && !passed_over(id)
                    && !entry.blocked_targets.contains(&blocked)
                    && self.matches(id, &req.selector)
            };
            if let Some(id) = req.prefer.as_ref().and_then(|key| self.ids.get(key)).copied()
                && self.proxies.get(&id).is_some_and(|e| eligible(id, e))
            {
                return Some(id);
            }
            // A session without an eligible proxy of its own: the one
            // ranking highest for it, so that it lands where it would in any
            // process seeing this fleet (a walk of the fleet, once per
            // session move).
            if let Some(session) = req.session {
                return self
                    .proxies
                    .iter()
                    .filter(|(id, entry)| eligible(**id, entry))
                    .max_by_key(|(id, entry)| (rendezvous::rank(session, entry.digest), **id))
                    .map(|(id, _)| *id);
            }
        }
        let rank = |id: ProxyId| {
            let entry = &self.proxies[&id];
            let last = target.and_then(|t| t.last_leased(id));
            // None (never leased) sorts before any instant.
            (entry.active, last, latency_key(entry.availability.latency), id)
        };

        // With a selector, a short posting list beats walking the index.
        let smallest = req
            .selector
            .iter()
            .map(|(k, v)| self.postings.get(&(k.clone(), v.clone())).map_or(0, HashSet::len))
            .min();
        if let Some(size) = smallest
            && size < self.available.len()
        {
            let (k, v) = req.selector.iter().min_by_key(|(k, v)| {
                self.postings
                    .get(&((*k).clone(), (*v).clone()))
                    .map_or(0, HashSet::len)
            })?;
            let postings = self.postings.get(&(k.clone(), v.clone()))?;
            return postings
                .iter()
                .copied()
                .filter(|id| !passed_over(*id))
                .filter(|id| self.proxies[id].indexed.is_some() && self.matches(*id, &req.selector))
                .filter(|id| !target.is_some_and(|t| t.resting(*id, now)))
                .min_by_key(|id| rank(*id));
        }

        let Some(target) = target else {
            // Never asked for: the first matching proxy of the index.
            return self
                .available
                .iter()
                .find(|key| !passed_over(key.2) && self.matches(key.2, &req.selector))
                .map(|key| key.2);
        };
        let floor = self.available.first()?.0;
        let mut used: Option<(u32, Option<Instant>, u64, ProxyId)> = None;
        let consider = |last: Instant, id: ProxyId, used: &mut Option<_>| -> bool {
            let Some((active, latency)) = self.proxies.get(&id).and_then(|e| e.indexed) else {
                return false;
            };
            if passed_over(id) || !self.matches(id, &req.selector) {
                return false;
            }
            let candidate = (active, Some(last), latency, id);
            if used.is_none_or(|best| candidate < best) {
                *used = Some(candidate);
            }
            active == floor
        };
        let mut walk = 0;
        let mut oldest_at_floor = None;
        for (last, id) in target.idle() {
            if oldest_at_floor.is_some_and(|oldest| last > oldest) {
                break; // the oldest at the lowest level (ties went by latency)
            }
            walk += 1;
            if consider(last, id, &mut used) {
                oldest_at_floor = Some(last);
            }
        }
        // A share never exceeds the capacity: with capacity 1, a proxy
        // leased for the target is full in every mode.
        if self.settings.capacity != 1 {
            // Leased for the target and still below capacity.
            for (last, id) in target.held() {
                walk += 1;
                consider(last, id, &mut used);
            }
        }

        let hot = req.selector.is_empty();
        let start = if hot { target.untouched_from } else { None };
        let (mut found, mut stopped, mut passed) = (None, INDEX_END, 0);
        // A noted return sorts before the starting point: no walk needed.
        let returned = if hot {
            target.returned.first().copied().filter(|key| !passed_over(key.2))
        } else {
            None
        };
        let walk_from = if returned.is_some() {
            INDEX_END
        } else {
            start.unwrap_or((0, 0, 0))
        };
        for &key in self.available.range(walk_from..) {
            walk += 1;
            if used.is_some_and(|best| key.0 > best.0) {
                stopped = key; // a used proxy at a lower level wins
                break;
            }
            if target.touched(key.2) || passed_over(key.2) || !self.matches(key.2, &req.selector) {
                passed += 1;
                continue;
            }
            found = Some(key);
            break;
        }
        self.last_walk = walk;
        if returned.is_some() {
            found = returned;
        } else if hot
            // A walk that passed over proxies for this request alone moves no starting point.
            && avoided.is_empty()
            && (passed >= HOT_WALK || self.hot_targets.contains(&req.target))
        {
            self.mark_hot(&req.target, found.unwrap_or(stopped));
        }
        match (found, used) {
            (Some(key), Some(best)) if key.0 <= best.0 => Some(key.2),
            (Some(key), None) => Some(key.2),
            (_, best) => best.map(|b| b.3),
        }
    }

    /// `target`'s walk for a never-used proxy starts at `from` from now on.
    fn mark_hot(&mut self, target: &str, from: IndexKey) {
        if !self.hot_targets.contains(target) {
            if self.hot_targets.len() >= MAX_HOT_TARGETS
                && let Some(evicted) = self.hot_targets.iter().next().cloned()
            {
                self.hot_targets.remove(&evicted);
                if let Some(state) = self.targets.get_mut(&evicted) {
                    state.forget_walk_start();
                }
            }
            self.hot_targets.insert(target.to_owned());
        }
        if let Some(state) = self.targets.get_mut(target) {
            state.untouched_from = Some(from);
        }
    }

    /// Whether `caller` may `act` on lease `id` (held,
    /// or ended and still taking reports). An id the book does not know is
    /// nobody's: the operation itself answers it as before.
    pub fn check_owner(&self, id: &str, caller: &Caller, act: Act, now: Instant) -> Result<(), NotOwner> {
        if let Some(lease) = self.leases.get(id) {
            return super::owners::check(id, lease.client.as_deref(), lease.owner.as_deref(), caller, act);
        }
        match self.ended.get(id) {
            Some(ended) if ended.until > now => {
                let client = ended.gateway.then_some(super::GATEWAY_CLIENT);
                super::owners::check(id, client, ended.owner.as_deref(), caller, act)
            }
            _ => Ok(()),
        }
    }

    /// Ends a lease (idempotent) and rests its proxy for the target.
    pub fn release(&mut self, id: &str, now: Instant) -> bool {
        self.end(id, now, Some(self.settings.cooldown))
    }

    /// Ends a lease (idempotent) and rests its proxy for the target for
    /// `rest` instead of the cooldown: the gateway's pacing of one request.
    pub fn release_with_rest(&mut self, id: &str, rest: Duration, now: Instant) -> bool {
        self.end(id, now, Some(rest))
    }

    /// Takes back a grant its client never saw: no rest, no report grace.
    pub fn cancel(&mut self, id: &str, now: Instant) {
        if self.end(id, now, None) {
            self.ended.remove(id);
        }
    }

    fn end(&mut self, id: &str, now: Instant, rest: Option<Duration>) -> bool {
        let Some(lease) = self.leases.remove(id) else {
            return false;
        };
        self.unhold(owner_key(lease.owner.as_deref()));
        self.expiry.remove(&(lease.expires, id.to_owned()));
        let grace_until = now + self.settings.report_grace;
        let gateway = lease.client.as_deref().is_some_and(super::is_gateway_client);
        self.ended.insert(
            id.to_owned(),
            Ended {
                until: grace_until,
                proxy: lease.proxy,
                target: lease.target.clone(),
                gateway,
                owner: lease.owner.clone(),
            },
        );
        self.ended_order.push_back((grace_until, id.to_owned()));
        if !gateway && let Some(proxy) = self.key_of(lease.proxy) {
            self.note(LeaseChange::Ended(EndedRecord {
                id: id.to_owned(),
                proxy,
                target: lease.target.clone(),
                until: self.wall(grace_until),
                owner: lease.owner.clone(),
            }));
        }
        while self.ended.len() > self.limits.max_ended {
            let Some((_, oldest)) = self.ended_order.pop_front() else {
                break;
            };
            self.forget_ended(&oldest);
        }
        if let Some(target) = self.targets.get_mut(&lease.target) {
            target.unheld(lease.proxy);
        }
        if let Some(rest) = rest {
            self.rest_for_target(&lease.target, lease.proxy, now + rest, now);
        }
        if let Some(entry) = self.proxies.get_mut(&lease.proxy) {
            entry.active = entry.active.saturating_sub(1);
            self.reindex(lease.proxy, now);
        }
        true
    }

    fn unhold(&mut self, owner: &str) {
        if let Some(held) = self.held_by.get_mut(owner) {
            *held = held.saturating_sub(1);
            if *held == 0 {
                self.held_by.remove(owner);
            }
        }
    }

    /// A waiting request that ended unserved: counted against its pool once.
    pub fn count_denial(&mut self, req: &AcquireRequest) {
        self.count_pool_denial(req);
    }

    /// Leases held, by owning identity.
    pub fn holdings(&self) -> &BTreeMap<String, u32> {
        &self.held_by
    }

    /// The owner of a held lease.
    pub fn owner_of(&self, id: &str) -> Option<&str> {
        self.leases.get(id).map(|l| owner_key(l.owner.as_deref()))
    }

    /// Leases the serving fleet carries at once in this book (in share
    /// mode: the slots granted it); 0: unlimited.
    pub fn slots(&self) -> u64 {
        self.serving_slots
    }

    /// Whether `key` would be eligible for `req` if it had room: serving,
    /// not resting for the target nor everywhere, not blocked by it, carrying
    /// the selector. What a lease taken back for a waiter must free.
    pub fn would_serve(&self, req: &AcquireRequest, key: &ObjectKey, now: Instant) -> bool {
        let Some(id) = self.ids.get(key).copied() else {
            return false;
        };
        let Some(entry) = self.proxies.get(&id) else {
            return false;
        };
        serves(&entry.availability)
            && entry.slots.cap(self.settings.capacity) != Some(0)
            && !req.avoid.contains(key)
            && !self.placeholders.contains(&id)
            && entry.global_cooldown.is_none_or(|until| until <= now)
            && !entry.blocked_targets.contains(&target_digest(&req.target))
            && self.matches(id, &req.selector)
            && !self.targets.get(&req.target).is_some_and(|t| t.resting(id, now))
    }

    /// When a rest ends that may let one of `targets` (or any target) be
    /// served: the earliest rest end after `now`.
    pub fn next_opening<'a>(&self, targets: impl Iterator<Item = &'a str>, now: Instant) -> Option<Instant> {
        let everywhere = self
            .global_cooling
            .iter()
            .map(|(until, _)| *until)
            .find(|u| *u > now);
        let per_target = targets
            .filter_map(|t| self.targets.get(t)?.next_rest_end_after(now))
            .min();
        everywhere.into_iter().chain(per_target).min()
    }

    /// Notes a refused acquire against the pool it named, if any — only
    /// when every serving member of the pool was full: a refusal because
    /// members rest for the target, or are still starting, says nothing
    /// about the pool's size.
    fn count_pool_denial(&mut self, req: &AcquireRequest) {
        let Some(pool) = req.selector.get(crate::resource::POOL_LABEL) else {
            return;
        };
        let capacity = self.settings.capacity;
        let room_left = self.proxies.values().any(|e| {
            let a = &e.availability;
            a.attributes.get(crate::resource::POOL_LABEL) == Some(pool)
                && a.ready
                && !a.retiring
                && e.slots.has_room(capacity, e.active)
        });
        if room_left {
            return;
        }
        // Pools that never ask are not remembered without bound.
        if self.pool_denials.len() < MAX_POOLS_COUNTED || self.pool_denials.contains_key(pool) {
            *self.pool_denials.entry(pool.clone()).or_default() += 1;
        }
    }

    /// Acquires naming `pool` refused for lack of capacity since the last call.
    pub fn take_pool_denials(&mut self, pool: &str) -> u32 {
        self.pool_denials.remove(pool).unwrap_or(0)
    }

    /// Feedback on a lease, held or recently ended.
    pub fn report(
        &mut self,
        id: &str,
        outcome: Outcome,
        detail: Option<String>,
        now: Instant,
    ) -> Result<(), UnknownLease> {
        let (proxy, target) = match self.leases.get_mut(id) {
            Some(lease) => {
                lease.reports.add(outcome);
                (lease.proxy, lease.target.clone())
            }
            // A report that arrives just after the release still counts.
            None => match self.ended.get(id) {
                Some(ended) if ended.until > now => (ended.proxy, ended.target.clone()),
                _ => return Err(UnknownLease(id.to_owned())),
            },
        };
        self.recent_reports.push(RecentReport {
            lease: id.to_owned(),
            outcome,
            detail,
        });
        let tallied = self.proxies.get_mut(&proxy).and_then(|entry| {
            let key = entry.availability.key.clone();
            match outcome {
                Outcome::Ok => None,
                Outcome::Blocked
                    if entry.blocked_targets.len() < MAX_BLOCKED_TARGETS
                        && entry.blocked_targets.insert(target_digest(&target)) =>
                {
                    Some(LeaseChange::BlockedBy {
                        proxy: key,
                        target: target_digest(&target),
                    })
                }
                Outcome::Blocked => None,
                Outcome::Error => {
                    entry.errors = entry.errors.saturating_add(1);
                    Some(LeaseChange::Errors {
                        proxy: key,
                        count: entry.errors,
                    })
                }
            }
        });
        if let Some(change) = tallied {
            self.tell_fleet_tally(&change);
            self.note(change);
        }
        match outcome {
            Outcome::Ok => {}
            Outcome::Blocked => {
                self.rest_for_target(&target, proxy, now + self.settings.blocked_cooldown, now);
            }
            Outcome::Error => {
                self.rest_everywhere(proxy, now + self.settings.error_cooldown, now);
                self.reindex(proxy, now);
            }
        }
        Ok(())
    }

    /// `proxy` rests for `target` until at least `until`.
    /// `proxy` rests for `target` until at least `until`; a rest already
    /// over at `now` (no cooldown) is not worth a journal row.
    fn rest_for_target(&mut self, target: &str, proxy: ProxyId, until: Instant, now: Instant) {
        let until = self
            .targets
            .entry(target.to_owned())
            .or_default()
            .rest(proxy, until);
        if until > now
            && let Some(key) = self.key_of(proxy)
        {
            self.tell_fleet_rest(Some(target), &key, until, now);
            self.note(LeaseChange::TargetRest {
                target: target.to_owned(),
                proxy: key,
                until: self.wall(until),
            });
        }
    }

    /// `proxy` rests for every target until at least `until` (the caller reindexes).
    fn rest_everywhere(&mut self, proxy: ProxyId, until: Instant, now: Instant) {
        let Some(entry) = self.proxies.get_mut(&proxy) else {
            return;
        };
        let until = entry.global_cooldown.map_or(until, |u| u.max(until));
        entry.global_cooldown = Some(until);
        self.global_cooling.insert((until, proxy));
        if let Some(key) = self.key_of(proxy) {
            self.tell_fleet_rest(None, &key, until, now);
            self.note(LeaseChange::ProxyRest {
                proxy: key,
                until: self.wall(until),
            });
        }
    }

    /// Puts proxies whose global cooldown ended back into the index.
    fn release_cooled(&mut self, now: Instant) {
        while let Some(&(until, id)) = self.global_cooling.first() {
            if until > now {
                break;
            }
            self.global_cooling.pop_first();
            self.reindex(id, now);
        }
    }

    /// Ends expired leases (like a release); drops stale bookkeeping. Returns how many expired.
    pub fn sweep(&mut self, now: Instant) -> usize {
        self.release_cooled(now);
        let mut expired = 0;
        while let Some((at, id)) = self.expiry.first().cloned() {
            if at > now {
                break;
            }
            self.end(&id, now, Some(self.settings.cooldown));
            expired += 1;
        }
        while let Some((until, id)) = self.ended_order.front().cloned() {
            if until > now {
                break;
            }
            self.ended_order.pop_front();
            self.forget_ended(&id);
        }
        // After the longest cooldown, "when last leased" no longer matters much.
        let horizon = (self.settings.blocked_cooldown)
            .max(self.settings.cooldown)
            .max(Duration::from_secs(3600));
        let cutoff = now.checked_sub(horizon);
        self.targets.retain(|_, state| {
            state.settle(now);
            if let Some(cutoff) = cutoff {
                state.forget_marks_before(cutoff);
            }
            !state.is_idle()
        });
        self.hot_targets.retain(|name| self.targets.contains_key(name));
        self.drop_idle_placeholders(now);
        expired
    }

    /// Extends a held lease from `now` by `ttl` (default: its TTL as
    /// granted), capped at the maximum TTL. Returns the TTL applied.
    pub fn renew(&mut self, id: &str, ttl: Option<Duration>, now: Instant) -> Result<Duration, RenewError> {
        if ttl.is_some_and(|t| t.is_zero()) {
            return Err(RenewError::ZeroTtl);
        }
        let Some(lease) = self.leases.get_mut(id) else {
            return Err(UnknownLease(id.to_owned()).into());
        };
        // Past its expiry but not yet swept: over all the same.
        if lease.expires <= now {
            return Err(UnknownLease(id.to_owned()).into());
        }
        if let Some(entry) = self.proxies.get(&lease.proxy)
            && entry.availability.retiring
        {
            return Err(RenewError::Retiring(entry.availability.key.clone()));
        }
        let ttl = ttl.unwrap_or(lease.ttl).min(self.settings.max_ttl);
        let journaled = !lease.client.as_deref().is_some_and(super::is_gateway_client);
        let expires = now + ttl;
        self.expiry.remove(&(lease.expires, id.to_owned()));
        lease.expires = expires;
        self.expiry.insert((expires, id.to_owned()));
        if !journaled {
            return Ok(ttl);
        }
        self.note(LeaseChange::Extended {
            id: id.to_owned(),
            expires: self.wall(expires),
        });
        Ok(ttl)
    }

    /// Reports on a held lease, by outcome.
    pub fn report_counts(&self, id: &str) -> Option<ReportCounts> {
        self.leases.get(id).map(|l| l.reports)
    }

    /// The latest reports with their details, newest first.
    pub fn recent_reports(&self) -> impl Iterator<Item = &RecentReport> {
        self.recent_reports.iter()
    }

    /// Sizes of the bookkeeping tables.
    pub fn footprint(&self) -> Footprint {
        Footprint {
            leases: self.leases.len(),
            ended: self.ended.len(),
            targets: self.targets.len(),
            target_marks: self.targets.values().map(TargetState::marks).sum(),
            recent_reports: self.recent_reports.len(),
            detail_bytes: self.recent_reports.detail_bytes(),
        }
    }

    /// Drops an ended lease's record; its target may then be forgotten.
    fn forget_ended(&mut self, id: &str) {
        if let Some(Ended { target, .. }) = self.ended.remove(id)
            && let Some(state) = self.targets.get_mut(&target)
        {
            state.refs = state.refs.saturating_sub(1);
        }
    }

    /// Makes room for one more target by forgetting idle ones: no lease
    /// held or taking reports, no rest running. Forgetting those loses only
    /// "last leased" marks (a tie-break), never a rest.
    fn make_room_for_target(&mut self, now: Instant) -> Result<(), TableFull> {
        if self.targets.len() < self.limits.max_targets {
            return Ok(());
        }
        let mut idle: Vec<(Option<Instant>, &String)> = self
            .targets
            .iter()
            .filter(|(_, s)| s.refs == 0 && s.last_rest_end().is_none_or(|until| until <= now))
            .map(|(k, s)| (s.newest_mark(), k))
            .collect();
        if idle.is_empty() {
            return Err(TableFull {
                table: "targets",
                limit: self.limits.max_targets,
                retry_after: self.until_targets_free(now),
            });
        }
        // The oldest tenth at once: one scan pays for many new targets.
        let n = (self.limits.max_targets / 10).clamp(1, idle.len());
        idle.select_nth_unstable(n - 1);
        let forget: Vec<String> = idle[..n].iter().map(|(_, k)| (*k).clone()).collect();
        for k in forget {
            self.targets.remove(&k);
            self.hot_targets.remove(&k);
        }
        Ok(())
    }

    fn until_next_expiry(&self, now: Instant) -> Option<Duration> {
        self.expiry
            .first()
            .map(|(at, _)| at.saturating_duration_since(now))
    }

    /// When a target may next become idle: a rest ends, an ended lease
    /// stops taking reports, or a lease expires.
    fn until_targets_free(&self, now: Instant) -> Duration {
        let rests = self
            .targets
            .values()
            .filter_map(|t| t.next_rest_end())
            .filter(|until| *until > now)
            .min()
            .map(|until| until.duration_since(now));
        let ended = self
            .ended_order
            .front()
            .map(|(until, _)| until.saturating_duration_since(now));
        [rests, ended, self.until_next_expiry(now)]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(Duration::from_secs(1))
    }

    /// The lease figures of `pool`'s `members` — those a restart restored
    /// leases for but whose availability has not arrived yet included, as
    /// not known — and the acquires for the pool refused since the last call.
    pub fn pool_figures(&mut self, pool: &str, members: &[ObjectKey]) -> PoolFigures {
        let members = members
            .iter()
            .filter_map(|key| {
                let id = self.ids.get(key)?;
                let e = self.proxies.get(id)?;
                let figures = LeaseFigures {
                    known: !self.placeholders.contains(id),
                    retiring: e.availability.retiring,
                    leases: e.active,
                    blocked_targets: u32::try_from(e.blocked_targets.len()).unwrap_or(u32::MAX),
                    errors: e.errors,
                };
                Some((key.clone(), figures))
            })
            .collect();
        PoolFigures {
            members,
            denied: self.take_pool_denials(pool),
        }
    }

    /// Every known proxy, with its active leases.
    pub fn proxies(&self) -> Vec<ProxyView> {
        let mut out: Vec<ProxyView> = self
            .proxies
            .iter()
            .filter(|(id, _)| !self.placeholders.contains(id))
            .map(|(_, e)| ProxyView {
                availability: e.availability.listed(),
                active_leases: e.active,
                blocked_targets: e.blocked_targets.len() as u32,
                errors: e.errors,
            })
            .collect();
        out.sort_by(|a, b| a.availability.key.cmp(&b.availability.key));
        out
    }
}
