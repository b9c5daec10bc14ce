//! `local.outgoingAddresses`: the source addresses local proxies connect
//! to destinations from, one per instance, so that each proxy shows the
//! world an address of its own (several addresses of a multi-IP host, or
//! `127.0.0.0/8` addresses a test site on loopback tells apart).

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use ipnet::IpNet;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::problems::Problems;

/// One entry: an address (`127.0.0.2`) or a network of them (`127.0.1.0/29`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct OutgoingNetwork(IpNet);

/// Why an entry was not understood.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum OutgoingAddressError {
    #[error("{0:?} is not an outgoing address: expected an IP address (127.0.0.2) or a CIDR (127.0.1.0/29)")]
    Unrecognised(String),
    #[error("{given:?} has host bits set: did you mean {network}?")]
    HostBits { given: String, network: IpNet },
}

impl OutgoingNetwork {
    /// The addresses instances get, in order: every address of the network
    /// but, in an IPv4 network larger than /31, its network and broadcast
    /// addresses (the kernel refuses to bind a broadcast address).
    pub fn addresses(&self) -> ipnet::IpAddrRange {
        self.0.hosts()
    }

    pub fn network(&self) -> IpNet {
        self.0
    }
}

impl FromStr for OutgoingNetwork {
    type Err = OutgoingAddressError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let text = text.trim();
        if let Ok(address) = text.parse::<IpAddr>() {
            return Ok(Self(IpNet::from(address)));
        }
        let network: IpNet = text
            .parse()
            .map_err(|_| OutgoingAddressError::Unrecognised(text.to_owned()))?;
        if network.trunc() != network {
            return Err(OutgoingAddressError::HostBits {
                given: text.to_owned(),
                network: network.trunc(),
            });
        }
        Ok(Self(network))
    }
}

impl fmt::Display for OutgoingNetwork {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.prefix_len() == self.0.max_prefix_len() {
            write!(f, "{}", self.0.addr())
        } else {
            write!(f, "{}", self.0)
        }
    }
}

impl Serialize for OutgoingNetwork {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for OutgoingNetwork {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// Reports entries no proxy can connect from, and entries given twice.
pub fn validate(entries: &[OutgoingNetwork], p: &mut Problems) {
    for (i, entry) in entries.iter().enumerate() {
        let field = format!("local.outgoingAddresses[{i}]");
        let addr = entry.0.addr();
        if addr.is_unspecified() || addr.is_multicast() || addr == IpAddr::from([255, 255, 255, 255]) {
            p.report(
                &field,
                format!(
                    "{entry} cannot be a source address (unspecified, multicast or broadcast): give addresses of this machine"
                ),
            );
        }
        if let Some((j, earlier)) = entries[..i]
            .iter()
            .enumerate()
            .find(|(_, e)| e.0.contains(&entry.0) || entry.0.contains(&e.0))
        {
            p.report(
                &field,
                format!(
                    "{entry} overlaps outgoingAddresses[{j}] ({earlier}): each address may be given once"
                ),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_and_networks_parse_and_print_as_written() {
        for text in ["127.0.0.2", "127.0.1.0/29", "2001:db8::5", "2001:db8::/126"] {
            let entry: OutgoingNetwork = text.parse().unwrap();
            assert_eq!(entry.to_string(), text);
        }
        assert!(matches!(
            "127.0.0.1/29".parse::<OutgoingNetwork>(),
            Err(OutgoingAddressError::HostBits { .. })
        ));
        assert!(matches!(
            "eth0".parse::<OutgoingNetwork>(),
            Err(OutgoingAddressError::Unrecognised(_))
        ));
    }

    #[test]
    fn an_ipv4_network_gives_its_usable_addresses_in_order() {
        let all = |text: &str| {
            text.parse::<OutgoingNetwork>()
                .unwrap()
                .addresses()
                .map(|a| a.to_string())
                .collect::<Vec<_>>()
        };
        assert_eq!(all("127.0.1.0/30"), ["127.0.1.1", "127.0.1.2"]);
        assert_eq!(all("10.0.0.0/31"), ["10.0.0.0", "10.0.0.1"]);
        assert_eq!(all("10.0.0.7"), ["10.0.0.7"]);
        assert_eq!(all("fd00::/127"), ["fd00::", "fd00::1"]);
    }

    #[test]
    fn unusable_and_overlapping_entries_are_problems() {
        let entries: Vec<OutgoingNetwork> = ["127.0.1.0/29", "127.0.1.3", "0.0.0.0", "224.0.0.1", "10.0.0.1"]
            .iter()
            .map(|t| t.parse().unwrap())
            .collect();
        let mut p = Problems::under("x");
        validate(&entries, &mut p);
        let found: Vec<String> = p.into_vec().iter().map(ToString::to_string).collect();
        assert_eq!(found.len(), 3, "{found:#?}");
        assert!(found[0].contains("outgoingAddresses[1]") && found[0].contains("overlaps"));
        assert!(found[1].contains("outgoingAddresses[2]") && found[1].contains("cannot be a source"));
        assert!(found[2].contains("outgoingAddresses[3]"));
    }
}
