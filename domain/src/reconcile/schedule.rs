//! When a Proxy is looked at again: one [`Schedule`] per Proxy owns every
//! "when next" — polling while something is in flight, the resync period,
//! backoff on errors and on quota, the retry of a deletion the provider
//! refuses, and which jobs a health verdict asks for. The replacement
//! backoff ([`ReplacementBackoff`]) is the one wait kept in the status
//! instead: neither a restart nor a leader change may reset it.
//!
//! The ProxyActor asks the schedule and sets its one timer; nothing else
//! decides a delay.

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};
use jiff::Timestamp;

use super::{Next, ReconcileError};
use crate::provider::ErrorClass;

/// How often a Proxy is looked at again.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    pub poll_min: Duration,
    pub poll_max: Duration,
    pub resync: Duration,
    pub error_min: Duration,
    pub error_max: Duration,
    pub quota_min: Duration,
    pub quota_max: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        Self {
            poll_min: Duration::from_millis(500),
            poll_max: Duration::from_secs(15),
            resync: Duration::from_secs(30),
            error_min: Duration::from_secs(1),
            error_max: Duration::from_secs(300),
            quota_min: Duration::from_secs(120),
            quota_max: Duration::from_secs(600),
        }
    }
}

/// A deletion the provider refuses for good is retried after this long,
/// doubling up to [`MAX_DELETION_RETRY`]: something outside may fix it.
const FIRST_DELETION_RETRY: Duration = Duration::from_secs(30);
const MAX_DELETION_RETRY: Duration = Duration::from_secs(600);

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
    polls: Backoff,
    errors: Backoff,
    quota: Backoff,
    /// Deletes refused for good in a row.
    deletion_refusals: u32,
}

impl Schedule {
    /// When to run the next reconcile after one ended with `outcome`;
    /// `None`: only when something changes.
    pub fn after(&mut self, outcome: &Result<Next, ReconcileError>, timing: &Timing) -> Option<Duration> {
        let next = match outcome {
            Ok(next) => next,
            Err(error) => return self.after_error(error, timing),
        };
        self.errors.reset();
        self.quota.reset();
        if !matches!(next, Next::After(_)) {
            self.deletion_refusals = 0;
        }
        match *next {
            Next::Poll => self.polls.next(timing.poll_min, timing.poll_max),
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

    fn after_error(&mut self, error: &ReconcileError, timing: &Timing) -> Option<Duration> {
        match (error.retry_after(), error.class()) {
            // Work still under way (an image download): back soon, backoff untouched.
            (Some(after), _) => Some(after),
            (None, ErrorClass::QuotaExceeded) => self.quota.next(timing.quota_min, timing.quota_max),
            (None, _) => self.errors.next(timing.error_min, timing.error_max),
        }
    }

    /// The provider refused the deletion once more: how long until it is
    /// asked again (30 s, doubling up to 10 minutes).
    pub fn deletion_refused(&mut self) -> Duration {
        let wait = FIRST_DELETION_RETRY.saturating_mul(1 << self.deletion_refusals.min(10));
        self.deletion_refusals += 1;
        wait.min(MAX_DELETION_RETRY)
    }

    /// A restart: polls start again from the shortest delay.
    pub fn restarted(&mut self) {
        self.polls.reset();
    }
}

/// An exponential backoff with jitter that holds nothing until it is used:
/// of ten thousand Proxies, few ever back off.
#[derive(Debug, Default)]
struct Backoff(Option<Box<ExponentialBackoff>>);

impl Backoff {
    fn next(&mut self, min: Duration, max: Duration) -> Option<Duration> {
        self.0
            .get_or_insert_with(|| {
                Box::new(
                    ExponentialBuilder::default()
                        .with_min_delay(min)
                        .with_max_delay(max)
                        .with_jitter()
                        .without_max_times()
                        .build(),
                )
            })
            .next()
    }

    /// Starts again from the shortest delay.
    fn reset(&mut self) {
        self.0 = None;
    }
}

/// How quickly lost instances are replaced: an instance that stops (or
/// vanishes) is replaced — cattle, not pets — but one that keeps stopping
/// is replaced with growing delays, like a crash loop. Without it a proxy
/// whose instances die at start would create and delete VMs as fast as the
/// provider allows (image copies, API quota, money). The count and the
/// time the next instance may be created live in `status.replacement`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplacementBackoff {
    /// Delay before the second replacement in a row; doubled for each after it.
    pub base: Duration,
    /// The longest delay.
    pub max: Duration,
    /// An instance up this long resets the count: its loss is a new story.
    pub stable_after: Duration,
}

impl Default for ReplacementBackoff {
    fn default() -> Self {
        Self {
            base: Duration::from_secs(10),
            max: Duration::from_secs(300),
            stable_after: Duration::from_secs(600),
        }
    }
}

impl ReplacementBackoff {
    /// The wait before creating the `count`-th replacement in a row: none
    /// for the first, then `base`, doubling up to `max`.
    pub fn delay(&self, count: u32) -> Duration {
        match count {
            0 | 1 => Duration::ZERO,
            n => {
                let factor = 1u32.checked_shl(n - 2).unwrap_or(u32::MAX);
                self.base.saturating_mul(factor).min(self.max)
            }
        }
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
    use crate::provider::{Op, ProviderError};

    fn timing() -> Timing {
        Timing {
            poll_min: Duration::from_millis(100),
            poll_max: Duration::from_millis(400),
            resync: Duration::from_secs(30),
            error_min: Duration::from_secs(1),
            error_max: Duration::from_secs(4),
            quota_min: Duration::from_secs(120),
            quota_max: Duration::from_secs(480),
        }
    }

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
        assert_eq!(s.after(&Ok(Next::Resync), &t), Some(t.resync));
        assert_eq!(
            s.after(&Ok(Next::After(Duration::from_secs(7))), &t),
            Some(Duration::from_secs(7))
        );
        assert_eq!(s.after(&Ok(Next::Idle), &t), None);
        assert_eq!(s.after(&Ok(Next::Gone), &t), None);
        // The provider's own hint wins and leaves the backoff where it was.
        let hinted = Err(
            ProviderError::new(ErrorClass::Transient, Op::Create, "sim", None, "busy")
                .retry_after(Duration::from_secs(3))
                .into(),
        );
        assert_eq!(s.after(&hinted, &t), Some(Duration::from_secs(3)));
        assert!(within(s.after(&error(ErrorClass::Transient), &t), t.error_min));
    }

    #[test]
    fn polls_errors_and_quota_back_off_apart_and_success_resets_them() {
        let t = timing();
        let mut s = Schedule::default();
        assert!(within(s.after(&Ok(Next::Poll), &t), t.poll_min));
        assert!(within(s.after(&Ok(Next::Poll), &t), t.poll_min * 2));
        // An error in between does not reset the polls, nor they the errors.
        assert!(within(s.after(&error(ErrorClass::Transient), &t), t.error_min));
        assert!(within(
            s.after(&error(ErrorClass::Transient), &t),
            t.error_min * 2
        ));
        assert!(within(
            s.after(&error(ErrorClass::QuotaExceeded), &t),
            t.quota_min
        ));
        assert!(within(
            s.after(&error(ErrorClass::QuotaExceeded), &t),
            t.quota_min * 2
        ));
        // Capped.
        for _ in 0..10 {
            let d = s.after(&error(ErrorClass::Transient), &t).unwrap();
            assert!(d <= t.error_max * 2, "{d:?}");
        }
        // A success resets the error backoffs; the polls go on until settled.
        assert!(within(s.after(&Ok(Next::Poll), &t), t.poll_min * 4));
        assert!(within(s.after(&error(ErrorClass::Transient), &t), t.error_min));
        assert!(within(
            s.after(&error(ErrorClass::QuotaExceeded), &t),
            t.quota_min
        ));
        s.after(&Ok(Next::Resync), &t);
        assert!(within(s.after(&Ok(Next::Poll), &t), t.poll_min));
    }

    #[test]
    fn a_refused_deletion_waits_longer_each_time_until_anything_else_happens() {
        let t = timing();
        let mut s = Schedule::default();
        let waits: Vec<u64> = (0..7).map(|_| s.deletion_refused().as_secs()).collect();
        assert_eq!(waits, [30, 60, 120, 240, 480, 600, 600]);
        // The blocked reconcile's own After keeps the count.
        s.after(&Ok(Next::After(Duration::from_secs(600))), &t);
        assert_eq!(s.deletion_refused().as_secs(), 600);
        s.after(&Ok(Next::Poll), &t);
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
        assert_eq!(b.delay(u32::MAX), b.max, "no overflow however long the loop");
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
