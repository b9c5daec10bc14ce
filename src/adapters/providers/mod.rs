//! The providers that keep the provider contract (`crate::domain::provider`), and
//! the registry that builds the configured ones. Each depends on the
//! contract's shared types, never on the registry or on another provider.

pub mod gcp;
pub mod kubernetes;
pub mod kvm;
pub mod local;
mod registry;

pub use local::LocalProvider;
pub use registry::{BuildContext, BuildError, KvmRunnerFactory, build};
