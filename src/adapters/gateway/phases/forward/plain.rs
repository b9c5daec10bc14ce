//! One try of a plain-HTTP request on a leased proxy: sent on a kept
//! connection when its body can be sent again, its answer observed for
//! the judge (who wrote it, whether a block rule matches), and relayed
//! when the judge says so.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header;
use http::{Request, Response, StatusCode, Uri, Version};
use hyper::body::{Body, Incoming};

use super::{Attempt, Forwarder, Tried};
use crate::adapters::forward_proxy::body::{BodyWatch, ProxyBody, read_up_to};
use crate::adapters::forward_proxy::request::drop_hop_by_hop;
use crate::adapters::gateway::GatewayError;
use crate::adapters::gateway::Upstream;
use crate::adapters::gateway::blocks::HeadVerdict;
use crate::adapters::gateway::challenge::challenge_realm;
use crate::adapters::gateway::phases::RequestContext;
use crate::adapters::gateway::phases::answers::describe;
use crate::adapters::gateway::phases::choose::Held;
use crate::adapters::gateway::phases::judge::Seen;
use crate::adapters::gateway::phases::log::{ExchangeOutcome, meter};
use crate::adapters::gateway::upstream::{Connection, UpstreamPool, authorize, open};
use crate::adapters::gateway::upstream_identity::{Author, author, strip_proxy_headers};
use crate::domain::config::BODY_SCAN_LIMIT;

/// A plain request on its way: its head for the next hop, its body kept
/// whole (it can be sent again) or streamed once.
pub(in crate::adapters::gateway) struct Plain {
    parts: http::request::Parts,
    uri: Uri,
    kept: Option<Bytes>,
    streamed: Option<Incoming>,
    chunked: bool,
}

/// A response the judge may have relayed: its head, what was read of its
/// body, the rest, and the connection it came on.
pub(in crate::adapters::gateway) struct Answer {
    head: http::response::Parts,
    read: Bytes,
    rest: Incoming,
    ended: bool,
    connection: Connection,
}

impl Plain {
    pub fn new(parts: http::request::Parts, uri: Uri, body: Incoming, chunked: bool) -> Self {
        Self {
            parts,
            uri,
            kept: None,
            streamed: Some(body),
            chunked,
        }
    }

    /// Reads a body of known size within `limit` whole, so that the request
    /// can be tried again on another proxy; the bytes kept.
    pub async fn keep_whole(&mut self, limit: u64, idle_timeout: Duration) -> Result<u64, GatewayError> {
        let Some(body) = self.streamed.as_mut() else {
            return Ok(0);
        };
        match body.size_hint().exact() {
            Some(size) if size <= limit && !self.chunked => {
                let limit = usize::try_from(size).unwrap_or(usize::MAX);
                match tokio::time::timeout(idle_timeout, read_up_to(body, limit)).await {
                    Ok(Ok((bytes, true))) => {
                        let kept = bytes.len() as u64;
                        self.kept = Some(bytes);
                        self.streamed = None;
                        Ok(kept)
                    }
                    _ => Err(GatewayError::Framing("the request body did not arrive whole")),
                }
            }
            _ => Ok(0),
        }
    }

    /// Sends the request, on a kept connection when its body can be sent
    /// again: the response head and the connection, or what went wrong.
    async fn send(
        &mut self,
        forwarder: &Forwarder,
        upstream: &Upstream,
        context: &RequestContext,
    ) -> Result<(Response<Incoming>, Connection), Tried<Answer>> {
        let transferred = &context.exchange.transferred;
        let mut pooled = self
            .kept
            .as_ref()
            .and_then(|_| forwarder.pool.take(&upstream.url));
        let watch = Arc::new(BodyWatch::default());
        loop {
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
                    .map_err(|e| Tried::failed(Seen::ProxyUnreachable, e))?,
            };
            let body = match &self.kept {
                Some(bytes) => ProxyBody::read_ahead(bytes.clone(), None, None),
                None => {
                    ProxyBody::read_ahead(Bytes::new(), self.streamed.take(), None).watched(watch.clone())
                }
            };
            let mut request = Request::new(body);
            *request.method_mut() = self.parts.method.clone();
            *request.uri_mut() = self.uri.clone();
            *request.version_mut() = Version::HTTP_11;
            *request.headers_mut() = self.parts.headers.clone();
            authorize(request.headers_mut(), upstream);
            let received = tokio::select! {
                received = connection.sender.send_request(request) => received,
                () = context.slot.stalled(forwarder.idle_timeout, None) => {
                    // Waiting on the client's body, or on the answer.
                    return Err(if self.kept.is_none() && !watch.ended() {
                        Tried::failed(Seen::ClientStalled, "the client stopped sending its request body")
                    } else {
                        Tried::failed(Seen::NoAnswer, "no response within the idle timeout")
                    });
                }
            };
            match received {
                Ok(response) => return Ok((response, connection)),
                // The client's body failed: its fault, whatever the upstream said.
                Err(e) if watch.failed() => {
                    return Err(Tried::failed(
                        Seen::ClientBodyFailed,
                        format!("the request body failed: {e}"),
                    ));
                }
                // A kept connection the proxy closed meanwhile: a new one.
                Err(_) if connection.reused => continue,
                Err(e) if e.is_parse() => return Err(Tried::failed(Seen::ProxyBroken, e)),
                Err(e) => return Err(Tried::failed(Seen::ProxyUnreachable, e)),
            }
        }
    }
}

impl Attempt for Plain {
    type Answer = Answer;
    const TUNNEL: bool = false;

    async fn prepare(
        &mut self,
        forwarder: &Forwarder,
        context: &mut RequestContext,
    ) -> Result<(), GatewayError> {
        let kept = self
            .keep_whole(forwarder.retry_body_limit, forwarder.idle_timeout)
            .await?;
        let up = &context.exchange.transferred.up;
        up.fetch_add(kept, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// The body is kept, or not streamed yet.
    fn can_retry(&self) -> bool {
        self.kept.is_some() || self.streamed.is_some()
    }

    async fn try_on(
        &mut self,
        forwarder: &Forwarder,
        upstream: &Upstream,
        context: &RequestContext,
    ) -> Tried<Answer> {
        let deadline = tokio::time::Instant::from_std(context.deadline);
        match tokio::time::timeout_at(deadline, self.send(forwarder, upstream, context)).await {
            Ok(Ok((response, connection))) => observe(forwarder, context, response, connection).await,
            Ok(Err(failed)) => failed,
            Err(_) => Tried::failed(Seen::NoAnswer, "no response head before the deadline"),
        }
    }

    fn relay(
        self,
        answer: Answer,
        forwarder: &Forwarder,
        upstream: Upstream,
        held: Held,
        context: RequestContext,
        blocked: bool,
    ) -> Response<ProxyBody> {
        answer.relay(&forwarder.pool, upstream, held, context, blocked)
    }
}

/// What the answer is, for the judge: who wrote it and whether it is a block.
async fn observe(
    forwarder: &Forwarder,
    context: &RequestContext,
    response: Response<Incoming>,
    connection: Connection,
) -> Tried<Answer> {
    let status = response.status();
    let code = status.as_u16();
    let answered = |seen: Seen, detail: String, head, read, rest, ended| Tried {
        seen,
        detail,
        answer: Some(Answer {
            head,
            read,
            rest,
            ended,
            connection,
        }),
    };
    if status == StatusCode::SWITCHING_PROTOCOLS {
        return Tried::failed(Seen::ProxyBroken, "it switched protocols unasked");
    }
    if status == StatusCode::PROXY_AUTHENTICATION_REQUIRED {
        let realm = challenge_realm(response.headers());
        let detail = format!("407 naming realm {:?}", realm.as_deref().unwrap_or(""));
        let (head, rest) = response.into_parts();
        return answered(
            Seen::AuthenticationRequired { realm },
            detail,
            head,
            Bytes::new(),
            rest,
            false,
        );
    }
    let said = || format!("it answered {status} itself");
    match author(status, response.headers()) {
        Author::Site => {}
        Author::ProxyFailure => return Tried::failed(Seen::SiteUnreachable { status: code }, said()),
        Author::ProxyRefusal => return Tried::failed(Seen::DestinationRefused, said()),
        Author::ProxyOther => return Tried::failed(Seen::RequestRejected { status: code }, said()),
    }
    let target = &context.admitted.ask.target;
    let (head, mut rest) = response.into_parts();
    let (read, ended, blocked) = match forwarder.blocks.on_head(target, code) {
        HeadVerdict::NotBlocked => (Bytes::new(), false, false),
        HeadVerdict::Blocked => (Bytes::new(), false, true),
        HeadVerdict::LookAtBody => {
            let deadline = tokio::time::Instant::from_std(context.deadline);
            match tokio::time::timeout_at(deadline, read_up_to(&mut rest, BODY_SCAN_LIMIT)).await {
                Ok(Ok((read, ended))) => {
                    let blocked = forwarder.blocks.on_body(target, code, &read);
                    (read, ended, blocked)
                }
                _ => return Tried::failed(Seen::NoAnswer, "the response body did not arrive"),
            }
        }
    };
    let seen = Seen::SiteAnswered {
        status: code,
        blocked,
    };
    answered(
        seen,
        format!("the site answered {status}"),
        head,
        read,
        rest,
        ended,
    )
}

impl Answer {
    /// Hands the response to the client; the lease, the access record and
    /// the connection (back to the pool) go when its body is done with.
    pub fn relay(
        self,
        pool: &Arc<UpstreamPool>,
        upstream: Upstream,
        held: Held,
        context: RequestContext,
        blocked: bool,
    ) -> Response<ProxyBody> {
        let Answer {
            mut head,
            read,
            rest,
            ended,
            connection,
        } = self;
        let RequestContext {
            mut exchange,
            in_flight,
            ..
        } = context;
        drop_hop_by_hop(&mut head.headers);
        strip_proxy_headers(&mut head.headers);
        describe(&mut head.headers, &upstream, &exchange, blocked);
        exchange.status = head.status.as_u16();
        exchange.outcome = if blocked {
            ExchangeOutcome::Blocked
        } else {
            ExchangeOutcome::Served
        };
        // A site's own `407` is relayed, but not its challenge's hop-by-hop meaning.
        head.headers.remove(header::PROXY_AUTHENTICATE);
        let rest = (!ended).then_some(rest);
        // Kept for the next request once this response has ended.
        let kept_alive = GiveBack(Some((pool.clone(), upstream.url.clone(), connection)));
        let body = ProxyBody::read_ahead(read, rest, Some(in_flight))
            .holding(Box::new((held, exchange, kept_alive)));
        Response::from_parts(head, body)
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
