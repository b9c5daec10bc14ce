//! Issue 53, done when: one replica cut off the API server for 20 s while
//! crawlers go to it directly and through the Services. Three replicas,
//! every one serving (the default),, six local proxies with
//! `--max-leases-per-proxy 2`, a site counting each proxy's connections;
//! crawlers through the Services (2 plain GETs, 2 tunnels, 4 leasing
//! through the API) and straight at the cut replica X (2 GETs, 2 tunnels,
//! 2 leasing), a `503` asked again after its `Retry-After`:
//! - X serves only until its share ends: nothing it serves ends later than
//!   the renew deadline (2 s at a 3 s lease duration) and a margin of
//!   0.5 s after the cut (a request already granted then);
//! - from then until the heal every answer of X's is `503` with
//!   `Retry-After` — the gateway's `egress-gateway-error: unavailable`,
//!   the lease API's `unavailable` — and its `/readyz` answers `503`;
//! - at no moment does the site see a proxy carry more connections than
//!   its capacity, across the replicas, through the cut and the heal;
//! - the two others serve on: no attempt the Services sent them fails;
//! - after the heal X exits with status 1 (it never exited while cut);
//!   restarted as a new member, it is ready and serves again.

mod support;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;
use support::crawlers::{
    ApiConnection, Attempt, Call, Crawlers, Landed, Outcome, acquire, gateway_get, release,
};
use support::replicas::{Port, ReplicaBed};
use support::site::Site;

const PROXIES: usize = 6;
const CAPACITY: usize = 2;
/// The renew deadline at the bed's 3 s lease duration.
const RENEW_DEADLINE: Duration = Duration::from_secs(2);
/// Past the renew deadline, for a request granted just before the share ended.
const MARGIN: Duration = Duration::from_millis(500);
const BEFORE_CUT: Duration = Duration::from_secs(5);
const CUT_FOR: Duration = Duration::from_secs(20);
const WAIT: Duration = Duration::from_secs(60);

/// One look at `/readyz`: sent, answered, the status (`None`: no answer in 1 s).
type ReadinessLook = (Instant, Instant, Option<u16>);

/// Looks at `/readyz` of `health` every 100 ms until `stop`.
fn watch_readiness(
    health: SocketAddr,
    stop: Arc<std::sync::atomic::AtomicBool>,
) -> Arc<Mutex<Vec<ReadinessLook>>> {
    let looks = Arc::new(Mutex::new(Vec::new()));
    let seen = looks.clone();
    actix_rt::spawn(async move {
        while !stop.load(std::sync::atomic::Ordering::SeqCst) {
            let sent = Instant::now();
            let look = support::http::try_request(health, "GET", "/readyz");
            let status = match tokio::time::timeout(Duration::from_secs(1), look).await {
                Ok(Ok(status)) => Some(status),
                _ => None,
            };
            seen.lock().unwrap().push((sent, Instant::now(), status));
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    looks
}

/// A refusal as a replica without a share answers: `503 unavailable` with `Retry-After`.
fn is_unavailable(outcome: &Outcome) -> bool {
    matches!(
        outcome,
        Outcome::Refused { status: 503, code: Some(code), retry_after: Some(_) } if code == "unavailable"
    )
}

#[actix_rt::test]
async fn a_replica_cut_off_the_api_server_serves_until_its_share_ends() {
    let _one = support::exclusive::replicas_lock();
    let mut bed = ReplicaBed::builder(3)
        .args([
            "--max-leases-per-proxy".to_owned(),
            CAPACITY.to_string(),
            "--lease-cooldown".to_owned(),
            "0s".to_owned(),
        ])
        .start()
        .await;
    let leader = bed.wait_leader().await;
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
    support::crawlers::wait_every_replica_ready(&bed).await;
    let gateway = bed.service(Port::Gateway).await;
    let api = bed.service(Port::Discovery).await;
    support::crawlers::wait_service_sees_all(&gateway, &bed).await;
    support::crawlers::wait_service_sees_all(&api, &bed).await;

    let cut_replica = (leader + 1) % 3;
    let x = bed.addrs(cut_replica);
    let site = Site::start().await;
    let host = site.addr.ip().to_string();
    let ms = Duration::from_millis;
    let mut crawlers = Crawlers::new();
    crawlers.gets(2, gateway.addr(), site.addr, (ms(20), ms(60)));
    crawlers.tunnels(
        2,
        gateway.addr(),
        site.addr,
        (ms(200), ms(500)),
        (ms(100), ms(200)),
    );
    crawlers.leasers(4, api.addr(), &host, site.addr, ms(300), (ms(200), ms(300)));
    crawlers.gets(2, x.gateway, site.addr, (ms(20), ms(60)));
    crawlers.tunnels(2, x.gateway, site.addr, (ms(200), ms(500)), (ms(100), ms(200)));
    crawlers.leasers(2, x.discovery, &host, site.addr, ms(300), (ms(200), ms(300)));
    let stop_watching = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let readiness = watch_readiness(x.health, stop_watching.clone());

    tokio::time::sleep(BEFORE_CUT).await;
    let cut_at = Instant::now();
    bed.cut(cut_replica);
    tokio::time::sleep(CUT_FOR).await;
    let exited_while_cut = bed.process(cut_replica).exited();
    let healed_at = Instant::now();
    bed.heal(cut_replica);
    let exit = support::eventually_explained(
        "the cut replica to exit after the heal",
        WAIT,
        || bed.logs(),
        async || bed.process(cut_replica).exited(),
    )
    .await;
    let exited_after = healed_at.elapsed();
    stop_watching.store(true, std::sync::atomic::Ordering::SeqCst);
    let (attempts, _) = crawlers.stop().await;

    // Which attempts X answered: straight at it, or sent to it by a Service.
    let services = [&gateway, &api];
    let on_x = |a: &Attempt| {
        a.via == x.gateway
            || a.via == x.discovery
            || matches!(a.landed(&services), Landed::Replica(i, _) if i == cut_replica)
    };
    let share_end = cut_at + RENEW_DEADLINE + MARGIN;
    let served_on_x: Vec<&Attempt> = attempts
        .iter()
        .filter(|a| a.call != Call::Use && on_x(a) && a.outcome == Outcome::Served)
        .collect();
    let last_served = served_on_x
        .iter()
        .filter(|a| a.ended >= cut_at && a.ended < healed_at)
        .map(|a| a.ended - cut_at)
        .max();
    let served_late: Vec<&&Attempt> = served_on_x
        .iter()
        .filter(|a| a.ended > share_end && a.started < healed_at)
        .collect();
    let answered_wrong: Vec<&Attempt> = attempts
        .iter()
        .filter(|a| a.call != Call::Use && on_x(a))
        .filter(|a| a.started >= share_end && a.ended <= healed_at)
        .filter(|a| !is_unavailable(&a.outcome))
        .collect();
    let refused_while_cut = attempts
        .iter()
        .filter(|a| on_x(a) && a.started >= share_end && a.ended <= healed_at)
        .count();
    let looks = readiness.lock().unwrap().clone();
    let unready_at = looks
        .iter()
        .find(|(sent, _, status)| *sent >= cut_at && *status == Some(503))
        .map(|(sent, _, _)| *sent - cut_at);
    let ready_wrong: Vec<_> = looks
        .iter()
        .filter(|(sent, answered, _)| *sent >= share_end && *answered <= healed_at)
        .filter(|(_, _, status)| *status != Some(503))
        .map(|(sent, _, status)| (*sent - cut_at, *status))
        .collect();
    let readiness_looks_cut = looks
        .iter()
        .filter(|(sent, answered, _)| *sent >= share_end && *answered <= healed_at)
        .count();
    // The two others, through the Services, the whole time X was up.
    let others_failed: Vec<&Attempt> = attempts
        .iter()
        .filter(|a| a.ended <= healed_at)
        .filter(|a| matches!(a.landed(&services), Landed::Replica(i, _) if i != cut_replica))
        .filter(|a| match (&a.call, &a.outcome) {
            (_, Outcome::Served) => false,
            (Call::Acquire, o) => o.code() != Some("no_capacity"),
            // A release of X's lease waits for X (cut) or its adoption.
            (Call::Release, o) => !is_unavailable(o),
            _ => true,
        })
        .collect();
    let most = site.log.most_open_by_source();

    // Restarted as a new member, it serves again.
    bed.restart(cut_replica).await;
    support::crawlers::wait_every_replica_ready(&bed).await;
    let (_, fetched, _) = gateway_get(x.gateway, site.addr).await;
    let mut conn = ApiConnection::connect(x.discovery).await.unwrap();
    let leased = acquire(&mut conn, &host, 10).await.unwrap();
    let released = match &leased {
        Ok(lease) => Some(release(&mut conn, &lease.id).await.unwrap()),
        Err(_) => None,
    };

    eprintln!(
        "partition: replica-{cut_replica} cut off for {CUT_FOR:?} (leader replica-{leader}); last served {last_served:?} \
         after the cut (bound {:?}), /readyz 503 from {unready_at:?}; {refused_while_cut} attempts on it and \
         {readiness_looks_cut} readiness looks between its share's end and the heal; exited {exit} {exited_after:?} \
         after the heal; most connections at once per proxy {most:?}; attempts {}, Service connections per \
         replica: gateway {:?} api {:?}; after the restart: fetch {fetched:?}, lease {:?}, release {released:?}",
        RENEW_DEADLINE + MARGIN,
        attempts.len(),
        gateway.accepted_per_backend(),
        api.accepted_per_backend(),
        leased.as_ref().map(|l| &l.proxy),
    );

    assert!(
        most.values().all(|n| *n <= CAPACITY),
        "a proxy carried more than {CAPACITY} connections at once: {most:?}"
    );
    assert!(
        served_on_x.iter().any(|a| a.ended < cut_at),
        "replica-{cut_replica} served before the cut"
    );
    assert!(
        served_late.is_empty(),
        "replica-{cut_replica} served {} requests later than {:?} after the cut: {:?}",
        served_late.len(),
        RENEW_DEADLINE + MARGIN,
        served_late
            .iter()
            .take(10)
            .map(|a| (a.call, a.ended - cut_at))
            .collect::<Vec<_>>()
    );
    assert!(
        refused_while_cut > 0 && readiness_looks_cut > 0,
        "crawlers and readiness looks reached replica-{cut_replica} while it was cut"
    );
    assert!(
        answered_wrong.is_empty(),
        "replica-{cut_replica} without a share answered other than 503 unavailable with Retry-After ({} times): {:?}",
        answered_wrong.len(),
        answered_wrong
            .iter()
            .take(10)
            .map(|a| (a.call, a.started - cut_at, &a.outcome))
            .collect::<Vec<_>>()
    );
    assert!(
        ready_wrong.is_empty(),
        "replica-{cut_replica}'s /readyz without a share (after the cut, status): {ready_wrong:?}"
    );
    assert_eq!(
        exited_while_cut, None,
        "replica-{cut_replica} exited while cut off"
    );
    assert_eq!(
        exit.code(),
        Some(1),
        "replica-{cut_replica} exits with status 1 once it reaches the API server again"
    );
    assert!(
        others_failed.is_empty(),
        "{} attempts failed on the replicas not cut off: {:?}",
        others_failed.len(),
        &others_failed[..others_failed.len().min(10)]
    );
    assert_eq!(
        fetched,
        Outcome::Served,
        "a fetch through the restarted replica's gateway"
    );
    assert!(leased.is_ok(), "a lease from the restarted replica: {leased:?}");
    assert_eq!(released, Some(Outcome::Served));
}
