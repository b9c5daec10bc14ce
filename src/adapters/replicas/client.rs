//! A member's calls to other replicas over plain HTTP on the internal
//! listener: the sync with the leader — one long-poll the leader may hold
//! up to `hold` while it has no news, and immediate pushes when the member
//! has news of its own — and lease calls forwarded to the replica holding
//! the lease. Every call carries the replicas' token ([`ReplicaToken`])
//! and has a deadline: a leader that stops answering is noticed within the
//! hold plus [`SyncTimings::answer_within`].
//!
//! A sync answer comes with the instant its request was sent: the share it
//! carries is valid from then (on this member's monotonic clock), not from
//! when the answer arrived, so a slow answer never stretches a share.

use std::time::{Duration, Instant};

use bytes::Bytes;

use super::ReplicaError;
use super::token::ReplicaToken;
use super::wire::{ForwardedLeaseCall, SYNC_PATH, SyncRequest, SyncResponse, lease_path};
use crate::adapters::discovery_api::bodies::ErrorBody;
use crate::telemetry::events::LeaseForwarded;

/// How long a sync call may take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SyncTimings {
    /// How long the leader may hold a long-poll without news.
    pub hold: Duration,
    /// How long an answer may take beyond the hold (and a push or a
    /// forwarded call in all).
    pub answer_within: Duration,
    /// How long connecting may take.
    pub connect_within: Duration,
}

impl Default for SyncTimings {
    fn default() -> Self {
        Self {
            hold: super::wire::DEFAULT_HOLD,
            answer_within: Duration::from_secs(2),
            connect_within: Duration::from_secs(1),
        }
    }
}

/// A sync answer and when its request was sent.
#[derive(Clone, Debug, PartialEq)]
pub struct Synced {
    pub response: SyncResponse,
    /// Taken just before the request went out.
    pub sent_at: Instant,
}

/// What the holder of a lease answered to a forwarded call: passed on to
/// the client as it is (status, `Retry-After`, body).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ForwardedAnswer {
    pub status: u16,
    pub retry_after: Option<String>,
    pub content_type: Option<String>,
    pub body: Bytes,
}

/// The HTTP client of one replica's calls to the others.
#[derive(Clone)]
pub struct ReplicaClient {
    http: reqwest::Client,
    token: Option<ReplicaToken>,
    timings: SyncTimings,
}

impl ReplicaClient {
    /// `token`: `None` only when the replicas run without a discovery
    /// token (their listeners are then on loopback).
    pub fn new(token: Option<ReplicaToken>, timings: SyncTimings) -> Result<Self, ReplicaError> {
        crate::tls::ensure_crypto_provider();
        let http = reqwest::Client::builder()
            .connect_timeout(timings.connect_within)
            // Replicas talk to each other directly, never through a proxy
            // from the environment.
            .no_proxy()
            .build()
            .map_err(|e| ReplicaError::Unreachable {
                address: "(client)".to_owned(),
                message: format!("building the HTTP client: {e}"),
            })?;
        Ok(Self { http, token, timings })
    }

    pub fn timings(&self) -> SyncTimings {
        self.timings
    }

    /// The long-poll: the leader at `leader` (`ip:port`) may hold it for
    /// [`SyncTimings::hold`] while it has no news for this member.
    pub async fn hold(&self, leader: &str, request: &SyncRequest) -> Result<Synced, ReplicaError> {
        let request = SyncRequest {
            hold_ms: u64::try_from(self.timings.hold.as_millis()).unwrap_or(u64::MAX),
            ..request.clone()
        };
        self.sync(leader, &request, self.timings.hold + self.timings.answer_within)
            .await
    }

    /// A push: answered at once, for news that must not wait for the
    /// long-poll's turn (a block, a give-back).
    pub async fn push(&self, leader: &str, request: &SyncRequest) -> Result<Synced, ReplicaError> {
        let request = SyncRequest {
            hold_ms: 0,
            ..request.clone()
        };
        self.sync(leader, &request, self.timings.answer_within).await
    }

    async fn sync(
        &self,
        leader: &str,
        request: &SyncRequest,
        within: Duration,
    ) -> Result<Synced, ReplicaError> {
        let sent_at = Instant::now();
        let (status, body) = self
            .call(leader, SYNC_PATH, request, within)
            .await
            .and_then(|answer| {
                if (200..300).contains(&answer.status) {
                    Ok((answer.status, answer.body))
                } else {
                    Err(refused(leader, &answer))
                }
            })?;
        let response = serde_json::from_slice(&body).map_err(|e| ReplicaError::Unreadable {
            address: leader.to_owned(),
            message: format!("{status} with a body that is no sync answer: {e}"),
        })?;
        Ok(Synced { response, sent_at })
    }

    /// Forwards a lease call to the replica at `holder` holding lease `id`;
    /// whatever it answers (a refusal too) is the answer to pass on.
    pub async fn forward(
        &self,
        holder: &str,
        id: &str,
        call: &ForwardedLeaseCall,
    ) -> Result<ForwardedAnswer, ReplicaError> {
        let op = call.call.op();
        let answer = self
            .call(holder, &lease_path(id, op), call, self.timings.answer_within)
            .await;
        let result = match &answer {
            Ok(a) if (200..300).contains(&a.status) => "ok",
            Ok(_) => "refused",
            Err(ReplicaError::Timeout { .. }) => "timeout",
            Err(_) => "unreachable",
        };
        LeaseForwarded {
            op: op.as_str(),
            holder,
            result,
        }
        .emit();
        answer
    }

    async fn call(
        &self,
        address: &str,
        path: &str,
        body: &impl serde::Serialize,
        within: Duration,
    ) -> Result<ForwardedAnswer, ReplicaError> {
        let body = serde_json::to_vec(body).map_err(|e| ReplicaError::Malformed {
            what: "request body",
            value: e.to_string(),
        })?;
        let mut request = self
            .http
            .post(format!("http://{address}{path}"))
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body);
        if let Some(token) = &self.token {
            request = request.header(reqwest::header::AUTHORIZATION, token.header_value());
        }
        let exchange = async {
            let response = request.send().await?;
            let header = |name: reqwest::header::HeaderName| {
                response
                    .headers()
                    .get(name)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned)
            };
            let status = response.status().as_u16();
            let retry_after = header(reqwest::header::RETRY_AFTER);
            let content_type = header(reqwest::header::CONTENT_TYPE);
            let body = response.bytes().await?;
            Ok::<_, reqwest::Error>(ForwardedAnswer {
                status,
                retry_after,
                content_type,
                body,
            })
        };
        match tokio::time::timeout(within, exchange).await {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(e)) if e.is_timeout() => Err(ReplicaError::Timeout {
                address: address.to_owned(),
                after: within,
            }),
            Ok(Err(e)) => Err(ReplicaError::Unreachable {
                address: address.to_owned(),
                message: describe(&e),
            }),
            Err(_) => Err(ReplicaError::Timeout {
                address: address.to_owned(),
                after: within,
            }),
        }
    }
}

/// A refusal, with the message of the replica's error body when it sent one.
fn refused(address: &str, answer: &ForwardedAnswer) -> ReplicaError {
    let message = serde_json::from_slice::<ErrorBody>(&answer.body)
        .map(|e| format!("{}: {}", e.error, e.message))
        .unwrap_or_else(|_| String::from_utf8_lossy(&answer.body).chars().take(200).collect());
    ReplicaError::Refused {
        address: address.to_owned(),
        status: answer.status,
        message,
    }
}

/// A reqwest error with its causes (reqwest's own text stops at "error
/// sending request").
fn describe(e: &reqwest::Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
