//! `/healthz` (the process is alive) and `/readyz` (it is doing its job).

use std::net::TcpListener;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use actix_web::{App, HttpResponse, HttpServer, dev::Server, get, web};
use egress_proxies::adapters::leader::Tenure;
use egress_proxies::file_limit;
use egress_proxies::listener_limits::{Listener, ListenerLimits};

/// Whether the operator is ready (for standalone: started; with leader
/// election: leading, checked against the tenure at each request so it
/// turns unready at the very instant the leader must stop).
#[derive(Clone, Default)]
pub struct Readiness {
    ready: Arc<AtomicBool>,
    tenure: Option<Tenure>,
    /// Asked at each request as well (every replica serving: whether this
    /// replica holds a valid capacity share).
    serving: Option<Arc<dyn Fn() -> bool + Send + Sync>>,
}

impl Readiness {
    /// Ready only while set and `tenure` lasts.
    pub fn bounded_by(tenure: Tenure) -> Self {
        Self {
            ready: Arc::default(),
            tenure: Some(tenure),
            serving: None,
        }
    }

    /// Ready only while set and `serving` says so.
    pub fn serving(serving: impl Fn() -> bool + Send + Sync + 'static) -> Self {
        Self {
            ready: Arc::default(),
            tenure: None,
            serving: Some(Arc::new(serving)),
        }
    }

    pub fn set(&self, ready: bool) {
        self.ready.store(ready, Ordering::Relaxed);
    }

    pub fn get(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
            && self.tenure.as_ref().is_none_or(Tenure::is_leading)
            && self.serving.as_ref().is_none_or(|serving| serving())
    }
}

/// Alive: every singleton actor (registry, prober, lease store, GC, image
/// cache) has beaten recently and none keeps crashing. One that is silent is
/// dead or wedged, one that crashes again and again does not recover by
/// in-process restarts: either way the process should be restarted.
#[get("/healthz")]
async fn healthz() -> HttpResponse {
    let silent = crate::supervision::silent(crate::supervision::HEARTBEAT_DEADLINE);
    let looping = crate::supervision::crash_looping();
    if silent.is_empty() && looping.is_empty() {
        return HttpResponse::Ok().body("ok");
    }
    let which: Vec<String> = silent
        .iter()
        .map(|(kind, quiet)| format!("{kind} silent for {}s", quiet.as_secs()))
        .chain(looping.iter().map(|(kind, restarts)| {
            format!(
                "{kind} restarted {restarts} times in {}s",
                crate::supervision::RESTART_WINDOW.as_secs()
            )
        }))
        .collect();
    tracing::error!(actors = ?which, "/healthz: actors stopped beating");
    HttpResponse::ServiceUnavailable().body(format!("unhealthy: {}", which.join(", ")))
}

#[get("/readyz")]
async fn readyz(ready: web::Data<Readiness>) -> HttpResponse {
    if ready.get() {
        HttpResponse::Ok().body("ok")
    } else {
        HttpResponse::ServiceUnavailable().body("not ready")
    }
}

/// Serves the probes on a bound listener, within [`ListenerLimits`]; the
/// server runs when awaited or spawned.
pub fn start(listener: TcpListener, readiness: Readiness) -> std::io::Result<Server> {
    let data = web::Data::new(readiness);
    let limits = ListenerLimits::of(Listener::Health, file_limit::current());
    Ok(
        HttpServer::new(move || App::new().app_data(data.clone()).service(healthz).service(readyz))
            .workers(1)
            .max_connections(limits.per_worker(1))
            .client_request_timeout(limits.request_head_timeout)
            .keep_alive(limits.keep_alive)
            .client_disconnect_timeout(limits.disconnect_timeout)
            .disable_signals()
            .listen(listener)?
            .run(),
    )
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use actix_web::test;

    use super::*;
    use crate::supervision::{
        CRASH_LOOP, HEARTBEAT_DEADLINE, Node, heartbeat, heartbeat_at, record_restart, register,
        stop_beating, unregister,
    };

    #[actix_web::test]
    async fn healthz_turns_unhealthy_when_a_singleton_stops_beating() {
        let _turn = crate::supervision::HEALTH_TESTS.lock().await;
        let app = test::init_service(App::new().service(healthz)).await;
        heartbeat("test_singleton");
        let ok = test::call_service(&app, test::TestRequest::get().uri("/healthz").to_request()).await;
        assert_eq!(ok.status(), 200);

        // Its thread stuck (or its task dead) for longer than the deadline.
        heartbeat_at(
            "test_singleton",
            Instant::now() - HEARTBEAT_DEADLINE - Duration::from_secs(5),
        );
        let sick = test::call_service(&app, test::TestRequest::get().uri("/healthz").to_request()).await;
        assert_eq!(sick.status(), 503);
        let body = test::read_body(sick).await;
        let body = String::from_utf8_lossy(&body);
        assert!(body.contains("test_singleton silent for 35s"), "{body}");

        // Stopped on purpose (shutdown): no longer expected.
        stop_beating("test_singleton");
        let ok = test::call_service(&app, test::TestRequest::get().uri("/healthz").to_request()).await;
        assert_eq!(ok.status(), 200);
    }

    #[actix_web::test]
    async fn healthz_turns_unhealthy_while_a_vital_actor_keeps_crashing() {
        let _turn = crate::supervision::HEALTH_TESTS.lock().await;
        let app = test::init_service(App::new().service(healthz)).await;
        let vital = Node::singleton("test_crasher");
        let member = Node::member("test_member", "one", "system");
        register(&vital);
        register(&member);
        for _ in 0..CRASH_LOOP {
            record_restart(&member);
        }
        let ok = test::call_service(&app, test::TestRequest::get().uri("/healthz").to_request()).await;
        assert_eq!(
            ok.status(),
            200,
            "one proxy or host crashing is not the process's illness"
        );

        for _ in 0..CRASH_LOOP - 1 {
            record_restart(&vital);
        }
        let ok = test::call_service(&app, test::TestRequest::get().uri("/healthz").to_request()).await;
        assert_eq!(ok.status(), 200, "a few restarts are what supervisors are for");
        record_restart(&vital);
        let sick = test::call_service(&app, test::TestRequest::get().uri("/healthz").to_request()).await;
        assert_eq!(sick.status(), 503);
        let body = test::read_body(sick).await;
        assert!(
            String::from_utf8_lossy(&body).contains("test_crasher restarted 5 times in 60s"),
            "{body:?}"
        );
        unregister(&vital);
        unregister(&member);
    }
}
