//! Every proxy the operator creates names a realm of its own in its `407`,
//! through the real binary in standalone mode: two built-in proxies and
//! two local Squids (when installed — CI installs it). Asked without
//! credentials, each answers `407` with `Proxy-Authenticate: Basic
//! realm="egress-proxies-<hex>"`: four different realms, none the shared
//! `egress-proxies`, each the one the lease book holds for it (and hands
//! the gateway with every lease on it). After the operator is stopped, the
//! built-in proxies' processes killed and the operator started again (so
//! they are replaced by new processes), every proxy names the realm it
//! named before, and the book holds it again.

mod support;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use hyper::HeaderMap;
use hyper::header::{HeaderName, HeaderValue};
use support::operator::{OperatorDir, OperatorProcess};
use support::process::{health_target, instance_pid};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const TOKEN: &str = "realms-t0ken-7d21";
const WAIT: Duration = Duration::from_secs(60);

/// The status and headers of the answer to a request without credentials.
async fn ask_without_credentials(proxy: SocketAddr) -> Result<(u16, HeaderMap), String> {
    let mut s = tokio::net::TcpStream::connect(proxy)
        .await
        .map_err(|e| format!("connecting to {proxy}: {e}"))?;
    s.write_all(b"GET http://127.0.0.1:9/ HTTP/1.1\r\nHost: 127.0.0.1:9\r\nConnection: close\r\n\r\n")
        .await
        .map_err(|e| e.to_string())?;
    let mut got = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), s.read_to_end(&mut got))
        .await
        .map_err(|_| "no answer within 20 s".to_owned())?
        .map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&got);
    let head = text.split("\r\n\r\n").next().unwrap_or_default();
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("no status line in {text:?}"))?;
    let mut headers = HeaderMap::new();
    for line in lines {
        let (name, value) = line
            .split_once(':')
            .ok_or_else(|| format!("{line:?} in {text:?}"))?;
        headers.append(
            HeaderName::from_bytes(name.trim().as_bytes()).map_err(|e| e.to_string())?,
            HeaderValue::from_str(value.trim()).map_err(|e| e.to_string())?,
        );
    }
    Ok((status, headers))
}

/// Each Ready proxy's address and realm as the lease book holds them (the
/// dashboard's rows).
async fn booked(operator: &OperatorProcess) -> BTreeMap<String, (SocketAddr, Option<String>)> {
    let dashboard = support::http::dashboard(operator.discovery(), TOKEN).await;
    dashboard["proxies"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["ready"] == true)
        .map(|p| {
            let url = url::Url::parse(p["url"].as_str().unwrap()).unwrap();
            let addr = format!("{}:{}", url.host_str().unwrap(), url.port().unwrap());
            (
                p["name"].as_str().unwrap().to_owned(),
                (addr.parse().unwrap(), p["realm"].as_str().map(str::to_owned)),
            )
        })
        .collect()
}

/// Every proxy's realm as its 407 names it, or what is not so yet: `count`
/// proxies Ready in the book, each answering 407 with a realm of its own,
/// the one the book holds for it.
async fn realms_named(operator: &OperatorProcess, count: usize) -> Result<BTreeMap<String, String>, String> {
    let book = booked(operator).await;
    if book.len() != count {
        return Err(format!("{} of {count} Ready: {book:?}", book.len()));
    }
    let mut realms = BTreeMap::new();
    for (name, (addr, booked_realm)) in book {
        let (status, headers) = ask_without_credentials(addr).await?;
        if status != 407 {
            return Err(format!("{name} at {addr}: {status} {headers:?}"));
        }
        let realm = egress_proxies::adapters::gateway::challenge_realm(&headers)
            .ok_or_else(|| format!("{name}: no Basic realm in {headers:?}"))?;
        if !realm.starts_with("egress-proxies-") || realm.len() == "egress-proxies-".len() {
            return Err(format!("{name} names {realm:?}, not a realm of its own"));
        }
        if booked_realm.as_deref() != Some(realm.as_str()) {
            return Err(format!(
                "{name} names {realm:?}, the lease book holds {booked_realm:?}"
            ));
        }
        realms.insert(name, realm);
    }
    Ok(realms)
}

async fn realms(operator: &OperatorProcess, count: usize) -> BTreeMap<String, String> {
    operator
        .eventually(
            "every proxy's 407 to name the realm the book holds",
            WAIT,
            async || realms_named(operator, count).await,
        )
        .await
}

fn manifest(name: &str, provider: &str, health: &str) -> String {
    format!(
        "apiVersion: crawl.example.com/v1alpha1\nkind: Proxy\nmetadata: {{name: {name}, namespace: crawl}}\n\
         spec: {{mode: Managed, provider: {provider}, healthCheck: {{url: \"{health}\", interval: 1s}}}}\n"
    )
}

#[tokio::test]
async fn every_managed_proxy_names_a_realm_of_its_own_across_restarts() {
    let squid = support::squid::binary();
    if squid.is_none() {
        assert!(std::env::var_os("CI").is_none(), "CI must have squid installed");
        eprintln!("squid is not installed: built-in proxies only (CI installs it)");
    }
    let allow = "destinations: {allow: [127.0.0.1, 1024-65535]}";
    let mut providers = format!(
        "providers:\n  - {{name: builtin, type: local, local: {{implementation: builtin, {allow}}}}}\n"
    );
    if let Some(squid) = &squid {
        providers.push_str(&format!(
            "  - {{name: squid, type: local, local: {{implementation: squid, squidBinary: {}, {allow}}}}}\n",
            squid.display()
        ));
    }
    let dir = OperatorDir::new(&providers);
    let health = health_target();
    let mut names = vec![("b1", "builtin"), ("b2", "builtin")];
    if squid.is_some() {
        names.extend([("s1", "squid"), ("s2", "squid")]);
    }
    for (name, provider) in &names {
        dir.write_manifest(name, &manifest(name, provider, &health));
    }
    let start = async || {
        let operator = dir
            .standalone()
            .discovery()
            .env("DISCOVERY_TOKEN", TOKEN)
            .start()
            .await;
        operator.wait_ready(names.len()).await;
        operator
    };

    let operator = start().await;
    let first = realms(&operator, names.len()).await;
    let mut distinct: Vec<&String> = first.values().collect();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), names.len(), "one realm per proxy: {first:?}");

    // Stopped, its built-in proxies killed: started again, it replaces them
    // with new processes (the Squids it adopts as they run).
    assert!(operator.stop().await.success(), "{}", operator.logs());
    let instances = dir.state().join("local/builtin/instances");
    let mut killed = 0;
    for instance in std::fs::read_dir(&instances).unwrap().flatten() {
        if let Some(pid) = instance_pid(&instance.path()) {
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL)
                .unwrap();
            killed += 1;
        }
    }
    assert_eq!(
        killed,
        2,
        "the built-in proxies' processes under {}",
        instances.display()
    );
    let operator = start().await;
    let again = realms(&operator, names.len()).await;
    assert_eq!(again, first, "the same realms after the restart");
}
