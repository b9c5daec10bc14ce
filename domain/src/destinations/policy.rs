//! The rules a proxy applies to each destination: a provider's `destinations`
//! on top of the default denies.
//!
//! Precedence, first match wins:
//! 1. an explicit `deny` network or port refuses;
//! 2. a tunnel (`CONNECT`) to a port other than 443 or an allowed port refuses;
//! 3. an explicit `allow` network passes;
//! 4. a default-denied network (see [`DEFAULT_DENIED`]) or a cluster network refuses;
//! 5. anything else passes.
//!
//! An IPv6 address that embeds an IPv4 address (see [`super::embedded`]) is
//! checked twice, as itself and as the IPv4 address it embeds, and refused
//! when either check refuses: `[::127.0.0.1]`, `[64:ff9b::7f00:1]` and
//! `[2002:7f00:1::]` are loopback unless `127.0.0.0/8` is allowed, and
//! denying `2002::/16` refuses every 6to4 address whatever it embeds.

use std::fmt;
use std::net::IpAddr;
use std::ops::RangeInclusive;

use ipnet::IpNet;

use super::embedded::embedded_ipv4;
use super::{DestinationEntry, DestinationRules};

/// The one port `CONNECT` reaches without an explicit allow.
pub const TLS_PORT: u16 = 443;

/// Networks no proxy reaches unless a provider allows them: whatever is
/// behind the proxy host rather than on the internet.
pub const DEFAULT_DENIED: [&str; 13] = [
    // "This network": connecting to 0.0.0.0 reaches the proxy host itself.
    "0.0.0.0/8",
    "127.0.0.0/8",
    // Link-local, including the cloud metadata server 169.254.169.254.
    "169.254.0.0/16",
    "10.0.0.0/8",
    "172.16.0.0/12",
    "192.168.0.0/16",
    // Shared address space (CGNAT): denied because clouds and overlay
    // networks use it for internal services (Alibaba Cloud's metadata server
    // is 100.100.100.200; Tailscale hands out 100.64.0.0/10 addresses), and
    // nothing a crawler should fetch lives there.
    "100.64.0.0/10",
    "::/128",
    "::1/128",
    "fe80::/10",
    // Unique local addresses (AWS's IPv6 metadata server fd00:ec2::254 is one).
    "fc00::/7",
    // Teredo and NAT64 local-use prefixes embed IPv4 addresses where they
    // cannot be read (obfuscated; placed by a local prefix length), so they
    // are denied whole; nothing a crawler fetches lives there.
    "2001::/32",
    "64:ff9b:1::/48",
];
// IPv4-mapped IPv6 addresses (`::ffff:127.0.0.1`) are the IPv4 ones above in
// disguise: checks unmap them first, and Squid keeps every IPv4 address in
// that form already, so `::ffff:0:0/96` must not be listed (it would match all).
// The other forms embedding an IPv4 address (`::/96`, `64:ff9b::/96`,
// `2002::/16`) are checked by the address they embed.

/// Where an External Proxy may not point in Kubernetes mode, unless the
/// operator's configuration allows it: the operator's own pod (loopback,
/// "this host") and the node's link-local services, the cloud metadata
/// server among them. Anyone who may create a Proxy would otherwise probe
/// them through the operator and read the answers in the Proxy's status.
pub const EXTERNAL_ENDPOINT_DENIED: [&str; 8] = [
    "0.0.0.0/8",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "::/128",
    "::1/128",
    "fe80::/10",
    // As in DEFAULT_DENIED: they may hide any IPv4 address.
    "2001::/32",
    "64:ff9b:1::/48",
];

/// The compiled rules of one provider.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DestinationPolicy {
    denied_networks: Vec<IpNet>,
    denied_ports: Vec<RangeInclusive<u16>>,
    allowed_networks: Vec<IpNet>,
    tunnel_ports: Vec<RangeInclusive<u16>>,
    default_denied: Vec<IpNet>,
}

/// Why a destination is refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    DeniedNetwork(IpNet),
    DeniedPort(u16),
    TunnelPort(u16),
    DefaultDenied(IpNet),
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::DeniedNetwork(net) => write!(f, "{net} is in destinations.deny"),
            Self::DeniedPort(port) => write!(f, "port {port} is in destinations.deny"),
            Self::TunnelPort(port) => write!(
                f,
                "CONNECT reaches port {TLS_PORT} and the ports in destinations.allow, not {port}"
            ),
            Self::DefaultDenied(net) => write!(f, "{net} is denied by default"),
        }
    }
}

impl Default for DestinationPolicy {
    fn default() -> Self {
        Self::new(&DestinationRules::default(), &[])
    }
}

impl DestinationPolicy {
    /// `cluster_networks` (the pod and service ranges in Kubernetes mode)
    /// are denied like the default networks: an explicit allow lifts them.
    pub fn new(rules: &DestinationRules, cluster_networks: &[IpNet]) -> Self {
        let (denied_networks, denied_ports) = split(&rules.deny);
        let (allowed_networks, allowed_ports) = split(&rules.allow);
        let mut tunnel_ports = vec![TLS_PORT..=TLS_PORT];
        tunnel_ports.extend(allowed_ports);
        let default_denied = DEFAULT_DENIED
            .iter()
            .filter_map(|net| net.parse().ok())
            .chain(cluster_networks.iter().copied())
            .collect();
        Self {
            denied_networks,
            denied_ports,
            allowed_networks,
            tunnel_ports,
            default_denied,
        }
    }

    /// The rules for External Proxies' endpoints in Kubernetes mode:
    /// [`EXTERNAL_ENDPOINT_DENIED`] refused unless in `allowed`.
    pub fn external_endpoints(allowed: &[IpNet]) -> Self {
        Self {
            denied_networks: Vec::new(),
            denied_ports: Vec::new(),
            allowed_networks: allowed.to_vec(),
            tunnel_ports: Vec::new(),
            default_denied: EXTERNAL_ENDPOINT_DENIED
                .iter()
                .filter_map(|net| net.parse().ok())
                .collect(),
        }
    }

    /// Checks the address about to be connected to; `tunnel` for `CONNECT`.
    /// An address embedding an IPv4 address passes only when both pass;
    /// the refusal of the embedded one names its IPv4 network.
    pub fn check(&self, address: IpAddr, port: u16, tunnel: bool) -> Result<(), Refusal> {
        let address = address.to_canonical();
        self.check_one(address, port, tunnel)?;
        match address {
            IpAddr::V6(v6) => match embedded_ipv4(v6) {
                Some(v4) => self.check_one(IpAddr::V4(v4), port, tunnel),
                None => Ok(()),
            },
            IpAddr::V4(_) => Ok(()),
        }
    }

    /// The rules for one address as it is.
    fn check_one(&self, address: IpAddr, port: u16, tunnel: bool) -> Result<(), Refusal> {
        if let Some(net) = find(&self.denied_networks, address) {
            return Err(Refusal::DeniedNetwork(net));
        }
        if self.denied_ports.iter().any(|r| r.contains(&port)) {
            return Err(Refusal::DeniedPort(port));
        }
        if tunnel && !self.tunnel_ports.iter().any(|r| r.contains(&port)) {
            return Err(Refusal::TunnelPort(port));
        }
        if find(&self.allowed_networks, address).is_some() {
            return Ok(());
        }
        match find(&self.default_denied, address) {
            Some(net) => Err(Refusal::DefaultDenied(net)),
            None => Ok(()),
        }
    }

    pub fn denied_networks(&self) -> &[IpNet] {
        &self.denied_networks
    }

    pub fn denied_ports(&self) -> &[RangeInclusive<u16>] {
        &self.denied_ports
    }

    pub fn allowed_networks(&self) -> &[IpNet] {
        &self.allowed_networks
    }

    /// 443 first, then the allowed ports.
    pub fn tunnel_ports(&self) -> &[RangeInclusive<u16>] {
        &self.tunnel_ports
    }

    pub fn default_denied(&self) -> &[IpNet] {
        &self.default_denied
    }
}

fn split(entries: &[DestinationEntry]) -> (Vec<IpNet>, Vec<RangeInclusive<u16>>) {
    let mut networks = Vec::new();
    let mut ports = Vec::new();
    for entry in entries {
        match entry {
            DestinationEntry::Network(net) => networks.push(*net),
            DestinationEntry::Ports(range) => ports.push(range.clone()),
        }
    }
    (networks, ports)
}

fn find(networks: &[IpNet], address: IpAddr) -> Option<IpNet> {
    networks.iter().find(|net| net.contains(&address)).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(allow: &[&str], deny: &[&str]) -> DestinationRules {
        let parse = |l: &[&str]| l.iter().map(|s| s.parse().unwrap()).collect();
        DestinationRules {
            allow: parse(allow),
            deny: parse(deny),
        }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn every_default_denied_network_parses() {
        assert_eq!(
            DestinationPolicy::default().default_denied().len(),
            DEFAULT_DENIED.len()
        );
        assert_eq!(
            DestinationPolicy::external_endpoints(&[]).default_denied().len(),
            EXTERNAL_ENDPOINT_DENIED.len()
        );
    }

    #[test]
    fn external_endpoints_may_be_private_but_not_loopback_or_link_local() {
        let policy = DestinationPolicy::external_endpoints(&[]);
        for refused in [
            "127.0.0.1",
            "0.0.0.0",
            "169.254.169.254",
            "::1",
            "fe80::1",
            "::ffff:127.0.0.1",
            "::127.0.0.1",
            "64:ff9b::a9fe:a9fe",
            "2002:7f00:1::",
        ] {
            assert!(policy.check(ip(refused), 3128, false).is_err(), "{refused}");
        }
        for passes in ["10.1.2.3", "192.168.1.1", "203.0.113.7", "fd00::1"] {
            assert_eq!(policy.check(ip(passes), 3128, false), Ok(()), "{passes}");
        }
        let policy = DestinationPolicy::external_endpoints(&["127.0.0.0/8".parse().unwrap()]);
        assert_eq!(policy.check(ip("127.0.0.1"), 3128, false), Ok(()));
        assert!(policy.check(ip("169.254.169.254"), 80, false).is_err());
    }

    #[test]
    fn by_default_internal_addresses_are_refused_and_public_ones_pass() {
        let policy = DestinationPolicy::default();
        for internal in [
            "127.0.0.1",
            "0.0.0.0",
            "169.254.169.254",
            "10.1.2.3",
            "172.31.0.1",
            "192.168.1.1",
            "100.100.100.200",
            "::1",
            "::",
            "fe80::1",
            "fd00:ec2::254",
            "::ffff:127.0.0.1",
        ] {
            assert!(
                matches!(
                    policy.check(ip(internal), 80, false),
                    Err(Refusal::DefaultDenied(_))
                ),
                "{internal}"
            );
        }
        for public in ["93.184.215.14", "172.32.0.1", "2606:4700::1111"] {
            assert_eq!(policy.check(ip(public), 80, false), Ok(()), "{public}");
            assert_eq!(policy.check(ip(public), 443, true), Ok(()), "{public}");
        }
    }

    #[test]
    fn ipv6_forms_embedding_a_denied_ipv4_address_are_refused() {
        let policy = DestinationPolicy::default();
        for embedded in [
            "::127.0.0.1",
            "::ffff:127.0.0.1",
            "64:ff9b::7f00:1",
            "2002:7f00:1::",
            "2002:a9fe:a9fe::1",
            "64:ff9b::a9fe:a9fe",
            "::10.1.2.3",
            "::0.0.0.2",
            // Denied whole: their embedded address cannot be read.
            "2001:0:4136:e378:8000:63bf:80ff:fffe",
            "64:ff9b:1:7f00:1::",
        ] {
            assert!(
                matches!(
                    policy.check(ip(embedded), 80, false),
                    Err(Refusal::DefaultDenied(_))
                ),
                "{embedded}"
            );
            assert!(policy.check(ip(embedded), 443, true).is_err(), "{embedded}");
        }
        assert_eq!(
            policy.check(ip("64:ff9b::7f00:1"), 80, false),
            Err(Refusal::DefaultDenied("127.0.0.0/8".parse().unwrap()))
        );
        // Public addresses in the same forms pass, as NAT64 needs.
        for public in ["64:ff9b::5db8:d70e", "2002:5db8:d70e::1", "::93.184.215.14"] {
            assert_eq!(policy.check(ip(public), 80, false), Ok(()), "{public}");
        }
    }

    #[test]
    fn an_embedded_address_passes_only_when_it_and_its_ipv6_form_pass() {
        // An IPv4 allow reaches the embedded forms too...
        let policy = DestinationPolicy::new(&rules(&["127.0.0.0/8"], &[]), &[]);
        for form in ["::127.0.0.1", "64:ff9b::7f00:1", "2002:7f00:1::"] {
            assert_eq!(policy.check(ip(form), 80, false), Ok(()), "{form}");
        }
        // ...but allowing the IPv6 form does not lift the IPv4 default...
        let policy = DestinationPolicy::new(&rules(&["64:ff9b::/96"], &[]), &[]);
        assert!(policy.check(ip("64:ff9b::7f00:1"), 80, false).is_err());
        // ...and a deny of either refuses.
        let policy = DestinationPolicy::new(&rules(&["127.0.0.0/8"], &["2002::/16"]), &[]);
        assert_eq!(
            policy.check(ip("2002:7f00:1::"), 80, false),
            Err(Refusal::DeniedNetwork("2002::/16".parse().unwrap()))
        );
        let policy = DestinationPolicy::new(&rules(&[], &["93.184.215.0/24"]), &[]);
        assert!(matches!(
            policy.check(ip("64:ff9b::5db8:d70e"), 80, false),
            Err(Refusal::DeniedNetwork(_))
        ));
        // Cluster networks are IPv4 networks like any other.
        let cluster: Vec<IpNet> = vec!["203.0.113.0/24".parse().unwrap()];
        let policy = DestinationPolicy::new(&DestinationRules::default(), &cluster);
        assert!(policy.check(ip("::203.0.113.7"), 80, false).is_err());
    }

    #[test]
    fn ipv6_loopback_keeps_its_own_meaning() {
        // `::1` is not "0.0.0.1": allowing it alone lets it through.
        let policy = DestinationPolicy::new(&rules(&["::1"], &[]), &[]);
        assert_eq!(policy.check(ip("::1"), 80, false), Ok(()));
        assert!(policy.check(ip("::0.0.0.2"), 80, false).is_err());
        assert!(DestinationPolicy::default().check(ip("::1"), 80, false).is_err());
    }

    #[test]
    fn connect_reaches_443_and_allowed_ports_only() {
        let policy = DestinationPolicy::new(&rules(&["8443", "9000-9009"], &[]), &[]);
        let public = ip("93.184.215.14");
        assert_eq!(policy.check(public, 8443, true), Ok(()));
        assert_eq!(policy.check(public, 9005, true), Ok(()));
        assert_eq!(policy.check(public, 22, true), Err(Refusal::TunnelPort(22)));
        // Plain HTTP is not a tunnel: its port is free.
        assert_eq!(policy.check(public, 8080, false), Ok(()));
    }

    #[test]
    fn allow_beats_the_defaults_and_deny_beats_allow() {
        let policy = DestinationPolicy::new(&rules(&["10.0.0.0/8"], &["10.9.0.0/16", "25"]), &[]);
        assert_eq!(policy.check(ip("10.1.0.1"), 80, false), Ok(()));
        assert_eq!(
            policy.check(ip("10.9.0.1"), 80, false),
            Err(Refusal::DeniedNetwork("10.9.0.0/16".parse().unwrap()))
        );
        assert_eq!(
            policy.check(ip("93.184.215.14"), 25, false),
            Err(Refusal::DeniedPort(25))
        );
        assert!(matches!(
            policy.check(ip("192.168.0.1"), 80, false),
            Err(Refusal::DefaultDenied(_))
        ));
    }

    #[test]
    fn cluster_networks_are_denied_unless_allowed() {
        let cluster: Vec<IpNet> = vec!["203.0.113.0/24".parse().unwrap()];
        let policy = DestinationPolicy::new(&DestinationRules::default(), &cluster);
        assert_eq!(
            policy.check(ip("203.0.113.7"), 80, false),
            Err(Refusal::DefaultDenied(cluster[0]))
        );
        let policy = DestinationPolicy::new(&rules(&["203.0.113.7"], &[]), &cluster);
        assert_eq!(policy.check(ip("203.0.113.7"), 80, false), Ok(()));
    }
}
