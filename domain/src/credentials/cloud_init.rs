//! Handing credentials to a VM's cloud-init: the operator replaces
//! documented placeholders with the passwd line and the proxy's realm
//! before creating the VM. The hash travels, never the password (user-data
//! is readable on the VM and, on some clouds, by its metadata server).

use super::{CredentialsError, ProxyCredentials, Salt, htpasswd_line, realm_of};

/// Replaced by `user:<sha512-crypt hash>` wherever it appears in cloud-init.
pub const HTPASSWD_PLACEHOLDER: &str = "{{ proxy_htpasswd }}";
/// Replaced by the proxy's own realm ([`realm_of`]), for
/// `auth_param basic realm {{ proxy_realm }}`.
pub const REALM_PLACEHOLDER: &str = "{{ proxy_realm }}";

/// `cloud_init` with every [`HTPASSWD_PLACEHOLDER`] replaced by the passwd
/// line of `credentials` (hashed with `salt`) and every
/// [`REALM_PLACEHOLDER`] by their realm; unchanged when it has neither.
pub fn substitute_placeholders(
    cloud_init: &[u8],
    credentials: &ProxyCredentials,
    salt: &Salt,
) -> Result<Vec<u8>, CredentialsError> {
    let mut out = cloud_init.to_vec();
    if contains(&out, HTPASSWD_PLACEHOLDER) {
        out = replace_all(&out, HTPASSWD_PLACEHOLDER, &htpasswd_line(credentials, salt)?);
    }
    if contains(&out, REALM_PLACEHOLDER) {
        out = replace_all(&out, REALM_PLACEHOLDER, &realm_of(credentials));
    }
    Ok(out)
}

/// Whether `cloud_init` names the proxy's realm by [`REALM_PLACEHOLDER`].
pub fn names_realm(cloud_init: &[u8]) -> bool {
    contains(cloud_init, REALM_PLACEHOLDER)
}

fn contains(doc: &[u8], needle: &str) -> bool {
    doc.windows(needle.len()).any(|w| w == needle.as_bytes())
}

fn replace_all(doc: &[u8], needle: &str, value: &str) -> Vec<u8> {
    let needle = needle.as_bytes();
    let mut out = Vec::with_capacity(doc.len() + value.len());
    let mut rest = doc;
    while let Some(at) = rest.windows(needle.len()).position(|w| w == needle) {
        out.extend_from_slice(&rest[..at]);
        out.extend_from_slice(value.as_bytes());
        rest = &rest[at + needle.len()..];
    }
    out.extend_from_slice(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_placeholder_becomes_the_hash_line() {
        let c = ProxyCredentials::generate(&crate::credentials::random::TestRandom).unwrap();
        let doc = b"#cloud-config\nwrite_files:\n  - path: /etc/squid/passwd\n    content: |\n      {{ proxy_htpasswd }}\n";
        let out = String::from_utf8(
            substitute_placeholders(
                doc,
                &c,
                &Salt::draw(&crate::credentials::random::TestRandom).unwrap(),
            )
            .unwrap(),
        )
        .unwrap();
        assert!(!out.contains(HTPASSWD_PLACEHOLDER));
        assert!(out.contains(&format!("      {}:$6$", c.username)), "{out}");
        assert!(!out.contains(&c.password));
    }

    #[test]
    fn the_realm_placeholder_becomes_the_proxy_s_realm() {
        let c = ProxyCredentials::generate(&crate::credentials::random::TestRandom).unwrap();
        let doc = b"#cloud-config\n# auth_param basic realm {{ proxy_realm }}\nauth_param basic realm {{ proxy_realm }}\n";
        assert!(names_realm(doc));
        let out = String::from_utf8(
            substitute_placeholders(
                doc,
                &c,
                &Salt::draw(&crate::credentials::random::TestRandom).unwrap(),
            )
            .unwrap(),
        )
        .unwrap();
        assert!(!out.contains(REALM_PLACEHOLDER) && !names_realm(out.as_bytes()));
        assert_eq!(out.matches(&realm_of(&c)).count(), 2, "{out}");
        assert!(!out.contains(&c.password));
    }

    #[test]
    fn cloud_init_without_the_placeholders_is_unchanged() {
        let c = ProxyCredentials::generate(&crate::credentials::random::TestRandom).unwrap();
        let doc = b"#cloud-config\npackages: [squid]\n";
        assert!(!names_realm(doc));
        assert_eq!(
            substitute_placeholders(
                doc,
                &c,
                &Salt::draw(&crate::credentials::random::TestRandom).unwrap()
            )
            .unwrap(),
            doc.to_vec()
        );
    }
}
