//! The standalone-mode configuration: where manifests, state and providers
//! are, and where the operator listens. Relative paths are resolved against
//! the directory of the file, so a config works from any working directory.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::config::BindAddress;
use crate::installation::InstallationId;

/// Settings of `egress-proxies-operator standalone`.
#[derive(Clone, Debug, PartialEq)]
pub struct StandaloneConfig {
    /// Providers configuration file.
    pub providers_config: PathBuf,
    /// Directory of Proxy (and cloud-init Secret) manifests, watched for changes.
    pub manifests: PathBuf,
    /// Where state lives: the database, local instances.
    pub state_dir: PathBuf,
    /// `/healthz` and `/readyz`.
    pub health_probe_bind_address: BindAddress,
    /// Prometheus metrics (`0` disables).
    pub metrics_bind_address: BindAddress,
    /// The discovery and lease API.
    pub discovery_bind_address: BindAddress,
    /// The gateway (docs/gateway.md); off when absent.
    pub gateway_bind_address: BindAddress,
    /// The gateway's behaviour (the `gateway:` block).
    pub gateway: super::GatewaySettings,
    /// Named crawler tokens: one file per identity (`crawlerTokensDir`,
    /// relative to the config file), re-read while running.
    pub crawler_tokens_dir: Option<PathBuf>,
    /// Rest of a proxy for a target after a lease on it is released.
    pub lease_cooldown: Duration,
    /// Upper bound of a lease's TTL.
    pub max_lease_ttl: Duration,
    /// Concurrent leases per proxy (0 = unlimited).
    pub max_leases_per_proxy: u32,
    /// Weights of crawler identities' fair shares (the `fairShare:` block).
    pub fair_share: crate::lease::FairShare,
    /// How often the manifest directory is rescanned.
    pub manifest_poll_interval: Duration,
    /// Health probes running at the same time.
    pub health_workers: usize,
    /// Extra CA certificates (PEM) trusted by health probes.
    pub health_ca_file: Option<PathBuf>,
    /// One trace span per health probe.
    pub trace_health_probes: bool,
    /// gcp wire log shows whole bodies (cloud-init stays redacted).
    pub gcp_wire_log_full_payloads: bool,
    /// Time between orphan-GC sweeps.
    pub gc_interval: Duration,
    /// Orphans younger than this are spared (in-flight creates).
    pub gc_grace_period: Duration,
    /// How long an autoscaled pool's demand must stay low before it shrinks.
    pub pool_scale_down_delay: Duration,
    /// This installation's id; by default generated once and kept in the
    /// state database.
    pub installation_id: Option<InstallationId>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Raw {
    providers_config: PathBuf,
    manifests: PathBuf,
    state_dir: PathBuf,
    #[serde(default = "default_health")]
    health_probe_bind_address: String,
    #[serde(default = "default_discovery")]
    discovery_bind_address: String,
    #[serde(default = "default_metrics")]
    metrics_bind_address: String,
    #[serde(default = "default_metrics")]
    gateway_bind_address: String,
    #[serde(default)]
    gateway: super::gateway::RawGatewaySettings,
    #[serde(default = "default_cooldown")]
    lease_cooldown: String,
    #[serde(default = "default_max_ttl")]
    max_lease_ttl: String,
    #[serde(default = "default_capacity")]
    max_leases_per_proxy: u32,
    #[serde(default)]
    fair_share: RawFairShare,
    #[serde(default = "default_poll")]
    manifest_poll_interval: String,
    #[serde(default = "default_workers")]
    health_workers: usize,
    #[serde(default)]
    health_ca_file: Option<PathBuf>,
    #[serde(default)]
    crawler_tokens_dir: Option<PathBuf>,
    #[serde(default)]
    trace_health_probes: bool,
    #[serde(default)]
    gcp_wire_log_full_payloads: bool,
    #[serde(default = "default_gc")]
    gc_interval: String,
    #[serde(default = "default_gc")]
    gc_grace_period: String,
    #[serde(default = "default_scale_down_delay")]
    pool_scale_down_delay: String,
    #[serde(default)]
    installation_id: Option<String>,
}

/// `fairShare: {weights: {team-a: 2}}`: identities not named weigh 1.
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawFairShare {
    #[serde(default)]
    weights: std::collections::BTreeMap<String, u32>,
}

fn default_gc() -> String {
    "10m".to_owned()
}

fn default_scale_down_delay() -> String {
    "2m".to_owned()
}

fn default_workers() -> usize {
    64
}

/// Off unless asked for (the quickstart asks for 127.0.0.1:8082 for
/// metrics, 127.0.0.1:8888 for the gateway).
fn default_metrics() -> String {
    "0".into()
}
fn default_health() -> String {
    "127.0.0.1:8081".to_owned()
}
fn default_discovery() -> String {
    "127.0.0.1:8090".to_owned()
}
fn default_cooldown() -> String {
    "30s".to_owned()
}
fn default_max_ttl() -> String {
    "10m".to_owned()
}
fn default_capacity() -> u32 {
    1
}
fn default_poll() -> String {
    "1s".to_owned()
}

/// The standalone configuration could not be used.
#[derive(Debug, thiserror::Error)]
pub enum StandaloneConfigError {
    #[error("reading {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Invalid { path: String, message: String },
}

impl StandaloneConfig {
    /// The configuration in `text`, read from `path`; relative paths in it
    /// are taken from `base`, the file's directory made absolute, so they
    /// survive any later change of working directory.
    pub fn parse(text: &str, path: &Path, base: &Path) -> Result<Self, StandaloneConfigError> {
        let shown = path.display().to_string();
        let invalid = |message: String| StandaloneConfigError::Invalid {
            path: shown.clone(),
            message,
        };
        let raw: Raw = serde_saphyr::from_str(text).map_err(|e| invalid(e.to_string()))?;
        let resolve = |p: PathBuf| if p.is_absolute() { p } else { base.join(p) };
        let health_probe_bind_address = raw
            .health_probe_bind_address
            .parse()
            .map_err(|e| invalid(format!("healthProbeBindAddress: {e}")))?;
        let metrics_bind_address = raw
            .metrics_bind_address
            .parse()
            .map_err(|e| invalid(format!("metricsBindAddress: {e}")))?;
        let discovery_bind_address = raw
            .discovery_bind_address
            .parse()
            .map_err(|e| invalid(format!("discoveryBindAddress: {e}")))?;
        let gateway_bind_address = raw
            .gateway_bind_address
            .parse()
            .map_err(|e| invalid(format!("gatewayBindAddress: {e}")))?;
        let gateway = super::GatewaySettings::from_raw(raw.gateway).map_err(|e| invalid(e.to_string()))?;
        let duration = |field: &str, value: &str| {
            humantime::parse_duration(value).map_err(|e| invalid(format!("{field} {value:?}: {e}")))
        };
        let lease_cooldown = duration("leaseCooldown", &raw.lease_cooldown)?;
        let fair_share = crate::lease::FairShare::new(raw.fair_share.weights)
            .map_err(|e| invalid(format!("fairShare: {e}")))?;
        let gc_interval = duration("gcInterval", &raw.gc_interval)?;
        let gc_grace_period = duration("gcGracePeriod", &raw.gc_grace_period)?;
        let pool_scale_down_delay = duration("poolScaleDownDelay", &raw.pool_scale_down_delay)?;
        if gc_interval.is_zero() {
            return Err(invalid("gcInterval must be greater than zero".into()));
        }
        let max_lease_ttl = duration("maxLeaseTtl", &raw.max_lease_ttl)?;
        if max_lease_ttl.is_zero() {
            return Err(invalid("maxLeaseTtl must be greater than zero".into()));
        }
        let manifest_poll_interval = humantime::parse_duration(&raw.manifest_poll_interval).map_err(|e| {
            invalid(format!(
                "manifestPollInterval {:?}: {e}",
                raw.manifest_poll_interval
            ))
        })?;
        if manifest_poll_interval.is_zero() {
            return Err(invalid("manifestPollInterval must be greater than zero".into()));
        }
        if raw.health_workers == 0 {
            return Err(invalid("healthWorkers must be at least 1".into()));
        }
        let installation_id = raw
            .installation_id
            .map(|id| InstallationId::parse(&id).map_err(|e| invalid(format!("installationId: {e}"))))
            .transpose()?;
        Ok(Self {
            installation_id,
            gc_interval,
            gc_grace_period,
            pool_scale_down_delay,
            discovery_bind_address,
            gateway_bind_address,
            gateway,
            lease_cooldown,
            max_lease_ttl,
            max_leases_per_proxy: raw.max_leases_per_proxy,
            fair_share,
            health_workers: raw.health_workers,
            health_ca_file: raw.health_ca_file.map(resolve),
            crawler_tokens_dir: raw.crawler_tokens_dir.map(resolve),
            trace_health_probes: raw.trace_health_probes,
            gcp_wire_log_full_payloads: raw.gcp_wire_log_full_payloads,
            providers_config: resolve(raw.providers_config),
            manifests: resolve(raw.manifests),
            state_dir: resolve(raw.state_dir),
            health_probe_bind_address,
            metrics_bind_address,
            manifest_poll_interval,
        })
    }
}
