//! A pool whose members leave from their own outgoing addresses, crawled by
//! eight clients for 90 s against a site that bans one of the addresses,
//! through the real binary (standalone, local built-in proxies on loopback
//! addresses `127.0.9.1`–`127.0.9.6`). With `afterBlockedTargets: 1` the
//! member on the banned address is replaced at its first block; the
//! address is then quarantined: no later member leaves from it (another
//! address is always free: at most 3 + 1 members hold one of six), and age
//! rotations keep moving — no member outlives `maxAge` + 30 s.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use egress_proxies::domain::resource::RETIRING_ANNOTATION;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

mod support;

use support::eventually;
use support::operator::OperatorDir;
use support::process::health_target;

const BANNED: &str = "127.0.9.1";
const MAX_AGE: Duration = Duration::from_secs(30);
const CRAWL: Duration = Duration::from_secs(90);
const CLIENTS: usize = 8;

/// Fetches the site saw: from which address, through which member.
type Seen = Arc<Mutex<Vec<(String, IpAddr)>>>;

/// A site that bans `banned`: `403` to every request from it, `200` with
/// the requester's address as the body to everyone else.
async fn banning_site(banned: IpAddr) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, peer)) = listener.accept().await {
            tokio::spawn(async move {
                let mut got = Vec::new();
                let mut buf = [0u8; 2048];
                while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                    }
                }
                let from = peer.ip().to_string();
                let answer = if peer.ip() == banned {
                    "HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".to_owned()
                } else {
                    format!(
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{from}",
                        from.len()
                    )
                };
                let _ = s.write_all(answer.as_bytes()).await;
                let _ = s.shutdown().await;
            });
        }
    });
    addr
}

/// One crawler: leases a member of the pool for one of its sites, fetches
/// through it, reports `blocked` on a 403 and `ok` otherwise, releases.
async fn crawl(api: String, client_no: usize, site: SocketAddr, seen: Seen, blocked: Arc<Mutex<usize>>) {
    let client = reqwest::Client::new();
    let deadline = Instant::now() + CRAWL;
    let mut round = 0;
    while Instant::now() < deadline {
        round += 1;
        let target = format!("shop{}.example", (client_no + round) % 5);
        let response = client
            .post(format!("{api}/v1/leases"))
            .json(&json!({"target": target, "pool": "eu", "ttlSeconds": 30}))
            .send()
            .await;
        let grant: Value = match response {
            Ok(r) if r.status().is_success() => r.json().await.unwrap(),
            // None free this instant (resting, starting): as a crawler, wait.
            _ => {
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        let id = grant["id"].as_str().unwrap().to_owned();
        let member = grant["proxy"]["name"].as_str().unwrap().to_owned();
        let via = reqwest::Client::builder()
            .proxy(reqwest::Proxy::http(grant["proxy"]["url"].as_str().unwrap()).unwrap())
            .timeout(Duration::from_secs(10))
            .build()
            .unwrap();
        let outcome = match via.get(format!("http://{site}/")).send().await {
            Ok(r) if r.status() == 403 => {
                seen.lock()
                    .unwrap()
                    .push((member.clone(), BANNED.parse().unwrap()));
                *blocked.lock().unwrap() += 1;
                "blocked"
            }
            Ok(r) if r.status().is_success() => {
                let from = r.text().await.unwrap_or_default();
                if let Ok(from) = from.parse() {
                    seen.lock().unwrap().push((member.clone(), from));
                }
                "ok"
            }
            _ => "error",
        };
        let _ = client
            .post(format!("{api}/v1/leases/{id}/report"))
            .json(&json!({"outcome": outcome}))
            .send()
            .await;
        let _ = client.delete(format!("{api}/v1/leases/{id}")).send().await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// What the test saw of one member: when it was made, when it began
/// retiring (from its annotation) or was last seen.
#[derive(Debug, Default)]
struct Life {
    created: Option<jiff::Timestamp>,
    retiring: Option<jiff::Timestamp>,
    last_seen: Option<jiff::Timestamp>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_banned_address_goes_to_no_later_member_and_ages_keep_rotating() {
    egress_proxies::tls::ensure_crypto_provider();
    let providers = "providers:\n  - {name: local, type: local, local: {implementation: builtin, \
                     destinations: {allow: [127.0.0.0/8]}, outgoingAddresses: [127.0.9.0/29]}}\n";
    let dir = OperatorDir::new(providers);
    let pool = format!(
        "apiVersion: crawl.example.com/v1alpha1\nkind: ProxyPool\nmetadata: {{name: eu, namespace: crawl}}\n\
         spec:\n  replicas: 3\n  maxSurge: 1\n  maxUnavailable: 0\n  drainTimeout: 10s\n  \
         rotation: {{afterBlockedTargets: 1, maxAge: {}s}}\n  template:\n    \
         spec: {{mode: Managed, provider: local, healthCheck: {{url: \"{}\", interval: 1s}}}}\n",
        MAX_AGE.as_secs(),
        health_target()
    );
    dir.write_manifest("pool", &pool);
    let operator = dir
        .standalone()
        .setting("maxLeasesPerProxy", "0")
        .setting("leaseCooldown", "1s")
        .discovery()
        .log_level("info")
        .start()
        .await;
    let api = format!("http://{}", operator.discovery());
    eventually("three Ready members", Duration::from_secs(60), async || {
        let ready = dir
            .proxies()
            .iter()
            .filter(|p| {
                p.status.as_ref().and_then(|s| s.phase)
                    == Some(egress_proxies::domain::resource::Phase::Ready)
            })
            .count();
        (ready == 3).then_some(())
    })
    .await;

    let site = banning_site(BANNED.parse().unwrap()).await;
    let seen = Seen::default();
    let blocked = Arc::new(Mutex::new(0));
    let crawlers: Vec<_> = (0..CLIENTS)
        .map(|n| tokio::spawn(crawl(api.clone(), n, site, seen.clone(), blocked.clone())))
        .collect();

    // Watch every member's life while the clients crawl.
    let mut lives: BTreeMap<String, Life> = BTreeMap::new();
    let end = Instant::now() + CRAWL;
    while Instant::now() < end {
        let now = jiff::Timestamp::now();
        for p in dir.proxies() {
            let Some(name) = p.metadata.name.clone() else {
                continue;
            };
            let life = lives.entry(name).or_default();
            life.created = p.metadata.creation_timestamp.as_ref().map(|t| t.0);
            life.last_seen = Some(now);
            if life.retiring.is_none() {
                life.retiring = p
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(RETIRING_ANNOTATION))
                    .and_then(|v| v.split_whitespace().next()?.parse().ok());
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    for crawler in crawlers {
        crawler.await.unwrap();
    }
    let now = jiff::Timestamp::now();

    let seen = seen.lock().unwrap().clone();
    let banned: IpAddr = BANNED.parse().unwrap();
    let on_banned: BTreeSet<&str> = seen
        .iter()
        .filter(|(_, from)| *from == banned)
        .map(|(member, _)| member.as_str())
        .collect();
    let addresses: BTreeMap<&str, BTreeSet<IpAddr>> = seen.iter().fold(BTreeMap::new(), |mut by, (m, a)| {
        by.entry(m.as_str()).or_default().insert(*a);
        by
    });
    eprintln!(
        "{} fetches, {} blocked; members on {BANNED}: {on_banned:?}; addresses seen: {addresses:?}",
        seen.len(),
        blocked.lock().unwrap()
    );
    assert!(*blocked.lock().unwrap() > 0, "the site banned a member's address");
    assert_eq!(
        on_banned.len(),
        1,
        "only the first member left from the banned address; later ones were given others \
         (six addresses, at most four held): {on_banned:?}\n{}",
        dir.logs()
    );

    // No member served longer than maxAge + 30 s: until it began retiring,
    // was gone, or now.
    let limit = MAX_AGE + Duration::from_secs(30);
    let overlived: Vec<String> = lives
        .iter()
        .filter_map(|(name, life)| {
            let created = life.created?;
            let gone = life
                .last_seen
                .filter(|seen| now.duration_since(*seen).as_secs() > 1);
            let until = life.retiring.or(gone).unwrap_or(now);
            let lived = until.duration_since(created).unsigned_abs();
            (lived > limit).then(|| format!("{name}: {}s", lived.as_secs()))
        })
        .collect();
    eprintln!(
        "{} members over the crawl; lives: {:?}",
        lives.len(),
        lives
            .iter()
            .map(|(n, l)| (
                n,
                l.created
                    .zip(l.retiring.or(l.last_seen))
                    .map(|(c, e)| e.duration_since(c).as_secs())
            ))
            .collect::<Vec<_>>()
    );
    assert!(
        overlived.is_empty(),
        "members outlived maxAge ({}s) + 30 s: {overlived:?}\n{}",
        MAX_AGE.as_secs(),
        dir.logs()
    );

    // The pool says what it quarantined, and that new members got others.
    let listed = std::process::Command::new(support::operator::BIN)
        .args(["get", "pools", "-o", "json", "--config"])
        .arg(dir.path().join("operator.yaml"))
        .output()
        .unwrap();
    let listed: Value = serde_json::from_slice(&listed.stdout).unwrap();
    let status = &listed["items"][0]["status"];
    let quarantined: Vec<&str> = status["quarantinedAddresses"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|q| q["address"].as_str())
        .collect();
    assert_eq!(quarantined, [BANNED], "{status:#}");
    let condition = status["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == "AddressesAvailable")
        .cloned()
        .unwrap_or_default();
    assert_eq!(
        (condition["status"].as_str(), condition["reason"].as_str()),
        (Some("True"), Some("Quarantined")),
        "{status:#}"
    );
    drop(operator);
}
