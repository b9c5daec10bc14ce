//! The discovery API's JSON bodies (and their OpenAPI schemas).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// A proxy as listed for clients.
#[derive(Serialize, Deserialize, ToSchema, Debug, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ProxyInfo {
    pub name: String,
    pub namespace: String,
    /// `http://host:port` to configure as the client's proxy (absent until the proxy serves).
    pub url: Option<String>,
    pub attributes: BTreeMap<String, String>,
    /// Lifecycle phase (`Ready` proxies are leased).
    pub phase: String,
    /// Latest health verdict, when known.
    pub healthy: Option<bool>,
    /// Latency of the probe behind the verdict.
    pub latency_ms: Option<u64>,
    pub active_leases: u32,
}

/// Ask for a lease.
#[derive(Serialize, Deserialize, ToSchema, Debug, Clone, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LeaseRequest {
    /// What will be fetched through the proxy (usually the target host).
    pub target: String,
    /// Attributes the proxy must carry, all of them.
    #[serde(default)]
    pub selector: BTreeMap<String, String>,
    /// Requested lifetime; capped by the server's maximum.
    pub ttl_seconds: Option<u64>,
    /// Free-form client name, for logs.
    pub client: Option<String>,
}

/// The proxy of a lease.
#[derive(Serialize, Deserialize, ToSchema, Debug, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct LeasedProxy {
    pub name: String,
    pub namespace: String,
    pub url: String,
    pub attributes: BTreeMap<String, String>,
}

/// A granted lease.
#[derive(Serialize, Deserialize, ToSchema, Debug, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Lease {
    pub id: String,
    pub proxy: LeasedProxy,
    pub target: String,
    /// RFC 3339 time the lease ends unless released earlier.
    pub expires_at: String,
}

/// How using a lease went.
#[derive(Serialize, Deserialize, ToSchema, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum ReportOutcome {
    Ok,
    /// The target blocked the proxy (captcha, 403, ...): it rests longer for that target.
    Blocked,
    /// The proxy failed: it rests for every target.
    Error,
}

/// Feedback on a lease, held or just released.
#[derive(Serialize, Deserialize, ToSchema, Debug, Clone, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LeaseReport {
    pub outcome: ReportOutcome,
    pub detail: Option<String>,
}

/// Every error: a stable code and a human message.
#[derive(Serialize, Deserialize, ToSchema, Debug, Clone, PartialEq)]
pub struct ErrorBody {
    /// `no_capacity`, `unknown_lease`, `invalid_request`, `unauthorized`, `payload_too_large`, `not_found`, `internal`.
    pub error: String,
    pub message: String,
}
