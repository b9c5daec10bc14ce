//! The realm a proxy's `407` names (`Proxy-Authenticate: Basic
//! realm="..."`). Every proxy the operator creates gets a realm of its own,
//! derived from its generated credentials, so that a gateway in front can
//! tell the proxy refusing its credentials from a site that answers `407`
//! itself: a site does not know the credentials, so it cannot name the realm
//! unless it reaches the proxy's own port and asks it. The realm is no
//! secret (it may be logged): it is a one-way digest, and the password
//! cannot be recovered from it.

use sha2::{Digest, Sha256};

use super::ProxyCredentials;

/// The realm shared by everything that has no realm of its own: the
/// gateway's own `407` to crawlers, and proxies created before realms were
/// per proxy.
pub const SHARED_REALM: &str = "egress-proxies";

/// Hex digits of the digest a realm carries: 64 bits, beyond guessing.
const REALM_HEX_DIGITS: usize = 16;

/// Domain separation: this digest is used for nothing else.
const REALM_CONTEXT: &[u8] = b"egress-proxies realm v1\0";

/// `egress-proxies-<16 hex digits>`: the same for the same credentials (so
/// across operator restarts), different for different ones. Letters, digits
/// and `-` only, so it fits a squid.conf line and a quoted string as it is.
pub fn realm_of(credentials: &ProxyCredentials) -> String {
    let mut hash = Sha256::new();
    hash.update(REALM_CONTEXT);
    hash.update(credentials.username.as_bytes());
    hash.update(b"\0");
    hash.update(credentials.password.as_bytes());
    let digest = hex::encode(hash.finalize());
    format!("{SHARED_REALM}-{}", &digest[..REALM_HEX_DIGITS])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_realm_is_stable_per_credentials_and_reveals_nothing() {
        let a = ProxyCredentials::generate(&crate::credentials::random::TestRandom).unwrap();
        let b = ProxyCredentials::generate(&crate::credentials::random::TestRandom).unwrap();
        let realm = realm_of(&a);
        assert_eq!(
            realm,
            realm_of(&a.clone()),
            "the same credentials, the same realm"
        );
        assert_ne!(realm, realm_of(&b));
        assert_ne!(realm, SHARED_REALM);
        assert!(realm.starts_with("egress-proxies-"), "{realm}");
        assert_eq!(realm.len(), SHARED_REALM.len() + 1 + REALM_HEX_DIGITS);
        assert!(realm.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'));
        assert!(!realm.contains(&a.password) && !realm.contains(&a.username));
        // Only the password differs: another realm (a site that knows the
        // username alone cannot name it).
        let same_user = ProxyCredentials::new(&a.username, &b.password).unwrap();
        assert_ne!(realm, realm_of(&same_user));
    }

    #[test]
    fn a_realm_is_a_fixed_digest() {
        // Pinned: a changed derivation would change every running proxy's
        // realm after an operator upgrade.
        let c = ProxyCredentials::new("u0123456789ab", "secret").unwrap();
        assert_eq!(realm_of(&c), "egress-proxies-754f8aea7ff04545");
    }
}
