//! The gateway's behaviour (docs/gateway.md): the `gateway:` block of the
//! standalone configuration, and the file `--gateway-config` names in
//! Kubernetes mode. Where it listens is configured beside the other
//! listeners (`gatewayBindAddress`, `--gateway-bind-address`).

use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

use crate::config::UnauthenticatedLimits;
use crate::destinations::{DestinationRules, IpNet};

/// Validated gateway settings.
#[derive(Clone, Debug, PartialEq)]
pub struct GatewaySettings {
    /// Where the gateway may send requests: the same rules and defaults as
    /// a provider's `destinations`.
    pub destinations: DestinationRules,
    /// Client networks served without credentials (for tools that cannot
    /// send proxy credentials); empty by default.
    pub client_networks: Vec<IpNet>,
    /// Proxies one request or tunnel may try before the crawler sees the
    /// failure.
    pub tries: u32,
    /// Bound on all tries of one request together, until a response head
    /// (or the upstream's `200` for a tunnel) arrives.
    pub deadline: Duration,
    /// How long a request waits for a free proxy before `503 no_capacity`.
    pub capacity_wait: Duration,
    /// A plain-HTTP request body up to this size is kept whole so that the
    /// request can be tried again on another proxy; a larger one is
    /// streamed and the request is tried once.
    pub retry_body_limit: u64,
    /// What counts as a block, for plain HTTP.
    pub blocks: Vec<BlockRule>,
    /// Whether a blocked response is tried again on another proxy (while
    /// tries and the deadline last) instead of being handed back.
    pub retry_on_block: bool,
    /// Lifetime of a sticky session without `sesstime`.
    pub session_lifetime: Duration,
    /// Longest lifetime a `sesstime` may ask for.
    pub max_session_lifetime: Duration,
    /// Sticky sessions remembered at once (the least recently used go first).
    pub max_sessions: usize,
    /// Requests per second one client (username's client name, else
    /// address) may start; 0 is unlimited.
    pub rate_per_client: f64,
    /// Requests a client may start at once after being idle.
    pub burst_per_client: f64,
    /// One trace span per request or tunnel (off by default: thousands per
    /// second; the access line and metrics are always there).
    pub trace_exchanges: bool,
    /// What connections may hold before they authenticate (the
    /// `unauthenticated:` block: `headBudget`, `connectionsPerSource`).
    pub unauthenticated: UnauthenticatedLimits,
    /// After a plain request (not a sticky session's), its proxy rests
    /// this long for the request's site: the gateway's own pacing, in
    /// place of the lease cooldown meant for long leases. Off (zero) by
    /// default: per-request rotation runs at the crawler's speed.
    pub pacing: Duration,
    /// What the gateway learns per site (the `learning:` block).
    pub learning: SiteLearningSettings,
}

/// How the gateway learns which proxies work for which site
/// (docs/gateway.md, "Learning per site").
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SiteLearningSettings {
    /// Off: every proxy is as good as another for every site.
    pub enabled: bool,
    /// Outcomes count half as much after this long.
    pub half_life: Duration,
    /// A proxy is passed over for a site when its success rate there is
    /// below this fraction of the site's best proxy's.
    pub avoid_below: f64,
    /// Outcomes a (site, proxy) pair needs before it can be passed over.
    pub min_observations: f64,
    /// A passed-over pair gets one trial request this often.
    pub recheck: Duration,
}

impl Default for SiteLearningSettings {
    fn default() -> Self {
        Self {
            enabled: true,
            half_life: Duration::from_secs(600),
            avoid_below: 0.5,
            min_observations: 2.0,
            recheck: Duration::from_secs(30),
        }
    }
}

/// One block rule: a response whose status is one of `status` (and, when
/// `body_contains` is set, whose body's first [`BODY_SCAN_LIMIT`] bytes
/// contain one of its markers), for one of `targets` (all when empty).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BlockRule {
    pub status: Vec<u16>,
    #[serde(default)]
    pub body_contains: Vec<String>,
    /// Hosts (`example.com`) or suffix patterns (`*.example.com`).
    #[serde(default)]
    pub targets: Vec<String>,
}

/// How much of a response body block markers are looked for in.
pub const BODY_SCAN_LIMIT: usize = 64 * 1024;

impl Default for GatewaySettings {
    fn default() -> Self {
        Self {
            destinations: DestinationRules::default(),
            client_networks: Vec::new(),
            tries: 3,
            deadline: Duration::from_secs(30),
            capacity_wait: Duration::from_secs(5),
            retry_body_limit: 64 * 1024,
            blocks: Vec::new(),
            retry_on_block: true,
            session_lifetime: Duration::from_secs(10 * 60),
            max_session_lifetime: Duration::from_secs(24 * 3600),
            max_sessions: 100_000,
            rate_per_client: 0.0,
            burst_per_client: 0.0,
            trace_exchanges: false,
            unauthenticated: UnauthenticatedLimits::default(),
            pacing: Duration::ZERO,
            learning: SiteLearningSettings::default(),
        }
    }
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct RawGatewaySettings {
    #[serde(default)]
    destinations: DestinationRules,
    #[serde(default)]
    client_networks: Vec<String>,
    tries: Option<u32>,
    deadline: Option<String>,
    capacity_wait: Option<String>,
    retry_body_limit: Option<u64>,
    #[serde(default)]
    blocks: Vec<BlockRule>,
    retry_on_block: Option<bool>,
    session_lifetime: Option<String>,
    max_session_lifetime: Option<String>,
    max_sessions: Option<usize>,
    rate_limit: Option<RawRateLimit>,
    trace_exchanges: Option<bool>,
    unauthenticated: Option<RawUnauthenticated>,
    pacing: Option<String>,
    learning: Option<RawLearning>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawLearning {
    enabled: Option<bool>,
    half_life: Option<String>,
    avoid_below: Option<f64>,
    min_observations: Option<f64>,
    recheck: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawUnauthenticated {
    head_budget: Option<usize>,
    connections_per_source: Option<usize>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawRateLimit {
    per_client: f64,
    burst: Option<f64>,
}

/// Gateway settings that cannot be used, naming the field.
#[derive(Debug, thiserror::Error)]
pub enum GatewaySettingsError {
    #[error("reading {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Parse(String),
    #[error("{field}: {message}")]
    Invalid { field: String, message: String },
}

fn invalid(field: &str, message: impl Into<String>) -> GatewaySettingsError {
    GatewaySettingsError::Invalid {
        field: format!("gateway.{field}"),
        message: message.into(),
    }
}

impl GatewaySettings {
    /// The text of the file `--gateway-config` names (read from `path`):
    /// the same fields as the standalone configuration's `gateway:` block,
    /// at the top level.
    pub fn from_file_text(text: &str, path: &Path) -> Result<Self, GatewaySettingsError> {
        Self::from_yaml(text).map_err(|e| match e {
            GatewaySettingsError::Parse(m) => GatewaySettingsError::Parse(format!("{}: {m}", path.display())),
            // The file holds the block's fields at its top level.
            GatewaySettingsError::Invalid { field, message } => GatewaySettingsError::Invalid {
                field: field.strip_prefix("gateway.").unwrap_or(&field).to_owned(),
                message,
            },
            other => other,
        })
    }

    pub fn from_yaml(text: &str) -> Result<Self, GatewaySettingsError> {
        let raw: Option<RawGatewaySettings> =
            serde_saphyr::from_str(text).map_err(|e| GatewaySettingsError::Parse(e.to_string()))?;
        Self::from_raw(raw.unwrap_or_default())
    }

    pub(crate) fn from_raw(raw: RawGatewaySettings) -> Result<Self, GatewaySettingsError> {
        let defaults = Self::default();
        let client_networks = raw
            .client_networks
            .iter()
            .map(|n| {
                n.parse::<IpNet>()
                    .or_else(|_| n.parse::<std::net::IpAddr>().map(IpNet::from))
                    .map_err(|_| {
                        invalid(
                            "clientNetworks",
                            format!("{n:?} is not an address or a CIDR network"),
                        )
                    })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let tries = raw.tries.unwrap_or(defaults.tries);
        if !(1..=10).contains(&tries) {
            return Err(invalid("tries", format!("{tries}: must be 1 to 10")));
        }
        let deadline = duration("deadline", raw.deadline, defaults.deadline)?;
        if deadline.is_zero() {
            return Err(invalid("deadline", "must be greater than zero"));
        }
        let capacity_wait = duration("capacityWait", raw.capacity_wait, defaults.capacity_wait)?;
        let session_lifetime = duration("sessionLifetime", raw.session_lifetime, defaults.session_lifetime)?;
        let max_session_lifetime = duration(
            "maxSessionLifetime",
            raw.max_session_lifetime,
            defaults.max_session_lifetime,
        )?;
        if session_lifetime.is_zero() || session_lifetime > max_session_lifetime {
            return Err(invalid(
                "sessionLifetime",
                "must be greater than zero and at most maxSessionLifetime",
            ));
        }
        let retry_body_limit = raw.retry_body_limit.unwrap_or(defaults.retry_body_limit);
        if retry_body_limit > 16 * 1024 * 1024 {
            return Err(invalid(
                "retryBodyLimit",
                "at most 16 MiB (bodies are held in memory)",
            ));
        }
        for (i, rule) in raw.blocks.iter().enumerate() {
            if rule.status.is_empty() {
                return Err(invalid(
                    &format!("blocks[{i}].status"),
                    "name at least one status code",
                ));
            }
            if let Some(bad) = rule.status.iter().find(|s| !(100..=599).contains(*s)) {
                return Err(invalid(
                    &format!("blocks[{i}].status"),
                    format!("{bad} is not an HTTP status"),
                ));
            }
            if rule.body_contains.iter().any(String::is_empty) {
                return Err(invalid(
                    &format!("blocks[{i}].bodyContains"),
                    "a marker may not be empty",
                ));
            }
        }
        let (rate_per_client, burst_per_client) = match raw.rate_limit {
            None => (0.0, 0.0),
            Some(r) if !r.per_client.is_finite() || r.per_client < 0.0 => {
                return Err(invalid("rateLimit.perClient", "must be zero (unlimited) or more"));
            }
            Some(r) => {
                let burst = r.burst.unwrap_or(r.per_client.max(1.0));
                if !burst.is_finite() || burst < 1.0 {
                    return Err(invalid("rateLimit.burst", "must be at least 1"));
                }
                (r.per_client, burst)
            }
        };
        let mut unauthenticated = UnauthenticatedLimits::default();
        if let Some(raw) = raw.unauthenticated {
            if let Some(bytes) = raw.head_budget {
                if bytes > 1 << 30 {
                    return Err(invalid(
                        "unauthenticated.headBudget",
                        "at most 1 GiB (heads are held in memory)",
                    ));
                }
                unauthenticated.head_budget = bytes;
            }
            if let Some(n) = raw.connections_per_source {
                if n == 0 {
                    return Err(invalid(
                        "unauthenticated.connectionsPerSource",
                        "must be at least 1",
                    ));
                }
                unauthenticated.connections_per_source = n;
            }
        }
        let pacing = duration("pacing", raw.pacing, defaults.pacing)?;
        if pacing > Duration::from_secs(3600) {
            return Err(invalid("pacing", "at most 1h"));
        }
        let learning = learning(raw.learning, defaults.learning)?;
        Ok(Self {
            destinations: raw.destinations,
            client_networks,
            tries,
            deadline,
            capacity_wait,
            retry_body_limit,
            blocks: raw.blocks,
            retry_on_block: raw.retry_on_block.unwrap_or(defaults.retry_on_block),
            session_lifetime,
            max_session_lifetime,
            max_sessions: raw.max_sessions.unwrap_or(defaults.max_sessions).max(1),
            rate_per_client,
            burst_per_client,
            trace_exchanges: raw.trace_exchanges.unwrap_or(defaults.trace_exchanges),
            unauthenticated,
            pacing,
            learning,
        })
    }
}

/// A duration field, `default` when absent.
fn duration(field: &str, value: Option<String>, default: Duration) -> Result<Duration, GatewaySettingsError> {
    match value {
        None => Ok(default),
        Some(v) => humantime::parse_duration(&v).map_err(|e| invalid(field, format!("{v:?}: {e}"))),
    }
}

/// The `learning:` block, checked.
fn learning(
    raw: Option<RawLearning>,
    defaults: SiteLearningSettings,
) -> Result<SiteLearningSettings, GatewaySettingsError> {
    let Some(raw) = raw else {
        return Ok(defaults);
    };
    let half_life = duration("learning.halfLife", raw.half_life, defaults.half_life)?;
    if half_life.is_zero() {
        return Err(invalid("learning.halfLife", "must be greater than zero"));
    }
    let avoid_below = raw.avoid_below.unwrap_or(defaults.avoid_below);
    if !(0.0..=1.0).contains(&avoid_below) {
        return Err(invalid("learning.avoidBelow", "a fraction from 0 to 1"));
    }
    let min_observations = raw.min_observations.unwrap_or(defaults.min_observations);
    if !min_observations.is_finite() || min_observations < 1.0 {
        return Err(invalid("learning.minObservations", "must be at least 1"));
    }
    let recheck = duration("learning.recheck", raw.recheck, defaults.recheck)?;
    if recheck.is_zero() {
        return Err(invalid("learning.recheck", "must be greater than zero"));
    }
    Ok(SiteLearningSettings {
        enabled: raw.enabled.unwrap_or(defaults.enabled),
        half_life,
        avoid_below,
        min_observations,
        recheck,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_block_is_the_defaults() {
        assert_eq!(
            GatewaySettings::from_yaml("").unwrap(),
            GatewaySettings::default()
        );
        assert_eq!(
            GatewaySettings::from_yaml("{}").unwrap(),
            GatewaySettings::default()
        );
    }

    #[test]
    fn every_field_parses() {
        let s = GatewaySettings::from_yaml(
            "destinations: {allow: [127.0.0.0/8]}\nclientNetworks: [127.0.0.1, 10.0.0.0/8]\ntries: 4\n\
             deadline: 10s\ncapacityWait: 2s\nretryBodyLimit: 1024\n\
             blocks: [{status: [403, 429], bodyContains: [captcha], targets: ['*.example.com']}]\n\
             retryOnBlock: false\nsessionLifetime: 5m\nmaxSessionLifetime: 1h\nmaxSessions: 10\n\
             rateLimit: {perClient: 50, burst: 100}\ntraceExchanges: true\n\
             unauthenticated: {headBudget: 1048576, connectionsPerSource: 32}\n",
        )
        .unwrap();
        assert!(s.trace_exchanges);
        assert_eq!(
            (
                s.unauthenticated.head_budget,
                s.unauthenticated.connections_per_source
            ),
            (1 << 20, 32)
        );
        assert_eq!(s.client_networks.len(), 2);
        assert_eq!(
            (s.tries, s.deadline, s.capacity_wait),
            (4, Duration::from_secs(10), Duration::from_secs(2))
        );
        assert_eq!(s.blocks[0].status, vec![403, 429]);
        assert!(!s.retry_on_block);
        assert_eq!((s.rate_per_client, s.burst_per_client), (50.0, 100.0));
    }

    #[test]
    fn mistakes_name_their_field() {
        for (yaml, field) in [
            ("tries: 0", "gateway.tries"),
            ("clientNetworks: [nowhere]", "gateway.clientNetworks"),
            ("deadline: soon", "gateway.deadline"),
            ("blocks: [{status: []}]", "gateway.blocks[0].status"),
            ("blocks: [{status: [999]}]", "gateway.blocks[0].status"),
            (
                "sessionLifetime: 2h\nmaxSessionLifetime: 1h",
                "gateway.sessionLifetime",
            ),
            ("rateLimit: {perClient: -1}", "gateway.rateLimit.perClient"),
            (
                "unauthenticated: {connectionsPerSource: 0}",
                "gateway.unauthenticated.connectionsPerSource",
            ),
            (
                "unauthenticated: {headBudget: 2147483648}",
                "gateway.unauthenticated.headBudget",
            ),
        ] {
            let e = GatewaySettings::from_yaml(yaml).unwrap_err().to_string();
            assert!(e.starts_with(field), "{yaml}: {e}");
        }
        assert!(
            GatewaySettings::from_yaml("retries: 3").is_err(),
            "unknown fields are refused"
        );
    }
}
