//! Pools in the embedded store: members are the operator's, kept across
//! manifest scans and restarts, and deleted when their pool goes.

use serde_json::json;

use super::*;
use crate::domain::pool::{new_member, template_hash};

fn pool(name: &str, replicas: u32) -> ProxyPool {
    serde_json::from_value(json!({
        "apiVersion": "crawl.example.com/v1alpha1", "kind": "ProxyPool",
        "metadata": {"name": name, "namespace": "ns"},
        "spec": {"replicas": replicas, "template": {"spec": {"mode": "Managed", "provider": "local"}}}
    }))
    .unwrap()
}

fn pools(declared: &[ProxyPool]) -> ManifestSet {
    ManifestSet {
        pools: declared
            .iter()
            .map(|p| (crate::domain::resource_store::pool_key(p), p.clone()))
            .collect(),
        ..Default::default()
    }
}

fn drain(rx: &mut mpsc::UnboundedReceiver<StoreEvent>) -> Vec<StoreEvent> {
    std::iter::from_fn(|| rx.try_recv().ok()).collect()
}

async fn stored_pool(store: &EmbeddedStore, name: &str) -> ProxyPool {
    store
        .get_pool(&ObjectKey::new("ns", name))
        .await
        .unwrap()
        .unwrap()
}

#[tokio::test]
async fn members_outlive_manifest_scans_and_restarts_and_go_with_their_pool() {
    let dir = tempfile::tempdir().unwrap();
    let (store, mut rx) = EmbeddedStore::open(dir.path()).unwrap();
    let mut pool_rx = store.pool_events().unwrap();
    assert!(store.pool_events().is_none(), "one subscriber");
    store.apply(&pools(&[pool("eu", 2)])).unwrap();
    assert_eq!(
        drain(&mut pool_rx),
        vec![StoreEvent::Changed(ObjectKey::new("ns", "eu"))]
    );
    let eu = stored_pool(&store, "eu").await;
    assert_eq!(eu.metadata.generation, Some(1));

    let member = new_member(&eu, "bcdfg", &template_hash(&eu.spec.template));
    store.create_member(&member).await.unwrap();
    let key = ObjectKey::new("ns", "eu-bcdfg");
    assert_eq!(drain(&mut rx), vec![StoreEvent::Changed(key.clone())]);
    assert!(matches!(
        store.create_member(&member).await,
        Err(StoreError::AlreadyExists(k)) if k == key
    ));
    let uid = store.get(&key).await.unwrap().unwrap().metadata.uid.unwrap();
    store.add_finalizer(&key, &uid).await.unwrap();

    // A manifest scan that does not mention the member leaves it alone.
    store.apply(&pools(&[pool("eu", 2)])).unwrap();
    assert_eq!(store.members(&eu).await.unwrap().len(), 1);
    assert_eq!(drain(&mut rx), vec![]);

    // Retiring is an annotation change: the member's actor hears of it.
    store
        .set_annotation(
            &key,
            &uid,
            crate::domain::resource::RETIRING_ANNOTATION,
            Some("x"),
        )
        .await
        .unwrap();
    assert_eq!(drain(&mut rx), vec![StoreEvent::Changed(key.clone())]);

    // The pool's status is kept; a restart finds pool, status and member.
    let status = ProxyPoolStatus {
        replicas: 1,
        ..Default::default()
    };
    store
        .write_pool_status(
            &ObjectKey::new("ns", "eu"),
            eu.metadata.uid.as_deref().unwrap(),
            &status,
        )
        .await
        .unwrap();
    drop(store);
    let (store, mut rx) = EmbeddedStore::open(dir.path()).unwrap();
    let eu = stored_pool(&store, "eu").await;
    assert_eq!(eu.status.as_ref().map(|s| s.replicas), Some(1));
    assert_eq!(store.members(&eu).await.unwrap().len(), 1);
    store.apply(&pools(&[pool("eu", 2)])).unwrap();
    assert_eq!(
        drain(&mut rx),
        vec![],
        "the restart's first scan keeps the member"
    );

    // The pool leaves the manifests: its member is deleted (held by its finalizer).
    store.apply(&pools(&[])).unwrap();
    assert_eq!(drain(&mut rx), vec![StoreEvent::Changed(key.clone())]);
    let deleting = store.get(&key).await.unwrap().unwrap();
    assert!(deleting.metadata.deletion_timestamp.is_some());
    store.remove_finalizer(&key, &uid).await.unwrap();
    assert!(store.get(&key).await.unwrap().is_none());
    assert!(store.pool_keys().await.unwrap().is_empty());
    assert!(
        store.create_member(&member).await.is_err(),
        "no member for a pool that is gone"
    );
}

#[tokio::test]
async fn a_pool_spec_change_bumps_its_generation_and_a_declared_proxy_cannot_take_a_members_name() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _rx) = EmbeddedStore::open(dir.path()).unwrap();
    store.apply(&pools(&[pool("eu", 2)])).unwrap();
    let eu = stored_pool(&store, "eu").await;
    store.create_member(&new_member(&eu, "bcdfg", "h")).await.unwrap();
    let mut set = pools(&[pool("eu", 3)]);
    let impostor: Proxy = serde_json::from_value(json!({
        "apiVersion": "crawl.example.com/v1alpha1", "kind": "Proxy",
        "metadata": {"name": "eu-bcdfg", "namespace": "ns"},
        "spec": {"mode": "Managed", "provider": "other"}
    }))
    .unwrap();
    set.proxies.insert(ObjectKey::of(&impostor), impostor);
    store.apply(&set).unwrap();
    let eu2 = stored_pool(&store, "eu").await;
    assert_eq!(eu2.metadata.generation, Some(2));
    assert_eq!(eu2.metadata.uid, eu.metadata.uid);
    let member = store
        .get(&ObjectKey::new("ns", "eu-bcdfg"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(member.spec.provider.as_deref(), Some("local"));
}

#[test]
fn a_pool_manifest_is_checked_like_the_crd_checks_it() {
    let ok = "apiVersion: crawl.example.com/v1alpha1\nkind: ProxyPool\nmetadata: {name: eu}\n\
              spec: {replicas: 2, template: {spec: {mode: Managed, provider: local}}}\n";
    let docs = parse_file(ok).unwrap();
    assert!(matches!(&docs[0], Document::Pool(p) if p.spec.replicas == 2));
    let both_zero = ok.replace("replicas: 2,", "replicas: 2, maxSurge: 0, maxUnavailable: 0,");
    let err = parse_file(&both_zero).unwrap_err();
    assert!(
        err.contains("maxSurge and maxUnavailable cannot both be 0"),
        "{err}"
    );
    let bad_age = ok.replace("replicas: 2,", "replicas: 2, rotation: {maxAge: 1d},");
    let err = parse_file(&bad_age).unwrap_err();
    assert!(err.contains("rotation.maxAge"), "{err}");
    let long = ok.replace("name: eu", &format!("name: {}", "a".repeat(60)));
    let err = parse_file(&long).unwrap_err();
    assert!(err.contains("at most 57 characters"), "{err}");
    let bad_template = ok.replace("mode: Managed, provider: local", "mode: External");
    let err = parse_file(&bad_template).unwrap_err();
    assert!(err.contains("template.spec"), "{err}");
}
