//! The gcp provider's real client (reqwest + gcp_auth with a service-account
//! key) against the fake Compute API and token endpoint over loopback HTTP:
//! lifecycle, 409-is-success, every status-code class, every state row,
//! partial-success lists, token refresh, missing credentials that heal,
//! release through setLabels, and two installations sharing one project
//! under orphan GC (the wire log has its own binary: gcp_wire_log.rs).

mod support;

use std::time::Duration;

use std::collections::BTreeSet;
use std::sync::Arc;

use egress_proxies::adapters::stores::embedded::{EmbeddedStore, ManifestSet};
use egress_proxies::domain::gc;
use egress_proxies::domain::provider_contract::{
    ErrorClass, InstanceState, Ownership, Provider, ProviderId, Providers,
};
use egress_proxies::domain::resource::ObjectKey;
use egress_proxies::domain::resource::Proxy;
use fake_compute::{FakeCompute, Fault, fingerprint_of};
use serde_json::{Value, json};
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
    assert_eq!(
        inserted["labels"],
        json!({"egress-proxies-managed": "true", "egress-proxies-uid": req.uid,
               "egress-proxies-namespace": "crawl", "egress-proxies-installation": "itest"})
    );
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
    assert_eq!(first.owner, Ownership::of(&req), "every owner label read back");
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
    assert_eq!((&listed[0].id, &listed[0].owner), (&id, &Ownership::of(&req)));

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
    // Calls go on succeeding while the token nears its expiry: one of them
    // refreshes it first.
    support::eventually(
        "the token refreshed before expiry",
        Duration::from_secs(10),
        async || {
            gcp.get(&id).await.unwrap();
            (fake.state().issued.len() == 2).then_some(())
        },
    )
    .await;
    let state = fake.state();
    let used: Vec<&str> = state.seen.iter().filter_map(|s| s.token.as_deref()).collect();
    assert_eq!(used.last(), Some(&state.issued[1].as_str()));
}

/// The labels of a VM made for `req` once released: no managed label.
fn released_labels(uid: &str, extra: &[(&str, &str)]) -> Value {
    let mut labels = json!({"egress-proxies-released": "true", "egress-proxies-uid": uid,
        "egress-proxies-namespace": "crawl", "egress-proxies-installation": "itest"});
    for (k, v) in extra {
        labels[*k] = json!(v);
    }
    labels
}

#[tokio::test]
async fn release_sends_set_labels_with_the_fingerprint_and_retries_a_stale_one() {
    let fake = FakeCompute::start("crawl-test").unwrap();
    fake.state().step = Duration::from_millis(100);
    let dir = tempfile::tempdir().unwrap();
    let gcp = provider(&fake, key_file(dir.path(), &fake), false);
    let req = request("3f0c0c5e-0000-4000-8000-000000000040");
    let name = req.name.as_str();
    let id = gcp.create(&req).await.unwrap();
    let created = fake.state().labels(ZONE, name).unwrap();

    // An admin adds a label between the provider's read and its setLabels:
    // the first setLabels carries the fingerprint it read and meets 412;
    // the provider reads again and keeps the admin's label.
    let mut admin = created.clone();
    admin["team"] = json!("web");
    fake.state().race_next_set_labels(ZONE, name, admin.clone());
    gcp.release(&id).await.unwrap();
    let sets = fake.state().label_sets.clone();
    assert_eq!(sets.len(), 2, "{sets:?}");
    assert_eq!(
        sets[0],
        (
            412,
            json!({"labels": released_labels(&req.uid, &[]), "labelFingerprint": fingerprint_of(&created)})
        )
    );
    let released = released_labels(&req.uid, &[("team", "web")]);
    assert_eq!(
        sets[1],
        (
            200,
            json!({"labels": released, "labelFingerprint": fingerprint_of(&admin)})
        )
    );
    assert_eq!(fake.state().labels(ZONE, name).unwrap(), released);
    let setlabels_posts = fake
        .state()
        .seen
        .iter()
        .filter(|s| s.method == "POST" && s.path.ends_with(&format!("/instances/{name}/setLabels")))
        .count();
    assert_eq!(setlabels_posts, 2);

    // Released: it keeps running, says so, and no list shows it.
    let got = gcp.get(&id).await.unwrap();
    assert_eq!(
        got.owner,
        Ownership {
            released: true,
            ..Ownership::of(&req)
        }
    );
    assert!(gcp.list_by_tag().await.unwrap().is_empty());
    assert_eq!(fake.state().instances(), [(ZONE.to_owned(), name.to_owned())]);

    // Releasing again sends nothing: the labels already say so.
    gcp.release(&id).await.unwrap();
    assert_eq!(fake.state().label_sets.len(), 2);

    // A fingerprint that keeps going stale is Transient, after a bounded number of tries.
    let other = request("3f0c0c5e-0000-4000-8000-000000000041");
    let other_id = gcp.create(&other).await.unwrap();
    let stale = Fault {
        method: "POST".into(),
        path_contains: "/setLabels".into(),
        status: 412,
        reason: "conditionNotMet".into(),
    };
    fake.state().inject(stale.clone(), 5);
    let err = gcp.release(&other_id).await.unwrap_err();
    assert_eq!(err.class, ErrorClass::Transient, "{err}");
    assert!(err.to_string().contains("412"), "{err}");
    assert!(
        fake.state().label_sets.len() == 2,
        "every try met the injected 412"
    );
    // Other refusals keep their class; a VM gone before setLabels is released.
    for (status, reason, class) in [
        (403, "forbidden", Some(ErrorClass::Permanent)),
        (503, "unavailable", Some(ErrorClass::Transient)),
        (404, "notFound", None),
    ] {
        fake.state().inject(
            Fault {
                status,
                reason: reason.into(),
                ..stale.clone()
            },
            1,
        );
        match (gcp.release(&other_id).await, class) {
            (Err(e), Some(class)) => assert_eq!(e.class, class, "{e}"),
            (Ok(()), None) => {}
            (answer, _) => panic!("{status} {reason}: {answer:?}"),
        }
    }
    assert_eq!(
        fake.state().labels(ZONE, other.name.as_str()).unwrap()["egress-proxies-managed"],
        "true",
        "nothing got through so far"
    );
    gcp.release(&other_id).await.unwrap();
    assert_eq!(
        fake.state().labels(ZONE, other.name.as_str()).unwrap(),
        released_labels(&other.uid, &[])
    );

    // Releasing a VM that is gone succeeds.
    let third = request("3f0c0c5e-0000-4000-8000-000000000042");
    let third_id = gcp.create(&third).await.unwrap();
    gcp.delete(&third_id).await.unwrap();
    support::eventually("deleted", Duration::from_secs(5), async || {
        gcp.get(&third_id)
            .await
            .err()
            .filter(|e| e.class == ErrorClass::NotFound)
    })
    .await;
    let sets_before = fake.state().label_sets.len();
    gcp.release(&third_id).await.unwrap();
    assert_eq!(fake.state().label_sets.len(), sets_before);
}

/// One installation's state: its own store (its live Proxies) and provider.
struct Installation {
    scope: gc::Scope,
    providers: Providers,
    gcp: Arc<egress_proxies::adapters::providers::gcp::GcpProvider>,
    store: EmbeddedStore,
    live_uid: String,
    _dir: tempfile::TempDir,
}

impl Installation {
    async fn new(fake: &FakeCompute, id: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let (store, _events) = EmbeddedStore::open(&dir.path().join("state")).unwrap();
        let proxy: Proxy = serde_json::from_value(json!({
            "apiVersion": "crawl.example.com/v1alpha1", "kind": "Proxy",
            "metadata": {"name": "live", "namespace": "crawl"},
            "spec": {"mode": "Managed", "provider": "gcp-test"}
        }))
        .unwrap();
        let key = ObjectKey::new("crawl", "live");
        store
            .apply(&ManifestSet {
                proxies: [(key.clone(), proxy)].into(),
                ..Default::default()
            })
            .unwrap();
        let live_uid = egress_proxies::domain::resource_store::ProxyStore::get(&store, &key)
            .await
            .unwrap()
            .unwrap()
            .metadata
            .uid
            .unwrap();
        let gcp = Arc::new(provider(fake, key_file(dir.path(), fake), false));
        Self {
            scope: gc::Scope {
                installation: id.parse().unwrap(),
                namespaces: None,
            },
            providers: egress_proxies::adapters::providers::decorated([gcp.clone() as Arc<dyn Provider>]),
            gcp,
            store,
            live_uid,
            _dir: dir,
        }
    }

    /// Creates a VM for Proxy `uid` as this installation; returns its name.
    async fn create(&self, uid: &str) -> (String, ProviderId) {
        let mut req = request(uid);
        req.installation = self.scope.installation.clone();
        let id = self.gcp.create(&req).await.unwrap();
        (req.name.as_str().to_owned(), id)
    }
}

#[tokio::test]
async fn two_installations_in_one_project_reap_only_their_own_orphans() {
    let fake = FakeCompute::start("crawl-test").unwrap();
    fake.state().step = Duration::from_millis(100);
    let a = Installation::new(&fake, "inst-a").await;
    let b = Installation::new(&fake, "inst-b").await;
    assert_ne!(a.live_uid, b.live_uid);

    let (a_live, _) = a.create(&a.live_uid).await;
    let (b_live, _) = b.create(&b.live_uid).await;
    // True orphans: their Proxies are gone from their installation's store.
    let (a_orphan, _) = a.create("3f0c0c5e-0000-4000-8000-0000000000a0").await;
    let (b_orphan, _) = b.create("3f0c0c5e-0000-4000-8000-0000000000b0").await;
    // Left to its admin with skip-cleanup; its Proxy is gone too.
    let (a_released, released_id) = a.create("3f0c0c5e-0000-4000-8000-0000000000a1").await;
    a.gcp.release(&released_id).await.unwrap();
    // An earlier version's VM: managed and UID labels, no installation.
    let mut legacy = fake.state().inserted[0].clone();
    let legacy_name = "proxy-legacy0000000000".to_owned();
    legacy["name"] = json!(legacy_name);
    legacy["labels"] = json!({"egress-proxies-managed": "true", "egress-proxies-uid": "3f0c0c5e-0000-4000-8000-0000000000c0"});
    fake.state().seed(ZONE, legacy);
    let legacy_id = ProviderId(format!("zones/{ZONE}/instances/{legacy_name}"));

    // Each installation's provider lists every managed VM, the released one by neither.
    for inst in [&a, &b] {
        let listed = inst.gcp.list_by_tag().await.unwrap();
        let names: BTreeSet<&str> = listed
            .iter()
            .map(|i| i.id.as_str().rsplit('/').next().unwrap())
            .collect();
        let want: BTreeSet<&str> = [&a_live, &b_live, &a_orphan, &b_orphan, &legacy_name]
            .into_iter()
            .map(String::as_str)
            .collect();
        assert_eq!(names, want);
        let legacy_listed = listed.iter().find(|i| i.id == legacy_id).unwrap();
        assert_eq!(inst.scope.judges(legacy_listed), Err(gc::NotOurs::Untagged));
    }

    let grace = Duration::from_millis(50);
    // Time passes (not a wait for anything): every VM is now older than the grace period.
    tokio::time::sleep(Duration::from_millis(120)).await;
    let mut deleted_by: [BTreeSet<String>; 2] = Default::default();
    for round in 0..10 {
        for (n, inst) in [&a, &b].into_iter().enumerate() {
            let seen_before = fake.state().seen.len();
            let report = gc::sweep(
                &inst.store,
                &inst.providers,
                &inst.scope,
                grace,
                jiff::Timestamp::now(),
            )
            .await
            .unwrap();
            for s in &fake.state().seen[seen_before..] {
                if s.method == "DELETE" {
                    deleted_by[n].insert(s.path.rsplit('/').next().unwrap().to_owned());
                }
            }
            assert!(report.skipped_providers.is_empty(), "{report:?}");
            assert_eq!(
                report.untagged,
                [("gcp-test".to_owned(), legacy_id.clone())],
                "round {round}"
            );
            assert!(
                report.not_ours[&("gcp-test".to_owned(), gc::NotOurs::OtherInstallation)] >= 1,
                "the other's live VM is seen and left: {report:?}"
            );
            assert_eq!(
                report.not_ours[&("gcp-test".to_owned(), gc::NotOurs::Released)],
                0,
                "a released VM is not even listed"
            );
        }
        // Rounds apart, as sweeps are.
        tokio::time::sleep(Duration::from_millis(40)).await;
    }
    assert_eq!(
        deleted_by[0],
        BTreeSet::from([a_orphan.clone()]),
        "A deletes only its orphan"
    );
    assert_eq!(
        deleted_by[1],
        BTreeSet::from([b_orphan.clone()]),
        "B deletes only its orphan"
    );

    let mut left: Vec<String> = fake.state().instances().into_iter().map(|(_, n)| n).collect();
    left.sort();
    let mut want = vec![a_live, b_live, a_released.clone(), legacy_name];
    want.sort();
    assert_eq!(left, want, "both orphans reaped, everything else alive");
    let labels = fake.state().labels(ZONE, &a_released).unwrap();
    assert_eq!(labels["egress-proxies-released"], "true");
    assert!(labels.get("egress-proxies-managed").is_none(), "{labels}");
    assert_eq!(labels["egress-proxies-installation"], "inst-a");
}
