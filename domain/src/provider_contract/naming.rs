//! Deterministic instance names.
//!
//! The name is derived from the Proxy UID alone, so a create repeated after a
//! crash finds the instance it already made instead of adding a second one.
//! The alphabet (lowercase base32: `a-z`, `2-7`) and length fit every
//! provider's naming rules: GCE instance names, Kubernetes pod names
//! (DNS-1123 labels), libvirt domain and volume names.

use std::fmt;

use data_encoding::BASE32_NOPAD;
use sha2::{Digest, Sha256};

/// Prefix of every instance name.
pub const INSTANCE_NAME_PREFIX: &str = "proxy-";
/// Base32 characters after the prefix (80 bits of the UID's hash).
const HASH_CHARS: usize = 16;

/// The name of the instance that backs one Proxy.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct InstanceName(String);

impl InstanceName {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for InstanceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// `proxy-` + 16 lowercase base32 characters of sha256(uid).
pub fn instance_name(uid: &str) -> InstanceName {
    let digest = Sha256::digest(uid.as_bytes());
    let encoded = BASE32_NOPAD.encode(&digest).to_ascii_lowercase();
    InstanceName(format!("{INSTANCE_NAME_PREFIX}{}", &encoded[..HASH_CHARS]))
}

/// The Secret holding the credentials of the Proxy with UID `uid` in
/// Kubernetes mode (derived like its instance's name, so the kubernetes
/// provider mounts it without a lookup).
pub fn credentials_secret_name(uid: &str) -> String {
    format!("{}-credentials", instance_name(uid))
}

/// The key of that Secret holding `username:<sha512-crypt hash>`, Squid's passwd file.
pub const HTPASSWD_KEY: &str = "htpasswd";

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn known_value() {
        // Pinned: changing the derivation would orphan every existing instance.
        // Values computed independently (Python: base32(sha256(uid)).lower()[:16]).
        assert_eq!(
            instance_name("2f6d3a52-0c4e-4d8b-9b57-1f0e6c1d2a33").as_str(),
            "proxy-opvxcflx4ugeuijn"
        );
        assert_eq!(instance_name("").as_str(), "proxy-4oymiquy7qobjgx3");
    }

    fn is_dns_label(s: &str) -> bool {
        s.len() <= 63
            && s.starts_with(|c: char| c.is_ascii_lowercase())
            && s.ends_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
            && s.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
    }

    proptest! {
        #[test]
        fn deterministic_and_valid_everywhere(uid in "[-a-f0-9]{1,64}") {
            let a = instance_name(&uid);
            prop_assert_eq!(&a, &instance_name(&uid));
            prop_assert_eq!(a.as_str().len(), INSTANCE_NAME_PREFIX.len() + HASH_CHARS);
            prop_assert!(is_dns_label(a.as_str()), "{a} is not a DNS label");
        }

        #[test]
        fn distinct_uids_get_distinct_names(a in "[-a-f0-9]{8,40}", b in "[-a-f0-9]{8,40}") {
            prop_assume!(a != b);
            prop_assert_ne!(instance_name(&a), instance_name(&b));
        }
    }

    #[test]
    fn no_collisions_among_many_uuids() {
        let mut seen = std::collections::HashSet::new();
        for i in 0..200_000u64 {
            let uid = format!("{:08x}-0000-4000-8000-{:012x}", i >> 16, i);
            assert!(seen.insert(instance_name(&uid)), "collision at {uid}");
        }
    }
}
