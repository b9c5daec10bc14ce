//! Orphan GC: delete provider instances whose Proxy no longer exists.
//!
//! Live UIDs are read first (objects being deleted still count as live —
//! their own finalizer handles them), then every provider lists what is
//! tagged managed. An instance is reaped only when it is **this
//! installation's** (its installation tag), within the operator's namespace
//! scope, not released, its UID is not live, and it is older than the grace
//! period, so a create racing the sweep is never touched. Instances of other
//! installations, or of namespaces out of scope, are someone else's to
//! judge; instances without an installation tag (made by hand or by an
//! earlier version) are never reaped, only reported. A provider that
//! cannot list is skipped for this sweep (GC never acts on a partial view
//! of a provider); a failed delete is logged and not counted.

use std::collections::{BTreeMap, BTreeSet};

use std::time::Duration;

use jiff::Timestamp;

use crate::installation::InstallationId;
use crate::provider_contract::{Instance, ProviderId, Providers};
use crate::resource_store::ProxyStore;
use egress_proxies_telemetry::events::SweepFigures;

/// Whose instances a sweep may reap.
#[derive(Clone, Debug)]
pub struct Scope {
    pub installation: InstallationId,
    /// Proxy namespaces the operator watches (`--proxy-namespace`); `None`: all.
    pub namespaces: Option<BTreeSet<String>>,
}

/// Why a listed instance is not this sweep's to judge.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum NotOurs {
    /// No installation tag: made by hand or by an earlier version.
    Untagged,
    OtherInstallation,
    /// This installation's, but its Proxy's namespace is outside `--proxy-namespace`.
    OutOfScope,
    /// Released with skip-cleanup: left to its admin.
    Released,
}

impl NotOurs {
    pub fn as_str(self) -> &'static str {
        match self {
            NotOurs::Untagged => "untagged",
            NotOurs::OtherInstallation => "other_installation",
            NotOurs::OutOfScope => "out_of_scope",
            NotOurs::Released => "released",
        }
    }
}

impl Scope {
    /// Whether the sweep may judge `instance` (and why not).
    pub fn judges(&self, instance: &Instance) -> Result<(), NotOurs> {
        let owner = &instance.owner;
        if owner.released {
            return Err(NotOurs::Released);
        }
        match owner.installation.as_deref() {
            None => return Err(NotOurs::Untagged),
            Some(i) if i != self.installation.as_str() => return Err(NotOurs::OtherInstallation),
            Some(_) => {}
        }
        match (&self.namespaces, owner.namespace.as_deref()) {
            (None, _) => Ok(()),
            (Some(scope), Some(ns)) if scope.contains(ns) => Ok(()),
            (Some(_), _) => Err(NotOurs::OutOfScope),
        }
    }
}

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
    /// Instances listed that were not this sweep's to judge, by provider and why.
    pub not_ours: BTreeMap<(String, NotOurs), usize>,
    /// Instances without an installation tag: (provider, id), for a one-time report.
    pub untagged: Vec<(String, ProviderId)>,
}

impl SweepReport {
    /// The counts telemetry reports.
    pub fn figures(&self) -> SweepFigures<'_> {
        SweepFigures {
            listed: self.listed,
            orphans: self.orphans,
            deleted: self.deleted,
            failed_deletes: self.failed_deletes,
            spared_young: self.spared_young,
            skipped_providers: &self.skipped_providers,
            leftovers_deleted: self.leftovers_deleted,
            leftovers_waiting: self.leftovers_waiting,
            leftover_errors: self.leftover_errors,
        }
    }
}

/// The live Proxy UIDs could not be read; nothing was deleted.
#[derive(Debug, thiserror::Error)]
#[error("listing live Proxies failed, sweep skipped: {0}")]
pub struct SweepError(#[from] crate::resource_store::StoreError);

/// One sweep over every provider.
pub async fn sweep(
    store: &dyn ProxyStore,
    providers: &Providers,
    scope: &Scope,
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
        for reason in [
            NotOurs::Untagged,
            NotOurs::OtherInstallation,
            NotOurs::OutOfScope,
            NotOurs::Released,
        ] {
            report.not_ours.insert((provider.name().to_owned(), reason), 0);
        }
        for instance in instances {
            if let Err(reason) = scope.judges(&instance) {
                *report
                    .not_ours
                    .entry((provider.name().to_owned(), reason))
                    .or_default() += 1;
                if reason == NotOurs::Untagged {
                    report
                        .untagged
                        .push((provider.name().to_owned(), instance.id.clone()));
                }
                continue;
            }
            // Without its tags an instance cannot be judged: leave it.
            let (Some(uid), Some(created)) = (&instance.owner.uid, instance.created_at) else {
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
