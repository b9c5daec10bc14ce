//! The proxy's own answers: refusals and failures, each with an empty body.

use http::header::{self, HeaderValue};
use http::{Response, StatusCode};
use hyper_util::client::legacy;

use super::body::ProxyBody;
use crate::adapters::checked_connect::CheckedConnectError;
use crate::adapters::guarded_listener::InFlight;

/// The `Proxy-Authenticate` challenge of a listener without a realm of its
/// own (the gateway's, to crawlers).
const SHARED_CHALLENGE: &str = "Basic realm=\"egress-proxies\"";

/// The `Proxy-Authenticate` challenge naming `realm` (a proxy's own, see
/// [`crate::domain::credentials::realm_of`]: letters, digits and `-`, nothing to
/// escape); the shared one if `realm` cannot be a header value.
pub fn challenge_naming(realm: &str) -> HeaderValue {
    HeaderValue::from_str(&format!("Basic realm=\"{realm}\""))
        .unwrap_or(HeaderValue::from_static(SHARED_CHALLENGE))
}

/// An empty answer; `close` ends the connection after it (the client's
/// next bytes cannot be trusted to start a request, or are a tunnel's).
pub fn answer(status: StatusCode, close: bool, request: InFlight) -> Response<ProxyBody> {
    let mut response = Response::new(ProxyBody::empty(Some(request)));
    *response.status_mut() = status;
    if close {
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    // RFC 9209: says the failure is the proxy's answer, not the site's (a
    // gateway in front tries another proxy on seeing it).
    let error = match status {
        StatusCode::BAD_GATEWAY => Some("destination_unavailable"),
        StatusCode::GATEWAY_TIMEOUT => Some("connection_timeout"),
        s if s.is_server_error() => Some("proxy_internal_error"),
        _ => None,
    };
    if let Some(error) = error {
        let value = format!("egress-proxies; error={error}");
        if let Ok(value) = HeaderValue::from_str(&value) {
            response.headers_mut().insert("proxy-status", value);
        }
    }
    response
}

/// 407 with the shared `Proxy-Authenticate` challenge.
pub fn authentication_required(close: bool, request: InFlight) -> Response<ProxyBody> {
    challenge(HeaderValue::from_static(SHARED_CHALLENGE), close, request)
}

/// 407 with the `Proxy-Authenticate` challenge `challenge` (from
/// [`challenge_naming`]).
pub fn challenge(challenge: HeaderValue, close: bool, request: InFlight) -> Response<ProxyBody> {
    let mut response = answer(StatusCode::PROXY_AUTHENTICATION_REQUIRED, close, request);
    response
        .headers_mut()
        .insert(header::PROXY_AUTHENTICATE, challenge);
    response
}

/// 403 for a refused destination, 504 when connecting timed out, 502 when
/// it could not be reached.
pub fn status_of_connect_error(e: &CheckedConnectError) -> StatusCode {
    match e {
        CheckedConnectError::Refused { .. } => StatusCode::FORBIDDEN,
        CheckedConnectError::TimedOut { .. } => StatusCode::GATEWAY_TIMEOUT,
        _ => StatusCode::BAD_GATEWAY,
    }
}

/// The connect error inside a client error, if it is one.
pub fn connect_error_in(e: &legacy::Error) -> Option<&CheckedConnectError> {
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        if let Some(connect) = cause.downcast_ref::<CheckedConnectError>() {
            return Some(connect);
        }
        source = cause.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adapters::guarded_listener::ConnectionSlots;

    #[test]
    fn the_proxy_s_own_failures_say_so_with_proxy_status() {
        let slots = ConnectionSlots::new(1);
        let slot = slots.admit(slots.try_reserve().unwrap());
        let status_of = |status: StatusCode| {
            answer(status, false, slot.in_flight())
                .headers()
                .get("proxy-status")
                .map(|v| v.to_str().unwrap().to_owned())
        };
        assert_eq!(
            status_of(StatusCode::BAD_GATEWAY).as_deref(),
            Some("egress-proxies; error=destination_unavailable")
        );
        assert_eq!(
            status_of(StatusCode::GATEWAY_TIMEOUT).as_deref(),
            Some("egress-proxies; error=connection_timeout")
        );
        assert_eq!(
            status_of(StatusCode::FORBIDDEN),
            None,
            "a refusal is not a failure"
        );
    }

    #[test]
    fn a_challenge_names_the_realm_it_is_given() {
        assert_eq!(
            challenge_naming("egress-proxies-0123abcd"),
            "Basic realm=\"egress-proxies-0123abcd\""
        );
        assert_eq!(
            challenge_naming("bad\nrealm"),
            SHARED_CHALLENGE,
            "never a header that cannot be sent"
        );
    }
}
