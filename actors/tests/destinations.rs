//! Destination rules through real proxies: the local provider's built-in
//! proxy and its Squid (when installed — CI installs it), each in front of
//! HTTP servers on loopback and on private, link-local and unique-local
//! addresses of a bridge this test creates. One provider allows a private
//! network, denies one address in it, and opens one extra CONNECT port;
//! every class of address gets its answer.

mod support;

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use egress_proxies::adapters::providers::LocalProvider;
use egress_proxies::domain::config::{LocalConfig, LocalImplementation};
use egress_proxies::domain::destinations::DestinationRules;
use egress_proxies::domain::provider_contract::{CreateRequest, InstanceState, Provider, instance_name};
use egress_proxies::domain::resource::Placement;
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
    let policy = egress_proxies::domain::destinations::DestinationPolicy::new(
        &rules(r#"{"allow": ["10.1.0.0/16", "fd00::1", 8443, "9000-9009"], "deny": ["10.1.2.0/24", 25]}"#),
        &["10.96.0.0/12".parse().unwrap()],
    );
    let conf = egress_proxies::adapters::providers::kubernetes::squid_config(3128, &policy);
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

/// The IPv6 forms of the IPv4 loopback address 127.0.`tag`.1: the three the
/// rules read the embedded address from, then the two denied whole (Teredo,
/// the client address inverted; a NAT64 local-use prefix).
fn embedding_loopback(tag: u8) -> Vec<(&'static str, IpAddr, bool)> {
    let ip = |s: String| s.parse().unwrap();
    vec![
        ("IPv4-compatible", ip(format!("::127.0.{tag}.1")), true),
        ("NAT64", ip(format!("64:ff9b::7f00:{tag:02x}01")), true),
        ("6to4", ip(format!("2002:7f00:{tag:02x}01::")), true),
        (
            "Teredo",
            ip(format!("2001:0:4136:e378:8000:63bf:80ff:{:02x}fe", 0xff - tag)),
            false,
        ),
        (
            "NAT64 local-use",
            ip(format!("64:ff9b:1::7f00:{tag:02x}01")),
            false,
        ),
    ]
}

/// A target listening on 127.0.`tag`.1 and on each of its IPv6 forms (on a
/// bed: each is an address of this machine, so a proxy that let one through
/// would reach the server behind it); asks `proxy` for each with a plain
/// GET and a CONNECT and returns what went wrong, given whether
/// `127.0.0.0/8` is allowed (its ports always are).
struct EmbeddedTargets {
    /// (what, target, passes when loopback is allowed)
    targets: Vec<(String, SocketAddr, bool)>,
    _bed: AddressBed,
}

impl EmbeddedTargets {
    async fn start(tag: u8) -> Option<Self> {
        let forms = embedding_loopback(tag);
        let addresses: Vec<IpAddr> = forms.iter().map(|(_, ip, _)| *ip).collect();
        let bed = AddressBed::create(tag, &addresses)?;
        let loopback = server(IpAddr::from([127, 0, tag, 1])).await;
        let mut targets = vec![(
            "IPv4-mapped".to_owned(),
            SocketAddr::new(format!("::ffff:127.0.{tag}.1").parse().unwrap(), loopback.port()),
            true,
        )];
        for (what, ip, follows_ipv4) in forms {
            targets.push((what.to_owned(), server(ip).await, follows_ipv4));
        }
        Some(Self { targets, _bed: bed })
    }

    /// The rules: these targets' ports open to CONNECT, and loopback if `allow_loopback`.
    fn rules(&self, allow_loopback: bool) -> Vec<String> {
        let mut allow: Vec<String> = self
            .targets
            .iter()
            .map(|(_, t, _)| t.port().to_string())
            .collect();
        if allow_loopback {
            allow.push("127.0.0.0/8".to_owned());
        }
        allow
    }

    async fn wrong_answers(&self, proxy: SocketAddr, allow_loopback: bool) -> Vec<String> {
        let mut wrong = Vec::new();
        for (what, target, follows_ipv4) in &self.targets {
            let passes = allow_loopback && *follows_ipv4;
            for (how, got, passed) in [
                ("GET", get(proxy, &target.to_string()).await, "204"),
                ("CONNECT", connect(proxy, *target).await, "200"),
            ] {
                let want = if passes { passed } else { "403" };
                if status(&got) != want {
                    wrong.push(format!("{how} {what} {target}: got {got:?}, want {want}"));
                }
            }
        }
        wrong
    }
}

/// The status code of a status line.
fn status(line: &str) -> &str {
    line.split(' ').nth(1).unwrap_or("")
}

/// `forward-proxy` refuses every IPv6 spelling of loopback, plain and
/// CONNECT, though a server listens at each; allowing 127.0.0.0/8 lets the
/// forms that embed it readably through, not Teredo or NAT64 local-use.
#[tokio::test]
async fn forward_proxy_refuses_ipv6_forms_embedding_loopback() {
    let Some(targets) = EmbeddedTargets::start(3).await else {
        eprintln!("needs root to add addresses (CI runs as root); skipping");
        assert!(std::env::var_os("CI").is_none(), "CI runs this as root");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    for allow_loopback in [false, true] {
        let port = support::process::free_port();
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_egress-proxies-operator"));
        command
            .args(["forward-proxy", "--listen", &format!("127.0.0.1:{port}")])
            .arg("--instance-dir")
            .arg(dir.path());
        for allow in targets.rules(allow_loopback) {
            command.args(["--allow", &allow]);
        }
        let _proxy = support::process::Killed(
            command
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
        let wrong = targets.wrong_answers(proxy, allow_loopback).await;
        assert!(
            wrong.is_empty(),
            "loopback allowed: {allow_loopback}:\n{}",
            wrong.join("\n")
        );
    }
}

/// A local Squid instance with `rules`; dropped with its provider's state.
struct LocalSquid {
    provider: LocalProvider,
    id: egress_proxies::domain::provider_contract::ProviderId,
    proxy: SocketAddr,
    _reaper: support::process::Reaper,
    _state: tempfile::TempDir,
}

impl LocalSquid {
    async fn start(rules: DestinationRules, uid: &str) -> Self {
        let state = tempfile::tempdir().unwrap();
        let reaper = support::process::Reaper(state.path().to_owned());
        let config = LocalConfig {
            implementation: LocalImplementation::Squid,
            destinations: rules,
            ..LocalConfig::default()
        };
        let provider = LocalProvider::new(
            "local",
            config,
            state.path(),
            env!("CARGO_BIN_EXE_egress-proxies-operator").into(),
            &[],
        )
        .unwrap();
        let req = CreateRequest {
            name: instance_name(uid),
            uid: uid.to_owned(),
            namespace: "default".into(),
            installation: support::installation(),
            cloud_init: None,
            placement: Placement::default(),
            port: 3128,
            credentials: None,
            quarantined: Vec::new(),
        };
        let id = provider.create(&req).await.unwrap();
        let instance = eventually("squid to run", Duration::from_secs(30), async || {
            let i = provider.get(&id).await.unwrap();
            (i.state == InstanceState::Running).then_some(i)
        })
        .await;
        Self {
            proxy: SocketAddr::new(instance.ip.unwrap(), instance.port.unwrap()),
            provider,
            id,
            _reaper: reaper,
            _state: state,
        }
    }

    async fn stop(self) {
        self.provider.delete(&self.id).await.unwrap();
    }
}

/// The local provider's generated squid.conf refuses the same IPv6
/// spellings of loopback as the built-in proxy, and lets the same ones
/// through when 127.0.0.0/8 is allowed.
#[tokio::test]
async fn squid_refuses_ipv6_forms_embedding_loopback() {
    if support::squid::binary().is_none() {
        eprintln!("squid is not installed; skipping (CI installs it)");
        assert!(std::env::var_os("CI").is_none(), "CI must have squid installed");
        return;
    }
    let Some(targets) = EmbeddedTargets::start(4).await else {
        eprintln!("needs root to add addresses (CI runs as root); skipping");
        assert!(std::env::var_os("CI").is_none(), "CI runs this as root");
        return;
    };
    for allow_loopback in [false, true] {
        let allow: Vec<String> = targets
            .rules(allow_loopback)
            .into_iter()
            .map(|a| match a.contains('/') {
                true => format!("{a:?}"),
                false => a,
            })
            .collect();
        let rules = rules(&format!(r#"{{"allow": [{}]}}"#, allow.join(", ")));
        let squid = LocalSquid::start(rules, &format!("embedded-{allow_loopback}")).await;
        let wrong = targets.wrong_answers(squid.proxy, allow_loopback).await;
        squid.stop().await;
        assert!(
            wrong.is_empty(),
            "loopback allowed: {allow_loopback}:\n{}",
            wrong.join("\n")
        );
    }
}

/// Squid's cache manager (`cache_object://`, what `squidclient mgr:info`
/// sends) answers nobody through a generated config, whatever the
/// destination rules allow. The host is a documentation address: Squid
/// answers manager requests itself and connects nowhere.
#[tokio::test]
async fn squid_refuses_cache_manager_requests() {
    if support::squid::binary().is_none() {
        eprintln!("squid is not installed; skipping (CI installs it)");
        assert!(std::env::var_os("CI").is_none(), "CI must have squid installed");
        return;
    }
    for (what, allow) in [
        ("default rules", r#"{}"#),
        ("loopback allowed", r#"{"allow": ["127.0.0.0/8"]}"#),
    ] {
        let squid = LocalSquid::start(rules(allow), &format!("manager-{}", allow.len())).await;
        let mut wrong = Vec::new();
        for request in [
            "GET cache_object://203.0.113.9/info HTTP/1.0\r\n\r\n".to_owned(),
            "GET cache_object://203.0.113.9/menu HTTP/1.1\r\nHost: 203.0.113.9\r\n\r\n".to_owned(),
            format!("GET cache_object://{}/info HTTP/1.0\r\n\r\n", squid.proxy.ip()),
        ] {
            let got = ask(squid.proxy, request.clone()).await;
            if status(&got) != "403" {
                wrong.push(format!("{request:?}: got {got:?}"));
            }
        }
        squid.stop().await;
        assert!(wrong.is_empty(), "{what}:\n{}", wrong.join("\n"));
    }
}
