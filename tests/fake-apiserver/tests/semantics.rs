//! The fake's own tests: each Kubernetes API semantic it claims, checked
//! through a real `kube::Client` over HTTP.

use std::time::Duration;

use fake_apiserver::FakeApiServer;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{
    Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::json;

async fn client(fake: &FakeApiServer) -> kube::Client {
    let config = kube::Config::new(fake.url().parse().unwrap());
    kube::Client::try_from(config).unwrap()
}

fn proxies(client: &kube::Client) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("crawl.example.com", "v1alpha1", "Proxy"),
        "proxies",
    );
    Api::namespaced_with(client.clone(), "ns", &ar)
}

fn proxy(name: &str, spec: serde_json::Value) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "crawl.example.com/v1alpha1", "kind": "Proxy",
        "metadata": {"name": name, "labels": {"app": "edge"}}, "spec": spec
    }))
    .unwrap()
}

fn code(e: kube::Error) -> u16 {
    match e {
        kube::Error::Api(s) => s.code,
        other => panic!("not an API error: {other}"),
    }
}

fn rv(o: &DynamicObject) -> u64 {
    o.metadata.resource_version.as_deref().unwrap().parse().unwrap()
}

#[actix_rt::test]
async fn create_assigns_identity_and_refuses_duplicates() {
    let fake = FakeApiServer::start().unwrap();
    let api = proxies(&client(&fake).await);
    let a = api
        .create(&PostParams::default(), &proxy("a", json!({"mode": "External"})))
        .await
        .unwrap();
    assert!(a.metadata.uid.is_some() && a.metadata.creation_timestamp.is_some());
    assert_eq!(a.metadata.generation, Some(1));
    assert_eq!(a.metadata.namespace.as_deref(), Some("ns"));
    let b = api
        .create(&PostParams::default(), &proxy("b", json!({})))
        .await
        .unwrap();
    assert!(rv(&b) > rv(&a), "one counter for the whole server");
    let dup = api
        .create(&PostParams::default(), &proxy("a", json!({})))
        .await
        .unwrap_err();
    assert_eq!(code(dup), 409);
    assert_eq!(code(api.get("missing").await.unwrap_err()), 404);
    // generateName
    let secrets: Api<Secret> = Api::namespaced(client(&fake).await, "ns");
    let mut s = Secret::default();
    s.metadata.generate_name = Some("gen-".into());
    let made = secrets.create(&PostParams::default(), &s).await.unwrap();
    assert!(made.metadata.name.unwrap().starts_with("gen-"));
}

#[actix_rt::test]
async fn status_subresource_and_generation() {
    let fake = FakeApiServer::start().unwrap();
    let api = proxies(&client(&fake).await);
    api.create(&PostParams::default(), &proxy("a", json!({"port": 1})))
        .await
        .unwrap();
    // Status through the subresource does not touch spec or generation.
    let s = api
        .patch_status(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Ready"}, "spec": {"port": 9}})),
        )
        .await
        .unwrap();
    assert_eq!(s.data["status"]["phase"], "Ready");
    assert_eq!(s.data["spec"]["port"], 1);
    assert_eq!(s.metadata.generation, Some(1));
    // A main-resource write keeps the status and bumps generation only for spec changes.
    let labelled = api
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}, "status": {"phase": "Failed"}})),
        )
        .await
        .unwrap();
    assert_eq!(labelled.metadata.generation, Some(1));
    assert_eq!(
        labelled.data["status"]["phase"], "Ready",
        "status is not written through the main resource"
    );
    let changed = api
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"port": 2}})),
        )
        .await
        .unwrap();
    assert_eq!(changed.metadata.generation, Some(2));
    // A no-op write leaves the resourceVersion alone.
    let same = api
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"port": 2}})),
        )
        .await
        .unwrap();
    assert_eq!(rv(&same), rv(&changed));
}

#[actix_rt::test]
async fn stale_writes_conflict_and_json_patch_tests_guard() {
    let fake = FakeApiServer::start().unwrap();
    let api = proxies(&client(&fake).await);
    let a = api
        .create(&PostParams::default(), &proxy("a", json!({"port": 1})))
        .await
        .unwrap();
    let mut newer = a.clone();
    newer.data["spec"]["port"] = json!(2);
    api.replace("a", &PostParams::default(), &newer).await.unwrap();
    let mut stale = a.clone();
    stale.data["spec"]["port"] = json!(3);
    assert_eq!(
        code(
            api.replace("a", &PostParams::default(), &stale)
                .await
                .unwrap_err()
        ),
        409
    );
    // JSON patch with a failing `test` changes nothing.
    let ops: json_patch::Patch = serde_json::from_value(json!([
        {"op": "test", "path": "/metadata/finalizers", "value": ["other"]},
        {"op": "replace", "path": "/spec/port", "value": 7}
    ]))
    .unwrap();
    let err = api
        .patch("a", &PatchParams::default(), &Patch::Json::<()>(ops))
        .await
        .unwrap_err();
    assert_eq!(code(err), 422);
    assert_eq!(api.get("a").await.unwrap().data["spec"]["port"], 2);
    // A merge patch carrying a stale resourceVersion conflicts too.
    let err = api
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"resourceVersion": "1"}, "spec": {"port": 8}})),
        )
        .await
        .unwrap_err();
    assert_eq!(code(err), 409);
}

#[actix_rt::test]
async fn finalizers_hold_deleted_objects() {
    let fake = FakeApiServer::start().unwrap();
    let api = proxies(&client(&fake).await);
    let mut p = proxy("a", json!({}));
    p.metadata.finalizers = Some(vec!["x/one".into(), "x/two".into()]);
    api.create(&PostParams::default(), &p).await.unwrap();
    api.delete("a", &DeleteParams::default()).await.unwrap();
    let held = api.get("a").await.unwrap();
    assert!(
        held.metadata.deletion_timestamp.is_some(),
        "delete with finalizers only marks"
    );
    let err = api
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": ["x/one", "x/two", "x/three"]}})),
        )
        .await
        .unwrap_err();
    assert_eq!(code(err), 422, "no new finalizers while deleting");
    api.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": ["x/two"]}})),
    )
    .await
    .unwrap();
    assert!(api.get("a").await.is_ok());
    api.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    assert_eq!(
        code(api.get("a").await.unwrap_err()),
        404,
        "the last finalizer's removal deletes"
    );
    // Without finalizers a delete is immediate.
    api.create(&PostParams::default(), &proxy("b", json!({})))
        .await
        .unwrap();
    api.delete("b", &DeleteParams::default()).await.unwrap();
    assert_eq!(code(api.get("b").await.unwrap_err()), 404);
}

#[actix_rt::test]
async fn label_and_field_selectors() {
    let fake = FakeApiServer::start().unwrap();
    let c = client(&fake).await;
    let secrets: Api<Secret> = Api::namespaced(c.clone(), "ns");
    for (name, labels) in [
        ("a", json!({"tier": "edge", "ci": "true"})),
        ("b", json!({"tier": "core"})),
        ("c", json!({})),
    ] {
        let s: Secret =
            serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}})).unwrap();
        secrets.create(&PostParams::default(), &s).await.unwrap();
    }
    let names = |list: kube::core::ObjectList<Secret>| -> Vec<String> {
        list.items.into_iter().map(|s| s.metadata.name.unwrap()).collect()
    };
    for (selector, want) in [
        ("ci=true", vec!["a"]),
        ("tier!=edge", vec!["b", "c"]),
        ("tier in (edge,core)", vec!["a", "b"]),
        ("tier notin (edge)", vec!["b", "c"]),
        ("tier", vec!["a", "b"]),
        ("!tier", vec!["c"]),
    ] {
        let got = names(
            secrets
                .list(&ListParams::default().labels(selector))
                .await
                .unwrap(),
        );
        assert_eq!(got, want, "{selector}");
    }
    let got = names(
        secrets
            .list(&ListParams::default().fields("metadata.name=b"))
            .await
            .unwrap(),
    );
    assert_eq!(got, ["b"]);
    let all: Api<Secret> = Api::all(c);
    assert_eq!(all.list(&ListParams::default()).await.unwrap().items.len(), 3);
}

#[actix_rt::test]
async fn watch_resumes_expires_and_bookmarks() {
    let fake = FakeApiServer::start().unwrap();
    let api = proxies(&client(&fake).await);
    let a = api
        .create(&PostParams::default(), &proxy("a", json!({})))
        .await
        .unwrap();
    api.create(&PostParams::default(), &proxy("b", json!({})))
        .await
        .unwrap();
    // Resume after a's creation: b's ADDED, then live events.
    let mut stream = api
        .watch(
            &WatchParams::default().timeout(5),
            &a.metadata.resource_version.clone().unwrap(),
        )
        .await
        .unwrap()
        .boxed();
    let first = stream.try_next().await.unwrap().unwrap();
    assert!(matches!(first, WatchEvent::Added(o) if o.metadata.name.as_deref() == Some("b")));
    api.delete("a", &DeleteParams::default()).await.unwrap();
    let next = stream.try_next().await.unwrap().unwrap();
    assert!(matches!(next, WatchEvent::Deleted(o) if o.metadata.name.as_deref() == Some("a")));

    // Bookmarks carry the current version.
    let mut params = WatchParams::default().timeout(5);
    params.bookmarks = true;
    let mut marked = api.watch(&params, "0").await.unwrap().boxed();
    let mut saw_bookmark = false;
    for _ in 0..3 {
        if let Ok(Some(Ok(WatchEvent::Bookmark(_)))) =
            tokio::time::timeout(Duration::from_secs(3), marked.next()).await
        {
            saw_bookmark = true;
            break;
        }
    }
    assert!(saw_bookmark);

    // A version older than the kept history is Gone.
    fake.state.lock().unwrap().compact();
    api.create(&PostParams::default(), &proxy("c", json!({})))
        .await
        .unwrap();
    let mut expired = api
        .watch(&WatchParams::default().timeout(5), "2")
        .await
        .unwrap()
        .boxed();
    match expired.try_next().await.unwrap().unwrap() {
        WatchEvent::Error(e) => assert_eq!(e.code, 410),
        other => panic!("expected 410 Gone, got {other:?}"),
    }
}

#[actix_rt::test]
async fn core_and_coordination_kinds() {
    let fake = FakeApiServer::start().unwrap();
    let c = client(&fake).await;
    let pods: Api<Pod> = Api::namespaced(c.clone(), "ns");
    let pod: Pod = serde_json::from_value(
        json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "squid", "image": "squid"}]}}),
    )
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let s = pods
        .patch_status(
            "p",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Running", "podIP": "10.0.0.9"}})),
        )
        .await
        .unwrap();
    assert_eq!(s.status.unwrap().pod_ip.as_deref(), Some("10.0.0.9"));

    let leases: Api<Lease> = Api::namespaced(c.clone(), "ns");
    let lease: Lease = serde_json::from_value(json!({"metadata": {"name": "leader"}, "spec": {"holderIdentity": "one", "leaseDurationSeconds": 15}})).unwrap();
    let made = leases.create(&PostParams::default(), &lease).await.unwrap();
    let mut taken = made.clone();
    taken.spec.as_mut().unwrap().holder_identity = Some("two".into());
    leases
        .replace("leader", &PostParams::default(), &taken)
        .await
        .unwrap();
    let mut late = made;
    late.spec.as_mut().unwrap().holder_identity = Some("three".into());
    assert_eq!(
        code(
            leases
                .replace("leader", &PostParams::default(), &late)
                .await
                .unwrap_err()
        ),
        409,
        "optimistic concurrency decides the leader"
    );

    let events: Api<DynamicObject> = Api::namespaced_with(
        c,
        "ns",
        &ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("events.k8s.io", "v1", "Event"), "events"),
    );
    let ev: DynamicObject = serde_json::from_value(json!({"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"generateName": "px."}, "reason": "PhaseChanged", "note": "Ready"})).unwrap();
    events.create(&PostParams::default(), &ev).await.unwrap();
    assert_eq!(events.list(&ListParams::default()).await.unwrap().items.len(), 1);

    // CustomResourceDefinitions are cluster-scoped.
    let crds: Api<DynamicObject> = Api::all_with(
        client(&fake).await,
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("apiextensions.k8s.io", "v1", "CustomResourceDefinition"),
            "customresourcedefinitions",
        ),
    );
    let crd: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "proxies.crawl.example.com"},
        "spec": {"group": "crawl.example.com", "scope": "Namespaced", "names": {"kind": "Proxy", "plural": "proxies"}}
    }))
    .unwrap();
    let made = crds.create(&PostParams::default(), &crd).await.unwrap();
    assert_eq!(made.metadata.namespace, None);
    assert!(crds.get("proxies.crawl.example.com").await.is_ok());
}

fn pools(client: &kube::Client) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("crawl.example.com", "v1alpha1", "ProxyPool"),
        "proxypools",
    );
    Api::namespaced_with(client.clone(), "ns", &ar)
}

fn pool(name: &str, replicas: u32) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "crawl.example.com/v1alpha1", "kind": "ProxyPool",
        "metadata": {"name": name}, "spec": {"replicas": replicas, "template": {"spec": {}}}
    }))
    .unwrap()
}

fn owned_by(name: &str, owners: &[&DynamicObject]) -> DynamicObject {
    let mut p = proxy(name, json!({}));
    p.metadata.owner_references = Some(
        owners
            .iter()
            .map(
                |o| k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                    api_version: "crawl.example.com/v1alpha1".into(),
                    kind: "ProxyPool".into(),
                    name: o.metadata.name.clone().unwrap(),
                    uid: o.metadata.uid.clone().unwrap(),
                    controller: Some(true),
                    block_owner_deletion: Some(true),
                },
            )
            .collect(),
    );
    p
}

#[actix_rt::test]
async fn deleting_an_owner_collects_its_dependents() {
    let fake = FakeApiServer::start().unwrap();
    let client = client(&fake).await;
    let (pools, api) = (pools(&client), proxies(&client));
    let a = pools.create(&PostParams::default(), &pool("a", 1)).await.unwrap();
    let b = pools.create(&PostParams::default(), &pool("b", 1)).await.unwrap();
    api.create(&PostParams::default(), &owned_by("only-a", &[&a]))
        .await
        .unwrap();
    let mut held = owned_by("held", &[&a]);
    held.metadata.finalizers = Some(vec!["x/one".into()]);
    api.create(&PostParams::default(), &held).await.unwrap();
    api.create(&PostParams::default(), &owned_by("both", &[&a, &b]))
        .await
        .unwrap();
    api.create(&PostParams::default(), &owned_by("only-b", &[&b]))
        .await
        .unwrap();

    pools.delete("a", &DeleteParams::default()).await.unwrap();
    assert_eq!(code(api.get("only-a").await.unwrap_err()), 404, "collected");
    let held = api.get("held").await.unwrap();
    assert!(
        held.metadata.deletion_timestamp.is_some(),
        "a dependent's finalizers hold it as usual"
    );
    let both = api.get("both").await.unwrap();
    let owners: Vec<_> = both
        .metadata
        .owner_references
        .unwrap()
        .into_iter()
        .map(|r| r.name)
        .collect();
    assert_eq!(owners, ["b"], "an owner left: only the dangling reference goes");

    // Orphan propagation keeps the dependent, without the reference.
    pools.delete("b", &DeleteParams::orphan()).await.unwrap();
    for name in ["both", "only-b"] {
        let kept = api.get(name).await.unwrap();
        assert!(
            kept.metadata.deletion_timestamp.is_none(),
            "{name} orphaned, not deleted"
        );
        assert!(kept.metadata.owner_references.unwrap_or_default().is_empty());
    }
    pools.create(&PostParams::default(), &pool("c", 1)).await.unwrap();
    let err = pools.delete("c", &DeleteParams::foreground()).await.unwrap_err();
    assert_eq!(code(err), 422, "foreground deletion is refused, not faked");
    assert!(pools.get("c").await.is_ok());
}

#[actix_rt::test]
async fn the_scale_subresource_reads_and_writes_spec_replicas() {
    let fake = FakeApiServer::start().unwrap();
    let pools = pools(&client(&fake).await);
    pools
        .create(&PostParams::default(), &pool("eu", 2))
        .await
        .unwrap();
    pools
        .patch_status(
            "eu",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"replicas": 1, "selector": "crawl.example.com/pool=eu"}})),
        )
        .await
        .unwrap();
    let scale = pools.get_scale("eu").await.unwrap();
    assert_eq!(scale.spec.unwrap().replicas, Some(2));
    let status = scale.status.unwrap();
    assert_eq!(
        (status.replicas, status.selector.as_deref()),
        (1, Some("crawl.example.com/pool=eu"))
    );

    let scaled = pools
        .patch_scale(
            "eu",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 5}})),
        )
        .await
        .unwrap();
    assert_eq!(scaled.spec.unwrap().replicas, Some(5));
    let after = pools.get("eu").await.unwrap();
    assert_eq!(after.data["spec"]["replicas"], 5);
    assert_eq!(after.metadata.generation, Some(2), "a spec change");
    assert_eq!(after.data["status"]["replicas"], 1, "status untouched");
    let err = pools
        .patch_scale(
            "eu",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": -1}})),
        )
        .await
        .unwrap_err();
    assert_eq!(code(err), 422);
    // Proxies have no scale subresource.
    let err = proxies(&client(&fake).await).get_scale("x").await.unwrap_err();
    assert_eq!(code(err), 404);
}

#[actix_rt::test]
async fn an_outage_refuses_and_cuts_connections_and_the_restart_expires_old_versions() {
    let fake = FakeApiServer::start().unwrap();
    let api = proxies(&client(&fake).await);
    let a = api
        .create(&PostParams::default(), &proxy("a", json!({})))
        .await
        .unwrap();
    let mut watch = api
        .watch(
            &WatchParams::default().timeout(60),
            &a.metadata.resource_version.clone().unwrap(),
        )
        .await
        .unwrap()
        .boxed();
    // Another path to the same server (another API server replica) stays up.
    let other = fake.link().unwrap();
    let other_api = proxies(&client(&other).await);

    fake.go_down().await;
    let cut = tokio::time::timeout(Duration::from_secs(10), watch.next())
        .await
        .expect("an open watch is cut when the server goes down");
    assert!(
        !matches!(cut, Some(Ok(_))),
        "no event, the stream ends or fails: {cut:?}"
    );
    assert!(
        tokio::net::TcpStream::connect(fake.addr).await.is_err(),
        "connections are refused while down"
    );
    assert!(api.get("a").await.is_err());
    // Changes made meanwhile through another path.
    other_api.delete("a", &DeleteParams::default()).await.unwrap();

    fake.come_back().await.unwrap();
    let fresh = proxies(&client(&fake).await);
    assert!(
        fresh.get_opt("a").await.unwrap().is_none(),
        "the objects are the server's"
    );
    // Resuming from before the restart is Expired; a list goes on.
    let mut resumed = fresh
        .watch(
            &WatchParams::default().timeout(5),
            &a.metadata.resource_version.clone().unwrap(),
        )
        .await
        .unwrap()
        .boxed();
    match resumed.try_next().await.unwrap().unwrap() {
        WatchEvent::Error(e) => assert_eq!((e.code, e.reason.as_str()), (410, "Expired")),
        other => panic!("expected 410 Expired, got {other:?}"),
    }
    let list = fresh.list(&ListParams::default()).await.unwrap();
    assert!(list.items.is_empty());
    // A watch from the version the list returned is fine.
    let from = list.metadata.resource_version.unwrap();
    let mut live = fresh
        .watch(&WatchParams::default().timeout(5), &from)
        .await
        .unwrap()
        .boxed();
    fresh
        .create(&PostParams::default(), &proxy("b", json!({})))
        .await
        .unwrap();
    let next = live.try_next().await.unwrap().unwrap();
    assert!(matches!(next, WatchEvent::Added(o) if o.metadata.name.as_deref() == Some("b")));
}

#[actix_rt::test]
async fn managed_fields_name_each_writer_and_clients_cannot_set_them() {
    use k8s_openapi::api::core::v1::ConfigMap;
    let fake = FakeApiServer::start().unwrap();
    let api: Api<ConfigMap> = Api::namespaced(client(&fake).await, "ns");
    let mut cm: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "c", "managedFields": [{"manager": "forged", "operation": "Update"}]},
        "data": {"k": "v"}
    }))
    .unwrap();
    let by_operator = PostParams {
        field_manager: Some("operator".into()),
        ..PostParams::default()
    };
    let made = api.create(&by_operator, &cm).await.unwrap();
    let managers = |c: &ConfigMap| -> Vec<String> {
        c.metadata
            .managed_fields
            .iter()
            .flatten()
            .map(|e| e.manager.clone().unwrap())
            .collect()
    };
    assert_eq!(managers(&made), ["operator"]);
    let entry = &made.metadata.managed_fields.as_ref().unwrap()[0];
    assert_eq!(entry.operation.as_deref(), Some("Update"));
    assert!(entry.time.is_some());
    assert_eq!(
        entry.fields_v1.as_ref().unwrap().0,
        json!({"f:data": {"f:k": {}}})
    );

    // `kubectl label` patches with its own field manager.
    let labelled = api
        .patch(
            "c",
            &PatchParams {
                field_manager: Some("kubectl-label".into()),
                ..PatchParams::default()
            },
            &Patch::Merge(json!({"metadata": {"labels": {"team": "crawl"}}})),
        )
        .await
        .unwrap();
    assert_eq!(managers(&labelled), ["operator", "kubectl-label"]);
    let label_entry = &labelled.metadata.managed_fields.as_ref().unwrap()[1];
    assert_eq!(
        label_entry.fields_v1.as_ref().unwrap().0,
        json!({"f:metadata": {"f:labels": {"f:team": {}}}})
    );
    // A replace that leaves managedFields out (or sends its own) keeps the server's.
    cm = labelled.clone();
    cm.metadata.managed_fields = None;
    let unchanged = api.replace("c", &by_operator, &cm).await.unwrap();
    assert_eq!(
        unchanged.metadata.resource_version, labelled.metadata.resource_version,
        "a no-op"
    );
    assert_eq!(managers(&unchanged), ["operator", "kubectl-label"]);
    // Without a fieldManager the User-Agent names the writer.
    cm.data = Some([("k".to_owned(), "w".to_owned())].into());
    let anonymous = api.replace("c", &PostParams::default(), &cm).await.unwrap();
    assert_eq!(managers(&anonymous).len(), 3, "{:?}", managers(&anonymous));
}

#[actix_rt::test]
async fn a_denying_admission_webhook_refuses_writes_of_what_it_matches() {
    use k8s_openapi::api::core::v1::ConfigMap;
    let fake = FakeApiServer::start().unwrap();
    let api: Api<ConfigMap> = Api::namespaced(client(&fake).await, "ns");
    let cm = |name: &str| -> ConfigMap {
        serde_json::from_value(json!({"metadata": {"name": name}, "data": {"k": "v"}})).unwrap()
    };
    api.create(&PostParams::default(), &cm("held-1")).await.unwrap();
    fake.state.lock().unwrap().deny(fake_apiserver::Denial {
        webhook: "policy.example.com".into(),
        resource: "configmaps".into(),
        name_prefix: "held-".into(),
        message: "frozen".into(),
    });
    let refused = api
        .create(&PostParams::default(), &cm("held-2"))
        .await
        .unwrap_err();
    let kube::Error::Api(status) = refused else {
        panic!("not an API error")
    };
    assert_eq!(status.code, 403);
    assert_eq!(
        status.message,
        r#"admission webhook "policy.example.com" denied the request: frozen"#
    );
    let current = api.get("held-1").await.unwrap();
    assert_eq!(
        code(
            api.replace("held-1", &PostParams::default(), &current)
                .await
                .unwrap_err()
        ),
        403
    );
    assert_eq!(
        code(api.delete("held-1", &DeleteParams::default()).await.unwrap_err()),
        403
    );
    // Reads and other names pass.
    api.create(&PostParams::default(), &cm("other")).await.unwrap();
    fake.state.lock().unwrap().allow_all();
    api.create(&PostParams::default(), &cm("held-2")).await.unwrap();
}

/// A streaming list (`sendInitialEvents`, what newer kubectl and client-go
/// send): the objects as ADDED, then a bookmark marking their end, then the
/// watch goes on; without `resourceVersionMatch=NotOlderThan` it is refused.
#[actix_rt::test]
async fn streaming_list_ends_its_initial_events_with_a_bookmark() {
    let fake = FakeApiServer::start().unwrap();
    let api = proxies(&client(&fake).await);
    for name in ["a", "b"] {
        api.create(&PostParams::default(), &proxy(name, json!({})))
            .await
            .unwrap();
    }
    let mut streaming = WatchParams::default().timeout(5);
    streaming.send_initial_events = true;
    streaming.bookmarks = true;
    let mut stream = api.watch(&streaming, "").await.unwrap().boxed();
    let mut added = Vec::new();
    let end = loop {
        match stream.try_next().await.unwrap().unwrap() {
            WatchEvent::Added(o) => added.push(o.metadata.name.unwrap()),
            WatchEvent::Bookmark(b) => break b,
            other => panic!("unexpected {other:?}"),
        }
    };
    assert_eq!(added, ["a", "b"]);
    assert_eq!(
        end.metadata
            .annotations
            .get("k8s.io/initial-events-end")
            .map(String::as_str),
        Some("true")
    );
    api.create(&PostParams::default(), &proxy("c", json!({})))
        .await
        .unwrap();
    let next = stream.try_next().await.unwrap().unwrap();
    assert!(matches!(next, WatchEvent::Added(o) if o.metadata.name.as_deref() == Some("c")));

    // The API server demands resourceVersionMatch=NotOlderThan with it
    // (kube always sends it: asked over a plain connection).
    use std::io::{Read, Write};
    let mut conn = std::net::TcpStream::connect(fake.addr).unwrap();
    write!(
        conn,
        "GET /apis/crawl.example.com/v1alpha1/namespaces/ns/proxies?watch=true&sendInitialEvents=true&allowWatchBookmarks=true HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    conn.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 422"), "{answer}");
    assert!(answer.contains("NotOlderThan"), "{answer}");
}

#[actix_rt::test]
async fn a_config_map_over_one_mebibyte_is_invalid_and_bodies_up_to_three_are_read() {
    use k8s_openapi::api::core::v1::ConfigMap;
    let fake = FakeApiServer::start().unwrap();
    let maps: Api<ConfigMap> = Api::namespaced(client(&fake).await, "ns");
    let map = |name: &str, bytes: usize| -> ConfigMap {
        serde_json::from_value(json!({
            "metadata": {"name": name},
            "data": {"state": "x".repeat(bytes)}
        }))
        .unwrap()
    };
    // 900 KiB: more than a default web framework reads, well within the API's limits.
    let created = maps
        .create(&PostParams::default(), &map("fits", 900 * 1024))
        .await;
    assert!(created.is_ok(), "{created:?}");
    let mut grown = created.unwrap();
    grown
        .data
        .as_mut()
        .unwrap()
        .insert("state".into(), "x".repeat(1024 * 1024));
    let refused = maps
        .replace("fits", &PostParams::default(), &grown)
        .await
        .unwrap_err();
    assert_eq!(
        code(refused),
        422,
        "data over 1 MiB: invalid, as the API server says"
    );
    let refused = maps
        .create(&PostParams::default(), &map("too-long", 2 * 1024 * 1024))
        .await
        .unwrap_err();
    assert_eq!(code(refused), 422, "a 2 MiB body is read, then found too long");
    assert!(maps.get_opt("too-long").await.unwrap().is_none());
}
