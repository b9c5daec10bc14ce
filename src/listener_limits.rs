//! What each HTTP listener of the operator (the discovery API, metrics,
//! health probes) lets a client hold: a connection cap sized from the
//! process's open-file limit, and how long a connection may sit without
//! sending a request. Named once here, applied by each server in
//! `actors/`, documented in docs/security.md ("Hostile clients").
//!
//! The caps together stay below the file limit, with room left for the
//! rest of the process (probes, the store, the API server's connections):
//! a flood of idle connections to one listener fills its cap and waits in
//! the kernel's accept queue, without starving the other listeners or the
//! process of files. A cap also fits the process's memory limit
//! ([`memory_cap`]), and what a client that has not authenticated may make
//! the proxy listeners hold is bounded by
//! [`UnauthenticatedLimits`](egress_proxies_domain::config::unauthenticated_limits::UnauthenticatedLimits).

use std::time::Duration;

/// Memory kept for everything but a listener's connections: the operator's
/// own state, its other listeners, the runtime, the allocator's slack.
pub const MEMORY_RESERVE: u64 = 64 * 1024 * 1024;
/// What one open connection of a proxy listener may cost, besides its
/// share of the head budget and any body or tunnel it relays: before it
/// authenticates, the task, the framing guard and its free head allowance
/// (measured: about 6.5 KiB each, 3,000 connections holding 4 KB heads);
/// once it is served, hyper's 8 KiB read and write buffers on the client's
/// side and on its upstream's, and the upstream socket. Rounded up.
pub const MEMORY_PER_CONNECTION: u64 = 48 * 1024;

/// What one discovery API connection may hold at most: actix-web's read
/// buffer for an unfinished head (up to 128 KiB) and its 8 KiB write buffer.
pub const DISCOVERY_MEMORY_PER_CONNECTION: u64 = 136 * 1024;

/// The part of the memory beyond [`MEMORY_RESERVE`] a proxy listener (the
/// gateway, or the built-in proxy) sizes its cap to: a half…
pub const PROXY_LISTENER_PART: u64 = 2;
/// …and the discovery API a quarter, so that both at their caps, in one
/// process, leave a quarter of it free.
pub const DISCOVERY_PART: u64 = 4;

/// The most connections that fit in `1/part` of what a memory limit of
/// `limit` bytes (none: no bound) leaves beyond [`MEMORY_RESERVE`], when
/// each costs `per_connection` and `held` bytes of that part are held apart
/// (a head budget); at least 1.
pub fn memory_cap(limit: Option<u64>, part: u64, held: u64, per_connection: u64) -> usize {
    let Some(limit) = limit else {
        return usize::MAX;
    };
    let share = limit.saturating_sub(MEMORY_RESERVE) / part.max(1);
    let room = share.saturating_sub(held) / per_connection.max(1);
    usize::try_from(room).unwrap_or(usize::MAX).max(1)
}

/// Time from a connection's start to the end of its first request's head:
/// a client that connects and says nothing, or sends its headers a byte at
/// a time, is disconnected after this (`408` when it sent part of a head).
pub const REQUEST_HEAD_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a keep-alive connection may wait idle for its next request.
pub const KEEP_ALIVE: Duration = Duration::from_secs(15);
/// How long a connection may take to close once the server ends it.
pub const DISCONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a TLS handshake (metrics over HTTPS) may take.
pub const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// Files kept for the rest of the process whatever the limit.
const RESERVED_MIN: u64 = 96;

/// One of the operator's listeners.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Listener {
    /// Crawlers' leases and the dashboard: the one that may have many clients.
    Discovery,
    /// Prometheus scrapes.
    Metrics,
    /// The kubelet's (or a supervisor's) `/healthz` and `/readyz`.
    Health,
}

impl Listener {
    /// Its share of the files not reserved, and the most it ever needs.
    fn share(self) -> (u64, u64, u64) {
        // (numerator, denominator, maximum)
        match self {
            Listener::Discovery => (1, 2, 10_000),
            Listener::Metrics | Listener::Health => (1, 8, 64),
        }
    }
}

/// The limits one listener applies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ListenerLimits {
    /// Connections open at once; more wait in the accept queue.
    pub max_connections: usize,
    pub request_head_timeout: Duration,
    pub keep_alive: Duration,
    pub disconnect_timeout: Duration,
    pub tls_handshake_timeout: Duration,
}

impl ListenerLimits {
    /// The limits of `listener` in a process allowed `file_limit` open files:
    /// a quarter of the limit (at least [`RESERVED_MIN`]) is kept for the
    /// rest of the process; of the remainder the discovery API may use half,
    /// metrics and health an eighth each, each at least 4 connections.
    pub fn of(listener: Listener, file_limit: u64) -> Self {
        let reserved = (file_limit / 4).max(RESERVED_MIN);
        let spare = file_limit.saturating_sub(reserved);
        let (numerator, denominator, most) = listener.share();
        let cap = (spare / denominator * numerator).clamp(4, most);
        Self {
            max_connections: usize::try_from(cap).unwrap_or(usize::MAX),
            request_head_timeout: REQUEST_HEAD_TIMEOUT,
            keep_alive: KEEP_ALIVE,
            disconnect_timeout: DISCONNECT_TIMEOUT,
            tls_handshake_timeout: TLS_HANDSHAKE_TIMEOUT,
        }
    }

    /// These limits, the discovery API's cap also fitting its part
    /// ([`DISCOVERY_PART`]) of what the memory limit `memory_limit` leaves
    /// (the gateway, in the same process, sizes its cap to its own part) at
    /// [`DISCOVERY_MEMORY_PER_CONNECTION`] each: actix-web buffers an
    /// unfinished head of up to 128 KiB for the request-head timeout.
    pub fn within_memory(mut self, listener: Listener, memory_limit: Option<u64>) -> Self {
        if listener == Listener::Discovery {
            let cap = memory_cap(memory_limit, DISCOVERY_PART, 0, DISCOVERY_MEMORY_PER_CONNECTION);
            self.max_connections = self.max_connections.min(cap.max(4));
        }
        self
    }

    /// The cap of each of `workers` threads that share the connections
    /// (actix counts per worker), at least one.
    pub fn per_worker(&self, workers: usize) -> usize {
        (self.max_connections / workers.max(1)).max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_memory_cap_leaves_the_reserve_and_the_budget_and_divides_the_rest() {
        const MIB: u64 = 1024 * 1024;
        for (limit, held, per_connection, cap) in [
            (None, 16 * MIB, 48 * 1024, usize::MAX),
            // The shipped Deployment's limit, the default budget: half of
            // 192 MiB, less 16 MiB, at 48 KiB.
            (Some(256 * MIB), 16 * MIB, 48 * 1024, 1706),
            (Some(256 * MIB), 0, 48 * 1024, 2048),
            (Some(1024 * MIB), 16 * MIB, 48 * 1024, 9898),
            // Less than the reserve still serves one.
            (Some(32 * MIB), 16 * MIB, 48 * 1024, 1),
        ] {
            assert_eq!(
                memory_cap(limit, PROXY_LISTENER_PART, held, per_connection),
                cap,
                "{limit:?} {held} {per_connection}"
            );
        }
    }

    fn caps(file_limit: u64) -> [usize; 3] {
        [Listener::Discovery, Listener::Metrics, Listener::Health]
            .map(|l| ListenerLimits::of(l, file_limit).max_connections)
    }

    #[test]
    fn the_caps_leave_room_for_the_rest_of_the_process() {
        assert_eq!(caps(256), [80, 20, 20]);
        assert_eq!(caps(1024), [384, 64, 64]);
        assert_eq!(caps(1_048_576), [10_000, 64, 64]);
        for limit in [256, 512, 1024, 4096, 65_536, 1_048_576] {
            let used: usize = caps(limit).iter().sum();
            assert!(
                u64::try_from(used).unwrap() + RESERVED_MIN <= limit,
                "{limit}: {used}"
            );
        }
    }

    #[test]
    fn the_discovery_api_s_cap_fits_half_the_memory_limit_and_only_its_own() {
        const MIB: u64 = 1024 * 1024;
        for (listener, file_limit, memory, cap) in [
            // A quarter of 192 MiB at 136 KiB.
            (Listener::Discovery, 1_048_576, Some(256 * MIB), 361),
            (Listener::Discovery, 1_048_576, Some(4096 * MIB), 7589),
            (Listener::Discovery, 1_048_576, Some(8192 * MIB), 10_000),
            (Listener::Discovery, 1_048_576, None, 10_000),
            (Listener::Discovery, 1024, Some(256 * MIB), 361),
            (Listener::Discovery, 1024, Some(1024 * MIB), 384),
            (Listener::Discovery, 1_048_576, Some(64 * MIB), 4),
            (Listener::Metrics, 1_048_576, Some(64 * MIB), 64),
        ] {
            let limits = ListenerLimits::of(listener, file_limit).within_memory(listener, memory);
            assert_eq!(
                limits.max_connections, cap,
                "{listener:?} {file_limit} {memory:?}"
            );
        }
    }

    #[test]
    fn a_tiny_limit_still_serves_and_unlimited_is_capped() {
        assert_eq!(caps(64), [4, 4, 4]);
        assert_eq!(caps(u64::MAX), [10_000, 64, 64]);
        let limits = ListenerLimits::of(Listener::Discovery, 256);
        assert_eq!(limits.per_worker(2), 40);
        assert_eq!(limits.per_worker(0), 80);
        assert_eq!(ListenerLimits::of(Listener::Health, 64).per_worker(8), 1);
    }
}
