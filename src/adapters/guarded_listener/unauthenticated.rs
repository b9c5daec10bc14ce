//! What one listener lets connections that have not authenticated hold
//! (its [`UnauthenticatedLimits`]), and how it refuses the rest: a short
//! canned answer naming the reason (in the listener's reason header, if it
//! has one), then a lingering close, counted in metrics and logged once
//! per burst.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use http::StatusCode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

use super::Bursts;
use super::head_budget::{HeadAllowance, HeadBudget};
use super::source_cap::{SourceCounts, SourceTicket};
use crate::domain::config::UnauthenticatedLimits;
use crate::telemetry::events::ConnectionRefused;

/// After its answer, a refused connection's further bytes are read and
/// dropped for up to this long, so that closing with unread bytes does not
/// reset the connection before the client has read the answer.
pub const LINGER: Duration = Duration::from_secs(2);
/// A burst of refusals of one kind ends after this long without one.
const BURST_QUIET: Duration = Duration::from_secs(10);

/// Why a connection that had not authenticated was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Its source holds the most unauthenticated connections it may.
    TooManyFromSource,
    /// Its unfinished head needed more than the shared budget had left.
    HeadBudgetExhausted,
    /// Its head grew past the largest head followed.
    HeadTooLarge,
}

impl Refusal {
    const ALL: [Refusal; 3] = [
        Refusal::TooManyFromSource,
        Refusal::HeadBudgetExhausted,
        Refusal::HeadTooLarge,
    ];

    pub fn status(self) -> StatusCode {
        match self {
            Refusal::TooManyFromSource => StatusCode::TOO_MANY_REQUESTS,
            Refusal::HeadBudgetExhausted | Refusal::HeadTooLarge => {
                StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE
            }
        }
    }

    /// The reason header's value and the metric's `reason` label.
    pub fn reason(self) -> &'static str {
        match self {
            Refusal::TooManyFromSource => "too_many_unauthenticated",
            Refusal::HeadBudgetExhausted => "head_budget_exhausted",
            Refusal::HeadTooLarge => "head_too_large",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// One listener's limits on unauthenticated connections and their state.
#[derive(Debug)]
pub struct Unauthenticated {
    limits: UnauthenticatedLimits,
    budget: Arc<HeadBudget>,
    sources: Arc<SourceCounts>,
    listener: &'static str,
    reason_header: Option<&'static str>,
    bursts: Mutex<[Bursts; 3]>,
}

impl Unauthenticated {
    /// For the listener `listener`, whose own answers carry their reason in
    /// `reason_header` (the gateway's `egress-gateway-error`).
    pub fn new(
        listener: &'static str,
        reason_header: Option<&'static str>,
        limits: UnauthenticatedLimits,
    ) -> Arc<Self> {
        Arc::new(Self {
            limits,
            budget: HeadBudget::new(limits.head_budget),
            sources: SourceCounts::new(limits.connections_per_source),
            listener,
            reason_header,
            bursts: Mutex::new(Refusal::ALL.map(|_| Bursts::new(BURST_QUIET))),
        })
    }

    pub fn limits(&self) -> &UnauthenticatedLimits {
        &self.limits
    }

    /// A new connection's allowance for its unfinished heads.
    pub fn allowance(&self) -> HeadAllowance {
        HeadAllowance::new(self.limits.free_head, self.budget.clone())
    }

    /// Counts a new connection against its source; `None`: refuse it.
    pub fn enter(&self, peer: SocketAddr) -> Option<SourceTicket> {
        self.sources.enter(peer.ip())
    }

    /// The canned answer to `refusal`: the connection closes after it.
    pub fn answer(&self, refusal: Refusal) -> Vec<u8> {
        let status = refusal.status();
        let mut head = format!(
            "HTTP/1.1 {} {}\r\nContent-Length: 0\r\nConnection: close\r\n",
            status.as_u16(),
            status.canonical_reason().unwrap_or_default()
        );
        if let Some(name) = self.reason_header {
            head.push_str(&format!("{name}: {}\r\n", refusal.reason()));
        }
        if refusal == Refusal::TooManyFromSource {
            head.push_str("Retry-After: 1\r\n");
        }
        head.push_str("\r\n");
        head.into_bytes()
    }

    /// Counts a refusal, and logs it if it starts a burst.
    pub fn refused(&self, refusal: Refusal, peer: SocketAddr) {
        let unlogged = self.bursts.lock().unwrap_or_else(PoisonError::into_inner)[refusal.index()]
            .occurred(Instant::now());
        ConnectionRefused {
            listener: self.listener,
            reason: refusal.reason(),
            status: refusal.status().as_u16(),
            peer,
            log: unlogged,
            budget_left: self.budget.left(),
            head_budget: self.limits.head_budget,
            connections_per_source: self.limits.connections_per_source,
        }
        .emit();
    }

    /// Answers a connection refused before it was served, then closes it
    /// (lingering, see [`LINGER`]).
    pub async fn refuse(&self, mut stream: TcpStream, peer: SocketAddr, refusal: Refusal) {
        self.refused(refusal, peer);
        let answer = self.answer(refusal);
        let _ = tokio::time::timeout(LINGER, async {
            stream.write_all(&answer).await?;
            stream.shutdown().await?;
            let mut sink = [0u8; 1024];
            while stream.read(&mut sink).await? > 0 {}
            Ok::<_, std::io::Error>(())
        })
        .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_canned_answers_name_their_reason_in_the_listener_s_header() {
        let gateway = Unauthenticated::new(
            "gateway",
            Some("egress-gateway-error"),
            UnauthenticatedLimits::default(),
        );
        let text = String::from_utf8(gateway.answer(Refusal::HeadBudgetExhausted)).unwrap();
        assert_eq!(
            text,
            "HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Length: 0\r\nConnection: close\r\n\
             egress-gateway-error: head_budget_exhausted\r\n\r\n"
        );
        let text = String::from_utf8(gateway.answer(Refusal::TooManyFromSource)).unwrap();
        assert!(text.starts_with("HTTP/1.1 429 Too Many Requests\r\n"), "{text}");
        assert!(
            text.contains("egress-gateway-error: too_many_unauthenticated\r\nRetry-After: 1\r\n"),
            "{text}"
        );
        let proxy = Unauthenticated::new("forward-proxy", None, UnauthenticatedLimits::default());
        let text = String::from_utf8(proxy.answer(Refusal::HeadTooLarge)).unwrap();
        assert!(!text.contains("error"), "{text}");
        let statuses = Refusal::ALL.map(|r| r.status().as_u16());
        assert_eq!(statuses, [429, 431, 431]);
    }
}
