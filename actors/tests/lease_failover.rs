//! Leases survive a leader change: two operator processes with leader
//! election against the fake API server; the leader hands out every proxy's
//! lease, rests one, and is SIGKILLed right after its last answer. The
//! replica that takes over starts from the lease checkpoint: old leases
//! answer as before, nothing is granted over capacity, the rest holds.
//!
//! The checkpoint ConfigMaps changed by other clients (`kubectl label`, an
//! earlier leader's late write dropping every lease of a shard): grants go on
//! within 5 s, the leader's leases are written over the foreign change with
//! the foreign labels kept, an Event and a metric name the writer, and a
//! new leader finds every lease. A checkpoint that stays unwritable (an
//! admission webhook refuses it) makes the leader step down and release its
//! Lease; another replica takes over at once.

mod support;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use fake_apiserver::FakeApiServer;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};
use support::operator::{LOCAL_PROVIDER, OperatorDir, OperatorProcess};
use support::process::health_target;

const WAIT: Duration = Duration::from_secs(30);

async fn start(dir: &OperatorDir, fake: &FakeApiServer, name: &str) -> OperatorProcess {
    replica(dir, fake, name, "3s").start().await
}

/// A replica with leader election over a Lease of `lease_duration`.
fn replica(
    dir: &OperatorDir,
    fake: &FakeApiServer,
    name: &str,
    lease_duration: &str,
) -> support::operator::OperatorBuilder {
    dir.kubernetes(&fake.kubeconfig("crawl"))
        .name(name)
        .env("POD_NAME", name)
        .discovery()
        // This test is about failover, not the API's tokens.
        .arg("--insecure-discovery-without-token")
        .args(["--leader-elect", "--lease-duration", lease_duration])
        // The checkpoint that carries leases to the next leader when only
        // the leader serves (every replica serving: replicas_failover.rs).
        .arg("--every-replica-serves=false")
        .args([
            "--lease-cooldown",
            "5m",
            "--max-lease-ttl",
            "10m",
            "--max-leases-per-proxy",
            "1",
        ])
}

async fn is_ready(r: &OperatorProcess) -> bool {
    support::http::try_request(r.health(), "GET", "/readyz")
        .await
        .is_ok_and(|s| s == 200)
}

async fn call(api: SocketAddr, method: &str, path: &str, body: Option<&str>) -> (u16, Value) {
    let (status, text) = support::http::request(api, method, path, &[], body).await;
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// Waits until `r` leads and lists `n` healthy proxies.
async fn leading_with(r: &OperatorProcess, n: usize, dir: &OperatorDir) -> Value {
    support::eventually_explained(
        &format!("a leader with {n} healthy proxies"),
        WAIT,
        || dir.logs(),
        async || {
            if !is_ready(r).await {
                return Err("not ready".to_owned());
            }
            let (status, list) = call(r.discovery(), "GET", "/v1/proxies?healthy=true", None).await;
            if status == 200 && list.as_array().is_some_and(|a| a.len() == n) {
                Ok(list)
            } else {
                Err(format!("{status} {list}"))
            }
        },
    )
    .await
}

fn acquire(target: &str) -> String {
    format!(r#"{{"target":"{target}","ttlSeconds":600}}"#)
}

fn proxy_api(client: &kube::Client) -> Api<DynamicObject> {
    Api::namespaced_with(
        client.clone(),
        "crawl",
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("crawl.example.com", "v1alpha1", "Proxy"),
            "proxies",
        ),
    )
}

/// Declares `names` as Managed local Proxies probed against the test's target.
async fn declare(client: &kube::Client, names: &[&str]) {
    let target = health_target();
    for name in names {
        let obj: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "crawl.example.com/v1alpha1", "kind": "Proxy",
            "metadata": {"name": name, "namespace": "crawl"},
            "spec": {"mode": "Managed", "provider": "local", "healthCheck": {"url": target, "interval": "1s"}}
        }))
        .unwrap();
        proxy_api(client)
            .create(&PostParams::default(), &obj)
            .await
            .unwrap();
    }
}

/// The checkpoint shards there are, by name.
async fn shards(configmaps: &Api<ConfigMap>) -> Vec<ConfigMap> {
    configmaps
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|c| {
            c.metadata
                .name
                .as_deref()
                .is_some_and(|n| n.starts_with("egress-proxies-leases-"))
        })
        .collect()
}

/// The ids of the leases the checkpoint holds.
fn checkpointed(shards: &[ConfigMap]) -> BTreeSet<String> {
    shards
        .iter()
        .filter_map(|c| c.data.as_ref()?.get("leases.json"))
        .filter_map(|text| serde_json::from_str::<Value>(text).ok())
        .filter_map(|v| {
            v["leases"]
                .as_object()
                .map(|m| m.keys().cloned().collect::<Vec<_>>())
        })
        .flatten()
        .collect()
}

#[actix_rt::test]
async fn leases_and_rests_survive_a_leader_change() {
    let fake = FakeApiServer::start().unwrap();
    let dir = OperatorDir::new(LOCAL_PROVIDER);
    let client = kube::Client::try_from(kube::Config::new(fake.url().parse().unwrap())).unwrap();
    let target = health_target();
    let proxies: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        "crawl",
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("crawl.example.com", "v1alpha1", "Proxy"),
            "proxies",
        ),
    );
    for name in ["p1", "p2", "p3"] {
        let obj: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "crawl.example.com/v1alpha1", "kind": "Proxy",
            "metadata": {"name": name, "namespace": "crawl"},
            "spec": {"mode": "Managed", "provider": "local", "healthCheck": {"url": target, "interval": "1s"}}
        }))
        .unwrap();
        proxies.create(&PostParams::default(), &obj).await.unwrap();
    }

    let mut replicas = vec![start(&dir, &fake, "a").await, start(&dir, &fake, "b").await];
    let leader = support::eventually_explained(
        "a leader",
        WAIT,
        || dir.logs(),
        async || {
            if is_ready(&replicas[0]).await {
                Some(0)
            } else if is_ready(&replicas[1]).await {
                Some(1)
            } else {
                None
            }
        },
    )
    .await;
    let follower = replicas.remove(1 - leader);
    let leader = replicas.remove(0);
    leading_with(&leader, 3, &dir).await;

    let mut leases = Vec::new();
    for _ in 0..3 {
        let (status, lease) = call(
            leader.discovery(),
            "POST",
            "/v1/leases",
            Some(&acquire("a.example")),
        )
        .await;
        assert_eq!(status, 201, "{lease}");
        leases.push(lease);
    }
    let third = leases[2]["id"].as_str().unwrap().to_owned();
    assert_eq!(
        call(leader.discovery(), "DELETE", &format!("/v1/leases/{third}"), None)
            .await
            .0,
        204
    );
    // Every change is answered only once written: the release's rest and
    // the next grant survive a kill right after the grant's answer.
    let (status, fourth) = call(
        leader.discovery(),
        "POST",
        "/v1/leases",
        Some(&acquire("c.example")),
    )
    .await;
    assert_eq!(status, 201, "the released proxy serves another target: {fourth}");
    assert_eq!(fourth["proxy"]["name"], leases[2]["proxy"]["name"]);
    drop(leader); // SIGKILL
    leases.push(fourth);

    let listed = leading_with(&follower, 3, &dir).await;
    let active: u64 = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["activeLeases"].as_u64().unwrap())
        .sum();
    assert_eq!(active, 3, "the new leader knows every held lease: {listed}");
    for target in ["a.example", "c.example", "d.example"] {
        let (status, body) = call(follower.discovery(), "POST", "/v1/leases", Some(&acquire(target))).await;
        assert_eq!(status, 503, "nothing over capacity for {target}: {body}");
    }
    for lease in &leases {
        let id = lease["id"].as_str().unwrap();
        let (status, body) = call(
            follower.discovery(),
            "POST",
            &format!("/v1/leases/{id}/report"),
            Some(r#"{"outcome":"ok"}"#),
        )
        .await;
        assert_eq!(status, 204, "report on {id} after the failover: {body}");
    }
    // The rest survived too: the fourth lease's proxy, released, still rests for a.example.
    let fourth = leases[3]["id"].as_str().unwrap();
    assert_eq!(
        call(
            follower.discovery(),
            "DELETE",
            &format!("/v1/leases/{fourth}"),
            None
        )
        .await
        .0,
        204
    );
    let (status, body) = call(
        follower.discovery(),
        "POST",
        "/v1/leases",
        Some(&acquire("a.example")),
    )
    .await;
    assert_eq!(
        status, 503,
        "the proxy released before the failover still rests for a.example: {body}"
    );

    // The checkpoint is where the docs say.
    let configmaps: Api<ConfigMap> = Api::namespaced(client, "crawl");
    let shards: usize = futures::future::join_all((0..16).map(|i| {
        let configmaps = configmaps.clone();
        async move {
            configmaps
                .get_opt(&format!("egress-proxies-leases-{i:02}"))
                .await
                .unwrap()
        }
    }))
    .await
    .into_iter()
    .flatten()
    .count();
    assert!(shards >= 1, "checkpoint shards written");
    support::rbac::assert_covered(&fake.accesses.lock().unwrap());
}

#[actix_rt::test]
async fn a_checkpoint_changed_by_other_clients_keeps_grants_going_and_loses_no_lease() {
    let fake = FakeApiServer::start().unwrap();
    let dir = OperatorDir::new(LOCAL_PROVIDER);
    let client = kube::Client::try_from(kube::Config::new(fake.url().parse().unwrap())).unwrap();
    declare(&client, &["p1", "p2", "p3"]).await;
    // A longer lease than elsewhere: this test is about the checkpoint, and
    // a loaded machine must not cost the leader its Lease meanwhile.
    let leader = replica(&dir, &fake, "a", "10s")
        .metrics()
        .arg("--metrics-secure=false")
        .start()
        .await;
    leading_with(&leader, 3, &dir).await;
    let id = |lease: &Value| lease["id"].as_str().unwrap().to_owned();
    let grant = async |target: &str| {
        let (status, lease) = call(leader.discovery(), "POST", "/v1/leases", Some(&acquire(target))).await;
        assert_eq!(status, 201, "{lease}\n{}", dir.logs());
        lease
    };
    let first = grant("a.example").await;
    let second = grant("b.example").await;
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), "crawl");
    assert!(
        checkpointed(&shards(&configmaps).await).is_superset(&[id(&first), id(&second)].into()),
        "both leases checkpointed"
    );

    // `kubectl label` on every shard, and an earlier leader's late write
    // that empties the shard holding the second lease.
    for shard in shards(&configmaps).await {
        let name = shard.metadata.name.unwrap();
        let labelled = PatchParams {
            field_manager: Some("kubectl-label".into()),
            ..PatchParams::default()
        };
        configmaps
            .patch(
                &name,
                &labelled,
                &Patch::Merge(json!({"metadata": {"labels": {"team": "crawl"}}})),
            )
            .await
            .unwrap();
    }
    let mut held = shards(&configmaps)
        .await
        .into_iter()
        .find(|c| checkpointed(std::slice::from_ref(c)).contains(&id(&second)))
        .expect("the shard of the second lease");
    held.data = Some([("leases.json".to_owned(), "{}".to_owned())].into());
    held.metadata
        .annotations
        .get_or_insert_default()
        .insert("crawl.example.com/checkpoint-writer".into(), "old-leader".into());
    held.metadata.managed_fields = None;
    let late = PostParams {
        field_manager: Some("egress-proxies-operator".into()),
        ..PostParams::default()
    };
    let held_name = held.metadata.name.clone().unwrap();
    configmaps.replace(&held_name, &late, &held).await.unwrap();
    let changed = Instant::now();

    // Renewing the second lease writes its shard over the late write; the
    // release of the first writes over the label; grants go on.
    let second_id = id(&second);
    let (status, body) = call(
        leader.discovery(),
        "POST",
        &format!("/v1/leases/{second_id}/renew"),
        Some("{}"),
    )
    .await;
    assert_eq!(
        status,
        200,
        "the renewal after the late write: {body}\n{}",
        dir.logs()
    );
    let first_id = id(&first);
    assert_eq!(
        call(
            leader.discovery(),
            "DELETE",
            &format!("/v1/leases/{first_id}"),
            None
        )
        .await
        .0,
        204
    );
    let third = support::eventually_explained(
        "a grant after the checkpoint was changed",
        Duration::from_secs(5),
        || dir.logs(),
        async || {
            let (status, lease) = call(
                leader.discovery(),
                "POST",
                "/v1/leases",
                Some(&acquire("c.example")),
            )
            .await;
            if status == 201 {
                Ok(lease)
            } else {
                Err(format!("{status} {lease}"))
            }
        },
    )
    .await;
    let resumed = changed.elapsed();
    assert!(
        resumed < Duration::from_secs(5),
        "grants resumed after {resumed:?}"
    );
    eprintln!("grants went on {resumed:?} after the checkpoint was changed");
    for _ in 0..5 {
        let (status, body) = call(
            leader.discovery(),
            "POST",
            "/v1/leases",
            Some(&acquire("d.example")),
        )
        .await;
        // Every proxy may hold one lease: two held, the released one rests for a.example only.
        assert!(status == 201 || status == 503, "{status} {body}");
        if status == 503 {
            assert!(
                body.to_string().contains("no_capacity"),
                "refused for capacity only: {body}"
            );
        }
    }

    // The checkpoint holds this leader's leases again, with the label kept.
    let held = [id(&second), id(&third)];
    let now = support::eventually(
        "the checkpoint to hold every lease",
        Duration::from_secs(10),
        async || {
            let now = shards(&configmaps).await;
            let ids = checkpointed(&now);
            if held.iter().all(|h| ids.contains(h)) && !ids.contains(&first_id) {
                Ok(now)
            } else {
                Err(format!("{ids:?}"))
            }
        },
    )
    .await;
    for shard in &now {
        let labels = shard.metadata.labels.clone().unwrap_or_default();
        assert_eq!(
            labels.get("team").map(String::as_str),
            Some("crawl"),
            "the foreign label kept: {shard:?}"
        );
    }

    // An Event on the ConfigMap and a metric name the writers.
    let events: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        "crawl",
        &ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("events.k8s.io", "v1", "Event"), "events"),
    );
    let notes = support::eventually("the conflict Events", WAIT, async || {
        let list = events.list(&ListParams::default()).await.ok()?;
        let notes: Vec<String> = list
            .items
            .iter()
            .filter(|e| {
                e.data["reason"] == "LeaseCheckpointConflict" && e.data["regarding"]["kind"] == "ConfigMap"
            })
            .map(|e| e.data["note"].as_str().unwrap_or_default().to_owned())
            .collect();
        let named = |who: &str| notes.iter().any(|n| n.contains(who));
        (named("field manager kubectl-label") && named("replica old-leader")).then_some(notes)
    })
    .await;
    assert!(notes.iter().any(|n| n.contains(&held_name)), "{notes:?}");
    let (status, metrics) = support::http::request(leader.metrics(), "GET", "/metrics", &[], None).await;
    assert_eq!(status, 200);
    for reason in ["other_client", "other_replica"] {
        let line = format!("egress_proxies_lease_checkpoint_conflicts_total{{reason=\"{reason}\"}}");
        assert!(metrics.contains(&line), "{line} in\n{metrics}");
    }

    // A new leader finds every lease.
    drop(leader); // SIGKILL
    let successor = replica(&dir, &fake, "b", "10s").start().await;
    let listed = leading_with(&successor, 3, &dir).await;
    let active: u64 = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["activeLeases"].as_u64().unwrap())
        .sum();
    assert!(active >= 2, "the new leader knows the held leases: {listed}");
    for lease in &held {
        let (status, body) = call(
            successor.discovery(),
            "POST",
            &format!("/v1/leases/{lease}/report"),
            Some(r#"{"outcome":"ok"}"#),
        )
        .await;
        assert_eq!(status, 204, "{lease} after the failover: {body}");
    }
    support::rbac::assert_covered(&fake.accesses.lock().unwrap());
}

#[actix_rt::test]
async fn a_leader_whose_checkpoint_stays_unwritable_steps_down() {
    let fake = FakeApiServer::start().unwrap();
    let dir = OperatorDir::new(LOCAL_PROVIDER);
    let client = kube::Client::try_from(kube::Config::new(fake.url().parse().unwrap())).unwrap();
    declare(&client, &["p1"]).await;
    let a = start(&dir, &fake, "a").await;
    leading_with(&a, 1, &dir).await;

    // A policy engine starts refusing every write of the checkpoint.
    fake.state.lock().unwrap().deny(fake_apiserver::Denial {
        webhook: "policy.example.com".into(),
        resource: "configmaps".into(),
        name_prefix: "egress-proxies-leases-".into(),
        message: "ConfigMaps must carry the label owner".into(),
    });
    let denied = Instant::now();
    // A grant to save; its answer may be cut by the exit.
    let discovery = a.discovery();
    let asked =
        actix_rt::spawn(
            async move { call(discovery, "POST", "/v1/leases", Some(&acquire("a.example"))).await },
        );
    let leases: Api<Lease> = Api::namespaced(client.clone(), "crawl");
    // The renew deadline is 2 s: it steps down, releases the Lease, exits.
    a.eventually(
        "the leader to step down and exit",
        Duration::from_secs(20),
        async || a.exited().filter(|s| !s.success()),
    )
    .await;
    let stepped = denied.elapsed();
    eprintln!("stepped down {stepped:?} after the checkpoint became unwritable");
    let lease = leases.get("egress-proxies-operator").await.unwrap();
    let holder = lease.spec.and_then(|s| s.holder_identity);
    assert_eq!(holder, None, "the Lease was released");
    assert!(a.logs().contains("stepping down"), "{}", a.logs());
    // Status 0: the answer was cut by the exit.
    if let Ok((status, body)) = asked.await
        && status != 0
    {
        assert_eq!(status, 503, "no grant that could not be saved: {body}");
    }

    // Another replica takes over at once once the checkpoint can be written.
    fake.state.lock().unwrap().allow_all();
    let b = start(&dir, &fake, "b").await;
    leading_with(&b, 1, &dir).await;
    let (status, body) = call(b.discovery(), "POST", "/v1/leases", Some(&acquire("a.example"))).await;
    assert_eq!(status, 201, "{body}");
}
