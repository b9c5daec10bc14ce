//! Proxy and ProxyPool facts checked against the CRD schemas: examples
//! validated as the API server would, field paths named in prose.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::markdown::repo_root;

/// Fields the schema does not have: the API server prunes them (or, with
/// strict field validation, refuses the object), so an example showing one
/// shows a setting that does nothing.
fn unknown_fields(schema: &Value, value: &Value, path: &str, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            if schema["x-kubernetes-preserve-unknown-fields"] == true {
                return;
            }
            if let Some(values) = schema.get("additionalProperties") {
                for (key, child) in map {
                    unknown_fields(values, child, &format!("{path}.{key}"), out);
                }
                return;
            }
            for (key, child) in map {
                let child_path = if path.is_empty() {
                    key.clone()
                } else {
                    format!("{path}.{key}")
                };
                match schema["properties"].get(key) {
                    Some(child_schema) => unknown_fields(child_schema, child, &child_path, out),
                    None if path.is_empty() && ["apiVersion", "kind", "metadata"].contains(&key.as_str()) => {
                    }
                    None => out.push(format!("unknown field `{child_path}`")),
                }
            }
        }
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                unknown_fields(&schema["items"], item, &format!("{path}[{i}]"), out);
            }
        }
        _ => {}
    }
}

/// What the API server would say about `object`: unknown fields, schema
/// violations (types, enums, required fields, bounds) and failed CEL
/// rules. For a part of an object (`partial`), fields it leaves out and
/// the rules that need them do not count.
pub fn rejections(schema: &Value, object: &Value, partial: bool) -> Vec<String> {
    let mut out = Vec::new();
    unknown_fields(schema, object, "", &mut out);
    let validator = jsonschema::options()
        .with_draft(jsonschema::Draft::Draft4)
        .build(schema)
        .expect("the CRD schema compiles");
    out.extend(
        validator
            .iter_errors(object)
            .map(|e| format!("{}: {e}", e.instance_path()))
            .filter(|e| !(partial && e.contains("is a required property"))),
    );
    if !partial {
        out.extend(
            kube_cel::Validator::new()
                .validate(schema, object, None)
                .into_iter()
                .map(|e| e.to_string()),
        );
    }
    out
}

/// An inline span that may be a field path, in the schema's notation:
/// `spec.placement.image`, `.status.phase`, `status.conditions[0].type`
/// (indices become `[]`), `healthCheck.interval`.
pub fn field_path(span: &str) -> Option<String> {
    let path = span.strip_prefix('.').unwrap_or(span);
    if !path.contains('.') {
        return None;
    }
    let mut clean = String::new();
    let mut chars = path.chars();
    while let Some(c) = chars.next() {
        match c {
            '[' => {
                chars.by_ref().take_while(|&c| c != ']').for_each(drop);
                clean.push_str("[]");
            }
            c if c.is_ascii_alphanumeric() || c == '.' || c == '_' => clean.push(c),
            _ => return None,
        }
    }
    Some(clean)
}

/// Names of tracing spans (`status.patch`, `health.probe`): they look like
/// field paths and are not.
pub fn span_names() -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut files = Vec::new();
    for dir in ["src", "domain/src", "telemetry/src", "actors/src"] {
        rust_files(&repo_root().join(dir), &mut files);
    }
    for file in files {
        let text = std::fs::read_to_string(&file).expect("a readable source file");
        for (marker, reach) in [("instrument(name = \"", 0), ("span!(", 300)] {
            for (at, _) in text.match_indices(marker) {
                let after = &text[at + marker.len()..];
                let window = if reach == 0 {
                    after
                        .split('"')
                        .next()
                        .map(|n| format!("\"{n}\""))
                        .unwrap_or_default()
                } else {
                    after.chars().take(reach).collect()
                };
                names.extend(
                    window
                        .split('"')
                        .skip(1)
                        .step_by(2)
                        .filter(|n| n.contains('.'))
                        .map(String::from),
                );
            }
        }
    }
    names
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("a source directory") {
        let path = entry.expect("an entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn field_paths_are_recognised() {
    assert_eq!(
        field_path("spec.placement.image").as_deref(),
        Some("spec.placement.image")
    );
    assert_eq!(
        field_path(".status.conditions[0].type").as_deref(),
        Some("status.conditions[].type")
    );
    assert_eq!(
        field_path("healthCheck.interval").as_deref(),
        Some("healthCheck.interval")
    );
    assert_eq!(field_path("spec"), None);
    assert_eq!(field_path("spec.replicas: 3"), None);
}

#[test]
fn unknown_fields_are_found_at_any_depth() {
    let schema: Value = serde_json::json!({"properties": {"spec": {"properties": {
        "a": {"type": "string"},
        "m": {"type": "object", "additionalProperties": {"type": "string"}},
        "l": {"type": "array", "items": {"properties": {"x": {"type": "string"}}}}}}}});
    let object = serde_json::json!({"apiVersion": "v", "kind": "K", "metadata": {"name": "n"},
        "spec": {"a": "1", "b": 2, "m": {"any": "ok"}, "l": [{"x": "1"}, {"y": "2"}]}});
    let mut out = Vec::new();
    unknown_fields(&schema, &object, "", &mut out);
    assert_eq!(out, ["unknown field `spec.b`", "unknown field `spec.l[1].y`"]);
}
