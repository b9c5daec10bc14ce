//! The gateway's figures for the dashboard: totals since start, requests
//! and tunnels in progress, and the latest exchanges (as their access
//! lines say, never with a credential). Fed by the gateway's events
//! ([`super::events`]); per process, like [`super::history`].

use std::collections::VecDeque;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{LazyLock, Mutex, PoisonError};

use serde::Serialize;

/// Latest exchanges kept.
pub const RECENT: usize = 20;

/// One ended request or tunnel.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RecentExchange {
    /// When it ended, Unix milliseconds.
    pub at: i64,
    pub kind: &'static str,
    pub client: Option<String>,
    pub target: String,
    pub proxy: Option<String>,
    pub tries: u32,
    pub status: u16,
    pub outcome: &'static str,
    pub duration_ms: u64,
}

/// What `GET /v1/dashboard` shows of the gateway.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GatewaySummary {
    /// Requests and tunnels ended.
    pub requests: u64,
    /// Of them answered by a leased proxy (blocked ones included).
    pub served: u64,
    /// In progress now.
    pub open_requests: i64,
    pub open_tunnels: i64,
    /// Leases taken, and of them tries after the first.
    pub tries: u64,
    pub retries: u64,
    /// Tries that failed and were reported on the proxy's lease.
    pub failures: u64,
    /// Responses that matched a block rule.
    pub blocks: u64,
    /// Sticky sessions remembered.
    pub sessions: i64,
    pub bytes_up: u64,
    pub bytes_down: u64,
    /// Newest first.
    pub recent: Vec<RecentExchange>,
    /// Requests served on the first proxy tried.
    pub first_try_served: u64,
    /// What the gateway learnt per site, the most recently used first
    /// (at most [`SITES_SHOWN`]; refreshed about once a second).
    pub sites: Vec<SiteSummary>,
}

/// Sites the summary shows.
pub const SITES_SHOWN: usize = 100;

/// One site as the gateway learnt it.
#[derive(Clone, Debug, PartialEq, Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SiteSummary {
    pub site: String,
    pub requests: u64,
    pub first_try_served: u64,
    /// Its proxies, the best first.
    pub proxies: Vec<SiteProxy>,
}

/// One (site, proxy) pair.
#[derive(Clone, Debug, PartialEq, Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SiteProxy {
    pub proxy: String,
    /// Recent success rate, `(successes + 1) / (tries + 2)`.
    pub success_rate: f64,
    /// Recent successes and failures (decayed, so fractional).
    pub successes: f64,
    pub failures: f64,
    /// Passed over for the site now.
    pub avoided: bool,
}

#[derive(Default)]
pub struct GatewayStats {
    requests: AtomicU64,
    served: AtomicU64,
    open_requests: AtomicI64,
    open_tunnels: AtomicI64,
    tries: AtomicU64,
    retries: AtomicU64,
    failures: AtomicU64,
    blocks: AtomicU64,
    sessions: AtomicI64,
    bytes_up: AtomicU64,
    bytes_down: AtomicU64,
    first_try_served: AtomicU64,
    recent: Mutex<VecDeque<RecentExchange>>,
    sites: Mutex<Vec<SiteSummary>>,
}

impl GatewayStats {
    pub fn note_started(&self, tunnel: bool) {
        self.open(tunnel).fetch_add(1, Ordering::Relaxed);
    }

    pub fn note_ended(&self, exchange: RecentExchange, served: bool, bytes: (u64, u64)) {
        self.open(exchange.kind == "tunnel")
            .fetch_sub(1, Ordering::Relaxed);
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.served.fetch_add(u64::from(served), Ordering::Relaxed);
        self.bytes_up.fetch_add(bytes.0, Ordering::Relaxed);
        self.bytes_down.fetch_add(bytes.1, Ordering::Relaxed);
        let mut recent = self.recent.lock().unwrap_or_else(PoisonError::into_inner);
        if recent.len() == RECENT {
            recent.pop_back();
        }
        recent.push_front(exchange);
    }

    pub fn note_try(&self, retry: bool, sessions: Option<usize>) {
        self.tries.fetch_add(1, Ordering::Relaxed);
        self.retries.fetch_add(u64::from(retry), Ordering::Relaxed);
        if let Some(n) = sessions {
            self.sessions.store(n as i64, Ordering::Relaxed);
        }
    }

    pub fn note_failure(&self) {
        self.failures.fetch_add(1, Ordering::Relaxed);
    }

    pub fn note_block(&self) {
        self.blocks.fetch_add(1, Ordering::Relaxed);
    }

    pub fn note_first_try_served(&self) {
        self.first_try_served.fetch_add(1, Ordering::Relaxed);
    }

    /// What the gateway learnt per site, now.
    pub fn note_sites(&self, sites: Vec<SiteSummary>) {
        *self.sites.lock().unwrap_or_else(PoisonError::into_inner) = sites;
    }

    /// Requests and tunnels in progress.
    pub fn open_now(&self) -> (i64, i64) {
        (
            self.open_requests.load(Ordering::Relaxed),
            self.open_tunnels.load(Ordering::Relaxed),
        )
    }

    fn open(&self, tunnel: bool) -> &AtomicI64 {
        if tunnel {
            &self.open_tunnels
        } else {
            &self.open_requests
        }
    }

    pub fn summary(&self) -> GatewaySummary {
        let (open_requests, open_tunnels) = self.open_now();
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        GatewaySummary {
            requests: load(&self.requests),
            served: load(&self.served),
            open_requests,
            open_tunnels,
            tries: load(&self.tries),
            retries: load(&self.retries),
            failures: load(&self.failures),
            blocks: load(&self.blocks),
            sessions: self.sessions.load(Ordering::Relaxed),
            bytes_up: load(&self.bytes_up),
            bytes_down: load(&self.bytes_down),
            recent: self
                .recent
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .iter()
                .cloned()
                .collect(),
            first_try_served: load(&self.first_try_served),
            sites: self.sites.lock().unwrap_or_else(PoisonError::into_inner).clone(),
        }
    }
}

static STATS: LazyLock<GatewayStats> = LazyLock::new(GatewayStats::default);

/// The process's gateway figures.
pub fn gateway_stats() -> &'static GatewayStats {
    &STATS
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ended(target: &str) -> RecentExchange {
        RecentExchange {
            at: 1,
            kind: "http",
            client: None,
            target: target.to_owned(),
            proxy: Some("ns/p".into()),
            tries: 1,
            status: 200,
            outcome: "served",
            duration_ms: 3,
        }
    }

    #[test]
    fn the_summary_counts_and_keeps_the_newest_exchanges_first() {
        let stats = GatewayStats::default();
        for i in 0..=RECENT {
            stats.note_started(false);
            stats.note_ended(ended(&format!("t{i}")), i % 2 == 0, (10, 100));
        }
        stats.note_started(true);
        stats.note_try(false, None);
        stats.note_try(true, Some(4));
        stats.note_failure();
        stats.note_block();
        let s = stats.summary();
        assert_eq!(
            (s.requests, s.served, s.open_requests, s.open_tunnels),
            (RECENT as u64 + 1, 11, 0, 1)
        );
        assert_eq!(
            (s.tries, s.retries, s.failures, s.blocks, s.sessions),
            (2, 1, 1, 1, 4)
        );
        assert_eq!((s.bytes_up, s.bytes_down), (210, 2100));
        assert_eq!(s.recent.len(), RECENT, "bounded");
        assert_eq!(s.recent[0].target, format!("t{RECENT}"), "newest first");
    }
}
