//! Lease API throughput: 64 concurrent clients doing acquire + release
//! against the real discovery API with 10,000 registered proxies, and in the
//! same run against a bare actix-web handler returning a constant — the
//! ceiling of the HTTP stack on this machine. The server runs in its own
//! process; this process is the load generator (keep-alive HTTP/1.1).
//!
//!   cargo bench -p egress-proxies-operator --bench lease_api -- [--proxies 10000] [--clients 64] [--seconds 10] [--journal log|none] [--target spread|hot]
//!
//! `--journal log` (the default) is standalone mode as shipped: every
//! grant and release appended to the lease log before the answer.
//!
//! `--target spread` (the default) asks for one of 100,000 targets each
//! time; `--target hot` asks for the same one every time, so after the
//! first pass over the fleet every proxy rests 30 s for it and most answers
//! are `503 no_capacity` — the case where selection must not walk past the
//! resting proxies. A 503 is then an expected answer, not an error.
//!
//! All traffic stays on 127.0.0.1.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use egress_proxies::adapters::lease_store::LeaseStore;
use egress_proxies::domain::lease::{Availability, LeaseLimits, LeaseSettings};
use egress_proxies::domain::resource::ObjectKey;
use egress_proxies::rate_limit::RateLimits;
use egress_proxies_operator::discovery;
use egress_proxies_operator::lease_store_actor::{GetLeaseStats, LeaseStoreActor, UpdateAvailability};
use tokio::net::TcpStream;

mod common;
use common::{Conn, Kill, arg, free_addr, lease_id, pct};

const ROLE: &str = "EPO_BENCH_LEASE_SERVER";

/// The server process: the discovery API with N proxies, and a bare handler.
fn serve(api: SocketAddr, bare: SocketAddr, proxies: usize, journal: &str, state: &std::path::Path) {
    let settings = LeaseSettings {
        capacity: 1,
        ..LeaseSettings::default()
    };
    // The load generator is one client address far over the per-client
    // rate limit, and 100,000 targets each resting 30 s outgrow the target
    // table's default: this measures the store and the HTTP stack, not
    // those limits (docs/api.md#limits).
    let limits = LeaseLimits {
        max_targets: 1_000_000,
        ..LeaseLimits::default()
    };
    let store = match journal {
        "none" => LeaseStore::with_limits(settings, limits),
        _ => LeaseStore::durable(
            settings,
            limits,
            Box::new(egress_proxies::adapters::stores::embedded::FileLeaseJournal::open(state).unwrap()),
        )
        .unwrap(),
    };
    System::new().block_on(async move {
        // As the operator runs it: on an arbiter of its own.
        let store =
            LeaseStoreActor::start_in_arbiter(&Arbiter::new().handle(), move |_| LeaseStoreActor::new(store));
        let geos = ["eu", "us", "asia", "sa"];
        for i in 0..proxies {
            store.do_send(UpdateAvailability(Availability {
                key: ObjectKey::new("bench", format!("p{i}")),
                ready: true,
                phase: "Ready".into(),
                healthy: Some(true),
                url: Some(format!(
                    "http://10.{}.{}.{}:3128",
                    i >> 16 & 255,
                    i >> 8 & 255,
                    i & 255
                )),
                attributes: BTreeMap::from([("geo".to_owned(), geos[i % geos.len()].to_owned())]),
                latency: Some(Duration::from_millis((i % 200) as u64)),
                credentials: None,
                realm: None,
                retiring: false,
            }));
        }
        let _ = store.send(GetLeaseStats).await;
        let unlimited = discovery::Limiter::new(RateLimits {
            per_client: 1e12,
            per_client_burst: 1e12,
            global: 1e12,
            global_burst: 1e12,
            max_clients: 16,
        });
        let listener = std::net::TcpListener::bind(api).unwrap();
        actix::spawn(
            discovery::start_with(listener, store, discovery::Tokens::open(), unlimited, None).unwrap(),
        );
        let bare_server = actix_web::HttpServer::new(|| {
            actix_web::App::new().route(
                "/bare",
                // Reads the body like the lease handler does, so the connection stays reusable.
                actix_web::web::post().to(|_body: actix_web::web::Bytes| async {
                    actix_web::HttpResponse::Created()
                        .content_type("application/json")
                        .body(r#"{"id":"00000000-0000-0000-0000-000000000000"}"#)
                }),
            )
        })
        .disable_signals()
        .bind(bare)
        .unwrap()
        .run();
        actix::spawn(bare_server);
        std::future::pending::<()>().await;
    });
}

struct Run {
    requests: u64,
    granted: u64,
    errors: u64,
    latencies: Vec<Duration>,
    wall: Duration,
}

async fn load(
    clients: usize,
    seconds: u64,
    hot: bool,
    work: impl Fn(u64) -> (SocketAddr, bool) + Send + Sync + 'static,
) -> Run {
    let work = Arc::new(work);
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let start = Instant::now();
    let tasks: Vec<_> = (0..clients)
        .map(|c| {
            let work = work.clone();
            tokio::spawn(async move {
                let (addr, _) = work(0);
                let mut conn = Conn::open(addr).await;
                let (mut requests, mut granted, mut errors, mut latencies) = (0u64, 0u64, 0u64, Vec::new());
                let mut n = c as u64;
                while Instant::now() < deadline {
                    n += clients as u64;
                    let (_, lease_api) = work(n);
                    if lease_api {
                        let ask = if hot {
                            r#"{"target":"hot.example","ttlSeconds":60}"#.to_owned()
                        } else {
                            format!(r#"{{"target":"site-{}.example","ttlSeconds":60}}"#, n % 100_000)
                        };
                        let t = Instant::now();
                        let (status, body) = conn.call("POST", "/v1/leases", &ask).await;
                        latencies.push(t.elapsed());
                        requests += 1;
                        if status != 201 {
                            errors += u64::from(!(hot && status == 503));
                            continue;
                        }
                        granted += 1;
                        let id = lease_id(&body);
                        let t = Instant::now();
                        let (status, _) = conn.call("DELETE", &format!("/v1/leases/{id}"), "").await;
                        latencies.push(t.elapsed());
                        requests += 1;
                        errors += u64::from(status != 204);
                    } else {
                        let t = Instant::now();
                        let (status, _) = conn.call("POST", "/bare", r#"{"target":"x"}"#).await;
                        latencies.push(t.elapsed());
                        requests += 1;
                        errors += u64::from(status != 201);
                    }
                }
                (requests, granted, errors, latencies)
            })
        })
        .collect();
    let mut run = Run {
        requests: 0,
        granted: 0,
        errors: 0,
        latencies: Vec::new(),
        wall: Duration::ZERO,
    };
    for t in tasks {
        let (r, g, e, l) = t.await.unwrap();
        run.requests += r;
        run.granted += g;
        run.errors += e;
        run.latencies.extend(l);
    }
    run.wall = start.elapsed();
    run.latencies.sort();
    run
}

fn main() {
    if let Ok(spec) = std::env::var(ROLE) {
        let mut parts = spec.split(',');
        let api = parts.next().unwrap().parse().unwrap();
        let bare = parts.next().unwrap().parse().unwrap();
        let proxies = parts.next().unwrap().parse().unwrap();
        let journal = parts.next().unwrap_or("log");
        let state = parts.next().unwrap();
        serve(api, bare, proxies, journal, std::path::Path::new(state));
        return;
    }
    let proxies: usize = arg("--proxies").map(|s| s.parse().unwrap()).unwrap_or(10_000);
    let clients: usize = arg("--clients").map(|s| s.parse().unwrap()).unwrap_or(64);
    let seconds: u64 = arg("--seconds").map(|s| s.parse().unwrap()).unwrap_or(10);
    let journal = arg("--journal").unwrap_or_else(|| "log".into());
    let target = arg("--target").unwrap_or_else(|| "spread".into());
    let hot = match target.as_str() {
        "hot" => true,
        "spread" => false,
        other => panic!("--target {other}: expected spread or hot"),
    };
    let (api, bare) = (free_addr(), free_addr());
    // Made (and removed) here: the server is killed, it cannot clean up.
    let state = tempfile::tempdir().unwrap();
    let _server = Kill(
        Command::new(std::env::current_exe().unwrap())
            .env(
                ROLE,
                format!("{api},{bare},{proxies},{journal},{}", state.path().display()),
            )
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let runtime = common::load_generator_runtime();
    runtime.block_on(async {
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect(api).await.is_err() || TcpStream::connect(bare).await.is_err() {
            assert!(Instant::now() < deadline, "server did not start");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // Let the 10k availability messages land before measuring.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let bare_run = load(clients, seconds, false, move |_| (bare, false)).await;
        let api_run = load(clients, seconds, hot, move |_| (api, true)).await;
        let rate = |r: &Run| r.requests as f64 / r.wall.as_secs_f64();
        println!(
            "proxies={proxies} clients={clients} duration={seconds}s journal={journal} target={target} cores={}",
            std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0)
        );
        println!("| server | requests/s | leases granted | errors | p50 ms | p99 ms |");
        println!("|---|---:|---:|---:|---:|---:|");
        for (name, r) in [
            ("bare actix handler", &bare_run),
            ("lease API (acquire + release)", &api_run),
        ] {
            println!(
                "| {name} | {:.0} | {} | {} | {:.3} | {:.3} |",
                rate(r),
                r.granted,
                r.errors,
                pct(&r.latencies, 0.50),
                pct(&r.latencies, 0.99)
            );
        }
        println!(
            "ratio (lease API / bare) = {:.2}",
            rate(&api_run) / rate(&bare_run)
        );
    });
}
