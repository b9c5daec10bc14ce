//! The gateway through the real binary in standalone mode, on loopback: one
//! local proxy of capacity 1 behind it, a local http and https target.
//! curl and Python `requests` fetch both pages through it with the crawler
//! token as the proxy password; no or a wrong password is a 407, a refused
//! destination a 403 with no lease taken, no leasable proxy a 503 with
//! `Retry-After`; gateway and API leases share one book (a held tunnel
//! fills the proxy for the API, an API lease fills it for the gateway) and
//! the gateway's lease is released when its request or tunnel ends. The
//! token never reaches the log. An open gateway on a reachable address
//! refuses to start.

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::Value;
use support::operator::{OperatorDir, OperatorProcess};
use support::process::{free_port, health_target};
use support::target_server::{Behaviour, http_target_with, https_target};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const TOKEN: &str = "gw-test-t0ken-9f3c";
/// Loopback on any port: the https target listens on a random one.
const PROVIDER: &str = "providers:\n  - {name: local, type: local, local: {implementation: builtin, destinations: {allow: [127.0.0.0/8, 1024-65535]}}}\n";
/// `::1` too: `localhost` may resolve to it, and the gateway refuses a
/// name with any refused address.
const DESTINATIONS: &str = "{allow: [127.0.0.0/8, '::1', 1024-65535]}";

fn bearer() -> String {
    format!("Bearer {TOKEN}")
}

async fn api(operator: &OperatorProcess, method: &str, path: &str, body: Option<&str>) -> (u16, Value) {
    let auth = bearer();
    let mut headers = vec![("Authorization", auth.as_str())];
    if body.is_some() {
        headers.push(("Content-Type", "application/json"));
    }
    let (status, text) = support::http::request(operator.discovery(), method, path, &headers, body).await;
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// The proxy's active leases, as the API lists them.
async fn active_leases(operator: &OperatorProcess) -> u64 {
    let (status, list) = api(operator, "GET", "/v1/proxies", None).await;
    assert_eq!(status, 200, "{list}");
    list.as_array()
        .unwrap()
        .iter()
        .map(|p| p["activeLeases"].as_u64().unwrap())
        .sum()
}

/// Runs a client; its stdout (the test fails on a failed start).
async fn run(program: &str, args: &[&str]) -> (bool, String, String) {
    let out = tokio::time::timeout(
        Duration::from_secs(30),
        tokio::process::Command::new(program)
            .args(args)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .unwrap_or_else(|_| panic!("{program} {args:?} did not finish in 30 s"))
    .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `curl -x proxy url`: the status and the response head (`-D -`).
async fn curl(proxy: &str, url: &str, extra: &[&str]) -> (u16, String) {
    let mut args = vec![
        "-s",
        "-o",
        "/dev/null",
        "-D",
        "-",
        "-w",
        "%{http_code}",
        "-x",
        proxy,
        url,
    ];
    args.extend_from_slice(extra);
    let (_, out, err) = run("curl", &args).await;
    let status = out
        .rsplit('\n')
        .next()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(|| panic!("curl gave no status: {out} {err}"));
    (status, out.to_ascii_lowercase())
}

fn pem(der: &[u8]) -> String {
    use base64::Engine;
    let text = base64::engine::general_purpose::STANDARD.encode(der);
    let lines: Vec<&str> = text
        .as_bytes()
        .chunks(64)
        .map(|c| std::str::from_utf8(c).unwrap())
        .collect();
    format!(
        "-----BEGIN CERTIFICATE-----\n{}\n-----END CERTIFICATE-----\n",
        lines.join("\n")
    )
}

/// Opens a tunnel through the gateway and keeps it open; the status line.
async fn hold_tunnel(gateway: SocketAddr, target: &str) -> (tokio::net::TcpStream, String) {
    use base64::Engine;
    let mut s = tokio::net::TcpStream::connect(gateway).await.unwrap();
    let auth = base64::engine::general_purpose::STANDARD.encode(format!("crawler:{TOKEN}"));
    let head =
        format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\nProxy-Authorization: Basic {auth}\r\n\r\n");
    s.write_all(head.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    let mut byte = [0u8; 1];
    while !got.ends_with(b"\r\n\r\n") {
        if s.read(&mut byte).await.unwrap() == 0 {
            break;
        }
        got.push(byte[0]);
    }
    let text = String::from_utf8_lossy(&got).into_owned();
    (s, text.lines().next().unwrap_or_default().to_owned())
}

#[tokio::test]
async fn crawlers_fetch_through_the_gateway_on_the_shared_lease_book() {
    let dir = OperatorDir::new(PROVIDER);
    let health = health_target();
    dir.write_manifest(
        "p1",
        &format!(
            "apiVersion: crawl.example.com/v1alpha1\nkind: Proxy\nmetadata: {{name: p1, namespace: crawl}}\n\
             spec: {{mode: Managed, provider: local, healthCheck: {{url: \"{health}\", interval: 1s}}}}\n"
        ),
    );
    let gateway: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let operator = dir
        .standalone()
        .discovery()
        .setting("gatewayBindAddress", &format!("\"{gateway}\""))
        .setting("gateway", &format!("{{destinations: {DESTINATIONS}}}"))
        .setting("maxLeasesPerProxy", "1")
        .setting("leaseCooldown", "0s")
        .env("DISCOVERY_TOKEN", TOKEN)
        .start()
        .await;
    operator.wait_ready(1).await;
    let (site, seen) = http_target_with(Behaviour::Status(204)).await;
    let (tls_site, cert) = https_target().await;
    let ca = dir.path().join("target-ca.pem");
    std::fs::write(&ca, pem(&cert)).unwrap();
    let ca = ca.to_str().unwrap().to_owned();
    let proxy = format!("http://crawler:{TOKEN}@{gateway}");
    let page = format!("http://{site}/page");
    let tls_page = format!("https://localhost:{}/page", tls_site.port());
    // The proxy turns Ready before its health verdict reaches the book.
    operator
        .eventually(
            "a gateway request served",
            Duration::from_secs(30),
            async || match curl(&proxy, &page, &[]).await {
                (204, _) => Ok(()),
                (status, head) => Err(format!("{status}: {head}")),
            },
        )
        .await;

    // curl: http and https (TLS end to end, the gateway only splices).
    assert_eq!(curl(&proxy, &page, &[]).await.0, 204);
    assert_eq!(curl(&proxy, &tls_page, &["--cacert", &ca]).await.0, 204);
    // Python requests, the same way a crawler script would.
    let script = format!(
        "import requests\nproxies = {{'http': '{proxy}', 'https': '{proxy}'}}\n\
         print(requests.get('{page}', proxies=proxies, timeout=20).status_code)\n\
         print(requests.get('{tls_page}', proxies=proxies, verify='{ca}', timeout=20).status_code)\n"
    );
    let (ok, out, err) = run("python3", &["-c", &script]).await;
    assert!(ok, "python requests failed: {out} {err}");
    assert_eq!(
        out.split_whitespace().collect::<Vec<_>>(),
        ["204", "204"],
        "{err}"
    );
    // Every lease went back after its request.
    operator
        .eventually(
            "the gateway's leases released",
            Duration::from_secs(10),
            async || match active_leases(&operator).await {
                0 => Ok(()),
                n => Err(format!("{n} active")),
            },
        )
        .await;

    // No credentials, a wrong password: 407 with the challenge.
    let (status, head) = curl(&format!("http://{gateway}"), &page, &[]).await;
    assert_eq!(status, 407, "{head}");
    assert!(head.contains("proxy-authenticate: basic realm="), "{head}");
    let (status, _) = curl(&format!("http://crawler:wrong@{gateway}"), &page, &[]).await;
    assert_eq!(status, 407);
    let (status, _) = curl(&format!("http://{TOKEN}:wrong@{gateway}"), &page, &[]).await;
    assert_eq!(status, 407, "the token is the password, not the username");

    // A refused destination (the metadata address): 403, and no lease taken.
    let (status, head) = curl(&proxy, "http://169.254.169.254/latest/meta-data/", &[]).await;
    assert_eq!(status, 403, "{head}");
    assert!(
        head.contains("egress-gateway-error: destination_refused"),
        "{head}"
    );
    assert_eq!(active_leases(&operator).await, 0);

    // An API lease fills the proxy: the gateway answers 503 with Retry-After.
    let (status, lease) = api(&operator, "POST", "/v1/leases", Some(r#"{"target":"127.0.0.1"}"#)).await;
    assert_eq!(status, 201, "{lease}");
    let (status, head) = curl(&proxy, &page, &[]).await;
    assert_eq!(status, 503, "{head}");
    assert!(head.contains("retry-after: 1"), "{head}");
    assert!(head.contains("egress-gateway-error: no_capacity"), "{head}");
    let id = lease["id"].as_str().unwrap();
    let (status, _) = api(&operator, "DELETE", &format!("/v1/leases/{id}"), None).await;
    assert_eq!(status, 204);
    assert_eq!(curl(&proxy, &page, &[]).await.0, 204, "the proxy is free again");

    // A tunnel held through the gateway holds its lease: the API finds no proxy.
    let (tunnel, line) = hold_tunnel(gateway, &format!("localhost:{}", tls_site.port())).await;
    assert!(line.starts_with("HTTP/1.1 200"), "{line}");
    assert_eq!(active_leases(&operator).await, 1);
    let (status, body) = api(
        &operator,
        "POST",
        "/v1/leases",
        Some(r#"{"target":"other.example"}"#),
    )
    .await;
    assert_eq!(status, 503, "the gateway's lease counts against capacity: {body}");
    drop(tunnel);
    operator
        .eventually(
            "the tunnel's lease released",
            Duration::from_secs(10),
            async || match active_leases(&operator).await {
                0 => Ok(()),
                n => Err(format!("{n} active")),
            },
        )
        .await;
    let (status, body) = api(
        &operator,
        "POST",
        "/v1/leases",
        Some(r#"{"target":"other.example"}"#),
    )
    .await;
    assert_eq!(status, 201, "{body}");

    // Neither the crawler's token nor any proxy credential reaches the site.
    let heads = seen.lock().unwrap().join("\n");
    assert!(heads.contains("GET /page"), "{heads}");
    assert!(!heads.contains(TOKEN), "{heads}");
    assert!(
        !heads.to_ascii_lowercase().contains("proxy-authorization"),
        "{heads}"
    );

    let logs = operator.logs();
    assert!(logs.contains("gateway listening"), "{logs}");
    assert!(!logs.contains(TOKEN), "the token reached the log");
    assert!(!logs.contains(&crate_b64(&format!("crawler:{TOKEN}"))));
    operator.stop().await;
}

fn crate_b64(text: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(text)
}

#[tokio::test]
async fn an_open_gateway_on_a_reachable_address_refuses_to_start() {
    let dir = OperatorDir::new(PROVIDER);
    let operator = dir
        .standalone()
        .setting("gatewayBindAddress", &format!("\"0.0.0.0:{}\"", free_port()))
        .spawn();
    let status = operator
        .eventually("the operator to exit", Duration::from_secs(30), async || {
            operator.exited()
        })
        .await;
    assert!(!status.success());
    let logs = operator.logs();
    assert!(
        logs.contains("without authentication") && logs.contains("DISCOVERY_TOKEN"),
        "{logs}"
    );
}
