//! The gcp tests' shared pieces: a fresh service-account key pointing at
//! the fake's token endpoint, the provider and a request.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use egress_proxies::adapters::providers::gcp::api::AdcTokens;
use egress_proxies::adapters::providers::gcp::{GcpOptions, GcpProvider};
use egress_proxies::domain::config::GcpConfig;
use egress_proxies::domain::provider_contract::{CloudInitBytes, CreateRequest, instance_name};
use egress_proxies::domain::resource::Placement;
use fake_compute::FakeCompute;
use serde_json::json;

pub const ZONE: &str = "europe-west1-b";

/// A fresh RSA service-account key whose `token_uri` is the fake's.
pub fn key_file(dir: &Path, fake: &FakeCompute) -> PathBuf {
    let pem = dir.join("key.pem");
    let made = std::process::Command::new("openssl")
        .args([
            "genpkey",
            "-algorithm",
            "RSA",
            "-pkeyopt",
            "rsa_keygen_bits:2048",
            "-out",
        ])
        .arg(&pem)
        .output()
        .unwrap();
    assert!(
        made.status.success(),
        "openssl: {}",
        String::from_utf8_lossy(&made.stderr)
    );
    let key = json!({
        "type": "service_account",
        "project_id": "crawl-test",
        "private_key_id": "k1",
        "private_key": std::fs::read_to_string(&pem).unwrap(),
        "client_email": "proxy-operator@crawl-test.iam.gserviceaccount.com",
        "client_id": "1",
        "token_uri": fake.token_uri(),
    });
    let path = dir.join("sa.json");
    std::fs::write(&path, key.to_string()).unwrap();
    path
}

pub fn config(fake: &FakeCompute) -> GcpConfig {
    serde_json::from_value(
        json!({"project": "crawl-test", "networkTag": "egress-proxy", "apiEndpoint": fake.api_root()}),
    )
    .unwrap()
}

pub fn provider(fake: &FakeCompute, key: PathBuf, full_payloads: bool) -> GcpProvider {
    GcpProvider::new(
        "gcp-test",
        config(fake),
        Arc::new(AdcTokens::service_account_file(key)),
        &GcpOptions {
            wire_log_full_payloads: full_payloads,
        },
    )
    .unwrap()
}

pub fn request(uid: &str) -> CreateRequest {
    CreateRequest {
        name: instance_name(uid),
        uid: uid.into(),
        namespace: "crawl".into(),
        installation: "itest".parse().unwrap(),
        cloud_init: Some(CloudInitBytes(b"#cloud-config\npackages: [squid]\n".to_vec())),
        placement: Placement {
            zone: Some(ZONE.into()),
            machine_type: Some("e2-micro".into()),
            image: Some("projects/debian-cloud/global/images/family/debian-12".into()),
            region: None,
        },
        port: 3128,
        credentials: None,
        quarantined: Vec::new(),
    }
}
