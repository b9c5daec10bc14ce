//! The gateway choosing, keeping and leaving proxies, through the real
//! binary in standalone mode with local built-in proxies, each leaving from
//! an outgoing address of its own on loopback (so the site can tell them
//! apart):
//! - a sticky session keeps one proxy for 50 requests, moves to one other
//!   proxy when that one is killed (its first request there a POST whose
//!   body is sent again whole), and stays there;
//! - sticky sessions are back on their proxies after the operator is
//!   killed and restarted (they land by rank, not by what it remembered);
//! - 8 clients fetching while a proxy is killed see no failed request;
//! - a site that answers 403 to one proxy's address: the proxy is reported
//!   blocked for it and not chosen for it again, and no request the client
//!   sees fails;
//! - with `maxLeasesPerProxy: 1` and 3 proxies, no more than 3 tunnels are
//!   open at the site at any instant, while 8 clients keep asking;
//! - a username that does not parse is a 400, a token over its rate a 429
//!   with `Retry-After` (whatever the username), and an operator killed under
//!   an open tunnel leaves no lease behind: restarted, its proxy serves at
//!   once.

mod support;

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::Value;
use support::operator::{OperatorDir, OperatorProcess};
use support::process::{free_port, health_target, instance_pid};
use support::site::{Site, SiteLog};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const TOKEN: &str = "gw-failover-t0ken-51ab";
const DESTINATIONS: &str = "{allow: [127.0.0.0/8, 1024-65535]}";

fn provider(network: &str) -> String {
    format!(
        "providers:\n  - {{name: local, type: local, local: {{implementation: builtin, \
         destinations: {{allow: [127.0.0.0/8, 1024-65535]}}, outgoingAddresses: [{network}]}}}}\n"
    )
}

/// A loopback site (support::site): 200 to every request, or 403 to
/// `blocked`'s every request.
async fn site(blocked: Option<IpAddr>) -> (SocketAddr, Arc<SiteLog>) {
    let site = Site::start().await;
    if let Some(source) = blocked {
        site.log.block(source, None);
    }
    (site.addr, site.log)
}

fn basic(user: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(format!("{user}:{TOKEN}"))
}

/// One plain-HTTP GET through the gateway: the status and the lowercase head.
async fn fetch(gateway: SocketAddr, site: SocketAddr, user: &str) -> Result<(u16, String), String> {
    send(gateway, site, user, None).await
}

/// A GET, or a POST of `body`, through the gateway.
async fn send(
    gateway: SocketAddr,
    site: SocketAddr,
    user: &str,
    body: Option<&[u8]>,
) -> Result<(u16, String), String> {
    let mut s = TcpStream::connect(gateway).await.map_err(|e| e.to_string())?;
    let (method, length) = match body {
        Some(b) => ("POST", format!("Content-Length: {}\r\n", b.len())),
        None => ("GET", String::new()),
    };
    let head = format!(
        "{method} http://{site}/page HTTP/1.1\r\nHost: {site}\r\nProxy-Authorization: Basic {}\r\n{length}Connection: close\r\n\r\n",
        basic(user)
    );
    s.write_all(head.as_bytes()).await.map_err(|e| e.to_string())?;
    if let Some(body) = body {
        s.write_all(body).await.map_err(|e| e.to_string())?;
    }
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), s.read_to_end(&mut answer))
        .await
        .map_err(|_| "no answer in 30 s".to_owned())?
        .map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&answer).to_ascii_lowercase();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("no status line: {text:?}"))?;
    Ok((status, text))
}

fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}: ")))
        .map(str::trim)
}

struct Fleet {
    dir: OperatorDir,
    operator: OperatorProcess,
    gateway: SocketAddr,
    settings: (u32, String),
}

impl Fleet {
    /// `count` local proxies behind a gateway with `gateway` settings.
    async fn start(count: usize, network: &str, capacity: u32, gateway: &str) -> Self {
        let dir = OperatorDir::new(&provider(network));
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
        let address: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let settings = (capacity, gateway.to_owned());
        let operator = Self::operator(&dir, address, &settings).await;
        operator.wait_ready(count).await;
        Self {
            dir,
            operator,
            gateway: address,
            settings,
        }
    }

    async fn operator(
        dir: &OperatorDir,
        gateway: SocketAddr,
        (capacity, settings): &(u32, String),
    ) -> OperatorProcess {
        dir.standalone()
            .discovery()
            .gateway_at(gateway)
            .setting(
                "gateway",
                &format!("{{destinations: {DESTINATIONS}, {settings}}}"),
            )
            .setting("maxLeasesPerProxy", &capacity.to_string())
            .setting("leaseCooldown", "0s")
            .env("DISCOVERY_TOKEN", TOKEN)
            .start()
            .await
    }

    /// SIGKILLs the operator and starts another on the same state.
    async fn restart(&mut self) {
        self.operator.kill().await;
        self.operator = Self::operator(&self.dir, self.gateway, &self.settings).await;
    }

    /// The proxies as the lease book sees them (the dashboard's rows:
    /// leases, blocks and errors reported).
    async fn proxies(&self) -> Vec<Value> {
        let dashboard = support::http::dashboard(self.operator.discovery(), TOKEN).await;
        dashboard["proxies"].as_array().unwrap().clone()
    }

    /// SIGKILLs the process of the proxy named `crawl/<name>`.
    async fn kill(&self, proxy: &str) {
        let name = proxy.rsplit('/').next().unwrap();
        let url = self
            .proxies()
            .await
            .into_iter()
            .find(|p| p["name"] == name)
            .and_then(|p| p["url"].as_str().map(str::to_owned))
            .unwrap_or_else(|| panic!("no proxy {proxy}"));
        let port: u16 = url
            .rsplit(':')
            .next()
            .unwrap()
            .trim_end_matches('/')
            .parse()
            .unwrap();
        let instances = self.dir.state().join("local/local/instances");
        let instance = std::fs::read_dir(&instances)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .find(|dir| {
                std::fs::read(dir.join("instance.json"))
                    .ok()
                    .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
                    .is_some_and(|r| r["port"].as_u64() == Some(u64::from(port)))
            })
            .unwrap_or_else(|| panic!("no instance listens on {port}"));
        let pid = instance_pid(&instance).expect("the proxy's process runs");
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL).unwrap();
    }
}

#[tokio::test]
async fn a_sticky_session_keeps_its_proxy_and_moves_once_when_it_dies() {
    let fleet = Fleet::start(3, "127.0.6.0/29", 0, "sessionLifetime: 10m").await;
    let (site, log) = site(None).await;
    let user = "spider-session-s1";
    let mut served_by = HashMap::<String, usize>::new();
    for _ in 0..50 {
        let (status, head) = fetch(fleet.gateway, site, user).await.unwrap();
        assert_eq!(status, 200, "{head}");
        *served_by
            .entry(header(&head, "egress-gateway-proxy").unwrap().to_owned())
            .or_default() += 1;
    }
    assert_eq!(served_by.len(), 1, "one proxy for the session: {served_by:?}");
    let first = served_by.keys().next().unwrap().clone();
    {
        let sources = log.requests_by_source();
        assert_eq!(sources.len(), 1, "the site saw one source address: {sources:?}");
    }
    // Another session goes its own way (where it ranks; not pinned here).
    let (status, _) = fetch(fleet.gateway, site, "spider-session-s2").await.unwrap();
    assert_eq!(status, 200);

    fleet.kill(&first).await;
    // The first request after: a POST, tried on the dead proxy, then sent
    // again (its body fits retryBodyLimit) on the one the session moves to.
    let form: Vec<u8> = (0..20_000u32).map(|i| b'a' + (i % 26) as u8).collect();
    let (status, head) = send(fleet.gateway, site, user, Some(&form)).await.unwrap();
    assert_eq!(status, 200, "{head}\n{}", fleet.operator.logs());
    assert_eq!(
        header(&head, "egress-gateway-session-moved-from"),
        Some("true"),
        "{head}"
    );
    assert_eq!(log.bodies(), [form], "the body arrived whole, once");
    let moved_to = header(&head, "egress-gateway-proxy").unwrap().to_owned();
    assert_ne!(moved_to, first, "the session moved");
    let mut after = Vec::new();
    for _ in 0..30 {
        let (status, head) = fetch(fleet.gateway, site, user).await.unwrap();
        assert_eq!(status, 200, "no request fails when its proxy dies: {head}");
        after.push((
            header(&head, "egress-gateway-proxy").unwrap().to_owned(),
            header(&head, "egress-gateway-session-moved-from").is_some(),
        ));
    }
    assert!(
        after.iter().all(|(proxy, moved)| *proxy == moved_to && !moved),
        "it stays on the one it moved to, moving once: {after:?}"
    );
    fleet.operator.stop().await;
}

#[tokio::test]
async fn sticky_sessions_land_on_their_proxies_again_after_the_operator_restarts() {
    let mut fleet = Fleet::start(4, "127.0.11.0/29", 0, "sessionLifetime: 10m").await;
    let (site, _) = site(None).await;
    let sessions: Vec<String> = (0..8).map(|i| format!("spider-session-r{i}")).collect();
    // Each session's proxy, asking in `order` (the book's own choice would
    // follow the order; a session's rank does not).
    let served =
        async |fleet: &Fleet, order: &mut dyn Iterator<Item = &String>| -> BTreeMap<String, String> {
            let mut by_session = BTreeMap::new();
            for user in order {
                for _ in 0..3 {
                    let (status, head) = fetch(fleet.gateway, site, user).await.unwrap();
                    assert_eq!(status, 200, "{head}");
                    assert_eq!(header(&head, "egress-gateway-session-moved-from"), None, "{head}");
                    let proxy = header(&head, "egress-gateway-proxy").unwrap().to_owned();
                    let first = by_session.entry(user.clone()).or_insert_with(|| proxy.clone());
                    assert_eq!(*first, proxy, "{user} keeps its proxy");
                }
            }
            by_session
        };
    let before = served(&fleet, &mut sessions.iter()).await;
    let used: std::collections::BTreeSet<&String> = before.values().collect();
    assert!(used.len() >= 2, "sessions spread over the proxies: {before:?}");

    fleet.restart().await;
    // The lease book fills again as the proxies' verdicts arrive.
    fleet
        .operator
        .eventually(
            "the four proxies leasable again",
            Duration::from_secs(30),
            async || {
                let proxies = fleet.proxies().await;
                let ready = proxies
                    .iter()
                    .filter(|p| p["ready"] == true && p["healthy"] == true && p["url"].is_string())
                    .count();
                if ready == 4 {
                    Ok(())
                } else {
                    Err(format!("{proxies:?}"))
                }
            },
        )
        .await;
    let after = served(&fleet, &mut sessions.iter().rev()).await;
    assert_eq!(
        after, before,
        "every session is back on its proxy after the restart"
    );
    fleet.operator.stop().await;
}

#[tokio::test]
async fn a_proxy_killed_under_eight_clients_costs_no_request() {
    let fleet = Fleet::start(3, "127.0.7.0/29", 1, "capacityWait: 10s").await;
    let (site, log) = site(None).await;
    let stop = Arc::new(AtomicBool::new(false));
    let mut clients = Vec::new();
    for c in 0..8 {
        let (stop, gateway) = (stop.clone(), fleet.gateway);
        clients.push(tokio::spawn(async move {
            let (mut ok, mut failed) = (0, Vec::new());
            while !stop.load(Ordering::SeqCst) {
                match fetch(gateway, site, &format!("client{c}")).await {
                    Ok((200, _)) => ok += 1,
                    Ok((status, head)) => failed.push(format!("{status}: {head}")),
                    Err(e) => failed.push(e),
                }
            }
            (ok, failed)
        }));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let victim = fleet.proxies().await[0]["name"].as_str().unwrap().to_owned();
    fleet.kill(&format!("crawl/{victim}")).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    stop.store(true, Ordering::SeqCst);
    let (mut ok, mut failed) = (0, Vec::new());
    for client in clients {
        let (o, f) = client.await.unwrap();
        ok += o;
        failed.extend(f);
    }
    assert!(
        failed.is_empty(),
        "{} of {} requests failed: {:?}",
        failed.len(),
        ok + failed.len(),
        &failed[..failed.len().min(5)]
    );
    assert!(ok > 50, "the clients kept fetching: {ok}");
    let victim_errors = fleet
        .proxies()
        .await
        .into_iter()
        .find(|p| p["name"] == victim.as_str())
        .map(|p| p["errors"].as_u64().unwrap_or(0));
    assert!(
        victim_errors.unwrap_or(0) >= 1,
        "the dead proxy was reported: {victim_errors:?}"
    );
    assert!(log.requests_by_source().len() >= 2);
    let logs = fleet.operator.logs();
    assert!(!logs.contains(TOKEN), "the token reached the log");
    fleet.operator.stop().await;
}

#[tokio::test]
async fn a_proxy_the_site_blocks_is_learnt_and_no_request_fails() {
    // Two proxies, leaving from 127.0.8.1 and 127.0.8.2; the site blocks the first address.
    let fleet = Fleet::start(2, "127.0.8.0/30", 0, "blocks: [{status: [403]}]").await;
    let blocked: IpAddr = "127.0.8.1".parse().unwrap();
    let (site, log) = site(Some(blocked)).await;
    for i in 0..20 {
        let (status, head) = fetch(fleet.gateway, site, "spider").await.unwrap();
        assert_eq!(status, 200, "request {i}: {head}");
        assert!(header(&head, "egress-gateway-blocked").is_none());
    }
    let sources = log.requests_by_source();
    // Never leased for the site, the blocked proxy is tried once (its
    // request then goes to the other), and never again for this site.
    assert_eq!(sources.get(&blocked).copied(), Some(1), "{sources:?}");
    let proxies = fleet.proxies().await;
    let blocked_targets: u64 = proxies
        .iter()
        .map(|p| p["blockedTargets"].as_u64().unwrap_or(0))
        .sum();
    assert_eq!(blocked_targets, 1, "the block was reported: {proxies:?}");
    fleet.operator.stop().await;
}

#[tokio::test]
async fn capacity_bounds_the_tunnels_open_upstream() {
    let fleet = Fleet::start(3, "127.0.9.0/29", 1, "capacityWait: 20s").await;
    let (site, log) = site(None).await;
    let mut clients = Vec::new();
    for _ in 0..8 {
        let gateway = fleet.gateway;
        clients.push(tokio::spawn(async move {
            let mut opened = 0;
            for _ in 0..3 {
                let mut s = TcpStream::connect(gateway).await.unwrap();
                let head = format!(
                    "CONNECT {site} HTTP/1.1\r\nHost: {site}\r\nProxy-Authorization: Basic {}\r\n\r\n",
                    basic("tunneler")
                );
                s.write_all(head.as_bytes()).await.unwrap();
                let mut got = Vec::new();
                let mut byte = [0u8; 1];
                while !got.ends_with(b"\r\n\r\n") {
                    if s.read(&mut byte).await.unwrap() == 0 {
                        break;
                    }
                    got.push(byte[0]);
                }
                let line = String::from_utf8_lossy(&got).into_owned();
                assert!(line.starts_with("HTTP/1.1 200"), "{line}");
                // Held open a while, then one request inside: the site ends
                // the connection (and counts it closed) before the client
                // sees the end and the gateway gives the lease back.
                tokio::time::sleep(Duration::from_millis(300)).await;
                s.write_all(format!("GET /page HTTP/1.1\r\nHost: {site}\r\n\r\n").as_bytes())
                    .await
                    .unwrap();
                let mut answer = Vec::new();
                s.read_to_end(&mut answer).await.unwrap();
                assert!(
                    answer.starts_with(b"HTTP/1.1 200"),
                    "{}",
                    String::from_utf8_lossy(&answer)
                );
                opened += 1;
            }
            opened
        }));
    }
    let mut opened = 0;
    for client in clients {
        opened += client.await.unwrap();
    }
    assert_eq!(opened, 24, "every tunnel opened in the end");
    let most = log.most_open();
    assert!(most <= 3, "{most} tunnels were open at the site at once");
    assert!(most >= 2, "the proxies were used side by side: {most}");

    // The 200 names the proxy and the lease: the crawler reports a block
    // seen inside the tunnel after closing it (its own identity may;
    // crawler_identities.rs has the rest of the rule).
    let mut s = TcpStream::connect(fleet.gateway).await.unwrap();
    let head = format!(
        "CONNECT {site} HTTP/1.1\r\nHost: {site}\r\nProxy-Authorization: Basic {}\r\n\r\n",
        basic("tunneler")
    );
    s.write_all(head.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    let mut byte = [0u8; 1];
    while !got.ends_with(b"\r\n\r\n") {
        assert_eq!(s.read(&mut byte).await.unwrap(), 1);
        got.push(byte[0]);
    }
    let reply = String::from_utf8_lossy(&got).to_ascii_lowercase();
    let proxy = header(&reply, "egress-gateway-proxy")
        .expect("the proxy named")
        .to_owned();
    let lease = header(&reply, "egress-gateway-lease")
        .expect("the lease named")
        .to_owned();
    drop(s);
    let auth = format!("Bearer {TOKEN}");
    let (status, body) = support::http::request(
        fleet.operator.discovery(),
        "POST",
        &format!("/v1/leases/{lease}/report"),
        &[("Authorization", &auth), ("Content-Type", "application/json")],
        Some(r#"{"outcome":"blocked","detail":"captcha inside the tunnel"}"#),
    )
    .await;
    assert!((200..300).contains(&status), "{status}: {body}");
    let reported = fleet
        .proxies()
        .await
        .into_iter()
        .find(|p| format!("crawl/{}", p["name"].as_str().unwrap()) == proxy)
        .unwrap();
    assert_eq!(reported["blockedTargets"], 1, "{reported}");
    fleet.operator.stop().await;
}

#[tokio::test]
async fn refusals_of_its_own_and_a_restart_that_frees_the_gateway_s_proxies() {
    let mut fleet = Fleet::start(
        1,
        "127.0.10.0/30",
        1,
        "rateLimit: {perClient: 1, burst: 2}, capacityWait: 1s",
    )
    .await;
    let (site, _) = site(None).await;
    // A username that does not parse: 400, naming why.
    let (status, head) = fetch(fleet.gateway, site, "spider-sesstime-0").await.unwrap();
    assert_eq!(status, 400, "{head}");
    assert_eq!(header(&head, "egress-gateway-error"), Some("bad_username"));
    // Two requests in a burst, the third waits for the client's rate.
    for _ in 0..2 {
        assert_eq!(fetch(fleet.gateway, site, "limited").await.unwrap().0, 200);
    }
    let (status, head) = fetch(fleet.gateway, site, "limited").await.unwrap();
    assert_eq!(status, 429, "{head}");
    assert_eq!(header(&head, "egress-gateway-error"), Some("rate_limited"));
    assert_eq!(header(&head, "retry-after"), Some("1"));
    // The rate is the token's, whatever the username says.
    let (status, head) = fetch(fleet.gateway, site, "other").await.unwrap();
    assert_eq!(status, 429, "another username, the same token: {head}");
    // One request a second: wait for one before each of the next two.
    tokio::time::sleep(Duration::from_millis(1100)).await;

    // A tunnel holds the one proxy; the operator is killed under it.
    let mut tunnel = TcpStream::connect(fleet.gateway).await.unwrap();
    let head = format!(
        "CONNECT {site} HTTP/1.1\r\nHost: {site}\r\nProxy-Authorization: Basic {}\r\n\r\n",
        basic("holder")
    );
    tunnel.write_all(head.as_bytes()).await.unwrap();
    let mut reply = [0u8; 12];
    tunnel.read_exact(&mut reply).await.unwrap();
    assert_eq!(&reply, b"HTTP/1.1 200");
    assert_eq!(fleet.proxies().await[0]["activeLeases"], 1);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let (status, head) = fetch(fleet.gateway, site, "waiting").await.unwrap();
    assert_eq!(status, 503, "the proxy is full: {head}");
    assert_eq!(header(&head, "egress-gateway-error"), Some("no_capacity"));
    fleet.restart().await;
    fleet.operator.wait_ready(1).await;
    // The lease the dead process held for its tunnel is not restored: the
    // proxy serves at once, not after maxLeaseTtl.
    let listed = fleet
        .operator
        .eventually(
            "the proxy back in the lease book",
            Duration::from_secs(30),
            async || fleet.proxies().await.into_iter().next().ok_or("not listed"),
        )
        .await;
    assert_eq!(listed["activeLeases"], 0, "{listed}");
    let (status, head) = fetch(fleet.gateway, site, "after").await.unwrap();
    assert_eq!(status, 200, "{head}");
    drop(tunnel);
    fleet.operator.stop().await;
}
