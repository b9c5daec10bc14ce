//! The client-side request budget: a token bucket of `qps` tokens a second
//! holding at most `burst`. Pure: the clock is passed in.

use std::time::{Duration, Instant};

/// `--kube-api-qps` and `--kube-api-burst`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ApiBudget {
    /// Requests a second sustained (> 0).
    pub qps: f64,
    /// Requests sent at once after a quiet spell (≥ 1).
    pub burst: u32,
}

impl ApiBudget {
    /// `burst` defaults to twice `qps` (client-go's 5/10,
    /// controller-runtime's former 20/30 are of that order), at least 1.
    pub fn new(qps: f64, burst: Option<u32>) -> Self {
        // `as` saturates: a huge qps gives u32::MAX, never a wrap.
        let burst = burst.unwrap_or((qps * 2.0).ceil() as u32);
        Self {
            qps,
            burst: burst.max(1),
        }
    }
}

/// Tokens may go below zero: each caller reserves the next token and
/// waits for it, so callers queue in arrival order and the rate holds
/// however many wait at once.
#[derive(Clone, Debug)]
pub struct TokenBucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    /// A full bucket.
    pub fn new(budget: ApiBudget, now: Instant) -> Self {
        let burst = f64::from(budget.burst.max(1));
        Self {
            rate: budget.qps,
            burst,
            tokens: burst,
            last: now,
        }
    }

    /// Takes one token; the time to wait before sending (zero when one was there).
    pub fn reserve(&mut self, now: Instant) -> Duration {
        if now > self.last {
            let refill = now.duration_since(self.last).as_secs_f64() * self.rate;
            self.tokens = (self.tokens + refill).min(self.burst);
            self.last = now;
        }
        self.tokens -= 1.0;
        if self.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-self.tokens / self.rate)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(d: Duration) -> u128 {
        d.as_millis()
    }

    #[test]
    fn a_burst_passes_then_callers_queue_at_the_rate() {
        let t0 = Instant::now();
        let mut bucket = TokenBucket::new(ApiBudget::new(5.0, Some(1)), t0);
        let waits: Vec<u128> = (0..10).map(|_| ms(bucket.reserve(t0))).collect();
        assert_eq!(waits, vec![0, 200, 400, 600, 800, 1000, 1200, 1400, 1600, 1800]);
    }

    #[test]
    fn the_bucket_refills_to_its_burst_only() {
        let t0 = Instant::now();
        let mut bucket = TokenBucket::new(ApiBudget::new(10.0, Some(3)), t0);
        for _ in 0..3 {
            assert_eq!(bucket.reserve(t0), Duration::ZERO);
        }
        assert_eq!(ms(bucket.reserve(t0)), 100);
        // An hour idle refills three tokens, not 36,000.
        let later = t0 + Duration::from_secs(3600);
        for _ in 0..3 {
            assert_eq!(bucket.reserve(later), Duration::ZERO);
        }
        assert_eq!(ms(bucket.reserve(later)), 100);
    }

    #[test]
    fn waiting_callers_are_paid_back_as_time_passes() {
        let t0 = Instant::now();
        let mut bucket = TokenBucket::new(ApiBudget::new(2.0, Some(1)), t0);
        assert_eq!(bucket.reserve(t0), Duration::ZERO);
        assert_eq!(ms(bucket.reserve(t0)), 500);
        // 500 ms on, the reserved token has come; the next is 500 ms away.
        assert_eq!(ms(bucket.reserve(t0 + Duration::from_millis(500))), 500);
        // A clock that steps back changes nothing.
        assert_eq!(ms(bucket.reserve(t0)), 1000);
    }

    #[test]
    fn burst_defaults_to_twice_qps() {
        assert_eq!(ApiBudget::new(5.0, None).burst, 10);
        assert_eq!(ApiBudget::new(0.2, None).burst, 1);
        assert_eq!(ApiBudget::new(20.0, Some(0)).burst, 1);
    }
}
