//! The providers that keep the provider contract (`crate::domain::provider_contract`), and
//! the registry that builds the configured ones. Each depends on the
//! contract's shared types, never on the registry or on another provider.

mod decorated;
pub mod gcp;
mod instrumented;
pub mod kubernetes;
pub mod kvm;
pub mod local;
mod registry;
mod traced;

pub use decorated::decorated;
pub use local::LocalProvider;
pub use registry::{BuildContext, BuildError, KvmRunnerFactory, build};
