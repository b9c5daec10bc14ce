//! A [`DestinationPolicy`] as squid.conf lines. Every `http_access` line
//! here denies, so the section can sit anywhere before the final
//! `http_access allow` without letting anything past other rules (such as
//! proxy authentication). Squid's `dst` ACL resolves host names itself and
//! connects to the addresses it checked.
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
    let lists = [
        ("epo_denied_dst", policy.denied_networks()),
        ("epo_allowed_dst", policy.allowed_networks()),
        ("epo_default_denied_dst", policy.default_denied()),
    ];
    let mut defined = Vec::new();
    for (name, list) in lists {
        let embedded_name = name.replace("_dst", "_embedded_dst");
        if acl(&mut conf, name, "dst", &networks(list)) {
            defined.push(name.to_owned());
        }
        if acl(&mut conf, &embedded_name, "dst", &embeddings(list)) {
            defined.push(embedded_name);
        }
    }
    acl(
        &mut conf,
        "epo_denied_ports",
        "port",
        &ports(policy.denied_ports()),
    );
    let has = |name: &str| defined.iter().any(|d| d == name);
    let embedded = defined.iter().any(|d| d.contains("_embedded_"));
    if embedded {
        acl(&mut conf, "epo_own_ipv6_dst", "dst", &[OWN_IPV6.to_owned()]);
    }
    let unless = |name: &str| match has(name) {
        true => format!(" !{name}"),
        false => String::new(),
    };
    // Predefined in every Squid version since 3.2.
    conf.push_str("http_access deny manager\n");
    if has("epo_denied_dst") {
        conf.push_str("http_access deny epo_denied_dst\n");
    }
    if has("epo_denied_embedded_dst") {
        conf.push_str("http_access deny epo_denied_embedded_dst !epo_own_ipv6_dst\n");
    }
    if !policy.denied_ports().is_empty() {
        conf.push_str("http_access deny epo_denied_ports\n");
    }
    conf.push_str("http_access deny CONNECT !SSL_ports\n");
    if has("epo_default_denied_dst") {
        let _ = writeln!(
            conf,
            "http_access deny epo_default_denied_dst{}",
            unless("epo_allowed_dst")
        );
    }
    if has("epo_default_denied_embedded_dst") {
        let _ = writeln!(
            conf,
            "http_access deny epo_default_denied_embedded_dst !epo_own_ipv6_dst{}",
            unless("epo_allowed_embedded_dst")
        );
    }
    conf
}

/// The embedded forms of the IPv4 networks in `list`.
fn embeddings(list: &[IpNet]) -> Vec<String> {
    list.iter()
        .filter_map(|net| match net {
            IpNet::V4(v4) => Some(*v4),
            IpNet::V6(_) => None,
        })
        .flat_map(embedding_networks)
        .map(|net| net.to_string())
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
            "acl epo_allowed_dst dst 127.0.0.0/8\n",
            "acl epo_allowed_embedded_dst dst ::7f00:0/104 64:ff9b::7f00:0/104 2002:7f00::/24\n",
            "acl epo_own_ipv6_dst dst ::/127\n",
            "http_access deny manager\n\
             http_access deny epo_denied_dst\n\
             http_access deny epo_denied_embedded_dst !epo_own_ipv6_dst\n\
             http_access deny epo_denied_ports\n\
             http_access deny CONNECT !SSL_ports\n\
             http_access deny epo_default_denied_dst !epo_allowed_dst\n\
             http_access deny epo_default_denied_embedded_dst !epo_own_ipv6_dst !epo_allowed_embedded_dst\n",
        ] {
            assert!(conf.contains(line), "{line:?} in {conf}");
        }
    }

    #[test]
    fn every_default_denied_ipv4_network_is_denied_in_its_embedded_forms() {
        let conf = squid_rules(&DestinationPolicy::default());
        assert!(
            conf.contains(
                "acl epo_default_denied_embedded_dst dst ::/104 64:ff9b::/104 2002::/24 \
                 ::7f00:0/104 64:ff9b::7f00:0/104 2002:7f00::/24 ::a9fe:0/112 "
            ),
            "{conf}"
        );
        assert!(
            conf.contains("http_access deny epo_default_denied_embedded_dst !epo_own_ipv6_dst\n"),
            "{conf}"
        );
        // Denies only: the manager first, before anything could allow it.
        let first = conf.find("http_access").unwrap();
        assert_eq!(&conf[first..][..25], "http_access deny manager\n");
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
