//! Orphan GC against the embedded store and a scripted provider.

mod support;

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use egress_proxies::adapters::stores::embedded::{EmbeddedStore, ManifestSet};
use egress_proxies::domain::gc;
use egress_proxies::domain::provider_contract::{ErrorClass, Op, Provider};
use egress_proxies::domain::resource::ObjectKey;
use egress_proxies::domain::resource::Proxy;
use egress_proxies::domain::resource_store::ProxyStore;
use egress_proxies_operator::gc_sweeper::{GcSweeper, SweepNow};
use serde_json::json;
use support::scripted_provider::{Call, ScriptedProvider};

const HOUR: Duration = Duration::from_secs(3600);

/// This installation's GC, over every namespace or only `namespace`.
fn scope(namespace: Option<&str>) -> gc::Scope {
    gc::Scope {
        installation: support::installation(),
        namespaces: namespace.map(|ns| [ns.to_owned()].into()),
    }
}
const GRACE: Duration = Duration::from_secs(600);

fn proxy(name: &str) -> Proxy {
    serde_json::from_value(json!({
        "apiVersion": "crawl.example.com/v1alpha1", "kind": "Proxy",
        "metadata": {"name": name, "namespace": "crawl"},
        "spec": {"mode": "Managed", "provider": "sim"}
    }))
    .unwrap()
}

async fn store_with(names: &[&str]) -> (Arc<EmbeddedStore>, tempfile::TempDir, Vec<String>) {
    let dir = tempfile::tempdir().unwrap();
    let (store, _events) = EmbeddedStore::open(dir.path()).unwrap();
    let set = ManifestSet {
        proxies: names
            .iter()
            .map(|n| (ObjectKey::new("crawl", *n), proxy(n)))
            .collect(),
        ..Default::default()
    };
    store.apply(&set).unwrap();
    let mut uids = Vec::new();
    for n in names {
        uids.push(
            store
                .get(&ObjectKey::new("crawl", *n))
                .await
                .unwrap()
                .unwrap()
                .metadata
                .uid
                .unwrap(),
        );
    }
    (Arc::new(store), dir, uids)
}

#[tokio::test]
async fn reaps_old_orphans_and_spares_live_deleting_and_young_instances() {
    let (store, _dir, uids) = store_with(&["live", "going"]).await;
    // "going" is being deleted: its finalizer keeps it, so it still counts as live.
    store
        .add_finalizer(&ObjectKey::new("crawl", "going"), &uids[1])
        .await
        .unwrap();
    store
        .apply(&ManifestSet {
            proxies: [(ObjectKey::new("crawl", "live"), proxy("live"))].into(),
            ..Default::default()
        })
        .unwrap();
    let sim = Arc::new(ScriptedProvider::new("sim", 0, 0));
    sim.plant("proxy-live", &uids[0], HOUR);
    sim.plant("proxy-going", &uids[1], HOUR);
    sim.plant("proxy-orphan", "uid-of-a-deleted-proxy", HOUR);
    sim.plant("proxy-in-flight", "uid-not-yet-visible", Duration::from_secs(5));
    let providers = egress_proxies::adapters::providers::decorated([sim.clone() as Arc<dyn Provider>]);

    let report = gc::sweep(
        store.as_ref(),
        &providers,
        &scope(None),
        GRACE,
        jiff::Timestamp::now(),
    )
    .await
    .unwrap();
    assert_eq!(
        (report.listed, report.orphans, report.deleted, report.spared_young),
        (4, 1, 1, 1)
    );
    let mut left = sim.instances();
    left.sort();
    assert_eq!(left, ["proxy-going", "proxy-in-flight", "proxy-live"]);
    assert_eq!(sim.count(|c| matches!(c, Call::Delete(_))), 1);
}

#[tokio::test]
async fn a_provider_that_cannot_list_is_skipped_and_failed_deletes_are_not_counted() {
    let (store, _dir, _) = store_with(&[]).await;
    let broken = Arc::new(ScriptedProvider::new("broken", 0, 0));
    broken.plant("proxy-x", "gone-uid", HOUR);
    broken.fail(Op::List, ErrorClass::Transient, 1);
    let flaky = Arc::new(ScriptedProvider::new("flaky", 0, 0));
    flaky.plant("proxy-y", "gone-uid-2", HOUR);
    flaky.plant("proxy-z", "gone-uid-3", HOUR);
    flaky.fail(Op::Delete, ErrorClass::Transient, 1);
    let providers = egress_proxies::adapters::providers::decorated([
        broken.clone() as Arc<dyn Provider>,
        flaky.clone() as Arc<dyn Provider>,
    ]);

    let report = gc::sweep(
        store.as_ref(),
        &providers,
        &scope(None),
        GRACE,
        jiff::Timestamp::now(),
    )
    .await
    .unwrap();
    assert_eq!(report.skipped_providers, ["broken"]);
    assert_eq!((report.orphans, report.deleted, report.failed_deletes), (2, 1, 1));
    assert_eq!(
        broken.instances(),
        ["proxy-x"],
        "nothing deleted on a provider GC could not see whole"
    );
    assert_eq!(flaky.instances().len(), 1);

    // The next sweep finishes the job.
    let report = gc::sweep(
        store.as_ref(),
        &providers,
        &scope(None),
        GRACE,
        jiff::Timestamp::now(),
    )
    .await
    .unwrap();
    assert_eq!(
        (
            report.deleted,
            report.failed_deletes,
            report.skipped_providers.len()
        ),
        (2, 0, 0)
    );
    assert!(broken.instances().is_empty() && flaky.instances().is_empty());
}

#[actix_rt::test]
async fn the_sweeper_actor_sweeps_on_demand_and_on_its_interval() {
    let (store, _dir, _) = store_with(&[]).await;
    let sim = Arc::new(ScriptedProvider::new("sim", 0, 0));
    sim.plant("proxy-a", "dead", HOUR);
    let providers = Arc::new(egress_proxies::adapters::providers::decorated([
        sim.clone() as Arc<dyn Provider>
    ]));
    let sweeper = GcSweeper::new(
        store.clone(),
        providers,
        scope(None),
        Duration::from_millis(200),
        GRACE,
    )
    .start();
    let report = sweeper.send(SweepNow).await.unwrap().expect("a sweep ran");
    assert_eq!(report.deleted, 1);
    sim.plant("proxy-b", "dead-too", HOUR);
    support::eventually(
        "the interval sweep (every 200 ms) to reap the second orphan",
        Duration::from_secs(5),
        async || sim.instances().is_empty().then_some(()),
    )
    .await;
}

#[actix_rt::test]
async fn a_sweep_that_could_not_finish_is_counted_as_incomplete_with_its_failed_deletes() {
    use egress_proxies::telemetry::metrics::{ResultLabel, metrics};
    let sweeps = |result: &str| {
        metrics()
            .gc_sweeps
            .get_or_create(&ResultLabel {
                result: result.to_owned(),
            })
            .get()
    };
    let (incomplete, failures, deleted) = (
        sweeps("incomplete"),
        metrics().gc_delete_failures.get(),
        metrics().gc_instances_deleted.get(),
    );
    let (store, _dir, _) = store_with(&[]).await;
    let flaky = Arc::new(ScriptedProvider::new("flaky-metrics", 0, 0));
    flaky.plant("proxy-m1", "gone-m1", HOUR);
    flaky.plant("proxy-m2", "gone-m2", HOUR);
    flaky.fail(Op::Delete, ErrorClass::Transient, 1);
    let providers = Arc::new(egress_proxies::adapters::providers::decorated([
        flaky.clone() as Arc<dyn Provider>
    ]));
    let sweeper = GcSweeper::new(store.clone(), providers, scope(None), HOUR, GRACE).start();
    let first = sweeper.send(SweepNow).await.unwrap().expect("a sweep ran");
    assert_eq!((first.deleted, first.failed_deletes), (1, 1));
    assert_eq!(
        sweeps("incomplete"),
        incomplete + 1,
        "one delete failed: incomplete"
    );
    assert_eq!(metrics().gc_delete_failures.get(), failures + 1);
    let ok = sweeps("ok");
    let second = sweeper.send(SweepNow).await.unwrap().expect("a sweep ran");
    assert_eq!((second.deleted, second.failed_deletes), (1, 0));
    assert!(sweeps("ok") > ok, "the next sweep finished: ok");
    assert_eq!(sweeps("incomplete"), incomplete + 1);
    assert!(metrics().gc_instances_deleted.get() >= deleted + 2);
}

#[tokio::test]
async fn reaps_only_this_installations_instances_in_scope() {
    let (store, _dir, _) = store_with(&[]).await;
    let sim = Arc::new(ScriptedProvider::new("sim", 0, 0));
    sim.plant("proxy-ours", "dead-1", HOUR);
    sim.plant_owned("proxy-theirs", "dead-2", "crawl", Some("iother"), HOUR);
    sim.plant_owned("proxy-untagged", "dead-3", "crawl", None, HOUR);
    sim.plant_owned(
        "proxy-other-ns",
        "dead-4",
        "elsewhere",
        Some(support::INSTALLATION),
        HOUR,
    );
    sim.plant("proxy-released", "dead-5", HOUR);
    sim.release(&egress_proxies::domain::provider_contract::ProviderId(
        "sim/proxy-released".into(),
    ))
    .await
    .unwrap();
    sim.plant_owned(
        "proxy-released-listed",
        "dead-6",
        "crawl",
        Some(support::INSTALLATION),
        HOUR,
    );
    sim.set_released_but_listed("proxy-released-listed");
    let providers = egress_proxies::adapters::providers::decorated([sim.clone() as Arc<dyn Provider>]);

    // Scoped to namespace "crawl": many sweeps, only the own orphan in scope goes.
    for _ in 0..5 {
        gc::sweep(
            store.as_ref(),
            &providers,
            &scope(Some("crawl")),
            GRACE,
            jiff::Timestamp::now(),
        )
        .await
        .unwrap();
    }
    let report = gc::sweep(
        store.as_ref(),
        &providers,
        &scope(Some("crawl")),
        GRACE,
        jiff::Timestamp::now(),
    )
    .await
    .unwrap();
    assert_eq!(
        sim.instances(),
        [
            "proxy-other-ns",
            "proxy-released",
            "proxy-released-listed",
            "proxy-theirs",
            "proxy-untagged"
        ]
    );
    let left = |reason| report.not_ours[&("sim".to_owned(), reason)];
    assert_eq!(left(gc::NotOurs::OtherInstallation), 1);
    assert_eq!(left(gc::NotOurs::Untagged), 1);
    assert_eq!(left(gc::NotOurs::OutOfScope), 1);
    assert_eq!(
        left(gc::NotOurs::Released),
        1,
        "a released instance that still lists is left alone"
    );
    assert_eq!(
        report.untagged,
        [(
            "sim".to_owned(),
            egress_proxies::domain::provider_contract::ProviderId("sim/proxy-untagged".into())
        )]
    );

    // Over every namespace, this installation's orphan there goes too — nothing else.
    gc::sweep(
        store.as_ref(),
        &providers,
        &scope(None),
        GRACE,
        jiff::Timestamp::now(),
    )
    .await
    .unwrap();
    assert_eq!(
        sim.instances(),
        [
            "proxy-released",
            "proxy-released-listed",
            "proxy-theirs",
            "proxy-untagged"
        ]
    );
}
