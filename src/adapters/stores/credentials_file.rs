//! Credentials handed to a local proxy process by a file only its owner can
//! read (mode 0600): a command line is visible to every user in `ps`.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use crate::domain::credentials::{CredentialsError, ProxyCredentials};

/// Writes `username:password` to `path`, readable by its owner only.
pub fn write_credentials_file(path: &Path, credentials: &ProxyCredentials) -> std::io::Result<()> {
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    writeln!(file, "{}:{}", credentials.username, credentials.password)?;
    file.sync_all()
}

/// Reads a file written by [`write_credentials_file`].
pub fn read_credentials_file(path: &Path) -> Result<ProxyCredentials, CredentialsError> {
    let file_error = |reason: String| CredentialsError::File {
        path: path.display().to_string(),
        reason,
    };
    let text = std::fs::read_to_string(path).map_err(|e| file_error(e.to_string()))?;
    let (username, password) = text
        .trim_end_matches(['\r', '\n'])
        .split_once(':')
        .ok_or_else(|| file_error("expected one line `username:password`".into()))?;
    ProxyCredentials::new(username, password)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_written_file_is_private_and_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("credentials");
        let c = ProxyCredentials::generate(&crate::adapters::random::SystemRandom).unwrap();
        write_credentials_file(&path, &c).unwrap();
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(read_credentials_file(&path).unwrap(), c);
    }

    #[test]
    fn a_malformed_file_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("credentials");
        std::fs::write(&path, "no separator\n").unwrap();
        let e = read_credentials_file(&path).unwrap_err().to_string();
        assert!(
            e.contains(&path.display().to_string()) && e.contains("username:password"),
            "{e}"
        );
    }
}
