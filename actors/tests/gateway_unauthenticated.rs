//! What a client that has not authenticated can make the gateway hold,
//! through the real binary in standalone mode, on loopback only (one local
//! proxy behind the gateway, a local site):
//!
//! - 3,000 connections from 3,000 loopback addresses, each sending 56 KB
//!   of a request head without credentials and holding it: the operator's
//!   memory (RSS) rises by less than 100 MiB, each flooder gets `431` with
//!   `egress-gateway-error: head_budget_exhausted` or is held within the
//!   budget (never more than the budget's worth), and curl with the token
//!   is served during the flood.
//! - One address may hold `connectionsPerSource` connections that have not
//!   authenticated: the next gets `429 too_many_unauthenticated`; other
//!   addresses, and connections of the same address that have
//!   authenticated, are unaffected; a closed one makes room again.
//! - The head budget: an unfinished head over what is left of it gets
//!   `431`; a head that fits is served; once a connection has
//!   authenticated its heads no longer draw from the budget. A `407`
//!   closes a connection whose head was over the free 4 KiB, and keeps
//!   one whose head was small.

mod support;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use base64::Engine;
use support::operator::{OperatorDir, OperatorProcess};
use support::process::{free_port, health_target};
use support::target_server::{Behaviour, http_target_with};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

const TOKEN: &str = "gw-unauth-t0ken-77ab";
const PROVIDER: &str = "providers:\n  - {name: local, type: local, local: {implementation: builtin, destinations: {allow: [127.0.0.0/8, 1024-65535]}}}\n";
const DESTINATIONS: &str = "{allow: [127.0.0.0/8, 1024-65535]}";
const PATIENCE: Duration = Duration::from_secs(60);
const MIB: u64 = 1024 * 1024;

fn basic() -> String {
    let pair = base64::engine::general_purpose::STANDARD.encode(format!("crawler:{TOKEN}"));
    format!("Basic {pair}")
}

/// This test process needs a few thousand sockets of its own.
fn raise_own_file_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    setrlimit(Resource::RLIMIT_NOFILE, hard, hard).unwrap();
}

/// The resident memory of `pid`, in bytes.
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no VmRSS in {status}"));
    kib * 1024
}

fn assert_alive(operator: &OperatorProcess, when: &str) {
    assert!(
        operator.exited().is_none(),
        "the operator died {when}: {:?}\n{}",
        operator.exited(),
        operator.logs()
    );
}

/// An operator with one local proxy and the gateway (its `gateway:` block
/// `settings`), once a request with the token is served through it.
async fn operator_with_gateway(
    dir: &OperatorDir,
    settings: &str,
    file_limit: Option<u64>,
    site: SocketAddr,
) -> (OperatorProcess, SocketAddr) {
    let health = health_target();
    dir.write_manifest(
        "p1",
        &format!(
            "apiVersion: crawl.example.com/v1alpha1\nkind: Proxy\nmetadata: {{name: p1, namespace: crawl}}\n\
             spec: {{mode: Managed, provider: local, healthCheck: {{url: \"{health}\", interval: 1s}}}}\n"
        ),
    );
    let gateway: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let mut builder = dir
        .standalone()
        .setting("gatewayBindAddress", &format!("\"{gateway}\""))
        .setting("gateway", settings)
        .setting("maxLeasesPerProxy", "64")
        .setting("leaseCooldown", "0s")
        .env("DISCOVERY_TOKEN", TOKEN);
    if let Some(n) = file_limit {
        builder = builder.file_limit(n, n);
    }
    let operator = builder.start().await;
    operator.wait_ready(1).await;
    operator
        .eventually("a gateway request served", PATIENCE, async || {
            let got = request(
                IpAddr::V4(Ipv4Addr::LOCALHOST),
                gateway,
                &get(site, "/warm-up", true, 0),
            )
            .await;
            if got.status == 204 {
                Ok(())
            } else {
                Err(format!("{got:?}"))
            }
        })
        .await;
    (operator, gateway)
}

/// A `GET` of `path` on `site` through the gateway, with the token when
/// `authenticated`, padded with an `X-Pad` header of `pad` bytes.
fn get(site: SocketAddr, path: &str, authenticated: bool, pad: usize) -> Vec<u8> {
    let auth = if authenticated {
        format!("Proxy-Authorization: {}\r\n", basic())
    } else {
        String::new()
    };
    let pad = if pad > 0 {
        format!("X-Pad: {}\r\n", "p".repeat(pad))
    } else {
        String::new()
    };
    format!("GET http://{site}{path} HTTP/1.1\r\nHost: {site}\r\n{auth}{pad}\r\n").into_bytes()
}

/// The start of a request head without credentials, `len` bytes long, never finished.
fn partial_head(site: SocketAddr, len: usize) -> Vec<u8> {
    let mut head = format!("GET http://{site}/flood HTTP/1.1\r\nHost: {site}\r\nX-Slow: ").into_bytes();
    head.resize(len, b's');
    head
}

/// A connection to `gateway` from `from`.
async fn connect_from(from: IpAddr, gateway: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(from, 0))?;
    tokio::time::timeout(Duration::from_secs(10), socket.connect(gateway))
        .await
        .map_err(|_| std::io::Error::other("connect timed out"))?
}

/// What a connection got: a response head (status, lower-cased head), or
/// the connection ended without one, or nothing within the patience.
#[derive(Debug, PartialEq)]
enum Got {
    Answer(u16, String),
    Closed,
    Nothing,
}

impl Got {
    fn status(&self) -> u16 {
        match self {
            Got::Answer(status, _) => *status,
            _ => 0,
        }
    }
}

/// Reads a response head from `s` within `patience`.
async fn read_head(s: &mut TcpStream, patience: Duration) -> Got {
    let mut raw = Vec::new();
    let mut buf = [0u8; 4096];
    let read = tokio::time::timeout(patience, async {
        while !raw.windows(4).any(|w| w == b"\r\n\r\n") {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return false,
                Ok(n) => raw.extend_from_slice(&buf[..n]),
            }
        }
        true
    })
    .await;
    match read {
        Err(_) if raw.is_empty() => Got::Nothing,
        Ok(false) if raw.is_empty() => Got::Closed,
        _ => {
            let head = String::from_utf8_lossy(&raw).to_ascii_lowercase();
            let status = head
                .split_whitespace()
                .nth(1)
                .and_then(|c| c.parse().ok())
                .unwrap_or(0);
            Got::Answer(status, head)
        }
    }
}

/// Whether the gateway closed `s` (after any answer) within `patience`.
async fn closed(s: &mut TcpStream, patience: Duration) -> bool {
    let mut buf = [0u8; 4096];
    tokio::time::timeout(patience, async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return true,
                Ok(_) => {}
            }
        }
    })
    .await
    .unwrap_or(false)
}

/// One request on a new connection from `from`, with `Connection: close`.
#[derive(Debug)]
struct Reply {
    status: u16,
    /// For failure messages.
    #[allow(dead_code, reason = "read through Debug, in failure messages")]
    head: String,
}

async fn request(from: IpAddr, gateway: SocketAddr, head: &[u8]) -> Reply {
    let Ok(mut s) = connect_from(from, gateway).await else {
        return Reply {
            status: 0,
            head: "no connection".to_owned(),
        };
    };
    let _ = s.write_all(head).await;
    match read_head(&mut s, PATIENCE).await {
        Got::Answer(status, head) => Reply { status, head },
        other => Reply {
            status: 0,
            head: format!("{other:?}"),
        },
    }
}

/// `curl -x http://crawler:<token>@gateway url`: the status.
async fn curl(gateway: SocketAddr, url: &str) -> String {
    let proxy = format!("http://crawler:{TOKEN}@{gateway}");
    let out = tokio::time::timeout(
        Duration::from_secs(30),
        tokio::process::Command::new("curl")
            .args([
                "-q",
                "-s",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
                "-x",
                &proxy,
                url,
            ])
            .kill_on_drop(true)
            .output(),
    )
    .await
    .map_or_else(
        |_| "curl took over 30 s".to_owned(),
        |out| String::from_utf8_lossy(&out.unwrap().stdout).into_owned(),
    );
    out.trim().to_owned()
}

/// The `n`-th of many distinct loopback client addresses (127.0.10.1 on).
fn flood_address(n: usize) -> IpAddr {
    let n = u32::try_from(n).unwrap();
    IpAddr::V4(Ipv4Addr::new(127, 0, 10 + (n / 250) as u8, 1 + (n % 250) as u8))
}

const FLOOD: usize = 3000;
const FLOOD_HEAD: usize = 56 * 1000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_thousand_unauthenticated_partial_heads_leave_the_operator_under_100_mib_more() {
    raise_own_file_limit();
    let dir = OperatorDir::new(PROVIDER);
    let (site, _) = http_target_with(Behaviour::Status(204)).await;
    let settings = format!("{{destinations: {DESTINATIONS}}}");
    // Room for the flood in the file limit: the cap is not what holds it back.
    let (operator, gateway) = operator_with_gateway(&dir, &settings, Some(8192), site).await;
    let pid = operator.pid();
    // A few served requests first, so that idle includes what serving costs.
    for i in 0..5 {
        let got = request(
            IpAddr::V4(Ipv4Addr::LOCALHOST),
            gateway,
            &get(site, &format!("/idle-{i}"), true, 0),
        )
        .await;
        assert_eq!(got.status, 204, "{got:?}");
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let idle = rss(pid);

    let started = Instant::now();
    let mut flood = Vec::new();
    let mut peak = idle;
    let head = partial_head(site, FLOOD_HEAD);
    for batch in 0..FLOOD / 100 {
        let connects = (0..100).map(|i| {
            let head = &head;
            async move {
                let mut s = connect_from(flood_address(batch * 100 + i), gateway).await.ok()?;
                // The gateway may stop reading (and answer) before all of it is written.
                let _ = tokio::time::timeout(Duration::from_secs(5), s.write_all(head)).await;
                Some(s)
            }
        });
        flood.extend(futures::future::join_all(connects).await.into_iter().flatten());
        peak = peak.max(rss(pid));
    }
    assert_alive(&operator, "under the flood");
    eprintln!(
        "{} of {FLOOD} connections sent {FLOOD_HEAD} bytes of a head in {:?}",
        flood.len(),
        started.elapsed()
    );
    assert!(
        flood.len() >= FLOOD * 9 / 10,
        "only {} of {FLOOD} connected",
        flood.len()
    );

    // Served during the flood.
    let asked = Instant::now();
    let during = curl(gateway, &format!("http://{site}/during")).await;
    eprintln!("curl during the flood: {during} in {:?}", asked.elapsed());
    assert_eq!(
        during,
        "204",
        "curl with the token during the flood\n{}",
        operator.logs()
    );
    peak = peak.max(rss(pid));

    // Each flooder was answered 431 (and closed), or is held within the budget.
    let outcomes = futures::future::join_all(
        flood
            .iter_mut()
            .map(|s| async move { read_head(s, Duration::from_secs(3)).await }),
    )
    .await;
    peak = peak.max(rss(pid));
    let refused = outcomes.iter().filter(|g| g.status() == 431).count();
    let ended = outcomes.iter().filter(|g| **g == Got::Closed).count();
    let held = outcomes.iter().filter(|g| **g == Got::Nothing).count();
    let other: Vec<&Got> = outcomes
        .iter()
        .filter(|g| !matches!(g, Got::Closed | Got::Nothing) && g.status() != 431)
        .collect();
    eprintln!(
        "RSS idle {} MiB, peak {} MiB (+{} MiB); flooders: {refused} got 431, {ended} closed, {held} held",
        idle / MIB,
        peak / MIB,
        (peak - idle) / MIB
    );
    assert!(
        other.is_empty(),
        "unexpected answers: {:?}",
        &other[..other.len().min(3)]
    );
    for got in &outcomes {
        if let Got::Answer(_, head) = got {
            assert!(
                head.contains("egress-gateway-error: head_budget_exhausted"),
                "{head}"
            );
        }
    }
    // 16 MiB of budget holds at most ~320 heads of 56 KB (less the free 4 KiB each).
    assert!(held <= 400, "{held} flooders held beyond what the budget allows");
    assert!(
        peak - idle < 100 * MIB,
        "the flood raised the operator's RSS from {} to {} MiB",
        idle / MIB,
        peak / MIB
    );
    assert_alive(&operator, "after the flood");
    let logs = operator.logs();
    let lines = logs.lines().filter(|l| l.contains("head budget")).count();
    assert!(lines >= 1, "the exhausted budget is logged\n{logs}");
    assert!(
        lines <= 3,
        "the exhausted budget is logged once per burst, not {lines} times"
    );

    drop(flood);
    assert_eq!(curl(gateway, &format!("http://{site}/after")).await, "204");
    operator.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_holds_at_most_its_share_of_unauthenticated_connections() {
    let dir = OperatorDir::new(PROVIDER);
    let (site, _) = http_target_with(Behaviour::Status(204)).await;
    let settings = format!("{{destinations: {DESTINATIONS}, unauthenticated: {{connectionsPerSource: 4}}}}");
    let (operator, gateway) = operator_with_gateway(&dir, &settings, None, site).await;
    let one = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1));
    let another = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));

    // Four keep-alive connections that authenticated: they no longer count.
    let mut crawlers = Vec::new();
    for i in 0..4 {
        let mut s = connect_from(one, gateway).await.unwrap();
        s.write_all(&get(site, &format!("/crawler-{i}"), true, 0))
            .await
            .unwrap();
        assert_eq!(read_head(&mut s, PATIENCE).await.status(), 204);
        crawlers.push(s);
    }
    // Four that have not: held.
    let mut slow = Vec::new();
    for _ in 0..4 {
        let mut s = connect_from(one, gateway).await.unwrap();
        s.write_all(&partial_head(site, 100)).await.unwrap();
        slow.push(s);
    }
    for s in &mut slow {
        assert_eq!(read_head(s, Duration::from_millis(500)).await, Got::Nothing);
    }
    // The fifth from the same address: 429 with the reason, and closed.
    let mut fifth = connect_from(one, gateway).await.unwrap();
    let got = read_head(&mut fifth, PATIENCE).await;
    assert_eq!(got.status(), 429, "{got:?}");
    let Got::Answer(_, head) = &got else {
        unreachable!()
    };
    assert!(
        head.contains("egress-gateway-error: too_many_unauthenticated"),
        "{head}"
    );
    assert!(
        closed(&mut fifth, Duration::from_secs(5)).await,
        "the fifth stays open"
    );
    // Another address is not held back.
    let got = request(another, gateway, &get(site, "/another", true, 0)).await;
    assert_eq!(got.status, 204, "from another address: {got:?}");
    // The authenticated ones keep serving.
    for (i, s) in crawlers.iter_mut().enumerate() {
        s.write_all(&get(site, &format!("/crawler-again-{i}"), true, 0))
            .await
            .unwrap();
        assert_eq!(
            read_head(s, PATIENCE).await.status(),
            204,
            "crawler connection {i}"
        );
    }
    // One slow connection closes: its room is given back.
    drop(slow.pop());
    operator
        .eventually("room for a new connection", Duration::from_secs(10), async || {
            let got = request(one, gateway, &get(site, "/room", true, 0)).await;
            if got.status == 204 {
                Ok(())
            } else {
                Err(format!("{got:?}"))
            }
        })
        .await;
    assert_alive(&operator, "after the per-address cap");
    operator.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unfinished_heads_share_a_budget_until_their_connection_authenticates() {
    let dir = OperatorDir::new(PROVIDER);
    let (site, _) = http_target_with(Behaviour::Status(204)).await;
    // 16 KiB for every unfinished head beyond the free 4 KiB each.
    let settings = format!("{{destinations: {DESTINATIONS}, unauthenticated: {{headBudget: 16384}}}}");
    let (operator, gateway) = operator_with_gateway(&dir, &settings, None, site).await;
    let from = IpAddr::V4(Ipv4Addr::LOCALHOST);

    // 10 KiB held: two 4 KiB steps of the budget taken.
    let mut holder = connect_from(from, gateway).await.unwrap();
    holder.write_all(&partial_head(site, 10 * 1024)).await.unwrap();
    assert_eq!(
        read_head(&mut holder, Duration::from_millis(500)).await,
        Got::Nothing
    );
    // 20 KB more than is left: 431 with the reason, and closed.
    let mut over = connect_from(from, gateway).await.unwrap();
    let _ = over.write_all(&partial_head(site, 20 * 1024)).await;
    let got = read_head(&mut over, PATIENCE).await;
    assert_eq!(got.status(), 431, "{got:?}");
    let Got::Answer(_, head) = &got else {
        unreachable!()
    };
    assert!(
        head.contains("egress-gateway-error: head_budget_exhausted"),
        "{head}"
    );
    assert!(
        closed(&mut over, Duration::from_secs(5)).await,
        "the refused connection stays open"
    );
    // A 10 KiB head that fits what is left is served.
    let mut crawler = connect_from(from, gateway).await.unwrap();
    crawler
        .write_all(&get(site, "/fits", true, 10 * 1024))
        .await
        .unwrap();
    assert_eq!(read_head(&mut crawler, PATIENCE).await.status(), 204);
    // Once authenticated, a 30 KB head on the same connection takes nothing from the budget.
    crawler
        .write_all(&get(site, "/large", true, 30 * 1024))
        .await
        .unwrap();
    assert_eq!(read_head(&mut crawler, PATIENCE).await.status(), 204);
    // A 407 keeps a connection whose head was small (challenge and
    // response on one connection), and closes one whose head was large.
    let mut small = connect_from(from, gateway).await.unwrap();
    small
        .write_all(&get(site, "/small-407", false, 100))
        .await
        .unwrap();
    assert_eq!(read_head(&mut small, PATIENCE).await.status(), 407);
    small.write_all(&get(site, "/after-407", true, 0)).await.unwrap();
    assert_eq!(
        read_head(&mut small, PATIENCE).await.status(),
        204,
        "kept after a small 407"
    );
    let mut large = connect_from(from, gateway).await.unwrap();
    large
        .write_all(&get(site, "/large-407", false, 6 * 1024))
        .await
        .unwrap();
    assert_eq!(read_head(&mut large, PATIENCE).await.status(), 407);
    assert!(
        closed(&mut large, Duration::from_secs(5)).await,
        "kept after a large 407"
    );
    // The holder leaves: its share comes back.
    drop(holder);
    operator
        .eventually("the budget given back", Duration::from_secs(10), async || {
            let got = request(from, gateway, &get(site, "/whole-budget", true, 18 * 1024)).await;
            if got.status == 204 {
                Ok(())
            } else {
                Err(format!("{got:?}"))
            }
        })
        .await;
    assert_alive(&operator, "after the budget tests");
    operator.stop().await;
}
