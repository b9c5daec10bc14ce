//! Proxy (and cloud-init Secret) manifests read from a directory — the same
//! YAML as for the API server, several documents per file allowed.
//!
//! A file that fails to parse keeps its previous good contents in effect: a
//! typo must never read as "these proxies were deleted" and tear instances
//! down. What a file declared is remembered by key only; the objects stay as
//! the store holds them until the file parses again.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::{Path, PathBuf};

use data_encoding::BASE64;
use serde_json::Value;

use serde::de::DeserializeOwned;
use sha2::{Digest, Sha256};

use crate::domain::resource::ObjectKey;
use crate::domain::resource::{API_GROUP, MAX_POOL_NAME_LEN, Proxy, ProxyPool};
use crate::domain::resource_store::pool_key;

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

/// A document's kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Kind {
    Proxy,
    ProxyPool,
    Secret,
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // As written in `kind:`.
        std::fmt::Debug::fmt(self, f)
    }
}

impl Document {
    /// Its kind and key: two documents of one kind and key are one object.
    fn identity(&self) -> (Kind, ObjectKey) {
        match self {
            Document::Proxy(p) => (Kind::Proxy, ObjectKey::of(p)),
            Document::Pool(p) => (Kind::ProxyPool, pool_key(p)),
            Document::Secret(s) => (Kind::Secret, s.key.clone()),
        }
    }
}

/// Everything the directory currently declares.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ManifestSet {
    pub proxies: BTreeMap<ObjectKey, Proxy>,
    pub pools: BTreeMap<ObjectKey, ProxyPool>,
    pub secrets: BTreeMap<ObjectKey, SecretDoc>,
    /// Declared by files that no longer parse: kept as they are stored.
    pub held: Held,
    /// Problems found, each naming its file.
    pub problems: Vec<String>,
}

/// Objects a broken file declared at its last good parse, by kind.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Held {
    pub proxies: BTreeSet<ObjectKey>,
    pub pools: BTreeSet<ObjectKey>,
    pub secrets: BTreeSet<ObjectKey>,
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
    /// The kinds and keys its last good parse declared (empty if it never
    /// parsed). The documents themselves are not kept: the store holds what
    /// was applied, so a file that breaks holds these as they are stored.
    declared: Vec<(Kind, ObjectKey)>,
}

/// The watched manifest directory: per file, what it last declared.
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

    /// Re-reads the directory. When any file changed (or `force`), every
    /// file is parsed again, one at a time, and the merged declaration is
    /// returned; otherwise `None`. Parses are not kept between scans: a
    /// fleet's documents live in the store only.
    pub fn scan(&mut self, force: bool) -> std::io::Result<Option<ManifestSet>> {
        let paths = self.yaml_files()?;
        let changed = paths.len() != self.files.len()
            || paths.iter().any(|path| {
                // A file that vanished between listing and reading is handled on the next scan.
                let digest = read_bounded(path).ok().map(|content| digest_of(&content));
                self.files.get(path).map(|f| f.digest) != digest
            });
        if !changed && !force {
            return Ok(None);
        }
        let mut files = BTreeMap::new();
        let mut set = ManifestSet::default();
        let mut origin: BTreeMap<(Kind, ObjectKey), PathBuf> = BTreeMap::new();
        for path in paths {
            let Ok(content) = read_bounded(&path) else {
                continue;
            };
            let digest = digest_of(&content);
            let parsed = content.and_then(|text| parse_file(&text));
            let previous = self.files.remove(&path).map(|f| f.declared).unwrap_or_default();
            let state = match parsed {
                Ok(docs) => {
                    let declared = docs.iter().map(Document::identity).collect();
                    for doc in docs {
                        set.declare(&path, doc, &mut origin);
                    }
                    FileState { digest, declared }
                }
                Err(error) => {
                    let kept = if previous.is_empty() {
                        "ignored"
                    } else {
                        "its previous contents stay in effect"
                    };
                    set.problems.push(format!("{}: {error} ({kept})", path.display()));
                    for identity in &previous {
                        set.hold(&path, identity.clone(), &mut origin);
                    }
                    FileState {
                        digest,
                        declared: previous,
                    }
                }
            };
            files.insert(path, state);
        }
        self.files = files;
        Ok(Some(set))
    }

    /// The directory's manifest files, in name order (the order duplicates are judged in).
    fn yaml_files(&self) -> std::io::Result<Vec<PathBuf>> {
        let mut paths = Vec::new();
        for entry in std::fs::read_dir(&self.dir)? {
            let path = entry?.path();
            let is_yaml = path.extension().is_some_and(|e| e == "yaml" || e == "yml");
            if is_yaml && path.is_file() {
                paths.push(path);
            }
        }
        paths.sort();
        Ok(paths)
    }
}

fn digest_of(content: &Result<String, String>) -> [u8; 32] {
    match content {
        Ok(text) => Sha256::digest(text.as_bytes()).into(),
        Err(too_big) => Sha256::digest(too_big.as_bytes()).into(),
    }
}

impl ManifestSet {
    /// Adds a document from `path`, unless an earlier file declared its
    /// kind and key (then it is reported and ignored).
    fn declare(&mut self, path: &Path, doc: Document, origin: &mut BTreeMap<(Kind, ObjectKey), PathBuf>) {
        let (kind, key) = doc.identity();
        if !self.claim(path, kind, &key, origin) {
            return;
        }
        match doc {
            Document::Proxy(p) => {
                self.proxies.insert(key, *p);
            }
            Document::Pool(p) => {
                self.pools.insert(key, *p);
            }
            Document::Secret(s) => {
                self.secrets.insert(key, s);
            }
        }
    }

    /// Holds an object a broken file at `path` declared.
    fn hold(
        &mut self,
        path: &Path,
        (kind, key): (Kind, ObjectKey),
        origin: &mut BTreeMap<(Kind, ObjectKey), PathBuf>,
    ) {
        if !self.claim(path, kind, &key, origin) {
            return;
        }
        match kind {
            Kind::Proxy => self.held.proxies.insert(key),
            Kind::ProxyPool => self.held.pools.insert(key),
            Kind::Secret => self.held.secrets.insert(key),
        };
    }

    /// Whether `path` is the first file to declare this kind and key.
    fn claim(
        &mut self,
        path: &Path,
        kind: Kind,
        key: &ObjectKey,
        origin: &mut BTreeMap<(Kind, ObjectKey), PathBuf>,
    ) -> bool {
        if let Some(first) = origin.get(&(kind, key.clone())) {
            self.problems.push(format!(
                "{}: {kind} {key} is already defined in {}; this copy is ignored",
                path.display(),
                first.display()
            ));
            return false;
        }
        origin.insert((kind, key.clone()), path.to_owned());
        true
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
    use crate::domain::resource::Mode;

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
        let set = manifests.scan(false).unwrap().expect("a change");
        assert_eq!(set.proxies.len(), 2, "the other file is read");
        assert_eq!(set.problems.len(), 1, "{:?}", set.problems);
        assert!(
            set.problems[0].contains("big.yaml") && set.problems[0].contains("67108865 bytes"),
            "{:?}",
            set.problems
        );
        assert!(
            manifests.scan(false).unwrap().is_none(),
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
        assert_eq!(m.scan(false).unwrap().expect("a change").proxies.len(), 2);
        assert!(m.scan(false).unwrap().is_none(), "no change, no rescan result");
        assert_eq!(m.scan(true).unwrap().expect("forced").proxies.len(), 2);

        std::fs::write(&file, "apiVersion: [").unwrap();
        let set = m.scan(false).unwrap().expect("a change");
        assert!(set.proxies.is_empty() && set.secrets.is_empty(), "{set:?}");
        assert_eq!(
            set.held,
            Held {
                proxies: BTreeSet::from([ObjectKey::new("default", "a"), ObjectKey::new("crawl", "b")]),
                pools: BTreeSet::new(),
                secrets: BTreeSet::from([ObjectKey::new("default", "ci")]),
            },
            "what it declared stays as stored"
        );
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
        let set = m.scan(false).unwrap().expect("a change");
        assert_eq!(set.held, Held::default(), "parses again");
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

        // The first definer gone, the copy in the unchanged file takes effect.
        std::fs::remove_file(&file).unwrap();
        let set = m.scan(false).unwrap().expect("a change");
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
