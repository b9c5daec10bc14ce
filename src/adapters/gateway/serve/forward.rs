//! Plain HTTP through the gateway: an absolute-form request sent on through
//! leased proxies, on a kept connection when its body can be sent again,
//! tried on another proxy when one fails or the response is a block.

use super::*;

impl Gateway {
    /// Sends an absolute-form request on through leased proxies, trying
    /// another when one fails or is blocked (if its body can be sent again).
    #[expect(clippy::too_many_arguments, reason = "one request's parts, passed once")]
    pub(super) async fn forward(
        &self,
        request: Request<Incoming>,
        uri: Uri,
        host: HeaderValue,
        mut wanted: Wanted,
        mut exchange: Exchange,
        in_flight: InFlight,
        slot: &Slot,
    ) -> Response<ProxyBody> {
        let settings = &self.options.settings;
        let (mut parts, mut body) = request.into_parts();
        // hyper let through only `chunked` (the guard refused any other coding).
        let chunked = parts.headers.contains_key(header::TRANSFER_ENCODING);
        // Drops the crawler's Proxy-Authorization (its token) among the hop-by-hop headers.
        forwarded_headers(&mut parts.headers, host, chunked);
        // A body within the bound is read whole, so that it can be sent again.
        let kept = match body.size_hint().exact() {
            Some(size) if size <= settings.retry_body_limit && !chunked => {
                let limit = usize::try_from(size).unwrap_or(usize::MAX);
                match tokio::time::timeout(self.idle_timeout, read_up_to(&mut body, limit)).await {
                    Ok(Ok((bytes, true))) => Some(bytes),
                    _ => {
                        let e = GatewayError::Framing("the request body did not arrive whole");
                        return refusal(&e, &mut exchange, true, in_flight);
                    }
                }
            }
            _ => None,
        };
        exchange.transferred.up.fetch_add(
            kept.as_ref().map_or(0, |b| b.len() as u64),
            std::sync::atomic::Ordering::Relaxed,
        );
        let mut streamed = kept.is_none().then_some(body);
        let tries = if kept.is_some() { settings.tries } else { 1 };
        let deadline = Instant::now() + settings.deadline;
        let mut failures = Failures::default();
        for attempt in 1..=tries {
            let until = deadline.min(Instant::now() + settings.capacity_wait);
            let (upstream, held) = match self.lease(&mut wanted, &mut exchange, until).await {
                Ok(leased) => leased,
                Err(e) => {
                    failures.last = Some(e);
                    break;
                }
            };
            let sent = self.send(
                &upstream,
                &parts,
                &uri,
                (kept.as_ref(), &mut streamed),
                &exchange.transferred,
                slot,
            );
            let (response, connection) = match tokio::time::timeout_at(deadline.into(), sent).await {
                Ok(Ok(sent)) => sent,
                Ok(Err(failure)) => {
                    let ends = matches!(failure, TryFailure::Final(_));
                    failures.record(self, &upstream.lease_id, failure, &mut exchange);
                    if ends {
                        break;
                    }
                    continue;
                }
                Err(_) => {
                    failures.last = Some(GatewayError::TimedOut {
                        proxy: upstream.proxy.to_string(),
                    });
                    break;
                }
            };
            let (mut head, mut rest) = response.into_parts();
            let status = head.status.as_u16();
            let (read, ended, blocked) = match self.blocks.on_head(&wanted.ask.target, status) {
                HeadVerdict::NotBlocked => (Bytes::new(), false, false),
                HeadVerdict::Blocked => (Bytes::new(), false, true),
                HeadVerdict::LookAtBody => {
                    match tokio::time::timeout_at(deadline.into(), read_up_to(&mut rest, BODY_SCAN_LIMIT))
                        .await
                    {
                        Ok(Ok((read, ended))) => {
                            let blocked = self.blocks.on_body(&wanted.ask.target, status, &read);
                            (read, ended, blocked)
                        }
                        _ => {
                            let e = GatewayError::Upstream {
                                proxy: upstream.proxy.to_string(),
                                why: "the response body did not arrive".into(),
                            };
                            failures.record(
                                self,
                                &upstream.lease_id,
                                TryFailure::Destination(e),
                                &mut exchange,
                            );
                            continue;
                        }
                    }
                }
            };
            if blocked {
                exchange.blocked += 1;
                GatewayBlocked {
                    target: &wanted.ask.target,
                    proxy: &upstream.proxy.to_string(),
                    status,
                }
                .emit();
                self.options.leases.report(
                    upstream.lease_id.clone(),
                    Outcome::Blocked,
                    format!(
                        "gateway: {status} from {} matched a block rule",
                        wanted.ask.target
                    ),
                );
                if settings.retry_on_block && attempt < tries && Instant::now() < deadline {
                    continue;
                }
            }
            failures.served(self, &mut exchange);
            drop_hop_by_hop(&mut head.headers);
            strip_proxy_headers(&mut head.headers);
            describe(&mut head.headers, &upstream, &exchange, blocked);
            exchange.status = status;
            exchange.outcome = if blocked {
                ExchangeOutcome::Blocked
            } else {
                ExchangeOutcome::Served
            };
            let rest = (!ended).then_some(rest);
            // Kept for the next request once this response has ended.
            let kept_alive = GiveBack(Some((self.pool.clone(), upstream.url.clone(), connection)));
            let body = ProxyBody::read_ahead(read, rest, Some(in_flight))
                .holding(Box::new((held, exchange, kept_alive)));
            return Response::from_parts(head, body);
        }
        let e = failures.into_error(&wanted.ask.target);
        refusal(&e, &mut exchange, false, in_flight)
    }

    /// One try of a plain-HTTP request on one leased proxy, on a kept
    /// connection when its body can be sent again: the response head and
    /// the connection, or why not.
    async fn send(
        &self,
        upstream: &Upstream,
        parts: &http::request::Parts,
        uri: &Uri,
        (kept, streamed): (Option<&Bytes>, &mut Option<Incoming>),
        transferred: &Arc<Transferred>,
        slot: &Slot,
    ) -> Result<(Response<Incoming>, Connection), TryFailure> {
        let mut pooled = kept.and_then(|_| self.pool.take(&upstream.url));
        let (response, connection) = loop {
            let mut connection = match pooled.take() {
                Some(connection) => {
                    *connection
                        .meter
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner) = transferred.clone();
                    connection
                }
                None => open(upstream, meter(transferred))
                    .await
                    .map_err(TryFailure::Proxy)?,
            };
            let body = match kept {
                Some(bytes) => ProxyBody::read_ahead(bytes.clone(), None, None),
                None => ProxyBody::read_ahead(Bytes::new(), streamed.take(), None),
            };
            let mut request = Request::new(body);
            *request.method_mut() = parts.method.clone();
            *request.uri_mut() = uri.clone();
            *request.version_mut() = Version::HTTP_11;
            *request.headers_mut() = parts.headers.clone();
            authorize(request.headers_mut(), upstream);
            let received = tokio::select! {
                received = connection.sender.send_request(request) => received,
                () = slot.stalled(self.idle_timeout, None) => {
                    return Err(TryFailure::Destination(GatewayError::TimedOut { proxy: upstream.proxy.to_string() }));
                }
            };
            match received {
                Ok(response) => break (response, connection),
                // A kept connection the proxy closed meanwhile: a new one.
                Err(_) if connection.reused => continue,
                Err(e) => return Err(TryFailure::Proxy(upstream_failed(upstream, &e))),
            }
        };
        let status = response.status();
        if status == StatusCode::SWITCHING_PROTOCOLS {
            return Err(TryFailure::Proxy(upstream_failed(
                upstream,
                &"it switched protocols unasked",
            )));
        }
        // The upstream refused its own credentials: the crawler can do nothing about it.
        if status == StatusCode::PROXY_AUTHENTICATION_REQUIRED {
            return Err(TryFailure::Proxy(upstream_failed(
                upstream,
                &"it refused its credentials (407)",
            )));
        }
        // The proxy's own page names it (Squid's its host and version): the
        // crawler gets the gateway's answer instead.
        let why = || format!("it answered {status} itself");
        match author(status, response.headers()) {
            Author::Site => Ok((response, connection)),
            Author::ProxyFailure => Err(TryFailure::Destination(upstream_failed(upstream, &why()))),
            Author::ProxyRefusal => Err(TryFailure::Final(GatewayError::DestinationRefused(format!(
                "upstream proxy {} refused it",
                upstream.proxy
            )))),
            Author::ProxyOther => Err(TryFailure::Final(upstream_failed(upstream, &why()))),
        }
    }
}

/// A plain-HTTP exchange's upstream connection, given back to the pool when
/// its response body is done with.
struct GiveBack(Option<(Arc<UpstreamPool>, String, Connection)>);

impl Drop for GiveBack {
    fn drop(&mut self) {
        if let Some((pool, url, connection)) = self.0.take() {
            pool.give_back(url, connection);
        }
    }
}
