//! The operator's Prometheus metrics: one registry for the process, served
//! in the OpenMetrics text format on `--metrics-bind-address`. Names follow
//! Prometheus conventions (`egress_proxies_` prefix, `_total` counters, base
//! units — seconds, bytes) and every label has a bounded set of values: no
//! proxy names or UIDs, only providers, hosts, pools, operations, phases,
//! classes and reasons. A pool (`namespace/name`) is declared by a person,
//! like a provider or a KVM host, and its series are removed when the pool
//! goes; its members are never labels. The one exception, the gateway's
//! per-proxy failures and blocks, names at most [`MAX_PROXY_LABELS`]
//! proxies (the rest are `other`) and drops a proxy's series when the
//! proxy goes ([`super::label_budget`]). Metrics are recorded through the events in
//! [`super::events`], which also write the matching log line.

use std::sync::LazyLock;
use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProviderCallLabels {
    pub provider: String,
    pub kind: String,
    pub op: String,
    /// `ok` or the error class (`not_found`, `transient`, `quota_exceeded`, `permanent`).
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProviderOpLabels {
    pub provider: String,
    pub op: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReplacementLabels {
    pub provider: String,
    /// `stopped`, `vanished` or `spec_changed`.
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProviderReasonLabels {
    pub provider: String,
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabel {
    pub state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HandshakeLabel {
    /// `full` or `resumed`.
    pub kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabel {
    pub phase: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ActorLabel {
    pub actor: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HostLabel {
    pub host: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RpcLabel {
    pub rpc: String,
}

/// What `build_info` says: the running version.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BuildInfo {
    pub version: String,
    /// The git commit the binary was built from.
    pub commit: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolLabel {
    /// `namespace/name` of a ProxyPool.
    pub pool: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolReasonLabels {
    pub pool: String,
    /// A pool retirement reason (the domain's `pool::RetireReason`): `blocked`, `errors`, `template`, `age`, `scale-down`.
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GatewayKindLabel {
    /// `http` (a plain-HTTP request) or `tunnel` (a `CONNECT`).
    pub kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GatewayOutcomeLabels {
    pub kind: &'static str,
    /// `served`, `blocked`, `client_gone` or the gateway's refusal reason.
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GatewayBytesLabels {
    pub kind: &'static str,
    /// `up` (crawler to site) or `down` (site to crawler).
    pub direction: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GatewayFailureLabels {
    /// The proxy (`namespace/name`), or `other` past [`MAX_PROXY_LABELS`].
    pub proxy: String,
    /// Whom the judge blamed: `proxy` (the proxy itself failed) or `site`
    /// (the site failed through this proxy).
    pub scope: &'static str,
    /// `upstream_failed` or `upstream_timeout`.
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ListenerRefusalLabels {
    /// `gateway` or `forward-proxy`.
    pub listener: &'static str,
    /// `too_many_unauthenticated`, `head_budget_exhausted` or `head_too_large`.
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GatewayProxyLabel {
    pub proxy: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KubeApiLabels {
    /// `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`, `deletecollection`, `other`.
    pub verb: &'static str,
    /// The plural resource name, with a subresource (`proxies/status`);
    /// `discovery` or `other` (the Kubernetes client's `ApiRequest`).
    pub resource: String,
    /// The HTTP status, or `error` when no answer came.
    pub code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KubeWaitLabel {
    /// `budget`, `retry_after` or `backoff` (the Kubernetes client's `WaitSource`).
    pub reason: &'static str,
}

/// Proxies the gateway's per-proxy metrics name at once; the rest are `other`.
pub const MAX_PROXY_LABELS: usize = 100;

type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

/// Latencies from 1 ms to ~65 s.
fn latency() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 17))
}

/// Every metric the operator exports.
pub struct Metrics {
    registry: Registry,
    /// Always 1, labelled with the version (set once at start).
    pub build_info: Family<BuildInfo, Gauge>,
    pub provider_calls: Family<ProviderCallLabels, Counter>,
    pub provider_call_duration: Histograms<ProviderOpLabels>,
    pub reconciles: Family<ResultLabel, Counter>,
    pub reconcile_duration: Histogram,
    pub instance_replacements: Family<ReplacementLabels, Counter>,
    pub proxies: Family<PhaseLabel, Gauge>,
    pub probes: Family<ResultLabel, Counter>,
    pub probe_duration: Histogram,
    pub probe_tls_handshakes: Family<HandshakeLabel, Counter>,
    pub leases_active: Gauge,
    pub leases_granted: Counter,
    pub leases_denied: Family<ReasonLabel, Counter>,
    pub leases_expired: Counter,
    pub lease_checkpoint_conflicts: Family<ReasonLabel, Counter>,
    pub actor_restarts: Family<ActorLabel, Counter>,
    pub kvm_host_connected: Family<HostLabel, Gauge>,
    pub libvirt_call_duration: Histograms<RpcLabel>,
    pub image_downloads: Family<ResultLabel, Counter>,
    pub image_download_bytes: Counter,
    pub gc_instances_left_alone: Family<ProviderReasonLabels, Gauge>,
    pub gc_sweeps: Family<ResultLabel, Counter>,
    pub gc_instances_deleted: Counter,
    pub gc_delete_failures: Counter,
    pub leader: Gauge,
    pub replicas: Family<StateLabel, Gauge>,
    pub lease_forwards: Family<ResultLabel, Counter>,
    pub share_slots: Gauge,
    pub share_slots_in_use: Gauge,
    pub share_seconds_left: Gauge<f64, AtomicU64>,
    pub replica_sync_age: Gauge<f64, AtomicU64>,
    pub share_conflicts: Counter,
    pub probes_assigned: Gauge,
    pub share_members: Family<StateLabel, Gauge>,
    pub pool_member_creations: Family<PoolLabel, Counter>,
    pub pool_member_retirements: Family<PoolReasonLabels, Counter>,
    pub pool_member_deletions: Family<PoolLabel, Counter>,
    pub pool_leases_denied: Family<PoolLabel, Counter>,
    pub pool_desired_members: Family<PoolLabel, Gauge>,
    pub pool_members: Family<PoolLabel, Gauge>,
    pub pool_ready_members: Family<PoolLabel, Gauge>,
    pub pool_rotating_members: Family<PoolLabel, Gauge>,
    pub pool_leases_active: Family<PoolLabel, Gauge>,
    pub gateway_requests: Family<GatewayOutcomeLabels, Counter>,
    pub gateway_requests_open: Family<GatewayKindLabel, Gauge>,
    pub gateway_request_duration: Histograms<GatewayKindLabel>,
    pub gateway_transferred_bytes: Family<GatewayBytesLabels, Counter>,
    pub gateway_tries: Family<GatewayKindLabel, Counter>,
    pub gateway_retries: Family<GatewayKindLabel, Counter>,
    pub gateway_upstream_failures: Family<GatewayFailureLabels, Counter>,
    pub gateway_blocks: Family<GatewayProxyLabel, Counter>,
    pub listener_refusals: Family<ListenerRefusalLabels, Counter>,
    pub gateway_sessions: Gauge,
    pub gateway_session_moves: Counter,
    pub gateway_first_try_served: Counter,
    pub gateway_sites_learnt: Gauge,
    pub gateway_avoided_pairs: Gauge,
    pub kube_api_requests: Family<KubeApiLabels, Counter>,
    pub kube_api_wait: Family<KubeWaitLabel, Counter<f64, AtomicU64>>,
}

impl Metrics {
    fn new() -> Self {
        // Ours under the prefix; the standard process metrics beside them.
        let mut root = Registry::default();
        root.register_collector(Box::new(super::process::ProcessCollector));
        let registry = root.sub_registry_with_prefix("egress_proxies");
        let m = Self {
            build_info: Family::default(),
            provider_calls: Family::default(),
            provider_call_duration: Family::new_with_constructor(latency),
            reconciles: Family::default(),
            reconcile_duration: latency(),
            instance_replacements: Family::default(),
            proxies: Family::default(),
            probes: Family::default(),
            probe_duration: latency(),
            probe_tls_handshakes: Family::default(),
            leases_active: Gauge::default(),
            leases_granted: Counter::default(),
            leases_denied: Family::default(),
            leases_expired: Counter::default(),
            lease_checkpoint_conflicts: Family::default(),
            actor_restarts: Family::default(),
            kvm_host_connected: Family::default(),
            libvirt_call_duration: Family::new_with_constructor(latency),
            image_downloads: Family::default(),
            image_download_bytes: Counter::default(),
            gc_instances_left_alone: Family::default(),
            gc_sweeps: Family::default(),
            gc_instances_deleted: Counter::default(),
            gc_delete_failures: Counter::default(),
            leader: Gauge::default(),
            replicas: Family::default(),
            lease_forwards: Family::default(),
            share_slots: Gauge::default(),
            share_slots_in_use: Gauge::default(),
            share_seconds_left: Gauge::default(),
            replica_sync_age: Gauge::default(),
            share_conflicts: Counter::default(),
            probes_assigned: Gauge::default(),
            share_members: Family::default(),
            pool_member_creations: Family::default(),
            pool_member_retirements: Family::default(),
            pool_member_deletions: Family::default(),
            pool_leases_denied: Family::default(),
            pool_desired_members: Family::default(),
            pool_members: Family::default(),
            pool_ready_members: Family::default(),
            pool_rotating_members: Family::default(),
            pool_leases_active: Family::default(),
            gateway_requests: Family::default(),
            gateway_requests_open: Family::default(),
            gateway_request_duration: Family::new_with_constructor(latency),
            gateway_transferred_bytes: Family::default(),
            gateway_tries: Family::default(),
            gateway_retries: Family::default(),
            gateway_upstream_failures: Family::default(),
            gateway_blocks: Family::default(),
            listener_refusals: Family::default(),
            gateway_sessions: Gauge::default(),
            gateway_session_moves: Counter::default(),
            gateway_first_try_served: Counter::default(),
            gateway_sites_learnt: Gauge::default(),
            gateway_avoided_pairs: Gauge::default(),
            kube_api_requests: Family::default(),
            kube_api_wait: Family::default(),
            registry: Registry::default(),
        };
        registry.register(
            "provider_calls",
            "Provider calls by provider, operation and result (ok or the error class)",
            m.provider_calls.clone(),
        );
        registry.register_with_unit(
            "provider_call_duration",
            "Duration of provider calls",
            Unit::Seconds,
            m.provider_call_duration.clone(),
        );
        registry.register(
            "reconciles",
            "Reconciles of Proxies by result (ok or the error kind/class)",
            m.reconciles.clone(),
        );
        registry.register_with_unit(
            "reconcile_duration",
            "Duration of reconciles",
            Unit::Seconds,
            m.reconcile_duration.clone(),
        );
        registry.register(
            "instance_replacements",
            "Managed instances replaced, by provider and reason (stopped, vanished, spec_changed)",
            m.instance_replacements.clone(),
        );
        registry.register("proxies", "Proxies by phase", m.proxies.clone());
        registry.register(
            "health_probes",
            "Health probes by result (ok or the failure reason)",
            m.probes.clone(),
        );
        registry.register_with_unit(
            "health_probe_duration",
            "Duration of health probes",
            Unit::Seconds,
            m.probe_duration.clone(),
        );
        registry.register(
            "health_probe_tls_handshakes",
            "TLS handshakes of https probes with their targets, full or resumed from an earlier session",
            m.probe_tls_handshakes.clone(),
        );
        registry.register("leases_active", "Leases currently held", m.leases_active.clone());
        registry.register("leases_granted", "Leases granted", m.leases_granted.clone());
        registry.register(
            "leases_denied",
            "Lease requests denied, by reason",
            m.leases_denied.clone(),
        );
        registry.register(
            "leases_expired",
            "Leases that reached their TTL unreleased",
            m.leases_expired.clone(),
        );
        registry.register(
            "lease_checkpoint_conflicts",
            "Lease checkpoint writes that met another writer's change, by who it was (other_replica, other_client, deleted, unknown)",
            m.lease_checkpoint_conflicts.clone(),
        );
        registry.register(
            "actor_restarts",
            "Supervised actor restarts by actor kind",
            m.actor_restarts.clone(),
        );
        registry.register(
            "kvm_host_connected",
            "1 while the SSH link and libvirt connection to a KVM host are up",
            m.kvm_host_connected.clone(),
        );
        registry.register_with_unit(
            "libvirt_call_duration",
            "Duration of libvirt calls by API name",
            Unit::Seconds,
            m.libvirt_call_duration.clone(),
        );
        registry.register(
            "image_downloads",
            "KVM base image downloads by result",
            m.image_downloads.clone(),
        );
        registry.register_with_unit(
            "image_download",
            "Bytes of KVM base images downloaded into pools",
            Unit::Bytes,
            m.image_download_bytes.clone(),
        );
        registry.register(
            "gc_instances_left_alone",
            "Instances the latest orphan-GC sweep listed but may not reap, by provider and reason \
             (untagged, other_installation, out_of_scope, released)",
            m.gc_instances_left_alone.clone(),
        );
        registry.register(
            "gc_sweeps",
            "Orphan-GC sweeps by result (ok; incomplete: a provider could not be listed or a delete \
             failed; failed: the live Proxies could not be read)",
            m.gc_sweeps.clone(),
        );
        registry.register(
            "gc_instances_deleted",
            "Orphaned instances the GC deleted",
            m.gc_instances_deleted.clone(),
        );
        registry.register(
            "gc_delete_failures",
            "Orphaned instances or leftovers the GC failed to delete (tried again next sweep)",
            m.gc_delete_failures.clone(),
        );
        registry.register(
            "leader",
            "1 while this replica acts (holds the leader Lease, or runs without election or standalone)",
            m.leader.clone(),
        );
        registry.register(
            "replicas",
            "Member replicas this replica's latest look at the member Leases found, by state (live; quiet, those of the live whose Lease stayed unchanged for half the lease duration; dead)",
            m.replicas.clone(),
        );
        registry.register(
            "lease_forwards",
            "Lease calls forwarded to the replica holding the lease, by result \
             (ok, refused, timeout, unreachable)",
            m.lease_forwards.clone(),
        );
        registry.register(
            "share_slots",
            "Every replica serving: lease slots this replica's capacity share holds, over all proxies",
            m.share_slots.clone(),
        );
        registry.register(
            "share_slots_in_use",
            "Every replica serving: of those, slots its leases and gateway tries use now",
            m.share_slots_in_use.clone(),
        );
        registry.register(
            "share_seconds_left",
            "Every replica serving: seconds this replica's share stays valid without another answer \
             from the leader (0: no valid share, it grants nothing)",
            m.share_seconds_left.clone(),
        );
        registry.register_with_unit(
            "replica_sync_age",
            "Every replica serving: time since the leader last answered this replica's link \
             (since the link started, when it never answered)",
            Unit::Seconds,
            m.replica_sync_age.clone(),
        );
        registry.register(
            "share_conflicts",
            "Every replica serving, on the leader: times the share desk found the shares of a proxy \
             adding up to more than its capacity, counted per proxy (must stay 0)",
            m.share_conflicts.clone(),
        );
        registry.register(
            "probes_assigned",
            "Every replica serving: proxies the shared probe plan gives this replica to probe",
            m.probes_assigned.clone(),
        );
        registry.register(
            "share_members",
            "Every replica serving, on the leader: members its share desk counts, by state (live; dead: \
             its shares stay counted until the leader adopts its journal)",
            m.share_members.clone(),
        );
        registry.register(
            "pool_member_creations",
            "Members ProxyPools made, by pool",
            m.pool_member_creations.clone(),
        );
        registry.register(
            "pool_member_retirements",
            "Pool members that started retiring, by pool and reason \
             (blocked, errors, template, age, scale-down)",
            m.pool_member_retirements.clone(),
        );
        registry.register(
            "pool_member_deletions",
            "Retired pool members deleted, by pool",
            m.pool_member_deletions.clone(),
        );
        registry.register(
            "pool_leases_denied",
            "Acquires naming a pool refused for lack of capacity, by pool (counted at the pool's next turn)",
            m.pool_leases_denied.clone(),
        );
        registry.register(
            "pool_desired_members",
            "Members a pool aims for (spec.replicas, or the autoscaler's choice)",
            m.pool_desired_members.clone(),
        );
        registry.register(
            "pool_members",
            "Members a pool has, retiring ones included",
            m.pool_members.clone(),
        );
        registry.register(
            "pool_ready_members",
            "A pool's members that are Ready and not retiring",
            m.pool_ready_members.clone(),
        );
        registry.register(
            "pool_rotating_members",
            "A pool's members being replaced (retiring, or waiting for their successor)",
            m.pool_rotating_members.clone(),
        );
        registry.register(
            "pool_leases_active",
            "Leases held on a pool's members",
            m.pool_leases_active.clone(),
        );
        registry.register(
            "listener_refusals",
            "Connections a proxy listener answered and closed before they authenticated, \
             by listener and reason (too_many_unauthenticated, head_budget_exhausted, head_too_large)",
            m.listener_refusals.clone(),
        );
        registry.register(
            "gateway_requests",
            "Gateway requests (kind http) and tunnels (kind tunnel) ended, by outcome \
             (served, blocked, client_gone, or the gateway's refusal reason)",
            m.gateway_requests.clone(),
        );
        registry.register(
            "gateway_requests_open",
            "Gateway requests and tunnels in progress (a tunnel until it closes), by kind",
            m.gateway_requests_open.clone(),
        );
        registry.register_with_unit(
            "gateway_request_duration",
            "Duration of gateway requests (until the response body ends) and tunnels, by kind",
            Unit::Seconds,
            m.gateway_request_duration.clone(),
        );
        registry.register_with_unit(
            "gateway_transferred",
            "Bytes the gateway moved, by kind and direction (up: crawler to site, down: site to crawler)",
            Unit::Bytes,
            m.gateway_transferred_bytes.clone(),
        );
        registry.register(
            "gateway_tries",
            "Leases the gateway took for requests and tunnels (one per try), by kind",
            m.gateway_tries.clone(),
        );
        registry.register(
            "gateway_retries",
            "Gateway tries after a request's or tunnel's first, on another proxy, by kind",
            m.gateway_retries.clone(),
        );
        registry.register(
            "gateway_upstream_failures",
            "Gateway tries that failed and were reported on the proxy's lease, by proxy (at most 100, \
             then other), scope (proxy, destination) and reason (upstream_failed, upstream_timeout)",
            m.gateway_upstream_failures.clone(),
        );
        registry.register(
            "gateway_blocks",
            "Gateway responses that matched a block rule, by proxy (at most 100, then other)",
            m.gateway_blocks.clone(),
        );
        registry.register(
            "gateway_sessions",
            "Sticky gateway sessions remembered",
            m.gateway_sessions.clone(),
        );
        registry.register(
            "gateway_session_moves",
            "Sticky gateway sessions that moved to another proxy (theirs was no longer leasable)",
            m.gateway_session_moves.clone(),
        );
        registry.register(
            "gateway_first_try_served",
            "Gateway requests and tunnels served by the first proxy tried",
            m.gateway_first_try_served.clone(),
        );
        registry.register(
            "gateway_sites_learnt",
            "Sites the gateway's learning remembers",
            m.gateway_sites_learnt.clone(),
        );
        registry.register(
            "gateway_avoided_pairs",
            "(site, proxy) pairs the gateway passes over now: the proxy fails for the site",
            m.gateway_avoided_pairs.clone(),
        );
        registry.register(
            "kube_api_requests",
            "Requests to the Kubernetes API server, one per try, by verb, resource and code",
            m.kube_api_requests.clone(),
        );
        registry.register_with_unit(
            "kube_api_wait",
            "Time Kubernetes API requests waited before a try, by reason (budget, retry_after, backoff)",
            Unit::Seconds,
            m.kube_api_wait.clone(),
        );
        registry.register(
            "build_info",
            "The operator's version and the commit it was built from (always 1)",
            m.build_info.clone(),
        );
        Self { registry: root, ..m }
    }

    /// The OpenMetrics text of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// The content type of [`Metrics::encode`].
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

static METRICS: LazyLock<Metrics> = LazyLock::new(Metrics::new);

/// The process's metrics.
pub fn metrics() -> &'static Metrics {
    &METRICS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_prometheus_conventions() {
        let m = Metrics::new();
        m.provider_calls
            .get_or_create(&ProviderCallLabels {
                provider: "gcp-eu".into(),
                kind: "gcp".into(),
                op: "create".into(),
                result: "ok".into(),
            })
            .inc();
        m.reconcile_duration.observe(0.02);
        m.image_download_bytes.inc_by(1024);
        let text = m.encode();
        for line in [
            "# TYPE egress_proxies_provider_calls counter",
            "egress_proxies_provider_calls_total{provider=\"gcp-eu\",kind=\"gcp\",op=\"create\",result=\"ok\"} 1",
            "# TYPE egress_proxies_reconcile_duration_seconds histogram",
            "egress_proxies_reconcile_duration_seconds_count 1",
            "egress_proxies_image_download_bytes_total 1024",
            "# EOF",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
        }
    }
}
