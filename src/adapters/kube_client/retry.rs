//! Whether and when a request the API server refused is sent again. Pure:
//! the jitter is passed in.
//!
//! Retried: `429` answers to any request but a watch (API Priority and
//! Fairness, or the max-in-flight filter, refused it before acting on it),
//! and `503` answers to reads, or to writes when the answer names a
//! `Retry-After` (the server deferred it). Never a watch: its caller
//! re-lists and watches again on its own schedule. At most
//! [`RetryRules::max_retries`] times, never waiting more than
//! [`RetryRules::max_wait`] in all: past that the caller gets the `429`.

use std::time::Duration;

use http::StatusCode;

use super::request::ApiRequest;
use crate::domain::backoff::{Backoff, ladders};

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RetryRules {
    pub max_retries: u32,
    /// The retry waits of one request together.
    pub max_wait: Duration,
    /// The wait without `Retry-After` ([`ladders::KUBE_API_REFUSED`]).
    pub backoff: Backoff,
}

impl Default for RetryRules {
    fn default() -> Self {
        Self {
            max_retries: 3,
            max_wait: Duration::from_secs(60),
            backoff: ladders::KUBE_API_REFUSED,
        }
    }
}

/// Why a request waits before its next try.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitSource {
    /// The server's `Retry-After`.
    RetryAfter,
    /// No `Retry-After` (or a shorter one than the backoff): exponential backoff.
    Backoff,
    /// The client-side budget (`--kube-api-qps`).
    Budget,
}

impl WaitSource {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::RetryAfter => "retry_after",
            Self::Backoff => "backoff",
            Self::Budget => "budget",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RetryWait {
    pub delay: Duration,
    pub source: WaitSource,
}

impl RetryRules {
    /// The wait before trying `request` again after `status`, or `None`
    /// to hand the answer to the caller. `retries` and `waited` are the
    /// request's retries and retry waits so far; `jitter` is uniform in
    /// [0, 1).
    pub fn decide(
        &self,
        request: &ApiRequest,
        status: StatusCode,
        retry_after: Option<&str>,
        retries: u32,
        waited: Duration,
        jitter: f64,
    ) -> Option<RetryWait> {
        if request.is_watch() || retries >= self.max_retries {
            return None;
        }
        let server_delay = retry_after.and_then(parse_retry_after);
        let refused = match status {
            StatusCode::TOO_MANY_REQUESTS => true,
            StatusCode::SERVICE_UNAVAILABLE => request.verb.is_read() || server_delay.is_some(),
            _ => false,
        };
        if !refused {
            return None;
        }
        // Full backoff halved by jitter: [b/2, b), so that clients refused
        // together do not come back together.
        let jitter = jitter.clamp(0.0, 1.0);
        let backoff = self.backoff.delay(retries, jitter);
        // Never sooner than the server asked, and spread over a quarter of
        // its delay after that: the requests it refused in one second do
        // not all return in the same instant to be refused again. Never a
        // tight loop when it says 0.
        let wait = match server_delay {
            Some(server) if server >= backoff => RetryWait {
                delay: server + server.mul_f64(jitter / 4.0),
                source: WaitSource::RetryAfter,
            },
            _ => RetryWait {
                delay: backoff,
                source: WaitSource::Backoff,
            },
        };
        (waited.saturating_add(wait.delay) <= self.max_wait).then_some(wait)
    }
}

/// `Retry-After` in seconds, as the API server sends it (an HTTP date is
/// not used by it, and is treated as absent).
pub fn parse_retry_after(value: &str) -> Option<Duration> {
    value.trim().parse::<u64>().ok().map(Duration::from_secs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Method;

    fn get() -> ApiRequest {
        ApiRequest::of(
            &Method::GET,
            "/apis/crawl.example.com/v1alpha1/namespaces/d/proxies/p",
        )
    }

    fn patch() -> ApiRequest {
        ApiRequest::of(
            &Method::PATCH,
            "/apis/crawl.example.com/v1alpha1/namespaces/d/proxies/p/status",
        )
    }

    fn watch() -> ApiRequest {
        ApiRequest::of(
            &Method::GET,
            "/apis/crawl.example.com/v1alpha1/proxies?watch=true",
        )
    }

    const TOO_MANY: StatusCode = StatusCode::TOO_MANY_REQUESTS;
    const UNAVAILABLE: StatusCode = StatusCode::SERVICE_UNAVAILABLE;

    #[test]
    fn retry_after_is_honoured() {
        let rules = RetryRules::default();
        let wait = rules.decide(&get(), TOO_MANY, Some("7"), 0, Duration::ZERO, 0.0);
        assert_eq!(
            wait,
            Some(RetryWait {
                delay: Duration::from_secs(7),
                source: WaitSource::RetryAfter
            })
        );
        // Refused together, back spread over the next quarter of the delay.
        let spread = |jitter| {
            rules
                .decide(&get(), TOO_MANY, Some("4"), 0, Duration::ZERO, jitter)
                .map(|w| w.delay)
        };
        assert_eq!(spread(0.5), Some(Duration::from_millis(4_500)));
        assert!(spread(0.999_999).is_some_and(|d| d < Duration::from_secs(5)));
        // A refused write was never acted on: it is sent again too.
        assert!(
            rules
                .decide(&patch(), TOO_MANY, Some("1"), 0, Duration::ZERO, 0.0)
                .is_some()
        );
    }

    #[test]
    fn without_retry_after_the_backoff_doubles_with_jitter() {
        let rules = RetryRules::default();
        let delays: Vec<Duration> = (0..3)
            .filter_map(|n| rules.decide(&get(), TOO_MANY, None, n, Duration::ZERO, 0.0))
            .map(|w| {
                assert_eq!(w.source, WaitSource::Backoff);
                w.delay
            })
            .collect();
        assert_eq!(delays, [250, 500, 1000].map(Duration::from_millis).to_vec());
        let most = rules.decide(&get(), TOO_MANY, None, 0, Duration::ZERO, 0.999_999);
        assert!(most.is_some_and(|w| w.delay < Duration::from_millis(500)));
        // Retry-After: 0 is no licence for a tight loop.
        let zero = rules.decide(&get(), TOO_MANY, Some("0"), 0, Duration::ZERO, 0.0);
        assert_eq!(zero.map(|w| w.delay), Some(Duration::from_millis(250)));
        // A date (not what the API server sends) counts as no Retry-After.
        let date = rules.decide(
            &get(),
            TOO_MANY,
            Some("Wed, 21 Oct 2015 07:28:00 GMT"),
            0,
            Duration::ZERO,
            0.0,
        );
        assert_eq!(date.map(|w| w.source), Some(WaitSource::Backoff));
    }

    #[test]
    fn retries_and_waits_are_bounded() {
        let rules = RetryRules::default();
        assert!(
            rules
                .decide(&get(), TOO_MANY, Some("1"), 3, Duration::ZERO, 0.0)
                .is_none()
        );
        // An hour's Retry-After is handed to the caller, not slept through.
        assert!(
            rules
                .decide(&get(), TOO_MANY, Some("3600"), 0, Duration::ZERO, 0.0)
                .is_none()
        );
        assert!(
            rules
                .decide(&get(), TOO_MANY, Some("30"), 1, Duration::from_secs(30), 0.0)
                .is_some()
        );
        assert!(
            rules
                .decide(&get(), TOO_MANY, Some("31"), 1, Duration::from_secs(30), 0.0)
                .is_none()
        );
    }

    #[test]
    fn only_refusals_of_repeatable_requests_are_retried() {
        let rules = RetryRules::default();
        let z = Duration::ZERO;
        assert!(rules.decide(&watch(), TOO_MANY, Some("1"), 0, z, 0.0).is_none());
        assert!(rules.decide(&get(), UNAVAILABLE, None, 0, z, 0.0).is_some());
        // A write answered 503 without Retry-After may have been acted on.
        assert!(rules.decide(&patch(), UNAVAILABLE, None, 0, z, 0.0).is_none());
        assert!(
            rules
                .decide(&patch(), UNAVAILABLE, Some("2"), 0, z, 0.0)
                .is_some()
        );
        for status in [
            StatusCode::OK,
            StatusCode::CONFLICT,
            StatusCode::INTERNAL_SERVER_ERROR,
            StatusCode::GATEWAY_TIMEOUT,
        ] {
            assert!(
                rules.decide(&get(), status, Some("1"), 0, z, 0.0).is_none(),
                "{status}"
            );
        }
    }
}
