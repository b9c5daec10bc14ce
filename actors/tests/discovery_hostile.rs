//! Hostile clients against the real discovery API on loopback: every bound
//! of issue 16 driven past its limit. The answers are 4xx (429 for rate
//! limits) or the documented 503 `lease_store_full`, never another 5xx, and
//! the lease store's tables and the process's memory stay flat.

mod support;

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use actix::prelude::*;
use egress_proxies::adapters::lease_store::LeaseStore;
use egress_proxies::domain::lease::{Availability, Footprint, LeaseLimits, LeaseSettings};
use egress_proxies::domain::resource::ObjectKey;
use egress_proxies::rate_limit::RateLimits;
use egress_proxies_operator::discovery::{self, Limiter};
use egress_proxies_operator::lease_store_actor::{GetLeaseFootprint, LeaseStoreActor, UpdateAvailability};
use serde_json::{Value, json};
use support::http::{Response, request_from};

const LIMITS: LeaseLimits = LeaseLimits {
    max_leases: 200,
    max_targets: 300,
    max_ended: 400,
    recent_reports: 64,
};

fn unlimited_rate() -> RateLimits {
    RateLimits {
        per_client: 1e9,
        per_client_burst: 1e9,
        global: 1e9,
        global_burst: 1e9,
        max_clients: 16,
    }
}

async fn serve(rate: RateLimits) -> (SocketAddr, Addr<LeaseStoreActor>, Limiter) {
    let store = LeaseStoreActor::new(LeaseStore::with_limits(
        LeaseSettings {
            capacity: 0,
            ..LeaseSettings::default()
        },
        LIMITS,
    ))
    .start();
    for i in 0..10 {
        store.do_send(UpdateAvailability(Availability {
            key: ObjectKey::new("crawl", format!("p{i}")),
            ready: true,
            phase: "Ready".into(),
            healthy: Some(true),
            url: Some(format!("http://127.0.0.1:{}", 42000 + i)),
            attributes: BTreeMap::new(),
            latency: Some(Duration::from_millis(i)),
            credentials: None,
            realm: None,
            retiring: false,
        }));
    }
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let limiter = Limiter::new(rate);
    actix::spawn(
        discovery::start_with(
            listener,
            store.clone(),
            discovery::Tokens::open(),
            limiter.clone(),
            None,
        )
        .unwrap(),
    );
    (addr, store, limiter)
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// Resident set size of this process, in KiB.
fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// Sends `n` bodies made by `body(i)` to `path`, 32 at a time (made as
/// they are sent: the test's own memory must not hide the server's).
async fn blast(
    addr: SocketAddr,
    method: &str,
    path: &str,
    n: usize,
    body: impl Fn(usize) -> String,
) -> Vec<Response> {
    let mut out = Vec::new();
    for start in (0..n).step_by(32) {
        let bodies: Vec<String> = (start..n.min(start + 32)).map(&body).collect();
        let batch = bodies
            .iter()
            .map(|b| request_from(ip("127.0.0.1"), addr, method, path, Some(b.as_str())));
        out.extend(futures::future::join_all(batch).await);
    }
    out
}

/// Counts statuses; panics on any 5xx but a documented 503.
fn tally(seen: &mut BTreeMap<u16, usize>, responses: &[Response]) {
    for r in responses {
        *seen.entry(r.status).or_default() += 1;
        if r.status >= 500 {
            let err: Value = serde_json::from_str(&r.body).unwrap();
            assert_eq!(r.status, 503, "{}", r.body);
            assert!(
                err["error"] == "lease_store_full" || err["error"] == "no_capacity",
                "{}",
                r.body
            );
        }
    }
}

fn error(r: &Response) -> String {
    serde_json::from_str::<Value>(&r.body).unwrap()["error"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

fn assert_bounded(size: Footprint) {
    assert!(size.leases <= LIMITS.max_leases, "{size:?}");
    assert!(size.targets <= LIMITS.max_targets, "{size:?}");
    assert!(size.ended <= LIMITS.max_ended, "{size:?}");
    assert!(size.recent_reports <= LIMITS.recent_reports, "{size:?}");
    assert!(size.detail_bytes <= LIMITS.recent_reports * 1024, "{size:?}");
}

#[actix_rt::test]
async fn hostile_clients_meet_every_bound_and_memory_stays_flat() {
    let (addr, store, _) = serve(unlimited_rate()).await;
    let mut seen = BTreeMap::new();
    let one = blast(addr, "POST", "/v1/leases", 1, |_| {
        json!({"target": "shop.example"}).to_string()
    })
    .await;
    let id = serde_json::from_str::<Value>(&one[0].body).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let report = format!("/v1/leases/{id}/report");
    // Warm up allocator and connection paths before the first measurement.
    blast(addr, "POST", &report, 200, |_| {
        json!({"outcome": "ok"}).to_string()
    })
    .await;
    let rss_before = rss_kib();

    // Issue 16's finding: 3,000 reports with a 60 KiB detail on one lease.
    let huge = json!({"outcome": "blocked", "detail": "x".repeat(60 * 1024)}).to_string();
    let r = blast(addr, "POST", &report, 3000, |_| huge.clone()).await;
    assert!(
        r.iter()
            .all(|r| r.status == 400 && r.body.contains("detail is 61440 characters"))
    );
    tally(&mut seen, &r);
    drop(r);
    // The longest detail allowed, 3,000 times: only the last 64 are kept.
    let long = json!({"outcome": "ok", "detail": "y".repeat(1024)}).to_string();
    let r = blast(addr, "POST", &report, 3000, |_| long.clone()).await;
    assert!(r.iter().all(|r| r.status == 204));
    tally(&mut seen, &r);
    drop(r);
    assert_bounded(store.send(GetLeaseFootprint).await.unwrap());

    // Endless new targets, each leased and released: 300 fit; then every
    // target rests or takes late reports, none may be forgotten: 503 with Retry-After.
    let r = blast(addr, "POST", "/v1/leases", 2000, |i| {
        json!({"target": format!("t{i}.example"), "ttlSeconds": 600}).to_string()
    })
    .await;
    tally(&mut seen, &r);
    let granted: Vec<String> = r
        .iter()
        .filter(|r| r.status == 201)
        .map(|r| {
            serde_json::from_str::<Value>(&r.body).unwrap()["id"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(
        granted.len(),
        199,
        "the table holds 300 targets, but only 200 leases: one is shop.example's"
    );
    let full: Vec<&Response> = r.iter().filter(|r| r.status == 503).collect();
    assert_eq!(full.len(), 2000 - 199);
    assert!(
        full.iter()
            .all(|r| error(r) == "lease_store_full" && r.header("retry-after").is_some())
    );
    assert!(full[0].body.contains("maximum of 200 leases"), "{}", full[0].body);
    drop(full);
    drop(r);
    for id in &granted {
        let r = request_from(ip("127.0.0.1"), addr, "DELETE", &format!("/v1/leases/{id}"), None).await;
        assert_eq!(r.status, 204);
    }
    let r = blast(addr, "POST", "/v1/leases", 2000, |i| {
        json!({"target": format!("t{}.example", 2000 + i)}).to_string()
    })
    .await;
    tally(&mut seen, &r);
    let targets_full = r.iter().filter(|r| r.status == 503).count();
    assert!(targets_full >= 1900, "{targets_full}");
    let refused = r.iter().find(|r| r.status == 503).unwrap();
    assert!(
        refused.body.contains("maximum of 300 targets"),
        "{}",
        refused.body
    );
    let retry: u64 = refused.header("retry-after").unwrap().parse().unwrap();
    assert!(
        (1..=30).contains(&retry),
        "the first rest ends within the 30 s cooldown: {retry}"
    );
    drop(r);

    // Malformed and oversized input of every shape.
    let junk: Vec<String> = vec![
        "{".into(),
        "[".repeat(10_000),
        json!({"target": "a".repeat(60_000)}).to_string(),
        json!({"target": "x", "selector": (0..2000).map(|i| (format!("k{i}"), "v")).collect::<BTreeMap<_, _>>()}).to_string(),
        json!({"target": "x", "client": "c".repeat(50_000)}).to_string(),
        "\u{0}\u{1}\u{2}".into(),
    ];
    let r = blast(addr, "POST", "/v1/leases", 1200, |i| junk[i % junk.len()].clone()).await;
    assert!(
        r.iter().all(|r| r.status == 400),
        "{:?}",
        r.iter().map(|r| r.status).collect::<Vec<_>>()
    );
    tally(&mut seen, &r);
    drop(r);
    let over = "z".repeat(discovery::BODY_LIMIT + 1);
    let r = blast(addr, "POST", "/v1/leases", 50, |_| over.clone()).await;
    assert!(r.iter().all(|r| r.status == 413));
    tally(&mut seen, &r);
    drop(r);

    let size = store.send(GetLeaseFootprint).await.unwrap();
    assert_bounded(size);
    let rss_after = rss_kib();
    // The same floods again: at the plateau, nothing more is kept.
    let huge = json!({"outcome": "blocked", "detail": "x".repeat(60 * 1024)}).to_string();
    let r = blast(addr, "POST", &report, 3000, |_| huge.clone()).await;
    tally(&mut seen, &r);
    drop(r);
    let r = blast(addr, "POST", &report, 3000, |_| long.clone()).await;
    tally(&mut seen, &r);
    drop(r);
    assert_eq!(store.send(GetLeaseFootprint).await.unwrap(), size);
    let rss_again = rss_kib();
    let sent: usize = seen.values().sum();
    eprintln!(
        "{sent} hostile requests, statuses {seen:?}; lease store {size:?}; \
         RSS {rss_before} KiB -> {rss_after} KiB -> {rss_again} KiB after 6,000 more"
    );
    assert!(
        rss_again < rss_after + 4 * 1024,
        "RSS still growing: {rss_after} KiB -> {rss_again} KiB"
    );
    // Before the bounds, 3,000 60 KiB reports alone grew the operator by 195 MiB.
    assert!(
        rss_after < rss_before + 16 * 1024,
        "RSS grew from {rss_before} KiB to {rss_after} KiB"
    );
}

#[actix_rt::test]
async fn rate_limits_answer_429_with_retry_after() {
    let (addr, _, limiter) = serve(RateLimits {
        per_client: 5.0,
        per_client_burst: 10.0,
        global: 1e9,
        global_burst: 1e9,
        max_clients: 4,
    })
    .await;
    let mut statuses = BTreeMap::new();
    for _ in 0..50 {
        let r = request_from(ip("127.0.0.1"), addr, "GET", "/v1/proxies", None).await;
        *statuses.entry(r.status).or_insert(0) += 1;
        if r.status == 429 {
            assert_eq!(error(&r), "rate_limited");
            assert!(
                r.body.contains("too many requests from this client address"),
                "{}",
                r.body
            );
            assert_eq!(r.header("retry-after"), Some("1"));
        }
    }
    assert_eq!(
        statuses,
        BTreeMap::from([(200, 10), (429, 40)]),
        "the burst, then 429"
    );
    // Other clients are not held back, up to the table's bound; busy clients are never forgotten.
    for a in ["127.0.0.2", "127.0.0.3", "127.0.0.4"] {
        assert_eq!(
            request_from(ip(a), addr, "GET", "/v1/proxies", None).await.status,
            200,
            "{a}"
        );
    }
    for a in ["127.0.0.5", "127.0.0.6"] {
        let r = request_from(ip(a), addr, "GET", "/v1/proxies", None).await;
        assert_eq!(r.status, 429, "{a}");
        assert!(r.body.contains("too many client addresses"), "{}", r.body);
        assert!(r.header("retry-after").is_some());
    }
    assert_eq!(limiter.tracked(), 4);
    // Limited before authentication and routing: a flood of anything is 429.
    let r = request_from(ip("127.0.0.1"), addr, "DELETE", "/v1/nothing", None).await;
    assert_eq!(r.status, 429);
    // /healthz is never limited.
    assert_eq!(
        request_from(ip("127.0.0.1"), addr, "GET", "/healthz", None)
            .await
            .status,
        200
    );
    // Refilled after a second (the time a refill takes, not a wait for state).
    actix_rt::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(
        request_from(ip("127.0.0.1"), addr, "GET", "/v1/proxies", None)
            .await
            .status,
        200
    );

    let (addr, _, _) = serve(RateLimits {
        global: 1.0,
        global_burst: 30.0,
        ..unlimited_rate()
    })
    .await;
    let mut ok = 0;
    for i in 0..100 {
        let from = ip(&format!("127.0.1.{}", 1 + i % 8));
        let r = request_from(from, addr, "GET", "/v1/proxies", None).await;
        match r.status {
            200 => ok += 1,
            429 => assert!(r.body.contains("all clients together"), "{}", r.body),
            other => panic!("{other}: {}", r.body),
        }
    }
    assert_eq!(ok, 30, "the global burst");
}
