//! Destination rules: which addresses and ports the proxies the operator
//! makes may reach. By default a proxy refuses whatever lies behind its host
//! (loopback, link-local with the cloud metadata server, private ranges) and
//! tunnels only to port 443; a provider's `destinations` widens or narrows
//! that. The same [`DestinationPolicy`] drives the built-in forward proxy
//! and the generated Squid configurations.

mod embedded;
mod entry;
mod names;
mod policy;
mod squid;

use serde::{Deserialize, Serialize};

pub use entry::{DestinationEntry, DestinationEntryError, parse_cidr};
pub use ipnet::IpNet;
pub use names::NameResolver;
pub use policy::{DEFAULT_DENIED, DestinationPolicy, EXTERNAL_ENDPOINT_DENIED, Refusal, TLS_PORT};
pub use squid::squid_rules;

/// A provider's `destinations: {allow: [...], deny: [...]}` as configured.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct DestinationRules {
    /// Networks reachable despite the default denies; ports `CONNECT` may reach besides 443.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow: Vec<DestinationEntry>,
    /// Networks and ports never reached, whatever `allow` says.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deny: Vec<DestinationEntry>,
}

impl DestinationRules {
    pub fn is_empty(&self) -> bool {
        self.allow.is_empty() && self.deny.is_empty()
    }

    /// The rules as `forward-proxy` arguments (`--allow X`, `--deny Y`).
    pub fn to_args(&self) -> Vec<String> {
        let flag = |name: &'static str| move |e: &DestinationEntry| [name.to_owned(), e.to_string()];
        self.allow
            .iter()
            .flat_map(flag("--allow"))
            .chain(self.deny.iter().flat_map(flag("--deny")))
            .collect()
    }
}
