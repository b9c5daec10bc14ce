//! What the gateway keeps from crawlers about the proxies behind it (pure).
//! A relayed response loses the headers a proxy adds to name itself
//! (Squid's `X-Cache: MISS from <host>`, `X-Cache-Lookup: ... from
//! <host>:<port>`, `Via`); a response the proxy wrote itself (an error page
//! naming its host and version in headers and body) is not relayed at all:
//! the gateway answers in its place.

use http::StatusCode;
use http::header::{self, HeaderMap, HeaderName};

/// Squid marks every error page it writes with this header.
const SQUID_ERROR: HeaderName = HeaderName::from_static("x-squid-error");
/// RFC 9209: a proxy's own answer (the built-in proxy sends it on its 5xx).
const PROXY_STATUS: HeaderName = HeaderName::from_static("proxy-status");

/// Headers naming a proxy in the path, dropped from every relayed response.
/// A site's own `Via` or `X-Cache` (a CDN's) goes with them: which hop
/// added them cannot be told apart.
const NAMING_PROXIES: [HeaderName; 4] = [
    HeaderName::from_static("x-cache"),
    HeaderName::from_static("x-cache-lookup"),
    header::VIA,
    SQUID_ERROR,
];

/// Drops the headers that name an upstream proxy.
pub fn strip_proxy_headers(headers: &mut HeaderMap) {
    for name in &NAMING_PROXIES {
        headers.remove(name);
    }
}

/// Who wrote a response the leased proxy returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Author {
    /// The site (or whatever is behind the proxy): relayed.
    Site,
    /// The proxy failed to reach the site (its own 5xx): another proxy may.
    ProxyFailure,
    /// The proxy refused the destination itself (its own 403).
    ProxyRefusal,
    /// Any other answer of the proxy's own (a 4xx about the request).
    ProxyOther,
}

/// Who wrote a response with `status` and `headers`. Squid's pages carry
/// `X-Squid-Error` whatever their status; `Proxy-Status` counts on a 5xx
/// only, where it says the proxy failed (a site's CDN may send it on its
/// own answers).
pub fn author(status: StatusCode, headers: &HeaderMap) -> Author {
    let squid = headers.contains_key(SQUID_ERROR);
    if status.is_server_error() && (squid || headers.contains_key(PROXY_STATUS)) {
        return Author::ProxyFailure;
    }
    match (squid, status) {
        (false, _) => Author::Site,
        (true, StatusCode::FORBIDDEN) => Author::ProxyRefusal,
        (true, _) => Author::ProxyOther,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(HeaderName::from_static(name), HeaderValue::from_static(value));
        }
        map
    }

    #[test]
    fn the_headers_naming_a_proxy_are_dropped_and_the_rest_kept() {
        let mut map = headers(&[
            ("x-cache", "MISS from vm"),
            ("x-cache-lookup", "MISS from vm:33425"),
            ("via", "1.1 vm (squid/5.7)"),
            ("via", "1.1 other"),
            ("x-squid-error", "ERR_CONNECT_FAIL 111"),
            ("server", "nginx"),
            ("content-type", "text/html"),
            ("x-cache-status", "HIT"),
        ]);
        strip_proxy_headers(&mut map);
        let mut left: Vec<String> = map
            .iter()
            .map(|(n, v)| format!("{n}: {}", v.to_str().unwrap()))
            .collect();
        left.sort();
        assert_eq!(
            left,
            ["content-type: text/html", "server: nginx", "x-cache-status: HIT"]
        );
    }

    #[test]
    fn each_response_has_its_author() {
        let squid = headers(&[("x-squid-error", "ERR_ACCESS_DENIED 0"), ("server", "squid")]);
        let proxy_status = headers(&[("proxy-status", "egress-proxies; error=destination_unavailable")]);
        let site = headers(&[("server", "nginx")]);
        for (status, map, want) in [
            (200, &site, Author::Site),
            (403, &site, Author::Site),
            (503, &site, Author::Site),
            (403, &squid, Author::ProxyRefusal),
            (400, &squid, Author::ProxyOther),
            (503, &squid, Author::ProxyFailure),
            (502, &proxy_status, Author::ProxyFailure),
            (504, &proxy_status, Author::ProxyFailure),
            // A CDN's Proxy-Status on a site's answer.
            (200, &proxy_status, Author::Site),
            (403, &proxy_status, Author::Site),
        ] {
            let status = StatusCode::from_u16(status).unwrap();
            assert_eq!(author(status, map), want, "{status} {map:?}");
        }
    }
}
