//! Issue 53, done when: a block learnt on one replica stops the others
//! from handing out that (proxy, site) within the bound stated (1 s while
//! both reach the leader). Three replicas, every one serving (the default),
//! three local proxies with `--max-leases-per-proxy 3` (each replica holds
//! a slot of each), the gateway taking a `403` for a block; a site on an
//! address of its own (a target of its own, as `blocked.test` would be)
//! answering `403` to one proxy P's address:
//! - before the block each replica hands P out (the test could fail);
//! - crawlers go through replica A's gateway until A's dashboard lists P
//!   blocked (`blockedTargets`, the distinct sites that reported it
//!   blocked: neither `GET /v1/proxies` nor the dashboard names the site);
//!   t_b is the instant the site sent P its first `403`, the earliest A
//!   can have learnt it;
//! - B and C list P blocked within 1 s of t_b (the delay is printed);
//! - from t_b + 1 s, crawlers hammer B and C directly for the site (plain
//!   GETs through their gateways, and leases through their APIs used
//!   through the leased proxy): no request from P's address for the site
//!   reaches it later than t_b + 1 s, and no lease for it names P.

mod support;

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use serde_json::json;
use support::crawlers::{Call, Crawlers, Outcome, dashboard_row, gateway_get};
use support::replicas::ReplicaBed;
use support::site::{Site, SiteOptions};

const PROXIES: usize = 3;
/// The stated bound: a block learnt on one replica stops the others within it.
const BOUND: Duration = Duration::from_secs(1);
const HAMMER_FOR: Duration = Duration::from_secs(3);
const WAIT: Duration = Duration::from_secs(60);

/// Whether `row` (a dashboard proxy row) counts a site that reported it blocked.
fn lists_blocked(row: &Option<serde_json::Value>) -> bool {
    row.as_ref()
        .and_then(|r| r["blockedTargets"].as_u64())
        .is_some_and(|n| n >= 1)
}

/// Plain GETs of `site` through `gateway`, one at a time, until each of
/// `names` has served one (a replica just ready may hold a share of some
/// proxies only), for 30 s at most: each proxy's source address at the site.
async fn proxies_seen(gateway: SocketAddr, site: &Site, names: &[String]) -> BTreeMap<String, IpAddr> {
    let mut seen = BTreeMap::new();
    let until = Instant::now() + Duration::from_secs(30);
    while Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let (_, outcome, proxy) = gateway_get(gateway, site.addr).await;
        if outcome != Outcome::Served {
            continue;
        }
        let (Some(proxy), Some(last)) = (proxy, site.log.requests().last().cloned()) else {
            continue;
        };
        let name = proxy.rsplit('/').next().unwrap_or_default().to_owned();
        seen.insert(name, last.source);
        if names.iter().all(|n| seen.contains_key(n)) {
            break;
        }
    }
    seen
}

#[actix_rt::test]
async fn a_block_learnt_on_one_replica_stops_the_others_within_a_second() {
    let _one = support::exclusive::replicas_lock();
    let bed = ReplicaBed::builder(3)
        .args(["--max-leases-per-proxy", "3", "--lease-cooldown", "0s"])
        .gateway("blocks: [{status: [403]}]")
        .start()
        .await;
    let leader = bed.wait_leader().await;
    let health = support::process::health_target();
    let names: Vec<String> = (0..PROXIES).map(|i| format!("p{i}")).collect();
    bed.apply_proxies(names.iter().map(|name| {
        (
            name.clone(),
            json!({"mode": "Managed", "provider": "local", "healthCheck": {"url": health, "interval": "1s"}}),
        )
    }))
    .await;
    let all: Vec<&str> = names.iter().map(String::as_str).collect();
    bed.wait_phase(&all, "Ready").await;
    support::crawlers::wait_every_replica_ready(&bed).await;

    // A is a member that does not lead; B the leader, C the other.
    let (a, b, c) = ((leader + 1) % 3, leader, (leader + 2) % 3);
    let [ra, rb, rc] = [a, b, c].map(|i| bed.addrs(i));

    // Before the block: every replica hands out every proxy (P included).
    let open_site = Site::start().await;
    let mut sources = BTreeMap::new();
    for (i, r) in [(a, ra), (b, rb), (c, rc)] {
        let seen = proxies_seen(r.gateway, &open_site, &names).await;
        assert_eq!(
            seen.len(),
            PROXIES,
            "replica-{i}'s gateway used every proxy before the block: {seen:?}"
        );
        sources.extend(seen);
    }
    let p = names[0].clone();
    let p_ip = sources[&p];

    // The site `blocked.test` stands for: its own loopback address, 403 to P.
    let [_, r, s, _] = ra.ip.octets();
    let site = Site::start_with(SiteOptions {
        keep_alive: false,
        ip: IpAddr::V4(Ipv4Addr::new(127, r, s, 250)),
    })
    .await;
    let host = site.addr.ip().to_string();
    site.log.block(p_ip, Some(&host));

    // Through A until A lists P blocked.
    let (t_b, a_lists) = support::eventually_explained(
        &format!("replica-{a} (A) to list {p} blocked"),
        WAIT,
        || bed.logs(),
        async || {
            let _ = gateway_get(ra.gateway, site.addr).await;
            let first_403 = site.log.requests().into_iter().find(|r| r.status == 403);
            let Some(first_403) = first_403 else {
                return Err("no 403 yet".to_owned());
            };
            let row = dashboard_row(ra.discovery, &p).await;
            if lists_blocked(&row) {
                Ok((first_403.at, first_403.at.elapsed()))
            } else {
                Err(format!("A's row for {p}: {row:?}"))
            }
        },
    )
    .await;
    let a_lag = a_lists;
    let refusals_through_a = site.log.requests().iter().filter(|r| r.status == 403).count();

    // B and C list it blocked: each seen between a look's sending and answer.
    let mut listed: BTreeMap<usize, (Duration, Duration)> = BTreeMap::new();
    let watch_until = t_b + BOUND + Duration::from_secs(4);
    while listed.len() < 2 && Instant::now() < watch_until {
        for (i, r) in [(b, rb), (c, rc)] {
            if listed.contains_key(&i) {
                continue;
            }
            let sent = t_b.elapsed();
            if lists_blocked(&dashboard_row(r.discovery, &p).await) {
                listed.insert(i, (sent, t_b.elapsed()));
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // From t_b + 1 s: crawlers hammer B and C for the site.
    tokio::time::sleep((t_b + BOUND).saturating_duration_since(Instant::now())).await;
    let hammer_from = Instant::now();
    let ms = Duration::from_millis;
    let mut crawlers = Crawlers::new();
    for r in [rb, rc] {
        crawlers.gets(4, r.gateway, site.addr, (ms(5), ms(20)));
        crawlers.leasers(2, r.discovery, &host, site.addr, ms(50), (ms(5), ms(20)));
    }
    tokio::time::sleep(HAMMER_FOR).await;
    let (attempts, _) = crawlers.stop().await;

    let from_p_late: Vec<Duration> = site
        .log
        .requests()
        .into_iter()
        .filter(|q| q.source == p_ip && q.at > t_b + BOUND)
        .map(|q| q.at - t_b)
        .collect();
    let p_name = format!("{}/{p}", support::replicas::NAMESPACE);
    let leased_p: Vec<Duration> = attempts
        .iter()
        .filter(|at| at.call == Call::Acquire && at.outcome == Outcome::Served)
        .filter(|at| at.proxy.as_deref() == Some(p_name.as_str()))
        .map(|at| at.ended - t_b)
        .collect();
    let served = |call: Call| {
        attempts
            .iter()
            .filter(|at| at.call == call && at.outcome == Outcome::Served)
            .count()
    };
    let site_requests_after = site.log.requests().iter().filter(|q| q.at >= hammer_from).count();
    eprintln!(
        "blocks: A replica-{a}, B replica-{b} (leader), C replica-{c}; {p} leaves from {p_ip}; first 403 at t_b, \
         A listed it blocked {a_lag:?} after t_b (the site refused P {refusals_through_a} times through A); B and C listed it (look sent, answered after t_b) {listed:?}; \
         hammering from t_b + {:?} for {HAMMER_FOR:?}: GETs served {}, leases {}, site requests {site_requests_after}; \
         requests from {p_ip} for the site after t_b + {BOUND:?}: {from_p_late:?}; leases naming {p} after t_b: \
         {leased_p:?}",
        hammer_from - t_b,
        served(Call::Get),
        served(Call::Acquire),
    );

    assert!(
        served(Call::Get) > 0 && served(Call::Acquire) > 0 && site_requests_after > 0,
        "B and C served the site while hammered"
    );
    for (i, name) in [(b, "B"), (c, "C")] {
        let seen = listed.get(&i);
        assert!(
            seen.is_some_and(|(_, answered)| *answered <= BOUND),
            "{name} (replica-{i}) lists {p} blocked within {BOUND:?} of t_b: {seen:?}"
        );
    }
    assert!(
        from_p_late.is_empty(),
        "{} requests from {p} ({p_ip}) for the blocked site later than t_b + {BOUND:?} (at, after t_b): {:?}",
        from_p_late.len(),
        &from_p_late[..from_p_late.len().min(10)]
    );
    assert!(
        leased_p.iter().all(|at| *at <= BOUND),
        "leases for the blocked site naming {p} after t_b + {BOUND:?}: {leased_p:?}"
    );
}
