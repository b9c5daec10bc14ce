//! The metric families the operator registers, and the `egress_proxies_*`
//! names a text mentions.

use super::markdown::repo_root;

/// The metric families `telemetry/src/metrics.rs` registers, by name,
/// with their type. Read from its `register` calls: a family shows in the
/// encoded registry only once it has a sample, and most have labels none
/// of which is set before the operator runs. The families that do show are
/// compared with what is read, so the reading cannot drift from the code.
pub fn registered_metrics() -> Vec<(String, String)> {
    let source =
        std::fs::read_to_string(repo_root().join("telemetry/src/metrics.rs")).expect("the metrics source");
    let kind_of_field = |field: &str| {
        let declaration = source
            .lines()
            .map(str::trim)
            .find_map(|l| l.strip_prefix(&format!("pub {field}: ")))
            .unwrap_or("");
        ["Histogram", "Counter", "Gauge"]
            .into_iter()
            .find(|t| declaration.contains(t))
            .map_or("unknown", |t| {
                if t == "Histogram" {
                    "histogram"
                } else if t == "Counter" {
                    "counter"
                } else {
                    "gauge"
                }
            })
    };
    let mut families = Vec::new();
    for call in source.split("registry.register").skip(1) {
        let call = call.split(");").next().unwrap_or("");
        let Some(name) = call.split('"').nth(1) else {
            continue;
        };
        let unit = call
            .split("Unit::")
            .nth(1)
            .map(|u| {
                format!(
                    "_{}",
                    u.split(|c: char| !c.is_alphanumeric())
                        .next()
                        .unwrap_or("")
                        .to_lowercase()
                )
            })
            .unwrap_or_default();
        let field = call
            .split("m.")
            .nth(1)
            .and_then(|f| f.split('.').next())
            .unwrap_or("");
        families.push((
            format!("egress_proxies_{name}{unit}"),
            kind_of_field(field).to_owned(),
        ));
    }
    let encoded = egress_proxies::telemetry::metrics().encode();
    for (name, kind) in encoded
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE egress_proxies_"))
        .filter_map(|rest| rest.split_once(' '))
    {
        let family = (format!("egress_proxies_{name}"), kind.to_owned());
        assert!(
            families.contains(&family),
            "{family:?} is registered but not read from the source: {families:?}"
        );
    }
    families
}

/// The sample names a family of this type exposes.
pub fn sample_names(family: &str, kind: &str) -> Vec<String> {
    let suffixes: &[&str] = match kind {
        "counter" => &["_total", "_created"],
        "histogram" => &["_bucket", "_sum", "_count", "_created"],
        "info" => &["_info"],
        _ => &[""],
    };
    suffixes.iter().map(|s| format!("{family}{s}")).collect()
}

/// The `egress_proxies_*` metric names in a text, each with its 1-based
/// line; `true` when it is a prefix (`egress_proxies_pool_*`). Rust paths
/// (`egress_proxies_operator::access`) and dictionary keys
/// (`meta["egress_proxies_skip"]`) are not metrics.
pub fn metric_names(text: &str) -> Vec<(usize, String, bool)> {
    let mut found = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let mut from = 0;
        while let Some(at) = line[from..].find("egress_proxies_").map(|i| i + from) {
            let end = line[at..]
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .map_or(line.len(), |i| i + at);
            from = end;
            let name = &line[at..end];
            let before = &line[..at];
            let after = &line[end..];
            let word_start = !before.ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_');
            if !word_start || after.starts_with("::") || before.ends_with("[\"") || before.ends_with("['") {
                continue;
            }
            let prefix = name.ends_with('_') || after.starts_with('*');
            found.push((n + 1, name.trim_end_matches('_').to_owned(), prefix));
        }
    }
    found
}

#[test]
fn metric_names_are_found_but_not_rust_paths_or_keys() {
    let text = "rate(egress_proxies_gc_sweeps_total[5m]) and `egress_proxies_provider_*`\n\
                `egress_proxies_operator::access` meta[\"egress_proxies_skip\"]";
    assert_eq!(
        metric_names(text),
        [
            (1, "egress_proxies_gc_sweeps_total".to_owned(), false),
            (1, "egress_proxies_provider".to_owned(), true),
        ]
    );
    assert!(
        sample_names("egress_proxies_probes", "counter").contains(&"egress_proxies_probes_total".to_owned())
    );
}
