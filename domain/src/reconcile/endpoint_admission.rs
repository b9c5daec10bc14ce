//! Admitting an External Proxy's endpoint in Kubernetes mode: a Proxy's
//! author may not point the operator at its own pod (loopback) or the
//! node's link-local services (the cloud metadata server), which would turn
//! Proxy status into a scanner of what only the operator can reach. The
//! name is resolved and every address checked; probes then connect only to
//! checked addresses, so a later DNS answer cannot slip past.

use std::net::IpAddr;

use crate::destinations::{DestinationPolicy, IpNet, NameResolver, Refusal};

/// The endpoint resolves to an address the operator does not connect to.
#[derive(Debug, thiserror::Error)]
#[error(
    "endpoint {host}:{port} resolves to {address}, in {network}: External endpoints on loopback \
     or link-local addresses are refused in Kubernetes mode unless the operator's \
     --allow-external-endpoint-networks lists them"
)]
pub struct EndpointRefused {
    pub host: String,
    pub port: u16,
    pub address: std::net::IpAddr,
    pub network: IpNet,
}

/// Checks every address `host` resolves to against `policy`; a name that
/// does not resolve is admitted (its probes fail and say why).
pub async fn admit(
    policy: &DestinationPolicy,
    names: &dyn NameResolver,
    host: &str,
    port: u16,
) -> Result<(), EndpointRefused> {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    match names.resolve(bare, port).await {
        Some(addresses) => check(policy, host, port, &addresses),
        None => Ok(()),
    }
}

/// Checks `addresses`, what `host` resolves to, against `policy`.
pub fn check(
    policy: &DestinationPolicy,
    host: &str,
    port: u16,
    addresses: &[IpAddr],
) -> Result<(), EndpointRefused> {
    for address in addresses {
        if let Err(refusal) = policy.check(*address, port, false) {
            let network = match refusal {
                Refusal::DefaultDenied(net) | Refusal::DeniedNetwork(net) => net,
                // Ports are not part of these rules.
                Refusal::DeniedPort(_) | Refusal::TunnelPort(_) => continue,
            };
            return Err(EndpointRefused {
                host: host.to_owned(),
                port,
                address: address.to_canonical(),
                network,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Names as a resolver answers them, addresses resolving to themselves.
    struct Table;

    #[async_trait::async_trait]
    impl NameResolver for Table {
        async fn resolve(&self, host: &str, _port: u16) -> Option<Vec<IpAddr>> {
            match host {
                "localhost" => Some(vec!["127.0.0.1".parse().unwrap(), "::1".parse().unwrap()]),
                literal => literal.parse().ok().map(|a| vec![a]),
            }
        }
    }

    #[tokio::test]
    async fn loopback_and_link_local_are_refused_by_address_and_by_name() {
        let policy = DestinationPolicy::external_endpoints(&[]);
        for host in ["127.0.0.1", "localhost", "[::1]", "169.254.169.254", "0.0.0.0"] {
            let refused = admit(&policy, &Table, host, 3128).await.unwrap_err();
            assert!(
                refused.to_string().contains("--allow-external-endpoint-networks"),
                "{host}: {refused}"
            );
        }
        for host in ["10.0.0.7", "203.0.113.7", "192.168.1.1"] {
            admit(&policy, &Table, host, 3128).await.unwrap();
        }
        let allowed = DestinationPolicy::external_endpoints(&["127.0.0.0/8".parse().unwrap()]);
        admit(&allowed, &Table, "127.0.0.1", 3128).await.unwrap();
    }

    #[tokio::test]
    async fn a_name_that_does_not_resolve_is_admitted() {
        let policy = DestinationPolicy::external_endpoints(&[]);
        admit(&policy, &Table, "no-such-name.invalid", 3128)
            .await
            .unwrap();
    }
}
