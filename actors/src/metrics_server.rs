//! `GET /metrics`: the process's Prometheus metrics in the OpenMetrics text
//! format, on `--metrics-bind-address` (standalone: `metricsBindAddress`).
//! In Kubernetes mode it is served over HTTPS and only to a bearer token the
//! API server authenticates and authorizes for `get /metrics`
//! ([`MetricsAccess`]); `--metrics-secure=false` serves plain HTTP to anyone
//! who can reach the port.

use std::net::TcpListener;
use std::sync::Arc;

use actix_web::http::header;
use actix_web::{App, HttpRequest, HttpResponse, HttpServer, dev::Server, get, web};
use egress_proxies::file_limit;
use egress_proxies::listener_limits::{Listener, ListenerLimits};
use egress_proxies::metrics_access::{Decision, MetricsAccess};
use egress_proxies::telemetry::metrics::{CONTENT_TYPE, metrics};

/// Who may scrape: anyone, or whom the API server allows.
#[derive(Clone)]
pub enum Protection {
    Open,
    Kubernetes(Arc<MetricsAccess>),
}

#[get("/metrics")]
async fn scrape(req: HttpRequest, protection: web::Data<Protection>) -> HttpResponse {
    if let Protection::Kubernetes(access) = protection.get_ref() {
        let token = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim)
            .filter(|t| !t.is_empty());
        let Some(token) = token else {
            return HttpResponse::Unauthorized()
                .insert_header((header::WWW_AUTHENTICATE, "Bearer"))
                .body("a bearer token is required");
        };
        match access.check(token).await {
            Ok(Decision::Allowed(_)) => {}
            Ok(Decision::Unauthenticated) => {
                return HttpResponse::Unauthorized()
                    .insert_header((header::WWW_AUTHENTICATE, "Bearer"))
                    .body("the bearer token is not valid");
            }
            Ok(Decision::Forbidden(user)) => {
                tracing::debug!(%user, "metrics scrape refused: not allowed get /metrics");
                return HttpResponse::Forbidden().body(format!("{user} may not get /metrics"));
            }
            Err(e) => {
                tracing::warn!(error = %e, "metrics scrape: the token could not be reviewed");
                return HttpResponse::ServiceUnavailable().body("the token could not be reviewed; retry");
            }
        }
    }
    HttpResponse::Ok()
        .content_type(CONTENT_TYPE)
        .body(metrics().encode())
}

/// Serves the metrics on a bound listener, over TLS when `tls` is given,
/// within [`ListenerLimits`]; the server runs when awaited or spawned.
pub fn start(
    listener: TcpListener,
    protection: Protection,
    tls: Option<Arc<rustls::ServerConfig>>,
) -> std::io::Result<Server> {
    let protection = web::Data::new(protection);
    let limits = ListenerLimits::of(Listener::Metrics, file_limit::current());
    let server = HttpServer::new(move || App::new().app_data(protection.clone()).service(scrape))
        .workers(1)
        .max_connections(limits.per_worker(1))
        .client_request_timeout(limits.request_head_timeout)
        .keep_alive(limits.keep_alive)
        .client_disconnect_timeout(limits.disconnect_timeout)
        .tls_handshake_timeout(limits.tls_handshake_timeout)
        .disable_signals();
    Ok(match tls {
        Some(tls) => server.listen_rustls_0_23(listener, (*tls).clone())?,
        None => server.listen(listener)?,
    }
    .run())
}
