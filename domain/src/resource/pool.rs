//! `ProxyPool`: a fleet of Proxies from one template, scaled by hand (the
//! scale subresource) or by lease demand, and rotated on age, on blocks
//! and on errors without failing a crawler's request.

use std::collections::BTreeMap;
use std::time::Duration;

use egress_proxies_telemetry::events::PoolFigures;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use super::spec::ProxySpec;

/// Label on every Proxy a pool owns: the pool's name.
pub const POOL_LABEL: &str = "crawl.example.com/pool";
/// Annotation on a pool's Proxy: the hash of the template it was made from
/// (a template change replaces Proxies with another hash).
pub const POOL_TEMPLATE_HASH_ANNOTATION: &str = "crawl.example.com/pool-template-hash";
/// Annotation on a pool's Proxy being retired: when retiring began and why,
/// as `<RFC 3339 time> <reason>`. A retiring proxy takes no new leases and
/// its leases are not renewed; it is deleted once its last lease ends or
/// the pool's drain timeout passes.
pub const RETIRING_ANNOTATION: &str = "crawl.example.com/retiring";
/// Annotation on a pool's Proxy: the outgoing addresses its pool has
/// quarantined (members were blocked on them), as
/// `<address>=<RFC 3339 until>,...`. A provider choosing from a list of
/// addresses gives the proxy's instance none of them while another is free.
pub const QUARANTINED_ADDRESSES_ANNOTATION: &str = "crawl.example.com/quarantined-addresses";

/// Default time a retiring proxy's leases get to end.
pub const DEFAULT_DRAIN_TIMEOUT: &str = "10m";

/// A pool of proxies made from one template.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "crawl.example.com",
    version = "v1alpha1",
    kind = "ProxyPool",
    namespaced,
    shortname = "pp",
    status = "ProxyPoolStatus",
    derive = "PartialEq",
    scale = r#"{"specReplicasPath":".spec.replicas","statusReplicasPath":".status.replicas","labelSelectorPath":".status.selector"}"#,
    printcolumn = r#"{"name":"Desired","type":"integer","jsonPath":".status.desiredReplicas"}"#,
    printcolumn = r#"{"name":"Replicas","type":"integer","jsonPath":".status.replicas"}"#,
    printcolumn = r#"{"name":"Ready","type":"integer","jsonPath":".status.ready"}"#,
    printcolumn = r#"{"name":"Leased","type":"integer","jsonPath":".status.leased"}"#,
    printcolumn = r#"{"name":"Rotating","type":"integer","jsonPath":".status.rotating"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[x_kube(
    validation = Rule::new("!has(self.autoscaling) || self.autoscaling.minReplicas <= self.autoscaling.maxReplicas")
        .message("autoscaling.minReplicas must not exceed autoscaling.maxReplicas"),
    validation = Rule::new(
        "(has(self.maxSurge) ? self.maxSurge : 1) + (has(self.maxUnavailable) ? self.maxUnavailable : 0) > 0"
    )
        .message("maxSurge and maxUnavailable cannot both be 0: nothing could ever be replaced")
)]
#[serde(rename_all = "camelCase")]
pub struct ProxyPoolSpec {
    /// How many proxies the pool keeps (`kubectl scale pp/<name>
    /// --replicas=N`); with `autoscaling`, only the size it starts from.
    #[serde(default = "default_replicas")]
    pub replicas: u32,
    /// What each proxy of the pool is.
    pub template: ProxyTemplate,
    /// Size the pool by lease demand, between the bounds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoscaling: Option<Autoscaling>,
    /// When a proxy is replaced by a fresh one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rotation: Option<Rotation>,
    /// Proxies made above `replicas` while others are replaced.
    #[serde(default = "default_max_surge")]
    pub max_surge: u32,
    /// Ready proxies that may be missing below `replicas` while others are replaced.
    #[serde(default)]
    pub max_unavailable: u32,
    /// How long a retiring proxy's leases get to end before it is deleted anyway.
    #[serde(default = "default_drain_timeout")]
    #[schemars(regex(pattern = r"^([0-9]+(h|m|s|ms))+$"), length(max = 32))]
    pub drain_timeout: String,
}

/// Length of a member's name suffix (`<pool>-<suffix>`).
pub const MEMBER_SUFFIX_LEN: usize = 5;

/// Longest pool name: a member's name `<pool>-<suffix>` must stay a
/// Kubernetes object name (63 characters, so it can be a label value too).
pub const MAX_POOL_NAME_LEN: usize = 63 - 1 - MEMBER_SUFFIX_LEN;

/// Distinct blocking targets counted per proxy: the highest rotation
/// threshold a pool may set, bounded so a crawler reporting endless targets
/// costs nothing more.
pub const MAX_BLOCKED_TARGETS: usize = 64;

impl ProxyPoolSpec {
    /// How long a retiring member's leases get to end.
    pub fn drain_timeout(&self) -> Result<Duration, String> {
        super::probe_duration::spelled(&self.drain_timeout).ok_or_else(|| {
            format!(
                "drainTimeout must be whole numbers with h, m, s or ms, like 10m (got {:?})",
                self.drain_timeout
            )
        })
    }

    /// Members older than this are replaced.
    pub fn max_age(&self) -> Result<Option<Duration>, String> {
        let Some(age) = self.rotation.as_ref().and_then(|r| r.max_age.as_deref()) else {
            return Ok(None);
        };
        match super::probe_duration::spelled(age) {
            Some(d) if !d.is_zero() => Ok(Some(d)),
            _ => Err(format!(
                "rotation.maxAge must be a positive duration of whole numbers with h, m, s or ms, like 24h (got {age:?})"
            )),
        }
    }

    /// Every rule the CRD states, checked again at runtime (the embedded
    /// store has no API server): each problem names its field.
    pub fn validate(&self) -> Result<(), Vec<String>> {
        let mut problems = Vec::new();
        if let Err(template) = self.template.spec.validate() {
            problems.extend(template.into_iter().map(|p| format!("template.spec: {p}")));
        }
        if let Some(a) = &self.autoscaling {
            if a.min_replicas > a.max_replicas {
                problems.push("autoscaling.minReplicas must not exceed autoscaling.maxReplicas".into());
            }
            if a.max_replicas == 0 {
                problems.push("autoscaling.maxReplicas must be at least 1".into());
            }
            if !(1..=100).contains(&a.target_utilization) {
                problems.push("autoscaling.targetUtilization must be between 1 and 100".into());
            }
        }
        if self.max_surge == 0 && self.max_unavailable == 0 {
            problems
                .push("maxSurge and maxUnavailable cannot both be 0: nothing could ever be replaced".into());
        }
        if let Some(r) = &self.rotation {
            if let Some(n) = r.after_blocked_targets
                && !(1..=MAX_BLOCKED_TARGETS as u32).contains(&n)
            {
                problems.push(format!(
                    "rotation.afterBlockedTargets must be between 1 and {} (got {n})",
                    MAX_BLOCKED_TARGETS
                ));
            }
            if r.after_errors == Some(0) {
                problems.push("rotation.afterErrors must be at least 1".into());
            }
        }
        problems.extend(self.drain_timeout().err());
        problems.extend(self.max_age().err());
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems)
        }
    }
}

fn default_replicas() -> u32 {
    1
}

fn default_max_surge() -> u32 {
    1
}

fn default_drain_timeout() -> String {
    DEFAULT_DRAIN_TIMEOUT.to_owned()
}

/// The Proxy each member is made from.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProxyTemplate {
    /// Labels of every member (besides the pool's own label).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// The members' spec.
    pub spec: ProxySpec,
}

/// Demand-driven size.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Autoscaling {
    /// The fewest members, also with no demand.
    #[schemars(range(min = 0))]
    pub min_replicas: u32,
    /// The most members, however high the demand.
    #[schemars(range(min = 1))]
    pub max_replicas: u32,
    /// Share of the pool's lease capacity in use the autoscaler aims for, in percent.
    #[serde(default = "default_target_utilization")]
    #[schemars(range(min = 1, max = 100))]
    pub target_utilization: u32,
}

fn default_target_utilization() -> u32 {
    70
}

/// Reasons to replace a proxy; each is optional.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Rotation {
    /// Replace proxies older than this (e.g. `24h`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^([0-9]+(h|m|s|ms))+$"), length(max = 32))]
    pub max_age: Option<String>,
    /// Replace a proxy once this many distinct targets reported it `blocked`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 64))]
    pub after_blocked_targets: Option<u32>,
    /// Replace a proxy once leases reported this many `error`s on it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub after_errors: Option<u32>,
}

/// What the pool observed.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProxyPoolStatus {
    /// Members, retiring ones included.
    #[serde(default)]
    pub replicas: u32,
    /// Members that are Ready and not retiring.
    #[serde(default)]
    pub ready: u32,
    /// Active leases on the pool's members.
    #[serde(default)]
    pub leased: u32,
    /// Members being replaced (retiring, or waiting for their successor).
    #[serde(default)]
    pub rotating: u32,
    /// Label selector of the members, for the scale subresource.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The size the pool aims for: `spec.replicas`, or with `autoscaling`
    /// the size the autoscaler chose.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub desired_replicas: Option<u32>,
    /// When the autoscaler last changed `desiredReplicas`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_scale_time: Option<Time>,
    /// `Ready` (all desired members Ready), `Progressing` (rotations or
    /// scaling under way), `AddressesAvailable` (once an address was
    /// quarantined: whether new members still get unquarantined ones).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// Outgoing addresses members were blocked on, given to no new member
    /// while another address is free until the blocked rest ends.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub quarantined_addresses: Vec<QuarantinedAddress>,
}

impl ProxyPoolStatus {
    /// The member counts this status reports, for the pool's metrics.
    pub fn figures(&self) -> PoolFigures {
        PoolFigures {
            desired: self.desired_replicas.unwrap_or_default(),
            replicas: self.replicas,
            ready: self.ready,
            leased: self.leased,
            rotating: self.rotating,
        }
    }
}

/// An outgoing address a member was blocked on.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct QuarantinedAddress {
    /// The address targets saw the blocked member come from.
    pub address: String,
    /// The member that was blocked on it (the latest one).
    pub member: String,
    /// When that member was retired for blocks.
    pub since: Time,
    /// The end of the quarantine: `since` plus the blocked rest.
    pub until: Time,
}
