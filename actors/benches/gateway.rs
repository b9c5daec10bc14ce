//! The gateway (docs/gateway.md) against the same upstream proxies used
//! straight and behind Squid as a rotating parent, in one run. The real
//! operator binary, standalone, with `--upstreams` Managed local Proxies
//! (the local provider's `auto`: Squid when installed, else the built-in
//! proxy; the output says which), `maxLeasesPerProxy: 0` and
//! `leaseCooldown: 0s`, so capacity is not what is measured. A site on
//! loopback, written here on hyper, serves a 128-byte and a 1 MiB body and
//! echoes bytes on a second port. Clients are written here too: hyper
//! keep-alive connections sending absolute-form requests with
//! `Proxy-Authorization`, or `CONNECT` and then the site's HTTP inside.
//!
//! - small responses, `--clients` (64) concurrent clients: requests/s and
//!   p50/p99 (a) through the gateway, (b) straight to the upstreams (each
//!   client pinned to one, with its URL and credentials from the lease API,
//!   as an API user would), (c) through Squid with every upstream as a
//!   `round-robin` `cache_peer` and `never_direct allow all` (skipped
//!   without Squid), (d) straight through a splice hop: this binary run
//!   again (`--bare-hop`), one port per upstream, every connection relayed
//!   by the kernel with nothing parsed or decided (the gateway's own tunnel
//!   relay), the ceiling any extra hop meets here, (e) straight through a
//!   bare relay (`--bare-relay`, `gateway/bare_relay.rs`): heads parsed by
//!   hyper, plain requests forwarded on a kept upstream connection,
//!   tunnels spliced — the gateway's work without leasing, judging or
//!   identities; then one client alone, (a), (d) and (e) against (b): the
//!   latency the gateway adds without queueing;
//! - 1 MiB responses inside `CONNECT` tunnels, gateway, splice hop and bare
//!   relay against straight;
//! - `--tunnels` (10,000) idle tunnels held through the gateway: the
//!   operator's RSS growth per tunnel.
//!
//! Cases take turns in every round (the order rotates); the summary gives
//! the median over rounds and judges the targets: gateway ≥ 0.7× straight
//! and ≥ 1.5× the Squid rotator on small requests/s; added p50 ≤ 0.3 ms and
//! p99 ≤ 2 ms (one client); 1 MiB throughput ≥ 0.9× straight; gateway ≥
//! 0.95× the bare relay on small requests/s and on 1 MiB tunnels; ≤ 16 KiB
//! of operator RSS per idle tunnel.
//!
//!   cargo bench -p egress-proxies-operator --bench gateway -- [--rounds 2] [--seconds 4]
//!       [--clients 64] [--upstreams 4] [--tunnels 10000] [--quick] [--check]
//!
//! `--quick` (or `EPO_BENCH_QUICK=1`): one round of 1.5 s phases and 1,000
//! tunnels, a smoke run. `--check` exits 1 when a target is missed.
//! Raises its file limit (and, as root, the hard one) for the tunnels; the
//! operator and its proxies inherit it. Every process it starts is stopped
//! when it ends, fails or is interrupted. All traffic stays on loopback.

use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use egress_proxies::adapters::forward_proxy::zero_copy;
use futures::StreamExt as _;
use http_body_util::{BodyExt as _, Empty, Full};
use hyper::body::{Bytes, Incoming};
use hyper::client::conn::http1 as client;
use hyper::header::{self, HeaderValue};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use nix::sys::resource::{Resource, getrlimit, setrlimit};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpSocket, TcpStream};

mod common;
use common::{
    arg, cpu_seconds, free_addr, healthy_proxies, local_proxy_pids, pct, reap_local_proxies,
    remove_squid_segments,
};
#[path = "gateway/bare_relay.rs"]
mod bare_relay;

const BIN: &str = env!("CARGO_BIN_EXE_egress-proxies-operator");
/// The crawler token: the gateway's proxy password and the API's bearer token.
const TOKEN: &str = "bench-gateway-t0ken";
const SMALL_BYTES: usize = 128;
const LARGE_BYTES: usize = 1 << 20;
/// Targets.
const VS_STRAIGHT: f64 = 0.7;
const VS_ROTATOR: f64 = 1.5;
const ADDED_P50_MS: f64 = 0.3;
const ADDED_P99_MS: f64 = 2.0;
const LARGE_VS_STRAIGHT: f64 = 0.9;
/// Against the bare relay, small requests/s and 1 MiB tunnel throughput alike.
const VS_BARE_RELAY: f64 = 0.95;
const KIB_PER_TUNNEL: f64 = 16.0;
/// Each phase's clients run this long before the measured window.
const WARM_UP: Duration = Duration::from_millis(500);
/// Tunnels opened at once while building up the idle ones.
const OPENING_AT_ONCE: usize = 128;
/// How long the operator's proxies may take to be Ready and healthy.
const START_DEADLINE: Duration = Duration::from_secs(60);
/// Descriptors this process keeps for everything but the idle tunnels
/// (each needs two here: the client's socket and the echo site's).
const SPARE_FDS: u64 = 512;

/// What to stop and remove if the run is interrupted.
static STARTED: Mutex<Started> = Mutex::new(Started {
    pids: Vec::new(),
    state: None,
    squid_service: None,
});

struct Started {
    pids: Vec<u32>,
    state: Option<PathBuf>,
    squid_service: Option<String>,
}

fn started() -> std::sync::MutexGuard<'static, Started> {
    STARTED.lock().unwrap_or_else(|e| e.into_inner())
}

/// Kills what this run started (the operator, its local proxies, the
/// rotator), and the shared memory Squid leaves.
fn clean_up() {
    let mut started = started();
    for pid in started.pids.drain(..) {
        let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
        let _ = nix::sys::wait::waitpid(Pid::from_raw(pid as i32), None);
    }
    if let Some(state) = started.state.take() {
        reap_local_proxies(&state);
    }
    if let Some(service) = started.squid_service.take() {
        remove_squid_segments(&service);
    }
}

fn watch_signals(dir: PathBuf) {
    std::thread::spawn(move || {
        let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() else {
            return;
        };
        rt.block_on(async {
            use tokio::signal::unix::{SignalKind, signal};
            let (Ok(mut int), Ok(mut term), Ok(mut hup)) = (
                signal(SignalKind::interrupt()),
                signal(SignalKind::terminate()),
                signal(SignalKind::hangup()),
            ) else {
                return;
            };
            tokio::select! {
                _ = int.recv() => {}
                _ = term.recv() => {}
                _ = hup.recv() => {}
            }
            eprintln!("\ninterrupted: stopping every process this benchmark started");
            clean_up();
            let _ = std::fs::remove_dir_all(&dir);
            std::process::exit(130);
        });
    });
}

/// A process this run started, killed when dropped.
struct Process {
    name: &'static str,
    child: Child,
}

impl Process {
    fn spawn(name: &'static str, cmd: &mut Command) -> Result<Self, String> {
        let mut started = started();
        let child = cmd
            .stdin(Stdio::null())
            .spawn()
            .map_err(|e| format!("starting {name}: {e}"))?;
        started.pids.push(child.id());
        Ok(Self { name, child })
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn alive(&mut self) -> Result<(), String> {
        match self.child.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => Err(format!("{} exited ({status})", self.name)),
            Err(e) => Err(format!("{}: {e}", self.name)),
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let pid = self.child.id();
        let _ = self.child.kill();
        let _ = self.child.wait();
        started().pids.retain(|p| *p != pid);
    }
}

/// Kills, when dropped, the local proxies the operator leaves running by
/// design (to adopt them at its next start).
struct LocalProxies(PathBuf);

impl LocalProxies {
    fn new(state: PathBuf) -> Self {
        started().state = Some(state.clone());
        Self(state)
    }
}

impl Drop for LocalProxies {
    fn drop(&mut self) {
        reap_local_proxies(&self.0);
        started().state = None;
    }
}

fn squid_binary() -> Option<PathBuf> {
    let path = std::env::var("PATH").unwrap_or_default();
    path.split(':')
        .chain(["/usr/sbin", "/sbin", "/usr/local/sbin"])
        .map(|dir| Path::new(dir).join("squid"))
        .find(|p| p.is_file())
}

/// Resident memory of `pid` now (VmRSS), in KiB.
fn rss_kib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .unwrap_or(0.0)
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    match values.len() {
        0 => 0.0,
        n if n % 2 == 1 => values[n / 2],
        n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

/// Raises this process's file limit (children inherit it): the hard one
/// too when allowed (root). The soft limit it ends with.
fn raise_file_limit(wanted: u64) -> u64 {
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return 1024;
    };
    if hard < wanted && setrlimit(Resource::RLIMIT_NOFILE, wanted, wanted).is_ok() {
        return wanted;
    }
    if setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_ok() {
        return hard;
    }
    soft
}

// ---------------------------------------------------------------- the site

/// The site, on a runtime of its own: `/small` and `/large` over HTTP/1.1
/// keep-alive, and an echo port for the idle tunnels.
fn start_site() -> Result<(SocketAddr, SocketAddr), String> {
    let bind = || -> Result<std::net::TcpListener, String> {
        let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| format!("site: {e}"))?;
        l.set_nonblocking(true).map_err(|e| format!("site: {e}"))?;
        Ok(l)
    };
    let (site, echo) = (bind()?, bind()?);
    let addrs = (
        site.local_addr().map_err(|e| e.to_string())?,
        echo.local_addr().map_err(|e| e.to_string())?,
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("site")
        .enable_all()
        .build()
        .map_err(|e| format!("site runtime: {e}"))?;
    std::thread::spawn(move || {
        rt.block_on(async move {
            let (Ok(site), Ok(echo)) = (TcpListener::from_std(site), TcpListener::from_std(echo)) else {
                return;
            };
            tokio::spawn(serve_echo(echo));
            serve_site(site).await;
        });
    });
    Ok(addrs)
}

async fn serve_site(listener: TcpListener) {
    let small = Bytes::from(vec![b's'; SMALL_BYTES]);
    let large = Bytes::from(vec![b'l'; LARGE_BYTES]);
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let _ = stream.set_nodelay(true);
        let (small, large) = (small.clone(), large.clone());
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                let body = match request.uri().path() {
                    "/small" => Some(small.clone()),
                    "/large" => Some(large.clone()),
                    _ => None,
                };
                async move {
                    let mut response = Response::new(Full::new(body.clone().unwrap_or_default()));
                    if body.is_none() {
                        *response.status_mut() = StatusCode::NOT_FOUND;
                    }
                    response
                        .headers_mut()
                        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
                    Ok::<_, std::convert::Infallible>(response)
                }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn serve_echo(listener: TcpListener) {
    loop {
        let Ok((mut stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        tokio::spawn(async move {
            let mut buf = [0u8; 64];
            while let Ok(n) = stream.read(&mut buf).await {
                if n == 0 || stream.write_all(&buf[..n]).await.is_err() {
                    return;
                }
            }
        });
    }
}

// ------------------------------------------------------------ the clients

/// Where a client sends its requests: a proxy and the
/// `Proxy-Authorization` it presents (none for the rotator).
#[derive(Clone)]
struct Via {
    proxy: SocketAddr,
    authorization: Option<HeaderValue>,
}

fn basic(user: &str, password: &str) -> HeaderValue {
    let encoded = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    HeaderValue::from_str(&format!("Basic {encoded}")).unwrap_or(HeaderValue::from_static(""))
}

async fn connect(to: SocketAddr, from: Option<IpAddr>) -> std::io::Result<TcpStream> {
    let stream = match from {
        Some(source) => {
            let socket = TcpSocket::new_v4()?;
            socket.bind(SocketAddr::new(source, 0))?;
            socket.connect(to).await?
        }
        None => TcpStream::connect(to).await?,
    };
    stream.set_nodelay(true)?;
    Ok(stream)
}

/// A keep-alive HTTP/1.1 connection over `stream`.
async fn handshake(stream: TcpStream) -> Result<client::SendRequest<Empty<Bytes>>, String> {
    let (sender, connection) = client::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    tokio::spawn(connection);
    Ok(sender)
}

/// `CONNECT target` through `via`; the stream once the proxy answered `200`.
async fn open_tunnel(via: &Via, target: SocketAddr, from: Option<IpAddr>) -> Result<TcpStream, String> {
    let mut stream = connect(via.proxy, from)
        .await
        .map_err(|e| format!("connecting to {}: {e}", via.proxy))?;
    let mut head = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n");
    if let Some(auth) = &via.authorization {
        head.push_str("Proxy-Authorization: ");
        head.push_str(auth.to_str().unwrap_or_default());
        head.push_str("\r\n");
    }
    head.push_str("\r\n");
    stream
        .write_all(head.as_bytes())
        .await
        .map_err(|e| format!("CONNECT: {e}"))?;
    // Nothing follows the answer's head until the client speaks (neither
    // the site nor the echo port talks first), so reading whole chunks
    // takes nothing of the tunnel's bytes.
    let mut got = Vec::new();
    let mut buf = [0u8; 512];
    while !got.ends_with(b"\r\n\r\n") {
        let n = stream.read(&mut buf).await.map_err(|e| format!("CONNECT: {e}"))?;
        if n == 0 {
            return Err(format!(
                "CONNECT: closed after {:?}",
                String::from_utf8_lossy(&got)
            ));
        }
        got.extend_from_slice(&buf[..n]);
    }
    let line = String::from_utf8_lossy(&got);
    let line = line.lines().next().unwrap_or_default();
    if line.split_whitespace().nth(1) != Some("200") {
        return Err(format!("CONNECT answered {line:?}"));
    }
    Ok(stream)
}

/// Reads a response's body; its length, or why not.
async fn body_length(response: Response<Incoming>, bytes: Option<&AtomicU64>) -> Result<usize, String> {
    if response.status() != StatusCode::OK {
        let reason = response
            .headers()
            .get("egress-gateway-error")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        return Err(format!("status {} {reason}", response.status()));
    }
    let mut body = response.into_body();
    let mut length = 0;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| format!("body: {e}"))?;
        if let Some(data) = frame.data_ref() {
            length += data.len();
            if let Some(bytes) = bytes {
                bytes.fetch_add(data.len() as u64, Ordering::Relaxed);
            }
        }
    }
    Ok(length)
}

/// What one client saw: when each measured request ended and what it took.
#[derive(Default)]
struct Seen {
    done: Vec<(Instant, Duration)>,
    /// Connections opened after the first (the proxy closed one).
    reconnects: u64,
    errors: u64,
    first_error: Option<String>,
}

impl Seen {
    fn error(&mut self, e: String) {
        self.errors += 1;
        self.first_error.get_or_insert(e);
    }
}

/// Fetches `/small` through `via` on one keep-alive connection (opening
/// another when it closes) until `stop`.
async fn small_client(via: Via, site: SocketAddr, stop: Arc<AtomicBool>) -> Seen {
    let mut seen = Seen::default();
    let url = format!("http://{site}/small");
    let host = HeaderValue::from_str(&site.to_string()).unwrap_or(HeaderValue::from_static("site"));
    let mut sender = None;
    let mut opened: u64 = 0;
    while !stop.load(Ordering::Relaxed) {
        let open = match sender.take() {
            Some(open) => Ok(open),
            None => {
                opened += 1;
                match connect(via.proxy, None).await {
                    Ok(stream) => handshake(stream).await,
                    Err(e) => Err(format!("connecting to {}: {e}", via.proxy)),
                }
            }
        };
        let mut open: client::SendRequest<Empty<Bytes>> = match open {
            Ok(open) => open,
            Err(e) => {
                seen.error(e);
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let mut request = Request::get(url.as_str())
            .header(header::HOST, host.clone())
            .body(Empty::new())
            .unwrap_or_default();
        if let Some(auth) = &via.authorization {
            request
                .headers_mut()
                .insert(header::PROXY_AUTHORIZATION, auth.clone());
        }
        let start = Instant::now();
        if open.ready().await.is_err() {
            continue;
        }
        let answered = match open.send_request(request).await {
            Ok(response) => body_length(response, None).await,
            Err(e) => Err(format!("request: {e}")),
        };
        match answered {
            Ok(SMALL_BYTES) => {
                seen.done.push((Instant::now(), start.elapsed()));
                sender = Some(open);
            }
            Ok(n) => seen.error(format!("{n} body bytes, not {SMALL_BYTES}")),
            Err(e) => seen.error(e),
        }
    }
    seen.reconnects = opened.saturating_sub(1);
    seen
}

/// Fetches `/large` inside a tunnel through `via` until `stop`, adding
/// every body byte to `bytes`.
async fn large_client(via: Via, site: SocketAddr, bytes: Arc<AtomicU64>, stop: Arc<AtomicBool>) -> Seen {
    let mut seen = Seen::default();
    let host = HeaderValue::from_str(&site.to_string()).unwrap_or(HeaderValue::from_static("site"));
    let mut sender = None;
    let mut opened: u64 = 0;
    while !stop.load(Ordering::Relaxed) {
        let open = match sender.take() {
            Some(open) => Ok(open),
            None => {
                opened += 1;
                match open_tunnel(&via, site, None).await {
                    Ok(stream) => handshake(stream).await,
                    Err(e) => Err(e),
                }
            }
        };
        let mut open: client::SendRequest<Empty<Bytes>> = match open {
            Ok(open) => open,
            Err(e) => {
                seen.error(e);
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let request = Request::get("/large")
            .header(header::HOST, host.clone())
            .body(Empty::new())
            .unwrap_or_default();
        let start = Instant::now();
        if open.ready().await.is_err() {
            continue;
        }
        let answered = match open.send_request(request).await {
            Ok(response) => body_length(response, Some(&bytes)).await,
            Err(e) => Err(format!("request: {e}")),
        };
        match answered {
            Ok(LARGE_BYTES) => {
                seen.done.push((Instant::now(), start.elapsed()));
                sender = Some(open);
            }
            Ok(n) => seen.error(format!("{n} body bytes, not {LARGE_BYTES}")),
            Err(e) => seen.error(e),
        }
    }
    seen.reconnects = opened.saturating_sub(1);
    seen
}

// ---------------------------------------------------------- measurements

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Case {
    Gateway,
    Straight,
    Rotator,
    /// Straight, through a relay that only moves bytes: what any extra hop costs.
    BareHop,
    /// Straight, through a relay that parses heads and moves bytes
    /// (`bare_relay`): the gateway's work without leasing, judging or identities.
    BareRelay,
}

impl Case {
    fn name(self) -> &'static str {
        match self {
            Case::Gateway => "gateway",
            Case::Straight => "straight",
            Case::Rotator => "Squid rotator",
            Case::BareHop => "splice hop",
            Case::BareRelay => "bare relay",
        }
    }
}

/// One measured phase.
struct Sample {
    case: Case,
    /// Requests per second in the window.
    rate: f64,
    /// Body MB (10^6 bytes) per second in the window (tunnels).
    megabytes: f64,
    p50: f64,
    p99: f64,
    /// Connections the clients had to open again (the proxy closed theirs).
    reconnects: u64,
    /// Cores the hop used in the window: the operator (gateway, straight,
    /// rotator: the operator idles) or the relay's process.
    hop_cores: f64,
    /// Cores the upstream proxies used in the window, together.
    upstream_cores: f64,
}

struct Bench {
    site: SocketAddr,
    echo: SocketAddr,
    gateway: Via,
    /// The upstreams as the lease API hands them out.
    upstreams: Vec<Via>,
    rotator: Option<Via>,
    /// Through the splice hop, one way in per upstream (its credentials).
    bare_hops: Vec<Via>,
    /// Through the bare relay, one way in per upstream (its credentials).
    bare_relays: Vec<Via>,
    operator_pid: u32,
    /// The splice hop's and the bare relay's processes (for their CPU).
    bare_hop_pid: u32,
    bare_relay_pid: u32,
    /// The upstreams' processes (for their CPU).
    upstream_pids: Vec<u32>,
    clients: usize,
    window: Duration,
}

impl Bench {
    /// Client `i`'s way in for `case`.
    fn via(&self, case: Case, i: usize) -> Via {
        match case {
            Case::Gateway => self.gateway.clone(),
            Case::Straight => self.upstreams[i % self.upstreams.len()].clone(),
            Case::Rotator => self.rotator.clone().unwrap_or_else(|| self.gateway.clone()),
            Case::BareHop => self.bare_hops[i % self.bare_hops.len()].clone(),
            Case::BareRelay => self.bare_relays[i % self.bare_relays.len()].clone(),
        }
    }

    /// Runs `clients` clients of `case`, warms up, measures one window.
    async fn phase(&self, case: Case, clients: usize, large: bool) -> Result<Sample, String> {
        let stop = Arc::new(AtomicBool::new(false));
        let bytes = Arc::new(AtomicU64::new(0));
        let tasks: Vec<_> = (0..clients)
            .map(|i| {
                let (via, stop, bytes) = (self.via(case, i), stop.clone(), bytes.clone());
                let site = self.site;
                tokio::spawn(async move {
                    if large {
                        large_client(via, site, bytes, stop).await
                    } else {
                        small_client(via, site, stop).await
                    }
                })
            })
            .collect();
        tokio::time::sleep(WARM_UP).await;
        let hop = match case {
            Case::BareHop => self.bare_hop_pid,
            Case::BareRelay => self.bare_relay_pid,
            _ => self.operator_pid,
        };
        let upstreams_cpu = || self.upstream_pids.iter().map(|p| cpu_seconds(*p)).sum::<f64>();
        let (from, cpu, upstream_cpu, bytes_before) = (
            Instant::now(),
            cpu_seconds(hop),
            upstreams_cpu(),
            bytes.load(Ordering::Relaxed),
        );
        tokio::time::sleep(self.window).await;
        let (to, cpu, upstream_cpu, moved) = (
            Instant::now(),
            cpu_seconds(hop) - cpu,
            upstreams_cpu() - upstream_cpu,
            bytes.load(Ordering::Relaxed) - bytes_before,
        );
        stop.store(true, Ordering::Relaxed);
        let mut latencies = Vec::new();
        let (mut errors, mut first_error, mut reconnects) = (0, None, 0);
        for task in tasks {
            let seen = task.await.map_err(|e| format!("client task: {e}"))?;
            errors += seen.errors;
            reconnects += seen.reconnects;
            first_error = first_error.or(seen.first_error);
            latencies.extend(
                seen.done
                    .into_iter()
                    .filter(|(end, took)| *end <= to && end.checked_sub(*took).is_some_and(|s| s >= from))
                    .map(|(_, took)| took),
            );
        }
        if errors > 0 {
            return Err(format!(
                "{}: {errors} failed requests, the first: {}",
                case.name(),
                first_error.unwrap_or_default()
            ));
        }
        latencies.sort();
        let seconds = (to - from).as_secs_f64();
        Ok(Sample {
            case,
            rate: latencies.len() as f64 / seconds,
            megabytes: moved as f64 / seconds / 1e6,
            p50: pct(&latencies, 0.50),
            p99: pct(&latencies, 0.99),
            reconnects,
            hop_cores: cpu / seconds,
            upstream_cores: upstream_cpu / seconds,
        })
    }

    /// Opens `count` tunnels through the gateway to the echo port (each
    /// checked with one byte there and back) and holds them; the operator's
    /// RSS before, with them open, and after they are closed.
    async fn idle_tunnels(&self, count: usize) -> Result<TunnelResult, String> {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let before = rss_kib(self.operator_pid);
        let started = Instant::now();
        let opened: Vec<Result<TcpStream, String>> = futures::stream::iter(0..count)
            .map(|i| {
                let (via, echo) = (self.gateway.clone(), self.echo);
                // Spread over source addresses: no single one runs out of ports.
                let from = IpAddr::V4(Ipv4Addr::new(127, 0, 1, (i % 16) as u8 + 1));
                async move {
                    let mut stream = open_tunnel(&via, echo, Some(from)).await?;
                    stream
                        .write_all(b"x")
                        .await
                        .map_err(|e| format!("tunnel write: {e}"))?;
                    let mut byte = [0u8; 1];
                    stream
                        .read_exact(&mut byte)
                        .await
                        .map_err(|e| format!("tunnel read: {e}"))?;
                    Ok(stream)
                }
            })
            .buffer_unordered(OPENING_AT_ONCE)
            .collect()
            .await;
        let opening = started.elapsed();
        let mut held = Vec::with_capacity(count);
        let (mut failed, mut first_error) = (0, None);
        for tunnel in opened {
            match tunnel {
                Ok(stream) => held.push(stream),
                Err(e) => {
                    failed += 1;
                    first_error.get_or_insert(e);
                }
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        let open = rss_kib(self.operator_pid);
        let peak = peak_rss_kib(self.operator_pid);
        let held_count = held.len();
        drop(held);
        tokio::time::sleep(Duration::from_secs(2)).await;
        let after = rss_kib(self.operator_pid);
        if failed > 0 {
            return Err(format!(
                "{failed} of {count} tunnels failed, the first: {}",
                first_error.unwrap_or_default()
            ));
        }
        Ok(TunnelResult {
            held: held_count,
            opening,
            before,
            open,
            peak,
            after,
        })
    }
}

/// Peak resident memory of `pid` so far (VmHWM), in KiB.
fn peak_rss_kib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .unwrap_or(0.0)
}

struct TunnelResult {
    held: usize,
    opening: Duration,
    before: f64,
    open: f64,
    peak: f64,
    after: f64,
}

impl TunnelResult {
    fn kib_per_tunnel(&self) -> f64 {
        (self.open - self.before) / self.held.max(1) as f64
    }
}

// ------------------------------------------------------------- the setup

/// The standalone operator with the gateway and `upstreams` local proxies.
async fn start_operator(
    dir: &Path,
    api: SocketAddr,
    gateway: SocketAddr,
    site: SocketAddr,
    upstreams: usize,
) -> Result<Process, String> {
    let io = |e: std::io::Error| format!("writing the operator's files: {e}");
    // The echo and site ports are high ones: CONNECT must be allowed to them.
    let destinations = "{allow: [127.0.0.0/8, 1024-65535]}";
    std::fs::write(
        dir.join("providers.yaml"),
        format!(
            "providers:\n  - {{name: local, type: local, local: {{implementation: auto, destinations: {destinations}}}}}\n"
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
                 spec: {{mode: Managed, provider: local, attributes: {{upstream: \"{i}\"}}, \
                 healthCheck: {{url: \"http://{site}/small\", interval: 1s}}}}\n"
            ),
        )
        .map_err(io)?;
    }
    std::fs::write(
        dir.join("standalone.yaml"),
        format!(
            "providersConfig: providers.yaml\nmanifests: proxies\nstateDir: state\n\
             healthProbeBindAddress: \"0\"\nmetricsBindAddress: \"0\"\ndiscoveryBindAddress: \"{api}\"\n\
             gatewayBindAddress: \"{gateway}\"\ngateway: {{destinations: {destinations}}}\n\
             maxLeasesPerProxy: 0\nleaseCooldown: 0s\n"
        ),
    )
    .map_err(io)?;
    let log = std::fs::File::create(dir.join("operator.log")).map_err(io)?;
    let log2 = log.try_clone().map_err(io)?;
    let mut operator = Process::spawn(
        "the operator",
        Command::new(BIN)
            .args([
                "standalone",
                "--log-format",
                "text",
                "--log-level",
                "warn",
                "--config",
            ])
            .arg(dir.join("standalone.yaml"))
            .env_remove("DISCOVERY_READ_TOKEN")
            .env("DISCOVERY_TOKEN", TOKEN)
            .current_dir(dir)
            .stdout(log2)
            .stderr(log),
    )?;
    // Every upstream Ready and healthy, as the API lists them.
    let client = reqwest::Client::new();
    let deadline = Instant::now() + START_DEADLINE;
    loop {
        operator.alive().map_err(|e| {
            let log = std::fs::read_to_string(dir.join("operator.log")).unwrap_or_default();
            format!("{e}\n{log}")
        })?;
        let healthy = healthy_proxies(&client, api, TOKEN).await;
        if healthy == upstreams {
            return Ok(operator);
        }
        if Instant::now() > deadline {
            let log = std::fs::read_to_string(dir.join("operator.log")).unwrap_or_default();
            return Err(format!(
                "{healthy} of {upstreams} upstreams healthy after {START_DEADLINE:?}\n{log}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Each upstream's address and credentials, as a lease hands them out
/// (taken by its attribute and released at once).
async fn upstreams(api: SocketAddr, count: usize) -> Result<Vec<(SocketAddr, String, String)>, String> {
    let client = reqwest::Client::new();
    let mut found = Vec::new();
    for i in 0..count {
        let ask = serde_json::json!({"target": "bench.example", "selector": {"upstream": i.to_string()}});
        let grant: serde_json::Value = client
            .post(format!("http://{api}/v1/leases"))
            .bearer_auth(TOKEN)
            .json(&ask)
            .send()
            .await
            .and_then(|r| r.error_for_status())
            .map_err(|e| format!("leasing upstream {i}: {e}"))?
            .json()
            .await
            .map_err(|e| format!("leasing upstream {i}: {e}"))?;
        let proxy = &grant["proxy"];
        let url = url::Url::parse(proxy["url"].as_str().unwrap_or_default())
            .map_err(|e| format!("upstream {i}'s URL: {e}"))?;
        let addr = url
            .socket_addrs(|| None)
            .ok()
            .and_then(|a| a.first().copied())
            .ok_or_else(|| format!("upstream {i}: no address in {url}"))?;
        let field = |name: &str| proxy[name].as_str().unwrap_or_default().to_owned();
        found.push((addr, field("username"), field("password")));
        let id = grant["id"].as_str().unwrap_or_default();
        client
            .delete(format!("http://{api}/v1/leases/{id}"))
            .bearer_auth(TOKEN)
            .send()
            .await
            .map_err(|e| format!("releasing: {e}"))?;
    }
    Ok(found)
}

/// What the local provider runs: the name of the upstreams' processes.
fn upstream_kind(state: &Path) -> String {
    let kinds: Vec<String> = local_proxy_pids(state)
        .into_iter()
        .filter_map(|pid| std::fs::read_to_string(format!("/proc/{pid}/comm")).ok())
        .map(|comm| match comm.trim() {
            "squid" => "Squid".to_owned(),
            other if other.starts_with("egress-proxies") => "the built-in proxy".to_owned(),
            other => other.to_owned(),
        })
        .collect();
    let mut unique = kinds;
    unique.sort();
    unique.dedup();
    unique.join(", ")
}

/// Squid with every upstream as a round-robin parent: the rotator a user
/// would build without the gateway. Open on loopback; no cache.
fn start_rotator(
    squid: &Path,
    dir: &Path,
    addr: SocketAddr,
    upstreams: &[(SocketAddr, String, String)],
) -> Result<Process, String> {
    let run = dir.join("rotator");
    let io = |e: std::io::Error| format!("writing the rotator's files: {e}");
    std::fs::create_dir_all(&run).map_err(io)?;
    let user = if nix::unistd::geteuid().is_root() {
        let user = nix::unistd::User::from_name("proxy")
            .ok()
            .flatten()
            .ok_or("running as root, Squid needs the user `proxy` (made by Debian's squid package)")?;
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).map_err(io)?;
        nix::unistd::chown(run.as_path(), Some(user.uid), Some(user.gid))
            .map_err(|e| format!("chown {}: {e}", run.display()))?;
        format!("cache_effective_user {}\n", user.name)
    } else {
        String::new()
    };
    let mut peers = String::new();
    for (i, (upstream, username, password)) in upstreams.iter().enumerate() {
        let _ = writeln!(
            peers,
            "cache_peer {} parent {} 0 no-query round-robin login={username}:{password} name=up{i}",
            upstream.ip(),
            upstream.port()
        );
    }
    let d = run.display();
    let conf = format!(
        "http_port {addr}\n{user}http_access allow all\n{peers}never_direct allow all\n\
         via off\nforwarded_for delete\nmax_filedescriptors 4096\ncache deny all\ncache_mem 8 MB\n\
         pinger_enable off\nshutdown_lifetime 1 seconds\npid_filename {d}/squid.pid\n\
         cache_log {d}/cache.log\naccess_log stdio:{d}/access.log\ncoredump_dir {d}\n"
    );
    let conf_file = run.join("squid.conf");
    std::fs::write(&conf_file, conf).map_err(io)?;
    let service = format!("epogw{}", std::process::id());
    started().squid_service = Some(service.clone());
    let mut process = Process::spawn(
        "the Squid rotator",
        Command::new(squid)
            .args(["-N", "-n", &service, "-f"])
            .arg(&conf_file)
            .current_dir(&run)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit()),
    )?;
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
        process.alive()?;
        if Instant::now() > deadline {
            return Err(format!("the Squid rotator does not listen on {addr}"));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(process)
}

// ------------------------------------------------- splice hop, bare relay

/// Starts this benchmark's binary again with `flag` (`--bare-hop`,
/// `--bare-relay`) as `what`: one loopback port per upstream, each
/// client's connection relayed to that upstream.
fn start_relay(
    flag: &str,
    what: &'static str,
    upstreams: &[(SocketAddr, String, String)],
) -> Result<(Process, Vec<Via>), String> {
    let exe = std::env::current_exe().map_err(|e| format!("this benchmark's binary: {e}"))?;
    let mut command = Command::new(exe);
    command.arg(flag);
    let mut ways = Vec::new();
    for (upstream, user, password) in upstreams {
        let listen = free_addr();
        command.arg(format!("{listen}={upstream}"));
        ways.push(Via {
            proxy: listen,
            authorization: Some(basic(user, password)),
        });
    }
    let mut process = Process::spawn(what, command.stdout(Stdio::null()).stderr(Stdio::inherit()))?;
    let deadline = Instant::now() + Duration::from_secs(10);
    for way in &ways {
        while std::net::TcpStream::connect_timeout(&way.proxy, Duration::from_millis(200)).is_err() {
            process.alive()?;
            if Instant::now() > deadline {
                return Err(format!("{what} does not listen on {}", way.proxy));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    Ok((process, ways))
}

/// `LISTEN=UPSTREAM` pairs from the command line, and a runtime with as
/// many threads as the gateway has.
fn relay_setup(pairs: &[String]) -> Result<(Vec<(SocketAddr, SocketAddr)>, tokio::runtime::Runtime), String> {
    let parsed = pairs
        .iter()
        .map(|pair| {
            let (listen, upstream) = pair
                .split_once('=')
                .ok_or(format!("{pair}: not LISTEN=UPSTREAM"))?;
            Ok((
                listen.parse().map_err(|e| format!("{listen}: {e}"))?,
                upstream.parse().map_err(|e| format!("{upstream}: {e}"))?,
            ))
        })
        .collect::<Result<_, String>>()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    Ok((parsed, runtime))
}

/// The bare relay's process ([`bare_relay`]). Runs until killed.
fn bare_relay_main(pairs: &[String]) -> ExitCode {
    let outcome = relay_setup(pairs).and_then(|(pairs, runtime)| {
        runtime
            .block_on(bare_relay::serve(pairs))
            .map_err(|e| e.to_string())
    });
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bare relay: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The splice hop's process: each `LISTEN=UPSTREAM` pair's connections
/// relayed to the upstream by the kernel (the gateway's own tunnel relay,
/// `zero_copy`), with nothing read, parsed or decided. Runs until killed.
fn bare_hop_main(pairs: &[String]) -> ExitCode {
    let (pairs, runtime) = match relay_setup(pairs) {
        Ok(setup) => setup,
        Err(e) => {
            eprintln!("splice hop: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async {
        for (listen, upstream) in pairs {
            let listener = match TcpListener::bind(listen).await {
                Ok(listener) => listener,
                Err(e) => {
                    eprintln!("splice hop: binding {listen}: {e}");
                    return ExitCode::FAILURE;
                }
            };
            tokio::spawn(async move {
                while let Ok((client, _)) = listener.accept().await {
                    tokio::spawn(async move {
                        let Ok(upstream) = TcpStream::connect(upstream).await else {
                            return;
                        };
                        let _ = (client.set_nodelay(true), upstream.set_nodelay(true));
                        let end = |socket| zero_copy::End {
                            socket,
                            early: Bytes::new(),
                        };
                        let _ = zero_copy::relay(end(client), end(upstream), &|_, _| {}).await;
                    });
                }
            });
        }
        futures::future::pending::<ExitCode>().await
    })
}

// ----------------------------------------------------------------- the run

struct Settings {
    rounds: usize,
    window: Duration,
    clients: usize,
    upstreams: usize,
    tunnels: usize,
}

impl Settings {
    fn from_args() -> Self {
        let quick = std::env::args().any(|a| a == "--quick")
            || std::env::var("EPO_BENCH_QUICK").is_ok_and(|v| !v.is_empty() && v != "0");
        let number = |name: &str, default: f64| arg(name).and_then(|v| v.parse().ok()).unwrap_or(default);
        Self {
            rounds: number("--rounds", if quick { 1.0 } else { 2.0 }) as usize,
            window: Duration::from_secs_f64(number("--seconds", if quick { 1.5 } else { 4.0 })),
            clients: number("--clients", 64.0) as usize,
            upstreams: (number("--upstreams", 4.0) as usize).max(1),
            tunnels: number("--tunnels", if quick { 1_000.0 } else { 10_000.0 }) as usize,
        }
    }
}

fn run(dir: &Path, settings: &Settings) -> Result<bool, String> {
    let run_started = Instant::now();
    // Two per tunnel here (client, echo), two in the operator, two in an upstream.
    let limit = raise_file_limit((settings.tunnels as u64 * 2 + SPARE_FDS).max(65_536));
    let tunnels = settings
        .tunnels
        .min(usize::try_from(limit.saturating_sub(SPARE_FDS) / 2).unwrap_or(usize::MAX));
    let (site, echo) = start_site()?;
    let (api, gateway_addr, rotator_addr) = (free_addr(), free_addr(), free_addr());
    let _local = LocalProxies::new(dir.join("state"));
    let runtime = common::load_generator_runtime();
    runtime.block_on(async {
        let mut operator = start_operator(dir, api, gateway_addr, site, settings.upstreams).await?;
        let found = upstreams(api, settings.upstreams).await?;
        let kind = upstream_kind(&dir.join("state"));
        let squid = squid_binary();
        let mut rotator = match &squid {
            Some(squid) => Some(start_rotator(squid, dir, rotator_addr, &found)?),
            None => None,
        };
        let (mut bare_hop, bare_hops) = start_relay("--bare-hop", "the splice hop", &found)?;
        let (mut bare_relay, bare_relays) = start_relay("--bare-relay", "the bare relay", &found)?;
        let bench = Bench {
            site,
            echo,
            gateway: Via {
                proxy: gateway_addr,
                authorization: Some(basic("crawler", TOKEN)),
            },
            upstreams: found
                .iter()
                .map(|(addr, user, password)| Via {
                    proxy: *addr,
                    authorization: Some(basic(user, password)),
                })
                .collect(),
            rotator: rotator.as_ref().map(|_| Via {
                proxy: rotator_addr,
                authorization: None,
            }),
            bare_hops,
            bare_relays,
            operator_pid: operator.pid(),
            bare_hop_pid: bare_hop.pid(),
            bare_relay_pid: bare_relay.pid(),
            upstream_pids: local_proxy_pids(&dir.join("state"))
                .into_iter()
                .filter_map(|p| u32::try_from(p).ok())
                .collect(),
            clients: settings.clients,
            window: settings.window,
        };
        println!(
            "gateway benchmark: {BIN}\n{} upstreams ({kind}), maxLeasesPerProxy 0, leaseCooldown 0s; {} clients; \
             {} rounds of {:.1} s windows; {tunnels} idle tunnels (file limit {limit}); load average {}",
            settings.upstreams,
            settings.clients,
            settings.rounds,
            settings.window.as_secs_f64(),
            load_average()
        );
        if squid.is_none() {
            println!("Squid not installed: no rotator case");
        }
        // The gateway must refuse a request without the token.
        let mut refused = Via {
            proxy: gateway_addr,
            authorization: None,
        };
        let seen = small_once(&refused, site).await;
        if !seen.is_err_and(|e| e.starts_with("status 407")) {
            return Err("the gateway answered a request without credentials".to_owned());
        }
        refused.authorization = Some(basic("crawler", "wrong"));
        if !small_once(&refused, site).await.is_err_and(|e| e.starts_with("status 407")) {
            return Err("the gateway answered a request with a wrong password".to_owned());
        }

        let mut small_cases = vec![Case::Gateway, Case::Straight, Case::BareHop, Case::BareRelay];
        if bench.rotator.is_some() {
            small_cases.push(Case::Rotator);
        }
        let mut small = Vec::new();
        let mut alone = Vec::new();
        let mut large = Vec::new();
        for round in 0..settings.rounds {
            for i in 0..small_cases.len() {
                let case = small_cases[(i + round) % small_cases.len()];
                operator.alive()?;
                if let Some(rotator) = rotator.as_mut() {
                    rotator.alive()?;
                }
                bare_hop.alive()?;
                bare_relay.alive()?;
                let sample = bench.phase(case, bench.clients, false).await?;
                print_sample(round, "small", &sample);
                small.push(sample);
            }
            let cases = [Case::Gateway, Case::Straight, Case::BareHop, Case::BareRelay];
            for i in 0..cases.len() {
                let case = cases[(i + round) % cases.len()];
                let sample = bench.phase(case, 1, false).await?;
                print_sample(round, "small, 1 client", &sample);
                alone.push(sample);
            }
            for i in 0..cases.len() {
                let case = cases[(i + round) % cases.len()];
                let sample = bench.phase(case, bench.clients, true).await?;
                print_sample(round, "1 MiB tunnels", &sample);
                large.push(sample);
            }
        }
        let idle = bench.idle_tunnels(tunnels).await?;
        println!(
            "{} idle tunnels opened in {:.1} s; operator RSS {:.1} MiB before, {:.1} MiB with them open \
             (peak {:.1} MiB), {:.1} MiB after they closed",
            idle.held,
            idle.opening.as_secs_f64(),
            idle.before / 1024.0,
            idle.open / 1024.0,
            idle.peak / 1024.0,
            idle.after / 1024.0
        );
        operator.alive()?;
        println!(
            "load average at the end: {}; the run took {:.0} s",
            load_average(),
            run_started.elapsed().as_secs_f64()
        );
        let (text, met) = summary(&small, &alone, &large, &idle, bench.rotator.is_some());
        print!("{text}");
        Ok(met)
    })
}

/// One small request through `via` on a fresh connection.
async fn small_once(via: &Via, site: SocketAddr) -> Result<usize, String> {
    let stream = connect(via.proxy, None).await.map_err(|e| e.to_string())?;
    let mut sender = handshake(stream).await?;
    let mut request = Request::get(format!("http://{site}/small"))
        .header(header::HOST, site.to_string())
        .body(Empty::new())
        .map_err(|e| e.to_string())?;
    if let Some(auth) = &via.authorization {
        request
            .headers_mut()
            .insert(header::PROXY_AUTHORIZATION, auth.clone());
    }
    let response = sender.send_request(request).await.map_err(|e| e.to_string())?;
    body_length(response, None).await
}

fn print_sample(round: usize, what: &str, s: &Sample) {
    println!(
        "round {} {what:16} {:14}: {:>8.0} req/s {:>8.1} MB/s  p50 {:>6.2} ms  p99 {:>6.2} ms  CPU: hop {:.2}, upstreams {:.2} cores  reconnects {}",
        round + 1,
        s.case.name(),
        s.rate,
        s.megabytes,
        s.p50,
        s.p99,
        s.hop_cores,
        s.upstream_cores,
        s.reconnects
    );
}

fn summary(
    small: &[Sample],
    alone: &[Sample],
    large: &[Sample],
    idle: &TunnelResult,
    rotator: bool,
) -> (String, bool) {
    let of = |samples: &[Sample], case: Case, value: fn(&Sample) -> f64| {
        median(samples.iter().filter(|s| s.case == case).map(value).collect())
    };
    let mut text = String::from(
        "\n| case | small req/s | p50 ms | p99 ms | hop CPU | upstreams CPU | 1 client p50 ms | 1 client p99 ms | 1 MiB tunnels MB/s |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    let mut cases = vec![Case::Gateway, Case::Straight, Case::BareHop, Case::BareRelay];
    if rotator {
        cases.push(Case::Rotator);
    }
    for case in &cases {
        let one = |v: fn(&Sample) -> f64| match case {
            Case::Rotator => "".to_owned(),
            _ => format!("{:.2}", of(alone, *case, v)),
        };
        let _ = writeln!(
            text,
            "| {} | {:.0} | {:.2} | {:.2} | {:.2} | {:.2} | {} | {} | {} |",
            case.name(),
            of(small, *case, |s| s.rate),
            of(small, *case, |s| s.p50),
            of(small, *case, |s| s.p99),
            of(small, *case, |s| s.hop_cores),
            of(small, *case, |s| s.upstream_cores),
            one(|s| s.p50),
            one(|s| s.p99),
            match case {
                Case::Rotator => "".to_owned(),
                _ => format!("{:.0}", of(large, *case, |s| s.megabytes)),
            },
        );
    }
    let _ = writeln!(
        text,
        "\n(medians over rounds; CPU: cores used during the small runs by the hop — the operator, gateway included, \
         for the gateway (and idle for straight and the rotator), the relay's process for the splice hop and the bare relay — \
         and by all upstream proxies together)"
    );
    let mut met = true;
    let mut judge = |text: &mut String, what: String, pass: bool| {
        met &= pass;
        let _ = writeln!(text, "{what}: {}", if pass { "MET" } else { "MISSED" });
    };
    let rate = |case| of(small, case, |s| s.rate);
    let ratio = rate(Case::Gateway) / rate(Case::Straight);
    judge(
        &mut text,
        format!("gateway / straight, small req/s: {ratio:.2} (target >= {VS_STRAIGHT})"),
        ratio >= VS_STRAIGHT,
    );
    if rotator {
        let ratio = rate(Case::Gateway) / rate(Case::Rotator);
        judge(
            &mut text,
            format!("gateway / Squid rotator, small req/s: {ratio:.2} (target >= {VS_ROTATOR})"),
            ratio >= VS_ROTATOR,
        );
    }
    let added = |v: fn(&Sample) -> f64| of(alone, Case::Gateway, v) - of(alone, Case::Straight, v);
    let (p50, p99) = (added(|s| s.p50), added(|s| s.p99));
    judge(
        &mut text,
        format!(
            "added latency, one client: p50 {p50:+.2} ms (target <= {ADDED_P50_MS}), p99 {p99:+.2} ms (target <= {ADDED_P99_MS})"
        ),
        p50 <= ADDED_P50_MS && p99 <= ADDED_P99_MS,
    );
    let ratio = of(large, Case::Gateway, |s| s.megabytes) / of(large, Case::Straight, |s| s.megabytes);
    judge(
        &mut text,
        format!("gateway / straight, 1 MiB tunnel throughput: {ratio:.2} (target >= {LARGE_VS_STRAIGHT})"),
        ratio >= LARGE_VS_STRAIGHT,
    );
    let mb = |case| of(large, case, |s| s.megabytes);
    let ratio = rate(Case::Gateway) / rate(Case::BareRelay);
    judge(
        &mut text,
        format!("gateway / bare relay, small req/s: {ratio:.2} (target >= {VS_BARE_RELAY})"),
        ratio >= VS_BARE_RELAY,
    );
    let ratio = mb(Case::Gateway) / mb(Case::BareRelay);
    judge(
        &mut text,
        format!("gateway / bare relay, 1 MiB tunnel throughput: {ratio:.2} (target >= {VS_BARE_RELAY})"),
        ratio >= VS_BARE_RELAY,
    );
    // Not judged: what a relay that parses heads costs, and the ceiling any
    // relaying hop meets on this machine.
    let _ = writeln!(
        text,
        "bare relay (parses heads, moves bytes): small req/s {:.2} of straight, 1 MiB tunnels {:.2} of straight, \
         one client p50 {:+.2} ms, p99 {:+.2} ms",
        rate(Case::BareRelay) / rate(Case::Straight),
        mb(Case::BareRelay) / mb(Case::Straight),
        of(alone, Case::BareRelay, |s| s.p50) - of(alone, Case::Straight, |s| s.p50),
        of(alone, Case::BareRelay, |s| s.p99) - of(alone, Case::Straight, |s| s.p99),
    );
    let _ = writeln!(
        text,
        "ceiling, a splice hop that only moves bytes (kernel splice): small req/s {:.2} of straight \
         (the gateway reaches {:.2} of it), 1 MiB tunnels {:.2} of straight (the gateway {:.2} of it), \
         one client p50 {:+.2} ms, p99 {:+.2} ms",
        rate(Case::BareHop) / rate(Case::Straight),
        rate(Case::Gateway) / rate(Case::BareHop),
        mb(Case::BareHop) / mb(Case::Straight),
        mb(Case::Gateway) / mb(Case::BareHop),
        of(alone, Case::BareHop, |s| s.p50) - of(alone, Case::Straight, |s| s.p50),
        of(alone, Case::BareHop, |s| s.p99) - of(alone, Case::Straight, |s| s.p99),
    );
    let per = idle.kib_per_tunnel();
    judge(
        &mut text,
        format!(
            "operator RSS per idle tunnel, {} held: {per:.1} KiB (target <= {KIB_PER_TUNNEL})",
            idle.held
        ),
        per <= KIB_PER_TUNNEL,
    );
    (text, met)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if let Some(at) = args.iter().position(|a| a == "--bare-hop") {
        return bare_hop_main(&args[at + 1..]);
    }
    if let Some(at) = args.iter().position(|a| a == "--bare-relay") {
        return bare_relay_main(&args[at + 1..]);
    }
    egress_proxies::tls::ensure_crypto_provider();
    let settings = Settings::from_args();
    let check = std::env::args().any(|a| a == "--check");
    let dir = match tempfile::Builder::new().prefix("epo-bench-gateway-").tempdir() {
        Ok(dir) => dir,
        Err(e) => {
            eprintln!("error: a temporary directory: {e}");
            return ExitCode::FAILURE;
        }
    };
    watch_signals(dir.path().to_owned());
    let outcome = run(dir.path(), &settings);
    clean_up();
    match outcome {
        Ok(met) if met || !check => ExitCode::SUCCESS,
        Ok(_) => {
            eprintln!("--check: a target was missed");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
