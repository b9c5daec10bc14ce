//! A member's replica client against a stand-in leader (a small hyper
//! server on loopback): the long-poll asks for the hold and is answered
//! after it, a push asks for none; every call carries the replicas' token
//! (none without one); the share's clock starts when the request was
//! sent; a leader that holds past the hold plus the answer budget is a
//! timeout, a refusal keeps its status and message, an unreadable answer
//! and a closed port are errors of their own; a forwarded lease call goes
//! to `/internal/v1/leases/{id}/{op}` with the caller and its answer —
//! refusals and `Retry-After` included — is passed on as it came (and
//! counted in `egress_proxies_lease_forwards_total`).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use egress_proxies::adapters::discovery_api::bodies::ReportOutcome;
use egress_proxies::adapters::replicas::ReplicaError;
use egress_proxies::adapters::replicas::client::{ReplicaClient, SyncTimings};
use egress_proxies::adapters::replicas::token::ReplicaToken;
use egress_proxies::adapters::replicas::wire::{
    Allocation, ForwardedLeaseCall, LeaseCall, SyncRequest, SyncResponse, Term,
};
use egress_proxies::telemetry::metrics::metrics;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

/// One request as the stand-in saw it.
#[derive(Clone, Debug)]
struct Seen {
    path: String,
    authorization: Option<String>,
    body: Bytes,
}

/// How the stand-in answers: after a delay, a status, headers and a body.
#[derive(Clone)]
struct Answer {
    delay: Duration,
    status: StatusCode,
    headers: Vec<(&'static str, String)>,
    body: String,
}

impl Answer {
    fn sync(delay: Duration) -> Self {
        let response = SyncResponse {
            term: Term {
                holder: "operator-0".into(),
                transitions: 2,
            },
            allocation: Allocation {
                version: 5,
                ttl_ms: 9000,
                unlimited: true,
                slots: vec![],
            },
            acked: 3,
            ..SyncResponse::default()
        };
        Self {
            delay,
            status: StatusCode::OK,
            headers: vec![("content-type", "application/json".into())],
            body: serde_json::to_string(&response).unwrap(),
        }
    }

    fn status(status: StatusCode, body: &str) -> Self {
        Self {
            delay: Duration::ZERO,
            status,
            headers: vec![("content-type", "application/json".into())],
            body: body.to_owned(),
        }
    }
}

async fn read_body(mut body: Incoming) -> Bytes {
    let mut all = Vec::new();
    while let Some(frame) =
        std::future::poll_fn(|cx| http_body::Body::poll_frame(Pin::new(&mut body), cx)).await
    {
        if let Ok(data) = frame.unwrap().into_data() {
            all.extend_from_slice(&data);
        }
    }
    Bytes::from(all)
}

/// A stand-in leader answering every request with `answer`; what it saw.
/// Its task ends with the test's runtime.
async fn stand_in(answer: Answer) -> (SocketAddr, Arc<Mutex<Vec<Seen>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let (log, answer) = (log.clone(), answer.clone());
            tokio::spawn(async move {
                let service = service_fn(move |request: Request<Incoming>| {
                    let (log, answer) = (log.clone(), answer.clone());
                    async move {
                        let path = request.uri().path().to_owned();
                        let authorization = request
                            .headers()
                            .get("authorization")
                            .map(|v| v.to_str().unwrap().to_owned());
                        let body = read_body(request.into_body()).await;
                        log.lock().unwrap().push(Seen {
                            path,
                            authorization,
                            body,
                        });
                        tokio::time::sleep(answer.delay).await;
                        let mut response = Response::builder().status(answer.status);
                        for (name, value) in &answer.headers {
                            response = response.header(*name, value);
                        }
                        Ok::<_, Infallible>(response.body(answer.body.clone()).unwrap())
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (addr, seen)
}

/// The value of one metric line, 0 when absent.
fn metric(line_start: &str) -> f64 {
    metrics()
        .encode()
        .lines()
        .find_map(|l| l.strip_prefix(line_start)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

fn timings() -> SyncTimings {
    SyncTimings {
        hold: Duration::from_millis(400),
        answer_within: Duration::from_millis(300),
        connect_within: Duration::from_millis(300),
    }
}

fn client(token: Option<&ReplicaToken>) -> ReplicaClient {
    ReplicaClient::new(token.cloned(), timings()).unwrap()
}

fn request() -> SyncRequest {
    SyncRequest {
        tag: "0a1b2c3d".into(),
        applied: 4,
        feed_since: 10,
        hold_ms: 12_345,
        ..SyncRequest::default()
    }
}

fn sent(seen: &Arc<Mutex<Vec<Seen>>>) -> Vec<Seen> {
    seen.lock().unwrap().clone()
}

#[tokio::test]
async fn the_long_poll_asks_for_the_hold_and_the_share_counts_from_the_send() {
    let (leader, seen) = stand_in(Answer::sync(Duration::from_millis(350))).await;
    let token = ReplicaToken::derive("s3cret");
    let before = Instant::now();
    let synced = client(Some(&token))
        .hold(&leader.to_string(), &request())
        .await
        .unwrap();
    let answered = Instant::now();
    assert_eq!(synced.response.allocation.version, 5);
    assert!(synced.response.allocation.unlimited);
    assert_eq!(synced.response.acked, 3);
    assert!(
        before <= synced.sent_at && synced.sent_at + Duration::from_millis(350) <= answered,
        "the share counts from the send, not the answer"
    );
    let calls = sent(&seen);
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].path, "/internal/v1/sync");
    assert_eq!(
        calls[0].authorization.as_deref(),
        Some(token.header_value().as_str())
    );
    let asked: SyncRequest = serde_json::from_slice(&calls[0].body).unwrap();
    assert_eq!(
        asked.hold_ms, 400,
        "the client's hold, whatever the caller left in"
    );
    assert_eq!(asked.tag, "0a1b2c3d");
    assert_eq!(asked.feed_since, 10);
}

#[tokio::test]
async fn a_push_asks_for_no_hold_and_without_a_token_sends_none() {
    let (leader, seen) = stand_in(Answer::sync(Duration::ZERO)).await;
    let synced = client(None).push(&leader.to_string(), &request()).await.unwrap();
    assert_eq!(synced.response.term.transitions, 2);
    let calls = sent(&seen);
    let asked: SyncRequest = serde_json::from_slice(&calls[0].body).unwrap();
    assert_eq!(asked.hold_ms, 0);
    assert_eq!(calls[0].authorization, None);
}

#[tokio::test]
async fn a_leader_holding_past_the_hold_and_the_budget_is_a_timeout() {
    let (leader, _) = stand_in(Answer::sync(Duration::from_secs(30))).await;
    let client = client(None);
    let started = Instant::now();
    let held = client.hold(&leader.to_string(), &request()).await;
    let took = started.elapsed();
    assert!(
        matches!(held, Err(ReplicaError::Timeout { after, .. }) if after == Duration::from_millis(700)),
        "{held:?}"
    );
    assert!(
        (Duration::from_millis(700)..Duration::from_millis(1500)).contains(&took),
        "{took:?}"
    );
    let started = Instant::now();
    let pushed = client.push(&leader.to_string(), &request()).await;
    assert!(matches!(pushed, Err(ReplicaError::Timeout { .. })), "{pushed:?}");
    assert!(
        started.elapsed() < Duration::from_millis(1000),
        "a push waits for no hold"
    );
}

#[tokio::test]
async fn refusals_unreadable_answers_and_closed_ports_are_told_apart() {
    let (leader, _) = stand_in(Answer::status(
        StatusCode::UNAUTHORIZED,
        r#"{"error":"unauthorized","message":"no replica token"}"#,
    ))
    .await;
    let client = client(Some(&ReplicaToken::derive("wrong")));
    let refused = client.push(&leader.to_string(), &request()).await;
    let Err(ReplicaError::Refused { status, message, .. }) = refused else {
        panic!("{refused:?}");
    };
    assert_eq!(status, 401);
    assert_eq!(message, "unauthorized: no replica token");

    let (garbled, _) = stand_in(Answer::status(StatusCode::OK, "<html>not a sync answer</html>")).await;
    let unreadable = client.push(&garbled.to_string(), &request()).await;
    assert!(
        matches!(unreadable, Err(ReplicaError::Unreadable { .. })),
        "{unreadable:?}"
    );

    // A port nobody listens on (bound, then closed).
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let unreachable = client.push(&closed.to_string(), &request()).await;
    let Err(ReplicaError::Unreachable { address, message }) = unreachable else {
        panic!("{unreachable:?}");
    };
    assert_eq!(address, closed.to_string());
    assert!(message.to_lowercase().contains("refused"), "{message}");
}

#[tokio::test]
async fn a_forwarded_call_carries_the_caller_and_its_answer_is_passed_on_as_it_came() {
    let mut answer = Answer::status(
        StatusCode::SERVICE_UNAVAILABLE,
        r#"{"error":"unavailable","message":"the holder's journal is being adopted"}"#,
    );
    answer.headers.push(("retry-after", "1".into()));
    let (holder, seen) = stand_in(answer).await;
    let token = ReplicaToken::derive("s3cret");
    let id = "0a1b2c3d-0000-4000-8000-000000000001";
    let call = ForwardedLeaseCall {
        caller: "crawler-a".into(),
        call: LeaseCall::Report {
            outcome: ReportOutcome::Blocked,
            detail: Some("captcha".into()),
        },
    };
    let refused_before = metric("egress_proxies_lease_forwards_total{result=\"refused\"}");
    let answer = client(Some(&token))
        .forward(&holder.to_string(), id, &call)
        .await
        .unwrap();
    assert_eq!(
        metric("egress_proxies_lease_forwards_total{result=\"refused\"}"),
        refused_before + 1.0,
        "counted as a refusal passed on"
    );
    assert_eq!(answer.status, 503);
    assert_eq!(answer.retry_after.as_deref(), Some("1"));
    assert_eq!(answer.content_type.as_deref(), Some("application/json"));
    assert!(String::from_utf8_lossy(&answer.body).contains("being adopted"));
    let calls = sent(&seen);
    assert_eq!(calls[0].path, format!("/internal/v1/leases/{id}/report"));
    assert_eq!(
        calls[0].authorization.as_deref(),
        Some(token.header_value().as_str())
    );
    let forwarded: ForwardedLeaseCall = serde_json::from_slice(&calls[0].body).unwrap();
    assert_eq!(forwarded, call);
}
