//! Named crawler identities and lease owners (docs/security.md, "Crawler
//! identities"), through the real binary in standalone mode with one local
//! built-in proxy leaving from an outgoing address of its own, so a site
//! tells by the peer address which proxy a connection came through:
//!
//! - a gateway tunnel's lease (its `egress-gateway-lease` id) cannot be
//!   released or renewed through the API (`403 not_owner`; the identity
//!   it serves may report on it);
//!   the tunnel keeps working and no second tunnel is granted on the proxy
//!   (capacity 1) while it relays — the site never sees two connections
//!   from the proxy's address at once;
//! - usernames rotated under one token (`bob1` … `bob6`) share the token's
//!   rate limit (`{perClient: 1, burst: 2}`: the third is `429`); a wrong
//!   password from a `clientNetworks` address is `407`, no credentials
//!   from there are admitted (as `anonymous`, with a rate of their own);
//! - two identities from a tokens directory: an API lease taken by one is
//!   refused (`403 not_owner`) to the other for release, report and
//!   renewal, held and in the report grace after release, and served to
//!   its owner;
//! - a token file added to the directory is accepted, and one removed is
//!   refused, within 10 s, without a restart; a file that does not
//!   validate is named in the log and leaves the identities in force; no
//!   token ever reaches the log.

mod support;

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use support::operator::{OperatorDir, OperatorProcess};
use support::process::{free_port, health_target};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const DESTINATIONS: &str = "{allow: [127.0.0.0/8, 1024-65535]}";
/// Generous: the suite runs many test binaries on two cores.
const PATIENCE: Duration = Duration::from_secs(60);
/// The documented bound on a tokens directory change taking effect.
const RELOAD_BOUND: Duration = Duration::from_secs(10);

/// The built-in proxy leaving from the first address of `network`.
fn provider(network: &str) -> String {
    format!(
        "providers:\n  - {{name: local, type: local, local: {{implementation: builtin, \
         destinations: {{allow: [127.0.0.0/8, 1024-65535]}}, outgoingAddresses: [{network}]}}}}\n"
    )
}

fn basic(user: &str, password: &str) -> String {
    use base64::Engine;
    let pair = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    format!("Basic {pair}")
}

fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}: ")))
        .map(str::trim)
}

// ---------------------------------------------------------------- the site

/// Connections a site has open now and at most, per source address.
#[derive(Default)]
struct SiteLog {
    open: Mutex<HashMap<IpAddr, usize>>,
    most_from_one_source: AtomicUsize,
}

impl SiteLog {
    fn opened(&self, peer: IpAddr) {
        let mut open = self.open.lock().unwrap();
        let now = open.entry(peer).or_default();
        *now += 1;
        self.most_from_one_source.fetch_max(*now, Ordering::SeqCst);
    }

    fn closed(&self, peer: IpAddr) {
        *self.open.lock().unwrap().entry(peer).or_default() -= 1;
    }
}

/// A loopback site answering one request per connection with 200;
/// connections are counted from accept to close, so a tunnel held open
/// counts while it lasts.
async fn site() -> (SocketAddr, Arc<SiteLog>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let log = Arc::new(SiteLog::default());
    let seen = log.clone();
    tokio::spawn(async move {
        while let Ok((mut s, peer)) = listener.accept().await {
            let log = seen.clone();
            tokio::spawn(async move {
                log.opened(peer.ip());
                let mut buf = vec![0u8; 4096];
                let mut got = Vec::new();
                while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => {
                            log.closed(peer.ip());
                            return;
                        }
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                    }
                }
                let _ = s
                    .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
                    .await;
                let _ = s.shutdown().await;
                log.closed(peer.ip());
            });
        }
    });
    (addr, log)
}

// ------------------------------------------------------------ the operator

/// One proxy (`p0`, leaving from `outgoing`), capacity 1, no rest after a
/// release, the discovery API and the gateway; `settings` are more
/// standalone settings, `env` the environment.
async fn operator(
    dir: &OperatorDir,
    gateway_settings: &str,
    settings: &[(&str, String)],
    env: &[(&str, &str)],
) -> (OperatorProcess, SocketAddr) {
    let health = health_target();
    dir.write_manifest(
        "p0",
        &format!(
            "apiVersion: crawl.example.com/v1alpha1\nkind: Proxy\nmetadata: {{name: p0, namespace: crawl}}\n\
             spec: {{mode: Managed, provider: local, healthCheck: {{url: \"{health}\", interval: 1s}}}}\n"
        ),
    );
    let gateway: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let mut builder = dir
        .standalone()
        .discovery()
        .setting("gatewayBindAddress", &format!("\"{gateway}\""))
        .setting(
            "gateway",
            &format!("{{destinations: {DESTINATIONS}, {gateway_settings}}}"),
        )
        .setting("maxLeasesPerProxy", "1")
        .setting("leaseCooldown", "0s");
    for (key, value) in settings {
        builder = builder.setting(key, value);
    }
    for (key, value) in env {
        builder = builder.env(key, value);
    }
    let operator = builder.start().await;
    operator.wait_ready(1).await;
    (operator, gateway)
}

/// An API call with `token` as the bearer token: the status and the body.
async fn api(
    operator: &OperatorProcess,
    token: &str,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> (u16, Value) {
    let auth = format!("Bearer {token}");
    let mut headers = vec![("Authorization", auth.as_str())];
    if body.is_some() {
        headers.push(("Content-Type", "application/json"));
    }
    let (status, text) = support::http::request(operator.discovery(), method, path, &headers, body).await;
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// Waits until the lease book lists the proxy healthy (it turns Ready
/// before its health verdict reaches the book).
async fn proxy_in_book(operator: &OperatorProcess, token: &str) {
    operator
        .eventually("the proxy healthy in the lease book", PATIENCE, async || {
            let (status, proxies) = api(operator, token, "GET", "/v1/proxies", None).await;
            match proxies.as_array().and_then(|p| p.first()) {
                Some(p) if status == 200 && p["healthy"] == true => Ok(()),
                _ => Err(format!("{status}: {proxies}")),
            }
        })
        .await;
}

async fn active_leases(operator: &OperatorProcess, token: &str) -> u64 {
    let (status, proxies) = api(operator, token, "GET", "/v1/proxies", None).await;
    assert_eq!(status, 200, "{proxies}");
    proxies
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["activeLeases"].as_u64().unwrap())
        .sum()
}

/// One plain GET through the gateway, `authorization` as the
/// `Proxy-Authorization` (none: no header): the status and lowercase head.
async fn fetch(gateway: SocketAddr, site: SocketAddr, authorization: Option<&str>) -> (u16, String) {
    let mut s = TcpStream::connect(gateway).await.unwrap();
    let auth = authorization.map_or_else(String::new, |a| format!("Proxy-Authorization: {a}\r\n"));
    let head = format!("GET http://{site}/page HTTP/1.1\r\nHost: {site}\r\n{auth}Connection: close\r\n\r\n");
    s.write_all(head.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), s.read_to_end(&mut answer))
        .await
        .expect("an answer within 30 s")
        .unwrap();
    let text = String::from_utf8_lossy(&answer).to_ascii_lowercase();
    let status = text.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    (status, text)
}

/// A `CONNECT` to `site` through the gateway: the stream and the
/// lowercase response head.
async fn connect(gateway: SocketAddr, site: SocketAddr, authorization: &str) -> (TcpStream, String) {
    let mut s = TcpStream::connect(gateway).await.unwrap();
    let head =
        format!("CONNECT {site} HTTP/1.1\r\nHost: {site}\r\nProxy-Authorization: {authorization}\r\n\r\n");
    s.write_all(head.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    let mut byte = [0u8; 1];
    while !got.ends_with(b"\r\n\r\n") {
        let read = tokio::time::timeout(Duration::from_secs(30), s.read(&mut byte))
            .await
            .expect("a CONNECT answer within 30 s")
            .unwrap();
        if read == 0 {
            break;
        }
        got.push(byte[0]);
    }
    (s, String::from_utf8_lossy(&got).to_ascii_lowercase())
}

fn assert_not_logged(operator: &OperatorProcess, tokens: &[&str]) {
    let logs = operator.logs();
    for token in tokens {
        assert!(!logs.contains(token), "a token reached the log");
    }
}

// ------------------------------------------------------------------ tests

/// Issue 51, item 4: `DELETE /v1/leases/<id from egress-gateway-lease>`
/// answered 204 for a tunnel another client still used, and the next
/// tunnel was granted on the same proxy while the first still relayed.
#[tokio::test]
async fn a_gateway_lease_is_the_gateway_s_and_its_proxy_is_never_overbooked() {
    const TOKEN: &str = "identities-gw-t0ken-4c1";
    let dir = OperatorDir::new(&provider("127.0.51.0/30"));
    let (operator, gateway) = operator(&dir, "capacityWait: 1s", &[], &[("DISCOVERY_TOKEN", TOKEN)]).await;
    proxy_in_book(&operator, TOKEN).await;
    let (site, log) = site().await;
    let auth = basic("crawler", TOKEN);

    let (mut tunnel, head) = connect(gateway, site, &auth).await;
    assert!(head.starts_with("http/1.1 200"), "{head}");
    let lease = header(&head, "egress-gateway-lease")
        .expect("the lease named")
        .to_owned();
    // Whoever asks, even the identity the tunnel is for: only the gateway ends it.
    let released = api(&operator, TOKEN, "DELETE", &format!("/v1/leases/{lease}"), None).await;
    // The proxy is still the tunnel's: another tunnel waits and is refused.
    let (second, second_head) = connect(gateway, site, &auth).await;
    drop(second);
    // The identity the tunnel is for may report on it (a block seen inside).
    let reported = api(
        &operator,
        TOKEN,
        "POST",
        &format!("/v1/leases/{lease}/report"),
        Some(r#"{"outcome":"ok"}"#),
    )
    .await;
    let renewed = api(
        &operator,
        TOKEN,
        "POST",
        &format!("/v1/leases/{lease}/renew"),
        None,
    )
    .await;
    // The first tunnel still relays.
    tunnel
        .write_all(format!("GET /page HTTP/1.1\r\nHost: {site}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut answer = Vec::new();
    tunnel.read_to_end(&mut answer).await.unwrap();
    drop(tunnel);

    let most = log.most_from_one_source.load(Ordering::SeqCst);
    assert_eq!(
        most, 1,
        "the proxy (capacity 1) carried {most} connections at once"
    );
    assert!(
        second_head.starts_with("http/1.1 503"),
        "a second tunnel on the full proxy: {second_head}"
    );
    assert_eq!(reported.0, 204, "its own identity reports: {}", reported.1);
    for (what, (status, body)) in [("release", released), ("renewal", renewed)] {
        assert_eq!(status, 403, "{what} of the gateway's lease: {body}");
        assert_eq!(body["error"], "not_owner", "{what}: {body}");
        assert!(
            body["message"].as_str().unwrap().contains("gateway"),
            "{what}: {body}"
        );
    }
    assert!(
        answer.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&answer)
    );
    // The gateway itself still gives its lease back.
    operator
        .eventually(
            "the tunnel's lease released",
            Duration::from_secs(15),
            async || match active_leases(&operator, TOKEN).await {
                0 => Ok(()),
                n => Err(format!("{n} active")),
            },
        )
        .await;
    let (status, body) = api(
        &operator,
        TOKEN,
        "POST",
        &format!("/v1/leases/{lease}/report"),
        Some(r#"{"outcome":"error"}"#),
    )
    .await;
    assert_eq!(status, 204, "in the report grace too, its own identity: {body}");
    assert_not_logged(&operator, &[TOKEN]);
    operator.stop().await;
}

/// Issue 51, item 5: rotating names (`bob1` … `bob6`) all got 200 under
/// `{perClient: 1, burst: 2}`, and from a `clientNetworks` address a wrong
/// password still set the client name.
#[tokio::test]
async fn rotating_usernames_share_their_token_s_rate_and_a_wrong_password_is_refused_everywhere() {
    const TOKEN: &str = "identities-rate-t0ken-9e2";
    let dir = OperatorDir::new(&provider("127.0.52.0/30"));
    let (operator, gateway) = operator(
        &dir,
        "clientNetworks: [127.0.0.0/8], rateLimit: {perClient: 1, burst: 2}, capacityWait: 5s",
        &[],
        &[("DISCOVERY_TOKEN", TOKEN)],
    )
    .await;
    proxy_in_book(&operator, TOKEN).await;
    let (site, _) = site().await;

    // One token, six names: two in the burst, then the token's rate (one
    // a second: a slow machine may earn one more meanwhile).
    let started = Instant::now();
    let mut statuses = Vec::new();
    for i in 1..=6 {
        statuses.push(
            fetch(gateway, site, Some(&basic(&format!("bob{i}"), TOKEN)))
                .await
                .0,
        );
    }
    let earned = 2 + started.elapsed().as_secs() as usize;
    let served = statuses.iter().filter(|s| **s == 200).count();
    assert_eq!(&statuses[..2], [200, 200], "the burst: {statuses:?}");
    assert!(
        served <= earned && statuses.contains(&429),
        "bob1..bob6 got {statuses:?}; the token earned {earned}"
    );
    assert!(statuses.iter().all(|s| [200, 429].contains(s)), "{statuses:?}");
    // A wrong password from a client network: refused, as anywhere.
    let (status, head) = fetch(gateway, site, Some(&basic("carol", "not-the-token"))).await;
    assert_eq!(status, 407, "{head}");
    assert!(head.contains("proxy-authenticate: basic"), "{head}");
    let (status, head) = fetch(gateway, site, Some("Bearer not-basic")).await;
    assert_eq!(status, 407, "{head}");

    // No credentials from a client network: admitted, with a rate of its own.
    let (status, head) = fetch(gateway, site, None).await;
    assert_eq!(status, 200, "{head}");
    assert_not_logged(&operator, &[TOKEN]);
    operator.stop().await;
}

/// Two identities from a tokens directory: each API lease is its taker's.
#[tokio::test]
async fn an_api_lease_is_released_reported_and_renewed_by_its_owner_only() {
    const A: &str = "identities-team-a-t0ken-1f";
    const B: &str = "identities-team-b-t0ken-2e";
    let dir = OperatorDir::new(&provider("127.0.53.0/30"));
    dir.write("tokens/team-a", format!("{A}\n"));
    dir.write("tokens/team-b", B);
    let tokens = format!("\"{}\"", dir.path().join("tokens").display());
    let (operator, _) = operator(&dir, "capacityWait: 1s", &[("crawlerTokensDir", tokens)], &[]).await;
    proxy_in_book(&operator, A).await;

    let (status, lease) = api(
        &operator,
        A,
        "POST",
        "/v1/leases",
        Some(r#"{"target":"example.org"}"#),
    )
    .await;
    assert_eq!(status, 201, "{lease}");
    let id = lease["id"].as_str().unwrap().to_owned();
    let release = format!("/v1/leases/{id}");
    let report = format!("/v1/leases/{id}/report");
    let renew = format!("/v1/leases/{id}/renew");
    let blocked = Some(r#"{"outcome":"blocked"}"#);
    for (method, path, body) in [
        ("DELETE", &release, None),
        ("POST", &report, blocked),
        ("POST", &renew, None),
    ] {
        let (status, answer) = api(&operator, B, method, path, body).await;
        assert_eq!(status, 403, "{method} {path} by team-b: {answer}");
        assert_eq!(answer["error"], "not_owner", "{answer}");
        assert!(
            answer["message"].as_str().unwrap().contains("another identity"),
            "{answer}"
        );
    }
    assert_eq!(active_leases(&operator, B).await, 1, "still held");
    let (status, answer) = api(
        &operator,
        B,
        "POST",
        "/v1/leases",
        Some(r#"{"target":"example.org"}"#),
    )
    .await;
    assert_eq!(status, 503, "the proxy is still team-a's: {answer}");
    assert_eq!(api(&operator, A, "POST", &renew, None).await.0, 200);
    assert_eq!(
        api(&operator, A, "POST", &report, Some(r#"{"outcome":"ok"}"#))
            .await
            .0,
        204
    );
    assert_eq!(api(&operator, A, "DELETE", &release, None).await.0, 204);
    // In the report grace after release: still team-a's.
    let (status, answer) = api(&operator, B, "POST", &report, blocked).await;
    assert_eq!(
        (status, &answer["error"]),
        (403, &Value::from("not_owner")),
        "{answer}"
    );
    assert_eq!(api(&operator, A, "POST", &report, blocked).await.0, 204);
    // Unknown ids answer as before, whoever asks.
    assert_eq!(
        api(&operator, B, "DELETE", "/v1/leases/never-existed", None)
            .await
            .0,
        204
    );
    assert_eq!(
        api(&operator, B, "POST", "/v1/leases/never-existed/report", blocked)
            .await
            .0,
        404
    );
    assert_not_logged(&operator, &[A, B]);
    operator.stop().await;
}

/// How long until `check` holds, polled every 100 ms, at most `RELOAD_BOUND`
/// plus a margin for a loaded machine; panics naming `what` otherwise.
async fn took(what: &str, mut check: impl AsyncFnMut() -> bool) -> Duration {
    let started = Instant::now();
    while !check().await {
        assert!(
            started.elapsed() < RELOAD_BOUND + Duration::from_secs(5),
            "{what}: not within {RELOAD_BOUND:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    started.elapsed()
}

#[tokio::test]
async fn a_token_file_added_or_removed_takes_effect_within_the_stated_bound() {
    const A: &str = "identities-reload-a-t0ken-3d";
    const B: &str = "identities-reload-b-t0ken-4c";
    let dir = OperatorDir::new(&provider("127.0.54.0/30"));
    dir.write("tokens/team-a", A);
    let tokens = format!("\"{}\"", dir.path().join("tokens").display());
    let (operator, gateway) = operator(&dir, "capacityWait: 5s", &[("crawlerTokensDir", tokens)], &[]).await;
    proxy_in_book(&operator, A).await;
    let (site, _) = site().await;
    let list = async |token: &str| api(&operator, token, "GET", "/v1/proxies", None).await.0;
    assert_eq!(list(B).await, 401);
    assert_eq!(fetch(gateway, site, Some(&basic("x", B))).await.0, 407);

    // Written as a Secret update lands: a new file appears.
    dir.write("tokens/team-b", format!("{B}\n"));
    let added = took("team-b accepted", async || list(B).await == 200).await;
    assert_eq!(fetch(gateway, site, Some(&basic("x", B))).await.0, 200);

    // A file that does not validate: named in the log, nothing changes.
    dir.write("tokens/Team_C", "whatever");
    operator
        .eventually(
            "the bad file named in the log",
            Duration::from_secs(15),
            async || operator.logs().contains("Team_C").then_some(()).ok_or("not yet"),
        )
        .await;
    assert_eq!(list(A).await, 200, "the identities in force stay");
    std::fs::remove_file(dir.path().join("tokens/Team_C")).unwrap();

    std::fs::remove_file(dir.path().join("tokens/team-a")).unwrap();
    let removed = took("team-a refused", async || list(A).await == 401).await;
    assert_eq!(fetch(gateway, site, Some(&basic("x", A))).await.0, 407);
    assert_eq!(list(B).await, 200);
    println!("a token file took effect {added:?} after it was added, {removed:?} after it was removed");
    assert!(
        added <= RELOAD_BOUND && removed <= RELOAD_BOUND,
        "{added:?} {removed:?}"
    );
    assert_not_logged(&operator, &[A, B]);
    operator.stop().await;
}
