//! Forward: one try loop for plain requests and tunnels. Each try leases a
//! proxy (the choose phase), tries the request on it (a [`plain`] request
//! or a [`tunnel`]'s `CONNECT`), has the judge rule on what it saw, acts on
//! the verdict (reports, learning, counters) and then relays the answer,
//! tries another proxy, or answers the client itself.

mod plain;
mod tunnel;

use std::sync::Arc;
use std::time::{Duration, Instant};

use http::Response;

use super::RequestContext;
use super::answers::refusal;
use super::choose::{Chooser, Held};
use super::judge::{Blame, Circumstances, Learned, Refusal, Seen, Then, judge, same_answer};
use crate::adapters::forward_proxy::body::ProxyBody;
use crate::adapters::gateway::blocks::BlockRules;
use crate::adapters::gateway::upstream::UpstreamPool;
use crate::adapters::gateway::{GatewayError, Leases, Upstream};
use crate::domain::config::GatewaySettings;
use crate::domain::lease::Outcome;
use crate::telemetry::events::{GatewayBlocked, GatewayTryFailed};

pub(in crate::adapters::gateway) use self::plain::Plain;
pub(in crate::adapters::gateway) use self::tunnel::Tunnel;

/// How a request goes on once admitted.
pub(in crate::adapters::gateway) enum Hop {
    Plain(Plain),
    Tunnel(Tunnel),
}

/// One kind of request the try loop forwards: a [`Plain`] request or a
/// [`Tunnel`]. Each knows how to try itself on a proxy and how to hand a
/// try's answer to the client; the loop, the judge and what follows a
/// verdict are the same for both.
pub(super) trait Attempt {
    /// What a try that got through hands on.
    type Answer;
    /// A tunnel: a `407` to its `CONNECT` can only be the proxy's.
    const TUNNEL: bool;
    /// Before the first try (a plain request's body read whole when it
    /// can be, so that it can be sent again).
    async fn prepare(
        &mut self,
        forwarder: &Forwarder,
        context: &mut RequestContext,
    ) -> Result<(), GatewayError>;
    /// Whether another try could still send the request.
    fn can_retry(&self) -> bool;
    /// One try on `upstream`.
    async fn try_on(
        &mut self,
        forwarder: &Forwarder,
        upstream: &Upstream,
        context: &RequestContext,
    ) -> Tried<Self::Answer>;
    /// Hands the answer the judge relays to the client; the lease and the
    /// access record go when it is done with.
    fn relay(
        self,
        answer: Self::Answer,
        forwarder: &Forwarder,
        upstream: Upstream,
        held: Held,
        context: RequestContext,
        blocked: bool,
    ) -> Response<ProxyBody>;
}

/// One try: what it saw (for the judge), why (for logs and reports), and
/// the answer to relay if the judge says so.
pub(super) struct Tried<A> {
    pub seen: Seen,
    pub detail: String,
    pub answer: Option<A>,
}

impl<A> Tried<A> {
    fn failed(seen: Seen, detail: impl std::fmt::Display) -> Self {
        Self {
            seen,
            detail: detail.to_string(),
            answer: None,
        }
    }
}

/// The forward phase's state.
pub(super) struct Forwarder {
    leases: Arc<dyn Leases>,
    pool: Arc<UpstreamPool>,
    blocks: BlockRules,
    idle_timeout: Duration,
    tries: u32,
    deadline: Duration,
    retry_on_block: bool,
    retry_body_limit: u64,
}

impl Forwarder {
    pub fn new(settings: &GatewaySettings, leases: Arc<dyn Leases>, idle_timeout: Duration) -> Self {
        Self {
            leases,
            pool: Arc::default(),
            blocks: BlockRules::new(settings.blocks.clone()),
            idle_timeout,
            tries: settings.tries,
            deadline: settings.deadline,
            retry_on_block: settings.retry_on_block,
            retry_body_limit: settings.retry_body_limit,
        }
    }

    /// Bound on all tries of one request together.
    pub fn deadline(&self) -> Duration {
        self.deadline
    }

    /// Tries `attempt` on chosen proxies until the judge relays an answer
    /// or refuses; the response, or the gateway's own answer.
    pub async fn forward<A: Attempt>(
        &self,
        mut attempt: A,
        mut context: RequestContext,
        chooser: &Chooser,
    ) -> Response<ProxyBody> {
        if let Err(e) = attempt.prepare(self, &mut context).await {
            return refuse(context, &e, true);
        }
        let tunnel = A::TUNNEL;
        let mut last_failure = None;
        loop {
            let (upstream, held) = match chooser.lease(&mut context).await {
                Ok(leased) => leased,
                Err(e) => return refuse(context, &last_failure.unwrap_or(e), tunnel),
            };
            let tried = attempt.try_on(self, &upstream, &context).await;
            let can_retry = attempt.can_retry()
                && context.exchange.tries < self.tries
                && Instant::now() < context.deadline;
            let at = Circumstances {
                plain: !tunnel,
                proxy_realm: upstream.realm.as_deref(),
                rested_one: context.rested_one,
                seen_elsewhere: context.seen.iter().any(|seen| same_answer(seen, &tried.seen)),
                can_retry,
                retry_on_block: self.retry_on_block,
            };
            let verdict = judge(&tried.seen, at);
            self.act(&verdict, &tried, &upstream, &mut context, chooser);
            let Tried { seen, detail, answer } = tried;
            match (verdict.then, answer) {
                (Then::Relay, Some(answer)) => {
                    let first_try = context.exchange.tries == 1;
                    chooser.finished(&context.admitted.ask.target, first_try);
                    let blocked = verdict.report == Some(Outcome::Blocked);
                    return attempt.relay(answer, self, upstream, held, context, blocked);
                }
                (Then::Retry, _) => {
                    last_failure = Some(error_of(Refusal::UpstreamFailed, &seen, &upstream, &detail));
                    context.seen.push(seen);
                }
                (Then::Refuse(why), _) => {
                    chooser.finished(&context.admitted.ask.target, false);
                    let e = error_of(why, &seen, &upstream, &detail);
                    let close = tunnel || matches!(why, Refusal::ClientBody | Refusal::ClientTimeout);
                    drop(held);
                    return refuse(context, &e, close);
                }
                (Then::Relay, None) => {
                    let e = error_of(Refusal::UpstreamFailed, &seen, &upstream, &detail);
                    return refuse(context, &e, tunnel);
                }
            }
        }
    }

    /// Carries out a verdict: the lease book's report, the site learning,
    /// the exchange's counters, the events.
    fn act(
        &self,
        verdict: &super::judge::Verdict,
        tried: &Tried<impl Sized>,
        upstream: &Upstream,
        context: &mut RequestContext,
        chooser: &Chooser,
    ) {
        let target = &context.admitted.ask.target;
        let proxy = upstream.proxy.to_string();
        match verdict.learned {
            Learned::Success => chooser.learn(target, &upstream.proxy, true),
            Learned::Failure => chooser.learn(target, &upstream.proxy, false),
            Learned::Nothing => {}
        }
        match verdict.report {
            Some(Outcome::Blocked) => {
                let status = match tried.seen {
                    Seen::SiteAnswered { status, .. } => status,
                    _ => 0,
                };
                context.exchange.blocked += 1;
                GatewayBlocked {
                    target,
                    proxy: &proxy,
                    status,
                }
                .emit();
                let detail = format!("gateway: {status} from {target} matched a block rule");
                self.leases
                    .report(upstream.lease_id.clone(), Outcome::Blocked, detail);
            }
            Some(outcome) => {
                context.rested_one = true;
                self.leases.report(
                    upstream.lease_id.clone(),
                    outcome,
                    format!("gateway: {}", tried.detail),
                );
            }
            None => {}
        }
        let failed =
            matches!(verdict.blame, Blame::Proxy | Blame::Site) && verdict.learned == Learned::Failure;
        if failed && verdict.report != Some(Outcome::Blocked) {
            if verdict.then == Then::Retry {
                context.exchange.failed_over += 1;
            }
            GatewayTryFailed {
                proxy: &proxy,
                blame: verdict.blame.label(),
                reason: if tried.seen == Seen::NoAnswer {
                    "upstream_timeout"
                } else {
                    "upstream_failed"
                },
                rested_everywhere: verdict.report == Some(Outcome::Error),
                error: &tried.detail,
            }
            .emit();
        } else if verdict.blame == Blame::Client {
            tracing::debug!(proxy = %proxy, error = %tried.detail, "gateway request failed on the client's side");
        }
    }
}

/// The gateway's answer for a refusal after a try through `upstream`.
fn error_of(why: Refusal, seen: &Seen, upstream: &Upstream, detail: &str) -> GatewayError {
    let proxy = upstream.proxy.to_string();
    match why {
        Refusal::UpstreamTimeout => GatewayError::TimedOut { proxy },
        Refusal::UpstreamFailed if *seen == Seen::NoAnswer => GatewayError::TimedOut { proxy },
        Refusal::UpstreamFailed => GatewayError::Upstream {
            proxy,
            why: detail.to_owned(),
        },
        Refusal::DestinationRefused => {
            GatewayError::DestinationRefused(format!("upstream proxy {proxy} refused it"))
        }
        Refusal::RequestRejected(status) => GatewayError::RequestRejected { proxy, status },
        Refusal::ClientBody => GatewayError::ClientBody(detail.to_owned()),
        Refusal::ClientTimeout => GatewayError::ClientTimeout,
    }
}

fn refuse(context: RequestContext, e: &GatewayError, close: bool) -> Response<ProxyBody> {
    let RequestContext {
        mut exchange,
        in_flight,
        ..
    } = context;
    refusal(e, &mut exchange, close, in_flight)
}
