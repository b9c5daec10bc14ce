//! Typed messages between the actors.

use actix::Message;

/// Look at the proxy again now (its object changed, or a caller asks).
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "()")]
pub struct Reconcile;

/// The object is gone: stop for good.
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "()")]
pub struct Shutdown;

/// How many ProxyActors run, and how often they were restarted.
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "RegistryStats")]
pub struct GetRegistryStats;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RegistryStats {
    pub actors: usize,
    pub restarts: u64,
}

/// A health verdict for the receiving ProxyActor's proxy.
#[derive(Message, Debug, Clone)]
#[rtype(result = "()")]
pub struct HealthVerdict(
    pub egress_proxies::health::Verdict,
    /// The `health.probe` span behind it (when probes are traced): the
    /// reconcile a flip triggers links to it.
    pub Option<opentelemetry::trace::SpanContext>,
);

pub use egress_proxies::health::ProbeTarget;
