//! Checks that the shipped RBAC allows every API call the operator made.

use fake_apiserver::Access;
use serde_json::Value;

fn rules() -> Vec<Value> {
    let text =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/rbac/role.yaml")).unwrap();
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text).unwrap();
    docs.iter()
        .flat_map(|d| d["rules"].as_array().cloned().unwrap_or_default())
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

/// Panics naming every call the RBAC rules would refuse.
pub fn assert_covered(accesses: &[Access]) {
    let rules = rules();
    let mut missing: Vec<String> = accesses
        .iter()
        .filter(|a| !rules.iter().any(|r| allows(r, a)))
        .map(|a| format!("{} {}/{}", a.verb, a.group, a.resource))
        .collect();
    missing.sort();
    missing.dedup();
    assert!(
        missing.is_empty(),
        "deploy/rbac/role.yaml does not allow: {missing:?}"
    );
    assert!(!accesses.is_empty(), "no operator request was recorded");
}
