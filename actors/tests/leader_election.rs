//! One leader at a time: operator processes with `--leader-elect
//! --lease-duration 3s` against the fake API server, under a partition and
//! with another replica's clock far off. Timings at 3 s: renew deadline
//! 2 s, retry period 0.4 s.

mod support;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fake_apiserver::FakeApiServer;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, DynamicObject, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::json;
use support::operator::{LOCAL_PROVIDER, OperatorBuilder, OperatorDir, OperatorProcess};

const LEASE_NAME: &str = "egress-proxies-operator";
const LEASE_DURATION: Duration = Duration::from_secs(3);
/// One sample's patience: a replica that does not answer in time did not act.
const SAMPLE_TIMEOUT: Duration = Duration::from_millis(300);

struct Bed {
    fake: FakeApiServer,
    dir: OperatorDir,
    client: kube::Client,
    target: String,
}

impl Bed {
    fn new() -> Self {
        let fake = FakeApiServer::start().unwrap();
        let client = kube::Client::try_from(kube::Config::new(fake.url().parse().unwrap())).unwrap();
        Self {
            fake,
            dir: OperatorDir::new(LOCAL_PROVIDER),
            client,
            target: support::process::health_target(),
        }
    }

    /// An operator process named `name` (its pod name and log) talking to
    /// the API server through `server` (the fake itself or one of its links).
    async fn start(&self, name: &str, server: &FakeApiServer) -> OperatorProcess {
        self.replica(name, server).start().await
    }

    fn replica(&self, name: &str, server: &FakeApiServer) -> OperatorBuilder {
        self.dir
            .kubernetes(&server.kubeconfig("crawl"))
            .name(name)
            .discovery()
            .args(["--leader-elect", "--lease-duration", "3s"])
            // Leadership as such: only the leader serves, so being ready
            // says who leads (every replica serving: replicas_*.rs).
            .arg("--every-replica-serves=false")
            .metrics()
            .arg("--metrics-secure=false")
            // This test is about leadership, not the API's tokens.
            .arg("--insecure-discovery-without-token")
            // Every grant succeeds while a proxy is available: no per-proxy cap.
            .args(["--max-leases-per-proxy", "0"])
            .env("POD_NAME", name)
    }

    fn logs(&self) -> String {
        self.dir.logs()
    }

    fn leases(&self) -> Api<Lease> {
        Api::namespaced(self.client.clone(), "crawl")
    }

    async fn holder(&self) -> Option<String> {
        let lease = self.leases().get_opt(LEASE_NAME).await.unwrap()?;
        lease.spec?.holder_identity
    }

    async fn apply_proxy(&self, name: &str) {
        let ar = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("crawl.example.com", "v1alpha1", "Proxy"),
            "proxies",
        );
        let proxies: Api<DynamicObject> = Api::namespaced_with(self.client.clone(), "crawl", &ar);
        let obj: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "crawl.example.com/v1alpha1", "kind": "Proxy",
            "metadata": {"name": name, "namespace": "crawl"},
            "spec": {"mode": "Managed", "provider": "local",
                     "healthCheck": {"url": self.target, "interval": "1s"}}
        }))
        .unwrap();
        proxies.create(&PostParams::default(), &obj).await.unwrap();
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Probe {
    /// `/readyz` answers 200.
    Ready,
    /// `POST /v1/leases` answers 201.
    Grant,
}

/// One look at one replica: it acted (`yes`) at some instant in `[sent, answered]`.
#[derive(Clone, Copy, Debug)]
struct Sample {
    replica: usize,
    probe: Probe,
    tick: u64,
    sent: Instant,
    answered: Instant,
    yes: bool,
}

async fn look(addr: SocketAddr, probe: Probe, tick: u64) -> bool {
    let request = async move {
        match probe {
            Probe::Ready => support::http::request(addr, "GET", "/readyz", &[], None).await.0 == 200,
            Probe::Grant => {
                let body = json!({"target": format!("t{tick}.example"), "ttlSeconds": 1}).to_string();
                support::http::request(addr, "POST", "/v1/leases", &[], Some(&body))
                    .await
                    .0
                    == 201
            }
        }
    };
    // A refused connection (exited process) panics inside the helper: not acting.
    let attempt = tokio::spawn(tokio::time::timeout(SAMPLE_TIMEOUT, request));
    matches!(attempt.await, Ok(Ok(true)))
}

/// Samples every live replica's readiness and grants every `every` until `until`.
struct Sampler {
    samples: Arc<Mutex<Vec<Sample>>>,
    looks: Vec<tokio::task::JoinHandle<()>>,
    tick: u64,
}

impl Sampler {
    fn new() -> Self {
        Self {
            samples: Arc::default(),
            looks: Vec::new(),
            tick: 0,
        }
    }

    /// Starts one round of looks at `targets` (index, health, discovery) without waiting for them.
    fn round(&mut self, targets: &[(usize, SocketAddr, SocketAddr)]) {
        self.tick += 1;
        for &(replica, health, discovery) in targets {
            for (probe, addr) in [(Probe::Ready, health), (Probe::Grant, discovery)] {
                let (samples, tick) = (self.samples.clone(), self.tick);
                self.looks.push(tokio::spawn(async move {
                    let sent = Instant::now();
                    let yes = look(addr, probe, tick).await;
                    let answered = Instant::now();
                    samples.lock().unwrap().push(Sample {
                        replica,
                        probe,
                        tick,
                        sent,
                        answered,
                        yes,
                    });
                }));
            }
        }
    }

    /// Every look, once all have answered or given up.
    async fn finish(self) -> Vec<Sample> {
        for look in self.looks {
            look.await.unwrap();
        }
        let mut samples = self.samples.lock().unwrap().clone();
        samples.sort_by_key(|s| s.sent);
        samples
    }
}

/// Panics if two replicas acted at one instant: for every pair of replicas,
/// all of one's `yes` samples must end before all of the other's begin.
/// Returns the smallest gap seen between two replicas' acting periods.
fn assert_one_at_a_time(samples: &[Sample], probe: Probe, logs: &dyn Fn() -> String) -> Option<Duration> {
    let yes: Vec<&Sample> = samples.iter().filter(|s| s.probe == probe && s.yes).collect();
    let replicas: std::collections::BTreeSet<usize> = yes.iter().map(|s| s.replica).collect();
    let same_tick = yes
        .iter()
        .filter(|a| yes.iter().any(|b| b.tick == a.tick && b.replica != a.replica))
        .count();
    assert_eq!(
        same_tick,
        0,
        "{probe:?}: two replicas said yes in one round\n{}",
        logs()
    );
    let mut smallest: Option<Duration> = None;
    for &a in &replicas {
        for &b in &replicas {
            let a_last = yes.iter().filter(|s| s.replica == a).map(|s| s.answered).max();
            let b_first = yes.iter().filter(|s| s.replica == b).map(|s| s.sent).min();
            let a_first = yes.iter().filter(|s| s.replica == a).map(|s| s.sent).min();
            let (Some(a_last), Some(b_first), Some(a_first)) = (a_last, b_first, a_first) else {
                continue;
            };
            if a == b || b_first < a_first {
                continue;
            }
            assert!(
                a_last < b_first,
                "{probe:?}: replica {a} was seen acting until {:?} after replica {b} began\n{}",
                a_last - b_first,
                logs()
            );
            let gap = b_first - a_last;
            smallest = Some(smallest.map_or(gap, |g| g.min(gap)));
        }
    }
    smallest
}

/// The first `yes` of `replica` for `probe` after `from`.
fn first_yes(samples: &[Sample], replica: usize, probe: Probe, from: Instant) -> Option<Instant> {
    samples
        .iter()
        .filter(|s| s.replica == replica && s.probe == probe && s.yes && s.sent >= from)
        .map(|s| s.answered)
        .min()
}

/// The last `yes` of `replica` for `probe`.
fn last_yes(samples: &[Sample], replica: usize, probe: Probe) -> Option<Instant> {
    samples
        .iter()
        .filter(|s| s.replica == replica && s.probe == probe && s.yes)
        .map(|s| s.answered)
        .max()
}

async fn ready(replica: &OperatorProcess) -> bool {
    look(replica.health(), Probe::Ready, 0).await
}

const EVERY: Duration = Duration::from_millis(50);

#[actix_rt::test]
async fn a_partitioned_leader_stops_before_the_follower_takes_over() {
    let bed = Bed::new();
    let link = bed.fake.link().unwrap();
    // A leads, through the link the test will cut.
    let a = bed.start("replica-a", &link).await;
    support::eventually("replica-a leading", Duration::from_secs(30), async || {
        ready(&a).await.then_some(())
    })
    .await;
    let b = bed.start("replica-b", &bed.fake).await;
    bed.apply_proxy("p").await;
    support::eventually("a lease from replica-a", Duration::from_secs(30), async || {
        look(a.discovery(), Probe::Grant, 0).await.then_some(())
    })
    .await;
    assert!(!ready(&b).await, "replica-b follows");
    assert_eq!(bed.holder().await.as_deref(), Some("replica-a"));
    // The leader gauge says who acts (the "no leader" alert sums it).
    for (replica, leading) in [(&a, "1"), (&b, "0")] {
        let (status, text) = support::http::request(replica.metrics(), "GET", "/metrics", &[], None).await;
        assert_eq!(status, 200, "{text}");
        assert!(
            text.lines()
                .any(|l| l == format!("egress_proxies_leader {leading}")),
            "egress_proxies_leader {leading} expected in\n{text}"
        );
    }

    // Cut A off for 20 s, sampling everyone 20 times a second throughout
    // (and 4 s after the heal).
    let mut sampler = Sampler::new();
    let mut ticker = tokio::time::interval(EVERY);
    for _ in 0..20 {
        ticker.tick().await;
        sampler.round(&[(0, a.health(), a.discovery()), (1, b.health(), b.discovery())]);
    }
    link.stall();
    let cut = Instant::now();
    let heal_at = cut + Duration::from_secs(20);
    let end = heal_at + Duration::from_secs(4);
    let mut a_exited: Option<(Instant, std::process::ExitStatus)> = None;
    let mut restarted: Option<OperatorProcess> = None;
    let mut healed = false;
    while Instant::now() < end {
        ticker.tick().await;
        if a_exited.is_none()
            && let Some(status) = a.exited()
        {
            a_exited = Some((Instant::now(), status));
            // Kubernetes restarts the container: a follower, still cut off
            // (not waited for: the sampling goes on meanwhile).
            restarted = Some(bed.replica("replica-a-restarted", &link).spawn());
        }
        if !healed && Instant::now() >= heal_at {
            link.resume();
            healed = true;
        }
        let mut targets = vec![(1, b.health(), b.discovery())];
        if a_exited.is_none() {
            targets.push((0, a.health(), a.discovery()));
        }
        if let Some(r) = &restarted {
            targets.push((2, r.health(), r.discovery()));
        }
        sampler.round(&targets);
    }
    let samples = sampler.finish().await;
    let logs = || bed.logs();

    let ready_gap = assert_one_at_a_time(&samples, Probe::Ready, &logs);
    let grant_gap = assert_one_at_a_time(&samples, Probe::Grant, &logs);
    let (exited, status) = a_exited.unwrap_or_else(|| panic!("the cut-off leader did not exit\n{}", logs()));
    assert_eq!(
        status.code(),
        Some(1),
        "exits with status 1 to restart as a follower"
    );
    let a_last_ready = last_yes(&samples, 0, Probe::Ready).unwrap();
    let a_last_grant = last_yes(&samples, 0, Probe::Grant).unwrap();
    let b_ready = first_yes(&samples, 1, Probe::Ready, cut)
        .unwrap_or_else(|| panic!("the follower never took over\n{}", logs()));
    let b_grant = first_yes(&samples, 1, Probe::Grant, cut)
        .unwrap_or_else(|| panic!("the new leader never granted\n{}", logs()));
    assert!(
        exited < b_ready,
        "the cut-off leader's process is gone before the follower is ready"
    );
    assert!(
        a_last_ready < cut + Duration::from_secs(2) + SAMPLE_TIMEOUT,
        "unready within the renew deadline"
    );
    // A's last renew landed at most one retry period (0.4 s) before the cut.
    assert!(
        b_ready >= cut + LEASE_DURATION - Duration::from_millis(400),
        "no takeover before the lease duration"
    );
    assert!(
        b_ready < cut + Duration::from_secs(8),
        "takeover soon after the lease duration"
    );
    let after_cut = |replica: usize, probe: Probe| {
        samples
            .iter()
            .filter(|s| s.replica == replica && s.probe == probe && s.sent >= cut)
            .collect::<Vec<_>>()
    };
    let granted = |replica: usize| after_cut(replica, Probe::Grant).iter().filter(|s| s.yes).count();
    // The restarted replica never leads: cut off, then B renews.
    assert_eq!(
        samples.iter().filter(|s| s.replica == 2 && s.yes).count(),
        0,
        "the restarted replica stays a follower\n{}",
        logs()
    );
    assert_eq!(bed.holder().await.as_deref(), Some("replica-b"));
    assert!(ready(&b).await, "replica-b still leads after the heal");
    eprintln!(
        "partition: {} samples ({} rounds) over {:?}; after the cut: replica-a granted {} leases and was \
         last ready {:?} / last granted {:?} after the cut, exited {:?} after the cut; replica-b ready {:?} and \
         granting {:?} after the cut, granted {}; readiness gap {:?}, grant gap {:?}; overlaps 0",
        samples.len(),
        samples.iter().map(|s| s.tick).max().unwrap_or(0),
        end - cut + Duration::from_secs(1),
        granted(0),
        a_last_ready.saturating_duration_since(cut),
        a_last_grant.saturating_duration_since(cut),
        exited - cut,
        b_ready - cut,
        b_grant - cut,
        granted(1),
        ready_gap,
        grant_gap,
    );
    drop(restarted);
    drop(b);
}

/// A holder that keeps renewing with `renewTime`s ten minutes in the past
/// (its clock is off) is never taken over; once it stops — its last
/// `renewTime` ten minutes in the *future* — the candidate takes over one
/// lease duration after it last saw the record change, not ten minutes on.
#[actix_rt::test]
async fn renew_times_from_a_skewed_clock_neither_hasten_nor_delay_takeover() {
    let bed = Bed::new();
    let leases = bed.leases();
    let past = jiff::Timestamp::now() - jiff::SignedDuration::from_secs(600);
    let lease: Lease = serde_json::from_value(json!({
        "metadata": {"name": LEASE_NAME},
        "spec": {"holderIdentity": "skewed-leader", "leaseDurationSeconds": 3,
                 "acquireTime": MicroTime(past), "renewTime": MicroTime(past), "leaseTransitions": 0}
    }))
    .unwrap();
    let mut current = leases.create(&PostParams::default(), &lease).await.unwrap();
    let candidate = bed.start("candidate", &bed.fake).await;

    // The skewed leader renews every 0.5 s for 8 s; the candidate must stay a follower.
    let started = Instant::now();
    let mut looks = 0;
    let mut renewals = 0u32;
    let mut next_renew = Instant::now();
    while started.elapsed() < Duration::from_secs(8) {
        if Instant::now() >= next_renew {
            renewals += 1;
            let mut renewed = current.clone();
            let spec = renewed.spec.as_mut().unwrap();
            spec.renew_time = Some(MicroTime(
                past + jiff::SignedDuration::from_millis(i64::from(renewals) * 500),
            ));
            // Guarded by the version it read: a takeover would make this a 409.
            current = leases
                .replace(LEASE_NAME, &PostParams::default(), &renewed)
                .await
                .unwrap_or_else(|e| panic!("the skewed leader lost its Lease: {e}\n{}", bed.logs()));
            next_renew += Duration::from_millis(500);
        }
        looks += 1;
        assert!(
            !ready(&candidate).await,
            "premature takeover from a renewTime ten minutes old\n{}",
            bed.logs()
        );
        // Looking every 50 ms for 8 s: nothing may change in that window.
        tokio::time::sleep(EVERY).await;
    }

    // Its last renew, from a clock ten minutes fast; then silence.
    let mut last = current.clone();
    last.spec.as_mut().unwrap().renew_time = Some(MicroTime(
        jiff::Timestamp::now() + jiff::SignedDuration::from_secs(600),
    ));
    // Measured from before the write: the candidate cannot have seen it earlier.
    let silent = Instant::now();
    leases
        .replace(LEASE_NAME, &PostParams::default(), &last)
        .await
        .unwrap();
    let took_over = support::eventually("the takeover", Duration::from_secs(20), async || {
        ready(&candidate).await.then(Instant::now)
    })
    .await;
    let after = took_over - silent;
    assert!(
        after >= LEASE_DURATION,
        "took over {after:?} after the last renew"
    );
    assert!(
        after < LEASE_DURATION * 2,
        "took over {after:?} after the last renew"
    );
    let spec = leases.get(LEASE_NAME).await.unwrap().spec.unwrap();
    assert_eq!(spec.holder_identity.as_deref(), Some("candidate"));
    assert_eq!(spec.lease_transitions, Some(1));
    eprintln!(
        "skew: {looks} looks over 8 s while {renewals} renewals dated ten minutes back: never ready; \
         takeover {after:?} after the last renew (dated ten minutes ahead)"
    );
}

/// A start held up by a busy API server does not cost the Lease: with the
/// fake refusing past one request a second (each priority level its own
/// budget, as API Priority and Fairness has it), the start's reads of the
/// installation record and the 16 lease checkpoint shards take longer than
/// the renew deadline (10 s at the default 15 s lease), and the winner
/// renews all along, becomes ready and stays the leader.
#[actix_rt::test]
async fn a_slow_start_keeps_renewing_the_lease() {
    let bed = Bed::new();
    bed.fake.limit_rate(1.0, 1);
    let leader = bed
        .dir
        .kubernetes(&bed.fake.kubeconfig("crawl"))
        .name("slow-start")
        .discovery()
        .arg("--leader-elect")
        .arg("--every-replica-serves=false")
        .arg("--insecure-discovery-without-token")
        .env("POD_NAME", "slow-start")
        .start()
        .await;
    // Watched through the fake's own counters: a test client's reads would
    // spend the Lease's budget.
    let renewals = || bed.fake.requests().count("update", "leases", 200);
    let won = support::eventually("the Lease won", Duration::from_secs(30), async || {
        (bed.fake.requests().count("create", "leases", 201) == 1).then(Instant::now)
    })
    .await;
    let ready_at = support::eventually("the leader ready", Duration::from_secs(90), async || {
        assert!(
            leader.exited().is_none(),
            "the leader exited during its start\n{}",
            bed.logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
        ready(&leader).await.then(Instant::now)
    })
    .await;
    let start = ready_at - won;
    let during = renewals();
    assert!(
        start > Duration::from_secs(10),
        "the start took {start:?}: not slower than the renew deadline, so this shows nothing"
    );
    // One renewal every 2 s (the retry period), give or take a refusal.
    assert!(
        during as f64 >= start.as_secs_f64() / 5.0,
        "{during} renewals during a start of {start:?}\n{}",
        bed.logs()
    );
    // And it stays the leader past one more renew deadline.
    tokio::time::sleep(Duration::from_secs(11)).await;
    assert!(leader.exited().is_none(), "the leader exited\n{}", bed.logs());
    assert!(ready(&leader).await, "the leader is not ready\n{}", bed.logs());
    assert!(renewals() >= during + 3, "renewals stopped\n{}", bed.logs());
    assert!(!bed.logs().contains("could not renew"), "{}", bed.logs());
    eprintln!("slow start: ready {start:?} after winning, {during} renewals meanwhile");
}
