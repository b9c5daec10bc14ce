//! `/healthz` (the process is alive) and `/readyz` (it is doing its job).

use std::net::TcpListener;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use actix_web::{App, HttpResponse, HttpServer, dev::Server, get, web};

/// Whether the operator is ready (for standalone: started; with leader
/// election: leading).
#[derive(Clone, Default)]
pub struct Readiness(Arc<AtomicBool>);

impl Readiness {
    pub fn set(&self, ready: bool) {
        self.0.store(ready, Ordering::Relaxed);
    }

    pub fn get(&self) -> bool {
        self.0.load(Ordering::Relaxed)
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
