//! Support for the library's integration tests: a real Squid, target
//! servers, the gcp provider against the fake Compute API, the kvm test
//! bed, and the one way to wait for something ([`eventually`]). The
//! operator's tests (`actors/tests/support/`) include these same files.
#![allow(
    dead_code,
    unused_imports,
    reason = "each test binary uses its own part of the shared support"
)]

pub mod gcp;
pub mod kvm_bed;
mod loopback;
pub mod squid;
pub mod target_server;
mod waiting;

pub use loopback::*;
pub use waiting::*;

/// The installation tests run as (the same as the operator's tests').
pub const INSTALLATION: &str = "itest";
