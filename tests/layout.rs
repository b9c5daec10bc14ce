//! The layout the docs describe still holds: each provider depends on the
//! shared provider types only (never on the registry, the decorators the
//! registry wraps it in, or another provider), and every source path
//! docs/ names exists.

use std::path::{Path, PathBuf};

/// The providers, each a file or a directory under `src/provider/`.
const PROVIDERS: [&str; 4] = ["gcp", "kubernetes", "kvm", "local"];

/// Items only the registry side of `src/provider/` may name.
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
    let dir = root().join("src/provider").join(provider);
    if dir.is_dir() {
        dir
    } else {
        root().join(format!("src/provider/{provider}.rs"))
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
                    if line.contains(&format!("provider::{other}")) {
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

/// Backticked spans in `text` that name a path into `src/` or `actors/`
/// (patterns with `…`, `*` or `<…>` in them name no one file).
fn source_paths(text: &str) -> Vec<&str> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .filter(|span| span.starts_with("src/") || span.starts_with("actors/"))
        .filter(|span| !span.contains(|c: char| c.is_whitespace() || "…*<".contains(c)))
        .collect()
}

#[test]
fn every_source_path_the_docs_name_exists() {
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.push(root().join("README.md"));
    let mut missing = Vec::new();
    let mut named = 0;
    for doc in &docs {
        let text = std::fs::read_to_string(doc).unwrap();
        for path in source_paths(&text) {
            named += 1;
            if !root().join(path).exists() {
                missing.push(format!("{}: `{path}`", doc.display()));
            }
        }
    }
    assert!(
        named > 20,
        "the docs name only {named} source paths: is the check reading them?"
    );
    assert!(
        missing.is_empty(),
        "docs name paths that do not exist:\n{}",
        missing.join("\n")
    );
}

#[test]
fn source_paths_are_found_between_backticks() {
    let text = "see `src/a.rs` and `actors/src/b/` but not `src/a b`, `src/…`, `other/x.rs` or src/c.rs";
    assert_eq!(source_paths(text), ["src/a.rs", "actors/src/b/"]);
}
