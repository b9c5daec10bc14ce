//! Leader election on a `coordination.k8s.io/v1` Lease, safe without
//! synchronised clocks.
//!
//! # Timings
//!
//! Scaled from the lease duration like client-go's defaults (15 s / 10 s /
//! 2 s): the **renew deadline** is 2/3 of it, the **retry period** 2/15, and
//! every API call of the elector times out after half the renew deadline.
//!
//! # Why at most one replica acts at a time
//!
//! Nobody compares another machine's timestamps; `renewTime` is written
//! because Kubernetes expects it, never read for a decision. Each side
//! measures on its own monotonic clock:
//!
//! - The **leader** acts only until `start + renew deadline`, where `start`
//!   is taken *before* its last successful renew request was sent
//!   ([`Tenure`]). Past that instant it stops granting leases and
//!   reconciling, whether or not a request is still hanging.
//! - A **candidate** takes over only after it has observed the same record
//!   (holder, renewTime, resourceVersion) unchanged for the full lease
//!   duration, counted from *after* the read that returned it.
//!
//! The record a candidate last observed was written by a request the leader
//! sent before that read completed, so the leader's deadline falls at least
//! `lease duration - renew deadline` (5 s of 15 s) before the candidate's
//! earliest takeover, however far apart the wall clocks are. Clock *rates*
//! must merely agree to within that margin. Every write is guarded by the
//! Lease's resourceVersion, so two candidates never both win a round (409 =
//! lost the race).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, PostParams};

use crate::domain::membership::{Decision, Liveness, holder_of};

/// How long a leader lasts, renews and waits for the API.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timings {
    /// A candidate takes over a record unchanged for this long.
    pub lease_duration: Duration,
    /// A leader stops acting this long after starting its last successful renew.
    pub renew_deadline: Duration,
    /// Pause between attempts (leader and candidates).
    pub retry_period: Duration,
    /// Timeout of every single API call.
    pub call_timeout: Duration,
}

impl Timings {
    /// client-go's 15 s / 10 s / 2 s, scaled to `lease_duration` (at least 1 s).
    pub fn from_lease_duration(lease_duration: Duration) -> Self {
        let lease_duration = lease_duration.max(Duration::from_secs(1));
        let renew_deadline = lease_duration * 2 / 3;
        Self {
            lease_duration,
            renew_deadline,
            retry_period: lease_duration * 2 / 15,
            call_timeout: renew_deadline / 2,
        }
    }
}

/// Where the elector reads time: monotonic for every decision, wall only
/// for the timestamps Kubernetes expects in the record.
pub trait Clock: Send + Sync {
    fn now(&self) -> Instant;
    fn wall(&self) -> Timestamp;
}

/// The process's clocks.
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }

    fn wall(&self) -> Timestamp {
        Timestamp::now()
    }
}

/// How long this replica may act as the leader: until an instant on its
/// monotonic clock, extended by every successful renew. Checked where the
/// leader acts (lease grants, store calls, `/readyz`), so acting stops at
/// that instant even while the renew request hangs.
#[derive(Clone)]
pub struct Tenure {
    until: Arc<Mutex<Option<Instant>>>,
    clock: Arc<dyn Clock>,
}

impl Tenure {
    /// Not leading until extended.
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        Self {
            until: Arc::new(Mutex::new(None)),
            clock,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Instant>> {
        self.until.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn is_leading(&self) -> bool {
        self.lock().is_some_and(|until| self.clock.now() < until)
    }

    /// The end of the tenure, if any (it may be past).
    pub fn until(&self) -> Option<Instant> {
        *self.lock()
    }

    /// Leading until `until` (never shortened by a late, older renew).
    pub fn extend(&self, until: Instant) {
        let mut current = self.lock();
        *current = Some(current.map_or(until, |c| c.max(until)));
    }

    /// Stops leading now (lost, or about to release the Lease).
    pub fn end(&self) {
        let now = self.clock.now();
        let mut current = self.lock();
        *current = Some(current.map_or(now, |c| c.min(now)));
    }
}

/// What an attempt found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Attempt {
    /// This candidate holds the Lease and may act until `until`.
    Leading { until: Instant },
    /// Someone else holds it (or won this round).
    Following { holder: String },
}

/// An API call of the elector failed or took too long.
#[derive(Debug, thiserror::Error)]
pub enum ElectionError {
    #[error("{call} of the leader Lease failed: {source}")]
    Api {
        call: &'static str,
        #[source]
        source: kube::Error,
    },
    #[error("{call} of the leader Lease got no answer within {after:?}")]
    Timeout { call: &'static str, after: Duration },
}

fn code(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(s) => Some(s.code),
        _ => None,
    }
}

/// One candidate for leadership.
pub struct LeaderElector {
    api: Api<Lease>,
    name: String,
    identity: String,
    timings: Timings,
    clock: Arc<dyn Clock>,
    observer: Liveness,
}

impl LeaderElector {
    pub fn new(
        client: kube::Client,
        namespace: &str,
        name: &str,
        identity: &str,
        timings: Timings,
        clock: Arc<dyn Clock>,
    ) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            name: name.to_owned(),
            identity: identity.to_owned(),
            timings,
            clock,
            observer: Liveness::new(identity, timings.lease_duration),
        }
    }

    pub fn identity(&self) -> &str {
        &self.identity
    }

    pub fn timings(&self) -> Timings {
        self.timings
    }

    async fn call<T>(
        &self,
        call: &'static str,
        request: impl Future<Output = Result<T, kube::Error>>,
    ) -> Result<Result<T, kube::Error>, ElectionError> {
        let after = self.timings.call_timeout;
        tokio::time::timeout(after, request)
            .await
            .map_err(|_| ElectionError::Timeout { call, after })
    }

    fn lease_seconds(&self) -> i32 {
        // Rounded up: a record may overstate the duration (candidates wait longer), never understate it.
        let d = self.timings.lease_duration;
        let secs = d.as_secs() + u64::from(d.subsec_nanos() > 0);
        i32::try_from(secs.max(1)).unwrap_or(i32::MAX)
    }

    /// Takes or renews the Lease. `Leading.until` counts from before the
    /// first request of this attempt was sent.
    pub async fn try_acquire_or_renew(&mut self) -> Result<Attempt, ElectionError> {
        let started = self.clock.now();
        let leading = Attempt::Leading {
            until: started + self.timings.renew_deadline,
        };
        let now = self.clock.wall();
        let current = self
            .call("get", self.api.get_opt(&self.name))
            .await?
            .map_err(|source| ElectionError::Api { call: "get", source })?;
        let seen_at = self.clock.now();
        let Some(mut lease) = current else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.identity.clone()),
                    lease_duration_seconds: Some(self.lease_seconds()),
                    acquire_time: Some(MicroTime(now)),
                    renew_time: Some(MicroTime(now)),
                    lease_transitions: Some(0),
                    ..LeaseSpec::default()
                }),
            };
            return match self
                .call("create", self.api.create(&PostParams::default(), &lease))
                .await?
            {
                Ok(_) => Ok(leading),
                Err(e) if code(&e) == Some(409) => Ok(Attempt::Following {
                    holder: String::new(),
                }),
                Err(source) => Err(ElectionError::Api {
                    call: "create",
                    source,
                }),
            };
        };
        let holder = match self.observer.decide(&lease, seen_at) {
            Decision::Follow { holder } => return Ok(Attempt::Following { holder }),
            Decision::Renew | Decision::TakeOver => holder_of(&lease),
        };
        let ours = holder == self.identity;
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        if !ours {
            spec.holder_identity = Some(self.identity.clone());
            spec.acquire_time = Some(MicroTime(now));
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
        }
        spec.renew_time = Some(MicroTime(now));
        spec.lease_duration_seconds = Some(self.lease_seconds());
        // `replace` sends the resourceVersion read above: a concurrent write makes this a 409.
        match self
            .call(
                "update",
                self.api.replace(&self.name, &PostParams::default(), &lease),
            )
            .await?
        {
            Ok(_) => Ok(leading),
            Err(e) if code(&e) == Some(409) => Ok(Attempt::Following { holder }),
            Err(source) => Err(ElectionError::Api {
                call: "update",
                source,
            }),
        }
    }

    /// Gives the Lease up (on shutdown) so another candidate takes over at
    /// once. End the [`Tenure`] first: a follower may act as soon as this lands.
    pub async fn release(&self) -> Result<(), ElectionError> {
        let Some(mut lease) = self
            .call("get", self.api.get_opt(&self.name))
            .await?
            .map_err(|source| ElectionError::Api { call: "get", source })?
        else {
            return Ok(());
        };
        let Some(spec) = lease.spec.as_mut() else {
            return Ok(());
        };
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return Ok(());
        }
        spec.holder_identity = None;
        spec.renew_time = None;
        match self
            .call(
                "update",
                self.api.replace(&self.name, &PostParams::default(), &lease),
            )
            .await?
        {
            Ok(_) => Ok(()),
            Err(e) if code(&e) == Some(409) => Ok(()),
            Err(source) => Err(ElectionError::Api {
                call: "update",
                source,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A clock the test moves by hand; the wall clock is set independently.
    struct FakeClock {
        base: Instant,
        offset: Mutex<Duration>,
    }

    impl FakeClock {
        fn new() -> Arc<Self> {
            Arc::new(Self {
                base: Instant::now(),
                offset: Mutex::new(Duration::ZERO),
            })
        }

        fn advance(&self, by: Duration) {
            *self.offset.lock().unwrap() += by;
        }
    }

    impl Clock for FakeClock {
        fn now(&self) -> Instant {
            self.base + *self.offset.lock().unwrap()
        }

        fn wall(&self) -> Timestamp {
            // Far off on purpose: no decision may depend on it.
            Timestamp::UNIX_EPOCH
        }
    }

    #[test]
    fn timings_scale_like_client_go() {
        let t = Timings::from_lease_duration(Duration::from_secs(15));
        assert_eq!(t.renew_deadline, Duration::from_secs(10));
        assert_eq!(t.retry_period, Duration::from_secs(2));
        assert_eq!(t.call_timeout, Duration::from_secs(5));
        let t = Timings::from_lease_duration(Duration::from_secs(3));
        assert_eq!(t.renew_deadline, Duration::from_secs(2));
        assert_eq!(t.retry_period, Duration::from_millis(400));
        assert!(t.retry_period < t.renew_deadline && t.renew_deadline < t.lease_duration);
        assert_eq!(
            Timings::from_lease_duration(Duration::ZERO).lease_duration,
            Duration::from_secs(1)
        );
    }

    #[test]
    fn a_tenure_ends_at_its_deadline_on_the_monotonic_clock() {
        let clock = FakeClock::new();
        let tenure = Tenure::new(clock.clone());
        assert!(!tenure.is_leading(), "not leading before the first renew");
        let start = clock.now();
        tenure.extend(start + Duration::from_secs(10));
        clock.advance(Duration::from_millis(9_999));
        assert!(tenure.is_leading());
        clock.advance(Duration::from_millis(1));
        assert!(!tenure.is_leading(), "stops exactly at the deadline");
        // A late answer to an older renew never shortens a newer one.
        tenure.extend(start + Duration::from_secs(20));
        tenure.extend(start + Duration::from_secs(12));
        assert_eq!(tenure.until(), Some(start + Duration::from_secs(20)));
        assert!(tenure.is_leading());
        tenure.end();
        assert!(!tenure.is_leading(), "ended at once");
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

    fn follows(d: &Decision) -> bool {
        matches!(d, Decision::Follow { holder } if holder == "other")
    }

    fn ten_minutes_off(sign: i64) -> Timestamp {
        Timestamp::now() + jiff::SignedDuration::from_secs(sign * 600)
    }

    /// The safety argument, numerically: the leader's deadline counts from
    /// before its renew was sent, the candidate's wait from after its read,
    /// so the leader stops first by `lease duration - renew deadline`.
    #[test]
    fn the_leader_always_stops_before_a_candidate_may_take_over() {
        let t = Timings::from_lease_duration(Duration::from_secs(3));
        let clock = FakeClock::new();
        let renew_sent = clock.now();
        let tenure = Tenure::new(clock.clone());
        tenure.extend(renew_sent + t.renew_deadline);
        let stop = tenure.until().unwrap();
        let l = lease("other", ten_minutes_off(-1), 11, 3);
        for read_after in [Duration::ZERO, Duration::from_millis(1), Duration::from_secs(2)] {
            let mut o = Liveness::new("me", t.lease_duration);
            let seen = renew_sent + read_after;
            assert!(follows(&o.decide(&l, seen)));
            // The first instant this candidate would take over, to the microsecond.
            let mut at = seen;
            while o.decide(&l, at) != Decision::TakeOver {
                at += Duration::from_micros(100);
            }
            assert!(stop + (t.lease_duration - t.renew_deadline) <= at);
            clock.advance(stop.saturating_duration_since(clock.now()));
            assert!(!tenure.is_leading(), "stopped at its deadline");
        }
    }
}
