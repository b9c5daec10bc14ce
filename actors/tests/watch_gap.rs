//! The operator's path to the API server cut for a while (connections
//! refused, as when the API server restarts): the watchers back off instead
//! of spinning, and a Proxy deleted during the gap — its deletion compacted
//! out of the watch history, so no event ever tells of it — is forgotten
//! once the watch is back: no longer listed, no longer leasable, and its
//! actor stopped without being restarted.

mod support;

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fake_apiserver::FakeApiServer;
use kube::api::{Api, DeleteParams, DynamicObject, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::json;
use support::process::{Killed, free_port};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

const BIN: &str = env!("CARGO_BIN_EXE_egress-proxies-operator");

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
        let deadline = Instant::now() + Duration::from_secs(10);
        let listener = loop {
            match TcpListener::bind(self.addr).await {
                Ok(l) => break l,
                Err(e) => {
                    assert!(Instant::now() < deadline, "rebinding {}: {e}", self.addr);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        };
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
    let root = tempfile::tempdir().unwrap();
    let dir = root.path();
    let kubeconfig = fake
        .kubeconfig("crawl")
        .replace(&fake.addr.to_string(), &relay.addr.to_string());
    std::fs::write(dir.join("kubeconfig"), kubeconfig).unwrap();
    std::fs::write(dir.join("providers.yaml"), "providers: []\n").unwrap();
    let api: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let log_path = dir.join("operator.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let _operator = Killed(
        Command::new(BIN)
            .arg("run")
            .arg("--providers-config")
            .arg(dir.join("providers.yaml"))
            .arg("--state-dir")
            .arg(dir.join("state"))
            .args(["--metrics-bind-address", "0", "--health-probe-bind-address", "0"])
            .args([
                "--discovery-bind-address",
                &api.to_string(),
                // This test is about watches, not the API's tokens.
                "--insecure-discovery-without-token",
                "--log-format",
                "text",
            ])
            .env("KUBECONFIG", dir.join("kubeconfig"))
            .env_remove("POD_NAME")
            .env_remove("POD_NAMESPACE")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap(),
    );
    let logs = || std::fs::read_to_string(&log_path).unwrap_or_default();

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
    let deadline = Instant::now() + Duration::from_secs(30);
    while listed(api).await.is_none_or(|l| l.len() != 2) {
        assert!(Instant::now() < deadline, "both proxies never listed\n{}", logs());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // The path is cut; meanwhile one Proxy is deleted and the history that
    // would tell of it is compacted away.
    relay.cut();
    proxies.delete("deleted", &DeleteParams::default()).await.unwrap();
    fake.state.lock().unwrap().compact();
    let failures_before = logs().matches("watching Proxies failed").count();
    tokio::time::sleep(Duration::from_secs(8)).await;
    let failures = logs().matches("watching Proxies failed").count() - failures_before;
    assert!(
        failures <= 20,
        "the watcher backs off while the API server is unreachable: {failures} failures in 8 s"
    );

    relay.restore().await;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if listed(api).await.is_some_and(|l| l == ["kept"]) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the deleted Proxy is still listed: {:?}\n{}",
            listed(api).await,
            logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        logs().contains("Proxy deleted while the watch was down"),
        "{}",
        logs()
    );
    // Its actor stopped for good: a deletion is not a crash.
    assert!(!logs().contains("actor restarting"), "{}", logs());
}
