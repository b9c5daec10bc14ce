//! The generated references (docs/reference/) are current, and the facts
//! the docs state are true of the code: command lines name subcommands and
//! flags the CLI has, configuration examples parse with the operator's own
//! parsers, Proxy and ProxyPool examples and field paths fit the CRD
//! schemas, and metric names are metrics the operator registers.
//!
//! Each failure names the file and line of the wrong fact. The references
//! are rewritten, instead of compared, with `EPO_BLESS_DOCS=1`.

#[path = "docs_reference/cli_doc.rs"]
mod cli_doc;
#[path = "docs_reference/command_lines.rs"]
mod command_lines;
#[path = "docs_reference/crd_doc.rs"]
mod crd_doc;
#[path = "docs_reference/markdown.rs"]
mod markdown;

use std::collections::BTreeSet;

use clap::CommandFactory;
use egress_proxies::config::{ProvidersConfig, StandaloneConfig};
use egress_proxies_operator::cli::Cli;
use markdown::{Page, repo_root, user_docs};
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
            cli_doc::render(&Cli::command(), &header("actors/src/cli.rs")),
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

const PROVIDER_TYPES: [&str; 4] = ["kubernetes", "gcp", "kvm", "local"];

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
fn config_problems(document: &Value, text: &str, at: &str) -> Option<Vec<String>> {
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

/// Providers configuration examples parse with `ProvidersConfig::parse`,
/// what `validate-config` runs; standalone configurations (a top-level
/// `providersConfig:`) load with `StandaloneConfig::load`, what
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
                    if let Err(e) = StandaloneConfig::load(&file) {
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
        checked >= 5,
        "only {checked} configuration examples: is the check reading the docs?"
    );
    fail_on("configuration examples", &wrong);
}

/// The fields a parser accepts, read from its refusal of an unknown one
/// (serde: "unknown field `x`, expected one of `a`, `b`"; serde-saphyr
/// leaves out the backticks of the list).
fn fields_in(problem: &str) -> Option<Vec<String>> {
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
fn block_fields(kind: &str) -> Vec<String> {
    entry_problems(kind, &serde_json::json!({"zzzUnknown": true}))
        .iter()
        .find_map(|p| fields_in(p))
        .unwrap_or_else(|| panic!("no field list in the refusal of an unknown {kind} field"))
}

/// A minimal standalone configuration plus `extra` lines, loaded from
/// `dir` (relative paths resolve against it, so loads from one directory
/// compare equal).
fn load_standalone(dir: &std::path::Path, extra: &str) -> Result<StandaloneConfig, String> {
    let file = dir.join("standalone.yaml");
    std::fs::write(
        &file,
        format!("providersConfig: p.yaml\nmanifests: m\nstateDir: s\n{extra}"),
    )
    .expect("a writable temporary file");
    StandaloneConfig::load(&file).map_err(|e| e.to_string())
}

/// The settings a documented default stands for: the one code span of a
/// cell, or a bare number; nothing for prose (`none`, `required`).
fn documented_default(cell: &str, k: usize) -> Option<String> {
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
fn rejections(schema: &Value, object: &Value, partial: bool) -> Vec<String> {
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

/// An inline span that may be a field path, in the schema's notation:
/// `spec.placement.image`, `.status.phase`, `status.conditions[0].type`
/// (indices become `[]`), `healthCheck.interval`.
fn field_path(span: &str) -> Option<String> {
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
fn span_names() -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut files = Vec::new();
    for dir in ["src", "actors/src"] {
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

fn rust_files(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("a source directory") {
        let path = entry.expect("an entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
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

/// The metric families `src/telemetry/metrics.rs` registers, by name,
/// with their type. Read from its `register` calls: a family shows in the
/// encoded registry only once it has a sample, and most have labels none
/// of which is set before the operator runs. The families that do show are
/// compared with what is read, so the reading cannot drift from the code.
fn registered_metrics() -> Vec<(String, String)> {
    let source =
        std::fs::read_to_string(repo_root().join("src/telemetry/metrics.rs")).expect("the metrics source");
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
fn sample_names(family: &str, kind: &str) -> Vec<String> {
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
fn metric_names(text: &str) -> Vec<(usize, String, bool)> {
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

/// The fields `validate-config` accepts in the object at `pointer` (a JSON
/// pointer into `config`), read from its refusal of an unknown one (`None`
/// where any key goes, such as a map of named images).
fn accepted_fields(config: &Value, pointer: &str) -> Option<Vec<String>> {
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
fn objects(value: &Value, pointer: String, out: &mut Vec<String>) {
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
        "docs/configuration.md calls config/providers.yaml a sample with every optional field; it lacks:\n{}",
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
