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
use super::choose::Chooser;
use super::judge::{Blame, Circumstances, Learned, Refusal, Seen, Then, judge, same_answer};
use crate::adapters::gateway::blocks::BlockRules;
use crate::adapters::gateway::upstream::UpstreamPool;
use crate::adapters::gateway::{GatewayError, Leases, Upstream};
use crate::config::GatewaySettings;
use crate::forward_proxy::body::ProxyBody;
use crate::lease::Outcome;
use crate::telemetry::events::{GatewayBlocked, GatewayTryFailed};

pub(in crate::adapters::gateway) use self::plain::Plain;
pub(in crate::adapters::gateway) use self::tunnel::Tunnel;

/// How a request goes on once admitted.
pub(in crate::adapters::gateway) enum Hop {
    Plain(Plain),
    Tunnel(Tunnel),
}

/// What a try that got through hands on to the client.
pub(super) enum Answer {
    Plain(plain::Answer),
    Tunnel(tunnel::Answer),
}

/// One try: what it saw (for the judge), why (for logs and reports), and
/// the answer to relay if the judge says so.
pub(super) struct Tried {
    pub seen: Seen,
    pub detail: String,
    pub answer: Option<Answer>,
}

impl Tried {
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

    /// Tries `hop` on chosen proxies until the judge relays an answer or
    /// refuses; the response, or the gateway's own answer.
    pub async fn forward(
        &self,
        mut hop: Hop,
        mut context: RequestContext,
        chooser: &Chooser,
    ) -> Response<ProxyBody> {
        if let Hop::Plain(plain) = &mut hop {
            // A body within the bound is read whole, so that it can be sent again.
            match plain.keep_whole(self.retry_body_limit, self.idle_timeout).await {
                Ok(kept) => {
                    let up = &context.exchange.transferred.up;
                    up.fetch_add(kept, std::sync::atomic::Ordering::Relaxed);
                }
                Err(e) => return refuse(context, &e, true),
            }
        }
        let tunnel = matches!(hop, Hop::Tunnel(_));
        let mut last_failure = None;
        loop {
            let (upstream, held) = match chooser.lease(&mut context).await {
                Ok(leased) => leased,
                Err(e) => return refuse(context, &last_failure.unwrap_or(e), tunnel),
            };
            let tried = match &mut hop {
                Hop::Plain(plain) => plain.try_on(self, &upstream, &context).await,
                Hop::Tunnel(tunnel) => tunnel.try_on(self, &upstream, &context).await,
            };
            let can_retry = match &hop {
                Hop::Plain(plain) => plain.can_retry(),
                Hop::Tunnel(_) => true,
            } && context.exchange.tries < self.tries
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
                    return match (hop, answer) {
                        (Hop::Plain(_), Answer::Plain(answer)) => {
                            answer.relay(&self.pool, upstream, held, context, blocked)
                        }
                        (Hop::Tunnel(tunnel), Answer::Tunnel(answer)) => {
                            tunnel.relay(answer, &upstream, held, context, self.idle_timeout)
                        }
                        // A try answers the way it was asked.
                        _ => unreachable_answer(context),
                    };
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
        tried: &Tried,
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

fn unreachable_answer(context: RequestContext) -> Response<ProxyBody> {
    let e = GatewayError::LeaseStore("a try answered another kind of request".into());
    refuse(context, &e, true)
}
