//! What clients learn about the server before they touch an object, as
//! kubectl asks for it: the version, the legacy discovery documents (`/api`,
//! `/apis`, `/api/v1`, `/apis/<group>/<version>`) and the OpenAPI v3 index
//! and group-version documents kubectl's validation reads.
//!
//! Aggregated discovery (`as=APIGroupDiscoveryList`) is not offered: the
//! answers are plain `application/json`, which clients take as the legacy
//! format and follow group by group, as they do with servers before 1.30.
//! The OpenAPI documents describe each kind's PATCH operation, with its
//! `x-kubernetes-group-version-kind` and the `fieldValidation` parameter
//! (so kubectl leaves field validation to the server), but carry no schemas:
//! this fake does not validate fields. `/openapi/v2` is not served: kubectl
//! asks for it only when v3 does not answer or a kind's PATCH lacks the
//! `fieldValidation` parameter (then it validates on the client); with
//! neither, `kubectl apply` stops with "failed to download openapi".

use serde_json::{Value, json};

use crate::kinds::{KINDS, Kind};
use crate::state::State;

/// The version this fake reports (`kubectl version`).
pub const VERSION: (&str, &str) = ("1", "32");

/// The discovery or OpenAPI answer for `path`, or None when `path` is not one.
pub fn answer(path: &str, state: &State) -> Option<Value> {
    let path = path.trim_end_matches('/');
    match path {
        "/version" => Some(version()),
        "/api" => Some(json!({
            "kind": "APIVersions", "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": ""}]
        })),
        "/apis" => Some(groups(state)),
        "/openapi/v3" => Some(openapi_index(state)),
        _ => {
            if let Some(gv) = path.strip_prefix("/openapi/v3/") {
                let (group, version) = split_root(gv)?;
                return served_in(state, group, version).map(|kinds| openapi_document(&kinds));
            }
            let (group, version) = split_root(path.strip_prefix('/')?)?;
            served_in(state, group, version).map(|kinds| resources(state, group, version, &kinds))
        }
    }
}

fn version() -> Value {
    let (major, minor) = VERSION;
    json!({
        "major": major, "minor": minor, "gitVersion": format!("v{major}.{minor}.0"),
        "gitCommit": "fake", "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": "go1.23", "compiler": "gc", "platform": "linux/amd64"
    })
}

/// `api/v1` → ("", "v1"); `apis/apps/v1` → ("apps", "v1").
fn split_root(path: &str) -> Option<(&str, &str)> {
    match path.split('/').collect::<Vec<_>>().as_slice() {
        ["api", version] => Some(("", version)),
        ["apis", group, version] => Some((group, version)),
        _ => None,
    }
}

/// The kinds served in one group version; None when there are none.
fn served_in<'a>(state: &State, group: &str, version: &str) -> Option<Vec<&'a Kind>> {
    let kinds: Vec<&Kind> = KINDS
        .iter()
        .enumerate()
        .filter(|(i, k)| k.group == group && k.version == version && state.serves(*i))
        .map(|(_, k)| k)
        .collect();
    (!kinds.is_empty()).then_some(kinds)
}

/// Every served group version, in table order.
fn group_versions(state: &State) -> Vec<(&'static str, &'static str)> {
    let mut out: Vec<(&str, &str)> = Vec::new();
    for (i, k) in KINDS.iter().enumerate() {
        if state.serves(i) && !out.contains(&(k.group, k.version)) {
            out.push((k.group, k.version));
        }
    }
    out
}

fn groups(state: &State) -> Value {
    let groups: Vec<Value> = group_versions(state)
        .into_iter()
        .filter(|(g, _)| !g.is_empty())
        .map(|(g, v)| {
            let gv = json!({"groupVersion": format!("{g}/{v}"), "version": v});
            json!({"name": g, "versions": [gv], "preferredVersion": gv})
        })
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

fn resources(state: &State, group: &str, version: &str, kinds: &[&Kind]) -> Value {
    let verbs = json!([
        "create",
        "delete",
        "deletecollection",
        "get",
        "list",
        "patch",
        "update",
        "watch"
    ]);
    let mut list = Vec::new();
    for k in kinds {
        list.push(json!({
            "name": k.plural, "singularName": k.kind.to_lowercase(), "namespaced": k.namespaced,
            "kind": k.kind, "verbs": verbs, "shortNames": state.short_names(k),
        }));
        if k.status {
            list.push(
                json!({"name": format!("{}/status", k.plural), "singularName": "", "namespaced": k.namespaced,
                "kind": k.kind, "verbs": ["get", "patch", "update"]}),
            );
        }
        if k.scale {
            list.push(json!({"name": format!("{}/scale", k.plural), "singularName": "", "namespaced": k.namespaced,
                "group": "autoscaling", "version": "v1", "kind": "Scale", "verbs": ["get", "patch", "update"]}));
        }
    }
    let gv = if group.is_empty() {
        version.to_owned()
    } else {
        format!("{group}/{version}")
    };
    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": list})
}

fn openapi_index(state: &State) -> Value {
    let mut paths = serde_json::Map::new();
    for (g, v) in group_versions(state) {
        let root = if g.is_empty() {
            format!("api/{v}")
        } else {
            format!("apis/{g}/{v}")
        };
        paths.insert(
            root.clone(),
            json!({"serverRelativeURL": format!("/openapi/v3/{root}?hash={}", state.resource_version())}),
        );
    }
    json!({"paths": paths})
}

fn openapi_document(kinds: &[&Kind]) -> Value {
    let mut paths = serde_json::Map::new();
    for k in kinds {
        let namespace = if k.namespaced {
            "/namespaces/{namespace}"
        } else {
            ""
        };
        let gvk = json!({"group": k.group, "version": k.version, "kind": k.kind});
        let patch = json!({
            "x-kubernetes-group-version-kind": gvk,
            "parameters": [
                {"name": "fieldManager", "in": "query", "schema": {"type": "string"}},
                {"name": "fieldValidation", "in": "query", "schema": {"type": "string"}}
            ],
            "responses": {"200": {"description": "OK"}}
        });
        paths.insert(
            format!("{}{namespace}/{}/{{name}}", k.root(), k.plural),
            json!({"patch": patch}),
        );
    }
    json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": format!("v{}.{}.0", VERSION.0, VERSION.1)},
        "paths": paths,
        "components": {"schemas": {}}
    })
}
