//! Names of the metadata the operator reads and writes on Proxy objects.

/// API group of the `Proxy` resource.
pub const API_GROUP: &str = "crawl.example.com";

/// Finalizer on Managed proxies: the instance is cleaned up before the object goes.
pub const FINALIZER: &str = "crawl.example.com/finalizer";

/// Annotation holding the hash of the replacement-relevant spec; a change
/// replaces the instance.
pub const SPEC_HASH_ANNOTATION: &str = "crawl.example.com/spec-hash";

/// Annotation that, set to `"true"`, releases a deleted Proxy without asking
/// the provider to clean up (the instance is left running for the admin).
pub const SKIP_CLEANUP_ANNOTATION: &str = "crawl.example.com/skip-cleanup";

/// Label a Secret must carry to be usable as cloud-init; only labelled
/// Secrets are watched.
pub const CLOUD_INIT_LABEL: &str = "crawl.example.com/cloud-init";

/// Default key of the cloud-init document inside a referenced Secret.
pub const DEFAULT_CLOUD_INIT_KEY: &str = "user-data";

/// Condition types written to `status.conditions`.
pub mod condition {
    /// The proxy is serving and healthy.
    pub const READY: &str = "Ready";
    /// The latest health verdict.
    pub const HEALTHY: &str = "Healthy";
    /// The provider reports the instance running with an address.
    pub const INSTANCE_READY: &str = "InstanceReady";
}

/// Set to any new value to rotate a Managed proxy's credentials: the
/// instance is replaced by one with new credentials.
pub const ROTATE_CREDENTIALS_ANNOTATION: &str = "crawl.example.com/rotate-credentials";
