//! The parts of **egress-proxies-operator**, in two halves and a few
//! shared pieces:
//!
//! - [`domain`]: the `Proxy` and `ProxyPool` resources, the providers
//!   configuration, leases, pools, health verdicts, credentials,
//!   destination rules and every decision about them (`reconcile::decide`,
//!   `pool::step`, the lease book, the verdict machine), with the two ports
//!   they act through: the provider contract and the object store.
//! - [`adapters`]: what talks to the world for the domain — the providers,
//!   the stores, the Kubernetes client and leader election, the health
//!   probe, the built-in forward proxy and the gateway, the command line
//!   and the discovery API's contract.
//! - Shared by both: telemetry, TLS, listener limits, bind addresses, the
//!   supervision tree's record.
//!
//! The domain imports no adapter (`tests/layout.rs` checks it). Every
//! module is also re-exported under its own name, so paths read
//! `egress_proxies::lease`. The running system — supervised actix actors,
//! HTTP servers and the binary — lives in the `actors/` workspace member
//! and is the only place that imports actix. docs/architecture.md maps each
//! behaviour to its file.
//!
//! ```text
//!   Proxy manifests / API server          providers.yaml
//!              │                                │
//!              ▼                                ▼
//!   resource::Proxy (spec, status)     config::ProvidersConfig (validated)
//!              │                                │
//!              ▼                                ▼
//!   reconcile: observe → decide → execute ──► provider::Provider (port)
//!              │                                 ▲ implemented by adapters::providers:
//!              ▼                                 │ kubernetes · gcp · kvm · local
//!   store::ProxyStore (port) ◄── adapters::stores: kubernetes · embedded
//! ```
#![warn(clippy::unwrap_used, clippy::expect_used)]
// Dependencies the library does not use (dev-dependencies only count for tests).
#![cfg_attr(not(test), warn(unused_crate_dependencies))]

pub mod adapters;
/// The domain crate, under the name its paths read by here.
pub use egress_proxies_domain as domain;
/// The telemetry crate, likewise.
pub use egress_proxies_telemetry as telemetry;

pub mod file_limit;
pub mod listener_limits;
pub mod memory_limit;
pub mod metrics_access;
pub mod private_files;
pub mod rate_limit;
pub mod serving_cert;
pub mod supervision_tree;
pub mod tls;
