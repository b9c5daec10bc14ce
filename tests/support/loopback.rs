//! Destination rules open to loopback, where the tests' servers listen.
//! Shared by the library's tests and the operator's
//! (`actors/tests/support/` includes this file).

/// Destination rules for proxies the tests fetch through: loopback targets
/// (where the tests' servers listen) on any port.
pub fn loopback_rules() -> egress_proxies::domain::destinations::DestinationRules {
    egress_proxies::domain::destinations::DestinationRules {
        allow: vec!["127.0.0.0/8".parse().unwrap(), "1-65535".parse().unwrap()],
        deny: Vec::new(),
    }
}

/// [`loopback_rules`] for an in-process built-in proxy standing in for someone else's.
pub fn open_to_loopback() -> std::sync::Arc<egress_proxies::domain::destinations::DestinationPolicy> {
    std::sync::Arc::new(egress_proxies::domain::destinations::DestinationPolicy::new(
        &loopback_rules(),
        &[],
    ))
}
