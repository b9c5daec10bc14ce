//! The gateway's own answers: a refusal (its status, the reason header,
//! `Retry-After` when waiting helps), and the headers that tell the
//! crawler which proxy and lease served it.

use http::HeaderMap;
use http::Response;
use http::header::{self, HeaderName, HeaderValue};

use super::log::Exchange;
use crate::adapters::forward_proxy::answers::{answer, authentication_required};
use crate::adapters::forward_proxy::body::ProxyBody;
use crate::adapters::gateway::{
    BLOCKED_HEADER, GatewayError, LEASE_HEADER, PROXY_HEADER, REASON_HEADER, SESSION_MOVED_HEADER, Upstream,
};
use crate::adapters::guarded_listener::InFlight;

/// The headers that tell the crawler which proxy and lease served it.
pub(super) fn describe(headers: &mut HeaderMap, upstream: &Upstream, exchange: &Exchange, blocked: bool) {
    let mut set = |name: &'static str, value: &str| {
        if let Ok(value) = HeaderValue::from_str(value) {
            headers.insert(HeaderName::from_static(name), value);
        }
    };
    set(PROXY_HEADER, &upstream.proxy.to_string());
    set(LEASE_HEADER, &upstream.lease_id);
    if exchange.session_moved {
        set(SESSION_MOVED_HEADER, "true");
    }
    if blocked {
        set(BLOCKED_HEADER, "true");
    }
}

/// The gateway's own answer to a failure; the exchange records it. `close`
/// (a tunnel's refusal, a client body that failed, or a connection that
/// never authenticated and sent a large head) ends the connection after it.
pub(super) fn refusal(
    e: &GatewayError,
    exchange: &mut Exchange,
    close: bool,
    in_flight: InFlight,
) -> Response<ProxyBody> {
    exchange.refused(e.status().as_u16(), e.reason());
    // No capacity and refused credentials are routine: the access line says enough.
    if matches!(
        e,
        GatewayError::NoProxy { .. }
            | GatewayError::AuthenticationRequired
            | GatewayError::RateLimited { .. }
    ) {
        tracing::debug!(peer = %exchange.peer, status = e.status().as_u16(), reason = e.reason(), error = %e, "gateway request not served");
    } else {
        tracing::info!(peer = %exchange.peer, status = e.status().as_u16(), reason = e.reason(), error = %e, "gateway request not served");
    }
    if matches!(e, GatewayError::AuthenticationRequired) {
        return authentication_required(close, in_flight);
    }
    // After a failed CONNECT or lost framing the client's next bytes are not a request.
    let close = close || matches!(e, GatewayError::Framing(_));
    let mut response = answer(e.status(), close, in_flight);
    let headers = response.headers_mut();
    headers.insert(REASON_HEADER, HeaderValue::from_static(e.reason()));
    if let Some(seconds) = e.retry_after() {
        headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
    }
    response
}
