//! The realm a `407`'s challenge names (pure): how the gateway tells a
//! leased proxy's own `407` (its realm is known) from a site's.

use http::HeaderMap;
use http::header::PROXY_AUTHENTICATE;

/// The realm of the first `Proxy-Authenticate: Basic realm="..."` challenge.
pub fn challenge_realm(headers: &HeaderMap) -> Option<String> {
    headers.get_all(PROXY_AUTHENTICATE).iter().find_map(|value| {
        let value = value.to_str().ok()?.trim();
        let (scheme, params) = value.split_once(' ').unwrap_or((value, ""));
        if !scheme.eq_ignore_ascii_case("basic") {
            return None;
        }
        let (name, rest) = params.trim().split_once('=')?;
        if !name.trim().eq_ignore_ascii_case("realm") {
            return None;
        }
        let rest = rest.trim();
        match rest.strip_prefix('"') {
            Some(quoted) => {
                let mut realm = String::new();
                let mut chars = quoted.chars();
                while let Some(c) = chars.next() {
                    match c {
                        '"' => return Some(realm),
                        '\\' => realm.push(chars.next()?),
                        c => realm.push(c),
                    }
                }
                None
            }
            None => Some(rest.split([',', ' ']).next().unwrap_or_default().to_owned()),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn the_realm_of_a_basic_challenge() {
        let realm = |value: &'static str| {
            let mut headers = HeaderMap::new();
            headers.insert(PROXY_AUTHENTICATE, HeaderValue::from_static(value));
            challenge_realm(&headers)
        };
        assert_eq!(realm(r#"Basic realm="egress-proxies-1a2b""#).as_deref(), Some("egress-proxies-1a2b"));
        assert_eq!(realm(r#"basic realm="a \"b\"""#).as_deref(), Some(r#"a "b""#));
        assert_eq!(realm("Basic realm=token").as_deref(), Some("token"));
        assert_eq!(realm(r#"Digest realm="x""#), None);
        assert_eq!(realm(r#"Basic realm="unterminated"#), None);
        assert_eq!(challenge_realm(&HeaderMap::new()), None);
    }
}
