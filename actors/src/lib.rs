//! The running system of **egress-proxies-operator**: supervised actix
//! actors over the parts in the `egress-proxies` crate.
//!
//! ```text
//!  object store ──events──► ProxyRegistry ──spawns, under a Supervisor──► ProxyActor (one per Proxy)
//!                                                                             │ reconcile (serial per object)
//!                                                                             ▼
//!                                                                         Provider
//! ```
//!
//! `src/` of the root crate decides *what* to do; the actors here decide
//! *when*: they serialise work per object, own the timers and backoff, and
//! restart what fails without disturbing the rest. Each actor's messages are
//! defined in its own file (docs/architecture.md#messages).
#![warn(clippy::unwrap_used, clippy::expect_used)]

pub mod discovery;
pub mod gc_sweeper;
pub mod health_prober;
pub mod health_server;
pub mod keyed_registry;
pub mod kvm;
pub mod lease_store_actor;
pub mod metrics_server;
pub mod operator;
pub mod pool_actor;
pub mod pool_registry;
pub mod proxy_actor;
pub mod proxy_registry;
pub mod replicas;
pub mod standalone;
pub mod supervision;
pub mod system;
