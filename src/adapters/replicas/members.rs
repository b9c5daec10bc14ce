//! The members: every replica holds a `coordination.k8s.io` Lease
//! `egress-proxies-member-<tag>` of its own, renewed by a [`LeaderElector`]
//! that is its only candidate, and every replica lists the member Leases
//! every retry period and judges each one the way leader election judges a
//! leader ([`Liveness`]). So a member's [`Tenure`] ends at the renew
//! deadline after its last successful renew started, and the others call
//! it dead no earlier than the lease duration after they last saw its
//! record change — by then it has stopped acting for at least the
//! difference, whatever the clocks say.
//!
//! A member never comes back under the same tag: once its tenure lapses it
//! renews no more ([`ReplicaError::Lapsed`]); the process restarts as a new
//! incarnation with a new tag. Known gap: if a live member's Lease is
//! deleted by hand, the elector writes it again, without the member label,
//! on its next renew; [`keep`] notices at the list that follows that renew
//! (its own Lease is no longer listed as a member) and ends the tenure, so
//! the member acted at most one list call longer than it should have. The
//! unlabelled Lease it leaves is released but not deleted.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, DeleteParams, ListParams, PostParams, Preconditions};

use super::ReplicaError;
use crate::adapters::leader::{Attempt, Clock, LeaderElector, Tenure, Timings};
use crate::domain::membership::{Decision, Liveness, MemberTag};
use crate::telemetry::events::MembersSeen;

/// Name prefix of the member Leases (`egress-proxies-member-0a1b2c3d`).
pub const LEASE_PREFIX: &str = "egress-proxies-member-";
/// The label every member Lease carries (value `"true"`).
pub const MEMBER_LABEL: &str = "crawl.example.com/member";
/// Where a member can be reached on the internal listener (`ip:port`).
pub const ADDRESS_ANNOTATION: &str = "crawl.example.com/replica-address";
/// The pod a member runs in.
pub const POD_ANNOTATION: &str = "crawl.example.com/pod";
const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "egress-proxies-operator");

/// Who this replica is among the members.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberIdentity {
    /// Its pod (`POD_NAME`).
    pub pod: String,
    /// Random per process start: a restarted pod is a new member.
    pub incarnation: [u8; 8],
    /// `ip:port` of its internal listener, when it has one.
    pub address: Option<String>,
}

impl MemberIdentity {
    pub fn tag(&self) -> MemberTag {
        MemberTag::of(&self.pod, &self.incarnation)
    }

    /// The holder its member Lease names: `<pod>/<incarnation in hex>`.
    pub fn holder(&self) -> String {
        format!("{}/{}", self.pod, hex::encode(self.incarnation))
    }

    /// The name of its member Lease.
    pub fn lease_name(&self) -> String {
        lease_name(&self.tag())
    }
}

/// The member Lease of `tag`.
pub fn lease_name(tag: &MemberTag) -> String {
    format!("{LEASE_PREFIX}{tag}")
}

/// The tag a member Lease's name carries.
pub fn tag_of_lease(name: &str) -> Option<MemberTag> {
    MemberTag::parse(name.strip_prefix(LEASE_PREFIX)?)
}

/// This replica's member Lease and the tenure it gives.
pub struct Membership {
    me: MemberIdentity,
    elector: LeaderElector,
    tenure: Tenure,
    lapsed: bool,
}

impl Membership {
    /// Writes this replica's member Lease (labelled, with its address and
    /// pod) and starts the tenure it gives.
    pub async fn join(
        client: kube::Client,
        namespace: &str,
        me: MemberIdentity,
        timings: Timings,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, ReplicaError> {
        let api: Api<Lease> = Api::namespaced(client.clone(), namespace);
        let name = me.lease_name();
        let started = clock.now();
        let now = MicroTime(clock.wall());
        let mut annotations = BTreeMap::from([(POD_ANNOTATION.to_owned(), me.pod.clone())]);
        if let Some(address) = &me.address {
            annotations.insert(ADDRESS_ANNOTATION.to_owned(), address.clone());
        }
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                labels: Some(BTreeMap::from([
                    (MEMBER_LABEL.to_owned(), "true".to_owned()),
                    (MANAGED_BY.0.to_owned(), MANAGED_BY.1.to_owned()),
                ])),
                annotations: Some(annotations),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(me.holder()),
                lease_duration_seconds: Some(whole_seconds(timings)),
                acquire_time: Some(now.clone()),
                renew_time: Some(now),
                lease_transitions: Some(0),
                ..LeaseSpec::default()
            }),
        };
        tokio::time::timeout(timings.call_timeout, api.create(&PostParams::default(), &lease))
            .await
            .map_err(|_| ReplicaError::Timeout {
                address: format!("the API server (creating Lease {name})"),
                after: timings.call_timeout,
            })?
            .map_err(|source| ReplicaError::MemberLeases {
                call: "create",
                source,
            })?;
        let tenure = Tenure::new(clock.clone());
        tenure.extend(started + timings.renew_deadline);
        let elector = LeaderElector::new(client, namespace, &name, &me.holder(), timings, clock);
        Ok(Self {
            me,
            elector,
            tenure,
            lapsed: false,
        })
    }

    pub fn identity(&self) -> &MemberIdentity {
        &self.me
    }

    pub fn tag(&self) -> MemberTag {
        self.me.tag()
    }

    /// How long this replica may act as a member (hold a share, grant,
    /// write its journal); shared with whatever checks it.
    pub fn tenure(&self) -> Tenure {
        self.tenure.clone()
    }

    /// Renews the member Lease once (call every retry period). Fails for
    /// good with [`ReplicaError::Lapsed`] once the tenure has run out.
    pub async fn renew(&mut self) -> Result<Instant, ReplicaError> {
        if self.lapsed {
            return Err(self.lapse("it lapsed before"));
        }
        if !self.tenure.is_leading() {
            return Err(self.lapse("not renewed within the renew deadline"));
        }
        match self.elector.try_acquire_or_renew().await? {
            Attempt::Leading { until } => {
                self.tenure.extend(until);
                Ok(until)
            }
            // Someone else wrote our Lease: it is no longer ours to renew.
            Attempt::Following { holder } if !holder.is_empty() && holder != self.me.holder() => {
                Err(self.lapse(&format!("another holder wrote it ({holder})")))
            }
            // Lost a write race on our own Lease: try again next period.
            Attempt::Following { .. } => self
                .tenure
                .until()
                .ok_or_else(|| self.lapse("its tenure ended while a write raced")),
        }
    }

    /// Ends the tenure for good (the member is no longer listed as ours,
    /// or it lapsed).
    pub fn lapse(&mut self, why: &str) -> ReplicaError {
        self.lapsed = true;
        self.tenure.end();
        ReplicaError::Lapsed {
            lease: self.me.lease_name(),
            why: why.to_owned(),
        }
    }

    /// Ends the tenure, then gives the Lease up, so the others take this
    /// member for dead at once (on shutdown).
    pub async fn release(mut self) -> Result<(), ReplicaError> {
        self.lapse("released");
        self.elector.release().await?;
        Ok(())
    }
}

fn whole_seconds(timings: Timings) -> i32 {
    let d = timings.lease_duration;
    let secs = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    i32::try_from(secs.max(1)).unwrap_or(i32::MAX)
}

/// One member as the list showed it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    pub tag: MemberTag,
    /// Its internal listener, when it advertises one.
    pub address: Option<String>,
    pub pod: Option<String>,
}

/// The members as judged by one look.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemberTable {
    /// Alive (this replica's own member included while it is listed), by tag.
    pub live: Vec<Member>,
    /// Listed, but released or unchanged for the lease duration.
    pub dead: Vec<MemberTag>,
    /// Live, but unchanged for half the lease duration (several renewals
    /// missed): probably dead. Not trusted with probes meanwhile (a
    /// probe twice is harmless; a proxy unprobed for a lease duration is
    /// not); its capacity waits for the full judgement.
    pub quiet: Vec<MemberTag>,
    /// Listed at the previous look and gone now (deleted: dead at once).
    pub gone: Vec<MemberTag>,
}

impl MemberTable {
    /// The live members' tags, for assignments (`probe_assignee`).
    pub fn live_tags(&self) -> Vec<MemberTag> {
        self.live.iter().map(|m| m.tag.clone()).collect()
    }

    /// Where a live member can be reached.
    pub fn address_of(&self, tag: &MemberTag) -> Option<&str> {
        self.live.iter().find(|m| &m.tag == tag)?.address.as_deref()
    }

    pub fn is_live(&self, tag: &MemberTag) -> bool {
        self.live.iter().any(|m| &m.tag == tag)
    }
}

/// Lists the member Leases and judges each: what every replica runs every
/// retry period.
pub struct Roster {
    api: Api<Lease>,
    /// This replica's holder: its own Lease is judged as ours.
    me: String,
    timings: Timings,
    clock: Arc<dyn Clock>,
    judges: BTreeMap<MemberTag, Liveness>,
    /// The resourceVersion of each member Lease judged dead at the last
    /// look: a removal is guarded by it.
    dead: BTreeMap<MemberTag, String>,
}

impl Roster {
    pub fn new(
        client: kube::Client,
        namespace: &str,
        me: &MemberIdentity,
        timings: Timings,
        clock: Arc<dyn Clock>,
    ) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            me: me.holder(),
            timings,
            clock,
            judges: BTreeMap::new(),
            dead: BTreeMap::new(),
        }
    }

    /// Lists the member Leases and judges them.
    pub async fn look(&mut self) -> Result<MemberTable, ReplicaError> {
        let params = ListParams::default().labels(&format!("{MEMBER_LABEL}=true"));
        let after = self.timings.call_timeout;
        let list = tokio::time::timeout(after, self.api.list(&params))
            .await
            .map_err(|_| ReplicaError::Timeout {
                address: "the API server (listing member Leases)".to_owned(),
                after,
            })?
            .map_err(|source| ReplicaError::MemberLeases { call: "list", source })?;
        let seen_at = self.clock.now();
        Ok(self.judge(&list.items, seen_at))
    }

    /// Deletes the Lease of `tag`, judged dead at the last look, once its
    /// journal is adopted — only as that look saw it (guarded by its
    /// resourceVersion). `Ok(false)`: not judged dead, or changed since
    /// (kept); `Ok(true)`: deleted, or gone already.
    pub async fn remove_dead(&mut self, tag: &MemberTag) -> Result<bool, ReplicaError> {
        let Some(version) = self.dead.get(tag).cloned() else {
            return Ok(false);
        };
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                resource_version: Some(version),
                uid: None,
            }),
            ..DeleteParams::default()
        };
        let after = self.timings.call_timeout;
        let deleted = tokio::time::timeout(after, self.api.delete(&lease_name(tag), &params))
            .await
            .map_err(|_| ReplicaError::Timeout {
                address: format!("the API server (deleting Lease {})", lease_name(tag)),
                after,
            })?;
        match deleted {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(kube::Error::Api(s)) if s.code == 409 => return Ok(false),
            Err(source) => {
                return Err(ReplicaError::MemberLeases {
                    call: "delete",
                    source,
                });
            }
        }
        self.dead.remove(tag);
        Ok(true)
    }

    /// Judges the Leases one list returned, read completed at `seen_at`.
    pub fn judge(&mut self, leases: &[Lease], seen_at: Instant) -> MemberTable {
        let mut table = MemberTable::default();
        let mut listed = BTreeSet::new();
        self.dead.clear();
        for lease in leases {
            let Some(tag) = lease.metadata.name.as_deref().and_then(tag_of_lease) else {
                continue;
            };
            listed.insert(tag.clone());
            let judge = self
                .judges
                .entry(tag.clone())
                .or_insert_with(|| Liveness::new(&self.me, self.timings.lease_duration));
            let alive = match judge.decide(lease, seen_at) {
                Decision::Renew => true,
                Decision::Follow { .. } => {
                    if judge.unchanged_for(seen_at) >= self.timings.lease_duration / 2 {
                        table.quiet.push(tag.clone());
                    }
                    true
                }
                Decision::TakeOver => false,
            };
            if alive {
                let annotation = |key: &str| lease.metadata.annotations.as_ref()?.get(key).cloned();
                table.live.push(Member {
                    tag,
                    address: annotation(ADDRESS_ANNOTATION),
                    pod: annotation(POD_ANNOTATION),
                });
            } else {
                let version = lease.metadata.resource_version.clone().unwrap_or_default();
                self.dead.insert(tag.clone(), version);
                table.dead.push(tag);
            }
        }
        table.gone = self
            .judges
            .keys()
            .filter(|tag| !listed.contains(*tag))
            .cloned()
            .collect();
        self.judges.retain(|tag, _| listed.contains(tag));
        table
    }
}

/// Whether the API server answers a read of `tag`'s member Lease within
/// `within` (a replica whose membership lapsed waits for this before it
/// restarts as a new member).
pub async fn api_answers(
    client: kube::Client,
    namespace: &str,
    tag: &MemberTag,
    within: std::time::Duration,
) -> bool {
    let api: Api<Lease> = Api::namespaced(client, namespace);
    matches!(
        tokio::time::timeout(within, api.get_opt(&lease_name(tag))).await,
        Ok(Ok(_))
    )
}

/// The journals a new leader adopts at takeover: those whose member has
/// no Lease at all (listed after the journals), other than its own. A
/// member with a Lease, live or dead, is the roster's to judge: a dead
/// one's journal is adopted when the roster calls it dead, and a member
/// that joined during the takeover (its Lease written before its
/// journal) is never taken for gone.
pub fn orphans(
    journals: &BTreeSet<MemberTag>,
    leases: &BTreeSet<MemberTag>,
    me: &MemberTag,
) -> Vec<MemberTag> {
    journals
        .iter()
        .filter(|tag| *tag != me && !leases.contains(*tag))
        .cloned()
        .collect()
}

/// Every member Lease there is now, live or not, by tag: a journal whose
/// member has one is no orphan (a dead one's is adopted when the roster
/// calls it dead).
pub async fn member_tags(client: kube::Client, namespace: &str) -> Result<BTreeSet<MemberTag>, ReplicaError> {
    let api: Api<Lease> = Api::namespaced(client, namespace);
    let params = ListParams::default().labels(&format!("{MEMBER_LABEL}=true"));
    let list = api
        .list(&params)
        .await
        .map_err(|source| ReplicaError::MemberLeases { call: "list", source })?;
    Ok(list
        .items
        .iter()
        .filter_map(|lease| lease.metadata.name.as_deref().and_then(tag_of_lease))
        .collect())
}

/// Deletes `tag`'s member Lease (after its journal was adopted: the tag
/// names one process's incarnation, never renewed again once dead).
pub async fn delete_lease(
    client: kube::Client,
    namespace: &str,
    tag: &MemberTag,
) -> Result<(), ReplicaError> {
    let api: Api<Lease> = Api::namespaced(client, namespace);
    match api
        .delete(&lease_name(tag), &kube::api::DeleteParams::default())
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(source) => Err(ReplicaError::MemberLeases {
            call: "delete",
            source,
        }),
    }
}

/// Keeps this replica a member until `stop` turns true: renews its Lease
/// and looks at every member each retry period, publishing each table in
/// `tables`; then releases the Lease. Ends with [`ReplicaError::Lapsed`]
/// (after trying to release the Lease, so it is dead at once) when the
/// tenure ran out or the list stopped showing this member.
pub async fn keep(
    mut membership: Membership,
    mut roster: Roster,
    timings: Timings,
    tables: tokio::sync::watch::Sender<MemberTable>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> Result<(), ReplicaError> {
    let mut tick = tokio::time::interval(timings.retry_period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let me = membership.tag();
    loop {
        let stopping = tokio::select! {
            _ = tick.tick() => false,
            // A dropped sender stops it too.
            _ = stop.wait_for(|s| *s) => true,
        };
        if stopping {
            return membership.release().await;
        }
        let lapsed = match membership.renew().await {
            Err(e @ ReplicaError::Lapsed { .. }) => Some(e),
            Err(e) => {
                tracing::warn!(error = %e, "renewing this replica's member Lease failed; retrying");
                None
            }
            Ok(_) => None,
        };
        let lapsed = match (lapsed, roster.look().await) {
            (Some(e), _) => Some(e),
            (None, Ok(table)) => {
                MembersSeen {
                    live: table.live.len(),
                    quiet: table.quiet.len(),
                    dead: table.dead.len(),
                }
                .emit();
                let listed = table.is_live(&me);
                let why = (!listed).then(|| {
                    let tags = |tags: Vec<String>| tags.join(", ");
                    format!(
                        "the member Leases listed do not show it live (live: [{}]; dead: [{}]; gone: [{}])",
                        tags(table.live.iter().map(|m| m.tag.to_string()).collect()),
                        tags(table.dead.iter().map(ToString::to_string).collect()),
                        tags(table.gone.iter().map(ToString::to_string).collect()),
                    )
                });
                tables.send_replace(table);
                why.map(|why| membership.lapse(&why))
            }
            (None, Err(e)) => {
                tracing::warn!(error = %e, "listing the member Leases failed; retrying");
                None
            }
        };
        if let Some(lapsed) = lapsed {
            tracing::error!(error = %lapsed, "this replica is no longer a member");
            if let Err(e) = membership.release().await {
                tracing::warn!(error = %e, "releasing the lapsed member Lease failed");
            }
            return Err(lapsed);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::adapters::leader::SystemClock;

    fn tag(i: u8) -> MemberTag {
        MemberTag::of(&format!("replica-{i}"), &[i; 8])
    }

    /// Each row: the journals and the member Leases there are; the
    /// journals a new leader (member 0) adopts at takeover.
    #[test]
    fn only_journals_without_a_member_lease_are_orphans() {
        let set = |tags: &[u8]| tags.iter().map(|i| tag(*i)).collect::<BTreeSet<_>>();
        /// What, the journals, the member Leases, the journals adopted.
        type Row = (&'static str, &'static [u8], &'static [u8], &'static [u8]);
        let rows: [Row; 4] = [
            ("its own journal is never one", &[0], &[], &[]),
            (
                "a member with a Lease is the roster's to judge",
                &[0, 1],
                &[0, 1],
                &[],
            ),
            (
                "a member that joined during the takeover: its Lease came first",
                &[0, 2],
                &[0, 1, 2],
                &[],
            ),
            (
                "a journal left without a Lease (or before per-member ones)",
                &[0, 3, 4],
                &[0, 4],
                &[3],
            ),
        ];
        for (what, journals, leases, adopted) in rows {
            let mut want: Vec<MemberTag> = adopted.iter().map(|i| tag(*i)).collect();
            want.sort();
            assert_eq!(orphans(&set(journals), &set(leases), &tag(0)), want, "{what}");
        }
    }

    /// A member Lease as its holder wrote it, at resourceVersion `version`.
    fn member_lease(i: u8, version: u64) -> Lease {
        let me = MemberIdentity {
            pod: format!("replica-{i}"),
            incarnation: [i; 8],
            address: None,
        };
        Lease {
            metadata: ObjectMeta {
                name: Some(me.lease_name()),
                resource_version: Some(version.to_string()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(me.holder()),
                lease_duration_seconds: Some(3),
                ..LeaseSpec::default()
            }),
        }
    }

    /// Each row: how long member 1's Lease has been unchanged at the look
    /// (member 0 looks, lease duration 3 s); whether member 1 is live,
    /// quiet (its probes go to the others), dead.
    #[tokio::test]
    async fn a_member_quiet_for_half_the_lease_duration_is_kept_from_probes() {
        type Row = (&'static str, u64, bool, bool, bool);
        let rows: [Row; 5] = [
            ("just renewed", 0, true, false, false),
            ("three renewals missed", 1_400, true, false, false),
            ("half the lease duration", 1_500, true, true, false),
            ("nearly the whole", 2_999, true, true, false),
            ("the whole lease duration: dead", 3_000, false, false, true),
        ];
        let client =
            kube::Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().unwrap())).unwrap();
        let timings = Timings::from_lease_duration(Duration::from_secs(3));
        let me = MemberIdentity {
            pod: "replica-0".into(),
            incarnation: [0; 8],
            address: None,
        };
        for (what, quiet_ms, live, quiet, dead) in rows {
            let mut roster = Roster::new(client.clone(), "crawl", &me, timings, Arc::new(SystemClock));
            let t0 = Instant::now();
            let leases = [member_lease(0, 1), member_lease(1, 1)];
            roster.judge(&leases, t0);
            // Member 0 (the looker) renews; member 1 does not.
            let leases = [member_lease(0, 2), member_lease(1, 1)];
            let table = roster.judge(&leases, t0 + Duration::from_millis(quiet_ms));
            assert_eq!(table.is_live(&tag(1)), live, "{what}: live");
            assert_eq!(table.quiet.contains(&tag(1)), quiet, "{what}: quiet");
            assert_eq!(table.dead.contains(&tag(1)), dead, "{what}: dead");
            assert!(
                table.is_live(&tag(0)) && !table.quiet.contains(&tag(0)),
                "{what}: the looker"
            );
        }
    }
}
