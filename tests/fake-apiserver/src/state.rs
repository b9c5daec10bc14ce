//! The object store with Kubernetes semantics.

use std::collections::{BTreeMap, VecDeque};

use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::kinds::KINDS;
use crate::selector::Selector;

/// An API error, rendered as a `Status`.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
}

impl ApiError {
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason,
            message: message.into(),
        }
    }

    pub fn status(&self) -> Value {
        json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {},
            "status": "Failure", "message": self.message, "reason": self.reason, "code": self.code
        })
    }
}

type Key = (usize, String, String);

#[derive(Clone, Debug)]
struct Event {
    rv: u64,
    kind: usize,
    type_: &'static str,
    object: Value,
}

/// Who watches what.
pub struct Watcher {
    pub kind: usize,
    pub namespace: Option<String>,
    pub labels: Selector,
    pub fields: Vec<(String, String)>,
    pub tx: mpsc::UnboundedSender<Value>,
}

/// A validating admission webhook that denies every write (create,
/// update, patch, delete) of the objects it matches.
#[derive(Clone, Debug)]
pub struct Denial {
    /// The webhook's name, as the error names it.
    pub webhook: String,
    /// The resource's plural (`configmaps`).
    pub resource: String,
    /// Objects whose name starts with this.
    pub name_prefix: String,
    pub message: String,
}

/// Everything the server holds.
pub struct State {
    rv: u64,
    objects: BTreeMap<Key, Value>,
    history: VecDeque<Event>,
    /// Events kept for watch resumption; older versions answer 410 Gone.
    pub history_limit: usize,
    watchers: Vec<Watcher>,
    /// The field manager of the write being made: the request's
    /// `fieldManager`, else its User-Agent up to the first `/` (set per request).
    pub manager: String,
    denials: Vec<Denial>,
    /// A whole cluster's rules (see [`State::cluster`]); off, any namespace
    /// may be used without creating it and custom kinds are always served.
    cluster: bool,
}

impl Default for State {
    fn default() -> Self {
        Self {
            rv: 1,
            objects: BTreeMap::new(),
            history: VecDeque::new(),
            history_limit: 1000,
            watchers: Vec::new(),
            manager: "unknown".to_owned(),
            denials: Vec::new(),
            cluster: false,
        }
    }
}

/// Metadata the server owns (or that names the object): never part of what
/// a manager changed.
const SERVER_OWNED: [&str; 8] = [
    "name",
    "namespace",
    "resourceVersion",
    "managedFields",
    "uid",
    "creationTimestamp",
    "generation",
    "deletionTimestamp",
];

/// The fields `after` sets differently from `before`, as a FieldsV1 set
/// (`{"f:metadata":{"f:labels":{"f:team":{}}}}`); None when nothing differs.
fn changed_fields(before: &Value, after: &Value, top: bool) -> Option<Value> {
    match (before, after) {
        (Value::Object(b), Value::Object(a)) => {
            let mut out = serde_json::Map::new();
            for (key, value) in a {
                if top && matches!(key.as_str(), "apiVersion" | "kind") {
                    continue;
                }
                let changed = match b.get(key) {
                    _ if key == "metadata" && top => {
                        let mut old = b.get(key).cloned().unwrap_or(json!({}));
                        let mut new = value.clone();
                        for field in SERVER_OWNED {
                            old.as_object_mut().map(|o| o.remove(field));
                            new.as_object_mut().map(|o| o.remove(field));
                        }
                        changed_fields(&old, &new, false)
                    }
                    Some(old) if old == value => None,
                    Some(old) => changed_fields(old, value, false),
                    None if value.is_object() => changed_fields(&json!({}), value, false).or(Some(json!({}))),
                    None => Some(json!({})),
                };
                if let Some(c) = changed {
                    out.insert(format!("f:{key}"), c);
                }
            }
            (!out.is_empty()).then_some(Value::Object(out))
        }
        (b, a) if b == a => None,
        _ => Some(json!({})),
    }
}

/// Deep union of two FieldsV1 sets.
fn union(into: &mut Value, more: &Value) {
    if let (Some(into), Some(more)) = (into.as_object_mut(), more.as_object()) {
        for (key, value) in more {
            union(into.entry(key.clone()).or_insert_with(|| json!({})), value);
        }
    }
}

fn meta(obj: &Value) -> &Value {
    &obj["metadata"]
}

fn labels(obj: &Value) -> BTreeMap<String, String> {
    serde_json::from_value(meta(obj)["labels"].clone()).unwrap_or_default()
}

/// Whether the object is being deleted (has a deletionTimestamp).
fn deleting(obj: &Value) -> bool {
    meta(obj).get("deletionTimestamp").is_some_and(|d| !d.is_null())
}

fn finalizers(obj: &Value) -> Vec<String> {
    serde_json::from_value(meta(obj)["finalizers"].clone()).unwrap_or_default()
}

/// Everything but metadata and status: what `generation` tracks.
fn spec_part(obj: &Value) -> Value {
    let mut v = obj.clone();
    if let Some(map) = v.as_object_mut() {
        map.remove("metadata");
        map.remove("status");
        map.remove("apiVersion");
        map.remove("kind");
    }
    v
}

fn now() -> String {
    jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

fn field_matches(obj: &Value, fields: &[(String, String)]) -> bool {
    fields.iter().all(|(path, want)| match path.as_str() {
        "metadata.name" => meta(obj)["name"].as_str() == Some(want),
        "metadata.namespace" => meta(obj)["namespace"].as_str() == Some(want),
        _ => false,
    })
}

/// Parses `metadata.name=x,metadata.namespace=y`.
pub fn parse_fields(text: &str) -> Result<Vec<(String, String)>, ApiError> {
    text.split(',')
        .filter(|p| !p.trim().is_empty())
        .map(|p| {
            let (k, v) = p
                .split_once("==")
                .or_else(|| p.split_once('='))
                .ok_or_else(|| ApiError::new(400, "BadRequest", format!("invalid field selector {p:?}")))?;
            match k.trim() {
                "metadata.name" | "metadata.namespace" => Ok((k.trim().to_owned(), v.trim().to_owned())),
                other => Err(ApiError::new(
                    400,
                    "BadRequest",
                    format!("field label not supported: {other}"),
                )),
            }
        })
        .collect()
}

/// The namespaces every cluster starts with.
const INITIAL_NAMESPACES: [&str; 4] = ["default", "kube-system", "kube-public", "kube-node-lease"];

/// The namespace finalizer the API server holds while it empties one.
const NAMESPACE_FINALIZER: &str = "kubernetes";

impl State {
    /// A state with a cluster's rules, as a real API server has them:
    /// - the namespaces `default`, `kube-system`, `kube-public` and
    ///   `kube-node-lease` exist;
    /// - an object can only be created in a namespace that exists (`404
    ///   namespaces "x" not found`) and is not being deleted (`403`), as the
    ///   NamespaceLifecycle admission plugin does;
    /// - deleting a namespace marks it `Terminating`; soon after, the
    ///   namespace controller's pass ([`State::empty_terminating_namespaces`],
    ///   run by the server half a second after the delete and then every
    ///   half second while any namespace terminates) deletes everything in
    ///   it (finalizers hold objects as usual); the namespace goes once it is
    ///   empty;
    /// - a custom kind is served only while its CustomResourceDefinition
    ///   exists (before, its paths answer `404` and discovery omits it);
    ///   deleting the CRD deletes its objects.
    pub fn cluster() -> Self {
        let mut state = Self {
            cluster: true,
            ..Self::default()
        };
        let kind = crate::kinds::find("", "v1", "namespaces").expect("namespaces are served");
        for name in INITIAL_NAMESPACES {
            let namespace = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}});
            state
                .create(kind, "", namespace)
                .expect("a fresh state takes its namespaces");
        }
        state
    }

    /// Whether the kind at `kind` is served now (custom kinds in a cluster:
    /// only while their CRD exists).
    pub fn serves(&self, kind: usize) -> bool {
        !self.cluster || !KINDS[kind].custom || self.crd(&KINDS[kind]).is_some()
    }

    /// The CRD defining a custom kind, when it exists.
    fn crd(&self, k: &crate::kinds::Kind) -> Option<&Value> {
        let crds = crate::kinds::find("apiextensions.k8s.io", "v1", "customresourcedefinitions")?;
        self.objects.get(&(crds, String::new(), k.crd_name()))
    }

    /// The short names discovery announces: a custom kind's come from its CRD.
    pub fn short_names(&self, k: &crate::kinds::Kind) -> Vec<String> {
        if !k.custom {
            return k.short_names.iter().map(|s| (*s).to_owned()).collect();
        }
        self.crd(k)
            .and_then(|crd| serde_json::from_value(crd["spec"]["names"]["shortNames"].clone()).ok())
            .unwrap_or_default()
    }

    /// NamespaceLifecycle: new objects only in namespaces that exist and are not going.
    fn admit_namespace(&self, kind: usize, ns: &str) -> Result<(), ApiError> {
        if !self.cluster || !KINDS[kind].namespaced {
            return Ok(());
        }
        let namespaces = crate::kinds::find("", "v1", "namespaces").expect("namespaces are served");
        match self.objects.get(&(namespaces, String::new(), ns.to_owned())) {
            None => Err(ApiError::new(
                404,
                "NotFound",
                format!("namespaces {ns:?} not found"),
            )),
            Some(n) if deleting(n) => Err(ApiError::new(
                403,
                "Forbidden",
                format!("unable to create new content in namespace {ns} because it is being terminated"),
            )),
            Some(_) => Ok(()),
        }
    }

    pub fn resource_version(&self) -> u64 {
        self.rv
    }

    fn bump(&mut self) -> u64 {
        self.rv += 1;
        self.rv
    }

    fn emit(&mut self, kind: usize, type_: &'static str, object: Value) {
        let rv = self.rv;
        self.history.push_back(Event {
            rv,
            kind,
            type_,
            object: object.clone(),
        });
        while self.history.len() > self.history_limit {
            self.history.pop_front();
        }
        let event = json!({"type": type_, "object": object});
        self.watchers.retain(|w| {
            let ns_ok = w
                .namespace
                .as_deref()
                .is_none_or(|ns| meta(&object)["namespace"].as_str() == Some(ns));
            if w.kind != kind
                || !ns_ok
                || !w.labels.matches(&labels(&object))
                || !field_matches(&object, &w.fields)
            {
                return !w.tx.is_closed();
            }
            w.tx.send(event.clone()).is_ok()
        });
    }

    /// Installs a denying admission webhook (see [`Denial`]).
    pub fn deny(&mut self, denial: Denial) {
        self.denials.push(denial);
    }

    /// Removes every denying webhook.
    pub fn allow_all(&mut self) {
        self.denials.clear();
    }

    /// A write of `name` is refused by a webhook, as the API server says it.
    fn admit(&self, kind: usize, name: &str) -> Result<(), ApiError> {
        match self
            .denials
            .iter()
            .find(|d| d.resource == KINDS[kind].plural && name.starts_with(&d.name_prefix))
        {
            Some(d) => Err(ApiError::new(
                403,
                "Forbidden",
                format!(
                    "admission webhook {:?} denied the request: {}",
                    d.webhook, d.message
                ),
            )),
            None => Ok(()),
        }
    }

    /// Records the write of `next` over `before` (None: created) in
    /// `next`'s managedFields: the current manager's Update entry gets the
    /// fields this write changed and the time. Simplified: fields are not
    /// taken away from other managers.
    fn manage(&self, before: Option<&Value>, next: &mut Value, subresource: Option<&str>) {
        let mut entries: Vec<Value> = before
            .and_then(|b| meta(b)["managedFields"].as_array().cloned())
            .unwrap_or_default();
        let changed = changed_fields(before.unwrap_or(&json!({})), next, true).unwrap_or(json!({}));
        let api_version = next["apiVersion"].clone();
        let position = entries.iter().position(|e| {
            e["manager"].as_str() == Some(self.manager.as_str())
                && e["operation"] == "Update"
                && e["subresource"].as_str() == subresource
        });
        let entry = match position {
            Some(i) => &mut entries[i],
            None => {
                entries.push(json!({"manager": self.manager, "operation": "Update", "apiVersion": api_version, "fieldsType": "FieldsV1", "fieldsV1": {}}));
                entries.last_mut().expect("just pushed")
            }
        };
        union(&mut entry["fieldsV1"], &changed);
        entry["time"] = json!(now());
        if let Some(sub) = subresource {
            entry["subresource"] = json!(sub);
        }
        next["metadata"]["managedFields"] = json!(entries);
    }

    pub fn get(&self, kind: usize, ns: &str, name: &str) -> Result<Value, ApiError> {
        self.objects
            .get(&(kind, ns.to_owned(), name.to_owned()))
            .cloned()
            .ok_or_else(|| not_found(kind, name))
    }

    pub fn list(
        &self,
        kind: usize,
        ns: Option<&str>,
        labels_sel: &Selector,
        fields: &[(String, String)],
    ) -> Value {
        let items: Vec<Value> = self
            .objects
            .iter()
            .filter(|((k, n, _), o)| {
                *k == kind
                    && ns.is_none_or(|ns| ns == n)
                    && labels_sel.matches(&labels(o))
                    && field_matches(o, fields)
            })
            .map(|(_, o)| o.clone())
            .collect();
        json!({
            "apiVersion": KINDS[kind].api_version(), "kind": format!("{}List", KINDS[kind].kind),
            "metadata": {"resourceVersion": self.rv.to_string()}, "items": items
        })
    }

    pub fn create(&mut self, kind: usize, ns: &str, mut body: Value) -> Result<Value, ApiError> {
        let k = &KINDS[kind];
        if !body.is_object() {
            return Err(ApiError::new(400, "BadRequest", "body must be a JSON object"));
        }
        let mut name = meta(&body)["name"].as_str().unwrap_or_default().to_owned();
        if name.is_empty() {
            let prefix = meta(&body)["generateName"].as_str().unwrap_or_default();
            if prefix.is_empty() {
                return Err(ApiError::new(
                    422,
                    "Invalid",
                    "metadata.name: Required value: name or generateName is required",
                ));
            }
            name = format!("{prefix}{}", &uuid::Uuid::new_v4().simple().to_string()[..5]);
        }
        if let Some(body_ns) = meta(&body)["namespace"].as_str()
            && k.namespaced
            && body_ns != ns
        {
            return Err(ApiError::new(
                400,
                "BadRequest",
                "the namespace of the object does not match the namespace on the request",
            ));
        }
        self.admit(kind, &name)?;
        self.admit_namespace(kind, ns)?;
        within_size(kind, &name, &body)?;
        let key = (kind, ns.to_owned(), name.clone());
        if self.objects.contains_key(&key) {
            return Err(ApiError::new(
                409,
                "AlreadyExists",
                format!("{}.{} {name:?} already exists", k.plural, k.group),
            ));
        }
        let rv = self.bump();
        let m = body["metadata"]
            .as_object_mut()
            .map(std::mem::take)
            .unwrap_or_default();
        let mut m = Value::Object(m);
        m["name"] = json!(name);
        if k.namespaced {
            m["namespace"] = json!(ns);
        }
        m["uid"] = json!(uuid::Uuid::new_v4().to_string());
        m["resourceVersion"] = json!(rv.to_string());
        m["creationTimestamp"] = json!(now());
        if let Some(o) = m.as_object_mut() {
            o.remove("deletionTimestamp");
            o.remove("generateName");
        }
        if k.status {
            m["generation"] = json!(1);
            if let Some(o) = body.as_object_mut() {
                o.remove("status");
            }
        }
        body["metadata"] = m;
        body["apiVersion"] = json!(k.api_version());
        body["kind"] = json!(k.kind);
        server_set_on_create(k, &name, &mut body);
        self.manage(None, &mut body, None);
        self.objects.insert(key, body.clone());
        self.emit(kind, "ADDED", body.clone());
        Ok(body)
    }

    /// Writes `next` over the stored object (main resource or `status`), with
    /// the API server's rules; `next` has already been checked against the
    /// stored resourceVersion.
    fn write(
        &mut self,
        kind: usize,
        ns: &str,
        name: &str,
        next: Value,
        status_only: bool,
    ) -> Result<Value, ApiError> {
        let k = &KINDS[kind];
        let key = (kind, ns.to_owned(), name.to_owned());
        let current = self
            .objects
            .get(&key)
            .cloned()
            .ok_or_else(|| not_found(kind, name))?;
        let mut merged = if status_only {
            let mut m = current.clone();
            m["status"] = next.get("status").cloned().unwrap_or(Value::Null);
            if m["status"].is_null() {
                m.as_object_mut().map(|o| o.remove("status"));
            }
            m
        } else {
            let mut m = next.clone();
            if k.status {
                match current.get("status") {
                    Some(s) => m["status"] = s.clone(),
                    None => {
                        m.as_object_mut().map(|o| o.remove("status"));
                    }
                }
            }
            // Immutable or server-owned metadata.
            for field in [
                "uid",
                "creationTimestamp",
                "deletionTimestamp",
                "name",
                "namespace",
                "generation",
            ] {
                match current["metadata"].get(field) {
                    Some(v) => m["metadata"][field] = v.clone(),
                    None => {
                        m["metadata"].as_object_mut().map(|o| o.remove(field));
                    }
                }
            }
            m
        };
        merged["apiVersion"] = json!(k.api_version());
        merged["kind"] = json!(k.kind);
        let deleting = deleting(&current);
        if deleting {
            let before = finalizers(&current);
            if finalizers(&merged).iter().any(|f| !before.contains(f)) {
                return Err(ApiError::new(
                    422,
                    "Invalid",
                    "metadata.finalizers: Forbidden: no new finalizers can be added if the object is being deleted",
                ));
            }
        }
        if k.status && !status_only && spec_part(&merged) != spec_part(&current) {
            let generation = meta(&current)["generation"].as_i64().unwrap_or(1) + 1;
            merged["metadata"]["generation"] = json!(generation);
        }
        merged["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"].clone();
        // Server-owned here: a write that leaves them out (or sends them back) keeps them.
        match current["metadata"].get("managedFields") {
            Some(v) => merged["metadata"]["managedFields"] = v.clone(),
            None => {
                merged["metadata"]
                    .as_object_mut()
                    .map(|o| o.remove("managedFields"));
            }
        }
        self.admit(kind, name)?;
        if merged == current {
            return Ok(current); // no-op writes do not change the resourceVersion
        }
        self.manage(Some(&current), &mut merged, status_only.then_some("status"));
        let rv = self.bump();
        merged["metadata"]["resourceVersion"] = json!(rv.to_string());
        within_size(kind, name, &merged)?;
        if deleting && finalizers(&merged).is_empty() {
            self.objects.remove(&key);
            self.emit(kind, "DELETED", merged.clone());
            self.collect_dependents(&merged);
            self.finish_namespaces();
        } else {
            self.objects.insert(key, merged.clone());
            self.emit(kind, "MODIFIED", merged.clone());
        }
        Ok(merged)
    }

    fn check_version(&self, kind: usize, current: &Value, next: &Value, name: &str) -> Result<(), ApiError> {
        match meta(next)["resourceVersion"].as_str() {
            Some(v) if !v.is_empty() && Some(v) != meta(current)["resourceVersion"].as_str() => {
                Err(ApiError::new(
                    409,
                    "Conflict",
                    format!(
                        "Operation cannot be fulfilled on {}.{} {name:?}: the object has been modified; please apply your changes to the latest version and try again",
                        KINDS[kind].plural, KINDS[kind].group
                    ),
                ))
            }
            _ => Ok(()),
        }
    }

    pub fn replace(
        &mut self,
        kind: usize,
        ns: &str,
        name: &str,
        body: Value,
        status_only: bool,
    ) -> Result<Value, ApiError> {
        let current = self.get(kind, ns, name)?;
        if meta(&body)["name"].as_str().is_some_and(|n| n != name) {
            return Err(ApiError::new(
                400,
                "BadRequest",
                "the name of the object does not match the name on the URL",
            ));
        }
        self.check_version(kind, &current, &body, name)?;
        self.write(kind, ns, name, body, status_only)
    }

    pub fn patch(
        &mut self,
        kind: usize,
        ns: &str,
        name: &str,
        content_type: &str,
        patch: Value,
        status_only: bool,
    ) -> Result<Value, ApiError> {
        let current = self.get(kind, ns, name)?;
        let mut next = current.clone();
        match content_type {
            "application/merge-patch+json" | "application/strategic-merge-patch+json" => {
                if content_type.starts_with("application/strategic")
                    && KINDS[kind].group == "crawl.example.com"
                {
                    return Err(ApiError::new(
                        415,
                        "UnsupportedMediaType",
                        "strategic merge patch is not supported for custom resources",
                    ));
                }
                if content_type.starts_with("application/strategic") {
                    crate::strategic::apply(&mut next, &patch);
                } else {
                    json_patch::merge(&mut next, &patch);
                }
            }
            "application/json-patch+json" => {
                let ops: json_patch::Patch = serde_json::from_value(patch)
                    .map_err(|e| ApiError::new(400, "BadRequest", format!("invalid JSON patch: {e}")))?;
                json_patch::patch(&mut next, &ops).map_err(|e| {
                    ApiError::new(422, "Invalid", format!("the patch could not be applied: {e}"))
                })?;
            }
            other => {
                return Err(ApiError::new(
                    415,
                    "UnsupportedMediaType",
                    format!(
                        "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json (got {other})"
                    ),
                ));
            }
        }
        self.check_version(kind, &current, &next, name)?;
        self.write(kind, ns, name, next, status_only)
    }

    /// Deletes with `options` (a DeleteOptions: `preconditions`,
    /// `propagationPolicy` Background — the default — or Orphan).
    pub fn delete(&mut self, kind: usize, ns: &str, name: &str, options: &Value) -> Result<Value, ApiError> {
        let key = (kind, ns.to_owned(), name.to_owned());
        let mut current = self.get(kind, ns, name)?;
        self.admit(kind, name)?;
        let preconditions = &options["preconditions"];
        let orphan = match options["propagationPolicy"].as_str() {
            None | Some("Background") => false,
            Some("Orphan") => true,
            Some("Foreground") => {
                return Err(ApiError::new(
                    422,
                    "Invalid",
                    "propagationPolicy Foreground is not modelled by this fake",
                ));
            }
            Some(other) => {
                return Err(ApiError::new(
                    400,
                    "BadRequest",
                    format!("propagationPolicy: Unsupported value: {other:?}"),
                ));
            }
        };
        if let Some(uid) = preconditions["uid"].as_str()
            && meta(&current)["uid"].as_str() != Some(uid)
        {
            return Err(ApiError::new(
                409,
                "Conflict",
                "Precondition failed: UID in precondition does not match the UID in the object",
            ));
        }
        if let Some(rv) = preconditions["resourceVersion"].as_str()
            && meta(&current)["resourceVersion"].as_str() != Some(rv)
        {
            return Err(ApiError::new(
                409,
                "Conflict",
                "Precondition failed: resourceVersion does not match",
            ));
        }
        if orphan {
            self.orphan_dependents(meta(&current)["uid"].as_str().unwrap_or_default());
        }
        if self.cluster && (KINDS[kind].group, KINDS[kind].kind) == ("", "Namespace") {
            return self.delete_namespace(kind, name, current);
        }
        if self.cluster && KINDS[kind].kind == "CustomResourceDefinition" {
            self.delete_custom_objects(&current);
        }
        if !finalizers(&current).is_empty() {
            if deleting(&current) {
                return Ok(current);
            }
            let rv = self.bump();
            current["metadata"]["deletionTimestamp"] = json!(now());
            current["metadata"]["deletionGracePeriodSeconds"] = json!(0);
            current["metadata"]["resourceVersion"] = json!(rv.to_string());
            self.objects.insert(key, current.clone());
            self.emit(kind, "MODIFIED", current.clone());
            return Ok(current);
        }
        let rv = self.bump();
        current["metadata"]["resourceVersion"] = json!(rv.to_string());
        self.objects.remove(&key);
        self.emit(kind, "DELETED", current.clone());
        self.collect_dependents(&current);
        self.finish_namespaces();
        Ok(current)
    }

    /// Marks a namespace Terminating; [`State::empty_terminating_namespaces`]
    /// deletes what it holds later, as the namespace controller does, and
    /// it goes once nothing is left in it.
    fn delete_namespace(&mut self, kind: usize, name: &str, mut current: Value) -> Result<Value, ApiError> {
        if deleting(&current) {
            return Ok(current);
        }
        let rv = self.bump();
        current["metadata"]["deletionTimestamp"] = json!(now());
        current["metadata"]["resourceVersion"] = json!(rv.to_string());
        current["status"]["phase"] = json!("Terminating");
        self.objects
            .insert((kind, String::new(), name.to_owned()), current.clone());
        self.emit(kind, "MODIFIED", current.clone());
        Ok(current)
    }

    /// The namespace controller's pass: deletes everything in Terminating
    /// namespaces (finalizers hold objects as usual); empty ones go.
    pub fn empty_terminating_namespaces(&mut self) {
        let Some(namespaces) = crate::kinds::find("", "v1", "namespaces") else {
            return;
        };
        let terminating: Vec<String> = self
            .objects
            .iter()
            .filter(|((k, _, _), o)| *k == namespaces && deleting(o))
            .map(|((_, _, name), _)| name.clone())
            .collect();
        let inside: Vec<Key> = self
            .objects
            .iter()
            .filter(|((k, ns, _), o)| KINDS[*k].namespaced && terminating.contains(ns) && !deleting(o))
            .map(|(key, _)| key.clone())
            .collect();
        for (k, ns, n) in inside {
            let _ = self.delete(k, &ns, &n, &Value::Null);
        }
        self.finish_namespaces();
    }

    /// Deleting a CRD deletes its objects (their finalizers hold them as usual).
    fn delete_custom_objects(&mut self, crd: &Value) {
        let group = crd["spec"]["group"].as_str().unwrap_or_default();
        let plural = crd["spec"]["names"]["plural"].as_str().unwrap_or_default();
        let objects: Vec<Key> = self
            .objects
            .keys()
            .filter(|(k, _, _)| KINDS[*k].custom && KINDS[*k].group == group && KINDS[*k].plural == plural)
            .cloned()
            .collect();
        for (k, ns, n) in objects {
            let _ = self.delete(k, &ns, &n, &Value::Null);
        }
    }

    /// Whether any namespace is being deleted.
    pub fn namespaces_terminating(&self) -> bool {
        let Some(namespaces) = crate::kinds::find("", "v1", "namespaces") else {
            return false;
        };
        self.objects
            .iter()
            .any(|((k, _, _), o)| *k == namespaces && deleting(o))
    }

    /// Terminating namespaces with nothing left in them go.
    fn finish_namespaces(&mut self) {
        if !self.cluster {
            return;
        }
        let Some(kind) = crate::kinds::find("", "v1", "namespaces") else {
            return;
        };
        let done: Vec<Key> = self
            .objects
            .iter()
            .filter(|((k, _, name), o)| {
                *k == kind
                    && deleting(o)
                    && !self
                        .objects
                        .keys()
                        .any(|(k2, ns, _)| KINDS[*k2].namespaced && ns == name)
            })
            .map(|(key, _)| key.clone())
            .collect();
        for key in done {
            if let Some(mut gone) = self.objects.remove(&key) {
                let rv = self.bump();
                gone["metadata"]["resourceVersion"] = json!(rv.to_string());
                self.emit(kind, "DELETED", gone);
            }
        }
    }

    /// The garbage collector, run at once when `gone` leaves storage: a
    /// dependent none of whose owners is left is deleted (background
    /// propagation, so its own finalizers hold it as usual); a dependent with
    /// an owner left loses only the dangling reference.
    fn collect_dependents(&mut self, gone: &Value) {
        let Some(uid) = meta(gone)["uid"].as_str() else {
            return;
        };
        for (kind, ns, name) in self.dependents_of(uid) {
            let Ok(current) = self.get(kind, &ns, &name) else {
                continue;
            };
            let remaining: Vec<Value> = owner_references(&current)
                .into_iter()
                .filter(|r| r["uid"].as_str().is_some_and(|u| self.uid_exists(u)))
                .collect();
            if remaining.is_empty() {
                let _ = self.delete(kind, &ns, &name, &Value::Null);
            } else {
                let mut next = current;
                next["metadata"]["ownerReferences"] = json!(remaining);
                let _ = self.write(kind, &ns, &name, next, false);
            }
        }
    }

    /// Orphan propagation: the dependents of `uid` lose their reference to it.
    fn orphan_dependents(&mut self, uid: &str) {
        for (kind, ns, name) in self.dependents_of(uid) {
            let Ok(mut next) = self.get(kind, &ns, &name) else {
                continue;
            };
            let remaining: Vec<Value> = owner_references(&next)
                .into_iter()
                .filter(|r| r["uid"].as_str() != Some(uid))
                .collect();
            next["metadata"]["ownerReferences"] = json!(remaining);
            let _ = self.write(kind, &ns, &name, next, false);
        }
    }

    fn dependents_of(&self, uid: &str) -> Vec<Key> {
        self.objects
            .iter()
            .filter(|(_, o)| owner_references(o).iter().any(|r| r["uid"].as_str() == Some(uid)))
            .map(|(k, _)| k.clone())
            .collect()
    }

    fn uid_exists(&self, uid: &str) -> bool {
        self.objects
            .values()
            .any(|o| meta(o)["uid"].as_str() == Some(uid))
    }

    /// The `autoscaling/v1` Scale of a kind with the scale subresource.
    pub fn get_scale(&self, kind: usize, ns: &str, name: &str) -> Result<Value, ApiError> {
        Ok(scale_of(&self.get(kind, ns, name)?))
    }

    /// Writes a Scale (merge patch or replacement): only `spec.replicas`
    /// reaches the object, guarded by the Scale's resourceVersion if it has one.
    pub fn write_scale(
        &mut self,
        kind: usize,
        ns: &str,
        name: &str,
        content_type: Option<&str>,
        body: Value,
    ) -> Result<Value, ApiError> {
        let current = self.get(kind, ns, name)?;
        let mut scale = scale_of(&current);
        match content_type {
            None => scale = body,
            Some("application/merge-patch+json") => json_patch::merge(&mut scale, &body),
            Some(other) => {
                return Err(ApiError::new(
                    415,
                    "UnsupportedMediaType",
                    format!("the scale subresource takes a merge patch or a replacement (got {other})"),
                ));
            }
        }
        let Some(replicas) = scale["spec"]["replicas"].as_i64().filter(|r| *r >= 0) else {
            return Err(ApiError::new(
                422,
                "Invalid",
                "spec.replicas: Invalid value: must be a non-negative integer",
            ));
        };
        self.check_version(kind, &current, &scale, name)?;
        let mut next = current;
        next["spec"]["replicas"] = json!(replicas);
        Ok(scale_of(&self.write(kind, ns, name, next, false)?))
    }

    /// Starts a watch: events after `from` (410 Gone when they are no longer
    /// kept), or the current objects as ADDED when `from` is None.
    pub fn watch(&mut self, mut watcher: Watcher, from: Option<u64>) -> Result<(), ApiError> {
        let matches = |w: &Watcher, kind: usize, o: &Value| {
            kind == w.kind
                && w.namespace
                    .as_deref()
                    .is_none_or(|ns| meta(o)["namespace"].as_str() == Some(ns))
                && w.labels.matches(&labels(o))
                && field_matches(o, &w.fields)
        };
        match from {
            None => {
                for ((kind, _, _), o) in &self.objects {
                    if matches(&watcher, *kind, o) {
                        let _ = watcher.tx.send(json!({"type": "ADDED", "object": o}));
                    }
                }
            }
            Some(rv) => {
                let oldest = self.history.front().map(|e| e.rv).unwrap_or(self.rv + 1);
                // Versions between the oldest kept event and now can be resumed.
                if rv + 1 < oldest && rv < self.rv {
                    return Err(ApiError::new(
                        410,
                        "Expired",
                        format!("too old resource version: {rv} ({})", oldest - 1),
                    ));
                }
                for e in self.history.iter().filter(|e| e.rv > rv) {
                    if matches(&watcher, e.kind, &e.object) {
                        let _ = watcher.tx.send(json!({"type": e.type_, "object": e.object}));
                    }
                }
            }
        }
        watcher.labels = watcher.labels.clone();
        self.watchers.push(watcher);
        Ok(())
    }

    /// Drops history so that resuming from older versions answers 410 (tests).
    pub fn compact(&mut self) {
        self.history.clear();
    }
}

fn owner_references(obj: &Value) -> Vec<Value> {
    serde_json::from_value(meta(obj)["ownerReferences"].clone()).unwrap_or_default()
}

fn scale_of(obj: &Value) -> Value {
    let m = meta(obj);
    json!({
        "apiVersion": "autoscaling/v1", "kind": "Scale",
        "metadata": {
            "name": m["name"], "namespace": m["namespace"], "uid": m["uid"],
            "resourceVersion": m["resourceVersion"], "creationTimestamp": m["creationTimestamp"]
        },
        "spec": {"replicas": obj["spec"]["replicas"].as_i64().unwrap_or(0)},
        "status": {
            "replicas": obj["status"]["replicas"].as_i64().unwrap_or(0),
            "selector": obj["status"]["selector"].as_str().unwrap_or_default()
        }
    })
}

/// What the API server itself sets on a new object of some kinds: a
/// Namespace's name label, finalizer and phase; a CRD's accepted names and
/// Established condition (at once: no controller runs here).
fn server_set_on_create(k: &crate::kinds::Kind, name: &str, body: &mut Value) {
    match (k.group, k.kind) {
        ("", "Namespace") => {
            body["metadata"]["labels"]["kubernetes.io/metadata.name"] = json!(name);
            body["spec"]["finalizers"] = json!([NAMESPACE_FINALIZER]);
            body["status"] = json!({"phase": "Active"});
        }
        ("apiextensions.k8s.io", "CustomResourceDefinition") => {
            let now = now();
            let condition = |type_: &str, reason: &str| json!({"type": type_, "status": "True", "reason": reason, "lastTransitionTime": now, "message": ""});
            let stored: Vec<Value> = body["spec"]["versions"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|v| v["storage"] == true)
                .map(|v| v["name"].clone())
                .collect();
            body["status"] = json!({
                "acceptedNames": body["spec"]["names"],
                "conditions": [condition("NamesAccepted", "NoConflicts"), condition("Established", "InitialNamesAccepted")],
                "storedVersions": stored,
            });
        }
        _ => {}
    }
}

fn not_found(kind: usize, name: &str) -> ApiError {
    let k = &KINDS[kind];
    let resource = if k.group.is_empty() {
        k.plural.to_owned()
    } else {
        format!("{}.{}", k.plural, k.group)
    };
    ApiError::new(404, "NotFound", format!("{resource} {name:?} not found"))
}

/// The most a ConfigMap's or Secret's data may take, keys and values
/// together, as the API server validates it.
pub const MAX_DATA_BYTES: usize = 1024 * 1024;

/// A ConfigMap or Secret whose `data` and `binaryData` exceed
/// [`MAX_DATA_BYTES`] is refused, `422 Invalid`, as the API server does.
fn within_size(kind: usize, name: &str, object: &Value) -> Result<(), ApiError> {
    let k = &KINDS[kind];
    if !k.group.is_empty() || !matches!(k.plural, "configmaps" | "secrets") {
        return Ok(());
    }
    let size: usize = ["data", "binaryData"]
        .iter()
        .filter_map(|field| object[*field].as_object())
        .flatten()
        .map(|(key, value)| key.len() + value.as_str().map_or(0, str::len))
        .sum();
    if size > MAX_DATA_BYTES {
        return Err(ApiError::new(
            422,
            "Invalid",
            format!(
                "{} {name:?} is invalid: []: Too long: must have at most {MAX_DATA_BYTES} bytes",
                k.kind
            ),
        ));
    }
    Ok(())
}
