//! Plain-HTTP forwarding: one absolute-form request sent on through the
//! pooled client, its response relayed back.

use http::{Request, Response, StatusCode, Version};
use hyper::body::Incoming;

use super::Proxy;
use super::answers::{answer, connect_error_in, status_of_connect_error};
use super::body::ProxyBody;
use super::request::{drop_hop_by_hop, forwarded_headers};
use crate::adapters::guarded_listener::InFlight;

impl Proxy {
    pub(super) async fn forward(
        &self,
        request: Request<Incoming>,
        uri: http::Uri,
        host: http::HeaderValue,
        in_flight: InFlight,
    ) -> Response<ProxyBody> {
        let (mut parts, body) = request.into_parts();
        // hyper let through only `chunked` (the guard refused any other coding).
        let chunked = parts.headers.contains_key(http::header::TRANSFER_ENCODING);
        forwarded_headers(&mut parts.headers, host, chunked);
        parts.uri = uri;
        parts.version = Version::HTTP_11;
        // The client side's extensions (its upgrade) are not the upstream's.
        parts.extensions = http::Extensions::new();
        let sent = self.client.request(Request::from_parts(parts, body));
        let received = tokio::select! {
            received = sent => received,
            () = in_flight.slot().stalled(self.idle_timeout, None) => {
                tracing::debug!("no response head within the idle timeout");
                return answer(StatusCode::GATEWAY_TIMEOUT, false, in_flight);
            }
        };
        match received {
            Ok(response) if response.status() == StatusCode::SWITCHING_PROTOCOLS => {
                // The upgrade was not passed on; a 101 would hand over a connection we do not relay.
                tracing::debug!("upstream switched protocols unasked");
                answer(StatusCode::BAD_GATEWAY, true, in_flight)
            }
            Ok(response) => {
                let (mut parts, body) = response.into_parts();
                drop_hop_by_hop(&mut parts.headers);
                Response::from_parts(parts, ProxyBody::relayed(body, in_flight))
            }
            Err(e) => match connect_error_in(&e) {
                Some(connect) => {
                    tracing::info!(error = %connect, "destination not reached");
                    answer(status_of_connect_error(connect), false, in_flight)
                }
                None => {
                    tracing::debug!(error = %e, "upstream request failed");
                    answer(StatusCode::BAD_GATEWAY, false, in_flight)
                }
            },
        }
    }
}
