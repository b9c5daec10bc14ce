//! Shared test support: a scripted provider, target servers, waiting helpers.
#![allow(dead_code)]

pub mod gcp;
pub mod http;
pub mod kvm_bed;
pub mod pod_security;
pub mod process;
pub mod rbac;
pub mod scripted_provider;
pub mod squid;
pub mod target_server;

use std::time::{Duration, Instant};

use egress_proxies::installation::InstallationId;

/// The installation tests run as.
pub const INSTALLATION: &str = "itest";

pub fn installation() -> InstallationId {
    InstallationId::parse(INSTALLATION).expect("a valid id")
}

/// Polls `check` until it returns `Some`, or panics after `timeout` naming `what`.
pub async fn eventually<T>(what: &str, timeout: Duration, mut check: impl AsyncFnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
