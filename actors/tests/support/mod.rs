//! Shared test support: the operator process, a scripted provider, target
//! servers, the one way to wait for something ([`eventually`]).
#![allow(
    dead_code,
    unused_imports,
    reason = "each test binary uses its own part of the shared support"
)]

pub mod address_bed;
pub mod browser;
pub mod checkout;
pub mod crawlers;
pub mod doc_blocks;
pub mod exclusive;
pub mod http;
pub mod kvm_bed;
// The bed's settings and links to its hosts: one file with the library's tests.
#[path = "../../../tests/support/kvm_bed.rs"]
pub mod kvm_bed_links;
pub mod operator;
pub mod pod_security;
pub mod probe_counter;
pub mod process;
pub mod rbac;
pub mod replicas;
pub mod scripted_provider;
pub mod service;
pub mod site;

// Shared with the library's tests: each file lives once, in its
// tests/support/, and is included here.
#[path = "../../../tests/support/gcp.rs"]
pub mod gcp;
#[path = "../../../tests/support/loopback.rs"]
mod loopback;
#[path = "../../../tests/support/squid.rs"]
pub mod squid;
#[path = "../../../tests/support/target_server.rs"]
pub mod target_server;
#[path = "../../../tests/support/waiting.rs"]
mod waiting;

pub use loopback::*;
pub use waiting::*;

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
