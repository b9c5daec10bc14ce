//! Support for the library's integration tests that need a real component
//! (the kvm test bed). The operator's tests have their own, larger support
//! (`actors/tests/support/`), which includes [`kvm_bed`] from here.
#![allow(
    dead_code,
    reason = "each test binary uses its own part of the shared support"
)]

pub mod kvm_bed;

/// The installation tests run as (the same as the operator's tests').
pub const INSTALLATION: &str = "itest";
