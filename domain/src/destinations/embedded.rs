//! IPv6 addresses that carry an IPv4 address inside them. Connecting to one
//! can reach the IPv4 address it embeds: a `sit` tunnel on the proxy host
//! carries IPv4-compatible (`::/96`) and 6to4 (`2002::/16`) packets to the
//! embedded address (its own loopback included), and a NAT64 gateway
//! (`64:ff9b::/96`) connects to it from the gateway's network. So the rules
//! check the embedded IPv4 address as well as the IPv6 address itself.
//!
//! IPv4-mapped addresses (`::ffff:0:0/96`) are not listed here: they *are*
//! IPv4 addresses (sockets and Squid treat them so) and are unmapped before
//! any check. Forms whose embedded address cannot be read without knowing
//! the local setup — Teredo (`2001::/32`, the address obfuscated) and NAT64
//! local-use prefixes (`64:ff9b:1::/48`, RFC 8215, position set by the
//! local prefix length) — are denied as a whole by default instead.

use std::net::{Ipv4Addr, Ipv6Addr};

use ipnet::{Ipv4Net, Ipv6Net};

/// One way of putting an IPv4 address into an IPv6 one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Embedding {
    /// `::a.b.c.d` (RFC 4291 §2.5.5.1, deprecated): the last 32 bits.
    Compatible,
    /// `64:ff9b::a.b.c.d`, the NAT64 well-known prefix (RFC 6052): the last 32 bits.
    Nat64,
    /// `2002:aabb:ccdd::/48`, 6to4 (RFC 3056): bits 16 to 48.
    SixToFour,
}

/// `::` and `::1` lie in `::/96` but are IPv6's own unspecified and
/// loopback addresses, not IPv4-compatible `0.0.0.0` and `0.0.0.1`.
pub const OWN_IPV6: &str = "::/127";

const NAT64_PREFIX: u128 = 0x0064_ff9b << 96;
const SIX_TO_FOUR_PREFIX: u128 = 0x2002 << 112;

impl Embedding {
    pub const ALL: [Embedding; 3] = [Self::Compatible, Self::Nat64, Self::SixToFour];

    /// Where the IPv4 address starts, counted in bits from the left.
    fn offset(self) -> u8 {
        match self {
            Self::Compatible | Self::Nat64 => 96,
            Self::SixToFour => 16,
        }
    }

    fn prefix(self) -> u128 {
        match self {
            Self::Compatible => 0,
            Self::Nat64 => NAT64_PREFIX,
            Self::SixToFour => SIX_TO_FOUR_PREFIX,
        }
    }

    /// The IPv4 address `address` embeds in this form, if it is of this form.
    pub fn extract(self, address: Ipv6Addr) -> Option<Ipv4Addr> {
        let bits = u128::from(address);
        let shift = 128 - u32::from(self.offset());
        if bits >> shift != self.prefix() >> shift {
            return None;
        }
        if self == Self::Compatible && bits <= 1 {
            return None;
        }
        // Truncation keeps exactly the 32 bits after the prefix.
        Some(Ipv4Addr::from((bits >> (shift - 32)) as u32))
    }

    /// The IPv6 network of the addresses embedding an address of `network`.
    pub fn embed(self, network: Ipv4Net) -> Ipv6Net {
        let shift = 128 - 32 - u32::from(self.offset());
        let bits = self.prefix() | (u128::from(u32::from(network.network())) << shift);
        // At most 96 + 32 bits: always a valid length.
        Ipv6Net::new_assert(Ipv6Addr::from(bits), self.offset() + network.prefix_len())
    }
}

/// The IPv4 address `address` embeds, in whichever form.
pub fn embedded_ipv4(address: Ipv6Addr) -> Option<Ipv4Addr> {
    Embedding::ALL.iter().find_map(|form| form.extract(address))
}

/// Every IPv6 network whose addresses embed an address of `network`.
pub fn embedding_networks(network: Ipv4Net) -> impl Iterator<Item = Ipv6Net> {
    Embedding::ALL.into_iter().map(move |form| form.embed(network))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v6(s: &str) -> Ipv6Addr {
        s.parse().unwrap()
    }

    #[test]
    fn each_form_yields_the_address_it_embeds() {
        let loopback = Some(Ipv4Addr::LOCALHOST);
        assert_eq!(embedded_ipv4(v6("::127.0.0.1")), loopback);
        assert_eq!(embedded_ipv4(v6("64:ff9b::7f00:1")), loopback);
        assert_eq!(embedded_ipv4(v6("2002:7f00:1::")), loopback);
        assert_eq!(embedded_ipv4(v6("2002:7f00:1:ffff::1")), loopback);
        assert_eq!(embedded_ipv4(v6("::0.0.0.2")), Some(Ipv4Addr::new(0, 0, 0, 2)));
    }

    #[test]
    fn ipv6_own_and_other_addresses_embed_nothing() {
        for address in [
            "::",
            "::1",
            // Mapped: unmapped before any check instead.
            "::ffff:127.0.0.1",
            "64:ff9b:1::7f00:1",
            "2001::7f00:1",
            "2606:4700::1111",
            "fe80::7f00:1",
        ] {
            assert_eq!(embedded_ipv4(v6(address)), None, "{address}");
        }
    }

    #[test]
    fn networks_embed_at_each_forms_offset() {
        let loopback: Ipv4Net = "127.0.0.0/8".parse().unwrap();
        let got: Vec<String> = embedding_networks(loopback).map(|n| n.to_string()).collect();
        assert_eq!(got, ["::7f00:0/104", "64:ff9b::7f00:0/104", "2002:7f00::/24"]);
        let host: Ipv4Net = "169.254.169.254/32".parse().unwrap();
        let got: Vec<String> = embedding_networks(host).map(|n| n.to_string()).collect();
        assert_eq!(
            got,
            ["::a9fe:a9fe/128", "64:ff9b::a9fe:a9fe/128", "2002:a9fe:a9fe::/48"]
        );
    }

    #[test]
    fn an_embedded_address_lies_in_the_embedding_of_its_network() {
        for (address, network) in [
            ("::10.1.2.3", "10.0.0.0/8"),
            ("64:ff9b::c0a8:101", "192.168.0.0/16"),
            ("2002:a9fe:a9fe:1::1", "169.254.0.0/16"),
        ] {
            let address = v6(address);
            let network: Ipv4Net = network.parse().unwrap();
            assert!(network.contains(&embedded_ipv4(address).unwrap()));
            assert!(
                embedding_networks(network).any(|n| n.contains(&address)),
                "{address} in {network}"
            );
        }
    }
}
