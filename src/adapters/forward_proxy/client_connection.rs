//! One client connection of a proxy listener (the built-in forward proxy,
//! the gateway): hyper's HTTP/1 server with upgrades over the framing
//! guard, ended when the listener evicts the connection or its relay stalls.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpStream;

use super::body::ProxyBody;
use super::framing::{FramingGuard, MAX_HEAD, Verdicts};
use crate::guarded_listener::{ListenerSettings, Phase, Slot, Tracked};

/// The HTTP/1 server settings every proxy listener uses.
pub(crate) fn server(settings: &ListenerSettings) -> http1::Builder {
    let mut server = http1::Builder::new();
    server
        .timer(TokioTimer::new())
        .header_read_timeout(settings.header_read_timeout)
        .keep_alive(true)
        .title_case_headers(true)
        .max_buf_size(MAX_HEAD);
    server
}

/// Serves `stream` until it closes, is evicted, or relays nothing for
/// `idle_timeout`; `handle` answers each request, given the connection's
/// slot and the framing guard's verdicts.
pub(crate) async fn serve<H, F>(
    server: &http1::Builder,
    stream: TcpStream,
    peer: SocketAddr,
    slot: Arc<Slot>,
    idle_timeout: Duration,
    handle: H,
) where
    H: Fn(Request<Incoming>, Arc<Slot>, Verdicts) -> F + Send + 'static,
    F: Future<Output = Response<ProxyBody>> + Send + 'static,
{
    if let Err(e) = stream.set_nodelay(true) {
        tracing::debug!(%peer, error = %e, "TCP_NODELAY not set on a client connection");
    }
    let verdicts = Verdicts::default();
    let io = TokioIo::new(FramingGuard::new(
        Tracked::new(stream, slot.clone()),
        verdicts.clone(),
    ));
    let service = {
        let slot = slot.clone();
        service_fn(move |request| {
            let answer = handle(request, slot.clone(), verdicts.clone());
            async move { Ok::<_, Infallible>(answer.await) }
        })
    };
    let connection = server.serve_connection(io, service).with_upgrades();
    tokio::pin!(connection);
    let ended = tokio::select! {
        ended = connection.as_mut() => ended,
        () = slot.evicted() => {
            tracing::debug!(%peer, "idle connection closed to make room");
            if slot.phase() == Phase::Idle {
                return;
            }
            connection.as_mut().graceful_shutdown();
            connection.await
        }
        () = slot.stalled(idle_timeout, Some(Phase::Relaying)) => {
            return tracing::debug!(%peer, "nothing relayed for the idle timeout; connection closed");
        }
    };
    if let Err(e) = ended {
        tracing::debug!(%peer, error = %e, "client connection ended with an error");
    }
}
