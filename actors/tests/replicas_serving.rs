//! Every replica serves (the default with `--leader-elect`): three replicas as
//! processes, each ready once it holds a capacity share; leases through
//! each one's own discovery API and fetches through each one's gateway;
//! together they never put more leases on a proxy than its capacity.

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::json;
use support::replicas::ReplicaBed;
use support::site::Site;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const WAIT: Duration = Duration::from_secs(60);

async fn fetch(gateway: SocketAddr, site: SocketAddr) -> Result<String, String> {
    let mut s = TcpStream::connect(gateway).await.map_err(|e| e.to_string())?;
    let head = format!("GET http://{site}/page HTTP/1.1\r\nHost: {site}\r\nConnection: close\r\n\r\n");
    s.write_all(head.as_bytes()).await.map_err(|e| e.to_string())?;
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut answer))
        .await
        .map_err(|_| "no answer in 10 s".to_owned())?
        .map_err(|e| e.to_string())?;
    Ok(String::from_utf8_lossy(&answer).to_ascii_lowercase())
}

fn serving_bed(n: usize, args: &'static [&'static str]) -> support::replicas::ReplicaBedBuilder {
    ReplicaBed::builder(n).args(args)
}

#[actix_rt::test]
async fn every_replica_serves_leases_and_the_gateway_within_the_capacity() {
    let _one = support::exclusive::replicas_lock();
    let bed = serving_bed(3, &["--lease-cooldown", "0s", "--max-leases-per-proxy", "2"])
        .start()
        .await;
    let target = support::process::health_target();
    for name in ["p0", "p1", "p2"] {
        bed.apply_proxy(
            name,
            json!({"mode": "Managed", "provider": "local", "healthCheck": {"url": target, "interval": "1s"}}),
        )
        .await;
    }
    bed.wait_phase(&["p0", "p1", "p2"], "Ready").await;
    // Each ready once it holds a share.
    support::crawlers::wait_every_replica_ready(&bed).await;
    let site = Site::start().await;
    for i in 0..3 {
        let answer = support::eventually_explained(
            &format!("a fetch through replica {i}'s gateway"),
            WAIT,
            || bed.logs(),
            async || {
                let answer = fetch(bed.addrs(i).gateway, site.addr).await?;
                answer
                    .starts_with("http/1.1 200")
                    .then_some(answer.clone())
                    .ok_or(answer)
            },
        )
        .await;
        assert!(answer.ends_with("ok"), "{answer}");
    }
    // Refusals while the shares came in (the fetches above, retried) are
    // wants, and lent a replica the others' idle slots for a while: wait
    // for the even split (2 slots each) before leasing through each.
    bed.wait_share_slots(2.0, "the even split: two slots in each replica's share")
        .await;
    // Leases through every replica's API: 3 proxies × 2 = 6 at most in all.
    let http = reqwest::Client::new();
    let mut held = Vec::new();
    for round in 0..4 {
        for i in 0..3 {
            let url = format!("http://{}/v1/leases", bed.addrs(i).discovery);
            let answer = http
                .post(&url)
                .json(&json!({"target": format!("t{round}-{i}.test"), "ttlSeconds": 60}))
                .send()
                .await
                .unwrap();
            let status = answer.status().as_u16();
            let body: serde_json::Value = answer.json().await.unwrap_or_default();
            match status {
                201 | 200 => held.push((i, body["id"].as_str().unwrap_or_default().to_owned(), body)),
                _ => assert!(
                    body["error"] == "no_capacity",
                    "replica {i} refused for another reason than capacity: {status} {body}"
                ),
            }
        }
    }
    let mut per_proxy = std::collections::BTreeMap::<String, u32>::new();
    for (_, _, body) in &held {
        *per_proxy
            .entry(body["proxy"]["name"].as_str().unwrap_or_default().to_owned())
            .or_default() += 1;
    }
    assert!(
        per_proxy.values().all(|n| *n <= 2),
        "over capacity: {per_proxy:?}"
    );
    assert!(held.len() >= 3, "every replica leased some: {held:?}");
    let served_by: std::collections::BTreeSet<usize> = held.iter().map(|(i, _, _)| *i).collect();
    assert_eq!(served_by.len(), 3, "each replica granted leases: {held:?}");
}

/// A lease is served by the replica that granted it, whichever replica the
/// client reaches; when that replica dies, the leader adopts its journal
/// and serves its leases, and its ConfigMaps and member Lease go.
#[actix_rt::test]
async fn a_lease_follows_its_granter_and_outlives_it() {
    use k8s_openapi::api::coordination::v1::Lease as KubeLease;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::{Api, ListParams};

    let bed = serving_bed(3, &["--lease-cooldown", "0s", "--max-leases-per-proxy", "3"])
        .start()
        .await;
    let target = support::process::health_target();
    bed.apply_proxy(
        "p0",
        json!({"mode": "Managed", "provider": "local", "healthCheck": {"url": target, "interval": "1s"}}),
    )
    .await;
    bed.wait_phase(&["p0"], "Ready").await;
    let leader = bed.wait_leader().await;
    let (granter, other) = match leader {
        0 => (1, 2),
        1 => (2, 0),
        _ => (0, 1),
    };
    let http = reqwest::Client::new();
    let api = |i: usize, path: &str| format!("http://{}{path}", bed.addrs(i).discovery);
    let lease: serde_json::Value = support::eventually_explained(
        "a lease from a follower",
        WAIT,
        || bed.logs(),
        async || {
            let answer = http
                .post(api(granter, "/v1/leases"))
                .json(&json!({"target": "follow.test", "ttlSeconds": 120}))
                .send()
                .await
                .map_err(|e| e.to_string())?;
            let status = answer.status().as_u16();
            let body: serde_json::Value = answer.json().await.map_err(|e| e.to_string())?;
            (status == 201)
                .then_some(body.clone())
                .ok_or(format!("{status} {body}"))
        },
    )
    .await;
    let id = lease["id"].as_str().unwrap().to_owned();

    // Renewed and reported through another replica: forwarded to the granter.
    let renewed = http
        .post(api(other, &format!("/v1/leases/{id}/renew")))
        .json(&json!({"ttlSeconds": 90}))
        .send()
        .await
        .unwrap();
    assert_eq!(renewed.status(), 200, "{:?}", renewed.text().await);
    let reported = http
        .post(api(leader, &format!("/v1/leases/{id}/report")))
        .json(&json!({"outcome": "ok"}))
        .send()
        .await
        .unwrap();
    assert_eq!(reported.status(), 204, "{:?}", reported.text().await);
    let unknown = http
        .post(api(
            other,
            "/v1/leases/ffffffff-0000-4000-8000-000000000000/renew",
        ))
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(
        unknown.status(),
        404,
        "an id nobody granted is unknown everywhere"
    );

    // The granter dies: its lease is the leader's once adopted.
    let tag = &id[..8];
    let journals: Api<ConfigMap> = Api::namespaced(bed.client.clone(), support::replicas::NAMESPACE);
    let selector = format!("crawl.example.com/lease-journal={tag}");
    assert!(
        !journals
            .list(&ListParams::default().labels(&selector))
            .await
            .unwrap()
            .items
            .is_empty(),
        "the granter journals its lease in its own ConfigMaps"
    );
    let killed = std::time::Instant::now();
    bed.kill(granter).await;
    let renewed = support::eventually_explained(
        "the dead granter's lease renewed through the leader",
        WAIT,
        || bed.logs(),
        async || {
            let answer = http
                .post(api(other, &format!("/v1/leases/{id}/renew")))
                .json(&json!({}))
                .send()
                .await
                .map_err(|e| e.to_string())?;
            let status = answer.status().as_u16();
            let retry = answer.headers().get("retry-after").is_some();
            let body = answer.text().await.unwrap_or_default();
            match status {
                200 => Ok(()),
                503 if retry => Err(format!("503 (waiting for the adoption): {body}")),
                _ => panic!("the dead granter's lease answered {status}: {body}"),
            }
        },
    )
    .await;
    let _: () = renewed;
    let took = killed.elapsed();
    println!("the dead granter's lease was served again {took:?} after the kill");
    assert!(
        took < support::replicas::LEASE_DURATION * 3,
        "adopted within the lease duration and a margin: {took:?}"
    );
    assert!(
        journals
            .list(&ListParams::default().labels(&selector))
            .await
            .unwrap()
            .items
            .is_empty(),
        "the adopted journal's ConfigMaps are gone"
    );
    let members: Api<KubeLease> = Api::namespaced(bed.client.clone(), support::replicas::NAMESPACE);
    assert!(
        members
            .get_opt(&format!("egress-proxies-member-{tag}"))
            .await
            .unwrap()
            .is_none(),
        "the dead member's Lease is gone"
    );
    let released = http
        .delete(api(other, &format!("/v1/leases/{id}")))
        .send()
        .await
        .unwrap();
    assert_eq!(released.status(), 204);
}

/// A replica refused for want of capacity is lent the idle slot of another
/// (docs/kubernetes.md, "What changes"): two replicas, two proxies of
/// capacity 1, one slot each; two leases through one replica — the second
/// refused at first, then granted once the leader has moved the other
/// replica's idle slot, which then refuses: never more than the capacity.
#[actix_rt::test]
async fn a_replica_that_wants_more_is_lent_another_s_idle_slot() {
    let _one = support::exclusive::replicas_lock();
    let bed = serving_bed(2, &["--lease-cooldown", "0s", "--max-leases-per-proxy", "1"])
        .start()
        .await;
    let target = support::process::health_target();
    for name in ["p0", "p1"] {
        bed.apply_proxy(
            name,
            json!({"mode": "Managed", "provider": "local", "healthCheck": {"url": target, "interval": "1s"}}),
        )
        .await;
    }
    bed.wait_phase(&["p0", "p1"], "Ready").await;
    support::crawlers::wait_every_replica_ready(&bed).await;
    let http = reqwest::Client::new();
    let acquire = async |i: usize, target: &str| -> (u16, serde_json::Value) {
        let answer = http
            .post(format!("http://{}/v1/leases", bed.addrs(i).discovery))
            .json(&json!({"target": target, "ttlSeconds": 120}))
            .send()
            .await
            .unwrap();
        let status = answer.status().as_u16();
        (status, answer.json().await.unwrap_or_default())
    };
    // Each replica holds one proxy's slot once the leader knows both
    // proxies (nothing asked before: no replica wants more).
    let slots_of = async |i: usize| {
        let view = bed.dashboard(i).await.unwrap_or_default();
        view["replicas"]["share"]["slots"].as_u64()
    };
    support::eventually_explained(
        "one slot in each replica's share",
        WAIT,
        || bed.logs(),
        async || {
            let held = (slots_of(0).await, slots_of(1).await);
            (held == (Some(1), Some(1)))
                .then_some(())
                .ok_or(format!("{held:?}"))
        },
    )
    .await;
    let (status, first) = acquire(0, "first.test").await;
    assert_eq!(status, 201, "replica 0 has a slot: {first}");
    let asked = std::time::Instant::now();
    let mut refusals = 0;
    let second = support::eventually_explained(
        "a second lease through replica 0, lent replica 1's idle slot",
        Duration::from_secs(5),
        || bed.logs(),
        async || match acquire(0, "second.test").await {
            (201, body) => Ok(body),
            (503, body) if body["error"] == "no_capacity" => {
                refusals += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
                Err(format!("503 {body}"))
            }
            (status, body) => panic!("refused for another reason than capacity: {status} {body}"),
        },
    )
    .await;
    println!("lent after {:?} ({refusals} refusals before)", asked.elapsed());

    assert_ne!(
        first["proxy"]["name"], second["proxy"]["name"],
        "one lease on each proxy"
    );
    let (status, body) = acquire(1, "third.test").await;
    assert!(
        status == 503 && body["error"] == "no_capacity",
        "both slots are replica 0's now: replica 1 must refuse ({status} {body})"
    );
    // Its dashboard (refreshed every second or so) says so too.
    support::eventually_explained(
        "replica 0's dashboard showing both slots",
        WAIT,
        || bed.logs(),
        async || {
            let view = bed.dashboard(0).await.unwrap_or_default();
            (view["replicas"]["share"]["slots"] == 2)
                .then_some(())
                .ok_or(view["replicas"].to_string())
        },
    )
    .await;
}

/// One GET of `site` through the gateway at `gateway` as `username` with
/// `token`: the proxy that carried it (`egress-gateway-proxy`).
async fn fetch_as(
    gateway: SocketAddr,
    site: SocketAddr,
    username: &str,
    token: &str,
) -> Result<String, String> {
    use base64::Engine;
    let credentials = base64::engine::general_purpose::STANDARD.encode(format!("{username}:{token}"));
    let mut s = TcpStream::connect(gateway).await.map_err(|e| e.to_string())?;
    let head = format!(
        "GET http://{site}/page HTTP/1.1\r\nHost: {site}\r\nProxy-Authorization: Basic {credentials}\r\nConnection: close\r\n\r\n"
    );
    s.write_all(head.as_bytes()).await.map_err(|e| e.to_string())?;
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut answer))
        .await
        .map_err(|_| "no answer in 10 s".to_owned())?
        .map_err(|e| e.to_string())?;
    let answer = String::from_utf8_lossy(&answer).to_ascii_lowercase();
    if !answer.starts_with("http/1.1 200") {
        return Err(answer);
    }
    answer
        .lines()
        .find_map(|l| l.strip_prefix("egress-gateway-proxy: "))
        .map(|p| p.trim().to_owned())
        .ok_or(answer.clone())
}

/// A sticky session leaves through one proxy whichever replica it reaches
/// (the proxy is chosen by the session's name, by rendezvous, on every
/// replica alike): three replicas, four proxies of capacity 3 (a slot of
/// each on every replica), ten sessions each asked through every replica.
#[actix_rt::test]
async fn a_sticky_session_keeps_its_proxy_whichever_replica_it_reaches() {
    let _one = support::exclusive::replicas_lock();
    const TOKEN: &str = "sticky-sessions-token";
    let bed = serving_bed(3, &["--max-leases-per-proxy", "3"])
        .env("DISCOVERY_TOKEN", TOKEN)
        .start()
        .await;
    let target = support::process::health_target();
    let names = ["p0", "p1", "p2", "p3"];
    for name in names {
        bed.apply_proxy(
            name,
            json!({"mode": "Managed", "provider": "local", "healthCheck": {"url": target, "interval": "1s"}}),
        )
        .await;
    }
    bed.wait_phase(&names, "Ready").await;
    support::crawlers::wait_every_replica_ready(&bed).await;
    // Every replica holds a slot of every proxy before sessions start.
    // (The dashboard wants the token; the metrics are open.)
    bed.wait_share_slots(4.0, "four slots in each replica's share")
        .await;
    let site = Site::start().await;
    let mut proxies_used = std::collections::BTreeSet::new();
    for s in 0..10 {
        let username = format!("crawler-session-s{s}");
        let mut seen = Vec::new();
        for i in 0..3 {
            let proxy = fetch_as(bed.addrs(i).gateway, site.addr, &username, TOKEN)
                .await
                .unwrap_or_else(|e| panic!("session s{s} through replica {i}: {e}"));
            seen.push(proxy);
        }
        assert!(
            seen.iter().all(|p| *p == seen[0]),
            "session s{s} left through {seen:?}"
        );
        proxies_used.insert(seen[0].clone());
    }
    assert!(
        proxies_used.len() >= 2,
        "ten sessions spread over the proxies: {proxies_used:?}"
    );
}
