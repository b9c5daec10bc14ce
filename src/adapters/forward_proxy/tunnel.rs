//! `CONNECT` tunnels: the checked connection to the target, `200`, then
//! bytes relayed both ways until either side closes or nothing moves for
//! the idle timeout. Only a `CONNECT` opens one.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::ext::ReasonPhrase;
use hyper::upgrade::{Parts, Upgraded};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt as _};
use tokio::net::TcpStream;

use super::Proxy;
use super::answers::{answer, status_of_connect_error};
use super::body::ProxyBody;
use super::framing::FramingGuard;
use super::relay;
use super::zero_copy::{self, End, Way};
use crate::adapters::guarded_listener::{InFlight, Phase, Slot, Tracked};

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
            Splice {
                idle_timeout: self.idle_timeout,
                ..Splice::default()
            },
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

/// Ends a tunnel early when it completes (a gateway lease taken back).
pub type Revoked = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// Counts a tunnel's bytes as they move: `(way, bytes)`, `Way::Forward`
/// being from the client towards the target.
pub type Tally = Arc<dyn Fn(Way, usize) + Send + Sync>;

/// A tunnel's upstream connection, relayed on its socket when it has one.
pub trait TunnelUpstream: AsyncRead + AsyncWrite + Unpin + Send + 'static + Sized {
    /// The socket underneath and the bytes already read from it, or the
    /// connection back when there is no socket to reach.
    fn into_end(self) -> Result<End, Self>;
}

impl TunnelUpstream for TcpStream {
    fn into_end(self) -> Result<End, Self> {
        Ok(End {
            socket: self,
            early: Bytes::new(),
        })
    }
}

/// The client connection's type under hyper, as every proxy listener builds it.
type ClientIo = TokioIo<FramingGuard<Tracked<TcpStream>>>;

/// How a tunnel is relayed, beyond its two ends.
#[derive(Default)]
pub struct Splice {
    /// Nothing moved for this long: the tunnel is closed.
    pub idle_timeout: Duration,
    /// Once one side has closed, the other gets at most this long (none:
    /// until it closes too, or the idle timeout).
    pub linger: Option<Duration>,
    /// Dropped when the tunnel ends (a gateway's lease and access record).
    pub held: Option<Box<dyn Send + Sync>>,
    pub tally: Option<Tally>,
    /// Completing closes the tunnel at once (a gateway lease taken back).
    pub revoked: Option<Revoked>,
}

/// Relays bytes between the client's connection (once hyper hands it over
/// after the `200`) and `upstream` until either side closes (and the other
/// within `linger`), nothing moves for the idle timeout or `revoked`
/// completes; `held` is dropped then. Both ends' sockets are relayed by
/// the kernel (`zero_copy`); `tally` counts the bytes there (a connection
/// without a socket counts its own).
pub fn splice<U: TunnelUpstream>(
    upgrade: hyper::upgrade::OnUpgrade,
    upstream: U,
    in_flight: InFlight,
    how: Splice,
) {
    tokio::spawn(async move {
        let Splice {
            idle_timeout,
            linger,
            held,
            tally,
            revoked,
        } = how;
        let _held = held;
        in_flight.relaying();
        let client = match upgrade.await {
            Ok(client) => client,
            Err(e) => return tracing::debug!(error = %e, "CONNECT's connection not handed over"),
        };
        let slot = in_flight.slot().clone();
        let relayed = relay_ends(client, upstream, &slot, tally, linger);
        tokio::select! {
            relayed = relayed => {
                if let Err(e) = relayed {
                    tracing::debug!(error = %e, "tunnel ended with an error");
                }
            }
            () = slot.stalled(idle_timeout, Some(Phase::Relaying)) => {
                tracing::debug!("tunnel idle for the idle timeout; closed");
            }
            () = async {
                match revoked {
                    Some(revoked) => revoked.await,
                    None => std::future::pending().await,
                }
            } => {
                tracing::debug!("tunnel's lease taken back for a crawler waiting below its fair share; closed");
            }
        }
    });
}

async fn relay_ends<U: TunnelUpstream>(
    client: Upgraded,
    upstream: U,
    slot: &Arc<Slot>,
    tally: Option<Tally>,
    linger: Option<Duration>,
) -> std::io::Result<()> {
    let upstream = match upstream.into_end() {
        Ok(end) => end,
        Err(mut upstream) => {
            let mut client = TokioIo::new(client);
            return relay::relay(&mut Tracked::new(&mut client, slot.clone()), &mut upstream)
                .await
                .map(drop);
        }
    };
    match client.downcast::<ClientIo>() {
        Ok(Parts { io, read_buf, .. }) => {
            let (guarded, unread) = io.into_inner().into_parts();
            // What hyper read past the CONNECT, then what the guard still held.
            let early = if unread.is_empty() {
                read_buf
            } else {
                let mut early = bytes::BytesMut::from(&read_buf[..]);
                early.extend_from_slice(&unread);
                early.freeze()
            };
            let client = End {
                socket: guarded.into_inner(),
                early,
            };
            let moved = |way, n| {
                slot.touch();
                if let Some(tally) = &tally {
                    tally(way, n);
                }
            };
            zero_copy::relay_lingering(client, upstream, &moved, linger)
                .await
                .map(drop)
        }
        Err(client) => {
            // Not a listener's own connection: copied through user space.
            let mut client = Tracked::new(TokioIo::new(client), slot.clone());
            client.write_all(&upstream.early).await?;
            let mut socket = upstream.socket;
            relay::relay(&mut client, &mut socket).await.map(drop)
        }
    }
}
