//! The embedded store of standalone mode: Proxy manifests from a directory
//! (watched for changes), state in a local database file.
//!
//! It plays the API server's part: it assigns UIDs, bumps `generation` on
//! spec changes, turns a removed manifest into a deletion (the object stays,
//! marked with a deletion timestamp, until its finalizers are released), and
//! keeps status, finalizers and the operator's annotations across restarts.

mod database;
mod file_lease_journal;
mod manifests;

use std::collections::{BTreeMap, HashSet};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use tokio::sync::mpsc;

use crate::domain::credentials::ProxyCredentials;
use crate::domain::resource::ObjectKey;
use crate::domain::resource::{
    CLOUD_INIT_LABEL, FINALIZER, Proxy, ProxyPool, ProxyPoolStatus, ProxyStatus, SPEC_HASH_ANNOTATION,
    SecretKeyRef,
};
use crate::domain::resource_store::{CloudInitError, PoolStore, ProxyStore, StoreError, StoreEvent};

pub use database::{Database, DatabaseError};
pub use file_lease_journal::{FileLeaseJournal, LEASES_DIR};
pub use manifests::{Document, Held, ManifestDir, ManifestSet, SecretDoc, parse_file};

/// File name of the state database inside the state directory.
pub const DATABASE_FILE: &str = "state.db";
/// Lock file keeping a second operator off the same state.
const LOCK_FILE: &str = "operator.lock";
/// Annotations the operator owns; a manifest cannot set or clear them.
const OPERATOR_ANNOTATIONS: [&str; 1] = [SPEC_HASH_ANNOTATION];

/// Opening the embedded store failed.
#[derive(Debug, thiserror::Error)]
pub enum EmbeddedStoreError {
    #[error("creating state directory {path}: {source}")]
    StateDir {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("state directory {0} is in use by another operator process")]
    Locked(String),
    #[error(transparent)]
    Database(#[from] DatabaseError),
}

struct Inner {
    db: Database,
    /// Boxed: a Proxy is a kilobyte, and a map node holds eleven values.
    objects: BTreeMap<ObjectKey, Box<Proxy>>,
    pools: BTreeMap<ObjectKey, ProxyPool>,
    secrets: BTreeMap<ObjectKey, SecretDoc>,
}

impl Inner {
    /// The copy here made what the state file holds again.
    fn reload(&mut self) -> Result<(), DatabaseError> {
        self.objects = load_objects(&self.db)?;
        self.pools = load_pools(&self.db)?;
        Ok(())
    }

    /// Whether `proxy` is a member of a pool that exists (that incarnation).
    fn owned_by_live_pool(&self, proxy: &Proxy) -> bool {
        controller_pool_uid(proxy).is_some_and(|uid| {
            self.pools
                .values()
                .any(|pool| pool.metadata.uid.as_deref() == Some(uid))
        })
    }
}

fn load_objects(db: &Database) -> Result<BTreeMap<ObjectKey, Box<Proxy>>, DatabaseError> {
    Ok(db
        .load_all()?
        .into_iter()
        .map(|p| (ObjectKey::of(&p), Box::new(p)))
        .collect())
}

fn load_pools(db: &Database) -> Result<BTreeMap<ObjectKey, ProxyPool>, DatabaseError> {
    Ok(db
        .load_pools()?
        .into_iter()
        .map(|p| (crate::domain::resource_store::pool_key(&p), p))
        .collect())
}

/// The pool incarnation a Proxy names as its controller, if any.
fn controller_pool_uid(proxy: &Proxy) -> Option<&str> {
    proxy
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true) && o.kind == "ProxyPool")
        .map(|o| o.uid.as_str())
}

/// Proxies and ProxyPools from manifests (pool members made by the
/// operator), state in SQLite.
pub struct EmbeddedStore {
    inner: Mutex<Inner>,
    events: mpsc::UnboundedSender<StoreEvent>,
    pool_events: mpsc::UnboundedSender<StoreEvent>,
    pool_receiver: Mutex<Option<mpsc::UnboundedReceiver<StoreEvent>>>,
    _lock: File,
}

impl EmbeddedStore {
    /// Opens the state in `state_dir` (created when missing). Events about
    /// manifest-driven changes arrive on the returned receiver.
    pub fn open(state_dir: &Path) -> Result<(Self, mpsc::UnboundedReceiver<StoreEvent>), EmbeddedStoreError> {
        let shown = state_dir.display().to_string();
        let state_error = |source| EmbeddedStoreError::StateDir {
            path: shown.clone(),
            source,
        };
        crate::private_files::private_dir(state_dir).map_err(state_error)?;
        let lock = crate::private_files::create_private(&state_dir.join(LOCK_FILE)).map_err(state_error)?;
        lock.try_lock()
            .map_err(|_| EmbeddedStoreError::Locked(shown.clone()))?;
        let db_path = state_dir.join(DATABASE_FILE);
        // SQLite would create its files 0644; its -wal and -shm files take the
        // database's mode, so a database made private first keeps all three so.
        if !db_path.exists() {
            crate::private_files::create_private(&db_path).map_err(state_error)?;
        }
        let db = Database::open(&db_path)?;
        for suffix in ["", "-wal", "-shm"] {
            let path = state_dir.join(format!("{DATABASE_FILE}{suffix}"));
            if path.exists() {
                crate::private_files::make_private(&path).map_err(state_error)?;
            }
        }
        let (objects, pools) = (load_objects(&db)?, load_pools(&db)?);
        let (events, rx) = mpsc::unbounded_channel();
        let (pool_events, pool_rx) = mpsc::unbounded_channel();
        let store = Self {
            inner: Mutex::new(Inner {
                db,
                objects,
                pools,
                secrets: BTreeMap::new(),
            }),
            events,
            pool_events,
            pool_receiver: Mutex::new(Some(pool_rx)),
            _lock: lock,
        };
        Ok((store, rx))
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves plain data behind; keep serving it.
        self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn emit(&self, event: StoreEvent) {
        // No receiver means the system is shutting down; nothing to tell.
        let _ = self.events.send(event);
    }

    fn emit_pool(&self, event: StoreEvent) {
        let _ = self.pool_events.send(event);
    }

    /// Events about ProxyPools (the first caller gets them; `None` after).
    pub fn pool_events(&self) -> Option<mpsc::UnboundedReceiver<StoreEvent>> {
        self.pool_receiver
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take()
    }

    /// This installation's id, kept in the state database (see
    /// [`Database::installation_id`]).
    pub fn installation_id(
        &self,
        configured: Option<&crate::domain::installation::InstallationId>,
    ) -> Result<crate::domain::installation::InstallationId, EmbeddedStoreError> {
        Ok(self.lock().db.installation_id(configured)?)
    }

    /// Announces every stored object (at start, so each gets reconciled).
    pub fn resync(&self) {
        let (keys, pools): (Vec<ObjectKey>, Vec<ObjectKey>) = {
            let inner = self.lock();
            (
                inner.objects.keys().cloned().collect(),
                inner.pools.keys().cloned().collect(),
            )
        };
        for key in keys {
            self.emit(StoreEvent::Changed(key));
        }
        for key in pools {
            self.emit_pool(StoreEvent::Changed(key));
        }
    }

    /// Every stored object.
    pub fn list(&self) -> Vec<Proxy> {
        self.lock().objects.values().map(|p| (**p).clone()).collect()
    }

    /// Every stored pool.
    pub fn list_pools(&self) -> Vec<ProxyPool> {
        self.lock().pools.values().cloned().collect()
    }

    /// Makes the stored objects match the manifests: new ones are created,
    /// changed specs bump `generation`, missing ones are deleted (held by
    /// their finalizers until released), and those a broken file declared
    /// ([`ManifestSet::held`]) stay as they are. Pool members are the
    /// operator's, not the manifests': they go when their pool goes.
    pub fn apply(&self, set: &ManifestSet) -> Result<(), StoreError> {
        let news = {
            let mut guard = self.lock();
            let inner = &mut *guard;
            // One transaction: a fleet's manifests cost one sync, and a
            // failure part way leaves the file, and the copy here, as they were.
            let secrets_before = inner.secrets.clone();
            inner.db.begin().map_err(backend)?;
            match apply_in(inner, set).and_then(|news| inner.db.commit().map(|()| news).map_err(backend)) {
                Ok(news) => news,
                Err(e) => {
                    inner.db.rollback();
                    inner.secrets = secrets_before;
                    inner.reload().map_err(backend)?;
                    return Err(e);
                }
            }
        };
        news.changed
            .into_iter()
            .for_each(|k| self.emit(StoreEvent::Changed(k)));
        news.removed
            .into_iter()
            .for_each(|k| self.emit(StoreEvent::Removed(k)));
        news.pools_changed
            .into_iter()
            .for_each(|k| self.emit_pool(StoreEvent::Changed(k)));
        news.pools_removed
            .into_iter()
            .for_each(|k| self.emit_pool(StoreEvent::Removed(k)));
        Ok(())
    }

    /// Applies `change` to the object if it is still incarnation `uid`, and persists it.
    fn mutate(
        &self,
        key: &ObjectKey,
        uid: &str,
        durability: Durability,
        change: impl FnOnce(&mut Proxy),
    ) -> Result<(), StoreError> {
        let mut removed = false;
        let mut relabelled = false;
        {
            let mut inner = self.lock();
            let gone = || StoreError::Gone {
                key: key.clone(),
                uid: uid.to_owned(),
            };
            let current = inner.objects.get(key).ok_or_else(gone)?;
            if current.metadata.uid.as_deref() != Some(uid) {
                return Err(gone());
            }
            let mut next = current.clone();
            change(&mut next);
            if &next == current {
                return Ok(());
            }
            let released = next.metadata.deletion_timestamp.is_some()
                && next.metadata.finalizers.as_ref().is_none_or(Vec::is_empty);
            if released {
                inner.db.delete(key).map_err(backend)?;
                inner.objects.remove(key);
                removed = true;
            } else {
                // A pool retiring its member, or deleting it, must reach the
                // member's actor. The actor's own writes (its spec hash, its
                // finalizer) are no news to it: an event for them would make
                // it look again, and retry what must wait.
                let retiring = |p: &Proxy| {
                    p.metadata
                        .annotations
                        .as_ref()
                        .and_then(|a| a.get(crate::domain::resource::RETIRING_ANNOTATION).cloned())
                };
                relabelled = retiring(&next) != retiring(current)
                    || next.metadata.deletion_timestamp != current.metadata.deletion_timestamp;
                match durability {
                    Durability::Synced => inner.db.put(&next),
                    Durability::Observed => inner.db.put_unsynced(&next),
                }
                .map_err(backend)?;
                inner.objects.insert(key.clone(), next);
            }
        }
        if removed {
            self.emit(StoreEvent::Removed(key.clone()));
        } else if relabelled {
            self.emit(StoreEvent::Changed(key.clone()));
        }
        Ok(())
    }
}

/// What an applied declaration changed, for the events sent once it is stored.
#[derive(Default)]
struct AppliedChanges {
    changed: Vec<ObjectKey>,
    removed: Vec<ObjectKey>,
    pools_changed: Vec<ObjectKey>,
    pools_removed: Vec<ObjectKey>,
}

/// The body of [`EmbeddedStore::apply`], inside its transaction.
fn apply_in(inner: &mut Inner, set: &ManifestSet) -> Result<AppliedChanges, StoreError> {
    let mut news = AppliedChanges::default();
    for (key, declared) in &set.pools {
        let next = match inner.pools.get(key) {
            Some(existing) => merge_pool(existing, declared),
            None => Some(create_pool(declared)),
        };
        if let Some(next) = next {
            inner.db.put_pool(&next).map_err(backend)?;
            inner.pools.insert(key.clone(), next);
            news.pools_changed.push(key.clone());
        }
    }
    let pools_gone: Vec<ObjectKey> = inner
        .pools
        .keys()
        .filter(|k| !set.pools.contains_key(*k) && !set.held.pools.contains(*k))
        .cloned()
        .collect();
    for key in pools_gone {
        inner.db.delete_pool(&key).map_err(backend)?;
        inner.pools.remove(&key);
        news.pools_removed.push(key);
    }
    let mut secrets = set.secrets.clone();
    for key in &set.held.secrets {
        if let Some(kept) = inner.secrets.get(key) {
            secrets.insert(key.clone(), kept.clone());
        }
    }
    // Proxies whose cloud-init Secret changed must be looked at again.
    let changed_secrets: HashSet<ObjectKey> = secrets
        .keys()
        .chain(inner.secrets.keys())
        .filter(|k| secrets.get(*k) != inner.secrets.get(*k))
        .cloned()
        .collect();
    news.changed.extend(
        inner
            .objects
            .iter()
            .filter(|(k, p)| {
                let secret = p.spec.cloud_init.as_ref().and_then(|c| c.secret_ref.as_ref());
                secret.is_some_and(|s| changed_secrets.contains(&ObjectKey::new(&k.namespace, &s.name)))
            })
            .map(|(k, _)| k.clone()),
    );
    inner.secrets = secrets;
    for (key, declared) in &set.proxies {
        let next = match inner.objects.get(key) {
            // A pool's member keeps its name until it is gone.
            Some(existing) if controller_pool_uid(existing).is_some() => {
                tracing::warn!(proxy = %key, "a manifest declares a Proxy that is a pool's member; ignored");
                continue;
            }
            // A deleting object finishes first; a re-added manifest
            // becomes a new incarnation once it is gone.
            Some(existing) if existing.metadata.deletion_timestamp.is_some() => continue,
            Some(existing) => merge(existing, declared),
            None => Some(create(declared)),
        };
        if let Some(next) = next {
            inner.db.put(&next).map_err(backend)?;
            inner.objects.insert(key.clone(), Box::new(next));
            news.changed.push(key.clone());
        }
    }
    let gone: Vec<ObjectKey> = inner
        .objects
        .iter()
        .filter(|(k, p)| {
            !set.proxies.contains_key(*k)
                && !set.held.proxies.contains(*k)
                && p.metadata.deletion_timestamp.is_none()
                && !inner.owned_by_live_pool(p)
        })
        .map(|(k, _)| k.clone())
        .collect();
    for key in gone {
        let Some(mut proxy) = inner.objects.get(&key).cloned() else {
            continue;
        };
        if proxy.metadata.finalizers.as_ref().is_none_or(Vec::is_empty) {
            inner.db.delete(&key).map_err(backend)?;
            inner.objects.remove(&key);
            news.removed.push(key);
        } else {
            proxy.metadata.deletion_timestamp = Some(now());
            inner.db.put(&proxy).map_err(backend)?;
            inner.objects.insert(key.clone(), proxy);
            news.changed.push(key);
        }
    }
    Ok(news)
}

/// How soon a write must be on the disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Durability {
    /// Before the call returns: what the operator decided (finalizers,
    /// annotations, deletions).
    Synced,
    /// Observed state (status), probed and reconciled afresh after every
    /// start: committed without waiting for the disk. A killed process
    /// loses none of it; a power cut at most what came after the last
    /// synced write, which carries every earlier one to the disk with it.
    Observed,
}

fn backend(e: DatabaseError) -> StoreError {
    StoreError::Backend(e.to_string())
}

/// Now, in whole seconds: what a timestamp keeps once stored (and what the
/// API server keeps), so the copy here and the file agree.
fn now() -> Time {
    let now = jiff::Timestamp::now();
    Time(jiff::Timestamp::from_second(now.as_second()).unwrap_or(now))
}

/// A new incarnation of a declared Proxy.
fn create(declared: &Proxy) -> Proxy {
    let mut proxy = declared.clone();
    proxy.metadata.uid = Some(uuid::Uuid::new_v4().to_string());
    proxy.metadata.generation = Some(1);
    proxy.metadata.creation_timestamp = Some(now());
    if let Some(annotations) = proxy.metadata.annotations.as_mut() {
        annotations.retain(|k, _| !OPERATOR_ANNOTATIONS.contains(&k.as_str()));
    }
    proxy
}

/// A new incarnation of a declared pool.
fn create_pool(declared: &ProxyPool) -> ProxyPool {
    let mut pool = declared.clone();
    pool.metadata.uid = Some(uuid::Uuid::new_v4().to_string());
    pool.metadata.generation = Some(1);
    pool.metadata.creation_timestamp = Some(now());
    pool
}

/// The stored pool updated with a manifest's user-owned fields, or `None` when nothing changed.
fn merge_pool(existing: &ProxyPool, declared: &ProxyPool) -> Option<ProxyPool> {
    let mut next = existing.clone();
    if next.spec != declared.spec {
        next.spec = declared.spec.clone();
        next.metadata.generation = Some(existing.metadata.generation.unwrap_or(0) + 1);
    }
    next.metadata.labels = declared.metadata.labels.clone();
    next.metadata.annotations = declared.metadata.annotations.clone();
    (&next != existing).then_some(next)
}

/// The stored object updated with a manifest's user-owned fields, or `None` when nothing changed.
fn merge(existing: &Proxy, declared: &Proxy) -> Option<Proxy> {
    let mut next = existing.clone();
    if next.spec != declared.spec {
        next.spec = declared.spec.clone();
        next.metadata.generation = Some(existing.metadata.generation.unwrap_or(0) + 1);
    }
    next.metadata.labels = declared.metadata.labels.clone();
    let mut annotations: BTreeMap<String, String> = declared.metadata.annotations.clone().unwrap_or_default();
    annotations.retain(|k, _| !OPERATOR_ANNOTATIONS.contains(&k.as_str()));
    for owned in OPERATOR_ANNOTATIONS {
        if let Some(v) = existing.metadata.annotations.as_ref().and_then(|a| a.get(owned)) {
            annotations.insert(owned.to_owned(), v.clone());
        }
    }
    next.metadata.annotations = (!annotations.is_empty()).then_some(annotations);
    (&next != existing).then_some(next)
}

#[async_trait]
impl ProxyStore for EmbeddedStore {
    async fn get(&self, key: &ObjectKey) -> Result<Option<Proxy>, StoreError> {
        Ok(self.lock().objects.get(key).map(|p| (**p).clone()))
    }

    async fn add_finalizer(&self, key: &ObjectKey, uid: &str) -> Result<(), StoreError> {
        self.mutate(key, uid, Durability::Synced, |p| {
            let finalizers = p.metadata.finalizers.get_or_insert_with(Vec::new);
            if !finalizers.iter().any(|f| f == FINALIZER) {
                finalizers.push(FINALIZER.to_owned());
            }
        })
    }

    async fn remove_finalizer(&self, key: &ObjectKey, uid: &str) -> Result<(), StoreError> {
        self.mutate(key, uid, Durability::Synced, |p| {
            if let Some(finalizers) = p.metadata.finalizers.as_mut() {
                finalizers.retain(|f| f != FINALIZER);
                if finalizers.is_empty() {
                    p.metadata.finalizers = None;
                }
            }
        })
    }

    async fn set_annotation(
        &self,
        key: &ObjectKey,
        uid: &str,
        name: &str,
        value: Option<&str>,
    ) -> Result<(), StoreError> {
        self.mutate(key, uid, Durability::Synced, |p| {
            let annotations = p.metadata.annotations.get_or_insert_with(BTreeMap::new);
            match value {
                Some(v) => {
                    annotations.insert(name.to_owned(), v.to_owned());
                }
                None => {
                    annotations.remove(name);
                }
            }
            if annotations.is_empty() {
                p.metadata.annotations = None;
            }
        })
    }

    async fn write_status(&self, key: &ObjectKey, uid: &str, status: &ProxyStatus) -> Result<(), StoreError> {
        self.mutate(key, uid, Durability::Observed, |p| {
            p.status = Some(status.clone())
        })
    }

    async fn proxy_credentials(
        &self,
        key: &ObjectKey,
        uid: &str,
        generation: &str,
    ) -> Result<ProxyCredentials, StoreError> {
        let inner = self.lock();
        if inner.objects.get(key).and_then(|p| p.metadata.uid.as_deref()) != Some(uid) {
            return Err(StoreError::Gone {
                key: key.clone(),
                uid: uid.to_owned(),
            });
        }
        if let Some(kept) = inner.db.credentials(key, uid, generation).map_err(backend)? {
            return Ok(kept);
        }
        let fresh = ProxyCredentials::generate(&crate::adapters::random::SystemRandom)
            .map_err(|e| StoreError::Backend(e.to_string()))?;
        inner
            .db
            .put_credentials(key, uid, generation, &fresh)
            .map_err(backend)?;
        Ok(fresh)
    }

    async fn secret_key(&self, namespace: &str, name: &str, key: &str) -> Result<Vec<u8>, CloudInitError> {
        let inner = self.lock();
        let doc = inner
            .secrets
            .get(&ObjectKey::new(namespace, name))
            .ok_or_else(|| CloudInitError::SecretNotFound {
                namespace: namespace.to_owned(),
                name: name.to_owned(),
            })?;
        doc.data
            .get(key)
            .cloned()
            .ok_or_else(|| CloudInitError::MissingKey {
                namespace: namespace.to_owned(),
                name: name.to_owned(),
                key: key.to_owned(),
            })
    }

    async fn cloud_init(&self, namespace: &str, secret: &SecretKeyRef) -> Result<Vec<u8>, CloudInitError> {
        let inner = self.lock();
        let doc = inner
            .secrets
            .get(&ObjectKey::new(namespace, &secret.name))
            .ok_or_else(|| CloudInitError::SecretNotFound {
                namespace: namespace.to_owned(),
                name: secret.name.clone(),
            })?;
        if doc.labels.get(CLOUD_INIT_LABEL).map(String::as_str) != Some("true") {
            return Err(CloudInitError::NotLabelled {
                namespace: namespace.to_owned(),
                name: secret.name.clone(),
            });
        }
        doc.data
            .get(&secret.key)
            .cloned()
            .ok_or_else(|| CloudInitError::MissingKey {
                namespace: namespace.to_owned(),
                name: secret.name.clone(),
                key: secret.key.clone(),
            })
    }

    async fn live_uids(&self) -> Result<HashSet<String>, StoreError> {
        Ok(self
            .lock()
            .objects
            .values()
            .filter_map(|p| p.metadata.uid.clone())
            .collect())
    }

    async fn keys(&self) -> Result<Vec<ObjectKey>, StoreError> {
        Ok(self.lock().objects.keys().cloned().collect())
    }
}

#[async_trait]
impl PoolStore for EmbeddedStore {
    async fn get_pool(&self, key: &ObjectKey) -> Result<Option<ProxyPool>, StoreError> {
        Ok(self.lock().pools.get(key).cloned())
    }

    async fn pool_keys(&self) -> Result<Vec<ObjectKey>, StoreError> {
        Ok(self.lock().pools.keys().cloned().collect())
    }

    async fn members(&self, pool: &ProxyPool) -> Result<Vec<Proxy>, StoreError> {
        let Some(uid) = pool.metadata.uid.as_deref() else {
            return Ok(Vec::new());
        };
        Ok(self
            .lock()
            .objects
            .values()
            .filter(|p| controller_pool_uid(p) == Some(uid))
            .map(|p| (**p).clone())
            .collect())
    }

    async fn create_member(&self, member: &Proxy) -> Result<(), StoreError> {
        let key = ObjectKey::of(member);
        {
            let mut inner = self.lock();
            if inner.objects.contains_key(&key) {
                return Err(StoreError::AlreadyExists(key));
            }
            // Like the API server, refuse a member whose owner is already gone.
            if !inner.owned_by_live_pool(member) {
                return Err(StoreError::Backend(format!(
                    "{key}: its owning ProxyPool no longer exists"
                )));
            }
            let created = create(member);
            inner.db.put(&created).map_err(backend)?;
            inner.objects.insert(key.clone(), Box::new(created));
        }
        self.emit(StoreEvent::Changed(key));
        Ok(())
    }

    async fn delete_member(&self, key: &ObjectKey, uid: &str) -> Result<(), StoreError> {
        self.mutate(key, uid, Durability::Synced, |p| {
            if p.metadata.deletion_timestamp.is_none() {
                p.metadata.deletion_timestamp = Some(now());
            }
        })
    }

    async fn write_pool_status(
        &self,
        key: &ObjectKey,
        uid: &str,
        status: &ProxyPoolStatus,
    ) -> Result<(), StoreError> {
        let mut inner = self.lock();
        let gone = || StoreError::Gone {
            key: key.clone(),
            uid: uid.to_owned(),
        };
        let current = inner.pools.get(key).ok_or_else(gone)?;
        if current.metadata.uid.as_deref() != Some(uid) {
            return Err(gone());
        }
        let mut next = current.clone();
        next.status = Some(status.clone());
        if &next != current {
            inner.db.put_pool_unsynced(&next).map_err(backend)?;
            inner.pools.insert(key.clone(), next);
        }
        Ok(())
    }
}

/// Keeps the store in step with the manifest directory: rescans every
/// `interval`, applies changes, and logs problems when they change.
pub async fn watch_manifests(store: Arc<EmbeddedStore>, dir: ManifestDir, interval: Duration) {
    let mut reported: Vec<String> = Vec::new();
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let path = dir.path().to_owned();
    let mut dir = Some(dir);
    // The first scan always applies: an empty directory deletes what the state still holds.
    let mut first = true;
    loop {
        ticker.tick().await;
        let mut scanning = dir.take().unwrap_or_else(|| ManifestDir::new(&path));
        let must_apply = std::mem::take(&mut first);
        let store = store.clone();
        // Reading, parsing and storing a fleet of manifests takes a while:
        // on a blocking thread, the actors on this one keep running.
        let scanned = tokio::task::spawn_blocking(move || {
            let scan = rescan(&store, &mut scanning, must_apply);
            (scanning, scan)
        })
        .await;
        match scanned {
            Ok((back, scan)) => {
                dir = Some(back);
                match scan {
                    Scan::Unchanged => {}
                    // Not applied yet: the next scan must.
                    Scan::Unreadable => first = must_apply,
                    Scan::NotStored => first = true,
                    Scan::Applied(problems) if problems != reported => {
                        for problem in &problems {
                            tracing::error!(problem = %problem, "manifest rejected");
                        }
                        reported = problems;
                    }
                    Scan::Applied(_) => {}
                }
            }
            Err(e) => {
                // Start afresh from the files: the next scan reads them all.
                tracing::error!(error = %e, "scanning the manifest directory failed");
                first = true;
            }
        }
    }
}

/// What one scan of the manifest directory did.
enum Scan {
    Unchanged,
    /// The directory could not be listed; nothing was applied.
    Unreadable,
    /// The state file refused the declaration; nothing of it was applied.
    NotStored,
    /// The declaration went to the store; the problems found in it.
    Applied(Vec<String>),
}

/// One scan: when something changed (or `must_apply`), the merged
/// declaration goes to the store.
fn rescan(store: &EmbeddedStore, dir: &mut ManifestDir, must_apply: bool) -> Scan {
    let set = match dir.scan(must_apply) {
        Ok(None) => return Scan::Unchanged,
        Ok(Some(set)) => set,
        Err(e) => {
            tracing::error!(dir = %dir.path().display(), error = %e, "cannot read the manifest directory");
            return Scan::Unreadable;
        }
    };
    if let Err(e) = store.apply(&set) {
        tracing::error!(error = %e, "applying manifests to the state database failed; the next scan tries again");
        return Scan::NotStored;
    }
    Scan::Applied(set.problems)
}

/// Reads the stored objects without taking the operator's lock (for `get proxies`).
pub fn read_snapshot(state_dir: &Path) -> Result<Vec<Proxy>, DatabaseError> {
    let path: PathBuf = state_dir.join(DATABASE_FILE);
    Database::open_read_only(&path)?.load_all()
}

/// Reads the stored pools without taking the operator's lock (for `get pools`).
pub fn read_pools_snapshot(state_dir: &Path) -> Result<Vec<ProxyPool>, DatabaseError> {
    let path: PathBuf = state_dir.join(DATABASE_FILE);
    Database::open_read_only(&path)?.load_pools()
}

#[cfg(test)]
mod pool_tests;
#[cfg(test)]
mod tests;
