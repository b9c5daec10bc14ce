//! The kvm test bed (tests/kvm-testbed.sh): its settings and links to it
//! (shared with the library's tests: [`super::kvm_bed_links`]), and what the
//! kvm provider needs to run on it.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use egress_proxies::domain::config::{
    DomainType, Firmware, ImageFormat, KvmConfig, KvmHost, KvmImage, MachineType,
};
use egress_proxies::domain::provider_contract::{CreateRequest, ErrorClass, ProviderError, instance_name};
use egress_proxies::domain::resource::Placement;
use sha2::Digest;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[allow(
    unused_imports,
    reason = "each test binary uses its own part of the shared support"
)]
pub use super::kvm_bed_links::{bed, link, target, tiny_qcow2};

/// Calls `f` until it answers anything but a Transient error (a host's link
/// coming up, an image being fetched) and returns that answer.
pub async fn past_transient<T>(
    what: &str,
    timeout: Duration,
    mut f: impl AsyncFnMut() -> Result<T, ProviderError>,
) -> Result<T, ProviderError> {
    super::eventually(what, timeout, async || match f().await {
        Err(e) if e.class == ErrorClass::Transient => Err(e),
        answer => Ok(answer),
    })
    .await
}

// The kvm provider on the bed.

/// Serves one small qcow2 image; counts the downloads. Returns its URL, the
/// counter and the base volume its content names.
pub async fn image_server() -> (String, Arc<AtomicUsize>, String) {
    image_server_of("256M").await
}

/// [`image_server`] with an image of virtual size `size`: other bytes, so a
/// base volume no other test's image shares in the bed's one pool.
pub async fn image_server_of(size: &str) -> (String, Arc<AtomicUsize>, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("i.qcow2");
    assert!(
        std::process::Command::new("qemu-img")
            .args(["create", "-q", "-f", "qcow2"])
            .arg(&path)
            .arg(size)
            .status()
            .unwrap()
            .success()
    );
    let body = Arc::new(std::fs::read(&path).unwrap());
    let base = egress_proxies::adapters::providers::kvm::base_image::base_volume(
        &hex::encode(sha2::Sha256::digest(body.as_slice())),
        ImageFormat::Qcow2,
    );
    let hits = Arc::new(AtomicUsize::new(0));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let counter = hits.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let (body, counter) = (body.clone(), counter.clone());
            tokio::spawn(async move {
                let mut buf = [0u8; 2048];
                let _ = s.read(&mut buf).await;
                counter.fetch_add(1, Ordering::SeqCst);
                let head = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                );
                let _ = s.write_all(head.as_bytes()).await;
                let _ = s.write_all(&body).await;
            });
        }
    });
    (format!("http://{addr}/debian-tiny.qcow2"), hits, base)
}

/// One of the bed's hosts (`EPO_KVM_HOST_A` or `EPO_KVM_HOST_B`) under `name`.
pub fn bed_host(bed: &HashMap<String, String>, name: &str, key: &str) -> KvmHost {
    KvmHost {
        name: name.into(),
        address: bed[key].clone(),
        user: bed["EPO_KVM_USER"].clone(),
        bridge: bed["EPO_KVM_BRIDGE"].clone(),
        socket: "/var/run/libvirt/libvirt-sock".into(),
        pool: "default".into(),
        domain_type: DomainType::Qemu,
    }
}

/// A kvm provider on hosts `a` and `b` of the bed, with image `tiny` at `url`
/// and machine type `small`.
pub fn provider_config(bed: &HashMap<String, String>, url: &str) -> KvmConfig {
    KvmConfig {
        ssh_key_file: bed["EPO_KVM_SSH_KEY"].clone().into(),
        known_hosts_file: Some(bed["EPO_KVM_KNOWN_HOSTS"].clone().into()),
        insecure_ignore_host_key: false,
        disk_size_gb: 1,
        vendor_data: None,
        install_guest_agent: true,
        images: BTreeMap::from([(
            "tiny".to_owned(),
            KvmImage {
                url: url.into(),
                sha256: None,
                format: ImageFormat::Qcow2,
                firmware: Firmware::Bios,
            },
        )]),
        allow_image_urls: false,
        max_image_size_gb: egress_proxies::domain::config::DEFAULT_MAX_IMAGE_SIZE_GB,
        machine_types: BTreeMap::from([(
            "small".to_owned(),
            MachineType {
                vcpus: 1,
                memory_mib: 128,
            },
        )]),
        hosts: vec![
            bed_host(bed, "a", "EPO_KVM_HOST_A"),
            bed_host(bed, "b", "EPO_KVM_HOST_B"),
        ],
    }
}

/// A create of a `tiny` VM of machine type `small` on host `zone`.
pub fn create_request(uid: &str, zone: &str) -> CreateRequest {
    CreateRequest {
        name: instance_name(uid),
        uid: uid.into(),
        namespace: "crawl".into(),
        installation: super::installation(),
        cloud_init: Some(egress_proxies::domain::provider_contract::CloudInitBytes(
            b"#!/bin/sh\necho proxy\n".to_vec(),
        )),
        placement: Placement {
            zone: Some(zone.into()),
            machine_type: Some("small".into()),
            image: Some("tiny".into()),
            region: None,
        },
        port: 3128,
        credentials: None,
        quarantined: Vec::new(),
    }
}

/// The volumes in the bed's `default` pool.
pub fn pool_volumes() -> Vec<String> {
    let out = std::process::Command::new("virsh")
        .args(["-c", "qemu:///system", "vol-list", "default"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // A table: header, a rule, then "name   path" rows.
    let names: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .skip(2)
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect();
    names
}

/// `virsh -c qemu:///system ARGS` on the bed.
pub fn virsh(args: &[&str]) -> std::process::Output {
    std::process::Command::new("virsh")
        .args(["-c", "qemu:///system"])
        .args(args)
        .output()
        .unwrap()
}

/// `virsh` that must succeed; its output.
pub fn virsh_ok(args: &[&str]) -> String {
    let out = virsh(args);
    assert!(
        out.status.success(),
        "virsh {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Whether a domain of that name is defined on the bed.
pub fn domain_exists(name: &str) -> bool {
    virsh(&["dominfo", name]).status.success()
}

/// Removes the named instances' domains and volumes when dropped, so a
/// failed assertion leaves nothing on the bed.
pub struct RemoveOnDrop(pub Vec<String>);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        for name in &self.0 {
            let _ = virsh(&["destroy", name]);
            let _ = virsh(&[
                "undefine",
                name,
                "--nvram",
                "--managed-save",
                "--snapshots-metadata",
                "--checkpoints-metadata",
            ]);
            for volume in [
                egress_proxies::adapters::providers::kvm::ops::overlay_name(name),
                egress_proxies::adapters::providers::kvm::ops::seed_name(name),
            ] {
                let _ = virsh(&["vol-delete", "--pool", "default", &volume]);
            }
        }
    }
}

/// The kvm provider `name` over `cfg`, its hosts driven by host actors as
/// the operator runs them.
pub fn kvm_provider(
    name: &str,
    cfg: KvmConfig,
) -> egress_proxies::adapters::providers::kvm::provider::KvmProvider {
    let runner = egress_proxies_operator::kvm::runner_factory()(name, &cfg).unwrap();
    egress_proxies::adapters::providers::kvm::provider::KvmProvider::new(name, cfg, runner)
}
