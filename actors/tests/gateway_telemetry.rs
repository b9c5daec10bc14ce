//! The gateway's telemetry through the real binary in standalone mode, on
//! loopback: two proxies behind the gateway (a Managed local one and an
//! External forward proxy of this test), curl as the crawler. After plain
//! requests, a tunnel, a refused request and a blocked one, `/metrics`
//! shows each by kind and outcome, tries and retries, blocks by proxy,
//! bytes and durations; once the External proxy is killed (still Ready:
//! its health check is slow to give up) a request through it fails over,
//! and the failure is counted against that proxy with scope `proxy`. Every
//! exchange writes one access line (never the token), and with
//! `traceExchanges` the console exporter prints the exchange and try spans.

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use support::operator::{BIN, OperatorDir, OperatorProcess};
use support::process::{forward_proxy, free_port, health_target};
use support::target_server::{Behaviour, http_target_with};

const TOKEN: &str = "gw-telemetry-t0ken-51c2";
const PROVIDER: &str = "providers:\n  - {name: local, type: local, local: {implementation: builtin, destinations: {allow: [127.0.0.0/8, 1024-65535]}}}\n";

/// `curl -x proxy url` and extra arguments: the status and response head.
async fn curl(proxy: &str, url: &str, extra: &[&str]) -> (u16, String) {
    let mut args = vec![
        "-s",
        "-o",
        "/dev/null",
        "-D",
        "-",
        "-w",
        "%{http_code}",
        "-x",
        proxy,
        url,
    ];
    args.extend_from_slice(extra);
    let out = tokio::time::timeout(
        Duration::from_secs(30),
        tokio::process::Command::new("curl")
            .args(&args)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("curl finishes within 30 s")
    .unwrap();
    let out = String::from_utf8_lossy(&out.stdout).to_ascii_lowercase();
    let status = out
        .rsplit('\n')
        .next()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(|| panic!("curl gave no status: {out}"));
    (status, out)
}

/// The scrape's value of the series `series` (exactly as written, labels
/// in registration order); 0 when it is not there.
async fn value(operator: &OperatorProcess, series: &str) -> f64 {
    scrape(operator.metrics())
        .await
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

async fn scrape(addr: SocketAddr) -> String {
    let (status, text) = support::http::request(addr, "GET", "/metrics", &[], None).await;
    assert_eq!(status, 200);
    text
}

#[tokio::test]
async fn the_gateway_s_traffic_shows_in_metrics_access_lines_and_spans() {
    let dir = OperatorDir::new(PROVIDER);
    let health = health_target();
    let external_port = free_port();
    let external = forward_proxy(BIN, external_port, dir.path());
    dir.write_manifest(
        "p1",
        &format!(
            "apiVersion: crawl.example.com/v1alpha1\nkind: Proxy\nmetadata: {{name: p1, namespace: crawl}}\n\
             spec: {{mode: Managed, provider: local, healthCheck: {{url: \"{health}\", interval: 1s}}}}\n"
        ),
    );
    // Slow to turn Unhealthy: killed, it stays leasable long enough to fail a try.
    dir.write_manifest(
        "p2",
        &format!(
            "apiVersion: crawl.example.com/v1alpha1\nkind: Proxy\nmetadata: {{name: p2, namespace: crawl}}\n\
             spec: {{mode: External, endpoint: {{host: 127.0.0.1, port: {external_port}}}, \
             healthCheck: {{url: \"{health}\", interval: 2s, unhealthyThreshold: 10}}}}\n"
        ),
    );
    let gateway: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let operator = dir
        .standalone()
        .discovery()
        .metrics()
        .setting("gatewayBindAddress", &format!("\"{gateway}\""))
        .setting(
            "gateway",
            "{destinations: {allow: [127.0.0.0/8, '::1', 1024-65535]}, tries: 2, traceExchanges: true, \
             blocks: [{status: [403], targets: [localhost]}]}",
        )
        .setting("leaseCooldown", "0s")
        .env("DISCOVERY_TOKEN", TOKEN)
        .env("OTEL_TRACES_EXPORTER", "console")
        .start()
        .await;
    operator.wait_ready(2).await;
    let (site, _) = http_target_with(Behaviour::Status(204)).await;
    let (blocking, _) = http_target_with(Behaviour::Status(403)).await;
    let proxy = format!("http://crawler:{TOKEN}@{gateway}");
    let page = format!("http://{site}/page");
    operator
        .eventually(
            "a gateway request served",
            Duration::from_secs(30),
            async || match curl(&proxy, &page, &[]).await {
                (204, _) => Ok(()),
                (status, head) => Err(format!("{status}: {head}")),
            },
        )
        .await;
    let served_before = value(
        &operator,
        "egress_proxies_gateway_requests_total{kind=\"http\",outcome=\"served\"}",
    )
    .await;

    // Plain requests, one tunnel, a refusal and a block (both proxies blocked: tries 2).
    for _ in 0..4 {
        assert_eq!(curl(&proxy, &page, &[]).await.0, 204);
    }
    assert_eq!(
        curl(&proxy, &page, &["-p"]).await.0,
        204,
        "through a CONNECT tunnel"
    );
    assert_eq!(curl(&format!("http://{gateway}"), &page, &[]).await.0, 407);
    let blocked = format!("http://localhost:{}/shop", blocking.port());
    let (status, head) = curl(&proxy, &blocked, &[]).await;
    assert_eq!(status, 403, "{head}");
    assert!(head.contains("egress-gateway-blocked: true"), "{head}");

    let series = [
        (
            "egress_proxies_gateway_requests_total{kind=\"http\",outcome=\"served\"}",
            served_before + 4.0,
        ),
        (
            "egress_proxies_gateway_requests_total{kind=\"tunnel\",outcome=\"served\"}",
            1.0,
        ),
        (
            "egress_proxies_gateway_requests_total{kind=\"http\",outcome=\"authentication_required\"}",
            1.0,
        ),
        (
            "egress_proxies_gateway_requests_total{kind=\"http\",outcome=\"blocked\"}",
            1.0,
        ),
        ("egress_proxies_gateway_tries_total{kind=\"tunnel\"}", 1.0),
        ("egress_proxies_gateway_retries_total{kind=\"http\"}", 1.0),
        ("egress_proxies_gateway_blocks_total{proxy=\"crawl/p1\"}", 1.0),
        ("egress_proxies_gateway_blocks_total{proxy=\"crawl/p2\"}", 1.0),
        ("egress_proxies_gateway_requests_open{kind=\"http\"}", 0.0),
        ("egress_proxies_gateway_requests_open{kind=\"tunnel\"}", 0.0),
        (
            "egress_proxies_gateway_request_duration_seconds_count{kind=\"tunnel\"}",
            1.0,
        ),
    ];
    let text = scrape(operator.metrics()).await;
    for (name, want) in series {
        assert_eq!(value(&operator, name).await, want, "{name} in\n{text}");
    }
    assert!(
        value(
            &operator,
            "egress_proxies_gateway_transferred_bytes_total{kind=\"tunnel\",direction=\"down\"}"
        )
        .await
            > 0.0,
        "{text}"
    );
    assert!(
        value(&operator, "egress_proxies_gateway_tries_total{kind=\"http\"}").await >= served_before + 6.0,
        "one try per served request, two for the blocked one: {text}"
    );
    assert!(!text.contains(TOKEN));

    // The External proxy dies; requests alternate between the proxies, so
    // one soon tries it, fails over to the other and is served.
    drop(external);
    let failures = "egress_proxies_gateway_upstream_failures_total{proxy=\"crawl/p2\",scope=\"proxy\",reason=\"upstream_failed\"}";
    operator
        .eventually(
            "a try on the dead proxy counted",
            Duration::from_secs(15),
            async || {
                let (status, head) = curl(&proxy, &page, &[]).await;
                assert_eq!(status, 204, "served after failing over: {head}");
                match value(&operator, failures).await {
                    n if n >= 1.0 => Ok(()),
                    _ => Err("no failure counted yet"),
                }
            },
        )
        .await;
    assert!(value(&operator, "egress_proxies_gateway_retries_total{kind=\"http\"}").await >= 2.0);

    // One access line per exchange, with the outcome; never the token.
    let logs = operator.logs();
    let access: Vec<&str> = logs
        .lines()
        .filter(|l| l.contains("gateway exchange") && l.contains("outcome"))
        .collect();
    assert!(access.len() >= 8, "{logs}");
    for outcome in ["served", "blocked", "authentication_required"] {
        assert!(
            access.iter().any(|l| l.contains(outcome)),
            "no {outcome} line in {access:#?}"
        );
    }
    assert!(!logs.contains(TOKEN), "the token reached the log");
    // The spans, printed by the console exporter: each exchange with its tries.
    for span in ["gateway exchange", "gateway try"] {
        assert!(
            logs.contains(&format!("Name         : {span}")),
            "no {span} span in {logs}"
        );
    }
}
