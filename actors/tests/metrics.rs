//! `/metrics` of the operator binary (standalone, local built-in proxies)
//! after a scenario: two proxies become Ready, a lease is granted, one is
//! denied for want of capacity, a proxy process is killed and its probes
//! fail; the scrape shows each of those as series with the right values.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

mod support;

use support::operator::{LOCAL_PROVIDER, OperatorDir};
use support::process::{free_port, health_target, kill_local_instance};

fn http(addr: SocketAddr, request: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

/// The crawler token the operator is started with (it must never be logged).
const TOKEN: &str = "metrics-test-token-5ab1e2c9d7";

fn post_lease(api: SocketAddr) -> String {
    post_lease_as(api, TOKEN)
}

fn post_lease_as(api: SocketAddr, token: &str) -> String {
    let body = r#"{"target":"shop.test","ttlSeconds":60,"client":"metrics-test"}"#;
    http(
        api,
        &format!(
            "POST /v1/leases HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        ),
    )
}

/// The value of the series whose line starts with `series ` (exact labels).
fn value(scrape: &str, series: &str) -> Option<f64> {
    scrape
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

#[tokio::test]
async fn a_scrape_shows_the_fleet_the_leases_and_the_probes() {
    let dir = OperatorDir::new(LOCAL_PROVIDER);
    let target = health_target();
    for i in 0..2 {
        dir.write_manifest(
            &format!("p{i}"),
            &format!(
                "apiVersion: crawl.example.com/v1alpha1\nkind: Proxy\nmetadata: {{name: p{i}, namespace: crawl}}\n\
                 spec: {{mode: Managed, provider: local, port: {}, \
                 healthCheck: {{url: \"{target}\", interval: 1s, unhealthyThreshold: 2}}}}\n",
                free_port()
            ),
        );
    }
    let operator = dir
        .standalone()
        .discovery()
        .metrics()
        .setting("maxLeasesPerProxy", "1")
        .setting("leaseCooldown", "0s")
        .setting("gcInterval", "1s")
        .env("DISCOVERY_TOKEN", TOKEN)
        .log_format("json")
        // Access lines of expected answers are DEBUG: shown here.
        .log_level("info,egress_proxies_operator::access=debug")
        .start()
        .await;
    let (api, metrics) = (operator.discovery(), operator.metrics());
    operator.wait_ready(2).await;

    // Two proxies, one lease each at most: two granted, the third denied.
    for want in ["201", "201", "503"] {
        let answer = post_lease(api);
        assert!(answer.starts_with(&format!("HTTP/1.1 {want}")), "{answer}");
    }
    let wrong = post_lease_as(api, "not-the-token");
    assert!(wrong.starts_with("HTTP/1.1 401"), "{wrong}");

    // One access line per request: method, route, status, code, duration,
    // client; the expected 503 as quiet as a grant, the 401 louder; never a token.
    let access = operator
        .eventually("four access lines", Duration::from_secs(10), async || {
            let lines: Vec<serde_json::Value> = operator
                .logs()
                .lines()
                .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
                .filter(|l| l["target"] == "egress_proxies_operator::access")
                .collect();
            if lines.len() >= 4 {
                Ok(lines)
            } else {
                Err(format!("{lines:?}"))
            }
        })
        .await;
    let of = |status: u64| {
        access
            .iter()
            .filter(|l| l["status"] == status)
            .map(|l| {
                assert_eq!(
                    (l["method"].as_str(), l["route"].as_str()),
                    (Some("POST"), Some("/v1/leases")),
                    "{l}"
                );
                assert_eq!(l["client"], "127.0.0.1", "{l}");
                assert!(l["duration_ms"].as_f64().is_some_and(|d| d >= 0.0), "{l}");
                (
                    l["level"].as_str().unwrap_or_default().to_owned(),
                    l["code"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect::<Vec<_>>()
    };
    let grant = ("DEBUG".to_owned(), String::new());
    assert_eq!(of(201), [grant.clone(), grant]);
    assert_eq!(of(503), [("DEBUG".to_owned(), "no_capacity".to_owned())]);
    assert_eq!(of(401), [("INFO".to_owned(), "unauthorized".to_owned())]);
    assert!(!operator.logs().contains(TOKEN), "the token is never logged");
    let scrape = || {
        http(
            metrics,
            "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        )
    };
    let first = scrape();
    assert!(
        first.contains("content-type: application/openmetrics-text"),
        "{first}"
    );
    let expect = |text: &str, series: &str, check: &dyn Fn(f64) -> bool| {
        let v = value(text, series);
        assert!(v.is_some_and(check), "{series} = {v:?} in\n{text}");
    };
    expect(&first, "egress_proxies_proxies{phase=\"Ready\"}", &|v| v == 2.0);
    expect(
        &first,
        "egress_proxies_provider_calls_total{provider=\"local\",kind=\"local\",op=\"create\",result=\"ok\"}",
        &|v| v >= 2.0,
    );
    expect(&first, "egress_proxies_reconciles_total{result=\"ok\"}", &|v| {
        v >= 2.0
    });
    expect(&first, "egress_proxies_reconcile_duration_seconds_count", &|v| {
        v >= 2.0
    });
    expect(
        &first,
        "egress_proxies_health_probes_total{result=\"ok\"}",
        &|v| v >= 4.0,
    );
    expect(&first, "egress_proxies_leases_granted_total", &|v| v == 2.0);
    expect(
        &first,
        "egress_proxies_leases_denied_total{reason=\"no_capacity\"}",
        &|v| v == 1.0,
    );
    expect(&first, "egress_proxies_leases_active", &|v| v == 2.0);
    // Which build runs, and the standard process metrics (of the operator,
    // not of this test: its pid's resident memory is in the range below).
    let build = first
        .lines()
        .find(|l| l.starts_with("egress_proxies_build_info{"))
        .unwrap_or_else(|| panic!("no build_info in\n{first}"));
    assert!(
        build.contains(&format!("version=\"{}\"", env!("CARGO_PKG_VERSION"))) && build.ends_with(" 1"),
        "{build}"
    );
    // Standalone, the process acts alone: it is the leader.
    expect(&first, "egress_proxies_leader", &|v| v == 1.0);
    operator
        .eventually("a GC sweep", Duration::from_secs(20), async || {
            let text = scrape();
            value(&text, "egress_proxies_gc_sweeps_total{result=\"ok\"}")
                .is_some_and(|v| v >= 1.0)
                .then_some(())
                .ok_or(text)
        })
        .await;
    expect(&scrape(), "egress_proxies_gc_delete_failures_total", &|v| {
        v == 0.0
    });
    expect(&first, "process_resident_memory_bytes", &|v| v > 1e6 && v < 4e9);
    expect(&first, "process_cpu_seconds_total", &|v| v > 0.0);
    expect(&first, "process_open_fds", &|v| v >= 3.0);
    expect(&first, "process_threads", &|v| v >= 2.0);
    let started = operator_start_time(&operator);
    expect(&first, "process_start_time_seconds", &|v| {
        (v - started).abs() < 5.0
    });

    // A proxy process dies: its probes fail with a reason, it turns Unhealthy.
    kill_local_instance(&dir.state());
    operator
        .eventually("failed probes", Duration::from_secs(20), async || {
            let text = scrape();
            let refused = value(
                &text,
                "egress_proxies_health_probes_total{result=\"proxy_refused\"}",
            )
            .unwrap_or(0.0);
            if refused >= 2.0 && value(&text, "egress_proxies_proxies{phase=\"Ready\"}") == Some(1.0) {
                Ok(())
            } else {
                Err(text)
            }
        })
        .await;
}

/// The operator process's start time, Unix seconds, from `/proc`.
fn operator_start_time(operator: &support::operator::OperatorProcess) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", operator.pid())).unwrap();
    let ticks: f64 = stat
        .rsplit_once(") ")
        .unwrap()
        .1
        .split_whitespace()
        .nth(19)
        .unwrap()
        .parse()
        .unwrap();
    let uptime: f64 = std::fs::read_to_string("/proc/uptime")
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    // /proc counts in USER_HZ, 100 a second on Linux.
    now - uptime + ticks / 100.0
}
