//! A replica's own view of the fleet when every replica serves: its member
//! tag, the leader its link syncs with and how long ago it answered, its
//! capacity share, what it probes, the member table the leader relays and,
//! on the leader, the share desk's members. A keeper fills it every second
//! from the member's parts and sets the share metrics from the same
//! figures; the dashboard reads it.
//!
//! ```text
//!  LeaseStore (share) ─┐
//!  ReplicaLink status ─┼─ keep, every second ─► ReplicaView ─► dashboard
//!  ProbeRouter stats ──┤                        └─► share metrics
//!  ShareDesk (leader) ─┘
//! ```

use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, Instant};

use actix::Addr;
use egress_proxies::adapters::lease_store::{LeaseStore, ShareStatus};
use egress_proxies::adapters::replicas::link::LinkStatus;
use egress_proxies::adapters::replicas::wire::MemberBody;
use egress_proxies::domain::lease::MemberShare;
use egress_proxies::domain::membership::MemberTag;
use egress_proxies::telemetry::events::{ShareMembersCounted, ShareObserved};
use serde::Serialize;
use tokio::sync::watch;

use super::probe_router::{GetRouterStats, ProbeRouter};
use super::server::DeskSlot;

/// How often the view (and the share metrics) is brought up to date.
const PERIOD: Duration = Duration::from_secs(1);

/// The latest figures, shared between the keeper and the dashboard.
#[derive(Clone, Default)]
pub struct ReplicaView(Arc<RwLock<Option<ReplicaFigures>>>);

impl ReplicaView {
    /// The figures as of the keeper's latest look (`None` before its first).
    pub fn get(&self) -> Option<ReplicaFigures> {
        self.0.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    fn set(&self, figures: ReplicaFigures) {
        *self.0.write().unwrap_or_else(PoisonError::into_inner) = Some(figures);
    }
}

/// What one replica sees of the replicas.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReplicaFigures {
    /// This replica's member tag.
    pub member: String,
    /// Whether this replica leads (runs the share desk).
    pub leading: bool,
    /// The leader's internal address this replica's link syncs with.
    pub leader: Option<String>,
    /// The leader's term as its answers name it (`pod/tag`).
    pub leader_holder: Option<String>,
    /// Since the leader last answered; `None`: it never did.
    pub sync_age_ms: Option<u64>,
    /// Why the latest sync failed, until one succeeds.
    pub last_error: Option<String>,
    pub share: ShareFigures,
    /// Proxies the shared probe plan gives this replica.
    pub probing: usize,
    /// The live members as the leader relays them (slots: what each holds).
    pub members: Vec<MemberBody>,
    /// On the leader: every member its share desk counts, dead ones too.
    pub desk: Vec<DeskMember>,
}

/// This replica's capacity share.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ShareFigures {
    /// It may grant: its share is unexpired and its member Lease held.
    pub valid: bool,
    /// Seconds the share stays valid without another answer (0: none).
    pub seconds_left: f64,
    /// Slots held over every proxy, and those in use.
    pub slots: u64,
    pub in_use: u64,
    /// Capacity is unlimited: the share gates by its expiry only.
    pub unlimited: bool,
    /// The allocation version applied.
    pub version: u64,
    /// Fleet changes not yet acknowledged by the leader.
    pub outbox: usize,
}

impl From<&ShareStatus> for ShareFigures {
    fn from(s: &ShareStatus) -> Self {
        Self {
            valid: s.member && s.left.is_some(),
            seconds_left: s.left.map_or(0.0, |l| l.as_secs_f64()),
            slots: s.slots,
            in_use: s.in_use,
            unlimited: s.unlimited,
            version: s.applied,
            outbox: s.outbox,
        }
    }
}

/// A member as the leader's share desk counts it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DeskMember {
    pub tag: String,
    /// Not declared dead (a dead member's shares count until adopted).
    pub live: bool,
    /// It has reported to this leader.
    pub reported: bool,
    /// Slots in its latest allocation, and the most it may be using.
    pub slots: u64,
    pub bound: u64,
    /// More slots it said it wants (lent idle slots of the others).
    pub wanting: u32,
}

impl From<MemberShare> for DeskMember {
    fn from(m: MemberShare) -> Self {
        Self {
            tag: m.tag.to_string(),
            live: m.live,
            reported: m.reported,
            slots: m.slots,
            bound: m.bound,
            wanting: m.wanting,
        }
    }
}

/// Where the keeper reads the figures.
pub struct Sources {
    pub tag: MemberTag,
    pub store: LeaseStore,
    pub link: watch::Receiver<LinkStatus>,
    pub router: Addr<ProbeRouter>,
    /// Holds the share desk while this replica leads.
    pub desk: DeskSlot,
}

/// Brings `view` and the share metrics up to date every second until
/// `stop` turns true.
pub async fn keep(view: ReplicaView, sources: Sources, mut stop: watch::Receiver<bool>) {
    let started = Instant::now();
    let mut tick = tokio::time::interval(PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            changed = stop.changed() => if changed.is_err() || *stop.borrow() { return },
        }
        let probing = sources
            .router
            .send(GetRouterStats)
            .await
            .map_or(0, |s| s.assigned_here);
        let share = sources.store.share_status();
        let link = sources.link.borrow().clone();
        let desk = sources.desk.get();
        let leading = desk.is_some();
        let desk: Vec<DeskMember> = desk
            .map(|desk| desk.members().into_iter().map(DeskMember::from).collect())
            .unwrap_or_default();
        let figures = figures(&sources.tag, &share, &link, probing, desk, leading);
        ShareObserved {
            slots: share.slots,
            in_use: share.in_use,
            left: share.left,
            sync_age: link
                .last_answer
                .map_or_else(|| started.elapsed(), |at| at.elapsed()),
        }
        .emit();
        if figures.leading {
            let live = figures.desk.iter().filter(|m| m.live).count();
            ShareMembersCounted {
                live,
                dead: figures.desk.len() - live,
            }
            .emit();
        }
        view.set(figures);
    }
}

/// The figures from what the parts say now.
fn figures(
    tag: &MemberTag,
    share: &ShareStatus,
    link: &LinkStatus,
    probing: usize,
    desk: Vec<DeskMember>,
    leading: bool,
) -> ReplicaFigures {
    ReplicaFigures {
        member: tag.to_string(),
        leading,
        leader: link.leader.clone(),
        leader_holder: link.term.as_ref().map(|t| t.holder.clone()),
        sync_age_ms: link
            .last_answer
            .map(|at| u64::try_from(at.elapsed().as_millis()).unwrap_or(u64::MAX)),
        last_error: link.last_error.clone(),
        share: ShareFigures::from(share),
        probing,
        members: link.members.clone(),
        desk,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tag() -> MemberTag {
        MemberTag::parse("0a1b2c3d").expect("a tag")
    }

    /// The share is valid only while both hold: an unexpired share and the
    /// member Lease; seconds left read 0 without one; the sync age is
    /// absent until the leader has answered.
    #[test]
    fn the_figures_say_what_the_parts_say() {
        let cases = [
            // (member, left, answered) → (valid, seconds left, sync age known)
            (true, Some(Duration::from_secs(5)), true, (true, 5.0, true)),
            (false, Some(Duration::from_secs(5)), true, (false, 5.0, true)),
            (true, None, true, (false, 0.0, true)),
            (true, None, false, (false, 0.0, false)),
        ];
        for (member, left, answered, (valid, seconds_left, aged)) in cases {
            let share = ShareStatus {
                left,
                member,
                slots: 4,
                in_use: 1,
                ..ShareStatus::default()
            };
            let link = LinkStatus {
                leader: Some("127.0.0.1:8091".into()),
                last_answer: answered.then(Instant::now),
                ..LinkStatus::default()
            };
            let f = figures(&tag(), &share, &link, 2, Vec::new(), false);
            let case = format!("member {member}, left {left:?}, answered {answered}");
            assert_eq!(f.share.valid, valid, "{case}");
            assert_eq!(f.share.seconds_left, seconds_left, "{case}");
            assert_eq!(f.sync_age_ms.is_some(), aged, "{case}");
            assert_eq!(
                (f.member.as_str(), f.share.slots, f.share.in_use, f.probing),
                ("0a1b2c3d", 4, 1, 2),
                "{case}"
            );
        }
    }
}
