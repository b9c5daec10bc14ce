//! Every replica serving (docs/kubernetes.md, "Every replica serves"),
//! measured through the real binary in Kubernetes mode against the fake
//! API server (a process of its own, `--links`: one address per replica,
//! so each replica's requests are counted apart).
//!
//! **Serving**: `--proxies` (4)
//! External Proxies, each a `forward-proxy` process of the operator's
//! binary, capacity `--capacity` (256) leases each, no cooldown; a site on
//! loopback answering `204`. Three cases, one after another, each on a
//! fresh fake and fresh replicas:
//!
//! - `leader only, 1 replica`: `--every-replica-serves=false`, the path
//!   before shares existed;
//! - `share, 1 replica`: the default, one replica serving from its share;
//! - `share, 3 replicas`: three, the load spread over them.
//!
//! In each, once every replica is ready and lists every proxy healthy,
//! keep-alive clients, client `c` on replica `c mod n` and from one of
//! 250 loopback addresses in turn (the API's rate limit is per client
//! address), run for `--seconds` (10) each:
//!
//! - **leases**, `--lease-clients` (512): `POST /v1/leases` then `DELETE
//!   /v1/leases/{id}`, a pair per turn; pairs/s, p50/p99 of a pair. In
//!   Kubernetes mode each grant and release is answered once its lease
//!   journal's ConfigMap write is done, so a pair takes a few hundred ms
//!   whatever the load and the rate comes from many clients at once;
//! - **gateway**, `--clients` (64):
//!   a plain `GET` of the site through the replica's gateway
//!   (a lease per request, held while it runs); requests/s, p50/p99.
//!
//! Beside each rate, the CPU the replicas used in the window (all of them,
//! from `/proc`) per operation: what serving from a share costs beyond the
//! leader-only path. The load generator shares the two cores, as in the
//! other benches.
//!
//! **The leader's API requests** (`--fleet N`, 10,000 in the docs; 0
//! skips it): N External Proxies (one forward proxy, probed every 10 s at
//! the site) created before three replicas start; once all are `Ready`
//! (the fake's LIST) and every replica is ready, a steady window of
//! `--steady` (60) seconds: each replica's requests to the API server by
//! verb and resource, per second, from its own link's counts.
//!
//! `--cases leader,share1,share3` picks cases; `--fleet 0` runs serving
//! only, `--serving false` the fleet only.

mod common;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::{Conn, Kill, arg, cpu_seconds, free_addr, pct, target};
use fake_apiserver::{RequestCounts, RequestKey};
use futures::StreamExt;
use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_egress-proxies-operator");
const NAMESPACE: &str = "bench";
const PROXIES: &str = "/apis/crawl.example.com/v1alpha1/namespaces/bench/proxies";
const WAIT: Duration = Duration::from_secs(300);

/// One serving case.
#[derive(Clone, Copy)]
struct Case {
    name: &'static str,
    replicas: usize,
    leader_only: bool,
}

const CASES: [(&str, Case); 3] = [
    (
        "leader",
        Case {
            name: "leader only, 1 replica",
            replicas: 1,
            leader_only: true,
        },
    ),
    (
        "share1",
        Case {
            name: "share, 1 replica",
            replicas: 1,
            leader_only: false,
        },
    ),
    (
        "share3",
        Case {
            name: "share, 3 replicas",
            replicas: 3,
            leader_only: false,
        },
    ),
];

/// A replica: the operator's process and its addresses.
struct Replica {
    process: Kill,
    log: PathBuf,
    health: SocketAddr,
    discovery: SocketAddr,
    gateway: SocketAddr,
    /// Its own address at the fake (its link).
    link: String,
}

impl Replica {
    fn start(dir: &Path, i: usize, args: &[String]) -> Self {
        let (health, metrics, discovery, gateway, internal) =
            (free_addr(), free_addr(), free_addr(), free_addr(), free_addr());
        let kubeconfig = dir.join(format!("kubeconfig.link-{i}"));
        let link = common::fake::server_of(&std::fs::read_to_string(&kubeconfig).unwrap());
        let pod = format!("replica-{i}");
        let log = dir.join(format!("{pod}.log"));
        let out = std::fs::File::create(&log).unwrap();
        let process = Command::new(BIN)
            .arg("run")
            .arg("--providers-config")
            .arg(dir.join("providers.yaml"))
            .arg("--state-dir")
            .arg(dir.join(format!("{pod}-state")))
            .args(["--health-probe-bind-address", &health.to_string()])
            .args([
                "--metrics-bind-address",
                &metrics.to_string(),
                "--metrics-secure=false",
            ])
            .args(["--discovery-bind-address", &discovery.to_string()])
            .args(["--gateway-bind-address", &gateway.to_string()])
            .arg("--gateway-config")
            .arg(dir.join("gateway.yaml"))
            .args(["--replica-bind-address", &internal.to_string()])
            .arg("--insecure-discovery-without-token")
            .arg("--leader-elect")
            .args(["--allow-external-endpoint-networks", "127.0.0.0/8"])
            .args(["--log-format", "text", "--log-level", "warn"])
            .args(args)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("KUBECONFIG", &kubeconfig)
            .env("POD_NAME", &pod)
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap();
        Self {
            process: Kill(process),
            log,
            health,
            discovery,
            gateway,
            link,
        }
    }

    fn pid(&self) -> u32 {
        self.process.0.id()
    }

    async fn ready(&self, http: &reqwest::Client) -> bool {
        http.get(format!("http://{}/readyz", self.health))
            .timeout(Duration::from_secs(1))
            .send()
            .await
            .is_ok_and(|r| r.status() == 200)
    }

    /// The requests it made to the API server (its link's counts).
    async fn api_requests(&self, http: &reqwest::Client) -> RequestCounts {
        let answer = http.get(format!("{}/debug/requests", self.link)).send().await;
        match answer {
            Ok(r) => {
                let body: Value = r.json().await.unwrap_or(Value::Null);
                RequestCounts::from_json(&body["link"]).unwrap_or_default()
            }
            Err(_) => RequestCounts::default(),
        }
    }

    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }
}

/// The fake's own HTTP API, as the bench uses it (its main address).
struct Fake {
    http: reqwest::Client,
    base: String,
}

impl Fake {
    async fn create(&self, path: &str, body: &Value) {
        loop {
            let answer = self
                .http
                .post(format!("{}{path}", self.base))
                .json(body)
                .send()
                .await
                .expect("the fake answers");
            match answer.status().as_u16() {
                201 => return,
                429 => tokio::time::sleep(Duration::from_secs(1)).await,
                code => panic!(
                    "creating {path}: {code} {}",
                    answer.text().await.unwrap_or_default()
                ),
            }
        }
    }

    /// Proxies in phase `Ready`, from one LIST.
    async fn ready_proxies(&self) -> usize {
        let Ok(answer) = self.http.get(format!("{}{PROXIES}", self.base)).send().await else {
            return 0;
        };
        let list: Value = answer.json().await.unwrap_or(Value::Null);
        list["items"].as_array().map_or(0, |items| {
            items.iter().filter(|p| p["status"]["phase"] == "Ready").count()
        })
    }
}

/// A fresh cluster: the fake, the namespace, both CRDs, and `proxies`
/// External Proxies at `endpoints` (round robin) probed at `site`.
async fn cluster(
    dir: &Path,
    links: usize,
    proxies: usize,
    endpoints: &[SocketAddr],
    site: SocketAddr,
    interval: &str,
) -> (Kill, Fake) {
    let (process, base) = common::fake::start(dir, NAMESPACE, links).await;
    let fake = Fake {
        http: reqwest::Client::new(),
        base,
    };
    fake.create("/api/v1/namespaces", &json!({"metadata": {"name": NAMESPACE}}))
        .await;
    for kind in ["proxies", "proxypools"] {
        let output = Command::new(BIN).args(["crd", kind]).output().unwrap();
        assert!(output.status.success(), "egress-proxies-operator crd {kind}");
        let crd: Value = serde_saphyr::from_str(&String::from_utf8_lossy(&output.stdout)).unwrap();
        fake.create("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", &crd)
            .await;
    }
    futures::stream::iter(0..proxies)
        .map(|i| {
            let endpoint = endpoints[i % endpoints.len()];
            let body = json!({
                "apiVersion": "crawl.example.com/v1alpha1", "kind": "Proxy",
                "metadata": {"name": format!("p{i:05}"), "namespace": NAMESPACE},
                "spec": {"mode": "External",
                         "endpoint": {"host": endpoint.ip().to_string(), "port": endpoint.port()},
                         "healthCheck": {"url": format!("http://{site}/"), "interval": interval, "timeout": "5s"}}
            });
            let fake = &fake;
            async move { fake.create(PROXIES, &body).await }
        })
        .buffer_unordered(32)
        .collect::<Vec<()>>()
        .await;
    std::fs::write(dir.join("providers.yaml"), "providers: []\n").unwrap();
    std::fs::write(
        dir.join("gateway.yaml"),
        "destinations: {allow: [127.0.0.0/8, 1024-65535]}\n",
    )
    .unwrap();
    (process, fake)
}

/// `n` forward proxies (the operator's `forward-proxy`), open to loopback.
fn forward_proxies(dir: &Path, n: usize) -> (Vec<Kill>, Vec<SocketAddr>) {
    (0..n)
        .map(|i| {
            let addr = free_addr();
            let instance = dir.join(format!("forward-{i}"));
            std::fs::create_dir_all(&instance).unwrap();
            let process = Command::new(BIN)
                .args(["forward-proxy", "--listen", &addr.to_string()])
                .args(["--allow", "127.0.0.0/8", "--allow", "1-65535", "--instance-dir"])
                .arg(&instance)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            (Kill(process), addr)
        })
        .unzip()
}

/// Waits until every replica is ready and its API lists `proxies` healthy.
async fn wait_serving(replicas: &[Replica], proxies: usize) -> Result<Duration, String> {
    let http = reqwest::Client::new();
    let began = Instant::now();
    loop {
        let mut waiting = Vec::new();
        for (i, r) in replicas.iter().enumerate() {
            if !r.ready(&http).await {
                waiting.push(format!("replica-{i} not ready"));
                continue;
            }
            let healthy = common::healthy_proxies(&http, r.discovery, "").await;
            if healthy < proxies {
                waiting.push(format!("replica-{i} lists {healthy} healthy"));
            }
        }
        if waiting.is_empty() {
            return Ok(began.elapsed());
        }
        if began.elapsed() > WAIT {
            let tails: Vec<String> = replicas.iter().map(Replica::log_tail).collect();
            return Err(format!("{}\n{}", waiting.join(", "), tails.join("\n---\n")));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// What one window measured.
struct Window {
    done: u64,
    refused: u64,
    /// Calls whose connection failed (reset, closed): each reconnects.
    broken: u64,
    latencies: Vec<Duration>,
    wall: Duration,
    cpu: f64,
}

impl Window {
    fn rate(&self) -> f64 {
        self.done as f64 / self.wall.as_secs_f64()
    }

    fn cpu_us_per_op(&self) -> f64 {
        self.cpu * 1e6 / self.done.max(1) as f64
    }
}

#[derive(Clone, Copy)]
enum Load {
    Leases,
    Gateway(SocketAddr),
}

/// Client `c`'s loopback address: 127.0.100.1 to .250, in turn.
fn source(c: usize) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 100, (c % 250 + 1) as u8))
}

/// One acquire and, when granted, its release: `Ok(false)` when refused.
async fn lease_pair(conn: &mut Conn, body: &str) -> std::io::Result<bool> {
    let (status, answer) = conn.try_call("POST", "/v1/leases", body).await?;
    if status != 201 {
        return Ok(false);
    }
    let id = common::lease_id(&answer);
    let (status, _) = conn.try_call("DELETE", &format!("/v1/leases/{id}"), "").await?;
    if status == 204 || status == 200 {
        Ok(true)
    } else {
        Err(std::io::Error::other(format!("release answered {status}")))
    }
}

/// `clients` closed loops of `load` for `seconds`, after a second's warm-up.
async fn window(
    replicas: &[Replica],
    load_of: impl Fn(&Replica) -> Load,
    clients: usize,
    seconds: u64,
) -> Window {
    let stop = Arc::new(AtomicBool::new(false));
    let measuring = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for c in 0..clients {
        let replica = &replicas[c % replicas.len()];
        let (api, load) = (replica.discovery, load_of(replica));
        let (stop, measuring) = (stop.clone(), measuring.clone());
        tasks.push(tokio::spawn(async move {
            let target = match load {
                Load::Leases => api,
                Load::Gateway(gateway) => gateway,
            };
            let mut conn = None;
            let (mut done, mut refused, mut broken, mut latencies) = (0u64, 0u64, 0u64, Vec::new());
            let lease_body = format!("{{\"target\":\"t{c}.example\",\"ttlSeconds\":60}}");
            while !stop.load(Ordering::Relaxed) {
                let began = Instant::now();
                if conn.is_none() {
                    match Conn::try_open_from(source(c), target).await {
                        Ok(open) => conn = Some(open),
                        Err(_) => {
                            broken += u64::from(measuring.load(Ordering::Relaxed));
                            tokio::time::sleep(Duration::from_millis(10)).await;
                            continue;
                        }
                    }
                }
                let Some(open) = conn.as_mut() else { continue };
                let outcome = match load {
                    Load::Leases => lease_pair(open, &lease_body).await,
                    Load::Gateway(_) => {
                        let site = SITE.get().copied().expect("the site runs");
                        open.try_call("GET", &format!("http://{site}/small"), "")
                            .await
                            .map(|(status, _)| status == 204)
                    }
                };
                let measured = measuring.load(Ordering::Relaxed);
                match outcome {
                    Ok(true) if measured => {
                        done += 1;
                        latencies.push(began.elapsed());
                    }
                    Ok(false) if measured => refused += 1,
                    Ok(_) => {}
                    Err(e) => {
                        if broken == 0 && measured {
                            eprintln!("client {c}: {e}");
                        }
                        broken += u64::from(measured);
                        conn = None;
                    }
                }
            }
            (done, refused, broken, latencies)
        }));
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let pids: Vec<u32> = replicas.iter().map(Replica::pid).collect();
    let cpu0: f64 = pids.iter().map(|p| cpu_seconds(*p)).sum();
    let began = Instant::now();
    measuring.store(true, Ordering::Relaxed);
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    measuring.store(false, Ordering::Relaxed);
    let wall = began.elapsed();
    let cpu = pids.iter().map(|p| cpu_seconds(*p)).sum::<f64>() - cpu0;
    stop.store(true, Ordering::Relaxed);
    let mut out = Window {
        done: 0,
        refused: 0,
        broken: 0,
        latencies: Vec::new(),
        wall,
        cpu,
    };
    for task in tasks {
        let (done, refused, broken, latencies) = task.await.expect("a client task");
        out.done += done;
        out.refused += refused;
        out.broken += broken;
        out.latencies.extend(latencies);
    }
    out.latencies.sort();
    out
}

static SITE: std::sync::OnceLock<SocketAddr> = std::sync::OnceLock::new();

/// One serving case: its rows of the table.
async fn serving(
    case: Case,
    proxies: usize,
    capacity: u32,
    (lease_clients, clients): (usize, usize),
    seconds: u64,
) -> Result<String, String> {
    let dir = tempfile::tempdir().unwrap();
    let site = *SITE.get().expect("the site runs");
    let (_forward, endpoints) = forward_proxies(dir.path(), proxies);
    let (_fake, _) = cluster(dir.path(), case.replicas, proxies, &endpoints, site, "1s").await;
    let mut args = vec![
        "--lease-cooldown".to_owned(),
        "0s".to_owned(),
        "--max-leases-per-proxy".to_owned(),
        capacity.to_string(),
    ];
    if case.leader_only {
        args.push("--every-replica-serves=false".to_owned());
    }
    let replicas: Vec<Replica> = (0..case.replicas)
        .map(|i| Replica::start(dir.path(), i, &args))
        .collect();
    // Leader only: the one replica leads, the others would not be ready.
    let took = wait_serving(&replicas, proxies).await?;
    println!("  {}: serving after {:.1} s", case.name, took.as_secs_f64());
    let leases = window(&replicas, |_| Load::Leases, lease_clients, seconds).await;
    let gateway = window(&replicas, |r| Load::Gateway(r.gateway), clients, seconds).await;
    if leases.broken + gateway.broken > 0 {
        for (i, r) in replicas.iter().enumerate() {
            println!("  replica-{i}'s log, the end:\n{}", r.log_tail());
        }
    }
    let row = |what: &str, w: &Window| {
        format!(
            "| {} | {what} | {:.0} | {:.2} | {:.2} | {:.0} | {} | {} |",
            case.name,
            w.rate(),
            pct(&w.latencies, 0.5),
            pct(&w.latencies, 0.99),
            w.cpu_us_per_op(),
            w.refused,
            w.broken
        )
    };
    Ok(format!(
        "{}\n{}",
        row("lease acquire+release", &leases),
        row("gateway GET", &gateway)
    ))
}

/// Counts by verb and resource per second, largest first, one line each.
fn per_second(counts: &RequestCounts, window: f64) -> String {
    let mut rows: Vec<(&RequestKey, &u64)> = counts.0.iter().collect();
    rows.sort_by(|a, b| b.1.cmp(a.1));
    rows.iter()
        .map(|(k, n)| {
            format!(
                "      {:>8.2}/s  {} {} {}",
                **n as f64 / window,
                k.verb,
                k.resource,
                k.code
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn minus(after: &RequestCounts, before: &RequestCounts) -> RequestCounts {
    let mut out = RequestCounts::default();
    for (key, n) in &after.0 {
        let was = before.0.get(key).copied().unwrap_or(0);
        if *n > was {
            out.0.insert(key.clone(), n - was);
        }
    }
    out
}

/// The leader's (and the others') API requests at `proxies` Proxies over
/// three replicas, steady.
async fn fleet(proxies: usize, steady: u64) -> Result<(), String> {
    let dir = tempfile::tempdir().unwrap();
    let site = *SITE.get().expect("the site runs");
    let (_forward, endpoints) = forward_proxies(dir.path(), 1);
    let created = Instant::now();
    let (_fake, fake) = cluster(dir.path(), 3, proxies, &endpoints, site, "10s").await;
    println!(
        "fleet: {proxies} Proxies created in {:.1} s",
        created.elapsed().as_secs_f64()
    );
    let replicas: Vec<Replica> = (0..3).map(|i| Replica::start(dir.path(), i, &[])).collect();
    let began = Instant::now();
    loop {
        let ready = fake.ready_proxies().await;
        if ready == proxies {
            break;
        }
        if began.elapsed() > Duration::from_secs(900) {
            return Err(format!("only {ready} of {proxies} Ready after 900 s"));
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let took = wait_serving(&replicas, 0).await?;
    println!(
        "fleet: all {proxies} Ready and every replica ready {:.1} s after the start",
        began.elapsed().as_secs_f64().max(took.as_secs_f64())
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    let http = reqwest::Client::new();
    let mut before = Vec::new();
    for r in &replicas {
        before.push(r.api_requests(&http).await);
    }
    let t0 = Instant::now();
    tokio::time::sleep(Duration::from_secs(steady)).await;
    let window = t0.elapsed().as_secs_f64();
    let leader = leader_of(&http, &fake).await;
    for (i, r) in replicas.iter().enumerate() {
        let counts = minus(&r.api_requests(&http).await, &before[i]);
        let role = if leader.as_deref() == Some(&format!("replica-{i}")) {
            "leader"
        } else {
            "member"
        };
        println!(
            "  replica-{i} ({role}): {:.2} requests/s over {window:.0} s\n{}",
            counts.total() as f64 / window,
            per_second(&counts, window)
        );
    }
    Ok(())
}

/// The leader Lease's holder.
async fn leader_of(http: &reqwest::Client, fake: &Fake) -> Option<String> {
    let url = format!(
        "{}/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/egress-proxies-operator",
        fake.base
    );
    let lease: Value = http.get(url).send().await.ok()?.json().await.ok()?;
    lease["spec"]["holderIdentity"].as_str().map(str::to_owned)
}

fn main() -> ExitCode {
    egress_proxies::tls::ensure_crypto_provider();
    let number = |name: &str, default: u64| arg(name).map_or(default, |v| v.parse().expect(name));
    let proxies = number("--proxies", 4) as usize;
    let capacity = number("--capacity", 256) as u32;
    let clients = number("--clients", 64) as usize;
    let lease_clients = number("--lease-clients", 512) as usize;
    let seconds = number("--seconds", 10);
    let fleet_size = number("--fleet", 10_000) as usize;
    let steady = number("--steady", 60);
    let serving_on = arg("--serving").is_none_or(|v| v != "false");
    let picked = arg("--cases").unwrap_or_else(|| "leader,share1,share3".into());
    let runtime = common::load_generator_runtime();
    runtime.block_on(async {
        SITE.set(target().await).expect("the site starts once");
        let mut ok = true;
        if serving_on {
            println!(
                "serving: {proxies} External Proxies of capacity {capacity}, {lease_clients} lease clients, {clients} gateway clients, {seconds} s windows"
            );
            let mut rows = Vec::new();
            for key in picked.split(',') {
                let Some((_, case)) = CASES.iter().find(|(k, _)| *k == key) else {
                    eprintln!("--cases: {key} is none of leader, share1, share3");
                    return ExitCode::FAILURE;
                };
                match serving(*case, proxies, capacity, (lease_clients, clients), seconds).await {
                    Ok(row) => rows.push(row),
                    Err(why) => {
                        println!("  {}: FAILED: {why}", case.name);
                        ok = false;
                    }
                }
            }
            println!();
            println!("| case | operation | ops/s | p50 ms | p99 ms | replicas' CPU µs/op | refused | broken |");
            println!("|---|---|---:|---:|---:|---:|---:|---:|");
            for row in rows {
                println!("{row}");
            }
            println!();
        }
        if fleet_size > 0
            && let Err(why) = fleet(fleet_size, steady).await
        {
            println!("fleet: FAILED: {why}");
            ok = false;
        }
        if ok { ExitCode::SUCCESS } else { ExitCode::FAILURE }
    })
}
