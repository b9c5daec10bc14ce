//! `CONNECT` through the gateway: the leased proxy's own `CONNECT`, tried on
//! another proxy until one answers `200`, then the crawler's bytes spliced
//! to it (TLS passes through untouched). The proxy is asked for an address
//! the gateway checked, not the crawler's name: it cannot resolve the name
//! again to an address the gateway never saw (DNS rebinding). SNI and
//! `Host` travel inside the tunnel, so the site sees the crawler's name.
//! As a proxy given the name would, each proxy is asked for the checked
//! addresses in turn until one opens (an IPv6 address it cannot reach
//! does not fail the try).

use super::*;

impl Gateway {
    /// Opens a tunnel through leased proxies (their own `CONNECT`), trying
    /// another when one fails, then answers `200` and splices.
    pub(super) async fn tunnel(
        &self,
        request: Request<Incoming>,
        addresses: &[SocketAddr],
        mut wanted: Wanted,
        mut exchange: Exchange,
        in_flight: InFlight,
        slot: &Slot,
    ) -> Response<ProxyBody> {
        let settings = &self.options.settings;
        let deadline = Instant::now() + settings.deadline;
        let mut failures = Failures::default();
        for _ in 0..settings.tries {
            let until = deadline.min(Instant::now() + settings.capacity_wait);
            let (upstream, held) = match self.lease(&mut wanted, &mut exchange, until).await {
                Ok(leased) => leased,
                Err(e) => {
                    failures.last = Some(e);
                    break;
                }
            };
            let opened = self.connect_through(addresses, &upstream, &exchange.transferred, slot);
            match tokio::time::timeout_at(deadline.into(), opened).await {
                Ok(Ok(upstream_io)) => {
                    failures.served(self, &mut exchange);
                    let mut response = established();
                    describe(response.headers_mut(), &upstream, &exchange, false);
                    exchange.status = 200;
                    exchange.outcome = ExchangeOutcome::Served;
                    let held = held.renewed(upstream.ttl);
                    let upgrade = hyper::upgrade::on(request);
                    let transferred = exchange.transferred.clone();
                    let tally: Tally = Arc::new(move |way, n| {
                        let counter = match way {
                            Way::Forward => &transferred.up,
                            Way::Back => &transferred.down,
                        };
                        counter.fetch_add(n as u64, Ordering::Relaxed);
                    });
                    splice(
                        upgrade,
                        upstream_io,
                        in_flight,
                        self.idle_timeout,
                        Some(Box::new((held, exchange))),
                        Some(tally),
                        Some(Box::pin(upstream.revoked.clone().revoked())),
                    );
                    return response;
                }
                Ok(Err(failure)) => failures.record(self, &upstream.lease_id, failure, &mut exchange),
                Err(_) => {
                    failures.last = Some(GatewayError::TimedOut {
                        proxy: upstream.proxy.to_string(),
                    });
                    break;
                }
            }
        }
        let e = failures.into_error(&wanted.ask.target);
        refusal(&e, &mut exchange, true, in_flight)
    }

    /// One try of a tunnel: the leased proxy's own `CONNECT` to each
    /// checked address in turn until one opens. The proxy's failure (it
    /// cannot be reached, refuses its credentials) ends the try at once;
    /// its refusal of every address is the destination's failure.
    async fn connect_through(
        &self,
        addresses: &[SocketAddr],
        upstream: &Upstream,
        transferred: &Arc<Transferred>,
        slot: &Slot,
    ) -> Result<TokioIo<hyper::upgrade::Upgraded>, TryFailure> {
        let mut refused = None;
        for &address in addresses {
            match self.connect_to(address, upstream, transferred, slot).await {
                Err(TryFailure::Destination(e)) => refused = Some(e),
                opened_or_failed => return opened_or_failed,
            }
        }
        Err(TryFailure::Destination(refused.unwrap_or_else(|| {
            upstream_failed(upstream, &"no address to ask it for")
        })))
    }

    /// The leased proxy's own `CONNECT` to one checked address.
    async fn connect_to(
        &self,
        address: SocketAddr,
        upstream: &Upstream,
        transferred: &Arc<Transferred>,
        slot: &Slot,
    ) -> Result<TokioIo<hyper::upgrade::Upgraded>, TryFailure> {
        // `[v6]:port` for an IPv6 address.
        let authority = address.to_string();
        let mut connect = Request::builder()
            .method(Method::CONNECT)
            .uri(authority.as_str())
            .body(ProxyBody::empty(None))
            .map_err(|e| TryFailure::Proxy(upstream_failed(upstream, &e)))?;
        if let Ok(value) = HeaderValue::from_str(&authority) {
            connect.headers_mut().insert(header::HOST, value);
        }
        authorize(connect.headers_mut(), upstream);
        let Connection { mut sender, .. } = open(upstream, meter(transferred))
            .await
            .map_err(TryFailure::Proxy)?;
        let response = tokio::select! {
            received = sender.send_request(connect) => {
                received.map_err(|e| TryFailure::Proxy(upstream_failed(upstream, &e)))?
            }
            () = slot.stalled(self.idle_timeout, None) => {
                return Err(TryFailure::Destination(GatewayError::TimedOut { proxy: upstream.proxy.to_string() }));
            }
        };
        match response.status() {
            StatusCode::OK => {}
            StatusCode::PROXY_AUTHENTICATION_REQUIRED => {
                return Err(TryFailure::Proxy(upstream_failed(
                    upstream,
                    &"it refused its credentials (407)",
                )));
            }
            status => {
                let why = format!("it answered {status} to CONNECT {authority}");
                return Err(TryFailure::Destination(upstream_failed(upstream, &why)));
            }
        }
        let upstream_io = hyper::upgrade::on(response)
            .await
            .map_err(|e| TryFailure::Proxy(upstream_failed(upstream, &e)))?;
        Ok(TokioIo::new(upstream_io))
    }
}
