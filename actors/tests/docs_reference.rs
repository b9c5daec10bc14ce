//! The generated references (docs/reference/) are current, and the facts
//! the docs (README.md, CHANGELOG.md, docs/**/*.md) state are true of the
//! code:
//!
//! - command lines (`egress-proxies-operator …`, `cargo run … -- …`, in
//!   code blocks and inline code) name subcommands, flags and values the
//!   CLI has; flag tables give each flag's environment variable and default;
//! - configuration examples parse with the operator's own parsers (a whole
//!   providers file as `validate-config` reads it; a part of one provider's
//!   block inside an entry of its type, fields it leaves out excused);
//!   field tables name fields the parsers accept; the standalone table's
//!   defaults are what loading leaves out; `config/providers.yaml` shows
//!   every field;
//! - Proxy and ProxyPool examples (and the samples in `deploy/samples/`,
//!   `config/standalone/proxies/`) fit the CRD schemas as the API server
//!   checks them, unknown fields refused; field paths named inline exist;
//! - sample `kubectl get px|pp` and `get proxies|pools` output has the
//!   columns the commands print;
//! - `egress_proxies_*` names in the docs and `deploy/monitoring/` are
//!   metrics the operator registers.
//!
//! Each failure names the file and line of the wrong fact. The references
//! are rewritten, instead of compared, with `EPO_BLESS_DOCS=1`.

#[path = "docs_reference/cli_doc.rs"]
mod cli_doc;
#[path = "docs_reference/command_lines.rs"]
mod command_lines;
#[path = "docs_reference/config_facts.rs"]
mod config_facts;
#[path = "docs_reference/crd_doc.rs"]
mod crd_doc;
#[path = "docs_reference/crd_facts.rs"]
mod crd_facts;
#[path = "support/doc_blocks.rs"]
#[allow(dead_code, reason = "the shell-block parts serve the doc runners")]
mod doc_blocks;
#[path = "docs_reference/markdown.rs"]
mod markdown;
#[path = "docs_reference/metric_names.rs"]
mod metric_names;

use std::collections::BTreeSet;

use clap::CommandFactory;
use config_facts::{
    PROVIDER_TYPES, accepted_fields, block_fields, config_problems, documented_default, fields_in,
    load_standalone, objects,
};
use crd_facts::{field_path, rejections, span_names};
use egress_proxies::adapters::command_line::Cli;
use markdown::{Page, repo_root, user_docs};
use metric_names::{metric_names, registered_metrics, sample_names};
use serde_json::Value;

const REGENERATE: &str = "EPO_BLESS_DOCS=1 cargo test -p egress-proxies-operator --test docs_reference";

fn header(source: &str) -> String {
    format!(
        "<!-- Generated from {source} by actors/tests/docs_reference.rs; do not edit.\n     \
         Regenerate: {REGENERATE} -->"
    )
}

fn cli() -> clap::Command {
    let mut cli = Cli::command();
    cli.build();
    cli
}

fn crd(file: &str) -> Value {
    let text = std::fs::read_to_string(repo_root().join(file)).expect("a committed CRD");
    serde_saphyr::from_str(&text).expect("a CRD is YAML")
}

/// The references as they should read, each with its path.
fn references() -> Vec<(&'static str, String)> {
    let proxies = crd("deploy/crd/proxies.yaml");
    let pools = crd("deploy/crd/proxypools.yaml");
    let proxy_spec = &crd_doc::schema(&proxies)["properties"]["spec"];
    let same_as_proxy = crd_doc::Shared {
        schema: proxy_spec,
        text: "A Proxy's `spec`: the same fields, described in [proxy.md](proxy.md#spec).",
    };
    vec![
        (
            "docs/reference/cli.md",
            cli_doc::render(&Cli::command(), &header("src/adapters/command_line.rs")),
        ),
        (
            "docs/reference/proxy.md",
            crd_doc::render(
                &proxies,
                &header("deploy/crd/proxies.yaml"),
                "How to use it: [proxy-resource.md](../proxy-resource.md).",
                &[],
            ),
        ),
        (
            "docs/reference/proxypool.md",
            crd_doc::render(
                &pools,
                &header("deploy/crd/proxypools.yaml"),
                "How to use it: [pools.md](../pools.md).",
                &[same_as_proxy],
            ),
        ),
    ]
}

#[test]
fn generated_references_are_current() {
    let bless = std::env::var_os("EPO_BLESS_DOCS").is_some_and(|v| v == "1");
    let mut stale = Vec::new();
    for (path, text) in references() {
        let file = repo_root().join(path);
        if std::fs::read_to_string(&file).ok().as_deref() == Some(text.as_str()) {
            continue;
        }
        if bless {
            std::fs::create_dir_all(file.parent().expect("a directory")).expect("docs/reference/");
            std::fs::write(&file, text).expect("a writable reference");
        } else {
            stale.push(path);
        }
    }
    assert!(
        stale.is_empty(),
        "stale generated references: {}\nregenerate them with\n  {REGENERATE}",
        stale.join(", ")
    );
}

fn place(page: &Page, line: usize) -> String {
    format!("{}:{line}", page.path.display())
}

fn fail_on(kind: &str, wrong: &[String]) {
    assert!(
        wrong.is_empty(),
        "{} wrong {kind} in the docs:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}

/// Shell-like code blocks, where command lines are.
const SHELL: [&str; 6] = ["sh", "bash", "shell", "console", "text", ""];

/// Every command line of the docs with its place: code block lines (a
/// `console` block's `$ ` lines, `\` continuations joined) and inline spans.
fn command_lines(page: &Page) -> Vec<(usize, String)> {
    let mut lines = Vec::new();
    for block in page.blocks.iter().filter(|b| SHELL.contains(&b.lang.as_str())) {
        let mut pending: Option<(usize, String)> = None;
        for (n, line) in &block.lines {
            let line = match (&pending, block.lang.as_str()) {
                (Some(_), _) => line.as_str(),
                (None, "console") => match line.strip_prefix("$ ") {
                    Some(command) => command,
                    None => continue,
                },
                (None, _) => line.as_str(),
            };
            let (start, mut text) = pending.take().unwrap_or((*n, String::new()));
            match line.trim_end().strip_suffix('\\') {
                Some(head) => {
                    text.push_str(head);
                    text.push(' ');
                    pending = Some((start, text));
                }
                None => {
                    text.push_str(line);
                    lines.push((start, text));
                }
            }
        }
        lines.extend(pending);
    }
    lines.extend(page.spans.iter().cloned());
    lines
}

#[test]
fn command_lines_in_the_docs_name_subcommands_and_flags_the_cli_has() {
    let cli = cli();
    let mut wrong = Vec::new();
    let mut checked = 0;
    for page in user_docs() {
        for (line, text) in command_lines(&page) {
            for args in command_lines::invocations(&command_lines::words(&text)) {
                checked += 1;
                for problem in command_lines::problems(&cli, &args) {
                    wrong.push(format!(
                        "{}: {problem} (in `{}`)",
                        place(&page, line),
                        text.trim()
                    ));
                }
            }
        }
    }
    assert!(
        checked > 10,
        "only {checked} command lines found: is the check reading the docs?"
    );
    fail_on("command lines", &wrong);
}

/// Table rows whose first cell names flags: each flag exists; where the
/// table has an `env` column, it names the flag's variable; where it has a
/// `default` column and the flag has a default, the cell states it.
#[test]
fn flag_tables_in_the_docs_match_the_cli() {
    let cli = cli();
    let flags = command_lines::all_flags(&cli);
    let mut wrong = Vec::new();
    let mut checked = 0;
    for page in user_docs() {
        let mut columns: Vec<String> = Vec::new();
        let mut last_row = 0;
        for (line, cells) in &page.rows {
            if *line != last_row + 1 {
                // A new table: its first row is the header.
                columns = cells.iter().map(|c| c.to_lowercase()).collect();
                last_row = *line;
                continue;
            }
            last_row = *line;
            let names: Vec<&str> = markdown::code_spans(&cells[0])
                .into_iter()
                .filter_map(|span| span.strip_prefix("--"))
                .map(|flag| flag.split([' ', '=']).next().unwrap_or(flag))
                .collect();
            let envs: Vec<&str> = columns
                .iter()
                .position(|c| c == "env" || c == "environment")
                .and_then(|i| cells.get(i))
                .map(|cell| markdown::code_spans(cell))
                .unwrap_or_default();
            let default_cell = columns
                .iter()
                .position(|c| c == "default")
                .and_then(|i| cells.get(i));
            for (k, name) in names.iter().enumerate() {
                checked += 1;
                let Some((_, arg)) = flags.iter().find(|(_, a)| a.get_long() == Some(*name)) else {
                    wrong.push(format!(
                        "{}: `--{name}` is not a flag of any subcommand",
                        place(&page, *line)
                    ));
                    continue;
                };
                let env = arg.get_env().map(|e| e.to_string_lossy().into_owned());
                if !envs.is_empty() && envs.get(k).copied() != env.as_deref() {
                    wrong.push(format!(
                        "{}: `--{name}` reads {}, not `{}`",
                        place(&page, *line),
                        env.map_or("no environment variable".to_owned(), |e| format!("`{e}`")),
                        envs.get(k).copied().unwrap_or("")
                    ));
                }
                // A switch's `false` is said as "off" or not at all.
                let defaults = if arg.get_action().takes_values() {
                    arg.get_default_values()
                } else {
                    &[]
                };
                for default in defaults {
                    let default = default.to_string_lossy();
                    if default_cell.is_some_and(|cell| !cell.contains(&*default)) {
                        wrong.push(format!(
                            "{}: `--{name}` defaults to `{default}`, which the row does not say",
                            place(&page, *line)
                        ));
                    }
                }
            }
        }
    }
    assert!(
        checked > 20,
        "only {checked} flags in tables: is the check reading the docs?"
    );
    fail_on("flag table rows", &wrong);
}

/// The YAML documents of a block, or why they do not parse.
fn yaml_documents(text: &str) -> Result<Vec<Value>, String> {
    serde_saphyr::from_multiple::<Value>(text).map_err(|e| e.to_string())
}

fn yaml_blocks(page: &Page) -> impl Iterator<Item = &markdown::CodeBlock> {
    page.blocks.iter().filter(|b| b.lang == "yaml" || b.lang == "yml")
}

/// Providers configuration examples parse with `ProvidersConfig::parse`,
/// what `validate-config` runs; standalone configurations (a top-level
/// `providersConfig:`) load with `config_files::standalone_config`, what
/// `standalone` runs.
#[test]
fn configuration_examples_parse_with_the_operators_parsers() {
    let mut wrong = Vec::new();
    let mut checked = 0;
    let dir = tempfile::tempdir().expect("a temporary directory");
    for page in user_docs() {
        for block in yaml_blocks(&page) {
            let text = block.text();
            let at = place(&page, block.line);
            let documents = match yaml_documents(&text) {
                Ok(documents) => documents,
                Err(e) => {
                    wrong.push(format!("{at}: not YAML: {e}"));
                    continue;
                }
            };
            for document in &documents {
                if document.get("providersConfig").is_some() {
                    checked += 1;
                    let file = dir.path().join("standalone.yaml");
                    std::fs::write(&file, &text).expect("a writable temporary file");
                    if let Err(e) = egress_proxies::adapters::config_files::standalone_config(&file) {
                        wrong.push(format!("{at}: {e}"));
                    }
                } else if let Some(problems) = config_problems(document, &text, &at) {
                    checked += 1;
                    wrong.extend(problems.into_iter().map(|p| format!("{at}: {p}")));
                }
            }
        }
    }
    assert!(
        checked >= 3,
        "only {checked} configuration examples: is the check reading the docs?"
    );
    fail_on("configuration examples", &wrong);
}

/// Tables of configuration fields (a `field` column) name fields the
/// parser accepts: under a heading naming a provider type, that type's
/// block; in docs/standalone.md's Configuration, the standalone
/// configuration, whose documented defaults are also what it loads when
/// the field is left out.
#[test]
fn field_tables_name_fields_the_parsers_accept() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let load_standalone = |extra: &str| load_standalone(dir.path(), extra);
    let standalone_fields = match load_standalone("zzzUnknown: true\n") {
        Err(e) => fields_in(&e).expect("the refusal lists the fields"),
        Ok(_) => panic!("an unknown standalone field is accepted"),
    };
    let standalone_base = load_standalone("").expect("a minimal standalone configuration");
    let mut wrong = Vec::new();
    let mut checked = 0;
    for page in user_docs() {
        let mut columns: Vec<String> = Vec::new();
        let mut last_row = 0;
        for (line, cells) in &page.rows {
            if *line != last_row + 1 {
                columns = cells.iter().map(|c| c.to_lowercase()).collect();
                last_row = *line;
                continue;
            }
            last_row = *line;
            if columns.first().map(String::as_str) != Some("field") {
                continue;
            }
            let heading = page.heading_above(*line);
            let standalone = page.path.ends_with("docs/standalone.md") && heading == "Configuration";
            let kind = markdown::code_spans(heading)
                .first()
                .copied()
                .filter(|k| PROVIDER_TYPES.contains(k));
            let (what, fields) = match (standalone, kind) {
                (true, _) => (
                    "the standalone configuration".to_owned(),
                    standalone_fields.clone(),
                ),
                (false, Some(kind)) => (format!("a `{kind}` block"), block_fields(kind)),
                _ => continue,
            };
            let default_cell = columns
                .iter()
                .position(|c| c == "default")
                .and_then(|i| cells.get(i));
            let names = markdown::code_spans(&cells[0]);
            for (k, name) in names.iter().enumerate() {
                let field = name.split(['.', '[', ':']).next().unwrap_or(name);
                if field.is_empty() || field.starts_with('<') {
                    continue;
                }
                checked += 1;
                if !fields.iter().any(|f| f == field) {
                    wrong.push(format!(
                        "{}: `{field}` is no field of {what}",
                        place(&page, *line)
                    ));
                    continue;
                }
                let Some(value) = default_cell
                    .and_then(|c| documented_default(c, k))
                    .filter(|_| standalone)
                else {
                    continue;
                };
                match load_standalone(&format!("{field}: {value}\n")) {
                    Ok(set) if set == standalone_base => {}
                    Ok(_) => wrong.push(format!(
                        "{}: `{field}` is documented to default to `{value}`, but leaving it out is not the same",
                        place(&page, *line)
                    )),
                    Err(e) => wrong.push(format!(
                        "{}: `{field}`'s documented default `{value}` does not load: {e}",
                        place(&page, *line)
                    )),
                }
            }
        }
    }
    assert!(
        checked > 30,
        "only {checked} fields in tables: is the check reading the docs?"
    );
    fail_on("configuration field tables", &wrong);
}

/// The committed CRDs by kind.
fn schemas() -> [(&'static str, Value); 2] {
    [
        ("Proxy", crd_doc::schema(&crd("deploy/crd/proxies.yaml")).clone()),
        (
            "ProxyPool",
            crd_doc::schema(&crd("deploy/crd/proxypools.yaml")).clone(),
        ),
    ]
}

/// YAML files in the repository that are examples too.
const EXAMPLE_MANIFESTS: [&str; 2] = ["deploy/samples", "config/standalone/proxies"];

/// Every Proxy and ProxyPool example (a document with that `kind`) fits its
/// CRD schema: no unknown field, types, enums, bounds, required fields and
/// CEL rules as the API server checks them. A part of a spec (a top-level
/// `spec:` without `kind`, or fields of a spec such as `placement:`) fits
/// a Proxy's or a ProxyPool's spec, leaving out what it does not show.
#[test]
fn proxy_and_pool_examples_fit_the_crd_schemas() {
    let schemas = schemas();
    let mut examples: Vec<(String, Vec<Value>)> = Vec::new();
    for page in user_docs() {
        for block in yaml_blocks(&page) {
            if let Ok(documents) = yaml_documents(&block.text()) {
                examples.push((place(&page, block.line), documents));
            }
        }
    }
    for dir in EXAMPLE_MANIFESTS {
        let mut files: Vec<_> = std::fs::read_dir(repo_root().join(dir))
            .expect("an examples directory")
            .map(|e| e.expect("an entry").path())
            .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
            .collect();
        files.sort();
        for file in files {
            let text = std::fs::read_to_string(&file).expect("a readable manifest");
            let shown = file
                .strip_prefix(repo_root())
                .unwrap_or(&file)
                .display()
                .to_string();
            let documents = yaml_documents(&text).unwrap_or_else(|e| panic!("{shown}: {e}"));
            examples.push((shown, documents));
        }
    }
    let mut wrong = Vec::new();
    let mut checked = 0;
    for (at, documents) in examples {
        for object in documents {
            let kind = object["kind"].as_str().unwrap_or("");
            if let Some((_, schema)) = schemas.iter().find(|(k, _)| *k == kind) {
                checked += 1;
                if object["apiVersion"] != "crawl.example.com/v1alpha1" {
                    wrong.push(format!("{at}: {kind} with apiVersion {}", object["apiVersion"]));
                }
                for rejection in rejections(schema, &object, false) {
                    wrong.push(format!(
                        "{at}: {kind} {}: {rejection}",
                        object["metadata"]["name"]
                    ));
                }
                continue;
            }
            let Some(map) = object.as_object().filter(|_| kind.is_empty()) else {
                continue;
            };
            let spec = if map.len() == 1 && map.contains_key("spec") {
                object["spec"].clone()
            } else if map.keys().all(|k| {
                schemas
                    .iter()
                    .any(|(_, s)| s["properties"]["spec"]["properties"].get(k).is_some())
            }) {
                object.clone()
            } else {
                continue;
            };
            checked += 1;
            let mut best: Option<Vec<String>> = None;
            for (kind, schema) in &schemas {
                let wrapped = serde_json::json!({"apiVersion": "crawl.example.com/v1alpha1", "kind": kind, "spec": spec});
                let found = rejections(schema, &wrapped, true);
                if best.as_ref().is_none_or(|b| found.len() < b.len()) {
                    best = Some(found);
                }
            }
            for rejection in best.unwrap_or_default() {
                wrong.push(format!("{at}: part of a spec: {rejection}"));
            }
        }
    }
    assert!(
        checked >= 5,
        "only {checked} Proxy/ProxyPool examples: is the check reading the docs?"
    );
    fail_on("Proxy/ProxyPool examples", &wrong);
}

/// Every inline field path of the docs names a field of the Proxy or
/// ProxyPool CRD: a full path (`spec.…`, `status.…`) as it is, a path
/// starting at one of their object fields (`placement.image`) under
/// `spec` or `status`.
#[test]
fn field_paths_named_in_the_docs_exist_in_the_crds() {
    let mut known = BTreeSet::new();
    let mut roots = BTreeSet::new();
    for (_, schema) in schemas() {
        let mut paths = Vec::new();
        crd_doc::paths(&schema, "", &mut paths);
        known.extend(paths);
        for section in ["spec", "status"] {
            let fields = schema["properties"][section]["properties"]
                .as_object()
                .into_iter()
                .flatten();
            roots.extend(
                fields
                    .filter(|(_, f)| f.get("properties").is_some() || f["type"] == "array")
                    .map(|(name, _)| name.clone()),
            );
        }
    }
    let spans = span_names();
    assert!(spans.contains("status.patch"), "span names not found: {spans:?}");
    let mut wrong = Vec::new();
    let mut checked = 0;
    for page in user_docs() {
        for (line, span) in &page.spans {
            let Some(path) = field_path(span).filter(|_| !spans.contains(span)) else {
                continue;
            };
            let root = path.split(['.', '[']).next().unwrap_or("");
            let candidates = match root {
                "spec" | "status" => vec![path.clone()],
                _ if roots.contains(root) => vec![format!("spec.{path}"), format!("status.{path}")],
                _ => continue,
            };
            checked += 1;
            if !candidates.iter().any(|c| known.contains(c)) {
                wrong.push(format!(
                    "{}: `{span}` is no field of the Proxy or ProxyPool CRD",
                    place(&page, *line)
                ));
            }
        }
    }
    assert!(
        checked > 20,
        "only {checked} field paths named: is the check reading the docs?"
    );
    fail_on("field paths", &wrong);
}

fn monitoring_files() -> Vec<std::path::PathBuf> {
    let dir = repo_root().join("deploy/monitoring");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("deploy/monitoring/")
        .map(|e| e.expect("an entry").path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
}

#[test]
fn metric_names_in_the_docs_and_dashboards_are_registered() {
    let families = registered_metrics();
    assert!(
        families.len() > 20,
        "only {} metric families read: {families:?}",
        families.len()
    );
    let samples: BTreeSet<String> = families.iter().flat_map(|(f, k)| sample_names(f, k)).collect();
    let mut files: Vec<std::path::PathBuf> = user_docs().iter().map(|p| repo_root().join(&p.path)).collect();
    files.extend(monitoring_files());
    let mut wrong = Vec::new();
    let mut checked = 0;
    for file in files {
        let text = std::fs::read_to_string(&file).expect("a readable file");
        let shown = file
            .strip_prefix(repo_root())
            .unwrap_or(&file)
            .display()
            .to_string();
        for (line, name, prefix) in metric_names(&text) {
            checked += 1;
            let exists = if prefix {
                samples.iter().any(|s| s.starts_with(&name))
            } else {
                samples.contains(&name)
            };
            if !exists {
                wrong.push(format!(
                    "{shown}:{line}: `{name}{}` is no metric the operator registers",
                    if prefix { "_*" } else { "" }
                ));
            }
        }
    }
    assert!(
        checked > 50,
        "only {checked} metric names found: is the check reading the files?"
    );
    fail_on("metric names", &wrong);
}

/// docs/configuration.md calls `config/providers.yaml` "a full sample with
/// every optional field": each object in it shows, set or in a comment
/// (`# field: default`) within its provider's entry, every field its type
/// accepts.
#[test]
fn the_full_providers_sample_shows_every_field() {
    let text = std::fs::read_to_string(repo_root().join("config/providers.yaml")).expect("the sample");
    let mut config: Value = serde_saphyr::from_str(&text).expect("the sample is YAML");
    // An entry's text: from its `- name:` line to the next one.
    let entries: Vec<&str> = text.split("\n  - name:").skip(1).collect();
    for entry in config["providers"].as_array_mut().into_iter().flatten() {
        let kind = entry["type"].as_str().unwrap_or("").to_owned();
        if entry[&kind].is_null() {
            entry[&kind] = serde_json::json!({});
        }
    }
    let mut pointers = Vec::new();
    objects(&config, String::new(), &mut pointers);
    let mut missing = Vec::new();
    let mut checked = 0;
    // Below a provider entry (whose one block is named by its type).
    for pointer in pointers.into_iter().filter(|p| p.split('/').count() > 3) {
        let Some(fields) = accepted_fields(&config, &pointer) else {
            continue;
        };
        checked += 1;
        let index: usize = pointer
            .split('/')
            .nth(2)
            .and_then(|i| i.parse().ok())
            .expect("an entry index");
        let entry_text = entries.get(index).copied().unwrap_or("");
        let present = config
            .pointer(&pointer)
            .and_then(Value::as_object)
            .expect("an object");
        let commented = |field: &str| {
            entry_text
                .lines()
                .filter_map(|l| l.trim_start().strip_prefix('#'))
                .any(|l| l.trim_start().starts_with(&format!("{field}:")))
        };
        missing.extend(
            fields
                .iter()
                .filter(|f| !present.contains_key(*f) && !commented(f))
                .map(|f| format!("config/providers.yaml: `{f}` in {pointer}")),
        );
    }
    assert!(checked >= 6, "only {checked} objects of the sample probed");
    assert!(
        missing.is_empty(),
        "config/providers.yaml is the sample with every optional field (its header, docs/configuration.md); \
         add these, commented out with their defaults:\n{}",
        missing.join("\n")
    );
}

#[test]
fn wrong_command_lines_are_told_apart_from_right_ones() {
    let cli = cli();
    let check = |line: &str| -> Vec<String> {
        command_lines::invocations(&command_lines::words(line))
            .iter()
            .flat_map(|args| command_lines::problems(&cli, args))
            .collect()
    };
    for right in [
        "egress-proxies-operator run --providers-config providers.yaml --leader-elect",
        "egress-proxies-operator --leader-elect --lease-duration=3s",
        "cargo run --release -q -- get pools -o wide --config config/standalone/quickstart.yaml",
        "cargo run -q -- crd proxypools > deploy/crd/proxypools.yaml",
        "egress-proxies-operator standalone --log-format text --config \"$config\"",
        "egress-proxies-operator run ...",
        "cargo run -q -- --version",
    ] {
        assert_eq!(check(right), Vec::<String>::new(), "{right}");
    }
    for (wrong, expected) in [
        (
            "egress-proxies-operator run --leader-election",
            "`--leader-election` is not a flag of `egress-proxies-operator run`",
        ),
        (
            "egress-proxies-operator crd pools",
            "`egress-proxies-operator crd`: `pools` is not one of proxies, proxypools",
        ),
        (
            "egress-proxies-operator validate providers.yaml",
            "`validate` is not a subcommand of `egress-proxies-operator`",
        ),
        (
            "cargo run -- get proxies --config c.yaml -x",
            "`-x` is not a flag of `egress-proxies-operator get`",
        ),
        (
            "egress-proxies-operator standalone --providers-config p.yaml",
            "`--providers-config` is not a flag of `egress-proxies-operator standalone`",
        ),
    ] {
        assert_eq!(check(wrong), [expected.to_owned()], "{wrong}");
    }
}

#[test]
fn crd_examples_are_refused_for_what_the_api_server_refuses() {
    let [(_, proxy), _] = schemas();
    let object = |spec: Value| {
        serde_json::json!({"apiVersion": "crawl.example.com/v1alpha1", "kind": "Proxy",
        "metadata": {"name": "p"}, "spec": spec})
    };
    let ok = object(serde_json::json!({"mode": "Managed", "provider": "local", "placement": {"image": "i"}}));
    assert_eq!(rejections(&proxy, &ok, false), Vec::<String>::new());
    let unknown =
        object(serde_json::json!({"mode": "Managed", "provider": "local", "placement": {"imag": "i"}}));
    assert_eq!(
        rejections(&proxy, &unknown, false),
        ["unknown field `spec.placement.imag`"]
    );
    let rule = object(serde_json::json!({"mode": "External"}));
    let found = rejections(&proxy, &rule, false);
    assert!(
        found
            .iter()
            .any(|r| r.contains("endpoint is required when mode is External")),
        "{found:?}"
    );
    assert_eq!(
        rejections(&proxy, &rule, true),
        Vec::<String>::new(),
        "a part of a spec is not held to its rules"
    );
    let bad_enum = object(serde_json::json!({"mode": "Sometimes"}));
    assert!(
        rejections(&proxy, &bad_enum, true)
            .iter()
            .any(|r| r.contains("Sometimes"))
    );
}

/// The header lines `kubectl get` prints for a CRD: NAME and the printer
/// columns (those of priority 1 with `-o wide`), each with or without a
/// NAMESPACE column first (`-A`).
fn kubectl_headers(crd: &Value) -> Vec<Vec<String>> {
    let columns = crd_doc::version(crd)["additionalPrinterColumns"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let mut headers = Vec::new();
    for wide in [false, true] {
        let mut header = vec!["NAME".to_owned()];
        header.extend(
            columns
                .iter()
                .filter(|c| wide || c["priority"].as_u64().unwrap_or(0) == 0)
                .map(|c| c["name"].as_str().unwrap_or("?").to_uppercase()),
        );
        headers.push(header);
    }
    with_namespace(headers)
}

fn with_namespace(headers: Vec<Vec<String>>) -> Vec<Vec<String>> {
    let mut all = headers.clone();
    all.extend(
        headers
            .into_iter()
            .map(|h| std::iter::once("NAMESPACE".to_owned()).chain(h).collect()),
    );
    all
}

fn words(line: &str) -> Vec<String> {
    line.split_whitespace().map(String::from).collect()
}

/// Sample output of `kubectl get px|pp` and `egress-proxies-operator get
/// proxies|pools` in the docs has the columns they print: a header line
/// starting `NAME MODE` (proxies) or `NAME DESIRED` (pools) is one of
/// kubectl's (the CRD's printer columns) or the standalone table's.
#[test]
fn sample_tables_have_the_columns_the_commands_print() {
    use egress_proxies::domain::resource::{pool_table, proxy_table};
    let now = jiff::Timestamp::now();
    let first_line = |table: String| words(table.lines().next().unwrap_or(""));
    let mut proxies = kubectl_headers(&crd("deploy/crd/proxies.yaml"));
    proxies.extend(with_namespace(vec![
        first_line(proxy_table(&[], now, false)),
        first_line(proxy_table(&[], now, true)),
    ]));
    let mut pools = kubectl_headers(&crd("deploy/crd/proxypools.yaml"));
    pools.extend(with_namespace(vec![first_line(pool_table(&[], now))]));
    // kubectl's and the standalone table agree where they should: one list each.
    for headers in [&mut proxies, &mut pools] {
        headers.sort();
        headers.dedup();
    }
    let mut wrong = Vec::new();
    let mut checked = 0;
    for page in user_docs() {
        for block in page.blocks.iter().filter(|b| SHELL.contains(&b.lang.as_str())) {
            for (line, text) in &block.lines {
                let header = words(text);
                let names: Vec<&str> = header
                    .iter()
                    .map(String::as_str)
                    .skip_while(|w| *w == "NAMESPACE")
                    .collect();
                let (kind, valid) = match names.get(..2) {
                    Some(["NAME", "MODE"]) => ("proxies", &proxies),
                    Some(["NAME", "DESIRED"]) => ("pools", &pools),
                    _ => continue,
                };
                checked += 1;
                if !valid.contains(&header) {
                    let shown: Vec<String> = valid.iter().map(|h| h.join(" ")).collect();
                    wrong.push(format!(
                        "{}: `{}` are not the columns listing {kind} prints; one of:\n    {}",
                        place(&page, *line),
                        header.join(" "),
                        shown.join("\n    ")
                    ));
                }
            }
        }
    }
    assert!(
        checked >= 3,
        "only {checked} sample tables found: is the check reading the docs?"
    );
    fail_on("sample tables", &wrong);
}
