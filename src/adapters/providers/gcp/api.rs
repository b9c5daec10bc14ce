//! The five Compute Engine calls the provider needs (`instances.insert`,
//! `get`, `delete`, `aggregatedList`, `setLabels`) over reqwest, with tokens from
//! Application Default Credentials (gcp_auth: the credentials file named by
//! `GOOGLE_APPLICATION_CREDENTIALS`, gcloud's application-default login, or
//! the metadata server / workload identity), cached and refreshed by
//! gcp_auth. Every request and response is one `trace` line on the
//! `egress_proxies::providers::gcp::wire` target, bodies through [`loggable`].

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use reqwest::Method;
use reqwest::header::{AUTHORIZATION, HeaderValue};
use serde_json::{Map, Value, json};
use tracing::Instrument;
use tracing::field::Empty;
use url::Url;

use super::wire_log::loggable;
use crate::domain::provider_contract::ErrorClass;

/// Enough to manage instances, nothing more.
pub const SCOPE: &str = "https://www.googleapis.com/auth/compute";
/// Instances per aggregatedList page.
const PAGE_SIZE: &str = "500";

/// A Compute Engine call failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum GcpError {
    #[error("no usable Google credentials (Application Default Credentials): {0}")]
    Credentials(String),
    #[error("HTTP {status}{}: {message}", reason.as_deref().map(|r| format!(" ({r})")).unwrap_or_default())]
    Api {
        status: u16,
        reason: Option<String>,
        message: String,
    },
    #[error("transport: {0}")]
    Transport(String),
    #[error("unexpected answer from the Compute API: {0}")]
    Decode(String),
}

impl GcpError {
    /// The provider error class (docs/providers.md#errors: 404 NotFound,
    /// quota and rate-limit reasons QuotaExceeded, 429/5xx/transport
    /// Transient, other 4xx Permanent).
    pub fn class(&self) -> ErrorClass {
        match self {
            GcpError::Api { status: 404, .. } => ErrorClass::NotFound,
            GcpError::Api {
                reason: Some(reason), ..
            } if is_quota_reason(reason) => ErrorClass::QuotaExceeded,
            // A token that expired between fetching and use: the next call gets a fresh one.
            GcpError::Api { status: 401, .. } => ErrorClass::Transient,
            GcpError::Api { status, .. } if *status == 429 || *status >= 500 => ErrorClass::Transient,
            GcpError::Api { .. } => ErrorClass::Permanent,
            // Missing credentials heal when they appear; the rest is the network.
            GcpError::Credentials(_) | GcpError::Transport(_) | GcpError::Decode(_) => ErrorClass::Transient,
        }
    }

    /// `setLabels` refused the fingerprint: the labels changed since they were read.
    pub fn is_stale_fingerprint(&self) -> bool {
        matches!(self, GcpError::Api { status: 412, .. })
    }
}

fn is_quota_reason(reason: &str) -> bool {
    let r = reason.to_ascii_lowercase().replace('_', "");
    r.contains("quota") || r.contains("ratelimit") || r == "resourceexhausted" || r == "limitexceeded"
}

/// Bearer tokens for the Compute API.
#[async_trait]
pub trait TokenSource: Send + Sync {
    async fn token(&self) -> Result<String, GcpError>;
}

/// Application Default Credentials, found on first use and retried until
/// found (a provider whose credentials arrive later heals by itself).
pub struct AdcTokens {
    file: Option<PathBuf>,
    provider: tokio::sync::OnceCell<Arc<dyn gcp_auth::TokenProvider>>,
}

impl AdcTokens {
    /// The standard lookup (environment variable, gcloud, metadata server).
    pub fn discover() -> Self {
        Self {
            file: None,
            provider: tokio::sync::OnceCell::new(),
        }
    }

    /// A service-account key file, whatever the environment says.
    pub fn service_account_file(path: PathBuf) -> Self {
        Self {
            file: Some(path),
            provider: tokio::sync::OnceCell::new(),
        }
    }
}

#[async_trait]
impl TokenSource for AdcTokens {
    async fn token(&self) -> Result<String, GcpError> {
        let provider = self
            .provider
            .get_or_try_init(|| async {
                match &self.file {
                    Some(path) => gcp_auth::CustomServiceAccount::from_file(path)
                        .map(|sa| Arc::new(sa) as Arc<dyn gcp_auth::TokenProvider>),
                    None => gcp_auth::provider().await,
                }
            })
            .await
            .map_err(credentials)?;
        let token = provider.token(&[SCOPE]).await.map_err(credentials)?;
        Ok(token.as_str().to_owned())
    }
}

/// gcp_auth's error with its causes (its own message alone says little).
fn credentials(e: gcp_auth::Error) -> GcpError {
    let mut message = e.to_string();
    let mut source = std::error::Error::source(&e);
    while let Some(cause) = source {
        message.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    GcpError::Credentials(message)
}

/// One page-merged `aggregatedList` answer.
#[derive(Debug, Clone, Default)]
pub struct Listed {
    pub instances: Vec<Value>,
    /// Zones the API could not read this time (partial success).
    pub unreachable: Vec<String>,
}

/// A Compute Engine API client for one project.
pub struct ComputeApi {
    http: reqwest::Client,
    root: Url,
    project: String,
    tokens: Arc<dyn TokenSource>,
    full_payloads: bool,
}

impl ComputeApi {
    pub fn new(
        http: reqwest::Client,
        root: Url,
        project: &str,
        tokens: Arc<dyn TokenSource>,
        full_payloads: bool,
    ) -> Self {
        Self {
            http,
            root,
            project: project.to_owned(),
            tokens,
            full_payloads,
        }
    }

    fn url(&self, path: &str) -> Result<Url, GcpError> {
        self.root
            .join(&format!("projects/{}/{path}", self.project))
            .map_err(|e| GcpError::Decode(format!("building a URL for {path}: {e}")))
    }

    /// Submits the insert; an instance of that name already existing (409) is success.
    pub async fn insert(&self, zone: &str, body: &Value) -> Result<(), GcpError> {
        let url = self.url(&format!("zones/{zone}/instances"))?;
        match self.call(Method::POST, url, Some(body)).await {
            Ok(_) => Ok(()),
            Err(GcpError::Api { status: 409, .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    pub async fn get(&self, zone: &str, name: &str) -> Result<Value, GcpError> {
        let url = self.url(&format!("zones/{zone}/instances/{name}"))?;
        self.call(Method::GET, url, None).await
    }

    /// Submits the delete (a 404 comes back as NotFound; the provider treats it as done).
    pub async fn delete(&self, zone: &str, name: &str) -> Result<(), GcpError> {
        let url = self.url(&format!("zones/{zone}/instances/{name}"))?;
        self.call(Method::DELETE, url, None).await.map(|_| ())
    }

    /// Replaces an instance's labels wholesale (`instances.setLabels`),
    /// guarded by `fingerprint`, the `labelFingerprint` read with the labels
    /// it is based on. Submits and returns, like insert and delete: the zone
    /// operation is not polled. A stale fingerprint comes back as HTTP 412
    /// ([`GcpError::is_stale_fingerprint`]), a vanished instance as 404.
    pub async fn set_labels(
        &self,
        zone: &str,
        name: &str,
        labels: &Map<String, Value>,
        fingerprint: &str,
    ) -> Result<(), GcpError> {
        let url = self.url(&format!("zones/{zone}/instances/{name}/setLabels"))?;
        let body = json!({"labels": labels, "labelFingerprint": fingerprint});
        self.call(Method::POST, url, Some(&body)).await.map(|_| ())
    }

    /// Every instance matching `filter` in every zone, all pages, with partial success.
    pub async fn aggregated_list(&self, filter: &str) -> Result<Listed, GcpError> {
        let mut listed = Listed::default();
        let mut page_token: Option<String> = None;
        loop {
            let mut url = self.url("aggregated/instances")?;
            {
                let mut q = url.query_pairs_mut();
                q.append_pair("filter", filter)
                    .append_pair("returnPartialSuccess", "true")
                    .append_pair("maxResults", PAGE_SIZE);
                if let Some(t) = &page_token {
                    q.append_pair("pageToken", t);
                }
            }
            let page = self.call(Method::GET, url, None).await?;
            if let Some(items) = page.get("items").and_then(Value::as_object) {
                for scoped in items.values() {
                    if let Some(instances) = scoped.get("instances").and_then(Value::as_array) {
                        listed.instances.extend(instances.iter().cloned());
                    }
                }
            }
            if let Some(unreachables) = page.get("unreachables").and_then(Value::as_array) {
                listed
                    .unreachable
                    .extend(unreachables.iter().filter_map(Value::as_str).map(str::to_owned));
            }
            match page.get("nextPageToken").and_then(Value::as_str) {
                Some(t) if !t.is_empty() => page_token = Some(t.to_owned()),
                _ => return Ok(listed),
            }
        }
    }

    /// One Compute API request, as an OpenTelemetry HTTP client span (named
    /// by its method, with `http.request.method`, `server.address`,
    /// `url.full`, `http.response.status_code`; status Error on a failure).
    async fn call(&self, method: Method, url: Url, body: Option<&Value>) -> Result<Value, GcpError> {
        let span = tracing::info_span!(
            "gcp.http", otel.name = %method, otel.kind = "client",
            http.request.method = %method, server.address = url.host_str().unwrap_or_default(),
            url.full = %url, http.response.status_code = Empty, error.type = Empty,
            otel.status_code = Empty, otel.status_description = Empty,
        );
        let result = self.exchange(method, url, body).instrument(span.clone()).await;
        match &result {
            Ok(_) => {}
            Err(e) => {
                let kind = match e {
                    GcpError::Api { status, .. } => {
                        span.record("http.response.status_code", status);
                        status.to_string()
                    }
                    GcpError::Credentials(_) => "credentials".to_owned(),
                    GcpError::Transport(_) => "transport".to_owned(),
                    GcpError::Decode(_) => "decode".to_owned(),
                };
                span.record("error.type", kind);
                span.record("otel.status_code", "error");
                span.record("otel.status_description", e.to_string());
            }
        }
        result
    }

    async fn exchange(&self, method: Method, url: Url, body: Option<&Value>) -> Result<Value, GcpError> {
        let token = self.tokens.token().await?;
        let mut auth = HeaderValue::from_str(&format!("Bearer {token}"))
            .map_err(|_| GcpError::Credentials("the access token is not a valid header value".into()))?;
        auth.set_sensitive(true);
        tracing::trace!(
            target: "egress_proxies::providers::gcp::wire",
            method = %method, url = %url,
            body = %body.map(|b| loggable(b, self.full_payloads).to_string()).unwrap_or_default(),
            "gcp request"
        );
        let started = Instant::now();
        let mut request = self
            .http
            .request(method.clone(), url.clone())
            .header(AUTHORIZATION, auth);
        if let Some(body) = body {
            request = request.json(body);
        }
        let response = request
            .send()
            .await
            .map_err(|e| GcpError::Transport(e.to_string()))?;
        let status = response.status().as_u16();
        let text = response
            .text()
            .await
            .map_err(|e| GcpError::Transport(e.to_string()))?;
        let value: Value = if text.trim().is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text)
                .map_err(|e| GcpError::Decode(format!("HTTP {status} with a body that is not JSON ({e})")))?
        };
        tracing::trace!(
            target: "egress_proxies::providers::gcp::wire",
            method = %method, url = %url, status, durationMs = started.elapsed().as_millis() as u64,
            body = %loggable(&value, self.full_payloads),
            "gcp response"
        );
        if (200..300).contains(&status) {
            tracing::Span::current().record("http.response.status_code", status);
            Ok(value)
        } else {
            Err(api_error(status, &value))
        }
    }
}

/// Google's error envelope: `{"error": {"code", "message", "status", "errors": [{"reason"}], "details": [{"reason"}]}}`.
fn api_error(status: u16, body: &Value) -> GcpError {
    let error = body.get("error");
    let message = error
        .and_then(|e| e.get("message"))
        .and_then(Value::as_str)
        .unwrap_or("no error message")
        .to_owned();
    let reasons = ["errors", "details"].into_iter().flat_map(|list| {
        error
            .and_then(|e| e.get(list))
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|item| item.get("reason").and_then(Value::as_str))
    });
    let all: Vec<&str> = reasons.collect();
    // The most telling reason: a quota one if any, else the first.
    let reason = all
        .iter()
        .find(|r| is_quota_reason(r))
        .or(all.first())
        .map(|r| (*r).to_owned())
        .or_else(|| {
            error
                .and_then(|e| e.get("status"))
                .and_then(Value::as_str)
                .map(str::to_owned)
        });
    GcpError::Api {
        status,
        reason,
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn err(status: u16, reason: &str) -> GcpError {
        api_error(
            status,
            &json!({"error": {"code": status, "message": "m", "errors": [{"reason": reason, "domain": "global"}]}}),
        )
    }

    #[test]
    fn status_codes_and_reasons_map_to_classes() {
        let cases = [
            (err(404, "notFound"), ErrorClass::NotFound),
            (err(403, "quotaExceeded"), ErrorClass::QuotaExceeded),
            (err(403, "rateLimitExceeded"), ErrorClass::QuotaExceeded),
            (err(403, "userRateLimitExceeded"), ErrorClass::QuotaExceeded),
            (err(429, "rateLimitExceeded"), ErrorClass::QuotaExceeded),
            (err(429, "tooManyRequests"), ErrorClass::Transient),
            (err(500, "backendError"), ErrorClass::Transient),
            (err(503, "unavailable"), ErrorClass::Transient),
            (err(400, "invalid"), ErrorClass::Permanent),
            (err(403, "forbidden"), ErrorClass::Permanent),
            (err(412, "conditionNotMet"), ErrorClass::Permanent),
            (err(401, "authError"), ErrorClass::Transient),
            (GcpError::Transport("reset".into()), ErrorClass::Transient),
            (GcpError::Credentials("none".into()), ErrorClass::Transient),
        ];
        for (e, class) in cases {
            assert_eq!(e.class(), class, "{e}");
        }
    }

    #[test]
    fn the_reason_comes_from_errors_details_or_status() {
        let details = api_error(
            429,
            &json!({"error": {"code": 429, "message": "Quota exceeded", "status": "RESOURCE_EXHAUSTED",
                "details": [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "RATE_LIMIT_EXCEEDED"}]}}),
        );
        assert_eq!(details.class(), ErrorClass::QuotaExceeded);
        assert_eq!(
            details.to_string(),
            "HTTP 429 (RATE_LIMIT_EXCEEDED): Quota exceeded"
        );
        let status_only = api_error(
            429,
            &json!({"error": {"code": 429, "message": "x", "status": "RESOURCE_EXHAUSTED"}}),
        );
        assert_eq!(status_only.class(), ErrorClass::QuotaExceeded);
        let bare = api_error(502, &Value::Null);
        assert_eq!(bare.to_string(), "HTTP 502: no error message");
        assert_eq!(bare.class(), ErrorClass::Transient);
    }
}
