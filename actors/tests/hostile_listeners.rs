//! Hostile clients against the operator's own listeners, through the real
//! binary (standalone, on loopback):
//!
//! - 600 idle connections to the discovery API of an operator whose file
//!   limit is 256 (soft and hard), and more to its metrics and health
//!   listeners: the process stays alive, `/healthz` keeps answering while
//!   the discovery API is flooded (each listener holds at most its cap, so
//!   one flood leaves the others their files), the API answers a
//!   well-formed request during the flood (once the idle connections ahead
//!   of it are cut by the request-head timeout) and at once after it, and
//!   accept errors are logged once per burst.
//! - 3,000 wrong-token requests in a row to each dashboard endpoint get
//!   `429` once the per-client rate limit is passed, like `/v1/...`; one
//!   client address holds at most 4 dashboard streams, and an open stream
//!   counted once does not hold the client's requests back.

mod support;

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use support::eventually;
use support::http::request_from;
use support::operator::{LOCAL_PROVIDER, OperatorDir, OperatorProcess};

const TOKEN: &str = "hostile-listeners-token";
const READ_TOKEN: &str = "hostile-listeners-read-token";

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// This test process needs more than a thousand sockets of its own.
fn raise_own_file_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    setrlimit(Resource::RLIMIT_NOFILE, hard, hard).unwrap();
}

/// `n` connections to `addr` that never send a byte; those the kernel
/// completes within a few seconds (the listener's accept queue may be full).
async fn idle_connections(addr: SocketAddr, n: usize) -> Vec<TcpStream> {
    let mut open = Vec::new();
    for _ in 0..n.div_ceil(50) {
        let batch = (0..50.min(n - open.len()))
            .map(|_| tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(addr)));
        open.extend(
            futures::future::join_all(batch)
                .await
                .into_iter()
                .filter_map(|c| c.ok()?.ok()),
        );
    }
    open
}

/// A well-formed authenticated `GET /v1/proxies`: its status, or why none came.
async fn list_proxies(addr: SocketAddr) -> Result<u16, String> {
    let mut s = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let req = format!(
        "GET /v1/proxies HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {TOKEN}\r\nConnection: close\r\n\r\n"
    );
    s.write_all(req.as_bytes()).await.map_err(|e| e.to_string())?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await.map_err(|e| e.to_string())?;
    String::from_utf8_lossy(&raw)
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| "the connection closed without an answer".to_owned())
}

/// A `GET` on `addr` answered within `patience`: its status, or why none came.
async fn answered(
    addr: SocketAddr,
    patience: Duration,
    call: impl Future<Output = Result<u16, String>>,
) -> Result<u16, String> {
    tokio::time::timeout(patience, call)
        .await
        .unwrap_or_else(|_| Err(format!("{addr}: no answer within {patience:?}")))
}

fn assert_alive(operator: &OperatorProcess, when: &str) {
    assert!(
        operator.exited().is_none(),
        "the operator died {when}: {:?}\n{}",
        operator.exited(),
        operator.logs()
    );
}

/// Open files of `pid`.
fn open_files(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

/// The soft and hard open-file limits of `pid`.
fn file_limits(pid: u32) -> (String, String) {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap_or_else(|| panic!("{limits}"));
    let words: Vec<&str> = line.split_whitespace().collect();
    (words[3].to_owned(), words[4].to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_open_file_limit_is_raised_to_the_hard_limit_at_start() {
    let dir = OperatorDir::new(LOCAL_PROVIDER);
    let operator = dir.standalone().file_limit(256, 4096).start().await;
    assert_eq!(
        file_limits(operator.pid()),
        ("4096".to_owned(), "4096".to_owned()),
        "{}",
        operator.logs()
    );
    let logs = operator.logs();
    assert!(
        logs.lines()
            .any(|l| l.contains("open-file limit") && l.contains("4096") && l.contains("256")),
        "the limit is logged at start\n{logs}"
    );
    // The built-in proxy the local provider runs (the same binary's
    // `forward-proxy`), started on its own, raises its own too.
    let port = support::process::free_port();
    let proxy = support::process::Killed(
        std::process::Command::new("prlimit")
            .arg("--nofile=256:4096")
            .arg("--")
            .arg(support::operator::BIN)
            .args([
                "forward-proxy",
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--instance-dir",
            ])
            .arg(dir.path())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let pid = proxy.0.id();
    eventually(
        "the forward proxy to listen",
        Duration::from_secs(30),
        async || TcpStream::connect(("127.0.0.1", port)).await.ok(),
    )
    .await;
    assert_eq!(file_limits(pid), ("4096".to_owned(), "4096".to_owned()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_neither_kill_the_operator_nor_starve_its_other_listeners() {
    raise_own_file_limit();
    let dir = OperatorDir::new(LOCAL_PROVIDER);
    let operator = dir
        .standalone()
        .discovery()
        .metrics()
        .file_limit(256, 256)
        .env("DISCOVERY_TOKEN", TOKEN)
        .start()
        .await;
    assert_eq!(file_limits(operator.pid()), ("256".to_owned(), "256".to_owned()));
    let (discovery, metrics, health) = (operator.discovery(), operator.metrics(), operator.health());
    assert_eq!(list_proxies(discovery).await, Ok(200));

    // 600 idle connections to the discovery API: over the file limit by far.
    let started = Instant::now();
    let flood = idle_connections(discovery, 600).await;
    eprintln!(
        "{} idle connections to the discovery API in {:?}; the operator holds {} files",
        flood.len(),
        started.elapsed(),
        open_files(operator.pid())
    );
    assert_alive(&operator, "under 600 idle connections");
    // The health listener's own cap is untouched: the kubelet's probe
    // answers at once, so the flood does not get the pod restarted.
    let probe = Instant::now();
    let healthz = answered(health, Duration::from_secs(10), async {
        support::http::try_request(health, "GET", "/healthz")
            .await
            .map_err(|e| e.to_string())
    })
    .await;
    assert_eq!(healthz, Ok(200), "/healthz during the flood\n{}", operator.logs());
    eprintln!("/healthz answered in {:?} during the flood", probe.elapsed());
    // The API itself: behind the idle connections in its accept queue,
    // which the request-head timeout cuts a cap's worth at a time.
    let asked = Instant::now();
    let during = answered(discovery, Duration::from_secs(180), list_proxies(discovery)).await;
    assert_eq!(during, Ok(200), "a request during the flood\n{}", operator.logs());
    eprintln!(
        "a request during the flood answered in {:?} (request-head timeout 5 s)",
        asked.elapsed()
    );
    assert_alive(&operator, "while the flood was timed out");
    // The listeners' caps leave the rest of the process its files.
    let logs = operator.logs();
    let out_of_files: Vec<&str> = logs
        .lines()
        .filter(|l| l.contains("Too many open files"))
        .collect();
    assert!(
        out_of_files.is_empty(),
        "the process ran out of files {} times:\n{}",
        out_of_files.len(),
        out_of_files.join("\n")
    );
    assert!(flood.len() >= 500, "only {} of 600 connected", flood.len());

    // The other listeners flooded too, a few times their caps.
    let more = [
        idle_connections(metrics, 150).await,
        idle_connections(health, 150).await,
        idle_connections(discovery, 300).await,
    ];
    eprintln!(
        "{} more idle connections to metrics, health and the API; the operator holds {} files",
        more.iter().map(Vec::len).sum::<usize>(),
        open_files(operator.pid())
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_alive(&operator, "with every listener flooded");

    // The flood ends: every listener answers promptly.
    drop(flood);
    drop(more);
    let after = Instant::now();
    operator
        .eventually(
            "every listener to answer after the flood",
            Duration::from_secs(60),
            async || {
                assert_alive(&operator, "after the flood");
                let api = answered(discovery, Duration::from_secs(5), list_proxies(discovery)).await?;
                let scrape = answered(metrics, Duration::from_secs(5), async {
                    support::http::try_request(metrics, "GET", "/metrics")
                        .await
                        .map_err(|e| e.to_string())
                })
                .await?;
                let alive = answered(health, Duration::from_secs(5), async {
                    support::http::try_request(health, "GET", "/healthz")
                        .await
                        .map_err(|e| e.to_string())
                })
                .await?;
                if (api, scrape, alive) == (200, 200, 200) {
                    Ok(())
                } else {
                    Err(format!("API {api}, metrics {scrape}, health {alive}"))
                }
            },
        )
        .await;
    eprintln!("every listener answered {:?} after the flood", after.elapsed());
    let logs = operator.logs();
    let accept_errors = logs.matches("Error accepting connection").count();
    assert!(
        accept_errors <= 2,
        "accept errors are logged once per burst, not {accept_errors} times\n{logs}"
    );
    assert_eq!(operator.stop().await.code(), Some(0), "{}", operator.logs());
}

/// One parsed response of a pipelined exchange.
struct Answer {
    status: u16,
    retry_after: Option<String>,
    body: String,
}

/// Reads one response off `buf` (from its start), if it is whole: the
/// answer and its length.
fn parse_answer(buf: &[u8]) -> Option<(Answer, usize)> {
    let end = buf.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    let header = |name: &str| {
        head.lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.trim_start_matches(':').trim().to_owned())
    };
    assert!(header("transfer-encoding").is_none(), "{head}");
    let length: usize = header("content-length").map_or(0, |v| v.parse().unwrap());
    if buf.len() < end + length {
        return None;
    }
    let body = String::from_utf8_lossy(&buf[end..end + length]).into_owned();
    Some((
        Answer {
            status,
            retry_after: header("retry-after"),
            body,
        },
        end + length,
    ))
}

/// `n` `GET path` requests with `auth` from the local address `from`, sent
/// in a row on 4 keep-alive connections (pipelined: the server, not the
/// test, sets the pace); their answers.
async fn pipelined(from: IpAddr, addr: SocketAddr, path: &str, auth: &str, n: usize) -> Vec<Answer> {
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: {auth}\r\n\r\n");
    let connection = |count: usize| {
        let request = request.clone();
        async move {
            let socket = tokio::net::TcpSocket::new_v4().unwrap();
            socket.bind(SocketAddr::new(from, 0)).unwrap();
            let stream = socket.connect(addr).await.unwrap();
            let (mut read, mut write) = stream.into_split();
            let writer = tokio::spawn(async move {
                let all = request.repeat(count);
                let _ = write.write_all(all.as_bytes()).await;
                write
            });
            let mut answers = Vec::new();
            let mut buf = Vec::new();
            let mut chunk = vec![0u8; 64 * 1024];
            while answers.len() < count {
                while let Some((answer, used)) = parse_answer(&buf) {
                    answers.push(answer);
                    buf.drain(..used);
                }
                if answers.len() == count {
                    break;
                }
                match tokio::time::timeout(Duration::from_secs(60), read.read(&mut chunk)).await {
                    Ok(Ok(0)) | Ok(Err(_)) | Err(_) => break,
                    Ok(Ok(got)) => buf.extend_from_slice(&chunk[..got]),
                }
            }
            drop(writer.await);
            answers
        }
    };
    let per = n.div_ceil(4);
    let counts: Vec<usize> = (0..4).map(|i| per.min(n - (per * i).min(n))).collect();
    let answers: Vec<Answer> = futures::future::join_all(counts.into_iter().map(connection))
        .await
        .into_iter()
        .flatten()
        .collect();
    assert_eq!(answers.len(), n, "every request was answered");
    answers
}

/// The first bytes of an SSE stream opened with `token` from `from`: its
/// status, and the connection, kept open.
async fn open_stream(from: IpAddr, addr: SocketAddr, token: &str) -> (u16, TcpStream) {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::new(from, 0)).unwrap();
    let mut s = socket.connect(addr).await.unwrap();
    let req =
        format!("GET /v1/dashboard/stream HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut buf = vec![0u8; 4096];
    let got = tokio::time::timeout(Duration::from_secs(30), s.read(&mut buf))
        .await
        .expect("the stream answers")
        .unwrap();
    let status = String::from_utf8_lossy(&buf[..got])
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, s)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_endpoints_are_rate_limited_like_the_api() {
    let dir = OperatorDir::new(LOCAL_PROVIDER);
    let operator = dir
        .standalone()
        .discovery()
        .env("DISCOVERY_TOKEN", TOKEN)
        .env("DISCOVERY_READ_TOKEN", READ_TOKEN)
        .start()
        .await;
    let api = operator.discovery();

    // Each endpoint from its own client address (its own bucket: 1,000/s,
    // bursts of 2,000). A round of 3,000 in a row passes the burst unless
    // the server answers fewer than 3,000 a second; a machine that slow
    // gets more rounds.
    for (n, (path, auth, allowed)) in [
        ("/v1/dashboard", "Bearer wrong-token", 401),
        ("/v1/dashboard/stream", "Bearer wrong-token", 401),
        ("/dashboard", "Bearer wrong-token", 200),
    ]
    .into_iter()
    .enumerate()
    {
        let from = ip(&format!("127.0.0.{}", 2 + n));
        let mut seen = std::collections::BTreeMap::new();
        let mut limited = None;
        for round in 1..=5 {
            let started = Instant::now();
            let answers = pipelined(from, api, path, auth, 3000).await;
            for a in &answers {
                *seen.entry(a.status).or_insert(0) += 1;
                assert!(
                    a.status == allowed || a.status == 429,
                    "{path}: {} {}",
                    a.status,
                    a.body
                );
            }
            eprintln!(
                "{path}: round {round} of 3,000 in {:?}: {seen:?}",
                started.elapsed()
            );
            limited = answers.into_iter().find(|a| a.status == 429);
            if limited.is_some() {
                break;
            }
        }
        let limited = limited.unwrap_or_else(|| {
            panic!("{path}: 15,000 requests in a row from one address and none refused with 429: {seen:?}")
        });
        assert!(limited.body.contains("\"rate_limited\""), "{}", limited.body);
        assert!(
            limited
                .body
                .contains("too many requests from this client address"),
            "{}",
            limited.body
        );
        assert!(limited.retry_after.is_some(), "429 without Retry-After");
    }

    // Streams: 4 per client address; an open stream counts once.
    let mine = ip("127.0.0.10");
    let mut streams = Vec::new();
    for _ in 0..4 {
        let (status, s) = open_stream(mine, api, READ_TOKEN).await;
        assert_eq!(status, 200);
        streams.push(s);
    }
    let (status, fifth) = open_stream(mine, api, READ_TOKEN).await;
    assert_eq!(status, 429, "a fifth stream from one address");
    drop(fifth);
    let r = request_from(mine, api, "GET", "/v1/dashboard", None).await;
    assert_eq!(
        r.status, 401,
        "its other requests are not held back by its streams"
    );
    let (status, _other) = open_stream(ip("127.0.0.11"), api, READ_TOKEN).await;
    assert_eq!(status, 200, "another address has slots of its own");
    // A closed stream frees its slot (once the server notices, at its next event).
    streams.pop();
    eventually(
        "a slot freed by a closed stream",
        Duration::from_secs(30),
        async || {
            let (status, s) = open_stream(mine, api, READ_TOKEN).await;
            (status == 200).then_some(s)
        },
    )
    .await;
    assert!(operator.exited().is_none(), "{}", operator.logs());
}
