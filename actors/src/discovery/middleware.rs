//! Bearer-token auth and panic containment for the discovery API.

use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use std::sync::Arc;

use actix_web::body::{BoxBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::middleware::Next;
use actix_web::{Error, HttpMessage, ResponseError};
use egress_proxies::adapters::stores::crawler_tokens::{CrawlerTokensError, TokenSources};
use egress_proxies::domain::identity::{ANONYMOUS_IDENTITY, Identities, SharedIdentities};
use futures::FutureExt;
use subtle::ConstantTimeEq;

use super::errors::ApiError;

/// The bearer tokens of the API: a crawler identity's token (one of the
/// tokens directory's, or `DISCOVERY_TOKEN`, identity `default`) may do
/// everything as that identity, the read-only token
/// (`DISCOVERY_READ_TOKEN`) only `GET`s — list proxies, the dashboard's
/// data, the OpenAPI document. No tokens: open, everyone `anonymous`.
#[derive(Clone, Default)]
pub struct Tokens {
    identities: SharedIdentities,
    reader: Option<Arc<String>>,
}

#[derive(Debug, thiserror::Error)]
pub enum TokensError {
    #[error("DISCOVERY_READ_TOKEN is set without a crawler token: leases would need no token at all")]
    ReaderWithoutCrawler,
    #[error("DISCOVERY_READ_TOKEN equals DISCOVERY_TOKEN: the read-only token would lease too")]
    Same,
    #[error(transparent)]
    Identities(#[from] CrawlerTokensError),
}

/// The identity a request authenticated as (a request extension; absent
/// for the read-only token).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity(pub String);

impl Tokens {
    /// No authentication (tests, and a standalone operator on loopback).
    pub fn open() -> Self {
        Self::default()
    }

    /// `DISCOVERY_TOKEN` (`crawler`, identity `default`) and
    /// `DISCOVERY_READ_TOKEN`, without a tokens directory.
    pub fn new(crawler: Option<String>, reader: Option<String>) -> Result<Self, TokensError> {
        Self::load(TokenSources {
            dir: None,
            legacy: crawler,
            reader,
        })
    }

    /// The tokens of `sources`, kept current from the tokens directory
    /// (see [`egress_proxies::adapters::stores::crawler_tokens`]).
    pub fn load(sources: TokenSources) -> Result<Self, TokensError> {
        let set = |t: Option<String>| t.filter(|t| !t.is_empty());
        let sources = TokenSources {
            legacy: set(sources.legacy),
            reader: set(sources.reader),
            ..sources
        };
        if sources.reader.is_some() && sources.legacy.is_none() && sources.dir.is_none() {
            return Err(TokensError::ReaderWithoutCrawler);
        }
        if sources.reader.is_some() && sources.reader == sources.legacy {
            return Err(TokensError::Same);
        }
        let reader = sources.reader.clone().map(Arc::new);
        let identities = if sources.dir.is_some() {
            sources.watch()?
        } else {
            SharedIdentities::new(sources.load()?)
        };
        Ok(Self { identities, reader })
    }

    /// `DISCOVERY_TOKEN`, `DISCOVERY_READ_TOKEN` and the tokens directory
    /// `dir` (`--crawler-tokens-dir`, `crawlerTokensDir:`), if any.
    pub fn from_env(dir: Option<PathBuf>) -> Result<Self, TokensError> {
        Self::load(TokenSources {
            dir,
            legacy: std::env::var("DISCOVERY_TOKEN").ok(),
            reader: std::env::var("DISCOVERY_READ_TOKEN").ok(),
        })
    }

    /// Only `DISCOVERY_TOKEN` (identity `default`).
    pub fn crawler(token: Option<String>) -> Self {
        let token = token.filter(|t| !t.is_empty());
        // Without files there is nothing to refuse.
        let identities = Identities::build(Vec::new(), token.as_deref(), None, false).unwrap_or_default();
        Self {
            identities: SharedIdentities::new(identities),
            reader: None,
        }
    }

    /// Whether no crawler token is demanded (and none is configured).
    pub fn is_open(&self) -> bool {
        self.identities.current().is_open()
    }

    /// The crawler identities (the gateway takes their tokens as proxy passwords).
    pub fn identities(&self) -> SharedIdentities {
        self.identities.clone()
    }
}

/// Constant time: a comparison must not reveal how much of a guess was right.
fn matches(presented: &str, expected: Option<&Arc<String>>) -> bool {
    expected.is_some_and(|e| bool::from(presented.as_bytes().ct_eq(e.as_bytes())))
}

/// Lets a request through as the identity its bearer token proves (a
/// request extension, [`Identity`]), or as the read-only token for a
/// `GET`; refuses it otherwise.
pub async fn authenticate(
    tokens: Tokens,
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<BoxBody>, Error> {
    let identities = tokens.identities.current();
    if identities.is_open() {
        req.extensions_mut()
            .insert(Identity(ANONYMOUS_IDENTITY.to_owned()));
    } else {
        let presented = req
            .headers()
            .get(actix_web::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or_default();
        let reading = req.method() == actix_web::http::Method::GET;
        if matches(presented, tokens.reader.as_ref()) {
            if !reading {
                return Ok(req.into_response(ApiError::ReadOnlyToken.error_response()));
            }
        } else {
            let Some(identity) = identities.identify(presented.as_bytes()) else {
                return Ok(req.into_response(ApiError::Unauthorized.error_response()));
            };
            req.extensions_mut().insert(Identity(identity.to_owned()));
        }
    }
    next.call(req).await.map(ServiceResponse::map_into_boxed_body)
}

/// A panicking handler answers 500 and the server keeps serving.
pub async fn contain_panics(
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<BoxBody>, Error> {
    let http = req.request().clone();
    match AssertUnwindSafe(next.call(req)).catch_unwind().await {
        Ok(result) => result.map(ServiceResponse::map_into_boxed_body),
        Err(_) => {
            tracing::error!(path = %http.path(), "discovery API handler panicked");
            let response = ApiError::Internal("internal error".into()).error_response();
            Ok(ServiceResponse::new(http, response))
        }
    }
}

/// Request headers as an OpenTelemetry carrier (for `traceparent`).
struct Headers<'a>(&'a actix_web::http::header::HeaderMap);

impl opentelemetry::propagation::Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}

/// How loud a request's access line is: answers a crawler expects in
/// normal work (a grant, no capacity right now, a lease already gone, a
/// retiring proxy) at DEBUG, a client's mistake at INFO, the server's own
/// trouble at WARN.
pub fn access_level(status: u16, code: Option<&str>) -> tracing::Level {
    match (status, code) {
        (..400, _) => tracing::Level::DEBUG,
        (_, Some("no_capacity" | "unknown_lease" | "proxy_retiring")) => tracing::Level::DEBUG,
        (_, Some("not_leader")) => tracing::Level::INFO,
        (500.., _) => tracing::Level::WARN,
        _ => tracing::Level::INFO,
    }
}

/// The access line of one request: method, route (never the path with its
/// lease id, never a header), status, error code, duration, client address.
fn access_line(
    method: &str,
    route: &str,
    status: u16,
    code: Option<&str>,
    took: std::time::Duration,
    client: &str,
) {
    let duration_ms = took.as_secs_f64() * 1000.0;
    let code = code.unwrap_or("");
    macro_rules! line {
        ($level:expr) => {
            tracing::event!(target: "egress_proxies_operator::access", $level,
                method, route, status, code, duration_ms, client, "request")
        };
    }
    match access_level(status, Some(code).filter(|c| !c.is_empty())) {
        tracing::Level::WARN => line!(tracing::Level::WARN),
        tracing::Level::INFO => line!(tracing::Level::INFO),
        _ => line!(tracing::Level::DEBUG),
    }
}

/// One server span per request, named from the route (`POST /v1/leases`),
/// continuing the caller's trace when it sends a W3C `traceparent`; and
/// its access line.
pub async fn traced(
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<impl MessageBody>, Error> {
    use tracing::Instrument;
    use tracing::field::Empty;
    use tracing_opentelemetry::OpenTelemetrySpanExt;

    let started = std::time::Instant::now();
    let client = req.peer_addr().map(|a| a.ip().to_string()).unwrap_or_default();
    let method = req.method().clone();
    let route = egress_proxies::adapters::discovery_api::routes::route_of(req.path()).unwrap_or("unmatched");
    let parent = opentelemetry::global::get_text_map_propagator(|p| p.extract(&Headers(req.headers())));
    let span = tracing::info_span!(
        parent: None, "HTTP request", otel.name = %format!("{method} {route}"), otel.kind = "server",
        http.request.method = %method, http.route = %route, http.response.status_code = Empty,
        otel.status_code = Empty, traceID = Empty, spanID = Empty,
    );
    let _ = span.set_parent(parent);
    egress_proxies::telemetry::otel::record_ids(&span);
    let response = next.call(req).instrument(span.clone()).await;
    if let Ok(r) = &response {
        span.record("http.response.status_code", r.status().as_u16());
        if r.status().is_server_error() {
            span.record("otel.status_code", "error");
        }
        let code = r
            .response()
            .extensions()
            .get::<super::errors::ErrorCode>()
            .map(|c| c.0);
        let _in_span = span.enter();
        access_line(
            method.as_str(),
            route,
            r.status().as_u16(),
            code,
            started.elapsed(),
            &client,
        );
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expected_answers_are_quiet_mistakes_heard_and_trouble_loud() {
        use tracing::Level;
        assert_eq!(access_level(201, None), Level::DEBUG);
        assert_eq!(access_level(204, None), Level::DEBUG);
        assert_eq!(access_level(503, Some("no_capacity")), Level::DEBUG);
        assert_eq!(access_level(404, Some("unknown_lease")), Level::DEBUG);
        assert_eq!(access_level(409, Some("proxy_retiring")), Level::DEBUG);
        assert_eq!(access_level(400, Some("invalid_request")), Level::INFO);
        assert_eq!(access_level(401, Some("unauthorized")), Level::INFO);
        assert_eq!(access_level(503, Some("not_leader")), Level::INFO);
        assert_eq!(access_level(503, Some("unavailable")), Level::WARN);
        assert_eq!(access_level(500, Some("internal")), Level::WARN);
    }

    #[test]
    fn a_read_token_needs_a_different_crawler_token() {
        assert!(Tokens::new(None, None).unwrap().is_open());
        assert!(
            Tokens::new(Some(String::new()), None).unwrap().is_open(),
            "empty is unset"
        );
        assert!(!Tokens::new(Some("c".into()), Some("r".into())).unwrap().is_open());
        assert!(matches!(
            Tokens::new(None, Some("r".into())).err(),
            Some(TokensError::ReaderWithoutCrawler)
        ));
        assert!(matches!(
            Tokens::new(Some("t".into()), Some("t".into())).err(),
            Some(TokensError::Same)
        ));
    }
}
