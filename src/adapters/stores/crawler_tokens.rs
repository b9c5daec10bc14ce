//! The crawler tokens directory (`--crawler-tokens-dir`,
//! `crawlerTokensDir:`): one file per identity, the file name the
//! identity's name, its content the token — the layout of a Kubernetes
//! Secret mounted as a volume. Hidden entries (`..data`, the volume's
//! timestamped directories) and subdirectories are skipped; symlinks are
//! followed. Re-read every [`RELOAD_EVERY`], so an updated Secret takes
//! effect without a restart; a directory that fails to read or validate
//! keeps the identities in force (logged, naming the file, never a token).

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::domain::identity::{Identities, IdentityError, SharedIdentities};

/// How often the directory is read again: a change on disk takes effect
/// within this (Kubernetes updates a mounted Secret's files up to about a
/// minute after the Secret changes, at the kubelet's sync).
pub const RELOAD_EVERY: Duration = Duration::from_secs(5);

/// The directory could not be used.
#[derive(Debug, thiserror::Error)]
pub enum CrawlerTokensError {
    #[error("crawler tokens directory {dir}: {source}")]
    Read {
        dir: String,
        #[source]
        source: std::io::Error,
    },
    #[error("crawler tokens directory {dir}: {source}")]
    Invalid {
        dir: String,
        #[source]
        source: IdentityError,
    },
}

/// Where the identities come from: the directory (if any), and the tokens
/// from the environment it is checked with.
#[derive(Clone, Default)]
pub struct TokenSources {
    pub dir: Option<PathBuf>,
    /// `DISCOVERY_TOKEN`: identity `default`.
    pub legacy: Option<String>,
    /// `DISCOVERY_READ_TOKEN`: must differ from every crawler token.
    pub reader: Option<String>,
}

/// Whether a token is set, for logs: never the token.
struct Redacted<'a>(&'a Option<String>);

impl std::fmt::Debug for Redacted<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() { "set" } else { "unset" })
    }
}

impl TokenSources {
    /// The identities as the sources say now.
    pub fn load(&self) -> Result<Identities, CrawlerTokensError> {
        let files = match &self.dir {
            Some(dir) => read_files(dir)?,
            None => Vec::new(),
        };
        Identities::build(
            files,
            self.legacy.as_deref(),
            self.reader.as_deref(),
            self.dir.is_some(),
        )
        .map_err(|source| CrawlerTokensError::Invalid {
            dir: self.dir_name(),
            source,
        })
    }

    fn dir_name(&self) -> String {
        self.dir
            .as_deref()
            .map(|d| d.display().to_string())
            .unwrap_or_else(|| "(none)".into())
    }

    /// Loads the identities, then keeps them current from a thread of its
    /// own (for the life of the process) when a directory is configured.
    pub fn watch(self) -> Result<SharedIdentities, CrawlerTokensError> {
        let first = self.load()?;
        tracing::info!(
            dir = %self.dir_name(), discovery_token = ?Redacted(&self.legacy),
            identities = ?first.names().collect::<Vec<_>>(), "crawler identities"
        );
        let shared = SharedIdentities::new(first);
        if self.dir.is_some() {
            let handle = shared.clone();
            std::thread::Builder::new()
                .name("crawler-tokens".into())
                .spawn(move || self.reload_forever(&handle))
                .map_err(|source| CrawlerTokensError::Read {
                    dir: "(reload thread)".into(),
                    source,
                })?;
        }
        Ok(shared)
    }

    fn reload_forever(&self, shared: &SharedIdentities) {
        let mut failing = false;
        loop {
            std::thread::sleep(RELOAD_EVERY);
            match self.load() {
                Ok(fresh) => {
                    failing = false;
                    let current = shared.current();
                    if *current != fresh {
                        tracing::info!(
                            dir = %self.dir_name(),
                            identities = ?fresh.names().collect::<Vec<_>>(),
                            "crawler identities changed"
                        );
                        shared.replace(fresh);
                    }
                }
                // Said once per failing spell, not every few seconds.
                Err(e) if !failing => {
                    failing = true;
                    tracing::error!(error = %e, "crawler tokens not reloaded; the identities in force stay");
                }
                Err(_) => {}
            }
        }
    }
}

/// `(file name, content)` of every regular file (or symlink to one) in
/// `dir` whose name does not start with `.`.
fn read_files(dir: &Path) -> Result<Vec<(String, Vec<u8>)>, CrawlerTokensError> {
    let failed = |source| CrawlerTokensError::Read {
        dir: dir.display().to_string(),
        source,
    };
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(failed)? {
        let entry = entry.map_err(failed)?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') {
            continue;
        }
        let path = entry.path();
        // Followed: a Secret volume's files are symlinks into `..data`.
        match std::fs::metadata(&path) {
            Ok(meta) if meta.is_file() => {}
            Ok(_) => continue,
            // Removed between listing and reading (a Secret update): skip.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(failed(e)),
        }
        match std::fs::read(&path) {
            Ok(content) => files.push((name, content)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(failed(e)),
        }
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_volume_reads_as_its_keys() {
        let dir = tempfile::tempdir().unwrap();
        // What the kubelet writes: a timestamped directory, `..data`
        // pointing at it, and one symlink per key.
        let stamped = dir.path().join("..2026_12_07_01_00_00.123");
        std::fs::create_dir(&stamped).unwrap();
        std::fs::write(stamped.join("team-a"), "token-a\n").unwrap();
        std::fs::write(stamped.join("team-b"), "token-b").unwrap();
        std::os::unix::fs::symlink(&stamped, dir.path().join("..data")).unwrap();
        for key in ["team-a", "team-b"] {
            std::os::unix::fs::symlink(format!("..data/{key}"), dir.path().join(key)).unwrap();
        }
        let sources = TokenSources {
            dir: Some(dir.path().to_owned()),
            legacy: Some("legacy".into()),
            reader: None,
        };
        let ids = sources.load().unwrap();
        assert_eq!(ids.names().collect::<Vec<_>>(), ["default", "team-a", "team-b"]);
        assert_eq!(ids.identify(b"token-a"), Some("team-a"));
        std::fs::write(stamped.join("Bad_Name"), "x").unwrap();
        std::os::unix::fs::symlink("..data/Bad_Name", dir.path().join("Bad_Name")).unwrap();
        let error = sources.load().unwrap_err().to_string();
        assert!(error.contains("Bad_Name") && !error.contains("token-"), "{error}");
    }

    #[test]
    fn a_missing_directory_is_an_error_naming_it() {
        let sources = TokenSources {
            dir: Some("/nonexistent/crawler-tokens".into()),
            ..TokenSources::default()
        };
        let error = sources.load().unwrap_err().to_string();
        assert!(error.contains("/nonexistent/crawler-tokens"), "{error}");
    }
}
