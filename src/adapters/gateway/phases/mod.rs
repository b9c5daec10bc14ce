//! The gateway's request pipeline, one phase per concern, the per-request
//! [`RequestContext`] passed through them:
//!
//! ```text
//!  client ──▶ admit ──▶ choose ──▶ forward ──▶ judge ──▶ log
//!             │          │          │  ▲         │        │
//!             │          │          │  └─ retry ─┘        │
//!             who, what,  a lease    one try:     whose    access line,
//!             where to,   (session,  plain or     fault,   metrics,
//!             how fast    learning,  tunnel       what     lease given
//!                         capacity                next     back
//!                         wait)
//! ```
//!
//! - [`admit`]: the connection's framing, the crawler's credentials and
//!   identity, its rate, its username's parameters, the destination rules;
//! - [`choose`]: a lease on the proxy to try (a sticky session's, one the
//!   site learning does not pass over, one not tried yet), waiting for
//!   capacity; the lease goes back, paced, when the exchange ends;
//! - [`forward`]: one try loop for plain requests and tunnels: each try on
//!   a leased proxy, observed as a [`judge::Seen`];
//! - [`judge`]: the pure policy of who is to blame and what follows;
//! - [`log`]: the exchange's record, written when it ends.

mod admit;
mod answers;
mod choose;
mod forward;
pub mod judge;
pub mod log;

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use http::{Method, Request, Response};
use hyper::body::Incoming;
use tokio::net::{TcpListener, TcpStream};
use tracing::Instrument;

use self::admit::{Admission, Admitted};
use self::answers::refusal;
use self::choose::Chooser;
use self::forward::{Forwarder, Hop};
use self::judge::Seen;
use self::log::{Exchange, exchange_span};
use super::{Leases, Options, REASON_HEADER};
use crate::adapters::forward_proxy::body::ProxyBody;
use crate::adapters::forward_proxy::client_connection;
use crate::adapters::forward_proxy::framing::Verdicts;
use crate::adapters::guarded_listener::{InFlight, ListenerSettings, Slot, serve_connections};
use crate::domain::resource::ObjectKey;

/// One request or tunnel on its way through the phases.
pub(super) struct RequestContext {
    /// The access record (the log phase writes it when dropped).
    pub exchange: Exchange,
    pub in_flight: InFlight,
    pub slot: Arc<Slot>,
    pub admitted: Admitted,
    /// Until when tries may start (`deadline`).
    pub deadline: Instant,
    /// Proxies tried so far (never tried twice).
    pub tried: Vec<ObjectKey>,
    /// A proxy was rested for every target during this request.
    pub rested_one: bool,
    /// What each try saw.
    pub seen: Vec<Seen>,
}

/// The gateway: its phases, each owning what it needs.
pub(super) struct Gateway {
    admission: Admission,
    chooser: Chooser,
    forwarder: Forwarder,
    server: hyper::server::conn::http1::Builder,
    /// The listener's timeouts, for each connection.
    listener: ListenerSettings,
    trace_exchanges: bool,
}

/// Serves until the process ends; accept errors are waited out.
pub async fn serve(listener: TcpListener, options: Options, settings: ListenerSettings) -> io::Result<()> {
    let gateway = Arc::new(Gateway::new(options, &settings));
    match serve_connections(
        listener,
        &settings,
        "gateway",
        Some(REASON_HEADER),
        move |stream, peer, slot| gateway.clone().serve_client(stream, peer, slot),
    )
    .await {}
}

impl Gateway {
    fn new(options: Options, settings: &ListenerSettings) -> Self {
        let Options {
            settings: gateway,
            destinations,
            identities,
            leases,
        } = options;
        let leases: Arc<dyn Leases> = leases;
        Self {
            admission: Admission::new(&gateway, destinations, identities),
            chooser: Chooser::new(&gateway, leases.clone()),
            forwarder: Forwarder::new(&gateway, leases, settings.idle_timeout),
            server: client_connection::server(settings),
            listener: settings.clone(),
            trace_exchanges: gateway.trace_exchanges,
        }
    }

    /// Serves one client connection, as the built-in forward proxy does.
    async fn serve_client(self: Arc<Self>, stream: TcpStream, peer: SocketAddr, slot: Arc<Slot>) {
        let gateway = self.clone();
        let handle = move |request: Request<Incoming>, slot, verdicts: Verdicts| {
            let gateway = gateway.clone();
            let span = exchange_span(gateway.trace_exchanges, request.method() == Method::CONNECT);
            async move {
                gateway
                    .handle(request, peer, slot, &verdicts, span.clone())
                    .instrument(span)
                    .await
            }
        };
        client_connection::serve(&self.server, stream, peer, slot, &self.listener, handle).await;
    }

    /// One request through the phases: admitted, then forwarded through
    /// chosen proxies (each try judged); the exchange is logged when its
    /// response or tunnel ends.
    async fn handle(
        &self,
        request: Request<Incoming>,
        peer: SocketAddr,
        slot: Arc<Slot>,
        verdicts: &Verdicts,
        span: tracing::Span,
    ) -> Response<ProxyBody> {
        let in_flight = slot.in_flight();
        let tunnel = request.method() == Method::CONNECT;
        let mut exchange = Exchange::new(peer, tunnel, span);
        let (admitted, hop) = match self.admission.admit(request, peer, &slot, verdicts).await {
            Ok(admitted) => admitted,
            Err(refused) => return refusal(&refused.error, &mut exchange, refused.close, in_flight),
        };
        exchange.client = admitted.client.clone();
        exchange.target = admitted.ask.target.clone();
        let context = RequestContext {
            exchange,
            in_flight,
            slot,
            admitted,
            deadline: Instant::now() + self.forwarder.deadline(),
            tried: Vec::new(),
            rested_one: false,
            seen: Vec::new(),
        };
        match hop {
            Hop::Plain(plain) => self.forwarder.forward(plain, context, &self.chooser).await,
            Hop::Tunnel(tunnel) => self.forwarder.forward(tunnel, context, &self.chooser).await,
        }
    }
}
