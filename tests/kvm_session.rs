//! libvirt calls over the SSH link against the real daemon of the test bed
//! (`domainType: qemu`, software emulation): volumes, seed upload, a domain
//! defined, started, read back and removed.

mod support;

use egress_proxies::adapters::providers::kvm::domain_xml::{DomainSpec, domain_xml};
use egress_proxies::adapters::providers::kvm::host::HostSession;
use egress_proxies::adapters::providers::kvm::metadata::InstanceMetadata;
use egress_proxies::adapters::providers::kvm::ops::DomainRunState;
use egress_proxies::adapters::providers::kvm::seed::{SeedFiles, build_iso, meta_data, vendor_data};
use egress_proxies::adapters::providers::kvm::volume_xml::{overlay_volume_xml, plain_volume_xml};
use egress_proxies::domain::config::{DomainType, Firmware};

#[tokio::test]
async fn volumes_seed_and_a_domain_through_the_link() {
    let bed = bed_or_skip!();
    let link = support::kvm_bed::link(&bed, "EPO_KVM_HOST_A").await;
    let uri = link.libvirt_uri();
    let bridge = bed["EPO_KVM_BRIDGE"].clone();

    // A tiny qcow2 to stand in for a cloud image.
    let image_bytes = support::kvm_bed::tiny_qcow2("64M");

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
            namespace: Some("crawl".into()),
            installation: Some(support::INSTALLATION.into()),
            released: false,
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
            s.address_of(&s.domain(name).unwrap().expect("defined"), name)
                .unwrap(),
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

#[tokio::test]
async fn create_get_delete_resume_from_every_partial_state() {
    use egress_proxies::adapters::providers::kvm::host::domain_ops as ops;
    use egress_proxies::adapters::providers::kvm::ops::{
        CreatePlan, OpError, Released, overlay_name, seed_name,
    };
    use egress_proxies::domain::provider_contract::{ErrorClass, InstanceState};
    let bed = bed_or_skip!();
    let link = support::kvm_bed::link(&bed, "EPO_KVM_HOST_B").await;
    let uri = link.libvirt_uri();
    let bridge = bed["EPO_KVM_BRIDGE"].clone();
    let image_bytes = support::kvm_bed::tiny_qcow2("64M");

    tokio::task::spawn_blocking(move || {
        let s = HostSession::open(&uri, "host-b", "default").unwrap();
        let name = "proxy-opstest00000001";
        let base = "base-opstest.qcow2";
        ops::delete(&s, name).unwrap();
        s.delete_volume(base).unwrap();
        let meta = InstanceMetadata {
            managed: true,
            uid: "5a3f0c2e-0000-4000-8000-000000000002".into(),
            created_at: "2026-11-30T02:00:00Z".parse().unwrap(),
            namespace: Some("crawl".into()),
            installation: Some(support::INSTALLATION.into()),
            released: false,
        };
        let mut plan = CreatePlan {
            domain: DomainSpec {
                name: name.into(),
                domain_type: DomainType::Qemu,
                firmware: Firmware::Bios,
                vcpus: 1,
                memory_mib: 128,
                disk_path: String::new(),
                seed_path: String::new(),
                bridge,
                metadata: meta.clone(),
            },
            base_volume: base.into(),
            base_format: "qcow2".into(),
            disk_bytes: 1 << 30,
            seed_iso: build_iso(&SeedFiles {
                user_data: b"#cloud-config\n".to_vec(),
                meta_data: meta_data(name),
                vendor_data: None,
            })
            .unwrap(),
        };

        // No base yet: a Transient error (the image cache brings it).
        let err = ops::create(&s, &plan).unwrap_err();
        assert!(
            matches!(err, OpError::BaseMissing(_)) && err.class() == ErrorClass::Transient,
            "{err}"
        );
        s.create_volume(base, &plain_volume_xml(base, "raw", image_bytes.len() as u64))
            .unwrap();
        s.upload(base, &image_bytes).unwrap();

        // A pool without room is QuotaExceeded, before anything is created.
        let mut huge = plan.clone();
        huge.disk_bytes = 1 << 60;
        let err = ops::create(&s, &huge).unwrap_err();
        assert_eq!(err.class(), ErrorClass::QuotaExceeded, "{err}");
        assert_eq!(s.volume_path(&overlay_name(name)).unwrap(), None);

        // Resume points: an overlay from an earlier attempt, a stale seed —
        // and a pool without room for a new overlay: this one is there.
        let base_path = s.volume_path(base).unwrap().unwrap();
        s.create_volume(
            &overlay_name(name),
            &overlay_volume_xml(&overlay_name(name), 1 << 30, &base_path, "qcow2"),
        )
        .unwrap();
        s.create_volume(&seed_name(name), &plain_volume_xml(&seed_name(name), "raw", 4096))
            .unwrap();
        ops::create(&s, &huge).unwrap();
        let seen = ops::get(&s, name).unwrap().unwrap();
        assert_eq!(
            seen.state,
            InstanceState::Provisioning,
            "running without an address"
        );
        assert_eq!(seen.metadata, Some(meta.clone()));
        // The paths create put in the domain without asking are libvirt's.
        // What create remembered is what libvirt holds: a new session reads it.
        let fresh = HostSession::open(&uri, "host-b", "default").unwrap();
        assert_eq!(fresh.domain_state(name).unwrap().unwrap().1, Some(meta.clone()));
        let disks = s.domain_disk_paths().unwrap();
        for volume in [overlay_name(name), seed_name(name)] {
            let path = s.volume_path(&volume).unwrap().unwrap();
            assert!(disks.contains(&path), "{path} in {disks:?}");
        }
        // The mark is remembered per domain; a release is seen at once.
        assert_eq!(ops::release(&s, name).unwrap(), Released::Marked);
        assert_eq!(
            ops::get(&s, name).unwrap().unwrap().metadata,
            Some(meta.released())
        );
        assert_eq!(fresh.domain_metadata(name).unwrap(), Some(Some(meta.released())));
        let with_seed = plan.clone();
        plan.seed_iso.clear();
        ops::create(&s, &plan).unwrap(); // exists: nothing rebuilt, still fine

        ops::delete(&s, name).unwrap();
        assert_eq!(ops::get(&s, name).unwrap(), None);
        // Defined anew under the same name, it is another domain: its own mark is read.
        let mut again = with_seed.clone();
        again.domain.metadata.uid = "5a3f0c2e-0000-4000-8000-000000000003".into();
        ops::create(&s, &again).unwrap();
        assert_eq!(
            ops::get(&s, name).unwrap().unwrap().metadata,
            Some(again.domain.metadata.clone())
        );
        ops::delete(&s, name).unwrap();
        // A mark without installation (an earlier version's) is read afresh
        // every time: an admin completing it by hand is seen at the next get.
        let mut untagged = with_seed.clone();
        untagged.domain.metadata.installation = None;
        ops::create(&s, &untagged).unwrap();
        assert_eq!(
            ops::get(&s, name).unwrap().unwrap().metadata,
            Some(untagged.domain.metadata.clone())
        );
        let completed = InstanceMetadata {
            installation: Some(support::INSTALLATION.into()),
            ..untagged.domain.metadata.clone()
        };
        assert!(
            fresh.set_metadata(name, &completed).unwrap(),
            "as an admin's virsh would"
        );
        assert_eq!(ops::get(&s, name).unwrap().unwrap().metadata, Some(completed));
        ops::delete(&s, name).unwrap();
        assert_eq!(s.volume_path(&overlay_name(name)).unwrap(), None);
        assert_eq!(s.volume_path(&seed_name(name)).unwrap(), None);
        assert!(s.volume_path(base).unwrap().is_some(), "the cached base stays");
        ops::delete(&s, name).unwrap();

        // A crash between volume creation and define: delete still cleans by name.
        s.create_volume(&seed_name(name), &plain_volume_xml(&seed_name(name), "raw", 4096))
            .unwrap();
        ops::delete(&s, name).unwrap();
        assert_eq!(s.volume_path(&seed_name(name)).unwrap(), None);
        s.delete_volume(base).unwrap();
    })
    .await
    .unwrap();
    link.close().await;
}
