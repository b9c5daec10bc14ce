//! How the provider reaches its hosts: one typed method per request, so a
//! caller gets exactly the answer it asked for. In the running system the
//! host actors implement it; nothing here knows about them.

use async_trait::async_trait;

use super::host_calls::ManagedDomain;
use super::image::{CachedBase, ImageSpec};
use super::ops::{CreatePlan, Observed, Released};
use super::pool_gc::{PoolSweep, SweepPlan};
use crate::config::KvmHost;
use crate::provider::ErrorClass;

/// A request failed: its class decides the retry.
#[derive(Clone, Debug, thiserror::Error)]
#[error("{message}")]
pub struct RunError {
    pub class: ErrorClass,
    pub message: String,
}

/// Runs requests on hosts (the host actors, in the running system).
#[async_trait]
pub trait HostRunner: Send + Sync {
    /// Creates (or finishes creating) an instance; starts it if it exists stopped.
    async fn create(&self, host: &KvmHost, plan: CreatePlan) -> Result<(), RunError>;
    /// A domain's state; `None` when it does not exist.
    async fn get(&self, host: &KvmHost, domain: &str) -> Result<Option<Observed>, RunError>;
    /// Removes a domain and its volumes (gone already is success).
    async fn delete(&self, host: &KvmHost, domain: &str) -> Result<(), RunError>;
    /// Marks a domain released (skip-cleanup); it keeps running.
    async fn release(&self, host: &KvmHost, domain: &str) -> Result<Released, RunError>;
    /// Every domain on the host marked as managed.
    async fn list_managed(&self, host: &KvmHost) -> Result<Vec<ManagedDomain>, RunError>;
    /// Makes sure `image` is in the host's pool (one download per host and image).
    async fn ensure_image(&self, host: &KvmHost, image: &ImageSpec) -> Result<CachedBase, RunError>;
    /// One pool sweep; what downloads are writing right now is added to `plan.protect`.
    async fn sweep_pool(&self, host: &KvmHost, plan: SweepPlan) -> Result<PoolSweep, RunError>;
}
