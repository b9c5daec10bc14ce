//! The port through which the domain learns what a host name resolves to
//! (implemented by the adapters on the system's resolver), so a check of a
//! name's addresses stays a pure function of the addresses it is given.

use std::net::IpAddr;

/// Resolves host names.
#[async_trait::async_trait]
pub trait NameResolver: Send + Sync {
    /// Every address `host` resolves to (an address literal resolves to
    /// itself); `None` when the name does not resolve in the resolver's
    /// own time bound.
    async fn resolve(&self, host: &str, port: u16) -> Option<Vec<IpAddr>>;
}
