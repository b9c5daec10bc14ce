//! An External proxy's first status waits for its first health verdict.
//! Written at once it would be `Running`, and then, a probe or two later,
//! `Ready` (or `Unhealthy`): two writes for one transition, and in
//! Kubernetes mode every write is an API request. Held back, the verdict's
//! write carries the endpoint, the conditions and the health at once.
//!
//! The wait is bounded: when no verdict comes in time (a flapping proxy
//! never reaches a threshold, a saturated probe pool, a check probing every
//! few minutes), `Running` is written as it would have been.

use std::time::Duration;

use crate::health::CheckSpec;

/// The longest a first status is held back, whatever the health check
/// says: with a check probing every few minutes the endpoint would stay out
/// of the status for many minutes, and one extra write is cheap beside that.
pub(super) const MAX_HOLD: Duration = Duration::from_secs(120);

/// Room for the proxy's registration with the prober and the verdict's way
/// back to its ProxyActor.
const SLACK: Duration = Duration::from_secs(1);

/// By when the first verdict is due, from the registration with the prober,
/// when probes run as `check` says: the first probe starts within one
/// interval (start times are spread), each probe takes at most the timeout,
/// the next starts within an interval after it ends, and a verdict needs
/// a threshold's worth of probes in a row — the larger threshold, as
/// either verdict may come. So `n × (interval + timeout)`, plus [`SLACK`];
/// at most [`MAX_HOLD`]. With the defaults (1s, 5s, 2 and 3): 19 s; a
/// healthy proxy's verdict comes within about two intervals.
pub(super) fn first_verdict_due(check: &CheckSpec) -> Duration {
    let probes = check.thresholds.healthy.max(check.thresholds.unhealthy).max(1);
    check
        .interval
        .saturating_add(check.timeout)
        .saturating_mul(probes)
        .saturating_add(SLACK)
        .min(MAX_HOLD)
}

/// What becomes of a reconcile's status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum FirstStatus {
    /// Written (when it changed), as always.
    Write,
    /// Held back; look again after this long unless the verdict comes first.
    Hold(Duration),
}

/// `interim`: the status takes a proxy with nothing recorded into
/// `Running` ([`StatusDraft::first_serving`](super::StatusDraft::first_serving));
/// `due`: by when its first verdict is due, `None` when none will come (no
/// prober, or a health check that cannot run); `known`: a verdict for this
/// incarnation is known already; `waited`: how long it has been held back.
pub(super) fn first_status(
    interim: bool,
    due: Option<Duration>,
    known: bool,
    waited: Duration,
) -> FirstStatus {
    match due {
        Some(due) if interim && !known && waited < due => FirstStatus::Hold(due - waited),
        _ => FirstStatus::Write,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::health::Thresholds;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn only_an_interim_status_with_a_verdict_on_its_way_is_held_and_not_for_longer_than_due() {
        use FirstStatus::*;
        // (interim, due, known, waited, decision)
        let table = [
            (true, Some(secs(19)), false, secs(0), Hold(secs(19))),
            (true, Some(secs(19)), false, secs(5), Hold(secs(14))),
            // Past due: Running is written as before.
            (true, Some(secs(19)), false, secs(19), Write),
            (true, Some(secs(19)), false, secs(60), Write),
            // The verdict is known: this write carries it.
            (true, Some(secs(19)), true, secs(0), Write),
            // No verdict will come (no prober, the check cannot run).
            (true, None, false, secs(0), Write),
            // Not an interim status (a change of a serving proxy, a failure, ...).
            (false, Some(secs(19)), false, secs(0), Write),
            (false, None, true, secs(0), Write),
        ];
        for (interim, due, known, waited, want) in table {
            assert_eq!(
                first_status(interim, due, known, waited),
                want,
                "interim {interim}, due {due:?}, known {known}, waited {waited:?}"
            );
        }
    }

    #[test]
    fn the_first_verdict_is_due_after_a_thresholds_worth_of_probes_each_up_to_its_timeout() {
        let check = |interval: u64, timeout_ms: u64, healthy: u32, unhealthy: u32| CheckSpec {
            url: "http://example.com/".parse().unwrap(),
            expected_status: None,
            interval: secs(interval),
            timeout: Duration::from_millis(timeout_ms),
            thresholds: Thresholds { healthy, unhealthy },
        };
        // (interval s, timeout ms, healthy, unhealthy, due)
        let table = [
            // The defaults: three probes of up to 1 s + 5 s, and the slack.
            (1, 5000, 2, 3, secs(19)),
            (1, 1000, 2, 3, secs(7)),
            // The larger threshold counts, either way round.
            (1, 1000, 5, 1, secs(11)),
            (1, 1000, 1, 1, secs(3)),
            (10, 2000, 2, 3, secs(37)),
            // Slow checks: capped.
            (60, 5000, 2, 3, MAX_HOLD),
            (86_400, 30_000, 2, 3, MAX_HOLD),
            (1, 1000, u32::MAX, 1, MAX_HOLD),
        ];
        for (interval, timeout, healthy, unhealthy, want) in table {
            assert_eq!(
                first_verdict_due(&check(interval, timeout, healthy, unhealthy)),
                want,
                "{interval}s, {timeout}ms, {healthy}/{unhealthy}"
            );
        }
    }
}
