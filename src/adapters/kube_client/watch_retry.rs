//! When a watch tries again after an error. kube-runtime's
//! `default_backoff` doubles from 800 ms to 30 s and resets only on an
//! event, so through an API-server outage it grows with every refused
//! connection, and the `410 Expired` that greets the resumed watch (a
//! restarted API server's watch cache starts afresh) doubles it once more:
//! after a 12 s outage a deletion made meanwhile was seen 25 s after the
//! server was back. Here the pause depends on what the error says:
//!
//! - **no answer** (connection refused or reset, a broken stream): nothing
//!   reaches the server, so trying costs it nothing; the pause doubles from
//!   500 ms to at most 2 s, and the watch is back within about 2 s of the
//!   server's return;
//! - **410 Expired/Gone**: the server is back and the watcher has dropped its
//!   resourceVersion; it re-lists at once (once per [`RELIST_AGAIN_AFTER`];
//!   a server that keeps answering 410 gets the pause of a refusal);
//! - **another error status** (429, 5xx, 403): the server answers but
//!   refuses; the pause doubles from 800 ms to 30 s, as client-go's
//!   reflector does, to spare a struggling server.
//!
//! Every event resets both pauses: the first successful response after an
//! outage ends its backoff. Pauses are spread ±20 % so replicas and
//! watches do not retry in step. The two ladders are
//! [`ladders::WATCH_UNREACHABLE`] and [`ladders::WATCH_REFUSED`].

use std::time::{Duration, Instant};

use futures::{Stream, StreamExt};
use kube::runtime::watcher::{self, Event};

use crate::domain::backoff::{Attempts, ladders};

/// A 410 re-lists at once only if the last immediate re-list was longer ago.
pub const RELIST_AGAIN_AFTER: Duration = Duration::from_secs(10);

/// What a watch error says about the API server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WatchFailure {
    /// No answer: refused, reset, timed out, or the stream broke.
    Unreachable,
    /// 410: the resourceVersion is too old; only a re-list goes on.
    Expired,
    /// Any other answer with an error status.
    Refused,
}

impl WatchFailure {
    pub fn of(error: &watcher::Error) -> Self {
        let status = |code: u16| if code == 410 { Self::Expired } else { Self::Refused };
        match error {
            watcher::Error::WatchError(s) => status(s.code),
            watcher::Error::InitialListFailed(e)
            | watcher::Error::WatchStartFailed(e)
            | watcher::Error::WatchFailed(e) => match e {
                kube::Error::Api(s) => status(s.code),
                _ => Self::Unreachable,
            },
            watcher::Error::NoResourceVersion => Self::Refused,
        }
    }
}

/// The pause of one watch between its errors.
#[derive(Debug, Default)]
pub struct WatchRetry {
    unreachable: Attempts,
    refused: Attempts,
    /// When a 410 last led to an immediate re-list (not reset by events).
    last_relist: Option<Instant>,
}

impl WatchRetry {
    /// An event arrived: the next error starts from the first pause.
    pub fn succeeded(&mut self) {
        self.unreachable.reset();
        self.refused.reset();
    }

    /// How long to wait before the watcher tries again; `jitter` in [0, 1)
    /// spreads the pause by ±20 %.
    pub fn pause_after(&mut self, failure: WatchFailure, now: Instant, jitter: f64) -> Duration {
        match failure {
            WatchFailure::Expired
                if self
                    .last_relist
                    .is_none_or(|at| now.saturating_duration_since(at) >= RELIST_AGAIN_AFTER) =>
            {
                self.last_relist = Some(now);
                self.succeeded();
                Duration::ZERO
            }
            WatchFailure::Unreachable => self.unreachable.next_delay(&ladders::WATCH_UNREACHABLE, jitter),
            WatchFailure::Expired | WatchFailure::Refused => {
                self.refused.next_delay(&ladders::WATCH_REFUSED, jitter)
            }
        }
    }

    /// Logs `error` and waits as [`Self::pause_after`] says.
    pub async fn wait_after(&mut self, error: &watcher::Error, what: &str) {
        let failure = WatchFailure::of(error);
        let pause = self.pause_after(failure, Instant::now(), fastrand::f64());
        if failure == WatchFailure::Expired && pause.is_zero() {
            tracing::info!(error = %error, "watching {what}: resourceVersion expired; listing again at once");
        } else {
            tracing::warn!(error = %error, retryIn = ?pause, "watching {what} failed; retrying with backoff");
        }
        tokio::time::sleep(pause).await;
    }
}

/// A watch's events, its errors waited out as [`WatchRetry`] says (and
/// logged, naming the watch `what`) while the watcher re-lists and resumes
/// by itself. Ends when the watch does.
pub fn retrying<'a, K>(
    watch: impl Stream<Item = Result<Event<K>, watcher::Error>> + Send + 'a,
    what: &'a str,
) -> impl Stream<Item = Event<K>> + Send + 'a
where
    K: Send + 'a,
{
    let state = (watch.boxed(), WatchRetry::default());
    futures::stream::unfold(state, move |(mut watch, mut retry)| async move {
        loop {
            match watch.next().await? {
                Ok(event) => {
                    retry.succeeded();
                    return Some((event, (watch, retry)));
                }
                Err(e) => retry.wait_after(&e, what).await,
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pauses(retry: &mut WatchRetry, failure: WatchFailure, n: usize, now: Instant) -> Vec<Duration> {
        (0..n).map(|_| retry.pause_after(failure, now, 0.5)).collect()
    }

    #[test]
    fn an_unreachable_server_is_retried_at_least_every_two_seconds() {
        let mut retry = WatchRetry::default();
        let now = Instant::now();
        let ms = |v: u64| Duration::from_millis(v);
        assert_eq!(
            pauses(&mut retry, WatchFailure::Unreachable, 6, now),
            [ms(500), ms(1000), ms(2000), ms(2000), ms(2000), ms(2000)]
        );
        // Jitter spreads by ±20 % at most.
        assert_eq!(retry.pause_after(WatchFailure::Unreachable, now, 0.0), ms(1600));
        let most = retry.pause_after(WatchFailure::Unreachable, now, 0.999_999);
        assert!(most < ms(2400) && most > ms(2399), "{most:?}");
    }

    #[test]
    fn the_410_after_an_outage_relists_at_once_and_resets() {
        let mut retry = WatchRetry::default();
        let now = Instant::now();
        pauses(&mut retry, WatchFailure::Unreachable, 20, now);
        assert_eq!(retry.pause_after(WatchFailure::Expired, now, 0.5), Duration::ZERO);
        // The growth is gone: a later cut starts from the first pause.
        assert_eq!(
            retry.pause_after(WatchFailure::Unreachable, now, 0.5),
            Duration::from_millis(500)
        );
        // A server answering 410 again and again is not hammered.
        let soon = now + Duration::from_secs(1);
        assert_eq!(
            retry.pause_after(WatchFailure::Expired, soon, 0.5),
            Duration::from_millis(800)
        );
        let later = now + RELIST_AGAIN_AFTER;
        assert_eq!(
            retry.pause_after(WatchFailure::Expired, later, 0.5),
            Duration::ZERO
        );
    }

    #[test]
    fn refusals_back_off_like_client_go_and_an_event_resets_everything() {
        let mut retry = WatchRetry::default();
        let now = Instant::now();
        let p = pauses(&mut retry, WatchFailure::Refused, 8, now);
        assert_eq!(p[0], Duration::from_millis(800));
        assert_eq!(p[1], Duration::from_millis(1600));
        assert_eq!(p[7], Duration::from_secs(30));
        pauses(&mut retry, WatchFailure::Unreachable, 3, now);
        retry.succeeded();
        assert_eq!(
            retry.pause_after(WatchFailure::Refused, now, 0.5),
            Duration::from_millis(800)
        );
        assert_eq!(
            retry.pause_after(WatchFailure::Unreachable, now, 0.5),
            Duration::from_millis(500)
        );
    }

    #[test]
    fn errors_are_told_apart_by_what_the_server_said() {
        let status = |code: u16| kube::core::Status::failure("x", "Expired").with_code(code);
        assert_eq!(
            WatchFailure::of(&watcher::Error::WatchError(Box::new(status(410)))),
            WatchFailure::Expired
        );
        assert_eq!(
            WatchFailure::of(&watcher::Error::WatchError(Box::new(status(500)))),
            WatchFailure::Refused
        );
        assert_eq!(
            WatchFailure::of(&watcher::Error::NoResourceVersion),
            WatchFailure::Refused
        );
    }

    #[tokio::test]
    async fn a_retrying_watch_yields_its_events_past_its_errors_and_ends_with_it() {
        let expired = || {
            watcher::Error::WatchError(Box::new(
                kube::core::Status::failure("x", "Expired").with_code(410),
            ))
        };
        let watch = futures::stream::iter([Ok(Event::Apply(1u32)), Err(expired()), Ok(Event::Delete(2))]);
        let seen: Vec<String> = retrying(watch, "numbers")
            .map(|e| match e {
                Event::Apply(n) => format!("apply {n}"),
                Event::Delete(n) => format!("delete {n}"),
                _ => "other".to_owned(),
            })
            .collect()
            .await;
        assert_eq!(seen, ["apply 1", "delete 2"]);
    }
}
