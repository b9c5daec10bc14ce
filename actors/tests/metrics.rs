//! `/metrics` of the operator binary (standalone, local built-in proxies)
//! after a scenario: two proxies become Ready, a lease is granted, one is
//! denied for want of capacity, a proxy process is killed and its probes
//! fail; the scrape shows each of those as series with the right values.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use egress_proxies::resource::Phase;
use egress_proxies::store::embedded::read_snapshot;

mod support;

use support::process::{Killed, free_port, health_target, kill_local_instance};

const BIN: &str = env!("CARGO_BIN_EXE_egress-proxies-operator");

fn http(addr: &str, request: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

fn post_lease(api: &str) -> String {
    let body = r#"{"target":"shop.test","ttlSeconds":60,"client":"metrics-test"}"#;
    http(
        api,
        &format!(
            "POST /v1/leases HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
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

#[test]
fn a_scrape_shows_the_fleet_the_leases_and_the_probes() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let _reaper = support::process::InstanceReaper(root.join("state"));
    std::fs::create_dir(root.join("proxies")).unwrap();
    std::fs::write(
        root.join("providers.yaml"),
        "providers:\n  - {name: local, type: local, local: {implementation: builtin, destinations: {allow: [127.0.0.0/8]}}}\n",
    )
    .unwrap();
    let (api, metrics) = (
        format!("127.0.0.1:{}", free_port()),
        format!("127.0.0.1:{}", free_port()),
    );
    std::fs::write(
        root.join("standalone.yaml"),
        format!(
            "providersConfig: providers.yaml\nmanifests: proxies\nstateDir: state\nhealthProbeBindAddress: \"0\"\n\
             discoveryBindAddress: \"{api}\"\nmetricsBindAddress: \"{metrics}\"\nmanifestPollInterval: 100ms\n\
             maxLeasesPerProxy: 1\nleaseCooldown: 0s\n"
        ),
    )
    .unwrap();
    let target = health_target();
    let ports = [free_port(), free_port()];
    for (i, port) in ports.iter().enumerate() {
        std::fs::write(
            root.join(format!("proxies/p{i}.yaml")),
            format!(
                "apiVersion: crawl.example.com/v1alpha1\nkind: Proxy\nmetadata: {{name: p{i}, namespace: crawl}}\n\
                 spec: {{mode: Managed, provider: local, port: {port}, \
                 healthCheck: {{url: \"{target}\", interval: 1s, unhealthyThreshold: 2}}}}\n"
            ),
        )
        .unwrap();
    }
    let log = std::fs::File::create(root.join("operator.log")).unwrap();
    let _operator = Killed(
        Command::new(BIN)
            .args(["standalone", "--config"])
            .arg(root.join("standalone.yaml"))
            .args(["--log-format", "text", "--log-level", "info"])
            .env_remove("DISCOVERY_TOKEN")
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .stdin(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let state = root.join("state");
    let phases = || -> Vec<Option<Phase>> {
        read_snapshot(&state)
            .map(|ps| ps.into_iter().map(|p| p.status.and_then(|s| s.phase)).collect())
            .unwrap_or_default()
    };
    let started = Instant::now();
    while phases() != [Some(Phase::Ready), Some(Phase::Ready)] {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "{:?}\n{}",
            phases(),
            std::fs::read_to_string(root.join("operator.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    // Two proxies, one lease each at most: two granted, the third denied.
    for want in ["201", "201", "503"] {
        let answer = post_lease(&api);
        assert!(answer.starts_with(&format!("HTTP/1.1 {want}")), "{answer}");
    }
    let scrape = || {
        http(
            &metrics,
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

    // A proxy process dies: its probes fail with a reason, it turns Unhealthy.
    kill_local_instance(&state);
    let started = Instant::now();
    loop {
        let text = scrape();
        let refused = value(
            &text,
            "egress_proxies_health_probes_total{result=\"proxy_refused\"}",
        )
        .unwrap_or(0.0);
        if refused >= 2.0 && value(&text, "egress_proxies_proxies{phase=\"Ready\"}") == Some(1.0) {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "no failed probes seen:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}
