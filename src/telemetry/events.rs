//! Internal events, in the style of Vector's instrumentation spec: one
//! struct per notable happening whose `emit` writes the log line and
//! records the metrics, so every metric has its log and label values stay
//! bounded.

use std::time::Duration;

use super::metrics::{
    ActorLabel, HostLabel, PhaseLabel, ProviderCallLabels, ProviderOpLabels, ProviderReasonLabels,
    ReasonLabel, ReplacementLabels, ResultLabel, RpcLabel, metrics,
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
    pub loss: crate::reconcile::Loss,
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
        replaced(self.provider, self.loss.as_str());
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
            }
            LeaseEvent::Denied { reason } => {
                tracing::debug!(reason, "lease denied");
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
