//! The built-in forward proxy (`forward-proxy`) through the real binary:
//! it survives and keeps serving 600 idle connections under a file limit
//! of 256; after a plain request the next bytes are parsed as a request,
//! never relayed; `Host` comes from the URL; ambiguous framing and
//! hop-by-hop headers stop at the proxy; tunnels, chunked and large bodies
//! pass; idle connections and stalled tunnels are closed after their
//! timeouts. Targets are real servers on loopback (a recording TCP server,
//! a hyper server, a TLS server); bodies go through curl.

mod support;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use egress_proxies::adapters::stores::credentials_file::write_credentials_file;
use egress_proxies::domain::credentials::ProxyCredentials;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Bytes, Frame, Incoming};
use support::process::{Killed, free_port};
use support::{eventually, target_server};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const BIN: &str = env!("CARGO_BIN_EXE_egress-proxies-operator");
/// Generous: CI runs many test binaries on two cores.
const ANSWER_WITHIN: Duration = Duration::from_secs(60);

/// A `forward-proxy` process demanding credentials, open to loopback targets.
struct Proxy {
    process: Killed,
    addr: SocketAddr,
    credentials: ProxyCredentials,
    log: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl Proxy {
    /// Starts one, under `prlimit --nofile=N:N` when `file_limit` is given.
    async fn start(extra: &[&str], file_limit: Option<u64>) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let credentials = ProxyCredentials::new("crawler", "s3cret-pass").unwrap();
        let file = dir.path().join("credentials");
        write_credentials_file(&file, &credentials).unwrap();
        let port = free_port();
        let log = dir.path().join("proxy.log");
        let mut command = match file_limit {
            Some(n) => {
                let mut c = std::process::Command::new("prlimit");
                c.arg(format!("--nofile={n}:{n}")).arg(BIN);
                c
            }
            None => std::process::Command::new(BIN),
        };
        command
            .args(["forward-proxy", "--listen", &format!("127.0.0.1:{port}")])
            .args(["--allow", "127.0.0.0/8", "--allow", "1-65535"])
            .arg("--instance-dir")
            .arg(dir.path())
            .arg("--credentials-file")
            .arg(&file)
            .args(extra)
            .env("RUST_LOG", "debug")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap());
        let process = Killed(command.spawn().unwrap());
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        eventually("the proxy to listen", ANSWER_WITHIN, async || {
            TcpStream::connect(addr).await.ok()
        })
        .await;
        Self {
            process,
            addr,
            credentials,
            log,
            _dir: dir,
        }
    }

    fn authorization(&self) -> String {
        format!(
            "Proxy-Authorization: {}\r\n",
            self.credentials.basic_authorization()
        )
    }

    fn assert_alive(&mut self, when: &str) {
        if let Some(status) = self.process.0.try_wait().unwrap() {
            panic!(
                "the proxy exited {when}: {status}; its log ends:\n{}",
                self.log_tail()
            );
        }
    }

    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// `http://crawler:…@127.0.0.1:port` for curl's `-x`.
    fn url(&self) -> String {
        format!(
            "http://{}:{}@{}",
            self.credentials.username, self.credentials.password, self.addr
        )
    }
}

/// One response read off `stream`: its head (status line and headers) and
/// its body (`Content-Length` framed, or up to the end of the stream).
async fn read_response(stream: &mut TcpStream) -> (String, Vec<u8>) {
    let mut got = Vec::new();
    let mut byte = [0u8; 1];
    while !got.ends_with(b"\r\n\r\n") {
        match stream.read(&mut byte).await {
            Ok(0) | Err(_) => return (String::from_utf8_lossy(&got).into_owned(), Vec::new()),
            Ok(_) => got.push(byte[0]),
        }
    }
    let head = String::from_utf8_lossy(&got).into_owned();
    let length = head
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse::<usize>().ok())?
        })
        .unwrap_or(0);
    let mut body = vec![0u8; length];
    stream.read_exact(&mut body).await.unwrap();
    (head, body)
}

/// Sends `request` on `stream` and reads the response, within [`ANSWER_WITHIN`].
async fn exchange(stream: &mut TcpStream, request: &str) -> (String, Vec<u8>) {
    stream.write_all(request.as_bytes()).await.unwrap();
    tokio::time::timeout(ANSWER_WITHIN, read_response(stream))
        .await
        .expect("an answer in time")
}

/// A TCP target that records every byte it receives, answering each
/// request head (`\r\n\r\n`) with `200 ok` and keeping the connection.
struct RecordingTarget {
    addr: SocketAddr,
    received: Arc<Mutex<Vec<u8>>>,
}

impl RecordingTarget {
    async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let received = Arc::new(Mutex::new(Vec::new()));
        let record = received.clone();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                let record = record.clone();
                tokio::spawn(async move {
                    let mut mine = Vec::new();
                    let mut answered = 0;
                    let mut buf = [0u8; 4096];
                    while let Ok(n @ 1..) = s.read(&mut buf).await {
                        record.lock().unwrap().extend_from_slice(&buf[..n]);
                        mine.extend_from_slice(&buf[..n]);
                        let heads = mine.windows(4).filter(|w| w == b"\r\n\r\n").count();
                        while answered < heads {
                            answered += 1;
                            let ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
                            if s.write_all(ok).await.is_err() {
                                return;
                            }
                        }
                    }
                });
            }
        });
        Self { addr, received }
    }

    fn received(&self) -> String {
        String::from_utf8_lossy(&self.received.lock().unwrap()).into_owned()
    }
}

/// 600 idle connections — half of them with a request head begun — against
/// a proxy whose file limit is 256: it stays alive, and an authenticated
/// request on a new connection is answered while they are open and after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn six_hundred_idle_connections_under_a_file_limit_of_256_neither_end_nor_starve_it() {
    let target = RecordingTarget::start().await;
    let mut proxy = Proxy::start(&[], Some(256)).await;
    let get = format!(
        "GET http://{}/alive HTTP/1.1\r\nHost: {}\r\n{}\r\n",
        target.addr,
        target.addr,
        proxy.authorization()
    );

    let mut idle = Vec::new();
    let mut refused = 0;
    for i in 0..600 {
        match TcpStream::connect(proxy.addr).await {
            Ok(mut s) => {
                if i % 2 == 0 {
                    // A slow client: a head begun and never finished.
                    let _ = s.write_all(b"GET http://127.0.0.1/ HTTP/1.1\r\nX-Slow: ").await;
                }
                idle.push(s);
            }
            Err(_) => refused += 1,
        }
    }
    proxy.assert_alive("while 600 idle connections were opened");
    assert_eq!(refused, 0, "connections refused: the listener is gone");

    for round in 0..3 {
        let mut client = tokio::time::timeout(ANSWER_WITHIN, TcpStream::connect(proxy.addr))
            .await
            .expect("connected in time")
            .unwrap();
        let (head, body) = exchange(&mut client, &get).await;
        assert!(
            head.starts_with("HTTP/1.1 200") && body == b"ok",
            "round {round} while 600 idle connections are open: {head:?}; proxy log:\n{}",
            proxy.log_tail()
        );
        proxy.assert_alive("while serving beside 600 idle connections");
    }

    drop(idle);
    let mut client = TcpStream::connect(proxy.addr).await.unwrap();
    let (head, _) = exchange(&mut client, &get).await;
    assert!(head.starts_with("HTTP/1.1 200"), "after: {head:?}");
    proxy.assert_alive("after the idle connections were closed");
}

/// Unfinished heads without credentials share one budget (16 MiB) beyond
/// their free 4 KiB each: of 400 connections each holding 60 KB of a head,
/// those that find it spent get `431` and are closed (at most the budget's
/// worth are held), and a request with credentials is served meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unfinished_heads_without_credentials_share_one_budget() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    setrlimit(Resource::RLIMIT_NOFILE, hard, hard).unwrap();
    let target = RecordingTarget::start().await;
    let mut proxy = Proxy::start(&[], Some(4096)).await;
    let mut head = b"GET http://127.0.0.1/ HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ".to_vec();
    head.resize(60_000, b's');
    let mut flood = Vec::new();
    for _ in 0..8 {
        let connects = (0..50).map(|_| {
            let head = &head;
            async {
                let mut s = TcpStream::connect(proxy.addr).await.ok()?;
                let _ = tokio::time::timeout(Duration::from_secs(5), s.write_all(head)).await;
                Some(s)
            }
        });
        flood.extend(futures::future::join_all(connects).await.into_iter().flatten());
    }
    assert_eq!(flood.len(), 400);
    let get = format!(
        "GET http://{}/alive HTTP/1.1\r\nHost: {}\r\n{}\r\n",
        target.addr,
        target.addr,
        proxy.authorization()
    );
    let mut client = TcpStream::connect(proxy.addr).await.unwrap();
    let (head, body) = exchange(&mut client, &get).await;
    assert!(
        head.starts_with("HTTP/1.1 200") && body == b"ok",
        "during the flood: {head:?}"
    );
    let answers = futures::future::join_all(flood.iter_mut().map(|s| async move {
        let mut got = Vec::new();
        let mut buf = [0u8; 1024];
        let _ = tokio::time::timeout(Duration::from_secs(3), async {
            while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                match s.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                }
            }
        })
        .await;
        String::from_utf8_lossy(&got).into_owned()
    }))
    .await;
    let refused = answers.iter().filter(|a| a.starts_with("HTTP/1.1 431 ")).count();
    let held = answers.iter().filter(|a| a.is_empty()).count();
    eprintln!("of 400 unfinished 60 KB heads: {refused} got 431, {held} held");
    assert_eq!(
        refused + held,
        400,
        "{:?}",
        answers
            .iter()
            .find(|a| !a.is_empty() && !a.starts_with("HTTP/1.1 431 "))
    );
    assert!(refused >= 80, "only {refused} got 431");
    assert!(held <= 300, "{held} held: more than the budget allows");
    proxy.assert_alive("after the flood of unfinished heads");
}

/// After a plain request on a keep-alive connection, the next request is
/// answered too, and the bytes of another protocol sent next are parsed as
/// a request (400), never relayed to the previous request's target.
#[tokio::test]
async fn bytes_after_a_plain_request_are_parsed_never_relayed() {
    let target = RecordingTarget::start().await;
    let mut proxy = Proxy::start(&[], None).await;
    let get = format!(
        "GET http://{}/first HTTP/1.1\r\nHost: {}\r\n{}\r\n",
        target.addr,
        target.addr,
        proxy.authorization()
    );
    let mut client = TcpStream::connect(proxy.addr).await.unwrap();
    let (head, body) = exchange(&mut client, &get).await;
    assert!(head.starts_with("HTTP/1.1 200") && body == b"ok", "{head:?}");
    let (head, body) = exchange(&mut client, &get.replace("/first", "/second")).await;
    assert!(
        head.starts_with("HTTP/1.1 200") && body == b"ok",
        "a second request on the kept-alive connection: {head:?}"
    );

    let smtp =
        "EHLO attacker.example\r\nMAIL FROM:<spam@attacker.example>\r\nRCPT TO:<victim@example.com>\r\n\r\n";
    let (head, _) = exchange(&mut client, smtp).await;
    assert!(head.starts_with("HTTP/1.1 400"), "SMTP bytes answered {head:?}");
    // The connection is closed after the 400.
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(ANSWER_WITHIN, client.read_to_end(&mut rest)).await;
    assert!(matches!(closed, Ok(Ok(_))), "the connection ends after the 400");

    tokio::time::sleep(Duration::from_millis(300)).await;
    let received = target.received();
    assert!(
        !received.contains("EHLO") && !received.contains("MAIL FROM"),
        "the target received the raw bytes:\n{received}"
    );
    assert_eq!(received.matches("GET /").count(), 2, "{received}");
    proxy.assert_alive("after the test");
}

/// The target sees `Host` from the URL, not the client's (RFC 9112 §3.2.2).
#[tokio::test]
async fn the_host_header_comes_from_the_url() {
    let target = RecordingTarget::start().await;
    let proxy = Proxy::start(&[], None).await;
    let mut client = TcpStream::connect(proxy.addr).await.unwrap();
    let request = format!(
        "GET http://{}/path?q=1 HTTP/1.1\r\nHost: evil.example\r\n{}\r\n",
        target.addr,
        proxy.authorization()
    );
    let (head, _) = exchange(&mut client, &request).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head:?}");
    let received = target.received().to_ascii_lowercase();
    assert!(received.starts_with("get /path?q=1 http/1.1\r\n"), "{received}");
    assert!(
        received.contains(&format!("\r\nhost: {}\r\n", target.addr)),
        "{received}"
    );
    assert!(!received.contains("evil.example"), "{received}");
}

/// A request with both Content-Length and Transfer-Encoding is refused with
/// 400, and nothing of it reaches the target.
#[tokio::test]
async fn a_request_with_content_length_and_transfer_encoding_is_refused() {
    let target = RecordingTarget::start().await;
    let proxy = Proxy::start(&[], None).await;
    for (order, framing) in [
        ("CL first", "Content-Length: 4\r\nTransfer-Encoding: chunked\r\n"),
        ("TE first", "Transfer-Encoding: chunked\r\nContent-Length: 4\r\n"),
    ] {
        let mut client = TcpStream::connect(proxy.addr).await.unwrap();
        let smuggled = format!(
            "POST http://{addr}/ HTTP/1.1\r\nHost: {addr}\r\n{auth}{framing}\r\n0\r\n\r\nGET http://{addr}/smuggled HTTP/1.1\r\nHost: {addr}\r\n{auth}\r\n",
            addr = target.addr,
            auth = proxy.authorization(),
        );
        let (head, _) = exchange(&mut client, &smuggled).await;
        assert!(head.starts_with("HTTP/1.1 400"), "{order}: {head:?}");
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(target.received(), "", "the target received something");
}

/// Hop-by-hop headers (and those `Connection` names) are not forwarded;
/// the others are, and no `Via` or `X-Forwarded-For` is added.
#[tokio::test]
async fn hop_by_hop_headers_are_not_forwarded() {
    let target = RecordingTarget::start().await;
    let proxy = Proxy::start(&[], None).await;
    let mut client = TcpStream::connect(proxy.addr).await.unwrap();
    let request = format!(
        "GET http://{}/ HTTP/1.1\r\nHost: {}\r\n{}Connection: keep-alive, X-Hop-Secret\r\n\
         X-Hop-Secret: 1\r\nKeep-Alive: timeout=5\r\nProxy-Connection: keep-alive\r\nTE: trailers\r\n\
         Trailer: X-Checksum\r\nUpgrade: websocket\r\nX-End-To-End: kept\r\n\r\n",
        target.addr,
        target.addr,
        proxy.authorization()
    );
    let (head, _) = exchange(&mut client, &request).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head:?}");
    let received = target.received().to_ascii_lowercase();
    for dropped in [
        "connection:",
        "x-hop-secret",
        "keep-alive",
        "proxy-connection",
        "proxy-authorization",
        "\r\nte:",
        "trailer",
        "upgrade",
        "via:",
        "x-forwarded-for",
    ] {
        assert!(!received.contains(dropped), "{dropped} forwarded:\n{received}");
    }
    assert!(received.contains("x-end-to-end: kept"), "{received}");
}

/// The byte at `i` of a test body.
fn pattern(i: usize) -> u8 {
    (i % 251) as u8
}

/// A hyper target: `POST /echo` streams the request body back (chunked),
/// `GET /chunked/N` and `GET /length/N` stream N pattern bytes without and
/// with a Content-Length.
async fn body_target() -> SocketAddr {
    type Body = http_body_util::combinators::BoxBody<Bytes, hyper::Error>;
    async fn serve(request: hyper::Request<Incoming>) -> Result<hyper::Response<Body>, Infallible> {
        let path = request.uri().path().to_owned();
        if path == "/echo" {
            return Ok(hyper::Response::new(request.into_body().boxed()));
        }
        let (kind, n) = path.trim_start_matches('/').split_once('/').unwrap();
        let n: usize = n.parse().unwrap();
        let frames = futures::stream::iter((0..n).step_by(64 * 1024).map(move |start| {
            let piece: Vec<u8> = (start..(start + 64 * 1024).min(n)).map(pattern).collect();
            Ok::<_, hyper::Error>(Frame::data(Bytes::from(piece)))
        }));
        let mut response = hyper::Response::new(StreamBody::new(frames).boxed());
        if kind == "length" {
            response
                .headers_mut()
                .insert(hyper::header::CONTENT_LENGTH, n.into());
        }
        Ok(response)
    }
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(s), hyper::service::service_fn(serve)),
            );
        }
    });
    addr
}

/// curl through `proxy` with `args`; its stdout.
async fn curl(proxy: &Proxy, args: &[&str]) -> Vec<u8> {
    let mut command = tokio::process::Command::new("curl");
    command
        .args(["-sS", "--fail", "--max-time", "120", "-x", &proxy.url()])
        .args(args)
        .kill_on_drop(true);
    let out = command.output().await.unwrap();
    assert!(
        out.status.success(),
        "curl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// CONNECT tunnels carry TLS; chunked and large bodies stream both ways.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tunnels_chunked_and_large_bodies_pass() {
    let proxy = Proxy::start(&[], None).await;
    let (tls, ca) = target_server::https_target().await;
    let authorization = proxy.credentials.basic_authorization();
    let answer = target_server::get_via_connect_as(proxy.addr, Some(&authorization), tls.port(), &ca).await;
    assert_eq!(answer, "HTTP/1.1 204 No Content", "TLS through CONNECT");

    let target = body_target().await;
    const LARGE: usize = 16 * 1024 * 1024 + 7;
    let expected: Vec<u8> = (0..LARGE).map(pattern).collect();
    for kind in ["chunked", "length"] {
        let got = curl(&proxy, &[&format!("http://{target}/{kind}/{LARGE}")]).await;
        assert!(
            got == expected,
            "{kind} download: {} bytes, not the pattern",
            got.len()
        );
    }

    let dir = tempfile::tempdir().unwrap();
    let upload = dir.path().join("upload");
    std::fs::write(&upload, &expected).unwrap();
    let data = format!("@{}", upload.display());
    let echoed = curl(
        &proxy,
        &[
            "-H",
            "Transfer-Encoding: chunked",
            "--data-binary",
            &data,
            &format!("http://{target}/echo"),
        ],
    )
    .await;
    assert!(
        echoed == expected,
        "chunked upload echoed: {} bytes",
        echoed.len()
    );
    let echoed = curl(
        &proxy,
        &["--data-binary", &data, &format!("http://{target}/echo")],
    )
    .await;
    assert!(
        echoed == expected,
        "Content-Length upload echoed: {} bytes",
        echoed.len()
    );

    // Several requests on one kept-alive curl connection, one target pool.
    let urls: Vec<String> = (0..5).map(|i| format!("http://{target}/length/{i}")).collect();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    let got = curl(&proxy, &urls).await;
    assert_eq!(got.len(), 1 + 2 + 3 + 4, "five answers on one connection");
}

/// A connection that sends no request head is closed after the
/// header-read timeout; a tunnel moving no byte after the idle timeout.
#[tokio::test]
async fn silent_connections_and_stalled_tunnels_are_closed_after_their_timeouts() {
    let proxy = Proxy::start(&["--header-read-timeout", "1s", "--idle-timeout", "2s"], None).await;

    let mut silent = TcpStream::connect(proxy.addr).await.unwrap();
    let started = Instant::now();
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(ANSWER_WITHIN, silent.read_to_end(&mut rest)).await;
    assert!(closed.is_ok(), "a silent connection stays open");
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "{:?}",
        started.elapsed()
    );

    // A target that accepts and says nothing: the tunnel carries nothing.
    let quiet = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let quiet_addr = quiet.local_addr().unwrap();
    let held = tokio::spawn(async move {
        let (s, _) = quiet.accept().await.unwrap();
        tokio::time::sleep(Duration::from_secs(120)).await;
        drop(s);
    });
    let mut tunnel = TcpStream::connect(proxy.addr).await.unwrap();
    let connect = format!(
        "CONNECT {quiet_addr} HTTP/1.1\r\nHost: {quiet_addr}\r\n{}\r\n",
        proxy.authorization()
    );
    tunnel.write_all(connect.as_bytes()).await.unwrap();
    let (head, _) = tokio::time::timeout(ANSWER_WITHIN, read_response(&mut tunnel))
        .await
        .unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head:?}");
    let opened = Instant::now();
    let closed = tokio::time::timeout(ANSWER_WITHIN, tunnel.read_to_end(&mut rest)).await;
    assert!(closed.is_ok(), "a stalled tunnel stays open");
    assert!(
        opened.elapsed() >= Duration::from_millis(1900),
        "{:?}",
        opened.elapsed()
    );
    held.abort();
}

/// Without credentials: 407 with the challenge, on plain requests and CONNECT.
#[tokio::test]
async fn requests_without_credentials_get_407() {
    let target = RecordingTarget::start().await;
    let proxy = Proxy::start(&[], None).await;
    let mut client = TcpStream::connect(proxy.addr).await.unwrap();
    let (head, _) = exchange(
        &mut client,
        &format!("GET http://{0}/ HTTP/1.1\r\nHost: {0}\r\n\r\n", target.addr),
    )
    .await;
    // The realm is the credentials' own, not the one every proxy shared.
    let challenge = format!(
        "Proxy-Authenticate: Basic realm=\"{}\"",
        proxy.credentials.realm()
    );
    assert!(
        head.starts_with("HTTP/1.1 407") && head.contains(&challenge),
        "{head:?}"
    );
    // The connection stays usable: the credentials on the next request.
    let (head, _) = exchange(
        &mut client,
        &format!(
            "GET http://{0}/ HTTP/1.1\r\nHost: {0}\r\n{1}\r\n",
            target.addr,
            proxy.authorization()
        ),
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head:?}");
    let mut tunnel = TcpStream::connect(proxy.addr).await.unwrap();
    let (head, _) = exchange(
        &mut tunnel,
        &format!("CONNECT {0} HTTP/1.1\r\nHost: {0}\r\n\r\n", target.addr),
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 407"), "{head:?}");
}
