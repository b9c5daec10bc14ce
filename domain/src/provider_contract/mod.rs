//! The provider contract (docs/providers.md): idempotent operations over
//! instances. The providers that keep it are adapters
//! (`egress_proxies::adapters::providers`).
//!
//! A provider creates the machine a Managed proxy runs on. None of the
//! operations blocks until a VM is up: `create` submits and returns, and the
//! reconciler polls `get`. Every created resource is tagged managed=true,
//! with the Proxy's UID and namespace and the installation that made it, and
//! reports its creation time, so orphan GC can find it through
//! `list_by_tag` and tell its own instances from another installation's.

// Shared by every provider: what a provider is given, reports and fails with.
mod error;
mod instance;
mod naming;
pub mod reason;
mod spec_hash;
pub mod squid_auth;
pub mod squid_identity;
pub mod squid_limits;

// The set of configured ones, built over any provider.
mod providers;

use async_trait::async_trait;

pub use error::{ErrorClass, Op, ProviderError};
pub use instance::{
    CloudInitBytes, CreateRequest, Instance, InstanceState, Ownership, ProviderId, QuarantinedAddress,
};
pub use naming::{HTPASSWD_KEY, INSTANCE_NAME_PREFIX, InstanceName, credentials_secret_name, instance_name};
pub use providers::Providers;
pub use spec_hash::{SpecHash, spec_hash};

/// A source of proxy instances (a cluster, a cloud, KVM hosts, this machine).
#[async_trait]
pub trait Provider: Send + Sync {
    /// The configured instance name (`gcp-eu`, `kvm-home`, ...).
    fn name(&self) -> &str;

    /// The provider type (`kubernetes`, `gcp`, `kvm`, `local`), for metrics and logs.
    fn kind(&self) -> &'static str;

    /// Whether the proxies it creates always name their credentials' own
    /// realm in a 407 ([`crate::credentials::realm_of`]): true where the
    /// provider writes the proxy's configuration itself. A VM's proxy is
    /// configured by its cloud-init, which names the realm only through the
    /// `{{ proxy_realm }}` placeholder.
    fn names_own_realm(&self) -> bool {
        false
    }

    /// Submits the creation of `req.name` and returns its id. Keyed on the
    /// name: a repeat after a crash finds the existing instance.
    async fn create(&self, req: &CreateRequest) -> Result<ProviderId, ProviderError>;

    /// Looks an instance up; a vanished instance is `ErrorClass::NotFound`.
    async fn get(&self, id: &ProviderId) -> Result<Instance, ProviderError>;

    /// Deletes an instance; deleting one that is already gone succeeds.
    async fn delete(&self, id: &ProviderId) -> Result<(), ProviderError>;

    /// Every instance tagged managed, whichever installation made it, with
    /// its [`Ownership`]: orphan GC judges which are its own.
    async fn list_by_tag(&self) -> Result<Vec<Instance>, ProviderError>;

    /// Leaves an instance to its admin (skip-cleanup): its tags are changed
    /// so that it is no longer listed as managed and is marked released —
    /// no orphan GC of any installation or version deletes it. It keeps
    /// running. Releasing one that is gone succeeds.
    async fn release(&self, id: &ProviderId) -> Result<(), ProviderError>;

    /// Removes what instances leave behind outside themselves (kvm: volumes
    /// without a domain, base images nothing uses) once it has been left
    /// over for `grace`. Called by orphan GC after each instance sweep.
    async fn sweep_leftovers(&self, grace: std::time::Duration) -> Result<LeftoverSweep, ProviderError> {
        let _ = grace;
        Ok(LeftoverSweep::default())
    }
}

/// What one [`Provider::sweep_leftovers`] found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LeftoverSweep {
    /// Deleted, as `<host>/<name>` or the provider's own naming.
    pub deleted: Vec<String>,
    /// Found but still inside their grace period.
    pub waiting: usize,
    /// Deletes that failed (retried next sweep).
    pub failed: usize,
    /// Parts that could not be swept this time (a host unreachable), with why.
    pub errors: Vec<String>,
}
