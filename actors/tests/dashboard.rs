//! The dashboard on the standalone binary with bearer tokens set: the JSON
//! endpoint (auth, proxies, phases, leases, supervision tree), and the page
//! in real headless Chromium driven over WebDriver (chromedriver): it asks for
//! a token, the read-only one is typed into its form (it never appears in a
//! URL), then it shows both proxies Ready and the actor tree, and — with no
//! reload — shows Unhealthy once a proxy process is killed (the External
//! proxy's: a Managed one would be replaced within a second, faster than the
//! page's poll). A ProxyPool of one member is on the page too: its row shows
//! what its PoolActor wrote — one wanted, one member, Ready, a lease held
//! and an acquire refused for want of capacity. The gateway's panel counts
//! requests sent through the gateway (curl) and lists them, and its chart
//! gets the samples that saw them. A screenshot is
//! saved as a test artifact (`$CARGO_TARGET_TMPDIR/dashboard.png`, and to
//! `EPO_DASHBOARD_SCREENSHOT` when set).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use base64::Engine;
use serde_json::{Value, json};

mod support;

use support::browser::{self, Browser, wait_js};
use support::eventually;
use support::operator::{BIN, LOCAL_PROVIDER, OperatorDir};
use support::process::{forward_proxy, free_port, health_target};
const TOKEN: &str = "dashboard-test-token";

/// Whether `name` is the pool `web`'s member (`web-<random suffix>`).
fn is_member(name: Option<&str>) -> bool {
    name.is_some_and(|n| n.starts_with("web-"))
}
/// The read-only token: enough for the dashboard.
const READ_TOKEN: &str = "dashboard-read-token";

/// The response headers (lowercased names) of `GET path`.
fn headers(addr: &str, path: &str) -> Vec<(String, String)> {
    let mut s = TcpStream::connect(addr).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    let head = out.split_once("\r\n\r\n").map_or(out.as_str(), |(h, _)| h);
    head.lines()
        .skip(1)
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect()
}

fn get(addr: &str, path: &str, bearer: Option<&str>) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    let auth = bearer
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\n{auth}Connection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    let status = out.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
    (
        status,
        out.split_once("\r\n\r\n")
            .map(|(_, b)| b.to_owned())
            .unwrap_or_default(),
    )
}

#[tokio::test]
async fn the_dashboard_shows_the_fleet_live_in_a_real_browser() {
    if !browser::available() {
        return;
    }
    egress_proxies::tls::ensure_crypto_provider();
    let dir = OperatorDir::new(LOCAL_PROVIDER);
    let target = health_target();
    // Someone else's proxy (External): the operator's own forward proxy as a process of this test.
    let external_port = free_port();
    let external = forward_proxy(BIN, external_port, dir.path());
    let check = format!("healthCheck: {{url: \"{target}\", interval: 1s, unhealthyThreshold: 2}}");
    dir.write_manifest(
        "eu-1",
        &format!(
            "apiVersion: crawl.example.com/v1alpha1\nkind: Proxy\nmetadata: {{name: eu-1, namespace: crawlers}}\n\
             spec: {{mode: Managed, provider: local, port: {}, attributes: {{site: eu}}, {check}}}\n",
            free_port()
        ),
    );
    dir.write_manifest(
        "us-1",
        &format!(
            "apiVersion: crawl.example.com/v1alpha1\nkind: Proxy\nmetadata: {{name: us-1, namespace: crawlers}}\n\
             spec: {{mode: External, endpoint: {{host: 127.0.0.1, port: {external_port}}}, attributes: {{site: us}}, {check}}}\n"
        ),
    );
    dir.write_manifest(
        "web",
        &format!(
            "apiVersion: crawl.example.com/v1alpha1\nkind: ProxyPool\nmetadata: {{name: web, namespace: crawlers}}\n\
             spec:\n  replicas: 1\n  template:\n    spec: {{mode: Managed, provider: local, {check}}}\n"
        ),
    );
    let gateway = format!("127.0.0.1:{}", free_port());
    let operator = dir
        .standalone()
        .discovery()
        .setting("gatewayBindAddress", &format!("\"{gateway}\""))
        .setting("gateway", "{destinations: {allow: [127.0.0.0/8, 1024-65535]}}")
        // Gateway requests one after another to one host: no rest between them.
        .setting("leaseCooldown", "0s")
        // One lease per proxy: the pool's capacity is its Ready members.
        .setting("maxLeasesPerProxy", "1")
        .env("DISCOVERY_TOKEN", TOKEN)
        .env("DISCOVERY_READ_TOKEN", READ_TOKEN)
        .start()
        .await;
    let api = operator.discovery().to_string();
    // Both proxies and the pool's one member.
    operator.wait_ready(3).await;

    // The JSON endpoint: behind the token, with the fleet and the actor tree.
    assert_eq!(get(&api, "/v1/dashboard", None).0, 401);
    assert_eq!(
        get(&api, "/v1/dashboard", Some(READ_TOKEN)).0,
        200,
        "the read token reads"
    );
    // …and cannot lease (a GET-less request with it: 403, not 401).
    {
        let mut s = TcpStream::connect(&api).unwrap();
        let body = r#"{"target":"x.example"}"#;
        write!(
            s,
            "POST /v1/leases HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {READ_TOKEN}\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        assert!(out.starts_with("HTTP/1.1 403"), "{out}");
    }
    let (status, body) = get(&api, "/v1/dashboard", Some(TOKEN));
    assert_eq!(status, 200, "{body}");
    let data: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(data["phases"], json!({"Ready": 3}), "{data}");
    let names: Vec<&str> = data["proxies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .filter(|n| !is_member(Some(n)))
        .collect();
    assert_eq!(names, ["eu-1", "us-1"]);
    assert_eq!(data["proxies"][0]["attributes"], json!({"site": "eu"}));
    assert!(data["proxies"][0]["latencyMs"].is_u64());
    let actors = data["actors"].as_array().unwrap();
    let has = |kind: &str, supervisor: &str| {
        actors
            .iter()
            .any(|a| a["kind"] == kind && a["supervisor"] == supervisor)
    };
    assert!(
        has("proxy", "proxy_registry") && has("proxy_registry", "system") && has("lease_store", "system"),
        "{data}"
    );
    assert!(
        has("health_prober", "system") && has("gc_sweeper", "system"),
        "{data}"
    );
    assert!(
        has("pool", "pool_registry") && has("pool_registry", "system"),
        "{data}"
    );

    // The pool's demand: one lease held on its member (one per proxy), and a
    // second acquire for the pool refused for want of capacity.
    let acquire = |want: &str| {
        let mut s = TcpStream::connect(&api).unwrap();
        let body = r#"{"target":"shop.example","pool":"web","ttlSeconds":300}"#;
        write!(
            s,
            "POST /v1/leases HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        assert!(out.starts_with(&format!("HTTP/1.1 {want}")), "{out}");
    };
    acquire("201");
    acquire("503");
    let pool_row = json!({"namespace": "crawlers", "name": "web", "desired": 1, "replicas": 1, "ready": 1,
        "leased": 1, "rotating": 0, "capacity": 1, "denied": 1, "progress": "Steady"});
    operator
        .eventually("the pool's row", Duration::from_secs(30), async || {
            let (_, body) = get(&api, "/v1/dashboard", Some(READ_TOKEN));
            let data: Value = serde_json::from_str(&body).map_err(|e| e.to_string())?;
            if data["pools"] == json!([pool_row.clone()]) {
                Ok(())
            } else {
                Err(data["pools"].to_string())
            }
        })
        .await;
    // The page holds no data: served to anyone, it asks for the token.
    let (status, page) = get(&api, "/dashboard", None);
    assert_eq!(status, 200);
    let served = headers(&api, "/dashboard");
    let header = |name: &str| served.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
    assert_eq!(header("referrer-policy").as_deref(), Some("no-referrer"));
    let csp = header("content-security-policy").unwrap_or_default();
    assert!(
        csp.contains("default-src 'none'")
            && csp.contains("script-src 'sha256-")
            && csp.contains("frame-ancestors 'none'"),
        "{csp}"
    );
    assert!(
        page.contains("<title>egress-proxies-operator</title>") && !page.contains("https://"),
        "self-contained"
    );

    // The page in headless Chromium.
    let browser = Browser::start().await;
    let driver = &browser.driver;
    driver
        .call(
            reqwest::Method::POST,
            "/url",
            json!({"url": format!("http://{api}/dashboard")}),
        )
        .await;
    // The page asks for a token; typed into its form, as a person would.
    wait_js(
        driver,
        "the login form",
        "return !document.getElementById('login').hidden",
        |v| *v == json!(true),
    )
    .await;
    let input = driver
        .call(
            reqwest::Method::POST,
            "/element",
            json!({"using": "css selector", "value": "#token-input"}),
        )
        .await;
    let input = input
        .as_object()
        .and_then(|o| o.values().next())
        .and_then(Value::as_str)
        .unwrap()
        .to_owned();
    driver
        .call(
            reqwest::Method::POST,
            &format!("/element/{input}/value"),
            json!({"text": format!("{READ_TOKEN}\n")}),
        )
        .await;
    // The proxies not in the pool (its member's name is drawn at random).
    let rows = "return [...document.querySelectorAll('#proxies tbody tr')].map(r => [r.dataset.proxy, r.dataset.phase])\
        .filter(([p]) => !p.startsWith('crawlers/web-'))";
    wait_js(driver, "both proxies Ready on the page", rows, |v| {
        *v == json!([["crawlers/eu-1", "Ready"], ["crawlers/us-1", "Ready"]])
    })
    .await;
    // Not every replica serving (standalone): no Replicas section.
    assert_eq!(
        driver
            .script("return document.getElementById('replicas').hidden")
            .await,
        json!(true),
        "the Replicas section is left out"
    );
    let href = driver.script("return location.href").await;
    assert!(
        !href.to_string().contains(READ_TOKEN),
        "the token is in no URL: {href}"
    );
    assert_eq!(
        driver
            .script("return document.getElementById('login').hidden")
            .await,
        json!(true)
    );
    wait_js(
        driver,
        "the supervision tree",
        "return document.querySelectorAll('#tree [data-actor=\"proxy_registry:proxy_registry\"] [data-actor^=\"proxy:\"]').length",
        |v| *v == json!(3),
    )
    .await;
    // The Pools panel: the pool's row, its figures as the JSON has them.
    let pool_cells = "return [...document.querySelectorAll('#pools tbody tr[data-pool]')].map(r => \
        [r.dataset.pool, ...[...r.querySelectorAll('td')].map(td => td.textContent)])";
    wait_js(
        driver,
        "the PoolActor in the supervision tree",
        "return document.querySelector('#tree [data-actor=\"pool_registry:pool_registry\"] \
         [data-actor=\"pool:crawlers/web\"]')?.textContent",
        |v| v.as_str().is_some_and(|t| t.contains("1 of 1 Ready")),
    )
    .await;
    wait_js(driver, "the pool's row on the page", pool_cells, |v| {
        *v == json!([[
            "crawlers/web",
            "crawlers/web",
            "1",
            "1",
            "1",
            "1",
            "0",
            "1 of 1 100%",
            "1",
            "steady"
        ]])
    })
    .await;
    // The gateway's panel: nothing yet, then the requests sent through it.
    let gateway_kpi = |key: &str| {
        format!("return document.querySelector('#gateway-kpis [data-kpi=\"{key}\"] .big')?.textContent")
    };
    wait_js(driver, "the gateway panel", &gateway_kpi("requests"), |v| {
        *v == json!("0")
    })
    .await;
    let site = health_target();
    for _ in 0..3 {
        let out = Command::new("curl")
            .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "-x"])
            .arg(format!("http://crawler:{TOKEN}@{gateway}"))
            .arg(&site)
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), "204", "through the gateway");
    }
    wait_js(
        driver,
        "the gateway's requests counted",
        &gateway_kpi("requests"),
        |v| *v == json!("3"),
    )
    .await;
    assert_eq!(driver.script(&gateway_kpi("served")).await, json!("3"));
    let recent = "return [...document.querySelectorAll('#gateway-recent tbody tr[data-outcome]')]\
        .map(r => [r.dataset.outcome, r.dataset.target])";
    wait_js(driver, "the gateway's latest exchanges", recent, |v| {
        *v == json!([
            ["served", "127.0.0.1"],
            ["served", "127.0.0.1"],
            ["served", "127.0.0.1"]
        ])
    })
    .await;
    // The history arrives over the stream and is drawn: a sample that saw
    // the grant and the refusal, the fleet Ready, probes with a latency.
    let totals = "return samples.reduce((t, s) => [t[0] + s.granted, t[1] + s.denied, Math.max(t[2], s.ready), \
        t[3] || s.probeP50Ms != null], [0, 0, 0, false])";
    wait_js(
        driver,
        "the history with the grant and the refusal",
        totals,
        |v| {
            v[0].as_u64() >= Some(1)
                && v[1].as_u64() >= Some(1)
                && v[2].as_u64() >= Some(3)
                && v[3] == json!(true)
        },
    )
    .await;
    let drawn = driver
        .script(
            "return [...document.querySelectorAll('#history path')].map(p => [p.closest('.chart').id, \
             p.dataset.series, Number(p.dataset.points) > 0])",
        )
        .await;
    assert_eq!(
        drawn,
        json!([
            ["chart-leases", "granted", true],
            ["chart-leases", "denied", true],
            ["chart-fleet", "ready", true],
            ["chart-fleet", "unhealthy", true],
            ["chart-latency", "p50", true],
            ["chart-latency", "p99", true],
            ["chart-gateway", "requests", true],
            ["chart-gateway", "retries", true],
            ["chart-gateway", "failures", true],
            ["chart-gateway", "blocks", true]
        ])
    );
    wait_js(
        driver,
        "a sample that saw the gateway's requests",
        "return samples.reduce((n, s) => n + s.gatewayRequests, 0)",
        |v| v.as_u64() >= Some(3),
    )
    .await;
    let latest = driver
        .script("return document.querySelector('#chart-fleet [data-latest]').textContent")
        .await;
    assert!(latest.as_str().is_some_and(|t| t.contains("ready 3")), "{latest}");
    // Pushed, not polled: no request for the snapshot JSON ever finished.
    let polled = driver
        .script(
            "return performance.getEntriesByType('resource').filter(e => new URL(e.name).pathname === '/v1/dashboard').length",
        )
        .await;
    assert_eq!(polled, json!(0), "the page follows the stream instead of polling");
    let marker = driver.script("window.__sameDocument = true; return true").await;
    assert_eq!(marker, json!(true));

    drop(external); // SIGKILL
    wait_js(driver, "Unhealthy shown without a reload", rows, |v| {
        *v == json!([["crawlers/eu-1", "Ready"], ["crawlers/us-1", "Unhealthy"]])
    })
    .await;
    assert_eq!(
        driver.script("return window.__sameDocument === true").await,
        json!(true),
        "the page updated in place"
    );
    let png = driver
        .call(reqwest::Method::GET, "/screenshot", Value::Null)
        .await;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(png.as_str().unwrap())
        .unwrap();
    assert!(bytes.starts_with(b"\x89PNG"), "a PNG screenshot");
    let artifact = Path::new(env!("CARGO_TARGET_TMPDIR")).join("dashboard.png");
    std::fs::write(&artifact, &bytes).unwrap();
    eprintln!("screenshot: {}", artifact.display());
    if let Some(path) = std::env::var_os("EPO_DASHBOARD_SCREENSHOT") {
        std::fs::write(path, &bytes).unwrap();
    }
    driver.call(reqwest::Method::DELETE, "", Value::Null).await;
}

/// One Server-Sent Events reader over reqwest's byte stream.
struct Events {
    body: std::pin::Pin<Box<dyn futures::Stream<Item = reqwest::Result<actix_web::web::Bytes>> + Send>>,
    buffer: String,
}

impl Events {
    async fn open(api: &str, token: &str) -> Result<Self, (u16, String)> {
        Self::open_from(api, token, None).await
    }

    /// [`Events::open`] from the loopback address `from` (a client of its
    /// own: each client may hold only a few streams).
    async fn open_from(
        api: &str,
        token: &str,
        from: Option<std::net::IpAddr>,
    ) -> Result<Self, (u16, String)> {
        let response = reqwest::Client::builder()
            .local_address(from)
            .build()
            .unwrap()
            .get(format!("http://{api}/v1/dashboard/stream"))
            .bearer_auth(token)
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        if status != 200 {
            return Err((status, response.text().await.unwrap_or_default()));
        }
        assert_eq!(
            response.headers()["content-type"],
            "text/event-stream",
            "an event stream"
        );
        Ok(Self {
            body: Box::pin(response.bytes_stream()),
            buffer: String::new(),
        })
    }

    /// The next event's name and data (`None`: the stream ended).
    async fn next(&mut self) -> Option<(String, String)> {
        use futures::StreamExt as _;
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let block: String = self.buffer.drain(..end + 2).collect();
                let field = |name: &str| {
                    block
                        .lines()
                        .find_map(|l| l.strip_prefix(name))
                        .map(str::to_owned)
                };
                match (field("event: "), field("data: ")) {
                    (Some(event), Some(data)) => return Some((event, data)),
                    _ => continue, // the retry hint
                }
            }
            let chunk = tokio::time::timeout(Duration::from_secs(15), self.body.next())
                .await
                .expect("an event within 15 s")?
                .ok()?;
            self.buffer.push_str(std::str::from_utf8(&chunk).unwrap());
        }
    }
}

#[tokio::test]
async fn the_stream_pushes_snapshots_and_history_to_a_bounded_number_of_listeners() {
    let dir = OperatorDir::new(LOCAL_PROVIDER);
    let external_port = free_port();
    let _external = forward_proxy(BIN, external_port, dir.path());
    dir.write_manifest(
        "ext",
        &format!(
            "apiVersion: crawl.example.com/v1alpha1\nkind: Proxy\nmetadata: {{name: ext, namespace: crawlers}}\n\
             spec: {{mode: External, endpoint: {{host: 127.0.0.1, port: {external_port}}}, \
             healthCheck: {{url: \"{}\", interval: 1s}}}}\n",
            health_target()
        ),
    );
    let operator = dir
        .standalone()
        .discovery()
        .env("DISCOVERY_TOKEN", TOKEN)
        .env("DISCOVERY_READ_TOKEN", READ_TOKEN)
        .start()
        .await;
    operator.wait_ready(1).await;
    let api = operator.discovery().to_string();
    assert_eq!(get(&api, "/v1/dashboard/stream", None).0, 401, "behind the token");

    // On connect: the history, then a snapshot; then a snapshot every second
    // and each closed interval as it closes.
    let mut events = Events::open(&api, READ_TOKEN)
        .await
        .expect("the read token reads");
    let (name, data) = events.next().await.unwrap();
    assert_eq!(name, "history");
    let history: Value = serde_json::from_str(&data).unwrap();
    assert_eq!(history["resolutionSecs"], 10);
    assert!(history["samples"].is_array());
    let started = std::time::Instant::now();
    let (mut snapshots, mut samples) = (0, Vec::new());
    while samples.len() < 2 {
        let (name, data) = events.next().await.unwrap();
        let value: Value = serde_json::from_str(&data).unwrap();
        match name.as_str() {
            "dashboard" => {
                assert_eq!(value["phases"]["Ready"], 1, "{value}");
                snapshots += 1;
            }
            "sample" => samples.push(value),
            other => panic!("unexpected event {other}: {data}"),
        }
    }
    let took = started.elapsed().as_secs_f64();
    assert!(
        (9.0..=30.0).contains(&took),
        "two samples, 10 s apart, took {took:.1} s"
    );
    assert!(
        snapshots as f64 >= took - 3.0 && snapshots as f64 <= took + 3.0,
        "about one snapshot a second: {snapshots} in {took:.1} s"
    );
    let (first, second) = (&samples[0], &samples[1]);
    let apart = second["at"].as_i64().unwrap() - first["at"].as_i64().unwrap();
    assert!(
        (9_000..=11_000).contains(&apart),
        "samples 10 s apart: {apart} ms"
    );
    assert_eq!(
        (second["proxies"].as_i64(), second["ready"].as_i64()),
        (Some(1), Some(1))
    );
    assert!(second["probes"].as_u64() >= Some(5), "1 s probes: {second}");
    assert!(
        second["probeP50Ms"].as_f64().is_some_and(|ms| ms > 0.0),
        "{second}"
    );
    // The history a newcomer gets holds what was pushed.
    let mut late = Events::open(&api, READ_TOKEN).await.unwrap();
    let (_, data) = late.next().await.unwrap();
    let history: Value = serde_json::from_str(&data).unwrap();
    let ats: Vec<&Value> = history["samples"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| &s["at"])
        .collect();
    assert!(
        ats.contains(&&first["at"]) && ats.contains(&&second["at"]),
        "{history}"
    );

    // A bounded number of streams: the 33rd is refused, and a closed one
    // frees its slot. Each comes from an address of its own, since one
    // client may hold only 4 (`hostile_listeners.rs`).
    let client = |n: u8| Some(std::net::IpAddr::from([127, 0, 7, n]));
    let mut open = vec![events, late];
    while open.len() < 32 {
        let n = u8::try_from(open.len()).unwrap();
        open.push(
            Events::open_from(&api, READ_TOKEN, client(n))
                .await
                .expect("a slot"),
        );
    }
    let Err((status, body)) = Events::open_from(&api, READ_TOKEN, client(100)).await else {
        panic!("a 33rd stream was accepted")
    };
    assert_eq!(status, 503, "{body}");
    assert!(
        body.contains("\"unavailable\"") && body.contains("32 dashboard streams"),
        "{body}"
    );
    drop(open.pop());
    eventually(
        "the closed stream's slot to be free",
        Duration::from_secs(10),
        async || {
            Events::open_from(&api, READ_TOKEN, client(101))
                .await
                .map(|_| ())
                .map_err(|(status, body)| format!("{status} {body}"))
        },
    )
    .await;
}
