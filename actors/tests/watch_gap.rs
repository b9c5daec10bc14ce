//! The operator's path to the API server cut for a while (connections
//! refused, as when the API server restarts): the watchers back off instead
//! of spinning, and a Proxy deleted during the gap — its deletion compacted
//! out of the watch history, so no event ever tells of it — is forgotten
//! once the watch is back: no longer listed, no longer leasable, and its
//! actor stopped without being restarted.
//!
//! The API server down for 12 s and back as a restarted one (its watch
//! cache fresh, so the resumed watches meet `410 Expired`): a Proxy
//! deleted during the outage is no longer leasable within 5 s of the
//! server's return.

mod support;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fake_apiserver::FakeApiServer;
use kube::api::{Api, DeleteParams, DynamicObject, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::json;
use support::eventually;
use support::operator::{LOCAL_PROVIDER, OperatorDir};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// A TCP relay in front of the fake API server that can be cut (listener
/// closed, every connection dropped) and restored on the same port.
struct Relay {
    addr: SocketAddr,
    upstream: SocketAddr,
    tasks: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl Relay {
    async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let relay = Self {
            addr: listener.local_addr().unwrap(),
            upstream,
            tasks: Arc::default(),
        };
        relay.serve(listener);
        relay
    }

    fn serve(&self, listener: TcpListener) {
        let (upstream, tasks) = (self.upstream, self.tasks.clone());
        let accept = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let pipe = tokio::spawn(async move {
                    if let Ok(mut server) = TcpStream::connect(upstream).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                });
                tasks.lock().unwrap().push(pipe);
            }
        });
        self.tasks.lock().unwrap().push(accept);
    }

    fn cut(&self) {
        for task in self.tasks.lock().unwrap().drain(..) {
            task.abort();
        }
    }

    async fn restore(&self) {
        let listener = eventually(
            &format!("rebinding {}", self.addr),
            Duration::from_secs(10),
            async || TcpListener::bind(self.addr).await,
        )
        .await;
        self.serve(listener);
    }
}

async fn listed(api: SocketAddr) -> Option<Vec<String>> {
    TcpStream::connect(api).await.ok()?;
    let (status, body) = tokio::time::timeout(
        Duration::from_secs(2),
        support::http::request(api, "GET", "/v1/proxies", &[], None),
    )
    .await
    .ok()?;
    (status == 200).then_some(())?;
    let list: serde_json::Value = serde_json::from_str(&body).ok()?;
    Some(
        list.as_array()?
            .iter()
            .filter_map(|p| p["name"].as_str().map(str::to_owned))
            .collect(),
    )
}

#[actix_rt::test]
async fn a_proxy_deleted_while_the_watch_was_down_is_forgotten_and_the_watch_backs_off() {
    let fake = FakeApiServer::start().unwrap();
    let relay = Relay::start(fake.addr).await;
    let dir = OperatorDir::new("providers: []\n");
    let kubeconfig = fake
        .kubeconfig("crawl")
        .replace(&fake.addr.to_string(), &relay.addr.to_string());
    let operator = dir
        .kubernetes(&kubeconfig)
        .discovery()
        // This test is about watches, not the API's tokens.
        .arg("--insecure-discovery-without-token")
        .start()
        .await;
    let api = operator.discovery();
    let logs = || operator.logs();

    let client = kube::Client::try_from(kube::Config::new(fake.url().parse().unwrap())).unwrap();
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("crawl.example.com", "v1alpha1", "Proxy"),
        "proxies",
    );
    let proxies: Api<DynamicObject> = Api::namespaced_with(client, "crawl", &ar);
    for name in ["kept", "deleted"] {
        let proxy: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "crawl.example.com/v1alpha1", "kind": "Proxy",
            "metadata": {"name": name, "namespace": "crawl"},
            "spec": {"mode": "External", "endpoint": {"host": "127.0.0.1", "port": 9}}
        }))
        .unwrap();
        proxies.create(&PostParams::default(), &proxy).await.unwrap();
    }
    operator
        .eventually("both proxies listed", Duration::from_secs(30), async || {
            listed(api).await.filter(|l| l.len() == 2)
        })
        .await;

    // The path is cut; meanwhile one Proxy is deleted and the history that
    // would tell of it is compacted away.
    relay.cut();
    proxies.delete("deleted", &DeleteParams::default()).await.unwrap();
    fake.state.lock().unwrap().compact();
    let failures_before = logs().matches("watching Proxies failed").count();
    // A window, not a wait: the watcher must not spin within it.
    tokio::time::sleep(Duration::from_secs(8)).await;
    let failures = logs().matches("watching Proxies failed").count() - failures_before;
    assert!(
        failures <= 20,
        "the watcher backs off while the API server is unreachable: {failures} failures in 8 s"
    );

    relay.restore().await;
    operator
        .eventually(
            "the deleted Proxy to leave the list",
            Duration::from_secs(60),
            async || {
                let list = listed(api).await;
                if list.as_ref().is_some_and(|l| l == &["kept"]) {
                    Ok(())
                } else {
                    Err(format!("{list:?}"))
                }
            },
        )
        .await;
    assert!(
        logs().contains("Proxy deleted while the watch was down"),
        "{}",
        logs()
    );
    // Its actor stopped for good: a deletion is not a crash.
    assert!(!logs().contains("actor restarting"), "{}", logs());
}

/// Asks `api` for a lease on the proxy whose attribute `name` is `proxy`
/// (a new target each time: a grant rests no other). Some(status, body).
async fn lease_on(api: SocketAddr, proxy: &str, attempt: usize) -> Option<(u16, String)> {
    let body =
        format!(r#"{{"target":"t{attempt}.example","selector":{{"name":"{proxy}"}},"ttlSeconds":60}}"#);
    tokio::time::timeout(
        Duration::from_secs(3),
        support::http::request(api, "POST", "/v1/leases", &[], Some(&body)),
    )
    .await
    .ok()
}

#[actix_rt::test]
async fn a_proxy_deleted_during_an_api_server_outage_is_not_leasable_within_5s_of_its_return() {
    let fake = FakeApiServer::start().unwrap();
    // The test's own path to the objects: another API server replica.
    let other = fake.link().unwrap();
    let dir = OperatorDir::new(LOCAL_PROVIDER);
    let operator = dir
        .kubernetes(&fake.kubeconfig("crawl"))
        .discovery()
        .arg("--insecure-discovery-without-token")
        .args(["--max-leases-per-proxy", "0"])
        .start()
        .await;
    let api = operator.discovery();
    let client = kube::Client::try_from(kube::Config::new(other.url().parse().unwrap())).unwrap();
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("crawl.example.com", "v1alpha1", "Proxy"),
        "proxies",
    );
    let proxies: Api<DynamicObject> = Api::namespaced_with(client, "crawl", &ar);
    let target = support::process::health_target();
    for name in ["kept", "deleted"] {
        let proxy: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "crawl.example.com/v1alpha1", "kind": "Proxy",
            "metadata": {"name": name, "namespace": "crawl"},
            "spec": {"mode": "Managed", "provider": "local", "attributes": {"name": name},
                     "healthCheck": {"url": target, "interval": "1s"}}
        }))
        .unwrap();
        proxies.create(&PostParams::default(), &proxy).await.unwrap();
    }
    let mut attempt = 0;
    for name in ["kept", "deleted"] {
        operator
            .eventually(&format!("{name} leasable"), Duration::from_secs(60), async || {
                attempt += 1;
                match lease_on(api, name, attempt).await {
                    Some((201, _)) => Ok(()),
                    other => Err(format!("{other:?}")),
                }
            })
            .await;
    }

    fake.go_down().await;
    proxies.delete("deleted", &DeleteParams::default()).await.unwrap();
    tokio::time::sleep(Duration::from_secs(12)).await;
    fake.come_back().await.unwrap();
    let back = Instant::now();

    // Not leasable any more: refused for capacity (not for an unwritable
    // checkpoint, which says nothing about the proxy).
    let gone = operator
        .eventually(
            "the deleted Proxy to be refused",
            Duration::from_secs(60),
            async || {
                attempt += 1;
                match lease_on(api, "deleted", attempt).await {
                    Some((503, body)) if body.contains("no_capacity") => Ok(back.elapsed()),
                    other => Err(format!("{other:?}")),
                }
            },
        )
        .await;
    eprintln!("the deleted Proxy was refused {gone:?} after the API server's return");
    assert!(
        gone <= Duration::from_secs(5),
        "a Proxy deleted during the outage stayed leasable {gone:?} after the API server's return"
    );
    attempt += 1;
    let kept = lease_on(api, "kept", attempt).await;
    assert!(matches!(kept, Some((201, _))), "the other still leases: {kept:?}");
}
