//! Checks that the shipped RBAC allows every API call the operator made.

use fake_apiserver::Access;
use serde_json::Value;

fn rules(file: &str) -> Vec<Value> {
    let path = format!("{}/../deploy/{file}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap();
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text).unwrap();
    docs.iter()
        .flat_map(|d| d["rules"].as_array().cloned().unwrap_or_default())
        .collect()
}

/// The operator's rules and its leader election's.
fn all_rules() -> Vec<Value> {
    let mut all = rules("rbac-base/operator_rules.yaml");
    all.extend(rules("rbac-base/leader_election.yaml"));
    all.extend(metrics_auth_rules());
    all
}

/// Bound cluster-wide in every install (reviews are cluster-scoped).
fn metrics_auth_rules() -> Vec<Value> {
    rules("rbac-base/metrics_auth.yaml")
        .into_iter()
        .filter(|r| r.get("apiGroups").is_some())
        .collect()
}

fn allows(rule: &Value, access: &Access) -> bool {
    let has = |field: &str, want: &str| {
        rule[field].as_array().is_some_and(|v| {
            v.iter()
                .any(|x| x.as_str() == Some(want) || x.as_str() == Some("*"))
        })
    };
    has("apiGroups", &access.group) && has("resources", &access.resource) && has("verbs", &access.verb)
}

fn named(a: &Access) -> String {
    format!(
        "{} {}/{} in {}",
        a.verb,
        a.group,
        a.resource,
        a.namespace.as_deref().unwrap_or("the whole cluster")
    )
}

/// Panics naming every call the RBAC rules would refuse.
pub fn assert_covered(accesses: &[Access]) {
    let rules = all_rules();
    let mut missing: Vec<String> = accesses
        .iter()
        .filter(|a| !rules.iter().any(|r| allows(r, a)))
        .map(|a| format!("{} {}/{}", a.verb, a.group, a.resource))
        .collect();
    missing.sort();
    missing.dedup();
    assert!(
        missing.is_empty(),
        "deploy/rbac-base's rules do not allow: {missing:?}"
    );
    assert!(!accesses.is_empty(), "no operator request was recorded");
}

/// Panics naming every call a namespace-scoped install (deploy/namespaced:
/// the rules bound in `namespace` only) would refuse — any cluster-wide
/// request, any request in another namespace, any verb not allowed.
pub fn assert_namespaced(accesses: &[Access], namespace: &str) {
    let rules = all_rules();
    let cluster_wide = metrics_auth_rules();
    let mut refused: Vec<String> = accesses
        .iter()
        .filter(|a| match a.namespace.as_deref() {
            Some(ns) => ns != namespace || !rules.iter().any(|r| allows(r, a)),
            None => !cluster_wide.iter().any(|r| allows(r, a)),
        })
        .map(named)
        .collect();
    refused.sort();
    refused.dedup();
    assert!(
        refused.is_empty(),
        "deploy/namespaced (bound in {namespace} only) would refuse: {refused:?}"
    );
    assert!(!accesses.is_empty(), "no operator request was recorded");
}
