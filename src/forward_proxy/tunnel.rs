//! `CONNECT` tunnels: the checked connection to the target, `200`, then
//! bytes relayed both ways until either side closes or nothing moves for
//! the idle timeout. Only a `CONNECT` opens one.

use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::ext::ReasonPhrase;
use hyper_util::rt::TokioIo;

use super::Proxy;
use super::answers::{answer, status_of_connect_error};
use super::body::ProxyBody;
use crate::guarded_listener::{InFlight, Phase};

/// Buffer per direction.
const RELAY_BUFFER: usize = 16 * 1024;

impl Proxy {
    pub(super) async fn tunnel(
        &self,
        request: Request<Incoming>,
        host: &str,
        port: u16,
        in_flight: InFlight,
    ) -> Response<ProxyBody> {
        let mut upstream = match self.connector.connect(host, port, true).await {
            Ok(upstream) => upstream,
            Err(e) => {
                tracing::info!(error = %e, "destination not reached");
                return answer(status_of_connect_error(&e), true, in_flight);
            }
        };
        let upgrade = hyper::upgrade::on(request);
        let idle_timeout = self.idle_timeout;
        tokio::spawn(async move {
            in_flight.relaying();
            let client = match upgrade.await {
                Ok(client) => client,
                Err(e) => return tracing::debug!(error = %e, "CONNECT's connection not handed over"),
            };
            let mut client = TokioIo::new(client);
            tokio::select! {
                relayed = tokio::io::copy_bidirectional_with_sizes(&mut client, &mut upstream, RELAY_BUFFER, RELAY_BUFFER) => {
                    if let Err(e) = relayed {
                        tracing::debug!(error = %e, "tunnel ended with an error");
                    }
                }
                () = in_flight.slot().stalled(idle_timeout, Some(Phase::Relaying)) => {
                    tracing::debug!("tunnel idle for the idle timeout; closed");
                }
            }
        });
        let mut response = Response::new(ProxyBody::empty(None));
        *response.status_mut() = StatusCode::OK;
        response
            .extensions_mut()
            .insert(ReasonPhrase::from_static(b"Connection established"));
        response
    }
}
