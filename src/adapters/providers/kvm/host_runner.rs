//! How the provider reaches its hosts: one typed method per request, so a
//! caller gets exactly the answer it asked for. In the running system the
//! host actors implement it; nothing here knows about them.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use super::image::{CachedBase, ImageError, ImageSpec};
use super::ops::{CreatePlan, ManagedDomain, Observed, OpError, Released};
use super::pool_gc::{PoolSweep, SweepPlan};
use super::ssh_key::KeyError;
use crate::domain::config::KvmHost;
use crate::domain::provider_contract::ErrorClass;

/// Why a request to a host failed; [`RunError::class`] decides the retry.
/// Cloned to every caller waiting on the same work (one image download
/// serves them all), hence the `Arc`s.
#[derive(Clone, Debug, thiserror::Error)]
pub enum RunError {
    /// The host's libvirt session refused or failed the call.
    #[error(transparent)]
    Call(#[from] OpError),
    /// Bringing the image into the host's pool failed.
    #[error(transparent)]
    Image(Arc<ImageError>),
    /// The SSH key the hosts are dialed with cannot be used.
    #[error(transparent)]
    Key(Arc<KeyError>),
    #[error("host {0} is not configured")]
    UnknownHost(String),
    /// The host's link is not up (still dialing, or lost and redialing).
    #[error("link to host {host} is down ({why})")]
    LinkDown { host: String, why: String },
    /// The host's actor stopped or restarted while the request waited on it.
    #[error("the link to host {host} was reset during the call")]
    LinkReset { host: String },
    /// The host's libvirt thread ended before it ran the call.
    #[error("the libvirt thread of host {host} ended")]
    WorkerEnded { host: String },
    /// A call still running at its deadline: the link is torn down and redialed.
    #[error("libvirt call ({call}) on host {host} ran past its {deadline:?} deadline; the link is redialed")]
    Overran {
        host: String,
        call: String,
        deadline: Duration,
    },
    /// The host links could not be started (the image downloader's HTTP client).
    #[error("starting KVM host links: {0}")]
    NotStarted(Arc<reqwest::Error>),
    /// The image cache restarted while the request waited on it.
    #[error("the image cache restarted during the fetch; it is retried")]
    ImageCacheRestarted,
    /// An image fetch panicked (a bug): its waiters fail, the next create fetches again.
    #[error("the image fetch failed unexpectedly ({0}); it is retried")]
    FetchPanicked(String),
}

impl RunError {
    /// What the provider makes of it: retry, back off slowly, or give up.
    pub fn class(&self) -> ErrorClass {
        match self {
            RunError::Call(e) => e.class(),
            RunError::Image(e) => e.class(),
            RunError::Key(e) if e.is_transient() => ErrorClass::Transient,
            RunError::Key(_) | RunError::UnknownHost(_) => ErrorClass::Permanent,
            RunError::LinkDown { .. }
            | RunError::LinkReset { .. }
            | RunError::WorkerEnded { .. }
            | RunError::Overran { .. }
            | RunError::NotStarted(_)
            | RunError::ImageCacheRestarted
            | RunError::FetchPanicked(_) => ErrorClass::Transient,
        }
    }
}

impl From<ImageError> for RunError {
    fn from(e: ImageError) -> Self {
        RunError::Image(Arc::new(e))
    }
}

impl From<KeyError> for RunError {
    fn from(e: KeyError) -> Self {
        RunError::Key(Arc::new(e))
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adapters::providers::kvm::errors::KvmError;

    #[test]
    fn the_class_follows_the_cause() {
        let libvirt = |code| {
            RunError::Call(OpError::Libvirt(KvmError {
                rpc: "virDomainLookupByName",
                target: "proxy-x".into(),
                code: Some(code),
                message: "m".into(),
            }))
        };
        assert_eq!(
            libvirt(virt::error::ErrorNumber::XmlError).class(),
            ErrorClass::Permanent
        );
        assert_eq!(
            libvirt(virt::error::ErrorNumber::Rpc).class(),
            ErrorClass::Transient
        );
        let room = RunError::Call(OpError::NoRoom {
            needed: 2,
            available: 1,
        });
        assert_eq!(room.class(), ErrorClass::QuotaExceeded);
        let missing = RunError::from(KeyError::Missing { path: "k".into() });
        assert_eq!(missing.class(), ErrorClass::Transient);
        let public = RunError::from(KeyError::PublicKeyGiven { path: "k.pub".into() });
        assert_eq!(public.class(), ErrorClass::Permanent);
        assert_eq!(RunError::UnknownHost("h".into()).class(), ErrorClass::Permanent);
        let reset = RunError::LinkReset { host: "h".into() };
        assert_eq!(reset.class(), ErrorClass::Transient);
        assert_eq!(reset.to_string(), "the link to host h was reset during the call");
    }
}
