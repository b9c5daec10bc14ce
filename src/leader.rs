//! Leader election on a `coordination.k8s.io/v1` Lease: the holder renews
//! it; anyone may take it over once it has not been renewed for its
//! duration. Every write is guarded by the Lease's resourceVersion, so two
//! candidates can never both win the same round.

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, PostParams};

/// One candidate for leadership.
pub struct LeaderElector {
    api: Api<Lease>,
    name: String,
    identity: String,
    lease_duration: Duration,
}

fn code(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(s) => Some(s.code),
        _ => None,
    }
}

impl LeaderElector {
    pub fn new(
        client: kube::Client,
        namespace: &str,
        name: &str,
        identity: &str,
        lease_duration: Duration,
    ) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            name: name.to_owned(),
            identity: identity.to_owned(),
            lease_duration,
        }
    }

    pub fn identity(&self) -> &str {
        &self.identity
    }

    pub fn lease_duration(&self) -> Duration {
        self.lease_duration
    }

    /// Takes or renews the Lease; true while this candidate holds it.
    pub async fn try_acquire_or_renew(&self, now: Timestamp) -> Result<bool, kube::Error> {
        let seconds = self.lease_duration.as_secs().max(1) as i32;
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.identity.clone()),
                    lease_duration_seconds: Some(seconds),
                    acquire_time: Some(MicroTime(now)),
                    renew_time: Some(MicroTime(now)),
                    lease_transitions: Some(0),
                    ..LeaseSpec::default()
                }),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(e) if code(&e) == Some(409) => Ok(false),
                Err(e) => Err(e),
            };
        };
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        let holder = spec.holder_identity.clone().unwrap_or_default();
        let ours = holder == self.identity;
        let expired = match (&spec.renew_time, spec.lease_duration_seconds) {
            (Some(renewed), Some(d)) => now.duration_since(renewed.0).as_secs_f64() > f64::from(d),
            _ => true,
        };
        if !ours && !holder.is_empty() && !expired {
            return Ok(false);
        }
        if !ours {
            spec.holder_identity = Some(self.identity.clone());
            spec.acquire_time = Some(MicroTime(now));
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
        }
        spec.renew_time = Some(MicroTime(now));
        spec.lease_duration_seconds = Some(seconds);
        match self.api.replace(&self.name, &PostParams::default(), &lease).await {
            Ok(_) => Ok(true),
            Err(e) if code(&e) == Some(409) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Gives the Lease up (on shutdown) so another candidate takes over at once.
    pub async fn release(&self) -> Result<(), kube::Error> {
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
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
        match self.api.replace(&self.name, &PostParams::default(), &lease).await {
            Ok(_) => Ok(()),
            Err(e) if code(&e) == Some(409) => Ok(()),
            Err(e) => Err(e),
        }
    }
}
