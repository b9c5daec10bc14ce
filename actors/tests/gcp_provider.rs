//! The gcp provider's real client (reqwest + gcp_auth with a service-account
//! key) against the fake Compute API and token endpoint over loopback HTTP:
//! lifecycle, 409-is-success, every status-code class, every state row,
//! partial-success lists, token refresh, missing credentials that heal
//! (the wire log has its own binary: gcp_wire_log.rs).

mod support;

use std::time::Duration;

use egress_proxies::provider::{ErrorClass, InstanceState, Provider, ProviderId};
use fake_compute::{FakeCompute, Fault};
use serde_json::json;
use support::gcp::{ZONE, key_file, provider, request};

#[tokio::test]
async fn a_vm_is_created_found_listed_and_deleted() {
    let fake = FakeCompute::start("crawl-test").unwrap();
    fake.state().step = Duration::from_millis(150);
    let dir = tempfile::tempdir().unwrap();
    let gcp = provider(&fake, key_file(dir.path(), &fake), false);
    let req = request("3f0c0c5e-0000-4000-8000-000000000001");

    let id = gcp.create(&req).await.unwrap();
    assert_eq!(id.as_str(), format!("zones/{ZONE}/instances/{}", req.name));
    let inserted = fake.state().inserted[0].clone();
    assert_eq!(inserted["labels"]["egress-proxies-uid"], req.uid.as_str());
    assert_eq!(
        inserted["metadata"]["items"][0]["value"],
        "#cloud-config\npackages: [squid]\n"
    );
    assert_eq!(
        gcp.create(&req).await.unwrap(),
        id,
        "409 already exists = success"
    );
    assert_eq!(fake.state().seen.iter().filter(|s| s.status == 409).count(), 1);

    let first = gcp.get(&id).await.unwrap();
    assert_eq!((first.state, first.ip), (InstanceState::Provisioning, None));
    assert_eq!(first.owner.uid.as_deref(), Some(req.uid.as_str()));
    assert!(first.created_at.is_some());
    let running = support::eventually("RUNNING", Duration::from_secs(5), async || {
        let i = gcp.get(&id).await.unwrap();
        (i.state == InstanceState::Running).then_some(i)
    })
    .await;
    assert_eq!(running.ip, Some("127.0.0.1".parse().unwrap()));

    // Someone else's VM in the project is not listed.
    let mut foreign = inserted.clone();
    foreign["name"] = json!("web-1");
    foreign["labels"] = json!({"team": "web"});
    fake.state().seed(ZONE, foreign);
    let listed = gcp.list_by_tag().await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(
        (&listed[0].id, listed[0].owner.uid.as_deref()),
        (&id, Some(req.uid.as_str()))
    );

    gcp.delete(&id).await.unwrap();
    assert_eq!(
        gcp.get(&id).await.unwrap().state,
        InstanceState::Stopped,
        "STOPPING"
    );
    let gone = support::eventually("gone", Duration::from_secs(5), async || gcp.get(&id).await.err()).await;
    assert_eq!(gone.class, ErrorClass::NotFound);
    gcp.delete(&id).await.unwrap();
    assert!(gcp.list_by_tag().await.unwrap().is_empty());

    // A providerID that is not a gcp one is refused, not looked up.
    let bad = gcp
        .get(&ProviderId("hosts/a/domains/x".into()))
        .await
        .unwrap_err();
    assert_eq!(bad.class, ErrorClass::Permanent);
}

#[tokio::test]
async fn every_state_row_and_status_code_class() {
    let fake = FakeCompute::start("crawl-test").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let gcp = provider(&fake, key_file(dir.path(), &fake), false);
    let req = request("3f0c0c5e-0000-4000-8000-000000000002");
    let id = gcp.create(&req).await.unwrap();
    for (status, state) in [
        ("PROVISIONING", InstanceState::Provisioning),
        ("STAGING", InstanceState::Provisioning),
        ("REPAIRING", InstanceState::Provisioning),
        ("RUNNING", InstanceState::Running),
        ("STOPPING", InstanceState::Stopped),
        ("STOPPED", InstanceState::Stopped),
        ("SUSPENDING", InstanceState::Stopped),
        ("SUSPENDED", InstanceState::Stopped),
        ("TERMINATED", InstanceState::Stopped),
        ("NEVER_SEEN_BEFORE", InstanceState::Stopped),
    ] {
        assert!(fake.state().force_status(ZONE, req.name.as_str(), status));
        assert_eq!(gcp.get(&id).await.unwrap().state, state, "{status}");
    }

    let other = request("3f0c0c5e-0000-4000-8000-000000000003");
    for (method, status, reason, class) in [
        ("POST", 403, "quotaExceeded", ErrorClass::QuotaExceeded),
        ("POST", 403, "rateLimitExceeded", ErrorClass::QuotaExceeded),
        ("POST", 429, "RATE_LIMIT_EXCEEDED", ErrorClass::QuotaExceeded),
        ("POST", 429, "tooManyRequests", ErrorClass::Transient),
        ("POST", 500, "backendError", ErrorClass::Transient),
        ("POST", 503, "unavailable", ErrorClass::Transient),
        ("POST", 400, "invalid", ErrorClass::Permanent),
        ("POST", 403, "forbidden", ErrorClass::Permanent),
        ("GET", 404, "notFound", ErrorClass::NotFound),
        ("GET", 502, "badGateway", ErrorClass::Transient),
        ("DELETE", 403, "forbidden", ErrorClass::Permanent),
    ] {
        let fault = Fault {
            method: method.into(),
            path_contains: "/instances".into(),
            status,
            reason: reason.into(),
        };
        fake.state().inject(fault, 1);
        let err = match method {
            "POST" => gcp.create(&other).await.unwrap_err(),
            "GET" => gcp.get(&id).await.unwrap_err(),
            _ => gcp.delete(&id).await.unwrap_err(),
        };
        assert_eq!(err.class, class, "{method} {status} {reason}: {err}");
        assert!(err.to_string().contains(reason), "{err}");
    }
    // A delete that finds nothing is done.
    fake.state().inject(
        Fault {
            method: "DELETE".into(),
            path_contains: "/instances".into(),
            status: 404,
            reason: "notFound".into(),
        },
        1,
    );
    gcp.delete(&id).await.unwrap();

    // Missing placement fields are Permanent, naming the field; nothing is sent.
    let sent = fake.state().seen.len();
    for field in ["zone", "machineType", "image"] {
        let mut r = request("3f0c0c5e-0000-4000-8000-000000000004");
        match field {
            "zone" => r.placement.zone = None,
            "machineType" => r.placement.machine_type = None,
            _ => r.placement.image = None,
        }
        let err = gcp.create(&r).await.unwrap_err();
        assert_eq!(err.class, ErrorClass::Permanent);
        assert!(
            err.to_string()
                .contains(&format!("placement.{field} is required")),
            "{err}"
        );
    }
    assert_eq!(fake.state().seen.len(), sent);
}

#[tokio::test]
async fn a_partial_list_returns_the_zones_that_answered() {
    let fake = FakeCompute::start("crawl-test").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let gcp = provider(&fake, key_file(dir.path(), &fake), false);
    let mut ids = Vec::new();
    for (i, zone) in ["europe-west1-b", "us-east1-c", "asia-east1-a"]
        .iter()
        .enumerate()
    {
        let mut r = request(&format!("3f0c0c5e-0000-4000-8000-00000000001{i}"));
        r.placement.zone = Some((*zone).into());
        ids.push(gcp.create(&r).await.unwrap());
    }
    fake.state().unreachable_zones.insert("us-east1-c".into());
    let listed = gcp.list_by_tag().await.unwrap();
    let mut got: Vec<&str> = listed.iter().map(|i| i.id.as_str()).collect();
    got.sort();
    let mut want = vec![ids[0].as_str(), ids[2].as_str()];
    want.sort();
    assert_eq!(got, want);
    let query = &fake.state().seen.last().unwrap().query.clone();
    assert!(
        query.contains("returnPartialSuccess=true") && query.contains("filter=labels.egress-proxies-managed"),
        "{query}"
    );
}

#[tokio::test]
async fn tokens_are_cached_and_refreshed_and_missing_credentials_heal() {
    let fake = FakeCompute::start("crawl-test").unwrap();
    // gcp_auth refreshes 20 s before expiry: a 21 s token is good for about one second.
    fake.state().token_lifetime = Duration::from_secs(21);
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("later.json");
    let gcp = provider(&fake, key.clone(), false);
    let req = request("3f0c0c5e-0000-4000-8000-000000000020");

    let err = gcp.create(&req).await.unwrap_err();
    assert_eq!(err.class, ErrorClass::Transient, "{err}");
    assert!(err.to_string().contains("no usable Google credentials"), "{err}");
    let made = key_file(dir.path(), &fake);
    std::fs::rename(made, &key).unwrap();

    let id = gcp.create(&req).await.unwrap();
    gcp.get(&id).await.unwrap();
    assert_eq!(fake.state().issued.len(), 1, "one token for both calls");
    tokio::time::sleep(Duration::from_millis(1200)).await;
    gcp.get(&id).await.unwrap();
    let state = fake.state();
    assert_eq!(state.issued.len(), 2, "refreshed before expiry");
    let used: Vec<&str> = state.seen.iter().filter_map(|s| s.token.as_deref()).collect();
    assert_eq!(used.last(), Some(&state.issued[1].as_str()));
}
