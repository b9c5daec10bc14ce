//! Shared test support: a scripted provider, target servers, waiting helpers.
#![allow(
    dead_code,
    reason = "each test binary uses its own part of the shared support"
)]

pub mod address_bed;
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

/// Destination rules for proxies the tests fetch through: loopback targets
/// (where the tests' servers listen) on any port.
pub fn loopback_rules() -> egress_proxies::destinations::DestinationRules {
    egress_proxies::destinations::DestinationRules {
        allow: vec!["127.0.0.0/8".parse().unwrap(), "1-65535".parse().unwrap()],
        deny: Vec::new(),
    }
}

/// [`loopback_rules`] for an in-process built-in proxy standing in for someone else's.
pub fn open_to_loopback() -> std::sync::Arc<egress_proxies::destinations::DestinationPolicy> {
    std::sync::Arc::new(egress_proxies::destinations::DestinationPolicy::new(
        &loopback_rules(),
        &[],
    ))
}
