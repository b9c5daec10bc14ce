//! Shared test support: the operator process, a scripted provider, target
//! servers, the one way to wait for something ([`eventually`]).
#![allow(
    dead_code,
    reason = "each test binary uses its own part of the shared support"
)]

pub mod address_bed;
pub mod checkout;
pub mod doc_blocks;
pub mod gcp;
pub mod http;
pub mod kvm_bed;
// The bed's settings and links to its hosts: one file with the library's tests.
#[path = "../../../tests/support/kvm_bed.rs"]
pub mod kvm_bed_links;
pub mod operator;
pub mod pod_security;
pub mod process;
pub mod rbac;
pub mod scripted_provider;
pub mod squid;
pub mod target_server;

use std::time::{Duration, Instant};

use egress_proxies::domain::installation::InstallationId;

/// The Python client's interpreter (a virtual environment with its test
/// dependencies, made by tests/python-clients-setup.sh; tests/run.sh sets
/// `EPO_CLIENTS_PYTHON`), if there is one.
pub fn clients_python() -> Option<std::path::PathBuf> {
    let path = std::env::var_os("EPO_CLIENTS_PYTHON").map_or_else(
        || std::path::PathBuf::from("/var/cache/egress-proxies-operator/venv-clients/bin/python"),
        std::path::PathBuf::from,
    );
    path.exists().then_some(path)
}

/// The installation tests run as.
pub const INSTALLATION: &str = "itest";

pub fn installation() -> InstallationId {
    InstallationId::parse(INSTALLATION).expect("a valid id")
}

/// What one look of [`eventually`] found: `Some(v)` or `Ok(v)` ends the
/// wait with `v`; `None`, or `Err(why)` saying what was seen instead (shown
/// if the wait times out), looks again.
pub trait Look {
    type Found;
    fn found(self) -> Result<Self::Found, Option<String>>;
}

impl<T> Look for Option<T> {
    type Found = T;
    fn found(self) -> Result<T, Option<String>> {
        self.ok_or(None)
    }
}

impl<T, E: std::fmt::Display> Look for Result<T, E> {
    type Found = T;
    fn found(self) -> Result<T, Option<String>> {
        self.map_err(|e| Some(e.to_string()))
    }
}

/// Polls `check` every 20 ms until it finds what it waits for, and returns
/// that; panics after `timeout`, naming `what` and the last thing `check`
/// saw instead. Every test that waits for something waits with this.
pub async fn eventually<L: Look>(what: &str, timeout: Duration, check: impl AsyncFnMut() -> L) -> L::Found {
    eventually_explained(what, timeout, String::new, check).await
}

/// [`eventually`], adding `explain()` — an operator's log, say — to the
/// message when it times out.
pub async fn eventually_explained<L: Look>(
    what: &str,
    timeout: Duration,
    explain: impl FnOnce() -> String,
    mut check: impl AsyncFnMut() -> L,
) -> L::Found {
    let deadline = Instant::now() + timeout;
    loop {
        let seen = match check().await.found() {
            Ok(found) => return found,
            Err(seen) => seen,
        };
        if Instant::now() >= deadline {
            let seen = seen.map(|s| format!("; last seen: {s}")).unwrap_or_default();
            let explained = explain();
            let explained = if explained.is_empty() {
                explained
            } else {
                format!("\n{explained}")
            };
            panic!("timed out after {timeout:?} waiting for {what}{seen}{explained}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Destination rules for proxies the tests fetch through: loopback targets
/// (where the tests' servers listen) on any port.
pub fn loopback_rules() -> egress_proxies::domain::destinations::DestinationRules {
    egress_proxies::domain::destinations::DestinationRules {
        allow: vec!["127.0.0.0/8".parse().unwrap(), "1-65535".parse().unwrap()],
        deny: Vec::new(),
    }
}

/// [`loopback_rules`] for an in-process built-in proxy standing in for someone else's.
pub fn open_to_loopback() -> std::sync::Arc<egress_proxies::domain::destinations::DestinationPolicy> {
    std::sync::Arc::new(egress_proxies::domain::destinations::DestinationPolicy::new(
        &loopback_rules(),
        &[],
    ))
}
