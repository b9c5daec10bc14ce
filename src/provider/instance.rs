//! What a provider creates and reports.

use std::fmt;
use std::net::IpAddr;

use jiff::Timestamp;

use crate::resource::Placement;

use super::InstanceName;

/// The provider's identifier of an instance (`zones/<zone>/instances/<name>`,
/// `hosts/<host>/domains/<name>`, ...). Opaque to everyone but its provider.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProviderId(pub String);

impl ProviderId {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ProviderId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Lifecycle of an instance as the provider sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum InstanceState {
    /// Being created or booting; poll again.
    Provisioning,
    /// Up (with an address when `ip` is set).
    Running,
    /// Stopped, crashed or in any state it will not leave by itself: recreate.
    Stopped,
}

impl InstanceState {
    pub fn as_str(self) -> &'static str {
        match self {
            InstanceState::Provisioning => "Provisioning",
            InstanceState::Running => "Running",
            InstanceState::Stopped => "Stopped",
        }
    }
}

/// An instance as reported by `get` or `list_by_tag`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Instance {
    pub id: ProviderId,
    pub state: InstanceState,
    /// The address clients reach the proxy at, once known.
    pub ip: Option<IpAddr>,
    /// The port clients use, when the provider chose it (else the spec's port).
    pub port: Option<u16>,
    /// UID of the owning Proxy, from the instance's tag.
    pub uid: Option<String>,
    /// When the instance was created, from the provider (GC grace period).
    pub created_at: Option<Timestamp>,
    /// Why the instance is not serving, in the provider's terms (an exit
    /// status and log lines, a domain's shutoff reason, a pod's container
    /// status). Never holds secrets: it reaches Proxy status and Events.
    pub reason: Option<String>,
}

/// Cloud-init user-data bytes. They may hold secrets, so `Debug` shows only the size.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct CloudInitBytes(pub Vec<u8>);

impl fmt::Debug for CloudInitBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CloudInitBytes(<{} bytes>)", self.0.len())
    }
}

/// Everything a provider needs to create one instance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CreateRequest {
    /// Deterministic name derived from the Proxy UID; creation is keyed on it.
    pub name: InstanceName,
    /// UID of the owning Proxy (tagged onto the instance).
    pub uid: String,
    /// Namespace of the owning Proxy (the kubernetes provider creates its pod there).
    pub namespace: String,
    /// Resolved cloud-init user-data, passed to the instance byte for byte.
    pub cloud_init: Option<CloudInitBytes>,
    pub placement: Placement,
    /// Port the proxy listens on.
    pub port: u16,
}
