//! Proxy credentials: the username and password a Managed proxy demands in
//! `Proxy-Authorization` (Basic), generated per instance from randomness handed
//! in ([`RandomSource`]: the operating system's CSPRNG). The password is a secret: `Debug` never shows it, and
//! nothing here logs it.

mod basic;
mod cloud_init;
mod htpasswd;
mod random;
mod realm;

use std::fmt;

pub use basic::BasicAuthorization;
pub use cloud_init::{HTPASSWD_PLACEHOLDER, REALM_PLACEHOLDER, names_realm, substitute_placeholders};
pub use htpasswd::{Salt, htpasswd_line};
pub use random::RandomSource;
pub use realm::{SHARED_REALM, realm_of};

/// Random bytes in a generated username (hex-encoded after a letter).
const USERNAME_BYTES: usize = 6;
/// Random bytes in a generated password (hex-encoded: 192 bits).
const PASSWORD_BYTES: usize = 24;

/// Working with credentials failed.
#[derive(Debug, thiserror::Error)]
pub enum CredentialsError {
    #[error("the operating system's random number generator failed: {0}")]
    Random(String),
    #[error("hashing the proxy password failed: {0}")]
    Hash(String),
    #[error("credentials file {path}: {reason}")]
    File { path: String, reason: String },
    #[error("{what} must not be empty")]
    Empty { what: &'static str },
    #[error("{what} must not contain ':' or control characters")]
    Unusable { what: &'static str },
}

/// A username and password for one proxy.
#[derive(Clone, PartialEq, Eq)]
pub struct ProxyCredentials {
    pub username: String,
    pub password: String,
}

// The password is a secret: show the username only.
impl fmt::Debug for ProxyCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProxyCredentials")
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .finish()
    }
}

impl ProxyCredentials {
    /// New random credentials: letters and digits only, so they fit a URL's
    /// user-info and a passwd file as they are.
    pub fn generate(random: &dyn RandomSource) -> Result<Self, CredentialsError> {
        Ok(Self {
            username: format!("u{}", random_hex(random, USERNAME_BYTES)?),
            password: random_hex(random, PASSWORD_BYTES)?,
        })
    }

    /// Credentials given by a user (an External proxy's Secret): checked so
    /// that they fit a Basic header.
    pub fn new(username: &str, password: &str) -> Result<Self, CredentialsError> {
        check("username", username)?;
        if password.is_empty() {
            return Err(CredentialsError::Empty { what: "password" });
        }
        if password.chars().any(char::is_control) {
            return Err(CredentialsError::Unusable { what: "password" });
        }
        Ok(Self {
            username: username.to_owned(),
            password: password.to_owned(),
        })
    }

    /// `url` (`scheme://host:port`) with these credentials as its user-info.
    /// Unusual characters are percent-encoded, as a URL requires.
    pub fn url_with_userinfo(&self, url: &str) -> Option<String> {
        let mut parsed = url::Url::parse(url).ok()?;
        parsed.set_username(&self.username).ok()?;
        parsed.set_password(Some(&self.password)).ok()?;
        let mut text = String::from(parsed);
        // `Url` adds a path; a proxy URL has none.
        if !url.ends_with('/') && text.ends_with('/') {
            text.pop();
        }
        Some(text)
    }

    /// The realm the `407` of a proxy demanding these credentials names
    /// ([`realm_of`]).
    pub fn realm(&self) -> String {
        realm_of(self)
    }

    /// The `Proxy-Authorization` value that presents these credentials.
    pub fn basic_authorization(&self) -> String {
        BasicAuthorization::of(self).header_value()
    }
}

fn check(what: &'static str, value: &str) -> Result<(), CredentialsError> {
    if value.is_empty() {
        return Err(CredentialsError::Empty { what });
    }
    if value.contains(':') || value.chars().any(char::is_control) {
        return Err(CredentialsError::Unusable { what });
    }
    Ok(())
}

fn random_hex(random: &dyn RandomSource, bytes: usize) -> Result<String, CredentialsError> {
    let mut buf = vec![0u8; bytes];
    random.fill(&mut buf)?;
    Ok(hex::encode(buf))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_credentials_are_random_and_url_safe() {
        let a = ProxyCredentials::generate(&crate::credentials::random::TestRandom).unwrap();
        let b = ProxyCredentials::generate(&crate::credentials::random::TestRandom).unwrap();
        assert_ne!(a.username, b.username);
        assert_ne!(a.password, b.password);
        assert_eq!(a.password.len(), 2 * PASSWORD_BYTES);
        assert!(
            a.username
                .chars()
                .chain(a.password.chars())
                .all(|c| c.is_ascii_alphanumeric())
        );
    }

    #[test]
    fn debug_never_shows_the_password() {
        let c = ProxyCredentials::generate(&crate::credentials::random::TestRandom).unwrap();
        let shown = format!("{c:?}");
        assert!(shown.contains(&c.username));
        assert!(!shown.contains(&c.password), "{shown}");
    }

    #[test]
    fn a_url_gets_the_credentials_as_user_info() {
        let c = ProxyCredentials::new("crawler", "p@ss word").unwrap();
        assert_eq!(
            c.url_with_userinfo("http://127.0.0.1:3128").unwrap(),
            "http://crawler:p%40ss%20word@127.0.0.1:3128"
        );
    }

    #[test]
    fn user_credentials_are_checked() {
        assert!(matches!(
            ProxyCredentials::new("", "x"),
            Err(CredentialsError::Empty { what: "username" })
        ));
        assert!(matches!(
            ProxyCredentials::new("a:b", "x"),
            Err(CredentialsError::Unusable { what: "username" })
        ));
        assert!(matches!(
            ProxyCredentials::new("a", ""),
            Err(CredentialsError::Empty { what: "password" })
        ));
    }
}
