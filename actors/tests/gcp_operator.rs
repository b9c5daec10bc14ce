//! A `gcp` Proxy through its whole lifecycle in the operator binary
//! (standalone mode) against the fake Compute API: Application Default
//! Credentials from `GOOGLE_APPLICATION_CREDENTIALS` (a key whose token URI
//! is the fake's), create → Provisioning → Running with the VM's external IP
//! (the fake hands out 127.0.0.1, where a real forward proxy listens) →
//! probed → Ready; deleting the manifest deletes the VM and releases the
//! Proxy. A second Proxy with skip-cleanup leaves its VM running, labelled
//! released. Traffic stays on loopback.

use std::process::Command;
use std::time::{Duration, Instant};

use egress_proxies::installation::InstallationId;
use egress_proxies::resource::Phase;
use egress_proxies::store::embedded::read_snapshot;
use fake_compute::FakeCompute;
use serde_json::json;

mod support;

use support::process::{Killed, forward_proxy, free_port, health_target};

const BIN: &str = env!("CARGO_BIN_EXE_egress-proxies-operator");

#[test]
fn a_gcp_proxy_lives_and_dies_against_the_fake_compute_api() {
    let fake = FakeCompute::start("crawl-test").unwrap();
    fake.state().step = Duration::from_millis(300);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();

    let key = support::gcp::key_file(root, &fake);

    // What the VM would run: a forward proxy on the address the fake reports.
    let port = free_port();
    let _vm_proxy = forward_proxy(BIN, port, root);

    std::fs::create_dir(root.join("proxies")).unwrap();
    std::fs::write(
        root.join("providers.yaml"),
        format!(
            "providers:\n  - name: gcp-test\n    type: gcp\n    gcp:\n      project: crawl-test\n      networkTag: egress-proxy\n      apiEndpoint: \"{}\"\n",
            fake.api_root()
        ),
    )
    .unwrap();
    let discovery = std::net::SocketAddr::from(([127, 0, 0, 1], free_port()));
    std::fs::write(
        root.join("standalone.yaml"),
        format!(
            "providersConfig: providers.yaml\nmanifests: proxies\nstateDir: state\n\
             healthProbeBindAddress: \"0\"\ndiscoveryBindAddress: \"{discovery}\"\nmanifestPollInterval: 100ms\n"
        ),
    )
    .unwrap();
    let log = std::fs::File::create(root.join("operator.log")).unwrap();
    let _operator = Killed(
        Command::new(BIN)
            .args(["standalone", "--config"])
            .arg(root.join("standalone.yaml"))
            .args(["--log-format", "text", "--log-level", "info"])
            .env("GOOGLE_APPLICATION_CREDENTIALS", &key)
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap(),
    );

    let manifest = root.join("proxies/gcp-1.yaml");
    let manifest_text = format!(
        "apiVersion: crawl.example.com/v1alpha1\nkind: Proxy\nmetadata: {{name: gcp-1, namespace: crawl}}\n\
             spec:\n  mode: Managed\n  provider: gcp-test\n  port: {port}\n\
             \x20 placement: {{zone: europe-west1-b, machineType: e2-micro, image: projects/debian-cloud/global/images/family/debian-12}}\n\
             \x20 cloudInit: {{inline: \"#cloud-config\\npackages: [squid]\\n# {{{{ proxy_htpasswd }}}}\\n\"}}\n\
             \x20 healthCheck: {{url: \"{}\", interval: 1s}}\n",
        health_target()
    );
    std::fs::write(&manifest, &manifest_text).unwrap();

    let state = root.join("state");
    let status = || {
        read_snapshot(&state)
            .ok()?
            .into_iter()
            .find(|p| p.metadata.name.as_deref() == Some("gcp-1"))
            .map(|p| p.status.unwrap_or_default())
    };
    let log_tail = || std::fs::read_to_string(root.join("operator.log")).unwrap_or_default();
    let started = Instant::now();
    let mut phases = Vec::new();
    let ready = loop {
        if let Some(s) = status()
            && let Some(phase) = s.phase
        {
            if phases.last() != Some(&phase) {
                phases.push(phase);
            }
            if phase == Phase::Ready {
                break s;
            }
            assert_ne!(phase, Phase::Failed, "{s:?}\n{}", log_tail());
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "not Ready: {phases:?}\n{}",
            log_tail()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(phases.contains(&Phase::Running), "{phases:?}");
    assert_eq!(ready.ip.as_deref(), Some("127.0.0.1"), "the VM's external IP");
    let provider_id = ready.provider_id.unwrap();
    let name = provider_id.rsplit('/').next().unwrap().to_owned();
    assert_eq!(provider_id, format!("zones/europe-west1-b/instances/{name}"));
    // The lease hands out the credentials the VM's cloud-init received as a hash.
    let lease = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(support::http::request(
            discovery,
            "POST",
            "/v1/leases",
            &[],
            Some(r#"{"target":"127.0.0.1"}"#),
        ));
    assert_eq!(lease.0, 201, "{}", lease.1);
    let lease: serde_json::Value = serde_json::from_str(&lease.1).unwrap();
    let (username, password) = (
        lease["proxy"]["username"].as_str().unwrap(),
        lease["proxy"]["password"].as_str().unwrap(),
    );
    {
        let fake_state = fake.state();
        let inserted = &fake_state.inserted[0];
        let user_data = inserted["metadata"]["items"][0]["value"].as_str().unwrap();
        assert!(
            user_data.starts_with(&format!(
                "#cloud-config\npackages: [squid]\n# {username}:$6$rounds=5000$"
            )),
            "the placeholder became the passwd line: {user_data}"
        );
        assert!(
            !user_data.contains(password),
            "the user-data carries the hash, not the password"
        );
        assert_eq!(inserted["tags"]["items"][0], "egress-proxy");
        let labels = &inserted["labels"];
        assert_eq!(
            (
                &labels["egress-proxies-managed"],
                &labels["egress-proxies-namespace"]
            ),
            (&json!("true"), &json!("crawl")),
            "{labels}"
        );
        let installation = labels["egress-proxies-installation"].as_str().unwrap_or_default();
        assert!(
            InstallationId::parse(installation).is_ok(),
            "the operator's installation id: {labels}"
        );
        assert!(
            fake_state.issued.len() == 1,
            "one token, cached: {:?}",
            fake_state.issued.len()
        );
    }

    std::fs::remove_file(&manifest).unwrap();
    let started = Instant::now();
    while status().is_some() {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "not released\n{}",
            log_tail()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(fake.state().instances().is_empty(), "the VM is gone");

    // skip-cleanup: deleting the Proxy leaves its VM running, released.
    let kept = root.join("proxies/gcp-2.yaml");
    std::fs::write(
        &kept,
        manifest_text.replace(
            "{name: gcp-1, namespace: crawl}",
            "{name: gcp-2, namespace: crawl, annotations: {crawl.example.com/skip-cleanup: \"true\"}}",
        ),
    )
    .unwrap();
    let started = Instant::now();
    let kept_name = loop {
        let found = read_snapshot(&state).ok().and_then(|proxies| {
            let p = proxies
                .into_iter()
                .find(|p| p.metadata.name.as_deref() == Some("gcp-2"))?;
            p.status?.provider_id
        });
        if let Some(id) = found {
            break id.rsplit('/').next().unwrap().to_owned();
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "gcp-2 got no VM\n{}",
            log_tail()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    std::fs::remove_file(&kept).unwrap();
    let started = Instant::now();
    while read_snapshot(&state)
        .ok()
        .is_some_and(|ps| ps.iter().any(|p| p.metadata.name.as_deref() == Some("gcp-2")))
    {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "gcp-2 not deleted\n{}",
            log_tail()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let labels = fake.state().labels("europe-west1-b", &kept_name);
    let labels = labels.unwrap_or_else(|| panic!("the VM was deleted despite skip-cleanup\n{}", log_tail()));
    assert_eq!(labels["egress-proxies-released"], "true", "{labels}");
    assert!(labels.get("egress-proxies-managed").is_none(), "{labels}");
    let log = log_tail();
    assert!(!log.contains("packages: [squid]"), "cloud-init never in the log");
    assert!(!log.contains(password), "the password never in the log");
}
