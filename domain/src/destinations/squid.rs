//! A [`DestinationPolicy`] as squid.conf lines. Every `http_access` line
//! here denies, so the section can sit anywhere before the final
//! `http_access allow` without letting anything past other rules (such as
//! proxy authentication). Squid's `dst` ACL resolves host names itself and
//! connects to the addresses it checked.
//!
//! A `dst` ACL matches a name when *any* of its addresses matches, so each
//! deny is a plain list of the refused networks — the default denies with
//! the allowed networks cut out of them, never `deny X !allowed` (which a
//! name resolving to an allowed and a refused address would pass, and
//! Squid could then connect to the refused one): a name is refused when
//! any of its addresses is.
//!
//! Squid matches an IPv6 destination against IPv6 networks only (it keeps
//! IPv4 addresses as IPv4-mapped ones, so those need nothing), so every
//! IPv4 network also appears in its embedded forms (`127.0.0.0/8` as
//! `::7f00:0/104`, `64:ff9b::7f00:0/104` and `2002:7f00::/24`), in ACLs of
//! their own: as in [`DestinationPolicy::check`], an embedding address is
//! refused when its embedded IPv4 address is, even where its IPv6 form is
//! allowed, and `::` and `::1` keep their IPv6 meaning.

use std::fmt::Write;
use std::ops::RangeInclusive;

use ipnet::IpNet;

use super::DestinationPolicy;
use super::embedded::{OWN_IPV6, embedding_networks};

/// The destination rules section of a squid.conf, with the cache manager
/// refused first: its pages (`cache_object://`, `/squid-internal-mgr/`)
/// tell anyone who can reach the proxy its clients and destinations.
pub fn squid_rules(policy: &DestinationPolicy) -> String {
    let mut conf = String::from("# Destination rules (docs/security.md): first match wins.\n");
    // Predefined since Squid 5; defining it again is accepted and keeps Squid 4 working.
    conf.push_str("acl CONNECT method CONNECT\n");
    acl(&mut conf, "SSL_ports", "port", &ports(policy.tunnel_ports()));
    // `::` and `::1` are IPv6's own, not IPv4-compatible `0.0.0.0`/`0.0.0.1`.
    let own: Vec<IpNet> = OWN_IPV6.parse().into_iter().collect();
    let allowed = policy.allowed_networks();
    let allowed_embedded = embeddings(allowed);
    let lists = [
        ("epo_denied_dst", policy.denied_networks().to_vec()),
        (
            "epo_denied_embedded_dst",
            without(&embeddings(policy.denied_networks()), &own),
        ),
        (
            "epo_default_denied_dst",
            without(policy.default_denied(), allowed),
        ),
        (
            "epo_default_denied_embedded_dst",
            without(
                &without(&embeddings(policy.default_denied()), &own),
                &allowed_embedded,
            ),
        ),
    ];
    let mut defined = Vec::new();
    for (name, list) in &lists[..2] {
        if acl(&mut conf, name, "dst", &networks(list)) {
            defined.push(*name);
        }
    }
    acl(
        &mut conf,
        "epo_denied_ports",
        "port",
        &ports(policy.denied_ports()),
    );
    for (name, list) in &lists[2..] {
        if acl(&mut conf, name, "dst", &networks(list)) {
            defined.push(*name);
        }
    }
    let deny = |conf: &mut String, name: &str| {
        if defined.contains(&name) {
            let _ = writeln!(conf, "http_access deny {name}");
        }
    };
    // Predefined in every Squid version since 3.2.
    conf.push_str("http_access deny manager\n");
    deny(&mut conf, "epo_denied_dst");
    deny(&mut conf, "epo_denied_embedded_dst");
    if !policy.denied_ports().is_empty() {
        conf.push_str("http_access deny epo_denied_ports\n");
    }
    conf.push_str("http_access deny CONNECT !SSL_ports\n");
    deny(&mut conf, "epo_default_denied_dst");
    deny(&mut conf, "epo_default_denied_embedded_dst");
    conf
}

/// The parts of `networks` outside every network of `holes`.
fn without(networks: &[IpNet], holes: &[IpNet]) -> Vec<IpNet> {
    holes.iter().fold(networks.to_vec(), |left, hole| {
        left.into_iter().flat_map(|net| cut(net, *hole)).collect()
    })
}

/// `net` without `hole`: nothing, itself, or the halves of its halves that
/// stay outside `hole` (at most one network per bit of the longer prefix).
fn cut(net: IpNet, hole: IpNet) -> Vec<IpNet> {
    if hole.contains(&net) {
        return Vec::new();
    }
    if !net.contains(&hole) {
        return vec![net];
    }
    // `net` holds `hole` and is larger: its prefix is shorter than the maximum.
    net.subnets(net.prefix_len() + 1)
        .into_iter()
        .flatten()
        .flat_map(|half| cut(half, hole))
        .collect()
}

/// The embedded forms of the IPv4 networks in `list`.
fn embeddings(list: &[IpNet]) -> Vec<IpNet> {
    list.iter()
        .filter_map(|net| match net {
            IpNet::V4(v4) => Some(*v4),
            IpNet::V6(_) => None,
        })
        .flat_map(embedding_networks)
        .map(IpNet::V6)
        .collect()
}

/// One `acl` line, or nothing for an empty list (Squid rejects empty
/// ACLs); whether it was written.
fn acl(conf: &mut String, name: &str, kind: &str, values: &[String]) -> bool {
    if values.is_empty() {
        return false;
    }
    // Writing to a String cannot fail.
    let _ = writeln!(conf, "acl {name} {kind} {}", values.join(" "));
    true
}

fn networks(list: &[IpNet]) -> Vec<String> {
    list.iter().map(ToString::to_string).collect()
}

fn ports(list: &[RangeInclusive<u16>]) -> Vec<String> {
    list.iter()
        .map(|r| match r.start() == r.end() {
            true => r.start().to_string(),
            false => format!("{}-{}", r.start(), r.end()),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::destinations::DestinationRules;

    #[test]
    fn the_default_rules_deny_internal_networks_and_tunnels_off_443() {
        let conf = squid_rules(&DestinationPolicy::default());
        assert!(conf.contains("acl SSL_ports port 443\n"), "{conf}");
        assert!(conf.contains("http_access deny CONNECT !SSL_ports\n"), "{conf}");
        assert!(
            conf.contains("acl epo_default_denied_dst dst 0.0.0.0/8 127.0.0.0/8 169.254.0.0/16 "),
            "{conf}"
        );
        assert!(
            conf.contains("http_access deny epo_default_denied_dst\n"),
            "{conf}"
        );
        assert!(!conf.contains("epo_allowed_dst"), "{conf}");
        assert!(!conf.contains("http_access allow"), "only denies: {conf}");
    }

    #[test]
    fn allows_and_denies_become_acls() {
        let rules: DestinationRules =
            serde_json::from_str(r#"{"allow": ["127.0.0.0/8", 8443], "deny": ["127.0.0.2", "25-26"]}"#)
                .unwrap();
        let conf = squid_rules(&DestinationPolicy::new(&rules, &[]));
        for line in [
            "acl SSL_ports port 443 8443\n",
            "acl epo_denied_dst dst 127.0.0.2/32\n",
            "acl epo_denied_embedded_dst dst ::7f00:2/128 64:ff9b::7f00:2/128 2002:7f00:2::/48\n",
            "acl epo_denied_ports port 25-26\n",
            // The allowed loopback cut out of the default denies, in both forms.
            "acl epo_default_denied_dst dst 0.0.0.0/8 169.254.0.0/16 ",
            " 64:ff9b::/104 2002::/24 ::a9fe:0/112 ",
            "http_access deny manager\n\
             http_access deny epo_denied_dst\n\
             http_access deny epo_denied_embedded_dst\n\
             http_access deny epo_denied_ports\n\
             http_access deny CONNECT !SSL_ports\n\
             http_access deny epo_default_denied_dst\n\
             http_access deny epo_default_denied_embedded_dst\n",
        ] {
            assert!(conf.contains(line), "{line:?} in {conf}");
        }
    }

    #[test]
    fn every_default_denied_ipv4_network_is_denied_in_its_embedded_forms() {
        let conf = squid_rules(&DestinationPolicy::default());
        // `0.0.0.0/8` embedded is `::/104` without `::` and `::1`, IPv6's own.
        assert!(
            conf.contains("acl epo_default_denied_embedded_dst dst ::2/127 ::4/126 ::8/125 "),
            "{conf}"
        );
        assert!(
            conf.contains(
                " ::80:0/105 64:ff9b::/104 2002::/24 \
                 ::7f00:0/104 64:ff9b::7f00:0/104 2002:7f00::/24 ::a9fe:0/112 "
            ),
            "{conf}"
        );
        assert!(
            conf.contains("http_access deny epo_default_denied_embedded_dst\n"),
            "{conf}"
        );
        // Denies only: the manager first, before anything could allow it.
        let first = conf.find("http_access").unwrap();
        assert_eq!(&conf[first..][..25], "http_access deny manager\n");
    }

    /// Whether Squid would refuse `address:port` under `conf`'s deny lines
    /// (the section's own ACL types: `dst`, `port`, `method`).
    fn squid_refuses(conf: &str, address: std::net::IpAddr, port: u16, tunnel: bool) -> bool {
        let acl = |name: &str| -> bool {
            let line = conf
                .lines()
                .find(|l| l.starts_with(&format!("acl {name} ")))
                .unwrap_or_else(|| panic!("no acl {name} in {conf}"));
            let mut words = line.split(' ').skip(2);
            match words.next() {
                Some("dst") => words.any(|net| net.parse::<IpNet>().unwrap().contains(&address)),
                Some("port") => words.any(|range| {
                    let (low, high) = range.split_once('-').unwrap_or((range, range));
                    (low.parse().unwrap()..=high.parse().unwrap()).contains(&port)
                }),
                Some("method") => tunnel,
                other => panic!("{other:?}"),
            }
        };
        conf.lines()
            .filter_map(|l| l.strip_prefix("http_access deny "))
            .filter(|terms| *terms != "manager")
            .any(|terms| {
                terms.split(' ').all(|term| match term.strip_prefix('!') {
                    Some(name) => !acl(name),
                    None => acl(term),
                })
            })
    }

    #[test]
    fn squid_refuses_exactly_what_the_policy_refuses_and_never_through_a_negated_address() {
        let policies = [
            r#"{}"#,
            r#"{"allow": ["127.0.0.10"]}"#,
            r#"{"allow": ["127.0.0.0/8", "::1", 8443], "deny": ["127.0.0.9", "25"]}"#,
            r#"{"allow": ["10.0.0.0/8", "fd00:214::/32"], "deny": ["10.9.0.0/16", "2002::/16"]}"#,
            r#"{"allow": ["64:ff9b::/96", "::/96"]}"#,
        ];
        let addresses = [
            "127.0.0.1",
            "127.0.0.9",
            "127.0.0.10",
            "127.0.0.11",
            "0.0.0.0",
            "10.1.2.3",
            "10.9.0.1",
            "169.254.169.254",
            "93.184.215.14",
            "100.100.100.200",
            "::",
            "::1",
            "::2",
            "::127.0.0.10",
            "::127.0.0.9",
            "64:ff9b::7f00:a",
            "64:ff9b::5db8:d70e",
            "2002:7f00:a::1",
            "2002:5db8:d70e::1",
            "fe80::1",
            "fd00:214::1",
            "fd00:213::1",
            "2606:4700::1111",
            "2001::1",
            "::ffff:127.0.0.9",
        ];
        for rules in policies {
            let rules: DestinationRules = serde_json::from_str(rules).unwrap();
            let policy = DestinationPolicy::new(&rules, &["203.0.113.0/24".parse().unwrap()]);
            let conf = squid_rules(&policy);
            // A negated `dst` would pass a name with one allowed address.
            for line in conf.lines().filter(|l| l.starts_with("http_access")) {
                assert!(!line.contains("!epo_"), "{line}");
            }
            for address in addresses.iter().chain(&["203.0.113.7"]) {
                let ip: std::net::IpAddr = address.parse().unwrap();
                // Squid keeps IPv4 addresses as mapped ones and matches them as IPv4.
                let squid_ip = ip.to_canonical();
                for (port, tunnel) in [(80, false), (443, true), (8443, true), (25, false)] {
                    assert_eq!(
                        squid_refuses(&conf, squid_ip, port, tunnel),
                        policy.check(ip, port, tunnel).is_err(),
                        "{address}:{port} tunnel={tunnel} under {rules:?}\n{conf}"
                    );
                }
            }
        }
    }

    #[test]
    fn the_vm_cloud_init_sample_carries_the_default_rules() {
        // The sample is static: this keeps it in step with the defaults.
        let sample = include_str!("../../../deploy/samples/cloud-init-secret.yaml");
        let lines: Vec<&str> = sample.lines().map(str::trim).collect();
        for line in squid_rules(&DestinationPolicy::default()).lines() {
            assert!(lines.contains(&line), "{line:?} missing from the sample");
        }
    }
}
