//! The Kubernetes adapter of the object-store port: Proxies through the API
//! server. Reads are direct GETs (always the latest version); writes carry a
//! JSON-patch `test` on the UID — and on the resourceVersion for finalizer
//! changes, retried on conflict — so another controller's finalizers are
//! never clobbered and a write never lands on a new incarnation. Status goes
//! through the status subresource. Cloud-init comes from Secrets labelled
//! `crawl.example.com/cloud-init: "true"`; only those are watched, and a
//! rotation re-reconciles the Proxies that use them.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ObjectReference, Secret};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder, Reporter};
use kube::runtime::watcher::{self, Event};
use serde_json::json;
use tokio::sync::mpsc;

use tracing::Instrument;

use crate::credentials::ProxyCredentials;
use crate::resource::{
    CLOUD_INIT_LABEL, FINALIZER, POOL_LABEL, Proxy, ProxyPool, ProxyPoolStatus, ProxyStatus, SecretKeyRef,
};
use crate::store::watch_retry::WatchRetry;
use crate::store::{
    CloudInitError, ObjectKey, PoolStore, ProxyStore, StoreError, StoreEvent, credentials_secret,
};

/// Attempts of a resourceVersion-guarded write before giving up (Transient).
const CONFLICT_RETRIES: usize = 5;

/// Proxies in a Kubernetes cluster.
pub struct KubeStore {
    client: kube::Client,
    namespace: Option<String>,
    events: mpsc::UnboundedSender<StoreEvent>,
    recorder: Recorder,
    /// Which Proxies use which Secret, learnt from the watch.
    secret_users: Mutex<HashMap<ObjectKey, HashSet<ObjectKey>>>,
    /// Secrets' last seen content, to react to rotations only.
    secret_versions: Mutex<HashMap<ObjectKey, String>>,
}

fn backend(e: kube::Error) -> StoreError {
    StoreError::Backend(e.to_string())
}

fn api_code(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(s) => Some(s.code),
        _ => None,
    }
}

fn secret_key(secret: &Secret) -> ObjectKey {
    ObjectKey::new(
        secret.metadata.namespace.clone().unwrap_or_default(),
        secret.metadata.name.clone().unwrap_or_default(),
    )
}

/// The objects a watch has seen, so that a re-list (after an error or a
/// 410 Gone) reveals the ones deleted while no events arrived.
#[derive(Debug, Default)]
struct Relisted {
    known: HashSet<ObjectKey>,
    /// While a re-list runs: what it has listed so far.
    listing: Option<HashSet<ObjectKey>>,
}

impl Relisted {
    fn seen(&mut self, key: &ObjectKey) {
        self.known.insert(key.clone());
    }

    fn gone(&mut self, key: &ObjectKey) {
        self.known.remove(key);
    }

    fn relist_started(&mut self) {
        self.listing = Some(HashSet::new());
    }

    fn relisted(&mut self, key: &ObjectKey) {
        self.listing.get_or_insert_with(HashSet::new).insert(key.clone());
    }

    /// The objects known before that the re-list no longer has.
    fn relist_done(&mut self) -> Vec<ObjectKey> {
        let listed = self.listing.take().unwrap_or_default();
        let mut missing: Vec<ObjectKey> = self.known.difference(&listed).cloned().collect();
        missing.sort();
        self.known = listed;
        missing
    }
}

/// JSON-pointer escaping of one path segment.
fn pointer(segment: &str) -> String {
    segment.replace('~', "~0").replace('/', "~1")
}

impl KubeStore {
    /// `namespace` restricts the operator to one namespace (`--proxy-namespace`).
    pub fn new(
        client: kube::Client,
        namespace: Option<String>,
        reporter: &str,
        instance: Option<String>,
    ) -> (Self, mpsc::UnboundedReceiver<StoreEvent>) {
        let (events, rx) = mpsc::unbounded_channel();
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: reporter.to_owned(),
                instance,
            },
        );
        let store = Self {
            client,
            namespace,
            events,
            recorder,
            secret_users: Mutex::new(HashMap::new()),
            secret_versions: Mutex::new(HashMap::new()),
        };
        (store, rx)
    }

    fn proxies(&self, namespace: &str) -> Api<Proxy> {
        Api::namespaced(self.client.clone(), namespace)
    }

    /// Every Proxy in scope, read from the API server (not a watch cache).
    async fn list_proxies(&self) -> Result<Vec<Proxy>, StoreError> {
        let list = self
            .all_proxies()
            .list(&ListParams::default())
            .instrument(api_span("list", "proxies", None))
            .await
            .map_err(backend)?;
        Ok(list.items)
    }

    fn all_proxies(&self) -> Api<Proxy> {
        match &self.namespace {
            Some(ns) => Api::namespaced(self.client.clone(), ns),
            None => Api::all(self.client.clone()),
        }
    }

    fn emit(&self, event: StoreEvent) {
        let _ = self.events.send(event);
    }

    /// Watches ProxyPools until the stream ends, sending each change to
    /// `events` (the pool registry's stream); a re-list removes pools
    /// deleted while the watch was down, as for Proxies.
    pub async fn watch_pools(self: Arc<Self>, events: mpsc::UnboundedSender<StoreEvent>) {
        let api: Api<ProxyPool> = match &self.namespace {
            Some(ns) => Api::namespaced(self.client.clone(), ns),
            None => Api::all(self.client.clone()),
        };
        let mut stream = watcher(api, watcher::Config::default()).boxed();
        let mut retry = WatchRetry::default();
        let mut known = Relisted::default();
        let send = |event| {
            // No receiver: the system is shutting down.
            let _ = events.send(event);
        };
        while let Some(item) = stream.next().await {
            if item.is_ok() {
                retry.succeeded();
            }
            match item {
                Ok(Event::Apply(p)) => {
                    let key = crate::store::pool_key(&p);
                    known.seen(&key);
                    send(StoreEvent::Changed(key));
                }
                Ok(Event::InitApply(p)) => {
                    let key = crate::store::pool_key(&p);
                    known.relisted(&key);
                    send(StoreEvent::Changed(key));
                }
                Ok(Event::Delete(p)) => {
                    let key = crate::store::pool_key(&p);
                    known.gone(&key);
                    send(StoreEvent::Removed(key));
                }
                Ok(Event::Init) => known.relist_started(),
                Ok(Event::InitDone) => known.relist_done().into_iter().for_each(|key| {
                    send(StoreEvent::Removed(key));
                }),
                Err(e) => retry.wait_after(&e, "ProxyPools").await,
            }
        }
    }

    /// Watches Proxies until the stream ends; every change becomes an event.
    /// The watcher re-lists and resumes by itself after errors and 410s,
    /// pausing as [`WatchRetry`] says (at most 2 s while the API server does
    /// not answer, none before the re-list a 410 calls for). A re-list is
    /// compared with what was known: a Proxy deleted during the gap (its
    /// deletion never seen as an event) is removed all the same.
    pub async fn watch_proxies(self: Arc<Self>) {
        let mut stream = watcher(self.all_proxies(), watcher::Config::default()).boxed();
        let mut retry = WatchRetry::default();
        let mut known = Relisted::default();
        while let Some(item) = stream.next().await {
            if item.is_ok() {
                retry.succeeded();
            }
            match item {
                Ok(Event::Apply(p)) => {
                    let key = ObjectKey::of(&p);
                    known.seen(&key);
                    self.remember_secret_use(&key, &p);
                    self.emit(StoreEvent::Changed(key));
                }
                Ok(Event::InitApply(p)) => {
                    let key = ObjectKey::of(&p);
                    known.relisted(&key);
                    self.remember_secret_use(&key, &p);
                    self.emit(StoreEvent::Changed(key));
                }
                Ok(Event::Delete(p)) => {
                    let key = ObjectKey::of(&p);
                    known.gone(&key);
                    self.forget_secret_use(&key);
                    self.emit(StoreEvent::Removed(key));
                }
                Ok(Event::Init) => known.relist_started(),
                Ok(Event::InitDone) => {
                    for key in known.relist_done() {
                        tracing::info!(proxy = %key, "Proxy deleted while the watch was down");
                        self.forget_secret_use(&key);
                        self.emit(StoreEvent::Removed(key));
                    }
                }
                Err(e) => retry.wait_after(&e, "Proxies").await,
            }
        }
    }

    /// Watches labelled cloud-init Secrets; a content change re-reconciles their users.
    pub async fn watch_secrets(self: Arc<Self>) {
        let api: Api<Secret> = match &self.namespace {
            Some(ns) => Api::namespaced(self.client.clone(), ns),
            None => Api::all(self.client.clone()),
        };
        let config = watcher::Config::default().labels(&format!("{CLOUD_INIT_LABEL}=true"));
        let mut stream = watcher(api, config).boxed();
        let mut retry = WatchRetry::default();
        let mut known = Relisted::default();
        while let Some(item) = stream.next().await {
            if item.is_ok() {
                retry.succeeded();
            }
            let secret = match item {
                Ok(Event::Apply(s)) => s,
                Ok(Event::Delete(s)) => {
                    let key = secret_key(&s);
                    known.gone(&key);
                    self.secret_changed(&key, String::new());
                    continue;
                }
                Ok(Event::InitApply(s)) => {
                    known.relisted(&secret_key(&s));
                    s
                }
                Ok(Event::Init) => {
                    known.relist_started();
                    continue;
                }
                Ok(Event::InitDone) => {
                    // Deleted during the gap: their users must notice.
                    for key in known.relist_done() {
                        self.secret_changed(&key, String::new());
                    }
                    continue;
                }
                Err(e) => {
                    retry.wait_after(&e, "cloud-init Secrets").await;
                    continue;
                }
            };
            let key = secret_key(&secret);
            known.seen(&key);
            let digest = serde_json::to_string(&secret.data).unwrap_or_default();
            self.secret_changed(&key, digest);
        }
    }

    /// A Secret's content is now `digest` (empty: gone): its users reconcile if it changed.
    fn secret_changed(&self, key: &ObjectKey, digest: String) {
        let previous = self
            .secret_versions
            .lock()
            .map(|mut v| {
                if digest.is_empty() {
                    v.remove(key)
                } else {
                    v.insert(key.clone(), digest.clone())
                }
            })
            .ok()
            .flatten();
        if previous.as_deref().unwrap_or_default() == digest {
            return;
        }
        let users: Vec<ObjectKey> = self
            .secret_users
            .lock()
            .map(|u| {
                u.get(key)
                    .map(|s| s.iter().cloned().collect())
                    .unwrap_or_default()
            })
            .unwrap_or_default();
        for user in users {
            self.emit(StoreEvent::Changed(user));
        }
    }

    fn remember_secret_use(&self, key: &ObjectKey, proxy: &Proxy) {
        self.forget_secret_use(key);
        let Some(secret) = proxy.spec.cloud_init.as_ref().and_then(|c| c.secret_ref.as_ref()) else {
            return;
        };
        if let Ok(mut users) = self.secret_users.lock() {
            users
                .entry(ObjectKey::new(&key.namespace, &secret.name))
                .or_default()
                .insert(key.clone());
        }
    }

    fn forget_secret_use(&self, key: &ObjectKey) {
        if let Ok(mut users) = self.secret_users.lock() {
            users.values_mut().for_each(|u| {
                u.remove(key);
            });
        }
    }

    /// Rewrites the finalizer list with a resourceVersion guard, retrying on conflict.
    async fn edit_finalizers(
        &self,
        key: &ObjectKey,
        uid: &str,
        edit: impl Fn(&mut Vec<String>),
    ) -> Result<(), StoreError> {
        let api = self.proxies(&key.namespace);
        for _ in 0..CONFLICT_RETRIES {
            let Some(current) = api
                .get_opt(&key.name)
                .instrument(api_span("get", "proxies", Some(key)))
                .await
                .map_err(backend)?
            else {
                return Err(StoreError::Gone {
                    key: key.clone(),
                    uid: uid.to_owned(),
                });
            };
            if current.metadata.uid.as_deref() != Some(uid) {
                return Err(StoreError::Gone {
                    key: key.clone(),
                    uid: uid.to_owned(),
                });
            }
            let before = current.metadata.finalizers.clone().unwrap_or_default();
            let mut after = before.clone();
            edit(&mut after);
            if after == before {
                return Ok(());
            }
            let ops = json!([
                {"op": "test", "path": "/metadata/uid", "value": uid},
                {"op": "test", "path": "/metadata/resourceVersion", "value": current.metadata.resource_version},
                {"op": "add", "path": "/metadata/finalizers", "value": after},
            ]);
            let patch: json_patch::Patch =
                serde_json::from_value(ops).map_err(|e| StoreError::Backend(e.to_string()))?;
            match api
                .patch(&key.name, &PatchParams::default(), &Patch::Json::<()>(patch))
                .instrument(api_span("patch", "proxies", Some(key)))
                .await
            {
                Ok(_) => return Ok(()),
                // Someone else changed the object meanwhile: read again.
                Err(e) if matches!(api_code(&e), Some(409 | 422)) => continue,
                Err(e) if api_code(&e) == Some(404) => {
                    return Err(StoreError::Gone {
                        key: key.clone(),
                        uid: uid.to_owned(),
                    });
                }
                Err(e) => return Err(backend(e)),
            }
        }
        Err(StoreError::Backend(format!(
            "{key}: finalizers kept changing under us; will retry"
        )))
    }

    /// A JSON patch guarded by the UID; a failed guard means another incarnation.
    async fn guarded_patch(
        &self,
        key: &ObjectKey,
        uid: &str,
        mut ops: Vec<serde_json::Value>,
        status: bool,
    ) -> Result<(), StoreError> {
        ops.insert(0, json!({"op": "test", "path": "/metadata/uid", "value": uid}));
        let patch: json_patch::Patch = serde_json::from_value(serde_json::Value::Array(ops))
            .map_err(|e| StoreError::Backend(e.to_string()))?;
        let api = self.proxies(&key.namespace);
        let result = if status {
            api.patch_status(&key.name, &PatchParams::default(), &Patch::Json::<()>(patch))
                .instrument(api_span("patch", "proxies/status", Some(key)))
                .await
        } else {
            api.patch(&key.name, &PatchParams::default(), &Patch::Json::<()>(patch))
                .instrument(api_span("patch", "proxies", Some(key)))
                .await
        };
        match result {
            Ok(_) => Ok(()),
            Err(e) if matches!(api_code(&e), Some(404 | 422)) => Err(StoreError::Gone {
                key: key.clone(),
                uid: uid.to_owned(),
            }),
            Err(e) => Err(backend(e)),
        }
    }
}

use kube::runtime::watcher::watcher;

/// A client span for one Kubernetes API call — only inside an existing
/// trace: watches, leader election and other background calls never start
/// traces of their own.
fn api_span(verb: &'static str, resource: &'static str, key: Option<&ObjectKey>) -> tracing::Span {
    if tracing::Span::current().is_none() {
        return tracing::Span::none();
    }
    tracing::info_span!(
        "kubernetes.api",
        otel.name = %format!("{verb} {resource}"),
        otel.kind = "client",
        k8s.namespace = key.map(|k| k.namespace.as_str()),
        k8s.name = key.map(|k| k.name.as_str()),
    )
}

#[async_trait]
impl ProxyStore for KubeStore {
    async fn get(&self, key: &ObjectKey) -> Result<Option<Proxy>, StoreError> {
        self.proxies(&key.namespace)
            .get_opt(&key.name)
            .instrument(api_span("get", "proxies", Some(key)))
            .await
            .map_err(backend)
    }

    async fn add_finalizer(&self, key: &ObjectKey, uid: &str) -> Result<(), StoreError> {
        self.edit_finalizers(key, uid, |f| {
            if !f.iter().any(|x| x == FINALIZER) {
                f.push(FINALIZER.to_owned());
            }
        })
        .await
    }

    async fn remove_finalizer(&self, key: &ObjectKey, uid: &str) -> Result<(), StoreError> {
        self.edit_finalizers(key, uid, |f| f.retain(|x| x != FINALIZER))
            .await
    }

    async fn set_annotation(
        &self,
        key: &ObjectKey,
        uid: &str,
        name: &str,
        value: Option<&str>,
    ) -> Result<(), StoreError> {
        let current = self.get(key).await?.ok_or_else(|| StoreError::Gone {
            key: key.clone(),
            uid: uid.to_owned(),
        })?;
        let annotations = current.metadata.annotations.unwrap_or_default();
        let path = format!("/metadata/annotations/{}", pointer(name));
        let ops = match (value, annotations.is_empty(), annotations.contains_key(name)) {
            (Some(v), true, _) => vec![
                json!({"op": "add", "path": "/metadata/annotations", "value": BTreeMap::from([(name, v)])}),
            ],
            (Some(v), false, _) => vec![json!({"op": "add", "path": path, "value": v})],
            (None, _, true) => vec![json!({"op": "remove", "path": path})],
            (None, _, false) => return Ok(()),
        };
        self.guarded_patch(key, uid, ops, false).await
    }

    async fn write_status(&self, key: &ObjectKey, uid: &str, status: &ProxyStatus) -> Result<(), StoreError> {
        let value = serde_json::to_value(status).map_err(|e| StoreError::Backend(e.to_string()))?;
        self.guarded_patch(
            key,
            uid,
            vec![json!({"op": "add", "path": "/status", "value": value})],
            true,
        )
        .await
    }

    async fn proxy_credentials(
        &self,
        key: &ObjectKey,
        uid: &str,
        generation: &str,
    ) -> Result<ProxyCredentials, StoreError> {
        let api: Api<Secret> = Api::namespaced(self.client.clone(), &key.namespace);
        let name = credentials_secret::credentials_secret_name(uid);
        let found = api
            .get_opt(&name)
            .instrument(api_span("get", "secrets", Some(key)))
            .await
            .map_err(backend)?;
        if let Some(kept) = found
            .as_ref()
            .and_then(|s| credentials_secret::kept(s, uid, generation))
        {
            return Ok(kept);
        }
        let unusable = |e: crate::credentials::CredentialsError| StoreError::Backend(e.to_string());
        let fresh = ProxyCredentials::generate().map_err(unusable)?;
        let mut secret = credentials_secret::build(key, uid, generation, &fresh).map_err(unusable)?;
        // A racing writer makes this fail (conflict or exists); the retry reads theirs.
        match found {
            Some(old) => {
                secret.metadata.resource_version = old.metadata.resource_version;
                api.replace(&name, &PostParams::default(), &secret)
                    .instrument(api_span("replace", "secrets", Some(key)))
                    .await
            }
            None => {
                api.create(&PostParams::default(), &secret)
                    .instrument(api_span("create", "secrets", Some(key)))
                    .await
            }
        }
        .map_err(backend)?;
        Ok(fresh)
    }

    async fn secret_key(&self, namespace: &str, name: &str, key: &str) -> Result<Vec<u8>, CloudInitError> {
        let api: Api<Secret> = Api::namespaced(self.client.clone(), namespace);
        let found = api
            .get_opt(name)
            .instrument(api_span("get", "secrets", None))
            .await
            .map_err(|e| CloudInitError::Backend {
                namespace: namespace.to_owned(),
                name: name.to_owned(),
                reason: e.to_string(),
            })?
            .ok_or_else(|| CloudInitError::SecretNotFound {
                namespace: namespace.to_owned(),
                name: name.to_owned(),
            })?;
        let from_data = found.data.as_ref().and_then(|d| d.get(key)).map(|b| b.0.clone());
        from_data
            .or_else(|| {
                found
                    .string_data
                    .as_ref()?
                    .get(key)
                    .map(|v| v.as_bytes().to_vec())
            })
            .ok_or_else(|| CloudInitError::MissingKey {
                namespace: namespace.to_owned(),
                name: name.to_owned(),
                key: key.to_owned(),
            })
    }

    async fn cloud_init(&self, namespace: &str, secret: &SecretKeyRef) -> Result<Vec<u8>, CloudInitError> {
        let api: Api<Secret> = Api::namespaced(self.client.clone(), namespace);
        let found = api
            .get_opt(&secret.name)
            .instrument(api_span("get", "secrets", None))
            .await
            .map_err(|e| CloudInitError::Backend {
                namespace: namespace.to_owned(),
                name: secret.name.clone(),
                reason: e.to_string(),
            })?;
        let found = found.ok_or_else(|| CloudInitError::SecretNotFound {
            namespace: namespace.to_owned(),
            name: secret.name.clone(),
        })?;
        let labelled = found
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(CLOUD_INIT_LABEL))
            .map(String::as_str)
            == Some("true");
        if !labelled {
            return Err(CloudInitError::NotLabelled {
                namespace: namespace.to_owned(),
                name: secret.name.clone(),
            });
        }
        let data = found.data.unwrap_or_default();
        if let Some(bytes) = data.get(&secret.key) {
            return Ok(bytes.0.clone());
        }
        found
            .string_data
            .and_then(|s| s.get(&secret.key).map(|v| v.as_bytes().to_vec()))
            .ok_or_else(|| CloudInitError::MissingKey {
                namespace: namespace.to_owned(),
                name: secret.name.clone(),
                key: secret.key.clone(),
            })
    }

    async fn live_uids(&self) -> Result<HashSet<String>, StoreError> {
        let proxies = self.list_proxies().await?;
        Ok(proxies.into_iter().filter_map(|p| p.metadata.uid).collect())
    }

    async fn keys(&self) -> Result<Vec<ObjectKey>, StoreError> {
        Ok(self
            .list_proxies()
            .await?
            .into_iter()
            .filter_map(|p| Some(ObjectKey::new(p.metadata.namespace?, p.metadata.name?)))
            .collect())
    }

    async fn publish_event(&self, key: &ObjectKey, uid: &str, reason: &str, note: &str, warning: bool) {
        let event = kube_event(reason, note, warning);
        if let Err(e) = self.recorder.publish(&event, &reference("Proxy", key, uid)).await {
            tracing::debug!(proxy = %key, error = %e, "publishing a Kubernetes Event failed");
        }
    }
}

/// The Event reference of one of our objects (`kind`: `Proxy`, `ProxyPool`).
fn reference(kind: &str, key: &ObjectKey, uid: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("crawl.example.com/v1alpha1".into()),
        kind: Some(kind.into()),
        name: Some(key.name.clone()),
        namespace: Some(key.namespace.clone()),
        uid: Some(uid.to_owned()),
        ..ObjectReference::default()
    }
}

/// An Event of the operator's reconcile loops (notes cut to 1,000 characters).
fn kube_event(reason: &str, note: &str, warning: bool) -> KubeEvent {
    KubeEvent {
        type_: if warning {
            EventType::Warning
        } else {
            EventType::Normal
        },
        reason: reason.to_owned(),
        note: Some(note.chars().take(1000).collect()),
        action: "Reconcile".into(),
        secondary: None,
    }
}

/// Pools and their members on the API server. Members carry an
/// ownerReference to their pool; the API server's garbage collector
/// deletes them when the pool goes (their finalizer still holds each until
/// its instance is gone).
#[async_trait]
impl PoolStore for KubeStore {
    async fn get_pool(&self, key: &ObjectKey) -> Result<Option<ProxyPool>, StoreError> {
        Api::<ProxyPool>::namespaced(self.client.clone(), &key.namespace)
            .get_opt(&key.name)
            .instrument(api_span("get", "proxypools", Some(key)))
            .await
            .map_err(backend)
    }

    async fn pool_keys(&self) -> Result<Vec<ObjectKey>, StoreError> {
        let api: Api<ProxyPool> = match &self.namespace {
            Some(ns) => Api::namespaced(self.client.clone(), ns),
            None => Api::all(self.client.clone()),
        };
        let list = api
            .list(&ListParams::default())
            .instrument(api_span("list", "proxypools", None))
            .await
            .map_err(backend)?;
        Ok(list.items.iter().map(crate::store::pool_key).collect())
    }

    async fn members(&self, pool: &ProxyPool) -> Result<Vec<Proxy>, StoreError> {
        let key = crate::store::pool_key(pool);
        let selector = format!("{POOL_LABEL}={}", key.name);
        let list = self
            .proxies(&key.namespace)
            .list(&ListParams::default().labels(&selector))
            .instrument(api_span("list", "proxies", Some(&key)))
            .await
            .map_err(backend)?;
        // The label is a hint; the controller reference decides.
        Ok(list
            .items
            .into_iter()
            .filter(|p| crate::pool::is_member(p, pool))
            .collect())
    }

    async fn create_member(&self, member: &Proxy) -> Result<(), StoreError> {
        let key = ObjectKey::of(member);
        match self
            .proxies(&key.namespace)
            .create(&PostParams::default(), member)
            .instrument(api_span("create", "proxies", Some(&key)))
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if api_code(&e) == Some(409) => Err(StoreError::AlreadyExists(key)),
            Err(e) => Err(backend(e)),
        }
    }

    async fn delete_member(&self, key: &ObjectKey, uid: &str) -> Result<(), StoreError> {
        // Preconditions make the delete land on this incarnation only.
        let params = kube::api::DeleteParams {
            preconditions: Some(kube::api::Preconditions {
                uid: Some(uid.to_owned()),
                resource_version: None,
            }),
            ..Default::default()
        };
        match self
            .proxies(&key.namespace)
            .delete(&key.name, &params)
            .instrument(api_span("delete", "proxies", Some(key)))
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if matches!(api_code(&e), Some(404 | 409)) => Err(StoreError::Gone {
                key: key.clone(),
                uid: uid.to_owned(),
            }),
            Err(e) => Err(backend(e)),
        }
    }

    async fn write_pool_status(
        &self,
        key: &ObjectKey,
        uid: &str,
        status: &ProxyPoolStatus,
    ) -> Result<(), StoreError> {
        let value = serde_json::to_value(status).map_err(|e| StoreError::Backend(e.to_string()))?;
        let patch: json_patch::Patch = serde_json::from_value(json!([
            {"op": "test", "path": "/metadata/uid", "value": uid},
            {"op": "add", "path": "/status", "value": value},
        ]))
        .map_err(|e| StoreError::Backend(e.to_string()))?;
        match Api::<ProxyPool>::namespaced(self.client.clone(), &key.namespace)
            .patch_status(&key.name, &PatchParams::default(), &Patch::Json::<()>(patch))
            .instrument(api_span("patch", "proxypools/status", Some(key)))
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if matches!(api_code(&e), Some(404 | 422)) => Err(StoreError::Gone {
                key: key.clone(),
                uid: uid.to_owned(),
            }),
            Err(e) => Err(backend(e)),
        }
    }

    async fn publish_pool_event(
        &self,
        key: &ObjectKey,
        uid: &str,
        member: (&ObjectKey, &str),
        reason: &str,
        note: &str,
    ) {
        let event = KubeEvent {
            secondary: Some(reference("Proxy", member.0, member.1)),
            ..kube_event(reason, note, false)
        };
        if let Err(e) = self
            .recorder
            .publish(&event, &reference("ProxyPool", key, uid))
            .await
        {
            tracing::debug!(pool = %key, error = %e, "publishing a Kubernetes Event failed");
        }
    }
}

#[cfg(test)]
mod relist_tests {
    use super::*;

    #[test]
    fn a_relist_reveals_what_was_deleted_during_the_gap() {
        let k = |n: &str| ObjectKey::new("crawl", n);
        let mut known = Relisted::default();
        for n in ["a", "b", "c"] {
            known.seen(&k(n));
        }
        known.gone(&k("c"));
        // The watch broke; the re-list no longer has "b".
        known.relist_started();
        known.relisted(&k("a"));
        known.relisted(&k("d"));
        assert_eq!(known.relist_done(), [k("b")]);
        // The next re-list starts from what the last one listed.
        known.relist_started();
        known.relisted(&k("d"));
        assert_eq!(known.relist_done(), [k("a")]);
    }
}
