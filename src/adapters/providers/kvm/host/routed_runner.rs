//! The provider's [`HostRunner`] over anything that routes host calls: a
//! [`HostRouter`] runs one typed [`HostCall`] on a named host and brings
//! images into its pool; [`RoutedRunner`] turns each of the provider's
//! requests into its call. In the running system the host actors are the
//! router (`egress_proxies_operator::kvm`), so they name the calls'
//! generic shape only, never each request and its answer.

use async_trait::async_trait;

use super::calls::{CreateDomain, DeleteDomain, GetDomain, HostCall, ListManaged, ReleaseDomain, SweepPool};
use crate::adapters::providers::kvm::host_runner::{HostRunner, RunError};
use crate::adapters::providers::kvm::image::{CachedBase, ImageSpec};
use crate::adapters::providers::kvm::ops::{CreatePlan, ManagedDomain, Observed, OpError, Released};
use crate::adapters::providers::kvm::pool_gc::{PoolSweep, SweepPlan};
use crate::domain::config::KvmHost;

/// Runs calls on hosts and keeps their images (the host actors and the
/// image cache, in the running system).
#[async_trait]
pub trait HostRouter: Send + Sync {
    /// Runs one call on `host`'s libvirt thread.
    async fn call<C: HostCall>(&self, host: &KvmHost, call: C) -> Result<C::Output, RunError>;
    /// Makes sure `image` is in the host's pool (one download per host and image).
    async fn ensure_image(&self, host: &KvmHost, image: &ImageSpec) -> Result<CachedBase, RunError>;
    /// The volumes fetches are writing on `host` right now (a sweep spares them).
    async fn fetching_volumes(&self, host: &KvmHost) -> Result<Vec<String>, RunError>;
    /// A create found base `volume` missing on `host`: whatever remembers
    /// it as fetched forgets it, so the retry looks (or fetches) anew.
    fn forget_base(&self, host: &KvmHost, volume: String);
}

/// The provider's [`HostRunner`]: each request as its own call on a [`HostRouter`].
pub struct RoutedRunner<R>(pub R);

#[async_trait]
impl<R: HostRouter> HostRunner for RoutedRunner<R> {
    async fn create(&self, host: &KvmHost, plan: CreatePlan) -> Result<(), RunError> {
        let result = self.0.call(host, CreateDomain(Box::new(plan))).await;
        if let Err(RunError::Call(OpError::BaseMissing(volume))) = &result {
            // Deleted behind the cache's back: the retry looks (or fetches) anew.
            self.0.forget_base(host, volume.clone());
        }
        result
    }

    async fn get(&self, host: &KvmHost, domain: &str) -> Result<Option<Observed>, RunError> {
        self.0.call(host, GetDomain(domain.to_owned())).await
    }

    async fn delete(&self, host: &KvmHost, domain: &str) -> Result<(), RunError> {
        self.0.call(host, DeleteDomain(domain.to_owned())).await
    }

    async fn release(&self, host: &KvmHost, domain: &str) -> Result<Released, RunError> {
        self.0.call(host, ReleaseDomain(domain.to_owned())).await
    }

    async fn list_managed(&self, host: &KvmHost) -> Result<Vec<ManagedDomain>, RunError> {
        self.0.call(host, ListManaged).await
    }

    async fn ensure_image(&self, host: &KvmHost, image: &ImageSpec) -> Result<CachedBase, RunError> {
        self.0.ensure_image(host, image).await
    }

    async fn sweep_pool(&self, host: &KvmHost, mut plan: SweepPlan) -> Result<PoolSweep, RunError> {
        // Asked right before the sweep: a fetch starting later writes volumes
        // too new to be due, so it cannot lose them.
        plan.protect.extend(self.0.fetching_volumes(host).await?);
        self.0.call(host, SweepPool(plan)).await
    }
}

#[cfg(test)]
mod tests {
    use std::any::Any;
    use std::collections::BTreeSet;
    use std::sync::Mutex;

    use super::*;
    use crate::adapters::providers::kvm::domain_xml::DomainSpec;
    use crate::adapters::providers::kvm::metadata::InstanceMetadata;
    use crate::domain::config::{DomainType, Firmware};

    /// Answers every call with `answer`, recording what it was asked.
    struct Recorder {
        answer: fn() -> RunError,
        fetching: Result<Vec<String>, fn() -> RunError>,
        calls: Mutex<Vec<String>>,
        swept: Mutex<Vec<SweepPlan>>,
        forgotten: Mutex<Vec<(String, String)>>,
    }

    impl Recorder {
        fn new(answer: fn() -> RunError, fetching: Result<Vec<String>, fn() -> RunError>) -> Self {
            Self {
                answer,
                fetching,
                calls: Mutex::default(),
                swept: Mutex::default(),
                forgotten: Mutex::default(),
            }
        }
    }

    #[async_trait]
    impl HostRouter for Recorder {
        async fn call<C: HostCall>(&self, host: &KvmHost, call: C) -> Result<C::Output, RunError> {
            self.calls
                .lock()
                .unwrap()
                .push(format!("{} on {}", C::NAME, host.name));
            if let Some(SweepPool(plan)) = (&call as &dyn Any).downcast_ref::<SweepPool>() {
                self.swept.lock().unwrap().push(plan.clone());
            }
            Err((self.answer)())
        }

        async fn ensure_image(&self, _: &KvmHost, _: &ImageSpec) -> Result<CachedBase, RunError> {
            Err((self.answer)())
        }

        async fn fetching_volumes(&self, _: &KvmHost) -> Result<Vec<String>, RunError> {
            self.fetching.clone().map_err(|e| e())
        }

        fn forget_base(&self, host: &KvmHost, volume: String) {
            self.forgotten.lock().unwrap().push((host.name.clone(), volume));
        }
    }

    fn host() -> KvmHost {
        serde_json::from_value(serde_json::json!({
            "name": "a", "address": "h:22", "user": "u", "bridge": "br0"
        }))
        .unwrap()
    }

    fn plan() -> CreatePlan {
        CreatePlan {
            domain: DomainSpec {
                name: "proxy-x".into(),
                domain_type: DomainType::Qemu,
                firmware: Firmware::Bios,
                vcpus: 1,
                memory_mib: 128,
                disk_path: String::new(),
                seed_path: String::new(),
                bridge: "br0".into(),
                metadata: InstanceMetadata {
                    managed: true,
                    uid: "u".into(),
                    created_at: "2026-12-01T00:00:00Z".parse().unwrap(),
                    namespace: None,
                    installation: None,
                    released: false,
                },
            },
            base_volume: "base-x.qcow2".into(),
            base_format: "qcow2".into(),
            disk_bytes: 1 << 30,
            seed_iso: Vec::new(),
        }
    }

    fn base_missing() -> RunError {
        RunError::Call(OpError::BaseMissing("base-x.qcow2".into()))
    }

    fn link_down() -> RunError {
        RunError::LinkDown {
            host: "a".into(),
            why: "dialing".into(),
        }
    }

    #[tokio::test]
    async fn each_request_is_its_own_call_on_the_named_host() {
        let runner = RoutedRunner(Recorder::new(link_down, Ok(Vec::new())));
        let h = host();
        assert!(runner.get(&h, "d").await.is_err());
        assert!(runner.delete(&h, "d").await.is_err());
        assert!(runner.release(&h, "d").await.is_err());
        assert!(runner.list_managed(&h).await.is_err());
        assert!(runner.create(&h, plan()).await.is_err());
        assert_eq!(
            *runner.0.calls.lock().unwrap(),
            [
                "get on a",
                "delete on a",
                "release on a",
                "list on a",
                "create on a"
            ]
        );
    }

    #[tokio::test]
    async fn a_create_missing_its_base_makes_the_cache_forget_it() {
        let runner = RoutedRunner(Recorder::new(base_missing, Ok(Vec::new())));
        let err = runner.create(&host(), plan()).await.unwrap_err();
        assert!(matches!(err, RunError::Call(OpError::BaseMissing(_))), "{err}");
        assert_eq!(
            *runner.0.forgotten.lock().unwrap(),
            [("a".to_owned(), "base-x.qcow2".to_owned())]
        );

        // Any other failure forgets nothing.
        let runner = RoutedRunner(Recorder::new(link_down, Ok(Vec::new())));
        runner.create(&host(), plan()).await.unwrap_err();
        assert!(runner.0.forgotten.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_sweep_spares_what_fetches_are_writing_and_needs_to_know_it() {
        let runner = RoutedRunner(Recorder::new(link_down, Ok(vec!["base-new.qcow2".into()])));
        let plan = SweepPlan {
            protect: BTreeSet::from(["pin-old".to_owned()]),
            ..SweepPlan::default()
        };
        runner.sweep_pool(&host(), plan).await.unwrap_err();
        let swept = runner.0.swept.lock().unwrap().clone();
        assert_eq!(swept.len(), 1);
        assert_eq!(
            swept[0].protect,
            BTreeSet::from(["base-new.qcow2".to_owned(), "pin-old".to_owned()])
        );

        // Without knowing what fetches write, no sweep runs.
        let runner = RoutedRunner(Recorder::new(link_down, Err(|| RunError::ImageCacheRestarted)));
        let err = runner
            .sweep_pool(&host(), SweepPlan::default())
            .await
            .unwrap_err();
        assert!(matches!(err, RunError::ImageCacheRestarted), "{err}");
        assert!(runner.0.calls.lock().unwrap().is_empty());
    }
}
