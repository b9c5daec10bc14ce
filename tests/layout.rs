//! The layout the docs describe still holds: the domain crate (`domain/`)
//! depends on no adapter, so an adapter import there does not build; it
//! does no I/O and reads no clock and no global random number generator
//! (time and randomness are its inputs); every file of `actors/src/` is
//! actix glue; no import circle forms between the modules of the library
//! and the domain; the files that decide await nothing; each
//! provider depends on the contract's shared types only (never on the
//! registry, the decorators, or another provider); every repository path
//! the docs name (`src/…`, `deploy/…`, `tests/…`, …) exists, every glob
//! they show matches a file and every source file they name by its bare
//! name (`gateway.rs`) exists somewhere; and the
//! architecture's messages table and file map are complete.

use std::path::{Path, PathBuf};

/// The providers, each a file or a directory under `src/adapters/providers/`.
const PROVIDERS: [&str; 4] = ["gcp", "kubernetes", "kvm", "local"];

/// Items only the registry (and the contract's set of providers) may name.
const REGISTRY_ITEMS: [&str; 6] = [
    "registry",
    "BuildContext",
    "Providers",
    "KvmRunnerFactory",
    "Traced",
    "Instrumented",
];

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn rust_files(path: &Path) -> Vec<PathBuf> {
    if path.is_file() {
        return vec![path.to_owned()];
    }
    let mut files = Vec::new();
    for entry in std::fs::read_dir(path).unwrap() {
        files.extend(rust_files(&entry.unwrap().path()));
    }
    files.retain(|f| f.extension().is_some_and(|e| e == "rs"));
    files
}

fn provider_path(provider: &str) -> PathBuf {
    let dir = root().join("src/adapters/providers").join(provider);
    if dir.is_dir() {
        dir
    } else {
        root().join(format!("src/adapters/providers/{provider}.rs"))
    }
}

#[test]
fn providers_depend_on_the_shared_provider_types_only() {
    let mut wrong = Vec::new();
    for provider in PROVIDERS {
        for file in rust_files(&provider_path(provider)) {
            let text = std::fs::read_to_string(&file).unwrap();
            for (n, line) in text.lines().enumerate() {
                if line.trim_start().starts_with("//") {
                    continue;
                }
                let at = || format!("{}:{}: {}", file.display(), n + 1, line.trim());
                let words: Vec<&str> = line.split(|c: char| !(c.is_alphanumeric() || c == '_')).collect();
                if REGISTRY_ITEMS.iter().any(|item| words.contains(item)) {
                    wrong.push(format!("{} (the registry's)", at()));
                }
                for other in PROVIDERS.iter().filter(|p| **p != provider) {
                    if line.contains(&format!("providers::{other}")) {
                        wrong.push(format!("{} (provider {other})", at()));
                    }
                }
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "providers reaching past the shared types:\n{}",
        wrong.join("\n")
    );
}

/// Top-level entries of the repository (`src`, `deploy`, `README.md`, ...):
/// a path the docs name starts with one of them.
fn top_level() -> Vec<String> {
    std::fs::read_dir(root())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name != ".git" && name != "target")
        .collect()
}

/// Backticked spans outside code blocks that name a repository path, each
/// with its 1-based line: a top-level directory, a slash and more
/// (`deploy/crd/proxies.yaml`, `tests/run.sh`), a `#anchor` or `:line`
/// suffix dropped. Patterns with `…`, `*`, `<…>`, `{…}` or `$` in them name
/// no one file.
fn repository_paths(text: &str, top: &[String]) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    for (line, span) in backticked_spans(text) {
        if span.contains('*') {
            continue;
        }
        let path = span.trim_start_matches("./").split('#').next().unwrap_or(span);
        let path = match path.rsplit_once(':') {
            Some((file, at)) if at.chars().all(|c| c.is_ascii_digit() || c == '-') => file,
            _ => path,
        };
        let Some((first, rest)) = path.split_once('/') else {
            continue;
        };
        if !rest.is_empty() && top.iter().any(|t| t == first) {
            found.push((line, path.to_owned()));
        }
    }
    found
}

/// Backticked spans outside code blocks, each with its 1-based line, but
/// those with whitespace, `…`, `<…>`, `{…}` or `$`: placeholders, which
/// name no file.
fn backticked_spans(text: &str) -> Vec<(usize, &str)> {
    let mut found = Vec::new();
    let mut in_block = false;
    for (n, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            in_block = !in_block;
            continue;
        }
        if in_block {
            continue;
        }
        for span in line.split('`').skip(1).step_by(2) {
            if !span.contains(|c: char| c.is_whitespace() || "…<>{}$".contains(c)) {
                found.push((n + 1, span));
            }
        }
    }
    found
}

/// README.md, CHANGELOG.md and every Markdown file under docs/.
fn user_docs() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "md") {
                out.push(path);
            }
        }
    }
    let mut docs = Vec::new();
    walk(&root().join("docs"), &mut docs);
    docs.sort();
    docs.extend(
        ["README.md", "CHANGELOG.md"]
            .map(|f| root().join(f))
            .into_iter()
            .filter(|f| f.exists()),
    );
    docs
}

/// Paths the repository's `.gitignore` keeps out: made at run time (the
/// quickstart's state directory), so a page may name them though no
/// checkout has them.
fn ignored(path: &str) -> bool {
    let rules = std::fs::read_to_string(root().join(".gitignore")).unwrap_or_default();
    let path = format!("/{}", path.trim_end_matches('/'));
    rules
        .lines()
        .map(|rule| rule.trim().trim_end_matches('/'))
        .filter(|rule| !rule.is_empty() && !rule.starts_with('#'))
        .any(|rule| match rule.strip_prefix('/') {
            Some(anchored) => path == format!("/{anchored}") || path.starts_with(&format!("/{anchored}/")),
            None => path.split('/').any(|part| part == rule),
        })
}

#[test]
fn every_repository_path_the_docs_name_exists() {
    let top = top_level();
    let mut missing = Vec::new();
    let mut named = 0;
    for doc in user_docs() {
        let text = std::fs::read_to_string(&doc).unwrap();
        let shown = doc.strip_prefix(root()).unwrap().display().to_string();
        for (line, path) in repository_paths(&text, &top) {
            named += 1;
            if !root().join(&path).exists() && !ignored(&path) {
                missing.push(format!("{shown}:{line}: `{path}`"));
            }
        }
    }
    assert!(
        named > 50,
        "the docs name only {named} repository paths: is the check reading them?"
    );
    assert!(
        missing.is_empty(),
        "docs name paths that do not exist (write the path from the repository root):\n{}",
        missing.join("\n")
    );
}

/// Every file of the repository (what git tracks, and new files it does
/// not ignore), relative to the root.
fn repository_files() -> Vec<String> {
    let out = std::process::Command::new("git")
        .args(["ls-files", "--cached", "--others", "--exclude-standard"])
        .current_dir(root())
        .output()
        .expect("git lists the repository");
    assert!(out.status.success(), "git ls-files failed");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|f| root().join(f).exists())
        .map(str::to_owned)
        .collect()
}

/// Whether `path` matches the glob `pattern`: `*` within a name, `**` any
/// number of directories.
fn glob_matches(pattern: &str, path: &str) -> bool {
    fn name_matches(pattern: &str, name: &str) -> bool {
        match pattern.split_once('*') {
            None => pattern == name,
            Some((head, tail)) => {
                name.starts_with(head)
                    && (head.len()..=name.len())
                        .any(|i| name.is_char_boundary(i) && name_matches(tail, &name[i..]))
            }
        }
    }
    fn parts_match(pattern: &[&str], path: &[&str]) -> bool {
        match (pattern.first(), path.first()) {
            (None, None) => true,
            (Some(&"**"), _) => {
                parts_match(&pattern[1..], path) || (!path.is_empty() && parts_match(pattern, &path[1..]))
            }
            (Some(p), Some(n)) => name_matches(p, n) && parts_match(&pattern[1..], &path[1..]),
            _ => false,
        }
    }
    let pattern: Vec<&str> = pattern.trim_end_matches('/').split('/').collect();
    let path: Vec<&str> = path.split('/').collect();
    parts_match(&pattern, &path)
}

/// Backticked globs over repository paths (`deploy/crd/*.yaml`,
/// `docs/**/*.md`) and bare source file names (`quickstart.rs`,
/// `run.sh`), outside code blocks, each with its 1-based line.
fn globs_and_file_names(text: &str, top: &[String]) -> Vec<(usize, String)> {
    backticked_spans(text)
        .into_iter()
        .filter(|(_, span)| {
            let glob = span.contains('*')
                && span
                    .split_once('/')
                    .is_some_and(|(first, _)| top.iter().any(|t| t == first));
            let bare = !span.contains('/')
                && !span.contains('*')
                && [".rs", ".sh", ".py"].iter().any(|ext| span.ends_with(ext))
                && span.len() > 3;
            glob || bare
        })
        .map(|(line, span)| (line, span.to_owned()))
        .collect()
}

/// A glob the docs show matches at least one file, and a source file the
/// docs name by its bare name (`gateway.rs`, `run.sh`) exists somewhere:
/// a renamed or deleted file leaves no stale name behind.
#[test]
fn every_glob_and_file_name_the_docs_name_exists() {
    let top = top_level();
    let files = repository_files();
    let mut missing = Vec::new();
    let mut named = 0;
    for doc in user_docs() {
        let text = std::fs::read_to_string(&doc).unwrap();
        let shown = doc.strip_prefix(root()).unwrap().display().to_string();
        for (line, name) in globs_and_file_names(&text, &top) {
            named += 1;
            let exists = if name.contains('*') {
                files.iter().any(|f| glob_matches(&name, f))
            } else {
                files
                    .iter()
                    .any(|f| f == &name || f.ends_with(&format!("/{name}")))
            };
            if !exists {
                missing.push(format!("{shown}:{line}: `{name}`"));
            }
        }
    }
    assert!(
        named > 50,
        "the docs name only {named} globs and file names: is the check reading them?"
    );
    assert!(
        missing.is_empty(),
        "docs name files that do not exist (no file has that name, or no file matches the glob):\n{}",
        missing.join("\n")
    );
}

#[test]
fn globs_and_bare_file_names_are_found_and_matched() {
    let top = ["tests", "deploy", "docs"].map(String::from);
    let text = "`tests/*.rs`, `gateway.rs`, `run.sh` and `deploy/crd/*.yaml`; not `*.yaml`, `a b.rs`, `egress_*`\n```\n`x.rs`\n```\n";
    assert_eq!(
        globs_and_file_names(text, &top),
        [
            (1, "tests/*.rs".to_owned()),
            (1, "gateway.rs".to_owned()),
            (1, "run.sh".to_owned()),
            (1, "deploy/crd/*.yaml".to_owned())
        ]
    );
    assert!(glob_matches("tests/*.rs", "tests/layout.rs"));
    assert!(!glob_matches("tests/*.rs", "tests/fake-apiserver/src/lib.rs"));
    assert!(glob_matches("docs/**/*.md", "docs/reference/cli.md"));
    assert!(glob_matches("docs/**/*.md", "docs/api.md"));
    assert!(!glob_matches("deploy/crd/*.yaml", "deploy/crd/kustomization.yml"));
}

#[test]
fn paths_made_at_run_time_are_the_ignored_ones() {
    assert!(ignored("config/standalone/state/"));
    assert!(ignored("config/standalone/state/state.db"));
    assert!(ignored("target/debug/egress-proxies-operator"));
    assert!(!ignored("config/standalone/proxies/"));
    assert!(!ignored("tests/semantics.rs"));
}

#[test]
fn repository_paths_are_found_between_backticks() {
    let top = ["src", "deploy", "tests"].map(String::from);
    let text = "see `src/a.rs:12` and `deploy/crd/#x` but not `src/a b`, `src/…`, `other/x.rs`, `src/`\n\
                ```sh\ncat `tests/in-a-block.sh`\n```\nor src/c.rs, `./tests/run.sh`";
    assert_eq!(
        repository_paths(text, &top),
        [
            (1, "src/a.rs".to_owned()),
            (1, "deploy/crd/".to_owned()),
            (5, "tests/run.sh".to_owned())
        ]
    );
}

/// `(actor, message)` for every `impl Handler<Message> for Actor` in the
/// actors crate outside its test modules (a generic message by its name:
/// `Call<C>` is `Call`).
fn handlers() -> Vec<(String, String, PathBuf)> {
    let mut found = Vec::new();
    for file in rust_files(&root().join("actors/src")) {
        let text = std::fs::read_to_string(&file).unwrap();
        let production = text.split("#[cfg(test)]").next().unwrap_or_default();
        for (at, _) in production.match_indices("Handler<") {
            let before = &production[..at];
            let Some(impl_at) = before.rfind("impl") else {
                continue;
            };
            // `impl Handler<…>` or `impl<C: HostCall> Handler<…>`, nothing else between.
            let between = &before[impl_at + 4..];
            if !(between.trim().is_empty()
                || between.trim_start().starts_with('<') && between.trim_end().ends_with('>'))
            {
                continue;
            }
            let rest = &production[at + "Handler<".len()..];
            let message: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            let Some(for_at) = rest.find(" for ") else {
                continue;
            };
            let actor: String = rest[for_at + 5..]
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == '$')
                .collect();
            // The fault-injection macro's `$actor`: its rows name the actors.
            if !message.is_empty() && !actor.starts_with('$') {
                found.push((actor, message, file.clone()));
            }
        }
    }
    found
}

#[test]
fn the_messages_table_names_every_handler() {
    let text = std::fs::read_to_string(root().join("docs/architecture.md")).unwrap();
    let section = text
        .split("\n## Messages\n")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .expect("docs/architecture.md has a Messages section");
    // actor → the names between backticks in its row's `handles` cell.
    let mut rows: std::collections::HashMap<String, Vec<String>> = Default::default();
    for line in section
        .lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| actor"))
    {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let (Some(actors), Some(handles)) = (cells.get(1), cells.get(3)) else {
            continue;
        };
        let names: Vec<String> = handles
            .split('`')
            .skip(1)
            .step_by(2)
            .map(|n| {
                n.chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect()
            })
            .collect();
        // "LeaseStoreActor" or "KeyedRegistry (ProxyRegistry in …)": the leading name.
        for actor in actors.split(',') {
            let actor: String = actor
                .trim()
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            rows.entry(actor).or_default().extend(names.iter().cloned());
        }
    }
    let handlers = handlers();
    assert!(
        handlers.len() >= 30,
        "found only {} handlers: the scan is broken",
        handlers.len()
    );
    let missing: Vec<String> = handlers
        .iter()
        .filter(|(actor, message, _)| !rows.get(actor).is_some_and(|names| names.contains(message)))
        .map(|(actor, message, file)| format!("{actor} handles {message} ({})", file.display()))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/architecture.md's messages table lacks:\n{}",
        missing.join("\n")
    );
}

/// A file's production code: without the items marked `#[cfg(test)]`
/// (a `mod tests;` line, or an inline test module to the end of the file).
fn production(text: &str) -> String {
    let mut kept = String::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        if line.trim() != "#[cfg(test)]" {
            kept.push_str(line);
            kept.push('\n');
            continue;
        }
        match lines.next() {
            Some(item) if item.trim_end().ends_with('{') => break,
            _ => continue,
        }
    }
    kept
}

/// A file holding a test module (`tests.rs`, `…_tests.rs`).
fn is_test_module(file: &Path) -> bool {
    let name = file.file_stem().unwrap_or_default().to_string_lossy();
    name == "tests" || name.ends_with("_tests")
}

/// The modules of the domain and the library, by name, with where each
/// lives: every module of `domain/src/` and `src/adapters/`, and the shared
/// ones at the top of `src/`.
fn modules() -> std::collections::BTreeMap<String, PathBuf> {
    let mut modules = std::collections::BTreeMap::new();
    for dir in ["domain/src", "src/adapters", "src"] {
        for entry in std::fs::read_dir(root().join(dir)).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_stem().unwrap().to_string_lossy().into_owned();
            let skip = ["lib", "mod", "domain", "adapters"].contains(&name.as_str());
            if !skip && (path.is_dir() || path.extension().is_some_and(|e| e == "rs")) {
                modules.insert(name, path);
            }
        }
    }
    modules
}

/// The modules of `src/` each imports (`crate::…`, with or without its
/// `domain::`/`adapters::` prefix, outside comments and test code).
fn module_imports() -> std::collections::BTreeMap<String, std::collections::BTreeSet<String>> {
    let modules = modules();
    let mut imports = std::collections::BTreeMap::new();
    for (module, path) in &modules {
        let mut uses = std::collections::BTreeSet::new();
        for file in rust_files(path).iter().filter(|f| !is_test_module(f)) {
            let text = std::fs::read_to_string(file).unwrap();
            for line in production(&text)
                .lines()
                .filter(|l| !l.trim_start().starts_with("//"))
            {
                for (at, _) in line.match_indices("crate::") {
                    let rest = &line[at + 7..];
                    let rest = rest
                        .strip_prefix("domain::")
                        .or_else(|| rest.strip_prefix("adapters::"))
                        .unwrap_or(rest);
                    let name: String = rest
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_')
                        .collect();
                    if &name != module && modules.contains_key(&name) {
                        uses.insert(name);
                    }
                }
            }
        }
        imports.insert(module.clone(), uses);
    }
    imports
}

/// The lines of a crate's `Cargo.toml` `[dependencies]` section (normal
/// dependencies, not dev-dependencies).
fn dependency_lines(manifest: &str) -> Vec<String> {
    let text = std::fs::read_to_string(root().join(manifest)).unwrap();
    let section = text
        .split("\n[dependencies]\n")
        .nth(1)
        .and_then(|s| s.split("\n[").next())
        .unwrap_or_else(|| panic!("{manifest} has a [dependencies] section"));
    section.lines().map(str::to_owned).collect()
}

/// A dependency line's package name (`tokio.workspace = true`, `x = { … }`).
fn package_of(line: &str) -> &str {
    line.split(['=', '.', ' ']).next().unwrap_or_default().trim()
}

/// The workspace crates a crate depends on (normal dependencies), by
/// package name.
fn workspace_dependencies(manifest: &str) -> Vec<String> {
    dependency_lines(manifest)
        .iter()
        .filter(|l| l.contains("path ="))
        .map(|l| package_of(l).to_owned())
        .collect()
}

/// The domain is a crate below the adapters: it depends on the telemetry
/// crate only, so an import of an adapter (or of the library they live in)
/// from the domain does not build. The telemetry crate depends on none.
#[test]
fn the_domain_crate_depends_on_no_adapter() {
    assert_eq!(
        workspace_dependencies("domain/Cargo.toml"),
        ["egress-proxies-telemetry"]
    );
    assert_eq!(
        workspace_dependencies("telemetry/Cargo.toml"),
        Vec::<String>::new()
    );
    let library = workspace_dependencies("Cargo.toml");
    assert!(
        library.contains(&"egress-proxies-domain".to_owned()),
        "the library builds on the domain: {library:?}"
    );
}

/// Crates that do I/O (a runtime, sockets, files, processes, databases,
/// SSH, libvirt, HTTP): the domain may name none of them as a dependency.
const IO_CRATES: [&str; 10] = [
    "tokio",
    "reqwest",
    "rusqlite",
    "russh",
    "virt",
    "nix",
    "socket2",
    "hyper",
    "getrandom",
    "procfs",
];

/// The domain does no I/O: no I/O crate among its dependencies (a test
/// may use one), and no file, socket or process call in its code. It acts
/// through its ports (the provider contract, the store, name resolution,
/// randomness), which the adapters implement.
#[test]
fn the_domain_does_no_io() {
    let lines = dependency_lines("domain/Cargo.toml");
    let named: Vec<&str> = lines
        .iter()
        .map(|l| package_of(l))
        .filter(|name| IO_CRATES.contains(name))
        .collect();
    assert!(named.is_empty(), "the domain depends on I/O crates: {named:?}");
    let mut found = Vec::new();
    for file in rust_files(&root().join("domain/src"))
        .iter()
        .filter(|f| !is_test_module(f))
    {
        let text = std::fs::read_to_string(file).unwrap();
        for (n, line) in production(&text).lines().enumerate() {
            let code = line.split("//").next().unwrap_or_default();
            for word in [
                "std::fs",
                "std::net::Tcp",
                "std::net::Udp",
                "std::process",
                "std::env",
            ] {
                if code.contains(word) {
                    found.push(format!("{}:{}: {word:?}", file.display(), n + 1));
                }
            }
        }
    }
    assert!(found.is_empty(), "the domain does I/O:\n{}", found.join("\n"));
}

/// What in `code` reads a clock or draws from a global random number
/// generator: `Instant::now`, `SystemTime::now`, jiff's `Timestamp::now`
/// and `Zoned::now`, an `elapsed()` (which reads the clock), and any use
/// of `getrandom`, `rand` or `fastrand` other than a generator seeded
/// from an input (`fastrand::Rng::with_seed`).
fn clock_or_rng_reads(code: &str) -> Vec<&'static str> {
    const CLOCKS: [&str; 6] = [
        "Instant::now",
        "SystemTime::now",
        "Timestamp::now",
        "Zoned::now",
        "UNIX_EPOCH.elapsed",
        ".elapsed()",
    ];
    const RANDOM: [&str; 5] = ["getrandom", "rand::", "thread_rng", "OsRng", "fastrand"];
    let mut found: Vec<&'static str> = CLOCKS.into_iter().filter(|w| code.contains(w)).collect();
    let seeded = code.replace("fastrand::Rng::with_seed", "");
    found.extend(RANDOM.into_iter().filter(|w| {
        seeded
            .match_indices(w)
            .any(|(at, _)| !seeded[..at].ends_with(|c: char| c.is_alphanumeric() || c == '_'))
    }));
    found
}

#[test]
fn the_clock_and_rng_check_finds_what_is_planted() {
    for planted in [
        "let t = Instant::now();",
        "let t = std::time::Instant::now();",
        "last_transition.unwrap_or_else(Timestamp::now)",
        "let waited = started.elapsed();",
        "let n = fastrand::u64(..);",
        "let mut r = fastrand::Rng::new();",
        "getrandom::fill(&mut salt)?;",
        "let x: u8 = rand::random();",
        "use fastrand;",
    ] {
        assert!(
            !clock_or_rng_reads(planted).is_empty(),
            "{planted:?} passed unseen"
        );
    }
    for clean in [
        "let mut rng = fastrand::Rng::with_seed(seed);",
        "fn decide(now: Now) -> Plan",
        "let wait = retry_at.duration_since(now.wall);",
        "let operand = 3;",
    ] {
        assert_eq!(clock_or_rng_reads(clean), Vec::<&str>::new(), "{clean:?}");
    }
}

/// No file of the domain reads a clock or a global random number
/// generator: the time (`Now`) and randomness (a seed, the
/// `RandomSource` port) are inputs, so every decision is a function of
/// what it is given and a test sets both.
#[test]
fn the_domain_reads_no_clock_and_no_global_rng() {
    let files = rust_files(&root().join("domain/src"));
    assert!(files.len() > 50, "found only {} domain files", files.len());
    let mut found = Vec::new();
    for file in files.iter().filter(|f| !is_test_module(f)) {
        let text = std::fs::read_to_string(file).unwrap();
        for (n, line) in production(&text).lines().enumerate() {
            let code = line.split("//").next().unwrap_or_default();
            for word in clock_or_rng_reads(code) {
                found.push(format!(
                    "{}:{}: {word:?} in {:?}",
                    file.display(),
                    n + 1,
                    line.trim()
                ));
            }
        }
    }
    assert!(
        found.is_empty(),
        "the domain reads a clock or a global random number generator (take it as an input):\n{}",
        found.join("\n")
    );
}

/// Whether a file's production code names an actix crate (`actix::`,
/// `actix_web::`, `actix_rt::`, `#[actix…]`), comments aside.
fn uses_actix(text: &str) -> bool {
    production(text).lines().any(|line| {
        let code = line.split("//").next().unwrap_or_default();
        ["actix::", "actix_web::", "actix_rt::", "actix_http::", "#[actix"]
            .iter()
            .any(|w| code.contains(w))
    })
}

/// Whether a file's code is only module declarations (and crate
/// attributes): a crate or module root.
fn only_declares_modules(text: &str) -> bool {
    production(text)
        .lines()
        .map(|line| line.split("//").next().unwrap_or_default().trim())
        .filter(|code| !code.is_empty() && !code.starts_with("#!["))
        .all(|code| {
            let code = code.strip_prefix("pub ").unwrap_or(code);
            code.starts_with("mod ") && code.ends_with(';')
        })
}

#[test]
fn the_actix_check_finds_what_is_planted() {
    assert!(only_declares_modules(
        "//! Docs.\n#![warn(x)]\npub mod a;\nmod b; // why\n"
    ));
    assert!(!only_declares_modules("pub mod a;\nfn helper() {}\n"));
    assert!(!only_declares_modules("pub mod a;\npub use a::Thing;\n"));
    assert!(uses_actix("use actix::prelude::*;\nfn f() {}\n"));
    assert!(uses_actix("pub async fn h(req: actix_web::HttpRequest) {}\n"));
    assert!(!uses_actix("//! Serves with actix::System.\nfn parse() {}\n"));
    assert!(!uses_actix(
        "fn f() {}\n#[cfg(test)]\nmod tests {\n    use actix::prelude::*;\n}\n"
    ));
}

/// `actors/` is the running system's glue: every file of `actors/src/`
/// uses actix (actors, their messages, the actix-web servers, the actix
/// system); what needs no actix lives in the library. The crate root and
/// module roots, which only declare modules, are the files without.
#[test]
fn every_file_of_the_actors_uses_actix() {
    let files = rust_files(&root().join("actors/src"));
    assert!(files.len() > 20, "found only {} files", files.len());
    let without: Vec<String> = files
        .iter()
        .filter(|f| !is_test_module(f))
        .filter(|f| {
            let text = std::fs::read_to_string(f).unwrap();
            !uses_actix(&text) && !only_declares_modules(&text)
        })
        .map(|f| f.strip_prefix(root()).unwrap().display().to_string())
        .collect();
    assert!(
        without.is_empty(),
        "files of actors/src/ that use no actix (move them into the library):\n{}",
        without.join("\n")
    );
}

/// The shared modules at the top of the library (`src/*.rs`) import no
/// adapter: they serve both sides.
#[test]
fn the_shared_modules_import_no_adapter() {
    let modules = modules();
    let in_dir = |dir: &str| -> Vec<String> {
        modules
            .iter()
            .filter(|(_, path)| path.parent() == Some(&root().join(dir)))
            .map(|(name, _)| name.clone())
            .collect()
    };
    let (adapters, shared) = (in_dir("src/adapters"), in_dir("src"));
    assert!(
        adapters.len() >= 6 && !shared.is_empty(),
        "{adapters:?} {shared:?}"
    );
    let imports = module_imports();
    let mut wrong = Vec::new();
    for module in &shared {
        for adapter in imports[module].iter().filter(|m| adapters.contains(m)) {
            wrong.push(format!("{module} imports {adapter}"));
        }
    }
    assert!(
        wrong.is_empty(),
        "the shared modules may not import an adapter:\n{}",
        wrong.join("\n")
    );
}

/// The groups of modules that import each other round a circle (Tarjan's
/// strongly connected components of more than one module), each sorted.
fn import_circles() -> Vec<Vec<String>> {
    let imports = module_imports();
    let names: Vec<&String> = imports.keys().collect();
    let reaches = |from: &String| {
        let mut seen = std::collections::BTreeSet::new();
        let mut todo = vec![from.clone()];
        while let Some(m) = todo.pop() {
            for next in &imports[&m] {
                if seen.insert(next.clone()) {
                    todo.push(next.clone());
                }
            }
        }
        seen
    };
    let reach: std::collections::BTreeMap<&String, _> = names.iter().map(|m| (*m, reaches(m))).collect();
    let mut circles: Vec<Vec<String>> = Vec::new();
    for m in &names {
        let circle: Vec<String> = names
            .iter()
            .filter(|o| reach[*m].contains(**o) && reach[**o].contains(*m))
            .map(|o| (*o).clone())
            .collect();
        if circle.len() > 1 && !circles.contains(&circle) {
            circles.push(circle);
        }
    }
    circles
}

#[test]
fn no_import_circle_forms_between_modules() {
    let imports = module_imports();
    let arrows = |circle: &[String]| {
        circle
            .iter()
            .map(|m| {
                let within: Vec<&String> = imports[m].iter().filter(|o| circle.contains(o)).collect();
                format!("  {m} -> {within:?}")
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    let circles = import_circles();
    assert!(
        circles.is_empty(),
        "modules of src/ import each other round a circle:\n{}",
        circles.iter().map(|c| arrows(c)).collect::<Vec<_>>().join("\n\n")
    );
}

/// The files that decide: pure functions of their inputs and the time
/// they are given. They await nothing, do no I/O and reach no adapter;
/// the code around them observes and acts.
const DECISIONS: [&str; 10] = [
    "domain/src/reconcile/decide.rs",
    "domain/src/reconcile/schedule.rs",
    "domain/src/reconcile/first_status.rs",
    "domain/src/pool/step.rs",
    "domain/src/pool/plan.rs",
    "domain/src/pool/autoscale.rs",
    "domain/src/lease/book.rs",
    "domain/src/health/verdict.rs",
    "domain/src/provider_contract/spec_hash.rs",
    "domain/src/backoff/mod.rs",
];

/// What a decision may not contain: awaiting, I/O, the store port, and
/// any adapter (by its module's path or its name; the compiler refuses
/// these in the domain too, the list says why they are absent).
const NOT_IN_A_DECISION: [&str; 17] = [
    "async ",
    ".await",
    "tokio::",
    "reqwest",
    "kube::",
    "russh",
    "rusqlite",
    "std::fs",
    "std::net::Tcp",
    "std::process",
    "crate::store",
    "crate::adapters",
    "crate::kube_client",
    "crate::providers",
    "crate::stores",
    "crate::probe",
    "crate::leader",
];

#[test]
fn decisions_await_nothing_and_reach_no_adapter() {
    let mut found = Vec::new();
    for file in DECISIONS {
        let text = std::fs::read_to_string(root().join(file)).unwrap();
        for (n, line) in production(&text).lines().enumerate() {
            let code = line.split("//").next().unwrap_or_default();
            for word in NOT_IN_A_DECISION.iter().filter(|w| code.contains(**w)) {
                found.push(format!("{file}:{}: {word:?} in {:?}", n + 1, line.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "a decision reaches outside its inputs:\n{}",
        found.join("\n")
    );
}

/// docs/architecture.md's file map names every file of the crates
/// over 200 lines (test modules aside): a reader finds each large file
/// there, with what it holds.
#[test]
fn the_file_map_names_every_file_over_200_lines() {
    let map = std::fs::read_to_string(root().join("docs/architecture.md")).unwrap();
    let mut missing = Vec::new();
    for dir in ["src", "domain/src", "telemetry/src", "actors/src"] {
        for file in rust_files(&root().join(dir)) {
            let lines = std::fs::read_to_string(&file).unwrap().lines().count();
            let relative = file.strip_prefix(root()).unwrap().to_string_lossy().into_owned();
            if lines > 200 && !is_test_module(&file) && !map.contains(&format!("`{relative}`")) {
                missing.push(format!("{relative} ({lines} lines)"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "docs/architecture.md's file map lacks:\n{}",
        missing.join("\n")
    );
}

/// The running system reaches the kvm provider through one surface, the
/// names `src/adapters/providers/kvm/host/mod.rs` re-exports: a path into
/// any other part of the provider from `actors/src/` is reported (a text
/// scan of the lines outside comments, grouped `providers::{kvm::…}`
/// paths included).
#[test]
fn the_actors_reach_the_kvm_provider_only_through_its_host_surface() {
    let mut wrong = Vec::new();
    for file in rust_files(&root().join("actors/src")) {
        let text = std::fs::read_to_string(&file).unwrap();
        for (n, line) in text.lines().enumerate() {
            if line.trim_start().starts_with("//") {
                continue;
            }
            let deeper = line.match_indices("providers::kvm").any(|(at, _)| {
                let rest = &line[at + "providers::kvm".len()..];
                !(rest.starts_with("::host::") || rest.starts_with("::host;"))
            });
            let grouped = line.contains("providers::{") && line.contains("kvm");
            if deeper || grouped {
                wrong.push(format!("{}:{}: {}", file.display(), n + 1, line.trim()));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "the actors reach past the kvm provider's host surface \
         (providers::kvm::host):\n{}",
        wrong.join("\n")
    );
}
