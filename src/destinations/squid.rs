//! A [`DestinationPolicy`] as squid.conf lines. Every `http_access` line
//! here denies, so the section can sit anywhere before the final
//! `http_access allow` without letting anything past other rules (such as
//! proxy authentication). Squid's `dst` ACL resolves host names itself and
//! connects to the addresses it checked.

use std::fmt::Write;
use std::ops::RangeInclusive;

use ipnet::IpNet;

use super::DestinationPolicy;

/// The destination rules section of a squid.conf.
pub fn squid_rules(policy: &DestinationPolicy) -> String {
    let mut conf = String::from("# Destination rules (docs/security.md): first match wins.\n");
    // Predefined since Squid 5; defining it again is accepted and keeps Squid 4 working.
    conf.push_str("acl CONNECT method CONNECT\n");
    acl(&mut conf, "SSL_ports", "port", &ports(policy.tunnel_ports()));
    acl(
        &mut conf,
        "epo_denied_dst",
        "dst",
        &networks(policy.denied_networks()),
    );
    acl(
        &mut conf,
        "epo_denied_ports",
        "port",
        &ports(policy.denied_ports()),
    );
    acl(
        &mut conf,
        "epo_allowed_dst",
        "dst",
        &networks(policy.allowed_networks()),
    );
    acl(
        &mut conf,
        "epo_default_denied_dst",
        "dst",
        &networks(policy.default_denied()),
    );
    if !policy.denied_networks().is_empty() {
        conf.push_str("http_access deny epo_denied_dst\n");
    }
    if !policy.denied_ports().is_empty() {
        conf.push_str("http_access deny epo_denied_ports\n");
    }
    conf.push_str("http_access deny CONNECT !SSL_ports\n");
    if policy.allowed_networks().is_empty() {
        conf.push_str("http_access deny epo_default_denied_dst\n");
    } else {
        conf.push_str("http_access deny epo_default_denied_dst !epo_allowed_dst\n");
    }
    conf
}

/// One `acl` line, or nothing for an empty list (Squid rejects empty ACLs).
fn acl(conf: &mut String, name: &str, kind: &str, values: &[String]) {
    if !values.is_empty() {
        // Writing to a String cannot fail.
        let _ = writeln!(conf, "acl {name} {kind} {}", values.join(" "));
    }
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
            "acl epo_denied_ports port 25-26\n",
            "acl epo_allowed_dst dst 127.0.0.0/8\n",
            "http_access deny epo_denied_dst\nhttp_access deny epo_denied_ports\nhttp_access deny CONNECT !SSL_ports\nhttp_access deny epo_default_denied_dst !epo_allowed_dst\n",
        ] {
            assert!(conf.contains(line), "{line:?} in {conf}");
        }
    }

    #[test]
    fn the_vm_cloud_init_sample_carries_the_default_rules() {
        // The sample is static: this keeps it in step with the defaults.
        let sample = include_str!("../../deploy/samples/cloud-init-secret.yaml");
        let lines: Vec<&str> = sample.lines().map(str::trim).collect();
        for line in squid_rules(&DestinationPolicy::default()).lines() {
            assert!(lines.contains(&line), "{line:?} missing from the sample");
        }
    }
}
