//! Each link counts its own requests: with one link per client (an
//! operator replica each), a test tells whose requests were whose, while
//! the server's counts stay the sum over every address; and the binary's
//! `--links N`, one kubeconfig per link.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use fake_apiserver::{FakeApiServer, RequestCounts};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn client(url: &str) -> kube::Client {
    kube::Client::try_from(kube::Config::new(url.parse().unwrap())).unwrap()
}

fn config_map(name: &str) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name}, "data": {"k": "v"}})).unwrap()
}

fn lease(name: &str, holder: &str) -> Lease {
    serde_json::from_value(
        json!({"metadata": {"name": name}, "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15}}),
    )
    .unwrap()
}

/// `GET /debug/requests` on `addr`: the JSON answer.
async fn debug_requests(addr: SocketAddr) -> Value {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!("GET /debug/requests HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await.unwrap();
    let answer = String::from_utf8(answer).unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    serde_json::from_str(body).unwrap()
}

#[actix_rt::test]
async fn each_link_counts_its_own_requests_and_the_server_counts_all() {
    let fake = FakeApiServer::start().unwrap();
    let (a, b) = (fake.link().unwrap(), fake.link().unwrap());
    assert_ne!(a.addr, b.addr);
    assert_eq!(a.addr.ip(), fake.addr.ip(), "a link serves on the server's IP");

    // Two ConfigMaps through a, a Lease through b, a read directly.
    let via_a: Api<ConfigMap> = Api::namespaced(client(&a.url()), "ns");
    for name in ["x", "y"] {
        via_a
            .create(&PostParams::default(), &config_map(name))
            .await
            .unwrap();
    }
    let via_b: Api<Lease> = Api::namespaced(client(&b.url()), "ns");
    via_b
        .create(&PostParams::default(), &lease("leader", "b"))
        .await
        .unwrap();
    // Still the same objects on every address: b reads what a wrote.
    let b_maps: Api<ConfigMap> = Api::namespaced(client(&b.url()), "ns");
    assert_eq!(b_maps.get("x").await.unwrap().data.unwrap()["k"], "v");
    let direct: Api<Lease> = Api::namespaced(client(&fake.url()), "ns");
    assert!(direct.get("leader").await.is_ok());

    let (on_a, on_b, direct_only) = (a.link_requests(), b.link_requests(), fake.link_requests());
    assert_eq!(on_a.count("create", "configmaps", 201), 2, "{on_a:?}");
    assert_eq!(on_a.total(), 2, "{on_a:?}");
    assert_eq!(on_b.count("create", "leases", 201), 1, "{on_b:?}");
    assert_eq!(on_b.count("get", "configmaps", 200), 1, "{on_b:?}");
    assert_eq!(on_b.total(), 2, "{on_b:?}");
    assert_eq!(direct_only.count("get", "leases", 200), 1);
    assert_eq!(direct_only.total(), 1, "{direct_only:?}");
    // The server's counts are the same from every address: all of them.
    for server in [&fake, &a, &b] {
        let all = server.requests();
        assert_eq!(all.total(), 5, "{all:?}");
        assert_eq!(all.count("create", "configmaps", 201), 2);
    }

    // Over HTTP: `link` is the asked address's own, the rest the sum.
    let over_http = debug_requests(a.addr).await;
    assert_eq!(over_http["total"], 5, "{over_http}");
    assert_eq!(over_http["link"]["addr"], a.addr.to_string());
    assert_eq!(over_http["link"]["total"], 2, "{over_http}");
    assert_eq!(
        RequestCounts::from_json(&over_http["link"]),
        Some(a.link_requests())
    );
    let on_b_http = debug_requests(b.addr).await;
    assert_eq!(RequestCounts::from_json(&on_b_http["link"]), Some(on_b));
    assert_eq!(
        a.link_requests().total(),
        2,
        "reading the counters counts nothing"
    );
}

#[actix_rt::test]
async fn a_request_held_on_a_stalled_link_is_counted_there_once_answered() {
    let fake = FakeApiServer::start().unwrap();
    let cut = fake.link().unwrap();
    let maps: Api<ConfigMap> = Api::namespaced(client(&cut.url()), "ns");
    cut.stall();
    let held = tokio::spawn(async move { maps.create(&PostParams::default(), &config_map("late")).await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!held.is_finished(), "a stalled link answers nothing");
    assert_eq!(
        cut.link_requests().total(),
        0,
        "nothing answered, nothing counted"
    );
    // The counters are read on any address, the stalled one's too.
    assert_eq!(debug_requests(cut.addr).await["link"]["total"], 0);

    cut.resume();
    tokio::time::timeout(Duration::from_secs(10), held)
        .await
        .expect("answered after the heal")
        .unwrap()
        .unwrap();
    assert_eq!(cut.link_requests().count("create", "configmaps", 201), 1);
    assert_eq!(fake.link_requests().total(), 0, "not the other address's");
    assert_eq!(fake.requests().total(), 1);
}

/// The binary, SIGKILLed when dropped.
struct Process(std::process::Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The server a kubeconfig file names.
async fn server_of(path: &Path) -> (SocketAddr, kube::Client) {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let kubeconfig = kube::config::Kubeconfig::from_yaml(&text).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap();
    let addr: SocketAddr = config.cluster_url.authority().unwrap().as_str().parse().unwrap();
    (addr, kube::Client::try_from(config).unwrap())
}

#[actix_rt::test]
async fn the_binary_writes_one_kubeconfig_per_link() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kubeconfig");
    let mut child = Process(
        std::process::Command::new(env!("CARGO_BIN_EXE_fake-apiserver"))
            .args(["--listen", "127.0.0.1:0", "--links", "3"])
            .arg("--kubeconfig-out")
            .arg(&path)
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while !path.exists() {
        if let Some(status) = child.0.try_wait().unwrap() {
            panic!("fake-apiserver exited early: {status}");
        }
        assert!(Instant::now() < deadline, "no kubeconfig within 20 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Every link's kubeconfig is there once the main one is.
    let (main, _) = server_of(&path).await;
    let mut links = Vec::new();
    for i in 0..3 {
        links.push(server_of(&dir.path().join(format!("kubeconfig.link-{i}"))).await);
    }
    assert!(!dir.path().join("kubeconfig.link-3").exists());
    let mut addrs: Vec<SocketAddr> = links.iter().map(|(a, _)| *a).chain([main]).collect();
    addrs.sort();
    addrs.dedup();
    assert_eq!(addrs.len(), 4, "four addresses: {addrs:?}");

    // Link i makes i + 1 writes; each address's `link` counts only its own.
    for (i, (_, client)) in links.iter().enumerate() {
        let maps: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
        for n in 0..=i {
            maps.create(&PostParams::default(), &config_map(&format!("l{i}-{n}")))
                .await
                .unwrap();
        }
    }
    for (i, (addr, _)) in links.iter().enumerate() {
        let answer = debug_requests(*addr).await;
        let own = RequestCounts::from_json(&answer["link"]).unwrap();
        assert_eq!(own.count("create", "configmaps", 201), i as u64 + 1, "{answer}");
        assert_eq!(own.total(), i as u64 + 1, "{answer}");
        assert_eq!(answer["total"], 6, "every address reports the sum: {answer}");
    }
    assert_eq!(debug_requests(main).await["link"]["total"], 0);
}
