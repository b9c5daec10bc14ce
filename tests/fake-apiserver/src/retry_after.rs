//! Whether the operator waits out a `429`'s `Retry-After` before sending
//! the same request again: each refusal is remembered with its wait, and a
//! request that repeats it before the wait is over is an early retry.
//!
//! Only requests with the kubeconfig's token are checked (the operator's;
//! a test's or a benchmark's own client sends none). "The same request" is
//! the verb and path, with the selectors and page that make one list
//! another (`labelSelector`, `fieldSelector`, `continue`), and for a create
//! the new object's name (else its whole body): creates share their
//! collection's path, and two Events for two Proxies are not one request
//! sent twice. A later write to the same object counts as the same request
//! even when its body differs: the server asked for a pause there.
//!
//! Requests already in flight. A request the client sent before it read
//! the `429` may reach the server just after the refusal; it is no retry.
//! Over HTTP/1.1 a connection carries one request at a time, so a repeat
//! on the refused request's own connection was sent after its answer was
//! read: it is judged on its time alone. A repeat on another connection
//! within [`IN_FLIGHT`] of the refusal cannot be told from one sent before
//! the answer arrived, and is counted apart (`in_flight`), not as early.
//! 50 ms: on loopback an answer reaches its reader well under a millisecond
//! after it is written, but on a loaded two-core machine the reader's task
//! may wait for a thread for tens of milliseconds; an honoured `Retry-After`
//! is at least a second (the fake never asks for less), so 50 ms cannot
//! hide a retry that waited out even a tenth of it. Nothing is tolerated at
//! the other end: a client counts the wait from when it read the answer,
//! which is after the server's own mark, so an honoured retry never
//! arrives before `refusal + Retry-After` on the server's clock.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// A repeat on another connection this soon after the refusal may have
/// been sent before the `429` was read (see the module's notes).
pub const IN_FLIGHT: Duration = Duration::from_millis(50);

/// Early retries kept for the report.
const EXAMPLES: usize = 20;

/// One refusal still within its `Retry-After`.
#[derive(Clone, Copy, Debug)]
struct Refusal {
    at: Instant,
    wait: Duration,
    connection: Option<SocketAddr>,
}

impl Refusal {
    fn until(&self) -> Instant {
        self.at + self.wait
    }
}

/// One request the operator sent again before its `Retry-After` was over.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EarlyRetry {
    /// The request as [`request_id`] names it.
    pub request: String,
    /// The refusal's `Retry-After`, in seconds.
    pub retry_after: u64,
    /// How long after the refusal the request came again (whole milliseconds).
    pub after: Duration,
}

/// What the check found so far.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RetryAfterReport {
    /// `429`s answered to the operator.
    pub refused: u64,
    /// Repeats before their `Retry-After` was over.
    pub early: u64,
    /// Repeats once it was over: the check saw the retries it passed.
    pub on_time: u64,
    /// Repeats on another connection within [`IN_FLIGHT`] of the refusal:
    /// possibly sent before the `429` was read, not counted as early.
    pub in_flight: u64,
    /// The first early retries.
    pub examples: Vec<EarlyRetry>,
}

impl RetryAfterReport {
    /// `{"refused", "early", "onTime", "inFlight", "inFlightMs", "examples": [{"request", "retryAfter", "afterMs"}]}`.
    pub fn to_json(&self) -> Value {
        let examples: Vec<Value> = self
            .examples
            .iter()
            .map(|e| json!({"request": e.request, "retryAfter": e.retry_after, "afterMs": e.after.as_millis() as u64}))
            .collect();
        json!({
            "refused": self.refused, "early": self.early, "onTime": self.on_time, "inFlight": self.in_flight,
            "inFlightMs": IN_FLIGHT.as_millis() as u64, "examples": examples
        })
    }

    /// Reads what [`to_json`](Self::to_json) wrote (the benchmark's side).
    pub fn from_json(value: &Value) -> Option<Self> {
        let mut examples = Vec::new();
        for e in value.get("examples")?.as_array()? {
            examples.push(EarlyRetry {
                request: e.get("request")?.as_str()?.to_owned(),
                retry_after: e.get("retryAfter")?.as_u64()?,
                after: Duration::from_millis(e.get("afterMs")?.as_u64()?),
            });
        }
        Some(Self {
            refused: value.get("refused")?.as_u64()?,
            early: value.get("early")?.as_u64()?,
            on_time: value.get("onTime")?.as_u64()?,
            in_flight: value.get("inFlight")?.as_u64()?,
            examples,
        })
    }
}

/// The refusals still open, and the tally.
#[derive(Debug)]
pub struct RetryAfterCheck {
    open: HashMap<String, Refusal>,
    /// Expired refusals are dropped once `open` grows to this size.
    prune_at: usize,
    report: RetryAfterReport,
}

impl Default for RetryAfterCheck {
    fn default() -> Self {
        Self {
            open: HashMap::new(),
            prune_at: 1024,
            report: RetryAfterReport::default(),
        }
    }
}

impl RetryAfterCheck {
    /// Notes one of the operator's requests: it `arrived` on `connection`,
    /// and was answered at `now`, with a `429` asking for `refused` seconds
    /// or served (`None`).
    pub fn note(
        &mut self,
        id: String,
        connection: Option<SocketAddr>,
        arrived: Instant,
        refused: Option<u64>,
        now: Instant,
    ) {
        if let Some(open) = self.open.get(&id).copied() {
            self.judge(&id, open, connection, arrived);
        }
        let Some(retry_after) = refused else { return };
        self.report.refused += 1;
        let refusal = Refusal {
            at: now,
            wait: Duration::from_secs(retry_after),
            connection,
        };
        // Of two refusals of the same request open at once, the one over
        // first stands: a retry after it honours one of them, and is no
        // early retry of the other one, which was likely a duplicate.
        match self.open.get(&id) {
            Some(open) if open.until() > arrived && open.until() <= refusal.until() => {}
            _ => {
                self.open.insert(id, refusal);
            }
        }
        if self.open.len() >= self.prune_at {
            self.open.retain(|_, r| r.until() > now);
            self.prune_at = (self.open.len() * 2).max(1024);
        }
    }

    fn judge(&mut self, id: &str, open: Refusal, connection: Option<SocketAddr>, arrived: Instant) {
        if arrived <= open.at {
            // Sent alongside the refused one, not after it: no retry.
            return;
        }
        let after = arrived - open.at;
        let same_connection = connection.is_some() && connection == open.connection;
        if after < IN_FLIGHT && !same_connection {
            self.report.in_flight += 1;
            return;
        }
        // This is the retry: anything later is a request of its own.
        self.open.remove(id);
        if arrived >= open.until() {
            self.report.on_time += 1;
        } else {
            self.report.early += 1;
            if self.report.examples.len() < EXAMPLES {
                self.report.examples.push(EarlyRetry {
                    request: id.to_owned(),
                    retry_after: open.wait.as_secs(),
                    // Whole milliseconds, as the JSON carries it.
                    after: Duration::from_millis(after.as_millis() as u64),
                });
            }
        }
    }

    pub fn report(&self) -> RetryAfterReport {
        self.report.clone()
    }
}

/// The request's identity for the check: `verb path`, the list selectors
/// and page when given, and a create's object name (else a digest of its
/// body).
pub fn request_id(verb: &str, path: &str, query: &[(String, String)], body: &[u8]) -> String {
    let mut id = format!("{verb} {path}");
    for key in ["labelSelector", "fieldSelector", "continue"] {
        if let Some((_, value)) = query.iter().find(|(k, _)| k == key) {
            id.push_str(&format!(" {key}={value}"));
        }
    }
    if verb == "create" {
        let name = serde_json::from_slice::<Value>(body)
            .ok()
            .and_then(|v| v["metadata"]["name"].as_str().map(str::to_owned));
        match name {
            Some(name) => id.push_str(&format!(" name={name}")),
            None => {
                use std::hash::{Hash, Hasher};
                let mut hasher = std::collections::hash_map::DefaultHasher::new();
                body.hash(&mut hasher);
                id.push_str(&format!(" body#{:016x}", hasher.finish()));
            }
        }
    }
    id
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conn(port: u16) -> Option<SocketAddr> {
        Some(SocketAddr::from(([127, 0, 0, 1], port)))
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    const P: &str = "patch /apis/crawl.example.com/v1alpha1/namespaces/f/proxies/p/status";

    #[test]
    fn a_retry_before_the_retry_after_is_early_and_one_after_it_is_not() {
        let t0 = Instant::now();
        let mut check = RetryAfterCheck::default();
        check.note(P.into(), conn(1), t0, Some(1), t0);
        check.note(P.into(), conn(1), t0 + ms(400), Some(1), t0 + ms(400));
        let early = check.report();
        assert_eq!((early.refused, early.early, early.in_flight), (2, 1, 0));
        assert_eq!(
            early.examples,
            [EarlyRetry {
                request: P.into(),
                retry_after: 1,
                after: ms(400)
            }]
        );
        // Refused again at 400 ms for a second: 1,400 ms is on time, and
        // is served.
        check.note(P.into(), conn(2), t0 + ms(1400), None, t0 + ms(1400));
        // Served, the request is closed: the next one is a new request.
        check.note(P.into(), conn(2), t0 + ms(1450), None, t0 + ms(1450));
        let report = check.report();
        assert_eq!((report.refused, report.early, report.in_flight), (2, 1, 0));
        assert_eq!(report.on_time, 1);
    }

    #[test]
    fn a_repeat_in_flight_on_another_connection_is_not_early() {
        let t0 = Instant::now();
        let mut check = RetryAfterCheck::default();
        check.note(P.into(), conn(1), t0, Some(2), t0);
        // Arrived before the refusal was answered: sent alongside it.
        check.note(P.into(), conn(2), t0 - ms(1), None, t0);
        // Within 50 ms on another connection: maybe sent before the 429
        // was read; its own refusal is over later than the first one's.
        check.note(P.into(), conn(3), t0 + ms(30), Some(2), t0 + ms(30));
        assert_eq!(check.report().in_flight, 1);
        assert_eq!(check.report().early, 0);
        // The first refusal's wait is what a retry must honour, and does.
        check.note(P.into(), conn(1), t0 + ms(2001), None, t0 + ms(2001));
        let report = check.report();
        assert_eq!((report.refused, report.early, report.in_flight), (2, 0, 1));
        assert_eq!(report.on_time, 1);
    }

    #[test]
    fn an_immediate_retry_on_the_same_connection_is_early() {
        let t0 = Instant::now();
        let mut check = RetryAfterCheck::default();
        check.note(P.into(), conn(1), t0, Some(1), t0);
        // HTTP/1.1: the connection was free again only once the 429 was read.
        check.note(P.into(), conn(1), t0 + ms(2), Some(1), t0 + ms(2));
        // Past 50 ms any connection's repeat is a retry.
        check.note(P.into(), conn(7), t0 + ms(60), None, t0 + ms(60));
        let report = check.report();
        assert_eq!((report.early, report.in_flight), (2, 0));
        assert_eq!(report.examples[0].after, ms(2));
    }

    #[test]
    fn other_requests_are_not_retries() {
        let t0 = Instant::now();
        let mut check = RetryAfterCheck::default();
        let events = "/api/v1/namespaces/f/events";
        let event = |name: &str| format!(r#"{{"metadata":{{"name":"{name}"}}}}"#);
        let a = request_id("create", events, &[], event("p1.1").as_bytes());
        let b = request_id("create", events, &[], event("p2.1").as_bytes());
        assert_ne!(a, b);
        check.note(a.clone(), conn(1), t0, Some(1), t0);
        check.note(b, conn(1), t0 + ms(100), None, t0 + ms(100));
        // Another object's status, another list page or selector.
        let proxies = "/apis/crawl.example.com/v1alpha1/namespaces/f/proxies";
        let page = |c: &str| vec![("continue".to_owned(), c.to_owned())];
        check.note(
            request_id("list", proxies, &page("x"), b""),
            conn(1),
            t0,
            Some(1),
            t0,
        );
        check.note(
            request_id("list", proxies, &page("y"), b""),
            conn(1),
            t0 + ms(100),
            None,
            t0 + ms(100),
        );
        // A list's resourceVersion does not make it another request.
        let rv = vec![("resourceVersion".to_owned(), "7".to_owned())];
        assert_eq!(
            request_id("list", proxies, &rv, b""),
            request_id("list", proxies, &[], b"")
        );
        // Bodies without a name: the same body is the same request.
        let nameless = request_id(
            "create",
            events,
            &[],
            br#"{"metadata":{"generateName":"p-"},"x":1}"#,
        );
        assert_eq!(
            nameless,
            request_id(
                "create",
                events,
                &[],
                br#"{"metadata":{"generateName":"p-"},"x":1}"#
            )
        );
        assert_ne!(
            nameless,
            request_id(
                "create",
                events,
                &[],
                br#"{"metadata":{"generateName":"p-"},"x":2}"#
            )
        );
        check.note(a, conn(1), t0 + ms(1000), None, t0 + ms(1000));
        let report = check.report();
        assert_eq!((report.refused, report.early, report.in_flight), (2, 0, 0));
        // Only `a` came again, after its wait.
        assert_eq!(report.on_time, 1);
    }

    #[test]
    fn expired_refusals_are_dropped_and_the_report_reads_back() {
        let t0 = Instant::now();
        let mut check = RetryAfterCheck::default();
        for i in 0..3000 {
            let at = t0 + ms(i);
            check.note(format!("get /x/{i}"), conn(1), at, Some(1), at);
        }
        // Only the last second's refusals are still open.
        assert!(check.open.len() <= 2048, "{}", check.open.len());
        check.note("get /x/2999".into(), conn(1), t0 + ms(3000), None, t0 + ms(3000));
        let report = check.report();
        assert_eq!((report.refused, report.early), (3000, 1));
        assert_eq!(RetryAfterReport::from_json(&report.to_json()), Some(report));
    }
}
