//! Leases survive a leader change: two operator processes with leader
//! election against the fake API server; the leader hands out every proxy's
//! lease, rests one, and is SIGKILLed right after its last answer. The
//! replica that takes over starts from the lease checkpoint: old leases
//! answer as before, nothing is granted over capacity, the rest holds.

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use fake_apiserver::FakeApiServer;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DynamicObject, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};
use support::operator::{LOCAL_PROVIDER, OperatorDir, OperatorProcess};
use support::process::health_target;

const WAIT: Duration = Duration::from_secs(30);

async fn start(dir: &OperatorDir, fake: &FakeApiServer, name: &str) -> OperatorProcess {
    dir.kubernetes(&fake.kubeconfig("crawl"))
        .name(name)
        .discovery()
        // This test is about failover, not the API's tokens.
        .arg("--insecure-discovery-without-token")
        .args(["--leader-elect", "--lease-duration", "3s"])
        .args([
            "--lease-cooldown",
            "5m",
            "--max-lease-ttl",
            "10m",
            "--max-leases-per-proxy",
            "1",
        ])
        .start()
        .await
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
