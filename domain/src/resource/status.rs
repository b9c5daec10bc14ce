//! `Proxy.status`: what the operator observed. Written through the status
//! subresource, and only when it changed.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use serde::{Deserialize, Serialize};

/// Observed state of a Proxy.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProxyStatus {
    /// Where the proxy is in its life.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<Phase>,
    /// The provider's identifier of the instance.
    #[serde(default, rename = "providerID", skip_serializing_if = "Option::is_none")]
    pub provider_id: Option<String>,
    /// The instance's address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip: Option<String>,
    /// `host:port` clients use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// The source address destinations see, when the provider chose it
    /// (the `local` provider's `outgoingAddresses`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outgoing_address: Option<String>,
    /// Human-readable explanation of the phase (always set for `Failed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready`, `Healthy` and `InstanceReady`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The latest health verdict.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<HealthStatus>,
    /// Instances lost in a row and when the next may be created (the
    /// replacement backoff); cleared once an instance stays up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replacement: Option<ReplacementStatus>,
}

/// Instances that stopped or vanished, replaced with growing delays.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReplacementStatus {
    /// Instances lost in a row, none of which stayed up long enough to reset the count.
    pub count: u32,
    /// Why the last one was lost, in the provider's words.
    pub reason: String,
    /// When the last loss was seen.
    pub lost_at: Time,
    /// The next instance is created no earlier than this.
    pub retry_at: Time,
    /// The lost instance is still being deleted.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub deleting: bool,
}

/// Lifecycle phase of a Proxy.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, schemars::JsonSchema)]
pub enum Phase {
    /// Seen, nothing done yet.
    Pending,
    /// The provider is creating the instance.
    Provisioning,
    /// The instance is up with an address, not yet verified by the health engine.
    Running,
    /// Healthy: probes through the proxy succeed.
    Ready,
    /// Probes through the proxy fail.
    Unhealthy,
    /// A permanent error; no retry until the spec or configuration changes.
    Failed,
    /// Being deleted: the instance is being cleaned up.
    Terminating,
    /// Instances keep stopping: waiting before creating the next one
    /// (delays grow exponentially, like a crash loop's).
    BackOff,
}

impl Phase {
    /// Every phase, in lifecycle order (for metrics and tables).
    pub const ALL: [Phase; 8] = [
        Phase::Pending,
        Phase::Provisioning,
        Phase::Running,
        Phase::Ready,
        Phase::Unhealthy,
        Phase::Failed,
        Phase::Terminating,
        Phase::BackOff,
    ];

    /// The spelling used in manifests, tables and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Pending => "Pending",
            Phase::Provisioning => "Provisioning",
            Phase::Running => "Running",
            Phase::Ready => "Ready",
            Phase::Unhealthy => "Unhealthy",
            Phase::Failed => "Failed",
            Phase::Terminating => "Terminating",
            Phase::BackOff => "BackOff",
        }
    }
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The health engine's verdict on a proxy.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HealthStatus {
    /// Whether the last verdict was healthy.
    pub healthy: bool,
    /// Latency of the probe that produced the verdict, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_ms: Option<u64>,
    /// When `healthy` last flipped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition: Option<Time>,
    /// Failed probes in a row.
    #[serde(default)]
    pub consecutive_failures: u32,
}
