//! Leases survive the operator being killed: the real binary in standalone
//! mode, three local proxies of capacity 1, all leased; SIGKILLed right
//! after its last answer and restarted, it still knows every lease (reports
//! answer as before, listings count them), never grants a fourth, and a
//! proxy resting for a target still rests.

mod support;

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;
use support::process::{InstanceReaper, free_port, health_target, standalone};

const BIN: &str = env!("CARGO_BIN_EXE_egress-proxies-operator");

async fn call(api: SocketAddr, method: &str, path: &str, body: Option<&str>) -> (u16, Value) {
    let (status, text) = support::http::request(api, method, path, &[], body).await;
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// Waits until the API lists `n` healthy proxies.
async fn ready(api: SocketAddr, n: usize, dir: &Path) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if tokio::net::TcpStream::connect(api).await.is_ok()
            && let Ok((200, text)) = tokio::time::timeout(
                Duration::from_secs(2),
                support::http::request(api, "GET", "/v1/proxies?healthy=true", &[], None),
            )
            .await
            && let Ok(list) = serde_json::from_str::<Value>(&text)
            && list.as_array().is_some_and(|a| a.len() == n)
        {
            return list;
        }
        assert!(
            Instant::now() < deadline,
            "{n} healthy proxies never listed\n{}",
            std::fs::read_to_string(dir.join("operator.log")).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn acquire(target: &str) -> String {
    format!(r#"{{"target":"{target}","ttlSeconds":600,"client":"durability-test"}}"#)
}

#[tokio::test]
async fn leases_and_rests_survive_a_sigkill() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path();
    let _reaper = InstanceReaper(dir.join("state"));
    let api: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    std::fs::create_dir(dir.join("proxies")).unwrap();
    std::fs::write(
        dir.join("providers.yaml"),
        "providers:\n  - {name: local, type: local, local: {implementation: builtin, destinations: {allow: [127.0.0.0/8]}}}\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("standalone.yaml"),
        format!(
            "providersConfig: providers.yaml\nmanifests: proxies\nstateDir: state\n\
             healthProbeBindAddress: \"0\"\ndiscoveryBindAddress: {api}\nmanifestPollInterval: 100ms\n\
             leaseCooldown: 5m\nmaxLeaseTtl: 10m\nmaxLeasesPerProxy: 1\n"
        ),
    )
    .unwrap();
    let health = health_target();
    for name in ["p1", "p2", "p3"] {
        std::fs::write(
            dir.join("proxies").join(format!("{name}.yaml")),
            format!(
                "apiVersion: crawl.example.com/v1alpha1\nkind: Proxy\nmetadata: {{name: {name}, namespace: crawl}}\n\
                 spec: {{mode: Managed, provider: local, healthCheck: {{url: \"{health}\", interval: 1s}}}}\n"
            ),
        )
        .unwrap();
    }

    let operator = standalone(BIN, dir);
    ready(api, 3, dir).await;
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
    drop(operator);

    let _operator = standalone(BIN, dir);
    let listed = ready(api, 3, dir).await;
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
