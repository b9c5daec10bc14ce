//! API Priority and Fairness, as far as a client sees it: past a configured
//! rate a request is answered `429 Too Many Requests` with `Retry-After`.
//!
//! Each priority level has its own token bucket, so one level's bulk
//! traffic cannot starve another: leader election (Lease requests) is one
//! level, everything else another. Watches are long-running requests, which
//! APF does not count per second: they are never refused. Simplified: a
//! request over the rate is refused at once (the real server first queues
//! it a little), and every Lease is at the leader-election level (a real
//! cluster puts only the matching flow schema's users there).

use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// The priority level a request is served at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    /// `coordination.k8s.io` Leases.
    LeaderElection,
    /// Everything else that is not long-running.
    Workload,
    /// Watches: long-running, never rate limited.
    Exempt,
}

impl Level {
    pub fn of(group: &str, resource: &str, verb: &str) -> Self {
        if verb == "watch" {
            Self::Exempt
        } else if group == "coordination.k8s.io" && resource.split('/').next() == Some("leases") {
            Self::LeaderElection
        } else {
            Self::Workload
        }
    }
}

/// Refills `per_second` tokens a second up to `burst`; a request takes one.
#[derive(Debug)]
struct Bucket {
    per_second: f64,
    burst: f64,
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn new(per_second: f64, burst: u32) -> Self {
        let burst = f64::from(burst.max(1));
        Self {
            per_second,
            burst,
            tokens: burst,
            at: Instant::now(),
        }
    }

    /// Takes a token, or says how long until one is there.
    fn take(&mut self, now: Instant) -> Result<(), Duration> {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.per_second).min(self.burst);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            return Ok(());
        }
        if self.per_second <= 0.0 {
            return Err(Duration::from_secs(1));
        }
        Err(Duration::from_secs_f64((1.0 - self.tokens) / self.per_second))
    }
}

/// The budgets of the priority levels.
#[derive(Debug)]
pub struct Fairness {
    leader_election: Bucket,
    workload: Bucket,
}

impl Fairness {
    /// Each level gets `per_second` with bursts of `burst` of its own.
    pub fn new(per_second: f64, burst: u32) -> Self {
        Self {
            leader_election: Bucket::new(per_second, burst),
            workload: Bucket::new(per_second, burst),
        }
    }

    /// Admits a request, or answers the whole seconds to wait (at least 1,
    /// as the header carries whole seconds and 0 would invite a tight retry).
    pub fn admit(&mut self, level: Level) -> Result<(), u64> {
        let bucket = match level {
            Level::Exempt => return Ok(()),
            Level::LeaderElection => &mut self.leader_election,
            Level::Workload => &mut self.workload,
        };
        bucket
            .take(Instant::now())
            .map_err(|wait| wait.as_secs_f64().ceil().max(1.0) as u64)
    }
}

/// The body of a `429`, as the API server sends it.
pub fn too_many_requests(retry_after: u64) -> Value {
    json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure",
        "message": "Too many requests, please try again later.",
        "reason": "TooManyRequests",
        "details": {"retryAfterSeconds": retry_after},
        "code": 429
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_refills_at_its_rate_up_to_its_burst() {
        let mut bucket = Bucket::new(2.0, 3);
        let start = bucket.at;
        for _ in 0..3 {
            assert!(bucket.take(start).is_ok());
        }
        let wait = bucket.take(start).unwrap_err();
        assert_eq!(wait, Duration::from_millis(500));
        assert!(bucket.take(start + Duration::from_millis(500)).is_ok());
        // Ten idle seconds refill only up to the burst.
        let later = start + Duration::from_secs(10);
        for _ in 0..3 {
            assert!(bucket.take(later).is_ok());
        }
        assert!(bucket.take(later).is_err());
    }

    #[test]
    fn retry_after_is_whole_seconds_and_at_least_one() {
        let mut fairness = Fairness::new(0.25, 1);
        assert_eq!(fairness.admit(Level::Workload), Ok(()));
        assert_eq!(fairness.admit(Level::Workload), Err(4));
        let mut fast = Fairness::new(100.0, 1);
        assert_eq!(fast.admit(Level::Workload), Ok(()));
        assert_eq!(fast.admit(Level::Workload), Err(1));
        // The other level has its own budget; watches need none.
        assert_eq!(fast.admit(Level::LeaderElection), Ok(()));
        assert_eq!(fast.admit(Level::Exempt), Ok(()));
    }
}
