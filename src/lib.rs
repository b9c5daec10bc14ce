//! The library of **egress-proxies-operator**: the adapters, over the
//! domain crate, and a few pieces the running system shares:
//!
//! - [`domain`] (the `egress-proxies-domain` crate): the `Proxy` and
//!   `ProxyPool` resources, the providers configuration, leases, pools,
//!   health verdicts, credentials, destination rules and every decision
//!   about them (`reconcile::decide`, `pool::step`, the lease book, the
//!   verdict machine), with the ports they act through: the provider
//!   contract, the resource store, the lease journal, name resolution and
//!   randomness. It does no I/O and is given the time.
//! - [`adapters`]: what talks to the world for the domain — the providers,
//!   the stores, the lease store, the Kubernetes client and leader
//!   election, the health probe, the built-in forward proxy and the
//!   gateway, the clocks, the resolver, the random source, the
//!   configuration files, the command line and the discovery API's
//!   contract.
//! - [`telemetry`] (the `egress-proxies-telemetry` crate) and, here, TLS,
//!   listener and rate limits, the supervision tree's record.
//!
//! The domain is a crate below this one, so it cannot import an adapter.
//! Paths say their side: `egress_proxies::domain::lease`,
//! `egress_proxies::adapters::gateway`. The running system — supervised
//! actix actors, HTTP servers and the binary — lives in the `actors/`
//! workspace member and is the only place that imports actix.
//! docs/architecture.md maps each behaviour to its file.
//!
//! ```text
//!   Proxy manifests / API server          providers.yaml
//!              │                                │
//!              ▼                                ▼
//!   resource::Proxy (spec, status)     config::ProvidersConfig (validated)
//!              │                                │
//!              ▼                                ▼
//!   reconcile: observe → decide → execute ──► provider_contract::Provider (port)
//!              │                                 ▲ implemented by adapters::providers:
//!              ▼                                 │ kubernetes · gcp · kvm · local
//!   resource_store::ProxyStore (port) ◄── adapters::stores: kubernetes · embedded
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
