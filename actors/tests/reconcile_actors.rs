//! The actor system driven through the embedded store's events against a
//! scripted provider: every path of docs/reconcile.md, supervision, and
//! "never two instances for one Proxy".

mod support;

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use egress_proxies::adapters::stores::embedded::{EmbeddedStore, ManifestSet};
use egress_proxies::domain::backoff::{Backoff, ladders};
use egress_proxies::domain::provider_contract::{ErrorClass, Op, Provider, Providers, instance_name};
use egress_proxies::domain::reconcile::{self, ReplacementBackoff};
use egress_proxies::domain::resource::ObjectKey;
use egress_proxies::domain::resource::{
    FINALIZER, Phase, Proxy, ProxyStatus, SKIP_CLEANUP_ANNOTATION, SPEC_HASH_ANNOTATION,
};
use egress_proxies::domain::resource_store::ProxyStore;
use egress_proxies_operator::proxy_actor::Timing;
use egress_proxies_operator::proxy_registry::GetRegistryStats;
use egress_proxies_operator::proxy_registry::ProxyRegistry;
use serde_json::json;
use support::eventually;
use support::scripted_provider::{Call, ScriptedProvider};

const WAIT: Duration = Duration::from_secs(10);

/// A ladder of the shape `like` has, between `first` and `cap`.
fn ladder(like: Backoff, first: u64, cap: u64) -> Backoff {
    Backoff {
        first: Duration::from_millis(first),
        cap: Duration::from_millis(cap),
        ..like
    }
}

fn fast() -> Timing {
    Timing {
        polls: ladder(ladders::PROXY_POLL, 10, 50),
        resync: Duration::from_millis(100),
        errors: ladder(ladders::PROXY_ERROR, 20, 100),
        quota: ladder(ladders::PROXY_QUOTA, 400, 500),
    }
}

/// The replacement backoff's shape at test speed: 0, 300 ms, 600 ms, 1.2 s, 1.2 s …
fn fast_replacement() -> ReplacementBackoff {
    ReplacementBackoff {
        ladder: ladder(ladders::REPLACEMENT, 300, 1200),
        stable_after: Duration::from_secs(600),
    }
}

struct Bed {
    store: Arc<EmbeddedStore>,
    provider: Arc<ScriptedProvider>,
    registry: Addr<ProxyRegistry>,
    declared: ManifestSet,
    _state: tempfile::TempDir,
}

fn managed(name: &str, zone: &str) -> Proxy {
    serde_json::from_value(json!({
        "apiVersion": "crawl.example.com/v1alpha1", "kind": "Proxy",
        "metadata": {"name": name, "namespace": "crawl"},
        "spec": {"mode": "Managed", "provider": "sim", "placement": {"zone": zone}}
    }))
    .unwrap()
}

fn key(name: &str) -> ObjectKey {
    ObjectKey::new("crawl", name)
}

impl Bed {
    fn start(provider: ScriptedProvider) -> Self {
        Self::start_with(provider, |p| vec![p])
    }

    fn start_with(
        provider: ScriptedProvider,
        configure: impl FnOnce(Arc<dyn Provider>) -> Vec<Arc<dyn Provider>>,
    ) -> Self {
        let state = tempfile::tempdir().unwrap();
        let (store, events) = EmbeddedStore::open(state.path()).unwrap();
        let store = Arc::new(store);
        let provider = Arc::new(provider);
        let ctx = reconcile::ReconcileContext {
            store: store.clone(),
            providers: Arc::new(egress_proxies::adapters::providers::decorated(configure(
                provider.clone(),
            ))),
            now: egress_proxies::adapters::clock::now,
            replacement: fast_replacement(),
            installation: support::installation(),
            external_endpoints: None,
            names: std::sync::Arc::new(egress_proxies::adapters::name_resolver::SystemResolver),
            random: std::sync::Arc::new(egress_proxies::adapters::random::SystemRandom),
        };
        let registry = ProxyRegistry::new(ctx, fast(), None).run(events);
        Self {
            store,
            provider,
            registry,
            declared: ManifestSet::default(),
            _state: state,
        }
    }

    fn declare(&mut self, proxy: Proxy) {
        self.declared.proxies.insert(ObjectKey::of(&proxy), proxy);
        self.store.apply(&self.declared).unwrap();
    }

    fn undeclare(&mut self, name: &str) {
        self.declared.proxies.remove(&key(name));
        self.store.apply(&self.declared).unwrap();
    }

    async fn get(&self, name: &str) -> Option<Proxy> {
        self.store.get(&key(name)).await.unwrap()
    }

    async fn phase(&self, name: &str) -> Option<Phase> {
        self.get(name).await?.status?.phase
    }

    async fn wait_phase(&self, name: &str, phase: Phase) -> Proxy {
        eventually(&format!("{name} to reach {phase}"), WAIT, async || {
            let p = self.get(name).await?;
            (p.status.as_ref()?.phase == Some(phase)).then_some(p)
        })
        .await
    }

    async fn wait_gone(&self, name: &str) {
        eventually(&format!("{name} to be released"), WAIT, async || {
            self.get(name).await.is_none().then_some(())
        })
        .await
    }
}

fn creates(provider: &ScriptedProvider) -> usize {
    provider.count(|c| matches!(c, Call::Create(_)))
}

fn deletes(provider: &ScriptedProvider) -> usize {
    provider.count(|c| matches!(c, Call::Delete(_)))
}

#[actix_rt::test]
async fn create_reaches_running_with_address_finalizer_and_hash() {
    let mut bed = Bed::start(ScriptedProvider::new("sim", 3, 0));
    bed.declare(managed("a", "z1"));
    let p = bed.wait_phase("a", Phase::Running).await;
    let uid = p.metadata.uid.clone().unwrap();
    let status = p.status.unwrap();
    assert_eq!(status.ip.as_deref(), Some("127.0.0.2"));
    assert_eq!(status.endpoint.as_deref(), Some("127.0.0.2:3128"));
    assert_eq!(status.provider_id, Some(format!("sim/{}", instance_name(&uid))));
    assert_eq!(status.observed_generation, Some(1));
    let ready = status
        .conditions
        .iter()
        .find(|c| c.type_ == "InstanceReady")
        .unwrap();
    assert_eq!(ready.status, "True");
    assert_eq!(p.metadata.finalizers, Some(vec![FINALIZER.to_owned()]));
    assert!(p.metadata.annotations.unwrap().contains_key(SPEC_HASH_ANNOTATION));
    assert_eq!(
        bed.provider.live_instances(),
        vec![instance_name(&uid).to_string()]
    );
    assert_eq!(creates(&bed.provider), 1);
}

#[actix_rt::test]
async fn spec_change_replaces_with_one_delete_then_one_create_never_overlapping() {
    // The old instance lingers for a few polls after delete: the new one must wait.
    let mut bed = Bed::start(ScriptedProvider::new("sim", 2, 4));
    bed.declare(managed("a", "z1"));
    let before = bed.wait_phase("a", Phase::Running).await;
    let old_hash = before.metadata.annotations.unwrap()[SPEC_HASH_ANNOTATION].clone();
    let calls_before = bed.provider.calls().len();

    bed.declare(managed("a", "z2"));
    let after = eventually("the replacement to run", WAIT, async || {
        let p = bed.get("a").await?;
        let hash = p
            .metadata
            .annotations
            .as_ref()?
            .get(SPEC_HASH_ANNOTATION)?
            .clone();
        (hash != old_hash && p.status.as_ref()?.phase == Some(Phase::Running)).then_some(p)
    })
    .await;
    assert_eq!(after.metadata.generation, Some(2));
    let changes: Vec<Call> = bed.provider.calls()[calls_before..]
        .iter()
        .filter(|c| !matches!(c, Call::Get(_)))
        .cloned()
        .collect();
    let name = instance_name(after.metadata.uid.as_deref().unwrap()).to_string();
    assert_eq!(changes, vec![Call::Delete(name.clone()), Call::Create(name)]);
    assert_eq!(bed.provider.max_per_uid(), 1, "never two instances for one Proxy");
}

#[actix_rt::test]
async fn transient_errors_are_retried_until_success() {
    let mut bed = Bed::start(ScriptedProvider::new("sim", 0, 0));
    bed.provider.fail(Op::Create, ErrorClass::Transient, 3);
    bed.declare(managed("a", "z1"));
    bed.wait_phase("a", Phase::Running).await;
    assert_eq!(creates(&bed.provider), 4);
}

#[actix_rt::test]
async fn quota_errors_back_off_slowly_and_say_so() {
    let mut bed = Bed::start(ScriptedProvider::new("sim", 0, 0));
    bed.provider.fail(Op::Create, ErrorClass::QuotaExceeded, 1);
    let start = std::time::Instant::now();
    bed.declare(managed("a", "z1"));
    let msg = eventually("the quota message", WAIT, async || {
        bed.get("a")
            .await?
            .status?
            .message
            .filter(|m| m.contains("quota_exceeded"))
    })
    .await;
    assert!(msg.contains("will retry"), "{msg}");
    bed.wait_phase("a", Phase::Running).await;
    assert!(
        start.elapsed() >= fast().quota.first / 2,
        "retried after {:?}",
        start.elapsed()
    );
    assert_eq!(creates(&bed.provider), 2);
}

#[actix_rt::test]
async fn permanent_errors_fail_the_proxy_without_retrying() {
    let mut bed = Bed::start(ScriptedProvider::new("sim", 0, 0));
    bed.provider.fail(Op::Create, ErrorClass::Permanent, 1);
    bed.declare(managed("a", "z1"));
    let p = bed.wait_phase("a", Phase::Failed).await;
    assert!(
        p.status
            .unwrap()
            .message
            .unwrap()
            .contains("scripted permanent failure")
    );
    // A window in which nothing may happen (a retry would come within it).
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(creates(&bed.provider), 1, "no retry until the spec changes");
    bed.declare(managed("a", "z2"));
    bed.wait_phase("a", Phase::Running).await;
}

#[actix_rt::test]
async fn an_unconfigured_provider_fails_the_proxy_with_the_names_it_knows() {
    let mut bed = Bed::start(ScriptedProvider::new("sim", 0, 0));
    let mut p = managed("a", "z1");
    p.spec.provider = Some("gcp-nowhere".into());
    bed.declare(p);
    let p = bed.wait_phase("a", Phase::Failed).await;
    assert_eq!(
        p.status.unwrap().message.as_deref(),
        Some("provider \"gcp-nowhere\" is not configured (configured: sim)")
    );
}

#[actix_rt::test]
async fn vanished_and_stopped_instances_are_recreated() {
    let mut bed = Bed::start(ScriptedProvider::new("sim", 0, 0));
    bed.declare(managed("a", "z1"));
    let p = bed.wait_phase("a", Phase::Running).await;
    let name = instance_name(p.metadata.uid.as_deref().unwrap()).to_string();

    bed.provider.vanish(&name);
    eventually("a second create", WAIT, async || {
        (creates(&bed.provider) == 2).then_some(())
    })
    .await;
    bed.wait_phase("a", Phase::Running).await;

    bed.provider.stop(&name);
    eventually("delete then create", WAIT, async || {
        (deletes(&bed.provider) == 1 && creates(&bed.provider) == 3).then_some(())
    })
    .await;
    bed.wait_phase("a", Phase::Running).await;
    assert_eq!(bed.provider.max_per_uid(), 1);
}

#[actix_rt::test]
async fn instances_that_keep_stopping_are_replaced_with_growing_delays() {
    let mut bed = Bed::start(ScriptedProvider::new("sim", 0, 0));
    bed.declare(managed("a", "z1"));
    let p = bed.wait_phase("a", Phase::Running).await;
    let name = instance_name(p.metadata.uid.as_deref().unwrap()).to_string();

    let mut gaps = Vec::new();
    for loss in 1..=4u32 {
        let before = creates(&bed.provider);
        bed.provider.stop(&name);
        let lost = std::time::Instant::now();
        if loss >= 2 {
            let waiting = bed.wait_phase("a", Phase::BackOff).await.status.unwrap();
            let message = waiting.message.unwrap();
            assert!(
                message.contains("instance stopped: scripted to stop") && message.contains("backing off"),
                "{message}"
            );
        }
        eventually("the replacement", WAIT, async || {
            (creates(&bed.provider) == before + 1).then_some(())
        })
        .await;
        gaps.push(lost.elapsed());
        let p = bed.wait_phase("a", Phase::Running).await;
        let replacement = p.status.unwrap().replacement.unwrap();
        assert_eq!(replacement.count, loss, "each loss counted once");
        assert!(!replacement.deleting);
        assert_eq!(replacement.reason, "instance stopped: scripted to stop");
    }
    let policy = fast_replacement();
    for (n, gap) in gaps.iter().enumerate() {
        let wanted = policy.delay(u32::try_from(n).unwrap() + 1);
        assert!(
            *gap >= wanted,
            "replacement {} after {gap:?}, before its {wanted:?}",
            n + 1
        );
    }
    assert!(
        gaps[0] < Duration::from_millis(300),
        "the first replacement is immediate: {gaps:?}"
    );
    assert_eq!(bed.provider.max_per_uid(), 1, "never two instances at once");

    // A spec change starts afresh: no backoff, no count.
    let before = creates(&bed.provider);
    bed.provider.stop(&name);
    bed.wait_phase("a", Phase::BackOff).await;
    bed.declare(managed("a", "z2"));
    eventually("the re-specified instance", WAIT, async || {
        (creates(&bed.provider) == before + 1).then_some(())
    })
    .await;
    let p = bed.wait_phase("a", Phase::Running).await;
    assert_eq!(p.status.unwrap().replacement, None);
}

#[actix_rt::test]
async fn deletion_deletes_the_instance_then_releases_the_object() {
    let mut bed = Bed::start(ScriptedProvider::new("sim", 0, 3));
    bed.declare(managed("a", "z1"));
    bed.wait_phase("a", Phase::Running).await;
    bed.undeclare("a");
    let p = bed.wait_phase("a", Phase::Terminating).await;
    assert!(p.metadata.deletion_timestamp.is_some());
    bed.wait_gone("a").await;
    assert!(
        bed.provider.instances().is_empty(),
        "the instance is gone before the object"
    );
}

#[actix_rt::test]
async fn skip_cleanup_releases_without_touching_the_instance() {
    let mut bed = Bed::start(ScriptedProvider::new("sim", 0, 0));
    let mut p = managed("a", "z1");
    p.metadata.annotations = Some([(SKIP_CLEANUP_ANNOTATION.to_owned(), "true".to_owned())].into());
    bed.declare(p);
    bed.wait_phase("a", Phase::Running).await;
    bed.undeclare("a");
    bed.wait_gone("a").await;
    assert_eq!(deletes(&bed.provider), 0);
    assert_eq!(
        bed.provider.live_instances().len(),
        1,
        "left running for the admin"
    );
    assert_eq!(
        bed.provider.count(|c| matches!(c, Call::Release(_))),
        1,
        "marked released, so no GC of any installation reaps it"
    );
    assert!(bed.provider.list_by_tag().await.unwrap().is_empty());
}

#[actix_rt::test]
async fn a_proxy_without_instance_is_released_at_once() {
    let mut bed = Bed::start(ScriptedProvider::new("sim", 0, 0));
    bed.provider.fail(Op::Create, ErrorClass::Permanent, 1);
    bed.declare(managed("a", "z1"));
    bed.wait_phase("a", Phase::Failed).await;
    bed.undeclare("a");
    bed.wait_gone("a").await;
    assert_eq!(deletes(&bed.provider), 0);
}

#[actix_rt::test]
async fn an_instance_that_cannot_be_looked_up_is_not_deleted_but_left_to_gc() {
    let mut bed = Bed::start(ScriptedProvider::new("sim", 0, 0));
    bed.declare(managed("a", "z1"));
    bed.wait_phase("a", Phase::Running).await;
    bed.provider.fail(Op::Get, ErrorClass::Permanent, 1);
    bed.undeclare("a");
    bed.wait_gone("a").await;
    // Whose it is could not be checked: nothing deleted on the Proxy's behalf.
    assert_eq!(deletes(&bed.provider), 0);
    assert_eq!(bed.provider.instances().len(), 1);
    // It is this installation's and its Proxy is gone: orphan GC reaps it.
    let providers =
        egress_proxies::adapters::providers::decorated([bed.provider.clone() as Arc<dyn Provider>]);
    let scope = egress_proxies::domain::gc::Scope {
        installation: support::installation(),
        namespaces: None,
    };
    let report = egress_proxies::domain::gc::sweep(
        bed.store.as_ref(),
        &providers,
        &scope,
        Duration::ZERO,
        jiff::Timestamp::now(),
    )
    .await
    .unwrap();
    assert_eq!(report.deleted, 1);
}

#[actix_rt::test]
async fn a_provider_id_naming_another_proxys_instance_is_never_deleted() {
    let mut bed = Bed::start(ScriptedProvider::new("sim", 0, 0));
    bed.declare(managed("a", "z1"));
    bed.declare(managed("b", "z1"));
    bed.wait_phase("a", Phase::Running).await;
    let b = bed.wait_phase("b", Phase::Running).await;
    // Someone edits a's status to name b's instance.
    let a = bed.get("a").await.unwrap();
    let mut status = a.status.clone().unwrap();
    status.provider_id = b.status.as_ref().unwrap().provider_id.clone();
    bed.store
        .write_status(&key("a"), a.metadata.uid.as_deref().unwrap(), &status)
        .await
        .unwrap();
    bed.undeclare("a");
    let conflicted = eventually("a to report the conflict", WAIT, async || {
        let p = bed.get("a").await?;
        let message = p.status.as_ref()?.message.clone()?;
        message.contains("is not this Proxy's").then_some(p)
    })
    .await;
    let status = conflicted.status.clone().unwrap();
    let condition = status
        .conditions
        .iter()
        .find(|c| c.type_ == "InstanceReady")
        .unwrap();
    assert_eq!(condition.reason, "InstanceConflict");
    assert!(
        status
            .message
            .as_deref()
            .unwrap()
            .contains("belongs to Proxy UID"),
        "{:?}",
        status.message
    );
    // A window in which nothing may happen: no delete, no release.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(deletes(&bed.provider), 0, "b's instance is never deleted");
    assert!(bed.get("a").await.is_some(), "a waits (its finalizer stays)");

    // skip-cleanup releases a — still without touching b's instance.
    let uid = conflicted.metadata.uid.clone().unwrap();
    bed.store
        .set_annotation(&key("a"), &uid, SKIP_CLEANUP_ANNOTATION, Some("true"))
        .await
        .unwrap();
    bed.wait_gone("a").await;
    assert_eq!(deletes(&bed.provider), 0);
    assert_eq!(bed.provider.count(|c| matches!(c, Call::Release(_))), 0);
    assert_eq!(bed.provider.live_instances().len(), 2);
}

#[actix_rt::test]
async fn an_existing_instance_of_another_installation_is_never_adopted() {
    let mut bed = Bed::start(ScriptedProvider::new("sim", 0, 0));
    bed.provider.fail(Op::Create, ErrorClass::Transient, 10_000);
    bed.declare(managed("a", "z1"));
    let uid = eventually("a's UID", WAIT, async || bed.get("a").await?.metadata.uid).await;
    // The same Proxy managed by another installation too: its instance
    // already exists under the name this one would create.
    let name = instance_name(&uid);
    bed.provider
        .plant_owned(name.as_str(), &uid, "crawl", Some("iother"), Duration::ZERO);
    bed.provider.heal(Op::Create);
    let p = eventually("a to report the conflict", WAIT, async || {
        let p = bed.get("a").await?;
        let message = p.status.as_ref()?.message.clone()?;
        message.contains("belongs to installation iother").then_some(p)
    })
    .await;
    let status = p.status.unwrap();
    assert_ne!(status.phase, Some(Phase::Running), "not used");
    assert_eq!(status.ip, None);
    bed.undeclare("a");
    // A window in which nothing may happen: no delete, no release.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(deletes(&bed.provider), 0, "not deleted either");
    assert!(
        bed.get("a").await.is_some(),
        "the Proxy waits for the conflict to be resolved"
    );
    assert_eq!(bed.provider.live_instances(), [name.to_string()]);
}

#[actix_rt::test]
async fn failed_deletes_keep_the_finalizer_and_are_retried() {
    let mut bed = Bed::start(ScriptedProvider::new("sim", 0, 0));
    bed.declare(managed("a", "z1"));
    bed.wait_phase("a", Phase::Running).await;
    bed.provider.fail(Op::Delete, ErrorClass::Transient, 3);
    bed.undeclare("a");
    bed.wait_gone("a").await;
    assert_eq!(deletes(&bed.provider), 4);
    assert!(bed.provider.instances().is_empty());
}

#[actix_rt::test]
async fn deleting_with_an_unconfigured_provider_holds_until_skip_cleanup() {
    // State left by an earlier run whose configuration still had provider "sim".
    let state = tempfile::tempdir().unwrap();
    let (store, events) = EmbeddedStore::open(state.path()).unwrap();
    let store = Arc::new(store);
    let mut set = ManifestSet::default();
    set.proxies.insert(key("a"), managed("a", "z1"));
    store.apply(&set).unwrap();
    let uid = store.get(&key("a")).await.unwrap().unwrap().metadata.uid.unwrap();
    store.add_finalizer(&key("a"), &uid).await.unwrap();
    let status = ProxyStatus {
        phase: Some(Phase::Running),
        provider_id: Some("sim/proxy-left-behind".into()),
        ..Default::default()
    };
    store.write_status(&key("a"), &uid, &status).await.unwrap();
    set.proxies.clear();
    store.apply(&set).unwrap();

    let ctx = reconcile::ReconcileContext {
        store: store.clone(),
        providers: Arc::new(Providers::default()),
        now: egress_proxies::adapters::clock::now,
        replacement: Default::default(),
        installation: support::installation(),
        external_endpoints: None,
        names: std::sync::Arc::new(egress_proxies::adapters::name_resolver::SystemResolver),
        random: std::sync::Arc::new(egress_proxies::adapters::random::SystemRandom),
    };
    let _registry = ProxyRegistry::new(ctx, fast(), None).run(events);
    let message = eventually("the not-configured message", WAIT, async || {
        store
            .get(&key("a"))
            .await
            .unwrap()?
            .status?
            .message
            .filter(|m| m.contains("is not configured"))
    })
    .await;
    assert!(message.contains(SKIP_CLEANUP_ANNOTATION), "{message}");
    // A window in which nothing may happen: the finalizer holds.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let held = store
        .get(&key("a"))
        .await
        .unwrap()
        .expect("the finalizer holds the object");
    assert_eq!(held.status.unwrap().phase, Some(Phase::Terminating));

    store
        .set_annotation(&key("a"), &uid, SKIP_CLEANUP_ANNOTATION, Some("true"))
        .await
        .unwrap();
    eventually("release", WAIT, async || {
        store.get(&key("a")).await.unwrap().is_none().then_some(())
    })
    .await;
}

#[actix_rt::test]
async fn a_crash_mid_create_restarts_the_actor_and_still_makes_one_instance() {
    let mut bed = Bed::start(ScriptedProvider::new("sim", 1, 0));
    bed.provider.panic_after_next_create();
    bed.declare(managed("a", "z1"));
    bed.wait_phase("a", Phase::Running).await;
    assert_eq!(bed.provider.live_instances().len(), 1);
    assert_eq!(bed.provider.max_per_uid(), 1);
    assert_eq!(
        creates(&bed.provider),
        2,
        "the restarted actor repeated the create, which found the instance"
    );
    let stats = bed.registry.send(GetRegistryStats).await.unwrap();
    assert_eq!((stats.actors, stats.restarts), (1, 1));
}

#[actix_rt::test]
async fn external_proxies_get_their_endpoint_and_no_provider_calls() {
    let mut bed = Bed::start(ScriptedProvider::new("sim", 0, 0));
    let p: Proxy = serde_json::from_value(json!({
        "apiVersion": "crawl.example.com/v1alpha1", "kind": "Proxy",
        "metadata": {"name": "ext", "namespace": "crawl"},
        "spec": {"mode": "External", "endpoint": {"host": "127.0.0.1", "port": 3128}}
    }))
    .unwrap();
    bed.declare(p);
    let p = bed.wait_phase("ext", Phase::Running).await;
    let status = p.status.unwrap();
    assert_eq!(status.endpoint.as_deref(), Some("127.0.0.1:3128"));
    assert_eq!(p.metadata.finalizers, None);
    assert!(bed.provider.calls().is_empty());
    bed.undeclare("ext");
    bed.wait_gone("ext").await;
    assert_eq!(bed.phase("ext").await, None);
}

/// One reconcile at a time, by hand, against the embedded store.
struct Direct {
    store: Arc<EmbeddedStore>,
    provider: Arc<ScriptedProvider>,
    ctx: reconcile::ReconcileContext,
    memory: reconcile::ProxyMemory,
    _state: tempfile::TempDir,
}

impl Direct {
    fn new() -> Self {
        let state = tempfile::tempdir().unwrap();
        let (store, _events) = EmbeddedStore::open(state.path()).unwrap();
        let store = Arc::new(store);
        let provider = Arc::new(ScriptedProvider::new("sim", 0, 0));
        let ctx = reconcile::ReconcileContext {
            store: store.clone(),
            providers: Arc::new(egress_proxies::adapters::providers::decorated([
                provider.clone() as Arc<dyn Provider>
            ])),
            now: egress_proxies::adapters::clock::now,
            replacement: fast_replacement(),
            installation: support::installation(),
            external_endpoints: None,
            names: std::sync::Arc::new(egress_proxies::adapters::name_resolver::SystemResolver),
            random: std::sync::Arc::new(egress_proxies::adapters::random::SystemRandom),
        };
        Self {
            store,
            provider,
            ctx,
            memory: Default::default(),
            _state: state,
        }
    }

    async fn once(&mut self) -> Result<reconcile::Next, reconcile::ReconcileError> {
        reconcile::reconcile(&key("a"), &self.ctx, &mut self.memory).await
    }
}

#[actix_rt::test]
async fn a_provider_hiccup_keeps_a_serving_proxy_serving() {
    let mut d = Direct::new();
    d.store
        .apply(&ManifestSet {
            proxies: [(key("a"), managed("a", "z1"))].into(),
            ..Default::default()
        })
        .unwrap();
    for _ in 0..3 {
        d.once().await.unwrap();
    }
    let target = d.memory.serving.clone().expect("running and probed");
    for class in [ErrorClass::Transient, ErrorClass::QuotaExceeded] {
        d.provider.fail(Op::Get, class, 1);
        assert!(d.once().await.is_err());
        assert_eq!(
            d.memory.serving.as_ref(),
            Some(&target),
            "still probed after a {class} error"
        );
        let status = d.store.get(&key("a")).await.unwrap().unwrap().status.unwrap();
        assert_eq!(status.phase, Some(Phase::Running), "status agrees");
        assert!(status.message.unwrap().contains("will retry"));
    }
    // A confirmed stop takes it out.
    d.provider.stop(
        &instance_name(
            d.store
                .get(&key("a"))
                .await
                .unwrap()
                .unwrap()
                .metadata
                .uid
                .as_deref()
                .unwrap(),
        )
        .to_string(),
    );
    let _ = d.once().await;
    assert_eq!(d.memory.serving, None);
}

#[actix_rt::test]
async fn a_deletion_the_provider_refuses_is_retried_and_never_given_up() {
    let mut d = Direct::new();
    d.store
        .apply(&ManifestSet {
            proxies: [(key("a"), managed("a", "z1"))].into(),
            ..Default::default()
        })
        .unwrap();
    for _ in 0..3 {
        d.once().await.unwrap();
    }
    d.store.apply(&ManifestSet::default()).unwrap();
    d.provider.fail(Op::Delete, ErrorClass::Permanent, 3);
    let mut waits = Vec::new();
    for _ in 0..3 {
        match d.once().await.unwrap() {
            reconcile::Next::After(wait) => waits.push(wait),
            other => panic!("a refused deletion must be retried, got {other:?}"),
        }
        let p = d
            .store
            .get(&key("a"))
            .await
            .unwrap()
            .expect("the finalizer stays");
        let status = p.status.unwrap();
        assert_eq!(status.phase, Some(Phase::Terminating));
        let condition = status
            .conditions
            .iter()
            .find(|c| c.type_ == "InstanceReady")
            .unwrap();
        assert_eq!(condition.reason, "DeletionBlocked");
        assert!(
            condition.message.contains(SKIP_CLEANUP_ANNOTATION),
            "{}",
            condition.message
        );
    }
    assert_eq!(
        waits,
        [
            Duration::from_secs(30),
            Duration::from_secs(60),
            Duration::from_secs(120)
        ],
        "a growing wait, capped at minutes"
    );
    // The provider accepts again: the deletion completes.
    for _ in 0..5 {
        if d.once().await.unwrap() == reconcile::Next::Gone {
            break;
        }
    }
    assert!(d.store.get(&key("a")).await.unwrap().is_none());
    assert!(d.provider.instances().is_empty());
}

/// An External proxy probed by a health engine: its first status waits for
/// the first verdict and is then written once, whole; a verdict that does
/// not come in time leaves it `Running`, as without a prober.
#[actix_rt::test]
async fn an_external_proxys_first_status_waits_for_its_first_verdict_but_not_past_due() {
    use egress_proxies::domain::health::Verdict;
    use reconcile::Next;
    let external = |name: &str| -> Proxy {
        serde_json::from_value(json!({
            "apiVersion": "crawl.example.com/v1alpha1", "kind": "Proxy",
            "metadata": {"name": name, "namespace": "crawl"},
            "spec": {"mode": "External", "endpoint": {"host": "127.0.0.1", "port": 3128},
                // Due after one probe of 1 s + 1 ms, and the slack: 2.001 s.
                "healthCheck": {"url": "http://127.0.0.1:9/", "interval": "1s", "timeout": "1ms",
                    "healthyThreshold": 1, "unhealthyThreshold": 1}}
        }))
        .unwrap()
    };
    let due = Duration::from_millis(2001);
    let mut d = Direct::new();
    d.memory = reconcile::ProxyMemory::default().with_verdicts(true);
    d.store
        .apply(&ManifestSet {
            proxies: [(key("a"), external("a"))].into(),
            ..Default::default()
        })
        .unwrap();
    let stored = async |d: &Direct| d.store.get(&key("a")).await.unwrap().unwrap();

    // Served (probed) at once, nothing written; looked at again when due.
    let Next::After(wait) = d.once().await.unwrap() else {
        panic!("a held first status is looked at again when its verdict is due");
    };
    assert!(wait <= due && wait > due - Duration::from_millis(500), "{wait:?}");
    assert!(d.memory.serving.is_some() && d.memory.holds_first_status());
    assert_eq!(stored(&d).await.status, None, "nothing written yet");
    // Another look meanwhile (an event): still held, for the rest of the wait only.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let Next::After(rest) = d.once().await.unwrap() else {
        panic!("still held");
    };
    assert!(
        rest < wait - Duration::from_millis(250),
        "{rest:?} after {wait:?}"
    );
    assert_eq!(stored(&d).await.status, None);

    // The verdict: one write with the endpoint, the conditions and the health.
    let uid = stored(&d).await.metadata.uid.unwrap();
    d.memory.health = Some(Verdict {
        uid: uid.clone(),
        healthy: true,
        latency: Some(Duration::from_millis(12)),
        reason: None,
        consecutive_failures: 0,
        last_transition: jiff::Timestamp::now(),
        flipped: true,
    });
    assert_eq!(d.once().await.unwrap(), Next::Idle);
    assert!(!d.memory.holds_first_status());
    let status = stored(&d).await.status.unwrap();
    assert_eq!(status.phase, Some(Phase::Ready));
    assert_eq!(status.endpoint.as_deref(), Some("127.0.0.1:3128"));
    assert_eq!(status.health.as_ref().and_then(|h| h.latency_ms), Some(12));
    let conditions: Vec<(&str, &str)> = status
        .conditions
        .iter()
        .map(|c| (c.type_.as_str(), c.status.as_str()))
        .collect();
    for expected in [("InstanceReady", "True"), ("Healthy", "True"), ("Ready", "True")] {
        assert!(conditions.contains(&expected), "{conditions:?}");
    }

    // No verdict in time: Running, as it always was.
    let mut d = Direct::new();
    d.memory = reconcile::ProxyMemory::default().with_verdicts(true);
    d.store
        .apply(&ManifestSet {
            proxies: [(key("a"), external("a"))].into(),
            ..Default::default()
        })
        .unwrap();
    assert!(matches!(d.once().await.unwrap(), Next::After(_)));
    tokio::time::sleep(due).await;
    assert_eq!(d.once().await.unwrap(), Next::Idle);
    assert!(!d.memory.holds_first_status());
    let status = stored(&d).await.status.unwrap();
    assert_eq!(status.phase, Some(Phase::Running));
    assert_eq!(status.endpoint.as_deref(), Some("127.0.0.1:3128"));
}
