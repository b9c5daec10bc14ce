//! The domain: what a Proxy, a pool, a lease and a health verdict are, and
//! every decision about them — plus the ports the decisions act through:
//! the provider contract, the resource store, the lease journal, name
//! resolution and randomness.
//!
//! What talks to the world lives in the adapters, a crate above this one
//! (`egress_proxies::adapters`), so nothing here can import one. The domain
//! does no I/O and reads no clock and no global random number generator:
//! the time ([`now::Now`]) and randomness are inputs (`tests/layout.rs`
//! checks both).
#![warn(clippy::unwrap_used, clippy::expect_used)]
// Dependencies the crate does not use (dev-dependencies only count for tests).
#![cfg_attr(not(test), warn(unused_crate_dependencies))]

pub mod backoff;
pub mod config;
pub mod credentials;
pub mod destinations;
pub mod gc;
pub mod health;
pub mod identity;
pub mod installation;
pub mod lease;
pub mod membership;
pub mod now;
pub mod pool;
pub mod provider_contract;
pub mod reconcile;
pub mod rendezvous;
pub mod resource;
pub mod resource_store;
