//! A fleet of `--proxies` External proxies, all in front of one built-in
//! forward proxy (its own process) and probed every second over plain HTTP
//! against a loopback target: the real operator binary, standalone, from a
//! manifest directory to all healthy, then probing steadily, then
//! restarted on its stored fleet.
//!
//!   cargo bench -p egress-proxies-operator --bench fleet_scale -- [--proxies 10000] [--per-file 10000] [--steady 20] [--timeline]
//!
//! Reported: start → every proxy healthy; the operator's peak RSS (VmHWM)
//! and its RSS after `--steady` seconds of probing; the CPU it used while
//! probing (cores, from /proc/<pid>/stat over the steady window) and per
//! probe; after a SIGTERM and a new start on the same state: the time to
//! the lease API's first answer and to its first granted lease. All
//! traffic stays on loopback. `--timeline` prints the phases, CPU and RSS
//! every half second until all are healthy. `EPO_BENCH_WRAPPER` runs the operator under a
//! profiler (the figures then include the profiler's own cost).
//!
//! `--kubernetes` runs the same fleet in Kubernetes mode instead (the
//! `kubernetes` module): the project's fake API server as a process of its
//! own (`fake-apiserver --cluster`, built by this bench unless
//! `EPO_FAKE_APISERVER` names it), the CRDs and the Proxies created by the
//! bench before one operator replica starts with `--leader-elect`.
//!
//!   cargo bench -p egress-proxies-operator --bench fleet_scale -- --kubernetes --proxies 1000 [--steady 20] [--deadline 300] [--api-rate 50 [--api-burst 50]] [--failover [kill|term|both]] [--timeline]
//!
//! Reported: start → every Proxy `Ready` in the fake (by a LIST), the time
//! to leadership, whether the leader ever lost its Lease (its log, its
//! exit, the Lease's holder), the operator's API requests during the start
//! by verb, resource and code (the fake's `/debug/requests`, less the
//! bench's own) and per Proxy, the steady request rate over `--steady`
//! seconds besides the leader Lease, and peak RSS. `--deadline` bounds the
//! start: a leader that loses its Lease or a start past it ends the run
//! with the figures so far (exit status 1). `--api-rate N` has the fake
//! answer `429` past N requests a second (`--api-burst`: at once); every
//! run ends with the fake's count of the `429`s it answered the operator
//! and of the requests sent again before their `Retry-After` (any fails
//! the run). `--failover` then has a standby replica take over from the
//! leader (SIGKILL, SIGTERM or both in turn: the `failover` module) and
//! reports the time from winning to its first granted lease and its
//! writes in its first minute.

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;
#[path = "fleet_scale/kubernetes.rs"]
mod kubernetes;
use common::{Kill, arg, cpu_seconds, free_addr, target};

const BIN: &str = env!("CARGO_BIN_EXE_egress-proxies-operator");
const LIMIT: Duration = Duration::from_secs(600);

fn proxy(i: usize, proxy_port: u16, target: SocketAddr) -> String {
    format!(
        "apiVersion: crawl.example.com/v1alpha1\nkind: Proxy\nmetadata: {{name: p{i:05}, namespace: fleet}}\n\
         spec: {{mode: External, endpoint: {{host: 127.0.0.1, port: {proxy_port}}}, \
         healthCheck: {{url: \"http://{target}/\", interval: 1s, timeout: 5s}}}}\n"
    )
}

/// `/proc/<pid>/status` field in MiB (`VmHWM`, `VmRSS`).
fn status_mib(pid: u32, field: &str) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| {
            v.trim_start_matches(':')
                .split_whitespace()
                .next()?
                .parse::<f64>()
                .ok()
        })
        .map_or(0.0, |kib| kib / 1024.0)
}

/// A metric's value in an OpenMetrics text.
fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

async fn scrape(client: &reqwest::Client, metrics: SocketAddr) -> String {
    match client.get(format!("http://{metrics}/metrics")).send().await {
        Ok(r) => r.text().await.unwrap_or_default(),
        Err(_) => String::new(),
    }
}

fn start(config: &std::path::Path, log: &std::path::Path) -> Kill {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap();
    // A profiler in front (`EPO_BENCH_WRAPPER="heaptrack -o /tmp/fleet"`,
    // `"perf record -g -o /tmp/fleet.perf"`): the wrapper execs the operator.
    let wrapper = std::env::var("EPO_BENCH_WRAPPER").unwrap_or_default();
    let mut words = wrapper.split_whitespace().map(str::to_owned).collect::<Vec<_>>();
    words.push(BIN.to_owned());
    Kill(
        Command::new(&words[0])
            .args(&words[1..])
            .args([
                "standalone",
                "--log-format",
                "text",
                "--log-level",
                "warn",
                "--config",
            ])
            .arg(config)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap(),
    )
}

fn main() -> std::process::ExitCode {
    egress_proxies::tls::ensure_crypto_provider();
    let proxies: usize = arg("--proxies").map(|s| s.parse().unwrap()).unwrap_or(10_000);
    let per_file: usize = arg("--per-file").map(|s| s.parse().unwrap()).unwrap_or(proxies);
    let steady: u64 = arg("--steady").map(|s| s.parse().unwrap()).unwrap_or(20);
    if std::env::args().any(|a| a == "--kubernetes") {
        return kubernetes::run(proxies, steady);
    }
    let dir = tempfile::tempdir().unwrap();
    let (api, metrics) = (free_addr(), free_addr());
    let manifests = dir.path().join("proxies");
    std::fs::create_dir(&manifests).unwrap();
    std::fs::write(dir.path().join("providers.yaml"), "providers: []\n").unwrap();
    let config = dir.path().join("standalone.yaml");
    std::fs::write(
        &config,
        format!(
            "providersConfig: providers.yaml\nmanifests: proxies\nstateDir: state\n\
             healthProbeBindAddress: \"0\"\nmetricsBindAddress: {metrics}\ndiscoveryBindAddress: {api}\n\
             manifestPollInterval: 1s\nmaxLeasesPerProxy: 1\n"
        ),
    )
    .unwrap();
    let log = dir.path().join("operator.log");
    let runtime = common::load_generator_runtime();
    runtime.block_on(async {
        let target = target().await;
        let proxy_port = free_addr().port();
        let _forward = Kill(
            Command::new(BIN)
                .args(["forward-proxy", "--listen", &format!("127.0.0.1:{proxy_port}")])
                .args(["--allow", "127.0.0.0/8", "--allow", "1-65535", "--instance-dir"])
                .arg(dir.path())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        );
        let all: Vec<String> = (0..proxies).map(|i| proxy(i, proxy_port, target)).collect();
        for (n, chunk) in all.chunks(per_file).enumerate() {
            std::fs::write(manifests.join(format!("fleet-{n:03}.yaml")), chunk.join("---\n")).unwrap();
        }
        let client = reqwest::Client::new();
        let began = Instant::now();
        let mut operator = start(&config, &log);
        let pid = operator.0.id();
        let timeline = std::env::args().any(|a| a == "--timeline");
        let mut next_line = Duration::ZERO;
        loop {
            assert!(
                operator.0.try_wait().unwrap().is_none(),
                "the operator exited:\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
            let text = scrape(&client, metrics).await;
            let ready = metric(&text, "egress_proxies_proxies{phase=\"Ready\"}").unwrap_or(0.0);
            if timeline && began.elapsed() >= next_line {
                next_line += Duration::from_millis(500);
                let phases: Vec<String> = text
                    .lines()
                    .filter_map(|l| l.strip_prefix("egress_proxies_proxies{phase=\""))
                    .filter(|l| !l.ends_with(" 0"))
                    .map(|l| l.replace("\"}", ""))
                    .collect();
                println!(
                    "  {:5.1} s  cpu {:5.2} s  rss {:5.1} MiB  {}",
                    began.elapsed().as_secs_f64(),
                    cpu_seconds(pid),
                    status_mib(pid, "VmRSS"),
                    phases.join(", ")
                );
            }
            if ready as usize == proxies {
                break;
            }
            assert!(began.elapsed() < LIMIT, "{ready} of {proxies} Ready");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let healthy = began.elapsed();
        println!("{proxies} proxies: start → all healthy {:.1} s", healthy.as_secs_f64());
        println!("peak RSS while starting: {:.1} MiB", status_mib(pid, "VmHWM"));

        // Steady probing: CPU and memory.
        tokio::time::sleep(Duration::from_secs(5)).await;
        let probes = |text: &str| metric(text, "egress_proxies_health_probes_total{result=\"ok\"}").unwrap_or(0.0);
        let (cpu0, probes0, t0) = (cpu_seconds(pid), probes(&scrape(&client, metrics).await), Instant::now());
        tokio::time::sleep(Duration::from_secs(steady)).await;
        let (cpu1, probes1, t1) = (cpu_seconds(pid), probes(&scrape(&client, metrics).await), Instant::now());
        let window = (t1 - t0).as_secs_f64();
        let cores = (cpu1 - cpu0) / window;
        let done = probes1 - probes0;
        println!(
            "steady {steady} s: {:.0} probes/s, {:.2} cores, {:.3} ms CPU per probe; RSS {:.1} MiB \
             (anonymous {:.1}, file {:.1}), peak {:.1} MiB",
            done / window,
            cores,
            (cpu1 - cpu0) * 1000.0 / done.max(1.0),
            status_mib(pid, "VmRSS"),
            status_mib(pid, "RssAnon"),
            status_mib(pid, "RssFile"),
            status_mib(pid, "VmHWM"),
        );

        // A restart on the stored fleet.
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
        let _ = operator.0.wait();
        let restarted = Instant::now();
        let operator = start(&config, &log);
        let (mut answered, mut granted) = (None, None);
        while granted.is_none() {
            let ask = client
                .post(format!("http://{api}/v1/leases"))
                .json(&serde_json::json!({"target": "restart.example", "ttlSeconds": 30}))
                .send()
                .await;
            if let Ok(response) = ask {
                answered.get_or_insert(restarted.elapsed());
                if response.status() == 201 {
                    granted = Some(restarted.elapsed());
                }
            }
            assert!(restarted.elapsed() < LIMIT, "no lease after the restart");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        println!(
            "restart with {proxies} stored: lease API answers after {:.2} s, first lease granted after {:.2} s",
            answered.unwrap_or_default().as_secs_f64(),
            granted.unwrap_or_default().as_secs_f64()
        );
        println!(
            "peak RSS after the restart: {:.1} MiB",
            status_mib(operator.0.id(), "VmHWM")
        );
    });
    std::process::ExitCode::SUCCESS
}
