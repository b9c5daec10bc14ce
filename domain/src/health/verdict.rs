//! The verdict state machine: samples in, verdicts out — only when the
//! verdict is first known, when it flips, or when a healthy proxy's latency
//! changes materially. Everything else stays out of the status (the API
//! server is not written every second); every sample still goes to metrics.

use std::time::Duration;

use jiff::Timestamp;

/// Consecutive results needed to call a proxy healthy / unhealthy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Thresholds {
    pub healthy: u32,
    pub unhealthy: u32,
}

/// A latency change is material when it exceeds both bounds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LatencyRule {
    /// Fraction of the reported latency (0.5 = 50%).
    pub relative: f64,
    pub absolute: Duration,
}

impl Default for LatencyRule {
    fn default() -> Self {
        Self {
            relative: 0.5,
            absolute: Duration::from_millis(100),
        }
    }
}

impl LatencyRule {
    pub fn is_material(&self, reported: Duration, now: Duration) -> bool {
        let delta = reported.abs_diff(now);
        delta > self.absolute && delta.as_secs_f64() > self.relative * reported.as_secs_f64()
    }
}

/// One probe result.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// UID of the Proxy incarnation the probe was made for.
    pub uid: String,
    pub ok: bool,
    pub latency: Duration,
    /// Why it failed.
    pub reason: Option<String>,
}

/// What the owning ProxyActor is told.
#[derive(Clone, Debug, PartialEq)]
pub struct Verdict {
    pub uid: String,
    pub healthy: bool,
    /// Latency of the probe behind a healthy verdict.
    pub latency: Option<Duration>,
    /// Why the last probe failed (unhealthy verdicts).
    pub reason: Option<String>,
    pub consecutive_failures: u32,
    /// When `healthy` last changed.
    pub last_transition: Timestamp,
    /// False for a latency-only update.
    pub flipped: bool,
}

/// A verdict the Proxy's status already records (`status.health`, in force:
/// the phase agrees and the endpoint is the one probed). A prober that
/// starts watching the proxy anew (after an operator restart or a leader
/// change) starts from it, so probes that agree with it report nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordedVerdict {
    pub healthy: bool,
    /// The latency recorded with a healthy verdict.
    pub latency: Option<Duration>,
    pub last_transition: Option<Timestamp>,
    pub consecutive_failures: u32,
}

/// Per-proxy threshold state.
#[derive(Clone, Debug)]
pub struct HealthState {
    uid: String,
    healthy: Option<bool>,
    successes: u32,
    failures: u32,
    reported_latency: Option<Duration>,
    last_transition: Option<Timestamp>,
}

impl HealthState {
    pub fn new(uid: impl Into<String>) -> Self {
        Self {
            uid: uid.into(),
            healthy: None,
            successes: 0,
            failures: 0,
            reported_latency: None,
            last_transition: None,
        }
    }

    /// The state of a prober that last reported `recorded`: a sample that
    /// agrees with it yields no verdict; a flip (by the thresholds, counted
    /// afresh) or a material latency change does.
    pub fn resuming(uid: impl Into<String>, recorded: &RecordedVerdict) -> Self {
        Self {
            uid: uid.into(),
            healthy: Some(recorded.healthy),
            successes: 0,
            failures: if recorded.healthy {
                0
            } else {
                recorded.consecutive_failures
            },
            reported_latency: recorded.latency.filter(|_| recorded.healthy),
            last_transition: recorded.last_transition,
        }
    }

    /// The current verdict, if one is known.
    pub fn healthy(&self) -> Option<bool> {
        self.healthy
    }

    /// Folds in one sample; returns a verdict when one must be reported.
    /// Samples for another incarnation of the Proxy are discarded.
    pub fn record(
        &mut self,
        sample: &Sample,
        thresholds: Thresholds,
        rule: LatencyRule,
        now: Timestamp,
    ) -> Option<Verdict> {
        if sample.uid != self.uid {
            return None;
        }
        if sample.ok {
            self.successes = self.successes.saturating_add(1);
            self.failures = 0;
        } else {
            self.failures = self.failures.saturating_add(1);
            self.successes = 0;
        }
        let flip_to = match (sample.ok, self.healthy) {
            (true, Some(true)) | (false, Some(false)) => None,
            (true, _) if self.successes >= thresholds.healthy => Some(true),
            (false, _) if self.failures >= thresholds.unhealthy => Some(false),
            _ => None,
        };
        if let Some(healthy) = flip_to {
            self.healthy = Some(healthy);
            self.last_transition = Some(now);
            self.reported_latency = healthy.then_some(sample.latency);
            return Some(self.verdict(sample, true, now));
        }
        let latency_moved = self.healthy == Some(true)
            && sample.ok
            && self
                .reported_latency
                .is_some_and(|reported| rule.is_material(reported, sample.latency));
        if latency_moved {
            self.reported_latency = Some(sample.latency);
            return Some(self.verdict(sample, false, now));
        }
        None
    }

    fn verdict(&self, sample: &Sample, flipped: bool, now: Timestamp) -> Verdict {
        let healthy = self.healthy == Some(true);
        Verdict {
            uid: self.uid.clone(),
            healthy,
            latency: healthy.then_some(sample.latency),
            reason: (!healthy).then(|| sample.reason.clone()).flatten(),
            consecutive_failures: self.failures,
            last_transition: self.last_transition.unwrap_or(now),
            flipped,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TH: Thresholds = Thresholds {
        healthy: 2,
        unhealthy: 3,
    };

    fn ok(ms: u64) -> Sample {
        Sample {
            uid: "u".into(),
            ok: true,
            latency: Duration::from_millis(ms),
            reason: None,
        }
    }

    fn fail() -> Sample {
        Sample {
            uid: "u".into(),
            ok: false,
            latency: Duration::from_millis(5),
            reason: Some("proxy refused the connection".into()),
        }
    }

    fn at(s: i64) -> Timestamp {
        Timestamp::from_second(1_000 + s).unwrap()
    }

    /// (sample index, healthy, flipped) of an emitted verdict.
    type Emitted = (usize, bool, bool);

    /// Runs samples; returns each emitted verdict.
    fn run(samples: &[Sample], th: Thresholds) -> Vec<Emitted> {
        let mut state = HealthState::new("u");
        samples
            .iter()
            .enumerate()
            .filter_map(|(i, s)| {
                state
                    .record(s, th, LatencyRule::default(), at(i as i64))
                    .map(|v| (i, v.healthy, v.flipped))
            })
            .collect()
    }

    #[test]
    fn threshold_matrix() {
        let cases: Vec<(Vec<Sample>, Thresholds, Vec<Emitted>)> = vec![
            // First verdict as soon as a threshold is met, in either direction.
            (vec![ok(10), ok(10)], TH, vec![(1, true, true)]),
            (vec![fail(), fail(), fail()], TH, vec![(2, false, true)]),
            (vec![ok(10)], TH, vec![]),
            (
                vec![ok(10)],
                Thresholds {
                    healthy: 1,
                    unhealthy: 1,
                },
                vec![(0, true, true)],
            ),
            // A failure resets the success streak and vice versa.
            (
                vec![ok(10), fail(), ok(10), fail(), ok(10), ok(10)],
                TH,
                vec![(5, true, true)],
            ),
            // Healthy stays healthy until unhealthy threshold failures in a row.
            (
                vec![ok(10), ok(10), fail(), fail(), ok(10), fail(), fail(), fail()],
                TH,
                vec![(1, true, true), (7, false, true)],
            ),
            // Recovery needs the healthy threshold again; no repeats while unchanged.
            (
                vec![fail(), fail(), fail(), fail(), ok(10), ok(10), ok(10)],
                TH,
                vec![(2, false, true), (5, true, true)],
            ),
        ];
        for (samples, th, want) in cases {
            assert_eq!(run(&samples, th), want, "{samples:?}");
        }
    }

    #[test]
    fn latency_suppression_matrix() {
        // (reported, new, material?) with the default rule: >50% and >100 ms.
        let rule = LatencyRule::default();
        for (reported, now, material) in [
            (100, 149, false),
            (100, 250, true),
            (100, 201, true),
            (100, 200, false),
            (20, 110, false),    // +450% but only 90 ms
            (20, 121, true),     // +505% and 101 ms
            (1000, 1400, false), // +400 ms but only 40%
            (1000, 1600, true),
            (1000, 300, true), // drops count too
            (300, 150, false), // exactly 50%: not more
            (300, 140, true),
            (300, 199, false), // 101 ms but only 34%
        ] {
            assert_eq!(
                rule.is_material(Duration::from_millis(reported), Duration::from_millis(now)),
                material,
                "{reported} -> {now}"
            );
        }
        // In the state machine: only material changes of a healthy proxy are reported,
        // measured against the last *reported* latency (no creeping drift).
        let got = run(
            &[ok(100), ok(100), ok(140), ok(180), ok(260), ok(270), ok(20)],
            TH,
        );
        assert_eq!(got, vec![(1, true, true), (4, true, false), (6, true, false)]);
    }

    fn recorded(healthy: bool, latency_ms: Option<u64>) -> RecordedVerdict {
        RecordedVerdict {
            healthy,
            latency: latency_ms.map(Duration::from_millis),
            last_transition: Some(at(-500)),
            consecutive_failures: if healthy { 0 } else { 3 },
        }
    }

    /// Runs samples from a state resumed from `from`; returns each emitted verdict.
    fn resumed(from: &RecordedVerdict, samples: &[Sample]) -> Vec<Verdict> {
        let mut state = HealthState::resuming("u", from);
        assert_eq!(state.healthy(), Some(from.healthy));
        samples
            .iter()
            .enumerate()
            .filter_map(|(i, s)| state.record(s, TH, LatencyRule::default(), at(i as i64)))
            .collect()
    }

    #[test]
    fn a_resumed_state_confirms_the_recorded_verdict_silently() {
        let brief = |v: &Verdict| (v.healthy, v.flipped, v.latency.map(|l| l.as_millis() as u64));
        // (healthy, flipped, latency ms) of an emitted verdict.
        type Brief = (bool, bool, Option<u64>);
        // (recorded, samples, the verdicts emitted)
        let cases: Vec<(RecordedVerdict, Vec<Sample>, Vec<Brief>)> = vec![
            // Healthy at 100 ms, probes agree: nothing to report, however many.
            (recorded(true, Some(100)), vec![ok(100); 5], vec![]),
            (recorded(true, Some(100)), vec![ok(140), ok(60), ok(190)], vec![]),
            // A material latency change is reported at once, as a latency update.
            (
                recorded(true, Some(100)),
                vec![ok(400)],
                vec![(true, false, Some(400))],
            ),
            // Failures short of the threshold say nothing; the threshold flips it.
            (recorded(true, Some(100)), vec![fail(), fail(), ok(100)], vec![]),
            (
                recorded(true, Some(100)),
                vec![fail(), fail(), fail()],
                vec![(false, true, None)],
            ),
            // Unhealthy, still failing: nothing; healthy threshold successes flip it.
            (recorded(false, None), vec![fail(); 5], vec![]),
            (recorded(false, None), vec![ok(10)], vec![]),
            (
                recorded(false, None),
                vec![fail(), ok(10), ok(12)],
                vec![(true, true, Some(12))],
            ),
        ];
        for (from, samples, want) in cases {
            let got: Vec<_> = resumed(&from, &samples).iter().map(brief).collect();
            assert_eq!(got, want, "{from:?} then {samples:?}");
        }
    }

    #[test]
    fn a_resumed_state_keeps_the_recorded_transition_time_until_a_flip() {
        let from = recorded(true, Some(100));
        let latency_only = &resumed(&from, &[ok(400)])[0];
        assert_eq!(
            latency_only.last_transition,
            at(-500),
            "no flip: the recorded time"
        );
        let flipped = &resumed(&from, &[fail(), fail(), fail()])[0];
        assert_eq!(flipped.last_transition, at(2), "a flip: its own time");
        assert_eq!(flipped.consecutive_failures, 3);
        // An unhealthy record's failures carry on; samples of another incarnation are dropped.
        let mut state = HealthState::resuming("u", &recorded(false, None));
        let mut stale = ok(10);
        stale.uid = "old-uid".into();
        for _ in 0..3 {
            assert_eq!(state.record(&stale, TH, LatencyRule::default(), at(0)), None);
        }
        assert_eq!(state.healthy(), Some(false));
    }

    #[test]
    fn stale_incarnations_are_discarded() {
        let mut state = HealthState::new("new-uid");
        let mut stale = ok(10);
        stale.uid = "old-uid".into();
        for _ in 0..5 {
            assert_eq!(state.record(&stale, TH, LatencyRule::default(), at(0)), None);
        }
        assert_eq!(state.healthy(), None);
    }

    #[test]
    fn verdicts_carry_reason_failures_and_transition_time() {
        let mut state = HealthState::new("u");
        let rule = LatencyRule::default();
        assert!(state.record(&fail(), TH, rule, at(1)).is_none());
        assert!(state.record(&fail(), TH, rule, at(2)).is_none());
        let v = state.record(&fail(), TH, rule, at(3)).unwrap();
        assert!(!v.healthy && v.flipped);
        assert_eq!(v.consecutive_failures, 3);
        assert_eq!(v.reason.as_deref(), Some("proxy refused the connection"));
        assert_eq!(v.latency, None);
        assert_eq!(v.last_transition, at(3));
        state.record(&ok(10), TH, rule, at(4));
        let v = state.record(&ok(12), TH, rule, at(5)).unwrap();
        assert_eq!(
            (v.healthy, v.consecutive_failures, v.latency),
            (true, 0, Some(Duration::from_millis(12)))
        );
        assert_eq!(v.last_transition, at(5));
    }
}
