//! Basic proxy authentication (`Proxy-Authorization: Basic <base64>`).

use data_encoding::BASE64;
use subtle::ConstantTimeEq;

use super::ProxyCredentials;

/// The token a client presents for some credentials.
pub struct BasicAuthorization {
    token: String,
}

impl BasicAuthorization {
    pub fn of(credentials: &ProxyCredentials) -> Self {
        let pair = format!("{}:{}", credentials.username, credentials.password);
        Self {
            token: BASE64.encode(pair.as_bytes()),
        }
    }

    /// `Basic <token>`, the header value.
    pub fn header_value(&self) -> String {
        format!("Basic {}", self.token)
    }

    /// Whether a `Proxy-Authorization` value presents these credentials. The
    /// token is compared in constant time, so timing tells a guesser nothing.
    pub fn admits(&self, header: &[u8]) -> bool {
        let header = header.trim_ascii();
        let Some(space) = header.iter().position(|b| *b == b' ') else {
            return false;
        };
        let (scheme, token) = header.split_at(space);
        scheme.eq_ignore_ascii_case(b"basic") && bool::from(token.trim_ascii().ct_eq(self.token.as_bytes()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admits_only_the_right_token() {
        let c = ProxyCredentials::new("crawler", "secret").unwrap();
        let auth = BasicAuthorization::of(&c);
        assert_eq!(auth.header_value(), "Basic Y3Jhd2xlcjpzZWNyZXQ=");
        assert!(auth.admits(b"Basic Y3Jhd2xlcjpzZWNyZXQ="));
        assert!(auth.admits(b"basic  Y3Jhd2xlcjpzZWNyZXQ= "));
        let wrong = ProxyCredentials::new("crawler", "secreT").unwrap();
        assert!(!auth.admits(BasicAuthorization::of(&wrong).header_value().as_bytes()));
        assert!(!auth.admits(b"Bearer Y3Jhd2xlcjpzZWNyZXQ="));
        assert!(!auth.admits(b""));
    }
}
