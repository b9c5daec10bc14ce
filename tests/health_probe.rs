//! The health probe through real proxies — Squid (Debian package) and the
//! built-in forward proxy — to local targets: success over CONNECT + TLS
//! with the test's own CA and over plain http, and each failure reason.

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use egress_proxies::adapters::probe::{ProbeFailure, Prober};
use egress_proxies::domain::health::{CheckSpec, Thresholds};
use rustls::pki_types::CertificateDer;
use support::squid::Squid;
use support::target_server::{
    Behaviour, http_target_with, https_target_noting_resumptions, https_target_with,
};

fn check(url: &str, expected: Option<u16>, timeout_ms: u64) -> CheckSpec {
    CheckSpec {
        url: url.parse().unwrap(),
        expected_status: expected,
        interval: Duration::from_secs(1),
        timeout: Duration::from_millis(timeout_ms),
        thresholds: Thresholds {
            healthy: 2,
            unhealthy: 3,
        },
    }
}

fn prober_trusting(ca: &CertificateDer<'static>) -> Prober {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.clone()).unwrap();
    Prober::with_roots(roots).unwrap()
}

async fn builtin_proxy() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(egress_proxies::adapters::forward_proxy::serve(
        listener,
        support::open_to_loopback(),
        None,
    ));
    addr
}

/// Every proxy kind the tests run against: the built-in one always, Squid when installed.
async fn proxies() -> (Vec<(&'static str, SocketAddr)>, Option<Squid>) {
    let mut out = vec![("builtin", builtin_proxy().await)];
    let squid = Squid::start("").await;
    match &squid {
        Some(s) => out.push(("squid", s.addr)),
        None => assert!(std::env::var_os("CI").is_none(), "CI must have squid installed"),
    }
    (out, squid)
}

#[tokio::test]
async fn https_through_connect_and_tls_succeeds_and_sends_no_identifying_headers() {
    let (target, ca, seen) = https_target_with(Behaviour::Status(204)).await;
    let prober = prober_trusting(&ca);
    let (proxies, _squid) = proxies().await;
    for (kind, proxy) in proxies {
        let url = format!("https://localhost:{}/generate_204?x=1", target.port());
        let result = prober.probe(&proxy.to_string(), &check(&url, None, 5000)).await;
        assert_eq!(result.outcome, Ok(204), "{kind}");
        assert!(result.latency > Duration::ZERO && result.latency < Duration::from_secs(5));
    }
    for head in seen.lock().unwrap().iter() {
        let mut lines = head.lines();
        assert_eq!(lines.next(), Some("GET /generate_204?x=1 HTTP/1.1"));
        let names: Vec<String> = lines
            .filter(|l| !l.is_empty())
            .map(|l| l.split(':').next().unwrap().to_ascii_lowercase())
            .collect();
        assert_eq!(
            names,
            ["host", "accept", "connection"],
            "only these headers reach the target: {head}"
        );
    }
}

#[tokio::test]
async fn later_probes_resume_the_tls_session_with_the_target_through_any_proxy() {
    let (target, ca, _, resumptions) = https_target_noting_resumptions(Behaviour::Status(204)).await;
    let prober = prober_trusting(&ca);
    let url = format!("https://localhost:{}/generate_204", target.port());
    // Every probe opens its own tunnel, through another proxy or the same.
    let (proxies, _squid) = proxies().await;
    let (first, second) = (builtin_proxy().await, builtin_proxy().await);
    for proxy in [first, second, first]
        .into_iter()
        .chain(proxies.iter().map(|(_, p)| *p))
    {
        let result = prober.probe(&proxy.to_string(), &check(&url, None, 5000)).await;
        assert_eq!(result.outcome, Ok(204), "through {proxy}");
    }
    let seen = resumptions.lock().unwrap().clone();
    assert_eq!(seen.len(), 3 + proxies.len(), "one handshake per probe");
    assert!(!seen[0], "the first probe has no session to resume");
    assert!(
        seen[1..].iter().all(|r| *r),
        "every later probe resumes: {seen:?}"
    );
    // A prober of its own (another operator) has no session: a full handshake.
    let other = prober_trusting(&ca);
    assert_eq!(
        other
            .probe(&first.to_string(), &check(&url, None, 5000))
            .await
            .outcome,
        Ok(204)
    );
    assert_eq!(resumptions.lock().unwrap().last(), Some(&false));
}

#[tokio::test]
async fn plain_http_uses_an_absolute_uri_get() {
    let (target, seen) = http_target_with(Behaviour::Status(204)).await;
    let prober = Prober::new(None).unwrap();
    let (proxies, _squid) = proxies().await;
    for (kind, proxy) in proxies {
        let result = prober
            .probe(
                &proxy.to_string(),
                &check(&format!("http://{target}/healthz"), None, 5000),
            )
            .await;
        assert_eq!(result.outcome, Ok(204), "{kind}");
    }
    let seen = seen.lock().unwrap();
    assert!(!seen.is_empty());
    for head in seen.iter() {
        assert!(head.starts_with("GET /healthz HTTP/1.1"), "{head}");
        let lower = head.to_ascii_lowercase();
        for leak in [
            "via:",
            "x-forwarded-for:",
            "traceparent:",
            "user-agent:",
            "tracestate:",
        ] {
            assert!(!lower.contains(leak), "{leak} reached the target: {head}");
        }
    }
}

#[tokio::test]
async fn wrong_status_is_reported_with_what_was_expected() {
    let (target, ca, _) = https_target_with(Behaviour::Status(500)).await;
    let prober = prober_trusting(&ca);
    let (proxies, _squid) = proxies().await;
    for (kind, proxy) in &proxies {
        let url = format!("https://localhost:{}/", target.port());
        let result = prober.probe(&proxy.to_string(), &check(&url, None, 5000)).await;
        assert_eq!(
            result.outcome,
            Err(ProbeFailure::UnexpectedStatus {
                status: 500,
                expected: "2xx".into()
            }),
            "{kind}"
        );
    }
    let (ok_target, ca, _) = https_target_with(Behaviour::Status(204)).await;
    let prober = prober_trusting(&ca);
    let url = format!("https://localhost:{}/", ok_target.port());
    let result = prober
        .probe(&proxies[0].1.to_string(), &check(&url, Some(200), 5000))
        .await;
    assert_eq!(
        result.outcome,
        Err(ProbeFailure::UnexpectedStatus {
            status: 204,
            expected: "200".into()
        })
    );
    assert_eq!(
        result.outcome.unwrap_err().to_string(),
        "unexpected status 204 (expected 200)"
    );
}

#[tokio::test]
async fn connect_refused_by_an_acl_carries_the_proxys_status() {
    let Some(squid) = Squid::start("acl SSL_ports port 443\nhttp_access deny CONNECT !SSL_ports").await
    else {
        assert!(std::env::var_os("CI").is_none(), "CI must have squid installed");
        return;
    };
    let (target, ca, _) = https_target_with(Behaviour::Status(204)).await;
    let url = format!("https://localhost:{}/", target.port());
    let result = prober_trusting(&ca)
        .probe(&squid.addr.to_string(), &check(&url, None, 5000))
        .await;
    assert_eq!(result.outcome, Err(ProbeFailure::ConnectRefused(403)));
    assert_eq!(result.outcome.unwrap_err().reason(), "connect_refused");
}

#[tokio::test]
async fn a_dead_proxy_is_refused() {
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let result = Prober::new(None)
        .unwrap()
        .probe(&dead.to_string(), &check("https://localhost:1/", None, 2000))
        .await;
    assert_eq!(result.outcome, Err(ProbeFailure::ProxyRefused));
}

#[tokio::test]
async fn a_silent_target_times_out_at_the_probe_timeout() {
    let (target, ca, _) = https_target_with(Behaviour::Silent).await;
    let prober = prober_trusting(&ca);
    let (proxies, _squid) = proxies().await;
    for (kind, proxy) in proxies {
        let url = format!("https://localhost:{}/", target.port());
        let result = prober.probe(&proxy.to_string(), &check(&url, None, 700)).await;
        assert_eq!(
            result.outcome,
            Err(ProbeFailure::Timeout {
                after: Duration::from_millis(700),
                stage: "waiting for the target's response"
            }),
            "{kind}"
        );
        assert!(result.latency >= Duration::from_millis(700) && result.latency < Duration::from_millis(1500));
    }
}

#[tokio::test]
async fn an_untrusted_target_certificate_is_a_tls_failure() {
    let (target, _ca, _) = https_target_with(Behaviour::Status(204)).await;
    let proxy = builtin_proxy().await;
    // The Mozilla roots do not include the test's self-signed CA.
    let result = Prober::new(None)
        .unwrap()
        .probe(
            &proxy.to_string(),
            &check(&format!("https://localhost:{}/", target.port()), None, 5000),
        )
        .await;
    match result.outcome {
        Err(ProbeFailure::Tls(why)) => assert!(why.contains("certificate"), "{why}"),
        other => panic!("expected a TLS failure, got {other:?}"),
    }
}

#[tokio::test]
async fn an_extra_ca_file_is_trusted() {
    let (target, ca, _) = https_target_with(Behaviour::Status(204)).await;
    let dir = tempfile::tempdir().unwrap();
    let pem = dir.path().join("ca.pem");
    let body = data_encoding::BASE64.encode(ca.as_ref());
    let lines: Vec<&str> = body
        .as_bytes()
        .chunks(64)
        .map(|c| std::str::from_utf8(c).unwrap())
        .collect();
    std::fs::write(
        &pem,
        format!(
            "-----BEGIN CERTIFICATE-----\n{}\n-----END CERTIFICATE-----\n",
            lines.join("\n")
        ),
    )
    .unwrap();
    let proxy = builtin_proxy().await;
    let prober = Prober::new(Some(&pem)).unwrap();
    let result = prober
        .probe(
            &proxy.to_string(),
            &check(&format!("https://localhost:{}/", target.port()), None, 5000),
        )
        .await;
    assert_eq!(result.outcome, Ok(204));

    std::fs::write(&pem, "not a certificate").unwrap();
    let err = Prober::new(Some(&pem)).err().unwrap().to_string();
    assert!(err.starts_with("reading extra CA file"), "{err}");
}

/// A proxy that demands credentials: a probe without them is refused (407),
/// with them it passes — over CONNECT and over an absolute-URI GET, through
/// the built-in proxy and through Squid's `basic_ncsa_auth`.
#[tokio::test]
async fn probes_present_the_proxys_credentials() {
    use egress_proxies::domain::credentials::{BasicAuthorization, ProxyCredentials};
    use std::os::unix::fs::PermissionsExt;

    let credentials = ProxyCredentials::generate(&egress_proxies::adapters::random::SystemRandom).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let builtin = listener.local_addr().unwrap();
    tokio::spawn(egress_proxies::adapters::forward_proxy::serve(
        listener,
        support::open_to_loopback(),
        Some(BasicAuthorization::of(&credentials)),
    ));
    let mut proxies = vec![("builtin", builtin)];
    // Squid's helper runs as Squid's user: the passwd file must be readable to it.
    let auth_dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(auth_dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let passwd = auth_dir.path().join("passwd");
    std::fs::write(
        &passwd,
        format!(
            "{}\n",
            egress_proxies::adapters::random::htpasswd_line(&credentials).unwrap()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&passwd, std::fs::Permissions::from_mode(0o644)).unwrap();
    let squid = Squid::start(&format!(
        "auth_param basic program /usr/lib/squid/basic_ncsa_auth {}\n\
         acl authenticated proxy_auth REQUIRED\nhttp_access deny !authenticated",
        passwd.display()
    ))
    .await;
    match &squid {
        Some(s) => proxies.push(("squid", s.addr)),
        None => assert!(std::env::var_os("CI").is_none(), "CI must have squid installed"),
    }
    let (tls, ca, _) = https_target_with(Behaviour::Status(204)).await;
    let (plain, _) = http_target_with(Behaviour::Status(204)).await;
    let prober = prober_trusting(&ca);
    let wrong = ProxyCredentials::new(&credentials.username, "wrong").unwrap();
    for (kind, proxy) in proxies {
        let proxy = proxy.to_string();
        let https = check(&format!("https://localhost:{}/", tls.port()), None, 5000);
        let http = check(&format!("http://{plain}/"), None, 5000);
        for bad in [None, Some(&wrong)] {
            let result = prober.probe_as(&proxy, bad, &https).await;
            assert_eq!(
                result.outcome,
                Err(ProbeFailure::ConnectRefused(407)),
                "{kind} CONNECT"
            );
            let result = prober.probe_as(&proxy, bad, &http).await;
            assert!(
                matches!(
                    result.outcome,
                    Err(ProbeFailure::UnexpectedStatus { status: 407, .. })
                ),
                "{kind} GET: {:?}",
                result.outcome
            );
        }
        let result = prober.probe_as(&proxy, Some(&credentials), &https).await;
        assert_eq!(result.outcome, Ok(204), "{kind} CONNECT with credentials");
        let result = prober.probe_as(&proxy, Some(&credentials), &http).await;
        assert_eq!(result.outcome, Ok(204), "{kind} GET with credentials");
    }
}

/// An External endpoint in Kubernetes mode: probes connect only to the
/// addresses the endpoint policy admits, whatever the name resolves to when
/// the probe runs (a name that later points at loopback is not followed).
#[tokio::test]
async fn a_guarded_probe_never_connects_to_a_refused_address() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use egress_proxies::domain::destinations::DestinationPolicy;
    use egress_proxies::domain::health::ProbeTarget;

    // A listener counting connections: only the guard stands before it.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let accepted = Arc::new(AtomicUsize::new(0));
    let counter = accepted.clone();
    tokio::spawn(async move {
        while listener.accept().await.is_ok() {
            counter.fetch_add(1, Ordering::SeqCst);
        }
    });
    let (target, _) = http_target_with(Behaviour::Status(204)).await;
    let prober = Prober::new(None).unwrap();
    let probe = |endpoint: String, policy: DestinationPolicy| ProbeTarget {
        uid: "u".into(),
        endpoint,
        check: check(&format!("http://{target}/"), None, 2000),
        credentials: None,
        realm: None,
        endpoint_policy: Some(Arc::new(policy)),
    };
    for endpoint in [format!("127.0.0.1:{port}"), format!("localhost:{port}")] {
        let result = prober
            .probe_target(&probe(
                endpoint.clone(),
                DestinationPolicy::external_endpoints(&[]),
            ))
            .await;
        let failure = result.outcome.unwrap_err();
        assert_eq!(failure.reason(), "endpoint_refused", "{endpoint}: {failure}");
        assert!(
            failure.to_string().contains("--allow-external-endpoint-networks"),
            "{failure}"
        );
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 0, "no connection was made");

    // Allowed: the probe goes through a real proxy as usual.
    let proxy = builtin_proxy().await;
    let allowed = DestinationPolicy::external_endpoints(&["127.0.0.0/8".parse().unwrap()]);
    let result = prober.probe_target(&probe(proxy.to_string(), allowed)).await;
    assert_eq!(result.outcome, Ok(204));
}
