//! Bearer-token auth and panic containment for the discovery API.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use actix_web::body::{BoxBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::middleware::Next;
use actix_web::{Error, ResponseError};
use futures::FutureExt;
use subtle::ConstantTimeEq;

use super::errors::ApiError;

/// The token clients must present, if one is configured.
#[derive(Clone)]
pub struct Token(pub Option<Arc<String>>);

pub async fn authenticate(
    token: Token,
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<BoxBody>, Error> {
    if let Some(expected) = &token.0 {
        let bearer = req
            .headers()
            .get(actix_web::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::to_owned);
        // A browser cannot send a header when opening a page: the dashboard
        // page alone also takes `?token=` (its script then sends the header).
        let query = (req.path() == "/dashboard")
            .then(|| {
                url::form_urlencoded::parse(req.query_string().as_bytes())
                    .find(|(k, _)| k == "token")
                    .map(|(_, v)| v.into_owned())
            })
            .flatten();
        let presented = bearer.or(query).unwrap_or_default();
        // Constant time: the comparison must not reveal how much of a guess was right.
        let ok: bool = presented.as_bytes().ct_eq(expected.as_bytes()).into();
        if !ok {
            return Ok(req.into_response(ApiError::Unauthorized.error_response()));
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

/// One server span per request, named from the route (`POST /v1/leases`),
/// continuing the caller's trace when it sends a W3C `traceparent`.
pub async fn traced(
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<impl MessageBody>, Error> {
    use tracing::Instrument;
    use tracing::field::Empty;
    use tracing_opentelemetry::OpenTelemetrySpanExt;

    let method = req.method().clone();
    let route = super::routes::route_of(req.path()).unwrap_or("unmatched");
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
    }
    response
}
