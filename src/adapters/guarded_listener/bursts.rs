//! Logging a burst of the same trouble once: the first occurrence after a
//! quiet spell is reported, the rest are only counted (and summed up once a
//! minute while the burst lasts).

use std::time::Duration;

use tokio::time::Instant;

/// A long burst is reported again this often, with its count.
const REPORT_EVERY: Duration = Duration::from_secs(60);

/// Occurrences of one kind of trouble, grouped into bursts.
#[derive(Debug)]
pub struct Bursts {
    quiet: Duration,
    last: Option<Instant>,
    reported: Option<Instant>,
    unreported: u64,
}

impl Bursts {
    /// A burst ends after `quiet` without an occurrence.
    pub fn new(quiet: Duration) -> Self {
        Self {
            quiet,
            last: None,
            reported: None,
            unreported: 0,
        }
    }

    /// Counts one occurrence at `now`; `Some(n)` when it is to be logged,
    /// `n` being how many went unlogged since the last report.
    pub fn occurred(&mut self, now: Instant) -> Option<u64> {
        let new_burst = self
            .last
            .is_none_or(|last| now.duration_since(last) >= self.quiet);
        let overdue = self
            .reported
            .is_some_and(|at| now.duration_since(at) >= REPORT_EVERY);
        self.last = Some(now);
        if new_burst || overdue {
            self.reported = Some(now);
            Some(std::mem::take(&mut self.unreported))
        } else {
            self.unreported += 1;
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_report_per_burst_and_one_a_minute_while_it_lasts() {
        let mut bursts = Bursts::new(Duration::from_secs(10));
        let start = Instant::now();
        let at = |ms: u64| start + Duration::from_millis(ms);
        assert_eq!(bursts.occurred(at(0)), Some(0));
        for ms in 1..1000 {
            assert_eq!(bursts.occurred(at(ms)), None, "inside the burst at {ms} ms");
        }
        // A quiet spell ends the burst.
        assert_eq!(bursts.occurred(at(999 + 10_000)), Some(999));
        assert_eq!(bursts.occurred(at(999 + 10_001)), None);
        // A burst that never pauses is summed up once a minute.
        let mut ms = 999 + 10_001;
        let mut reports = 0;
        while ms < 999 + 10_000 + 180_000 {
            ms += 1000;
            reports += usize::from(bursts.occurred(at(ms)).is_some());
        }
        assert_eq!(reports, 3);
    }
}
