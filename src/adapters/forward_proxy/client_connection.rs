//! One client connection of a proxy listener (the built-in forward proxy,
//! the gateway): hyper's HTTP/1 server with upgrades over the framing
//! guard, set up once the first request head is complete, ended when the
//! listener evicts the connection or its relay stalls.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpStream;

use super::body::ProxyBody;
use super::framing::{FramingGuard, MAX_HEAD, Verdicts};
use crate::adapters::guarded_listener::{ListenerSettings, Phase, Slot, Tracked};

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
/// `settings.idle_timeout`; `handle` answers each request, given the
/// connection's slot and the framing guard's verdicts. hyper's connection
/// (its state and buffers) is set up only once the first request head is
/// complete: a connection that sends nothing or an unfinished head holds
/// only the guard and what its head allowance lets it hold.
pub(crate) async fn serve<H, F>(
    server: &http1::Builder,
    stream: TcpStream,
    peer: SocketAddr,
    slot: Arc<Slot>,
    settings: &ListenerSettings,
    handle: H,
) where
    H: Fn(Request<Incoming>, Arc<Slot>, Verdicts) -> F + Send + 'static,
    F: Future<Output = Response<ProxyBody>> + Send + 'static,
{
    if let Err(e) = stream.set_nodelay(true) {
        tracing::debug!(%peer, error = %e, "TCP_NODELAY not set on a client connection");
    }
    let verdicts = Verdicts::default();
    let mut guard = FramingGuard::new(
        Tracked::new(stream, slot.clone()),
        verdicts.clone(),
        slot.clone(),
        peer,
    );
    let first_head = tokio::time::timeout(
        settings.header_read_timeout,
        std::future::poll_fn(|cx| guard.poll_first_head(cx)),
    );
    tokio::select! {
        first = first_head => match first {
            Ok(Ok(true)) => {}
            Ok(Ok(false)) => return,
            Ok(Err(e)) => return tracing::debug!(%peer, error = %e, "client connection ended with an error"),
            Err(_) => return tracing::debug!(%peer, "no complete request head within the header-read timeout; connection closed"),
        },
        () = slot.evicted() => return tracing::debug!(%peer, "idle connection closed to make room"),
    }
    let io = TokioIo::new(guard);
    let idle_timeout = settings.idle_timeout;
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
