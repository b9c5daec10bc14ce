//! How replicas know each other on the internal listener: every call
//! carries `Authorization: Bearer <token>`, where the token is
//! `hex(HMAC-SHA256(discovery token, "egress-proxies replica v1"))`. Every
//! replica of an installation has the discovery token (`DISCOVERY_TOKEN`),
//! so every one derives the same token, and a crawler — who holds the
//! discovery token or a token of its own — cannot present it by accident:
//! the derived token is not a crawler token, and knowing it does not give
//! the discovery token back. Compared in constant time.
//!
//! Without a discovery token there is nothing to derive it from: the
//! listener then serves only on loopback (the gateway's rule for an open
//! proxy, [`check_exposure`](crate::adapters::gateway::check_exposure)),
//! since its calls carry proxy credentials.

use std::fmt;
use std::net::SocketAddr;

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;
use subtle::ConstantTimeEq;

use super::ReplicaError;

/// What the HMAC is taken over: a new meaning gets a new label.
const LABEL: &[u8] = b"egress-proxies replica v1";

/// The replicas' shared bearer token.
#[derive(Clone, PartialEq, Eq)]
pub struct ReplicaToken(String);

// A secret: never printed.
impl fmt::Debug for ReplicaToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ReplicaToken(<redacted>)")
    }
}

impl ReplicaToken {
    /// The token every replica holding `discovery_token` derives.
    pub fn derive(discovery_token: &str) -> Self {
        let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(discovery_token.as_bytes())
            .unwrap_or_else(|_| unreachable!("HMAC takes a key of any length"));
        mac.update(LABEL);
        Self(hex::encode(mac.finalize().into_bytes()))
    }

    /// The value of the `Authorization` header a caller sends.
    pub fn header_value(&self) -> String {
        format!("Bearer {}", self.0)
    }

    /// Whether an `Authorization` header value carries this token
    /// (compared in constant time; the scheme is case-insensitive).
    pub fn accepts(&self, header: &str) -> bool {
        let Some((scheme, presented)) = header.trim().split_once(' ') else {
            return false;
        };
        scheme.eq_ignore_ascii_case("bearer")
            && bool::from(presented.trim().as_bytes().ct_eq(self.0.as_bytes()))
    }
}

/// Refuses a replica listener on `addr` that would take calls without a
/// token from anywhere but loopback.
pub fn check_listener(addr: SocketAddr, token: Option<&ReplicaToken>) -> Result<(), ReplicaError> {
    crate::adapters::gateway::check_exposure(addr, token.is_some()).map_err(|_| {
        ReplicaError::ExposedWithoutToken {
            address: addr.to_string(),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_is_the_hmac_of_the_label_under_the_discovery_token() {
        // Computed independently with
        // `printf 'egress-proxies replica v1' | openssl dgst -sha256 -hmac s3cret`.
        let token = ReplicaToken::derive("s3cret");
        assert_eq!(
            token.header_value(),
            "Bearer 25809ba78bc6df0928311391c72c8c7147bcc7060a6d5f0a5d585930ecae5afe"
        );
    }

    #[test]
    fn every_replica_derives_the_same_token_and_no_other_secret_gives_it() {
        let token = ReplicaToken::derive("s3cret");
        assert_eq!(token, ReplicaToken::derive("s3cret"));
        assert_ne!(token, ReplicaToken::derive("s3cret2"));
        assert!(token.accepts(&token.header_value()));
        assert!(token.accepts(&token.header_value().replace("Bearer", "bearer")));
        assert!(
            !token.accepts("Bearer s3cret"),
            "the discovery token itself is not it"
        );
        assert!(!token.accepts(""));
        assert!(!token.accepts(&token.header_value().replace("Bearer", "Basic")));
        assert!(!token.accepts(&ReplicaToken::derive("other").header_value()));
        let mut short = token.header_value();
        short.pop();
        assert!(!token.accepts(&short));
        assert_eq!(format!("{token:?}"), "ReplicaToken(<redacted>)");
    }

    #[test]
    fn without_a_token_the_listener_stays_on_loopback() {
        let at = |a: &str| a.parse::<SocketAddr>().unwrap();
        let token = ReplicaToken::derive("s3cret");
        assert!(check_listener(at("127.0.0.1:8091"), None).is_ok());
        assert!(check_listener(at("[::1]:8091"), None).is_ok());
        assert!(check_listener(at("0.0.0.0:8091"), Some(&token)).is_ok());
        assert!(check_listener(at("10.1.2.3:8091"), Some(&token)).is_ok());
        let refused = check_listener(at("0.0.0.0:8091"), None).unwrap_err();
        assert!(
            matches!(&refused, ReplicaError::ExposedWithoutToken { address } if address == "0.0.0.0:8091")
        );
        assert!(refused.to_string().contains("DISCOVERY_TOKEN"));
        assert!(check_listener(at("10.1.2.3:8091"), None).is_err());
    }
}
