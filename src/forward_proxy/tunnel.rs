//! `CONNECT` tunnels: the checked connection to the target, `200`, then
//! bytes relayed both ways until either side closes or nothing moves for
//! the idle timeout. Only a `CONNECT` opens one.

use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::ext::ReasonPhrase;
use hyper_util::rt::TokioIo;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};

use super::Proxy;
use super::answers::{answer, status_of_connect_error};
use super::body::ProxyBody;
use crate::guarded_listener::{InFlight, Phase};

impl Proxy {
    pub(super) async fn tunnel(
        &self,
        request: Request<Incoming>,
        host: &str,
        port: u16,
        in_flight: InFlight,
    ) -> Response<ProxyBody> {
        let upstream = match self.connector.connect(host, port, true).await {
            Ok(upstream) => upstream,
            Err(e) => {
                tracing::info!(error = %e, "destination not reached");
                return answer(status_of_connect_error(&e), true, in_flight);
            }
        };
        splice(
            hyper::upgrade::on(request),
            upstream,
            in_flight,
            self.idle_timeout,
            None,
        );
        established()
    }
}

/// The `200 Connection established` that opens a tunnel.
pub fn established() -> Response<ProxyBody> {
    let mut response = Response::new(ProxyBody::empty(None));
    *response.status_mut() = StatusCode::OK;
    response
        .extensions_mut()
        .insert(ReasonPhrase::from_static(b"Connection established"));
    response
}

/// Relays bytes between the client's connection (once hyper hands it over
/// after the `200`) and `upstream` until either side closes or nothing
/// moves for `idle_timeout`; `held` (a gateway's lease) is dropped then.
pub fn splice<U>(
    upgrade: hyper::upgrade::OnUpgrade,
    mut upstream: U,
    in_flight: InFlight,
    idle_timeout: Duration,
    held: Option<Box<dyn Send + Sync>>,
) where
    U: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    tokio::spawn(async move {
        let _held = held;
        in_flight.relaying();
        let client = match upgrade.await {
            Ok(client) => client,
            Err(e) => return tracing::debug!(error = %e, "CONNECT's connection not handed over"),
        };
        let mut client = TokioIo::new(client);
        tokio::select! {
            relayed = super::relay::relay(&mut client, &mut upstream) => {
                if let Err(e) = relayed {
                    tracing::debug!(error = %e, "tunnel ended with an error");
                }
            }
            () = in_flight.slot().stalled(idle_timeout, Some(Phase::Relaying)) => {
                tracing::debug!("tunnel idle for the idle timeout; closed");
            }
        }
    });
}
