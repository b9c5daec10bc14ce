//! `type: local` — proxy processes on this machine (standalone mode).

use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::outgoing_addresses::{self, OutgoingNetwork};
use super::problems::Problems;
use crate::destinations::DestinationRules;

/// Settings of one local provider instance.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LocalConfig {
    /// Which forward proxy runs each instance.
    #[serde(default)]
    pub implementation: LocalImplementation,
    /// The Squid binary (default: `squid` on `PATH`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub squid_binary: Option<PathBuf>,
    /// Address the proxies listen on.
    #[serde(default = "default_listen_address")]
    pub listen_address: IpAddr,
    /// The user Squid switches to when the operator runs as root (default `proxy`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub squid_user: Option<String>,
    /// Where Squid's files live when the operator runs as root: a place
    /// `squidUser` can reach (default `/run/egress-proxies-operator`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_directory: Option<PathBuf>,
    /// Which destinations the proxies may reach (docs/security.md).
    #[serde(default, skip_serializing_if = "DestinationRules::is_empty")]
    pub destinations: DestinationRules,
    /// Source addresses the proxies connect from, one per instance (none:
    /// the kernel chooses, the same for all).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub outgoing_addresses: Vec<OutgoingNetwork>,
}

impl Default for LocalConfig {
    fn default() -> Self {
        Self {
            implementation: LocalImplementation::default(),
            squid_binary: None,
            listen_address: default_listen_address(),
            squid_user: None,
            run_directory: None,
            destinations: DestinationRules::default(),
            outgoing_addresses: Vec::new(),
        }
    }
}

/// The forward proxy behind a local instance.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[serde(rename_all = "lowercase")]
pub enum LocalImplementation {
    /// Squid when its binary is found, the built-in proxy otherwise.
    #[default]
    Auto,
    /// Always Squid; a missing binary fails the proxy.
    Squid,
    /// Always the built-in CONNECT + absolute-URI forward proxy.
    Builtin,
}

/// Squid's unprivileged user on Debian and Ubuntu.
pub const DEFAULT_SQUID_USER: &str = "proxy";
/// Run directories of Squid instances started by root.
pub const DEFAULT_RUN_DIRECTORY: &str = "/run/egress-proxies-operator";

fn default_listen_address() -> IpAddr {
    IpAddr::V4(Ipv4Addr::LOCALHOST)
}

impl LocalConfig {
    pub(super) fn validate(&self, p: &mut Problems) {
        if let Some(bin) = &self.squid_binary
            && bin.as_os_str().is_empty()
        {
            p.report(
                "local.squidBinary",
                "must not be empty (omit it to use `squid` on PATH)",
            );
        }
        if self.squid_user.as_deref().is_some_and(|u| u.trim().is_empty()) {
            p.report("local.squidUser", "must not be empty (omit it for `proxy`)");
        }
        if let Some(dir) = &self.run_directory
            && !dir.is_absolute()
        {
            p.report("local.runDirectory", "must be an absolute path");
        }
        outgoing_addresses::validate(&self.outgoing_addresses, p);
        if self.squid_binary.is_some() && self.implementation == LocalImplementation::Builtin {
            p.report(
                "local.squidBinary",
                "is set but implementation is builtin, which never runs Squid",
            );
        }
    }
}
