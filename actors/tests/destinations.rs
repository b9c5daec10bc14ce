//! Destination rules through real proxies: the local provider's built-in
//! proxy and its Squid (when installed — CI installs it), each in front of
//! HTTP servers on loopback and on private, link-local and unique-local
//! addresses of a bridge this test creates. One provider allows a private
//! network, denies one address in it, and opens one extra CONNECT port;
//! every class of address gets its answer.

mod support;

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use egress_proxies::config::{LocalConfig, LocalImplementation};
use egress_proxies::destinations::DestinationRules;
use egress_proxies::provider::{CreateRequest, InstanceState, LocalProvider, Provider, instance_name};
use egress_proxies::resource::Placement;
use support::address_bed::AddressBed;
use support::eventually;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The bed's addresses for one test (`tag` keeps parallel tests apart).
struct Addresses {
    allowed_private: IpAddr,
    denied_in_allowed: IpAddr,
    default_private: IpAddr,
    link_local: IpAddr,
    unique_local: IpAddr,
    allowed_unique_local: IpAddr,
}

impl Addresses {
    fn of(tag: u8) -> Self {
        let ip = |s: String| s.parse().unwrap();
        Self {
            allowed_private: ip(format!("10.213.{tag}.1")),
            denied_in_allowed: ip(format!("10.213.{tag}.2")),
            default_private: ip(format!("10.214.{tag}.1")),
            link_local: ip(format!("169.254.213.{tag}")),
            unique_local: ip(format!("fd00:213::{tag}")),
            allowed_unique_local: ip(format!("fd00:214::{tag}")),
        }
    }

    fn all(&self) -> Vec<IpAddr> {
        vec![
            self.allowed_private,
            self.denied_in_allowed,
            self.default_private,
            self.link_local,
            self.unique_local,
            self.allowed_unique_local,
        ]
    }
}

/// An HTTP server on `ip` answering 204 to anything.
async fn server(ip: IpAddr) -> SocketAddr {
    let listener = TcpListener::bind(SocketAddr::new(ip, 0)).await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 2048];
                let _ = s.read(&mut buf).await;
                let _ = s
                    .write_all(b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                    .await;
            });
        }
    });
    addr
}

/// The status line the proxy (or the target through it) answers `head` with.
async fn ask(proxy: SocketAddr, head: String) -> String {
    let mut s = TcpStream::connect(proxy).await.unwrap();
    s.write_all(head.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    let mut byte = [0u8; 1];
    while !got.ends_with(b"\r\n") {
        match tokio::time::timeout(Duration::from_secs(10), s.read(&mut byte)).await {
            Ok(Ok(1)) => got.push(byte[0]),
            _ => break,
        }
    }
    String::from_utf8_lossy(&got).trim_end().to_owned()
}

async fn get(proxy: SocketAddr, host_port: &str) -> String {
    ask(
        proxy,
        format!("GET http://{host_port}/ HTTP/1.1\r\nHost: {host_port}\r\n\r\n"),
    )
    .await
}

async fn connect(proxy: SocketAddr, target: SocketAddr) -> String {
    ask(
        proxy,
        format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n"),
    )
    .await
}

fn rules(text: &str) -> DestinationRules {
    serde_json::from_str(text).unwrap()
}

async fn refuses_and_passes_by_class(implementation: LocalImplementation, tag: u8) {
    let addresses = Addresses::of(tag);
    let Some(_bed) = AddressBed::create(tag, &addresses.all()) else {
        eprintln!("needs root to add addresses (CI runs as root); skipping");
        assert!(std::env::var_os("CI").is_none(), "CI runs this as root");
        return;
    };
    let allowed = server(addresses.allowed_private).await;
    let tunnel_open = server(addresses.allowed_private).await;
    let denied_in_allowed = server(addresses.denied_in_allowed).await;
    let default_private = server(addresses.default_private).await;
    let link_local = server(addresses.link_local).await;
    let unique_local = server(addresses.unique_local).await;
    let allowed_unique_local = server(addresses.allowed_unique_local).await;
    let loopback = server(IpAddr::from([127, 0, 0, 1])).await;

    let state = tempfile::tempdir().unwrap();
    let _reaper = support::process::Reaper(state.path().to_owned());
    let config = LocalConfig {
        implementation,
        destinations: rules(&format!(
            r#"{{"allow": ["10.213.{tag}.0/24", "{}", {}], "deny": ["{}"]}}"#,
            addresses.allowed_unique_local,
            tunnel_open.port(),
            addresses.denied_in_allowed,
        )),
        ..LocalConfig::default()
    };
    let p = LocalProvider::new(
        "local",
        config,
        state.path(),
        env!("CARGO_BIN_EXE_egress-proxies-operator").into(),
        &[],
    )
    .unwrap();
    let uid = format!("dest-{tag}");
    let req = CreateRequest {
        name: instance_name(&uid),
        uid,
        namespace: "default".into(),
        installation: support::installation(),
        cloud_init: None,
        placement: Placement::default(),
        port: 3128,
        // Destinations alone: credentials have tests of their own.
        credentials: None,
        quarantined: Vec::new(),
    };
    let id = p.create(&req).await.unwrap();
    let instance = eventually("the proxy to run", Duration::from_secs(20), async || {
        let i = p.get(&id).await.unwrap();
        (i.state == InstanceState::Running).then_some(i)
    })
    .await;
    let proxy = SocketAddr::new(instance.ip.unwrap(), instance.port.unwrap());

    const PASSED: &str = "HTTP/1.1 204 No Content";
    const REFUSED: &str = "HTTP/1.1 403 Forbidden";
    let answers = [
        (
            "an allowed private address",
            get(proxy, &allowed.to_string()).await,
            PASSED,
        ),
        (
            "an allowed unique-local address",
            get(proxy, &allowed_unique_local.to_string()).await,
            PASSED,
        ),
        (
            "a denied address inside an allowed network",
            get(proxy, &denied_in_allowed.to_string()).await,
            REFUSED,
        ),
        (
            "a private address (default deny)",
            get(proxy, &default_private.to_string()).await,
            REFUSED,
        ),
        (
            "a link-local address (default deny)",
            get(proxy, &link_local.to_string()).await,
            REFUSED,
        ),
        (
            "a unique-local address (default deny)",
            get(proxy, &unique_local.to_string()).await,
            REFUSED,
        ),
        (
            "loopback (default deny)",
            get(proxy, &loopback.to_string()).await,
            REFUSED,
        ),
        (
            "loopback as an IPv4-mapped IPv6 address",
            get(proxy, &format!("[::ffff:127.0.0.1]:{}", loopback.port())).await,
            REFUSED,
        ),
        (
            "0.0.0.0 (reaches this host)",
            get(proxy, &format!("0.0.0.0:{}", loopback.port())).await,
            REFUSED,
        ),
        (
            "loopback by name (checked after resolving)",
            get(proxy, &format!("localhost:{}", loopback.port())).await,
            REFUSED,
        ),
        (
            "CONNECT to an allowed port",
            connect(proxy, tunnel_open).await,
            "HTTP/1.1 200 Connection established",
        ),
        (
            "CONNECT to a port neither 443 nor allowed",
            connect(proxy, allowed).await,
            REFUSED,
        ),
        (
            "CONNECT to the link-local address",
            connect(proxy, link_local).await,
            REFUSED,
        ),
    ];
    let wrong: Vec<String> = answers
        .iter()
        .filter(|(_, got, want)| !got.eq_ignore_ascii_case(want))
        .map(|(what, got, want)| format!("{what}: got {got:?}, want {want:?}"))
        .collect();
    assert!(
        wrong.is_empty(),
        "{implementation:?} answered wrongly:\n{}",
        wrong.join("\n")
    );

    p.delete(&id).await.unwrap();
}

#[tokio::test]
async fn builtin_proxy_refuses_denied_destinations_and_passes_allowed_ones() {
    refuses_and_passes_by_class(LocalImplementation::Builtin, 1).await;
}

#[tokio::test]
async fn squid_refuses_denied_destinations_and_passes_allowed_ones() {
    if support::squid::binary().is_none() {
        eprintln!("squid is not installed; skipping (CI installs it)");
        assert!(std::env::var_os("CI").is_none(), "CI must have squid installed");
        return;
    }
    refuses_and_passes_by_class(LocalImplementation::Squid, 2).await;
}

/// The kubernetes provider's pod config, with every kind of rule and a
/// cluster network, is accepted by a real Squid's parser.
#[tokio::test]
async fn the_kubernetes_pods_squid_config_parses() {
    let Some(squid) = support::squid::binary() else {
        eprintln!("squid is not installed; skipping (CI installs it)");
        assert!(std::env::var_os("CI").is_none(), "CI must have squid installed");
        return;
    };
    let policy = egress_proxies::destinations::DestinationPolicy::new(
        &rules(r#"{"allow": ["10.1.0.0/16", "fd00::1", 8443, "9000-9009"], "deny": ["10.1.2.0/24", 25]}"#),
        &["10.96.0.0/12".parse().unwrap()],
    );
    let conf = egress_proxies::provider::kubernetes::squid_config(3128, &policy);
    assert!(
        conf.contains("acl epo_default_denied_dst dst ") && conf.contains(" 10.96.0.0/12\n"),
        "{conf}"
    );
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("squid.conf"), &conf).unwrap();
    let out = std::process::Command::new(squid)
        .args(["-k", "parse", "-f"])
        .arg(dir.path().join("squid.conf"))
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{said}");
    assert!(!said.contains("ERROR") && !said.contains("FATAL"), "{said}");
}

/// `forward-proxy` run by hand applies the defaults; `--allow` lifts them.
#[tokio::test]
async fn forward_proxy_without_rules_refuses_loopback_and_allow_lifts_it() {
    let target = server(IpAddr::from([127, 0, 0, 1])).await;
    let dir = tempfile::tempdir().unwrap();
    for (extra, want) in [
        (&[][..], "HTTP/1.1 403 Forbidden"),
        (&["--allow", "127.0.0.0/8"][..], "HTTP/1.1 204 No Content"),
    ] {
        let port = support::process::free_port();
        let _proxy = support::process::Killed(
            std::process::Command::new(env!("CARGO_BIN_EXE_egress-proxies-operator"))
                .args(["forward-proxy", "--listen", &format!("127.0.0.1:{port}")])
                .arg("--instance-dir")
                .arg(dir.path())
                .args(extra)
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .unwrap(),
        );
        let proxy = SocketAddr::from(([127, 0, 0, 1], port));
        eventually("the proxy to listen", Duration::from_secs(10), async || {
            TcpStream::connect(proxy).await.ok()
        })
        .await;
        assert_eq!(get(proxy, &target.to_string()).await, want, "with {extra:?}");
    }
}
