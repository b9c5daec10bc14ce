//! The lease store of a replica that serves from a capacity share (every
//! replica serving): it grants only while its share is valid and its
//! member Lease is held, leases each proxy only up to the slots the leader
//! allotted it, keeps the rests, blocks and tallies it learns in an outbox
//! for the leader, and applies what the leader's feed says about the
//! fleet. The link to the leader carries both ways
//! (`crate::adapters::replicas::link`).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use super::{LeaseStore, State};
use crate::adapters::leader::Tenure;
use crate::domain::lease::{
    AcquireError, Availability, Claim, LeaseChange, LeaseSnapshot, ProxyTally, RenewError, Wants,
};
use crate::domain::membership::MemberTag;
use crate::domain::resource::ObjectKey;

/// Changes kept for the leader at most; the oldest go first (and the
/// leader hears of them from nobody: logged).
const OUTBOX_CAPACITY: usize = 16_384;
/// Rests shorter than this stay with the replica that made them (the
/// gateway's pacing between two requests to a site).
const LOCAL_REST: Duration = Duration::from_secs(1);

/// Why a store may not grant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Refusal {
    /// Its leadership lapsed (only the leader serves).
    NotLeader,
    /// It holds no valid share (every replica serving).
    NoShare(&'static str),
}

impl Refusal {
    pub(super) fn acquire(self) -> AcquireError {
        match self {
            Refusal::NotLeader => AcquireError::NotLeader,
            Refusal::NoShare(why) => AcquireError::Unavailable(why.to_owned()),
        }
    }

    pub(super) fn renew(self) -> RenewError {
        match self {
            Refusal::NotLeader => RenewError::NotLeader,
            Refusal::NoShare(why) => RenewError::Unavailable(why.to_owned()),
        }
    }
}

/// What the share adds to the store's state.
pub(super) struct Share {
    /// This replica's member Lease: no grant outlives it.
    tenure: Tenure,
    /// Until when the share is valid (this replica's monotonic clock).
    valid_until: Option<Instant>,
    /// The highest allocation version applied.
    applied: u64,
    /// Unlimited capacity: the share gates by its expiry only.
    unlimited: bool,
    next_seq: u64,
    outbox: VecDeque<(u64, LeaseChange)>,
    /// Woken when the outbox has news the leader should hear now.
    news: Arc<Notify>,
    /// The gateway's tunnels were cut when the share lapsed.
    cut: bool,
    /// Acquires refused for want of capacity lately: the slots it wants.
    wants: Wants,
}

/// What this replica tells the leader in its next sync.
#[derive(Clone, Debug, Default)]
pub struct ShareReport {
    pub applied: u64,
    pub claims: Vec<Claim>,
    /// More slots it wants: acquires refused for want of capacity lately
    /// and gateway requests waiting ([`Wants`]); the leader lends it idle
    /// slots of the other replicas.
    pub wanting: u32,
    /// Changes not yet acknowledged, numbered.
    pub outbox: Vec<(u64, LeaseChange)>,
}

/// What the leader's feed says about the fleet.
#[derive(Clone, Debug, PartialEq)]
pub enum FleetNews {
    /// A proxy as it may be leased now.
    Available(Availability),
    /// The proxy is gone.
    Removed(ObjectKey),
    /// Rests, blocks and tallies (set semantics).
    Changed(LeaseChange),
}

/// A new allocation from the leader.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Allotment {
    /// Slots per proxy (a proxy not named has none).
    Slots(BTreeMap<ObjectKey, u32>),
    /// Capacity is unlimited: every proxy may be leased.
    Unlimited,
}

/// What one answer of the leader says.
#[derive(Clone, Debug)]
pub struct ShareUpdate {
    /// A new allocation and its version (`None`: a renewal only).
    pub allotment: Option<(u64, Allotment)>,
    /// Until when the share is valid.
    pub valid_until: Instant,
    /// The outbox is acknowledged up to here.
    pub acked: u64,
    /// The feed starts over: `feed` is the whole fleet (proxies it does not
    /// name are gone).
    pub reset: bool,
    pub feed: Vec<FleetNews>,
}

/// The share as the dashboard and `/readyz` show it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ShareStatus {
    /// How long the share lasts still (`None`: none or over).
    pub left: Option<Duration>,
    pub member: bool,
    pub applied: u64,
    pub unlimited: bool,
    /// Slots held over every proxy, and those in use.
    pub slots: u64,
    pub in_use: u64,
    pub outbox: usize,
}

impl LeaseStore {
    /// Serves from a share of each proxy's capacity, granted by the leader,
    /// and only while `member` (this replica's member Lease) lasts; every
    /// lease id begins with `tag`. No grant before the first allocation.
    pub fn with_shares(self, member: Tenure, tag: &MemberTag) -> Self {
        {
            let mut state = self.lock();
            let now = Instant::now();
            state.book.set_share_mode(true, now);
            state.book.set_member(tag.clone());
            state.book.journal_changes();
            state.share = Some(Share {
                tenure: member,
                valid_until: None,
                applied: 0,
                unlimited: false,
                next_seq: 0,
                outbox: VecDeque::new(),
                news: Arc::new(Notify::new()),
                cut: false,
                wants: Wants::default(),
            });
        }
        self
    }

    /// Woken when there are changes the leader should hear at once.
    pub fn share_news(&self) -> Option<Arc<Notify>> {
        self.lock().share.as_ref().map(|s| s.news.clone())
    }

    /// What to tell the leader now.
    pub fn share_report(&self) -> ShareReport {
        let mut state = self.lock();
        let waiting = u32::try_from(state.turns.waiting_count()).unwrap_or(u32::MAX);
        let claims = state.book.claims();
        let Some(share) = state.share.as_mut() else {
            return ShareReport::default();
        };
        ShareReport {
            applied: share.applied,
            claims,
            wanting: share.wants.wanting(Instant::now(), waiting),
            outbox: share.outbox.iter().cloned().collect(),
        }
    }

    /// Applies the leader's answer: the allocation, the share's new expiry,
    /// the acknowledged outbox, the feed.
    pub fn apply_share(&self, update: ShareUpdate) {
        let mut state = self.lock();
        let now = Instant::now();
        let Some(share) = state.share.as_mut() else {
            return;
        };
        share.valid_until = Some(
            share
                .valid_until
                .map_or(update.valid_until, |u| u.max(update.valid_until)),
        );
        while share.outbox.front().is_some_and(|(seq, _)| *seq <= update.acked) {
            share.outbox.pop_front();
        }
        let allotment = match update.allotment {
            Some((version, allotment)) if version > share.applied => {
                share.applied = version;
                share.unlimited = allotment == Allotment::Unlimited;
                Some(allotment)
            }
            _ => None,
        };
        match allotment {
            Some(Allotment::Slots(slots)) => state.book.set_all_slots(&slots, now),
            Some(Allotment::Unlimited) => state.book.set_share_mode(false, now),
            None => {}
        }
        state.apply_feed(update.reset, update.feed, now);
        state.serve_waiters();
    }

    /// The share now.
    pub fn share_status(&self) -> ShareStatus {
        let state = self.lock();
        let Some(share) = &state.share else {
            return ShareStatus::default();
        };
        let now = Instant::now();
        let claims = state.book.claims();
        ShareStatus {
            left: share
                .valid_until
                .and_then(|u| u.checked_duration_since(now))
                .filter(|left| !left.is_zero()),
            member: share.tenure.is_leading(),
            applied: share.applied,
            unlimited: share.unlimited,
            slots: claims.iter().map(|c| u64::from(c.slots)).sum(),
            in_use: claims.iter().map(|c| u64::from(c.in_use)).sum(),
            outbox: share.outbox.len(),
        }
    }

    /// Takes over a dead member's journal (`snapshot`): its leases, ended
    /// leases, rests and tallies merge into this store's book and are
    /// recorded in this store's own journal; the answer comes once that is
    /// durable (the dead member's shards may be deleted then). Merging the
    /// same journal twice changes nothing more.
    pub fn adopt(
        &self,
        snapshot: LeaseSnapshot,
    ) -> futures::future::BoxFuture<'static, Result<usize, String>> {
        let mut state = self.lock();
        let before = state.book.active_leases();
        state.book.adopt(snapshot, Instant::now());
        let adopted = state.book.active_leases().saturating_sub(before);
        crate::telemetry::metrics::metrics()
            .leases_active
            .set(state.book.active_leases() as i64);
        drop(state);
        use futures::FutureExt;
        self.when_durable(move |outcome, _| outcome.map(|()| adopted).map_err(|e| e.to_string()))
            .boxed()
    }

    /// What this replica knows of the fleet, as the leader's feed would
    /// say it: where a new leader's fleet starts (it had the old leader's
    /// feed), never from nothing.
    pub fn fleet_seed(&self) -> Vec<FleetNews> {
        let state = self.lock();
        let now = Instant::now();
        let mut news: Vec<FleetNews> = state
            .book
            .availabilities()
            .cloned()
            .map(FleetNews::Available)
            .collect();
        let snapshot = state.book.snapshot(now);
        news.extend(snapshot.target_rests.into_iter().map(|(target, proxy, until)| {
            FleetNews::Changed(LeaseChange::TargetRest { target, proxy, until })
        }));
        news.extend(
            snapshot
                .proxy_rests
                .into_iter()
                .map(|(proxy, until)| FleetNews::Changed(LeaseChange::ProxyRest { proxy, until })),
        );
        for tally in snapshot.tallies {
            news.extend(tally.blocked_targets.iter().map(|target| {
                FleetNews::Changed(LeaseChange::BlockedBy {
                    proxy: tally.proxy.clone(),
                    target: *target,
                })
            }));
            news.push(FleetNews::Changed(LeaseChange::Errors {
                proxy: tally.proxy,
                count: tally.errors,
            }));
        }
        news
    }
}

impl State {
    /// Whether this store may grant now, and if not, why.
    pub(super) fn refusal(&self) -> Option<Refusal> {
        match &self.share {
            Some(share) if !share.tenure.is_leading() => Some(Refusal::NoShare(
                "this replica's membership lapsed (it cannot reach the API server)",
            )),
            Some(share) if share.valid_until.is_none_or(|u| Instant::now() >= u) => Some(Refusal::NoShare(
                "this replica holds no capacity share (it has not heard from the leader)",
            )),
            Some(_) => None,
            None => (!self.tenure.as_ref().is_none_or(Tenure::is_leading)).then_some(Refusal::NotLeader),
        }
    }

    /// Keeps the fleet changes the leader should hear (from the changes
    /// just taken from the book for the journal).
    pub(super) fn share_out(&mut self, changes: &[LeaseChange]) {
        let Some(share) = self.share.as_mut() else {
            return;
        };
        let wall_now = jiff::Timestamp::now();
        let mut urgent = false;
        for change in changes {
            let passed_on = match change {
                LeaseChange::TargetRest { until, .. } | LeaseChange::ProxyRest { until, .. } => {
                    until.duration_since(wall_now)
                        >= jiff::SignedDuration::try_from(LOCAL_REST).unwrap_or_default()
                }
                LeaseChange::BlockedBy { .. } | LeaseChange::Errors { .. } => true,
                _ => false,
            };
            if !passed_on {
                continue;
            }
            share.next_seq += 1;
            share.outbox.push_back((share.next_seq, change.clone()));
            urgent = true;
            if share.outbox.len() > OUTBOX_CAPACITY {
                share.outbox.pop_front();
                tracing::warn!("outbox to the leader full: the oldest fleet change is dropped");
            }
        }
        if urgent {
            share.news.notify_one();
        }
    }

    /// An acquire refused for want of capacity: the leader hears at once
    /// when the want grows (it doubles: [`Wants`]).
    pub(super) fn note_refusal(&mut self, now: Instant) {
        let waiting = u32::try_from(self.turns.waiting_count()).unwrap_or(u32::MAX);
        let Some(share) = self.share.as_mut().filter(|s| !s.unlimited) else {
            return;
        };
        let before = share.wants.wanting(now, waiting);
        share.wants.refused(now);
        if share.wants.wanting(now, waiting) > before {
            share.news.notify_one();
        }
    }

    /// Cuts the gateway's tunnels once the share has lapsed: what they
    /// carry may count on another replica's share by now.
    pub(super) fn cut_if_lapsed(&mut self) {
        let lapsed = self.refusal().is_some();
        let Some(share) = self.share.as_mut() else {
            return;
        };
        if lapsed && !share.cut {
            let cut = self.turns.revoke_all();
            tracing::warn!(
                tunnels = cut,
                "capacity share lapsed: gateway tunnels cut, nothing granted until the leader renews it"
            );
        }
        if let Some(share) = self.share.as_mut() {
            share.cut = lapsed;
        }
    }

    /// Applies the leader's feed: availability, rests, blocks, tallies (set
    /// semantics: the later end, the union, the larger count). Not
    /// journaled or passed on again: it is the leader's word.
    fn apply_feed(&mut self, reset: bool, feed: Vec<FleetNews>, now: Instant) {
        let mut named = BTreeSet::new();
        let mut remote = LeaseSnapshot::default();
        for news in feed {
            match news {
                FleetNews::Available(availability) => {
                    named.insert(availability.key.clone());
                    self.book.upsert(availability, now);
                }
                FleetNews::Removed(key) => {
                    if !reset {
                        self.book.remove(&key, now);
                    }
                }
                FleetNews::Changed(change) => match change {
                    LeaseChange::ProxyRemoved(key) => {
                        if !reset {
                            self.book.remove(&key, now);
                        }
                    }
                    LeaseChange::TargetRest { target, proxy, until } => {
                        remote.target_rests.push((target, proxy, until))
                    }
                    LeaseChange::ProxyRest { proxy, until } => remote.proxy_rests.push((proxy, until)),
                    LeaseChange::BlockedBy { proxy, target } => remote.tallies.push(ProxyTally {
                        proxy,
                        blocked_targets: vec![target],
                        errors: 0,
                    }),
                    LeaseChange::Errors { proxy, count } => remote.tallies.push(ProxyTally {
                        proxy,
                        blocked_targets: Vec::new(),
                        errors: count,
                    }),
                    // Leases stay with the member that granted them.
                    LeaseChange::Granted(_) | LeaseChange::Extended { .. } | LeaseChange::Ended(_) => {}
                },
            }
        }
        if reset {
            let gone: Vec<ObjectKey> = self
                .book
                .availabilities()
                .map(|a| a.key.clone())
                .filter(|key| !named.contains(key))
                .collect();
            for key in gone {
                self.book.remove(&key, now);
            }
        }
        // A restore merges as the feed means it: later ends, unions, maxima.
        self.book.restore(remote, now);
    }
}
