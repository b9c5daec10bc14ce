//! The Kubernetes adapter of the object-store port: Proxies through the API
//! server. Reads come from watch caches ([`WatchCache`]): Proxies,
//! ProxyPools, the operator's credentials Secrets and the labelled
//! cloud-init Secrets are each watched once, and a reconcile reads the
//! object it was woken for from memory, never with a GET. The one read
//! that still goes to the API server is an External proxy's credentials
//! Secret (any Secret the user names; the operator does not watch every
//! Secret), once per reconcile of that Proxy.
//!
//! Writes carry a JSON-patch `test` on the UID — and on the resourceVersion
//! for finalizer and annotation changes, retried on conflict once the cache
//! shows the newer version — so another controller's finalizers are never
//! clobbered and a write never lands on a new incarnation. Status goes
//! through the status subresource. A rotation of a cloud-init Secret
//! re-reconciles the Proxies that use it.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ObjectReference, Secret};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder, Reporter};
use kube::runtime::watcher::{self, Event};
use serde_json::json;
use tokio::sync::mpsc;

use tracing::Instrument;

use super::credentials_secret;
use crate::adapters::kube_client::watch_cache::WatchCache;
use crate::adapters::kube_client::watch_retry::retrying;
use crate::domain::credentials::ProxyCredentials;
use crate::domain::resource::ObjectKey;
use crate::domain::resource::{
    CLOUD_INIT_LABEL, FINALIZER, POOL_LABEL, Proxy, ProxyPool, ProxyPoolStatus, ProxyStatus, SecretKeyRef,
};
use crate::domain::resource_store::{CloudInitError, PoolStore, ProxyStore, StoreError, StoreEvent};

/// How long a read waits for a watch's first list before it fails (and
/// its reconcile is retried): the API server is down or the operator may
/// not list that kind.
const FIRST_LIST_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

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
    proxy_cache: WatchCache<Proxy>,
    pool_cache: WatchCache<ProxyPool>,
    /// The operator's own credentials Secrets (one per Managed Proxy).
    credentials_cache: WatchCache<Secret>,
    /// Secrets labelled for cloud-init.
    cloud_init_cache: WatchCache<Secret>,
    /// Writes being built or sent. A start of 10,000 Proxies queues
    /// thousands of status writes at once; they wait here as the typed
    /// status, and become JSON only when their turn comes.
    writing: tokio::sync::Semaphore,
}

/// Waits for `cache`'s first list, at most [`FIRST_LIST_WAIT`].
async fn listed<K>(cache: &WatchCache<K>, what: &str) -> Result<(), StoreError>
where
    K: kube::Resource<DynamicType = ()> + Clone + 'static,
{
    tokio::time::timeout(FIRST_LIST_WAIT, cache.ready())
        .await
        .map_err(|_| StoreError::Backend(format!("the watch of {what} has not listed them yet")))
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
    /// Follows one watch event; returns the changes to announce (after
    /// the event has been applied to the cache).
    fn follow<K>(&mut self, event: &Event<K>, key_of: impl Fn(&K) -> ObjectKey) -> Vec<StoreEvent> {
        match event {
            Event::Apply(o) => {
                let key = key_of(o);
                self.seen(&key);
                vec![StoreEvent::Changed(key)]
            }
            Event::Delete(o) => {
                let key = key_of(o);
                self.gone(&key);
                vec![StoreEvent::Removed(key)]
            }
            Event::Init => {
                self.relist_started();
                Vec::new()
            }
            Event::InitApply(o) => {
                self.relisted(&key_of(o));
                Vec::new()
            }
            Event::InitDone => {
                let relist = self.relist_done();
                let changed = relist.found.into_iter().map(StoreEvent::Changed);
                changed
                    .chain(relist.missing.into_iter().map(StoreEvent::Removed))
                    .collect()
            }
        }
    }

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

    /// What the re-list found, and the objects known before that it no longer has.
    fn relist_done(&mut self) -> Relist {
        let listed = self.listing.take().unwrap_or_default();
        let mut missing: Vec<ObjectKey> = self.known.difference(&listed).cloned().collect();
        missing.sort();
        let mut found: Vec<ObjectKey> = listed.iter().cloned().collect();
        found.sort();
        self.known = listed;
        Relist { found, missing }
    }
}

/// The outcome of a (re-)list. Its objects are announced only once the list
/// is complete: the cache shows a list's objects from its end on.
struct Relist {
    found: Vec<ObjectKey>,
    missing: Vec<ObjectKey>,
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
            proxy_cache: WatchCache::default(),
            pool_cache: WatchCache::default(),
            credentials_cache: WatchCache::default(),
            cloud_init_cache: WatchCache::default(),
            writing: tokio::sync::Semaphore::new(crate::adapters::kube_client::layer::MAX_IN_FLIGHT),
        };
        (store, rx)
    }

    fn proxies(&self, namespace: &str) -> Api<Proxy> {
        Api::namespaced(self.client.clone(), namespace)
    }

    /// A turn to build and send a write (never refused: the semaphore is never closed).
    async fn write_turn(&self) -> Option<tokio::sync::SemaphorePermit<'_>> {
        self.writing.acquire().await.ok()
    }

    /// Every Proxy in scope, as the watch cache shows them.
    async fn cached_proxies(&self) -> Result<Vec<Arc<Proxy>>, StoreError> {
        listed(&self.proxy_cache, "Proxies").await?;
        Ok(self.proxy_cache.all())
    }

    /// The Proxy at `key` as the watch cache shows it.
    async fn cached_proxy(&self, key: &ObjectKey) -> Result<Option<Arc<Proxy>>, StoreError> {
        listed(&self.proxy_cache, "Proxies").await?;
        Ok(self.proxy_cache.get(key))
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

    /// Watches ProxyPools until the stream ends, keeping the pool cache and
    /// sending each change to `events` (the pool registry's stream); a
    /// re-list removes pools deleted while the watch was down, as for Proxies.
    pub async fn watch_pools(self: Arc<Self>, events: mpsc::UnboundedSender<StoreEvent>) {
        let api: Api<ProxyPool> = match &self.namespace {
            Some(ns) => Api::namespaced(self.client.clone(), ns),
            None => Api::all(self.client.clone()),
        };
        let mut watch = std::pin::pin!(retrying(watcher(api, watcher::Config::default()), "ProxyPools"));
        let mut known = Relisted::default();
        let send = |event| {
            // No receiver: the system is shutting down.
            let _ = events.send(event);
        };
        while let Some(event) = watch.next().await {
            let announce = known.follow(&event, crate::domain::resource_store::pool_key);
            self.pool_cache.apply(event);
            announce.into_iter().for_each(send);
        }
    }

    /// Watches Proxies until the stream ends, keeping the Proxy cache; every
    /// change becomes an event once the cache shows it. The watcher re-lists
    /// and resumes by itself after errors and 410s, pausing as [`WatchRetry`](crate::adapters::kube_client::watch_retry::WatchRetry)
    /// says (at most 2 s while the API server does not answer, none before
    /// the re-list a 410 calls for). A re-list is compared with what was
    /// known: a Proxy deleted during the gap (its deletion never seen as an
    /// event) is removed all the same.
    pub async fn watch_proxies(self: Arc<Self>) {
        let proxies = watcher(self.all_proxies(), watcher::Config::default());
        let mut watch = std::pin::pin!(retrying(proxies, "Proxies"));
        let mut known = Relisted::default();
        while let Some(event) = watch.next().await {
            match &event {
                Event::Apply(p) | Event::InitApply(p) => self.remember_secret_use(&ObjectKey::of(p), p),
                Event::Delete(p) => self.forget_secret_use(&ObjectKey::of(p)),
                Event::Init | Event::InitDone => {}
            }
            let relisting = matches!(event, Event::InitDone);
            let announce = known.follow(&event, ObjectKey::of);
            self.proxy_cache.apply(event);
            for change in announce {
                if let StoreEvent::Removed(key) = &change {
                    if relisting {
                        tracing::info!(proxy = %key, "Proxy deleted while the watch was down");
                    }
                    self.forget_secret_use(key);
                }
                self.emit(change);
            }
        }
    }

    /// Watches the operator's credentials Secrets into their cache.
    pub async fn watch_credentials(self: Arc<Self>) {
        let api: Api<Secret> = match &self.namespace {
            Some(ns) => Api::namespaced(self.client.clone(), ns),
            None => Api::all(self.client.clone()),
        };
        let label = credentials_secret::CREDENTIALS_LABEL;
        let config = watcher::Config::default().labels(&format!("{label}=true"));
        self.credentials_cache
            .follow(watcher(api, config), "credentials Secrets")
            .await;
    }

    /// Watches labelled cloud-init Secrets into their cache; a content
    /// change re-reconciles their users.
    pub async fn watch_secrets(self: Arc<Self>) {
        let api: Api<Secret> = match &self.namespace {
            Some(ns) => Api::namespaced(self.client.clone(), ns),
            None => Api::all(self.client.clone()),
        };
        let config = watcher::Config::default().labels(&format!("{CLOUD_INIT_LABEL}=true"));
        let mut watch = std::pin::pin!(retrying(watcher(api, config), "cloud-init Secrets"));
        let mut known = Relisted::default();
        // A list's contents, told once the cache shows them.
        let mut listing: Vec<(ObjectKey, String)> = Vec::new();
        let digest = |s: &Secret| serde_json::to_string(&s.data).unwrap_or_default();
        while let Some(event) = watch.next().await {
            let changed: Vec<(ObjectKey, String)> = match &event {
                Event::Apply(s) => vec![(secret_key(s), digest(s))],
                Event::Delete(s) => vec![(secret_key(s), String::new())],
                Event::InitApply(s) => {
                    listing.push((secret_key(s), digest(s)));
                    Vec::new()
                }
                Event::Init => {
                    listing.clear();
                    Vec::new()
                }
                Event::InitDone => std::mem::take(&mut listing),
            };
            // Deleted during the gap: their users must notice.
            let gone: Vec<ObjectKey> = known
                .follow(&event, secret_key)
                .into_iter()
                .filter_map(|e| match e {
                    StoreEvent::Removed(key) => Some(key),
                    StoreEvent::Changed(_) => None,
                })
                .collect();
            self.cloud_init_cache.apply(event);
            for (key, digest) in changed {
                self.secret_changed(&key, digest);
            }
            for key in gone {
                self.secret_changed(&key, String::new());
            }
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

    /// Edits the Proxy with a resourceVersion guard: `edit` turns the
    /// current object into JSON-patch operations (none: nothing to do). A
    /// conflict is retried once the cache shows the version that won.
    async fn edit_guarded(
        &self,
        key: &ObjectKey,
        uid: &str,
        edit: impl Fn(&Proxy) -> Vec<serde_json::Value>,
    ) -> Result<(), StoreError> {
        let gone = || StoreError::Gone {
            key: key.clone(),
            uid: uid.to_owned(),
        };
        let api = self.proxies(&key.namespace);
        let _turn = self.write_turn().await;
        for _ in 0..CONFLICT_RETRIES {
            let current = self
                .cached_proxy(key)
                .await?
                .filter(|p| p.metadata.uid.as_deref() == Some(uid))
                .ok_or_else(gone)?;
            let edits = edit(&current);
            if edits.is_empty() {
                return Ok(());
            }
            let version = current.metadata.resource_version.clone();
            let mut ops = vec![
                json!({"op": "test", "path": "/metadata/uid", "value": uid}),
                json!({"op": "test", "path": "/metadata/resourceVersion", "value": version}),
            ];
            ops.extend(edits);
            let patch: json_patch::Patch = serde_json::from_value(serde_json::Value::Array(ops))
                .map_err(|e| StoreError::Backend(e.to_string()))?;
            let ticket = self.proxy_cache.ticket();
            match api
                .patch(&key.name, &PatchParams::default(), &Patch::Json::<()>(patch))
                .instrument(api_span("patch", "proxies", Some(key)))
                .await
            {
                Ok(written) => {
                    self.proxy_cache.wrote(ticket, written);
                    return Ok(());
                }
                // Someone else changed the object meanwhile (or it is another
                // incarnation): retry against what the watch shows next.
                Err(e) if matches!(api_code(&e), Some(409 | 422)) => {
                    self.proxy_cache.caught_up(key, version.as_deref()).await;
                }
                Err(e) if api_code(&e) == Some(404) => return Err(gone()),
                Err(e) => return Err(backend(e)),
            }
        }
        Err(StoreError::Backend(format!(
            "{key}: the object kept changing under us; will retry"
        )))
    }

    /// Rewrites the finalizer list (guarded as [`Self::edit_guarded`] says).
    async fn edit_finalizers(
        &self,
        key: &ObjectKey,
        uid: &str,
        edit: impl Fn(&mut Vec<String>),
    ) -> Result<(), StoreError> {
        self.edit_guarded(key, uid, |current| {
            let before = current.metadata.finalizers.clone().unwrap_or_default();
            let mut after = before.clone();
            edit(&mut after);
            if after == before {
                return Vec::new();
            }
            vec![json!({"op": "add", "path": "/metadata/finalizers", "value": after})]
        })
        .await
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
        let ticket = self.proxy_cache.ticket();
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
            Ok(written) => {
                self.proxy_cache.wrote(ticket, written);
                Ok(())
            }
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
        Ok(self.cached_proxy(key).await?.map(|p| p.as_ref().clone()))
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
        let path = format!("/metadata/annotations/{}", pointer(name));
        self.edit_guarded(key, uid, |current| {
            let annotations = current.metadata.annotations.as_ref();
            let now = annotations.and_then(|a| a.get(name)).map(String::as_str);
            if now == value {
                return Vec::new();
            }
            match (value, annotations.is_none_or(|a| a.is_empty())) {
                // The resourceVersion guard keeps a whole-map write from
                // dropping annotations the cache has not seen yet.
                (Some(v), true) => vec![
                    json!({"op": "add", "path": "/metadata/annotations", "value": BTreeMap::from([(name, v)])}),
                ],
                (Some(v), false) => vec![json!({"op": "add", "path": path, "value": v})],
                (None, _) => vec![json!({"op": "remove", "path": path})],
            }
        })
        .await
    }

    async fn write_status(&self, key: &ObjectKey, uid: &str, status: &ProxyStatus) -> Result<(), StoreError> {
        let _turn = self.write_turn().await;
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
        listed(&self.credentials_cache, "credentials Secrets").await?;
        let found = self.credentials_cache.get(&ObjectKey::new(&key.namespace, &name));
        if let Some(kept) = found
            .as_ref()
            .and_then(|s| credentials_secret::kept(s, uid, generation))
        {
            return Ok(kept);
        }
        let unusable = |e: crate::domain::credentials::CredentialsError| StoreError::Backend(e.to_string());
        let fresh = ProxyCredentials::generate(&crate::adapters::random::SystemRandom).map_err(unusable)?;
        let mut secret = credentials_secret::build(key, uid, generation, &fresh).map_err(unusable)?;
        // A racing writer makes this fail (conflict or exists); the retry
        // reads theirs once the watch has brought it.
        let ticket = self.credentials_cache.ticket();
        let written = match found {
            Some(old) => {
                secret.metadata.resource_version = old.metadata.resource_version.clone();
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
        self.credentials_cache.wrote(ticket, written);
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
        let failed = |reason: String| CloudInitError::Backend {
            namespace: namespace.to_owned(),
            name: secret.name.clone(),
            reason,
        };
        listed(&self.cloud_init_cache, "cloud-init Secrets")
            .await
            .map_err(|e| failed(e.to_string()))?;
        let cached = self
            .cloud_init_cache
            .get(&ObjectKey::new(namespace, &secret.name));
        let found = match cached {
            Some(found) => found.as_ref().clone(),
            // Not among the labelled ones: read it only to say why.
            None => Api::<Secret>::namespaced(self.client.clone(), namespace)
                .get_opt(&secret.name)
                .instrument(api_span("get", "secrets", None))
                .await
                .map_err(|e| failed(e.to_string()))?
                .ok_or_else(|| CloudInitError::SecretNotFound {
                    namespace: namespace.to_owned(),
                    name: secret.name.clone(),
                })?,
        };
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
        let proxies = self.cached_proxies().await?;
        Ok(proxies.iter().filter_map(|p| p.metadata.uid.clone()).collect())
    }

    async fn keys(&self) -> Result<Vec<ObjectKey>, StoreError> {
        let proxies = self.cached_proxies().await?;
        Ok(proxies.iter().map(|p| ObjectKey::of(p.as_ref())).collect())
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
        listed(&self.pool_cache, "ProxyPools").await?;
        Ok(self.pool_cache.get(key).map(|p| p.as_ref().clone()))
    }

    async fn pool_keys(&self) -> Result<Vec<ObjectKey>, StoreError> {
        listed(&self.pool_cache, "ProxyPools").await?;
        Ok(self
            .pool_cache
            .all()
            .iter()
            .map(|p| crate::domain::resource_store::pool_key(p))
            .collect())
    }

    async fn members(&self, pool: &ProxyPool) -> Result<Vec<Proxy>, StoreError> {
        let key = crate::domain::resource_store::pool_key(pool);
        let proxies = self.cached_proxies().await?;
        // The label is a hint; the controller reference decides.
        Ok(proxies
            .iter()
            .filter(|p| p.metadata.namespace.as_deref() == Some(key.namespace.as_str()))
            .filter(|p| {
                let label = p.metadata.labels.as_ref().and_then(|l| l.get(POOL_LABEL));
                label == Some(&key.name)
            })
            .filter(|p| crate::domain::pool::is_member(p, pool))
            .map(|p| p.as_ref().clone())
            .collect())
    }

    async fn create_member(&self, member: &Proxy) -> Result<(), StoreError> {
        let key = ObjectKey::of(member);
        // The pool's next turn must count it even before the watch brings it.
        let ticket = self.proxy_cache.ticket();
        match self
            .proxies(&key.namespace)
            .create(&PostParams::default(), member)
            .instrument(api_span("create", "proxies", Some(&key)))
            .await
        {
            Ok(created) => {
                self.proxy_cache.wrote(ticket, created);
                Ok(())
            }
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
        let ticket = self.proxy_cache.ticket();
        match self
            .proxies(&key.namespace)
            .delete(&key.name, &params)
            .instrument(api_span("delete", "proxies", Some(key)))
            .await
        {
            Ok(answer) => {
                // Held by its finalizer: the pool sees it leaving at once.
                if let Some(deleting) = answer.left() {
                    self.proxy_cache.wrote(ticket, deleting);
                }
                Ok(())
            }
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
        let _turn = self.write_turn().await;
        let value = serde_json::to_value(status).map_err(|e| StoreError::Backend(e.to_string()))?;
        let patch: json_patch::Patch = serde_json::from_value(json!([
            {"op": "test", "path": "/metadata/uid", "value": uid},
            {"op": "add", "path": "/status", "value": value},
        ]))
        .map_err(|e| StoreError::Backend(e.to_string()))?;
        let ticket = self.pool_cache.ticket();
        match Api::<ProxyPool>::namespaced(self.client.clone(), &key.namespace)
            .patch_status(&key.name, &PatchParams::default(), &Patch::Json::<()>(patch))
            .instrument(api_span("patch", "proxypools/status", Some(key)))
            .await
        {
            Ok(written) => {
                self.pool_cache.wrote(ticket, written);
                Ok(())
            }
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
        let relist = known.relist_done();
        assert_eq!(relist.missing, [k("b")]);
        assert_eq!(relist.found, [k("a"), k("d")]);
        // The next re-list starts from what the last one listed.
        known.relist_started();
        known.relisted(&k("d"));
        assert_eq!(known.relist_done().missing, [k("a")]);
    }
}
