//! The supervision tree. Every long-lived actor runs under [`start`]'s
//! supervisor (restarted in place after a crash, see [`supervisor`]) and
//! reports itself into the tree's record (`egress_proxies::supervision_tree`,
//! re-exported here): kind, where it sits in the tree, its restart count, a
//! one-word state and how much work it has waiting.
//!
//! ```text
//! system
//! ├── proxy_registry ── proxy × N      (one per Proxy)
//! ├── health_prober
//! ├── lease_store                      (a thread of its own)
//! ├── gc_sweeper
//! ├── kvm_image_cache                  (kvm provider configured)
//! └── kvm_host × H                     (one per KVM host, started on first use)
//! ```
//!
//! Singletons also beat once a second ([`beat_while_running`]); `/healthz`
//! turns unhealthy when one falls silent or keeps crashing.

pub mod supervisor;

#[cfg(feature = "fault-injection")]
pub mod fault;

use std::time::Duration;

pub use egress_proxies::supervision_tree::heartbeats::*;
pub use egress_proxies::supervision_tree::*;
pub use supervisor::{start, start_in_arbiter};

/// Starts `kind`'s heartbeat: now, then every second while the actor runs.
pub fn beat_while_running<A>(kind: &'static str, ctx: &mut A::Context)
where
    A: actix::Actor<Context = actix::Context<A>>,
{
    use actix::AsyncContext;
    heartbeat(kind);
    ctx.run_interval(Duration::from_secs(1), move |_, _| heartbeat(kind));
}

/// Tests that read or change the process-wide health (heartbeats, crash
/// loops) take turns.
#[cfg(test)]
pub(crate) static HEALTH_TESTS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
