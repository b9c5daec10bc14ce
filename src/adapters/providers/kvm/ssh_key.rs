//! SSH key material, read lazily: the `kvm-ssh` Secret is an optional mount,
//! so a missing file is a Transient condition (it may appear later and heal
//! the provider), while a file that does not parse is Permanent.

use std::path::Path;

use russh::keys::PrivateKey;

/// The key could not be used.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("SSH key {path} does not exist (yet): mount the kvm-ssh Secret")]
    Missing { path: String },
    #[error(
        "SSH key {path} is a public key; sshKeyFile must name the private key (e.g. id_ed25519, not id_ed25519.pub)"
    )]
    PublicKeyGiven { path: String },
    #[error("SSH key {path} cannot be used: {reason}")]
    Unparseable { path: String, reason: String },
    #[error("reading SSH key {path}: {reason}")]
    Unreadable { path: String, reason: String },
}

impl KeyError {
    /// Worth retrying: the file may still appear.
    pub fn is_transient(&self) -> bool {
        matches!(self, KeyError::Missing { .. } | KeyError::Unreadable { .. })
    }
}

/// Reads and parses a private key (OpenSSH or PEM formats, unencrypted).
pub fn load_private_key(path: &Path) -> Result<PrivateKey, KeyError> {
    let shown = path.display().to_string();
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(KeyError::Missing { path: shown }),
        Err(e) => {
            return Err(KeyError::Unreadable {
                path: shown,
                reason: e.to_string(),
            });
        }
    };
    let first = text.trim_start();
    if first.starts_with("ssh-")
        || first.starts_with("ecdsa-sha2-")
        || first.contains("BEGIN SSH2 PUBLIC KEY")
    {
        return Err(KeyError::PublicKeyGiven { path: shown });
    }
    russh::keys::decode_secret_key(&text, None).map_err(|e| KeyError::Unparseable {
        path: shown,
        reason: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_missing_public_and_garbage() {
        let dir = tempfile::tempdir().unwrap();
        let missing = load_private_key(&dir.path().join("nope")).unwrap_err();
        assert!(missing.is_transient(), "{missing}");
        let public = dir.path().join("id.pub");
        std::fs::write(&public, "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIJ8 user@host\n").unwrap();
        let err = load_private_key(&public).unwrap_err();
        assert!(
            matches!(err, KeyError::PublicKeyGiven { .. }) && !err.is_transient(),
            "{err}"
        );
        assert!(err.to_string().contains("not id_ed25519.pub"));
        let garbage = dir.path().join("garbage");
        std::fs::write(
            &garbage,
            "-----BEGIN OPENSSH PRIVATE KEY-----\nnot base64\n-----END OPENSSH PRIVATE KEY-----\n",
        )
        .unwrap();
        let err = load_private_key(&garbage).unwrap_err();
        assert!(
            matches!(err, KeyError::Unparseable { .. }) && !err.is_transient(),
            "{err}"
        );
    }
}
