//! `/healthz` (the process is alive) and `/readyz` (it is doing its job).

use std::net::TcpListener;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use actix_web::{App, HttpResponse, HttpServer, dev::Server, get, web};
use egress_proxies::leader::Tenure;

/// Whether the operator is ready (for standalone: started; with leader
/// election: leading, checked against the tenure at each request so it
/// turns unready at the very instant the leader must stop).
#[derive(Clone, Default)]
pub struct Readiness {
    ready: Arc<AtomicBool>,
    tenure: Option<Tenure>,
}

impl Readiness {
    /// Ready only while set and `tenure` lasts.
    pub fn bounded_by(tenure: Tenure) -> Self {
        Self {
            ready: Arc::default(),
            tenure: Some(tenure),
        }
    }

    pub fn set(&self, ready: bool) {
        self.ready.store(ready, Ordering::Relaxed);
    }

    pub fn get(&self) -> bool {
        self.ready.load(Ordering::Relaxed) && self.tenure.as_ref().is_none_or(Tenure::is_leading)
    }
}

#[get("/healthz")]
async fn healthz() -> HttpResponse {
    HttpResponse::Ok().body("ok")
}

#[get("/readyz")]
async fn readyz(ready: web::Data<Readiness>) -> HttpResponse {
    if ready.get() {
        HttpResponse::Ok().body("ok")
    } else {
        HttpResponse::ServiceUnavailable().body("not ready")
    }
}

/// Serves the probes on a bound listener; the server runs when awaited or spawned.
pub fn start(listener: TcpListener, readiness: Readiness) -> std::io::Result<Server> {
    let data = web::Data::new(readiness);
    Ok(
        HttpServer::new(move || App::new().app_data(data.clone()).service(healthz).service(readyz))
            .workers(1)
            .disable_signals()
            .listen(listener)?
            .run(),
    )
}
