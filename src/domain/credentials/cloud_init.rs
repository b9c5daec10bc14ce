//! Handing credentials to a VM's cloud-init: the operator replaces a
//! documented placeholder with the passwd line before creating the VM. The
//! hash travels, never the password (user-data is readable on the VM and,
//! on some clouds, by its metadata server).

use super::{CredentialsError, ProxyCredentials, htpasswd_line};

/// Replaced by `user:<sha512-crypt hash>` wherever it appears in cloud-init.
pub const HTPASSWD_PLACEHOLDER: &str = "{{ proxy_htpasswd }}";

/// `cloud_init` with every [`HTPASSWD_PLACEHOLDER`] replaced by the passwd
/// line of `credentials`; unchanged when it has none.
pub fn substitute_htpasswd(
    cloud_init: &[u8],
    credentials: &ProxyCredentials,
) -> Result<Vec<u8>, CredentialsError> {
    let needle = HTPASSWD_PLACEHOLDER.as_bytes();
    if !cloud_init.windows(needle.len()).any(|w| w == needle) {
        return Ok(cloud_init.to_vec());
    }
    let line = htpasswd_line(credentials)?;
    let mut out = Vec::with_capacity(cloud_init.len() + line.len());
    let mut rest = cloud_init;
    while let Some(at) = rest.windows(needle.len()).position(|w| w == needle) {
        out.extend_from_slice(&rest[..at]);
        out.extend_from_slice(line.as_bytes());
        rest = &rest[at + needle.len()..];
    }
    out.extend_from_slice(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_placeholder_becomes_the_hash_line() {
        let c = ProxyCredentials::generate().unwrap();
        let doc = b"#cloud-config\nwrite_files:\n  - path: /etc/squid/passwd\n    content: |\n      {{ proxy_htpasswd }}\n";
        let out = String::from_utf8(substitute_htpasswd(doc, &c).unwrap()).unwrap();
        assert!(!out.contains(HTPASSWD_PLACEHOLDER));
        assert!(out.contains(&format!("      {}:$6$", c.username)), "{out}");
        assert!(!out.contains(&c.password));
    }

    #[test]
    fn cloud_init_without_the_placeholder_is_unchanged() {
        let c = ProxyCredentials::generate().unwrap();
        let doc = b"#cloud-config\npackages: [squid]\n";
        assert_eq!(substitute_htpasswd(doc, &c).unwrap(), doc.to_vec());
    }
}
