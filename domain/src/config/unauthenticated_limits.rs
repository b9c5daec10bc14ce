//! What a client that has not authenticated may make a proxy listener
//! hold: a setting of the gateway and the built-in proxy, enforced by the
//! guarded listener in the adapters.

/// What the proxy listeners (the gateway, the built-in proxy) let clients
/// that have not authenticated yet hold (docs/security.md, "Hostile
/// clients"). A connection counts as unauthenticated until one of its
/// requests passed the credentials check (or came from a client network
/// served without credentials).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnauthenticatedLimits {
    /// Bytes of an unfinished request head each connection may hold of its own.
    pub free_head: usize,
    /// Bytes beyond `free_head` that the unfinished heads of all of a
    /// listener's connections may hold together; a head that finds it
    /// spent is answered `431`.
    pub head_budget: usize,
    /// Connections one source address (an IPv6 /64) may hold open before
    /// authenticating; the next is answered `429`.
    pub connections_per_source: usize,
}

impl UnauthenticatedLimits {
    /// A usual request head (URL, cookies, user agent) fits in 4 KiB.
    pub const DEFAULT_FREE_HEAD: usize = 4 * 1024;
    /// About 300 slow heads of 56 KB at once; little next to the default
    /// memory limit (256 MiB) and the reserve kept for the rest of the process.
    pub const DEFAULT_HEAD_BUDGET: usize = 16 * 1024 * 1024;
    /// A crawler pod or node behind one address opens connections in bursts
    /// well below this, and each stops counting once it has authenticated.
    pub const DEFAULT_CONNECTIONS_PER_SOURCE: usize = 256;
}

impl Default for UnauthenticatedLimits {
    fn default() -> Self {
        Self {
            free_head: Self::DEFAULT_FREE_HEAD,
            head_budget: Self::DEFAULT_HEAD_BUDGET,
            connections_per_source: Self::DEFAULT_CONNECTIONS_PER_SOURCE,
        }
    }
}
