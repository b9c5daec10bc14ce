//! The Proxy CRD: the committed YAML matches the Rust types, and its schema
//! accepts good objects and rejects bad ones the way the API server would
//! (OpenAPI structure via a JSON-schema validator, `x-kubernetes-validations`
//! via a CEL evaluator).

use egress_proxies_domain::resource::{CrdKind, Proxy, ProxyPool, crd_yaml, crd_yaml_of};
use kube::CustomResourceExt;
use serde_json::{Value, json};

const COMMITTED: &str = include_str!("../../deploy/crd/proxies.yaml");
const COMMITTED_POOLS: &str = include_str!("../../deploy/crd/proxypools.yaml");

#[test]
fn committed_crds_match_the_types() {
    for (kind, committed) in [
        (CrdKind::Proxies, COMMITTED),
        (CrdKind::ProxyPools, COMMITTED_POOLS),
    ] {
        let plural = kind.plural();
        assert!(
            crd_yaml_of(kind).unwrap() == committed,
            "deploy/crd/{plural}.yaml is stale: regenerate it with\n  \
             cargo run -q -- crd {plural} > deploy/crd/{plural}.yaml"
        );
    }
    assert_eq!(crd_yaml().unwrap(), COMMITTED);
}

fn schema() -> Value {
    let crd = serde_json::to_value(Proxy::crd()).unwrap();
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"].clone()
}

fn object(spec: Value) -> Value {
    json!({
        "apiVersion": "crawl.example.com/v1alpha1",
        "kind": "Proxy",
        "metadata": {"name": "p", "namespace": "crawlers"},
        "spec": spec,
    })
}

/// Messages the API server would answer with: schema violations and failed CEL rules.
fn rejections(obj: &Value) -> Vec<String> {
    rejections_by(&schema(), obj)
}

fn rejections_by(schema: &Value, obj: &Value) -> Vec<String> {
    let validator = jsonschema::options()
        .with_draft(jsonschema::Draft::Draft4)
        .build(schema)
        .unwrap();
    let mut out: Vec<String> = validator.iter_errors(obj).map(|e| e.to_string()).collect();
    out.extend(
        kube_cel::Validator::new()
            .validate(schema, obj, None)
            .into_iter()
            .map(|e| e.to_string()),
    );
    out
}

#[test]
fn valid_proxies_are_accepted() {
    for spec in [
        json!({"mode": "Managed", "provider": "kvm-home"}),
        json!({"mode": "Managed", "provider": "gcp-eu", "placement": {"zone": "europe-west1-b",
               "machineType": "e2-small", "image": "debian-13"}, "port": 3128,
               "cloudInit": {"inline": "#cloud-config\n"}, "attributes": {"geo": "eu"}}),
        json!({"mode": "Managed", "provider": "k", "cloudInit": {"secretRef": {"name": "ci"}}}),
        json!({"mode": "External", "endpoint": {"host": "203.0.113.7", "port": 8080, "scheme": "https"},
               "healthCheck": {"url": "https://example.org/", "interval": "5s", "expectedStatus": 204,
               "healthyThreshold": 1, "unhealthyThreshold": 5}}),
    ] {
        let obj = object(spec.clone());
        assert_eq!(rejections(&obj), Vec::<String>::new(), "{spec}");
        let proxy: Proxy = serde_json::from_value(obj).unwrap();
        assert_eq!(serde_json::to_value(&proxy.spec).unwrap()["mode"], spec["mode"]);
    }
}

#[test]
fn invalid_proxies_are_rejected_with_a_reason() {
    let cases = [
        (
            json!({"mode": "External"}),
            "endpoint is required when mode is External",
        ),
        (
            json!({"mode": "Managed"}),
            "provider is required when mode is Managed",
        ),
        (
            json!({"mode": "Managed", "provider": ""}),
            "provider is required when mode is Managed",
        ),
        (
            json!({"mode": "Managed", "provider": "p", "cloudInit": {}}),
            "cloudInit must set exactly one of inline or secretRef",
        ),
        (
            json!({"mode": "Managed", "provider": "p",
                   "cloudInit": {"inline": "x", "secretRef": {"name": "s"}}}),
            "cloudInit must set exactly one of inline or secretRef",
        ),
        (json!({"mode": "Sometimes"}), "\"Sometimes\" is not one of"),
        (json!({"provider": "p"}), "\"mode\" is a required property"),
        (
            json!({"mode": "External", "endpoint": {"host": "h"}}),
            "\"port\" is a required property",
        ),
        (
            json!({"mode": "Managed", "provider": "p", "port": 0}),
            "0 is less than the minimum of 1",
        ),
        (
            json!({"mode": "Managed", "provider": "p", "port": 70000}),
            "70000 is greater than the maximum of 65535",
        ),
        (
            json!({"mode": "Managed", "provider": "p", "healthCheck": {"healthyThreshold": 0}}),
            "0 is less than the minimum of 1",
        ),
    ];
    for (spec, expected) in cases {
        let got = rejections(&object(spec.clone()));
        assert!(
            got.iter().any(|m| m.contains(expected)),
            "{spec}: expected a rejection containing {expected:?}, got {got:?}"
        );
    }
}

#[test]
fn defaults_come_from_the_types() {
    let proxy: Proxy = serde_json::from_value(object(json!({"mode": "Managed", "provider": "p",
        "healthCheck": {}, "cloudInit": {"secretRef": {"name": "s"}}})))
    .unwrap();
    assert_eq!(proxy.spec.port, 3128);
    let hc = proxy.spec.health_check();
    assert_eq!(hc.url, "https://www.gstatic.com/generate_204");
    assert_eq!(hc.interval().unwrap(), std::time::Duration::from_secs(1));
    assert_eq!(hc.timeout().unwrap(), std::time::Duration::from_secs(5));
    assert_eq!(
        (hc.healthy_threshold, hc.unhealthy_threshold, hc.expected_status),
        (2, 3, None)
    );
    let secret = proxy.spec.cloud_init.unwrap().secret_ref.unwrap();
    assert_eq!(secret.key, "user-data");
}

#[test]
fn durations_are_checked_with_a_clear_message() {
    let mut hc = egress_proxies_domain::resource::HealthCheck {
        interval: "1m30s".into(),
        ..Default::default()
    };
    assert_eq!(hc.interval().unwrap().as_secs(), 90);
    hc.interval = "often".into();
    let err = hc.interval().unwrap_err().to_string();
    assert!(
        err.starts_with("healthCheck.interval must be whole numbers with h, m, s or ms"),
        "{err}"
    );
    hc.timeout = "0s".into();
    assert!(
        hc.timeout()
            .unwrap_err()
            .to_string()
            .starts_with("healthCheck.timeout must be between 1ms and 30s")
    );
}

/// The API server (CRD pattern and CEL rules) and the operator's own check
/// (the embedded store, objects stored before the rules) draw the same
/// lines: each value is accepted or refused by both, with the same words.
#[test]
fn health_check_bounds_agree_between_the_crd_and_the_runtime_check() {
    let cases = [
        ("interval", "1s", None),
        ("interval", "24h", None),
        ("interval", "1m30s", None),
        (
            "interval",
            "999ms",
            Some("healthCheck.interval must be between 1s and 24h"),
        ),
        (
            "interval",
            "1ms",
            Some("healthCheck.interval must be between 1s and 24h"),
        ),
        (
            "interval",
            "24h1s",
            Some("healthCheck.interval must be between 1s and 24h"),
        ),
        ("interval", "1.5s", Some("must match")),
        ("interval", "1 s", Some("must match")),
        ("timeout", "30s", None),
        ("timeout", "1ms", None),
        (
            "timeout",
            "31s",
            Some("healthCheck.timeout must be between 1ms and 30s"),
        ),
        (
            "timeout",
            "0s",
            Some("healthCheck.timeout must be between 1ms and 30s"),
        ),
        ("timeout", "5d", Some("must match")),
    ];
    for (field, value, refusal) in cases {
        let spec = json!({"mode": "Managed", "provider": "p", "healthCheck": {field: value}});
        let by_the_api_server = rejections(&object(spec.clone()));
        let proxy: Proxy = serde_json::from_value(object(spec)).unwrap();
        let by_the_operator = proxy.spec.validate().err().unwrap_or_default();
        match refusal {
            None => {
                assert_eq!(by_the_api_server, Vec::<String>::new(), "{field}: {value}");
                assert_eq!(by_the_operator, Vec::<String>::new(), "{field}: {value}");
            }
            Some(words) => {
                assert!(
                    by_the_api_server
                        .iter()
                        .any(|m| m.contains(words) || m.contains("does not match")),
                    "{field}: {value}: the CRD lets it through: {by_the_api_server:?}"
                );
                let expected = if words == "must match" {
                    format!("healthCheck.{field} must be whole numbers")
                } else {
                    words.to_owned()
                };
                assert!(
                    by_the_operator.iter().any(|m| m.starts_with(&expected)),
                    "{field}: {value}: the operator says {by_the_operator:?}, not {expected:?}"
                );
            }
        }
    }
}

#[test]
fn printer_columns_and_subresource() {
    let crd = serde_json::to_value(Proxy::crd()).unwrap();
    let version = &crd["spec"]["versions"][0];
    let columns: Vec<&str> = version["additionalPrinterColumns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        columns,
        ["Mode", "Provider", "Phase", "IP", "Healthy", "Age", "Message"]
    );
    // The message only with `kubectl get -o wide`, like pods' extra columns.
    let message = &version["additionalPrinterColumns"][6];
    assert_eq!(message["priority"], 1);
    assert_eq!(message["jsonPath"], ".status.message");
    let phases = &version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]["phase"]["enum"];
    assert!(phases.as_array().unwrap().contains(&json!("BackOff")), "{phases}");
    assert_eq!(version["subresources"]["status"], json!({}));
    assert_eq!(crd["spec"]["names"]["shortNames"], json!(["px"]));
    assert_eq!(crd["spec"]["scope"], "Namespaced");
}

#[test]
fn cloud_init_content_never_shows_in_debug_output() {
    let proxy: Proxy = serde_json::from_value(object(json!({"mode": "Managed", "provider": "p",
        "cloudInit": {"inline": "password: hunter2"}})))
    .unwrap();
    let debug = format!("{proxy:?}");
    assert!(!debug.contains("hunter2"), "{debug}");
    assert!(debug.contains("<17 bytes>"), "{debug}");
}

fn pool(spec: Value) -> Value {
    json!({
        "apiVersion": "crawl.example.com/v1alpha1",
        "kind": "ProxyPool",
        "metadata": {"name": "eu", "namespace": "crawlers"},
        "spec": spec,
    })
}

fn pool_rejections(obj: &Value) -> Vec<String> {
    let crd = serde_json::to_value(ProxyPool::crd()).unwrap();
    rejections_by(&crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"], obj)
}

#[test]
fn proxy_pools_are_checked_like_their_proxies() {
    let template = json!({"labels": {"team": "shop"}, "spec": {"mode": "Managed", "provider": "gcp-eu",
        "attributes": {"geo": "eu"}}});
    for spec in [
        json!({"replicas": 20, "template": template}),
        json!({"replicas": 5, "template": template, "maxSurge": 0, "maxUnavailable": 1,
               "autoscaling": {"minReplicas": 5, "maxReplicas": 50, "targetUtilization": 70},
               "rotation": {"maxAge": "24h", "afterBlockedTargets": 5, "afterErrors": 20},
               "drainTimeout": "5m"}),
    ] {
        let obj = pool(spec.clone());
        assert_eq!(pool_rejections(&obj), Vec::<String>::new(), "{spec}");
        let parsed: ProxyPool = serde_json::from_value(obj).unwrap();
        assert_eq!(parsed.spec.template.spec.attributes["geo"], "eu");
    }
    let defaults: ProxyPool = serde_json::from_value(pool(json!({"template": template}))).unwrap();
    assert_eq!(
        (
            defaults.spec.replicas,
            defaults.spec.max_surge,
            defaults.spec.max_unavailable
        ),
        (1, 1, 0)
    );
    assert_eq!(defaults.spec.drain_timeout, "10m");

    let cases = [
        (
            json!({"template": template, "autoscaling": {"minReplicas": 9, "maxReplicas": 3}}),
            "autoscaling.minReplicas must not exceed autoscaling.maxReplicas",
        ),
        (
            json!({"template": template, "maxSurge": 0}),
            "maxSurge and maxUnavailable cannot both be 0",
        ),
        (
            json!({"template": {"spec": {"mode": "External"}}}),
            "endpoint is required when mode is External",
        ),
        (
            json!({"template": {"spec": {"mode": "Managed", "provider": "p",
                   "healthCheck": {"interval": "10ms"}}}}),
            "healthCheck.interval must be between 1s and 24h",
        ),
        (
            json!({"template": template, "rotation": {"maxAge": "1 day"}}),
            "does not match",
        ),
        (json!({"replicas": 3}), "\"template\" is a required property"),
        (
            // Tallies count at most 64 distinct targets per proxy.
            json!({"template": template, "rotation": {"afterBlockedTargets": 65}}),
            "maximum",
        ),
    ];
    for (spec, expected) in cases {
        let got = pool_rejections(&pool(spec.clone()));
        assert!(
            got.iter().any(|m| m.contains(expected)),
            "{spec}: expected a rejection containing {expected:?}, got {got:?}"
        );
    }
}

#[test]
fn proxy_pools_scale_through_the_scale_subresource() {
    let crd = serde_json::to_value(ProxyPool::crd()).unwrap();
    let version = &crd["spec"]["versions"][0];
    assert_eq!(
        version["subresources"]["scale"],
        json!({"specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas",
               "labelSelectorPath": ".status.selector"})
    );
    assert_eq!(crd["spec"]["names"]["shortNames"], json!(["pp"]));
    let columns: Vec<&str> = version["additionalPrinterColumns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        columns,
        ["Desired", "Replicas", "Ready", "Leased", "Rotating", "Age"]
    );
}
