//! The gateway's learning per site (docs/gateway.md, "Learning per
//! site"): the share of requests served on the first proxy tried when one
//! of the proxies is refused by the site, with the learning on and off, in
//! one run. The real operator binary, standalone, with `--upstreams` (4)
//! built-in local proxies, each leaving from an address of its own on
//! loopback (`outgoingAddresses: [127.0.25.0/29]`); a site on 127.0.24.1
//! answers `403` to the first proxy's address and `200` to the others. No
//! block rules: a `403` is relayed, so a request that got `200` was
//! served by the first proxy tried. `--clients` (8) clients send
//! `--requests` (2,000) requests, one per connection, after 100 of
//! warm-up; the gateway's requests/s is printed alongside.
//!
//!   cargo bench -p egress-proxies-operator --bench gateway_learning -- [--requests 2000]
//!       [--clients 8] [--upstreams 4]
//!
//! Every process it starts is stopped when it ends, fails or is
//! interrupted. All traffic stays on loopback.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use base64::Engine as _;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};

mod common;
use common::{Kill, arg, free_addr, healthy_proxies, reap_local_proxies};

const BIN: &str = env!("CARGO_BIN_EXE_egress-proxies-operator");
const TOKEN: &str = "bench-learning-t0ken";
/// The site's address, and the refused proxy's (the first of the network).
const SITE: Ipv4Addr = Ipv4Addr::new(127, 0, 24, 1);
const REFUSED: Ipv4Addr = Ipv4Addr::new(127, 0, 25, 1);
const WARM_UP: usize = 100;

fn main() -> ExitCode {
    let number = |name: &str, default: usize| arg(name).and_then(|v| v.parse().ok()).unwrap_or(default);
    let requests = number("--requests", 2000);
    let clients = number("--clients", 8);
    let upstreams = number("--upstreams", 4);
    egress_proxies::tls::ensure_crypto_provider();
    let runtime = common::load_generator_runtime();
    runtime.block_on(async move {
        tokio::select! {
            code = bench(requests, clients, upstreams) => code,
            _ = tokio::signal::ctrl_c() => {
                eprintln!("interrupted");
                ExitCode::FAILURE
            }
        }
    })
}

async fn bench(requests: usize, clients: usize, upstreams: usize) -> ExitCode {
    {
        let site = site().await;
        let load = || std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
        println!(
            "{upstreams} proxies, one refused by the site; {requests} requests from {clients} clients; load average {}",
            load().trim()
        );
        println!("learning   first-try served   requests/s");
        for learning in [true, false] {
            match measure(site, learning, upstreams, requests, clients).await {
                Ok((served, rate)) => {
                    let share = served as f64 * 100.0 / requests as f64;
                    println!(
                        "{:<10} {share:>15.2} %   {rate:>10.0}",
                        if learning { "on" } else { "off" }
                    );
                }
                Err(e) => {
                    eprintln!("error: {e}");
                    return ExitCode::FAILURE;
                }
            }
        }
        println!("load average at the end: {}", load().trim());
        ExitCode::SUCCESS
    }
}

/// Requests served `200` of `requests`, and requests/s, with the learning on or off.
async fn measure(
    site: SocketAddr,
    learning: bool,
    upstreams: usize,
    requests: usize,
    clients: usize,
) -> Result<(usize, f64), String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let gateway = free_addr();
    let _operator = start_operator(dir.path(), gateway, upstreams, learning).await?;
    run(gateway, site, WARM_UP, clients).await;
    let started = Instant::now();
    let served = run(gateway, site, requests, clients).await;
    Ok((served, requests as f64 / started.elapsed().as_secs_f64()))
}

/// `total` requests from `clients` clients: how many were answered `200`.
async fn run(gateway: SocketAddr, site: SocketAddr, total: usize, clients: usize) -> usize {
    let left = Arc::new(AtomicUsize::new(total));
    let served = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let (left, served) = (left.clone(), served.clone());
        tasks.push(tokio::spawn(async move {
            while left
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
            {
                if get(gateway, site).await == 200 {
                    served.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    for task in tasks {
        let _ = task.await;
    }
    served.load(Ordering::Relaxed)
}

/// One GET through the gateway on a connection of its own: the status.
async fn get(gateway: SocketAddr, site: SocketAddr) -> u16 {
    let Ok(mut s) = TcpStream::connect(gateway).await else {
        return 0;
    };
    let auth = base64::engine::general_purpose::STANDARD.encode(format!("bench:{TOKEN}"));
    let head = format!(
        "GET http://{site}/ HTTP/1.1\r\nHost: {site}\r\nProxy-Authorization: Basic {auth}\r\nConnection: close\r\n\r\n"
    );
    if s.write_all(head.as_bytes()).await.is_err() {
        return 0;
    }
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(30), s.read_to_end(&mut answer)).await;
    String::from_utf8_lossy(&answer)
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// The site: `403` to the refused proxy's address, `200` to the others.
async fn site() -> SocketAddr {
    let listener = TcpListener::bind((SITE, 0)).await.unwrap();
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
                let answer: &[u8] = if peer.ip() == IpAddr::V4(REFUSED) {
                    b"HTTP/1.1 403 Forbidden\r\nContent-Length: 7\r\nConnection: close\r\n\r\nrefused"
                } else {
                    b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"
                };
                let _ = s.write_all(answer).await;
                let _ = s.shutdown().await;
            });
        }
    });
    addr
}

/// The standalone operator with the gateway and `upstreams` built-in local
/// proxies, once every one is healthy.
async fn start_operator(
    dir: &Path,
    gateway: SocketAddr,
    upstreams: usize,
    learning: bool,
) -> Result<Fleet, String> {
    let io = |e: std::io::Error| format!("writing the operator's files: {e}");
    let api = free_addr();
    let health = common::target().await;
    let destinations = "{allow: [127.0.0.0/8, 1024-65535]}";
    std::fs::write(
        dir.join("providers.yaml"),
        format!(
            "providers:\n  - {{name: local, type: local, local: {{implementation: builtin, \
             destinations: {destinations}, outgoingAddresses: [127.0.25.0/29]}}}}\n"
        ),
    )
    .map_err(io)?;
    let manifests = dir.join("proxies");
    std::fs::create_dir_all(&manifests).map_err(io)?;
    for i in 0..upstreams {
        std::fs::write(
            manifests.join(format!("up-{i}.yaml")),
            format!(
                "apiVersion: crawl.example.com/v1alpha1\nkind: Proxy\nmetadata: {{name: up-{i}, namespace: bench}}\n\
                 spec: {{mode: Managed, provider: local, healthCheck: {{url: \"http://{health}/\", interval: 1s}}}}\n"
            ),
        )
        .map_err(io)?;
    }
    std::fs::write(
        dir.join("standalone.yaml"),
        format!(
            "providersConfig: providers.yaml\nmanifests: proxies\nstateDir: state\n\
             healthProbeBindAddress: \"0\"\nmetricsBindAddress: \"0\"\ndiscoveryBindAddress: \"{api}\"\n\
             gatewayBindAddress: \"{gateway}\"\n\
             gateway: {{destinations: {destinations}, learning: {{enabled: {learning}}}}}\n\
             maxLeasesPerProxy: 0\nleaseCooldown: 30s\n"
        ),
    )
    .map_err(io)?;
    let operator = Fleet {
        operator: Some(Kill(
            Command::new(BIN)
                .args(["standalone", "--log-level", "warn", "--config"])
                .arg(dir.join("standalone.yaml"))
                .env_remove("DISCOVERY_READ_TOKEN")
                .env("DISCOVERY_TOKEN", TOKEN)
                .current_dir(dir)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .map_err(|e| format!("starting the operator: {e}"))?,
        )),
        state: dir.join("state"),
    };
    let client = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let healthy = healthy_proxies(&client, api, TOKEN).await;
        if healthy == upstreams {
            return Ok(operator);
        }
        if Instant::now() > deadline {
            return Err(format!("{healthy} of {upstreams} proxies healthy after 60 s"));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The operator and the local proxies it leaves running by design (to
/// adopt them at its next start): all killed when dropped.
struct Fleet {
    operator: Option<Kill>,
    state: PathBuf,
}

impl Drop for Fleet {
    fn drop(&mut self) {
        drop(self.operator.take());
        reap_local_proxies(&self.state);
    }
}
