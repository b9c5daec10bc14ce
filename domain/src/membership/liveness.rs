//! Whether the holder of a Lease is alive, judged the way leader election
//! judges it: a record (holder, renewTime, resourceVersion) seen unchanged
//! for the full lease duration, counted on the observer's own monotonic
//! clock from after the read, means its holder stopped renewing. Times
//! inside the record are compared for equality only, never with a clock,
//! so skewed clocks between replicas cannot cause an early verdict.

use std::time::{Duration, Instant};

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;

/// The holder a Lease names (empty when released).
pub fn holder_of(lease: &Lease) -> String {
    Record::of(lease).holder
}

/// The parts of the record whose change proves the holder is alive.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Record {
    holder: String,
    renew_time: Option<Timestamp>,
    resource_version: Option<String>,
}

impl Record {
    fn of(lease: &Lease) -> Self {
        let spec = lease.spec.as_ref();
        Self {
            holder: spec.and_then(|s| s.holder_identity.clone()).unwrap_or_default(),
            renew_time: spec.and_then(|s| s.renew_time.as_ref()).map(|t| t.0),
            resource_version: lease.metadata.resource_version.clone(),
        }
    }
}

/// A record and when this candidate first saw it (its own monotonic clock).
#[derive(Clone, Debug)]
struct Observation {
    record: Record,
    since: Instant,
    /// The longer of ours and the record's `leaseDurationSeconds`.
    wait: Duration,
}

/// What to do about the record just read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Ours: write a new renewTime.
    Renew,
    /// Released, or unchanged for the full lease duration: write ourselves in.
    TakeOver,
    Follow {
        holder: String,
    },
}

/// The candidate's memory of the record: takeover only after the same
/// record was seen unchanged for the full duration. Timestamps inside the
/// record are compared for equality only, never with a clock.
#[derive(Debug)]
pub struct Liveness {
    identity: String,
    lease_duration: Duration,
    observed: Option<Observation>,
}

impl Liveness {
    /// The memory of a candidate (or an observer of members) named
    /// `identity`, waiting `lease_duration` at least.
    pub fn new(identity: &str, lease_duration: Duration) -> Self {
        Self {
            identity: identity.to_owned(),
            lease_duration,
            observed: None,
        }
    }

    /// How long the record last decided on has been seen unchanged, at
    /// `seen_at` (zero before any).
    pub fn unchanged_for(&self, seen_at: Instant) -> Duration {
        self.observed
            .as_ref()
            .map_or(Duration::ZERO, |o| seen_at.saturating_duration_since(o.since))
    }

    /// `seen_at`: when the read that returned `lease` completed.
    pub fn decide(&mut self, lease: &Lease, seen_at: Instant) -> Decision {
        let record = Record::of(lease);
        if self.observed.as_ref().is_none_or(|o| o.record != record) {
            let theirs = lease
                .spec
                .as_ref()
                .and_then(|s| s.lease_duration_seconds)
                .and_then(|s| u64::try_from(s).ok())
                .map(Duration::from_secs)
                .unwrap_or_default();
            self.observed = Some(Observation {
                record: record.clone(),
                since: seen_at,
                wait: self.lease_duration.max(theirs),
            });
        }
        if record.holder == self.identity {
            return Decision::Renew;
        }
        if record.holder.is_empty() {
            return Decision::TakeOver;
        }
        match &self.observed {
            Some(o) if seen_at.saturating_duration_since(o.since) >= o.wait => Decision::TakeOver,
            _ => Decision::Follow {
                holder: record.holder,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};

    use super::*;

    fn observer(lease_duration: Duration) -> Liveness {
        Liveness::new("me", lease_duration)
    }

    /// A monotonic clock the test moves by hand.
    struct FakeClock {
        at: std::cell::Cell<Instant>,
    }

    impl FakeClock {
        fn new() -> Self {
            Self {
                at: std::cell::Cell::new(Instant::now()),
            }
        }

        fn now(&self) -> Instant {
            self.at.get()
        }

        fn advance(&self, by: Duration) {
            self.at.set(self.at.get() + by);
        }
    }

    /// A Lease as another replica wrote it; `renew_time` from its own clock.
    fn lease(holder: &str, renew_time: Timestamp, version: u64, seconds: i32) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some("l".into()),
                resource_version: Some(version.to_string()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: (!holder.is_empty()).then(|| holder.to_owned()),
                renew_time: Some(MicroTime(renew_time)),
                lease_duration_seconds: Some(seconds),
                ..LeaseSpec::default()
            }),
        }
    }

    fn ten_minutes_off(sign: i64) -> Timestamp {
        Timestamp::now() + jiff::SignedDuration::from_secs(sign * 600)
    }

    fn follows(d: &Decision) -> bool {
        matches!(d, Decision::Follow { holder } if holder == "other")
    }

    #[test]
    fn takeover_waits_the_full_duration_from_the_observation() {
        let clock = FakeClock::new();
        let mut o = observer(Duration::from_secs(15));
        // Written ten minutes "ago" by a skewed clock: no premature takeover.
        let l = lease("other", ten_minutes_off(-1), 7, 15);
        let seen = clock.now();
        assert!(follows(&o.decide(&l, seen)));
        assert!(follows(&o.decide(&l, seen + Duration::from_millis(14_999))));
        assert_eq!(o.decide(&l, seen + Duration::from_secs(15)), Decision::TakeOver);
    }

    #[test]
    fn a_record_that_keeps_changing_is_never_taken_over() {
        let clock = FakeClock::new();
        let mut o = observer(Duration::from_secs(3));
        let past = ten_minutes_off(-1);
        for i in 0..100u32 {
            // Renewed every second, with renewTimes minutes in the past.
            let renewed = past + jiff::SignedDuration::from_micros(i.into());
            let l = lease("other", renewed, u64::from(i) + 1, 3);
            assert!(follows(&o.decide(&l, clock.now())), "round {i}");
            clock.advance(Duration::from_secs(1));
        }
    }

    #[test]
    fn a_renew_time_in_the_future_does_not_delay_takeover() {
        let clock = FakeClock::new();
        let mut o = observer(Duration::from_secs(3));
        let l = lease("other", ten_minutes_off(1), 9, 3);
        let seen = clock.now();
        assert!(follows(&o.decide(&l, seen)));
        assert_eq!(o.decide(&l, seen + Duration::from_secs(3)), Decision::TakeOver);
    }

    #[test]
    fn a_change_restarts_the_wait_and_the_longer_duration_wins() {
        let clock = FakeClock::new();
        let t0 = clock.now();
        let mut o = observer(Duration::from_secs(15));
        let renewed = Timestamp::UNIX_EPOCH;
        assert!(follows(&o.decide(&lease("other", renewed, 1, 15), t0)));
        // Renewed (new version) 10 s later: the 15 s count starts again.
        let l = lease("other", renewed, 2, 15);
        assert!(follows(&o.decide(&l, t0 + Duration::from_secs(10))));
        assert!(follows(&o.decide(&l, t0 + Duration::from_secs(24))));
        assert_eq!(o.decide(&l, t0 + Duration::from_secs(25)), Decision::TakeOver);
        // A holder that declares 60 s is given 60 s, whatever ours says.
        let long = lease("other", renewed, 3, 60);
        assert!(follows(&o.decide(&long, t0 + Duration::from_secs(30))));
        assert!(follows(&o.decide(&long, t0 + Duration::from_secs(89))));
        assert_eq!(o.decide(&long, t0 + Duration::from_secs(90)), Decision::TakeOver);
    }

    #[test]
    fn released_is_taken_at_once_and_ours_is_renewed() {
        let clock = FakeClock::new();
        let mut o = observer(Duration::from_secs(15));
        let released = lease("", Timestamp::UNIX_EPOCH, 4, 15);
        assert_eq!(o.decide(&released, clock.now()), Decision::TakeOver);
        let ours = lease("me", Timestamp::UNIX_EPOCH, 5, 15);
        assert_eq!(o.decide(&ours, clock.now()), Decision::Renew);
    }

    #[test]
    fn unchanged_for_counts_from_the_first_sight_of_a_record() {
        let clock = FakeClock::new();
        let t0 = clock.now();
        let mut o = observer(Duration::from_secs(3));
        assert_eq!(o.unchanged_for(t0), Duration::ZERO, "nothing seen yet");
        let l = lease("other", Timestamp::UNIX_EPOCH, 1, 3);
        o.decide(&l, t0);
        o.decide(&l, t0 + Duration::from_millis(400));
        assert_eq!(
            o.unchanged_for(t0 + Duration::from_millis(1_500)),
            Duration::from_millis(1_500)
        );
        // Renewed: the count starts again from the read that saw it.
        o.decide(
            &lease("other", Timestamp::UNIX_EPOCH, 2, 3),
            t0 + Duration::from_secs(2),
        );
        assert_eq!(
            o.unchanged_for(t0 + Duration::from_millis(2_500)),
            Duration::from_millis(500)
        );
        assert_eq!(o.unchanged_for(t0), Duration::ZERO, "never negative");
    }
}
