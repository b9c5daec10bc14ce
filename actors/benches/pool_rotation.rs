//! A ProxyPool of `--replicas` local proxies (each a process of the built-in
//! forward proxy, probed every second through itself against an HTTP target
//! on loopback), brought up from nothing and then rotated in full by a
//! template change, while crawlers keep leasing from the pool and fetching
//! a page through every leased proxy. The real operator binary, standalone.
//!
//!   cargo bench -p egress-proxies-operator --bench pool_rotation -- [--replicas 1000] [--surge 100] [--crawlers 16]
//!
//! Reported: the time from the pool's manifest to every member Ready and
//! healthy; the time from the template change to every member replaced
//! (all listed proxies carry the new template, healthy, and no old one is
//! left); the crawlers' fetches during the rotation — failed ones (the goal
//! is none) and acquires refused for want of a free member; the operator's
//! peak RSS. All traffic stays on loopback.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

mod common;
use common::{Kill, arg, free_addr, target};

const BIN: &str = env!("CARGO_BIN_EXE_egress-proxies-operator");
const LIMIT: Duration = Duration::from_secs(1800);

fn pool_manifest(replicas: usize, surge: usize, target: SocketAddr, generation: &str) -> String {
    format!(
        "apiVersion: crawl.example.com/v1alpha1\nkind: ProxyPool\nmetadata: {{name: bench, namespace: bench}}\n\
         spec:\n  replicas: {replicas}\n  maxSurge: {surge}\n  maxUnavailable: 0\n  drainTimeout: 30s\n  \
         template:\n    spec:\n      mode: Managed\n      provider: local\n      attributes: {{generation: {generation}}}\n      \
         healthCheck: {{url: \"http://{target}/\", interval: 1s, timeout: 5s}}\n"
    )
}

/// Written aside and renamed into place: the operator never reads half a file.
fn write_pool(dir: &Path, yaml: &str) {
    let aside = dir.join(".pool.tmp");
    std::fs::write(&aside, yaml).unwrap();
    std::fs::rename(&aside, dir.join("pool.yaml")).unwrap();
}

/// The pool's members as the API lists them: (all, healthy ones of `generation`).
async fn members(client: &reqwest::Client, api: SocketAddr, generation: &str) -> (usize, usize) {
    let Ok(response) = client.get(format!("http://{api}/v1/proxies")).send().await else {
        return (0, 0);
    };
    let Ok(listed) = response.json::<Vec<serde_json::Value>>().await else {
        return (0, 0);
    };
    let ours: Vec<&serde_json::Value> = listed
        .iter()
        .filter(|p| p["name"].as_str().is_some_and(|n| n.starts_with("bench-")))
        .collect();
    let current = ours
        .iter()
        .filter(|p| p["attributes"]["generation"] == generation && p["healthy"] == true)
        .count();
    (ours.len(), current)
}

/// Waits until the pool lists exactly `replicas` members, all healthy and
/// of `generation`; the time it took.
async fn settled(api: SocketAddr, replicas: usize, generation: &str, operator: &mut Kill) -> Duration {
    let client = reqwest::Client::new();
    let start = Instant::now();
    loop {
        assert!(operator.0.try_wait().unwrap().is_none(), "the operator exited");
        let (all, current) = members(&client, api, generation).await;
        if all == replicas && current == replicas {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < LIMIT,
            "not settled: {all} members, {current} healthy of generation {generation}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[derive(Default)]
struct Counts {
    fetched: AtomicU64,
    failed: AtomicU64,
    refused: AtomicU64,
}

/// A crawler: acquire from the pool (a new target each time), fetch a page
/// through the leased proxy, release; until `stop`.
async fn crawler(n: usize, api: SocketAddr, page: String, counts: Arc<Counts>, stop: Arc<AtomicBool>) {
    let client = reqwest::Client::new();
    let mut i = 0u64;
    while !stop.load(Ordering::Relaxed) {
        i += 1;
        let ask =
            serde_json::json!({"target": format!("site-{n}-{i}.example"), "pool": "bench", "ttlSeconds": 60});
        let response = client
            .post(format!("http://{api}/v1/leases"))
            .json(&ask)
            .send()
            .await
            .unwrap();
        if response.status() == 503 {
            counts.refused.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        }
        let grant: serde_json::Value = response.error_for_status().unwrap().json().await.unwrap();
        let via = reqwest::Client::builder()
            .proxy(reqwest::Proxy::http(grant["proxy"]["url"].as_str().unwrap()).unwrap())
            .timeout(Duration::from_secs(10))
            .build()
            .unwrap();
        match via.get(&page).send().await.and_then(|r| r.error_for_status()) {
            Ok(_) => counts.fetched.fetch_add(1, Ordering::Relaxed),
            Err(e) => {
                eprintln!("fetch through {} failed: {e}", grant["proxy"]["name"]);
                counts.failed.fetch_add(1, Ordering::Relaxed)
            }
        };
        let id = grant["id"].as_str().unwrap();
        client
            .delete(format!("http://{api}/v1/leases/{id}"))
            .send()
            .await
            .unwrap();
    }
}

/// Peak resident memory of `pid` so far (VmHWM), in MiB.
fn peak_rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .map_or(0.0, |kib| kib / 1024.0)
}

/// Kills, when dropped, every local proxy process the operator left under
/// its state directory (it leaves them running by design).
struct ReapLocalProxies(std::path::PathBuf);

impl Drop for ReapLocalProxies {
    fn drop(&mut self) {
        reap_local_proxies(&self.0);
    }
}

fn reap_local_proxies(state: &Path) {
    let Ok(instances) = std::fs::read_dir(state.join("local/local/instances")) else {
        return;
    };
    for instance in instances.flatten() {
        let Ok(record) = std::fs::read_to_string(instance.path().join("process.json")) else {
            continue;
        };
        let Ok(identity) = serde_json::from_str::<serde_json::Value>(&record) else {
            continue;
        };
        if let Some(pid) = identity["pid"].as_i64().and_then(|p| i32::try_from(p).ok()) {
            // The process group of the proxy: it and anything it started.
            let _ =
                nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
        }
    }
}

fn main() {
    egress_proxies::tls::ensure_crypto_provider();
    let replicas: usize = arg("--replicas").map(|s| s.parse().unwrap()).unwrap_or(1000);
    let surge: usize = arg("--surge").map(|s| s.parse().unwrap()).unwrap_or(100);
    let crawlers: usize = arg("--crawlers").map(|s| s.parse().unwrap()).unwrap_or(16);
    let dir = tempfile::tempdir().unwrap();
    let api = free_addr();
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
             manifestPollInterval: 1s\nleaseCooldown: 1s\nmaxLeasesPerProxy: 1\nhealthWorkers: 256\n"
        ),
    )
    .unwrap();
    // Dropped last: after the operator is killed, its proxies go too.
    let _reap = ReapLocalProxies(dir.path().join("state"));
    let runtime = common::load_generator_runtime();
    runtime.block_on(async {
        let target = target().await;
        let log = std::fs::File::create(dir.path().join("operator.log")).unwrap();
        let mut operator = Kill(
            Command::new(BIN)
                .args(["standalone", "--log-format", "text", "--log-level", "warn", "--config"])
                .arg(dir.path().join("standalone.yaml"))
                .stdin(Stdio::null())
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .spawn()
                .unwrap(),
        );
        let pid = operator.0.id();
        // The API first: the time below is the pool's, not the start's.
        let probe = reqwest::Client::new();
        while probe.get(format!("http://{api}/v1/proxies")).send().await.is_err() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        write_pool(&manifests, &pool_manifest(replicas, surge, target, "a"));
        let up = settled(api, replicas, "a", &mut operator).await;
        println!("{replicas} members Ready and healthy: {:.1} s", up.as_secs_f64());

        let counts = Arc::new(Counts::default());
        let stop = Arc::new(AtomicBool::new(false));
        let page = format!("http://{target}/page");
        let tasks: Vec<_> = (0..crawlers)
            .map(|n| tokio::spawn(crawler(n, api, page.clone(), counts.clone(), stop.clone())))
            .collect();
        tokio::time::sleep(Duration::from_secs(3)).await;
        let before = counts.fetched.load(Ordering::Relaxed);
        write_pool(&manifests, &pool_manifest(replicas, surge, target, "b"));
        let rotated = settled(api, replicas, "b", &mut operator).await;
        let during = counts.fetched.load(Ordering::Relaxed) - before;
        stop.store(true, Ordering::Relaxed);
        for task in tasks {
            task.await.unwrap();
        }
        println!(
            "full rotation of {replicas} (maxSurge {surge}): {:.1} s; fetches during it {during}, failed {}, refused acquires {}",
            rotated.as_secs_f64(),
            counts.failed.load(Ordering::Relaxed),
            counts.refused.load(Ordering::Relaxed),
        );
        println!("operator peak RSS: {:.0} MiB", peak_rss_mib(pid));
    });
}
