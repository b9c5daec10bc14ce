//! Lease API latency while a burst of Proxies is created at once. The real
//! operator binary runs standalone (embedded store, lease log) with a seed of
//! External proxies; a steady lease load runs (acquire, then release when
//! granted) from several clients; then manifests declaring `--burst` more
//! Proxies appear at once. Every new Proxy gets an actor, a finalizer and
//! status writes in the store, probes through a real forward proxy (the
//! operator's built-in one) to a real HTTP target, and availability pushed to
//! the lease store — all while the lease API answers. Latencies are reported
//! before the burst, during it (until every new proxy is healthy) and after.
//!
//!   cargo bench -p egress-proxies-operator --bench lease_burst -- [--burst 1000] [--seed 100] [--clients 16] [--rate 2000] [--after 5]
//!
//! `--rate` is the total lease requests per second, open loop (each client
//! keeps its own schedule; a late answer does not lower the offered load).
//! Each client connects from its own loopback address (127.0.0.2, …), so
//! the API's per-client rate limit (1,000/s) is not what is measured.
//! All traffic stays on loopback.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tokio::net::TcpStream;

mod common;
use common::{Conn, Kill, arg, free_addr, lease_id, pct, target};

const BIN: &str = env!("CARGO_BIN_EXE_egress-proxies-operator");

/// Writes `count` External proxies named `{prefix}-N` into `dir`, in files of
/// at most 500 documents, each written aside and renamed into place.
fn write_manifests(dir: &Path, prefix: &str, count: usize, proxy: SocketAddr, target: SocketAddr) {
    for (file, chunk) in (0..count).collect::<Vec<_>>().chunks(500).enumerate() {
        let mut yaml = String::new();
        for i in chunk {
            yaml.push_str(&format!(
                "---\napiVersion: crawl.example.com/v1alpha1\nkind: Proxy\nmetadata: {{name: {prefix}-{i}, namespace: bench}}\n\
                 spec: {{mode: External, endpoint: {{host: 127.0.0.1, port: {}}}, \
                 healthCheck: {{url: \"http://{target}/\", interval: 1s, timeout: 2s}}}}\n",
                proxy.port()
            ));
        }
        let aside = dir.join(format!(".{prefix}-{file}.tmp"));
        std::fs::write(&aside, yaml).unwrap();
        std::fs::rename(&aside, dir.join(format!("{prefix}-{file}.yaml"))).unwrap();
    }
}

/// How many proxies the API lists as healthy (asked from its own address).
async fn healthy(api: SocketAddr) -> usize {
    let Ok(stream) = TcpStream::connect(api).await else {
        return 0;
    };
    drop(stream);
    let mut conn = Conn::open_from(IpAddr::V4(Ipv4Addr::new(127, 0, 1, 1)), api).await;
    let (status, body) = conn.call("GET", "/v1/proxies?healthy=true", "").await;
    if status != 200 {
        return 0;
    }
    body.matches("\"name\":").count()
}

/// One answered request: when it was sent (since the start) and how long it took.
type Sample = (Duration, Duration);

async fn client(
    n: usize,
    api: SocketAddr,
    interval: Duration,
    start: Instant,
    stop: Arc<AtomicBool>,
) -> (Vec<Sample>, u64) {
    let source = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2 + n as u8));
    let mut conn = Conn::open_from(source, api).await;
    let (mut samples, mut errors) = (Vec::new(), 0u64);
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut i = 0u64;
    while !stop.load(Ordering::Relaxed) {
        ticker.tick().await;
        i += 1;
        let ask = format!(r#"{{"target":"site-{n}-{i}.example","ttlSeconds":60}}"#);
        let sent = Instant::now();
        let (status, body) = conn.call("POST", "/v1/leases", &ask).await;
        samples.push((sent - start, sent.elapsed()));
        match status {
            201 => {
                ticker.tick().await;
                let sent = Instant::now();
                let (status, _) = conn
                    .call("DELETE", &format!("/v1/leases/{}", lease_id(&body)), "")
                    .await;
                samples.push((sent - start, sent.elapsed()));
                errors += u64::from(status != 204);
            }
            503 => {} // no capacity: an answer
            _ => errors += 1,
        }
    }
    (samples, errors)
}

fn row(name: &str, samples: &[Sample], from: Duration, to: Duration) {
    let mut window: Vec<Duration> = samples
        .iter()
        .filter(|(at, _)| *at >= from && *at < to)
        .map(|(_, took)| *took)
        .collect();
    window.sort();
    println!(
        "| {name} | {:.1} | {} | {:.3} | {:.3} | {:.3} |",
        (to - from).as_secs_f64(),
        window.len(),
        pct(&window, 0.50),
        pct(&window, 0.99),
        window.last().map_or(0.0, |d| d.as_secs_f64() * 1000.0),
    );
}

fn main() {
    let burst: usize = arg("--burst").map(|s| s.parse().unwrap()).unwrap_or(1000);
    let seed: usize = arg("--seed").map(|s| s.parse().unwrap()).unwrap_or(100);
    let clients: usize = arg("--clients").map(|s| s.parse().unwrap()).unwrap_or(16);
    let rate: f64 = arg("--rate").map(|s| s.parse().unwrap()).unwrap_or(2000.0);
    let after: u64 = arg("--after").map(|s| s.parse().unwrap()).unwrap_or(5);
    assert!((1..=200).contains(&clients), "--clients 1..=200");
    let dir = tempfile::tempdir().unwrap();
    let (api, proxy) = (free_addr(), free_addr());
    let manifests = dir.path().join("proxies");
    std::fs::create_dir(&manifests).unwrap();
    std::fs::write(
        dir.path().join("providers.yaml"),
        "providers:\n  - {name: local, type: local, local: {implementation: builtin, destinations: {allow: [127.0.0.0/8]}}}\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("standalone.yaml"),
        format!(
            "providersConfig: providers.yaml\nmanifests: proxies\nstateDir: state\n\
             healthProbeBindAddress: \"0\"\nmetricsBindAddress: \"0\"\ndiscoveryBindAddress: {api}\n\
             manifestPollInterval: 1s\nleaseCooldown: 1s\nmaxLeasesPerProxy: 1\n"
        ),
    )
    .unwrap();
    let _forward = Kill(
        Command::new(BIN)
            .args(["forward-proxy", "--listen", &proxy.to_string(), "--instance-dir"])
            .arg(dir.path().join("forward"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let runtime = common::load_generator_runtime();
    runtime.block_on(async {
        let target = target().await;
        write_manifests(&manifests, "seed", seed, proxy, target);
        let log = std::fs::File::create(dir.path().join("operator.log")).unwrap();
        let _operator = Kill(
            Command::new(BIN)
                .args(["standalone", "--log-format", "text", "--config"])
                .arg(dir.path().join("standalone.yaml"))
                .stdin(Stdio::null())
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .spawn()
                .unwrap(),
        );
        let deadline = Instant::now() + Duration::from_secs(60);
        while healthy(api).await < seed {
            assert!(Instant::now() < deadline, "the seed proxies never became healthy");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }

        let start = Instant::now();
        let stop = Arc::new(AtomicBool::new(false));
        let interval = Duration::from_secs_f64(clients as f64 / rate);
        let load: Vec<_> = (0..clients)
            .map(|n| tokio::spawn(client(n, api, interval, start, stop.clone())))
            .collect();
        tokio::time::sleep(Duration::from_secs(after)).await;
        let burst_at = start.elapsed();
        write_manifests(&manifests, "burst", burst, proxy, target);
        let deadline = Instant::now() + Duration::from_secs(120);
        while healthy(api).await < seed + burst {
            assert!(Instant::now() < deadline, "the burst never became healthy");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let all_healthy = start.elapsed();
        tokio::time::sleep(Duration::from_secs(after)).await;
        stop.store(true, Ordering::Relaxed);
        let end = start.elapsed();
        let (mut samples, mut errors) = (Vec::new(), 0);
        for task in load {
            let (s, e) = task.await.unwrap();
            samples.extend(s);
            errors += e;
        }
        println!(
            "seed={seed} burst={burst} clients={clients} offered={rate:.0} req/s cores={}",
            std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0)
        );
        println!(
            "burst declared at {:.1}s; all {} proxies healthy {:.2}s later; errors={errors}",
            burst_at.as_secs_f64(),
            seed + burst,
            (all_healthy - burst_at).as_secs_f64()
        );
        println!("| window | seconds | requests | p50 ms | p99 ms | max ms |");
        println!("|---|---:|---:|---:|---:|---:|");
        row("before the burst", &samples, Duration::ZERO, burst_at);
        row("during the burst", &samples, burst_at, all_healthy);
        row("after", &samples, all_healthy, end);
    });
}
