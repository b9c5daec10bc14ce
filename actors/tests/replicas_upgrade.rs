//! The upgrade from a release where only the leader served
//! (docs/kubernetes.md, "Upgrading from a release where only the leader
//! served"): two replicas with `--every-replica-serves=false`, one proxy of
//! capacity 1 leased through the leader's API, the lease checkpointed in
//! `egress-proxies-leases-00` … `-15`; every replica stopped and started
//! again without the flag (every replica serves, the default):
//! - both replicas turn ready and serve;
//! - the lease is not lost and not granted twice: while it is held, an
//!   acquire on either replica is refused for want of capacity;
//! - it is released through the replica that does not lead (the leader
//!   adopted the old checkpoint and answers for it), after which the
//!   replica whose share holds the slot grants it;
//! - the old checkpoint's ConfigMaps are gone once adopted.

mod support;

use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams};
use serde_json::{Value, json};
use support::replicas::{NAMESPACE, ReplicaBed};

const WAIT: Duration = Duration::from_secs(60);
const LEADER_ONLY: &str = "--every-replica-serves=false";

/// The leader-only checkpoint's shards: `egress-proxies-leases-NN`.
fn is_old_checkpoint(name: &str) -> bool {
    name.strip_prefix("egress-proxies-leases-")
        .is_some_and(|n| n.len() == 2 && n.bytes().all(|b| b.is_ascii_digit()))
}

async fn old_checkpoint(bed: &ReplicaBed) -> Result<Vec<ConfigMap>, String> {
    let maps: Api<ConfigMap> = Api::namespaced(bed.client.clone(), NAMESPACE);
    let all = maps
        .list(&ListParams::default())
        .await
        .map_err(|e| e.to_string())?;
    Ok(all
        .items
        .into_iter()
        .filter(|m| m.metadata.name.as_deref().is_some_and(is_old_checkpoint))
        .collect())
}

async fn acquire(bed: &ReplicaBed, i: usize, target: &str) -> Result<(u16, Value), String> {
    let answer = reqwest::Client::new()
        .post(format!("http://{}/v1/leases", bed.addrs(i).discovery))
        .json(&json!({"target": target, "ttlSeconds": 600}))
        .send()
        .await
        .map_err(|e| e.to_string())?;
    let status = answer.status().as_u16();
    Ok((status, answer.json().await.unwrap_or_default()))
}

#[actix_rt::test]
async fn leases_of_a_leader_only_release_survive_the_upgrade_to_every_replica_serving() {
    let _one = support::exclusive::replicas_lock();
    let mut bed = ReplicaBed::builder(2)
        .leader_only()
        .args(["--lease-cooldown", "0s", "--max-leases-per-proxy", "1"])
        .start()
        .await;
    let target = support::process::health_target();
    bed.apply_proxy(
        "p0",
        json!({"mode": "Managed", "provider": "local", "healthCheck": {"url": target, "interval": "1s"}}),
    )
    .await;
    bed.wait_phase(&["p0"], "Ready").await;
    let old_leader = bed.wait_leader().await;
    let lease = support::eventually_explained(
        "a lease from the leader-only leader",
        WAIT,
        || bed.logs(),
        async || match acquire(&bed, old_leader, "before.test").await? {
            (201, body) => Ok(body),
            (status, body) => Err(format!("{status} {body}")),
        },
    )
    .await;
    let id = lease["id"].as_str().expect("a lease id").to_owned();
    support::eventually_explained(
        "the lease in the leader-only checkpoint",
        WAIT,
        || bed.logs(),
        async || {
            let maps = old_checkpoint(&bed).await?;
            maps.iter()
                .any(|m| m.data.iter().flatten().any(|(_, v)| v.contains(&id)))
                .then_some(())
                .ok_or(format!("{} shards, none holds {id}", maps.len()))
        },
    )
    .await;

    // The rollout: every pod replaced at once, the flag gone.
    for i in 0..2 {
        bed.kill(i).await;
    }
    bed.forget_arg(LEADER_ONLY);
    for i in 0..2 {
        bed.restart(i).await;
    }
    support::crawlers::wait_every_replica_ready(&bed).await;
    let leader = bed.wait_leader().await;
    let follower = 1 - leader;

    // The adopted lease holds the proxy's one slot on both replicas.
    for i in [leader, follower] {
        let (status, body) = acquire(&bed, i, "during.test").await.unwrap();
        assert!(
            status == 503 && body["error"] == "no_capacity",
            "replica {i} must refuse while the old lease is held: {status} {body}"
        );
    }

    // Released through the replica that does not lead.
    let released = support::eventually_explained(
        "the old lease released through the follower",
        WAIT,
        || bed.logs(),
        async || {
            let answer = reqwest::Client::new()
                .delete(format!("http://{}/v1/leases/{id}", bed.addrs(follower).discovery))
                .send()
                .await
                .map_err(|e| e.to_string())?;
            let status = answer.status().as_u16();
            // 503: the leader has not adopted the old checkpoint yet.
            (status != 503)
                .then_some(status)
                .ok_or(format!("{status} {}", answer.text().await.unwrap_or_default()))
        },
    )
    .await;
    assert!(
        released == 200 || released == 204,
        "the old lease is known after the upgrade: {released}"
    );
    // The slot is free again: the replica whose share holds it grants it.
    support::eventually_explained(
        "an acquire once the old lease is released",
        WAIT,
        || bed.logs(),
        async || {
            let mut seen = Vec::new();
            for i in [leader, follower] {
                match acquire(&bed, i, "after.test").await? {
                    (201, _) => return Ok(()),
                    (status, body) => seen.push(format!(
                        "replica {i}: {status} {body}; its replicas view: {}",
                        bed.dashboard(i)
                            .await
                            .map(|d| d["replicas"].to_string())
                            .unwrap_or_default()
                    )),
                }
            }
            Err(seen.join("; "))
        },
    )
    .await;
    support::eventually_explained(
        "the old checkpoint gone once adopted",
        WAIT,
        || bed.logs(),
        async || {
            let left = old_checkpoint(&bed).await?;
            left.is_empty()
                .then_some(())
                .ok_or(format!("{} shards left", left.len()))
        },
    )
    .await;
}
