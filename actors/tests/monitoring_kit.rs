//! The operations kit in `deploy/monitoring/` queries only metrics the
//! operator exports: every `egress_proxies_*` and `process_*` name in the
//! alerts and the Grafana dashboard is a series the real binary's `/metrics`
//! carries. Families are read from the `# TYPE` lines. In OpenMetrics a
//! counter's family drops `_total` (its samples carry it) and a histogram's
//! samples are `_bucket`, `_sum` and `_count`: a query naming the bare family
//! of either would find nothing in Prometheus and counts as missing here.
//!
//! A family with no sample yet prints no `# TYPE` line at all, so the binary
//! is driven until its families fill: a ProxyPool of local proxies rotated by
//! age, a lease granted and one refused, a proxy process killed, orphan GC
//! every second, and a KVM host that cannot be reached (its link fails,
//! its actor restarts). Two families need a live libvirt host, which this
//! test has none of: libvirt call latency and image downloads. Only those
//! are taken from the same telemetry code in this process instead.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

mod support;

use support::http::request;
use support::operator::{LOCAL_PROVIDER, OperatorDir};
use support::process::{free_port, health_target, kill_local_instance};

/// The kit's files whose queries must name exported series.
const KIT: [&str; 2] = ["alerts.yaml", "grafana-dashboard.json"];

/// The sample names a scrape with these `# TYPE` lines can carry.
fn series_names(scrape: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in scrape.lines() {
        let Some(declared) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let Some((family, kind)) = declared.split_once(' ') else {
            panic!("a # TYPE line without a type: {line:?}");
        };
        let suffixes: &[&str] = match kind {
            "counter" => &["_total"],
            "histogram" => &["_bucket", "_sum", "_count"],
            "summary" => &["", "_sum", "_count"],
            "info" => &["_info"],
            "gauge" | "unknown" | "stateset" => &[""],
            other => panic!("unexpected metric type {other:?} in {line:?}"),
        };
        names.extend(suffixes.iter().map(|s| format!("{family}{s}")));
    }
    names
}

/// Every `egress_proxies_…` and `process_…` token in `text` (lower-case
/// letters, digits and `_`, not preceded by one of those).
fn metric_tokens(text: &str) -> BTreeSet<String> {
    let word = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'_';
    let bytes = text.as_bytes();
    let mut tokens = BTreeSet::new();
    for prefix in ["egress_proxies_", "process_"] {
        for (start, _) in text.match_indices(prefix) {
            if start > 0 && word(bytes[start - 1]) {
                continue;
            }
            let end = bytes[start..]
                .iter()
                .position(|&c| !word(c))
                .map_or(bytes.len(), |n| start + n);
            tokens.insert(text[start..end].to_owned());
        }
    }
    tokens
}

#[test]
fn tokens_and_series_names_are_read_as_prometheus_sees_them() {
    let names = series_names(
        "# TYPE egress_proxies_leases_granted counter\n# TYPE egress_proxies_leader gauge\n\
         # TYPE egress_proxies_health_probe_duration_seconds histogram\n# EOF\n",
    );
    assert!(names.contains("egress_proxies_leases_granted_total"));
    assert!(
        !names.contains("egress_proxies_leases_granted"),
        "a counter's bare family is no series"
    );
    assert!(names.contains("egress_proxies_health_probe_duration_seconds_bucket"));
    assert!(!names.contains("egress_proxies_health_probe_duration_seconds"));
    assert!(names.contains("egress_proxies_leader"));
    assert_eq!(
        metric_tokens(
            "sum(rate(egress_proxies_x_total{a=\"b\"}[5m])) / subprocess_y + process_cpu_seconds_total"
        ),
        BTreeSet::from([
            "egress_proxies_x_total".to_owned(),
            "process_cpu_seconds_total".to_owned()
        ])
    );
}

/// The crawler token the operator is started with.
const TOKEN: &str = "monitoring-kit-token-7c1d";

/// Families only a live libvirt host fills (see the top of the file).
const NEED_A_KVM_HOST: [&str; 2] = [
    "egress_proxies_libvirt_call_duration_seconds",
    "egress_proxies_image_downloads",
];

/// The series names those families export, from this process's registry
/// after their events, emitted as the KVM provider emits them.
fn kvm_host_series() -> BTreeSet<String> {
    use egress_proxies::telemetry::events::{ImageDownloadCompleted, LibvirtCallCompleted};
    LibvirtCallCompleted {
        rpc: "virDomainLookupByName",
        duration: Duration::from_millis(3),
    }
    .emit();
    ImageDownloadCompleted {
        host: "a",
        url: "https://images.invalid/guest.qcow2",
        result: "ok",
        bytes: 1,
    }
    .emit();
    let local = series_names(&egress_proxies::telemetry::metrics::metrics().encode());
    local
        .into_iter()
        .filter(|name| NEED_A_KVM_HOST.iter().any(|family| name.starts_with(family)))
        .collect()
}

async fn api(addr: std::net::SocketAddr, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
    let auth = format!("Bearer {TOKEN}");
    request(addr, method, path, &[("Authorization", &auth)], body).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_the_kit_queries_is_exported_by_the_operator() {
    let kit = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/monitoring");
    // Which file names each token.
    let mut wanted: BTreeMap<String, Vec<&str>> = BTreeMap::new();
    for file in KIT {
        let text = std::fs::read_to_string(kit.join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
        for token in metric_tokens(&text) {
            wanted.entry(token).or_default().push(file);
        }
    }
    // The kit queries a good part of what the operator exports, both files do.
    assert!(
        wanted.len() >= 30,
        "only {} metric names found in the kit: {wanted:?}",
        wanted.len()
    );
    for file in KIT {
        assert!(
            wanted.values().filter(|files| files.contains(&file)).count() >= 10,
            "{file} names few metrics: {wanted:?}"
        );
    }
    let from_this_process = kvm_host_series();
    assert!(
        !from_this_process.is_empty(),
        "the libvirt and image download events recorded nothing"
    );

    // A KVM host on a loopback port nobody listens on, with no key: its link
    // fails before any connection is tried.
    let dir = OperatorDir::new("");
    let port = free_port();
    dir.write(
        "providers.yaml",
        format!(
            "{LOCAL_PROVIDER}  - name: kvm-down\n    type: kvm\n    kvm:\n      sshKeyFile: {key}\n      \
             knownHostsFile: {known}\n      machineTypes: {{tiny: {{vcpus: 1, memoryMiB: 256}}}}\n      \
             hosts: [{{name: down, address: \"127.0.0.1:{port}\", user: nobody, bridge: br0}}]\n",
            key = dir.path().join("no-key").display(),
            known = dir.path().join("no-known-hosts").display(),
        ),
    );
    dir.write_manifest(
        "pool",
        &format!(
            "apiVersion: crawl.example.com/v1alpha1\nkind: ProxyPool\nmetadata: {{name: eu, namespace: crawl}}\n\
             spec:\n  replicas: 1\n  rotation: {{maxAge: 15s}}\n  drainTimeout: 5s\n  template:\n    \
             spec: {{mode: Managed, provider: local, healthCheck: {{url: \"{}\", interval: 1s}}}}\n",
            health_target()
        ),
    );
    let operator = dir
        .standalone()
        .discovery()
        .metrics()
        .setting("maxLeasesPerProxy", "1")
        .setting("leaseCooldown", "0s")
        .setting("gcInterval", "1s")
        .env("DISCOVERY_TOKEN", TOKEN)
        .log_level("info")
        .start()
        .await;
    let (discovery, metrics) = (operator.discovery(), operator.metrics());
    operator.wait_ready(1).await;

    // One lease on the pool's one member, and one refused for want of capacity.
    let acquire = r#"{"target":"shop.test","pool":"eu","ttlSeconds":60}"#;
    let grant = operator
        .eventually("a lease on the pool", Duration::from_secs(20), async || {
            let (status, body) = api(discovery, "POST", "/v1/leases", Some(acquire)).await;
            if status == 201 {
                Ok(body)
            } else {
                Err(format!("{status} {body}"))
            }
        })
        .await;
    let (status, refused) = api(discovery, "POST", "/v1/leases", Some(acquire)).await;
    assert_eq!(status, 503, "{refused}");
    let id = serde_json::from_str::<serde_json::Value>(&grant).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let (status, body) = api(discovery, "DELETE", &format!("/v1/leases/{id}"), None).await;
    assert!(status < 300, "{status} {body}");
    // Its proxy process dies: the instance is replaced.
    kill_local_instance(&dir.state());

    // Until every family the kit names (but the two above) has its series.
    let exported = operator
        .eventually(
            "every metric the kit names in the scrape",
            Duration::from_secs(90),
            async || {
                let (status, scrape) = request(metrics, "GET", "/metrics", &[], None).await;
                let mut exported = series_names(&scrape);
                if status != 200 {
                    return Err(format!("{status}\n{scrape}"));
                }
                // Standalone, the process leads from its start.
                if !scrape.lines().any(|l| l == "egress_proxies_leader 1") {
                    return Err(format!("no `egress_proxies_leader 1` in\n{scrape}"));
                }
                exported.extend(from_this_process.iter().cloned());
                let missing: Vec<String> = wanted
                    .iter()
                    .filter(|(token, _)| !exported.contains(*token))
                    .map(|(token, files)| format!("{token} (in {})", files.join(", ")))
                    .collect();
                if missing.is_empty() {
                    Ok(exported)
                } else {
                    Err(format!(
                        "the kit in deploy/monitoring queries {} metric(s) the operator does not export:\n  {}\n\
                         series the operator exports:\n  {}",
                        missing.len(),
                        missing.join("\n  "),
                        exported.iter().cloned().collect::<Vec<_>>().join("\n  ")
                    ))
                }
            },
        )
        .await;
    assert!(exported.contains("egress_proxies_kvm_host_connected"));
}
