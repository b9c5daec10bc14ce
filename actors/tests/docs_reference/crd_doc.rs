//! docs/reference/proxy.md and proxypool.md, rendered from a
//! CustomResourceDefinition's `openAPIV3Schema`: every field as a path with
//! its type, whether it is required, its default, its validation and its
//! description; the printer columns and subresources too.

use std::fmt::Write;

use serde_json::Value;

use super::cli_doc::cell;

/// A schema rendered elsewhere: where it matches, one row links to it.
pub struct Shared<'a> {
    pub schema: &'a Value,
    pub text: &'a str,
}

/// The first served version of a CRD (the one the docs describe).
pub fn version(crd: &Value) -> &Value {
    &crd["spec"]["versions"][0]
}

pub fn schema(crd: &Value) -> &Value {
    &version(crd)["schema"]["openAPIV3Schema"]
}

pub fn render(crd: &Value, header: &str, intro: &str, shared: &[Shared]) -> String {
    let spec = &crd["spec"];
    let version = version(crd);
    let kind = spec["names"]["kind"].as_str().unwrap_or("?");
    let mut out = String::new();
    let _ = writeln!(out, "# {kind} reference\n\n{header}\n\n{intro}\n");
    out.push_str(
        "A field marked required must be set whenever the object holding it is; \
         validation is what the API server checks (rules are CEL `x-kubernetes-validations`, \
         by the message a refused object gets).\n\n",
    );
    let short: Vec<String> = strings(&spec["names"]["shortNames"])
        .map(|s| format!("`{s}`"))
        .collect();
    out.push_str("| | |\n|---|---|\n");
    let _ = writeln!(
        out,
        "| apiVersion | `{}/{}` |",
        spec["group"].as_str().unwrap_or("?"),
        version["name"].as_str().unwrap_or("?")
    );
    let _ = writeln!(out, "| kind | `{kind}` |");
    let _ = writeln!(
        out,
        "| plural | `{}` |",
        spec["names"]["plural"].as_str().unwrap_or("?")
    );
    let _ = writeln!(out, "| short names | {} |", short.join(", "));
    let _ = writeln!(out, "| scope | {} |", spec["scope"].as_str().unwrap_or("?"));
    let subresources: Vec<String> = version["subresources"]
        .as_object()
        .map(|s| s.keys().map(|k| format!("`{k}`")).collect())
        .unwrap_or_default();
    let _ = writeln!(out, "| subresources | {} |", subresources.join(", "));
    if let Some(scale) = version["subresources"]["scale"].as_object() {
        let paths: Vec<String> = ["specReplicasPath", "statusReplicasPath", "labelSelectorPath"]
            .iter()
            .filter_map(|k| {
                scale
                    .get(*k)
                    .and_then(Value::as_str)
                    .map(|v| format!("{k} `{v}`"))
            })
            .collect();
        let _ = writeln!(out, "| scale | {} |", paths.join(", "));
    }
    out.push('\n');

    out.push_str("## Printer columns\n\nWhat `kubectl get` shows (`-o wide` adds those of priority 1).\n\n");
    out.push_str("| column | JSONPath | type | priority |\n|---|---|---|---|\n");
    for column in version["additionalPrinterColumns"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let _ = writeln!(
            out,
            "| {} | `{}` | {} | {} |",
            column["name"].as_str().unwrap_or("?"),
            column["jsonPath"].as_str().unwrap_or("?"),
            column["type"].as_str().unwrap_or("?"),
            column["priority"].as_u64().unwrap_or(0)
        );
    }
    out.push('\n');

    let root = schema(crd);
    for section in ["spec", "status"] {
        let Some(node) = root["properties"].get(section) else {
            continue;
        };
        let _ = writeln!(
            out,
            "## {section}\n\n{}\n",
            cell(node["description"].as_str().unwrap_or(""))
        );
        out.push_str("| field | type | required | default | validation | description |\n");
        out.push_str("|---|---|---|---|---|---|\n");
        let mut rows = Vec::new();
        fields(node, section, shared, &mut rows);
        for row in rows {
            out.push_str(&row);
        }
        let rules = rules(node);
        if !rules.is_empty() {
            let _ = writeln!(out, "\nRules on `{section}` as a whole: {}.", rules.join("; "));
        }
        out.push('\n');
    }
    out.truncate(out.trim_end().len());
    out.push('\n');
    out
}

fn strings(value: &Value) -> impl Iterator<Item = &str> {
    value.as_array().into_iter().flatten().filter_map(Value::as_str)
}

/// One row per property under `node` (whose path is `path`), depth first.
fn fields(node: &Value, path: &str, shared: &[Shared], rows: &mut Vec<String>) {
    let required: Vec<&str> = strings(&node["required"]).collect();
    let Some(properties) = node["properties"].as_object() else {
        return;
    };
    for (name, child) in properties {
        let child_path = format!("{path}.{name}");
        if let Some(link) = shared.iter().find(|s| same_fields(s.schema, child)) {
            rows.push(format!(
                "| `{child_path}` | object | {} | | | {} |\n",
                yes(required.contains(&name.as_str())),
                cell(link.text)
            ));
            continue;
        }
        rows.push(row(&child_path, child, required.contains(&name.as_str())));
        if child["type"] == "array" {
            fields(&child["items"], &format!("{child_path}[]"), shared, rows);
        } else {
            fields(child, &child_path, shared, rows);
        }
    }
}

/// Two schemas with the same fields, whatever they say of themselves.
fn same_fields(a: &Value, b: &Value) -> bool {
    let fields = |v: &Value| {
        let mut v = v.clone();
        if let Some(map) = v.as_object_mut() {
            map.remove("description");
        }
        v
    };
    fields(a) == fields(b)
}

fn yes(required: bool) -> &'static str {
    if required { "yes" } else { "" }
}

fn row(path: &str, node: &Value, required: bool) -> String {
    let default = match &node["default"] {
        Value::Null => String::new(),
        Value::String(s) => format!("`{s}`"),
        other => format!("`{other}`"),
    };
    let mut checks = Vec::new();
    let values: Vec<String> = node["enum"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(|v| format!("`{v}`"))
        .collect();
    if !values.is_empty() {
        checks.push(format!("one of {}", values.join(", ")));
    }
    for (key, word) in [
        ("minimum", "≥"),
        ("maximum", "≤"),
        ("minLength", "length ≥"),
        ("maxLength", "length ≤"),
        ("minItems", "items ≥"),
        ("maxItems", "items ≤"),
    ] {
        if let Some(n) = node[key].as_f64() {
            checks.push(format!("{word} {n}"));
        }
    }
    if let Some(pattern) = node["pattern"].as_str() {
        checks.push(format!("matches `{pattern}`"));
    }
    checks.extend(rules(node).into_iter().map(|message| format!("rule: {message}")));
    format!(
        "| `{path}` | {} | {} | {default} | {} | {} |\n",
        type_of(node),
        yes(required),
        cell(&checks.join("; ")),
        cell(node["description"].as_str().unwrap_or(""))
    )
}

/// The messages of a node's CEL rules (`x-kubernetes-validations`).
fn rules(node: &Value) -> Vec<String> {
    node["x-kubernetes-validations"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|rule| rule["message"].as_str().unwrap_or("?").to_owned())
        .collect()
}

fn type_of(node: &Value) -> String {
    match node["type"].as_str().unwrap_or("any") {
        "array" => format!("array of {}", type_of(&node["items"])),
        "object" if node.get("additionalProperties").is_some() => {
            format!("map of {}", type_of(&node["additionalProperties"]))
        }
        "string" if node["format"].is_string() => {
            format!("string ({})", node["format"].as_str().unwrap_or(""))
        }
        other => other.to_owned(),
    }
}

/// Every field path of a schema (`spec.placement.image`, `status.conditions[].type`).
pub fn paths(node: &Value, path: &str, out: &mut Vec<String>) {
    let Some(properties) = node["properties"].as_object() else {
        return;
    };
    for (name, child) in properties {
        let child_path = if path.is_empty() {
            name.clone()
        } else {
            format!("{path}.{name}")
        };
        out.push(child_path.clone());
        if child["type"] == "array" {
            paths(&child["items"], &format!("{child_path}[]"), out);
        } else {
            paths(child, &child_path, out);
        }
    }
}
