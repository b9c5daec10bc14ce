//! The object-store port: where Proxy objects live and how the operator
//! changes them. Two adapters implement it (`egress_proxies::adapters::stores`) —
//! the Kubernetes API server and the embedded store of standalone mode —
//! so the same reconcile logic and actors run on both.
//!
//! The port follows Kubernetes semantics: every object has a UID for its
//! incarnation, finalizers hold a deleted object until the operator releases
//! it, and writes name the UID they expect so a write meant for an old
//! incarnation never lands on a new one.

mod pools;

use std::collections::HashSet;

use async_trait::async_trait;

use crate::credentials::ProxyCredentials;
use crate::resource::{ObjectKey, Proxy, ProxyStatus, SecretKeyRef};

pub use pools::{PoolStore, pool_key};

/// Something happened to an object; the receiver re-reads it (level-triggered).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreEvent {
    /// Created, changed, or marked for deletion.
    Changed(ObjectKey),
    /// Gone for good (deleted and every finalizer released).
    Removed(ObjectKey),
}

/// A store operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The object is gone, or is another incarnation than the caller meant.
    #[error("{key} (uid {uid}) no longer exists")]
    Gone { key: ObjectKey, uid: String },
    /// An object of that name exists already (creating a pool member).
    #[error("{0} already exists")]
    AlreadyExists(ObjectKey),
    #[error("store backend: {0}")]
    Backend(String),
}

/// A referenced Secret (cloud-init, External credentials) could not be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CloudInitError {
    #[error("Secret {namespace}/{name} not found")]
    SecretNotFound { namespace: String, name: String },
    #[error(
        "Secret {namespace}/{name} is not labelled crawl.example.com/cloud-init: \"true\" \
         (only labelled Secrets are watched)"
    )]
    NotLabelled { namespace: String, name: String },
    #[error("Secret {namespace}/{name} has no key {key:?}")]
    MissingKey {
        namespace: String,
        name: String,
        key: String,
    },
    #[error("reading Secret {namespace}/{name}: {reason}")]
    Backend {
        namespace: String,
        name: String,
        reason: String,
    },
}

/// The operations the reconcile logic needs from wherever Proxies are stored.
#[async_trait]
pub trait ProxyStore: Send + Sync {
    /// The current object, or `None` when it does not exist.
    async fn get(&self, key: &ObjectKey) -> Result<Option<Proxy>, StoreError>;

    /// Adds the operator's finalizer (no-op when present).
    async fn add_finalizer(&self, key: &ObjectKey, uid: &str) -> Result<(), StoreError>;

    /// Removes the operator's finalizer; a deleted object with no finalizer left goes away.
    async fn remove_finalizer(&self, key: &ObjectKey, uid: &str) -> Result<(), StoreError>;

    /// Sets (or with `None` clears) an annotation the operator owns.
    async fn set_annotation(
        &self,
        key: &ObjectKey,
        uid: &str,
        name: &str,
        value: Option<&str>,
    ) -> Result<(), StoreError>;

    /// Replaces the status (callers only write when it changed).
    async fn write_status(&self, key: &ObjectKey, uid: &str, status: &ProxyStatus) -> Result<(), StoreError>;

    /// The credentials of the Proxy's instances for spec generation
    /// `generation` (its spec hash): the ones kept for it, else new random
    /// ones, kept before they are returned. A new generation (a changed
    /// spec, a rotation) gets new credentials; they go with the Proxy.
    async fn proxy_credentials(
        &self,
        key: &ObjectKey,
        uid: &str,
        generation: &str,
    ) -> Result<ProxyCredentials, StoreError>;

    /// Reads one key of any Secret in `namespace` (an External proxy's
    /// credentials). Secrets are read when the Proxy is reconciled.
    async fn secret_key(&self, namespace: &str, name: &str, key: &str) -> Result<Vec<u8>, CloudInitError>;

    /// Reads cloud-init from a labelled Secret in `namespace`.
    async fn cloud_init(&self, namespace: &str, secret: &SecretKeyRef) -> Result<Vec<u8>, CloudInitError>;

    /// UIDs of every existing Proxy, including those being deleted (for orphan GC).
    async fn live_uids(&self) -> Result<HashSet<String>, StoreError>;

    /// The key of every existing Proxy (a restarted registry checks that it
    /// runs one actor for each).
    async fn keys(&self) -> Result<Vec<ObjectKey>, StoreError>;

    /// Records a notable change of the Proxy where users look for it
    /// (Kubernetes Events); stores without such a place only log.
    async fn publish_event(&self, key: &ObjectKey, uid: &str, reason: &str, note: &str, warning: bool) {
        let _ = (uid, warning);
        tracing::debug!(proxy = %key, reason, note, "event");
    }
}
