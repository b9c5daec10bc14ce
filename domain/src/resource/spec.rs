//! `Proxy.spec`: what the user asks for.

use std::collections::BTreeMap;
use std::time::Duration;

use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use super::probe_duration::{self, DurationError, Field};
use super::status::ProxyStatus;

/// Default port of a Managed proxy.
pub const DEFAULT_PORT: u16 = 3128;
/// Default health-check target: a tiny, always-204 page.
pub const DEFAULT_HEALTH_URL: &str = "https://www.gstatic.com/generate_204";
/// Default probe interval.
pub const DEFAULT_HEALTH_INTERVAL: &str = "1s";
/// Default probe timeout.
pub const DEFAULT_HEALTH_TIMEOUT: &str = "5s";
/// Default consecutive successes before a proxy counts as healthy.
pub const DEFAULT_HEALTHY_THRESHOLD: u32 = 2;
/// Default consecutive failures before a proxy counts as unhealthy.
pub const DEFAULT_UNHEALTHY_THRESHOLD: u32 = 3;

/// One egress proxy: either an endpoint someone else runs (`External`) or an
/// instance a provider creates and keeps alive (`Managed`).
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "crawl.example.com",
    version = "v1alpha1",
    kind = "Proxy",
    namespaced,
    shortname = "px",
    status = "ProxyStatus",
    derive = "PartialEq",
    printcolumn = r#"{"name":"Mode","type":"string","jsonPath":".spec.mode"}"#,
    printcolumn = r#"{"name":"Provider","type":"string","jsonPath":".spec.provider"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"IP","type":"string","jsonPath":".status.ip"}"#,
    printcolumn = r#"{"name":"Healthy","type":"boolean","jsonPath":".status.health.healthy"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    printcolumn = r#"{"name":"Message","type":"string","priority":1,"jsonPath":".status.message"}"#
)]
#[x_kube(
    validation = Rule::new("self.mode != 'External' || has(self.endpoint)")
        .message("endpoint is required when mode is External"),
    validation = Rule::new("self.mode != 'Managed' || (has(self.provider) && self.provider != '')")
        .message("provider is required when mode is Managed")
)]
#[serde(rename_all = "camelCase")]
pub struct ProxySpec {
    /// `Managed` (a provider creates the instance) or `External` (an existing endpoint).
    pub mode: Mode,

    /// Name of a configured provider instance (not its type). Managed only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,

    /// Where the instance runs; each provider says which fields it needs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<Placement>,

    /// Port the proxy listens on.
    #[serde(default = "default_port")]
    #[schemars(range(min = 1))]
    pub port: u16,

    /// Cloud-init user-data for the instance, inline or from a labelled Secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cloud_init: Option<CloudInit>,

    /// The endpoint of an External proxy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<Endpoint>,

    /// Free-form labels (geo, purpose, ...) clients select proxies by.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub attributes: BTreeMap<String, String>,

    /// How the health engine probes this proxy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_check: Option<HealthCheck>,
}

fn default_port() -> u16 {
    DEFAULT_PORT
}

/// Who runs the proxy.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, schemars::JsonSchema)]
pub enum Mode {
    /// A provider creates, watches and deletes the instance.
    Managed,
    /// Someone else runs it; the operator only probes and hands it out.
    External,
}

impl Mode {
    /// The spelling used in manifests and tables.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Managed => "Managed",
            Mode::External => "External",
        }
    }
}

/// Placement hints; every field is optional and interpreted by the provider.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, Hash, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Placement {
    /// A region; no provider of this version reads it (it still counts as a
    /// spec change that replaces the instance).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    /// gcp: the Compute Engine zone (required). kvm: the configured host to
    /// run on (required when the provider has several hosts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
    /// gcp: the machine type, e.g. `e2-small`. kvm: a key of the provider's
    /// `machineTypes`. Required by both.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine_type: Option<String>,
    /// gcp: the boot image (required). kvm: a key of the provider's `images`,
    /// or an image URL with its sha256 where the provider allows URLs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
}

/// Cloud-init for the instance: exactly one of `inline` or `secretRef`.
#[derive(KubeSchema, Serialize, Deserialize, Clone, PartialEq, Eq)]
#[x_kube(
    validation = Rule::new("has(self.inline) != has(self.secretRef)")
        .message("cloudInit must set exactly one of inline or secretRef")
)]
#[serde(rename_all = "camelCase")]
pub struct CloudInit {
    /// The user-data document itself, passed to the instance byte for byte.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inline: Option<String>,
    /// A Secret in the Proxy's namespace labelled `crawl.example.com/cloud-init: "true"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_ref: Option<SecretKeyRef>,
}

// Cloud-init carries secrets: never print its content.
impl std::fmt::Debug for CloudInit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CloudInit")
            .field(
                "inline",
                &self.inline.as_ref().map(|s| format!("<{} bytes>", s.len())),
            )
            .field("secret_ref", &self.secret_ref)
            .finish()
    }
}

/// A key of a Secret in the Proxy's namespace.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretKeyRef {
    /// Secret name.
    #[schemars(length(min = 1))]
    pub name: String,
    /// Key inside the Secret.
    #[serde(default = "default_cloud_init_key")]
    pub key: String,
}

fn default_cloud_init_key() -> String {
    super::DEFAULT_CLOUD_INIT_KEY.to_owned()
}

/// Where clients reach an External proxy.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Endpoint {
    /// Hostname or IP address.
    #[schemars(length(min = 1))]
    pub host: String,
    /// TCP port.
    #[schemars(range(min = 1))]
    pub port: u16,
    /// How clients talk to the proxy itself (default `http`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheme: Option<ProxyScheme>,
    /// The credentials the proxy demands (Basic proxy authentication), from a
    /// Secret in the Proxy's namespace; handed out with leases and presented
    /// by health probes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials_secret_ref: Option<CredentialsSecretRef>,
}

/// Username and password keys of a Secret in the Proxy's namespace.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CredentialsSecretRef {
    /// Secret name.
    #[schemars(length(min = 1))]
    pub name: String,
    /// Key holding the username.
    #[serde(default = "default_username_key")]
    pub username_key: String,
    /// Key holding the password.
    #[serde(default = "default_password_key")]
    pub password_key: String,
}

fn default_username_key() -> String {
    "username".to_owned()
}

fn default_password_key() -> String {
    "password".to_owned()
}

/// Protocol spoken to the proxy itself.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ProxyScheme {
    #[default]
    Http,
    Https,
}

/// Health-check settings; every field has a default.
///
/// The bounds below are also checked at runtime, with the same messages
/// (`probe_duration`); a test keeps the two in step.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[x_kube(
    validation = Rule::new(
        "!has(self.interval) || (duration(self.interval) >= duration('1s') && duration(self.interval) <= duration('24h'))"
    )
    .message("healthCheck.interval must be between 1s and 24h"),
    validation = Rule::new(
        "!has(self.timeout) || (duration(self.timeout) >= duration('1ms') && duration(self.timeout) <= duration('30s'))"
    )
    .message("healthCheck.timeout must be between 1ms and 30s")
)]
#[serde(rename_all = "camelCase")]
pub struct HealthCheck {
    /// URL fetched through the proxy (https: CONNECT + TLS; http: absolute-URI GET).
    #[serde(default = "default_health_url")]
    pub url: String,
    /// Time between probes, 1s to 24h: whole numbers with h, m, s or ms
    /// (`1s`, `1m30s`). A probe outlasting the interval delays the next one.
    #[serde(default = "default_health_interval")]
    #[schemars(regex(pattern = r"^([0-9]+(h|m|s|ms))+$"), length(max = 32))]
    pub interval: String,
    /// Time one probe may take in total, 1ms to 30s.
    #[serde(default = "default_health_timeout")]
    #[schemars(regex(pattern = r"^([0-9]+(h|m|s|ms))+$"), length(max = 32))]
    pub timeout: String,
    /// Expected HTTP status; any 2xx when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 100, max = 599))]
    pub expected_status: Option<u16>,
    /// Consecutive successes before the proxy counts as healthy.
    #[serde(default = "default_healthy_threshold")]
    #[schemars(range(min = 1))]
    pub healthy_threshold: u32,
    /// Consecutive failures before the proxy counts as unhealthy.
    #[serde(default = "default_unhealthy_threshold")]
    #[schemars(range(min = 1))]
    pub unhealthy_threshold: u32,
}

impl Default for HealthCheck {
    fn default() -> Self {
        Self {
            url: default_health_url(),
            interval: default_health_interval(),
            timeout: default_health_timeout(),
            expected_status: None,
            healthy_threshold: DEFAULT_HEALTHY_THRESHOLD,
            unhealthy_threshold: DEFAULT_UNHEALTHY_THRESHOLD,
        }
    }
}

fn default_health_url() -> String {
    DEFAULT_HEALTH_URL.to_owned()
}
fn default_health_interval() -> String {
    DEFAULT_HEALTH_INTERVAL.to_owned()
}
fn default_health_timeout() -> String {
    DEFAULT_HEALTH_TIMEOUT.to_owned()
}
fn default_healthy_threshold() -> u32 {
    DEFAULT_HEALTHY_THRESHOLD
}
fn default_unhealthy_threshold() -> u32 {
    DEFAULT_UNHEALTHY_THRESHOLD
}

impl HealthCheck {
    /// The probe interval.
    pub fn interval(&self) -> Result<Duration, DurationError> {
        probe_duration::parse(Field::Interval, &self.interval)
    }

    /// The per-probe timeout.
    pub fn timeout(&self) -> Result<Duration, DurationError> {
        probe_duration::parse(Field::Timeout, &self.timeout)
    }
}

impl ProxySpec {
    /// The checks the CRD's validation rules make, for stores without an API
    /// server (the embedded store). Messages match the CRD's.
    pub fn validate(&self) -> Result<(), Vec<String>> {
        let mut problems = Vec::new();
        if self.mode == Mode::External && self.endpoint.is_none() {
            problems.push("endpoint is required when mode is External".to_owned());
        }
        if self.mode == Mode::Managed && self.provider.as_deref().is_none_or(str::is_empty) {
            problems.push("provider is required when mode is Managed".to_owned());
        }
        if let Some(ci) = &self.cloud_init
            && ci.inline.is_some() == ci.secret_ref.is_some()
        {
            problems.push("cloudInit must set exactly one of inline or secretRef".to_owned());
        }
        if self.port == 0 || self.endpoint.as_ref().is_some_and(|e| e.port == 0) {
            problems.push("port must be between 1 and 65535".to_owned());
        }
        if let Some(hc) = &self.health_check {
            if hc.healthy_threshold == 0 || hc.unhealthy_threshold == 0 {
                problems.push("healthCheck thresholds must be at least 1".to_owned());
            }
            for result in [hc.interval().err(), hc.timeout().err()].into_iter().flatten() {
                problems.push(result.to_string());
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems)
        }
    }

    /// Health-check settings with defaults applied.
    pub fn health_check(&self) -> HealthCheck {
        self.health_check.clone().unwrap_or_default()
    }
}
