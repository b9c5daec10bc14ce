//! The discovery API through a real server on loopback: every endpoint and
//! error, auth on and off, body cap, panics, and the capacity invariant
//! under hundreds of concurrent acquires.

mod support;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use actix::prelude::*;
use egress_proxies::lease::{Availability, LeaseSettings};
use egress_proxies::store::ObjectKey;
use egress_proxies_operator::discovery;
use egress_proxies_operator::lease_store::{GetLeaseStats, LeaseStore, ListProxies, UpdateAvailability};
use serde_json::{Value, json};
use support::http::request;

fn free_addr() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

fn availability(name: &str, ready: bool, geo: &str, latency_ms: u64) -> Availability {
    Availability {
        key: ObjectKey::new("crawl", name),
        ready,
        phase: if ready { "Ready" } else { "Unhealthy" }.into(),
        healthy: Some(ready),
        url: Some(format!("http://127.0.0.1:{}", 40000 + latency_ms)),
        attributes: BTreeMap::from([("geo".to_owned(), geo.to_owned())]),
        latency: Some(Duration::from_millis(latency_ms)),
    }
}

async fn serve(capacity: u32, token: Option<&str>) -> (SocketAddr, Addr<LeaseStore>) {
    let store = LeaseStore::new(LeaseSettings {
        capacity,
        ..LeaseSettings::default()
    })
    .start();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let server = discovery::start(listener, store.clone(), token.map(str::to_owned)).unwrap();
    actix::spawn(server);
    (addr, store)
}

fn body(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text:?}"))
}

#[actix_rt::test]
async fn list_acquire_report_release_and_their_errors() {
    let (addr, store) = serve(1, None).await;
    store.do_send(UpdateAvailability(availability("eu-1", true, "eu", 20)));
    store.do_send(UpdateAvailability(availability("eu-2", true, "eu", 10)));
    store.do_send(UpdateAvailability(availability("us-1", false, "us", 5)));

    let (status, text) = request(addr, "GET", "/v1/proxies", &[], None).await;
    assert_eq!(status, 200);
    let list = body(&text);
    assert_eq!(list.as_array().unwrap().len(), 3);
    assert_eq!(list[0]["name"], "eu-1");
    assert_eq!(list[0]["namespace"], "crawl");
    assert_eq!(list[0]["activeLeases"], 0);
    let (_, text) = request(addr, "GET", "/v1/proxies?attr=geo%3Deu&healthy=true", &[], None).await;
    let names: Vec<Value> = body(&text)
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].clone())
        .collect();
    assert_eq!(names, [json!("eu-1"), json!("eu-2")]);
    let (status, text) = request(addr, "GET", "/v1/proxies?healthy=maybe", &[], None).await;
    assert_eq!(
        (status, body(&text)["error"].clone()),
        (400, json!("invalid_request"))
    );

    let ask = r#"{"target":"shop.example","selector":{"geo":"eu"},"ttlSeconds":30,"client":"crawler-7"}"#;
    let (status, text) = request(addr, "POST", "/v1/leases", &[], Some(ask)).await;
    assert_eq!(status, 201, "{text}");
    let lease = body(&text);
    assert_eq!(lease["proxy"]["name"], "eu-2", "lowest latency first");
    assert_eq!(lease["proxy"]["url"], "http://127.0.0.1:40010");
    assert_eq!(lease["target"], "shop.example");
    let expires = lease["expiresAt"]
        .as_str()
        .unwrap()
        .parse::<jiff::Timestamp>()
        .unwrap();
    let left = expires.duration_since(jiff::Timestamp::now()).as_secs();
    assert!((25..=30).contains(&left), "{left}");
    let id = lease["id"].as_str().unwrap().to_owned();

    let (status, _) = request(addr, "POST", "/v1/leases", &[], Some(ask)).await;
    assert_eq!(status, 201, "eu-1 is still free");
    let (status, text) = request(addr, "POST", "/v1/leases", &[], Some(ask)).await;
    assert_eq!(status, 503);
    assert_eq!(body(&text)["error"], "no_capacity");

    let (status, _) = request(
        addr,
        "POST",
        &format!("/v1/leases/{id}/report"),
        &[],
        Some(r#"{"outcome":"blocked","detail":"captcha"}"#),
    )
    .await;
    assert_eq!(status, 204);
    let (status, text) = request(
        addr,
        "POST",
        &format!("/v1/leases/{id}/report"),
        &[],
        Some(r#"{"outcome":"great"}"#),
    )
    .await;
    assert_eq!(
        (status, body(&text)["error"].clone()),
        (400, json!("invalid_request"))
    );
    let (status, text) = request(
        addr,
        "POST",
        "/v1/leases/unknown/report",
        &[],
        Some(r#"{"outcome":"ok"}"#),
    )
    .await;
    assert_eq!(
        (status, body(&text)["error"].clone()),
        (404, json!("unknown_lease"))
    );

    for _ in 0..2 {
        let (status, text) = request(addr, "DELETE", &format!("/v1/leases/{id}"), &[], None).await;
        assert_eq!((status, text.as_str()), (204, ""), "release is idempotent");
    }
    let (status, _) = request(addr, "DELETE", "/v1/leases/never-existed", &[], None).await;
    assert_eq!(status, 204);

    for (bad, why) in [
        (r#"{"target":""}"#, "target must not be empty"),
        (
            r#"{"target":"x","ttlSeconds":0}"#,
            "ttlSeconds must be greater than zero",
        ),
        (r#"{"target":"x","surprise":1}"#, "unknown field"),
        (r#"{"target":"x""#, "EOF"),
    ] {
        let (status, text) = request(addr, "POST", "/v1/leases", &[], Some(bad)).await;
        let err = body(&text);
        assert_eq!(
            (status, err["error"].clone()),
            (400, json!("invalid_request")),
            "{bad}"
        );
        assert!(err["message"].as_str().unwrap().contains(why), "{bad}: {err}");
    }
    let (status, text) = request(addr, "GET", "/v1/nothing", &[], None).await;
    assert_eq!((status, body(&text)["error"].clone()), (404, json!("not_found")));
    let stats = store.send(GetLeaseStats).await.unwrap();
    assert_eq!((stats.granted, stats.denied, stats.active), (2, 1, 1));
}

#[actix_rt::test]
async fn bearer_auth_when_a_token_is_set() {
    let (addr, _) = serve(1, Some("s3cret-token")).await;
    let (status, text) = request(addr, "GET", "/v1/proxies", &[], None).await;
    assert_eq!(
        (status, body(&text)["error"].clone()),
        (401, json!("unauthorized"))
    );
    for wrong in [
        "Bearer s3cret-tokeX",
        "Bearer s3cret",
        "Basic s3cret-token",
        "Bearer s3cret-token-and-more",
    ] {
        let (status, _) = request(addr, "GET", "/v1/proxies", &[("Authorization", wrong)], None).await;
        assert_eq!(status, 401, "{wrong}");
    }
    let (status, _) = request(
        addr,
        "GET",
        "/v1/proxies",
        &[("Authorization", "Bearer s3cret-token")],
        None,
    )
    .await;
    assert_eq!(status, 200);
    let (status, _) = request(addr, "GET", "/healthz", &[], None).await;
    assert_eq!(status, 200, "/healthz is never authenticated");
    let (status, _) = request(addr, "GET", "/v1/openapi.json", &[], None).await;
    assert_eq!(status, 401);
}

#[actix_rt::test]
async fn without_a_token_everything_is_open() {
    let (addr, _) = serve(1, None).await;
    for path in ["/v1/proxies", "/healthz", "/v1/openapi.json"] {
        assert_eq!(request(addr, "GET", path, &[], None).await.0, 200, "{path}");
    }
}

#[actix_rt::test]
async fn oversize_bodies_are_refused() {
    let (addr, _) = serve(1, None).await;
    let big = format!(r#"{{"target":"{}"}}"#, "x".repeat(discovery::BODY_LIMIT + 10));
    let (status, text) = request(addr, "POST", "/v1/leases", &[], Some(&big)).await;
    assert_eq!(status, 413);
    assert_eq!(body(&text)["error"], "payload_too_large");
    let (status, _) = request(addr, "GET", "/v1/proxies", &[], None).await;
    assert_eq!(status, 200, "still serving");
}

#[actix_rt::test]
async fn a_panicking_handler_answers_500_and_the_server_lives_on() {
    let addr = free_addr();
    let server = actix_web::HttpServer::new(|| {
        actix_web::App::new()
            .service(
                discovery::guarded("/boom").route(actix_web::web::get().to(|| async {
                    if std::hint::black_box(true) {
                        panic!("handler bug");
                    }
                    actix_web::HttpResponse::Ok().finish()
                })),
            )
            .service(
                discovery::guarded("/fine")
                    .route(actix_web::web::get().to(|| async { actix_web::HttpResponse::Ok().finish() })),
            )
    })
    .workers(1)
    .disable_signals()
    .bind(addr)
    .unwrap()
    .run();
    actix::spawn(server);
    for _ in 0..3 {
        let (status, text) = request(addr, "GET", "/boom", &[], None).await;
        assert_eq!((status, body(&text)["error"].clone()), (500, json!("internal")));
    }
    assert_eq!(request(addr, "GET", "/fine", &[], None).await.0, 200);
}

#[actix_rt::test]
async fn concurrent_acquires_never_exceed_capacity() {
    let capacity = 3;
    let (addr, store) = serve(capacity, None).await;
    for i in 0..10 {
        store.do_send(UpdateAvailability(availability(&format!("p{i}"), true, "eu", i)));
    }
    let mut clients = Vec::new();
    for i in 0..300 {
        clients.push(tokio::spawn(async move {
            let ask = format!(r#"{{"target":"site-{}.example","ttlSeconds":60}}"#, i % 7);
            request(addr, "POST", "/v1/leases", &[], Some(&ask)).await
        }));
    }
    let mut granted = 0;
    let mut per_proxy: BTreeMap<String, u32> = BTreeMap::new();
    for c in clients {
        let (status, text) = c.await.unwrap();
        match status {
            201 => {
                granted += 1;
                *per_proxy
                    .entry(body(&text)["proxy"]["name"].as_str().unwrap().to_owned())
                    .or_default() += 1;
            }
            503 => assert_eq!(body(&text)["error"], "no_capacity"),
            other => panic!("unexpected {other}: {text}"),
        }
    }
    assert_eq!(granted, 30, "10 proxies × capacity 3, all handed out");
    assert!(per_proxy.values().all(|n| *n <= capacity), "{per_proxy:?}");
    let views = store.send(ListProxies).await.unwrap();
    assert!(
        views.iter().all(|v| v.active_leases == capacity),
        "store agrees: {views:?}"
    );
    assert_eq!(store.send(GetLeaseStats).await.unwrap().active, 30);
}

#[test]
fn the_openapi_document_describes_every_endpoint() {
    let doc: Value = serde_json::from_str(&discovery::openapi_json()).unwrap();
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    for (path, method) in [
        ("/v1/proxies", "get"),
        ("/v1/leases", "post"),
        ("/v1/leases/{id}", "delete"),
        ("/v1/leases/{id}/report", "post"),
        ("/healthz", "get"),
    ] {
        assert!(doc["paths"][path][method].is_object(), "{method} {path} missing");
    }
    assert!(doc["paths"]["/v1/leases"]["post"]["responses"]["503"].is_object());
    for schema in ["LeaseRequest", "Lease", "ProxyInfo", "LeaseReport", "ErrorBody"] {
        assert!(doc["components"]["schemas"][schema].is_object(), "{schema}");
    }
    assert_eq!(doc["components"]["securitySchemes"]["bearer"]["scheme"], "bearer");
}
