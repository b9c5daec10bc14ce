//! The parts of **egress-proxies-operator**.
//!
//! This crate holds everything the operator is made of, as plain Rust: the
//! `Proxy` resource, the providers configuration, the provider contract with
//! its error taxonomy and every provider (under [`provider`]), the reconcile
//! decisions, the health probe, lease bookkeeping, orphan GC, leader election
//! and the object-store adapters. The running system — supervised actix
//! actors, HTTP servers and the binary — lives in the `actors/` workspace
//! member and is the only place that imports actix. docs/architecture.md maps
//! each behaviour to its file.
//!
//! ```text
//!   Proxy manifests / API server          providers.yaml
//!              │                                │
//!              ▼                                ▼
//!   resource::Proxy (spec, status)     config::ProvidersConfig (validated)
//!              │                                │
//!              └──────────► provider::Provider ◄┘
//!                   create / get / delete / list_by_tag
//!                   errors: NotFound | QuotaExceeded | Transient | Permanent
//! ```
//!
//! Every module is usable and testable on its own.
#![warn(clippy::unwrap_used, clippy::expect_used)]
// Dependencies the library does not use (dev-dependencies only count for tests).
#![cfg_attr(not(test), warn(unused_crate_dependencies))]

pub mod bind_address;
pub mod config;
pub mod credentials;
pub mod destinations;
pub mod file_limit;
pub mod forward_proxy;
pub mod gateway;
pub mod gc;
pub mod guarded_listener;
pub mod health;
pub mod installation;
pub mod kube_client;
pub mod leader;
pub mod lease;
pub mod listener_limits;
pub mod metrics_access;
pub mod pool;
pub mod private_files;
pub mod provider;
pub mod rate_limit;
pub mod reconcile;
pub mod resource;
pub mod serving_cert;
pub mod store;
pub mod telemetry;
pub mod tls;
