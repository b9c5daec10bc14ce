//! The health engine in the running system: HealthProber + ProxyActors over
//! the embedded store, probing real proxies. An External proxy comes up
//! Ready (its first status waits for the first verdict), turns Unhealthy
//! and Ready again, with exactly one status write per transition.

mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use actix::prelude::*;
use async_trait::async_trait;
use egress_proxies::adapters::probe::Prober;
use egress_proxies::adapters::providers::LocalProvider;
use egress_proxies::adapters::stores::embedded::{EmbeddedStore, ManifestSet};
use egress_proxies::domain::backoff::{Backoff, ladders};
use egress_proxies::domain::config::{LocalConfig, LocalImplementation};
use egress_proxies::domain::provider_contract::Provider;
use egress_proxies::domain::reconcile;
use egress_proxies::domain::resource::ObjectKey;
use egress_proxies::domain::resource::{Phase, Proxy, ProxyStatus, SecretKeyRef};
use egress_proxies::domain::resource_store::{CloudInitError, ProxyStore, StoreError};
use egress_proxies_operator::health_prober::{GetProberStats, HealthProber, ProbeThreads};
use egress_proxies_operator::proxy_actor::Timing;
use egress_proxies_operator::proxy_registry::ProxyRegistry;
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
    ) -> Result<egress_proxies::domain::credentials::ProxyCredentials, StoreError> {
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
    _probe_threads: ProbeThreads,
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
        let ctx = reconcile::ReconcileContext {
            store: counting.clone(),
            providers: Arc::new(egress_proxies::adapters::providers::decorated(providers(
                state.path(),
            ))),
            now: egress_proxies::adapters::clock::now,
            replacement: Default::default(),
            installation: support::installation(),
            external_endpoints: None,
            names: std::sync::Arc::new(egress_proxies::adapters::name_resolver::SystemResolver),
            random: std::sync::Arc::new(egress_proxies::adapters::random::SystemRandom),
        };
        // As the operator runs them: probes on threads of their own.
        let threads = ProbeThreads::new(2).unwrap();
        let prober = HealthProber::new(Prober::new(None).unwrap(), 8, false)
            .on(&threads)
            .start();
        let p = prober.clone();
        let timing = Timing {
            polls: Backoff {
                first: Duration::from_millis(20),
                cap: Duration::from_millis(200),
                ..ladders::PROXY_POLL
            },
            resync: Duration::from_secs(30),
            ..Timing::default()
        };
        let registry = ProxyRegistry::new(ctx, timing, Some(p.into())).run(events);
        Self {
            store,
            counting,
            prober,
            declared: ManifestSet::default(),
            _registry: registry,
            _probe_threads: threads,
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
    // Coming up is one transition too: its first status waits for the
    // first verdict (no interim Running).
    assert_eq!(
        bed.writes("ext"),
        vec![Some(Phase::Ready), Some(Phase::Unhealthy), Some(Phase::Ready)],
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

/// Takes the verdicts (the test counts probes at the proxy).
struct Verdicts;

impl Actor for Verdicts {
    type Context = Context<Self>;
}

impl Handler<egress_proxies_operator::health_prober::HealthVerdict> for Verdicts {
    type Result = ();
    fn handle(&mut self, _: egress_proxies_operator::health_prober::HealthVerdict, _: &mut Self::Context) {}
}

#[actix_rt::test]
async fn a_small_worker_pool_probes_every_proxy_in_turn_never_more_at_once() {
    use egress_proxies::domain::health::{CheckSpec, ProbeTarget, Thresholds};
    use egress_proxies_operator::health_prober::Watch;
    // A "proxy" answering every request after 50 ms, counting the
    // connections open at once and the requests per probed proxy (the path).
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let proxy = listener.local_addr().unwrap();
    let open = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let seen: Arc<std::sync::Mutex<BTreeMap<String, usize>>> = Arc::default();
    {
        let (open, most, seen) = (open.clone(), most.clone(), seen.clone());
        tokio::spawn(async move {
            loop {
                let Ok((mut s, _)) = listener.accept().await else {
                    continue;
                };
                let (open, most, seen) = (open.clone(), most.clone(), seen.clone());
                tokio::spawn(async move {
                    use tokio::io::{AsyncReadExt, AsyncWriteExt};
                    let now = open.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    let mut head = Vec::new();
                    let mut buf = [0u8; 1024];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                        match s.read(&mut buf).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => head.extend_from_slice(&buf[..n]),
                        }
                    }
                    let line = String::from_utf8_lossy(&head)
                        .lines()
                        .next()
                        .unwrap_or_default()
                        .to_owned();
                    let path = line
                        .split(' ')
                        .nth(1)
                        .unwrap_or_default()
                        .rsplit('/')
                        .next()
                        .unwrap_or_default()
                        .to_owned();
                    *seen.lock().unwrap().entry(path).or_default() += 1;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    open.fetch_sub(1, Ordering::SeqCst);
                    let _ = s
                        .write_all(
                            b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                        )
                        .await;
                });
            }
        });
    }
    // Two workers, on two threads: the bound holds across threads.
    let threads = ProbeThreads::new(2).unwrap();
    let prober = HealthProber::new(Prober::new(None).unwrap(), 2, false)
        .on(&threads)
        .start();
    let sink = Verdicts.start();
    let proxies = 20;
    for i in 0..proxies {
        prober.do_send(Watch {
            key: ObjectKey::new("crawl", format!("p{i}")),
            target: std::sync::Arc::new(ProbeTarget {
                uid: format!("uid-{i}"),
                endpoint: proxy.to_string(),
                check: CheckSpec {
                    url: format!("http://127.0.0.1:9/p{i}").parse().unwrap(),
                    expected_status: None,
                    // 20 proxies × 50 ms on 2 workers: 0.5 s a round, so most
                    // ticks find the proxy still due and skip.
                    interval: Duration::from_millis(100),
                    timeout: Duration::from_secs(5),
                    thresholds: Thresholds {
                        healthy: 1,
                        unhealthy: 1,
                    },
                },
                credentials: None,
                realm: None,
                endpoint_policy: None,
            }),
            owner: sink.downgrade().recipient(),
            recorded: None,
        });
    }
    eventually(
        "every proxy probed three times",
        Duration::from_secs(20),
        async || {
            let seen = seen.lock().unwrap();
            (seen.len() == proxies && seen.values().all(|n| *n >= 3))
                .then_some(())
                .ok_or(format!("{seen:?}"))
        },
    )
    .await;
    assert!(
        most.load(Ordering::SeqCst) <= 2,
        "at most 2 probes at once, saw {}",
        most.load(Ordering::SeqCst)
    );
    let stats = prober.send(GetProberStats).await.unwrap();
    assert!(stats.skipped > 0, "due proxies skip their ticks: {stats:?}");
    assert!(
        stats.in_flight <= proxies,
        "each proxy is due at most once: {stats:?}"
    );
    // Fair: the most-probed proxy is at most a round ahead of the least.
    let seen = seen.lock().unwrap();
    let (least, most_probed) = (seen.values().min().unwrap(), seen.values().max().unwrap());
    assert!(most_probed - least <= 2, "{seen:?}");
}
