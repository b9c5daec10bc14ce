//! The local provider against real processes: Squid (when installed — CI
//! installs it) and the built-in proxy, each forwarding a CONNECT to a local
//! TLS server and an absolute-URI GET to a local HTTP server.

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use egress_proxies::adapters::providers::LocalProvider;
use egress_proxies::domain::config::{LocalConfig, LocalImplementation};
use egress_proxies::domain::credentials::ProxyCredentials;
use egress_proxies::domain::provider_contract::{CreateRequest, InstanceState, Provider, instance_name};
use egress_proxies::domain::resource::Placement;
use support::{eventually, target_server};

fn provider(state: &std::path::Path, implementation: LocalImplementation) -> LocalProvider {
    provider_with(
        state,
        LocalConfig {
            implementation,
            destinations: support::loopback_rules(),
            ..LocalConfig::default()
        },
    )
}

fn provider_with(state: &std::path::Path, config: LocalConfig) -> LocalProvider {
    LocalProvider::new(
        "local",
        config,
        state,
        env!("CARGO_BIN_EXE_egress-proxies-operator").into(),
        &[],
    )
    .unwrap()
}

fn request(uid: &str) -> CreateRequest {
    CreateRequest {
        name: instance_name(uid),
        uid: uid.to_owned(),
        namespace: "default".into(),
        installation: support::installation(),
        cloud_init: None,
        placement: Placement::default(),
        port: 3128,
        credentials: None,
        quarantined: Vec::new(),
    }
}

async fn lifecycle(implementation: LocalImplementation) {
    let state = tempfile::tempdir().unwrap();
    let _reaper = support::process::Reaper(state.path().to_owned());
    let p = provider(state.path(), implementation);
    let uid = "0b7d3c1e-1111-4222-8333-444455556666";
    let credentials = ProxyCredentials::generate(&egress_proxies::adapters::random::SystemRandom).unwrap();
    let req = CreateRequest {
        credentials: Some(credentials.clone()),
        ..request(uid)
    };

    let id = p.create(&req).await.unwrap();
    assert_eq!(p.create(&req).await.unwrap(), id, "create is keyed on the name");

    let instance = eventually(
        "the proxy to accept connections",
        Duration::from_secs(20),
        async || {
            let i = p.get(&id).await.unwrap();
            (i.state == InstanceState::Running).then_some(i)
        },
    )
    .await;
    let proxy = SocketAddr::new(instance.ip.unwrap(), instance.port.unwrap());
    assert!(proxy.ip().is_loopback());
    assert_eq!(instance.owner.uid.as_deref(), Some(uid));
    assert!(instance.created_at.is_some());

    let instances_dir = state.path().join("local/local/instances").canonicalize().unwrap();
    let dir = instances_dir.join(req.name.as_str());
    let pid = support::process::instance_pid(&dir).expect("the recorded process runs");

    let (tls, ca) = target_server::https_target().await;
    let plain = target_server::http_target().await;
    let right = credentials.basic_authorization();
    let wrong = ProxyCredentials::new(&credentials.username, "not-the-password")
        .unwrap()
        .basic_authorization();
    for (who, authorization) in [
        ("no credentials", None),
        ("a wrong password", Some(wrong.as_str())),
    ] {
        let answer = target_server::get_via_connect_as(proxy, authorization, tls.port(), &ca).await;
        assert!(
            answer.starts_with("CONNECT refused: HTTP/1.1 407"),
            "CONNECT with {who}: {answer}"
        );
        let answer = target_server::get_via_absolute_uri_as(proxy, authorization, plain).await;
        assert!(
            answer.starts_with("HTTP/1.1 407"),
            "absolute-URI GET with {who}: {answer}"
        );
    }
    let answer = target_server::get_via_connect_as(proxy, Some(&right), tls.port(), &ca).await;
    assert_eq!(
        answer, "HTTP/1.1 204 No Content",
        "CONNECT + TLS through the proxy"
    );
    let answer = target_server::get_via_absolute_uri_as(proxy, Some(&right), plain).await;
    assert!(
        answer.starts_with("HTTP/1.1 204"),
        "absolute-URI GET through the proxy: {answer}"
    );
    // The password is on no command line and in no file but the built-in
    // proxy's own (mode 0600); Squid's passwd file holds a hash.
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
    assert!(!String::from_utf8_lossy(&cmdline).contains(&credentials.password));
    for file in walk(state.path()) {
        let text = String::from_utf8_lossy(&std::fs::read(&file).unwrap_or_default()).into_owned();
        if text.contains(&credentials.password) {
            use std::os::unix::fs::PermissionsExt;
            assert_eq!(file.file_name().unwrap(), "credentials", "{}", file.display());
            let mode = std::fs::metadata(&file).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600, "{}", file.display());
        }
    }

    let listed = p.list_by_tag().await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].owner.uid.as_deref(), Some(uid));

    p.delete(&id).await.unwrap();
    p.delete(&id).await.unwrap();
    let (gone, state_of) = support::process::is_gone(pid);
    assert!(gone, "delete stops the process: {state_of}");
    assert!(!dir.exists());
    assert!(p.get(&id).await.unwrap_err().is_not_found());
    assert!(p.list_by_tag().await.unwrap().is_empty());
}

#[tokio::test]
async fn builtin_proxy_lifecycle_forwards_connect_and_absolute_uri() {
    lifecycle(LocalImplementation::Builtin).await;
}

#[tokio::test]
async fn squid_lifecycle_forwards_connect_and_absolute_uri() {
    if which_squid().is_none() {
        // CI installs squid (tests/system-packages.sh); a developer machine may not have it.
        eprintln!("squid is not installed; skipping the Squid lifecycle (CI runs it)");
        assert!(std::env::var_os("CI").is_none(), "CI must have squid installed");
        return;
    }
    let state = tempfile::tempdir().unwrap();
    assert!(matches!(
        provider(state.path(), LocalImplementation::Squid).launcher(),
        egress_proxies::adapters::providers::local::Launcher::Squid(_)
    ));
    lifecycle(LocalImplementation::Squid).await;
}

/// Every file under `dir`.
fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(walk(&path));
        } else {
            out.push(path);
        }
    }
    out
}

fn which_squid() -> Option<std::path::PathBuf> {
    ["/usr/sbin/squid", "/usr/bin/squid"]
        .iter()
        .map(std::path::PathBuf::from)
        .find(|p| p.exists())
}

#[tokio::test]
async fn a_dead_process_reads_as_stopped_and_delete_cleans_up() {
    let state = tempfile::tempdir().unwrap();
    let _reaper = support::process::Reaper(state.path().to_owned());
    let p = provider(state.path(), LocalImplementation::Builtin);
    let req = request("dead-process");
    let id = p.create(&req).await.unwrap();
    eventually("running", Duration::from_secs(10), async || {
        (p.get(&id).await.unwrap().state == InstanceState::Running).then_some(())
    })
    .await;
    let dir = state
        .path()
        .join("local/local/instances")
        .canonicalize()
        .unwrap()
        .join(req.name.as_str());
    let pid = support::process::instance_pid(&dir).unwrap();
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL).unwrap();
    let stopped = eventually("stopped", Duration::from_secs(10), async || {
        let i = p.get(&id).await.unwrap();
        (i.state == InstanceState::Stopped).then_some(i)
    })
    .await;
    assert!(
        stopped
            .reason
            .as_deref()
            .is_some_and(|r| r.starts_with("the proxy process was killed by signal 9 (SIGKILL)")),
        "the reason names the signal: {:?}",
        stopped.reason
    );
    p.delete(&id).await.unwrap();
    assert!(p.get(&id).await.unwrap_err().is_not_found());
}

#[tokio::test]
async fn foreign_provider_ids_are_permanent_errors() {
    let state = tempfile::tempdir().unwrap();
    let p = provider(state.path(), LocalImplementation::Builtin);
    for bad in ["zones/x/instances/y", "instances/../../etc", "instances/"] {
        let err = p
            .get(&egress_proxies::domain::provider_contract::ProviderId(bad.into()))
            .await
            .unwrap_err();
        assert_eq!(
            err.class,
            egress_proxies::domain::provider_contract::ErrorClass::Permanent,
            "{bad}"
        );
    }
}

/// The operator killed between spawning a proxy and recording its identity:
/// the proxy's own pid file identifies it, and delete still stops it.
#[tokio::test]
async fn a_process_never_recorded_is_found_by_its_pid_file() {
    let state = tempfile::tempdir().unwrap();
    let _reaper = support::process::Reaper(state.path().to_owned());
    let p = provider(state.path(), LocalImplementation::Builtin);
    let req = request("unrecorded-process");
    let id = p.create(&req).await.unwrap();
    let dir = state
        .path()
        .join("local/local/instances")
        .canonicalize()
        .unwrap()
        .join(req.name.as_str());
    eventually("running", Duration::from_secs(10), async || {
        (p.get(&id).await.unwrap().state == InstanceState::Running).then_some(())
    })
    .await;
    // The proxy writes its pid file once it has started; Running only says
    // the spawned process lives (on a loaded machine the file may come later).
    eventually("the proxy's pid file", Duration::from_secs(10), async || {
        dir.join("proxy.pid").exists().then_some(())
    })
    .await;
    let pid = support::process::instance_pid(&dir).unwrap();
    std::fs::remove_file(dir.join("process.json")).unwrap();

    let again = provider(state.path(), LocalImplementation::Builtin);
    assert_eq!(again.get(&id).await.unwrap().state, InstanceState::Running);
    assert_eq!(
        support::process::instance_pid(&dir),
        Some(pid),
        "the adopted process is recorded again"
    );
    again.delete(&id).await.unwrap();
    let (gone, stat) = support::process::is_gone(pid);
    assert!(gone, "delete stopped the adopted process: {stat}");
    assert!(!dir.exists());
}

/// A config Squid rejects never starts: the error is Permanent and quotes Squid.
#[tokio::test]
async fn a_config_squid_rejects_fails_with_squids_words() {
    let state = tempfile::tempdir().unwrap();
    let script = state.path().join("picky-squid");
    std::fs::write(
        &script,
        "#!/bin/sh\necho '2026/11/30 13:18:44| FATAL: Bungled squid.conf line 2: http_port 127.0.0.1:0' >&2\nexit 1\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let p = provider_with(
        state.path(),
        LocalConfig {
            implementation: LocalImplementation::Squid,
            squid_binary: Some(script),
            ..LocalConfig::default()
        },
    );
    let req = request("picky-squid");
    let err = p.create(&req).await.unwrap_err();
    assert_eq!(
        err.class,
        egress_proxies::domain::provider_contract::ErrorClass::Permanent
    );
    let text = err.to_string();
    assert!(
        text.contains("`squid -k parse` rejected the generated configuration (exited with status 1)")
            && text.contains("FATAL: Bungled squid.conf line 2"),
        "{text}"
    );
    let left: Vec<_> = std::fs::read_dir(state.path().join("local/local/instances"))
        .unwrap()
        .collect();
    assert!(
        left.is_empty(),
        "nothing is left of a create that failed: {left:?}"
    );
}

/// As root, a run directory Squid's user cannot reach fails the create
/// with a message naming the user and the directory.
#[tokio::test]
async fn a_run_directory_squids_user_cannot_reach_is_refused() {
    if !nix::unistd::geteuid().is_root() || which_squid().is_none() {
        eprintln!("needs root and Squid (CI has both); skipping");
        assert!(
            std::env::var_os("CI").is_none(),
            "CI runs this as root with Squid"
        );
        return;
    }
    let state = tempfile::tempdir().unwrap();
    let private = tempfile::tempdir().unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(private.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let p = provider_with(
        state.path(),
        LocalConfig {
            implementation: LocalImplementation::Squid,
            run_directory: Some(private.path().join("run")),
            ..LocalConfig::default()
        },
    );
    let err = p.create(&request("unreachable-run-dir")).await.unwrap_err();
    assert_eq!(
        err.class,
        egress_proxies::domain::provider_contract::ErrorClass::Permanent
    );
    let text = err.to_string();
    assert!(
        text.contains("Squid's user proxy cannot write its run directory")
            && text.contains(&private.path().display().to_string()),
        "{text}"
    );
    let left = std::fs::read_dir(private.path().join("run"))
        .map(|d| d.flatten().map(|e| e.path()).collect::<Vec<_>>())
        .unwrap_or_default();
    assert!(left.is_empty(), "the provider's run root holds nothing: {left:?}");
}

#[tokio::test]
async fn a_released_instance_keeps_running_and_is_no_longer_listed() {
    let state = tempfile::tempdir().unwrap();
    let _reaper = support::process::Reaper(state.path().to_owned());
    let p = provider(state.path(), LocalImplementation::Builtin);
    let req = request("5e7d3c1e-2222-4222-8333-444455556666");
    let id = p.create(&req).await.unwrap();
    let created = p.get(&id).await.unwrap();
    assert_eq!(
        created.owner,
        egress_proxies::domain::provider_contract::Ownership::of(&req)
    );
    let dir = state.path().join("local/local/instances").join(req.name.as_str());
    let pid = eventually("the proxy process", Duration::from_secs(20), async || {
        support::process::instance_pid(&dir)
    })
    .await;

    p.release(&id).await.unwrap();
    assert!(p.list_by_tag().await.unwrap().is_empty(), "no GC lists it");
    let released = p.get(&id).await.unwrap();
    assert!(released.owner.released);
    assert_eq!(released.owner.uid.as_deref(), Some(req.uid.as_str()));
    assert!(!support::process::is_gone(pid).0, "it keeps running");
    let record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("instance.json")).unwrap()).unwrap();
    assert_eq!(
        (record["managed"].clone(), record["released"].clone()),
        (false.into(), true.into())
    );
    p.release(&egress_proxies::domain::provider_contract::ProviderId(
        "instances/proxy-gone".into(),
    ))
    .await
    .unwrap();

    // A record an earlier version wrote (no installation, no namespace) reads as untagged.
    let mut legacy = record.clone();
    let fields = legacy.as_object_mut().unwrap();
    for field in ["installation", "namespace", "released"] {
        fields.remove(field);
    }
    fields.insert("managed".into(), true.into());
    std::fs::write(dir.join("instance.json"), serde_json::to_vec(&legacy).unwrap()).unwrap();
    let listed = p.list_by_tag().await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(
        (
            listed[0].owner.installation.clone(),
            listed[0].owner.namespace.clone(),
            listed[0].owner.released
        ),
        (None, None, false)
    );
    p.delete(&id).await.unwrap();
}

/// A loopback HTTP listener answering 204 that records the peer address of
/// every connection it accepts.
async fn peer_recorder() -> (
    SocketAddr,
    std::sync::Arc<std::sync::Mutex<Vec<std::net::IpAddr>>>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let peers = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = peers.clone();
    tokio::spawn(async move {
        while let Ok((mut s, peer)) = listener.accept().await {
            seen.lock().unwrap().push(peer.ip());
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let mut got = Vec::new();
                while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                    }
                }
                let _ = s
                    .write_all(b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                    .await;
            });
        }
    });
    (addr, peers)
}

/// The outgoing address an instance's record names.
fn recorded_outgoing(state: &std::path::Path, name: &str) -> Option<std::net::IpAddr> {
    let dir = state.join("local/local/instances").join(name);
    let record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("instance.json")).unwrap()).unwrap();
    record["outgoingAddress"].as_str().map(|a| a.parse().unwrap())
}

/// Two instances of a provider with `outgoingAddresses: [<network>/30]`
/// (two addresses): each fetch through a proxy arrives at the target from
/// that proxy's own address; a third instance finds none left until one
/// is deleted.
async fn outgoing_addresses(implementation: LocalImplementation, network: &str) {
    let state = tempfile::tempdir().unwrap();
    let _reaper = support::process::Reaper(state.path().to_owned());
    let p = provider_with(
        state.path(),
        LocalConfig {
            implementation,
            destinations: support::loopback_rules(),
            outgoing_addresses: vec![network.parse().unwrap()],
            ..LocalConfig::default()
        },
    );
    let expected: Vec<std::net::IpAddr> = network
        .parse::<egress_proxies::domain::config::OutgoingNetwork>()
        .unwrap()
        .addresses()
        .collect();
    let (target, peers) = peer_recorder().await;
    let credentials = ProxyCredentials::generate(&egress_proxies::adapters::random::SystemRandom).unwrap();
    let authorization = credentials.basic_authorization();
    let mut ids = Vec::new();
    for (i, uid) in [
        "0b7d3c1e-aaaa-4222-8333-444455556666",
        "0b7d3c1e-bbbb-4222-8333-444455556666",
    ]
    .into_iter()
    .enumerate()
    {
        let req = CreateRequest {
            credentials: Some(credentials.clone()),
            ..request(uid)
        };
        let id = p.create(&req).await.unwrap();
        let instance = eventually(
            "the proxy to accept connections",
            Duration::from_secs(20),
            async || {
                let i = p.get(&id).await.unwrap();
                (i.state == InstanceState::Running).then_some(i)
            },
        )
        .await;
        let from = recorded_outgoing(state.path(), req.name.as_str());
        assert_eq!(
            from,
            Some(expected[i]),
            "instance {i} holds the next free address"
        );
        let proxy = SocketAddr::new(instance.ip.unwrap(), instance.port.unwrap());
        let answer = target_server::get_via_absolute_uri_as(proxy, Some(&authorization), target).await;
        assert!(answer.starts_with("HTTP/1.1 204"), "through {proxy}: {answer}");
        assert_eq!(
            peers.lock().unwrap().last().copied(),
            Some(expected[i]),
            "the target sees the proxy's outgoing address"
        );
        ids.push(id);
    }
    let third = request("0b7d3c1e-cccc-4222-8333-444455556666");
    let err = p.create(&third).await.unwrap_err();
    assert_eq!(
        err.class,
        egress_proxies::domain::provider_contract::ErrorClass::QuotaExceeded,
        "{err}"
    );
    assert!(
        err.to_string()
            .contains("every address of outgoingAddresses is held"),
        "{err}"
    );
    assert!(
        !state
            .path()
            .join("local/local/instances")
            .join(third.name.as_str())
            .exists(),
        "a refused create leaves nothing behind"
    );
    p.delete(&ids[0]).await.unwrap();
    let id = p.create(&third).await.unwrap();
    assert_eq!(
        recorded_outgoing(state.path(), third.name.as_str()),
        Some(expected[0]),
        "a deleted instance's address is free again"
    );
    for id in [id, ids[1].clone()] {
        p.delete(&id).await.unwrap();
    }
}

#[tokio::test]
async fn builtin_proxies_connect_from_their_own_outgoing_address() {
    outgoing_addresses(LocalImplementation::Builtin, "127.0.3.0/30").await;
}

#[tokio::test]
async fn squid_proxies_connect_from_their_own_outgoing_address() {
    if which_squid().is_none() {
        eprintln!("squid is not installed; skipping (CI runs it)");
        assert!(std::env::var_os("CI").is_none(), "CI must have squid installed");
        return;
    }
    outgoing_addresses(LocalImplementation::Squid, "127.0.4.0/30").await;
}

#[tokio::test]
async fn an_outgoing_address_this_machine_lacks_fails_the_create_in_words() {
    let state = tempfile::tempdir().unwrap();
    let _reaper = support::process::Reaper(state.path().to_owned());
    let p = provider_with(
        state.path(),
        LocalConfig {
            implementation: LocalImplementation::Builtin,
            // TEST-NET-3: assigned to no machine.
            outgoing_addresses: vec!["203.0.113.9".parse().unwrap()],
            ..LocalConfig::default()
        },
    );
    let err = p.create(&request("no-such-address")).await.unwrap_err();
    assert_eq!(
        err.class,
        egress_proxies::domain::provider_contract::ErrorClass::Permanent,
        "{err}"
    );
    assert!(
        err.to_string()
            .contains("outgoing address 203.0.113.9 cannot be bound"),
        "{err}"
    );
}
