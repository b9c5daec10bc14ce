//! Issue 53, done when: the leader SIGKILLed while crawlers work through
//! every replica. Three replicas, every one serving (the default), six local
//! proxies with `--max-leases-per-proxy 2`, a site counting each proxy's
//! connections (support::site); 8 crawlers through the gateway's Service
//! (4 plain GETs, 4 tunnels held 200–500 ms) and 8 through the lease
//! API's Service (acquire, a tunnel through the leased proxy held 300 ms,
//! release; a `503` asked again after its `Retry-After`, as the Python
//! client does), for 30 s, the leader SIGKILLed at 10 s:
//! - at no moment does the site see a proxy carry more connections than
//!   its capacity (2), across the replicas and through the kill;
//! - no attempt on a replica that lives (the survivors, and the killed one
//!   before its kill) fails: no broken connection, no refusal but the API's
//!   `503 no_capacity` (asked again) and a release of a lease the killed
//!   replica granted answered `503 unavailable` until the leader adopts it;
//! - a crawler request whose connection was on the killed replica fails
//!   there at most once, and is served once it reconnects;
//! - no answer says `not_leader`, no survivor's gateway says
//!   `unavailable`, and the Services always had a ready replica;
//! - a survivor leads (`egress_proxies_leader` 1) within the lease
//!   duration and a margin of 1.5 s (the retry period 0.4 s, the winner's
//!   Lease update and the look).

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::{Duration, Instant};

use serde_json::json;
use support::crawlers::{Call, Crawlers, Landed, Outcome};
use support::replicas::{LEASE_DURATION, Port, ReplicaBed};
use support::site::Site;

const PROXIES: usize = 6;
const CAPACITY: usize = 2;
const RUN: Duration = Duration::from_secs(30);
const KILL_AT: Duration = Duration::from_secs(10);
/// A survivor leads within the lease duration and this.
const NEW_LEADER_MARGIN: Duration = Duration::from_millis(1_500);
const WAIT: Duration = Duration::from_secs(60);

#[actix_rt::test]
async fn the_leader_killed_while_crawlers_work_through_every_replica() {
    let _one = support::exclusive::replicas_lock();
    let bed = ReplicaBed::builder(3)
        .args([
            "--max-leases-per-proxy".to_owned(),
            CAPACITY.to_string(),
            // Each release leaves no rest for the site: the crawlers come back at once.
            "--lease-cooldown".to_owned(),
            "0s".to_owned(),
        ])
        .start()
        .await;
    bed.wait_leader().await;
    let target = support::process::health_target();
    let names: Vec<String> = (0..PROXIES).map(|i| format!("p{i}")).collect();
    bed.apply_proxies(names.iter().map(|name| {
        (
            name.clone(),
            json!({"mode": "Managed", "provider": "local", "healthCheck": {"url": target, "interval": "1s"}}),
        )
    }))
    .await;
    let all: Vec<&str> = names.iter().map(String::as_str).collect();
    bed.wait_phase(&all, "Ready").await;

    // Every replica serves: all three ready, and both Services see them so.
    support::crawlers::wait_every_replica_ready(&bed).await;
    let gateway = bed.service(Port::Gateway).await;
    let api = bed.service(Port::Discovery).await;
    support::crawlers::wait_service_sees_all(&gateway, &bed).await;
    support::crawlers::wait_service_sees_all(&api, &bed).await;

    let site = Site::start().await;
    let ms = Duration::from_millis;
    let mut crawlers = Crawlers::new();
    crawlers.gets(4, gateway.addr(), site.addr, (ms(20), ms(60)));
    crawlers.tunnels(
        4,
        gateway.addr(),
        site.addr,
        (ms(200), ms(500)),
        (ms(100), ms(200)),
    );
    crawlers.leasers(
        8,
        api.addr(),
        &site.addr.ip().to_string(),
        site.addr,
        ms(300),
        (ms(200), ms(300)),
    );
    let started = Instant::now();
    tokio::time::sleep(KILL_AT).await;
    let leader = bed.leader().await.expect("a leader");
    let survivors: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
    let before_kill_gateway = gateway.accepted_per_backend();
    let before_kill_api = api.accepted_per_backend();

    let killed_at = Instant::now();
    bed.kill(leader).await;
    // A survivor leads: seen between a look's sending and its answer.
    let (new_leader, earliest, took) = support::eventually_explained(
        "a survivor leading (egress_proxies_leader 1)",
        WAIT,
        || bed.logs(),
        async || {
            let sent = killed_at.elapsed();
            for &i in &survivors {
                if bed.metric(i, "egress_proxies_leader", "").await == Some(1.0) {
                    return Ok((i, sent, killed_at.elapsed()));
                }
            }
            Err("no survivor leads yet")
        },
    )
    .await;
    let run_left = RUN.saturating_sub(started.elapsed());
    tokio::time::sleep(run_left).await;
    let (attempts, requests) = crawlers.stop().await;

    // Judge every attempt by where its connection went.
    let services = [&gateway, &api];
    let granted_by_killed: BTreeSet<String> = attempts
        .iter()
        .filter(|a| a.call == Call::Acquire && a.outcome == Outcome::Served)
        .filter(|a| matches!(a.landed(&services), Landed::Replica(i, _) if i == leader))
        .filter_map(|a| a.lease.clone())
        .collect();
    let mut on_live_failed = Vec::new();
    let mut cut_by_kill: BTreeMap<(usize, u64), usize> = BTreeMap::new();
    let mut routed_to_dead = 0;
    let mut no_replica = Vec::new();
    let mut not_leader = Vec::new();
    let mut unavailable_on_survivors = Vec::new();
    let mut no_capacity_asked_again = 0;
    let mut release_waits = 0;
    for a in &attempts {
        if a.outcome.code() == Some("not_leader") {
            not_leader.push(a.clone());
        }
        if a.outcome == Outcome::Served {
            continue;
        }
        let place = a.landed(&services);
        if a.call == Call::Use {
            // The leased proxy lives: using it never fails.
            on_live_failed.push((a.clone(), place));
            continue;
        }
        match place {
            Landed::NoReplica => no_replica.push(a.clone()),
            Landed::Replica(i, accepted) if i == leader && a.ended >= killed_at => {
                if accepted < killed_at {
                    *cut_by_kill.entry((a.client, a.request)).or_default() += 1;
                } else {
                    // The Service's readiness look had not yet seen it dead.
                    routed_to_dead += 1;
                }
            }
            Landed::Replica(i, _) => {
                let allowed = match (&a.call, &a.outcome) {
                    // No proxy free right now: asked again after a backoff.
                    (
                        Call::Acquire,
                        Outcome::Refused {
                            status: 503,
                            code: Some(code),
                            ..
                        },
                    ) if code == "no_capacity" => {
                        no_capacity_asked_again += 1;
                        true
                    }
                    (
                        Call::Release,
                        Outcome::Refused {
                            status: 503,
                            code: Some(code),
                            retry_after: Some(_),
                        },
                    ) if code == "unavailable"
                        && a.started >= killed_at
                        && a.lease.as_ref().is_some_and(|l| granted_by_killed.contains(l)) =>
                    {
                        release_waits += 1;
                        true
                    }
                    _ => false,
                };
                if a.call != Call::Acquire
                    && a.call != Call::Release
                    && a.outcome.code() == Some("unavailable")
                    && i != leader
                {
                    unavailable_on_survivors.push(a.clone());
                }
                if !allowed {
                    on_live_failed.push((a.clone(), place));
                }
            }
            Landed::Unknown => on_live_failed.push((a.clone(), place)),
        }
    }
    let failed_twice: Vec<_> = cut_by_kill.iter().filter(|(_, n)| **n > 1).collect();
    let unserved: Vec<_> = requests.iter().filter(|r| !r.served && !r.abandoned).collect();
    let served = |call: Call, after: Option<Instant>| {
        attempts
            .iter()
            .filter(|a| a.call == call && a.outcome == Outcome::Served)
            .filter(|a| after.is_none_or(|t| a.started >= t))
            .count()
    };
    let most = site.log.most_open_by_source();
    eprintln!(
        "failover: leader replica-{leader} SIGKILLed at {KILL_AT:?}; replica-{new_leader} leads {took:?} after \
         (look sent at {earliest:?}; bound {:?}); served GETs {} ({} after the kill), tunnels {} ({}), leases {} ({}); \
         attempts {}, crawler requests {}; cut by the kill {} (requests {}), routed to the dead replica {routed_to_dead}, \
         acquires answered no_capacity and asked again {no_capacity_asked_again}, releases waiting for adoption \
         {release_waits}; most connections at once per proxy {most:?}; Service connections per replica before the \
         kill: gateway {before_kill_gateway:?} api {before_kill_api:?}, in all: gateway {:?} api {:?}",
        LEASE_DURATION + NEW_LEADER_MARGIN,
        served(Call::Get, None),
        served(Call::Get, Some(killed_at)),
        served(Call::Tunnel, None),
        served(Call::Tunnel, Some(killed_at)),
        served(Call::Acquire, None),
        served(Call::Acquire, Some(killed_at)),
        attempts.len(),
        requests.len(),
        cut_by_kill.values().sum::<usize>(),
        cut_by_kill.len(),
        gateway.accepted_per_backend(),
        api.accepted_per_backend(),
    );

    // Capacity holds across the replicas and through the kill.
    let network = bed.proxy_network();
    let prefix = network.rsplit_once('.').unwrap().0;
    assert!(
        most.keys().all(|ip: &IpAddr| ip.to_string().starts_with(prefix)),
        "only proxies (in {network}) reach the site: {most:?}"
    );
    assert!(
        most.values().all(|n| *n <= CAPACITY),
        "a proxy carried more than {CAPACITY} connections at once: {most:?}"
    );
    // The crawlers went to every replica before the kill, and were served after it.
    for (what, before) in [("gateway", &before_kill_gateway), ("lease API", &before_kill_api)] {
        for i in 0..3 {
            assert!(
                before.get(&Some(i)).copied().unwrap_or(0) > 0,
                "the {what} Service sent crawlers to replica-{i} before the kill: {before:?}"
            );
        }
    }
    for call in [Call::Get, Call::Tunnel, Call::Acquire] {
        assert!(
            served(call, Some(killed_at + LEASE_DURATION + NEW_LEADER_MARGIN)) > 0,
            "{call:?} served after the takeover"
        );
    }
    assert!(
        not_leader.is_empty(),
        "{} answers said not_leader: {:?}",
        not_leader.len(),
        &not_leader[..not_leader.len().min(10)]
    );
    assert!(
        unavailable_on_survivors.is_empty(),
        "a survivor's gateway answered unavailable {} times: {:?}",
        unavailable_on_survivors.len(),
        &unavailable_on_survivors[..unavailable_on_survivors.len().min(10)]
    );
    assert!(
        no_replica.is_empty(),
        "{} attempts found no ready replica behind the Service: {:?}",
        no_replica.len(),
        &no_replica[..no_replica.len().min(10)]
    );
    assert!(
        on_live_failed.is_empty(),
        "{} attempts failed on a replica that lived (or through a leased proxy): {:?}; the first: {:?}",
        on_live_failed.len(),
        support::crawlers::tally(on_live_failed.iter().map(|(a, place)| (a, *place))),
        &on_live_failed[..on_live_failed.len().min(10)]
    );
    assert!(
        failed_twice.is_empty(),
        "crawler requests failing more than once on the killed replica: {failed_twice:?}"
    );
    assert!(
        unserved.is_empty(),
        "{} crawler requests never served (within {:?} of asking again): {:?}",
        unserved.len(),
        support::crawlers::RETRY_BUDGET,
        &unserved[..unserved.len().min(10)]
    );
    assert!(
        took <= LEASE_DURATION + NEW_LEADER_MARGIN,
        "replica-{new_leader} led {took:?} after the kill (bound {:?})",
        LEASE_DURATION + NEW_LEADER_MARGIN
    );
}
