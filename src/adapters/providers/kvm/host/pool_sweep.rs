//! Sweeping a host's pool of the leftovers [`leftovers`] names
//! (docs/kvm-internals.md), on the host's libvirt session.

use std::collections::{HashMap, HashSet};

use crate::adapters::providers::kvm::base_image::{PIN_MAX_BYTES, PoolName, parse_pin};
use crate::adapters::providers::kvm::errors::KvmError;
use crate::adapters::providers::kvm::pool_gc::{PoolSweep, SweepPlan, leftovers};

use super::session::HostSession;

/// Inventories the pool, deletes the due leftovers, reports all of them.
pub fn sweep(s: &HostSession, plan: &SweepPlan) -> Result<PoolSweep, KvmError> {
    let volumes = s.volumes()?;
    let domains: HashSet<String> = s.domain_names()?.into_iter().collect();
    // Disks named as `pool/volume` are resolved to paths for this pool.
    let disks: HashSet<String> = s
        .domain_disk_paths()?
        .into_iter()
        .filter_map(|d| {
            if d.starts_with('/') {
                return Some(d);
            }
            let (pool, volume) = d.split_once('/')?;
            (pool == s.pool())
                .then(|| volumes.iter().find(|v| v.name == volume))
                .flatten()
                .map(|v| v.path.clone())
        })
        .collect();
    let mut pins = HashMap::new();
    for v in volumes.iter().filter(|v| PoolName::of(&v.name) == PoolName::Pin) {
        if let Some(pinned) = s
            .read_small(&v.name, PIN_MAX_BYTES)?
            .as_deref()
            .and_then(parse_pin)
        {
            pins.insert(v.name.clone(), pinned.volume);
        }
    }
    let mut report = PoolSweep {
        leftovers: leftovers(&volumes, &domains, &disks, &pins, plan),
        ..PoolSweep::default()
    };
    for name in report.leftovers.iter().filter(|n| plan.due.contains(*n)) {
        match s.delete_volume(name) {
            Ok(()) => report.deleted.push(name.clone()),
            Err(e) => report.failed.push((name.clone(), e.to_string())),
        }
    }
    Ok(report)
}
