//! The pool side of the object-store port: ProxyPools and the Proxies they
//! own. Both stores keep Kubernetes' ownership semantics: a member names its
//! pool incarnation as controller owner, and when that pool is gone its
//! members are deleted (by the API server's garbage collector, or by the
//! embedded store itself).

use async_trait::async_trait;

use super::StoreError;
use crate::resource::ObjectKey;
use crate::resource::{Proxy, ProxyPool, ProxyPoolStatus};

/// The operations a pool's control loop needs from wherever pools are stored.
#[async_trait]
pub trait PoolStore: Send + Sync {
    /// The current pool, or `None` when it does not exist.
    async fn get_pool(&self, key: &ObjectKey) -> Result<Option<ProxyPool>, StoreError>;

    /// The key of every existing pool (a restarted registry checks that it
    /// runs one actor for each).
    async fn pool_keys(&self) -> Result<Vec<ObjectKey>, StoreError>;

    /// The Proxies this incarnation of `pool` owns, those being deleted included.
    async fn members(&self, pool: &ProxyPool) -> Result<Vec<Proxy>, StoreError>;

    /// Creates a member; [`StoreError::AlreadyExists`] when its name is taken.
    async fn create_member(&self, member: &Proxy) -> Result<(), StoreError>;

    /// Deletes a member (its finalizer holds it until its instance is gone).
    async fn delete_member(&self, key: &ObjectKey, uid: &str) -> Result<(), StoreError>;

    /// Replaces the pool's status (callers only write when it changed).
    async fn write_pool_status(
        &self,
        key: &ObjectKey,
        uid: &str,
        status: &ProxyPoolStatus,
    ) -> Result<(), StoreError>;

    /// Records a notable change of the pool concerning its `member` (key
    /// and incarnation) where users look for it: a Kubernetes Event on the
    /// ProxyPool, relating the member (so changes of different members are
    /// separate Events, not one series). Stores without such a place only
    /// log. Never fails the caller: an Event is a courtesy.
    async fn publish_pool_event(
        &self,
        key: &ObjectKey,
        uid: &str,
        member: (&ObjectKey, &str),
        reason: &str,
        note: &str,
    ) {
        let _ = uid;
        tracing::debug!(pool = %key, proxy = %member.0, reason, note, "event");
    }
}

/// The key of a pool (namespace `default` when unset).
pub fn pool_key(pool: &ProxyPool) -> ObjectKey {
    ObjectKey::new(
        pool.metadata.namespace.as_deref().unwrap_or("default"),
        pool.metadata.name.as_deref().unwrap_or_default(),
    )
}
