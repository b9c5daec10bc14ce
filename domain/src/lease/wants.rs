//! How many more slots a replica serving from a share wants, as it tells
//! the leader: the acquires it refused for want of capacity over the last
//! [`WANT_WINDOW`], plus its requests waiting now, rounded up to a power
//! of two — so the leader hears a change only when the want doubles or
//! halves, and a want lasts the window after the last refusal (slots lent
//! for it are not taken back between one request and the next).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// How long a refusal counts.
pub const WANT_WINDOW: Duration = Duration::from_secs(10);
/// Refusals are counted per bucket of this length.
const BUCKET: Duration = Duration::from_secs(1);

/// Refusals for want of capacity, per second, over the window.
#[derive(Debug, Default)]
pub struct Wants {
    /// (bucket start, refusals), oldest first; at most the window's buckets.
    buckets: VecDeque<(Instant, u32)>,
}

impl Wants {
    /// An acquire refused for want of capacity at `now`.
    pub fn refused(&mut self, now: Instant) {
        self.forget(now);
        match self.buckets.back_mut() {
            Some((start, n)) if now.duration_since(*start) < BUCKET => *n = n.saturating_add(1),
            _ => self.buckets.push_back((now, 1)),
        }
    }

    /// The want to report at `now`, with `waiting` requests waiting.
    pub fn wanting(&mut self, now: Instant, waiting: u32) -> u32 {
        self.forget(now);
        let refused: u32 = self.buckets.iter().map(|(_, n)| *n).fold(0, u32::saturating_add);
        match refused.saturating_add(waiting) {
            0 => 0,
            n => n.checked_next_power_of_two().unwrap_or(u32::MAX),
        }
    }

    fn forget(&mut self, now: Instant) {
        while self
            .buckets
            .front()
            .is_some_and(|(start, _)| now.saturating_duration_since(*start) >= WANT_WINDOW)
        {
            self.buckets.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_want_rounds_up_lasts_the_window_and_counts_the_waiting() {
        let t0 = Instant::now();
        let mut wants = Wants::default();
        assert_eq!(wants.wanting(t0, 0), 0, "nothing refused, nothing waiting");
        assert_eq!(wants.wanting(t0, 1), 1, "one waiting");
        for i in 0..3 {
            wants.refused(t0 + Duration::from_millis(i * 100));
        }
        assert_eq!(wants.wanting(t0 + Duration::from_secs(1), 0), 4, "3 refused: 4");
        assert_eq!(
            wants.wanting(t0 + Duration::from_secs(1), 2),
            8,
            "and 2 waiting: 8"
        );
        wants.refused(t0 + Duration::from_secs(5));
        assert_eq!(
            wants.wanting(t0 + Duration::from_secs(9), 0),
            4,
            "within the window"
        );
        assert_eq!(
            wants.wanting(t0 + Duration::from_secs(10), 0),
            1,
            "the first second's refusals over"
        );
        assert_eq!(wants.wanting(t0 + Duration::from_secs(15), 0), 0, "all over");
    }

    #[test]
    fn a_storm_of_refusals_keeps_a_bucket_a_second() {
        let t0 = Instant::now();
        let mut wants = Wants::default();
        for i in 0..100_000u64 {
            wants.refused(t0 + Duration::from_micros(i * 300));
        }
        // 30 s of refusals, 3,333 a second.
        assert!(wants.buckets.len() <= 11, "{} buckets", wants.buckets.len());
        assert_eq!(
            wants.wanting(t0 + Duration::from_secs(30), 0),
            65_536,
            "the last 10 s: 33,333"
        );
        assert_eq!(wants.wanting(t0 + Duration::from_secs(41), 0), 0);
    }
}
