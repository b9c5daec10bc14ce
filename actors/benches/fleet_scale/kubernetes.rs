//! `--kubernetes`: the same fleet in Kubernetes mode, against the project's
//! fake API server run as a process of its own (`fake-apiserver
//! --cluster`: custom kinds are served only once their CRD exists, objects
//! only in namespaces that exist).
//!
//! The bench creates the namespace `fleet`, applies both CRDs (as
//! `egress-proxies-operator crd` prints them) and creates the `--proxies`
//! External Proxies itself, 32 POSTs at a time, all before the operator
//! starts; then one replica runs `run --leader-elect` against the fake.
//! Its requests are the fake's counts (`GET /debug/requests`) after the
//! Proxies exist, minus the requests the bench itself sent since (its
//! LISTs of Proxies and its reads of the leader Lease), which it counts as
//! it sends them. Whether the operator waited out each `429`'s
//! `Retry-After` the fake checks itself (`retryAfter` in the same
//! answer): the run's last figure, and an early retry fails it.
//! `--failover`: the `failover` module.
//!
//! The fake runs as a process of its own ([`crate::common::fake`]).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fake_apiserver::{RequestCounts, RequestKey, RetryAfterReport};
use futures::StreamExt;
use serde_json::{Value, json};

use super::{BIN, metric, scrape, status_mib};
use crate::common::{Kill, arg, cpu_seconds, free_addr, target};

#[path = "failover.rs"]
mod failover;

const NAMESPACE: &str = "fleet";
const POD: &str = "fleet-operator-0";
const LEASE: &str = "egress-proxies-operator";
const GROUP: &str = "crawl.example.com";
const PROXIES: &str = "/apis/crawl.example.com/v1alpha1/namespaces/fleet/proxies";
const LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/fleet/leases";
/// What the operator logs when its leadership ends before a shutdown.
const LOST: [&str; 3] = [
    "stopped acting",
    "another candidate holds the leader Lease",
    "stepping down",
];

/// The fake's HTTP API as the bench uses it, counting what it sends.
#[derive(Clone)]
struct Fake {
    http: reqwest::Client,
    base: String,
    /// The bench's own requests since the last [`Fake::reset_own`].
    own: Arc<Mutex<RequestCounts>>,
}

impl Fake {
    async fn send(
        &self,
        verb: &str,
        group: &str,
        resource: &str,
        request: reqwest::RequestBuilder,
    ) -> (u16, reqwest::header::HeaderMap, Value) {
        let (code, headers, body) = match request.send().await {
            Ok(r) => {
                let (code, headers) = (r.status().as_u16(), r.headers().clone());
                (code, headers, r.json().await.unwrap_or(Value::Null))
            }
            Err(_) => (0, Default::default(), Value::Null),
        };
        if code != 0 {
            let key = RequestKey {
                verb: verb.to_owned(),
                group: group.to_owned(),
                resource: resource.to_owned(),
                code,
            };
            *self.own.lock().unwrap().0.entry(key).or_default() += 1;
        }
        (code, headers, body)
    }

    /// From now on `429` past `per_second` requests a second, bursts of
    /// `burst` (each priority level: the fake's `PUT /debug/rate`).
    async fn limit_rate(&self, per_second: f64, burst: u32) {
        let answer = self
            .http
            .put(format!("{}/debug/rate", self.base))
            .json(&json!({"perSecond": per_second, "burst": burst}))
            .send()
            .await
            .expect("the fake answers");
        assert_eq!(answer.status(), 200, "setting the fake's rate");
    }

    /// Creates, waiting out each `429`'s `Retry-After`.
    async fn create(&self, group: &str, resource: &str, path: &str, body: &Value) {
        loop {
            let request = self.http.post(format!("{}{path}", self.base)).json(body);
            let (code, headers, answer) = self.send("create", group, resource, request).await;
            match code {
                201 => return,
                429 => {
                    let wait = headers
                        .get("retry-after")
                        .and_then(|v| v.to_str().ok()?.parse().ok())
                        .unwrap_or(1);
                    tokio::time::sleep(Duration::from_secs(wait)).await;
                }
                _ => panic!("creating {path}: {code} {answer}"),
            }
        }
    }

    /// Proxies by status phase (`None`: no phase yet), from one LIST; `None` if refused.
    async fn phases(&self) -> Option<Vec<(String, usize)>> {
        let request = self.http.get(format!("{}{PROXIES}", self.base));
        let (code, _, list) = self.send("list", GROUP, "proxies", request).await;
        if code != 200 {
            return None;
        }
        let mut phases: Vec<(String, usize)> = Vec::new();
        for item in list["items"].as_array().map_or(&[][..], Vec::as_slice) {
            let phase = item["status"]["phase"].as_str().unwrap_or("none");
            match phases.iter_mut().find(|(p, _)| p == phase) {
                Some((_, n)) => *n += 1,
                None => phases.push((phase.to_owned(), 1)),
            }
        }
        phases.sort();
        Some(phases)
    }

    /// The leader Lease's holder and transitions.
    async fn lease(&self) -> Option<(String, u64)> {
        let request = self.http.get(format!("{}{LEASES}/{LEASE}", self.base));
        let (code, _, lease) = self.send("get", "coordination.k8s.io", "leases", request).await;
        (code == 200).then(|| {
            (
                lease["spec"]["holderIdentity"].as_str().unwrap_or("").to_owned(),
                lease["spec"]["leaseTransitions"].as_u64().unwrap_or(0),
            )
        })
    }

    /// The fake's check of the operator's retries after `429`s.
    async fn retry_after(&self) -> Option<RetryAfterReport> {
        let answer = self
            .http
            .get(format!("{}/debug/requests", self.base))
            .send()
            .await
            .ok()?;
        RetryAfterReport::from_json(&answer.json::<Value>().await.ok()?["retryAfter"])
    }

    /// Every request the fake served so far (this read is not counted).
    async fn counts(&self) -> RequestCounts {
        let answer = self
            .http
            .get(format!("{}/debug/requests", self.base))
            .send()
            .await;
        match answer {
            Ok(r) => RequestCounts::from_json(&r.json().await.unwrap_or(Value::Null)).unwrap_or_default(),
            Err(_) => RequestCounts::default(),
        }
    }

    fn take_own(&self) -> RequestCounts {
        std::mem::take(&mut *self.own.lock().unwrap())
    }
}

/// `after - before - own`, key by key.
fn minus(after: &RequestCounts, before: &RequestCounts, own: &RequestCounts) -> RequestCounts {
    let mut out = RequestCounts::default();
    for (key, n) in &after.0 {
        let taken = before.0.get(key).copied().unwrap_or(0) + own.0.get(key).copied().unwrap_or(0);
        if *n > taken {
            out.0.insert(key.clone(), n - taken);
        }
    }
    out
}

/// Counts by verb, resource and code, largest first.
fn table(counts: &RequestCounts, per: f64, unit: &str) -> String {
    let mut rows: Vec<(&RequestKey, &u64)> = counts.0.iter().collect();
    rows.sort_by(|a, b| b.1.cmp(a.1));
    rows.iter()
        .map(|(k, n)| {
            let resource = if k.resource.is_empty() {
                "(discovery)"
            } else {
                &k.resource
            };
            format!(
                "    {:>8}  {:>9.2} {unit}  {} {} {}",
                n,
                **n as f64 / per,
                k.verb,
                resource,
                k.code
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The CRD of `kind` as the operator prints it, as JSON.
fn crd(kind: &str) -> Value {
    let output = Command::new(BIN).args(["crd", kind]).output().unwrap();
    assert!(output.status.success(), "egress-proxies-operator crd {kind}");
    serde_saphyr::from_str(&String::from_utf8_lossy(&output.stdout)).unwrap()
}

fn proxy(i: usize, proxy_port: u16, target: SocketAddr) -> Value {
    json!({
        "apiVersion": "crawl.example.com/v1alpha1", "kind": "Proxy",
        "metadata": {"name": format!("p{i:05}"), "namespace": NAMESPACE},
        "spec": {"mode": "External", "endpoint": {"host": "127.0.0.1", "port": proxy_port},
                 "healthCheck": {"url": format!("http://{target}/"), "interval": "1s", "timeout": "5s"}}
    })
}

struct Operator {
    process: Kill,
    /// Its `POD_NAME`: its identity in the leader Lease.
    pod: String,
    log: PathBuf,
    health: SocketAddr,
    metrics: SocketAddr,
    /// Its discovery (lease) API, when served.
    discovery: Option<SocketAddr>,
}

impl Operator {
    /// A replica named `pod` with a state directory and log of its own;
    /// with `discovery`, its lease API there, open without a token (the
    /// operator refuses to serve it without one unless told so).
    fn start(dir: &Path, pod: &str, discovery: Option<SocketAddr>) -> Self {
        let (health, metrics) = (free_addr(), free_addr());
        let log = dir.join(format!("{pod}.log"));
        let out = std::fs::File::create(&log).unwrap();
        std::fs::write(dir.join("providers.yaml"), "providers: []\n").unwrap();
        let mut command = Command::new(BIN);
        command
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
            .arg("--leader-elect")
            // The figures below are of the leader serving alone; every
            // replica serving is measured by the replicas bench.
            .arg("--every-replica-serves=false");
        match discovery {
            Some(addr) => command
                .args(["--discovery-bind-address", &addr.to_string()])
                .arg("--insecure-discovery-without-token"),
            None => command.args(["--discovery-bind-address", "0"]),
        };
        let process = command
            // The fleet's one forward proxy is on loopback.
            .args(["--allow-external-endpoint-networks", "127.0.0.0/8"])
            .args(["--log-format", "text", "--log-level", "warn"])
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("KUBECONFIG", dir.join("kubeconfig"))
            .env("POD_NAME", pod)
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap();
        Self {
            process: Kill(process),
            pod: pod.to_owned(),
            log,
            health,
            metrics,
            discovery,
        }
    }

    fn pid(&self) -> u32 {
        self.process.0.id()
    }

    /// Why its leadership ended, if it did: its exit or its log's word.
    fn lost(&mut self) -> Option<String> {
        let logs = std::fs::read_to_string(&self.log).unwrap_or_default();
        let said = logs
            .lines()
            .find(|l| LOST.iter().any(|w| l.contains(w)))
            .map(plain);
        match (self.process.0.try_wait().ok().flatten(), said) {
            (Some(status), Some(line)) => Some(format!("exited ({status}); log: {line}")),
            (Some(status), None) => Some(format!("exited ({status})")),
            (None, Some(line)) => Some(format!("log: {line}")),
            (None, None) => None,
        }
    }

    /// Failed renewals it logged.
    fn failed_renewals(&self) -> usize {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .matches("renewing the leader Lease failed")
            .count()
    }

    /// Its own count of its API requests (`kube_api_requests_total`, one
    /// per try), as [`RequestCounts`] without groups; empty if unreachable.
    async fn api_requests(&self, http: &reqwest::Client) -> RequestCounts {
        let mut counts = RequestCounts::default();
        let text = scrape(http, self.metrics).await;
        for line in text.lines() {
            let Some(rest) = line.strip_prefix("egress_proxies_kube_api_requests_total{") else {
                continue;
            };
            let Some((labels, value)) = rest.split_once("} ") else {
                continue;
            };
            let label = |name: &str| {
                labels
                    .split(',')
                    .find_map(|l| l.strip_prefix(name)?.strip_prefix("=\"")?.strip_suffix('"'))
                    .unwrap_or_default()
                    .to_owned()
            };
            let key = RequestKey {
                verb: label("verb"),
                group: String::new(),
                resource: label("resource"),
                // `error` (no answer) as 0.
                code: label("code").parse().unwrap_or(0),
            };
            *counts.0.entry(key).or_default() += value.parse::<f64>().unwrap_or(0.0) as u64;
        }
        counts
    }

    /// Its `leader` gauge: 1 from the moment its Lease write won.
    async fn won(&self, http: &reqwest::Client) -> bool {
        metric(&scrape(http, self.metrics).await, "egress_proxies_leader") == Some(1.0)
    }

    async fn leading(&self, http: &reqwest::Client) -> bool {
        let answer = http
            .get(format!("http://{}/readyz", self.health))
            .timeout(Duration::from_secs(1))
            .send()
            .await;
        answer.is_ok_and(|r| r.status() == 200)
    }
}

/// A log line without its colours.
fn plain(line: &str) -> String {
    let mut out = String::new();
    let mut rest = line;
    while let Some((before, after)) = rest.split_once("\x1b[") {
        out.push_str(before);
        rest = after.split_once('m').map_or("", |(_, r)| r);
    }
    out.push_str(rest);
    out
}

fn phase_line(phases: &[(String, usize)]) -> String {
    phases
        .iter()
        .map(|(p, n)| format!("{p} {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn ready(phases: &[(String, usize)]) -> usize {
    phases.iter().find(|(p, _)| p == "Ready").map_or(0, |(_, n)| *n)
}

/// The whole Kubernetes-mode run; success only if every Proxy became
/// Ready in the fake, the leader kept its Lease throughout, every
/// `--failover` handover granted a lease and left the fleet Ready, and no
/// request of the operator's came back before its `429`'s `Retry-After`.
pub fn run(proxies: usize, steady: u64) -> ExitCode {
    let deadline = Duration::from_secs(arg("--deadline").map_or(300, |s| s.parse().unwrap()));
    // A second's budget at once unless told otherwise: Priority and
    // Fairness queues a request before it refuses it, so a client merely
    // sending two requests back to back is not refused; a bucket of one
    // would refuse it, and its whole-second Retry-After would cap such a
    // client at a request a second.
    let rate = arg("--api-rate").map(|r| {
        let per_second: f64 = r.parse().expect("--api-rate: requests a second");
        let burst = arg("--api-burst").map_or(per_second.ceil() as u32, |b| {
            b.parse().expect("--api-burst: a whole number")
        });
        (per_second, burst)
    });
    let timeline = std::env::args().any(|a| a == "--timeline");
    let failover = failover::Leave::from_args();
    let runtime = crate::common::load_generator_runtime();
    runtime.block_on(async {
        let scenario = scenario(proxies, steady, deadline, rate, timeline, failover.as_deref());
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).unwrap();
        // Interrupted, the scenario is dropped: every child with it.
        tokio::select! {
            code = scenario => code,
            _ = tokio::signal::ctrl_c() => { println!("interrupted"); ExitCode::from(130) }
            _ = term.recv() => { println!("terminated"); ExitCode::from(143) }
        }
    })
}

async fn scenario(
    proxies: usize,
    steady: u64,
    deadline: Duration,
    rate: Option<(f64, u32)>,
    timeline: bool,
    failover: Option<&[failover::Leave]>,
) -> ExitCode {
    let dir = tempfile::tempdir().unwrap();
    let (mut fake_process, server) = crate::common::fake::start(dir.path(), NAMESPACE, 0).await;
    let fake_pid = fake_process.0.id();
    let fake = Fake {
        http: reqwest::Client::new(),
        base: server.clone(),
        own: Arc::default(),
    };
    println!("Kubernetes mode: fake-apiserver (pid {fake_pid}) at {server}");

    // The cluster as an install leaves it, and the fleet, before the operator.
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
    fake.create(
        "",
        "namespaces",
        "/api/v1/namespaces",
        &json!({"metadata": {"name": NAMESPACE}}),
    )
    .await;
    for kind in ["proxies", "proxypools"] {
        let path = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions";
        fake.create(
            "apiextensions.k8s.io",
            "customresourcedefinitions",
            path,
            &crd(kind),
        )
        .await;
    }
    let created = Instant::now();
    futures::stream::iter(0..proxies)
        .map(|i| {
            let (fake, body) = (fake.clone(), proxy(i, proxy_port, target));
            async move { fake.create(GROUP, "proxies", PROXIES, &body).await }
        })
        .buffer_unordered(32)
        .collect::<Vec<()>>()
        .await;
    let setup = fake.take_own();
    println!(
        "created {proxies} Proxies in {:.1} s (the bench's own {} requests, before the operator starts)",
        created.elapsed().as_secs_f64(),
        setup.total()
    );
    // The fleet was there before: a user's `kubectl apply` is a flow of its
    // own under Priority and Fairness, and long done when the operator starts.
    if let Some((per_second, burst)) = rate {
        fake.limit_rate(per_second, burst).await;
        println!("the fake answers 429 past {per_second} requests/s (bursts of {burst}) from now on");
    }

    // One replica with leader election, from no Lease.
    let before = fake.counts().await;
    let began = Instant::now();
    let fake_cpu0 = cpu_seconds(fake_pid);
    let mut operator = Operator::start(dir.path(), POD, None);
    let pid = operator.pid();
    let http = reqwest::Client::new();
    let (mut peak, mut leading_at, mut healthy_at, mut lost) = (0.0f64, None, None, None);
    let mut phases: Vec<(String, usize)> = Vec::new();
    let mut listed = Instant::now();
    let mut first_list = true;
    let every = if timeline {
        Duration::from_secs(1)
    } else {
        Duration::from_secs(5)
    };
    while healthy_at.is_none() {
        peak = peak.max(status_mib(pid, "VmHWM"));
        if let Some(why) = operator.lost() {
            lost = Some((began.elapsed(), why));
            break;
        }
        if leading_at.is_none() && operator.leading(&http).await {
            leading_at = Some(began.elapsed());
        }
        let gauge = metric(
            &scrape(&http, operator.metrics).await,
            "egress_proxies_proxies{phase=\"Ready\"}",
        )
        .unwrap_or(0.0) as usize;
        // The fake's LIST is the verdict; the operator's own gauge says
        // when to ask, so that 10,000 objects are not listed four times a second.
        if gauge >= proxies || first_list || listed.elapsed() >= every {
            first_list = false;
            listed = Instant::now();
            if let Some(now) = fake.phases().await {
                phases = now;
            }
            let so_far = minus(&fake.counts().await, &before, &fake.own.lock().unwrap());
            println!(
                "  {:6.1} s  {}  rss {:6.1} MiB  operator requests {:>7}  fake cpu {:5.1} s  {}",
                began.elapsed().as_secs_f64(),
                if leading_at.is_some() {
                    "leading"
                } else {
                    "waiting"
                },
                status_mib(pid, "VmRSS"),
                so_far.total(),
                cpu_seconds(fake_pid) - fake_cpu0,
                phase_line(&phases)
            );
            if ready(&phases) == proxies {
                healthy_at = Some(began.elapsed());
            }
        }
        if began.elapsed() >= deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    if healthy_at.is_none()
        && let Some(now) = fake.phases().await
    {
        // Where the start stands now, not at the last look.
        phases = now;
    }
    let start_counts = minus(&fake.counts().await, &before, &fake.own.lock().unwrap());
    let start_window = began.elapsed();
    let start_own = fake.take_own();
    let fake_cpu = cpu_seconds(fake_pid) - fake_cpu0;

    println!();
    match (healthy_at, &lost) {
        (Some(t), _) => println!(
            "{proxies} Proxies: start → all Ready in the fake {:.1} s",
            t.as_secs_f64()
        ),
        (None, Some((t, why))) => println!(
            "{proxies} Proxies: NOT all Ready — the leader's leadership ended after {:.1} s ({why}); {} Ready in the fake at the end ({})",
            t.as_secs_f64(),
            ready(&phases),
            phase_line(&phases)
        ),
        (None, None) => println!(
            "{proxies} Proxies: NOT all Ready within the {} s deadline; at the end: {}",
            deadline.as_secs(),
            phase_line(&phases)
        ),
    }
    if let Some(t) = leading_at {
        println!("leading (/readyz 200) after {:.2} s", t.as_secs_f64());
    }
    let total = start_counts.total();
    println!(
        "operator API requests during the start ({:.1} s): {total}, {:.2} per Proxy, {:.0}/s; \
         the bench's own meanwhile: {} (not counted); the fake used {fake_cpu:.1} s of CPU",
        start_window.as_secs_f64(),
        total as f64 / proxies as f64,
        total as f64 / start_window.as_secs_f64(),
        start_own.total(),
    );
    println!("{}", table(&start_counts, proxies as f64, "per Proxy"));

    let mut steady_figures = None;
    if healthy_at.is_some() {
        tokio::time::sleep(Duration::from_secs(5)).await;
        let s0 = fake.counts().await;
        fake.take_own();
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(steady) && lost.is_none() {
            peak = peak.max(status_mib(pid, "VmHWM"));
            if let Some(why) = operator.lost() {
                lost = Some((began.elapsed(), why));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        let window = t0.elapsed().as_secs_f64();
        let counts = minus(&fake.counts().await, &s0, &fake.take_own());
        steady_figures = Some((window, counts));
    }
    if let Some((window, counts)) = &steady_figures {
        let (lease, rest): (Vec<_>, Vec<_>) = counts.0.iter().partition(|(k, _)| k.resource == "leases");
        let sum = |v: &[(&RequestKey, &u64)]| v.iter().map(|(_, n)| **n).sum::<u64>() as f64 / window;
        println!(
            "steady {window:.0} s: {:.2} requests/s besides the leader Lease ({:.2}/s on Leases); RSS {:.1} MiB",
            sum(&rest),
            sum(&lease),
            status_mib(pid, "VmRSS"),
        );
        println!("{}", table(counts, *window, "/s"));
    }

    peak = peak.max(status_mib(pid, "VmHWM"));
    let holder = fake.lease().await;
    let renewals = operator.failed_renewals();
    match &lost {
        Some((t, why)) => println!(
            "leader Lease: LOST after {:.1} s ({why}); {renewals} failed renewals logged; Lease now {holder:?}",
            t.as_secs_f64()
        ),
        None => println!(
            "leader Lease: kept throughout ({renewals} failed renewals logged); holder and transitions {holder:?}"
        ),
    }
    println!(
        "operator peak RSS {peak:.1} MiB; fake-apiserver peak RSS {:.1} MiB",
        status_mib(fake_pid, "VmHWM")
    );
    let mut ok = healthy_at.is_some() && lost.is_none();
    match failover {
        Some(leaves) if ok => {
            ok = failover::run(&fake, dir.path(), operator, leaves, proxies, deadline).await;
        }
        _ => drop(operator),
    }
    let honoured = retry_after(&fake).await;
    println!("(logs: {} — removed at the end)", dir.path().display());
    let _ = fake_process.0.kill();
    if ok && honoured {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// Prints the `429`s the fake answered the operator's replicas over the
/// whole run and the requests they sent again before the `Retry-After`
/// was over (the fake's check, `retryAfter` in `/debug/requests`); true if
/// there were none.
async fn retry_after(fake: &Fake) -> bool {
    let Some(report) = fake.retry_after().await else {
        println!("429s: the fake's report could not be read");
        return false;
    };
    println!(
        "429 + Retry-After answered to the operator: {}; sent again before the Retry-After was over: {}, after it: {}{}",
        report.refused,
        report.early,
        report.on_time,
        if report.in_flight > 0 {
            format!(
                " (and {} repeats within {} ms on another connection: possibly in flight before the 429 was read, not counted)",
                report.in_flight,
                fake_apiserver::IN_FLIGHT.as_millis()
            )
        } else {
            String::new()
        }
    );
    for early in &report.examples {
        println!(
            "    early: {} — {} ms after a 429 with Retry-After {} s",
            early.request,
            early.after.as_millis(),
            early.retry_after
        );
    }
    report.early == 0
}
