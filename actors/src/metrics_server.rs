//! `GET /metrics`: the process's Prometheus metrics in the OpenMetrics text
//! format, on `--metrics-bind-address` (standalone: `metricsBindAddress`).

use std::net::TcpListener;

use actix_web::{App, HttpResponse, HttpServer, dev::Server, get};
use egress_proxies::telemetry::metrics::{CONTENT_TYPE, metrics};

#[get("/metrics")]
async fn scrape() -> HttpResponse {
    HttpResponse::Ok()
        .content_type(CONTENT_TYPE)
        .body(metrics().encode())
}

/// Serves the metrics on a bound listener; the server runs when awaited or spawned.
pub fn start(listener: TcpListener) -> std::io::Result<Server> {
    Ok(HttpServer::new(|| App::new().service(scrape))
        .workers(1)
        .disable_signals()
        .listen(listener)?
        .run())
}
