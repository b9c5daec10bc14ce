//! A Proxy's health check, parsed once into what the probe needs.

use std::time::Duration;

use crate::resource::HealthCheck;

use super::Thresholds;

/// What to fetch through a proxy and what counts as success.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckSpec {
    pub url: url::Url,
    pub expected_status: Option<u16>,
    pub interval: Duration,
    pub timeout: Duration,
    pub thresholds: Thresholds,
}

/// The health check cannot be used as written.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    #[error("healthCheck.url {url:?}: {reason}")]
    Url { url: String, reason: String },
    #[error(transparent)]
    Duration(#[from] crate::resource::DurationError),
}

impl CheckSpec {
    pub fn from_health_check(hc: &HealthCheck) -> Result<Self, CheckError> {
        let bad = |reason: &str| CheckError::Url {
            url: hc.url.clone(),
            reason: reason.to_owned(),
        };
        let url = url::Url::parse(&hc.url).map_err(|e| bad(&e.to_string()))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(bad("must be an http:// or https:// URL"));
        }
        if url.host_str().is_none() {
            return Err(bad("has no host"));
        }
        Ok(Self {
            url,
            expected_status: hc.expected_status,
            interval: hc.interval()?,
            timeout: hc.timeout()?,
            thresholds: Thresholds {
                healthy: hc.healthy_threshold.max(1),
                unhealthy: hc.unhealthy_threshold.max(1),
            },
        })
    }

    /// Whether `status` counts as healthy.
    pub fn accepts(&self, status: u16) -> bool {
        match self.expected_status {
            Some(expected) => status == expected,
            None => (200..300).contains(&status),
        }
    }

    /// The expectation, for messages.
    pub fn expectation(&self) -> String {
        match self.expected_status {
            Some(expected) => expected.to_string(),
            None => "2xx".to_owned(),
        }
    }
}

/// What the health engine probes for one proxy incarnation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeTarget {
    /// The Proxy UID (results for another incarnation are discarded).
    pub uid: String,
    /// `host:port` of the proxy.
    pub endpoint: String,
    pub check: CheckSpec,
    /// What the proxy demands in `Proxy-Authorization`, if anything.
    pub credentials: Option<crate::credentials::ProxyCredentials>,
    /// The realm the proxy's own 407 names, when known (a Managed proxy's).
    pub realm: Option<String>,
    /// Where probes may connect, when the endpoint is the Proxy author's
    /// word (External, Kubernetes mode); `None` connects anywhere.
    pub endpoint_policy: Option<std::sync::Arc<crate::destinations::DestinationPolicy>>,
}
