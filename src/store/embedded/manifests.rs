//! Proxy (and cloud-init Secret) manifests read from a directory — the same
//! YAML as for the API server, several documents per file allowed.
//!
//! A file that fails to parse keeps its previous good contents: a typo must
//! never read as "these proxies were deleted" and tear instances down.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};

use data_encoding::BASE64;
use serde_json::Value;

use serde::de::DeserializeOwned;
use sha2::{Digest, Sha256};

use crate::resource::{API_GROUP, MAX_POOL_NAME_LEN, Proxy, ProxyPool};
use crate::store::{ObjectKey, pool_key};

/// API version of Proxy documents.
const PROXY_API_VERSION: &str = "crawl.example.com/v1alpha1";

/// A Secret document (cloud-init, External proxy credentials).
#[derive(Clone, PartialEq, Eq)]
pub struct SecretDoc {
    pub key: ObjectKey,
    pub labels: BTreeMap<String, String>,
    pub data: BTreeMap<String, Vec<u8>>,
}

// Secret data is never printed: only which keys it has.
impl std::fmt::Debug for SecretDoc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecretDoc")
            .field("key", &self.key)
            .field("labels", &self.labels)
            .field("data_keys", &self.data.keys().collect::<Vec<_>>())
            .finish()
    }
}

/// One document of a manifest file.
#[derive(Clone, Debug, PartialEq)]
pub enum Document {
    Proxy(Box<Proxy>),
    Pool(Box<ProxyPool>),
    Secret(SecretDoc),
}

impl Document {
    /// Its kind and key: two documents of one kind and key are one object.
    fn identity(&self) -> (&'static str, ObjectKey) {
        match self {
            Document::Proxy(p) => ("Proxy", ObjectKey::of(p)),
            Document::Pool(p) => ("ProxyPool", pool_key(p)),
            Document::Secret(s) => ("Secret", s.key.clone()),
        }
    }
}

/// Everything the directory currently declares.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ManifestSet {
    pub proxies: BTreeMap<ObjectKey, Proxy>,
    pub pools: BTreeMap<ObjectKey, ProxyPool>,
    pub secrets: BTreeMap<ObjectKey, SecretDoc>,
    /// Problems found, each naming its file.
    pub problems: Vec<String>,
}

/// The largest manifest file read (bigger ones are reported and skipped).
pub const MAX_FILE_BYTES: u64 = 64 * 1024 * 1024;
/// The most documents one file may hold (a generated fleet of tens of
/// thousands fits; a document-separator storm does not).
pub const MAX_DOCUMENTS: usize = 100_000;

#[derive(Debug)]
struct FileState {
    /// SHA-256 of the content: enough to see a change, without keeping a copy.
    digest: [u8; 32],
    /// Last good parse (empty if the file never parsed).
    docs: Vec<Document>,
    error: Option<String>,
}

/// The watched manifest directory with the last good parse of each file.
#[derive(Debug)]
pub struct ManifestDir {
    dir: PathBuf,
    files: BTreeMap<PathBuf, FileState>,
}

impl ManifestDir {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            files: BTreeMap::new(),
        }
    }

    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// Re-reads the directory; returns whether anything changed.
    pub fn scan(&mut self) -> std::io::Result<bool> {
        let mut seen = HashSet::new();
        let mut changed = false;
        for entry in std::fs::read_dir(&self.dir)? {
            let path = entry?.path();
            let is_yaml = path.extension().is_some_and(|e| e == "yaml" || e == "yml");
            if !is_yaml || !path.is_file() {
                continue;
            }
            // A file that vanished between listing and reading is handled on the next scan.
            let Ok(content) = read_bounded(&path) else {
                continue;
            };
            seen.insert(path.clone());
            let digest: [u8; 32] = match &content {
                Ok(text) => Sha256::digest(text.as_bytes()).into(),
                Err(too_big) => Sha256::digest(too_big.as_bytes()).into(),
            };
            if self.files.get(&path).is_some_and(|f| f.digest == digest) {
                continue;
            }
            changed = true;
            let previous = self.files.remove(&path).map(|f| f.docs).unwrap_or_default();
            let parsed = match &content {
                Ok(text) => parse_file(text),
                Err(too_big) => Err(too_big.clone()),
            };
            let state = match parsed {
                Ok(docs) => FileState {
                    digest,
                    docs,
                    error: None,
                },
                Err(error) => FileState {
                    digest,
                    docs: previous,
                    error: Some(error),
                },
            };
            self.files.insert(path, state);
        }
        let before = self.files.len();
        self.files.retain(|path, _| seen.contains(path));
        Ok(changed || self.files.len() != before)
    }

    /// The merged declaration; later duplicates of a namespace/name are reported and ignored.
    pub fn current(&self) -> ManifestSet {
        let mut set = ManifestSet::default();
        let mut origin: BTreeMap<(&'static str, ObjectKey), &Path> = BTreeMap::new();
        for (path, file) in &self.files {
            if let Some(error) = &file.error {
                let kept = if file.docs.is_empty() {
                    "ignored"
                } else {
                    "its previous contents stay in effect"
                };
                set.problems.push(format!("{}: {error} ({kept})", path.display()));
            }
            for doc in &file.docs {
                let (kind, key) = doc.identity();
                if let Some(first) = origin.get(&(kind, key.clone())) {
                    set.problems.push(format!(
                        "{}: {kind} {key} is already defined in {}; this copy is ignored",
                        path.display(),
                        first.display()
                    ));
                    continue;
                }
                origin.insert((kind, key.clone()), path);
                match doc {
                    Document::Proxy(p) => {
                        set.proxies.insert(key, (**p).clone());
                    }
                    Document::Pool(p) => {
                        set.pools.insert(key, (**p).clone());
                    }
                    Document::Secret(s) => {
                        set.secrets.insert(key, s.clone());
                    }
                }
            }
        }
        set
    }
}

/// A file's text, or why it is not read (too large: its size, so a file
/// that stays too large is not reported anew at every scan).
fn read_bounded(path: &Path) -> std::io::Result<Result<String, String>> {
    let size = std::fs::metadata(path)?.len();
    if size > MAX_FILE_BYTES {
        return Ok(Err(format!(
            "{size} bytes, more than the {MAX_FILE_BYTES} a manifest file may hold; split it"
        )));
    }
    std::fs::read_to_string(path).map(Ok)
}

/// Parses every document of a file; any error rejects the whole file.
pub fn parse_file(content: &str) -> Result<Vec<Document>, String> {
    // Without the excerpt the parser would quote: the lines around an error
    // may be a Secret's, and this message is logged. Line and column say where.
    // The parser's default budget (1,024 documents, 250,000 nodes) is for
    // configuration files; a fleet's manifest is one document per proxy.
    let options = serde_saphyr::options! {
        with_snippet: false,
        budget: serde_saphyr::budget! {
            max_documents: MAX_DOCUMENTS,
            max_nodes: MAX_DOCUMENTS * 100,
            max_events: MAX_DOCUMENTS * 200,
        },
    };
    let values: Vec<Value> = serde_saphyr::from_multiple_with_options(content, options)
        .map_err(|e| format!("not valid YAML: {e}"))?;
    let mut docs = Vec::new();
    let mut keys = HashSet::new();
    for (i, value) in values.into_iter().enumerate() {
        if value.is_null() {
            continue;
        }
        let doc = parse_document(value).map_err(|e| format!("document {}: {e}", i + 1))?;
        let (kind, key) = doc.identity();
        if !keys.insert((kind, key.clone())) {
            return Err(format!(
                "document {}: {kind} {key} appears twice in this file",
                i + 1
            ));
        }
        docs.push(doc);
    }
    Ok(docs)
}

fn parse_document(value: Value) -> Result<Document, String> {
    let kind = value
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let api_version = value
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    match (kind.as_str(), api_version.as_str()) {
        ("Proxy", PROXY_API_VERSION) => parse_proxy(value).map(|p| Document::Proxy(Box::new(p))),
        ("Proxy", other) => Err(format!("Proxy apiVersion {other:?} is not {PROXY_API_VERSION:?}")),
        ("ProxyPool", PROXY_API_VERSION) => parse_pool(value).map(|p| Document::Pool(Box::new(p))),
        ("ProxyPool", other) => Err(format!(
            "ProxyPool apiVersion {other:?} is not {PROXY_API_VERSION:?}"
        )),
        ("Secret", "v1") => parse_secret(value).map(Document::Secret),
        ("", _) => Err("missing kind (expected Proxy, ProxyPool or Secret)".into()),
        (other, _) => Err(format!(
            "kind {other:?} is not supported here (Proxy or ProxyPool of {API_GROUP}, or a v1 Secret)"
        )),
    }
}

fn parse_proxy(value: Value) -> Result<Proxy, String> {
    let (mut proxy, namespace): (Proxy, String) = parse_object("Proxy", value)?;
    proxy.metadata.namespace = Some(namespace);
    proxy.spec.validate().map_err(|problems| problems.join("; "))?;
    Ok(proxy)
}

fn parse_pool(value: Value) -> Result<ProxyPool, String> {
    let (mut pool, namespace): (ProxyPool, String) = parse_object("ProxyPool", value)?;
    let name = pool.metadata.name.as_deref().unwrap_or_default();
    if name.len() > MAX_POOL_NAME_LEN || name.contains('.') {
        return Err(format!(
            "ProxyPool metadata.name {name:?} must be a DNS label of at most {MAX_POOL_NAME_LEN} characters \
             (its proxies are named <pool>-<5 characters>)"
        ));
    }
    pool.metadata.namespace = Some(namespace);
    pool.spec.validate().map_err(|problems| problems.join("; "))?;
    Ok(pool)
}

/// A namespaced object of `kind` with only the metadata a user owns (the
/// store owns the rest), and its namespace (`default` when unset).
fn parse_object<T: DeserializeOwned>(kind: &str, mut value: Value) -> Result<(T, String), String> {
    let name = value
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if name.is_empty() {
        return Err(format!("{kind} metadata.name is required"));
    }
    if !is_dns_subdomain(name) {
        return Err(format!(
            "{kind} metadata.name {name:?} must be a DNS subdomain (lowercase a-z, 0-9, '-', '.')"
        ));
    }
    let namespace = value
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or("default")
        .to_owned();
    if !is_dns_subdomain(&namespace) {
        return Err(format!(
            "{kind} metadata.namespace {namespace:?} must be a DNS label"
        ));
    }
    if let Some(meta) = value.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.retain(|k, _| matches!(k.as_str(), "name" | "namespace" | "labels" | "annotations"));
    }
    if let Some(obj) = value.as_object_mut() {
        obj.remove("status");
    }
    let object = serde_path_to_error::deserialize(value).map_err(|e| match e.path().to_string() {
        p if p == "." => e.into_inner().to_string(),
        p => format!("{p}: {}", e.into_inner()),
    })?;
    Ok((object, namespace))
}

fn parse_secret(value: Value) -> Result<SecretDoc, String> {
    let name = value
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if name.is_empty() {
        return Err("Secret metadata.name is required".into());
    }
    let namespace = value
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or("default");
    let labels = match value.pointer("/metadata/labels") {
        None | Some(Value::Null) => BTreeMap::new(),
        Some(v) => serde_json::from_value(v.clone()).map_err(|e| format!("metadata.labels: {e}"))?,
    };
    let mut data = BTreeMap::new();
    if let Some(encoded) = value.get("data").and_then(Value::as_object) {
        for (k, v) in encoded {
            let text = v
                .as_str()
                .ok_or_else(|| format!("data.{k} must be a base64 string"))?;
            let bytes = BASE64
                .decode(text.trim().as_bytes())
                .map_err(|e| format!("data.{k} is not valid base64: {e}"))?;
            data.insert(k.clone(), bytes);
        }
    }
    if let Some(plain) = value.get("stringData").and_then(Value::as_object) {
        for (k, v) in plain {
            let text = v
                .as_str()
                .ok_or_else(|| format!("stringData.{k} must be a string"))?;
            data.insert(k.clone(), text.as_bytes().to_vec());
        }
    }
    Ok(SecretDoc {
        key: ObjectKey::new(namespace, name),
        labels,
        data,
    })
}

/// Kubernetes object-name rule (RFC 1123 subdomain).
fn is_dns_subdomain(s: &str) -> bool {
    (1..=253).contains(&s.len())
        && s.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && s.ends_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resource::Mode;

    const TWO: &str = "\
apiVersion: crawl.example.com/v1alpha1
kind: Proxy
metadata: {name: a}
spec: {mode: Managed, provider: local}
---
apiVersion: crawl.example.com/v1alpha1
kind: Proxy
metadata: {name: b, namespace: crawl, uid: ignored}
spec: {mode: External, endpoint: {host: 127.0.0.1, port: 3128}}
status: {phase: Ready}
---
apiVersion: v1
kind: Secret
metadata: {name: ci, labels: {crawl.example.com/cloud-init: \"true\"}}
stringData: {user-data: \"#cloud-config\\n\"}
data: {other: aGVsbG8=}
";

    #[test]
    fn a_generated_fleet_of_ten_thousand_documents_parses_and_a_separator_storm_does_not() {
        let fleet: Vec<String> = (0..10_000)
            .map(|i| {
                format!(
                    "apiVersion: crawl.example.com/v1alpha1\nkind: Proxy\nmetadata: {{name: p{i}, namespace: fleet}}\n\
                     spec: {{mode: External, endpoint: {{host: 127.0.0.1, port: 3128}}, attributes: {{site: s{i}}}, \
                     healthCheck: {{url: \"http://127.0.0.1:9/\", interval: 1s, timeout: 5s}}}}\n"
                )
            })
            .collect();
        assert_eq!(parse_file(&fleet.join("---\n")).unwrap().len(), 10_000);
        let storm = "---\n".repeat(MAX_DOCUMENTS + 1);
        let err = parse_file(&storm).unwrap_err();
        assert!(
            err.contains("not valid YAML") && err.contains("document"),
            "{err}"
        );
    }

    #[test]
    fn a_file_too_large_is_refused_by_its_size_unread() {
        let dir = tempfile::tempdir().unwrap();
        let good = dir.path().join("a.yaml");
        std::fs::write(&good, TWO).unwrap();
        // Sparse: the size is there, the bytes are not (nothing is read).
        let big = dir.path().join("big.yaml");
        std::fs::File::create(&big)
            .unwrap()
            .set_len(MAX_FILE_BYTES + 1)
            .unwrap();
        let mut manifests = ManifestDir::new(dir.path());
        assert!(manifests.scan().unwrap());
        let set = manifests.current();
        assert_eq!(set.proxies.len(), 2, "the other file is read");
        assert_eq!(set.problems.len(), 1, "{:?}", set.problems);
        assert!(
            set.problems[0].contains("big.yaml") && set.problems[0].contains("67108865 bytes"),
            "{:?}",
            set.problems
        );
        assert!(
            !manifests.scan().unwrap(),
            "unchanged: not reported as a change again"
        );
    }

    #[test]
    fn parses_proxies_and_secrets_with_defaults() {
        let docs = parse_file(TWO).unwrap();
        assert_eq!(docs.len(), 3);
        let Document::Proxy(a) = &docs[0] else { panic!() };
        assert_eq!(ObjectKey::of(a), ObjectKey::new("default", "a"));
        assert_eq!(a.spec.port, 3128);
        let Document::Proxy(b) = &docs[1] else { panic!() };
        assert_eq!(b.spec.mode, Mode::External);
        assert_eq!(b.metadata.uid, None, "uid is the store's, not the manifest's");
        assert_eq!(b.status, None, "status is the store's");
        let Document::Secret(s) = &docs[2] else { panic!() };
        assert_eq!(s.data["user-data"], b"#cloud-config\n");
        assert_eq!(s.data["other"], b"hello");
    }

    #[test]
    fn rejects_bad_documents_with_a_reason() {
        let cases = [
            (
                "kind: Proxy\napiVersion: crawl.example.com/v1\nmetadata: {name: a}\nspec: {mode: Managed}",
                "document 1: Proxy apiVersion \"crawl.example.com/v1\" is not \"crawl.example.com/v1alpha1\"",
            ),
            (
                "kind: Deployment\napiVersion: apps/v1\nmetadata: {name: a}",
                "document 1: kind \"Deployment\" is not supported here",
            ),
            (
                "kind: Proxy\napiVersion: crawl.example.com/v1alpha1\nmetadata: {name: a}\nspec: {mode: External}",
                "document 1: endpoint is required when mode is External",
            ),
            (
                "kind: Proxy\napiVersion: crawl.example.com/v1alpha1\nmetadata: {name: a}\n\
                 spec: {mode: Managed, provider: p, healthCheck: {interval: 1ms, timeout: 1m}}",
                "document 1: healthCheck.interval must be between 1s and 24h (got \"1ms\"); \
                 healthCheck.timeout must be between 1ms and 30s (got \"1m\")",
            ),
            (
                "kind: Proxy\napiVersion: crawl.example.com/v1alpha1\nmetadata: {name: A_1}\nspec: {mode: External}",
                "document 1: Proxy metadata.name \"A_1\" must be a DNS subdomain",
            ),
            (
                "kind: Proxy\napiVersion: crawl.example.com/v1alpha1\nmetadata: {name: a}\nspec: {mode: Managed, provider: p, port: x}",
                "document 1: spec.port: invalid type",
            ),
            (
                "apiVersion: crawl.example.com/v1alpha1\nkind: Proxy\nmetadata: {name: a}\nspec: {mode: Managed, provider: p}\n---\n\
              apiVersion: crawl.example.com/v1alpha1\nkind: Proxy\nmetadata: {name: a}\nspec: {mode: Managed, provider: q}",
                "document 2: Proxy default/a appears twice in this file",
            ),
            ("a: [", "not valid YAML"),
        ];
        for (yaml, expected) in cases {
            let err = parse_file(yaml).unwrap_err();
            assert!(err.starts_with(expected), "{yaml}\n => {err}");
        }
    }

    #[test]
    fn a_yaml_error_says_where_without_quoting_the_file() {
        // A broken Secret: the message is logged, its lines must not be.
        let yaml = "apiVersion: v1\nkind: Secret\nmetadata: {name: ci}\nstringData:\n  user-data: |\n    \
                    password: hunter2-secret\n  oops: [tail-of-the-file\n";
        let err = parse_file(yaml).unwrap_err();
        assert!(err.starts_with("not valid YAML"), "{err}");
        assert!(err.contains("line 7"), "says where: {err}");
        assert!(
            !err.contains("hunter2") && !err.contains("tail-of-the-file"),
            "quotes nothing: {err}"
        );
    }

    #[test]
    fn a_broken_edit_keeps_the_last_good_contents_and_duplicates_across_files_are_reported() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a.yaml");
        std::fs::write(&file, TWO).unwrap();
        let mut m = ManifestDir::new(dir.path());
        assert!(m.scan().unwrap());
        assert!(!m.scan().unwrap(), "no change, no rescan result");
        assert_eq!(m.current().proxies.len(), 2);

        std::fs::write(&file, "apiVersion: [").unwrap();
        assert!(m.scan().unwrap());
        let set = m.current();
        assert_eq!(set.proxies.len(), 2, "previous contents stay in effect");
        assert_eq!(set.problems.len(), 1);
        assert!(
            set.problems[0].contains("previous contents stay in effect"),
            "{:?}",
            set.problems
        );

        std::fs::write(&file, TWO).unwrap();
        std::fs::write(
            dir.path().join("b.yml"),
            "apiVersion: crawl.example.com/v1alpha1\nkind: Proxy\nmetadata: {name: a}\nspec: {mode: Managed, provider: other}\n",
        )
        .unwrap();
        std::fs::write(dir.path().join("notes.txt"), "not a manifest").unwrap();
        assert!(m.scan().unwrap());
        let set = m.current();
        assert_eq!(
            set.proxies[&ObjectKey::new("default", "a")]
                .spec
                .provider
                .as_deref(),
            Some("local")
        );
        assert_eq!(set.problems.len(), 1);
        assert!(
            set.problems[0].contains("Proxy default/a is already defined in"),
            "{:?}",
            set.problems
        );

        std::fs::remove_file(&file).unwrap();
        assert!(m.scan().unwrap());
        let set = m.current();
        assert_eq!(set.proxies.len(), 1);
        assert_eq!(
            set.proxies[&ObjectKey::new("default", "a")]
                .spec
                .provider
                .as_deref(),
            Some("other")
        );
    }
}
