//! The discovery API's JSON bodies (and their OpenAPI schemas), and the
//! codes its errors carry.

use std::collections::BTreeMap;

use serde::de::{DeserializeOwned, Error as _};
use serde::{Deserialize, Deserializer, Serialize};
use utoipa::ToSchema;

/// A request body that must be a JSON object: serde would also read a
/// struct from an array (`["ok"]`), which the schema does not allow.
#[derive(Debug)]
pub struct Object<T>(pub T);

impl<'de, T: DeserializeOwned> Deserialize<'de> for Object<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let map = serde_json::Map::deserialize(d)?;
        T::deserialize(serde_json::Value::Object(map))
            .map(Object)
            .map_err(D::Error::custom)
    }
}

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
    /// Lease only a member of this ProxyPool (its name).
    #[serde(default)]
    pub pool: Option<String>,
    /// Requested lifetime; capped by the server's maximum.
    #[serde(default, deserialize_with = "whole_number")]
    pub ttl_seconds: Option<u64>,
    /// Free-form client name, for logs.
    pub client: Option<String>,
}

/// The proxy of a lease, with what it demands: a lease is the only place
/// a proxy's credentials are handed out.
#[derive(Serialize, Deserialize, ToSchema, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct LeasedProxy {
    pub name: String,
    pub namespace: String,
    /// `http://user:password@host:port` to configure as the client's proxy
    /// (user-info only when the proxy demands credentials).
    pub url: String,
    pub attributes: BTreeMap<String, String>,
    /// Username for Basic proxy authentication (`Proxy-Authorization`), when the proxy demands it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    /// Password for Basic proxy authentication, when the proxy demands it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password: Option<String>,
}

// The URL and password are secrets: never printed.
impl std::fmt::Debug for LeasedProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeasedProxy")
            .field("name", &self.name)
            .field("namespace", &self.namespace)
            .field("attributes", &self.attributes)
            .field("username", &self.username)
            .finish_non_exhaustive()
    }
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

/// Extend a held lease (the body is optional).
#[derive(Serialize, Deserialize, ToSchema, Debug, Clone, Default, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RenewRequest {
    /// New lifetime from now; default: the lease's TTL as granted. Capped by the server's maximum.
    #[serde(default, deserialize_with = "whole_number")]
    pub ttl_seconds: Option<u64>,
}

/// A renewed lease.
#[derive(Serialize, Deserialize, ToSchema, Debug, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Renewal {
    pub id: String,
    /// RFC 3339 time the lease now ends unless released or renewed.
    pub expires_at: String,
    /// The lifetime applied, from now (after the server's cap).
    pub ttl_seconds: u64,
}

/// Every error: a stable code and a human message.
#[derive(Serialize, Deserialize, ToSchema, Debug, Clone, PartialEq)]
pub struct ErrorBody {
    /// `no_capacity`, `lease_store_full`, `unavailable`, `not_leader`, `unknown_lease`,
    /// `invalid_request`, `unauthorized`, `forbidden`, `payload_too_large`, `not_found`,
    /// `method_not_allowed`, `rate_limited`, `internal`.
    pub error: String,
    pub message: String,
}

/// Every `error` code, for the OpenAPI document (a test checks each of the
/// server's errors has its code here: a client validating answers against
/// the document must accept every one the server sends).
pub const ERROR_CODES: [&str; 15] = [
    "no_capacity",
    "unknown_lease",
    "invalid_request",
    "unauthorized",
    "forbidden",
    "payload_too_large",
    "not_found",
    "method_not_allowed",
    "rate_limited",
    "lease_store_full",
    "unavailable",
    "not_leader",
    "internal",
    "proxy_retiring",
    "not_owner",
];

/// A non-negative whole number, also written as `30.0`: JSON Schema counts
/// that as an integer, so a client that sends it is not wrong.
fn whole_number<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    struct Whole;
    impl serde::de::Visitor<'_> for Whole {
        type Value = Option<u64>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a whole number of seconds")
        }
        fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Self::Value, E> {
            Ok(Some(v))
        }
        fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Self::Value, E> {
            u64::try_from(v)
                .map(Some)
                .map_err(|_| E::custom(format!("{v} is negative; expected a whole number of seconds")))
        }
        fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Self::Value, E> {
            if v.fract() == 0.0 && (0.0..=u64::MAX as f64).contains(&v) {
                Ok(Some(v as u64))
            } else {
                Err(E::custom(format!("{v} is not a whole number of seconds")))
            }
        }
        fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
    }
    d.deserialize_any(Whole)
}
