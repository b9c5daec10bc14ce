//! The kvm test bed (tests/kvm-testbed.sh): its settings and live links to
//! its hosts. The library's tests use it as `support::kvm_bed`; the
//! operator's tests include this same file (`support::kvm_bed_links` in
//! `actors/tests/support/`), and their `support::kvm_bed` re-exports it
//! beside what needs the host actors.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use egress_proxies::adapters::providers::kvm::host::{LinkTarget, SshLink};
use egress_proxies::adapters::providers::kvm::libvirt::ensure_client_setup;
use egress_proxies::adapters::providers::kvm::ssh_key::load_private_key;

/// The bed's settings, when it is set up.
pub fn bed() -> Option<HashMap<String, String>> {
    let text = std::fs::read_to_string("/run/epo-kvm-testbed/env").ok()?;
    Some(
        text.lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect(),
    )
}

/// The bed, or a skip that says why (never in CI, where the bed must exist).
#[macro_export]
macro_rules! bed_or_skip {
    () => {
        match support::kvm_bed::bed() {
            Some(b) => b,
            None => {
                assert!(
                    std::env::var_os("CI").is_none(),
                    "CI must set up the kvm test bed (tests/kvm-testbed.sh up)"
                );
                eprintln!("SKIPPED: no kvm test bed (run `sudo tests/kvm-testbed.sh up`)");
                return;
            }
        }
    };
}

/// How to reach host `EPO_KVM_HOST_A` or `EPO_KVM_HOST_B`.
pub fn target(bed: &HashMap<String, String>, host: &str) -> LinkTarget {
    LinkTarget {
        address: bed[host].clone(),
        user: bed["EPO_KVM_USER"].clone(),
        remote_socket: "/var/run/libvirt/libvirt-sock".into(),
        known_hosts: Some(bed["EPO_KVM_KNOWN_HOSTS"].clone().into()),
    }
}

/// A live link to one of the bed's hosts.
pub async fn link(bed: &HashMap<String, String>, host: &str) -> SshLink {
    ensure_client_setup();
    let key = Arc::new(load_private_key(bed["EPO_KVM_SSH_KEY"].as_ref()).unwrap());
    SshLink::dial(&target(bed, host), key, Duration::from_secs(10))
        .await
        .unwrap()
}

/// The bytes of an empty qcow2 image of `size` (e.g. "64M"), made by qemu-img.
pub fn tiny_qcow2(size: &str) -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("image.qcow2");
    let made = std::process::Command::new("qemu-img")
        .args(["create", "-q", "-f", "qcow2"])
        .arg(&path)
        .arg(size)
        .status();
    assert!(made.unwrap().success(), "qemu-img create");
    std::fs::read(&path).unwrap()
}
