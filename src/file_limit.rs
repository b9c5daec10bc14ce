//! The process's open-file limit (`RLIMIT_NOFILE`), raised to its hard
//! limit at start: every socket is a file, and the soft limit distributions
//! set (often 1,024) is far below what a proxy or an API serving many
//! clients needs. Children (Squid, the built-in proxy) inherit the raised
//! limit. The listeners size their connection caps from it
//! ([`crate::listener_limits`]).

use nix::sys::resource::{Resource, getrlimit, setrlimit};

/// Pipes the process keeps alive at once for relaying tunnels by
/// `splice(2)`, in use or pooled: two descriptors each, which every
/// listener leaves out of its connection cap.
pub const MAX_PIPES: usize = 32;

/// The limit before and after the raise.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileLimit {
    /// The soft limit the process started with.
    pub was: u64,
    /// The soft limit now.
    pub soft: u64,
    /// The hard limit (the most the soft one may be raised to).
    pub hard: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum FileLimitError {
    #[error("reading the open-file limit (RLIMIT_NOFILE): {0}")]
    Read(#[source] nix::Error),
    #[error("raising the open-file limit (RLIMIT_NOFILE) from {was} to its hard limit {hard}: {source}")]
    Raise {
        was: u64,
        hard: u64,
        #[source]
        source: nix::Error,
    },
}

/// Raises the soft open-file limit to the hard one (a no-op when they are
/// equal), and says what it is now.
pub fn raise_to_hard_limit() -> Result<FileLimit, FileLimitError> {
    let (was, hard) = getrlimit(Resource::RLIMIT_NOFILE).map_err(FileLimitError::Read)?;
    if was < hard {
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard).map_err(|source| FileLimitError::Raise {
            was,
            hard,
            source,
        })?;
    }
    Ok(FileLimit {
        was,
        soft: hard,
        hard,
    })
}

/// The soft open-file limit now (what `accept()` runs into). Unlimited or
/// unreadable reads as `u64::MAX`: nothing to size down for.
pub fn current() -> u64 {
    getrlimit(Resource::RLIMIT_NOFILE).map_or(u64::MAX, |(soft, _)| soft)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_soft_limit_ends_at_the_hard_one() {
        let limit = raise_to_hard_limit().unwrap();
        assert_eq!(limit.soft, limit.hard);
        assert!(limit.was <= limit.hard);
        assert_eq!(current(), limit.hard);
    }
}
