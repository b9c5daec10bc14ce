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
//! process of files.

use std::time::Duration;

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

    /// The cap of each of `workers` threads that share the connections
    /// (actix counts per worker), at least one.
    pub fn per_worker(&self, workers: usize) -> usize {
        (self.max_connections / workers.max(1)).max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn a_tiny_limit_still_serves_and_unlimited_is_capped() {
        assert_eq!(caps(64), [4, 4, 4]);
        assert_eq!(caps(u64::MAX), [10_000, 64, 64]);
        let limits = ListenerLimits::of(Listener::Discovery, 256);
        assert_eq!(limits.per_worker(2), 40);
        assert_eq!(limits.per_worker(0), 80);
        assert_eq!(ListenerLimits::of(Listener::Health, 64).per_worker(8), 1);
    }
}
