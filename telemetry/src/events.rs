//! Internal events, in the style of Vector's instrumentation spec: one
//! struct per notable happening whose `emit` writes the log line and
//! records the metrics, so every metric has its log and label values stay
//! bounded.

use std::net::SocketAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::gateway_stats::{RecentExchange, gateway_stats};
use super::history::history;
use super::label_budget::proxy_labels;
use super::metrics::{
    ActorLabel, GatewayBytesLabels, GatewayFailureLabels, GatewayKindLabel, GatewayOutcomeLabels,
    GatewayProxyLabel, HandshakeLabel, HostLabel, ListenerRefusalLabels, PhaseLabel, PoolLabel,
    PoolReasonLabels, ProviderCallLabels, ProviderOpLabels, ProviderReasonLabels, ReasonLabel,
    ReplacementLabels, ResultLabel, RpcLabel, StateLabel, metrics,
};

/// A provider call returned.
pub struct ProviderCallCompleted<'a> {
    pub provider: &'a str,
    pub kind: &'a str,
    pub op: &'a str,
    /// `ok` or the error class.
    pub result: &'a str,
    pub duration: Duration,
}

impl ProviderCallCompleted<'_> {
    pub fn emit(self) {
        tracing::debug!(
            provider = self.provider,
            op = self.op,
            result = self.result,
            durationMs = self.duration.as_millis() as u64,
            "provider call"
        );
        let m = metrics();
        m.provider_calls
            .get_or_create(&ProviderCallLabels {
                provider: self.provider.to_owned(),
                kind: self.kind.to_owned(),
                op: self.op.to_owned(),
                result: self.result.to_owned(),
            })
            .inc();
        m.provider_call_duration
            .get_or_create(&ProviderOpLabels {
                provider: self.provider.to_owned(),
                op: self.op.to_owned(),
            })
            .observe(self.duration.as_secs_f64());
    }
}

/// A reconcile of one Proxy finished.
pub struct ReconcileCompleted<'a> {
    pub proxy: &'a str,
    /// `ok`, or the failure's kind and class (`provider_transient`, `store`, ...).
    pub result: &'a str,
    pub duration: Duration,
}

impl ReconcileCompleted<'_> {
    pub fn emit(self) {
        tracing::debug!(
            proxy = self.proxy,
            result = self.result,
            durationMs = self.duration.as_millis() as u64,
            "reconcile finished"
        );
        let m = metrics();
        m.reconciles
            .get_or_create(&ResultLabel {
                result: self.result.to_owned(),
            })
            .inc();
        m.reconcile_duration.observe(self.duration.as_secs_f64());
    }
}

/// A Managed proxy's instance stopped or vanished: it will be replaced
/// after `retry_in` (the replacement backoff).
pub struct InstanceLost<'a> {
    pub proxy: &'a str,
    pub provider: &'a str,
    /// What was lost, as the `reason` label of `replacements_total`
    /// (`stopped` or `vanished`).
    pub loss: &'static str,
    /// The provider's explanation (never secrets).
    pub reason: &'a str,
    /// Losses in a row, this one included.
    pub count: u32,
    pub retry_in: Duration,
}

impl InstanceLost<'_> {
    pub fn emit(self) {
        tracing::warn!(
            proxy = self.proxy,
            provider = self.provider,
            reason = self.reason,
            replacement = self.count,
            retryInSeconds = self.retry_in.as_secs(),
            "instance lost; replacing it"
        );
        replaced(self.provider, self.loss);
    }
}

/// A Managed proxy's instance is replaced because its spec changed.
pub struct InstanceReplaced<'a> {
    pub proxy: &'a str,
    pub provider: &'a str,
    /// The metric label: `spec_changed`.
    pub reason: &'static str,
}

impl InstanceReplaced<'_> {
    pub fn emit(self) {
        tracing::info!(
            proxy = self.proxy,
            provider = self.provider,
            reason = self.reason,
            "old instance deleted; creating its replacement"
        );
        replaced(self.provider, self.reason);
    }
}

fn replaced(provider: &str, reason: &str) {
    metrics()
        .instance_replacements
        .get_or_create(&ReplacementLabels {
            provider: provider.to_owned(),
            reason: reason.to_owned(),
        })
        .inc();
}

/// A Proxy moved from one phase to another (`None`: not counted — new or gone).
pub struct ProxyPhaseChanged<'a> {
    pub proxy: &'a str,
    pub from: Option<&'a str>,
    pub to: Option<&'a str>,
}

impl ProxyPhaseChanged<'_> {
    pub fn emit(self) {
        tracing::trace!(proxy = self.proxy, from = ?self.from, to = ?self.to, "proxy phase");
        history().note_phase(self.from, self.to);
        if self.from.is_some() && self.to.is_none() {
            forget_gateway_series(self.proxy);
        }
        let m = metrics();
        if let Some(from) = self.from {
            m.proxies
                .get_or_create(&PhaseLabel {
                    phase: from.to_owned(),
                })
                .dec();
        }
        if let Some(to) = self.to {
            m.proxies
                .get_or_create(&PhaseLabel { phase: to.to_owned() })
                .inc();
        }
    }
}

/// A health probe finished.
pub struct ProbeCompleted<'a> {
    /// `ok` or the failure reason (`timeout`, `connect_refused`, ...).
    pub result: &'a str,
    pub duration: Duration,
}

impl ProbeCompleted<'_> {
    pub fn emit(self) {
        // Thousands per second: trace level (`--trace-health-probes` has the detailed record).
        tracing::trace!(
            result = self.result,
            durationMs = self.duration.as_millis() as u64,
            "probe"
        );
        let m = metrics();
        m.probes
            .get_or_create(&ResultLabel {
                result: self.result.to_owned(),
            })
            .inc();
        m.probe_duration.observe(self.duration.as_secs_f64());
        history().note_probe(self.duration);
    }
}

/// An https probe finished its TLS handshake with the target.
pub struct ProbeTlsHandshake {
    /// Resumed from a session the target issued to an earlier probe.
    pub resumed: bool,
}

impl ProbeTlsHandshake {
    pub fn emit(self) {
        let kind = if self.resumed { "resumed" } else { "full" };
        tracing::trace!(kind, "probe TLS handshake");
        metrics()
            .probe_tls_handshakes
            .get_or_create(&HandshakeLabel { kind })
            .inc();
    }
}

/// The lease book answered an acquire, or expired leases.
pub enum LeaseEvent<'a> {
    Granted { proxy: &'a str, target: &'a str },
    Denied { reason: &'a str },
    Expired { count: usize },
}

impl LeaseEvent<'_> {
    /// `active`: leases held after the change.
    pub fn emit(self, active: usize) {
        let m = metrics();
        match self {
            LeaseEvent::Granted { proxy, target } => {
                tracing::debug!(proxy, target, active, "lease granted");
                m.leases_granted.inc();
                history().note_grant();
            }
            LeaseEvent::Denied { reason } => {
                tracing::debug!(reason, "lease denied");
                history().note_denial();
                m.leases_denied
                    .get_or_create(&ReasonLabel {
                        reason: reason.to_owned(),
                    })
                    .inc();
            }
            LeaseEvent::Expired { count } => {
                tracing::debug!(count, active, "leases expired");
                m.leases_expired.inc_by(count as u64);
            }
        }
        m.leases_active.set(active as i64);
    }
}

/// How many instances one GC sweep listed but left alone, for one provider
/// and one reason (`untagged`, `other_installation`, `out_of_scope`,
/// `released`). A gauge: the count of the latest sweep.
pub struct GcNotOurs<'a> {
    pub provider: &'a str,
    pub reason: &'a str,
    pub count: usize,
}

impl GcNotOurs<'_> {
    pub fn emit(self) {
        if self.count > 0 {
            tracing::debug!(
                provider = self.provider,
                reason = self.reason,
                count = self.count,
                "GC: instances left alone"
            );
        }
        metrics()
            .gc_instances_left_alone
            .get_or_create(&ProviderReasonLabels {
                provider: self.provider.to_owned(),
                reason: self.reason.to_owned(),
            })
            .set(self.count as i64);
    }
}

/// One orphan-GC sweep ended, with its figures or the reason it could not run.
pub struct GcSweepCompleted<'a> {
    pub outcome: Result<SweepFigures<'a>, &'a dyn std::fmt::Display>,
}

/// What one sweep did (`gc::SweepReport::figures`).
pub struct SweepFigures<'a> {
    pub listed: usize,
    pub orphans: usize,
    pub deleted: usize,
    pub failed_deletes: usize,
    pub spared_young: usize,
    pub skipped_providers: &'a [String],
    pub leftovers_deleted: usize,
    pub leftovers_waiting: usize,
    pub leftover_errors: usize,
}

impl GcSweepCompleted<'_> {
    pub fn emit(self) {
        let m = metrics();
        let result = match self.outcome {
            Err(e) => {
                tracing::warn!(error = %e, "gc.sweep failed");
                "failed"
            }
            Ok(r) => {
                let incomplete =
                    !r.skipped_providers.is_empty() || r.failed_deletes > 0 || r.leftover_errors > 0;
                macro_rules! sweep_line {
                    ($level:ident, $message:literal) => {
                        tracing::$level!(
                            listed = r.listed, orphans = r.orphans, deleted = r.deleted,
                            failedDeletes = r.failed_deletes, sparedYoung = r.spared_young,
                            skippedProviders = ?r.skipped_providers, leftoversDeleted = r.leftovers_deleted,
                            leftoversWaiting = r.leftovers_waiting, leftoverErrors = r.leftover_errors, $message
                        )
                    };
                }
                if incomplete {
                    sweep_line!(warn, "gc.sweep incomplete");
                } else {
                    sweep_line!(info, "gc.sweep");
                }
                m.gc_instances_deleted.inc_by(r.deleted as u64);
                m.gc_delete_failures
                    .inc_by((r.failed_deletes + r.leftover_errors) as u64);
                if incomplete { "incomplete" } else { "ok" }
            }
        };
        m.gc_sweeps
            .get_or_create(&ResultLabel {
                result: result.to_owned(),
            })
            .inc();
    }
}

/// This replica started or stopped acting as the leader (standalone, and
/// without leader election, it leads from start to stop).
pub struct LeadershipChanged<'a> {
    pub identity: &'a str,
    pub leading: bool,
}

impl LeadershipChanged<'_> {
    pub fn emit(self) {
        if self.leading {
            tracing::info!(identity = self.identity, "became the leader");
        } else {
            tracing::info!(identity = self.identity, "no longer the leader");
        }
        metrics().leader.set(i64::from(self.leading));
    }
}

/// This replica looked at the member Leases (every retry period).
pub struct MembersSeen {
    pub live: usize,
    /// Of the live, those whose Lease stayed unchanged for half the lease
    /// duration (their probes go to the others).
    pub quiet: usize,
    pub dead: usize,
}

impl MembersSeen {
    pub fn emit(self) {
        tracing::debug!(
            live = self.live,
            quiet = self.quiet,
            dead = self.dead,
            "member replicas"
        );
        let m = metrics();
        for (state, count) in [("live", self.live), ("quiet", self.quiet), ("dead", self.dead)] {
            m.replicas
                .get_or_create(&StateLabel {
                    state: state.to_owned(),
                })
                .set(i64::try_from(count).unwrap_or(i64::MAX));
        }
    }
}

/// A lease call was forwarded to the replica holding the lease.
pub struct LeaseForwarded<'a> {
    /// `release`, `renew` or `report`: logged, not a label.
    pub op: &'a str,
    /// The holder's `ip:port`: logged, not a label.
    pub holder: &'a str,
    /// `ok` (2xx), `refused` (the holder answered otherwise), `timeout`
    /// or `unreachable`: the label.
    pub result: &'static str,
}

impl LeaseForwarded<'_> {
    pub fn emit(self) {
        tracing::debug!(
            op = self.op,
            holder = self.holder,
            result = self.result,
            "lease call forwarded"
        );
        metrics()
            .lease_forwards
            .get_or_create(&ResultLabel {
                result: self.result.to_owned(),
            })
            .inc();
    }
}

/// This replica's capacity share as it stands (every replica serving;
/// emitted every second).
pub struct ShareObserved {
    /// Slots held over every proxy, and those in use.
    pub slots: u64,
    pub in_use: u64,
    /// How long the share stays valid (`None`: no valid share).
    pub left: Option<Duration>,
    /// Since the leader last answered (or since the link started).
    pub sync_age: Duration,
}

impl ShareObserved {
    pub fn emit(self) {
        let m = metrics();
        m.share_slots.set(i64::try_from(self.slots).unwrap_or(i64::MAX));
        m.share_slots_in_use
            .set(i64::try_from(self.in_use).unwrap_or(i64::MAX));
        m.share_seconds_left
            .set(self.left.map_or(0.0, |l| l.as_secs_f64()));
        m.replica_sync_age.set(self.sync_age.as_secs_f64());
    }
}

/// The leader's share desk found shares adding up to more than a proxy's
/// capacity: the allocator's rule was broken (never expected).
pub struct SharesOverCapacity<'a> {
    /// Proxies over their capacity.
    pub proxies: usize,
    /// Which, and by how much: logged, not a label.
    pub detail: &'a dyn std::fmt::Debug,
}

impl SharesOverCapacity<'_> {
    pub fn emit(self) {
        tracing::error!(over = ?self.detail, "capacity shares add up to more than a proxy's capacity");
        metrics().share_conflicts.inc_by(self.proxies as u64);
    }
}

/// The shared probe plan changed what this replica probes.
pub struct ProbesAssigned {
    pub count: usize,
}

impl ProbesAssigned {
    pub fn emit(self) {
        metrics()
            .probes_assigned
            .set(i64::try_from(self.count).unwrap_or(i64::MAX));
    }
}

/// The leader's share desk counted its members (every retry period).
pub struct ShareMembersCounted {
    pub live: usize,
    /// Dead, their shares counted until their journals are adopted.
    pub dead: usize,
}

impl ShareMembersCounted {
    pub fn emit(self) {
        let m = metrics();
        for (state, count) in [("live", self.live), ("dead", self.dead)] {
            m.share_members
                .get_or_create(&StateLabel {
                    state: state.to_owned(),
                })
                .set(i64::try_from(count).unwrap_or(i64::MAX));
        }
    }
}

/// A lease checkpoint shard was changed by someone else since the leader
/// wrote it; the leader read it again and wrote its leases over it.
pub struct CheckpointConflict<'a> {
    /// The ConfigMap (`egress-proxies-leases-07`): logged, not a label.
    pub shard: &'a str,
    /// `other_replica`, `other_client`, `deleted` or `unknown`: the label.
    pub reason: &'static str,
    /// Who it was (a replica's identity, a field manager): logged, not a label.
    pub writer: &'a str,
    /// Whether the shard's leases differed from what the leader last wrote.
    pub leases_changed: bool,
}

impl CheckpointConflict<'_> {
    pub fn emit(self) {
        tracing::warn!(
            checkpoint = self.shard,
            reason = self.reason,
            writer = self.writer,
            leasesChanged = self.leases_changed,
            "lease checkpoint changed by another writer; writing this leader's leases over it"
        );
        metrics()
            .lease_checkpoint_conflicts
            .get_or_create(&ReasonLabel {
                reason: self.reason.to_owned(),
            })
            .inc();
    }
}

/// A supervised actor is being restarted by its supervisor.
pub struct ActorRestarted<'a> {
    /// Actor kind: `proxy`, `kvm_host`, ...
    pub actor: &'a str,
    /// Which one (a proxy key, a host name): logged, not a label.
    pub id: &'a str,
    /// Why: `stopped` (it stopped itself to start afresh) or `panicked: …`.
    pub cause: &'a str,
}

impl ActorRestarted<'_> {
    pub fn emit(self) {
        tracing::warn!(
            actor = self.actor,
            id = self.id,
            cause = self.cause,
            "actor restarting"
        );
        metrics()
            .actor_restarts
            .get_or_create(&ActorLabel {
                actor: self.actor.to_owned(),
            })
            .inc();
    }
}

/// A KVM host link came up or went down.
pub struct KvmHostLinkChanged<'a> {
    pub host: &'a str,
    pub connected: bool,
    /// Why it went down.
    pub reason: Option<&'a str>,
}

impl KvmHostLinkChanged<'_> {
    pub fn emit(self) {
        if self.connected {
            tracing::debug!(host = self.host, "KVM host connected");
        } else {
            tracing::warn!(
                host = self.host,
                reason = self.reason.unwrap_or(""),
                "KVM host link dropped"
            );
        }
        metrics()
            .kvm_host_connected
            .get_or_create(&HostLabel {
                host: self.host.to_owned(),
            })
            .set(i64::from(self.connected));
    }
}

/// A libvirt call returned (the call's own debug line is written by the session).
pub struct LibvirtCallCompleted {
    pub rpc: &'static str,
    pub duration: Duration,
}

impl LibvirtCallCompleted {
    pub fn emit(self) {
        metrics()
            .libvirt_call_duration
            .get_or_create(&RpcLabel {
                rpc: self.rpc.to_owned(),
            })
            .observe(self.duration.as_secs_f64());
    }
}

/// An image download into a KVM pool ended.
pub struct ImageDownloadCompleted<'a> {
    pub host: &'a str,
    pub url: &'a str,
    /// `ok` or the error class.
    pub result: &'a str,
    pub bytes: u64,
}

impl ImageDownloadCompleted<'_> {
    pub fn emit(self) {
        if self.result == "ok" {
            tracing::debug!(
                host = self.host,
                url = self.url,
                bytes = self.bytes,
                "image download recorded"
            );
        } else {
            tracing::warn!(
                host = self.host,
                url = self.url,
                result = self.result,
                "image download failed"
            );
        }
        let m = metrics();
        m.image_downloads
            .get_or_create(&ResultLabel {
                result: self.result.to_owned(),
            })
            .inc();
        m.image_download_bytes.inc_by(self.bytes);
    }
}

fn pool_label(pool: &str) -> PoolLabel {
    PoolLabel {
        pool: pool.to_owned(),
    }
}

/// A pool made a new member.
pub struct PoolMemberCreated<'a> {
    /// The pool, `namespace/name`.
    pub pool: &'a str,
    /// The member, `namespace/name` (logged, not a label).
    pub member: &'a str,
}

impl PoolMemberCreated<'_> {
    pub fn emit(self) {
        tracing::info!(pool = self.pool, proxy = self.member, "pool member created");
        metrics()
            .pool_member_creations
            .get_or_create(&pool_label(self.pool))
            .inc();
    }
}

/// A pool member started retiring: it takes no new leases and is deleted
/// once drained.
pub struct PoolMemberRetiring<'a> {
    pub pool: &'a str,
    pub member: &'a str,
    /// Why, a `pool::RetireReason` label value.
    pub reason: &'static str,
}

impl PoolMemberRetiring<'_> {
    pub fn emit(self) {
        tracing::info!(
            pool = self.pool,
            proxy = self.member,
            reason = self.reason,
            "pool member retiring"
        );
        metrics()
            .pool_member_retirements
            .get_or_create(&PoolReasonLabels {
                pool: self.pool.to_owned(),
                reason: self.reason.to_owned(),
            })
            .inc();
    }
}

/// A retired pool member was deleted (drained, or its drain timed out).
pub struct PoolMemberDeleted<'a> {
    pub pool: &'a str,
    pub member: &'a str,
}

impl PoolMemberDeleted<'_> {
    pub fn emit(self) {
        tracing::info!(pool = self.pool, proxy = self.member, "pool member deleted");
        metrics()
            .pool_member_deletions
            .get_or_create(&pool_label(self.pool))
            .inc();
    }
}

/// A pool's turn ended: with the status it wrote (or found unchanged), or
/// early (`None`: the pool vanished, its spec is invalid, a store call
/// failed). `denied` acquires naming the pool were refused for lack of
/// capacity since its previous turn.
pub struct PoolTurnCompleted<'a> {
    pub pool: &'a str,
    pub status: Option<PoolFigures>,
    pub denied: u32,
}

/// The member counts a pool's status reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolFigures {
    pub desired: u32,
    pub replicas: u32,
    pub ready: u32,
    pub leased: u32,
    pub rotating: u32,
}

impl PoolTurnCompleted<'_> {
    pub fn emit(self) {
        let m = metrics();
        let label = pool_label(self.pool);
        if self.denied > 0 {
            tracing::debug!(
                pool = self.pool,
                denied = self.denied,
                "acquires for the pool refused for lack of capacity"
            );
        }
        // Made at 0 on the first turn, so a rate has a start.
        m.pool_leases_denied
            .get_or_create(&label)
            .inc_by(u64::from(self.denied));
        let Some(s) = self.status else {
            return;
        };
        let desired = s.desired;
        // Every second per pool: trace level, as probes.
        tracing::trace!(
            pool = self.pool,
            desired,
            replicas = s.replicas,
            ready = s.ready,
            leased = s.leased,
            rotating = s.rotating,
            "pool turn"
        );
        m.pool_desired_members
            .get_or_create(&label)
            .set(i64::from(desired));
        m.pool_members.get_or_create(&label).set(i64::from(s.replicas));
        m.pool_ready_members.get_or_create(&label).set(i64::from(s.ready));
        m.pool_rotating_members
            .get_or_create(&label)
            .set(i64::from(s.rotating));
        m.pool_leases_active
            .get_or_create(&label)
            .set(i64::from(s.leased));
    }
}

/// A pool is gone: its series go with it, so deleted pools do not pile up
/// in every scrape.
pub struct PoolRemoved<'a> {
    pub pool: &'a str,
    /// Every retirement reason its series may carry (`pool::RetireReason`'s labels).
    pub retire_reasons: &'a [&'static str],
}

impl PoolRemoved<'_> {
    pub fn emit(self) {
        tracing::debug!(pool = self.pool, "pool gone; its metrics removed");
        let m = metrics();
        let label = pool_label(self.pool);
        for family in [
            &m.pool_member_creations,
            &m.pool_member_deletions,
            &m.pool_leases_denied,
        ] {
            family.remove(&label);
        }
        for family in [
            &m.pool_desired_members,
            &m.pool_members,
            &m.pool_ready_members,
            &m.pool_rotating_members,
            &m.pool_leases_active,
        ] {
            family.remove(&label);
        }
        for reason in self.retire_reasons {
            m.pool_member_retirements.remove(&PoolReasonLabels {
                pool: self.pool.to_owned(),
                reason: (*reason).to_owned(),
            });
        }
    }
}

/// The gateway's `kind` label.
fn kind(tunnel: bool) -> &'static str {
    if tunnel { "tunnel" } else { "http" }
}

/// The target of the gateway's access lines (`RUST_LOG=egress_proxies::gateway::access=off` hides them).
pub const GATEWAY_ACCESS_TARGET: &str = "egress_proxies::gateway::access";

/// A gateway request or tunnel began (its client connection sent a request head).
pub struct GatewayExchangeStarted {
    pub tunnel: bool,
}

impl GatewayExchangeStarted {
    pub fn emit(self) {
        metrics()
            .gateway_requests_open
            .get_or_create(&GatewayKindLabel {
                kind: kind(self.tunnel),
            })
            .inc();
        gateway_stats().note_started(self.tunnel);
    }
}

/// A gateway request or tunnel ended (its response body or tunnel is
/// done, or the gateway answered it itself): the access line and its metrics.
pub struct GatewayExchangeEnded {
    pub peer: SocketAddr,
    /// The username's client name, if any.
    pub client: Option<String>,
    pub tunnel: bool,
    /// The lease target (empty when refused before it was known).
    pub target: String,
    /// The proxy that served it (the last one tried).
    pub proxy: Option<String>,
    pub tries: u32,
    pub failed_over: u32,
    pub blocked: u32,
    pub session_moved: bool,
    pub status: u16,
    /// `served`, `blocked`, `client_gone` or the refusal reason.
    pub outcome: &'static str,
    pub bytes_up: u64,
    pub bytes_down: u64,
    pub duration: Duration,
}

impl GatewayExchangeEnded {
    pub fn emit(self) {
        let kind = kind(self.tunnel);
        // Never a credential: the client name is the username's `client` parameter.
        tracing::info!(
            target: GATEWAY_ACCESS_TARGET,
            peer = %self.peer,
            client = self.client.as_deref().unwrap_or("-"),
            kind,
            target = %self.target,
            proxy = self.proxy.as_deref().unwrap_or("-"),
            tries = self.tries,
            failed_over = self.failed_over,
            blocked = self.blocked,
            session_moved = self.session_moved,
            status = self.status,
            outcome = self.outcome,
            bytes_up = self.bytes_up,
            bytes_down = self.bytes_down,
            duration_ms = self.duration.as_millis() as u64,
            "gateway exchange"
        );
        let m = metrics();
        let by_kind = GatewayKindLabel { kind };
        m.gateway_requests
            .get_or_create(&GatewayOutcomeLabels {
                kind,
                outcome: self.outcome,
            })
            .inc();
        m.gateway_requests_open.get_or_create(&by_kind).dec();
        m.gateway_request_duration
            .get_or_create(&by_kind)
            .observe(self.duration.as_secs_f64());
        for (direction, bytes) in [("up", self.bytes_up), ("down", self.bytes_down)] {
            m.gateway_transferred_bytes
                .get_or_create(&GatewayBytesLabels { kind, direction })
                .inc_by(bytes);
        }
        if self.session_moved {
            m.gateway_session_moves.inc();
        }
        history().note_gateway_request();
        let served = matches!(self.outcome, "served" | "blocked");
        let at = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        gateway_stats().note_ended(
            RecentExchange {
                at,
                kind,
                client: self.client,
                target: self.target,
                proxy: self.proxy,
                tries: self.tries,
                status: self.status,
                outcome: self.outcome,
                duration_ms: self.duration.as_millis() as u64,
            },
            served,
            (self.bytes_up, self.bytes_down),
        );
    }
}

/// The gateway took a lease for one try of a request or tunnel.
pub struct GatewayLeaseTaken<'a> {
    /// The exchange's span (none unless `traceExchanges`): the try is a child span.
    pub span: &'a tracing::Span,
    pub tunnel: bool,
    pub proxy: &'a str,
    /// Which try (1: the first).
    pub attempt: u32,
    /// Time spent waiting for a free proxy.
    pub waited: Duration,
    /// Sticky sessions remembered, when this try belonged to one.
    pub sessions: Option<usize>,
}

impl GatewayLeaseTaken<'_> {
    pub fn emit(self) {
        tracing::trace!(proxy = self.proxy, attempt = self.attempt, "gateway lease");
        if !self.span.is_disabled() {
            // A child span per try: the trace shows which proxies were tried.
            let _try = tracing::info_span!(
                parent: self.span, "gateway try", proxy = self.proxy, attempt = self.attempt,
                waited_ms = self.waited.as_secs_f64() * 1000.0,
            );
        }
        let m = metrics();
        let by_kind = GatewayKindLabel {
            kind: kind(self.tunnel),
        };
        m.gateway_tries.get_or_create(&by_kind).inc();
        let retry = self.attempt > 1;
        if retry {
            m.gateway_retries.get_or_create(&by_kind).inc();
            history().note_gateway_retry();
        }
        if let Some(n) = self.sessions {
            m.gateway_sessions.set(n as i64);
        }
        gateway_stats().note_try(retry, self.sessions);
    }
}

/// Reasons of [`GatewayTryFailed`] (the label's values).
pub const GATEWAY_FAILURE_REASONS: [&str; 2] = ["upstream_failed", "upstream_timeout"];
/// Scopes of [`GatewayTryFailed`]: whom the judge blamed.
pub const GATEWAY_FAILURE_SCOPES: [&str; 2] = ["proxy", "site"];

/// A gateway try failed, judged the proxy's fault (`proxy`: it was not
/// reached, broke, or refused its own credentials) or the site's through
/// this proxy (`site`: the proxy could not reach it, no answer in time).
pub struct GatewayTryFailed<'a> {
    pub proxy: &'a str,
    /// `proxy` or `site`.
    pub blame: &'static str,
    /// `upstream_failed` or `upstream_timeout` (anything else counts as `upstream_failed`).
    pub reason: &'static str,
    /// Reported `error` on its lease: the proxy rests for every target.
    pub rested_everywhere: bool,
    pub error: &'a dyn std::fmt::Display,
}

impl GatewayTryFailed<'_> {
    pub fn emit(self) {
        // In the exchange's span (when traced): an event of its trace.
        tracing::info!(
            proxy = self.proxy,
            blame = self.blame,
            reason = self.reason,
            rested_everywhere = self.rested_everywhere,
            error = %self.error,
            "gateway try failed"
        );
        let reason = GATEWAY_FAILURE_REASONS
            .into_iter()
            .find(|r| *r == self.reason)
            .unwrap_or(GATEWAY_FAILURE_REASONS[0]);
        let scope = GATEWAY_FAILURE_SCOPES
            .into_iter()
            .find(|s| *s == self.blame)
            .unwrap_or(GATEWAY_FAILURE_SCOPES[1]);
        metrics()
            .gateway_upstream_failures
            .get_or_create(&GatewayFailureLabels {
                proxy: proxy_labels().label(self.proxy),
                scope,
                reason,
            })
            .inc();
        history().note_gateway_failure();
        gateway_stats().note_failure();
    }
}

/// The gateway's site learning, as it stands (emitted about once a second
/// while the gateway serves).
pub struct GatewayLearnt {
    pub sites: Vec<super::gateway_stats::SiteSummary>,
    /// Sites remembered in all, and pairs passed over over all of them.
    pub remembered: usize,
    pub avoided: usize,
}

impl GatewayLearnt {
    pub fn emit(self) {
        let m = metrics();
        m.gateway_sites_learnt.set(self.remembered as i64);
        m.gateway_avoided_pairs.set(self.avoided as i64);
        gateway_stats().note_sites(self.sites);
    }
}

/// A gateway request or tunnel was served by the first proxy tried.
pub struct GatewayFirstTryServed;

impl GatewayFirstTryServed {
    pub fn emit(self) {
        metrics().gateway_first_try_served.inc();
        gateway_stats().note_first_try_served();
    }
}

/// A gateway response matched a block rule (reported `blocked` on its lease).
pub struct GatewayBlocked<'a> {
    pub target: &'a str,
    pub proxy: &'a str,
    pub status: u16,
}

impl GatewayBlocked<'_> {
    pub fn emit(self) {
        tracing::info!(
            target = self.target,
            proxy = self.proxy,
            status = self.status,
            "gateway response matched a block rule; reported on the proxy's lease"
        );
        metrics()
            .gateway_blocks
            .get_or_create(&GatewayProxyLabel {
                proxy: proxy_labels().label(self.proxy),
            })
            .inc();
        history().note_gateway_block();
        gateway_stats().note_block();
    }
}

/// A proxy listener answered a connection that had not authenticated and
/// closed it (docs/security.md, "Hostile clients").
pub struct ConnectionRefused {
    pub listener: &'static str,
    pub reason: &'static str,
    pub status: u16,
    pub peer: SocketAddr,
    /// `Some(n)`: the first refusal of a burst (or a long burst's minutely
    /// summary), to be logged, `n` refusals having gone unlogged since the
    /// last line; `None`: only counted.
    pub log: Option<u64>,
    /// Bytes of the head budget left.
    pub budget_left: usize,
    /// The listener's head budget and connections-per-source cap, in bytes and connections.
    pub head_budget: usize,
    pub connections_per_source: usize,
}

impl ConnectionRefused {
    pub fn emit(self) {
        if let Some(unlogged) = self.log {
            let what = match self.reason {
                "too_many_unauthenticated" => {
                    "a source holds the most connections it may before authenticating; refusing more"
                }
                "head_budget_exhausted" => {
                    "the head budget for unauthenticated connections is spent; refusing their unfinished heads"
                }
                _ => "an unauthenticated connection's request head is too large; refusing it",
            };
            tracing::warn!(
                listener = self.listener,
                reason = self.reason,
                status = self.status,
                peer = %self.peer,
                moreSinceLastReport = unlogged,
                headBudgetLeft = self.budget_left,
                headBudget = self.head_budget,
                connectionsPerSource = self.connections_per_source,
                "{what}"
            );
        }
        metrics()
            .listener_refusals
            .get_or_create(&ListenerRefusalLabels {
                listener: self.listener,
                reason: self.reason,
            })
            .inc();
    }
}

/// A proxy is gone: its gateway series go with it and free their label.
fn forget_gateway_series(proxy: &str) {
    if !proxy_labels().forget(proxy) {
        return;
    }
    let m = metrics();
    for scope in GATEWAY_FAILURE_SCOPES {
        for reason in GATEWAY_FAILURE_REASONS {
            m.gateway_upstream_failures.remove(&GatewayFailureLabels {
                proxy: proxy.to_owned(),
                scope,
                reason,
            });
        }
    }
    m.gateway_blocks.remove(&GatewayProxyLabel {
        proxy: proxy.to_owned(),
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The series of `pool` in a scrape, without the `# HELP`/`# TYPE` lines.
    fn series(pool: &str) -> Vec<String> {
        let needle = format!("pool=\"{pool}\"");
        metrics()
            .encode()
            .lines()
            .filter(|l| l.contains(&needle))
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn a_pool_s_events_record_its_series_and_its_removal_drops_them() {
        // The registry is the process's: a pool name no other test uses.
        let pool = "events-test/eu";
        PoolMemberCreated {
            pool,
            member: "events-test/eu-bcdfg",
        }
        .emit();
        PoolMemberRetiring {
            pool,
            member: "events-test/eu-bcdfg",
            reason: "blocked",
        }
        .emit();
        PoolMemberRetiring {
            pool,
            member: "events-test/eu-hjklm",
            reason: "scale-down",
        }
        .emit();
        PoolMemberDeleted {
            pool,
            member: "events-test/eu-bcdfg",
        }
        .emit();
        let status = PoolFigures {
            replicas: 3,
            ready: 2,
            leased: 5,
            rotating: 1,
            desired: 2,
        };
        for (status, denied) in [(Some(status), 2), (None, 1)] {
            PoolTurnCompleted { pool, status, denied }.emit();
        }
        let got = series(pool);
        for line in [
            "egress_proxies_pool_member_creations_total{pool=\"events-test/eu\"} 1",
            "egress_proxies_pool_member_retirements_total{pool=\"events-test/eu\",reason=\"blocked\"} 1",
            "egress_proxies_pool_member_retirements_total{pool=\"events-test/eu\",reason=\"scale-down\"} 1",
            "egress_proxies_pool_member_deletions_total{pool=\"events-test/eu\"} 1",
            "egress_proxies_pool_leases_denied_total{pool=\"events-test/eu\"} 3",
            "egress_proxies_pool_desired_members{pool=\"events-test/eu\"} 2",
            "egress_proxies_pool_members{pool=\"events-test/eu\"} 3",
            "egress_proxies_pool_ready_members{pool=\"events-test/eu\"} 2",
            "egress_proxies_pool_rotating_members{pool=\"events-test/eu\"} 1",
            "egress_proxies_pool_leases_active{pool=\"events-test/eu\"} 5",
        ] {
            assert!(got.iter().any(|l| l == line), "missing {line:?} in {got:#?}");
        }
        assert_eq!(got.len(), 10, "{got:#?}");

        PoolRemoved {
            pool,
            retire_reasons: &["blocked", "scale-down"],
        }
        .emit();
        assert_eq!(series(pool), Vec::<String>::new());
    }

    /// The scrape's lines that contain every one of `needles`.
    fn lines_with(needles: &[&str]) -> Vec<String> {
        metrics()
            .encode()
            .lines()
            .filter(|l| needles.iter().all(|n| l.contains(n)))
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn gateway_events_record_their_series_and_a_gone_proxy_s_go_with_it() {
        // The registry is the process's: a proxy and an outcome no other test uses.
        let proxy = "events-test/gw-1";
        let outcome = "events_test_outcome";
        GatewayExchangeStarted { tunnel: true }.emit();
        let span = tracing::Span::none();
        for attempt in [1, 2] {
            GatewayLeaseTaken {
                span: &span,
                tunnel: true,
                proxy,
                attempt,
                waited: Duration::ZERO,
                sessions: Some(3),
            }
            .emit();
        }
        let error = "connection refused";
        GatewayTryFailed {
            proxy,
            blame: "proxy",
            reason: "upstream_failed",
            rested_everywhere: true,
            error: &error,
        }
        .emit();
        GatewayBlocked {
            target: "shop.example",
            proxy,
            status: 403,
        }
        .emit();
        GatewayExchangeEnded {
            peer: "127.0.0.1:5000".parse().unwrap(),
            client: Some("crawler-a".into()),
            tunnel: true,
            target: "shop.example".into(),
            proxy: Some(proxy.into()),
            tries: 2,
            failed_over: 1,
            blocked: 1,
            session_moved: true,
            status: 200,
            outcome,
            bytes_up: 120,
            bytes_down: 4096,
            duration: Duration::from_millis(1500),
        }
        .emit();
        assert_eq!(
            lines_with(&["egress_proxies_gateway_requests_total{", outcome]),
            [format!(
                "egress_proxies_gateway_requests_total{{kind=\"tunnel\",outcome=\"{outcome}\"}} 1"
            )]
        );
        assert_eq!(
            lines_with(&["gateway_upstream_failures_total{", proxy]),
            [format!(
                "egress_proxies_gateway_upstream_failures_total{{proxy=\"{proxy}\",scope=\"proxy\",reason=\"upstream_failed\"}} 1"
            )]
        );
        assert_eq!(
            lines_with(&["gateway_blocks_total{", proxy]),
            [format!(
                "egress_proxies_gateway_blocks_total{{proxy=\"{proxy}\"}} 1"
            )]
        );
        // Shared by every test's tunnels: at least this one's.
        let value = |needle: &str| -> f64 {
            lines_with(&[needle])
                .first()
                .and_then(|l| l.rsplit(' ').next()?.parse().ok())
                .unwrap_or_else(|| panic!("no {needle}"))
        };
        assert!(value("egress_proxies_gateway_tries_total{kind=\"tunnel\"}") >= 2.0);
        assert!(value("egress_proxies_gateway_retries_total{kind=\"tunnel\"}") >= 1.0);
        assert!(
            value("egress_proxies_gateway_transferred_bytes_total{kind=\"tunnel\",direction=\"down\"}")
                >= 4096.0
        );
        assert!(value("egress_proxies_gateway_request_duration_seconds_count{kind=\"tunnel\"}") >= 1.0);
        assert!(
            value("egress_proxies_gateway_request_duration_seconds_bucket{le=\"1.024\",kind=\"tunnel\"}")
                >= 0.0
        );
        assert!(value("egress_proxies_gateway_session_moves_total") >= 1.0);
        assert!(value("egress_proxies_gateway_requests_open{kind=\"tunnel\"}") >= 0.0);
        let recent = gateway_stats().summary().recent;
        assert!(
            recent
                .iter()
                .any(|e| e.outcome == outcome && e.client.as_deref() == Some("crawler-a")),
            "{recent:?}"
        );

        ProxyPhaseChanged {
            proxy,
            from: Some("Ready"),
            to: None,
        }
        .emit();
        assert_eq!(
            lines_with(&[proxy]),
            Vec::<String>::new(),
            "the gone proxy's series are removed"
        );
    }
}
