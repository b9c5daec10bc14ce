//! Issue 53, done when: probing is shared. 3,000 External Proxies, each
//! probed every 1 s at its own health URL on one counting endpoint
//! (support::probe_counter), over three replicas, every one serving (the
//! default):
//! - over a 15 s window each proxy is probed 15 ± 2 times, never twice
//!   within 0.3 s, counted at the proxy (two replicas probing one proxy
//!   would double the count, and their probes would interleave at random
//!   gaps; one replica held up on a busy machine sends a probe late and
//!   the next on time, a gap down to about half the interval);
//! - every replica probes a fair part of them (at least a fifth of the
//!   window's probes, by its `egress_proxies_health_probes_total`);
//! - a member that does not lead SIGKILLed: the proxies it probed (those
//!   whose probes stop at the kill, at least a fifth of the fleet) are each
//!   probed again within one interval plus the lease duration (3 s) of the
//!   kill: the leader calls a member quiet once its Lease is unchanged for
//!   half the lease duration (seen at looks a retry period, 0.4 s, apart)
//!   and the others take its probes, each first probed within an interval.
//!
//! The counter runs on a thread of its own, so that the instants it
//! records are not held up by the test's other work.

mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fake_apiserver::RequestCounts;
use support::probe_counter::ProbeCounter;
use support::replicas::{LEASE_DURATION, ReplicaBed};

const PROXIES: usize = 3_000;
const INTERVAL: Duration = Duration::from_secs(1);
const WINDOW: Duration = Duration::from_secs(15);
/// Probes per proxy over the window: 15 ± 2.
const PROBES_LOW: usize = 13;
const PROBES_HIGH: usize = 17;
const CLOSEST: Duration = Duration::from_millis(300);
const OK_PROBES: &str = "egress_proxies_health_probes_total";
const WAIT: Duration = Duration::from_secs(120);
/// Proxies created at a time.
const BATCH: usize = 300;

/// API requests since `before`, by verb and resource, the most first.
fn by_verb_and_resource(now: &RequestCounts, before: &RequestCounts) -> Vec<(String, u64)> {
    let mut counts: BTreeMap<String, u64> = BTreeMap::new();
    for (k, n) in &now.0 {
        let was = before.0.get(k).copied().unwrap_or(0);
        if *n > was {
            *counts.entry(format!("{} {}", k.verb, k.resource)).or_default() += n - was;
        }
    }
    let mut sorted: Vec<(String, u64)> = counts.into_iter().collect();
    sorted.sort_by_key(|(_, n)| std::cmp::Reverse(*n));
    sorted
}

/// For a failure: each replica's last log lines and the API requests so far.
fn explain(bed: &ReplicaBed) -> String {
    format!(
        "API requests so far: {:?}\n{}",
        by_verb_and_resource(&bed.fake.requests(), &RequestCounts::default()),
        support::crawlers::log_tails(bed, 30)
    )
}

/// A probe counter serving from a thread of its own until dropped.
struct CounterThread {
    counter: Arc<ProbeCounter>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl CounterThread {
    fn start() -> Self {
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                ready_tx.send(Arc::new(ProbeCounter::start().await)).unwrap();
                let _ = stopped.await;
            });
        });
        Self {
            counter: ready_rx.recv().unwrap(),
            stop: Some(stop),
            thread: Some(thread),
        }
    }
}

impl Drop for CounterThread {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Each replica's probes that succeeded so far; a replica that does not
/// answer `/metrics` is a failure, with its log.
async fn probes_by_replica(bed: &ReplicaBed, replicas: &[usize]) -> BTreeMap<usize, f64> {
    let mut counts = BTreeMap::new();
    for &i in replicas {
        let look = async {
            let mut conn = support::crawlers::ApiConnection::connect(bed.addrs(i).metrics).await?;
            conn.call("GET", "/metrics", None).await
        };
        let text = match look.await {
            Ok(answer) if answer.status == 200 => answer.text(),
            other => panic!(
                "replica-{i}'s /metrics: {:?} (exited: {:?})\n{}",
                other.map(|a| a.status),
                bed.process(i).exited(),
                explain(bed)
            ),
        };
        let wanted = format!("{OK_PROBES}{{result=\"ok\"}} ");
        let n = text
            .lines()
            .find_map(|l| l.strip_prefix(&wanted)?.trim().parse().ok())
            .unwrap_or(0.0);
        counts.insert(i, n);
    }
    counts
}

#[actix_rt::test]
async fn three_thousand_proxies_probed_once_per_interval_by_one_of_three_replicas() {
    let _one = support::exclusive::replicas_lock();
    let counter_thread = CounterThread::start();
    let counter = counter_thread.counter.clone();
    let bed = ReplicaBed::builder(3)
        .args(["--allow-external-endpoint-networks", "127.0.0.0/8"])
        .start()
        .await;
    let leader = bed.wait_leader().await;
    let names: Vec<String> = (0..PROXIES).map(|i| format!("ext-{i:04}")).collect();
    // Created a few hundred at a time, each batch probed before the next
    // (a burst of 3,000 at once is another test's question).
    let api_before = bed.fake.requests();
    let creating = Instant::now();
    for batch in names.chunks(BATCH) {
        bed.apply_proxies(batch.iter().map(|name| {
            (
                name.clone(),
                counter.external_spec(&ProbeCounter::health_url(name), "1s"),
            )
        }))
        .await;
        let created = names.iter().position(|n| n == batch.last().unwrap()).unwrap() + 1;
        support::eventually_explained(
            &format!("the first {created} proxies probed"),
            WAIT,
            || explain(&bed),
            async || {
                // Looked at 4 times a second: each look copies 3,000 names.
                tokio::time::sleep(Duration::from_millis(250)).await;
                if let Some((i, status)) = (0..bed.len()).find_map(|i| Some((i, bed.process(i).exited()?))) {
                    panic!(
                        "replica-{i} exited ({status}) while the first {created} proxies were created\n{}",
                        explain(&bed)
                    );
                }
                let seen = counter.counts().len();
                (seen >= created)
                    .then_some(())
                    .ok_or(format!("{seen} of {created}"))
            },
        )
        .await;
    }
    eprintln!(
        "probing: {PROXIES} proxies created and probed in {:?}; API requests meanwhile {:?}",
        creating.elapsed(),
        by_verb_and_resource(&bed.fake.requests(), &api_before)
    );

    // Every replica probing its part, and settled: two looks 3 s apart,
    // each replica's probes risen in between.
    let all = [0, 1, 2];
    support::eventually_explained(
        "every replica probing (shared probing)",
        WAIT,
        || explain(&bed),
        async || {
            let before = probes_by_replica(&bed, &all).await;
            tokio::time::sleep(Duration::from_secs(3)).await;
            let after = probes_by_replica(&bed, &all).await;
            let rose: Vec<f64> = all.iter().map(|i| after[i] - before[i]).collect();
            rose.iter()
                .all(|n| *n > 0.0)
                .then_some(())
                .ok_or(format!("probes per replica in 3 s: {rose:?}"))
        },
    )
    .await;

    // The window.
    let before = probes_by_replica(&bed, &all).await;
    let api_before = bed.fake.requests();
    let from = Instant::now();
    tokio::time::sleep(WINDOW).await;
    let to = Instant::now();
    let after = probes_by_replica(&bed, &all).await;
    let api_window = by_verb_and_resource(&bed.fake.requests(), &api_before);
    let probes = counter.probes();
    let mut off_count = Vec::new();
    let mut too_close = Vec::new();
    let mut counts: BTreeMap<usize, usize> = BTreeMap::new();
    let mut closest = Duration::MAX;
    for name in &names {
        let at = probes.get(name).map(Vec::as_slice).unwrap_or_default();
        let inside: Vec<Instant> = at.iter().copied().filter(|t| *t >= from && *t < to).collect();
        *counts.entry(inside.len()).or_default() += 1;
        if !(PROBES_LOW..=PROBES_HIGH).contains(&inside.len()) {
            off_count.push((name.clone(), inside.len()));
        }
        // Gaps between consecutive probes, those touching the window.
        for pair in at.windows(2) {
            if pair[1] >= from && pair[0] < to {
                let gap = pair[1] - pair[0];
                closest = closest.min(gap);
                if gap < CLOSEST {
                    too_close.push((name.clone(), gap));
                }
            }
        }
    }
    let by_replica: BTreeMap<usize, f64> = all.iter().map(|i| (*i, after[i] - before[i])).collect();
    let window_total: f64 = by_replica.values().sum();
    eprintln!(
        "probing: {PROXIES} proxies over {WINDOW:?}: probes per proxy (count: proxies) {counts:?}, closest two \
         probes of one proxy {closest:?}; probes per replica {by_replica:?} (leader replica-{leader}); \
         strays {}; API requests in the window {api_window:?}",
        counter.strays()
    );
    assert!(
        off_count.is_empty(),
        "{} proxies not probed {PROBES_LOW}..={PROBES_HIGH} times in {WINDOW:?}: {:?}",
        off_count.len(),
        &off_count[..off_count.len().min(10)]
    );
    assert!(
        too_close.is_empty(),
        "{} times a proxy was probed twice within {CLOSEST:?}: {:?}",
        too_close.len(),
        &too_close[..too_close.len().min(10)]
    );
    for (i, n) in &by_replica {
        assert!(
            *n >= window_total / 5.0,
            "replica-{i} probed {n} of the window's {window_total} probes: probing is shared ({by_replica:?})"
        );
    }

    // A member that does not lead SIGKILLed: its proxies probed again in time.
    let killed = (leader + 1) % 3;
    let killed_at = Instant::now();
    bed.kill(killed).await;
    let bound = INTERVAL + LEASE_DURATION;
    support::eventually_explained(
        "every proxy probed after the kill",
        WAIT,
        || explain(&bed),
        async || {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let probes = counter.probes();
            let waiting = names
                .iter()
                .filter(|n| {
                    probes
                        .get(*n)
                        .is_none_or(|at| at.last().is_none_or(|t| *t <= killed_at))
                })
                .count();
            (waiting == 0)
                .then_some(())
                .ok_or(format!("{waiting} not probed since the kill"))
        },
    )
    .await;
    let probes = counter.probes();
    let mut stopped = Vec::new();
    for name in &names {
        let at = &probes[name];
        let last_before = at.iter().rev().find(|t| **t <= killed_at).copied();
        let next_after = at
            .iter()
            .find(|t| **t > killed_at)
            .copied()
            .expect("probed after the kill");
        // Probed by a survivor: about an interval apart across the kill.
        if last_before.is_none_or(|t| next_after - t > INTERVAL + INTERVAL / 2) {
            stopped.push((name.clone(), next_after - killed_at));
        }
    }
    stopped.sort_by_key(|(_, after)| *after);
    let late: Vec<_> = stopped.iter().filter(|(_, after)| *after > bound).collect();
    let quantile = |q: f64| {
        stopped
            .get(((stopped.len() as f64 - 1.0) * q).round() as usize)
            .map(|(_, d)| *d)
    };
    eprintln!(
        "probing: replica-{killed} SIGKILLed; {} proxies stopped being probed at the kill (it probed {} in the \
         window), probed again after (median, p99, max) {:?} {:?} {:?}; bound {bound:?}",
        stopped.len(),
        by_replica[&killed],
        quantile(0.5),
        quantile(0.99),
        quantile(1.0),
    );
    assert!(
        stopped.len() >= PROXIES / 5,
        "the killed replica probed a fair part of the fleet: {} proxies stopped being probed at its kill",
        stopped.len()
    );
    assert!(
        late.is_empty(),
        "{} of the killed replica's proxies probed again later than {bound:?} after the kill: {:?}",
        late.len(),
        &late[..late.len().min(10)]
    );
    drop(bed);
    drop(counter_thread);
}
