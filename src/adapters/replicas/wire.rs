//! What replicas say to each other on the internal listener, as JSON:
//!
//! - `POST /internal/v1/sync` ([`SYNC_PATH`]): a member's [`SyncRequest`]
//!   (its claims, its unacked fleet changes, its probe verdicts), held by
//!   the leader up to `hold_ms` until it has news, answered with a
//!   [`SyncResponse`] (the member's whole allocation, the fleet feed since
//!   what the member saw, its probe assignment, the member table).
//! - `POST /internal/v1/leases/{id}/{release|renew|report}`
//!   ([`lease_path`]): a lease call forwarded to the replica holding the
//!   lease, with the identity of the client that made it
//!   ([`ForwardedLeaseCall`]); the holder answers as its public lease API
//!   would (status and body), and the forwarder relays that answer.
//!
//! Versioning: the path carries the version (`v1`). Within v1 fields are
//! only ever added, each with a default, and unknown fields are ignored,
//! so members of neighbouring releases understand each other; anything
//! else is a `v2` path.
//!
//! The bodies are self-contained (strings, numbers): proxies as
//! `namespace/name`, times as Unix milliseconds (wall clock, as the lease
//! journals keep them), durations in milliseconds. Conversions to the
//! domain's types live beside each body. Credentials travel on this
//! channel (a proxy's availability, a probe target), so no `Debug` here
//! prints a password.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use super::ReplicaError;
use crate::adapters::discovery_api::bodies::ReportOutcome;
use crate::domain::credentials::ProxyCredentials;
use crate::domain::destinations::DestinationPolicy;
use crate::domain::health::{CheckSpec, ProbeTarget, RecordedVerdict, Thresholds, Verdict};
use crate::domain::lease::journal::{key_string, parse_key};
use crate::domain::lease::{Availability, LeaseChange};
use crate::domain::resource::ObjectKey;

/// The sync call's path.
pub const SYNC_PATH: &str = "/internal/v1/sync";
/// How long the leader holds a sync call without news, unless asked otherwise.
pub const DEFAULT_HOLD: Duration = Duration::from_secs(1);

/// The path of a forwarded lease call.
pub fn lease_path(id: &str, op: LeaseOp) -> String {
    format!("/internal/v1/leases/{id}/{}", op.as_str())
}

/// A forwarded lease call's kind, as the path names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseOp {
    Release,
    Renew,
    Report,
}

impl LeaseOp {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Release => "release",
            Self::Renew => "renew",
            Self::Report => "report",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "release" => Some(Self::Release),
            "renew" => Some(Self::Renew),
            "report" => Some(Self::Report),
            _ => None,
        }
    }
}

/// Which leadership a message belongs to: the leader Lease's holder and
/// its `leaseTransitions` (a new leader, even the same pod again, is a new
/// term).
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Term {
    pub holder: String,
    pub transitions: i32,
}

impl Term {
    /// The term a leader Lease records.
    pub fn of(lease: &k8s_openapi::api::coordination::v1::Lease) -> Self {
        let spec = lease.spec.as_ref();
        Self {
            holder: spec.and_then(|s| s.holder_identity.clone()).unwrap_or_default(),
            transitions: spec.and_then(|s| s.lease_transitions).unwrap_or(0),
        }
    }
}

/// A member to the leader: what it holds and what it learnt.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct SyncRequest {
    /// The member's tag (8 hex digits).
    pub tag: String,
    /// The term the member syncs with; `None` before it knows one.
    pub term: Option<Term>,
    /// The highest allocation version it has applied.
    pub applied: u64,
    /// Per proxy: its slots and the leases it has in use (the leader
    /// counts the larger).
    pub claims: Vec<Claim>,
    /// More slots this member wants (refused for want of capacity lately,
    /// requests waiting): the leader lends it idle slots.
    pub wanting: u32,
    /// Fleet changes not yet acknowledged, each with the member's sequence number.
    pub outbox: Vec<OutboxItem>,
    /// Probe verdicts on the proxies assigned to this member.
    pub verdicts: Vec<ProbeVerdict>,
    /// The last fleet feed sequence number applied (0: none yet).
    pub feed_since: u64,
    /// How long the leader may hold the call without news (0: answer at once).
    pub hold_ms: u64,
    /// Counts this member's requests (one higher each time): a report not
    /// newer than the last one taken (delayed, retried) is ignored.
    pub seq: u64,
    /// A digest of `claims` (sent or not).
    pub claims_digest: u64,
    /// `claims` left out: they and `applied` are what the leader last
    /// answered (it asks for them with `claimsWanted` if it has not got them).
    pub claims_omitted: bool,
}

/// A member's claim on one proxy.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Claim {
    /// `namespace/name`.
    pub proxy: String,
    pub slots: u32,
    pub in_use: u32,
}

/// One fleet change from a member's outbox.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OutboxItem {
    pub seq: u64,
    pub change: FleetItem,
}

/// A change every replica must learn: rests, blocks and tallies (up from
/// a member, and down in the feed), and availability (down only).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase", rename_all_fields = "camelCase")]
pub enum FleetItem {
    /// `proxy` rests for `target` until then.
    TargetRest {
        proxy: String,
        target: String,
        until_ms: i64,
    },
    /// `proxy` rests for every target until then.
    ProxyRest { proxy: String, until_ms: i64 },
    /// A target (by its digest) reported `proxy` blocked.
    Blocked { proxy: String, target_digest: u64 },
    /// `proxy`'s leases have reported this many errors in all.
    Errors { proxy: String, count: u32 },
    /// `proxy`'s whole tally (set semantics: union, max).
    Tally {
        proxy: String,
        blocked_targets: Vec<u64>,
        errors: u32,
    },
    /// A proxy as it may be leased now.
    Available(Box<AvailabilityBody>),
    /// The proxy is gone.
    Removed { proxy: String },
    /// What a proxy's probes need (down only): every member derives which
    /// member probes it from the live members the answer names.
    Probe(Box<ProbeWatch>),
    /// A proxy no longer probed (down only).
    ProbeStopped { proxy: String },
}

impl FleetItem {
    /// The journal's change as a fleet item; `None` for what stays with
    /// the member that made it (leases granted, renewed, ended).
    pub fn from_change(change: &LeaseChange) -> Option<Self> {
        Some(match change {
            LeaseChange::TargetRest { target, proxy, until } => Self::TargetRest {
                proxy: key_string(proxy),
                target: target.clone(),
                until_ms: until.as_millisecond(),
            },
            LeaseChange::ProxyRest { proxy, until } => Self::ProxyRest {
                proxy: key_string(proxy),
                until_ms: until.as_millisecond(),
            },
            LeaseChange::BlockedBy { proxy, target } => Self::Blocked {
                proxy: key_string(proxy),
                target_digest: *target,
            },
            LeaseChange::Errors { proxy, count } => Self::Errors {
                proxy: key_string(proxy),
                count: *count,
            },
            LeaseChange::ProxyRemoved(proxy) => Self::Removed {
                proxy: key_string(proxy),
            },
            LeaseChange::Granted(_) | LeaseChange::Extended { .. } | LeaseChange::Ended(_) => return None,
        })
    }

    /// The item as the journal's changes (a tally is one change per
    /// blocked target and one for the errors); `None` for availability.
    pub fn to_changes(&self) -> Result<Option<Vec<LeaseChange>>, ReplicaError> {
        Ok(Some(match self {
            Self::TargetRest {
                proxy,
                target,
                until_ms,
            } => vec![LeaseChange::TargetRest {
                target: target.clone(),
                proxy: key(proxy)?,
                until: millis(*until_ms)?,
            }],
            Self::ProxyRest { proxy, until_ms } => vec![LeaseChange::ProxyRest {
                proxy: key(proxy)?,
                until: millis(*until_ms)?,
            }],
            Self::Blocked { proxy, target_digest } => vec![LeaseChange::BlockedBy {
                proxy: key(proxy)?,
                target: *target_digest,
            }],
            Self::Errors { proxy, count } => vec![LeaseChange::Errors {
                proxy: key(proxy)?,
                count: *count,
            }],
            Self::Tally {
                proxy,
                blocked_targets,
                errors,
            } => {
                let proxy = key(proxy)?;
                let mut changes: Vec<LeaseChange> = blocked_targets
                    .iter()
                    .map(|target| LeaseChange::BlockedBy {
                        proxy: proxy.clone(),
                        target: *target,
                    })
                    .collect();
                changes.push(LeaseChange::Errors {
                    proxy,
                    count: *errors,
                });
                changes
            }
            Self::Removed { proxy } => vec![LeaseChange::ProxyRemoved(key(proxy)?)],
            Self::Available(_) | Self::Probe(_) | Self::ProbeStopped { .. } => return Ok(None),
        }))
    }
}

/// A proxy's credentials on the wire: the password never printed.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CredentialsBody {
    pub username: String,
    pub password: String,
}

impl fmt::Debug for CredentialsBody {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CredentialsBody")
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .finish()
    }
}

impl From<&ProxyCredentials> for CredentialsBody {
    fn from(c: &ProxyCredentials) -> Self {
        Self {
            username: c.username.clone(),
            password: c.password.clone(),
        }
    }
}

impl CredentialsBody {
    pub fn to_credentials(&self) -> Result<ProxyCredentials, ReplicaError> {
        ProxyCredentials::new(&self.username, &self.password).map_err(|e| ReplicaError::Malformed {
            what: "proxy credentials",
            value: e.to_string(),
        })
    }
}

/// A proxy's availability ([`Availability`]) on the wire.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct AvailabilityBody {
    pub proxy: String,
    pub ready: bool,
    pub phase: String,
    pub healthy: Option<bool>,
    pub url: Option<String>,
    pub attributes: BTreeMap<String, String>,
    pub latency_ms: Option<u64>,
    pub credentials: Option<CredentialsBody>,
    pub realm: Option<String>,
    pub retiring: bool,
}

impl From<&Availability> for AvailabilityBody {
    fn from(a: &Availability) -> Self {
        Self {
            proxy: key_string(&a.key),
            ready: a.ready,
            phase: a.phase.clone(),
            healthy: a.healthy,
            url: a.url.clone(),
            attributes: a.attributes.clone(),
            latency_ms: a.latency.map(as_millis),
            credentials: a.credentials.as_ref().map(CredentialsBody::from),
            realm: a.realm.clone(),
            retiring: a.retiring,
        }
    }
}

impl AvailabilityBody {
    pub fn to_availability(&self) -> Result<Availability, ReplicaError> {
        Ok(Availability {
            key: key(&self.proxy)?,
            ready: self.ready,
            phase: self.phase.clone(),
            healthy: self.healthy,
            url: self.url.clone(),
            attributes: self.attributes.clone(),
            latency: self.latency_ms.map(Duration::from_millis),
            credentials: self
                .credentials
                .as_ref()
                .map(CredentialsBody::to_credentials)
                .transpose()?,
            realm: self.realm.clone(),
            retiring: self.retiring,
        })
    }
}

/// A verdict a member's prober reached on a proxy assigned to it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ProbeVerdict {
    pub proxy: String,
    pub uid: String,
    pub healthy: bool,
    pub latency_ms: Option<u64>,
    pub reason: Option<String>,
    pub consecutive_failures: u32,
    pub last_transition_ms: i64,
    pub flipped: bool,
}

impl ProbeVerdict {
    pub fn new(proxy: &ObjectKey, v: &Verdict) -> Self {
        Self {
            proxy: key_string(proxy),
            uid: v.uid.clone(),
            healthy: v.healthy,
            latency_ms: v.latency.map(as_millis),
            reason: v.reason.clone(),
            consecutive_failures: v.consecutive_failures,
            last_transition_ms: v.last_transition.as_millisecond(),
            flipped: v.flipped,
        }
    }

    pub fn to_verdict(&self) -> Result<(ObjectKey, Verdict), ReplicaError> {
        Ok((
            key(&self.proxy)?,
            Verdict {
                uid: self.uid.clone(),
                healthy: self.healthy,
                latency: self.latency_ms.map(Duration::from_millis),
                reason: self.reason.clone(),
                consecutive_failures: self.consecutive_failures,
                last_transition: millis(self.last_transition_ms)?,
                flipped: self.flipped,
            },
        ))
    }
}

/// The leader to a member.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct SyncResponse {
    /// Send the claims in full next time (the leader has not got them).
    pub claims_wanted: bool,
    pub term: Term,
    /// The member's whole allocation.
    pub allocation: Allocation,
    /// The highest outbox sequence number merged.
    pub acked: u64,
    pub feed: Feed,
    pub probes: ProbeAssignment,
    /// Every member, for the dashboard.
    pub members: Vec<MemberBody>,
}

/// A member's whole share, absolute: valid until the send instant of the
/// request it answers plus `ttl_ms`, on the member's own clock.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Allocation {
    pub version: u64,
    pub ttl_ms: u64,
    /// Every live member serves every ready proxy (no per-proxy
    /// capacity); `slots` is then empty.
    pub unlimited: bool,
    pub slots: Vec<ProxySlots>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ProxySlots {
    pub proxy: String,
    pub slots: u32,
}

impl Allocation {
    /// The slots per proxy; `None` when unlimited.
    pub fn per_proxy(&self) -> Result<Option<BTreeMap<ObjectKey, u32>>, ReplicaError> {
        if self.unlimited {
            return Ok(None);
        }
        self.slots
            .iter()
            .map(|s| Ok((key(&s.proxy)?, s.slots)))
            .collect::<Result<_, _>>()
            .map(Some)
    }
}

/// The fleet feed from `from` (exclusive) to `to` (inclusive).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Feed {
    pub from: u64,
    pub to: u64,
    /// `items` are the whole fleet state: forget what the feed said before.
    pub reset: bool,
    pub items: Vec<FleetItem>,
}

/// Which proxies this member now probes, and which no longer.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ProbeAssignment {
    /// `watch` is the whole assignment: unwatch everything else.
    pub reset: bool,
    pub watch: Vec<ProbeWatch>,
    /// `namespace/name` of proxies no longer assigned.
    pub unwatch: Vec<String>,
}

/// One proxy to probe: its [`ProbeTarget`] (without the endpoint policy,
/// which the prober's own replica attaches) and the verdict its status
/// records.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ProbeWatch {
    pub proxy: String,
    pub uid: String,
    pub endpoint: String,
    pub check: CheckBody,
    pub credentials: Option<CredentialsBody>,
    pub realm: Option<String>,
    /// Whether the endpoint is the Proxy author's word (probes then obey
    /// the receiver's `--allow-external-endpoint-networks`).
    pub policed: bool,
    pub recorded: Option<RecordedBody>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct CheckBody {
    pub url: String,
    pub expected_status: Option<u16>,
    pub interval_ms: u64,
    pub timeout_ms: u64,
    pub healthy_threshold: u32,
    pub unhealthy_threshold: u32,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct RecordedBody {
    pub healthy: bool,
    pub latency_ms: Option<u64>,
    pub last_transition_ms: Option<i64>,
    pub consecutive_failures: u32,
}

impl ProbeWatch {
    pub fn new(proxy: &ObjectKey, target: &ProbeTarget, recorded: Option<&RecordedVerdict>) -> Self {
        let check = &target.check;
        Self {
            proxy: key_string(proxy),
            uid: target.uid.clone(),
            endpoint: target.endpoint.clone(),
            check: CheckBody {
                url: check.url.to_string(),
                expected_status: check.expected_status,
                interval_ms: as_millis(check.interval),
                timeout_ms: as_millis(check.timeout),
                healthy_threshold: check.thresholds.healthy,
                unhealthy_threshold: check.thresholds.unhealthy,
            },
            credentials: target.credentials.as_ref().map(CredentialsBody::from),
            realm: target.realm.clone(),
            policed: target.endpoint_policy.is_some(),
            recorded: recorded.map(|r| RecordedBody {
                healthy: r.healthy,
                latency_ms: r.latency.map(as_millis),
                last_transition_ms: r.last_transition.map(Timestamp::as_millisecond),
                consecutive_failures: r.consecutive_failures,
            }),
        }
    }

    /// The target to probe; `policy` is the receiver's own endpoint policy,
    /// attached when the target is policed.
    pub fn to_target(
        &self,
        policy: Option<Arc<DestinationPolicy>>,
    ) -> Result<(ObjectKey, ProbeTarget, Option<RecordedVerdict>), ReplicaError> {
        let url = url::Url::parse(&self.check.url).map_err(|e| ReplicaError::Malformed {
            what: "health check URL",
            value: format!("{:?}: {e}", self.check.url),
        })?;
        let target = ProbeTarget {
            uid: self.uid.clone(),
            endpoint: self.endpoint.clone(),
            check: CheckSpec {
                url,
                expected_status: self.check.expected_status,
                interval: Duration::from_millis(self.check.interval_ms),
                timeout: Duration::from_millis(self.check.timeout_ms),
                thresholds: Thresholds {
                    healthy: self.check.healthy_threshold.max(1),
                    unhealthy: self.check.unhealthy_threshold.max(1),
                },
            },
            credentials: self
                .credentials
                .as_ref()
                .map(CredentialsBody::to_credentials)
                .transpose()?,
            realm: self.realm.clone(),
            endpoint_policy: if self.policed { policy } else { None },
        };
        let recorded = self
            .recorded
            .as_ref()
            .map(|r| {
                Ok::<_, ReplicaError>(RecordedVerdict {
                    healthy: r.healthy,
                    latency: r.latency_ms.map(Duration::from_millis),
                    last_transition: r.last_transition_ms.map(millis).transpose()?,
                    consecutive_failures: r.consecutive_failures,
                })
            })
            .transpose()?;
        Ok((key(&self.proxy)?, target, recorded))
    }
}

/// A member as the leader's table shows it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct MemberBody {
    pub tag: String,
    pub address: Option<String>,
    /// Slots it holds over every proxy.
    pub slots: u32,
    /// Its member Lease unchanged for half the lease duration: the others
    /// probe its proxies (absent from an earlier leader: false).
    pub quiet: bool,
}

/// A lease call forwarded to the replica holding the lease.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ForwardedLeaseCall {
    /// The identity of the client that called (whoever took the lease is
    /// the only one who may act on it).
    pub caller: String,
    #[serde(flatten)]
    pub call: LeaseCall,
}

/// What the client asked of the lease.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "camelCase", rename_all_fields = "camelCase")]
pub enum LeaseCall {
    Release,
    Renew {
        #[serde(default)]
        ttl_seconds: Option<u64>,
    },
    Report {
        outcome: ReportOutcome,
        #[serde(default)]
        detail: Option<String>,
    },
}

impl LeaseCall {
    pub fn op(&self) -> LeaseOp {
        match self {
            Self::Release => LeaseOp::Release,
            Self::Renew { .. } => LeaseOp::Renew,
            Self::Report { .. } => LeaseOp::Report,
        }
    }
}

fn key(text: &str) -> Result<ObjectKey, ReplicaError> {
    parse_key(text).map_err(|_| ReplicaError::Malformed {
        what: "proxy (namespace/name)",
        value: text.to_owned(),
    })
}

fn millis(ms: i64) -> Result<Timestamp, ReplicaError> {
    Timestamp::from_millisecond(ms).map_err(|_| ReplicaError::Malformed {
        what: "time (Unix milliseconds)",
        value: ms.to_string(),
    })
}

fn as_millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip<T: Serialize + serde::de::DeserializeOwned + PartialEq + fmt::Debug>(value: &T) -> String {
        let json = serde_json::to_string(value).unwrap();
        let back: T = serde_json::from_str(&json).unwrap();
        assert_eq!(&back, value, "{json}");
        json
    }

    fn proxy() -> ObjectKey {
        ObjectKey::new("crawl", "squid-1")
    }

    fn secret() -> ProxyCredentials {
        ProxyCredentials::new("u1", "s3cret-pa55").unwrap()
    }

    fn availability() -> Availability {
        Availability {
            key: proxy(),
            ready: true,
            phase: "Ready".into(),
            healthy: Some(true),
            url: Some("http://10.0.0.7:3128".into()),
            attributes: BTreeMap::from([("region".into(), "eu".into())]),
            latency: Some(Duration::from_millis(42)),
            credentials: Some(secret()),
            realm: Some("egress-proxies squid-1".into()),
            retiring: false,
        }
    }

    fn target(policy: Option<Arc<DestinationPolicy>>) -> ProbeTarget {
        ProbeTarget {
            uid: "uid-1".into(),
            endpoint: "10.0.0.7:3128".into(),
            check: CheckSpec {
                url: url::Url::parse("https://www.gstatic.com/generate_204").unwrap(),
                expected_status: Some(204),
                interval: Duration::from_secs(10),
                timeout: Duration::from_millis(2500),
                thresholds: Thresholds {
                    healthy: 2,
                    unhealthy: 3,
                },
            },
            credentials: Some(secret()),
            realm: None,
            endpoint_policy: policy,
        }
    }

    fn request() -> SyncRequest {
        SyncRequest {
            tag: "0a1b2c3d".into(),
            term: Some(Term {
                holder: "operator-0".into(),
                transitions: 3,
            }),
            applied: 17,
            claims: vec![Claim {
                proxy: "crawl/squid-1".into(),
                slots: 1,
                in_use: 2,
            }],
            wanting: 4,
            outbox: vec![
                OutboxItem {
                    seq: 9,
                    change: FleetItem::Blocked {
                        proxy: "crawl/squid-1".into(),
                        target_digest: u64::MAX - 1,
                    },
                },
                OutboxItem {
                    seq: 10,
                    change: FleetItem::TargetRest {
                        proxy: "crawl/squid-1".into(),
                        target: "example.com".into(),
                        until_ms: 1_900_000_000_000,
                    },
                },
            ],
            verdicts: vec![ProbeVerdict {
                proxy: "crawl/squid-1".into(),
                uid: "uid-1".into(),
                healthy: false,
                latency_ms: None,
                reason: Some("connect refused".into()),
                consecutive_failures: 3,
                last_transition_ms: 1_900_000_000_000,
                flipped: true,
            }],
            feed_since: 120,
            hold_ms: 1000,
            seq: 31,
            claims_digest: 0x0123_4567_89ab_cdef,
            claims_omitted: false,
        }
    }

    fn response() -> SyncResponse {
        SyncResponse {
            claims_wanted: true,
            term: Term {
                holder: "operator-0".into(),
                transitions: 3,
            },
            allocation: Allocation {
                version: 18,
                ttl_ms: 9000,
                unlimited: false,
                slots: vec![ProxySlots {
                    proxy: "crawl/squid-1".into(),
                    slots: 1,
                }],
            },
            acked: 10,
            feed: Feed {
                from: 120,
                to: 122,
                reset: false,
                items: vec![
                    FleetItem::Available(Box::new(AvailabilityBody::from(&availability()))),
                    FleetItem::Tally {
                        proxy: "crawl/squid-1".into(),
                        blocked_targets: vec![1, 2],
                        errors: 5,
                    },
                    FleetItem::Removed {
                        proxy: "crawl/gone".into(),
                    },
                ],
            },
            probes: ProbeAssignment {
                reset: true,
                watch: vec![ProbeWatch::new(&proxy(), &target(None), None)],
                unwatch: vec!["crawl/squid-2".into()],
            },
            members: vec![MemberBody {
                tag: "0a1b2c3d".into(),
                address: Some("10.1.2.3:8091".into()),
                slots: 7,
                quiet: true,
            }],
        }
    }

    #[test]
    fn sync_bodies_round_trip_in_camel_case() {
        let json = round_trip(&request());
        for field in [
            r#""feedSince":120"#,
            r#""holdMs":1000"#,
            r#""inUse":2"#,
            r#""kind":"blocked""#,
            r#""targetDigest":18446744073709551614"#,
            r#""untilMs":1900000000000"#,
            r#""lastTransitionMs""#,
        ] {
            assert!(json.contains(field), "{field} in {json}");
        }
        let json = round_trip(&response());
        for field in [
            r#""ttlMs":9000"#,
            r#""kind":"available""#,
            r#""intervalMs":10000"#,
        ] {
            assert!(json.contains(field), "{field} in {json}");
        }
        round_trip(&SyncRequest::default());
        round_trip(&SyncResponse::default());
    }

    #[test]
    fn unknown_fields_are_ignored_and_missing_ones_default() {
        let newer: SyncRequest =
            serde_json::from_str(r#"{"tag":"0a1b2c3d","applied":3,"wants":[{"proxy":"crawl/p"}]}"#).unwrap();
        assert_eq!(newer.tag, "0a1b2c3d");
        assert_eq!(newer.applied, 3);
        assert_eq!(newer.hold_ms, 0);
        let older: SyncResponse = serde_json::from_str(r#"{"acked":4}"#).unwrap();
        assert_eq!(older.acked, 4);
        assert_eq!(older.allocation, Allocation::default());
    }

    #[test]
    fn allocations_are_per_proxy_or_unlimited() {
        let allocation = response().allocation;
        assert_eq!(
            allocation.per_proxy().unwrap(),
            Some(BTreeMap::from([(proxy(), 1)]))
        );
        let unlimited = Allocation {
            version: 1,
            ttl_ms: 9000,
            unlimited: true,
            slots: vec![],
        };
        assert!(round_trip(&unlimited).contains(r#""unlimited":true"#));
        assert_eq!(unlimited.per_proxy().unwrap(), None);
        let bad = Allocation {
            slots: vec![ProxySlots {
                proxy: "no-namespace".into(),
                slots: 1,
            }],
            ..Allocation::default()
        };
        assert!(matches!(
            bad.per_proxy(),
            Err(ReplicaError::Malformed { value, .. }) if value == "no-namespace"
        ));
    }

    #[test]
    fn fleet_changes_cross_the_wire_and_come_back_as_they_were() {
        let until = Timestamp::from_millisecond(1_900_000_000_123).unwrap();
        let changes = [
            LeaseChange::TargetRest {
                target: "example.com".into(),
                proxy: proxy(),
                until,
            },
            LeaseChange::ProxyRest {
                proxy: proxy(),
                until,
            },
            LeaseChange::BlockedBy {
                proxy: proxy(),
                target: 77,
            },
            LeaseChange::Errors {
                proxy: proxy(),
                count: 3,
            },
            LeaseChange::ProxyRemoved(proxy()),
        ];
        for change in changes {
            let item = FleetItem::from_change(&change).unwrap();
            round_trip(&item);
            assert_eq!(item.to_changes().unwrap(), Some(vec![change]));
        }
        let granted = LeaseChange::Extended {
            id: "l1".into(),
            expires: until,
        };
        assert_eq!(
            FleetItem::from_change(&granted),
            None,
            "leases stay with their holder"
        );
        let tally = FleetItem::Tally {
            proxy: "crawl/squid-1".into(),
            blocked_targets: vec![5, 6],
            errors: 2,
        };
        assert_eq!(
            tally.to_changes().unwrap().unwrap(),
            vec![
                LeaseChange::BlockedBy {
                    proxy: proxy(),
                    target: 5
                },
                LeaseChange::BlockedBy {
                    proxy: proxy(),
                    target: 6
                },
                LeaseChange::Errors {
                    proxy: proxy(),
                    count: 2
                },
            ]
        );
    }

    #[test]
    fn availability_and_verdicts_come_back_as_they_were() {
        let body = AvailabilityBody::from(&availability());
        round_trip(&body);
        assert_eq!(body.to_availability().unwrap(), availability());
        let verdict = Verdict {
            uid: "uid-1".into(),
            healthy: true,
            latency: Some(Duration::from_millis(31)),
            reason: None,
            consecutive_failures: 0,
            last_transition: Timestamp::from_millisecond(1_900_000_000_000).unwrap(),
            flipped: true,
        };
        let wire = ProbeVerdict::new(&proxy(), &verdict);
        round_trip(&wire);
        assert_eq!(wire.to_verdict().unwrap(), (proxy(), verdict));
    }

    #[test]
    fn a_probe_target_comes_back_with_the_receivers_own_policy() {
        let sender = Arc::new(DestinationPolicy::external_endpoints(&[]));
        let recorded = RecordedVerdict {
            healthy: true,
            latency: Some(Duration::from_millis(12)),
            last_transition: Some(Timestamp::from_millisecond(1_900_000_000_000).unwrap()),
            consecutive_failures: 0,
        };
        let watch = ProbeWatch::new(&proxy(), &target(Some(sender)), Some(&recorded));
        round_trip(&watch);
        assert!(watch.policed);
        let receiver = Arc::new(DestinationPolicy::external_endpoints(&["10.0.0.0/8"
            .parse()
            .unwrap()]));
        let (key, back, recorded_back) = watch.to_target(Some(receiver.clone())).unwrap();
        assert_eq!(key, proxy());
        assert_eq!(back, target(Some(receiver.clone())));
        assert_eq!(recorded_back, Some(recorded));
        let unpoliced = ProbeWatch::new(&proxy(), &target(None), None);
        let (_, back, _) = unpoliced.to_target(Some(receiver)).unwrap();
        assert_eq!(back.endpoint_policy, None, "an unpoliced target stays unpoliced");
        let broken = ProbeWatch {
            check: CheckBody {
                url: "not a url".into(),
                ..CheckBody::default()
            },
            ..unpoliced
        };
        assert!(matches!(
            broken.to_target(None),
            Err(ReplicaError::Malformed { .. })
        ));
    }

    #[test]
    fn no_debug_output_prints_a_password() {
        let mut request = request();
        request.outbox.push(OutboxItem {
            seq: 11,
            change: FleetItem::Available(Box::new(AvailabilityBody::from(&availability()))),
        });
        let printed = [
            format!("{request:?}"),
            format!("{:?}", response()),
            format!("{:#?}", response()),
            format!("{:?}", CredentialsBody::from(&secret())),
        ];
        for text in printed {
            assert!(!text.contains("s3cret-pa55"), "{text}");
        }
        assert!(format!("{:?}", CredentialsBody::from(&secret())).contains("u1"));
        // On the wire it is there: the receiver needs it.
        assert!(
            serde_json::to_string(&response())
                .unwrap()
                .contains("s3cret-pa55")
        );
    }

    #[test]
    fn forwarded_lease_calls_name_the_op_in_the_path_and_the_caller_in_the_body() {
        let call = ForwardedLeaseCall {
            caller: "crawler-a".into(),
            call: LeaseCall::Report {
                outcome: ReportOutcome::Blocked,
                detail: Some("captcha".into()),
            },
        };
        let json = round_trip(&call);
        assert_eq!(
            json,
            r#"{"caller":"crawler-a","op":"report","outcome":"blocked","detail":"captcha"}"#
        );
        assert_eq!(
            lease_path("0a1b2c3d-0000-4000-8000-000000000001", call.call.op()),
            "/internal/v1/leases/0a1b2c3d-0000-4000-8000-000000000001/report"
        );
        for call in [
            LeaseCall::Release,
            LeaseCall::Renew {
                ttl_seconds: Some(30),
            },
            LeaseCall::Renew { ttl_seconds: None },
        ] {
            let forwarded = ForwardedLeaseCall {
                caller: "crawler-b".into(),
                call,
            };
            round_trip(&forwarded);
            let op = forwarded.call.op();
            assert_eq!(LeaseOp::parse(op.as_str()), Some(op));
        }
        assert_eq!(LeaseOp::parse("delete"), None);
        let renew: ForwardedLeaseCall = serde_json::from_str(r#"{"caller":"c","op":"renew"}"#).unwrap();
        assert_eq!(renew.call, LeaseCall::Renew { ttl_seconds: None });
    }

    #[test]
    fn a_term_is_the_leader_leases_holder_and_transitions() {
        use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
        let lease = Lease {
            spec: Some(LeaseSpec {
                holder_identity: Some("operator-1".into()),
                lease_transitions: Some(4),
                ..LeaseSpec::default()
            }),
            ..Lease::default()
        };
        assert_eq!(
            Term::of(&lease),
            Term {
                holder: "operator-1".into(),
                transitions: 4
            }
        );
        assert_eq!(Term::of(&Lease::default()), Term::default());
    }
}
