//! The embedded store plays the API server's part: these pin its semantics.

use super::*;
use crate::domain::resource::{Proxy, SecretKeyRef};
use serde_json::json;

fn proxy(name: &str, provider: &str) -> Proxy {
    serde_json::from_value(json!({
        "apiVersion": "crawl.example.com/v1alpha1", "kind": "Proxy",
        "metadata": {"name": name, "namespace": "ns"},
        "spec": {"mode": "Managed", "provider": provider}
    }))
    .unwrap()
}

fn set(proxies: &[Proxy]) -> ManifestSet {
    ManifestSet {
        proxies: proxies.iter().map(|p| (ObjectKey::of(p), p.clone())).collect(),
        ..Default::default()
    }
}

fn drain(rx: &mut mpsc::UnboundedReceiver<StoreEvent>) -> Vec<StoreEvent> {
    std::iter::from_fn(|| rx.try_recv().ok()).collect()
}

fn k(name: &str) -> ObjectKey {
    ObjectKey::new("ns", name)
}

#[tokio::test]
async fn creation_generation_and_events() {
    let dir = tempfile::tempdir().unwrap();
    let (store, mut rx) = EmbeddedStore::open(dir.path()).unwrap();
    store.apply(&set(&[proxy("a", "p")])).unwrap();
    assert_eq!(drain(&mut rx), vec![StoreEvent::Changed(k("a"))]);
    let a = store.get(&k("a")).await.unwrap().unwrap();
    assert_eq!(a.metadata.generation, Some(1));
    assert!(a.metadata.uid.is_some() && a.metadata.creation_timestamp.is_some());

    store.apply(&set(&[proxy("a", "p")])).unwrap();
    assert_eq!(drain(&mut rx), vec![], "no change, no event");

    let mut labelled = proxy("a", "p");
    labelled.metadata.labels = Some([("team".to_owned(), "x".to_owned())].into());
    store.apply(&set(&[labelled.clone()])).unwrap();
    assert_eq!(drain(&mut rx), vec![StoreEvent::Changed(k("a"))]);
    assert_eq!(
        store.get(&k("a")).await.unwrap().unwrap().metadata.generation,
        Some(1),
        "labels are not spec"
    );

    let mut changed = labelled;
    changed.spec.provider = Some("q".into());
    store.apply(&set(&[changed])).unwrap();
    let a2 = store.get(&k("a")).await.unwrap().unwrap();
    assert_eq!(a2.metadata.generation, Some(2));
    assert_eq!(a2.metadata.uid, a.metadata.uid, "same incarnation");
}

#[tokio::test]
async fn removal_honours_finalizers_and_a_readded_manifest_waits_for_the_old_incarnation() {
    let dir = tempfile::tempdir().unwrap();
    let (store, mut rx) = EmbeddedStore::open(dir.path()).unwrap();
    store.apply(&set(&[proxy("a", "p"), proxy("b", "p")])).unwrap();
    let uid = store.get(&k("a")).await.unwrap().unwrap().metadata.uid.unwrap();
    store.add_finalizer(&k("a"), &uid).await.unwrap();
    drain(&mut rx);

    store.apply(&set(&[])).unwrap();
    let mut events = drain(&mut rx);
    events.sort_by_key(|e| format!("{e:?}"));
    assert_eq!(
        events,
        vec![StoreEvent::Changed(k("a")), StoreEvent::Removed(k("b"))]
    );
    assert!(
        store.get(&k("b")).await.unwrap().is_none(),
        "no finalizer: gone at once"
    );
    let held = store.get(&k("a")).await.unwrap().unwrap();
    assert!(held.metadata.deletion_timestamp.is_some());

    store.apply(&set(&[proxy("a", "p")])).unwrap();
    assert_eq!(
        store.get(&k("a")).await.unwrap().unwrap().metadata.uid.as_deref(),
        Some(uid.as_str()),
        "the deleting incarnation finishes first"
    );

    store.remove_finalizer(&k("a"), &uid).await.unwrap();
    assert_eq!(drain(&mut rx), vec![StoreEvent::Removed(k("a"))]);
    store.apply(&set(&[proxy("a", "p")])).unwrap();
    let reborn = store.get(&k("a")).await.unwrap().unwrap();
    assert_ne!(
        reborn.metadata.uid.as_deref(),
        Some(uid.as_str()),
        "a new incarnation"
    );
}

#[tokio::test]
async fn writes_for_another_incarnation_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _rx) = EmbeddedStore::open(dir.path()).unwrap();
    store.apply(&set(&[proxy("a", "p")])).unwrap();
    let err = store
        .write_status(&k("a"), "some-old-uid", &ProxyStatus::default())
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Gone { .. }), "{err}");
    let err = store.add_finalizer(&k("missing"), "x").await.unwrap_err();
    assert!(matches!(err, StoreError::Gone { .. }), "{err}");
}

#[tokio::test]
async fn state_survives_a_restart_and_a_second_operator_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let uid;
    {
        let (store, _rx) = EmbeddedStore::open(dir.path()).unwrap();
        store.apply(&set(&[proxy("a", "p")])).unwrap();
        uid = store.get(&k("a")).await.unwrap().unwrap().metadata.uid.unwrap();
        store.add_finalizer(&k("a"), &uid).await.unwrap();
        store
            .set_annotation(&k("a"), &uid, SPEC_HASH_ANNOTATION, Some("abc"))
            .await
            .unwrap();
        let status = ProxyStatus {
            provider_id: Some("instances/x".into()),
            ..Default::default()
        };
        store.write_status(&k("a"), &uid, &status).await.unwrap();
        assert!(matches!(
            EmbeddedStore::open(dir.path()),
            Err(EmbeddedStoreError::Locked(_))
        ));
        let snapshot = read_snapshot(dir.path()).unwrap();
        assert_eq!(snapshot.len(), 1, "readable while the operator runs");
    }
    let (store, mut rx) = EmbeddedStore::open(dir.path()).unwrap();
    let a = store.get(&k("a")).await.unwrap().unwrap();
    assert_eq!(a.metadata.uid.as_deref(), Some(uid.as_str()));
    assert_eq!(a.metadata.finalizers, Some(vec![FINALIZER.to_owned()]));
    assert_eq!(
        a.metadata.annotations.as_ref().unwrap()[SPEC_HASH_ANNOTATION],
        "abc"
    );
    assert_eq!(a.status.unwrap().provider_id.as_deref(), Some("instances/x"));
    store.resync();
    assert_eq!(drain(&mut rx), vec![StoreEvent::Changed(k("a"))]);

    // A manifest can neither set nor clear the operator's annotation.
    let mut declared = proxy("a", "p");
    declared.metadata.annotations = Some([(SPEC_HASH_ANNOTATION.to_owned(), "forged".to_owned())].into());
    store.apply(&set(&[declared])).unwrap();
    let a = store.get(&k("a")).await.unwrap().unwrap();
    assert_eq!(a.metadata.annotations.unwrap()[SPEC_HASH_ANNOTATION], "abc");
}

#[tokio::test]
async fn cloud_init_comes_only_from_labelled_secrets_and_rotation_triggers_a_reconcile() {
    let dir = tempfile::tempdir().unwrap();
    let (store, mut rx) = EmbeddedStore::open(dir.path()).unwrap();
    let mut p = proxy("a", "p");
    p.spec.cloud_init = Some(crate::domain::resource::CloudInit {
        inline: None,
        secret_ref: Some(SecretKeyRef {
            name: "ci".into(),
            key: "user-data".into(),
        }),
    });
    let secret = |labelled: bool, content: &str| SecretDoc {
        key: k("ci"),
        labels: if labelled {
            [(CLOUD_INIT_LABEL.to_owned(), "true".to_owned())].into()
        } else {
            BTreeMap::new()
        },
        data: [("user-data".to_owned(), content.as_bytes().to_vec())].into(),
    };
    let mut declared = set(&[p]);
    let reference = SecretKeyRef {
        name: "ci".into(),
        key: "user-data".into(),
    };
    store.apply(&declared).unwrap();
    assert_eq!(
        store.cloud_init("ns", &reference).await,
        Err(CloudInitError::SecretNotFound {
            namespace: "ns".into(),
            name: "ci".into()
        })
    );
    declared.secrets.insert(k("ci"), secret(false, "#!/bin/sh\n"));
    store.apply(&declared).unwrap();
    let err = store.cloud_init("ns", &reference).await.unwrap_err();
    assert!(
        err.to_string()
            .contains("is not labelled crawl.example.com/cloud-init"),
        "{err}"
    );

    drain(&mut rx);
    declared
        .secrets
        .insert(k("ci"), secret(true, "#!/bin/sh\necho v2\n"));
    store.apply(&declared).unwrap();
    assert_eq!(
        drain(&mut rx),
        vec![StoreEvent::Changed(k("a"))],
        "rotation re-reconciles its users"
    );
    assert_eq!(
        store.cloud_init("ns", &reference).await.unwrap(),
        b"#!/bin/sh\necho v2\n"
    );
    let missing_key = SecretKeyRef {
        name: "ci".into(),
        key: "other".into(),
    };
    assert!(matches!(
        store.cloud_init("ns", &missing_key).await,
        Err(CloudInitError::MissingKey { .. })
    ));
}

#[tokio::test]
async fn what_a_broken_file_declared_stays_as_stored() {
    let dir = tempfile::tempdir().unwrap();
    let (store, mut rx) = EmbeddedStore::open(dir.path()).unwrap();
    let mut declared = set(&[proxy("a", "p"), proxy("b", "p")]);
    let secret = SecretDoc {
        key: k("ci"),
        labels: [(CLOUD_INIT_LABEL.to_owned(), "true".to_owned())].into(),
        data: [("user-data".to_owned(), b"#!/bin/sh\n".to_vec())].into(),
    };
    declared.secrets.insert(k("ci"), secret);
    store.apply(&declared).unwrap();
    let stored_a = store.get(&k("a")).await.unwrap().unwrap();
    drain(&mut rx);

    // The file declaring `a` and the Secret breaks; `b`'s file is fine but drops `b`.
    let broken = ManifestSet {
        held: Held {
            proxies: [k("a")].into(),
            secrets: [k("ci")].into(),
            ..Held::default()
        },
        ..ManifestSet::default()
    };
    store.apply(&broken).unwrap();
    assert_eq!(drain(&mut rx), vec![StoreEvent::Removed(k("b"))]);
    assert_eq!(
        store.get(&k("a")).await.unwrap(),
        Some(stored_a),
        "held as stored"
    );
    let reference = SecretKeyRef {
        name: "ci".into(),
        key: "user-data".into(),
    };
    assert_eq!(store.cloud_init("ns", &reference).await.unwrap(), b"#!/bin/sh\n");

    // Fixed, without `a`: now it goes.
    store.apply(&set(&[])).unwrap();
    assert_eq!(drain(&mut rx), vec![StoreEvent::Removed(k("a"))]);
    assert!(store.cloud_init("ns", &reference).await.is_err());
}

#[test]
fn the_installation_id_is_generated_once_and_kept() {
    let dir = tempfile::tempdir().unwrap();
    let first = {
        let (store, _rx) = EmbeddedStore::open(dir.path()).unwrap();
        let id = store.installation_id(None).unwrap();
        assert_eq!(store.installation_id(None).unwrap(), id);
        id
    };
    let (store, _rx) = EmbeddedStore::open(dir.path()).unwrap();
    assert_eq!(
        store.installation_id(None).unwrap(),
        first,
        "kept across restarts"
    );
    // A configured id wins, and is kept from then on.
    let configured = crate::domain::installation::InstallationId::parse("prod-eu").unwrap();
    assert_eq!(store.installation_id(Some(&configured)).unwrap(), configured);
    assert_eq!(store.installation_id(None).unwrap(), configured);
    let other = tempfile::tempdir().unwrap();
    let (elsewhere, _rx) = EmbeddedStore::open(other.path()).unwrap();
    assert_ne!(
        elsewhere.installation_id(None).unwrap(),
        first,
        "each state directory its own"
    );
}

#[test]
fn the_state_directory_and_its_files_are_private() {
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    let root = tempfile::tempdir().unwrap();
    let state = root.path().join("state");
    std::fs::create_dir(&state).unwrap();
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o755)).unwrap();
    let (store, _events) = EmbeddedStore::open(&state).unwrap();
    store.apply(&set(&[proxy("a", "local")])).unwrap();
    // Opening the lease log makes its directory and first log file.
    let _log = FileLeaseJournal::open(&state).unwrap();
    let mut seen = Vec::new();
    for entry in walk(&state) {
        let m = mode(&entry);
        let want = if entry.is_dir() { 0o700 } else { 0o600 };
        assert_eq!(m, want, "{} is {m:o}", entry.display());
        seen.push(entry);
    }
    assert!(mode(&state) == 0o700 && seen.len() >= 4, "{seen:?}");
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(walk(&path));
        }
        out.push(path);
    }
    out
}

#[tokio::test]
async fn proxy_credentials_are_kept_per_generation_across_restarts_and_go_with_the_proxy() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _rx) = EmbeddedStore::open(dir.path()).unwrap();
    store.apply(&set(&[proxy("a", "p")])).unwrap();
    let uid = store.get(&k("a")).await.unwrap().unwrap().metadata.uid.unwrap();
    let first = store.proxy_credentials(&k("a"), &uid, "h1").await.unwrap();
    assert_eq!(store.proxy_credentials(&k("a"), &uid, "h1").await.unwrap(), first);
    let second = store.proxy_credentials(&k("a"), &uid, "h2").await.unwrap();
    assert_ne!(second, first, "a new generation gets new credentials");
    assert!(matches!(
        store.proxy_credentials(&k("a"), "another-uid", "h2").await,
        Err(StoreError::Gone { .. })
    ));
    drop(store);

    let (store, _rx) = EmbeddedStore::open(dir.path()).unwrap();
    assert_eq!(
        store.proxy_credentials(&k("a"), &uid, "h2").await.unwrap(),
        second,
        "kept across restarts"
    );
    // No finalizer: removing the manifest removes the Proxy, and its credentials with it.
    store.apply(&set(&[])).unwrap();
    store.apply(&set(&[proxy("a", "p")])).unwrap();
    let new_uid = store.get(&k("a")).await.unwrap().unwrap().metadata.uid.unwrap();
    assert_ne!(
        store.proxy_credentials(&k("a"), &new_uid, "h2").await.unwrap(),
        second
    );
}

#[tokio::test]
async fn any_manifest_secret_key_can_be_read() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _rx) = EmbeddedStore::open(dir.path()).unwrap();
    let mut manifests = set(&[]);
    manifests.secrets.insert(
        k("vendor"),
        SecretDoc {
            key: k("vendor"),
            labels: Default::default(),
            data: BTreeMap::from([("username".to_owned(), b"v".to_vec())]),
        },
    );
    store.apply(&manifests).unwrap();
    assert_eq!(store.secret_key("ns", "vendor", "username").await.unwrap(), b"v");
    let missing = store
        .secret_key("ns", "vendor", "password")
        .await
        .unwrap_err()
        .to_string();
    assert_eq!(missing, "Secret ns/vendor has no key \"password\"");
    let absent = store
        .secret_key("ns", "nope", "username")
        .await
        .unwrap_err()
        .to_string();
    assert_eq!(absent, "Secret ns/nope not found");
}

#[test]
fn a_secret_document_never_prints_its_data() {
    let doc = SecretDoc {
        key: k("vendor"),
        labels: Default::default(),
        data: BTreeMap::from([("password".to_owned(), b"hunter2".to_vec())]),
    };
    let shown = format!("{doc:?}");
    assert!(
        shown.contains("password") && !shown.contains("hunter2"),
        "{shown}"
    );
}

/// Makes the state file refuse to store the Proxy `name` (as a full disk
/// or an I/O error would), through a connection of its own.
fn refuse_to_store(dir: &std::path::Path, name: &str) {
    let db = rusqlite::Connection::open(dir.join(DATABASE_FILE)).unwrap();
    db.execute_batch(&format!(
        "CREATE TRIGGER refuse BEFORE INSERT ON proxies WHEN NEW.name = '{name}'
         BEGIN SELECT RAISE(ABORT, 'refused by the test'); END;"
    ))
    .unwrap();
}

#[tokio::test]
async fn a_declaration_the_state_file_refuses_changes_nothing_and_is_stored_once_it_can_be() {
    let dir = tempfile::tempdir().unwrap();
    let (store, mut rx) = EmbeddedStore::open(dir.path()).unwrap();
    store.apply(&set(&[proxy("a", "p"), proxy("b", "p")])).unwrap();
    drain(&mut rx);
    let before = store.list();

    // a changes, b goes, c comes: c cannot be stored, so none of it is.
    refuse_to_store(dir.path(), "c");
    let next = set(&[proxy("a", "q"), proxy("c", "p")]);
    let refused = store.apply(&next).unwrap_err();
    assert!(refused.to_string().contains("refused by the test"), "{refused}");
    assert_eq!(store.list(), before, "the copy the actors read is as it was");
    assert_eq!(read_snapshot(dir.path()).unwrap(), before, "and so is the file");
    assert_eq!(
        drain(&mut rx),
        vec![],
        "no event for a change that did not happen"
    );

    rusqlite::Connection::open(dir.path().join(DATABASE_FILE))
        .unwrap()
        .execute_batch("DROP TRIGGER refuse")
        .unwrap();
    store.apply(&next).unwrap();
    let stored: Vec<String> = read_snapshot(dir.path())
        .unwrap()
        .iter()
        .map(|p| p.metadata.name.clone().unwrap())
        .collect();
    assert_eq!(stored, ["a", "c"]);
    assert_eq!(
        store.get(&k("a")).await.unwrap().unwrap().metadata.generation,
        Some(2)
    );
    let mut events = drain(&mut rx);
    events.sort_by_key(|e| format!("{e:?}"));
    assert_eq!(
        events,
        vec![
            StoreEvent::Changed(k("a")),
            StoreEvent::Changed(k("c")),
            StoreEvent::Removed(k("b"))
        ]
    );
}

#[tokio::test]
async fn status_is_stored_without_a_sync_and_every_other_write_with_one() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _rx) = EmbeddedStore::open(dir.path()).unwrap();
    store.apply(&set(&[proxy("a", "p")])).unwrap();
    let uid = store.get(&k("a")).await.unwrap().unwrap().metadata.uid.unwrap();
    let full = 2;
    assert_eq!(store.lock().db.synchronous(), full);

    let status = ProxyStatus {
        phase: Some(crate::domain::resource::Phase::Running),
        ..Default::default()
    };
    store.write_status(&k("a"), &uid, &status).await.unwrap();
    assert_eq!(store.lock().db.synchronous(), full, "back to synced writes");
    store.add_finalizer(&k("a"), &uid).await.unwrap();
    assert_eq!(store.lock().db.synchronous(), full);

    // Unsynced is still committed: another reader (and a restart) sees it.
    let stored = read_snapshot(dir.path()).unwrap();
    assert_eq!(
        stored[0].status.as_ref().and_then(|s| s.phase),
        Some(crate::domain::resource::Phase::Running)
    );
    drop(store);
    let (reopened, _rx) = EmbeddedStore::open(dir.path()).unwrap();
    let a = reopened.get(&k("a")).await.unwrap().unwrap();
    assert_eq!(
        a.status.and_then(|s| s.phase),
        Some(crate::domain::resource::Phase::Running)
    );
    assert!(a.metadata.finalizers.is_some_and(|f| !f.is_empty()));
}

#[tokio::test]
async fn the_manifest_watcher_stores_a_refused_declaration_once_the_file_takes_it() {
    let state = tempfile::tempdir().unwrap();
    let manifests = tempfile::tempdir().unwrap();
    std::fs::write(
        manifests.path().join("fleet.yaml"),
        "apiVersion: crawl.example.com/v1alpha1\nkind: Proxy\nmetadata: {name: a, namespace: ns}\n\
         spec: {mode: Managed, provider: local}\n---\n\
         apiVersion: crawl.example.com/v1alpha1\nkind: Proxy\nmetadata: {name: c, namespace: ns}\n\
         spec: {mode: Managed, provider: local}\n",
    )
    .unwrap();
    let (store, _rx) = EmbeddedStore::open(state.path()).unwrap();
    let store = Arc::new(store);
    refuse_to_store(state.path(), "c");
    let watcher = tokio::spawn(watch_manifests(
        store.clone(),
        ManifestDir::new(manifests.path()),
        Duration::from_millis(20),
    ));
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(store.list(), vec![], "refused: none of it is stored");

    // The file never changes; the state file takes it again.
    rusqlite::Connection::open(state.path().join(DATABASE_FILE))
        .unwrap()
        .execute_batch("DROP TRIGGER refuse")
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while store.list().len() < 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "the watcher never tried again"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    watcher.abort();
    assert_eq!(read_snapshot(state.path()).unwrap().len(), 2);
}
