//! The kvm provider's pool sweep against the real daemon: an overlay and a
//! seed whose domain never came (or went) are reaped after the grace period,
//! then the base they kept alive; bases in use (an overlay of a defined
//! domain, a configured image), pins of configured URLs and the bases they
//! name, and volumes that are not the operator's are never touched; a URL
//! base no pin names (a crash before its pin was written) is reaped. Nor is any volume some domain on
//! the host uses as a disk, whoever made it and whatever its name: a base an
//! admin's VM boots from directly, an overlay and seed whose domain was renamed. Its own test binary: it sweeps the
//! whole shared pool, so it must not run beside the other kvm tests.

mod support;

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use egress_proxies::adapters::providers::kvm::base_image::{
    Pinned, base_volume, marker_name, pin_content, pin_name, url_base_volume,
};
use egress_proxies::adapters::providers::kvm::host::HostSession;
use egress_proxies::adapters::providers::kvm::provider::KvmProvider;
use egress_proxies::adapters::providers::kvm::volume_xml::{overlay_volume_xml, plain_volume_xml};
use egress_proxies::domain::config::{
    DomainType, Firmware, ImageFormat, KvmConfig, KvmHost, KvmImage, MachineType,
};
use egress_proxies::domain::provider_contract::{Provider, instance_name};
use egress_proxies_operator::kvm::runner_factory;

fn config(bed: &HashMap<String, String>, configured_digest: &str, latest_url: &str) -> KvmConfig {
    KvmConfig {
        ssh_key_file: bed["EPO_KVM_SSH_KEY"].clone().into(),
        known_hosts_file: Some(bed["EPO_KVM_KNOWN_HOSTS"].clone().into()),
        insecure_ignore_host_key: false,
        disk_size_gb: 1,
        vendor_data: None,
        install_guest_agent: true,
        images: BTreeMap::from([
            (
                "pinned".to_owned(),
                KvmImage {
                    url: "http://127.0.0.1:9/never-fetched.img".into(),
                    sha256: Some(configured_digest.to_owned()),
                    format: ImageFormat::Raw,
                    firmware: Firmware::Bios,
                },
            ),
            (
                "latest".to_owned(),
                KvmImage {
                    url: latest_url.to_owned(),
                    sha256: None,
                    format: ImageFormat::Raw,
                    firmware: Firmware::Bios,
                },
            ),
        ]),
        allow_image_urls: false,
        max_image_size_gb: egress_proxies::domain::config::DEFAULT_MAX_IMAGE_SIZE_GB,
        machine_types: BTreeMap::from([(
            "small".to_owned(),
            MachineType {
                vcpus: 1,
                memory_mib: 128,
            },
        )]),
        hosts: vec![KvmHost {
            name: "a".into(),
            address: bed["EPO_KVM_HOST_A"].clone(),
            user: bed["EPO_KVM_USER"].clone(),
            bridge: bed["EPO_KVM_BRIDGE"].clone(),
            socket: "/var/run/libvirt/libvirt-sock".into(),
            pool: "default".into(),
            domain_type: DomainType::Qemu,
        }],
    }
}

/// A random-looking digest unique to this run (names only; content is irrelevant here).
fn run_digest(tag: u8) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    hex::encode(<sha2::Sha256 as sha2::Digest>::digest(format!("{nanos}-{tag}")))
}

/// A domain defined (not started) with `disks` as its disks, as an admin might make one.
fn define_with_disks(name: &str, disks: &[String]) {
    let devices: String = disks
        .iter()
        .enumerate()
        .map(|(i, path)| {
            format!(
                "<disk type='file' device='disk'><driver name='qemu' type='raw'/><source file='{path}'/>\
                 <target dev='vd{}' bus='virtio'/></disk>",
                char::from(b'a' + i as u8)
            )
        })
        .collect();
    let xml = format!(
        "<domain type='qemu'><name>{name}</name><memory unit='MiB'>64</memory><vcpu>1</vcpu>\
         <os><type arch='x86_64' machine='q35'>hvm</type></os><devices>{devices}</devices></domain>"
    );
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), xml).unwrap();
    let out = std::process::Command::new("virsh")
        .args(["-c", "qemu:///system", "define"])
        .arg(file.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

fn minimal_domain(name: &str) -> String {
    format!(
        "<domain type='qemu'><name>{name}</name><memory unit='MiB'>64</memory><vcpu>1</vcpu>\
         <os><type arch='x86_64' machine='q35'>hvm</type></os></domain>"
    )
}

#[actix_rt::test]
async fn leftovers_are_reaped_after_the_grace_period_and_nothing_in_use_is() {
    let bed = bed_or_skip!();
    let link = support::kvm_bed::link(&bed, "EPO_KVM_HOST_A").await;
    let uri = link.libvirt_uri();

    let orphan = instance_name(&run_digest(1)).to_string();
    let live = instance_name(&run_digest(2)).to_string();
    let freed_base = base_volume(&run_digest(3), ImageFormat::Qcow2);
    let live_base = base_volume(&run_digest(4), ImageFormat::Qcow2);
    let configured_digest = run_digest(5);
    let configured_base = base_volume(&configured_digest, ImageFormat::Raw);
    let foreign = [
        format!("users-disk-{}.qcow2", &run_digest(6)[..8]),
        "base-debian-13.qcow2".to_owned(),
    ];
    // Used by domains that are not named after them: an admin's VM booting
    // a base directly, and an instance whose domain was renamed.
    let direct_base = base_volume(&run_digest(7), ImageFormat::Qcow2);
    let renamed = instance_name(&run_digest(8)).to_string();
    let admins_vm = format!("users-vm-{}", &run_digest(9)[..8]);
    let renamed_vm = format!("adopted-{}", &run_digest(10)[..8]);
    let image = support::kvm_bed::tiny_qcow2("64M");
    // A configured URL without a digest: the base its pin names stays; one
    // more base of that URL, never pinned (a fetch cut short), goes.
    let latest_url = format!("http://127.0.0.1:9/latest-{}.img", &run_digest(11)[..8]);
    let pinned = Pinned {
        digest: run_digest(12),
        format: ImageFormat::Raw,
        volume: url_base_volume(&latest_url, ImageFormat::Raw),
    };
    let unpinned = url_base_volume(&latest_url, ImageFormat::Raw);
    let url_volumes = (pinned.clone(), unpinned.clone(), pin_name(&latest_url));

    let names = (
        orphan.clone(),
        live.clone(),
        freed_base.clone(),
        live_base.clone(),
        configured_base.clone(),
        foreign.clone(),
        (
            direct_base.clone(),
            renamed.clone(),
            admins_vm.clone(),
            renamed_vm.clone(),
        ),
    );
    let setup_uri = uri.clone();
    tokio::task::spawn_blocking(move || {
        let (orphan, live, freed_base, live_base, configured_base, foreign, by_disk) = names;
        let (direct_base, renamed, admins_vm, renamed_vm) = by_disk;
        let s = HostSession::open(&setup_uri, "a", "default").unwrap();
        let put = |name: &str, bytes: &[u8]| {
            s.delete_volume(name).unwrap();
            s.create_volume(name, &plain_volume_xml(name, "raw", bytes.len() as u64))
                .unwrap();
            s.upload(name, bytes).unwrap();
        };
        for base in [&freed_base, &live_base, &configured_base] {
            put(base, &image);
            put(&marker_name(base), b"digest");
        }
        for name in &foreign {
            if s.volume_path(name).unwrap().is_none() {
                put(name, b"not the operator's");
            }
        }
        let (pinned, unpinned, pin) = url_volumes;
        for base in [&pinned.volume, &unpinned] {
            put(base, &image);
            put(&marker_name(base), pinned.digest.as_bytes());
        }
        put(&pin, pin_content(&pinned).as_bytes());
        // The orphan: overlay + seed, no domain (a crash between create and define).
        let freed_path = s.volume_path(&freed_base).unwrap().unwrap();
        let overlay = format!("{orphan}.qcow2");
        s.create_volume(
            &overlay,
            &overlay_volume_xml(&overlay, 1 << 30, &freed_path, "qcow2"),
        )
        .unwrap();
        put(&format!("{orphan}-seed.iso"), b"seed");
        // The live instance: a defined domain with its overlay on live_base.
        let live_path = s.volume_path(&live_base).unwrap().unwrap();
        let overlay = format!("{live}.qcow2");
        s.create_volume(
            &overlay,
            &overlay_volume_xml(&overlay, 1 << 30, &live_path, "qcow2"),
        )
        .unwrap();
        s.define_and_start(&live, &minimal_domain(&live)).ok(); // defined is enough; starting may fail
        put(&direct_base, &image);
        put(&marker_name(&direct_base), b"digest");
        define_with_disks(&admins_vm, &[s.volume_path(&direct_base).unwrap().unwrap()]);
        let renamed_disks = [format!("{renamed}.qcow2"), format!("{renamed}-seed.iso")].map(|v| {
            put(&v, b"disk");
            s.volume_path(&v).unwrap().unwrap()
        });
        define_with_disks(&renamed_vm, &renamed_disks);
    })
    .await
    .unwrap();

    let cfg = config(&bed, &configured_digest, &latest_url);
    let provider = KvmProvider::new("kvm-gc", cfg.clone(), runner_factory()("kvm-gc", &cfg).unwrap());
    let grace = Duration::from_millis(600);
    let present = |uri: String| async move {
        tokio::task::spawn_blocking(move || {
            let s = HostSession::open(&uri, "a", "default").unwrap();
            s.volumes()
                .unwrap()
                .into_iter()
                .map(|v| v.name)
                .collect::<Vec<_>>()
        })
        .await
        .unwrap()
    };
    let orphan_volumes = [format!("{orphan}.qcow2"), format!("{orphan}-seed.iso")];

    // First sighting: leftovers are noted, nothing is deleted.
    let first = provider.sweep_leftovers(grace).await.unwrap();
    assert!(first.errors.is_empty(), "{first:?}");
    let vols = present(uri.clone()).await;
    assert!(
        orphan_volumes.iter().all(|v| vols.contains(v)),
        "nothing deleted inside the grace period"
    );
    assert!(first.waiting >= 2, "{first:?}");

    // Past the grace period (time passing, not a wait for state): the
    // orphan's overlay and seed go; the base they kept alive is new to the list.
    tokio::time::sleep(grace).await;
    let second = provider.sweep_leftovers(grace).await.unwrap();
    for v in &orphan_volumes {
        assert!(
            second.deleted.contains(&format!("a/{v}")),
            "{v} reaped: {second:?}"
        );
    }
    for v in [&unpinned, &marker_name(&unpinned)] {
        assert!(
            second.deleted.contains(&format!("a/{v}")),
            "{v} reaped: {second:?}"
        );
    }
    let vols = present(uri.clone()).await;
    assert!(
        vols.contains(&freed_base),
        "a base freed just now waits out its own grace"
    );

    let third = provider.sweep_leftovers(grace).await.unwrap();
    assert!(
        !third.deleted.iter().any(|v| v.contains(&freed_base)),
        "{third:?}"
    );
    // The freed base's own grace period passes.
    tokio::time::sleep(grace).await;
    let fourth = provider.sweep_leftovers(grace).await.unwrap();
    for v in [&freed_base, &marker_name(&freed_base)] {
        assert!(
            fourth.deleted.contains(&format!("a/{v}")),
            "{v} reaped: {fourth:?}"
        );
    }

    // Whatever is in use or not the operator's is still there.
    let vols = present(uri.clone()).await;
    for kept in [
        format!("{live}.qcow2"),
        live_base.clone(),
        marker_name(&live_base),
        configured_base.clone(),
        marker_name(&configured_base),
        foreign[0].clone(),
        foreign[1].clone(),
        direct_base.clone(),
        marker_name(&direct_base),
        format!("{renamed}.qcow2"),
        format!("{renamed}-seed.iso"),
        pinned.volume.clone(),
        marker_name(&pinned.volume),
        pin_name(&latest_url),
    ] {
        assert!(vols.contains(&kept), "{kept} must stay: {vols:?}");
    }

    tokio::task::spawn_blocking(move || {
        let s = HostSession::open(&uri, "a", "default").unwrap();
        s.remove_domain(&live).unwrap();
        s.remove_domain(&admins_vm).unwrap();
        s.remove_domain(&renamed_vm).unwrap();
        for v in [
            direct_base.clone(),
            marker_name(&direct_base),
            format!("{renamed}.qcow2"),
            format!("{renamed}-seed.iso"),
            format!("{live}.qcow2"),
            live_base.clone(),
            marker_name(&live_base),
            configured_base.clone(),
            marker_name(&configured_base),
            foreign[0].clone(),
            pinned.volume.clone(),
            marker_name(&pinned.volume),
            pin_name(&latest_url),
        ] {
            s.delete_volume(&v).unwrap();
        }
    })
    .await
    .unwrap();
    link.close().await;
}
