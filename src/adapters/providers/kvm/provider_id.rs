//! kvm providerIDs: `hosts/<host>/domains/<name>`.

use crate::domain::config::is_identifier;
use crate::domain::provider_contract::ProviderId;

pub fn provider_id(host: &str, domain: &str) -> ProviderId {
    ProviderId(format!("hosts/{host}/domains/{domain}"))
}

/// The host and domain of a kvm providerID; `None` for anything else.
pub fn parse(id: &ProviderId) -> Option<(&str, &str)> {
    let rest = id.as_str().strip_prefix("hosts/")?;
    let (host, domain) = rest.split_once("/domains/")?;
    (is_identifier(host) && is_identifier(domain)).then_some((host, domain))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_rejects() {
        let id = provider_id("dc1-kvm1", "proxy-abc");
        assert_eq!(id.as_str(), "hosts/dc1-kvm1/domains/proxy-abc");
        assert_eq!(parse(&id), Some(("dc1-kvm1", "proxy-abc")));
        for bad in [
            "hosts/a/b/domains/c",
            "hosts//domains/c",
            "zones/a/instances/b",
            "hosts/a/domains/../x",
            "hosts/a/domains/",
        ] {
            assert_eq!(parse(&ProviderId(bad.into())), None, "{bad}");
        }
    }
}
