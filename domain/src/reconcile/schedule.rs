//! When a Proxy is looked at again: one [`Schedule`] per Proxy owns every
//! "when next" — polling while something is in flight, the resync period,
//! backoff on errors and on quota, the retry of a deletion the provider
//! refuses, and which jobs a health verdict asks for. The replacement
//! backoff ([`ReplacementBackoff`]) is the one wait kept in the status
//! instead: neither a restart nor a leader change may reset it.
//!
//! The ProxyActor asks the schedule and sets its one timer; nothing else
//! decides a delay. Every backoff here is a ladder of
//! [`crate::backoff::ladders`]; the jitter sample is the caller's draw.

use std::time::Duration;

use jiff::Timestamp;

use super::{Next, ReconcileError};
use crate::backoff::{Attempts, Backoff, ladders};
use crate::provider_contract::ErrorClass;

/// How often a Proxy is looked at again.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    /// Work in flight polled ([`ladders::PROXY_POLL`]).
    pub polls: Backoff,
    pub resync: Duration,
    /// A failed reconcile tried again ([`ladders::PROXY_ERROR`]).
    pub errors: Backoff,
    /// A reconcile refused for quota tried again ([`ladders::PROXY_QUOTA`]).
    pub quota: Backoff,
}

impl Default for Timing {
    fn default() -> Self {
        Self {
            polls: ladders::PROXY_POLL,
            resync: Duration::from_secs(30),
            errors: ladders::PROXY_ERROR,
            quota: ladders::PROXY_QUOTA,
        }
    }
}

/// The two kinds of work on one Proxy, never two at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Job {
    /// The full reconcile (provider I/O, timers).
    Reconcile,
    /// Only write the latest health verdict into the status.
    Health,
}

/// The jobs a health verdict asks for, in order.
pub fn jobs_for_verdict(healthy: bool, first_status_held: bool) -> &'static [Job] {
    match (healthy, first_status_held) {
        // Nothing of the proxy serving is written yet: the reconcile writes
        // it all with this verdict (and ends the wait's timer).
        (_, true) => &[Job::Reconcile],
        (true, false) => &[Job::Health],
        // Then a full look: is the instance still there at all?
        (false, false) => &[Job::Health, Job::Reconcile],
    }
}

/// Every wait of one Proxy that is not kept in its status. Lost on a
/// restart, which starts each backoff from its shortest delay again.
#[derive(Debug, Default)]
pub struct Schedule {
    polls: Attempts,
    errors: Attempts,
    quota: Attempts,
    /// Deletes refused for good in a row.
    deletion_refusals: Attempts,
}

impl Schedule {
    /// When to run the next reconcile after one ended with `outcome`;
    /// `None`: only when something changes. `jitter` is a draw uniform in
    /// [0, 1) that spreads a backoff's wait.
    pub fn after(
        &mut self,
        outcome: &Result<Next, ReconcileError>,
        timing: &Timing,
        jitter: f64,
    ) -> Option<Duration> {
        let next = match outcome {
            Ok(next) => next,
            Err(error) => return self.after_error(error, timing, jitter),
        };
        self.errors.reset();
        self.quota.reset();
        if !matches!(next, Next::After(_)) {
            self.deletion_refusals.reset();
        }
        match *next {
            Next::Poll => Some(self.polls.next_delay(&timing.polls, jitter)),
            Next::Resync => {
                self.polls.reset();
                Some(timing.resync)
            }
            Next::After(wait) => {
                // What follows the wait is new work: poll it closely again.
                self.polls.reset();
                Some(wait)
            }
            Next::Idle | Next::Gone => {
                self.polls.reset();
                None
            }
        }
    }

    fn after_error(&mut self, error: &ReconcileError, timing: &Timing, jitter: f64) -> Option<Duration> {
        match (error.retry_after(), error.class()) {
            // Work still under way (an image download): back soon, backoff untouched.
            (Some(after), _) => Some(after),
            (None, ErrorClass::QuotaExceeded) => Some(self.quota.next_delay(&timing.quota, jitter)),
            (None, _) => Some(self.errors.next_delay(&timing.errors, jitter)),
        }
    }

    /// The provider refused the deletion once more: how long until it is
    /// asked again ([`ladders::DELETION_REFUSED`]: 30 s, doubling up to 10 minutes).
    pub fn deletion_refused(&mut self) -> Duration {
        self.deletion_refusals.next_step(&ladders::DELETION_REFUSED)
    }

    /// A restart: polls start again from the shortest delay.
    pub fn restarted(&mut self) {
        self.polls.reset();
    }
}

/// How quickly lost instances are replaced: an instance that stops (or
/// vanishes) is replaced — cattle, not pets — but one that keeps stopping
/// is replaced with growing delays, like a crash loop. Without it a proxy
/// whose instances die at start would create and delete VMs as fast as the
/// provider allows (image copies, API quota, money). The count and the
/// time the next instance may be created live in `status.replacement`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ReplacementBackoff {
    /// The waits before the first, second, … replacement in a row
    /// ([`ladders::REPLACEMENT`]: none, then 10 s doubling up to 5 minutes).
    pub ladder: Backoff,
    /// An instance up this long resets the count: its loss is a new story.
    pub stable_after: Duration,
}

impl Default for ReplacementBackoff {
    fn default() -> Self {
        Self {
            ladder: ladders::REPLACEMENT,
            stable_after: Duration::from_secs(600),
        }
    }
}

impl ReplacementBackoff {
    /// The wait before creating the `count`-th replacement in a row (the
    /// ladder's attempt `count - 1`; none for the first).
    pub fn delay(&self, count: u32) -> Duration {
        self.ladder.step(count.saturating_sub(1))
    }

    /// Whether an instance up since `since` has stayed up long enough to
    /// forget the losses before it.
    pub fn is_stable(&self, since: Timestamp, now: Timestamp) -> bool {
        now.duration_since(since).as_secs_f64() >= self.stable_after.as_secs_f64()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider_contract::{Op, ProviderError};

    fn timing() -> Timing {
        let ladder = |first, cap| Backoff {
            first,
            cap,
            ..ladders::PROXY_POLL
        };
        Timing {
            polls: ladder(Duration::from_millis(100), Duration::from_millis(400)),
            resync: Duration::from_secs(30),
            errors: ladder(Duration::from_secs(1), Duration::from_secs(4)),
            quota: ladder(Duration::from_secs(120), Duration::from_secs(480)),
        }
    }

    /// The jitter draw: the top of the spread, where a cap is tested hardest.
    const JITTER: f64 = 0.999_999;

    fn error(class: ErrorClass) -> Result<Next, ReconcileError> {
        Err(ProviderError::new(class, Op::Get, "sim", None, "no").into())
    }

    /// Jittered delays lie between the backoff's step and twice it.
    fn within(delay: Option<Duration>, step: Duration) -> bool {
        delay.is_some_and(|d| d >= step && d <= step * 2)
    }

    #[test]
    fn every_outcome_has_its_wait() {
        let t = timing();
        let mut s = Schedule::default();
        assert_eq!(s.after(&Ok(Next::Resync), &t, JITTER), Some(t.resync));
        assert_eq!(
            s.after(&Ok(Next::After(Duration::from_secs(7))), &t, JITTER),
            Some(Duration::from_secs(7))
        );
        assert_eq!(s.after(&Ok(Next::Idle), &t, JITTER), None);
        assert_eq!(s.after(&Ok(Next::Gone), &t, JITTER), None);
        // The provider's own hint wins and leaves the backoff where it was.
        let hinted = Err(
            ProviderError::new(ErrorClass::Transient, Op::Create, "sim", None, "busy")
                .retry_after(Duration::from_secs(3))
                .into(),
        );
        assert_eq!(s.after(&hinted, &t, JITTER), Some(Duration::from_secs(3)));
        assert!(within(
            s.after(&error(ErrorClass::Transient), &t, JITTER),
            t.errors.first
        ));
    }

    #[test]
    fn polls_errors_and_quota_back_off_apart_and_success_resets_them() {
        let t = timing();
        let mut s = Schedule::default();
        assert!(within(s.after(&Ok(Next::Poll), &t, JITTER), t.polls.first));
        assert!(within(s.after(&Ok(Next::Poll), &t, JITTER), t.polls.first * 2));
        // An error in between does not reset the polls, nor they the errors.
        assert!(within(
            s.after(&error(ErrorClass::Transient), &t, JITTER),
            t.errors.first
        ));
        assert!(within(
            s.after(&error(ErrorClass::Transient), &t, JITTER),
            t.errors.first * 2
        ));
        assert!(within(
            s.after(&error(ErrorClass::QuotaExceeded), &t, JITTER),
            t.quota.first
        ));
        assert!(within(
            s.after(&error(ErrorClass::QuotaExceeded), &t, JITTER),
            t.quota.first * 2
        ));
        // Capped.
        for _ in 0..10 {
            let d = s.after(&error(ErrorClass::Transient), &t, JITTER).unwrap();
            assert!(d <= t.errors.cap * 2, "{d:?}");
        }
        // A success resets the error backoffs; the polls go on until settled.
        assert!(within(s.after(&Ok(Next::Poll), &t, JITTER), t.polls.first * 4));
        assert!(within(
            s.after(&error(ErrorClass::Transient), &t, JITTER),
            t.errors.first
        ));
        assert!(within(
            s.after(&error(ErrorClass::QuotaExceeded), &t, JITTER),
            t.quota.first
        ));
        s.after(&Ok(Next::Resync), &t, JITTER);
        assert!(within(s.after(&Ok(Next::Poll), &t, JITTER), t.polls.first));
    }

    #[test]
    fn a_refused_deletion_waits_longer_each_time_until_anything_else_happens() {
        let t = timing();
        let mut s = Schedule::default();
        let waits: Vec<u64> = (0..7).map(|_| s.deletion_refused().as_secs()).collect();
        assert_eq!(waits, [30, 60, 120, 240, 480, 600, 600]);
        // The blocked reconcile's own After keeps the count.
        s.after(&Ok(Next::After(Duration::from_secs(600))), &t, JITTER);
        assert_eq!(s.deletion_refused().as_secs(), 600);
        s.after(&Ok(Next::Poll), &t, JITTER);
        assert_eq!(s.deletion_refused().as_secs(), 30);
    }

    #[test]
    fn an_unhealthy_verdict_asks_for_a_full_look_and_a_held_first_status_for_the_reconcile_alone() {
        assert_eq!(jobs_for_verdict(true, false), [Job::Health]);
        assert_eq!(jobs_for_verdict(false, false), [Job::Health, Job::Reconcile]);
        assert_eq!(jobs_for_verdict(true, true), [Job::Reconcile]);
        assert_eq!(jobs_for_verdict(false, true), [Job::Reconcile]);
    }

    #[test]
    fn the_first_replacement_is_immediate_then_delays_double_to_the_cap() {
        let b = ReplacementBackoff::default();
        let secs: Vec<u64> = (1..=9).map(|n| b.delay(n).as_secs()).collect();
        assert_eq!(secs, [0, 10, 20, 40, 80, 160, 300, 300, 300]);
        assert_eq!(
            b.delay(u32::MAX),
            b.ladder.cap,
            "no overflow however long the loop"
        );
        assert_eq!(b.delay(0), Duration::ZERO);
    }

    #[test]
    fn stability_is_measured_from_when_the_instance_came_up() {
        let b = ReplacementBackoff::default();
        let up = Timestamp::from_second(1_000_000).unwrap();
        assert!(!b.is_stable(up, up + Duration::from_secs(599)));
        assert!(b.is_stable(up, up + Duration::from_secs(600)));
        assert!(
            !b.is_stable(up, up - Duration::from_secs(5)),
            "clock skew is not stability"
        );
    }
}
