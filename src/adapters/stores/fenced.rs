//! Store ports fenced by the leader's [`Tenure`]: a replica whose tenure
//! ran out neither reads nor writes (reconciles, status, finalizers,
//! Events, orphan GC and pool turns all stop at that instant).

use std::sync::Arc;

use async_trait::async_trait;

use crate::adapters::leader::Tenure;
use crate::domain::resource::{ObjectKey, Proxy, ProxyPool, ProxyPoolStatus, ProxyStatus, SecretKeyRef};

use crate::domain::resource_store::{CloudInitError, PoolStore, ProxyStore, StoreError};

/// `Ok` while leading; else the error every fenced store answers with.
fn fence(tenure: &Tenure) -> Result<(), StoreError> {
    if tenure.is_leading() {
        Ok(())
    } else {
        Err(StoreError::Backend(
            "not the leader: its leadership lapsed".to_owned(),
        ))
    }
}

/// A [`ProxyStore`] that answers only while the [`Tenure`] lasts: a leader
/// whose tenure ran out neither reads nor writes Proxies (reconciles, status,
/// finalizers, Events, orphan GC all stop at that instant).
pub struct FencedStore {
    inner: Arc<dyn ProxyStore>,
    tenure: Tenure,
}

impl FencedStore {
    pub fn new(inner: Arc<dyn ProxyStore>, tenure: Tenure) -> Self {
        Self { inner, tenure }
    }

    fn check(&self) -> Result<(), StoreError> {
        fence(&self.tenure)
    }
}

#[async_trait]
impl ProxyStore for FencedStore {
    async fn get(&self, key: &ObjectKey) -> Result<Option<Proxy>, StoreError> {
        self.check()?;
        self.inner.get(key).await
    }

    async fn add_finalizer(&self, key: &ObjectKey, uid: &str) -> Result<(), StoreError> {
        self.check()?;
        self.inner.add_finalizer(key, uid).await
    }

    async fn remove_finalizer(&self, key: &ObjectKey, uid: &str) -> Result<(), StoreError> {
        self.check()?;
        self.inner.remove_finalizer(key, uid).await
    }

    async fn set_annotation(
        &self,
        key: &ObjectKey,
        uid: &str,
        name: &str,
        value: Option<&str>,
    ) -> Result<(), StoreError> {
        self.check()?;
        self.inner.set_annotation(key, uid, name, value).await
    }

    async fn write_status(&self, key: &ObjectKey, uid: &str, status: &ProxyStatus) -> Result<(), StoreError> {
        self.check()?;
        self.inner.write_status(key, uid, status).await
    }

    async fn proxy_credentials(
        &self,
        key: &ObjectKey,
        uid: &str,
        generation: &str,
    ) -> Result<crate::domain::credentials::ProxyCredentials, StoreError> {
        self.check()?;
        self.inner.proxy_credentials(key, uid, generation).await
    }

    async fn secret_key(&self, namespace: &str, name: &str, key: &str) -> Result<Vec<u8>, CloudInitError> {
        if !self.tenure.is_leading() {
            return Err(CloudInitError::Backend {
                namespace: namespace.to_owned(),
                name: name.to_owned(),
                reason: "not the leader: its leadership lapsed".to_owned(),
            });
        }
        self.inner.secret_key(namespace, name, key).await
    }

    async fn cloud_init(&self, namespace: &str, secret: &SecretKeyRef) -> Result<Vec<u8>, CloudInitError> {
        if !self.tenure.is_leading() {
            return Err(CloudInitError::Backend {
                namespace: namespace.to_owned(),
                name: secret.name.clone(),
                reason: "not the leader: its leadership lapsed".to_owned(),
            });
        }
        self.inner.cloud_init(namespace, secret).await
    }

    async fn live_uids(&self) -> Result<std::collections::HashSet<String>, StoreError> {
        self.check()?;
        self.inner.live_uids().await
    }

    async fn keys(&self) -> Result<Vec<ObjectKey>, StoreError> {
        self.check()?;
        self.inner.keys().await
    }

    async fn publish_event(&self, key: &ObjectKey, uid: &str, reason: &str, note: &str, warning: bool) {
        if self.tenure.is_leading() {
            self.inner.publish_event(key, uid, reason, note, warning).await;
        }
    }
}

/// A [`PoolStore`] fenced like [`FencedStore`]: a leader whose tenure ran
/// out neither makes, retires nor deletes pool members.
pub struct FencedPools {
    inner: Arc<dyn PoolStore>,
    tenure: Tenure,
}

impl FencedPools {
    pub fn new(inner: Arc<dyn PoolStore>, tenure: Tenure) -> Self {
        Self { inner, tenure }
    }

    fn check(&self) -> Result<(), StoreError> {
        fence(&self.tenure)
    }
}

#[async_trait]
impl PoolStore for FencedPools {
    async fn get_pool(&self, key: &ObjectKey) -> Result<Option<ProxyPool>, StoreError> {
        self.check()?;
        self.inner.get_pool(key).await
    }

    async fn pool_keys(&self) -> Result<Vec<ObjectKey>, StoreError> {
        self.check()?;
        self.inner.pool_keys().await
    }

    async fn members(&self, pool: &ProxyPool) -> Result<Vec<Proxy>, StoreError> {
        self.check()?;
        self.inner.members(pool).await
    }

    async fn create_member(&self, member: &Proxy) -> Result<(), StoreError> {
        self.check()?;
        self.inner.create_member(member).await
    }

    async fn delete_member(&self, key: &ObjectKey, uid: &str) -> Result<(), StoreError> {
        self.check()?;
        self.inner.delete_member(key, uid).await
    }

    async fn write_pool_status(
        &self,
        key: &ObjectKey,
        uid: &str,
        status: &ProxyPoolStatus,
    ) -> Result<(), StoreError> {
        self.check()?;
        self.inner.write_pool_status(key, uid, status).await
    }

    async fn publish_pool_event(
        &self,
        key: &ObjectKey,
        uid: &str,
        member: (&ObjectKey, &str),
        reason: &str,
        note: &str,
    ) {
        if self.tenure.is_leading() {
            self.inner
                .publish_pool_event(key, uid, member, reason, note)
                .await;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::time::{Duration, Instant};

    use super::*;
    use crate::adapters::leader::Clock;

    /// A clock the test moves by hand.
    struct StepClock {
        base: Instant,
        offset: Mutex<Duration>,
    }

    impl Clock for StepClock {
        fn now(&self) -> Instant {
            self.base + *self.offset.lock().unwrap()
        }

        fn wall(&self) -> jiff::Timestamp {
            jiff::Timestamp::UNIX_EPOCH
        }
    }

    #[tokio::test]
    async fn a_fenced_store_stops_answering_when_the_tenure_ends() {
        let clock = Arc::new(StepClock {
            base: Instant::now(),
            offset: Mutex::new(Duration::ZERO),
        });
        let tenure = Tenure::new(clock.clone());
        let inner: Arc<dyn ProxyStore> = Arc::new(Unreachable);
        let store = FencedStore::new(inner, tenure.clone());
        let key = ObjectKey::new("ns", "p");
        assert!(matches!(store.get(&key).await, Err(StoreError::Backend(m)) if m.contains("not the leader")));
        tenure.extend(clock.now() + Duration::from_secs(1));
        assert!(matches!(store.get(&key).await, Ok(None)));
        *clock.offset.lock().unwrap() += Duration::from_secs(1);
        assert!(store.live_uids().await.is_err());
        assert!(
            store
                .write_status(&key, "u", &ProxyStatus::default())
                .await
                .is_err()
        );
    }

    /// A store with nothing in it.
    struct Unreachable;

    #[async_trait]
    impl ProxyStore for Unreachable {
        async fn get(&self, _: &ObjectKey) -> Result<Option<Proxy>, StoreError> {
            Ok(None)
        }
        async fn add_finalizer(&self, _: &ObjectKey, _: &str) -> Result<(), StoreError> {
            Ok(())
        }
        async fn remove_finalizer(&self, _: &ObjectKey, _: &str) -> Result<(), StoreError> {
            Ok(())
        }
        async fn set_annotation(
            &self,
            _: &ObjectKey,
            _: &str,
            _: &str,
            _: Option<&str>,
        ) -> Result<(), StoreError> {
            Ok(())
        }
        async fn write_status(&self, _: &ObjectKey, _: &str, _: &ProxyStatus) -> Result<(), StoreError> {
            Ok(())
        }
        async fn proxy_credentials(
            &self,
            _: &ObjectKey,
            _: &str,
            _: &str,
        ) -> Result<crate::domain::credentials::ProxyCredentials, StoreError> {
            Err(StoreError::Backend("unreachable".into()))
        }
        async fn secret_key(&self, _: &str, _: &str, _: &str) -> Result<Vec<u8>, CloudInitError> {
            Ok(Vec::new())
        }
        async fn cloud_init(&self, _: &str, _: &SecretKeyRef) -> Result<Vec<u8>, CloudInitError> {
            Ok(Vec::new())
        }
        async fn live_uids(&self) -> Result<std::collections::HashSet<String>, StoreError> {
            Ok(Default::default())
        }

        async fn keys(&self) -> Result<Vec<ObjectKey>, StoreError> {
            Ok(Vec::new())
        }
    }
}
