//! Orphan GC: delete provider instances whose Proxy no longer exists.
//!
//! Live UIDs are read first (objects being deleted still count as live —
//! their own finalizer handles them), then every provider lists what it
//! tagged. An instance is reaped only when its UID is not live **and** it is
//! older than the grace period, so a create racing the sweep is never
//! touched. A provider that cannot list is skipped for this sweep (GC never
//! acts on a partial view of a provider); a failed delete is logged and not
//! counted.

use std::time::Duration;

use jiff::Timestamp;

use crate::provider::Providers;
use crate::store::ProxyStore;

/// What one sweep did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SweepReport {
    /// Instances listed across providers.
    pub listed: usize,
    /// Orphans found (not live, older than the grace period).
    pub orphans: usize,
    pub deleted: usize,
    pub failed_deletes: usize,
    /// Orphans spared because they are younger than the grace period.
    pub spared_young: usize,
    /// Providers whose listing failed (skipped this sweep).
    pub skipped_providers: Vec<String>,
    /// Provider leftovers (kvm volumes) deleted, waiting out their grace, or not swept.
    pub leftovers_deleted: usize,
    pub leftovers_waiting: usize,
    pub leftover_errors: usize,
}

/// The live Proxy UIDs could not be read; nothing was deleted.
#[derive(Debug, thiserror::Error)]
#[error("listing live Proxies failed, sweep skipped: {0}")]
pub struct SweepError(#[from] crate::store::StoreError);

/// One sweep over every provider.
pub async fn sweep(
    store: &dyn ProxyStore,
    providers: &Providers,
    grace: Duration,
    now: Timestamp,
) -> Result<SweepReport, SweepError> {
    let live = store.live_uids().await?;
    let mut report = SweepReport::default();
    for provider in providers.iter() {
        let instances = match provider.list_by_tag().await {
            Ok(instances) => instances,
            Err(e) => {
                tracing::warn!(provider = provider.name(), error = %e, "GC: listing failed; provider skipped this sweep");
                report.skipped_providers.push(provider.name().to_owned());
                continue;
            }
        };
        report.listed += instances.len();
        for instance in instances {
            // Without its tags an instance cannot be judged: leave it.
            let (Some(uid), Some(created)) = (&instance.uid, instance.created_at) else {
                continue;
            };
            if live.contains(uid) {
                continue;
            }
            let age = now.duration_since(created);
            if age.as_secs_f64() < grace.as_secs_f64() {
                report.spared_young += 1;
                continue;
            }
            report.orphans += 1;
            match provider.delete(&instance.id).await {
                Ok(()) => {
                    report.deleted += 1;
                    tracing::info!(provider = provider.name(), providerID = %instance.id, uid = %uid, "GC: orphan deleted");
                }
                Err(e) => {
                    report.failed_deletes += 1;
                    tracing::warn!(provider = provider.name(), providerID = %instance.id, error = %e, "GC: deleting an orphan failed");
                }
            }
        }
        // After the instances: an orphan deleted just now frees its volumes for a later sweep.
        match provider.sweep_leftovers(grace).await {
            Ok(leftovers) => {
                report.leftovers_deleted += leftovers.deleted.len();
                report.leftovers_waiting += leftovers.waiting;
                report.leftover_errors += leftovers.failed + leftovers.errors.len();
                for e in &leftovers.errors {
                    tracing::warn!(provider = provider.name(), error = %e, "GC: leftovers not swept");
                }
            }
            Err(e) => {
                report.leftover_errors += 1;
                tracing::warn!(provider = provider.name(), error = %e, "GC: leftovers not swept");
            }
        }
    }
    Ok(report)
}
