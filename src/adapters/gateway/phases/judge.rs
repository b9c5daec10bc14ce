//! The judge: who is to blame for what one try of a request saw, and what
//! follows (pure; the forward phase observes, this decides, the forward
//! phase acts). Three parties can fail a request:
//!
//! - the **proxy**: no connection to it, a connection that breaks before
//!   any answer, an answer that is not HTTP, or its own `407` — its own,
//!   because the challenge names the realm the gateway knows the proxy by
//!   (every proxy the operator creates has one of its own, derived from
//!   secret credentials; a site cannot name it), or because it answers a
//!   `CONNECT`, which no site ever sees. Only the proxy's fault rests it
//!   for every target (an `error` report), and only once per request: one
//!   request is one witness and never takes a second proxy out of service
//!   fleet-wide (the health engine judges the others);
//! - the **site**: anything it answered (a `407` or `5xx` included), and
//!   what the proxy says about reaching it (its own error page, a refused
//!   `CONNECT`, no answer in time). That rests at most the (proxy, site)
//!   pair: a block rule's match is reported `blocked`, a failure through
//!   this proxy is remembered by the site learning. A site that answers a
//!   second proxy the same way is the site's doing: the request stops
//!   there, nothing more is blamed;
//! - the **client**: its body (malformed, aborted) or its stall. Nothing
//!   rests, nothing is tried again, the client gets a 4xx.

use crate::domain::lease::Outcome;

/// What one try saw, as the forward phase observed it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Seen {
    /// The tunnel opened (the proxy answered the `CONNECT` with `200`).
    Opened,
    /// The site's answer, and whether a block rule matched it.
    SiteAnswered { status: u16, blocked: bool },
    /// No connection to the proxy, or it broke before any answer.
    ProxyUnreachable,
    /// The proxy answered something that is not a proxy's answer (a `101`
    /// nobody asked for, a malformed head).
    ProxyBroken,
    /// A `407` and the realm its challenge names, if any.
    AuthenticationRequired { realm: Option<String> },
    /// The proxy's own answer that it could not reach the site: its error
    /// page (Squid's, or a `5xx` with `Proxy-Status`), a `CONNECT` it did
    /// not open.
    SiteUnreachable { status: u16 },
    /// No answer before the idle timeout or the deadline.
    NoAnswer,
    /// The proxy's rules refused the destination (its own `403`).
    DestinationRefused,
    /// Another answer of the proxy's own about the request itself (a
    /// Squid `400`, `411`, `414`...).
    RequestRejected { status: u16 },
    /// The client's request body failed: malformed, or the client stopped
    /// sending it.
    ClientBodyFailed,
    /// The client sent nothing for the idle timeout while the request
    /// needed its body.
    ClientStalled,
}

/// What the judge knows beyond the try itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Circumstances<'a> {
    /// A plain request (not a `CONNECT`).
    pub plain: bool,
    /// The realm the leased proxy's own challenges name, when known.
    pub proxy_realm: Option<&'a str>,
    /// A proxy was already rested for every target during this request.
    pub rested_one: bool,
    /// Another proxy already saw the same class of answer in this request.
    pub seen_elsewhere: bool,
    /// Another try is possible: tries and time are left, and the request's
    /// body can be sent again.
    pub can_retry: bool,
    /// `retryOnBlock`.
    pub retry_on_block: bool,
}

/// Who is to blame for a try's outcome.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Blame {
    Nobody,
    Proxy,
    Site,
    Client,
}

impl Blame {
    pub fn label(self) -> &'static str {
        match self {
            Self::Nobody => "nobody",
            Self::Proxy => "proxy",
            Self::Site => "site",
            Self::Client => "client",
        }
    }
}

/// What the site learning hears of a try.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Learned {
    /// Says nothing about how this proxy does for this site.
    Nothing,
    /// The site answered through this proxy.
    Success,
    /// This proxy did not get a usable answer from this site.
    Failure,
}

/// How the request goes on after the try.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Then {
    /// Hand this try's answer (or tunnel) to the client.
    Relay,
    /// Try another proxy.
    Retry,
    /// Answer the client with the gateway's own refusal.
    Refuse(Refusal),
}

/// The gateway's own answers after a try (see `GatewayError`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// `502 upstream_failed`: no proxy got an answer from the site.
    UpstreamFailed,
    /// `504 upstream_timeout`.
    UpstreamTimeout,
    /// `403 destination_refused`: the proxy's rules refused it.
    DestinationRefused,
    /// The proxy's own 4xx about the request, passed on as its status.
    RequestRejected(u16),
    /// `400 bad_request_body`: the client's body failed.
    ClientBody,
    /// `408 client_timeout`.
    ClientTimeout,
}

/// The judge's decision on one try.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Verdict {
    pub blame: Blame,
    /// What the lease book hears: `error` rests the proxy for every
    /// target, `blocked` for this site.
    pub report: Option<Outcome>,
    pub learned: Learned,
    pub then: Then,
}

const fn verdict(blame: Blame, report: Option<Outcome>, learned: Learned, then: Then) -> Verdict {
    Verdict {
        blame,
        report,
        learned,
        then,
    }
}

/// Judges one try.
pub fn judge(seen: &Seen, at: Circumstances<'_>) -> Verdict {
    use Blame::{Client, Nobody, Proxy, Site};
    use Learned::{Failure, Nothing, Success};
    let retry_or = |refusal| {
        if at.can_retry {
            Then::Retry
        } else {
            Then::Refuse(refusal)
        }
    };
    // The proxy's own fault: rested for every target, once per request.
    let proxy_failed = |refusal| {
        let report = (!at.rested_one).then_some(Outcome::Error);
        verdict(Proxy, report, Failure, retry_or(refusal))
    };
    // The site failed through this proxy: another proxy may do better,
    // unless one already saw the same.
    let site_failed = |refusal| {
        if at.seen_elsewhere {
            verdict(Site, None, Failure, Then::Refuse(refusal))
        } else {
            verdict(Site, None, Failure, retry_or(refusal))
        }
    };
    match seen {
        Seen::Opened => verdict(Nobody, None, Success, Then::Relay),
        // The site's answer is relayed; a refusal-like one still teaches
        // the learning that this proxy does not get through here.
        Seen::SiteAnswered {
            status,
            blocked: false,
        } => {
            let learned = if refusal_like(*status) { Failure } else { Success };
            verdict(Nobody, None, learned, Then::Relay)
        }
        Seen::SiteAnswered { blocked: true, .. } => {
            let then = if at.retry_on_block && at.can_retry {
                Then::Retry
            } else {
                Then::Relay
            };
            verdict(Site, Some(Outcome::Blocked), Failure, then)
        }
        Seen::ProxyUnreachable | Seen::ProxyBroken => proxy_failed(Refusal::UpstreamFailed),
        Seen::AuthenticationRequired { realm } => {
            let own = !at.plain || (at.proxy_realm.is_some() && realm.as_deref() == at.proxy_realm);
            if own {
                proxy_failed(Refusal::UpstreamFailed)
            } else if at.proxy_realm.is_some() || at.seen_elsewhere {
                // Not the realm the proxy names (or a second proxy saw the
                // same): the site's own `407`, relayed like any answer.
                verdict(Site, None, Nothing, Then::Relay)
            } else {
                // A proxy whose realm is unknown (External): its or the
                // site's; another proxy tells.
                verdict(
                    Site,
                    None,
                    Failure,
                    if at.can_retry { Then::Retry } else { Then::Relay },
                )
            }
        }
        Seen::SiteUnreachable { .. } => site_failed(Refusal::UpstreamFailed),
        Seen::NoAnswer => site_failed(Refusal::UpstreamTimeout),
        Seen::DestinationRefused => verdict(Nobody, None, Nothing, Then::Refuse(Refusal::DestinationRefused)),
        Seen::RequestRejected { status } => verdict(
            Client,
            None,
            Nothing,
            Then::Refuse(Refusal::RequestRejected(*status)),
        ),
        Seen::ClientBodyFailed => verdict(Client, None, Nothing, Then::Refuse(Refusal::ClientBody)),
        Seen::ClientStalled => verdict(Client, None, Nothing, Then::Refuse(Refusal::ClientTimeout)),
    }
}

/// A site's answer that says "not through this address" rather than
/// "here is the page": refused (`403`), throttled (`429`), failed (`5xx`).
pub fn refusal_like(status: u16) -> bool {
    status == 403 || status == 429 || status >= 500
}

/// Whether two tries saw the same class of answer (a site answering every
/// proxy the same way).
pub fn same_answer(a: &Seen, b: &Seen) -> bool {
    match (a, b) {
        (Seen::SiteUnreachable { status: x }, Seen::SiteUnreachable { status: y }) => x == y,
        (Seen::AuthenticationRequired { realm: x }, Seen::AuthenticationRequired { realm: y }) => x == y,
        (Seen::NoAnswer, Seen::NoAnswer) => true,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Blame::{Client, Nobody, Proxy, Site};
    use Learned::{Failure, Nothing, Success};
    use Outcome::{Blocked, Error};
    use Then::{Refuse, Relay, Retry};

    const REALM: Option<&str> = Some("egress-proxies-5f1c");

    fn plain() -> Circumstances<'static> {
        Circumstances {
            plain: true,
            proxy_realm: REALM,
            rested_one: false,
            seen_elsewhere: false,
            can_retry: true,
            retry_on_block: true,
        }
    }

    fn auth(realm: Option<&str>) -> Seen {
        Seen::AuthenticationRequired {
            realm: realm.map(str::to_owned),
        }
    }

    /// One row per outcome class: what was seen, in which circumstances,
    /// and the verdict (blame, report, learned, then).
    #[test]
    fn every_outcome_has_its_verdict() {
        let tunnel = Circumstances {
            plain: false,
            ..plain()
        };
        let last_try = Circumstances {
            can_retry: false,
            ..plain()
        };
        let rested = Circumstances {
            rested_one: true,
            ..plain()
        };
        let again = Circumstances {
            seen_elsewhere: true,
            ..plain()
        };
        let external = Circumstances {
            proxy_realm: None,
            ..plain()
        };
        let no_retry_on_block = Circumstances {
            retry_on_block: false,
            ..plain()
        };
        let ok = Seen::SiteAnswered {
            status: 200,
            blocked: false,
        };
        let block = Seen::SiteAnswered {
            status: 403,
            blocked: true,
        };
        let five = Seen::SiteUnreachable { status: 502 };
        #[rustfmt::skip]
        let table: Vec<(&str, Seen, Circumstances, Verdict)> = vec![
            ("tunnel opened", Seen::Opened, tunnel, verdict(Nobody, None, Success, Relay)),
            ("site answered", ok.clone(), plain(), verdict(Nobody, None, Success, Relay)),
            ("site's 404 is its answer", Seen::SiteAnswered { status: 404, blocked: false }, plain(), verdict(Nobody, None, Success, Relay)),
            ("site's 500 is relayed, learnt", Seen::SiteAnswered { status: 500, blocked: false }, plain(), verdict(Nobody, None, Failure, Relay)),
            ("site's 403 is relayed, learnt", Seen::SiteAnswered { status: 403, blocked: false }, plain(), verdict(Nobody, None, Failure, Relay)),
            ("block, tried elsewhere", block.clone(), plain(), verdict(Site, Some(Blocked), Failure, Retry)),
            ("block on the last try", block.clone(), last_try, verdict(Site, Some(Blocked), Failure, Relay)),
            ("block, retries off", block, no_retry_on_block, verdict(Site, Some(Blocked), Failure, Relay)),
            ("proxy unreachable", Seen::ProxyUnreachable, plain(), verdict(Proxy, Some(Error), Failure, Retry)),
            ("proxy broken", Seen::ProxyBroken, plain(), verdict(Proxy, Some(Error), Failure, Retry)),
            ("proxy unreachable, last try", Seen::ProxyUnreachable, last_try, verdict(Proxy, Some(Error), Failure, Refuse(Refusal::UpstreamFailed))),
            ("second proxy at fault in one request", Seen::ProxyUnreachable, rested, verdict(Proxy, None, Failure, Retry)),
            ("proxy's own 407 (its realm)", auth(REALM), plain(), verdict(Proxy, Some(Error), Failure, Retry)),
            ("a 407 to CONNECT is the proxy's", auth(None), tunnel, verdict(Proxy, Some(Error), Failure, Retry)),
            ("site's 407 (another realm)", auth(Some("site")), plain(), verdict(Site, None, Nothing, Relay)),
            ("site's 407 (no challenge)", auth(None), plain(), verdict(Site, None, Nothing, Relay)),
            ("407 from a proxy of unknown realm", auth(Some("x")), external, verdict(Site, None, Failure, Retry)),
            ("407 of unknown realm, last try", auth(Some("x")), Circumstances { can_retry: false, ..external }, verdict(Site, None, Failure, Relay)),
            ("407 of unknown realm, twice", auth(Some("x")), Circumstances { seen_elsewhere: true, ..external }, verdict(Site, None, Nothing, Relay)),
            ("proxy could not reach the site", five.clone(), plain(), verdict(Site, None, Failure, Retry)),
            ("a second proxy could not either", five, again, verdict(Site, None, Failure, Refuse(Refusal::UpstreamFailed))),
            ("no answer in time", Seen::NoAnswer, plain(), verdict(Site, None, Failure, Retry)),
            ("no answer, last try", Seen::NoAnswer, last_try, verdict(Site, None, Failure, Refuse(Refusal::UpstreamTimeout))),
            ("proxy's rules refused it", Seen::DestinationRefused, plain(), verdict(Nobody, None, Nothing, Refuse(Refusal::DestinationRefused))),
            ("proxy rejected the request", Seen::RequestRejected { status: 400 }, plain(), verdict(Client, None, Nothing, Refuse(Refusal::RequestRejected(400)))),
            ("client's body failed", Seen::ClientBodyFailed, plain(), verdict(Client, None, Nothing, Refuse(Refusal::ClientBody))),
            ("client stalled", Seen::ClientStalled, plain(), verdict(Client, None, Nothing, Refuse(Refusal::ClientTimeout))),
        ];
        for (row, seen, at, want) in table {
            assert_eq!(judge(&seen, at), want, "{row}");
        }
    }

    #[test]
    fn only_the_proxy_s_fault_rests_it_everywhere_and_once_per_request() {
        let all = [
            Seen::Opened,
            Seen::SiteAnswered {
                status: 407,
                blocked: false,
            },
            Seen::SiteAnswered {
                status: 500,
                blocked: true,
            },
            Seen::ProxyUnreachable,
            Seen::ProxyBroken,
            auth(REALM),
            auth(Some("site")),
            auth(None),
            Seen::SiteUnreachable { status: 500 },
            Seen::NoAnswer,
            Seen::DestinationRefused,
            Seen::RequestRejected { status: 400 },
            Seen::ClientBodyFailed,
            Seen::ClientStalled,
        ];
        for seen in &all {
            for plain in [true, false] {
                for realm in [REALM, None] {
                    for rested_one in [false, true] {
                        let at = Circumstances {
                            plain,
                            proxy_realm: realm,
                            rested_one,
                            ..super::tests::plain()
                        };
                        let v = judge(seen, at);
                        if v.report == Some(Outcome::Error) {
                            assert_eq!(v.blame, Blame::Proxy, "{seen:?} {at:?}");
                            assert!(!rested_one, "a second fleet-wide rest: {seen:?} {at:?}");
                        }
                        if v.blame == Blame::Client {
                            assert_eq!(v.report, None, "{seen:?}");
                            assert!(matches!(v.then, Then::Refuse(_)), "{seen:?}: never retried");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn the_same_answer_from_two_proxies_is_recognised() {
        assert!(same_answer(
            &Seen::SiteUnreachable { status: 500 },
            &Seen::SiteUnreachable { status: 500 }
        ));
        assert!(!same_answer(
            &Seen::SiteUnreachable { status: 500 },
            &Seen::SiteUnreachable { status: 502 }
        ));
        assert!(same_answer(&auth(Some("a")), &auth(Some("a"))));
        assert!(!same_answer(&auth(Some("a")), &auth(Some("b"))));
        assert!(same_answer(&Seen::NoAnswer, &Seen::NoAnswer));
        assert!(!same_answer(&Seen::ProxyUnreachable, &Seen::ProxyUnreachable));
    }
}
