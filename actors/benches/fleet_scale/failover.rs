//! `--failover`: the leader's end with the whole fleet Ready, and a
//! standby replica taking over.
//!
//! A second replica (its own `POD_NAME`, state directory and log, and the
//! lease API on a loopback port of its own) starts as a standby and waits
//! until it has read the leader Lease; then the leader ends. `kill`: a
//! SIGKILL, as a node lost — the standby takes over only once the Lease
//! has gone unrenewed for its whole duration (15 s). `term`: a SIGTERM, as
//! a rolling update — the leader releases the Lease and the standby takes
//! it at its next attempt. `both` (the default) runs the kill, then with a
//! third replica as the standby, the SIGTERM of the second.
//!
//! Measured from the signal: when the new replica won (its `leader` gauge,
//! set as its Lease write succeeds, scraped every 20 ms; the fake's Lease
//! read every 0.5 s confirms the holder), its `/readyz` 200, and its lease
//! API's first `201` (a `POST /v1/leases` every 20 ms from the signal on).
//! Then its requests until 60 s after it won, from the fake's counts (the
//! window starts at the signal: after a kill only the new replica runs;
//! after a SIGTERM the old one's requests while it shut down are in it
//! too) and from its own `kube_api_requests_total` (its requests alone).
//! The writes — every verb but get, list and watch, the leader Lease's own
//! requests aside — are the "objects written in its first minute".
//! Its one granted lease is checkpointed, and those writes are counted.

use std::path::Path;
use std::time::{Duration, Instant};

use fake_apiserver::RequestCounts;
use serde_json::json;

use super::{Fake, Operator, minus, phase_line, ready, table};
use crate::common::free_addr;

/// The first lease after winning; the target.
const GRANT_TARGET: Duration = Duration::from_secs(2);
/// Writes in the new leader's first minute; the target (fewer).
const WRITES_TARGET: u64 = 100;
const FIRST_MINUTE: Duration = Duration::from_secs(60);
/// How often the bench asks the new replica (its gauge, its lease API).
const POLL: Duration = Duration::from_millis(20);
/// How often the bench reads the fake's Lease: rarely, as its reads share
/// the leader-election budget with the replicas' under `--api-rate`.
const LEASE_POLL: Duration = Duration::from_millis(500);

/// How the leader ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Leave {
    Kill,
    Term,
}

impl Leave {
    /// `--failover [kill|term|both]`: the handovers to run, in order.
    pub fn from_args() -> Option<Vec<Leave>> {
        let args: Vec<String> = std::env::args().collect();
        let at = args.iter().position(|a| a == "--failover")?;
        Some(match args.get(at + 1).map(String::as_str) {
            Some("kill") => vec![Leave::Kill],
            Some("term") => vec![Leave::Term],
            Some("both") | None => vec![Leave::Kill, Leave::Term],
            Some(other) if other.starts_with("--") => vec![Leave::Kill, Leave::Term],
            Some(other) => panic!("--failover {other}: expected kill, term or both"),
        })
    }

    fn name(self) -> &'static str {
        match self {
            Leave::Kill => "SIGKILL",
            Leave::Term => "SIGTERM",
        }
    }
}

/// One handover's figures, times from the signal.
struct Handover {
    leave: Leave,
    old: String,
    new: String,
    won: Option<Duration>,
    holder: Option<Duration>,
    ready: Option<Duration>,
    granted: Option<Duration>,
    /// When the old leader's process was gone.
    exited: Option<Duration>,
    /// The lease API's last refusal before its first grant.
    refusal: String,
    /// From the signal to 60 s after winning: the fake's counts and the new
    /// replica's own.
    window: Duration,
    fake_counts: RequestCounts,
    own_counts: RequestCounts,
    /// The Proxies' phases at the window's end.
    phases: Vec<(String, usize)>,
    /// Why the new leader's leadership ended, if it did.
    lost: Option<String>,
}

/// Write requests besides the leader Lease's.
fn writes(counts: &RequestCounts) -> u64 {
    counts
        .0
        .iter()
        .filter(|(k, _)| !matches!(k.verb.as_str(), "get" | "list" | "watch") && k.resource != "leases")
        .map(|(_, n)| n)
        .sum()
}

/// Runs the handovers in turn, each from the replica the last one made
/// leader; prints each; true if every standby took over, granted a lease
/// and left every Proxy Ready.
pub async fn run(
    fake: &Fake,
    dir: &Path,
    mut leader: Operator,
    leaves: &[Leave],
    proxies: usize,
    deadline: Duration,
) -> bool {
    let mut ok = true;
    for (n, leave) in leaves.iter().enumerate() {
        let standby = Operator::start(dir, &format!("fleet-operator-{}", n + 1), Some(free_addr()));
        let (new_leader, figures) = handover(fake, leader, standby, *leave, deadline).await;
        print(&figures, proxies);
        let done = figures.granted.is_some() && figures.lost.is_none() && ready(&figures.phases) == proxies;
        ok &= done;
        leader = new_leader;
        if !done {
            break;
        }
    }
    ok
}

/// Waits for `standby` to follow, ends `old` by `leave` and measures the
/// takeover; the new leader comes back for the next handover.
async fn handover(
    fake: &Fake,
    old: Operator,
    standby: Operator,
    leave: Leave,
    deadline: Duration,
) -> (Operator, Handover) {
    let http = reqwest::Client::new();
    let api = standby.discovery.expect("a standby serves its lease API");
    // A follower: it has read the Lease (and found it held) at least once.
    let began = Instant::now();
    while standby.api_requests(&http).await.count("get", "leases", 200) == 0 && began.elapsed() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!(
        "\nfailover ({}): {} following after {:.1} s; ending {}",
        leave.name(),
        standby.pod,
        began.elapsed().as_secs_f64(),
        old.pod
    );
    let before = fake.counts().await;
    fake.take_own();
    let own_before = standby.api_requests(&http).await;
    let mut old = old;
    let signalled = Instant::now();
    match leave {
        Leave::Kill => {
            let _ = old.process.0.kill();
        }
        Leave::Term => nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(old.pid() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap(),
    }
    let mut figures = Handover {
        leave,
        old: old.pod.clone(),
        new: standby.pod.clone(),
        won: None,
        holder: None,
        ready: None,
        granted: None,
        exited: None,
        refusal: String::new(),
        window: Duration::ZERO,
        fake_counts: RequestCounts::default(),
        own_counts: RequestCounts::default(),
        phases: Vec::new(),
        lost: None,
    };
    // Its lease API on a task of its own: a request may wait up to a
    // second in the backlog, and the gauge is read meanwhile.
    let granting = tokio::spawn(first_grant(http.clone(), api, signalled, deadline));
    let mut lease_read = Instant::now() - LEASE_POLL;
    let mut standby = standby;
    // Until the first grant (or the deadline): every figure as it comes.
    while !granting.is_finished() {
        let at = signalled.elapsed();
        if figures.exited.is_none() && old.process.0.try_wait().ok().flatten().is_some() {
            figures.exited = Some(at);
        }
        if figures.won.is_none() && standby.won(&http).await {
            figures.won = Some(at);
            println!(
                "  {:6.2} s  {} won (its leader gauge)",
                at.as_secs_f64(),
                figures.new
            );
        }
        if figures.holder.is_none() && lease_read.elapsed() >= LEASE_POLL {
            lease_read = Instant::now();
            if fake
                .lease()
                .await
                .is_some_and(|(holder, _)| holder == figures.new)
            {
                figures.holder = Some(at);
                println!("  {:6.2} s  the fake's Lease names it", at.as_secs_f64());
            }
        }
        if figures.ready.is_none() && standby.leading(&http).await {
            figures.ready = Some(at);
            println!("  {:6.2} s  /readyz 200", at.as_secs_f64());
        }
        if let Some(why) = standby.lost() {
            figures.lost = Some(why);
            granting.abort();
            break;
        }
        tokio::time::sleep(POLL).await;
    }
    if let Ok((granted, refusal)) = granting.await {
        (figures.granted, figures.refusal) = (granted, refusal);
    }
    if let Some(t) = figures.granted {
        println!("  {:6.2} s  first lease granted", t.as_secs_f64());
    }
    // Its first minute as the leader, or as far as it got.
    let won = figures.won.or(figures.holder).unwrap_or(signalled.elapsed());
    while figures.lost.is_none() && signalled.elapsed() < won + FIRST_MINUTE && figures.granted.is_some() {
        if figures.exited.is_none() && old.process.0.try_wait().ok().flatten().is_some() {
            figures.exited = Some(signalled.elapsed());
        }
        // The grant may have come before the next read of the Lease.
        if figures.holder.is_none() && lease_read.elapsed() >= LEASE_POLL {
            lease_read = Instant::now();
            if fake
                .lease()
                .await
                .is_some_and(|(holder, _)| holder == figures.new)
            {
                figures.holder = Some(signalled.elapsed());
            }
        }
        figures.lost = standby.lost();
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    figures.window = signalled.elapsed();
    figures.fake_counts = minus(&fake.counts().await, &before, &fake.take_own());
    figures.own_counts = minus(
        &standby.api_requests(&http).await,
        &own_before,
        &RequestCounts::default(),
    );
    figures.phases = fake.phases().await.unwrap_or_default();
    fake.take_own();
    drop(old);
    (standby, figures)
}

/// `POST /v1/leases` every 20 ms until a `201`: when it came (from
/// `signalled`), and the last refusal before it. Before the replica leads,
/// its listener is bound but not served: a request waits in the backlog
/// and is answered the moment the API serves, so a second's timeout loses
/// no time.
async fn first_grant(
    http: reqwest::Client,
    api: std::net::SocketAddr,
    signalled: Instant,
    deadline: Duration,
) -> (Option<Duration>, String) {
    let mut refusal = String::new();
    while signalled.elapsed() < deadline {
        let answer = http
            .post(format!("http://{api}/v1/leases"))
            .json(&json!({"target": "failover.example", "ttlSeconds": 300}))
            .timeout(Duration::from_secs(1))
            .send()
            .await;
        refusal = match answer {
            Ok(r) if r.status() == 201 => return (Some(signalled.elapsed()), refusal),
            Ok(r) => {
                let code = r.status().as_u16();
                let body: serde_json::Value = r.json().await.unwrap_or_default();
                format!("{code} {}", body["error"].as_str().unwrap_or(""))
            }
            Err(e) if e.is_timeout() => "no answer within 1 s".to_owned(),
            Err(e) => format!("no answer ({e})"),
        };
        tokio::time::sleep(POLL).await;
    }
    (None, refusal)
}

fn print(h: &Handover, proxies: usize) {
    let s = |t: Option<Duration>| t.map_or("never".to_owned(), |t| format!("{:.2} s", t.as_secs_f64()));
    println!(
        "failover ({}, {} → {}), from the signal: won {}; the fake's Lease names it {} (read every {:.1} s); \
         /readyz 200 {}; first lease granted {}{}",
        h.leave.name(),
        h.old,
        h.new,
        s(h.won),
        s(h.holder),
        LEASE_POLL.as_secs_f64(),
        s(h.ready),
        s(h.granted),
        h.exited
            .map(|t| format!("; {} exited after {:.2} s", h.old, t.as_secs_f64()))
            .unwrap_or_default(),
    );
    match (h.won.or(h.holder), h.granted) {
        (Some(won), Some(granted)) => {
            let took = granted.saturating_sub(won);
            println!(
                "  won → first lease granted: {:.2} s (target ≤ {} s: {})",
                took.as_secs_f64(),
                GRANT_TARGET.as_secs(),
                if took <= GRANT_TARGET { "met" } else { "MISSED" }
            );
        }
        _ => println!(
            "  NO lease granted within the deadline; the lease API's last answer: {}",
            h.refusal
        ),
    }
    if let Some(why) = &h.lost {
        println!("  the new leader's leadership ENDED: {why}");
    }
    let (fake_writes, own_writes) = (writes(&h.fake_counts), writes(&h.own_counts));
    let first = h.window.saturating_sub(h.won.or(h.holder).unwrap_or(h.window));
    println!(
        "  write requests in the new leader's first {:.0} s, the leader Lease aside: {own_writes} by its own count, \
         {fake_writes} at the fake (target < {WRITES_TARGET}: {})",
        first.as_secs_f64(),
        if own_writes.max(fake_writes) < WRITES_TARGET {
            "met"
        } else {
            "MISSED"
        }
    );
    let whose = match h.leave {
        Leave::Kill => "only the new leader ran",
        Leave::Term => "with the old leader's own while it shut down",
    };
    println!(
        "  the fake's requests from the signal to {:.0} s after winning ({:.1} s; {whose}): {}",
        first.as_secs_f64(),
        h.window.as_secs_f64(),
        h.fake_counts.total()
    );
    println!("{}", table(&h.fake_counts, h.window.as_secs_f64(), "/s"));
    println!(
        "  Proxies at the end: {} ({})",
        phase_line(&h.phases),
        if ready(&h.phases) == proxies {
            "all Ready"
        } else {
            "NOT all Ready"
        }
    );
}
