//! Leases survive the operator being killed: the real binary in standalone
//! mode, three local proxies of capacity 1, all leased; SIGKILLed right
//! after its last answer and restarted, it still knows every lease (reports
//! answer as before, listings count them), never grants a fourth, and a
//! proxy resting for a target still rests.

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::Value;
use support::operator::{LOCAL_PROVIDER, OperatorBuilder, OperatorDir, OperatorProcess};
use support::process::{free_port, health_target};

async fn call(api: SocketAddr, method: &str, path: &str, body: Option<&str>) -> (u16, Value) {
    let (status, text) = support::http::request(api, method, path, &[], body).await;
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// Waits until the API lists `n` healthy proxies.
async fn ready(operator: &OperatorProcess, n: usize) -> Value {
    let api = operator.discovery();
    operator
        .eventually(
            &format!("{n} healthy proxies listed"),
            Duration::from_secs(30),
            async || {
                let (status, text) = tokio::time::timeout(
                    Duration::from_secs(2),
                    support::http::request(api, "GET", "/v1/proxies?healthy=true", &[], None),
                )
                .await
                .map_err(|_| "no answer within 2 s".to_owned())?;
                let list = serde_json::from_str::<Value>(&text).unwrap_or_default();
                if status == 200 && list.as_array().is_some_and(|a| a.len() == n) {
                    Ok(list)
                } else {
                    Err(format!("{status} {text}"))
                }
            },
        )
        .await
}

fn acquire(target: &str) -> String {
    format!(r#"{{"target":"{target}","ttlSeconds":600,"client":"durability-test"}}"#)
}

#[tokio::test]
async fn leases_and_rests_survive_a_sigkill() {
    let dir = OperatorDir::new(LOCAL_PROVIDER);
    let health = health_target();
    for name in ["p1", "p2", "p3"] {
        dir.write_manifest(
            name,
            &format!(
                "apiVersion: crawl.example.com/v1alpha1\nkind: Proxy\nmetadata: {{name: {name}, namespace: crawl}}\n\
                 spec: {{mode: Managed, provider: local, healthCheck: {{url: \"{health}\", interval: 1s}}}}\n"
            ),
        );
    }
    // Both processes serve the API on the same address, as a restarted one would.
    let api: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let operator = || -> OperatorBuilder {
        dir.standalone()
            .discovery_at(api)
            .setting("leaseCooldown", "5m")
            .setting("maxLeaseTtl", "10m")
            .setting("maxLeasesPerProxy", "1")
    };

    let first = operator().start().await;
    ready(&first, 3).await;
    let mut leases = Vec::new();
    for _ in 0..3 {
        let (status, lease) = call(api, "POST", "/v1/leases", Some(&acquire("a.example"))).await;
        assert_eq!(status, 201, "{lease}");
        leases.push(lease);
    }
    let (status, _) = call(api, "POST", "/v1/leases", Some(&acquire("a.example"))).await;
    assert_eq!(status, 503, "capacity 1 × 3 proxies");
    // The third goes back: its proxy rests for a.example for 5 minutes.
    let third = leases[2]["id"].as_str().unwrap().to_owned();
    let (status, _) = call(api, "DELETE", &format!("/v1/leases/{third}"), None).await;
    assert_eq!(status, 204);
    // Killed right after its last answer.
    drop(first);

    let second = operator().start().await;
    let listed = ready(&second, 3).await;
    let active: Vec<u64> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["activeLeases"].as_u64().unwrap())
        .collect();
    assert_eq!(
        active.iter().sum::<u64>(),
        2,
        "both held leases are known again: {listed}"
    );

    // Nothing over capacity, and the released proxy still rests for a.example.
    let (status, body) = call(api, "POST", "/v1/leases", Some(&acquire("a.example"))).await;
    assert_eq!(status, 503, "a fourth lease on a busy or resting proxy: {body}");
    let (status, other) = call(api, "POST", "/v1/leases", Some(&acquire("b.example"))).await;
    assert_eq!(status, 201, "the resting proxy serves other targets: {other}");
    assert_eq!(other["proxy"]["name"], leases[2]["proxy"]["name"]);
    let (status, _) = call(api, "POST", "/v1/leases", Some(&acquire("b.example"))).await;
    assert_eq!(status, 503);

    // Leases granted before the kill answer as before.
    for lease in &leases {
        let id = lease["id"].as_str().unwrap();
        let (status, body) = call(
            api,
            "POST",
            &format!("/v1/leases/{id}/report"),
            Some(r#"{"outcome":"ok"}"#),
        )
        .await;
        assert_eq!(status, 204, "report on {id}: {body}");
    }
    let (status, _) = call(
        api,
        "POST",
        "/v1/leases/00000000-0000-4000-8000-000000000000/report",
        Some(r#"{"outcome":"ok"}"#),
    )
    .await;
    assert_eq!(status, 404, "an id never granted is still unknown");
    let first = leases[0]["id"].as_str().unwrap();
    let (status, _) = call(api, "DELETE", &format!("/v1/leases/{first}"), None).await;
    assert_eq!(status, 204);
    let (status, _) = call(api, "POST", "/v1/leases", Some(&acquire("c.example"))).await;
    assert_eq!(status, 201, "a released proxy serves again");
}
