//! The kvm provider's operations on one host's libvirt session
//! (docs/kvm-internals.md#operations). Every step tolerates an earlier attempt
//! having got that far, so a create interrupted anywhere is finished by the
//! next one.

use crate::adapters::providers::kvm::domain_xml::{DomainSpec, domain_xml};
use crate::adapters::providers::kvm::errors::KvmError;
use crate::adapters::providers::kvm::ops::{
    CreatePlan, DomainRunState, Observed, OpError, Released, overlay_name, seed_name,
};
use crate::adapters::providers::kvm::volume_xml::{overlay_volume_xml, plain_volume_xml};
use crate::domain::provider_contract::InstanceState;
use virt::error::ErrorNumber;

use super::session::HostSession;

/// Creates (or finishes creating) the instance; starts it if it exists stopped.
///
/// Optimistic: volumes are created without asking first whether they exist
/// (libvirt refuses a taken name, and that answer is the resume point of a
/// create cut off earlier), and the base is not looked up — libvirt refuses
/// an overlay over a missing backing file, and only then is the base asked
/// for, to tell a missing base from another failure.
pub fn create(s: &HostSession, plan: &CreatePlan) -> Result<(), OpError> {
    let name = plan.domain.name.as_str();
    if let Some(domain) = s.domain(name)? {
        s.start(&domain, name)?;
        return Ok(());
    }
    let base = plan.base_volume.as_str();
    let base_missing = || OpError::BaseMissing(base.to_owned());
    // Asked only after a failure: was it the base that is gone?
    let or_base_missing = |e: KvmError| match s.volume_path(base) {
        Ok(None) => base_missing(),
        _ => OpError::Libvirt(e),
    };
    let base_path = match s.path_in_pool(base) {
        Err(e) if e.is_not_found() => return Err(base_missing()),
        other => other?,
    };
    let overlay = overlay_name(name);
    let available = s.pool_available_bytes()?;
    // A create cut off before the define may have left its overlay: then
    // it is reused, and needs no room.
    if available < plan.disk_bytes && s.volume_path(&overlay)?.is_none() {
        return Err(OpError::NoRoom {
            needed: plan.disk_bytes,
            available,
        });
    }
    let xml = overlay_volume_xml(&overlay, plan.disk_bytes, &base_path, &plan.base_format);
    let disk_path = match s.create_volume_from(&overlay, &xml) {
        Ok(vol) => s.path_of(&overlay, &vol)?,
        Err(e) if e.code == Some(ErrorNumber::StorageVolExist) => s.path_in_pool(&overlay)?,
        Err(e) => return Err(or_base_missing(e)),
    };
    // The seed is always rebuilt: a cut-off upload must never be trusted.
    let seed = seed_name(name);
    let seed_xml = plain_volume_xml(&seed, "raw", plan.seed_iso.len() as u64);
    let seed_volume = match s.create_volume_from(&seed, &seed_xml) {
        Err(e) if e.code == Some(ErrorNumber::StorageVolExist) => {
            s.delete_volume(&seed)?;
            s.create_volume_from(&seed, &seed_xml)?
        }
        other => other?,
    };
    s.upload_to(&seed_volume, &seed, &plan.seed_iso)?;
    let spec = DomainSpec {
        disk_path,
        seed_path: s.path_of(&seed, &seed_volume)?,
        ..plan.domain.clone()
    };
    // A reused overlay may have outlived its base.
    s.define_and_start_new(name, &domain_xml(&spec), &spec.metadata)
        .map_err(or_base_missing)
}

/// The instance's state; `None` when the domain does not exist.
pub fn get(s: &HostSession, name: &str) -> Result<Option<Observed>, OpError> {
    // One lookup: the state, the mark and the address all come from its handle.
    let Some(domain) = s.domain(name)? else {
        return Ok(None);
    };
    let (run, metadata) = s.state_of(&domain, name)?;
    let (state, ip, reason) = match run {
        DomainRunState::Running => match s.address_of(&domain, name)? {
            Some(ip) => (InstanceState::Running, Some(ip), None),
            None => (InstanceState::Provisioning, None, None),
        },
        DomainRunState::Transitional => (InstanceState::Provisioning, None, None),
        DomainRunState::Stopped { reason } => (InstanceState::Stopped, None, Some(reason.to_owned())),
    };
    Ok(Some(Observed {
        state,
        reason,
        ip,
        metadata,
    }))
}

/// Removes the domain and the instance's volumes by name — also when the
/// domain is already gone (a crash between volume creation and define).
pub fn delete(s: &HostSession, name: &str) -> Result<(), OpError> {
    s.remove_domain(name)?;
    s.delete_volume(&overlay_name(name))?;
    s.delete_volume(&seed_name(name))?;
    Ok(())
}

/// Leaves a domain to its admin: its mark becomes managed=false,
/// released=true (who made it and when are kept), persistently and live.
/// The domain and its volumes are not touched.
pub fn release(s: &HostSession, name: &str) -> Result<Released, OpError> {
    let meta = match s.domain_metadata(name)? {
        None => return Ok(Released::Gone),
        Some(None) => return Ok(Released::Unmarked),
        Some(Some(meta)) => meta,
    };
    if s.set_metadata(name, &meta.released())? {
        Ok(Released::Marked)
    } else {
        Ok(Released::Gone)
    }
}
