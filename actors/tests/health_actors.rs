//! The health engine in the running system: HealthProber + ProxyActors over
//! the embedded store, probing real proxies. Phases move Running → Ready →
//! Unhealthy → Ready with exactly one status write per transition.

mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use actix::prelude::*;
use async_trait::async_trait;
use egress_proxies::config::{LocalConfig, LocalImplementation};
use egress_proxies::health::Prober;
use egress_proxies::provider::{LocalProvider, Provider, Providers};
use egress_proxies::reconcile;
use egress_proxies::resource::{Phase, Proxy, ProxyStatus, SecretKeyRef};
use egress_proxies::store::embedded::{EmbeddedStore, ManifestSet};
use egress_proxies::store::{CloudInitError, ObjectKey, ProxyStore, StoreError};
use egress_proxies_operator::health_prober::{GetProberStats, HealthProber};
use egress_proxies_operator::proxy_actor::Timing;
use egress_proxies_operator::registry::ProxyRegistry;
use serde_json::json;
use support::eventually;
use support::process::Reaper;
use support::squid::Squid;
use support::target_server::{Behaviour, http_target_with};

/// The embedded store, counting status writes per object.
struct Counting {
    inner: Arc<EmbeddedStore>,
    writes: std::sync::Mutex<BTreeMap<ObjectKey, Vec<Option<Phase>>>>,
    total: AtomicUsize,
}

#[async_trait]
impl ProxyStore for Counting {
    async fn get(&self, key: &ObjectKey) -> Result<Option<Proxy>, StoreError> {
        self.inner.get(key).await
    }
    async fn add_finalizer(&self, key: &ObjectKey, uid: &str) -> Result<(), StoreError> {
        self.inner.add_finalizer(key, uid).await
    }
    async fn remove_finalizer(&self, key: &ObjectKey, uid: &str) -> Result<(), StoreError> {
        self.inner.remove_finalizer(key, uid).await
    }
    async fn set_annotation(
        &self,
        key: &ObjectKey,
        uid: &str,
        name: &str,
        value: Option<&str>,
    ) -> Result<(), StoreError> {
        self.inner.set_annotation(key, uid, name, value).await
    }
    async fn write_status(&self, key: &ObjectKey, uid: &str, status: &ProxyStatus) -> Result<(), StoreError> {
        self.total.fetch_add(1, Ordering::Relaxed);
        self.writes
            .lock()
            .unwrap()
            .entry(key.clone())
            .or_default()
            .push(status.phase);
        self.inner.write_status(key, uid, status).await
    }
    async fn proxy_credentials(
        &self,
        key: &ObjectKey,
        uid: &str,
        generation: &str,
    ) -> Result<egress_proxies::credentials::ProxyCredentials, StoreError> {
        self.inner.proxy_credentials(key, uid, generation).await
    }
    async fn secret_key(&self, namespace: &str, name: &str, key: &str) -> Result<Vec<u8>, CloudInitError> {
        self.inner.secret_key(namespace, name, key).await
    }
    async fn cloud_init(&self, namespace: &str, secret: &SecretKeyRef) -> Result<Vec<u8>, CloudInitError> {
        self.inner.cloud_init(namespace, secret).await
    }
    async fn live_uids(&self) -> Result<std::collections::HashSet<String>, StoreError> {
        self.inner.live_uids().await
    }

    async fn keys(&self) -> Result<Vec<ObjectKey>, StoreError> {
        self.inner.keys().await
    }
}

struct Bed {
    store: Arc<EmbeddedStore>,
    counting: Arc<Counting>,
    prober: Addr<HealthProber>,
    declared: ManifestSet,
    _registry: Addr<ProxyRegistry>,
    /// Whatever happens, no local proxy outlives the test (dropped before `_state`).
    _reaper: Reaper,
    _state: tempfile::TempDir,
}

impl Bed {
    fn start(providers: impl FnOnce(&std::path::Path) -> Vec<Arc<dyn Provider>>) -> Self {
        let state = tempfile::tempdir().unwrap();
        let (store, events) = EmbeddedStore::open(state.path()).unwrap();
        let store = Arc::new(store);
        let counting = Arc::new(Counting {
            inner: store.clone(),
            writes: Default::default(),
            total: AtomicUsize::new(0),
        });
        let ctx = reconcile::Context {
            store: counting.clone(),
            providers: Arc::new(Providers::from_providers(providers(state.path()))),
            now: jiff::Timestamp::now,
            replacement: Default::default(),
            installation: support::installation(),
            external_endpoints: None,
        };
        let prober = HealthProber::new(Prober::new(None).unwrap(), 8, false).start();
        let p = prober.clone();
        let timing = Timing {
            poll_min: Duration::from_millis(20),
            poll_max: Duration::from_millis(200),
            resync: Duration::from_secs(30),
            ..Timing::default()
        };
        let registry = ProxyRegistry::new(ctx, timing, Some(p)).run(events);
        Self {
            store,
            counting,
            prober,
            declared: ManifestSet::default(),
            _registry: registry,
            _reaper: Reaper(state.path().to_owned()),
            _state: state,
        }
    }

    fn declare(&mut self, proxy: Proxy) {
        self.declared.proxies.insert(ObjectKey::of(&proxy), proxy);
        self.store.apply(&self.declared).unwrap();
    }

    fn undeclare(&mut self, name: &str) {
        self.declared.proxies.remove(&ObjectKey::new("crawl", name));
        self.store.apply(&self.declared).unwrap();
    }

    async fn wait_phase(&self, name: &str, phase: Phase, within: Duration) -> Proxy {
        eventually(&format!("{name} to be {phase}"), within, async || {
            let p = self.store.get(&ObjectKey::new("crawl", name)).await.unwrap()?;
            (p.status.as_ref()?.phase == Some(phase)).then_some(p)
        })
        .await
    }

    fn writes(&self, name: &str) -> Vec<Option<Phase>> {
        self.counting
            .writes
            .lock()
            .unwrap()
            .get(&ObjectKey::new("crawl", name))
            .cloned()
            .unwrap_or_default()
    }
}

fn proxy(name: &str, spec: serde_json::Value) -> Proxy {
    serde_json::from_value(json!({
        "apiVersion": "crawl.example.com/v1alpha1", "kind": "Proxy",
        "metadata": {"name": name, "namespace": "crawl"}, "spec": spec
    }))
    .unwrap()
}

#[actix_rt::test]
async fn an_external_squid_goes_ready_unhealthy_and_ready_with_one_write_per_transition() {
    let Some(mut squid) = Squid::start("").await else {
        assert!(std::env::var_os("CI").is_none(), "CI must have squid installed");
        return;
    };
    let (target, _) = http_target_with(Behaviour::Status(204)).await;
    let mut bed = Bed::start(|_| Vec::new());
    bed.declare(proxy(
        "ext",
        json!({
            "mode": "External",
            "endpoint": {"host": "127.0.0.1", "port": squid.addr.port()},
            "healthCheck": {"url": format!("http://{target}/generate_204"), "interval": "1s", "timeout": "1s"}
        }),
    ));
    let ready = bed.wait_phase("ext", Phase::Ready, Duration::from_secs(10)).await;
    let health = ready.status.unwrap().health.unwrap();
    assert!(health.healthy && health.latency_ms.is_some() && health.last_transition.is_some());

    squid.kill();
    let killed = Instant::now();
    let unhealthy = bed
        .wait_phase("ext", Phase::Unhealthy, Duration::from_secs(10))
        .await;
    // interval × unhealthyThreshold, plus jitter and one probe's time.
    assert!(
        killed.elapsed() < Duration::from_millis(1000 * 3 + 100 + 500),
        "took {:?}",
        killed.elapsed()
    );
    let status = unhealthy.status.unwrap();
    assert_eq!(
        status.message.as_deref(),
        Some("health check failing: proxy refused the connection")
    );
    assert_eq!(
        status
            .health
            .as_ref()
            .map(|h| (h.healthy, h.consecutive_failures)),
        Some((false, 3))
    );

    squid.restart().await;
    bed.wait_phase("ext", Phase::Ready, Duration::from_secs(10)).await;
    // A window in which no write may happen: probes go on (every second), unchanged.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        bed.writes("ext"),
        vec![
            Some(Phase::Running),
            Some(Phase::Ready),
            Some(Phase::Unhealthy),
            Some(Phase::Ready)
        ],
        "exactly one status write per transition, none for unchanged probes"
    );

    bed.undeclare("ext");
    eventually(
        "the prober to prune the deleted proxy",
        Duration::from_secs(5),
        async || (bed.prober.send(GetProberStats).await.unwrap().watched == 0).then_some(()),
    )
    .await;
    let stats = bed.prober.send(GetProberStats).await.unwrap();
    // Two successes to Ready, three failures to Unhealthy, two to Ready again.
    assert!(stats.probes >= 2 + 3 + 2 && stats.failures >= 3, "{stats:?}");
}

#[actix_rt::test]
async fn a_killed_local_proxy_turns_unhealthy_and_is_replaced_until_ready() {
    let (target, _) = http_target_with(Behaviour::Status(204)).await;
    let exe = env!("CARGO_BIN_EXE_egress-proxies-operator");
    let mut bed = Bed::start(|state| {
        let config = LocalConfig {
            implementation: LocalImplementation::Builtin,
            destinations: support::loopback_rules(),
            ..LocalConfig::default()
        };
        vec![
            Arc::new(LocalProvider::new("local", config, state, exe.into(), &[]).unwrap())
                as Arc<dyn Provider>,
        ]
    });
    bed.declare(proxy(
        "m",
        json!({
            "mode": "Managed", "provider": "local",
            "healthCheck": {"url": format!("http://{target}/"), "interval": "1s", "timeout": "1s"}
        }),
    ));
    let ready = bed.wait_phase("m", Phase::Ready, Duration::from_secs(15)).await;
    let first_endpoint = ready.status.unwrap().endpoint.unwrap();

    support::process::kill_local_instance(bed._state.path());
    let replaced = eventually("a replacement to be Ready", Duration::from_secs(15), async || {
        let p = bed.store.get(&ObjectKey::new("crawl", "m")).await.unwrap()?;
        let s = p.status?;
        (s.phase == Some(Phase::Ready) && s.endpoint.as_deref() != Some(first_endpoint.as_str())).then_some(s)
    })
    .await;
    assert!(replaced.health.unwrap().healthy);
    let phases = bed.writes("m");
    assert!(
        phases.contains(&Some(Phase::Unhealthy)),
        "went through Unhealthy: {phases:?}"
    );
    bed.undeclare("m");
    eventually("cleanup", Duration::from_secs(10), async || {
        bed.store
            .get(&ObjectKey::new("crawl", "m"))
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
}
