//! The realm a `407` names. Every proxy the operator creates names a realm
//! of its own (`credentials::realm_of`), which a site cannot know; the
//! gateway compares what a `407` names with the realm of the proxy it went
//! through ([`super::Upstream::realm`]) to tell the proxy refusing its
//! credentials from a site answering `407` itself.

use http::HeaderMap;
use http::header::PROXY_AUTHENTICATE;

/// The realm of the first `Basic` challenge in the `Proxy-Authenticate`
/// headers (RFC 9110 §11.6.1; the scheme and the parameter name compared
/// case-insensitively, a quoted realm unescaped, a token realm as it is).
/// `None` without one; a header that stops parsing counts up to where it
/// does.
pub fn challenge_realm(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(PROXY_AUTHENTICATE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .find_map(basic_realm)
}

/// The realm of the first `Basic` challenge in one header value.
fn basic_realm(value: &str) -> Option<String> {
    http_auth::parser::ChallengeParser::new(value)
        .map_while(Result::ok)
        .filter(|challenge| challenge.scheme.eq_ignore_ascii_case("basic"))
        .find_map(|challenge| {
            challenge
                .params
                .iter()
                .find(|(name, _)| name.eq_ignore_ascii_case("realm"))
                .map(|(_, value)| value.to_unescaped())
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn headers(values: &[&str]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for value in values {
            map.append(PROXY_AUTHENTICATE, HeaderValue::from_str(value).unwrap());
        }
        map
    }

    #[test]
    fn the_realm_of_a_basic_challenge() {
        for (values, want) in [
            // What Squid and the built-in proxy send.
            (
                &["Basic realm=\"egress-proxies-0123abcd\""][..],
                Some("egress-proxies-0123abcd"),
            ),
            // The scheme and the parameter name are case-insensitive.
            (&["basic REALM=\"r\""], Some("r")),
            (&["BASIC Realm=\"r\""], Some("r")),
            // Whitespace around `=` (BWS) and other parameters.
            (&["Basic charset=\"UTF-8\", realm = \"r\""], Some("r")),
            // A token instead of a quoted string.
            (&["Basic realm=r-1"], Some("r-1")),
            // Quoted pairs are unescaped; a comma inside quotes is the realm's.
            (&["Basic realm=\"a\\\"b\\\\c, d\""], Some("a\"b\\c, d")),
            (&["Basic realm=\"\""], Some("")),
            // Among several challenges in one value, the Basic one.
            (&["Digest realm=\"d\", nonce=\"n\", Basic realm=\"b\""], Some("b")),
            (&["Negotiate, Basic realm=\"b\""], Some("b")),
            // Across several headers, the first Basic challenge.
            (&["Digest realm=\"d\"", "Basic realm=\"b\""], Some("b")),
            (
                &["Basic realm=\"first\"", "Basic realm=\"second\""],
                Some("first"),
            ),
            // No Basic challenge, or no realm in it.
            (&["Digest realm=\"d\""], None),
            (&["Basic"], None),
            (&["Basic charset=\"UTF-8\""], None),
            (&["Bearer realm=\"b\""], None),
            (&[], None),
            // A scheme that merely starts with "Basic" is another scheme.
            (&["Basically realm=\"x\""], None),
            // Unparseable: an unterminated quote, a token68 challenge.
            (&["Basic realm=\"open"], None),
            (&["Negotiate abc=="], None),
            // A challenge parsed before a broken one still counts.
            (&["Basic realm=\"b\", Negotiate abc=="], Some("b")),
        ] {
            assert_eq!(challenge_realm(&headers(values)).as_deref(), want, "{values:?}");
        }
    }

    #[test]
    fn only_proxy_authenticate_counts() {
        let mut map = HeaderMap::new();
        map.insert(
            http::header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Basic realm=\"site\""),
        );
        assert_eq!(challenge_realm(&map), None, "a site's own challenge to its users");
    }
}
