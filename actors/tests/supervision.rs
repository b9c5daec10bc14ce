//! Fault injection into the running system: each singleton actor is made to
//! panic in the middle of its work (`supervision::fault::Crash`, built only
//! for tests) and the system recovers — leases are kept, probes and GC
//! resume, the registry still follows the store, and the dashboard's tree
//! counts each restart. The system is the one both modes run
//! (`system::start`), over the embedded store, with External proxies that
//! are real forward proxies probed against a real HTTP target.

mod support;

use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::Duration;

use egress_proxies::adapters::probe::Prober;
use egress_proxies::adapters::stores::embedded::{EmbeddedStore, ManifestSet};
use egress_proxies::domain::provider_contract::Provider;
use egress_proxies::domain::resource::ObjectKey;
use egress_proxies::domain::resource::{Phase, Proxy};
use egress_proxies::domain::resource_store::ProxyStore;
use egress_proxies_operator::gc_sweeper::SweepNow;
use egress_proxies_operator::health_prober::GetProberStats;
use egress_proxies_operator::lease_store_actor::GetLeaseStats;
use egress_proxies_operator::proxy_registry::GetRegistryStats;
use egress_proxies_operator::supervision::{self, fault::Crash};
use egress_proxies_operator::system::{self, Running, Settings};
use serde_json::{Value, json};
use support::eventually;
use support::process::{Killed, forward_proxy, free_port};
use support::scripted_provider::{Call, ScriptedProvider};
use support::target_server::{Behaviour, http_target_with};

const BIN: &str = env!("CARGO_BIN_EXE_egress-proxies-operator");
const WAIT: Duration = Duration::from_secs(15);
const HOUR: Duration = Duration::from_secs(3600);

fn external(name: &str, port: u16, target: SocketAddr) -> Proxy {
    serde_json::from_value(json!({
        "apiVersion": "crawl.example.com/v1alpha1", "kind": "Proxy",
        "metadata": {"name": name, "namespace": "crawl"},
        "spec": {
            "mode": "External",
            "endpoint": {"host": "127.0.0.1", "port": port},
            "healthCheck": {"url": format!("http://{target}/"), "interval": "1s", "timeout": "1s"}
        }
    }))
    .unwrap()
}

struct Bed {
    store: Arc<EmbeddedStore>,
    declared: ManifestSet,
    running: Running,
    api: SocketAddr,
    gc_provider: Arc<ScriptedProvider>,
    proxy: Killed,
    target: SocketAddr,
    proxy_port: u16,
    _dir: tempfile::TempDir,
}

impl Bed {
    async fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let proxy_port = free_port();
        let proxy = forward_proxy(BIN, proxy_port, &dir.path().join("forward"));
        let (target, _) = http_target_with(Behaviour::Status(204)).await;
        let (store, events) = EmbeddedStore::open(&dir.path().join("state")).unwrap();
        let store = Arc::new(store);
        let gc_provider = Arc::new(ScriptedProvider::new("sim", 0, 0));
        let providers =
            egress_proxies::adapters::providers::decorated([gc_provider.clone() as Arc<dyn Provider>]);
        let settings = Settings {
            health_workers: 8,
            trace_health_probes: false,
            leases: system::lease_settings(Duration::from_secs(1), Duration::from_secs(600), 1),
            fair_share: Default::default(),
            // Sweeps only when a test asks.
            gc_interval: HOUR,
            gc_grace_period: Duration::from_secs(60),
            pool_scale_down_delay: Duration::from_secs(120),
            discovery_tokens: egress_proxies_operator::discovery::Tokens::open(),
            lease_journal: None,
            tenure: None,
            proxy_namespace: None,
            external_endpoints: None,
        };
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let api = listener.local_addr().unwrap();
        let running = system::start(system::Parts {
            store: store.clone() as Arc<dyn ProxyStore>,
            events,
            providers: Arc::new(providers),
            prober: Prober::new(None).unwrap(),
            settings,
            installation: support::installation(),
            discovery: Some(listener),
            gateway: None,
            pools: None,
        })
        .unwrap();
        Self {
            store,
            declared: ManifestSet::default(),
            running,
            api,
            gc_provider,
            proxy,
            target,
            proxy_port,
            _dir: dir,
        }
    }

    fn declare(&mut self, name: &str) {
        let proxy = external(name, self.proxy_port, self.target);
        self.declared.proxies.insert(ObjectKey::of(&proxy), proxy);
        self.store.apply(&self.declared).unwrap();
    }

    fn undeclare(&mut self, name: &str) {
        self.declared.proxies.remove(&ObjectKey::new("crawl", name));
        self.store.apply(&self.declared).unwrap();
    }

    async fn call(&self, method: &str, path: &str, body: Option<&str>) -> (u16, Value) {
        let (status, text) = support::http::request(self.api, method, path, &[], body).await;
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    /// The names the API lists as healthy, sorted.
    async fn healthy(&self) -> Vec<String> {
        let (_, list) = self.call("GET", "/v1/proxies?healthy=true", None).await;
        let mut names: Vec<String> = list
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|p| p["name"].as_str().map(str::to_owned))
            .collect();
        names.sort();
        names
    }

    async fn acquire(&self, target: &str) -> (u16, Value) {
        let body = format!(r#"{{"target":"{target}","ttlSeconds":600}}"#);
        self.call("POST", "/v1/leases", Some(&body)).await
    }

    async fn phase(&self, name: &str) -> Option<Phase> {
        let proxy = self.store.get(&ObjectKey::new("crawl", name)).await.ok()??;
        proxy.status?.phase
    }
}

fn restarts(kind: &str) -> u32 {
    supervision::snapshot()
        .into_iter()
        .find(|a| a.kind == kind)
        .map_or(0, |a| a.restarts)
}

#[actix_rt::test]
async fn every_singleton_killed_mid_work_is_restarted_and_the_system_recovers() {
    let mut bed = Bed::start().await;
    for name in ["a", "b", "c"] {
        bed.declare(name);
    }
    eventually("three healthy proxies", WAIT, async || {
        (bed.healthy().await.len() == 3).then_some(())
    })
    .await;

    // ── LeaseStoreActor: crashed with leases held and acquires in flight. ──
    let (status, held) = bed.acquire("shop.example").await;
    assert_eq!(status, 201, "{held}");
    let (status, other) = bed.acquire("news.example").await;
    assert_eq!(status, 201, "{other}");
    bed.running.serving.leases.do_send(Crash);
    let during = bed.acquire("books.example").await;
    assert!(
        during.0 == 201 || during.0 == 503,
        "a request the crash swallowed is a 503 to retry, never a 500: {during:?}"
    );
    let mut active = 2 + usize::from(during.0 == 201);
    eventually("the lease store restarted", WAIT, async || {
        (restarts("lease_store") == 1).then_some(())
    })
    .await;
    let stats = bed.running.serving.leases.send(GetLeaseStats).await.unwrap();
    assert_eq!(stats.active, active, "leases survive the restart: {stats:?}");
    let (_, listed) = bed.call("GET", "/v1/proxies", None).await;
    let leased: u64 = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["activeLeases"].as_u64().unwrap())
        .sum();
    assert_eq!(leased as usize, active, "and are listed: {listed}");
    assert_eq!(bed.healthy().await.len(), 3, "availability survives the restart");
    // Capacity 1 each: the held proxies are still taken.
    let (status, third) = bed.acquire("shop.example").await;
    if active == 2 {
        assert_eq!(status, 201, "the free proxy is leased: {third}");
        active += 1;
    } else {
        assert_eq!(status, 503, "all three held: {third}");
    }
    assert_eq!(active, 3);
    let (status, _) = bed.acquire("more.example").await;
    assert_eq!(status, 503, "no capacity beyond three leases");
    let id = held["id"].as_str().unwrap();
    let (status, _) = bed.call("DELETE", &format!("/v1/leases/{id}"), None).await;
    assert_eq!(
        status, 204,
        "a lease granted before the crash is released as before"
    );

    // ── HealthProber: crashed with probes in flight; probes resume. ──
    let before = bed.running.serving.prober.send(GetProberStats).await.unwrap();
    assert_eq!(before.watched, 3);
    bed.running.serving.prober.do_send(Crash);
    eventually("the prober restarted", WAIT, async || {
        (restarts("health_prober") == 1).then_some(())
    })
    .await;
    eventually("probes to resume after the restart", WAIT, async || {
        let now = bed.running.serving.prober.send(GetProberStats).await.ok()?;
        (now.watched == 3 && now.probes >= before.probes + 30).then_some(())
    })
    .await;
    // Verdicts still reach the proxies: a dead proxy turns Unhealthy.
    bed.proxy.0.kill().unwrap();
    bed.proxy.0.wait().unwrap();
    for name in ["a", "b", "c"] {
        eventually(&format!("{name} to turn Unhealthy"), WAIT, async || {
            (bed.phase(name).await == Some(Phase::Unhealthy)).then_some(())
        })
        .await;
    }
    bed.proxy = forward_proxy(BIN, bed.proxy_port, &bed._dir.path().join("forward"));
    eventually("three healthy proxies again", WAIT, async || {
        (bed.healthy().await.len() == 3).then_some(())
    })
    .await;

    // ── GcSweeper: crashed while a sweep waits on a slow provider. ──
    bed.gc_provider
        .plant("proxy-orphan", "uid-of-a-deleted-proxy", HOUR);
    bed.gc_provider.slow_list(Duration::from_millis(500));
    let lists = || bed.gc_provider.count(|c| matches!(c, Call::List));
    let listed_before = lists();
    let cut_short = bed.running.leading.gc.send(SweepNow);
    eventually("the sweep to wait on the slow list", WAIT, async || {
        (lists() > listed_before).then_some(())
    })
    .await;
    bed.running.leading.gc.do_send(Crash);
    assert!(
        cut_short.await.is_err(),
        "the sweep under way went with the crash"
    );
    eventually("the sweeper restarted", WAIT, async || {
        (restarts("gc_sweeper") == 1).then_some(())
    })
    .await;
    let report = bed
        .running
        .leading
        .gc
        .send(SweepNow)
        .await
        .unwrap()
        .expect("a sweep runs after the restart");
    assert_eq!(report.deleted, 1, "{report:?}");
    assert!(bed.gc_provider.instances().is_empty());
    assert!(bed.gc_provider.count(|c| matches!(c, Call::Delete(_))) >= 1);

    // ── ProxyRegistry: crashed, it still follows the store. ──
    bed.running.leading.registry.do_send(Crash);
    bed.declare("d");
    eventually("the registry restarted", WAIT, async || {
        (restarts("proxy_registry") == 1).then_some(())
    })
    .await;
    eventually(
        "the Proxy declared during the restart to serve",
        WAIT,
        async || (bed.healthy().await == ["a", "b", "c", "d"]).then_some(()),
    )
    .await;
    bed.undeclare("a");
    eventually("the deleted Proxy to leave the pool", WAIT, async || {
        (bed.healthy().await == ["b", "c", "d"]).then_some(())
    })
    .await;
    let stats = bed.running.leading.registry.send(GetRegistryStats).await.unwrap();
    assert_eq!(stats.actors, 3);
    assert_eq!(stats.restarts, 0, "no ProxyActor was restarted by any of this");

    // Each singleton restarted exactly once; none is crash-looping.
    for kind in ["lease_store", "health_prober", "gc_sweeper", "proxy_registry"] {
        assert_eq!(restarts(kind), 1, "{kind}");
    }
    assert!(supervision::crash_looping().is_empty());
}
