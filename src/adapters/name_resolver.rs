//! The system's resolver behind the domain's [`NameResolver`] port.

use std::net::IpAddr;
use std::time::Duration;

use crate::domain::destinations::NameResolver;

/// How long a name may take to resolve before it counts as not resolving.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(5);

/// Resolves names with the operating system's resolver (`getaddrinfo`).
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemResolver;

#[async_trait::async_trait]
impl NameResolver for SystemResolver {
    async fn resolve(&self, host: &str, port: u16) -> Option<Vec<IpAddr>> {
        let found = tokio::time::timeout(RESOLVE_TIMEOUT, tokio::net::lookup_host((host, port))).await;
        let Ok(Ok(addresses)) = found else {
            return None;
        };
        Some(addresses.map(|a| a.ip()).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::destinations::DestinationPolicy;
    use crate::domain::reconcile::endpoint_admission;

    #[tokio::test]
    async fn localhost_resolves_to_loopback_and_is_refused_by_name() {
        let addresses = SystemResolver.resolve("localhost", 3128).await.unwrap();
        assert!(
            !addresses.is_empty() && addresses.iter().all(IpAddr::is_loopback),
            "{addresses:?}"
        );
        let policy = DestinationPolicy::external_endpoints(&[]);
        let refused = endpoint_admission::admit(&policy, &SystemResolver, "localhost", 3128)
            .await
            .unwrap_err();
        assert!(
            refused.to_string().contains("--allow-external-endpoint-networks"),
            "{refused}"
        );
    }

    #[tokio::test]
    async fn an_address_resolves_to_itself() {
        assert_eq!(
            SystemResolver.resolve("203.0.113.7", 80).await,
            Some(vec!["203.0.113.7".parse().unwrap()])
        );
    }
}
