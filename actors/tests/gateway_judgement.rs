//! The gateway judging what it sees, through the real binary in standalone
//! mode with local built-in proxies, each leaving from an outgoing address
//! of its own on loopback, and sites on loopback addresses of their own
//! (each its own lease target):
//! - a hostile site answering every request `407` (with a challenge), or
//!   `500` with `Proxy-Status`, rests no proxy: another site keeps its full
//!   capacity throughout, no `error` is reported, the lease API still
//!   leases;
//! - 100 requests whose bodies are malformed or cut off are the clients'
//!   fault: each gets a `400`, no proxy is rested, and the next request is
//!   served;
//! - with `pacing: 500ms`, no proxy sends a site two requests less than
//!   about 500 ms apart;
//! - 100 requests in a row to one site with the quickstart's lease
//!   settings are all served, spread over the four proxies, and none is
//!   counted denied;
//! - a tunnel's lease is back within about a second of its client closing
//!   (fully, or only its sending side) while the site keeps its side open;
//! - learning: with one of four proxies refused by one site (`403` by
//!   source address), after a warm-up at least 99 % of that site's
//!   requests succeed on the first try, and another site's requests still
//!   use all four proxies.

mod support;

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use support::operator::{OperatorDir, OperatorProcess};
use support::process::{free_port, health_target};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const TOKEN: &str = "gw-judgement-t0ken-77c1";

struct Fleet {
    operator: OperatorProcess,
    gateway: SocketAddr,
    dir: OperatorDir,
}

impl Fleet {
    /// `count` local proxies leaving from `network`, each carrying one
    /// lease at a time, behind a gateway with `settings`.
    async fn start(count: usize, network: &str, settings: &str) -> Self {
        let dir = OperatorDir::new(&format!(
            "providers:\n  - {{name: local, type: local, local: {{implementation: builtin, \
             destinations: {{allow: [127.0.0.0/8, 1024-65535]}}, outgoingAddresses: [{network}]}}}}\n"
        ));
        let health = health_target();
        for i in 0..count {
            dir.write_manifest(
                &format!("p{i}"),
                &format!(
                    "apiVersion: crawl.example.com/v1alpha1\nkind: Proxy\nmetadata: {{name: p{i}, namespace: crawl}}\n\
                     spec: {{mode: Managed, provider: local, healthCheck: {{url: \"{health}\", interval: 1s}}}}\n"
                ),
            );
        }
        let gateway: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let operator = dir
            .standalone()
            .discovery()
            .setting("gatewayBindAddress", &format!("\"{gateway}\""))
            .setting(
                "gateway",
                &format!("{{destinations: {{allow: [127.0.0.0/8, 1024-65535]}}, {settings}}}"),
            )
            .setting("maxLeasesPerProxy", "1")
            .setting("leaseCooldown", "30s")
            .env("DISCOVERY_TOKEN", TOKEN)
            .start()
            .await;
        operator.wait_ready(count).await;
        Self {
            operator,
            gateway,
            dir,
        }
    }

    /// `egress-proxies-operator get sites -o <output>` against this operator.
    fn get_sites(&self, output: &str) -> String {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_egress-proxies-operator"))
            .args(["get", "sites", "-o", output, "--config"])
            .arg(self.dir.path().join("operator.yaml"))
            .env("EGRESS_PROXIES_TOKEN", TOKEN)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    }

    /// The proxies as the lease book sees them (the dashboard's rows).
    async fn proxies(&self) -> Vec<Value> {
        let dashboard = support::http::dashboard(self.operator.discovery(), TOKEN).await;
        dashboard["proxies"].as_array().unwrap().clone()
    }

    /// The dashboard's lease counters (`granted`, `denied`...).
    async fn leases(&self) -> Value {
        support::http::dashboard(self.operator.discovery(), TOKEN).await["leases"].clone()
    }

    /// `error` reports on the proxies' leases, in all.
    async fn errors(&self) -> u64 {
        self.proxies()
            .await
            .iter()
            .map(|p| p["errors"].as_u64().unwrap_or(0))
            .sum()
    }
}

/// What a site answers a request for `path` from `source`.
type Answer = fn(&str, IpAddr) -> &'static [u8];

/// A site on `ip` answering each request with `answer`, one request per
/// connection; counts requests per source address.
async fn site(ip: &str, answer: Answer) -> (SocketAddr, Arc<Mutex<BTreeMap<IpAddr, usize>>>) {
    let listener = TcpListener::bind((ip, 0)).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let sources = Arc::new(Mutex::new(BTreeMap::new()));
    let seen = sources.clone();
    tokio::spawn(async move {
        while let Ok((mut s, peer)) = listener.accept().await {
            let seen = seen.clone();
            tokio::spawn(async move {
                let mut got = Vec::new();
                let mut buf = [0u8; 4096];
                while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                    }
                }
                *seen.lock().unwrap().entry(peer.ip()).or_default() += 1;
                let head = String::from_utf8_lossy(&got).into_owned();
                let path = head.split(' ').nth(1).unwrap_or("/").to_owned();
                // A site answers once it has the whole request: a chunked
                // body up to its last chunk (one that never ends, never).
                if head.to_ascii_lowercase().contains("transfer-encoding: chunked") {
                    while !got.ends_with(b"0\r\n\r\n") {
                        match s.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => got.extend_from_slice(&buf[..n]),
                        }
                    }
                }
                let _ = s.write_all(answer(&path, peer.ip())).await;
                let _ = s.shutdown().await;
            });
        }
    });
    (addr, sources)
}

fn basic() -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(format!("crawler:{TOKEN}"))
}

/// Sends `head` (and `body`, then optionally the end of sending) to the
/// gateway: the status the gateway answered and the lowercase answer.
async fn exchange(gateway: SocketAddr, head: String, body: &[u8], half_close: bool) -> (u16, String) {
    let mut s = TcpStream::connect(gateway).await.unwrap();
    s.write_all(head.as_bytes()).await.unwrap();
    s.write_all(body).await.unwrap();
    if half_close {
        s.shutdown().await.unwrap();
    }
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(30), s.read_to_end(&mut answer)).await;
    let text = String::from_utf8_lossy(&answer).to_ascii_lowercase();
    let status = text.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    (status, text)
}

async fn get(gateway: SocketAddr, site: SocketAddr, path: &str) -> (u16, String) {
    let head = format!(
        "GET http://{site}{path} HTTP/1.1\r\nHost: {site}\r\nProxy-Authorization: Basic {}\r\nConnection: close\r\n\r\n",
        basic()
    );
    exchange(gateway, head, b"", false).await
}

const OK: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok";

#[tokio::test]
async fn a_site_answering_407_or_proxy_status_500_takes_no_proxy_out_of_service() {
    let fleet = Fleet::start(3, "127.0.12.0/29", "capacityWait: 2s").await;
    let (hostile, _) = site("127.0.13.1", |path, _| match path {
        "/407" => {
            b"HTTP/1.1 407 Proxy Authentication Required\r\nProxy-Authenticate: Basic realm=\"hostile\"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        }
        _ => {
            b"HTTP/1.1 500 Internal Server Error\r\nProxy-Status: hostile; error=http_protocol_error\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        }
    })
    .await;
    let (good, _) = site("127.0.13.2", |_, _| OK).await;
    for round in 0..10 {
        let (status, text) = get(fleet.gateway, hostile, "/407").await;
        assert_eq!(
            status, 407,
            "round {round}: the site's own 407 is relayed: {text}"
        );
        assert!(!text.contains("egress-gateway-error"), "{text}");
        let (status, text) = get(fleet.gateway, hostile, "/500").await;
        assert_eq!(status, 502, "round {round}: {text}");
        for _ in 0..3 {
            let (status, text) = get(fleet.gateway, good, "/").await;
            assert_eq!(
                status, 200,
                "round {round}: another site keeps its capacity: {text}"
            );
        }
    }
    assert_eq!(fleet.errors().await, 0, "no proxy was rested for every target");
    let auth = format!("Bearer {TOKEN}");
    let (status, text) = support::http::request(
        fleet.operator.discovery(),
        "POST",
        "/v1/leases",
        &[("Authorization", &auth), ("Content-Type", "application/json")],
        Some(r#"{"target": "example.org"}"#),
    )
    .await;
    assert_eq!(status, 201, "the lease API still leases: {text}");
    fleet.operator.stop().await;
}

#[tokio::test]
async fn a_hundred_requests_in_a_row_to_one_site_are_all_served_spread_over_the_proxies() {
    // The quickstart's lease settings: one lease per proxy, a 30 s cooldown.
    let fleet = Fleet::start(4, "127.0.22.0/29", "capacityWait: 5s").await;
    let (site, sources) = site("127.0.23.1", |_, _| OK).await;
    let started = Instant::now();
    for i in 0..100 {
        let (status, text) = get(fleet.gateway, site, "/").await;
        assert_eq!(status, 200, "request {i}: {text}");
    }
    let took = started.elapsed();
    let sources = sources.lock().unwrap().clone();
    assert_eq!(sources.len(), 4, "spread over the four proxies: {sources:?}");
    assert!(sources.values().all(|n| *n >= 10), "{sources:?}");
    assert!(took < Duration::from_secs(30), "100 requests took {took:?}");
    let leases = fleet.leases().await;
    assert_eq!(
        leases["denied"], 0,
        "no request was refused, none counted: {leases}"
    );
    fleet.operator.stop().await;
}

#[tokio::test]
async fn pacing_keeps_each_proxy_to_one_request_per_interval_for_a_site() {
    let fleet = Fleet::start(2, "127.0.26.0/29", "capacityWait: 5s, pacing: 500ms").await;
    // When each source address's requests arrived.
    let listener = TcpListener::bind("127.0.27.1:0").await.unwrap();
    let site = listener.local_addr().unwrap();
    let arrivals: Arc<Mutex<BTreeMap<IpAddr, Vec<Instant>>>> = Arc::default();
    let seen = arrivals.clone();
    tokio::spawn(async move {
        while let Ok((mut s, peer)) = listener.accept().await {
            seen.lock()
                .unwrap()
                .entry(peer.ip())
                .or_default()
                .push(Instant::now());
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf).await;
                let _ = s.write_all(OK).await;
                let _ = s.shutdown().await;
            });
        }
    });
    for i in 0..6 {
        let (status, text) = get(fleet.gateway, site, "/").await;
        assert_eq!(status, 200, "request {i}: {text}");
    }
    let arrivals = arrivals.lock().unwrap().clone();
    assert_eq!(arrivals.len(), 2, "both proxies used: {arrivals:?}");
    for (source, times) in &arrivals {
        for pair in times.windows(2) {
            let gap = pair[1] - pair[0];
            assert!(
                gap >= Duration::from_millis(450),
                "{source}: {gap:?} between two requests"
            );
        }
    }
    fleet.operator.stop().await;
}

#[tokio::test]
async fn broken_request_bodies_are_the_clients_fault() {
    let fleet = Fleet::start(2, "127.0.16.0/29", "capacityWait: 2s").await;
    let (site, _) = site("127.0.17.1", |_, _| OK).await;
    for i in 0..100 {
        let head = format!(
            "POST http://{site}/upload HTTP/1.1\r\nHost: {site}\r\nProxy-Authorization: Basic {}\r\nTransfer-Encoding: chunked\r\n\r\n",
            basic()
        );
        let (status, text) = if i % 2 == 0 {
            // A chunk size that is not hexadecimal.
            exchange(fleet.gateway, head, b"5\r\nhello\r\nzz\r\nbroken\r\n", false).await
        } else {
            // The upload stops halfway: the client ends its sending side.
            exchange(fleet.gateway, head, b"5\r\nhel", true).await
        };
        assert!((400..500).contains(&status), "request {i}: {status} {text}");
    }
    assert_eq!(fleet.errors().await, 0, "no proxy was blamed");
    for _ in 0..4 {
        let (status, text) = get(fleet.gateway, site, "/").await;
        assert_eq!(status, 200, "{text}");
    }
    fleet.operator.stop().await;
}

/// Opens a tunnel to `site`: the connection once the gateway answered 200.
async fn tunnel(gateway: SocketAddr, site: SocketAddr) -> Result<TcpStream, String> {
    let mut s = TcpStream::connect(gateway).await.unwrap();
    let head = format!(
        "CONNECT {site} HTTP/1.1\r\nHost: {site}\r\nProxy-Authorization: Basic {}\r\n\r\n",
        basic()
    );
    s.write_all(head.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    let mut byte = [0u8; 1];
    while !got.ends_with(b"\r\n\r\n") {
        if s.read(&mut byte).await.unwrap_or(0) == 0 {
            break;
        }
        got.push(byte[0]);
    }
    let line = String::from_utf8_lossy(&got).into_owned();
    if line.starts_with("HTTP/1.1 200") {
        Ok(s)
    } else {
        Err(line)
    }
}

#[tokio::test]
async fn a_tunnel_s_lease_comes_back_within_a_second_of_its_client_closing() {
    let fleet = Fleet::start(1, "127.0.18.0/30", "capacityWait: 5s").await;
    // A site that reads and never answers nor closes.
    let listener = TcpListener::bind("127.0.19.1:0").await.unwrap();
    let site = listener.local_addr().unwrap();
    let held = Arc::new(Mutex::new(Vec::new()));
    let keep = held.clone();
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            keep.lock().unwrap().push(s);
        }
    });
    for half in [false, true] {
        let mut first = tunnel(fleet.gateway, site).await.unwrap();
        first.write_all(b"hello").await.unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        let closed = Instant::now();
        if half {
            // Only the sending side: the client still reads.
            first.shutdown().await.unwrap();
        } else {
            drop(first);
        }
        let second = tunnel(fleet.gateway, site).await;
        let waited = closed.elapsed();
        assert!(second.is_ok(), "half-close {half}: {second:?}");
        assert!(
            waited < Duration::from_millis(2500),
            "half-close {half}: the lease came back after {waited:?}"
        );
        drop(second);
        tokio::time::sleep(Duration::from_millis(1500)).await;
    }
    assert_eq!(
        held.lock().unwrap().len(),
        4,
        "the site kept every connection open"
    );
    fleet.operator.stop().await;
}

#[tokio::test]
async fn a_proxy_one_site_refuses_is_learnt_for_that_site_only() {
    let fleet = Fleet::start(4, "127.0.20.0/29", "capacityWait: 5s").await;
    let (refusing, _) = site("127.0.21.1", |_, source| {
        if source == IpAddr::from([127, 0, 20, 1]) {
            b"HTTP/1.1 403 Forbidden\r\nContent-Length: 7\r\nConnection: close\r\n\r\nblocked"
        } else {
            OK
        }
    })
    .await;
    let (other, other_sources) = site("127.0.21.2", |_, _| OK).await;
    for _ in 0..20 {
        get(fleet.gateway, refusing, "/").await;
    }
    let mut served = 0;
    for _ in 0..200 {
        let (status, _) = get(fleet.gateway, refusing, "/").await;
        served += usize::from(status == 200);
    }
    assert!(served >= 198, "{served} of 200 succeeded on the first try");
    for _ in 0..40 {
        let (status, text) = get(fleet.gateway, other, "/").await;
        assert_eq!(status, 200, "{text}");
    }
    let sources = other_sources.lock().unwrap().clone();
    assert_eq!(
        sources.len(),
        4,
        "the other site still uses every proxy: {sources:?}"
    );

    // What was learnt is published about once a second: `get sites` shows it.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    get(fleet.gateway, other, "/").await;
    let sites: Vec<Value> = serde_json::from_str(&fleet.get_sites("json")).unwrap();
    let avoided = |site: SocketAddr| {
        let site = sites.iter().find(|s| s["site"] == site.ip().to_string()).unwrap();
        site["proxies"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["avoided"] == true)
            .count()
    };
    assert_eq!(avoided(refusing), 1, "{sites:?}");
    assert_eq!(avoided(other), 0, "{sites:?}");
    let table = fleet.get_sites("table");
    assert!(table.starts_with("SITE "), "{table}");
    assert!(table.contains("127.0.21.1"), "{table}");
    fleet.operator.stop().await;
}
