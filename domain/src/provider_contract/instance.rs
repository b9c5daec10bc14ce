//! What a provider creates and reports.

use std::fmt;
use std::net::IpAddr;

use jiff::Timestamp;

use crate::credentials::ProxyCredentials;
use crate::installation::InstallationId;
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
    /// The source address destinations see, when the provider chose it
    /// from a configured list (`local`: `outgoingAddresses`).
    pub outgoing_address: Option<IpAddr>,
    /// Who it belongs to, from its tags.
    pub owner: Ownership,
    /// When the instance was created, from the provider (GC grace period).
    pub created_at: Option<Timestamp>,
    /// Why the instance is not serving, in the provider's terms (an exit
    /// status and log lines, a domain's shutoff reason, a pod's container
    /// status). Never holds secrets: it reaches Proxy status and Events.
    pub reason: Option<String>,
}

/// Who an instance belongs to, as its tags say. Every tag may be missing:
/// an instance made by hand or by an earlier version carries fewer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ownership {
    /// UID of the owning Proxy.
    pub uid: Option<String>,
    /// Namespace of the owning Proxy.
    pub namespace: Option<String>,
    /// The installation that created it.
    pub installation: Option<String>,
    /// Released with skip-cleanup: left to the admin, no GC deletes it.
    pub released: bool,
}

impl Ownership {
    /// Tags of an instance created for `req`.
    pub fn of(req: &CreateRequest) -> Self {
        Self {
            uid: Some(req.uid.clone()),
            namespace: Some(req.namespace.clone()),
            installation: Some(req.installation.to_string()),
            released: false,
        }
    }

    /// Why this instance is not the one of Proxy `uid` in `installation`, if it is not.
    pub fn conflict(&self, uid: &str, installation: &InstallationId) -> Option<String> {
        let installation = installation.as_str();
        match (self.uid.as_deref(), self.installation.as_deref()) {
            _ if self.released => Some("it was released (skip-cleanup) and is left to its admin".into()),
            (Some(u), Some(i)) if u == uid && i == installation => None,
            (_, None) => Some(
                "it carries no installation tag (made by hand or by an earlier version; see docs/operations.md)".into(),
            ),
            (_, Some(i)) if i != installation => Some(format!("it belongs to installation {i}")),
            (Some(u), _) => Some(format!("it belongs to Proxy UID {u}")),
            (None, _) => Some("it carries no Proxy UID tag".into()),
        }
    }
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
    /// The installation creating it (tagged onto the instance).
    pub installation: InstallationId,
    /// Resolved cloud-init user-data, passed to the instance byte for byte.
    pub cloud_init: Option<CloudInitBytes>,
    pub placement: Placement,
    /// Port the proxy listens on.
    pub port: u16,
    /// What clients must present (Basic proxy authentication); providers
    /// configure the proxy to demand it.
    pub credentials: Option<ProxyCredentials>,
    /// Outgoing addresses targets blocked (the Proxy's pool quarantined
    /// them): a provider choosing from a list of addresses gives none of
    /// them while another is free.
    pub quarantined: Vec<QuarantinedAddress>,
}

/// An outgoing address not to be given while another is free, until `until`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QuarantinedAddress {
    pub address: IpAddr,
    pub until: Timestamp,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_instance_is_a_proxys_only_with_its_uid_and_installation() {
        let ours = InstallationId::parse("iours").unwrap();
        let owner = |uid: Option<&str>, installation: Option<&str>, released| Ownership {
            uid: uid.map(str::to_owned),
            namespace: Some("crawl".into()),
            installation: installation.map(str::to_owned),
            released,
        };
        assert_eq!(
            owner(Some("u1"), Some("iours"), false).conflict("u1", &ours),
            None
        );
        let why = |o: Ownership| o.conflict("u1", &ours).unwrap();
        assert!(why(owner(Some("u2"), Some("iours"), false)).contains("Proxy UID u2"));
        assert!(why(owner(Some("u1"), Some("itheirs"), false)).contains("installation itheirs"));
        assert!(why(owner(Some("u1"), None, false)).contains("no installation tag"));
        assert!(why(owner(None, Some("iours"), false)).contains("no Proxy UID"));
        assert!(why(owner(Some("u1"), Some("iours"), true)).contains("released"));
    }
}
