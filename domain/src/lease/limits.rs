//! Bounds on the lease book's own memory. A hostile client can ask for
//! leases on endless targets or end leases endlessly; each table below stops
//! at its bound. None is ever reached by forgetting a lease or a rest: when a
//! table is full of state that still matters, the request is refused.

use std::time::Duration;

/// How much the lease book keeps at most.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseLimits {
    /// Leases held at once. Beyond it acquires are refused until one ends.
    pub max_leases: usize,
    /// Targets with per-target state (rests, "last leased" marks). Targets
    /// with no rest running and no lease (held, or ended but still taking
    /// reports) are forgotten oldest-first to make room; when none can be,
    /// acquires for new targets are refused.
    pub max_targets: usize,
    /// Ended leases kept for late reports; the oldest is forgotten first
    /// (a report on it then answers 404).
    pub max_ended: usize,
    /// Latest report details kept across all leases (each lease keeps only
    /// counts per outcome).
    pub recent_reports: usize,
}

impl Default for LeaseLimits {
    fn default() -> Self {
        Self {
            max_leases: 50_000,
            max_targets: 50_000,
            max_ended: 20_000,
            recent_reports: 256,
        }
    }
}

/// A table of the lease book is full of state it must not forget.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the lease store holds its maximum of {limit} {table}; try again in {}s", retry_after.as_secs().max(1))]
pub struct TableFull {
    /// `leases` or `targets`.
    pub table: &'static str,
    pub limit: usize,
    /// When room is expected (the earliest expiry or end of a rest).
    pub retry_after: Duration,
}

/// Sizes of the lease book's tables, to show they stay bounded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Footprint {
    pub leases: usize,
    pub ended: usize,
    pub targets: usize,
    /// Per-target marks (rests and "last leased") across all targets.
    pub target_marks: usize,
    pub recent_reports: usize,
    /// Bytes of detail text kept.
    pub detail_bytes: usize,
}
