//! libvirt calls over the SSH link against the real daemon of the test bed
//! (`domainType: qemu`, software emulation): volumes, seed upload, a domain
//! defined, started, read back and removed.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use egress_proxies::config::{DomainType, Firmware};
use egress_proxies::kvm::domain_xml::{DomainSpec, domain_xml};
use egress_proxies::kvm::libvirt::ensure_client_setup;
use egress_proxies::kvm::metadata::InstanceMetadata;
use egress_proxies::kvm::seed::{SeedFiles, build_iso, meta_data, vendor_data};
use egress_proxies::kvm::session::{DomainRunState, HostSession};
use egress_proxies::kvm::ssh_key::load_private_key;
use egress_proxies::kvm::ssh_link::{LinkTarget, SshLink};
use egress_proxies::kvm::volume_xml::{overlay_volume_xml, plain_volume_xml};

fn bed() -> Option<HashMap<String, String>> {
    let text = std::fs::read_to_string("/run/epo-kvm-testbed/env").ok()?;
    Some(
        text.lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect(),
    )
}

#[tokio::test]
async fn volumes_seed_and_a_domain_through_the_link() {
    let Some(bed) = bed() else {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must set up the kvm test bed (tests/kvm-testbed.sh up)"
        );
        eprintln!("SKIPPED: no kvm test bed (run `sudo tests/kvm-testbed.sh up`)");
        return;
    };
    ensure_client_setup();
    let key = Arc::new(load_private_key(bed["EPO_KVM_SSH_KEY"].as_ref()).unwrap());
    let target = LinkTarget {
        address: bed["EPO_KVM_HOST_A"].clone(),
        user: bed["EPO_KVM_USER"].clone(),
        remote_socket: "/var/run/libvirt/libvirt-sock".into(),
        known_hosts: Some(bed["EPO_KVM_KNOWN_HOSTS"].clone().into()),
    };
    let link = SshLink::dial(&target, key, Duration::from_secs(10))
        .await
        .unwrap();
    let uri = link.libvirt_uri();
    let bridge = bed["EPO_KVM_BRIDGE"].clone();

    // A tiny qcow2 to stand in for a cloud image.
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("base.qcow2");
    assert!(
        std::process::Command::new("qemu-img")
            .args(["create", "-q", "-f", "qcow2"])
            .arg(&image)
            .arg("64M")
            .status()
            .unwrap()
            .success()
    );
    let image_bytes = std::fs::read(&image).unwrap();

    tokio::task::spawn_blocking(move || {
        let s = HostSession::open(&uri, "host-a", "default").unwrap();
        let name = "proxy-sessiontest0001";
        let (base, overlay, seed) = (
            "base-sessiontest.qcow2",
            format!("{name}.qcow2"),
            format!("{name}-seed.iso"),
        );
        // Leftovers of an interrupted earlier run.
        s.remove_domain(name).unwrap();
        for v in [base, overlay.as_str(), seed.as_str()] {
            s.delete_volume(v).unwrap();
        }
        assert!(s.pool_available_bytes().unwrap() > 0);

        let base_path = s
            .create_volume(base, &plain_volume_xml(base, "raw", image_bytes.len() as u64))
            .unwrap();
        s.upload(base, &image_bytes).unwrap();
        let disk_path = s
            .create_volume(
                &overlay,
                &overlay_volume_xml(&overlay, 1 << 30, &base_path, "qcow2"),
            )
            .unwrap();
        assert_eq!(
            s.create_volume(&overlay, "<volume/>").unwrap(),
            disk_path,
            "an existing volume is reused"
        );
        let iso = build_iso(&SeedFiles {
            user_data: b"#!/bin/sh\necho hello\n".to_vec(),
            meta_data: meta_data(name),
            vendor_data: vendor_data(true, None),
        })
        .unwrap();
        let seed_path = s
            .create_volume(&seed, &plain_volume_xml(&seed, "raw", iso.len() as u64))
            .unwrap();
        s.upload(&seed, &iso).unwrap();

        let meta = InstanceMetadata {
            managed: true,
            uid: "5a3f0c2e-0000-4000-8000-000000000001".into(),
            created_at: "2026-11-30T01:00:00Z".parse().unwrap(),
        };
        let xml = domain_xml(&DomainSpec {
            name: name.into(),
            domain_type: DomainType::Qemu,
            firmware: Firmware::Uefi,
            vcpus: 1,
            memory_mib: 256,
            disk_path,
            seed_path,
            bridge,
            metadata: meta.clone(),
        });
        s.define_and_start(name, &xml).unwrap();
        s.define_and_start(name, &xml).unwrap();
        let (state, read_back) = s.domain_state(name).unwrap().unwrap();
        assert_eq!(state, DomainRunState::Running);
        assert_eq!(
            read_back,
            Some(meta.clone()),
            "UID and creation time round-trip through the metadata"
        );
        assert_eq!(
            s.domain_address(name).unwrap(),
            None,
            "nothing booted: no address yet, and no error"
        );
        let managed = s.managed_domains().unwrap();
        assert!(managed.iter().any(|(n, _, m)| n == name && *m == meta));

        s.remove_domain(name).unwrap();
        assert_eq!(s.domain_state(name).unwrap(), None);
        s.remove_domain(name).unwrap();
        for v in [overlay.as_str(), seed.as_str(), base] {
            s.delete_volume(v).unwrap();
            assert_eq!(s.volume_path(v).unwrap(), None);
            s.delete_volume(v).unwrap();
        }
    })
    .await
    .unwrap();
    link.close().await;
}
