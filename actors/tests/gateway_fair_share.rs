//! Fair shares through the real binary in standalone mode, on loopback:
//! three local proxies of capacity 1 behind the gateway. A crawler waiting
//! in `capacityWait` waits in turn at the lease store: a request that ends
//! in `503 no_capacity` is one denial on the dashboard, not one per look
//! at the book; a crawler holding every proxy in idle tunnels loses its
//! latest one to another identity waiting below its share, which is served
//! within `capacityWait`; a crawler firing requests back to back does not
//! starve a slower one of another identity; through the lease API, an
//! identity at its share leaves a freed proxy to one that asked for it.

mod support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde_json::Value;
use support::operator::{OperatorDir, OperatorProcess};
use support::process::{free_port, health_target};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The API's token (and the `default` identity's).
const TOKEN: &str = "fair-api-t0ken-51aa";
/// Two crawler identities: a token file each.
const TEAM_A: (&str, &str) = ("team-a", "fair-team-a-t0ken-7c1e");
const TEAM_B: (&str, &str) = ("team-b", "fair-team-b-t0ken-2d9f");
const PROVIDER: &str = "providers:\n  - {name: local, type: local, local: {implementation: builtin, destinations: {allow: [127.0.0.0/8, 1024-65535]}}}\n";
const DESTINATIONS: &str = "{allow: [127.0.0.0/8, '::1', 1024-65535]}";

/// The bed: the operator, its gateway, three Ready proxies of capacity 1.
struct Bed {
    _dir: OperatorDir,
    operator: OperatorProcess,
    gateway: SocketAddr,
}

/// With `identities`: the two teams' tokens in `crawlerTokensDir`.
/// `gateway` adds settings to the gateway block.
async fn bed(capacity_wait: &str, identities: bool, gateway: &str) -> Bed {
    let dir = OperatorDir::new(PROVIDER);
    let health = health_target();
    for name in ["p1", "p2", "p3"] {
        dir.write_manifest(
            name,
            &format!(
                "apiVersion: crawl.example.com/v1alpha1\nkind: Proxy\nmetadata: {{name: {name}, namespace: crawl}}\n\
                 spec: {{mode: Managed, provider: local, healthCheck: {{url: \"{health}\", interval: 1s}}}}\n"
            ),
        );
    }
    for (name, token) in [TEAM_A, TEAM_B] {
        dir.write(&format!("tokens/{name}"), token);
    }
    let listen: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let mut operator = dir.standalone();
    if identities {
        operator = operator.setting("crawlerTokensDir", "tokens");
    }
    let operator = operator
        .discovery()
        .setting("gatewayBindAddress", &format!("\"{listen}\""))
        .setting(
            "gateway",
            &format!("{{destinations: {DESTINATIONS}, capacityWait: {capacity_wait}, tries: 1{gateway}}}"),
        )
        .setting("maxLeasesPerProxy", "1")
        .setting("leaseCooldown", "0s")
        .env("DISCOVERY_TOKEN", TOKEN)
        .start()
        .await;
    operator.wait_ready(3).await;
    Bed {
        _dir: dir,
        operator,
        gateway: listen,
    }
}

async fn api(operator: &OperatorProcess, method: &str, path: &str, body: Option<&str>) -> (u16, Value) {
    let auth = format!("Bearer {TOKEN}");
    let mut headers = vec![("Authorization", auth.as_str())];
    if body.is_some() {
        headers.push(("Content-Type", "application/json"));
    }
    let (status, text) = support::http::request(operator.discovery(), method, path, &headers, body).await;
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// Leases refused, as the dashboard counts them.
async fn denied(operator: &OperatorProcess) -> u64 {
    let (status, body) = api(operator, "GET", "/v1/dashboard", None).await;
    assert_eq!(status, 200, "{body}");
    body["leases"]["denied"].as_u64().unwrap()
}

async fn active_leases(operator: &OperatorProcess) -> u64 {
    let (status, list) = api(operator, "GET", "/v1/proxies", None).await;
    assert_eq!(status, 200, "{list}");
    list.as_array()
        .unwrap()
        .iter()
        .map(|p| p["activeLeases"].as_u64().unwrap())
        .sum()
}

fn basic(token: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(format!("crawler:{token}"))
}

/// Reads a response head.
async fn head_of(s: &mut TcpStream) -> String {
    let mut got = Vec::new();
    let mut byte = [0u8; 1];
    while !got.ends_with(b"\r\n\r\n") {
        match s.read(&mut byte).await {
            Ok(0) | Err(_) => break,
            Ok(_) => got.push(byte[0]),
        }
    }
    String::from_utf8_lossy(&got).into_owned()
}

fn status_of(head: &str) -> u16 {
    head.split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// One plain request through the gateway: its status and response head.
async fn get(gateway: SocketAddr, token: &str, site: SocketAddr) -> (u16, String) {
    let mut s = TcpStream::connect(gateway).await.unwrap();
    let head = format!(
        "GET http://{site}/page HTTP/1.1\r\nHost: {site}\r\nProxy-Authorization: Basic {}\r\nConnection: close\r\n\r\n",
        basic(token)
    );
    s.write_all(head.as_bytes()).await.unwrap();
    let head = head_of(&mut s).await;
    (status_of(&head), head)
}

/// A tunnel opened through the gateway and kept open; its status.
async fn tunnel(gateway: SocketAddr, token: &str, site: SocketAddr) -> (TcpStream, u16) {
    let mut s = TcpStream::connect(gateway).await.unwrap();
    let head = format!(
        "CONNECT {site} HTTP/1.1\r\nHost: {site}\r\nProxy-Authorization: Basic {}\r\n\r\n",
        basic(token)
    );
    s.write_all(head.as_bytes()).await.unwrap();
    let head = head_of(&mut s).await;
    (s, status_of(&head))
}

/// A site answering `200` after `delay`; it keeps tunnels open until the
/// other side closes.
async fn site(delay: Duration) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut got = Vec::new();
                let mut buf = [0u8; 2048];
                while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                    }
                }
                tokio::time::sleep(delay).await;
                let _ = s
                    .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
                    .await;
                let _ = s.shutdown().await;
            });
        }
    });
    addr
}

/// Whether the other side closed `s` (within `within`).
async fn closed(s: &mut TcpStream, within: Duration) -> bool {
    let mut byte = [0u8; 1];
    matches!(
        tokio::time::timeout(within, s.read(&mut byte)).await,
        Ok(Ok(0) | Err(_))
    )
}

/// Requests that waited for a proxy and got `503 no_capacity` count one
/// denial each on the dashboard, however long they waited.
#[tokio::test]
async fn a_request_refused_after_waiting_is_one_denial() {
    let bed = bed("2s", false, "").await;
    let site = site(Duration::ZERO).await;
    let (gateway, operator) = (bed.gateway, &bed.operator);
    operator
        .eventually(
            "a gateway request served",
            Duration::from_secs(30),
            async || match get(gateway, TOKEN, site).await {
                (200, _) => Ok(()),
                (status, head) => Err(format!("{status}: {head}")),
            },
        )
        .await;
    // API leases fill the fleet.
    let mut leases = Vec::new();
    for _ in 0..3 {
        let (status, lease) = api(
            operator,
            "POST",
            "/v1/leases",
            Some(r#"{"target":"busy.example"}"#),
        )
        .await;
        assert_eq!(status, 201, "{lease}");
        leases.push(lease["id"].as_str().unwrap().to_owned());
    }
    let before = denied(operator).await;
    let started = Instant::now();
    let refused = futures::future::join_all((0..4).map(|_| get(gateway, TOKEN, site))).await;
    for (status, head) in &refused {
        assert_eq!(*status, 503, "{head}");
        assert!(
            head.to_ascii_lowercase()
                .contains("egress-gateway-error: no_capacity"),
            "{head}"
        );
    }
    assert!(
        started.elapsed() >= Duration::from_millis(1500),
        "they waited capacityWait: {:?}",
        started.elapsed()
    );
    assert_eq!(
        denied(operator).await - before,
        4,
        "4 requests refused, 4 denials"
    );
    for id in leases {
        assert_eq!(
            api(operator, "DELETE", &format!("/v1/leases/{id}"), None).await.0,
            204
        );
    }
    bed.operator.stop().await;
}

/// Team A holds all three proxies in idle tunnels; team B's request is
/// served within `capacityWait` on the proxy of A's latest tunnel, which
/// closes. A keeps two (its rounded-up share of three).
#[tokio::test]
async fn a_crawler_holding_every_proxy_in_tunnels_does_not_keep_another_waiting() {
    let bed = bed("5s", true, "").await;
    let site = site(Duration::ZERO).await;
    let (gateway, operator) = (bed.gateway, &bed.operator);
    operator
        .eventually(
            "a gateway request served",
            Duration::from_secs(30),
            async || match get(gateway, TEAM_A.1, site).await {
                (200, _) => Ok(()),
                (status, head) => Err(format!("{status}: {head}")),
            },
        )
        .await;
    let mut tunnels = Vec::new();
    for _ in 0..3 {
        let (s, status) = tunnel(gateway, TEAM_A.1, site).await;
        assert_eq!(status, 200);
        tunnels.push(s);
    }
    assert_eq!(active_leases(operator).await, 3);

    let started = Instant::now();
    let (status, head) = get(gateway, TEAM_B.1, site).await;
    let waited = started.elapsed();
    eprintln!("team B waited {waited:?} for a proxy team A held");
    assert_eq!(status, 200, "team B served while team A hogs: {head}");
    assert!(waited < Duration::from_secs(5), "within capacityWait: {waited:?}");
    assert!(
        closed(&mut tunnels[2], Duration::from_secs(2)).await,
        "A's latest tunnel was taken back"
    );
    for s in &mut tunnels[..2] {
        assert!(!closed(s, Duration::from_millis(200)).await, "A keeps its share");
    }
    let logs = operator.logs();
    assert!(logs.contains("taken back"), "{logs}");
    drop(tunnels);
    bed.operator.stop().await;
}

/// Team A fires requests back to back on eight connections (more than
/// the fleet) with no pacing between requests to the site; team B asks one
/// at a time. Both are served in turn: every one of B's requests is served
/// as soon as a proxy frees, and A's keep being served too.
#[tokio::test]
async fn a_fast_crawler_does_not_starve_a_slower_one() {
    let bed = bed("3s", true, ", pacing: 0s").await;
    let site = site(Duration::from_millis(150)).await;
    let (gateway, operator) = (bed.gateway, &bed.operator);
    operator
        .eventually(
            "a gateway request served",
            Duration::from_secs(30),
            async || match get(gateway, TEAM_A.1, site).await {
                (200, _) => Ok(()),
                (status, head) => Err(format!("{status}: {head}")),
            },
        )
        .await;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let a_served = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let flood: Vec<_> = (0..8)
        .map(|_| {
            let (stop, served) = (stop.clone(), a_served.clone());
            tokio::spawn(async move {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    if get(gateway, TEAM_A.1, site).await.0 == 200 {
                        served.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (mut b_statuses, mut b_slowest) = (Vec::new(), Duration::ZERO);
    for _ in 0..6 {
        let asked = Instant::now();
        b_statuses.push(get(gateway, TEAM_B.1, site).await.0);
        b_slowest = b_slowest.max(asked.elapsed());
        // A slower crawler: it thinks between requests.
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let a_before_end = a_served.load(std::sync::atomic::Ordering::Relaxed);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for task in flood {
        let _ = tokio::time::timeout(Duration::from_secs(10), task).await;
    }
    eprintln!("team B: {b_statuses:?}, slowest {b_slowest:?}; team A served {a_before_end}");
    assert_eq!(b_statuses, [200; 6], "team B served in turn");
    // A proxy frees every ~50 ms (3 proxies, 150 ms a request): B's turn
    // comes at the next one.
    assert!(b_slowest < Duration::from_secs(1), "team B waited {b_slowest:?}");
    assert!(a_before_end >= 10, "team A served too: {a_before_end}");
    bed.operator.stop().await;
}

/// The lease API keeps shares too: team A holds the whole fleet through
/// the API; team B is refused, so it asks; a lease A gives back goes to B,
/// not to A again (A is answered `503` naming its share), and B's lease
/// is then granted. A's leases are never taken back.
#[tokio::test]
async fn an_api_crawler_at_its_share_leaves_a_freed_proxy_to_one_that_asked() {
    let bed = bed("2s", true, "").await;
    let operator = &bed.operator;
    let as_team = async |token: &str, method: &str, path: &str, body: Option<&str>| {
        let auth = format!("Bearer {token}");
        let mut headers = vec![("Authorization", auth.as_str())];
        if body.is_some() {
            headers.push(("Content-Type", "application/json"));
        }
        let (status, text) = support::http::request(operator.discovery(), method, path, &headers, body).await;
        (
            status,
            serde_json::from_str::<Value>(&text).unwrap_or(Value::Null),
        )
    };
    let lease = Some(r#"{"target":"shared.example"}"#);
    let mut a_leases = Vec::new();
    operator
        .eventually("team A holds the fleet", Duration::from_secs(30), async || {
            match as_team(TEAM_A.1, "POST", "/v1/leases", lease).await {
                (201, body) => a_leases.push(body["id"].as_str().unwrap().to_owned()),
                (status, body) => return Err(format!("{status}: {body}")),
            }
            if a_leases.len() == 3 {
                Ok(())
            } else {
                Err(format!("{} held", a_leases.len()))
            }
        })
        .await;
    let (status, body) = as_team(TEAM_B.1, "POST", "/v1/leases", lease).await;
    assert_eq!(status, 503, "the fleet is full: {body}");

    let released = a_leases.pop().unwrap();
    let (status, _) = as_team(TEAM_A.1, "DELETE", &format!("/v1/leases/{released}"), None).await;
    assert_eq!(status, 204);
    let (status, body) = as_team(TEAM_A.1, "POST", "/v1/leases", lease).await;
    assert_eq!(status, 503, "team A is at its share while B asks: {body}");
    assert_eq!(body["error"], "no_capacity", "{body}");
    assert!(body["message"].as_str().unwrap().contains("fair share"), "{body}");
    let (status, body) = as_team(TEAM_B.1, "POST", "/v1/leases", lease).await;
    assert_eq!(status, 201, "the freed proxy is B's: {body}");
    assert_eq!(active_leases(operator).await, 3, "A's two leases stay");
    bed.operator.stop().await;
}
