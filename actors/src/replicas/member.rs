//! Kubernetes mode when every replica serves (`--every-replica-serves`):
//! each replica is a member with a Lease of its own and serves crawlers
//! (discovery API, gateway) from the capacity share the leader hands it;
//! the member that wins the leader Lease also acts on Proxies and runs the
//! share desk.
//!
//! ```text
//!  every replica:  member Lease ─ keep ─► roster tables ─► leader's address
//!                  LeaseStore (share) ◄─ ReplicaLink ─ sync ─► leader's ShareDesk
//!                  HealthProber ◄─ ProbeRouter ◄─ probe feed    (on the internal listener)
//!  the leader:     ProxyActors ─ availability ─► ShareDesk ─ feed ─► every replica
//!                  ProxyActors ─ Watch ─► ProbeRouter ─ publish ─► ShareDesk
//! ```

use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use egress_proxies::adapters::leader::{SystemClock, Tenure, Timings};
use egress_proxies::adapters::lease_store::FleetNews;
use egress_proxies::adapters::lease_store::LeaseStore;
use egress_proxies::adapters::replicas::ReplicaError;
use egress_proxies::adapters::replicas::client::{ReplicaClient, SyncTimings};
use egress_proxies::adapters::replicas::desk::{DeskSettings, ShareDesk};
use egress_proxies::adapters::replicas::link::{ProbeFeed, ReplicaLink, VerdictQueue};
use egress_proxies::adapters::replicas::members::{self, MemberIdentity, MemberTable, Membership, Roster};
use egress_proxies::adapters::replicas::token::ReplicaToken;
use egress_proxies::adapters::replicas::wire::{AvailabilityBody, FleetItem, ProbeWatch, Term};
use egress_proxies::domain::destinations::DestinationPolicy;
use egress_proxies::domain::membership::MemberTag;
use tokio::sync::{mpsc, watch};

use super::probe_router::{
    ApplyProbeFeed, Assigned, GetPlan, ProbeItem, ProbeRouter, RemoteVerdict, SetPublisher,
};
use super::server::{self, DeskSlot};
use super::view::{self, ReplicaView};
use crate::discovery::Forwarding;
use crate::lease_store_actor::{PublishTo, ShowReplicas};
use crate::operator::OperatorError;
use egress_proxies::adapters::lease_keeper::{Election, LeaseKeeper, Standing};
use egress_proxies::adapters::replicas::routes::{Adoptions, LeaseRoutes};
use egress_proxies::adapters::stores::configmap_lease_journal::JournalName;
use egress_proxies::adapters::stores::journal_adoption::{Deletion, JournalAdoption, journal_tags};
use egress_proxies::domain::lease::Report;

/// A share lasts this many lease durations: longer than a leader failover
/// (one lease duration, plus the new leader's start), so members keep
/// serving through one.
pub const SHARE_LIFETIMES: u32 = 3;

/// What a member needs from the operator's start.
pub struct MemberParts {
    /// For everything but the member Lease (journals, adoptions).
    pub client: kube::Client,
    /// The keeper's client, for the member Leases (called on its thread).
    pub lease_client: kube::Client,
    pub namespace: String,
    /// The pod's identity (`POD_NAME`): the leader Lease names it.
    pub identity: String,
    pub timings: Timings,
    pub clock: Arc<SystemClock>,
    /// The address other replicas reach the internal listener at.
    pub advertise: SocketAddr,
    pub token: Option<ReplicaToken>,
    /// Where External endpoints may not point (re-attached to probe targets).
    pub endpoint_policy: Option<Arc<DestinationPolicy>>,
}

/// A running member: what the operator keeps and hands to the leading part.
pub struct Member {
    pub tag: MemberTag,
    /// This replica's member Lease: its store grants only while it lasts.
    pub tenure: Tenure,
    /// The live members, every retry period.
    pub tables: watch::Receiver<MemberTable>,
    stop: watch::Sender<bool>,
    leader: watch::Sender<Option<String>>,
    desk: DeskSlot,
    advertise: SocketAddr,
    identity: String,
    /// While leading: the dead members' journals still to adopt.
    adoptions: Arc<Adoptions>,
    client: kube::Client,
    namespace: String,
}

/// Joins the members: a member Lease of its own, kept and looked at every
/// retry period. The handle ends (with an error) when the membership lapsed.
/// The member Lease is written and kept on the keeper's thread.
pub async fn join(parts: &MemberParts, keeper: &LeaseKeeper) -> Result<(Member, Keeping), OperatorError> {
    let incarnation: [u8; 8] = rand_incarnation();
    let me = MemberIdentity {
        pod: parts.identity.clone(),
        incarnation,
        address: Some(parts.advertise.to_string()),
    };
    let tag = me.tag();
    let joining = {
        let (client, namespace, me, timings, clock) = (
            parts.lease_client.clone(),
            parts.namespace.clone(),
            me.clone(),
            parts.timings,
            parts.clock.clone(),
        );
        async move { Membership::join(client, &namespace, me, timings, clock).await }
    };
    let membership = keeper
        .run(joining)
        .await
        .map_err(|e| OperatorError::LeaseKeeper(e.to_string()))??;
    let tenure = membership.tenure();
    let roster = Roster::new(
        parts.lease_client.clone(),
        &parts.namespace,
        &me,
        parts.timings,
        parts.clock.clone(),
    );
    let (tables_tx, tables) = watch::channel(MemberTable::default());
    let (stop, stopped) = watch::channel(false);
    let keeping = keeper.spawn(members::keep(
        membership,
        roster,
        parts.timings,
        tables_tx,
        stopped,
    ));
    tracing::info!(member = %tag, address = %parts.advertise, "joined the members");
    let desk = DeskSlot::default();
    let member = Member {
        tag,
        tenure,
        tables,
        stop,
        leader: watch::Sender::new(None),
        desk,
        advertise: parts.advertise,
        identity: parts.identity.clone(),
        adoptions: Arc::new(Adoptions::default()),
        client: parts.client.clone(),
        namespace: parts.namespace.clone(),
    };
    Ok((member, keeping))
}

/// The task keeping a member's Lease.
pub type Keeping = tokio::task::JoinHandle<Result<(), ReplicaError>>;

/// How long replicas wait on each other: an answer within the API call
/// timeout (a third of the lease duration), at least a second.
fn sync_timings(timings: Timings) -> SyncTimings {
    SyncTimings {
        answer_within: timings.call_timeout.max(Duration::from_secs(1)),
        ..SyncTimings::default()
    }
}

fn rand_incarnation() -> [u8; 8] {
    fastrand::u64(..).to_be_bytes()
}

/// What a serving member runs beside its store: the probe router and the
/// link to the leader.
pub struct Serving {
    pub router: Addr<ProbeRouter>,
    pub store: LeaseStore,
}

impl Member {
    /// How this replica passes on lease calls for leases another one holds.
    pub fn forwarding(&self, parts: &MemberParts) -> Result<Forwarding, ReplicaError> {
        Ok(Forwarding {
            routes: LeaseRoutes::new(
                self.tag.clone(),
                self.advertise.to_string(),
                self.tables.clone(),
                self.leader.subscribe(),
                self.adoptions.clone(),
            ),
            client: ReplicaClient::new(parts.token.clone(), sync_timings(parts.timings))?,
        })
    }

    /// Starts the link to the leader, the probe router over this replica's
    /// serving part, and the internal listener on `listener`.
    pub fn serve(
        &self,
        serving: &crate::system::Serving,
        parts: &MemberParts,
        listener: TcpListener,
        forwarding: Forwarding,
    ) -> Result<Serving, ReplicaError> {
        let server = server::start(
            listener,
            self.desk.clone(),
            parts.token.clone(),
            serving.leases.clone(),
            forwarding,
        )
        .map_err(|e| ReplicaError::Unreachable {
            address: parts.advertise.to_string(),
            message: format!("the internal listener: {e}"),
        })?;
        actix::spawn(server);
        let verdicts = VerdictQueue::default();
        let upstream = verdicts.clone();
        let (tag, prober) = (self.tag.clone(), serving.prober.clone());
        // Threads of their own: the plan's work over thousands of proxies
        // and the sync's never delay the leader Lease's renewals.
        let router = ProbeRouter::start_in_arbiter(&Arbiter::new().handle(), move |_| {
            ProbeRouter::new(
                tag,
                prober,
                Arc::new(move |key, verdict| upstream.push(&key, &verdict)),
            )
        });
        let (probes, mut feed) = mpsc::unbounded_channel::<ProbeFeed>();
        let to_router = router.clone();
        actix::spawn(async move {
            while let Some(update) = feed.recv().await {
                to_router.do_send(ApplyProbeFeed {
                    reset: update.reset,
                    items: update
                        .items
                        .into_iter()
                        .map(|(key, target)| match target {
                            Some((target, recorded)) => ProbeItem::Watch {
                                key,
                                assigned: Assigned {
                                    target: Arc::new(target),
                                    recorded,
                                },
                            },
                            None => ProbeItem::Unwatch { key },
                        })
                        .collect(),
                    members: update.members,
                });
            }
        });
        let client = ReplicaClient::new(parts.token.clone(), sync_timings(parts.timings))?;
        let link = ReplicaLink::new(
            self.tag.clone(),
            serving.lease_store.clone(),
            client,
            self.leader.subscribe(),
            parts.endpoint_policy.clone(),
            verdicts,
            probes,
        );
        // This replica's view of the fleet, for the dashboard and the share metrics.
        let view = ReplicaView::default();
        actix::spawn(view::keep(
            view.clone(),
            view::Sources {
                tag: self.tag.clone(),
                store: serving.lease_store.clone(),
                link: link.status(),
                router: router.clone(),
                desk: self.desk.clone(),
            },
            self.stop.subscribe(),
        ));
        serving.leases.do_send(ShowReplicas(view));
        Arbiter::new().handle().spawn(link.run(self.stop.subscribe()));
        // The leader's address follows the member table (a new incarnation
        // of the leader's pod advertises itself anew).
        Ok(Serving {
            router,
            store: serving.lease_store.clone(),
        })
    }

    /// The leader Lease names `holder` (a pod): syncs go to that pod's
    /// live member.
    pub fn follow(&self, holder: &str) {
        let table = self.tables.borrow();
        let address = table
            .live
            .iter()
            .find(|m| m.pod.as_deref() == Some(holder))
            .and_then(|m| m.address.clone());
        self.leader.send_if_modified(|current| {
            let changed = *current != address;
            *current = address;
            changed
        });
    }

    /// This member won the leader Lease: it runs the share desk, and its
    /// own link syncs with it.
    pub async fn lead(
        &self,
        serving: &Serving,
        leases: &Addr<crate::lease_store_actor::LeaseStoreActor>,
        capacity: u32,
        lease_duration: Duration,
    ) -> Arc<ShareDesk> {
        let router = serving.router.clone();
        let verdicts = router.clone();
        let mut seed: Vec<FleetItem> = serving
            .store
            .fleet_seed()
            .into_iter()
            .filter_map(|news| match news {
                FleetNews::Available(a) => Some(FleetItem::Available(Box::new(AvailabilityBody::from(&a)))),
                FleetNews::Removed(_) => None,
                FleetNews::Changed(change) => FleetItem::from_change(&change),
            })
            .collect();
        // What the old leader published to probe, as this member's plan holds it.
        if let Ok(plan) = router.send(GetPlan).await {
            seed.extend(plan.into_iter().map(|(key, assigned)| {
                FleetItem::Probe(Box::new(ProbeWatch::new(
                    &key,
                    &assigned.target,
                    assigned.recorded.as_ref(),
                )))
            }));
        }
        let desk = Arc::new(ShareDesk::new(
            Term {
                holder: format!("{}/{}", self.identity, self.tag),
                transitions: 0,
            },
            DeskSettings {
                capacity,
                ttl: lease_duration * SHARE_LIFETIMES,
                rebuilding: true,
            },
            seed,
            Arc::new(move |from, verdicts_of| {
                for (key, verdict) in verdicts_of {
                    verdicts.do_send(RemoteVerdict {
                        from: from.clone(),
                        key,
                        verdict,
                    });
                }
            }),
        ));
        desk.set_members(&self.tables.borrow());
        self.desk.set(Some(desk.clone()));
        let publishing = desk.clone();
        router.do_send(SetPublisher(Some(Arc::new(move |item| {
            publishing.publish(match item {
                ProbeItem::Watch { key, assigned } => FleetItem::Probe(Box::new(ProbeWatch::new(
                    &key,
                    &assigned.target,
                    assigned.recorded.as_ref(),
                ))),
                ProbeItem::Unwatch { key } => FleetItem::ProbeStopped {
                    proxy: egress_proxies::domain::lease::journal::key_string(&key),
                },
            })
        }))));
        leases.do_send(PublishTo(Some(desk.clone())));
        self.leader.send_replace(Some(self.advertise.to_string()));
        let adopter = Adopter {
            client: self.client.clone(),
            namespace: self.namespace.clone(),
            store: serving.store.clone(),
            desk: desk.clone(),
            me: self.tag.clone(),
            adoptions: self.adoptions.clone(),
            retry: lease_duration * 2 / 15,
        };
        // Journals left by members that died before this leader took over
        // (or by a version before per-member journals).
        let first = adopter.clone();
        actix::spawn(async move { first.left_behind().await });
        // The desk's keeper: the roster's news every retry period.
        let keeper = desk.clone();
        let mut tables = self.tables.clone();
        actix::spawn(async move {
            loop {
                let table = tables.borrow_and_update().clone();
                let changed = keeper.set_members(&table);
                for tag in changed.died {
                    tracing::warn!(member = %tag, "a member died: its leases and shares are taken over once its journal is adopted");
                    adopter.adoptions.pending(&tag);
                    let adopter = adopter.clone();
                    actix::spawn(async move { adopter.adopt(JournalName::member(&tag), Some(tag)).await });
                }
                keeper.prune();
                if tables.changed().await.is_err() {
                    return;
                }
            }
        });
        desk
    }

    /// Stops the link and releases the member Lease (dead at once for the
    /// others); waits for the release.
    pub async fn leave(self, keeping: Keeping) {
        self.desk.set(None);
        let _ = self.stop.send(true);
        match keeping.await {
            Ok(Ok(())) => tracing::info!(member = %self.tag, "left the members"),
            Ok(Err(e)) => tracing::warn!(member = %self.tag, error = %e, "leaving the members"),
            Err(e) => tracing::warn!(member = %self.tag, error = %e, "the member's keeper failed"),
        }
    }
}

/// The leader's adoption of dead members' journals.
#[derive(Clone)]
struct Adopter {
    client: kube::Client,
    namespace: String,
    store: LeaseStore,
    desk: Arc<ShareDesk>,
    me: MemberTag,
    adoptions: Arc<Adoptions>,
    retry: Duration,
}

impl Adopter {
    /// Adopts every journal whose member has no Lease any more (a member
    /// with a Lease, live or dead, is the roster's to judge: a dead one is
    /// adopted when it calls it dead), then lets lease calls for dead
    /// members' leases through. The member Leases are listed after the
    /// journals: a member writes its Lease before its journal, so one that
    /// joined meanwhile is seen with its Lease, never taken for an orphan.
    async fn left_behind(self) {
        let (journals, members) = loop {
            let journals = journal_tags(self.client.clone(), &self.namespace)
                .await
                .map_err(|e| e.to_string());
            let members = match &journals {
                Ok(_) => members::member_tags(self.client.clone(), &self.namespace)
                    .await
                    .map_err(|e| e.to_string()),
                Err(_) => Ok(Default::default()),
            };
            match (journals, members) {
                (Ok(journals), Ok(members)) => break (journals, members),
                (Err(e), _) | (_, Err(e)) => {
                    tracing::warn!(error = %e, "listing lease journals or member Leases failed; retrying");
                    tokio::time::sleep(self.retry).await;
                }
            }
        };
        let orphans = members::orphans(&journals, &members, &self.me);
        for tag in &orphans {
            self.adoptions.pending(tag);
        }
        self.adoptions.scanned();
        self.clone().adopt(JournalName::default(), None).await;
        self.adoptions.untagged_adopted();
        for tag in orphans {
            self.clone().adopt(JournalName::member(&tag), Some(tag)).await;
        }
    }

    /// Merges `journal` into this leader's store until its shards are gone
    /// (retrying every retry period), then frees the member's shares.
    async fn adopt(self, journal: JournalName, tag: Option<MemberTag>) {
        let adoption = JournalAdoption::new(self.client.clone(), &self.namespace, journal);
        let started = Instant::now();
        let adopted = loop {
            match self.adopt_once(&adoption).await {
                Ok(adopted) => break adopted,
                Err(e) => {
                    tracing::warn!(journal = ?adoption.journal().prefix, error = %e, "adopting a lease journal failed; retrying");
                    tokio::time::sleep(self.retry).await;
                }
            }
        };
        if let Some(tag) = tag {
            if let Err(e) = members::delete_lease(self.client.clone(), &self.namespace, &tag).await {
                tracing::warn!(member = %tag, error = %e, "deleting a dead member's Lease failed");
            }
            let report = self.store.share_report();
            self.desk.adopted(
                &tag,
                &self.me,
                Report {
                    // After every report the link made (it counts from 1 per request).
                    seq: u64::MAX / 2,
                    applied: report.applied,
                    claims: report.claims,
                },
            );
            self.adoptions.done(&tag);
            tracing::info!(member = %tag, leases = adopted, took = ?started.elapsed(), "a dead member's leases adopted; its shares are free");
        } else if adopted > 0 {
            tracing::info!(
                leases = adopted,
                "the leader journal of an earlier version adopted"
            );
        }
    }

    /// One round: read, merge (durably), delete what was read; again while
    /// the journal changed since it was read.
    async fn adopt_once(&self, adoption: &JournalAdoption) -> Result<usize, String> {
        let mut read = adoption.read().await.map_err(|e| e.to_string())?;
        let mut adopted = 0;
        loop {
            if read.is_gone() {
                return Ok(adopted);
            }
            adopted += self.store.adopt(read.snapshot.clone()).await?;
            match adoption.delete(&read).await.map_err(|e| e.to_string())? {
                Deletion::Done => return Ok(adopted),
                Deletion::ChangedSince(again) => read = again,
            }
        }
    }
}

/// Follows the leader Lease's holder while this replica stands for it;
/// returns once this replica leads (true), or at shutdown (false).
pub async fn follow_until_leading(
    member: &Member,
    election: &mut Election,
    mut shutdown: std::pin::Pin<&mut dyn Future<Output = std::io::Result<()>>>,
) -> Result<bool, OperatorError> {
    let mut tables = member.tables.clone();
    let mut standing = election.standing();
    loop {
        let holder = match &*standing.borrow_and_update() {
            Standing::Leading => return Ok(true),
            Standing::Lost(why) => return Err(OperatorError::LeadershipLost(why)),
            Standing::Following(holder) => Some(holder.clone()),
            Standing::Candidate => None,
        };
        if let Some(holder) = &holder {
            member.follow(holder);
        }
        tokio::select! {
            changed = standing.changed() => if changed.is_err() {
                return Err(OperatorError::LeadershipLost("the election stopped"));
            },
            // A member joining may be the holder: its address is known now.
            changed = tables.changed() => if changed.is_ok() && let Some(h) = &holder {
                member.follow(h);
            },
            r = &mut shutdown => { r?; return Ok(false) }
        }
    }
}
