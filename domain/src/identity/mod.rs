//! Crawler identities: named crawler tokens. Each identity is a name and
//! the token that proves it; a request's bearer token (the API) or proxy
//! password (the gateway) says which identity asks. Lease owners, rate
//! limits, sticky sessions and fair shares are per identity.
//!
//! Pure: the tokens directory is read by an adapter
//! (`egress_proxies::adapters::stores::crawler_tokens`), which hands the files here as
//! (file name, content) pairs.

use std::sync::{Arc, RwLock};

use subtle::{ConditionallySelectable, ConstantTimeEq};

/// The identity of the single `DISCOVERY_TOKEN`.
pub const DEFAULT_IDENTITY: &str = "default";
/// The identity of every client when no token is configured at all (an
/// open operator, loopback only), and of a gateway client admitted from a
/// `clientNetworks` address without credentials.
pub const ANONYMOUS_IDENTITY: &str = "anonymous";
/// Longest identity name, in bytes.
pub const MAX_NAME_LEN: usize = 64;

/// A tokens file or token that cannot be used, naming the file.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum IdentityError {
    #[error(
        "crawler tokens file {file:?}: an identity name is 1 to {MAX_NAME_LEN} lowercase letters, digits or `-`, starting and ending with a letter or digit"
    )]
    BadName { file: String },
    #[error("crawler tokens file {file:?}: `{ANONYMOUS_IDENTITY}` is reserved for unauthenticated clients")]
    Reserved { file: String },
    #[error(
        "crawler tokens file {file:?}: `{DEFAULT_IDENTITY}` is DISCOVERY_TOKEN's identity; remove the file or unset DISCOVERY_TOKEN"
    )]
    DefaultTaken { file: String },
    #[error("crawler tokens file {file:?} is empty: its token must not be")]
    EmptyToken { file: String },
    #[error("crawler tokens file {file:?} is not UTF-8 text")]
    NotText { file: String },
    #[error("crawler tokens file {file:?} holds the same token as {other:?}: each identity needs its own")]
    SameToken { file: String, other: String },
    #[error(
        "crawler tokens file {file:?} holds DISCOVERY_READ_TOKEN: the read-only token must differ from every crawler token"
    )]
    ReadToken { file: String },
}

/// One identity: its name and token.
#[derive(Clone, PartialEq, Eq)]
struct Entry {
    name: String,
    token: String,
}

/// The configured identities. Without any (and not [`Identities::closed`]):
/// open, everyone is [`ANONYMOUS_IDENTITY`].
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Identities {
    entries: Vec<Entry>,
    /// Tokens are demanded even when none is configured (a tokens
    /// directory is given but empty): nobody gets in, never open.
    closed: bool,
}

/// Never prints a token.
impl std::fmt::Debug for Identities {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Identities")
            .field("names", &self.names().collect::<Vec<_>>())
            .field("closed", &self.closed)
            .finish()
    }
}

/// Whether `name` may name an identity: DNS-label-like, at most
/// [`MAX_NAME_LEN`] bytes.
pub fn valid_name(name: &str) -> bool {
    let edge = |c: Option<char>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    (1..=MAX_NAME_LEN).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && edge(name.chars().next())
        && edge(name.chars().last())
}

impl Identities {
    /// No tokens: everyone is [`ANONYMOUS_IDENTITY`].
    pub fn open() -> Self {
        Self::default()
    }

    /// The identities of a tokens directory's files (`(file name,
    /// content)`; content trimmed) and of `DISCOVERY_TOKEN` (`legacy`, as
    /// [`DEFAULT_IDENTITY`]), checked against `DISCOVERY_READ_TOKEN`
    /// (`reader`). `from_directory`: a tokens directory is configured, so
    /// tokens are demanded even while it holds none.
    pub fn build(
        files: Vec<(String, Vec<u8>)>,
        legacy: Option<&str>,
        reader: Option<&str>,
        from_directory: bool,
    ) -> Result<Self, IdentityError> {
        let mut entries: Vec<Entry> = Vec::new();
        if let Some(token) = legacy.filter(|t| !t.is_empty()) {
            entries.push(Entry {
                name: DEFAULT_IDENTITY.to_owned(),
                token: token.to_owned(),
            });
        }
        let mut files = files;
        files.sort();
        for (file, content) in files {
            if file == ANONYMOUS_IDENTITY {
                return Err(IdentityError::Reserved { file });
            }
            if !valid_name(&file) {
                return Err(IdentityError::BadName { file });
            }
            if file == DEFAULT_IDENTITY && legacy.is_some_and(|t| !t.is_empty()) {
                return Err(IdentityError::DefaultTaken { file });
            }
            let Ok(text) = String::from_utf8(content) else {
                return Err(IdentityError::NotText { file });
            };
            let token = text.trim();
            if token.is_empty() {
                return Err(IdentityError::EmptyToken { file });
            }
            if reader.is_some_and(|r| r == token) {
                return Err(IdentityError::ReadToken { file });
            }
            if let Some(other) = entries.iter().find(|e| e.token == token) {
                let other = if other.name == DEFAULT_IDENTITY && legacy.is_some() {
                    "DISCOVERY_TOKEN".to_owned()
                } else {
                    other.name.clone()
                };
                return Err(IdentityError::SameToken { file, other });
            }
            entries.push(Entry {
                name: file,
                token: token.to_owned(),
            });
        }
        Ok(Self {
            entries,
            closed: from_directory,
        })
    }

    /// Whether no token is demanded: everyone is [`ANONYMOUS_IDENTITY`].
    pub fn is_open(&self) -> bool {
        self.entries.is_empty() && !self.closed
    }

    /// The identity whose token `presented` is, if any. Every token is
    /// compared, in constant time: neither the time nor the order of the
    /// identities reveals how much of a guess was right or which one
    /// nearly matched.
    pub fn identify(&self, presented: &[u8]) -> Option<&str> {
        let mut found = u64::MAX;
        for (i, entry) in self.entries.iter().enumerate() {
            let hit = presented.ct_eq(entry.token.as_bytes());
            found.conditional_assign(&(i as u64), hit);
        }
        usize::try_from(found)
            .ok()
            .and_then(|i| self.entries.get(i))
            .map(|e| e.name.as_str())
    }

    /// The identity of a request presenting `presented` (none: no token):
    /// [`ANONYMOUS_IDENTITY`] when open, otherwise the token's identity.
    pub fn authenticate(&self, presented: Option<&[u8]>) -> Option<&str> {
        if self.is_open() {
            return Some(ANONYMOUS_IDENTITY);
        }
        presented.and_then(|p| self.identify(p))
    }

    /// The names, sorted (`default` first if present).
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.entries.iter().map(|e| e.name.as_str())
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// The identities in force, replaced whole when the tokens directory
/// changes; readers take the current set without waiting for a reload.
#[derive(Clone, Debug, Default)]
pub struct SharedIdentities(Arc<RwLock<Arc<Identities>>>);

impl SharedIdentities {
    pub fn new(identities: Identities) -> Self {
        Self(Arc::new(RwLock::new(Arc::new(identities))))
    }

    /// The set in force now.
    pub fn current(&self) -> Arc<Identities> {
        // A panic elsewhere cannot leave an Arc half-written.
        self.0
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Puts `identities` in force for every later request.
    pub fn replace(&self, identities: Identities) {
        *self.0.write().unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(identities);
    }
}

#[cfg(test)]
mod tests;
