//! A name resolving to several addresses, through the real binary run in a
//! mount namespace of its own with an `/etc/hosts` the test writes (root
//! only: without root it says it skips, in CI it fails): `multi` resolves
//! to a denied and an allowed loopback address, `allowed` to the allowed
//! one alone, and an HTTP server listens on each address, counting who
//! reaches it. Through the gateway (its rules deny one address; the leased
//! built-in proxy behind it may reach both) a plain request and a tunnel
//! to `multi` are refused `403 destination_refused`, naming the denied
//! address, while `allowed` is served, the tunnel carrying the crawler's
//! name inside. Through a leased Squid whose rules allow only one of the
//! two addresses, such a name is refused too: Squid reads one address per
//! name from `/etc/hosts`, so its name comes from a DNS server of the
//! test's on loopback (`/etc/resolv.conf` replaced as well). The denied
//! address's server never sees a connection.

mod support;

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::Value;
use support::operator::{OperatorDir, OperatorProcess, can_replace_etc_files};
use support::process::{free_port, health_target};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const TOKEN: &str = "names-t0ken-77a1";
const DENIED: &str = "127.0.0.9";
const ALLOWED: &str = "127.0.0.10";
const WAIT: Duration = Duration::from_secs(30);

/// Whether this test can run; in CI it must.
fn runnable() -> bool {
    if can_replace_etc_files() {
        return true;
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "CI runs as root with unshare: a private /etc/hosts must be possible"
    );
    eprintln!("skipping: a private /etc/hosts needs root (a mount namespace)");
    false
}

/// An HTTP server on `ip:port` answering each request with the address it
/// was reached at; counts the connections it accepts and keeps the heads.
struct Site {
    connections: Arc<AtomicUsize>,
    heads: Arc<std::sync::Mutex<Vec<String>>>,
}

impl Site {
    /// Whether a request head the site received named `host:port` in `Host`.
    fn saw_host(&self, host: &str, port: u16) -> bool {
        let wanted = format!("Host: {host}:{port}");
        self.heads.lock().unwrap().iter().any(|h| h.contains(&wanted))
    }
}

async fn site(ip: &str, port: u16) -> Site {
    let listener = TcpListener::bind((ip.parse::<IpAddr>().unwrap(), port))
        .await
        .unwrap();
    let site = Site {
        connections: Arc::default(),
        heads: Arc::default(),
    };
    let (connections, heads) = (site.connections.clone(), site.heads.clone());
    let me = ip.to_owned();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            connections.fetch_add(1, Ordering::SeqCst);
            let (heads, me) = (heads.clone(), me.clone());
            tokio::spawn(async move {
                let mut got = Vec::new();
                let mut buf = [0u8; 2048];
                while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                    }
                }
                heads
                    .lock()
                    .unwrap()
                    .push(String::from_utf8_lossy(&got).into_owned());
                let answer = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{me}",
                    me.len()
                );
                let _ = s.write_all(answer.as_bytes()).await;
            });
        }
    });
    site
}

/// A port free on both addresses, with a site on each.
async fn sites() -> (u16, Site, Site) {
    for _ in 0..20 {
        let port = free_port();
        let free = |ip: &str| std::net::TcpListener::bind((ip.parse::<IpAddr>().unwrap(), port)).is_ok();
        if free(DENIED) && free(ALLOWED) {
            return (port, site(DENIED, port).await, site(ALLOWED, port).await);
        }
    }
    panic!("no port free on both {DENIED} and {ALLOWED}");
}

/// The machine's hosts file with `multi` and `allowed` added.
fn hosts_file(dir: &Path) -> std::path::PathBuf {
    let mut hosts = std::fs::read_to_string("/etc/hosts").unwrap_or_default();
    hosts.push_str(&format!("\n{DENIED} multi\n{ALLOWED} multi\n{ALLOWED} allowed\n"));
    let path = dir.join("hosts");
    std::fs::write(&path, hosts).unwrap();
    path
}

/// Where the tests' DNS servers listen, one each (port 53: resolv.conf names no port).
const DNS_SERVERS: [&str; 2] = ["127.0.99.53", "127.0.99.54"];
/// The name only the test's DNS server knows, with both addresses.
const MULTI_DNS: &str = "multi-dns.test";
/// A rebinding name: the allowed address in the first answer, the denied
/// one in every later answer (with a TTL of 0).
const REBINDING: &str = "rebinding.test";

/// A DNS server on `server` answering `A` queries for [`MULTI_DNS`]
/// and [`REBINDING`], every other query with no address; a resolv.conf
/// naming it.
async fn dns_server(dir: &Path, server: &str) -> std::path::PathBuf {
    let socket = tokio::net::UdpSocket::bind((server, 53)).await.unwrap();
    tokio::spawn(async move {
        let mut buf = [0u8; 1500];
        let mut rebinding_answers = 0;
        while let Ok((n, from)) = socket.recv_from(&mut buf).await {
            if let Some(answer) = dns_answer(&buf[..n], &mut rebinding_answers) {
                let _ = socket.send_to(&answer, from).await;
            }
        }
    });
    let path = dir.join("resolv.conf");
    std::fs::write(&path, format!("nameserver {server}\n")).unwrap();
    path
}

/// The answer to one query (RFC 1035 §4.1): the question echoed, then an
/// `A` record per address of the name, none for anything else.
fn dns_answer(query: &[u8], rebinding_answers: &mut usize) -> Option<Vec<u8>> {
    let mut at = 12;
    let mut labels = Vec::new();
    loop {
        let len = usize::from(*query.get(at)?);
        at += 1;
        if len == 0 {
            break;
        }
        labels.push(String::from_utf8_lossy(query.get(at..at + len)?).to_ascii_lowercase());
        at += len;
    }
    let question = query.get(12..at + 4)?;
    let qtype = u16::from_be_bytes([query[at], query[at + 1]]);
    let name = labels.join(".");
    let addresses: &[&str] = match (name.as_str(), qtype) {
        (MULTI_DNS, 1) => &[DENIED, ALLOWED],
        (REBINDING, 1) => {
            *rebinding_answers += 1;
            if *rebinding_answers == 1 {
                &[ALLOWED]
            } else {
                &[DENIED]
            }
        }
        _ => &[],
    };
    let addresses: Vec<[u8; 4]> = addresses
        .iter()
        .map(|ip| ip.parse::<std::net::Ipv4Addr>().unwrap().octets())
        .collect();
    let mut answer = query[..2].to_vec();
    answer.extend_from_slice(&[0x81, 0x80, 0, 1, 0, addresses.len() as u8, 0, 0, 0, 0]);
    answer.extend_from_slice(question);
    for octets in addresses {
        // The name by pointer to the question's, type A, class IN, TTL 0, 4 bytes.
        answer.extend_from_slice(&[0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 0, 0, 4]);
        answer.extend_from_slice(&octets);
    }
    Some(answer)
}

fn proxy_manifest(dir: &OperatorDir) {
    let health = health_target();
    dir.write_manifest(
        "p1",
        &format!(
            "apiVersion: crawl.example.com/v1alpha1\nkind: Proxy\nmetadata: {{name: p1, namespace: crawl}}\n\
             spec: {{mode: Managed, provider: local, healthCheck: {{url: \"{health}\", interval: 1s}}}}\n"
        ),
    );
}

/// Sends `head` to `proxy` (adding `auth` as Proxy-Authorization when
/// given) and reads the answer's head; the connection stays open.
async fn ask(proxy: SocketAddr, head: &str, auth: Option<&str>) -> (TcpStream, String) {
    use base64::Engine;
    let mut s = TcpStream::connect(proxy).await.unwrap();
    let head = match auth {
        Some(pair) => head.replace(
            "\r\n\r\n",
            &format!(
                "\r\nProxy-Authorization: Basic {}\r\n\r\n",
                base64::engine::general_purpose::STANDARD.encode(pair)
            ),
        ),
        None => head.to_owned(),
    };
    s.write_all(head.as_bytes()).await.unwrap();
    let read = async {
        let mut got = Vec::new();
        let mut byte = [0u8; 1];
        while !got.ends_with(b"\r\n\r\n") {
            if s.read(&mut byte).await.unwrap_or(0) == 0 {
                break;
            }
            got.push(byte[0]);
        }
        String::from_utf8_lossy(&got).into_owned()
    };
    let answer = tokio::time::timeout(WAIT, read).await.expect("an answer");
    (s, answer)
}

/// A plain GET of `http://{host}:{port}/`: the status line and the body.
async fn get(proxy: SocketAddr, host: &str, port: u16, auth: Option<&str>) -> (String, String) {
    let head =
        format!("GET http://{host}:{port}/ HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n");
    let (mut s, answer) = ask(proxy, &head, auth).await;
    let mut body = String::new();
    let _ = tokio::time::timeout(WAIT, s.read_to_string(&mut body)).await;
    (answer, body)
}

/// `CONNECT {host}:{port}`, then a GET inside the tunnel when it opens: the
/// CONNECT's answer and the answer inside (empty when refused).
async fn tunnel(proxy: SocketAddr, host: &str, port: u16, auth: Option<&str>) -> (String, String) {
    let head = format!("CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n");
    let (mut s, answer) = ask(proxy, &head, auth).await;
    if !answer.starts_with("HTTP/1.1 200") {
        return (answer, String::new());
    }
    s.write_all(format!("GET / HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut inside = String::new();
    let _ = tokio::time::timeout(WAIT, s.read_to_string(&mut inside)).await;
    (answer, inside)
}

fn assert_never_reached(denied: &Site, operator: &OperatorProcess) {
    assert_eq!(
        denied.connections.load(Ordering::SeqCst),
        0,
        "the denied address was reached: {:?}\n{}",
        denied.heads.lock().unwrap(),
        operator.logs()
    );
}

#[tokio::test]
async fn the_gateway_refuses_a_name_with_a_denied_address_and_never_reaches_it() {
    if !runnable() {
        return;
    }
    // The leased proxy may reach both addresses: only the gateway's rules
    // stand between a crawler and the denied one.
    let dir = OperatorDir::new(
        "providers:\n  - {name: local, type: local, local: {implementation: builtin, destinations: {allow: [127.0.0.0/8, 1024-65535]}}}\n",
    );
    proxy_manifest(&dir);
    let (port, denied, allowed) = sites().await;
    let resolv = dns_server(dir.path(), DNS_SERVERS[0]).await;
    let gateway: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let operator = dir
        .standalone()
        .private_file(&hosts_file(dir.path()), "/etc/hosts")
        .private_file(&resolv, "/etc/resolv.conf")
        .setting("gatewayBindAddress", &format!("\"{gateway}\""))
        .setting(
            "gateway",
            &format!("{{destinations: {{allow: [127.0.0.0/8, 1024-65535], deny: [{DENIED}]}}}}"),
        )
        .setting("leaseCooldown", "0s")
        .env("DISCOVERY_TOKEN", TOKEN)
        .start()
        .await;
    operator.wait_ready(1).await;
    let auth = format!("crawler:{TOKEN}");
    let auth = Some(auth.as_str());
    operator
        .eventually("`allowed` served through the gateway", WAIT, async || match get(
            gateway, "allowed", port, auth,
        )
        .await
        {
            (status, body) if status.starts_with("HTTP/1.1 200") && body == ALLOWED => Ok(()),
            other => Err(format!("{other:?}")),
        })
        .await;
    let (answer, inside) = tunnel(gateway, "allowed", port, auth).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(inside.ends_with(ALLOWED), "{inside}");
    assert!(
        allowed.saw_host("allowed", port),
        "the site sees the crawler's name inside the tunnel"
    );

    // The denied address itself, and the name that resolves to it among
    // others, whichever the resolver gives first: refused, every time.
    let (status, _) = get(gateway, DENIED, port, auth).await;
    assert!(status.starts_with("HTTP/1.1 403"), "{status}");
    for _ in 0..5 {
        for (answer, _) in [
            get(gateway, "multi", port, auth).await,
            tunnel(gateway, "multi", port, auth).await,
        ] {
            assert!(answer.starts_with("HTTP/1.1 403"), "{answer}");
            assert!(
                answer
                    .to_ascii_lowercase()
                    .contains("egress-gateway-error: destination_refused"),
                "{answer}"
            );
        }
    }
    assert!(
        operator
            .logs()
            .contains(&format!("multi:{port} is refused: it resolves to {DENIED}")),
        "the refusal names the denied address\n{}",
        operator.logs()
    );
    // A name that answers the allowed address to the gateway's check and
    // the denied one afterwards: the tunnel goes to the address the
    // gateway checked, the leased proxy does not resolve the name again.
    let (answer, inside) = tunnel(gateway, REBINDING, port, auth).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(inside.ends_with(ALLOWED), "{inside}");
    assert!(
        allowed.saw_host(REBINDING, port),
        "the site sees the crawler's name inside the tunnel"
    );
    assert_never_reached(&denied, &operator);
    operator.stop().await;
}

#[tokio::test]
async fn a_leased_squid_refuses_a_name_with_a_denied_address_and_never_reaches_it() {
    if !runnable() {
        return;
    }
    let Some(squid) = support::squid::binary() else {
        assert!(std::env::var_os("CI").is_none(), "CI must have squid installed");
        eprintln!("squid is not installed; skipping (CI installs it)");
        return;
    };
    // Only the allowed address (and the health target's) lifts the
    // default deny of loopback: the denied one stays refused.
    let dir = OperatorDir::new(&format!(
        "providers:\n  - {{name: local, type: local, local: {{implementation: squid, squidBinary: {}, \
         destinations: {{allow: [127.0.0.1, {ALLOWED}, 1024-65535]}}}}}}\n",
        squid.display()
    ));
    proxy_manifest(&dir);
    let (port, denied, _allowed) = sites().await;
    let resolv = dns_server(dir.path(), DNS_SERVERS[1]).await;
    let operator = dir
        .standalone()
        .discovery()
        .private_file(&hosts_file(dir.path()), "/etc/hosts")
        .private_file(&resolv, "/etc/resolv.conf")
        .setting("leaseCooldown", "0s")
        .env("DISCOVERY_TOKEN", TOKEN)
        .start()
        .await;
    operator.wait_ready(1).await;
    let auth = format!("Bearer {TOKEN}");
    let headers = [
        ("Authorization", auth.as_str()),
        ("Content-Type", "application/json"),
    ];
    let lease = operator
        .eventually("a lease", WAIT, async || {
            let (status, body) = support::http::request(
                operator.discovery(),
                "POST",
                "/v1/leases",
                &headers,
                Some(r#"{"target":"multi"}"#),
            )
            .await;
            match status {
                201 => Ok(serde_json::from_str::<Value>(&body).unwrap()),
                _ => Err(format!("{status} {body}")),
            }
        })
        .await;
    let url = url::Url::parse(lease["proxy"]["url"].as_str().unwrap()).unwrap();
    let proxy: SocketAddr = format!("{}:{}", url.host_str().unwrap(), url.port().unwrap())
        .parse()
        .unwrap();
    let pair = format!("{}:{}", url.username(), url.password().unwrap_or_default());
    let auth = Some(pair.as_str());

    let (status, body) = get(proxy, "allowed", port, auth).await;
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    assert_eq!(body, ALLOWED);
    for _ in 0..5 {
        let (status, _) = get(proxy, MULTI_DNS, port, auth).await;
        assert!(status.starts_with("HTTP/1.1 403"), "{status}");
        let (answer, _) = tunnel(proxy, MULTI_DNS, port, auth).await;
        assert!(answer.starts_with("HTTP/1.1 403"), "{answer}");
    }
    assert_never_reached(&denied, &operator);
    operator.stop().await;
}
