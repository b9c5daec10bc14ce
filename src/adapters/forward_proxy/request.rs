//! What a client asked the proxy for, and the request the proxy sends on
//! (pure): the target of a `CONNECT` or of an absolute-form request, the
//! `Host` taken from the URL (RFC 9112 §3.2.2), the hop-by-hop headers
//! dropped (RFC 9110 §7.6.1).

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Uri};

/// Headers that concern one hop only, dropped in both directions (and
/// every header a `Connection` header names). The proxy frames each hop
/// itself; `Proxy-*` are for this proxy alone.
const HOP_BY_HOP: [HeaderName; 9] = [
    header::CONNECTION,
    HeaderName::from_static("proxy-connection"),
    HeaderName::from_static("keep-alive"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// Where a request goes.
#[derive(Debug, PartialEq, Eq)]
pub enum Target {
    /// `CONNECT host:port`: a tunnel.
    Tunnel { host: String, port: u16 },
    /// An absolute-form `http://` request: sent to `uri` (without any
    /// userinfo), with `host` as its `Host` header.
    Forward { uri: Uri, host: HeaderValue },
}

/// Why a request cannot be served (answered 400).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum TargetError {
    #[error("CONNECT needs a host:port target")]
    ConnectTarget,
    #[error("a proxy request needs an absolute URI (http://host/path)")]
    NotAbsolute,
    #[error("only http:// URIs are forwarded; https goes through CONNECT")]
    Scheme,
}

/// The target of a request with `method` and request-target `uri`.
pub fn target_of(method: &Method, uri: &Uri) -> Result<Target, TargetError> {
    if method == Method::CONNECT {
        let authority = uri
            .authority()
            .filter(|_| uri.scheme().is_none())
            .filter(|a| !a.as_str().contains('@'))
            .ok_or(TargetError::ConnectTarget)?;
        let port = authority.port_u16().ok_or(TargetError::ConnectTarget)?;
        return Ok(Target::Tunnel {
            host: authority.host().to_owned(),
            port,
        });
    }
    let (Some(scheme), Some(authority)) = (uri.scheme(), uri.authority()) else {
        return Err(TargetError::NotAbsolute);
    };
    if *scheme != http::uri::Scheme::HTTP {
        return Err(TargetError::Scheme);
    }
    let full = authority.as_str();
    // The Host header is the authority without userinfo.
    let host_port = full.rsplit_once('@').map_or(full, |(_, host_port)| host_port);
    if host_port.is_empty() || authority.host().is_empty() {
        return Err(TargetError::NotAbsolute);
    }
    let host = HeaderValue::from_str(host_port).map_err(|_| TargetError::NotAbsolute)?;
    let uri = if host_port.len() == full.len() {
        uri.clone()
    } else {
        let path = uri.path_and_query().map_or("/", |p| p.as_str());
        Uri::builder()
            .scheme(http::uri::Scheme::HTTP)
            .authority(host_port)
            .path_and_query(path)
            .build()
            .map_err(|_| TargetError::NotAbsolute)?
    };
    Ok(Target::Forward { uri, host })
}

/// Drops the hop-by-hop headers, those a `Connection` header names first.
pub fn drop_hop_by_hop(headers: &mut HeaderMap) {
    if headers.contains_key(header::CONNECTION) {
        let named: Vec<HeaderName> = headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
            .collect();
        for name in named {
            headers.remove(name);
        }
    }
    for name in &HOP_BY_HOP {
        headers.remove(name);
    }
}

/// The headers to send on: hop-by-hop ones dropped, `Host` from the URL,
/// and `Transfer-Encoding: chunked` again when the client's body was
/// chunked (the only transfer coding the proxy accepts; see `framing`):
/// its length is unknown, and the client side's framing was dropped.
pub fn forwarded_headers(headers: &mut HeaderMap, host: HeaderValue, chunked: bool) {
    drop_hop_by_hop(headers);
    headers.insert(header::HOST, host);
    if chunked {
        headers.insert(header::TRANSFER_ENCODING, HeaderValue::from_static("chunked"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uri(text: &str) -> Uri {
        text.parse().unwrap()
    }

    #[test]
    fn connect_targets_are_host_and_port() {
        assert_eq!(
            target_of(&Method::CONNECT, &uri("example.com:443")),
            Ok(Target::Tunnel {
                host: "example.com".into(),
                port: 443
            })
        );
        assert_eq!(
            target_of(&Method::CONNECT, &uri("[::1]:8443")),
            Ok(Target::Tunnel {
                host: "[::1]".into(),
                port: 8443
            })
        );
        for bad in [
            "example.com",
            "http://example.com:443",
            "user@example.com:443",
            "/path",
        ] {
            assert_eq!(
                target_of(&Method::CONNECT, &uri(bad)),
                Err(TargetError::ConnectTarget),
                "{bad}"
            );
        }
    }

    #[test]
    fn absolute_http_urls_give_the_host_header_without_userinfo() {
        let forward = |text: &str| match target_of(&Method::GET, &uri(text)) {
            Ok(Target::Forward { uri, host }) => (uri.to_string(), host.to_str().unwrap().to_owned()),
            other => panic!("{text}: {other:?}"),
        };
        assert_eq!(
            forward("http://example.com/a?b=c"),
            ("http://example.com/a?b=c".into(), "example.com".into())
        );
        assert_eq!(
            forward("http://127.0.0.1:8080/"),
            ("http://127.0.0.1:8080/".into(), "127.0.0.1:8080".into())
        );
        assert_eq!(
            forward("http://[::1]:81/x"),
            ("http://[::1]:81/x".into(), "[::1]:81".into())
        );
        assert_eq!(
            forward("http://user:secret@example.com:81/x?y"),
            ("http://example.com:81/x?y".into(), "example.com:81".into())
        );
    }

    #[test]
    fn other_request_targets_are_refused() {
        assert_eq!(
            target_of(&Method::GET, &uri("/path")),
            Err(TargetError::NotAbsolute)
        );
        assert_eq!(
            target_of(&Method::GET, &uri("https://example.com/")),
            Err(TargetError::Scheme)
        );
        assert_eq!(
            target_of(&Method::GET, &uri("ftp://example.com/")),
            Err(TargetError::Scheme)
        );
    }

    #[test]
    fn hop_by_hop_headers_and_those_connection_names_are_dropped() {
        let mut headers = HeaderMap::new();
        for (name, value) in [
            ("host", "client-chose-this"),
            ("connection", "keep-alive, X-Secret-Hop"),
            ("connection", "upgrade"),
            ("x-secret-hop", "1"),
            ("keep-alive", "timeout=5"),
            ("proxy-connection", "keep-alive"),
            ("proxy-authorization", "Basic c2VjcmV0"),
            ("te", "trailers"),
            ("trailer", "x-checksum"),
            ("transfer-encoding", "chunked"),
            ("upgrade", "websocket"),
            ("accept", "*/*"),
            ("content-length", "5"),
        ] {
            headers.append(HeaderName::from_static(name), HeaderValue::from_static(value));
        }
        forwarded_headers(&mut headers, HeaderValue::from_static("example.com"), false);
        let mut left: Vec<_> = headers
            .iter()
            .map(|(n, v)| format!("{n}: {}", v.to_str().unwrap()))
            .collect();
        left.sort();
        assert_eq!(left, ["accept: */*", "content-length: 5", "host: example.com"]);
    }

    #[test]
    fn a_chunked_body_is_sent_on_chunked() {
        let mut headers = HeaderMap::new();
        headers.insert(header::TRANSFER_ENCODING, HeaderValue::from_static("Chunked"));
        forwarded_headers(&mut headers, HeaderValue::from_static("example.com"), true);
        assert_eq!(headers[header::TRANSFER_ENCODING], "chunked");
    }
}
