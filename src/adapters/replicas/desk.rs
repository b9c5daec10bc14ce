//! The leader's share desk: what answers the members' syncs. It holds the
//! allocator (each member's share of each proxy's capacity), the fleet
//! state and its numbered feed, and what each member has acknowledged.
//!
//! ```text
//!  member ──SyncRequest (claims, outbox, verdicts, feed seen)──► ShareDesk::sync
//!                                                                 │ merge outbox → fleet → feed
//!                                                                 │ report claims → allocator
//!                                                                 │ hold until news (≤ hold_ms)
//!  member ◄──SyncResponse (allocation, feed since, members)───────┘
//!  leader's ProxyActors / router ──publish──► fleet → feed (availability, probe targets)
//!  roster (every retry period) ──set_members──► allocator: joins, deaths
//! ```
//!
//! One lock guards it; a held sync waits outside the lock for the news
//! counter to move. Nothing here does I/O: the actor that hosts it does.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::watch;

use super::ReplicaError;
use super::fleet_state::FleetState;
use super::members::MemberTable;
use super::wire::{self, FleetItem, MemberBody, ProxySlots, SyncRequest, SyncResponse, Term};
use crate::domain::health::Verdict;
use crate::domain::lease::journal::{key_string, parse_key};
use crate::domain::lease::{Allocator, Allotted, Claim, MemberShare, Report};
use crate::domain::membership::{Feed, MemberTag, Since};
use crate::domain::resource::ObjectKey;
use crate::telemetry::events::SharesOverCapacity;

#[cfg(test)]
mod tests;

/// Items the feed keeps; a member further behind starts over.
pub const FEED_CAPACITY: usize = 65_536;
/// How long a held sync waits after news before it answers, so that news
/// arriving together (a start, a burst of availability) goes in one answer.
const COALESCE: Duration = Duration::from_millis(25);

/// Where the verdicts members send go (the leader's probe router).
pub type VerdictSink = Arc<dyn Fn(MemberTag, Vec<(ObjectKey, Verdict)>) + Send + Sync>;

/// What a desk is set up with.
pub struct DeskSettings {
    /// Concurrent leases per proxy; 0 = unlimited.
    pub capacity: u32,
    /// A share's lifetime.
    pub ttl: Duration,
    /// This leader took over from another: it raises no share until every
    /// member has told it what it holds (or died and was adopted).
    pub rebuilding: bool,
}

pub struct ShareDesk {
    term: Term,
    state: Mutex<DeskState>,
    /// Moves on every change a held sync may be waiting for.
    news: watch::Sender<u64>,
    verdicts: VerdictSink,
}

struct DeskState {
    allocator: Allocator,
    /// The leasable proxies changed since the allocator last heard.
    proxies_changed: bool,
    fleet: FleetState,
    feed: Feed<FleetItem>,
    /// The highest outbox number merged, per member.
    acked: HashMap<MemberTag, u64>,
    /// Leases in use per proxy, per member, as each last reported (a dead
    /// member's until adopted): what a pool's figures sum.
    in_use: HashMap<MemberTag, HashMap<ObjectKey, u32>>,
    /// The claims digest and applied version last reported, per member:
    /// a request that leaves them out is taken as saying them again.
    claims: HashMap<MemberTag, (u64, u64)>,
    /// The live members, as the roster last said.
    live: Vec<wire::MemberBody>,
    live_tags: Vec<MemberTag>,
}

/// What the roster's latest look changed.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct MembersChanged {
    /// Declared dead or gone since the last look: their journals are to be
    /// adopted before their shares are freed ([`ShareDesk::adopted`]).
    pub died: Vec<MemberTag>,
}

impl ShareDesk {
    /// A desk whose fleet starts from `seed` (what this replica's book
    /// knows: a new leader starts from the old leader's feed, never empty).
    pub fn new(term: Term, settings: DeskSettings, seed: Vec<FleetItem>, verdicts: VerdictSink) -> Self {
        let allocator = if settings.rebuilding {
            Allocator::rebuilding(settings.capacity, settings.ttl)
        } else {
            Allocator::new(settings.capacity, settings.ttl)
        };
        let mut fleet = FleetState::default();
        let now = now_ms();
        for item in seed {
            fleet.merge(item, now);
        }
        Self {
            term,
            state: Mutex::new(DeskState {
                allocator,
                proxies_changed: true,
                fleet,
                feed: Feed::new(FEED_CAPACITY),
                acked: HashMap::new(),
                in_use: HashMap::new(),
                claims: HashMap::new(),
                live: Vec::new(),
                live_tags: Vec::new(),
            }),
            news: watch::Sender::new(0),
            verdicts,
        }
    }

    pub fn term(&self) -> &Term {
        &self.term
    }

    fn lock(&self) -> MutexGuard<'_, DeskState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn tell(&self) {
        self.news.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// The leader's own news (a proxy's availability or probe target):
    /// merged into the fleet and passed on.
    pub fn publish(&self, item: FleetItem) {
        let changed = {
            let mut state = self.lock();
            state.merge(item, now_ms())
        };
        if changed {
            self.tell();
        }
    }

    /// The roster's latest look: members join and die.
    pub fn set_members(&self, table: &MemberTable) -> MembersChanged {
        let mut changed = MembersChanged::default();
        {
            let mut state = self.lock();
            let live_tags = table.live_tags();
            // Every member Lease there is joins, dead ones too: what a dead
            // member may hold counts (and a rebuild waits) until adopted.
            for tag in live_tags.iter().chain(&table.dead) {
                state.allocator.join(tag);
            }
            let left: Vec<MemberTag> = state
                .live_tags
                .iter()
                .filter(|tag| !live_tags.contains(tag))
                .cloned()
                .collect();
            for tag in left {
                state.allocator.died(&tag);
                changed.died.push(tag);
            }
            let known: Vec<MemberTag> = state
                .allocator
                .members()
                .into_iter()
                .filter(|m| m.live)
                .map(|m| m.tag)
                .collect();
            for tag in table.dead.iter().chain(&table.gone) {
                if !changed.died.contains(tag) && known.contains(tag) {
                    state.allocator.died(tag);
                    changed.died.push(tag.clone());
                }
            }
            let quiet_before: Vec<String> = state
                .live
                .iter()
                .filter(|m| m.quiet)
                .map(|m| m.tag.clone())
                .collect();
            let live: Vec<MemberBody> = table
                .live
                .iter()
                .map(|m| MemberBody {
                    tag: m.tag.to_string(),
                    address: m.address.clone(),
                    slots: 0,
                    quiet: table.quiet.contains(&m.tag),
                })
                .collect();
            let quiet: Vec<String> = live.iter().filter(|m| m.quiet).map(|m| m.tag.clone()).collect();
            if quiet != quiet_before {
                tracing::info!(
                    ?quiet,
                    "members quiet (their Lease unchanged for half the lease duration): the others probe their proxies"
                );
            }
            let unchanged = state.live_tags == live_tags && quiet == quiet_before;
            state.live_tags = live_tags;
            state.live = live;
            if unchanged && changed.died.is_empty() {
                return changed;
            }
        }
        self.tell();
        changed
    }

    /// A dead member's journal is now in `into`'s book, and `report` is
    /// what `into` holds now (the adopted leases included): the dead
    /// member's shares are freed, with the slots its leases use counted
    /// as `into`'s in the same step.
    pub fn adopted(&self, tag: &MemberTag, into: &MemberTag, report: Report) {
        {
            let mut state = self.lock();
            state.allocator.report(into, &report);
            state.allocator.adopted(tag);
            state.in_use.remove(tag);
            let held = report
                .claims
                .iter()
                .filter(|c| c.in_use > 0)
                .map(|c| (c.key.clone(), c.in_use))
                .collect();
            state.in_use.insert(into.clone(), held);
        }
        self.tell();
    }

    /// Leases in use on each of `proxies` over every member, as they last
    /// reported (a pool's figures: every replica's leases, not the
    /// leader's alone).
    pub fn in_use(&self, proxies: &[ObjectKey]) -> HashMap<ObjectKey, u32> {
        let state = self.lock();
        proxies
            .iter()
            .map(|key| {
                let total = state.in_use.values().filter_map(|m| m.get(key)).sum();
                (key.clone(), total)
            })
            .collect()
    }

    /// Every member as the allocator sees it (dashboard, metrics).
    pub fn members(&self) -> Vec<MemberShare> {
        self.lock().allocator.members()
    }

    /// Proxies whose shares add up to more than their capacity, which the
    /// allocator's rule must never allow (logged and counted when seen).
    pub fn over_capacity(&self) -> Vec<(ObjectKey, u32)> {
        self.lock().allocator.over_capacity()
    }

    /// Drops ended rests from the state a member starting over gets.
    pub fn prune(&self) {
        self.lock().fleet.prune(now_ms());
    }

    /// A member's sync: takes what it reports, then answers once there is
    /// news for it or `hold_ms` has passed.
    pub async fn sync(&self, request: SyncRequest) -> Result<SyncResponse, ReplicaError> {
        let tag = MemberTag::parse(&request.tag).ok_or_else(|| ReplicaError::Malformed {
            what: "member tag",
            value: request.tag.clone(),
        })?;
        let claims = request
            .claims
            .iter()
            .map(|c| {
                Ok(Claim {
                    key: parse_key(&c.proxy).map_err(|_| ReplicaError::Malformed {
                        what: "proxy (namespace/name)",
                        value: c.proxy.clone(),
                    })?,
                    slots: c.slots,
                    in_use: c.in_use,
                })
            })
            .collect::<Result<Vec<_>, ReplicaError>>()?;
        let verdicts = request
            .verdicts
            .iter()
            .map(wire::ProbeVerdict::to_verdict)
            .collect::<Result<Vec<_>, _>>()?;
        // A member coming from another leader's term has another feed's
        // numbers: it starts over.
        let same_term = request.term.as_ref() == Some(&self.term);
        let feed_since = if same_term { request.feed_since } else { u64::MAX };
        let merged = {
            let mut state = self.lock();
            let now = now_ms();
            let acked = state.acked.get(&tag).copied().unwrap_or(0);
            let mut merged = false;
            let mut highest = acked;
            for item in &request.outbox {
                if item.seq > acked {
                    merged |= state.merge(item.change.clone(), now);
                    highest = highest.max(item.seq);
                }
            }
            state.acked.insert(tag.clone(), highest);
            let said = (request.claims_digest, request.applied);
            // Sent with every request (claims or not): lending follows it.
            let mut moved = state.live_tags.contains(&tag) && state.allocator.want(&tag, request.wanting);
            if moved {
                tracing::debug!(member = %tag, wanting = request.wanting, "a member's want changed");
            }
            let wanted = if request.claims_omitted {
                state.claims.get(&tag) != Some(&said)
            } else {
                if state.live_tags.contains(&tag) {
                    let in_use = claims
                        .iter()
                        .filter(|c| c.in_use > 0)
                        .map(|c| (c.key.clone(), c.in_use))
                        .collect();
                    state.in_use.insert(tag.clone(), in_use);
                    let before = state.allocator.generation();
                    state.allocator.report(
                        &tag,
                        &Report {
                            seq: request.seq,
                            applied: request.applied,
                            claims,
                        },
                    );
                    // Room freed or use moved: a held sync may get a raise.
                    moved |= state.allocator.generation() != before;
                    state.claims.insert(tag.clone(), said);
                }
                false
            };
            (merged || moved, wanted)
        };
        let (news, claims_wanted) = merged;
        if news {
            self.tell();
        }
        if !verdicts.is_empty() {
            (self.verdicts)(tag.clone(), verdicts);
        }
        let hold = Duration::from_millis(request.hold_ms).min(Duration::from_secs(30));
        let deadline = tokio::time::Instant::now() + hold;
        let mut news = self.news.subscribe();
        loop {
            news.mark_unchanged();
            let (mut response, has_news) = self.answer(&tag, &request, feed_since);
            if claims_wanted || has_news || tokio::time::Instant::now() >= deadline {
                response.claims_wanted = claims_wanted;
                return Ok(response);
            }
            match tokio::time::timeout_at(deadline, news.changed()).await {
                Ok(Ok(())) => tokio::time::sleep(COALESCE).await,
                // Timed out, or the desk is going away: answer as things are.
                _ => return Ok(self.answer(&tag, &request, feed_since).0),
            }
        }
    }

    /// The answer for `tag` now, and whether it tells it anything new.
    fn answer(&self, tag: &MemberTag, request: &SyncRequest, feed_since: u64) -> (SyncResponse, bool) {
        let mut state = self.lock();
        if state.proxies_changed {
            let leasable: Vec<ObjectKey> = state.fleet.leasable().filter_map(|p| parse_key(p).ok()).collect();
            state.allocator.set_proxies(leasable);
            state.proxies_changed = false;
        }
        let over = state.allocator.over_capacity();
        if !over.is_empty() {
            SharesOverCapacity {
                proxies: over.len(),
                detail: &over,
            }
            .emit();
        }
        let allocation = if state.live_tags.contains(tag) {
            state.allocator.allocation_for(tag)
        } else {
            None
        };
        let mut has_news = false;
        let allocation = match allocation {
            Some(a) => {
                let fresh = a.version > request.applied;
                if fresh {
                    tracing::debug!(member = %tag, version = a.version, slots = ?a.slots, "a new allocation");
                }
                has_news |= fresh;
                let (unlimited, slots) = match (&a.slots, fresh) {
                    (Allotted::Unlimited, _) => (true, Vec::new()),
                    (Allotted::Slots(slots), true) => (
                        false,
                        slots
                            .iter()
                            .map(|(key, n)| ProxySlots {
                                proxy: key_string(key),
                                slots: *n,
                            })
                            .collect(),
                    ),
                    // A renewal: the member keeps the slots it applied.
                    (Allotted::Slots(_), false) => (false, Vec::new()),
                };
                wire::Allocation {
                    version: a.version,
                    ttl_ms: u64::try_from(a.ttl.as_millis()).unwrap_or(u64::MAX),
                    unlimited,
                    slots,
                }
            }
            // Not a member the cluster lists (yet): no share.
            None => wire::Allocation::default(),
        };
        let feed = match state.feed.since(feed_since) {
            Since::Items { items, to } => {
                has_news |= !items.is_empty();
                wire::Feed {
                    from: feed_since,
                    to,
                    reset: false,
                    items: items.into_iter().cloned().collect(),
                }
            }
            Since::Reset { to } => {
                has_news = true;
                wire::Feed {
                    from: 0,
                    to,
                    reset: true,
                    items: state.fleet.items(),
                }
            }
        };
        let acked = state.acked.get(tag).copied().unwrap_or(0);
        let shares: BTreeMap<String, u32> = state
            .allocator
            .members()
            .into_iter()
            .map(|m| (m.tag.to_string(), u32::try_from(m.slots).unwrap_or(u32::MAX)))
            .collect();
        let members = state
            .live
            .iter()
            .map(|m| MemberBody {
                slots: shares.get(&m.tag).copied().unwrap_or(0),
                ..m.clone()
            })
            .collect();
        (
            SyncResponse {
                claims_wanted: false,
                term: self.term.clone(),
                allocation,
                acked,
                feed,
                probes: Default::default(),
                members,
            },
            has_news,
        )
    }
}

impl DeskState {
    /// Merges one item into the fleet and the feed; whether it changed anything.
    fn merge(&mut self, item: FleetItem, now_ms: i64) -> bool {
        let availability = matches!(item, FleetItem::Available(_) | FleetItem::Removed { .. });
        match self.fleet.merge(item, now_ms) {
            Some(passed) => {
                self.feed.push(passed);
                self.proxies_changed |= availability;
                true
            }
            None => false,
        }
    }
}

/// The wall clock in Unix milliseconds: rests travel as wall times, as
/// the lease journals keep them.
fn now_ms() -> i64 {
    crate::adapters::clock::now().wall.as_millisecond()
}
