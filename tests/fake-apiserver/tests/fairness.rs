//! API Priority and Fairness as a client meets it (`limit_rate`): `429`
//! with `Retry-After` and a Status past the rate, a budget of its own for
//! leader election's Leases, watches never refused; the requests served
//! counted by verb, resource and code; and the `fake-apiserver` binary,
//! the same server as a process of its own.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use fake_apiserver::{FakeApiServer, RequestCounts, RetryAfterReport};
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// One HTTP/1.1 answer: status code, headers (lower-case names), JSON body.
struct Answer {
    code: u16,
    headers: Vec<(String, String)>,
    body: Value,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Sends one request and reads the answer up to the connection's close.
async fn call(addr: SocketAddr, method: &str, path: &str, body: Option<Value>) -> Answer {
    send(addr, method, path, body, "").await
}

/// [`call`] with the kubeconfig's token: a request of the operator's.
async fn call_as_operator(addr: SocketAddr, method: &str, path: &str, body: Option<Value>) -> Answer {
    send(addr, method, path, body, "Authorization: Bearer fake-token\r\n").await
}

async fn send(addr: SocketAddr, method: &str, path: &str, body: Option<Value>, headers: &str) -> Answer {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let content_type = if method == "PATCH" {
        "application/merge-patch+json"
    } else {
        "application/json"
    };
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: fake\r\nConnection: close\r\n{headers}Content-Type: {content_type}\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await.unwrap();
    parse(&String::from_utf8(answer).unwrap())
}

fn parse(answer: &str) -> Answer {
    let (head, body) = answer.split_once("\r\n\r\n").unwrap();
    let mut lines = head.lines();
    let code = lines.next().unwrap()[9..12].parse().unwrap();
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    Answer {
        code,
        headers,
        body: serde_json::from_str(body).unwrap_or(Value::Null),
    }
}

/// Opens a watch and reads only its status line and headers: it streams on.
async fn watch_head(addr: SocketAddr, path: &str) -> (u16, tokio::net::TcpStream) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: fake\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        let n = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut byte))
            .await
            .expect("the watch's headers within 5 s")
            .unwrap();
        assert_eq!(n, 1, "the watch's connection closed before its headers");
        head.push(byte[0]);
    }
    let code = String::from_utf8(head).unwrap()[9..12].parse().unwrap();
    (code, stream)
}

/// A client that gives up at the first `429` (kube 5 retries by default,
/// honouring `Retry-After`), so that a test sees each answer.
fn client(url: String) -> kube::Client {
    let mut config = kube::Config::new(url.parse().unwrap());
    config.default_retry = false;
    kube::Client::try_from(config).unwrap()
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

const CONFIG_MAPS: &str = "/api/v1/namespaces/ns/configmaps";
const LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/ns/leases";

#[actix_rt::test]
async fn past_the_rate_a_request_meets_429_with_retry_after_and_a_status() {
    let fake = FakeApiServer::start().unwrap();
    // Unlimited by default.
    for _ in 0..50 {
        assert_eq!(call(fake.addr, "GET", CONFIG_MAPS, None).await.code, 200);
    }
    let config_maps: Api<ConfigMap> = Api::namespaced(client(fake.url()), "ns");
    fake.limit_rate(0.5, 3);
    for _ in 0..3 {
        assert_eq!(call(fake.addr, "GET", CONFIG_MAPS, None).await.code, 200);
    }
    let refused = call(fake.addr, "GET", CONFIG_MAPS, None).await;
    assert_eq!(refused.code, 429);
    let retry_after: u64 = refused.header("retry-after").unwrap().parse().unwrap();
    assert_eq!(retry_after, 2, "a token every 2 s");
    assert_eq!(
        refused.body,
        json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {},
            "status": "Failure", "reason": "TooManyRequests", "code": 429,
            "message": "Too many requests, please try again later.",
            "details": {"retryAfterSeconds": 2}
        })
    );
    // kube::Client without its retry sees the API server's own error.
    match config_maps.list(&ListParams::default()).await {
        Err(kube::Error::Api(status)) => {
            assert_eq!((status.code, status.reason.as_str()), (429, "TooManyRequests"));
        }
        other => panic!("expected a 429, got {other:?}"),
    }
    // With its default retry (kube 5) it waits the Retry-After and is served.
    let patient: Api<ConfigMap> = Api::namespaced(
        kube::Client::try_from(kube::Config::new(fake.url().parse().unwrap())).unwrap(),
        "ns",
    );
    let asked = Instant::now();
    patient.list(&ListParams::default()).await.unwrap();
    assert!(asked.elapsed() >= Duration::from_secs(1), "{:?}", asked.elapsed());
    let counts = fake.requests();
    assert_eq!(counts.count("list", "configmaps", 429), 3);
    assert_eq!(counts.count("list", "configmaps", 200), 54);
    // Writes are refused too, and nothing is written.
    let create = call(
        fake.addr,
        "POST",
        CONFIG_MAPS,
        Some(json!({"metadata": {"name": "a"}})),
    )
    .await;
    assert_eq!(create.code, 429);
    // After the Retry-After the request is served.
    tokio::time::sleep(Duration::from_secs(retry_after)).await;
    assert_eq!(
        call(fake.addr, "GET", &format!("{CONFIG_MAPS}/a"), None)
            .await
            .code,
        404
    );
    // Lifted again, nothing is refused.
    fake.unlimit_rate();
    for _ in 0..20 {
        assert_eq!(call(fake.addr, "GET", CONFIG_MAPS, None).await.code, 200);
    }
}

#[actix_rt::test]
async fn the_rate_is_set_and_lifted_over_http() {
    let fake = FakeApiServer::start().unwrap();
    let rate = |body: Value| call(fake.addr, "PUT", "/debug/rate", Some(body));
    let set = rate(json!({"perSecond": 0.5, "burst": 2})).await;
    assert_eq!(
        (set.code, &set.body),
        (200, &json!({"perSecond": 0.5, "burst": 2}))
    );
    let codes = async || {
        let mut codes = Vec::new();
        for _ in 0..3 {
            codes.push(call(fake.addr, "GET", CONFIG_MAPS, None).await.code);
        }
        codes
    };
    assert_eq!(codes().await, [200, 200, 429]);
    assert_eq!(rate(json!({"perSecond": 0})).await.code, 400);
    assert_eq!(rate(json!({"perSecond": null})).await.code, 200);
    assert_eq!(codes().await, [200, 200, 200]);
    // The debug paths are neither limited nor counted.
    assert_eq!(fake.requests().total(), 6);
}

#[actix_rt::test]
async fn a_slow_rate_asks_for_a_longer_wait() {
    let fake = FakeApiServer::start().unwrap();
    fake.limit_rate(0.25, 1);
    assert_eq!(call(fake.addr, "GET", CONFIG_MAPS, None).await.code, 200);
    let refused = call(fake.addr, "GET", CONFIG_MAPS, None).await;
    assert_eq!(refused.code, 429);
    assert_eq!(refused.header("retry-after"), Some("4"));
    assert_eq!(refused.body["details"]["retryAfterSeconds"], 4);
}

#[actix_rt::test]
async fn leases_are_answered_while_bulk_traffic_is_refused() {
    let fake = FakeApiServer::start().unwrap();
    fake.limit_rate(5.0, 5);
    // Bulk traffic far past the rate, from four clients at once.
    let stop = Instant::now() + Duration::from_secs(3);
    let bulk: Vec<_> = (0..4)
        .map(|_| {
            let addr = fake.addr;
            actix_rt::spawn(async move {
                let (mut served, mut refused) = (0, 0);
                while Instant::now() < stop {
                    match call(addr, "GET", CONFIG_MAPS, None).await.code {
                        200 => served += 1,
                        429 => refused += 1,
                        other => panic!("bulk answered {other}"),
                    }
                }
                (served, refused)
            })
        })
        .collect();
    // Meanwhile a leader acquires and renews its Lease twice a second.
    let leases: Api<Lease> = Api::namespaced(client(fake.url()), "ns");
    tokio::time::sleep(Duration::from_millis(200)).await;
    leases
        .create(&PostParams::default(), &lease("leader", "a"))
        .await
        .unwrap();
    let mut renewals = 0;
    while Instant::now() + Duration::from_millis(500) < stop {
        let mut current = leases.get("leader").await.expect("the Lease is read");
        current.spec.as_mut().unwrap().lease_duration_seconds = Some(15 + renewals);
        leases
            .replace("leader", &PostParams::default(), &current)
            .await
            .expect("the renewal is written");
        renewals += 1;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let (mut served, mut refused) = (0, 0);
    for task in bulk {
        let (s, r) = task.await.unwrap();
        served += s;
        refused += r;
    }
    assert!(renewals >= 4, "{renewals} renewals");
    assert!(refused > 100, "bulk refused {refused} times");
    // Its own budget: 5 at once and 5 a second for about 3 s.
    assert!((5..=25).contains(&served), "bulk served {served}");
    let counts = fake.requests();
    assert_eq!(counts.count("list", "configmaps", 200), served);
    assert_eq!(counts.count("list", "configmaps", 429), refused);
    assert_eq!(counts.count("get", "leases", 200), renewals as u64);
    assert_eq!(counts.count("update", "leases", 200), renewals as u64);
    assert_eq!(counts.count("create", "leases", 201), 1);
    assert_eq!(
        counts.on("leases"),
        1 + 2 * renewals as u64,
        "no Lease request refused"
    );
}

#[actix_rt::test]
async fn the_lease_budget_is_limited_too() {
    let fake = FakeApiServer::start().unwrap();
    fake.limit_rate(1.0, 2);
    for _ in 0..2 {
        assert_eq!(call(fake.addr, "GET", LEASES, None).await.code, 200);
    }
    let refused = call(fake.addr, "GET", LEASES, None).await;
    assert_eq!(refused.code, 429);
    assert_eq!(refused.header("retry-after"), Some("1"));
    // The workload's budget is untouched by it.
    assert_eq!(call(fake.addr, "GET", CONFIG_MAPS, None).await.code, 200);
}

#[actix_rt::test]
async fn watches_are_long_running_and_never_refused() {
    let fake = FakeApiServer::start().unwrap();
    let config_maps: Api<ConfigMap> = Api::namespaced(client(fake.url()), "ns");
    config_maps
        .create(&PostParams::default(), &config_map("before"))
        .await
        .unwrap();
    fake.limit_rate(1.0, 1);
    assert_eq!(call(fake.addr, "GET", CONFIG_MAPS, None).await.code, 200);
    assert_eq!(call(fake.addr, "GET", CONFIG_MAPS, None).await.code, 429);
    // The budget is spent, and still watches open, many of them.
    let mut open = Vec::new();
    for _ in 0..10 {
        let (code, stream) = watch_head(fake.addr, &format!("{CONFIG_MAPS}?watch=true")).await;
        assert_eq!(code, 200);
        open.push(stream);
    }
    let mut events = config_maps
        .watch(&WatchParams::default(), "0")
        .await
        .unwrap()
        .boxed();
    match events.next().await {
        Some(Ok(WatchEvent::Added(cm))) => {
            assert_eq!(cm.metadata.name.as_deref(), Some("before"));
        }
        other => panic!("expected the ADDED event, got {other:?}"),
    }
    assert_eq!(call(fake.addr, "GET", CONFIG_MAPS, None).await.code, 429);
    let counts = fake.requests();
    assert_eq!(counts.count("watch", "configmaps", 200), 11);
    assert_eq!(counts.count("watch", "configmaps", 429), 0);
}

#[actix_rt::test]
async fn requests_are_counted_by_verb_resource_and_code() {
    let fake = FakeApiServer::start().unwrap();
    let kube = client(fake.url());
    let config_maps: Api<ConfigMap> = Api::namespaced(kube.clone(), "ns");
    let leases: Api<Lease> = Api::namespaced(kube, "ns");
    let proxies = "/apis/crawl.example.com/v1alpha1/namespaces/ns/proxies";
    let proxy = json!({"apiVersion": "crawl.example.com/v1alpha1", "kind": "Proxy",
                       "metadata": {"name": "p"}, "spec": {"mode": "External"}});

    for name in ["a", "b"] {
        config_maps
            .create(&PostParams::default(), &config_map(name))
            .await
            .unwrap();
    }
    assert!(
        config_maps
            .create(&PostParams::default(), &config_map("a"))
            .await
            .is_err()
    );
    config_maps.get("a").await.unwrap();
    assert!(config_maps.get("missing").await.is_err());
    config_maps.list(&ListParams::default()).await.unwrap();
    config_maps
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"k": "w"}})),
        )
        .await
        .unwrap();
    config_maps.delete("b", &Default::default()).await.unwrap();
    let mut events = config_maps
        .watch(&WatchParams::default(), "0")
        .await
        .unwrap()
        .boxed();
    assert!(matches!(events.next().await, Some(Ok(WatchEvent::Added(_)))));
    leases
        .create(&PostParams::default(), &lease("leader", "a"))
        .await
        .unwrap();
    assert_eq!(call(fake.addr, "POST", proxies, Some(proxy)).await.code, 201);
    let status = json!({"status": {"phase": "Ready"}});
    let patched = call(fake.addr, "PATCH", &format!("{proxies}/p/status"), Some(status)).await;
    assert_eq!(patched.code, 200);
    assert_eq!(call(fake.addr, "GET", "/version", None).await.code, 200);

    let counts = fake.requests();
    let expected = [
        ("create", "configmaps", 201, 2),
        ("create", "configmaps", 409, 1),
        ("get", "configmaps", 200, 1),
        ("get", "configmaps", 404, 1),
        ("list", "configmaps", 200, 1),
        ("patch", "configmaps", 200, 1),
        ("delete", "configmaps", 200, 1),
        ("watch", "configmaps", 200, 1),
        ("create", "leases", 201, 1),
        ("create", "proxies", 201, 1),
        ("patch", "proxies/status", 200, 1),
        ("get", "", 200, 1),
    ];
    for (verb, resource, code, n) in expected {
        assert_eq!(counts.count(verb, resource, code), n, "{verb} {resource} {code}");
    }
    assert_eq!(counts.total(), 13, "{counts:?}");
    assert_eq!(counts.with_code(201), 4);
    let groups: Vec<&str> = counts
        .0
        .keys()
        .filter(|k| k.resource.starts_with("proxies") || k.resource == "leases")
        .map(|k| k.group.as_str())
        .collect();
    assert_eq!(
        groups,
        ["coordination.k8s.io", "crawl.example.com", "crawl.example.com"]
    );

    // The same snapshot over HTTP, which counts nothing itself; refusals
    // are counted with their code.
    let over_http = call(fake.addr, "GET", "/debug/requests", None).await;
    assert_eq!(over_http.code, 200);
    assert_eq!(over_http.body["total"], 13);
    assert_eq!(RequestCounts::from_json(&over_http.body), Some(counts.clone()));
    fake.limit_rate(1.0, 1);
    call(fake.addr, "GET", CONFIG_MAPS, None).await;
    call(fake.addr, "GET", CONFIG_MAPS, None).await;
    let after = fake.requests();
    assert_eq!(after.count("list", "configmaps", 200), 2);
    assert_eq!(after.count("list", "configmaps", 429), 1);
    assert_eq!(after.total(), 15);
}

#[actix_rt::test]
async fn the_operator_s_retries_before_retry_after_are_counted() {
    let fake = FakeApiServer::start().unwrap();
    fake.limit_rate(0.5, 1);
    let a = format!("{CONFIG_MAPS}/a");
    assert_eq!(call_as_operator(fake.addr, "GET", &a, None).await.code, 404);
    let refused = call_as_operator(fake.addr, "GET", &a, None).await;
    assert_eq!(refused.code, 429);
    assert_eq!(refused.header("retry-after"), Some("2"));
    // A test's own client (no token) is not checked, however eager.
    assert_eq!(call(fake.addr, "GET", &a, None).await.code, 429);
    // Another request is no retry of this one.
    let b = call_as_operator(fake.addr, "GET", &format!("{CONFIG_MAPS}/b"), None).await;
    assert_eq!(b.code, 429);
    assert_eq!(fake.retry_after().early, 0);
    // 100 ms later the same request again, on another connection.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let early = call_as_operator(fake.addr, "GET", &a, None).await;
    assert_eq!(early.code, 429);
    let report = fake.retry_after();
    assert_eq!((report.refused, report.early, report.in_flight), (3, 1, 0));
    assert_eq!(report.examples.len(), 1);
    assert_eq!(report.examples[0].request, format!("get {a}"));
    assert_eq!(report.examples[0].retry_after, 2);
    assert!(report.examples[0].after >= Duration::from_millis(100));
    // Its own Retry-After waited out, it is served and nothing more counts.
    let wait: u64 = early.header("retry-after").unwrap().parse().unwrap();
    tokio::time::sleep(Duration::from_secs(wait)).await;
    assert_eq!(call_as_operator(fake.addr, "GET", &a, None).await.code, 404);
    assert_eq!((fake.retry_after().early, fake.retry_after().on_time), (1, 1));
    // The same report over HTTP, beside the counts.
    let over_http = call(fake.addr, "GET", "/debug/requests", None).await;
    assert_eq!(
        RetryAfterReport::from_json(&over_http.body["retryAfter"]),
        Some(fake.retry_after())
    );
    assert_eq!(over_http.body["retryAfter"]["inFlightMs"], 50);
    assert_eq!(fake.requests().with_code(429), 4);
}

/// The binary as a child process, killed when dropped.
struct Process(std::process::Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn kubeconfig_written(path: &Path, child: &mut Process) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(text) = std::fs::read_to_string(path) {
            return text;
        }
        if let Some(status) = child.0.try_wait().unwrap() {
            panic!("fake-apiserver exited early: {status}");
        }
        assert!(Instant::now() < deadline, "no kubeconfig within 20 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[actix_rt::test]
async fn the_binary_serves_as_a_process_and_writes_its_kubeconfig() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kubeconfig");
    let mut child = Process(
        std::process::Command::new(env!("CARGO_BIN_EXE_fake-apiserver"))
            .args(["--listen", "127.0.0.1:0", "--cluster"])
            .args(["--max-requests-per-second", "0.5", "--burst", "4"])
            .arg("--kubeconfig-out")
            .arg(&path)
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let text = kubeconfig_written(&path, &mut child).await;
    let kubeconfig = kube::config::Kubeconfig::from_yaml(&text).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap();
    let addr: SocketAddr = config.cluster_url.authority().unwrap().as_str().parse().unwrap();
    assert!(addr.ip().is_loopback() && addr.port() != 0, "{addr}");

    // A usable kubeconfig: its namespace (a cluster's `default`) and token.
    let config_maps: Api<ConfigMap> = Api::default_namespaced(kube::Client::try_from(config).unwrap());
    config_maps
        .create(&PostParams::default(), &config_map("hello"))
        .await
        .unwrap();
    let read = config_maps.get("hello").await.unwrap();
    assert_eq!(read.data.unwrap()["k"], "v");
    // The rate the flags set: a burst of 4, then a token every 2 s.
    let mut codes = Vec::new();
    for _ in 0..4 {
        codes.push(
            call(addr, "GET", "/api/v1/namespaces/default/configmaps", None)
                .await
                .code,
        );
    }
    assert_eq!(codes.iter().filter(|c| **c == 429).count(), 2, "{codes:?}");
    let counts = RequestCounts::from_json(&call(addr, "GET", "/debug/requests", None).await.body).unwrap();
    assert_eq!(counts.count("create", "configmaps", 201), 1);
    assert_eq!(counts.count("get", "configmaps", 200), 1);
    assert_eq!(counts.count("list", "configmaps", 429), 2);

    // Killed, it is gone: no process and nothing listening.
    let pid = child.0.id();
    child.0.kill().unwrap();
    let status = child.0.wait().unwrap();
    assert!(!status.success());
    assert!(!Path::new(&format!("/proc/{pid}")).exists());
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());
}
