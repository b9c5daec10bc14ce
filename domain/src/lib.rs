//! The domain: what a Proxy, a pool, a lease and a health verdict are, and
//! every decision about them — plus the two ports the decisions act
//! through, the provider contract and the object store. Nothing here
//! imports an adapter (`tests/layout.rs` checks it); what talks to the
//! world lives in [`crate::adapters`].
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
pub mod now;
pub mod pool;
pub mod provider_contract;
pub mod reconcile;
pub mod resource;
pub mod resource_store;
