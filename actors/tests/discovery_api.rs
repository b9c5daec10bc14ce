//! The discovery API through a real server on loopback: every endpoint and
//! error, auth on and off, body cap, panics, and the capacity invariant
//! under hundreds of concurrent acquires.

mod support;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use actix::prelude::*;
use egress_proxies::adapters::lease_store::LeaseStore;
use egress_proxies::domain::credentials::ProxyCredentials;
use egress_proxies::domain::lease::{Availability, LeaseSettings};
use egress_proxies::domain::resource::ObjectKey;
use egress_proxies_operator::discovery;
use egress_proxies_operator::lease_store_actor::{
    GetLeaseStats, LeaseStoreActor, ListProxies, UpdateAvailability,
};
use serde_json::{Value, json};
use support::http::{request, request_from};

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
        credentials: Some(credentials(name)),
        realm: None,
        retiring: false,
    }
}

fn credentials(name: &str) -> ProxyCredentials {
    ProxyCredentials::new(&format!("user-{name}"), &format!("pw-{name}-s3cret")).unwrap()
}

async fn serve(capacity: u32, token: Option<&str>) -> (SocketAddr, Addr<LeaseStoreActor>) {
    let store = LeaseStoreActor::new(LeaseStore::new(LeaseSettings {
        capacity,
        ..LeaseSettings::default()
    }))
    .start();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let server = discovery::start(
        listener,
        store.clone(),
        discovery::Tokens::crawler(token.map(str::to_owned)),
    )
    .unwrap();
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
    assert!(
        !text.contains("s3cret") && !text.contains("user-"),
        "the listing carries no credentials: {text}"
    );
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
    assert_eq!(
        lease["proxy"]["url"], "http://user-eu-2:pw-eu-2-s3cret@127.0.0.1:40010",
        "the lease's URL carries the credentials as user-info"
    );
    assert_eq!(lease["proxy"]["username"], "user-eu-2");
    assert_eq!(lease["proxy"]["password"], "pw-eu-2-s3cret");
    let (_, listed) = request(addr, "GET", "/v1/proxies", &[], None).await;
    assert!(
        !listed.contains("s3cret"),
        "leased or not, the listing carries no credentials: {listed}"
    );
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
            "ttlSeconds must be between 1 and 86400 (got 0)",
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
                discovery::guarded("/boom", "GET").route(actix_web::web::get().to(|| async {
                    if std::hint::black_box(true) {
                        panic!("handler bug");
                    }
                    actix_web::HttpResponse::Ok().finish()
                })),
            )
            .service(
                discovery::guarded("/fine", "GET")
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
    let doc: Value = serde_json::from_str(&egress_proxies::adapters::discovery_api::openapi_json()).unwrap();
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    for (path, method) in [
        ("/v1/proxies", "get"),
        ("/v1/leases", "post"),
        ("/v1/leases/{id}", "delete"),
        ("/v1/leases/{id}/report", "post"),
        ("/v1/leases/{id}/renew", "post"),
        ("/healthz", "get"),
    ] {
        let op = &doc["paths"][path][method];
        assert!(op.is_object(), "{method} {path} missing");
        assert!(
            op["responses"]["405"]["headers"]["Allow"].is_object(),
            "{method} {path}: 405"
        );
        if path != "/healthz" {
            assert!(
                op["responses"]["429"]["headers"]["Retry-After"].is_object(),
                "{method} {path}: 429"
            );
        }
    }
    // The bounds the server enforces, stated from the same constants.
    use egress_proxies::domain::lease::input;
    let target = &doc["components"]["schemas"]["LeaseRequest"]["properties"]["target"];
    assert_eq!(target["pattern"], json!(input::target_pattern()));
    assert_eq!(
        (target["minLength"].clone(), target["maxLength"].clone()),
        (json!(1), json!(253))
    );
    assert_eq!(
        doc["components"]["schemas"]["LeaseReport"]["properties"]["detail"]["maxLength"],
        1024
    );
    assert_eq!(
        doc["components"]["schemas"]["LeaseRequest"]["properties"]["selector"]["maxProperties"],
        16
    );
    assert_eq!(
        doc["components"]["schemas"]["RenewRequest"]["properties"]["ttlSeconds"]["maximum"],
        86400
    );
    assert_eq!(
        doc["paths"]["/v1/leases/{id}/renew"]["post"]["requestBody"]["required"],
        false
    );
    assert_eq!(
        doc["paths"]["/v1/proxies"]["get"]["parameters"][0]["schema"]["items"]["pattern"],
        json!(input::attr_filter_pattern())
    );
    assert!(doc["paths"]["/v1/leases"]["post"]["responses"]["503"].is_object());
    for schema in ["LeaseRequest", "Lease", "ProxyInfo", "LeaseReport", "ErrorBody"] {
        assert!(doc["components"]["schemas"][schema].is_object(), "{schema}");
    }
    assert_eq!(doc["components"]["securitySchemes"]["bearer"]["scheme"], "bearer");
}

#[actix_rt::test]
async fn renew_extends_a_held_lease_and_404s_otherwise() {
    let (addr, store) = serve(1, None).await;
    store.do_send(UpdateAvailability(availability("eu-1", true, "eu", 10)));
    let (status, text) = request(
        addr,
        "POST",
        "/v1/leases",
        &[],
        Some(r#"{"target":"Shop.Example","ttlSeconds":30}"#),
    )
    .await;
    assert_eq!(status, 201, "{text}");
    let lease = body(&text);
    assert_eq!(
        lease["target"], "shop.example",
        "host names are compared in lower case"
    );
    let id = lease["id"].as_str().unwrap().to_owned();
    let renew = format!("/v1/leases/{id}/renew");

    let left = |v: &Value| {
        v["expiresAt"]
            .as_str()
            .unwrap()
            .parse::<jiff::Timestamp>()
            .unwrap()
            .duration_since(jiff::Timestamp::now())
            .as_secs()
    };
    // No body: the lease's own TTL, from now.
    let (status, text) = request(addr, "POST", &renew, &[], None).await;
    assert_eq!(status, 200, "{text}");
    let renewed = body(&text);
    assert_eq!(
        (renewed["id"].as_str(), renewed["ttlSeconds"].as_u64()),
        (Some(id.as_str()), Some(30))
    );
    assert!((28..=30).contains(&left(&renewed)), "{renewed}");
    // A TTL over the server's maximum (600 s here) is capped; `120.0` is a whole number too.
    for (ask, applied) in [(r#"{"ttlSeconds":86400}"#, 600), (r#"{"ttlSeconds":120.0}"#, 120)] {
        let (status, text) = request(addr, "POST", &renew, &[], Some(ask)).await;
        assert_eq!(
            (status, body(&text)["ttlSeconds"].as_u64()),
            (200, Some(applied)),
            "{ask}"
        );
    }
    for (bad, why) in [
        (r#"{"ttlSeconds":0}"#, "ttlSeconds must be between 1 and 86400"),
        (
            r#"{"ttlSeconds":86401}"#,
            "ttlSeconds must be between 1 and 86400",
        ),
        (r#"{"ttlSeconds":1.5}"#, "not a whole number"),
        (r#"{"ttlSeconds":-3}"#, "negative"),
        (r#"{"ttl":5}"#, "unknown field"),
        ("[]", "expected a map"),
        ("null", "expected a map"),
        (r#"{"ttlSeconds":5"#, "EOF"),
    ] {
        let (status, text) = request(addr, "POST", &renew, &[], Some(bad)).await;
        let err = body(&text);
        assert_eq!(
            (status, err["error"].clone()),
            (400, json!("invalid_request")),
            "{bad}"
        );
        assert!(err["message"].as_str().unwrap().contains(why), "{bad}: {err}");
    }
    let (status, _) = request(addr, "POST", "/v1/leases/never-existed/renew", &[], None).await;
    assert_eq!(status, 404);
    request(addr, "DELETE", &format!("/v1/leases/{id}"), &[], None).await;
    let (status, text) = request(addr, "POST", &renew, &[], None).await;
    assert_eq!(
        (status, body(&text)["error"].clone()),
        (404, json!("unknown_lease")),
        "ended"
    );
    assert_eq!(store.send(GetLeaseStats).await.unwrap().active, 0);
}

#[actix_rt::test]
async fn wrong_methods_answer_405_with_allow() {
    let (addr, _) = serve(1, None).await;
    let loopback: std::net::IpAddr = "127.0.0.1".parse().unwrap();
    for (method, path, allow) in [
        ("GET", "/v1/leases", "POST"),
        ("PUT", "/v1/proxies", "GET"),
        ("POST", "/v1/leases/abc", "DELETE"),
        ("GET", "/v1/leases/abc/report", "POST"),
        ("DELETE", "/v1/leases/abc/renew", "POST"),
        ("OPTIONS", "/v1/openapi.json", "GET"),
        ("POST", "/healthz", "GET"),
        ("PATCH", "/v1/dashboard", "GET"),
    ] {
        let r = request_from(loopback, addr, method, path, None).await;
        assert_eq!(
            (r.status, r.header("allow")),
            (405, Some(allow)),
            "{method} {path}: {}",
            r.body
        );
        assert_eq!(body(&r.body)["error"], "method_not_allowed", "{method} {path}");
    }
    let (status, text) = request(addr, "GET", "/v1/nothing", &[], None).await;
    assert_eq!((status, body(&text)["error"].clone()), (404, json!("not_found")));
}

#[actix_rt::test]
async fn every_bound_is_a_400_naming_the_field() {
    let (addr, store) = serve(0, None).await;
    store.do_send(UpdateAvailability(availability("eu-1", true, "eu", 10)));
    let long_key = "k".repeat(129);
    let many: BTreeMap<String, String> = (0..17).map(|i| (format!("k{i}"), "v".to_owned())).collect();
    let asks = [
        (json!({"target": "shop.example:443"}), "no port"),
        (json!({"target": "https://shop.example/"}), "neither a host name"),
        (
            json!({"target": format!("{}.example", "a".repeat(250))}),
            "at most 253",
        ),
        (json!({"target": "x", "selector": many}), "selector has 17 pairs"),
        (
            json!({"target": "x", "selector": {long_key.clone(): "v"}}),
            "selector key must be 1 to 128",
        ),
        (
            json!({"target": "x", "selector": {"geo": "v".repeat(257)}}),
            "at most 256",
        ),
        (
            json!({"target": "x", "client": "c".repeat(129)}),
            "client is 129 characters",
        ),
        (
            json!({"target": "x", "ttlSeconds": 86401}),
            "ttlSeconds must be between 1 and 86400",
        ),
        (json!(["x"]), "expected a map"),
    ];
    for (ask, why) in asks {
        let (status, text) = request(addr, "POST", "/v1/leases", &[], Some(&ask.to_string())).await;
        let err = body(&text);
        assert_eq!(
            (status, err["error"].clone()),
            (400, json!("invalid_request")),
            "{ask}"
        );
        assert!(err["message"].as_str().unwrap().contains(why), "{ask}: {err}");
    }
    let (_, text) = request(
        addr,
        "POST",
        "/v1/leases",
        &[],
        Some(r#"{"target":"2001:DB8::0:1"}"#),
    )
    .await;
    assert_eq!(body(&text)["target"], "2001:db8::1", "IPv6 in its canonical form");
    let id = body(&text)["id"].as_str().unwrap().to_owned();
    let detail = json!({"outcome": "blocked", "detail": "d".repeat(1025)}).to_string();
    let (status, text) = request(
        addr,
        "POST",
        &format!("/v1/leases/{id}/report"),
        &[],
        Some(&detail),
    )
    .await;
    assert_eq!(status, 400);
    assert!(
        body(&text)["message"]
            .as_str()
            .unwrap()
            .contains("detail is 1025 characters")
    );
    let attrs: String = (0..17).map(|i| format!("attr=k{i}%3Dv&")).collect();
    for (query, why) in [
        ("attr=", "must be key=value"),
        ("attr=%3Dv", "attr key must be 1 to 128"),
        (attrs.as_str(), "attr has 17 pairs"),
        ("colour=red", "unknown query parameter"),
    ] {
        let (status, text) = request(addr, "GET", &format!("/v1/proxies?{query}"), &[], None).await;
        assert_eq!(status, 400, "{query}");
        assert!(
            body(&text)["message"].as_str().unwrap().contains(why),
            "{query}: {text}"
        );
    }
    let (status, _) = request(addr, "GET", "/v1/proxies?attr=geo%3D", &[], None).await;
    assert_eq!(status, 200, "an empty value is a value");
}
