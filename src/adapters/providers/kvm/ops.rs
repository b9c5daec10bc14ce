//! What the kvm provider asks of a host and what it hears back
//! (docs/kvm-internals.md#operations): the plans, the answers and the
//! errors of the operations a host's libvirt session runs
//! ([`domain_ops`](super::host::domain_ops)).

use std::net::IpAddr;

use super::domain_xml::DomainSpec;
use super::errors::KvmError;
use super::metadata::InstanceMetadata;
use crate::domain::provider_contract::{ErrorClass, InstanceState};

/// Why an operation failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum OpError {
    #[error(transparent)]
    Libvirt(#[from] KvmError),
    #[error("storage pool has {available} bytes free, the overlay needs up to {needed}")]
    NoRoom { needed: u64, available: u64 },
    #[error("base image volume {0} is not in the pool")]
    BaseMissing(String),
    #[error("base volume {volume} in the pool is refused: {problem}")]
    UnsafeBase {
        volume: String,
        problem: super::qcow2_header::Qcow2HeaderError,
    },
}

impl OpError {
    pub fn class(&self) -> ErrorClass {
        match self {
            OpError::Libvirt(e) => e.class(),
            // libvirt has no quota signal; a full pool is the closest thing.
            OpError::NoRoom { .. } => ErrorClass::QuotaExceeded,
            OpError::BaseMissing(_) => ErrorClass::Transient,
            OpError::UnsafeBase { .. } => ErrorClass::Permanent,
        }
    }

    /// The connection to the daemon failed (not a daemon-reported error):
    /// the link must be re-established.
    pub fn is_transport(&self) -> bool {
        matches!(self, OpError::Libvirt(e) if e.is_transport())
    }
}

/// Names of everything one instance owns on its host.
pub fn overlay_name(instance: &str) -> String {
    format!("{instance}.qcow2")
}

pub fn seed_name(instance: &str) -> String {
    format!("{instance}-seed.iso")
}

/// What create needs, all resolved.
#[derive(Clone, Debug)]
pub struct CreatePlan {
    /// The domain, with empty disk/seed paths (filled in here).
    pub domain: DomainSpec,
    pub base_volume: String,
    pub base_format: String,
    pub disk_bytes: u64,
    pub seed_iso: Vec<u8>,
}

/// What `get` learns about one instance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observed {
    pub state: InstanceState,
    /// Why a stopped domain stopped.
    pub reason: Option<String>,
    pub ip: Option<IpAddr>,
    pub metadata: Option<InstanceMetadata>,
}

/// What a release found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Released {
    /// Marked released (or already was).
    Marked,
    /// No such domain: nothing to leave behind.
    Gone,
    /// The domain carries no mark of the operator: no GC lists it anyway.
    Unmarked,
}

/// A domain's lifecycle state, as the provider needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DomainRunState {
    Running,
    /// `nostate`, paused, being shut down: the next poll decides.
    Transitional,
    /// Shut off or crashed, and why (libvirt's state reason, in words).
    Stopped {
        reason: &'static str,
    },
}

/// A volume as the pool lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VolumeInfo {
    pub name: String,
    pub path: String,
    /// The backing file of an overlay.
    pub backing: Option<String>,
}

/// A domain the operator marked as managed: its name, state and mark.
pub type ManagedDomain = (String, DomainRunState, InstanceMetadata);
