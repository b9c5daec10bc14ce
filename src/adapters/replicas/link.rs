//! A member's link to the leader: one long-poll held open, and a push when
//! the lease store has news the leader should hear at once (a block, a
//! rest). Each answer renews the share, may bring a new allocation, and
//! carries the fleet feed since what this member applied; it goes to the
//! lease store, and the feed's probe targets and the live members go to
//! the member's probing.
//!
//! ```text
//!  LeaseStore ──report (claims, outbox)──►┐
//!  probe verdicts ───────────────────────►├─ SyncRequest ──► leader's ShareDesk
//!                                         │
//!  LeaseStore ◄── allocation, feed ───────┤◄─ SyncResponse
//!  probing    ◄── probe targets, members ─┘
//! ```
//!
//! Answers to a held call and a push may arrive in either order: what is
//! older than what was applied already is not applied again.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, watch};

use super::ReplicaError;
use super::client::{ReplicaClient, Synced};
use super::wire::{self, FleetItem, ProbeVerdict, SyncRequest, Term};
use crate::adapters::lease_store::{Allotment, FleetNews, LeaseStore, ShareUpdate};
use crate::domain::destinations::DestinationPolicy;
use crate::domain::health::{ProbeTarget, RecordedVerdict, Verdict};
use crate::domain::lease::journal::key_string;
use crate::domain::membership::MemberTag;
use crate::domain::resource::ObjectKey;

/// Verdicts kept for the leader at most (the latest per proxy matters).
const MAX_VERDICTS: usize = 65_536;
/// The first pause after a failed sync; it doubles up to [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(100);
const MAX_PAUSE: Duration = Duration::from_secs(1);

/// What a proxy's probes need, and the verdict its status records.
pub type Probed = (ProbeTarget, Option<RecordedVerdict>);

/// What the feed says about probing, for the member's probe router.
#[derive(Clone, Debug, Default)]
pub struct ProbeFeed {
    /// Start over: `items` names every proxy to probe.
    pub reset: bool,
    /// `None`: no longer probed.
    pub items: Vec<(ObjectKey, Option<Probed>)>,
    /// The members that probe (the live but quiet left out), when they changed.
    pub members: Option<Vec<MemberTag>>,
}

/// Verdicts of this member's probes, waiting to go to the leader.
#[derive(Clone, Default)]
pub struct VerdictQueue(Arc<Mutex<VecDeque<ProbeVerdict>>>);

impl VerdictQueue {
    pub fn push(&self, key: &ObjectKey, verdict: &Verdict) {
        let mut queue = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if queue.len() >= MAX_VERDICTS {
            queue.pop_front();
        }
        queue.push_back(ProbeVerdict::new(key, verdict));
    }

    fn take(&self) -> Vec<ProbeVerdict> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .drain(..)
            .collect()
    }

    /// Puts back verdicts whose call failed, ahead of newer ones.
    fn put_back(&self, verdicts: Vec<ProbeVerdict>) {
        let mut queue = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        for verdict in verdicts.into_iter().rev() {
            if queue.len() >= MAX_VERDICTS {
                break;
            }
            queue.push_front(verdict);
        }
    }

    fn is_empty(&self) -> bool {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).is_empty()
    }
}

/// The link's view of the leader, for the dashboard.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LinkStatus {
    pub leader: Option<String>,
    pub term: Option<Term>,
    /// When the last answer came.
    pub last_answer: Option<Instant>,
    pub members: Vec<wire::MemberBody>,
    pub last_error: Option<String>,
}

pub struct ReplicaLink {
    me: MemberTag,
    store: LeaseStore,
    client: ReplicaClient,
    /// The leader's internal address, as the operator learns it.
    leader: watch::Receiver<Option<String>>,
    /// Re-attached to every probe target from the feed.
    endpoint_policy: Option<Arc<DestinationPolicy>>,
    verdicts: VerdictQueue,
    probes: mpsc::UnboundedSender<ProbeFeed>,
    status: watch::Sender<LinkStatus>,
    term: Option<Term>,
    feed_seen: u64,
    members: Vec<MemberTag>,
    /// Numbers this member's requests.
    seq: u64,
    /// The claims digest and applied version the leader last answered a
    /// request carrying in full: sent again only when they change.
    claims_taken: Option<(u64, u64)>,
}

impl ReplicaLink {
    pub fn new(
        me: MemberTag,
        store: LeaseStore,
        client: ReplicaClient,
        leader: watch::Receiver<Option<String>>,
        endpoint_policy: Option<Arc<DestinationPolicy>>,
        verdicts: VerdictQueue,
        probes: mpsc::UnboundedSender<ProbeFeed>,
    ) -> Self {
        Self {
            me,
            store,
            client,
            leader,
            endpoint_policy,
            verdicts,
            probes,
            status: watch::Sender::new(LinkStatus::default()),
            term: None,
            feed_seen: 0,
            members: Vec::new(),
            seq: 0,
            claims_taken: None,
        }
    }

    /// The link's view, updated on every answer.
    pub fn status(&self) -> watch::Receiver<LinkStatus> {
        self.status.subscribe()
    }

    /// Syncs with the leader until `stop` turns true.
    pub async fn run(mut self, mut stop: watch::Receiver<bool>) {
        let Some(news) = self.store.share_news() else {
            tracing::error!("the replica link needs a lease store serving from a share");
            return;
        };
        let mut pause = FIRST_PAUSE;
        let mut urgent = false;
        loop {
            if *stop.borrow() {
                return;
            }
            let Some(leader) = self.leader.borrow_and_update().clone() else {
                tokio::select! {
                    _ = self.leader.changed() => continue,
                    _ = stop.changed() => continue,
                }
            };
            let verdicts = self.verdicts.take();
            let request = self.request(verdicts.clone());
            let claims = (!request.claims_omitted).then_some((request.claims_digest, request.applied));
            let push = urgent || !verdicts.is_empty();
            urgent = false;
            let call = async {
                if push {
                    self.client.push(&leader, &request).await
                } else {
                    self.client.hold(&leader, &request).await
                }
            };
            let outcome = tokio::select! {
                outcome = call => Some(outcome),
                // News while the long-poll is held: ask again at once (the
                // held call is dropped; what it carried is in the next).
                _ = news.notified(), if !push => { urgent = true; None }
                _ = self.leader.changed() => None,
                _ = stop.changed() => None,
            };
            match outcome {
                Some(Ok(synced)) => {
                    pause = FIRST_PAUSE;
                    if synced.response.claims_wanted {
                        self.claims_taken = None;
                    } else if claims.is_some() {
                        self.claims_taken = claims;
                    }
                    self.apply(&leader, synced);
                    urgent |= !self.verdicts.is_empty();
                }
                Some(Err(e)) => {
                    self.verdicts.put_back(verdicts);
                    self.failed(&leader, &e);
                    tokio::select! {
                        _ = tokio::time::sleep(pause) => {}
                        _ = self.leader.changed() => {}
                        _ = stop.changed() => {}
                    }
                    pause = (pause * 2).min(MAX_PAUSE);
                }
                None => self.verdicts.put_back(verdicts),
            }
        }
    }

    fn request(&mut self, verdicts: Vec<ProbeVerdict>) -> SyncRequest {
        self.seq += 1;
        let report = self.store.share_report();
        let claims: Vec<wire::Claim> = report
            .claims
            .iter()
            .map(|c| wire::Claim {
                proxy: key_string(&c.key),
                slots: c.slots,
                in_use: c.in_use,
            })
            .collect();
        let claims_digest = digest(&claims);
        let claims_omitted = self.claims_taken == Some((claims_digest, report.applied));
        SyncRequest {
            tag: self.me.to_string(),
            term: self.term.clone(),
            applied: report.applied,
            claims: if claims_omitted { Vec::new() } else { claims },
            wanting: report.wanting,
            outbox: report
                .outbox
                .into_iter()
                .filter_map(|(seq, change)| {
                    FleetItem::from_change(&change).map(|change| wire::OutboxItem { seq, change })
                })
                .collect(),
            verdicts,
            feed_since: self.feed_seen,
            hold_ms: 0,
            seq: self.seq,
            claims_digest,
            claims_omitted,
        }
    }

    fn failed(&self, leader: &str, error: &ReplicaError) {
        tracing::debug!(leader, error = %error, "sync with the leader failed; retrying");
        self.status
            .send_modify(|s| s.last_error = Some(error.to_string()));
    }

    /// Takes one answer: the share to the lease store, the feed's news to
    /// the store and to probing.
    fn apply(&mut self, leader: &str, synced: Synced) {
        let Synced { response, sent_at } = synced;
        if self.term.as_ref() != Some(&response.term) {
            tracing::info!(leader, holder = %response.term.holder, "syncing with a new leader");
            self.term = Some(response.term.clone());
            self.feed_seen = 0;
            self.claims_taken = None;
        }
        let allotment = match response.allocation.per_proxy() {
            Ok(_) if response.allocation.version == 0 => None,
            Ok(None) => Some((response.allocation.version, Allotment::Unlimited)),
            // A renewal names no slots; the store applies only a version above what it has.
            Ok(Some(slots)) => Some((response.allocation.version, Allotment::Slots(slots))),
            Err(e) => {
                tracing::warn!(error = %e, "the leader's allocation names an invalid proxy; ignored");
                None
            }
        };
        let valid_until = sent_at + Duration::from_millis(response.allocation.ttl_ms);
        let feed = response.feed;
        // An answer overtaken by a newer one: only what is newer is applied.
        let (reset, items): (bool, Vec<FleetItem>) = if feed.reset {
            if feed.to < self.feed_seen {
                (false, Vec::new())
            } else {
                (true, feed.items)
            }
        } else {
            let skip = usize::try_from(self.feed_seen.saturating_sub(feed.from)).unwrap_or(usize::MAX);
            (false, feed.items.into_iter().skip(skip).collect())
        };
        if reset || feed.to > self.feed_seen {
            self.feed_seen = feed.to;
        }
        let probes = self.probe_feed(reset, &items, &response.members);
        let feed = items.iter().flat_map(fleet_news).collect();
        self.store.apply_share(ShareUpdate {
            // A renewal (the version applied already) carries no slots: the
            // store keeps what it has.
            allotment,
            valid_until,
            acked: response.acked,
            reset,
            feed,
        });
        if probes.reset || !probes.items.is_empty() || probes.members.is_some() {
            let _ = self.probes.send(probes);
        }
        self.status.send_modify(|s| {
            s.leader = Some(leader.to_owned());
            s.term = self.term.clone();
            s.last_answer = Some(Instant::now());
            s.members = response.members.clone();
            s.last_error = None;
        });
    }

    /// The probing news among `items`, and the live members if changed.
    fn probe_feed(&mut self, reset: bool, items: &[FleetItem], members: &[wire::MemberBody]) -> ProbeFeed {
        let mut feed = ProbeFeed {
            reset,
            ..ProbeFeed::default()
        };
        for item in items {
            match item {
                FleetItem::Probe(watch) => match watch.to_target(self.endpoint_policy.clone()) {
                    Ok((key, target, recorded)) => feed.items.push((key, Some((target, recorded)))),
                    Err(e) => tracing::warn!(error = %e, "the leader's feed held an invalid probe target"),
                },
                FleetItem::ProbeStopped { proxy } | FleetItem::Removed { proxy } => {
                    if let Ok(key) = crate::domain::lease::journal::parse_key(proxy) {
                        feed.items.push((key, None));
                    }
                }
                _ => {}
            }
        }
        let live = probing(members);
        if reset || live != self.members {
            self.members = live.clone();
            feed.members = Some(live);
        }
        feed
    }
}

/// What one feed item tells the lease store (probe targets aside).
fn fleet_news(item: &FleetItem) -> Vec<FleetNews> {
    match item {
        FleetItem::Available(body) => match body.to_availability() {
            Ok(availability) => vec![FleetNews::Available(availability)],
            Err(e) => {
                tracing::warn!(error = %e, "the leader's feed named an invalid proxy");
                Vec::new()
            }
        },
        FleetItem::Removed { proxy } => match crate::domain::lease::journal::parse_key(proxy) {
            Ok(key) => vec![FleetNews::Removed(key)],
            Err(_) => Vec::new(),
        },
        FleetItem::Probe(_) | FleetItem::ProbeStopped { .. } => Vec::new(),
        other => match other.to_changes() {
            Ok(Some(changes)) => changes.into_iter().map(FleetNews::Changed).collect(),
            Ok(None) => Vec::new(),
            Err(e) => {
                tracing::warn!(error = %e, "the leader's feed held an invalid change");
                Vec::new()
            }
        },
    }
}

/// A digest of the claims (order as the book lists them).
fn digest(claims: &[wire::Claim]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    for claim in claims {
        claim.proxy.hash(&mut hasher);
        claim.slots.hash(&mut hasher);
        claim.in_use.hash(&mut hasher);
    }
    hasher.finish()
}

/// The members that probe, sorted: the live ones but the quiet, unless
/// every one is quiet (someone has to probe; the leader judges them all
/// quiet when it cannot see their renewals, not when they stopped).
fn probing(members: &[wire::MemberBody]) -> Vec<MemberTag> {
    let all_quiet = members.iter().all(|m| m.quiet);
    let mut tags: Vec<MemberTag> = members
        .iter()
        .filter(|m| !m.quiet || all_quiet)
        .filter_map(|m| MemberTag::parse(&m.tag))
        .collect();
    tags.sort();
    tags
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(i: u8, quiet: bool) -> wire::MemberBody {
        wire::MemberBody {
            tag: MemberTag::of(&format!("replica-{i}"), &[i; 8]).to_string(),
            quiet,
            ..wire::MemberBody::default()
        }
    }

    /// Each row: the members (quiet or not); the ones that probe.
    #[test]
    fn the_quiet_do_not_probe_unless_all_are() {
        type Row = (&'static str, &'static [(u8, bool)], &'static [u8]);
        let rows: [Row; 4] = [
            ("none quiet", &[(0, false), (1, false), (2, false)], &[0, 1, 2]),
            ("one quiet", &[(0, false), (1, true), (2, false)], &[0, 2]),
            ("all quiet: all probe", &[(0, true), (1, true)], &[0, 1]),
            ("none at all", &[], &[]),
        ];
        for (what, members, want) in rows {
            let bodies: Vec<wire::MemberBody> = members.iter().map(|(i, q)| body(*i, *q)).collect();
            let mut want: Vec<MemberTag> = want
                .iter()
                .map(|i| MemberTag::of(&format!("replica-{i}"), &[*i; 8]))
                .collect();
            want.sort();
            assert_eq!(probing(&bodies), want, "{what}");
        }
    }
}
