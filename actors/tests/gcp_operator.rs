//! A `gcp` Proxy through its whole lifecycle in the operator binary
//! (standalone mode) against the fake Compute API: Application Default
//! Credentials from `GOOGLE_APPLICATION_CREDENTIALS` (a key whose token URI
//! is the fake's), create → Provisioning → Running with the VM's external IP
//! (the fake hands out 127.0.0.1, where a real forward proxy listens) →
//! probed → Ready; deleting the manifest deletes the VM and releases the
//! Proxy. A second Proxy with skip-cleanup leaves its VM running, labelled
//! released. Traffic stays on loopback.

use std::time::Duration;

use egress_proxies::domain::installation::InstallationId;
use egress_proxies::domain::resource::Phase;
use fake_compute::FakeCompute;
use serde_json::json;

mod support;

use support::operator::{BIN, OperatorDir};
use support::process::{forward_proxy, free_port, health_target};

const WAIT: Duration = Duration::from_secs(30);

#[tokio::test]
async fn a_gcp_proxy_lives_and_dies_against_the_fake_compute_api() {
    let fake = FakeCompute::start("crawl-test").unwrap();
    fake.state().step = Duration::from_millis(300);
    let dir = OperatorDir::new(&format!(
        "providers:\n  - name: gcp-test\n    type: gcp\n    gcp:\n      project: crawl-test\n      networkTag: egress-proxy\n      apiEndpoint: \"{}\"\n",
        fake.api_root()
    ));
    let key = support::gcp::key_file(dir.path(), &fake);

    // What the VM would run: a forward proxy on the address the fake reports.
    let port = free_port();
    let _vm_proxy = forward_proxy(BIN, port, dir.path());

    let operator = dir
        .standalone()
        .discovery()
        .log_level("info")
        .env("GOOGLE_APPLICATION_CREDENTIALS", &key)
        .start()
        .await;
    let discovery = operator.discovery();

    let manifest_text = format!(
        "apiVersion: crawl.example.com/v1alpha1\nkind: Proxy\nmetadata: {{name: gcp-1, namespace: crawl}}\n\
             spec:\n  mode: Managed\n  provider: gcp-test\n  port: {port}\n\
             \x20 placement: {{zone: europe-west1-b, machineType: e2-micro, image: projects/debian-cloud/global/images/family/debian-12}}\n\
             \x20 cloudInit: {{inline: \"#cloud-config\\npackages: [squid]\\n# {{{{ proxy_htpasswd }}}}\\n# realm {{{{ proxy_realm }}}}\\n\"}}\n\
             \x20 healthCheck: {{url: \"{}\", interval: 1s}}\n",
        health_target()
    );
    dir.write_manifest("gcp-1", &manifest_text);

    let status = || dir.proxy("gcp-1").map(|p| p.status.unwrap_or_default());
    let mut phases = Vec::new();
    let ready = operator
        .eventually("gcp-1 Ready", WAIT, async || {
            let s = status().ok_or_else(|| "not stored".to_owned())?;
            let phase = s.phase.ok_or_else(|| "no phase".to_owned())?;
            if phases.last() != Some(&phase) {
                phases.push(phase);
            }
            assert_ne!(phase, Phase::Failed, "{s:?}\n{}", operator.logs());
            if phase == Phase::Ready {
                Ok(s)
            } else {
                Err(format!("{phases:?}"))
            }
        })
        .await;
    assert!(phases.contains(&Phase::Running), "{phases:?}");
    assert_eq!(ready.ip.as_deref(), Some("127.0.0.1"), "the VM's external IP");
    let provider_id = ready.provider_id.unwrap();
    let name = provider_id.rsplit('/').next().unwrap().to_owned();
    assert_eq!(provider_id, format!("zones/europe-west1-b/instances/{name}"));
    // The lease hands out the credentials the VM's cloud-init received as a hash.
    let lease = support::http::request(
        discovery,
        "POST",
        "/v1/leases",
        &[],
        Some(r#"{"target":"127.0.0.1"}"#),
    )
    .await;
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
        // The realm placeholder became the proxy's own realm.
        let realm = egress_proxies::domain::credentials::ProxyCredentials::new(username, password)
            .unwrap()
            .realm();
        assert!(
            user_data.ends_with(&format!("\n# realm {realm}\n")),
            "the placeholder became the realm: {user_data}"
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
    // The lease book holds that realm for the gateway (the dashboard's row).
    let realm = egress_proxies::domain::credentials::ProxyCredentials::new(username, password)
        .unwrap()
        .realm();
    let (code, dashboard) = support::http::request(discovery, "GET", "/v1/dashboard", &[], None).await;
    assert_eq!(code, 200, "{dashboard}");
    let dashboard: serde_json::Value = serde_json::from_str(&dashboard).unwrap();
    assert_eq!(dashboard["proxies"][0]["realm"], json!(realm), "{dashboard}");

    dir.remove_manifest("gcp-1");
    operator
        .eventually("gcp-1 released", WAIT, async || status().is_none().then_some(()))
        .await;
    assert!(fake.state().instances().is_empty(), "the VM is gone");

    // skip-cleanup: deleting the Proxy leaves its VM running, released.
    dir.write_manifest(
        "gcp-2",
        &manifest_text.replace(
            "{name: gcp-1, namespace: crawl}",
            "{name: gcp-2, namespace: crawl, annotations: {crawl.example.com/skip-cleanup: \"true\"}}",
        ),
    );
    let kept_name = operator
        .eventually("gcp-2 to get a VM", WAIT, async || {
            let id = dir.proxy("gcp-2")?.status?.provider_id?;
            Some(id.rsplit('/').next().unwrap().to_owned())
        })
        .await;
    dir.remove_manifest("gcp-2");
    operator
        .eventually("gcp-2 deleted", WAIT, async || {
            dir.proxy("gcp-2").is_none().then_some(())
        })
        .await;
    let labels = fake.state().labels("europe-west1-b", &kept_name);
    let labels =
        labels.unwrap_or_else(|| panic!("the VM was deleted despite skip-cleanup\n{}", operator.logs()));
    assert_eq!(labels["egress-proxies-released"], "true", "{labels}");
    assert!(labels.get("egress-proxies-managed").is_none(), "{labels}");
    let log = operator.logs();
    assert!(!log.contains("packages: [squid]"), "cloud-init never in the log");
    assert!(!log.contains(password), "the password never in the log");
}
