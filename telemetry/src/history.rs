//! The dashboard's recent past: one [`Sample`] per [`RESOLUTION`] for the
//! last [`SPAN`], kept in memory (a fixed-size ring, ~150 KiB when full)
//! so the page can draw charts without a Prometheus. Events feed the open
//! interval ([`super::events`]); the running system closes it every
//! `RESOLUTION` ([`History::close`]). Per process: a replica's own grants
//! and probes, gone with the process.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{LazyLock, Mutex, PoisonError};
use std::time::Duration;

use serde::Serialize;

/// Time between samples.
pub const RESOLUTION: Duration = Duration::from_secs(10);
/// How far back the history reaches.
pub const SPAN: Duration = Duration::from_secs(6 * 3600);
/// Samples kept: `SPAN / RESOLUTION`.
pub const CAPACITY: usize = (SPAN.as_secs() / RESOLUTION.as_secs()) as usize;

/// Latency buckets: bucket `i` holds probes up to `FIRST_BOUND_MS * GROWTH^i`
/// (0.1 ms … ~2 min in 64 steps of 25 %, past any probe timeout; a quantile
/// is off by at most a step).
const BUCKETS: usize = 64;
const FIRST_BOUND_MS: f64 = 0.1;
const GROWTH: f64 = 1.25;

/// One interval of the operator's life.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Sample {
    /// The interval's end, in Unix milliseconds.
    pub at: i64,
    /// Leases granted in the interval.
    pub granted: u64,
    /// Acquires refused in the interval (every reason, as `leases_denied_total`).
    pub denied: u64,
    /// Proxies this operator reconciles, at the interval's end.
    pub proxies: i64,
    /// Of them Ready, and Unhealthy.
    pub ready: i64,
    pub unhealthy: i64,
    /// Health probes finished in the interval.
    pub probes: u64,
    /// Their latency's median and 99th percentile (none: no probe).
    pub probe_p50_ms: Option<f64>,
    pub probe_p99_ms: Option<f64>,
    /// Gateway requests and tunnels ended in the interval.
    pub gateway_requests: u64,
    /// Gateway tries after the first (on another proxy), failures reported
    /// on a proxy's lease, and responses that matched a block rule.
    pub gateway_retries: u64,
    pub gateway_failures: u64,
    pub gateway_blocks: u64,
    /// Gateway tunnels open at the interval's end.
    pub gateway_tunnels: i64,
}

/// The open interval's counters and the closed samples.
pub struct History {
    granted: AtomicU64,
    denied: AtomicU64,
    proxies: AtomicI64,
    ready: AtomicI64,
    unhealthy: AtomicI64,
    latency: [AtomicU64; BUCKETS],
    gateway_requests: AtomicU64,
    gateway_retries: AtomicU64,
    gateway_failures: AtomicU64,
    gateway_blocks: AtomicU64,
    samples: Mutex<VecDeque<Sample>>,
    capacity: usize,
}

impl History {
    pub fn new(capacity: usize) -> Self {
        Self {
            granted: AtomicU64::new(0),
            denied: AtomicU64::new(0),
            proxies: AtomicI64::new(0),
            ready: AtomicI64::new(0),
            unhealthy: AtomicI64::new(0),
            latency: std::array::from_fn(|_| AtomicU64::new(0)),
            gateway_requests: AtomicU64::new(0),
            gateway_retries: AtomicU64::new(0),
            gateway_failures: AtomicU64::new(0),
            gateway_blocks: AtomicU64::new(0),
            samples: Mutex::new(VecDeque::with_capacity(capacity)),
            capacity,
        }
    }

    pub fn note_grant(&self) {
        self.granted.fetch_add(1, Ordering::Relaxed);
    }

    pub fn note_denial(&self) {
        self.denied.fetch_add(1, Ordering::Relaxed);
    }

    pub fn note_probe(&self, latency: Duration) {
        self.latency[bucket_of(latency)].fetch_add(1, Ordering::Relaxed);
    }

    pub fn note_gateway_request(&self) {
        self.gateway_requests.fetch_add(1, Ordering::Relaxed);
    }

    pub fn note_gateway_retry(&self) {
        self.gateway_retries.fetch_add(1, Ordering::Relaxed);
    }

    pub fn note_gateway_failure(&self) {
        self.gateway_failures.fetch_add(1, Ordering::Relaxed);
    }

    pub fn note_gateway_block(&self) {
        self.gateway_blocks.fetch_add(1, Ordering::Relaxed);
    }

    /// A proxy moved between phases (`None`: new or gone), as the proxies gauge.
    pub fn note_phase(&self, from: Option<&str>, to: Option<&str>) {
        for (phase, delta) in [(from, -1), (to, 1)] {
            let Some(phase) = phase else { continue };
            self.proxies.fetch_add(delta, Ordering::Relaxed);
            match phase {
                "Ready" => self.ready.fetch_add(delta, Ordering::Relaxed),
                "Unhealthy" => self.unhealthy.fetch_add(delta, Ordering::Relaxed),
                _ => 0,
            };
        }
    }

    /// Ends the open interval at `at` (Unix ms): its sample joins the ring,
    /// the oldest leaving once the ring is full.
    pub fn close(&self, at: i64) -> Sample {
        let counts: Vec<u64> = self
            .latency
            .iter()
            .map(|b| b.swap(0, Ordering::Relaxed))
            .collect();
        let sample = Sample {
            at,
            granted: self.granted.swap(0, Ordering::Relaxed),
            denied: self.denied.swap(0, Ordering::Relaxed),
            proxies: self.proxies.load(Ordering::Relaxed),
            ready: self.ready.load(Ordering::Relaxed),
            unhealthy: self.unhealthy.load(Ordering::Relaxed),
            probes: counts.iter().sum(),
            probe_p50_ms: quantile(&counts, 0.5),
            probe_p99_ms: quantile(&counts, 0.99),
            gateway_requests: self.gateway_requests.swap(0, Ordering::Relaxed),
            gateway_retries: self.gateway_retries.swap(0, Ordering::Relaxed),
            gateway_failures: self.gateway_failures.swap(0, Ordering::Relaxed),
            gateway_blocks: self.gateway_blocks.swap(0, Ordering::Relaxed),
            gateway_tunnels: super::gateway_stats::gateway_stats().open_now().1,
        };
        let mut samples = self.samples.lock().unwrap_or_else(PoisonError::into_inner);
        if samples.len() == self.capacity {
            samples.pop_front();
        }
        samples.push_back(sample);
        sample
    }

    /// The samples after `after` (Unix ms; `None`: all), oldest first.
    pub fn since(&self, after: Option<i64>) -> Vec<Sample> {
        let samples = self.samples.lock().unwrap_or_else(PoisonError::into_inner);
        let skip = after.map_or(0, |after| samples.partition_point(|s| s.at <= after));
        samples.iter().skip(skip).copied().collect()
    }
}

/// The bucket a latency falls in (the last holds everything longer).
fn bucket_of(latency: Duration) -> usize {
    let ms = latency.as_secs_f64() * 1000.0;
    if ms <= FIRST_BOUND_MS {
        return 0;
    }
    let i = ((ms / FIRST_BOUND_MS).ln() / GROWTH.ln()).ceil() as usize;
    i.min(BUCKETS - 1)
}

fn upper_bound_ms(bucket: usize) -> f64 {
    FIRST_BOUND_MS * GROWTH.powi(bucket as i32)
}

/// The `q` quantile of the counted latencies: the upper bound of the
/// bucket where the cumulative count reaches `q` of all.
fn quantile(counts: &[u64], q: f64) -> Option<f64> {
    let total: u64 = counts.iter().sum();
    if total == 0 {
        return None;
    }
    let rank = ((total as f64) * q).ceil().max(1.0) as u64;
    let mut seen = 0;
    for (i, count) in counts.iter().enumerate() {
        seen += count;
        if seen >= rank {
            // Three significant digits are all a 25 % bucket can say.
            let bound = upper_bound_ms(i);
            let scale = 10f64.powi(2 - bound.log10().floor() as i32);
            return Some((bound * scale).round() / scale);
        }
    }
    None
}

static HISTORY: LazyLock<History> = LazyLock::new(|| History::new(CAPACITY));

/// The process's history.
pub fn history() -> &'static History {
    &HISTORY
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_interval_counts_what_happened_in_it_and_starts_the_next_from_zero() {
        let h = History::new(4);
        h.note_phase(None, Some("Pending"));
        h.note_phase(Some("Pending"), Some("Ready"));
        h.note_phase(None, Some("Unhealthy"));
        for _ in 0..3 {
            h.note_grant();
        }
        h.note_denial();
        h.note_gateway_request();
        h.note_gateway_request();
        h.note_gateway_retry();
        h.note_gateway_failure();
        h.note_gateway_block();
        let s = h.close(10_000);
        assert_eq!(
            (
                s.gateway_requests,
                s.gateway_retries,
                s.gateway_failures,
                s.gateway_blocks
            ),
            (2, 1, 1, 1)
        );
        assert_eq!(
            (s.granted, s.denied, s.proxies, s.ready, s.unhealthy, s.probes),
            (3, 1, 2, 1, 1, 0)
        );
        assert_eq!(
            (s.probe_p50_ms, s.probe_p99_ms),
            (None, None),
            "no probe, no latency"
        );
        h.note_phase(Some("Unhealthy"), None);
        let s = h.close(20_000);
        assert_eq!(
            (s.granted, s.denied, s.proxies, s.ready, s.unhealthy),
            (0, 0, 1, 1, 0)
        );
    }

    #[test]
    fn quantiles_come_within_a_bucket_of_the_truth() {
        let h = History::new(4);
        // 1..=100 ms: p50 ≈ 50 ms, p99 ≈ 99 ms.
        for ms in 1..=100 {
            h.note_probe(Duration::from_millis(ms));
        }
        let s = h.close(1);
        assert_eq!(s.probes, 100);
        let (p50, p99) = (s.probe_p50_ms.unwrap(), s.probe_p99_ms.unwrap());
        assert!((50.0..=50.0 * GROWTH).contains(&p50), "{p50}");
        assert!((99.0..=99.0 * GROWTH).contains(&p99), "{p99}");
        // Extremes land in the first and last buckets.
        h.note_probe(Duration::ZERO);
        h.note_probe(Duration::from_secs(3600));
        let s = h.close(2);
        assert_eq!(s.probe_p50_ms, Some(0.1));
        assert!(s.probe_p99_ms.unwrap() > 100_000.0, "the last bucket: ~2 min");
    }

    #[test]
    fn the_ring_keeps_the_newest_samples_and_answers_what_came_after_a_time() {
        let h = History::new(3);
        for at in 1..=5 {
            h.close(at * 10);
        }
        let ats = |v: Vec<Sample>| v.iter().map(|s| s.at).collect::<Vec<_>>();
        assert_eq!(ats(h.since(None)), vec![30, 40, 50], "bounded: the oldest left");
        assert_eq!(ats(h.since(Some(40))), vec![50]);
        assert_eq!(ats(h.since(Some(35))), vec![40, 50]);
        assert_eq!(ats(h.since(Some(50))), Vec::<i64>::new());
        assert_eq!(ats(h.since(Some(0))), vec![30, 40, 50]);
    }
}
