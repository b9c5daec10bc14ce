//! A local provider's destination rules, in the two forms its proxies take
//! them: a policy Squid's config is rendered from, and the built-in proxy's
//! command-line arguments.

use crate::domain::destinations::{DestinationPolicy, DestinationRules, IpNet};

pub(super) struct Destinations {
    pub policy: DestinationPolicy,
    pub builtin_args: Vec<String>,
}

impl Destinations {
    pub fn new(rules: &DestinationRules, cluster_networks: &[IpNet]) -> Self {
        let mut builtin_args = rules.to_args();
        for net in cluster_networks {
            builtin_args.extend(["--cluster-network".to_owned(), net.to_string()]);
        }
        Self {
            policy: DestinationPolicy::new(rules, cluster_networks),
            builtin_args,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_builtin_proxy_gets_every_rule_and_cluster_network() {
        let rules: DestinationRules =
            serde_json::from_str(r#"{"allow": ["127.0.0.0/8", 8443], "deny": ["10.1.0.0/16"]}"#).unwrap();
        let d = Destinations::new(&rules, &["10.96.0.0/12".parse().unwrap()]);
        assert_eq!(
            d.builtin_args,
            [
                "--allow",
                "127.0.0.0/8",
                "--allow",
                "8443",
                "--deny",
                "10.1.0.0/16",
                "--cluster-network",
                "10.96.0.0/12"
            ]
        );
    }
}
