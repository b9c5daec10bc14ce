//! Configuration examples checked with the operator's own parsers: whole
//! providers files, parts of one provider's block, the standalone
//! configuration, and the field lists the parsers accept.

use std::path::Path;

use egress_proxies::domain::config::{ProvidersConfig, StandaloneConfig};
use serde_json::Value;

use super::markdown;

pub const PROVIDER_TYPES: [&str; 4] = ["kubernetes", "gcp", "kvm", "local"];

/// Problems `validate-config` reports for one provider entry of type `kind`.
fn entry_problems(kind: &str, block: &Value) -> Vec<String> {
    let entry = serde_json::json!({"providers": [{"name": "example", "type": kind, kind: block}]});
    let yaml = serde_json::to_string(&entry).expect("JSON is YAML");
    match ProvidersConfig::parse(&yaml, "example") {
        Ok(_) => Vec::new(),
        Err(e) => e.problems(),
    }
}

/// What is wrong with a providers configuration example. A whole file (a
/// top-level `providers:`) or a list of entries is parsed as
/// `validate-config` parses it; a part of one provider's block (a
/// top-level `local:`, or fields of a provider type such as
/// `destinations:`) is parsed inside an entry of that type, its problems
/// counted except fields it leaves out.
pub fn config_problems(document: &Value, text: &str, at: &str) -> Option<Vec<String>> {
    let whole = |yaml: &str| match ProvidersConfig::parse(yaml, at) {
        Ok(_) => Vec::new(),
        Err(e) => e.problems(),
    };
    if document.get("providers").is_some() {
        return Some(whole(text));
    }
    if let Some(entries) = document
        .as_array()
        .filter(|a| a.iter().all(|e| e.get("type").is_some()))
    {
        let wrapped = serde_json::json!({"providers": entries});
        return Some(whole(&serde_json::to_string(&wrapped).expect("JSON is YAML")));
    }
    let map = document.as_object()?;
    let partial = |problems: Vec<String>| -> Vec<String> {
        problems
            .into_iter()
            .filter(|p| !p.contains("missing field") && !p.contains("is required"))
            .map(|p| format!("{p} (checked as part of a provider entry)"))
            .collect()
    };
    if let [(kind, block)] = map.iter().collect::<Vec<_>>()[..]
        && PROVIDER_TYPES.contains(&kind.as_str())
    {
        return Some(partial(entry_problems(kind, block)));
    }
    // Fields of a provider type's block: each top-level key is one the type knows.
    let knows = |kind: &str, key: &str| -> bool {
        let probe = serde_json::json!({ key: map[key] });
        !entry_problems(kind, &probe)
            .iter()
            .any(|p| p.contains(&format!("unknown field `{key}`")))
    };
    PROVIDER_TYPES
        .into_iter()
        .find(|kind| map.keys().all(|key| knows(kind, key.as_str())))
        .map(|kind| partial(entry_problems(kind, document)))
}

/// The fields a parser accepts, read from its refusal of an unknown one
/// (serde: "unknown field `x`, expected one of `a`, `b`"; serde-saphyr
/// leaves out the backticks of the list).
pub fn fields_in(problem: &str) -> Option<Vec<String>> {
    let (_, list) = problem.split_once("unknown field `zzzUnknown`, expected ")?;
    let list = list.lines().next().unwrap_or("");
    if list.contains('`') {
        return Some(list.split('`').skip(1).step_by(2).map(String::from).collect());
    }
    // serde-saphyr's wording: `expected one of a, b, c`.
    let list = list.strip_prefix("one of ").unwrap_or(list);
    Some(list.split(',').map(|f| f.trim().to_owned()).collect())
}

/// The fields of a provider type's block.
pub fn block_fields(kind: &str) -> Vec<String> {
    entry_problems(kind, &serde_json::json!({"zzzUnknown": true}))
        .iter()
        .find_map(|p| fields_in(p))
        .unwrap_or_else(|| panic!("no field list in the refusal of an unknown {kind} field"))
}

/// A minimal standalone configuration plus `extra` lines, loaded from
/// `dir` (relative paths resolve against it, so loads from one directory
/// compare equal).
pub fn load_standalone(dir: &Path, extra: &str) -> Result<StandaloneConfig, String> {
    let file = dir.join("standalone.yaml");
    std::fs::write(
        &file,
        format!("providersConfig: p.yaml\nmanifests: m\nstateDir: s\n{extra}"),
    )
    .expect("a writable temporary file");
    egress_proxies::adapters::config_files::standalone_config(&file).map_err(|e| e.to_string())
}

/// The settings a documented default stands for: the one code span of a
/// cell, or a bare number; nothing for prose (`none`, `required`).
pub fn documented_default(cell: &str, k: usize) -> Option<String> {
    let spans = markdown::code_spans(cell);
    let bare: String = cell.split_whitespace().collect();
    let joined: String = spans
        .iter()
        .map(|s| format!("`{s}`"))
        .collect::<Vec<_>>()
        .join(",");
    if !spans.is_empty() && bare == joined {
        return spans.get(k).map(|s| (*s).to_owned());
    }
    cell.trim().parse::<u64>().ok().map(|n| n.to_string())
}

/// The fields `validate-config` accepts in the object at `pointer` (a JSON
/// pointer into `config`), read from its refusal of an unknown one (`None`
/// where any key goes, such as a map of named images).
pub fn accepted_fields(config: &Value, pointer: &str) -> Option<Vec<String>> {
    let mut probe = config.clone();
    probe
        .pointer_mut(pointer)?
        .as_object_mut()?
        .insert("zzzUnknown".into(), Value::Bool(true));
    let yaml = serde_json::to_string(&probe).expect("JSON is YAML");
    let problems = match ProvidersConfig::parse(&yaml, "probe") {
        Ok(_) => return None,
        Err(e) => e.problems(),
    };
    let list = problems
        .iter()
        .find_map(|p| {
            p.split_once("unknown field `zzzUnknown`, expected one of ")
                .map(|(_, l)| l.to_owned())
        })
        .or_else(|| {
            problems.iter().find_map(|p| {
                p.split_once("unknown field `zzzUnknown`, expected ")
                    .map(|(_, l)| l.to_owned())
            })
        })?;
    Some(
        list.split('`')
            .skip(1)
            .step_by(2)
            .filter(|f| *f != "zzzUnknown")
            .map(String::from)
            .collect(),
    )
}

/// Every object of `value` with its JSON pointer.
pub fn objects(value: &Value, pointer: String, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            out.push(pointer.clone());
            for (key, child) in map {
                objects(
                    child,
                    format!("{pointer}/{}", key.replace('~', "~0").replace('/', "~1")),
                    out,
                );
            }
        }
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                objects(item, format!("{pointer}/{i}"), out);
            }
        }
        _ => {}
    }
}

#[test]
fn configuration_fragments_are_checked_inside_an_entry_of_their_type() {
    let problems = |yaml: &str| {
        let document: Value = serde_saphyr::from_str(yaml).unwrap();
        config_problems(&document, yaml, "t.md:1")
    };
    assert_eq!(
        problems("local:\n  outgoingAddresses: [127.0.1.0/29]\n"),
        Some(vec![])
    );
    assert_eq!(problems("destinations:\n  allow: [8443]\n"), Some(vec![]));
    assert_eq!(
        problems("gcp:\n  network: global/networks/default\n"),
        Some(vec![]),
        "a required field left out"
    );
    let found = problems("local:\n  outgoingAdresses: [127.0.1.0/29]\n").unwrap();
    assert!(
        found.len() == 1 && found[0].contains("unknown field `outgoingAdresses`"),
        "{found:?}"
    );
    let found = problems("destinations:\n  alow: [8443]\n").unwrap();
    assert!(found.len() == 1 && found[0].contains("alow"), "{found:?}");
    let found = problems("providers:\n  - name: x\n    type: lokal\n").unwrap();
    assert!(
        found.len() == 1 && found[0].contains("not a provider type"),
        "{found:?}"
    );
    assert_eq!(
        problems("kind: Kustomization\nresources: [a.yaml]\n"),
        None,
        "not a configuration"
    );
}
