//! The operator's path to the API server cut for a while (connections
//! refused, as when the API server restarts): the watchers back off instead
//! of spinning, and a Proxy deleted during the gap — its deletion compacted
//! out of the watch history, so no event ever tells of it — is forgotten
//! once the watch is back: no longer listed, no longer leasable, and its
//! actor stopped without being restarted.

mod support;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fake_apiserver::FakeApiServer;
use kube::api::{Api, DeleteParams, DynamicObject, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::json;
use support::eventually;
use support::operator::OperatorDir;
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
