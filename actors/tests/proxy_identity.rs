//! What crawlers learn about the proxies behind them, through the real
//! binary in standalone mode: a local Squid (when installed — CI installs
//! it) and a built-in proxy, each behind the gateway and leased directly.
//! A served page, a destination nobody listens on (the proxy's own
//! failure) and a destination the proxy's rules refuse (its own refusal):
//! no response head or body names the machine's host name, the proxy's
//! port, Squid's version, nor carries `X-Cache`, `X-Cache-Lookup` or `Via`;
//! through the gateway a Squid's own pages are replaced by the gateway's
//! answers (`502 upstream_failed`, `403 destination_refused`).

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::Value;
use support::operator::{OperatorDir, OperatorProcess};
use support::process::{free_port, health_target};
use support::target_server::{Behaviour, http_target_with};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const TOKEN: &str = "identity-t0ken-3c9e";
const WAIT: Duration = Duration::from_secs(30);
/// Loopback, which the proxies' rules refuse (only 127.0.0.1 is allowed).
const REFUSED: &str = "127.0.0.9";

/// The whole answer (head and body) to `GET http://{target}/` sent to
/// `proxy` with `Proxy-Authorization` for `pair`.
async fn fetch(proxy: SocketAddr, target: &str, pair: &str) -> String {
    use base64::Engine;
    let mut s = tokio::net::TcpStream::connect(proxy).await.unwrap();
    let auth = base64::engine::general_purpose::STANDARD.encode(pair);
    let head = format!(
        "GET http://{target}/page HTTP/1.1\r\nHost: {target}\r\nProxy-Authorization: Basic {auth}\r\n\
         Connection: close\r\n\r\n"
    );
    s.write_all(head.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    tokio::time::timeout(Duration::from_secs(60), s.read_to_end(&mut got))
        .await
        .expect("the whole answer within a minute")
        .unwrap();
    String::from_utf8_lossy(&got).into_owned()
}

/// The machine's host name.
fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .unwrap()
        .trim()
        .to_owned()
}

/// Whether `word` stands in `text` as a word of its own (not inside a longer one).
fn names(text: &str, word: &str) -> bool {
    let is_word = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_';
    text.match_indices(word).any(|(at, _)| {
        let before = text[..at].chars().next_back();
        let after = text[at + word.len()..].chars().next();
        !before.is_some_and(is_word) && !after.is_some_and(is_word)
    })
}

/// Fails when `answer` names the proxy at `proxy`.
fn assert_anonymous(answer: &str, proxy: SocketAddr, what: &str) {
    let lower = answer.to_ascii_lowercase();
    let head = lower.split("\r\n\r\n").next().unwrap_or_default();
    for header in ["x-cache:", "x-cache-lookup:", "via:"] {
        assert!(!head.contains(header), "{what}: {header} in\n{answer}");
    }
    assert!(!lower.contains("squid/"), "{what}: Squid's version in\n{answer}");
    assert!(!names(answer, &hostname()), "{what}: the host name in\n{answer}");
    assert!(
        !names(answer, &proxy.port().to_string()),
        "{what}: the proxy's port {} in\n{answer}",
        proxy.port()
    );
}

fn status(answer: &str) -> u16 {
    answer
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line: {answer}"))
}

/// An operator with one proxy of `provider` behind the gateway.
async fn operator(dir: &OperatorDir, gateway: SocketAddr) -> OperatorProcess {
    let health = health_target();
    dir.write_manifest(
        "p1",
        &format!(
            "apiVersion: crawl.example.com/v1alpha1\nkind: Proxy\nmetadata: {{name: p1, namespace: crawl}}\n\
             spec: {{mode: Managed, provider: local, healthCheck: {{url: \"{health}\", interval: 1s}}}}\n"
        ),
    );
    let operator = dir
        .standalone()
        .discovery()
        .setting("gatewayBindAddress", &format!("\"{gateway}\""))
        // The gateway lets loopback through: the proxy's own rules answer.
        .setting("gateway", "{destinations: {allow: [127.0.0.0/8, 1024-65535]}}")
        .setting("leaseCooldown", "0s")
        .setting("maxLeasesPerProxy", "4")
        .env("DISCOVERY_TOKEN", TOKEN)
        .start()
        .await;
    operator.wait_ready(1).await;
    operator
}

/// The leased proxy's address and credentials (`user:password`).
async fn lease(operator: &OperatorProcess) -> (SocketAddr, String) {
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
                Some(r#"{"target":"127.0.0.1"}"#),
            )
            .await;
            match status {
                201 => Ok(serde_json::from_str::<Value>(&body).unwrap()),
                _ => Err(format!("{status} {body}")),
            }
        })
        .await;
    let url = url::Url::parse(lease["proxy"]["url"].as_str().unwrap()).unwrap();
    let proxy = format!("{}:{}", url.host_str().unwrap(), url.port().unwrap())
        .parse()
        .unwrap();
    (
        proxy,
        format!("{}:{}", url.username(), url.password().unwrap_or_default()),
    )
}

/// The three answers through the gateway and directly, each checked.
async fn check_every_answer(operator: &OperatorProcess, gateway: SocketAddr) -> [(String, String); 3] {
    let (site, _) = http_target_with(Behaviour::Status(200)).await;
    let closed = format!("127.0.0.1:{}", free_port());
    let refused = format!("{REFUSED}:{}", site.port());
    let crawler = format!("crawler:{TOKEN}");
    operator
        .eventually("a page through the gateway", WAIT, async || {
            match fetch(gateway, &site.to_string(), &crawler).await {
                answer if status(&answer) == 200 => Ok(()),
                answer => Err(answer),
            }
        })
        .await;
    let (proxy, pair) = lease(operator).await;
    let mut answers = Vec::new();
    for target in [site.to_string(), closed, refused] {
        let through_gateway = fetch(gateway, &target, &crawler).await;
        let direct = fetch(proxy, &target, &pair).await;
        assert_anonymous(&through_gateway, proxy, &format!("{target} through the gateway"));
        assert_anonymous(&direct, proxy, &format!("{target} through the leased proxy"));
        answers.push((through_gateway, direct));
    }
    answers.try_into().unwrap()
}

#[tokio::test]
async fn a_squid_upstream_names_neither_its_host_its_port_nor_its_version() {
    let Some(squid) = support::squid::binary() else {
        assert!(std::env::var_os("CI").is_none(), "CI must have squid installed");
        eprintln!("squid is not installed; skipping (CI installs it)");
        return;
    };
    let dir = OperatorDir::new(&format!(
        "providers:\n  - {{name: local, type: local, local: {{implementation: squid, squidBinary: {}, \
         destinations: {{allow: [127.0.0.1, 1024-65535]}}}}}}\n",
        squid.display()
    ));
    let gateway: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let operator = operator(&dir, gateway).await;
    let [
        (page, direct_page),
        (closed, direct_closed),
        (refused, direct_refused),
    ] = check_every_answer(&operator, gateway).await;
    assert_eq!(status(&page), 200, "{page}");
    assert_eq!(status(&direct_page), 200, "{direct_page}");
    // Squid's own pages: the gateway answers in their place, with nothing of Squid's.
    assert_eq!(status(&closed), 502, "{closed}");
    assert!(
        closed
            .to_ascii_lowercase()
            .contains("egress-gateway-error: upstream_failed"),
        "{closed}"
    );
    assert_eq!(status(&refused), 403, "{refused}");
    assert!(
        refused
            .to_ascii_lowercase()
            .contains("egress-gateway-error: destination_refused"),
        "{refused}"
    );
    for answer in [&closed, &refused] {
        assert!(!answer.to_ascii_lowercase().contains("squid"), "{answer}");
    }
    // Leased directly, the crawler sees Squid's page, signed with the
    // neutral name only.
    assert_eq!(status(&direct_closed), 503, "{direct_closed}");
    assert_eq!(status(&direct_refused), 403, "{direct_refused}");
    assert!(direct_refused.contains("egress-proxy"), "{direct_refused}");
    operator.stop().await;
}

#[tokio::test]
async fn the_built_in_proxy_adds_nothing_that_names_it() {
    let dir = OperatorDir::new(
        "providers:\n  - {name: local, type: local, local: {implementation: builtin, destinations: {allow: [127.0.0.1, 1024-65535]}}}\n",
    );
    let gateway: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let operator = operator(&dir, gateway).await;
    let answers = check_every_answer(&operator, gateway).await;
    let [
        (page, direct_page),
        (closed, direct_closed),
        (refused, direct_refused),
    ] = &answers;
    assert_eq!(status(page), 200, "{page}");
    assert_eq!(status(direct_page), 200, "{direct_page}");
    assert_eq!(status(closed), 502, "{closed}");
    assert_eq!(status(direct_closed), 502, "{direct_closed}");
    assert_eq!(status(refused), 403, "{refused}");
    assert_eq!(status(direct_refused), 403, "{direct_refused}");
    // No Server header either: the target sends none, and the proxy adds none.
    for (through_gateway, direct) in &answers {
        for answer in [through_gateway, direct] {
            let head = answer.to_ascii_lowercase();
            let head = head.split("\r\n\r\n").next().unwrap_or_default();
            assert!(!head.contains("\r\nserver:"), "{answer}");
        }
    }
    operator.stop().await;
}
