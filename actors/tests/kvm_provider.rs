//! The kvm provider end to end through its host actors, against the real
//! libvirt daemon behind the real sshd of the test bed (`domainType: qemu`).

mod support;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use egress_proxies::domain::config::KvmConfig;
use std::time::Duration;

use egress_proxies::domain::provider_contract::{
    CreateRequest, ErrorClass, InstanceState, Provider, ProviderId,
};
use support::eventually;
use support::kvm_bed::{
    RemoveOnDrop, create_request, domain_exists, image_server, image_server_of, kvm_provider, past_transient,
    pool_volumes, provider_config, virsh_ok,
};

/// A provider configuration whose image `tiny` is served by a server of
/// this test alone (its downloads counted), with its digest configured so a
/// fetch reads it once, and not cached in the pool by an earlier run: the
/// configuration, the download count, the base's and its marker's names.
async fn own_image(
    bed: &HashMap<String, String>,
    size: &str,
) -> (KvmConfig, Arc<AtomicUsize>, String, String) {
    let (url, hits, base) = image_server_of(size).await;
    let mut cfg = provider_config(bed, &url);
    let digest = base
        .trim_start_matches("base-")
        .trim_end_matches(".qcow2")
        .to_owned();
    cfg.images.get_mut("tiny").unwrap().sha256 = Some(digest);
    let marker = egress_proxies::adapters::providers::kvm::base_image::marker_name(&base);
    for v in [&marker, &base] {
        let _ = std::process::Command::new("virsh")
            .args(["-c", "qemu:///system", "vol-delete", "--pool", "default", v])
            .output();
    }
    (cfg, hits, base, marker)
}

async fn retry<T>(
    what: &str,
    f: impl AsyncFnMut() -> Result<T, egress_proxies::domain::provider_contract::ProviderError>,
) -> T {
    past_transient(what, Duration::from_secs(60), f)
        .await
        .unwrap_or_else(|e| panic!("{what}: {e}"))
}

#[actix_rt::test]
async fn create_get_list_delete_through_the_host_actors() {
    let bed = bed_or_skip!();
    // An image of its own: the other tests here, running meanwhile, fetch
    // theirs into the same pool, and this one counts its downloads.
    let (cfg, hits, base, marker) = own_image(&bed, "255M").await;
    let provider = kvm_provider("kvm-test", cfg);

    // Three creates racing on host b share one download of the image.
    let reqs: Vec<CreateRequest> = (0..3)
        .map(|i| create_request(&format!("7e0c0c5e-0000-4000-8000-00000000000{i}"), "b"))
        .collect();
    let creates = reqs
        .iter()
        .map(|r| retry("create on b", async || provider.create(r).await));
    let ids: Vec<ProviderId> = futures::future::join_all(creates).await;
    assert_eq!(hits.load(Ordering::SeqCst), 1, "one download per (host, image)");
    assert_eq!(ids[0].as_str(), format!("hosts/b/domains/{}", reqs[0].name));

    let again = retry("re-create", async || provider.create(&reqs[0]).await).await;
    assert_eq!(again, ids[0], "idempotent");
    assert_eq!(hits.load(Ordering::SeqCst), 1, "the cached base is reused");

    let instance = retry("get", async || provider.get(&ids[0]).await).await;
    assert_eq!(
        instance.state,
        InstanceState::Provisioning,
        "running, no address yet"
    );
    assert_eq!(instance.owner.uid.as_deref(), Some(reqs[0].uid.as_str()));
    assert_eq!(instance.owner.namespace.as_deref(), Some("crawl"));
    assert_eq!(
        instance.owner.installation.as_deref(),
        Some(support::INSTALLATION)
    );
    assert!(!instance.owner.released);
    assert!(instance.created_at.is_some());

    assert_eq!(instance.reason, None);

    // A domain forced off from outside is Stopped, and libvirt's reason says so.
    let destroyed = std::process::Command::new("virsh")
        .args(["-c", "qemu:///system", "destroy", reqs[1].name.as_str()])
        .output()
        .unwrap();
    assert!(destroyed.status.success(), "{destroyed:?}");
    let stopped = retry("get a destroyed domain", async || provider.get(&ids[1]).await).await;
    assert_eq!(stopped.state, InstanceState::Stopped);
    assert_eq!(
        stopped.reason.as_deref(),
        Some("domain shut off: destroyed (forced off from outside the guest)")
    );

    let listed = retry("list", async || provider.list_by_tag().await).await;
    for id in &ids {
        assert!(listed.iter().any(|i| &i.id == id), "{id} listed");
    }
    let listed_stopped = listed.iter().find(|i| i.id == ids[1]).unwrap();
    assert_eq!(listed_stopped.state, InstanceState::Stopped);
    assert_eq!(listed_stopped.reason, stopped.reason);

    for id in &ids {
        retry("delete", async || provider.delete(id).await).await;
        let err = provider.get(id).await.unwrap_err();
        assert_eq!(err.class, ErrorClass::NotFound);
        retry("second delete", async || provider.delete(id).await).await;
    }
    let left: Vec<String> = pool_volumes()
        .into_iter()
        .filter(|v| v.contains("proxy-") && reqs.iter().any(|r| v.contains(r.name.as_str())))
        .collect();
    assert!(left.is_empty(), "instance volumes left: {left:?}");
    assert!(
        pool_volumes().contains(&base) && pool_volumes().contains(&marker),
        "the base ({base}) and its marker stay cached"
    );

    // A providerID naming an unconfigured host: get is Permanent, delete a no-op.
    let stray = ProviderId("hosts/zz/domains/proxy-x".into());
    assert_eq!(
        provider.get(&stray).await.unwrap_err().class,
        ErrorClass::Permanent
    );
    provider.delete(&stray).await.unwrap();
}

#[actix_rt::test]
async fn delete_removes_a_domain_with_snapshots_and_checkpoints() {
    let bed = bed_or_skip!();
    let (url, _, _) = image_server().await;
    let cfg = provider_config(&bed, &url);
    let provider = kvm_provider("kvm-snap", cfg);
    let req = create_request("7e0c0c5e-0000-4000-8000-0000000000c1", "b");
    let name = req.name.to_string();
    let _cleanup = RemoveOnDrop(vec![name.clone()]);
    let id = retry("create", async || provider.create(&req).await).await;

    // What an admin or a backup tool may leave behind: an internal snapshot
    // (taken shut off) and a checkpoint (taken running). Either alone makes
    // libvirt refuse a plain undefine. A checkpoint needs a qcow2 v3 disk
    // (dirty bitmaps); libvirt creates overlays as v2, so the admin amends it.
    virsh_ok(&["destroy", &name]);
    let overlay = virsh_ok(&["vol-path", "--pool", "default", &format!("{name}.qcow2")]);
    let amended = std::process::Command::new("qemu-img")
        .args(["amend", "-f", "qcow2", "-o", "compat=1.1", overlay.trim()])
        .output()
        .unwrap();
    assert!(amended.status.success(), "{amended:?}");
    virsh_ok(&["snapshot-create-as", &name, "before-upgrade"]);
    virsh_ok(&["start", &name]);
    virsh_ok(&["checkpoint-create-as", &name, "backup-1"]);
    assert!(virsh_ok(&["snapshot-list", &name, "--name"]).contains("before-upgrade"));
    assert!(virsh_ok(&["checkpoint-list", &name, "--name"]).contains("backup-1"));

    retry("delete", async || provider.delete(&id).await).await;
    assert!(!domain_exists(&name), "the domain is gone");
    for kept in ["snapshot", "checkpoint"] {
        let dir = std::path::Path::new("/var/lib/libvirt/qemu")
            .join(kept)
            .join(&name);
        assert!(
            !dir.exists(),
            "libvirt's {kept} metadata is gone: {}",
            dir.display()
        );
    }
    let left: Vec<String> = pool_volumes()
        .into_iter()
        .filter(|v| v.contains(name.as_str()))
        .collect();
    assert!(left.is_empty(), "instance volumes left: {left:?}");
}

fn kill_sshd(bed: &HashMap<String, String>, port: &str) {
    let master = std::fs::read_to_string(&bed["EPO_KVM_SSHD_A_PID_FILE"]).unwrap();
    let _ = std::process::Command::new("kill").arg(master.trim()).status();
    // Established sessions live in their own sshd processes: end those of this port only.
    let out = std::process::Command::new("ss")
        .args(["-Htnp", &format!("sport = :{port}")])
        .output()
        .unwrap();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        for pid in line.split("pid=").skip(1).filter_map(|p| p.split(',').next()) {
            let _ = std::process::Command::new("kill").arg(pid).status();
        }
    }
}

#[actix_rt::test]
async fn a_dead_link_restarts_only_its_host() {
    let bed = bed_or_skip!();
    let (url, _, _) = image_server().await;
    let cfg = provider_config(&bed, &url);
    let provider = kvm_provider("kvm-iso", cfg);
    let missing_a = ProviderId("hosts/a/domains/proxy-isolation0000a".into());
    let missing_b = ProviderId("hosts/b/domains/proxy-isolation0000b".into());
    // Both links up (a missing domain is a normal NotFound answer).
    for id in [&missing_a, &missing_b] {
        eventually(
            &format!("{id} answered NotFound"),
            Duration::from_secs(30),
            async || match provider.get(id).await {
                Err(e) if e.class == ErrorClass::NotFound => Ok(()),
                other => Err(format!("{other:?}")),
            },
        )
        .await;
    }
    let port_a = bed["EPO_KVM_HOST_A"].rsplit_once(':').unwrap().1.to_owned();
    kill_sshd(&bed, &port_a);

    // A fails (Transient) while B keeps answering throughout.
    eventually(
        "host a's calls to fail while its sshd is down",
        Duration::from_secs(20),
        async || {
            let a = provider.get(&missing_a).await;
            assert_eq!(
                provider.get(&missing_b).await.unwrap_err().class,
                ErrorClass::NotFound,
                "host b unaffected"
            );
            matches!(&a, Err(e) if e.class == ErrorClass::Transient)
                .then_some(())
                .ok_or_else(|| format!("{a:?}"))
        },
    )
    .await;

    // sshd comes back: A recovers by itself.
    assert!(
        std::process::Command::new("/usr/sbin/sshd")
            .arg("-f")
            .arg(&bed["EPO_KVM_SSHD_A_CONFIG"])
            .status()
            .unwrap()
            .success()
    );
    eventually("host a to recover", Duration::from_secs(60), async || {
        let a = provider.get(&missing_a).await;
        assert_eq!(
            provider.get(&missing_b).await.unwrap_err().class,
            ErrorClass::NotFound
        );
        match a {
            Err(e) if e.class == ErrorClass::NotFound => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
}

#[actix_rt::test]
async fn a_key_that_appears_later_heals_the_provider_without_a_restart() {
    let bed = bed_or_skip!();
    let (url, _, _) = image_server().await;
    let dir = tempfile::tempdir().unwrap();
    let key_path = dir.path().join("id_ed25519");
    let mut cfg = provider_config(&bed, &url);
    cfg.ssh_key_file = key_path.clone();
    cfg.hosts.truncate(1);
    let provider = kvm_provider("kvm-heal", cfg);
    let missing = ProviderId("hosts/a/domains/proxy-keyheal00000000".into());

    let err = provider.get(&missing).await.unwrap_err();
    assert_eq!(err.class, ErrorClass::Transient, "{err}");
    // Once the host has tried to dial, its calls say why they fail.
    eventually(
        "a failure saying the key does not exist",
        Duration::from_secs(10),
        async || {
            let err = provider.get(&missing).await.unwrap_err();
            assert_eq!(err.class, ErrorClass::Transient, "{err}");
            err.to_string()
                .contains("does not exist")
                .then_some(())
                .ok_or(err)
        },
    )
    .await;

    // The Secret gets mounted.
    std::fs::copy(&bed["EPO_KVM_SSH_KEY"], &key_path).unwrap();
    let healed = past_transient("the provider to heal", Duration::from_secs(45), async || {
        provider.get(&missing).await
    })
    .await;
    assert!(
        matches!(&healed, Err(e) if e.class == ErrorClass::NotFound),
        "healed: {healed:?}"
    );
}

#[actix_rt::test]
async fn a_pool_without_room_for_the_overlay_is_quota_exceeded_with_the_numbers() {
    let bed = bed_or_skip!();
    let (url, _, _) = image_server().await;
    let mut cfg = provider_config(&bed, &url);
    cfg.disk_size_gb = 1 << 20; // 1 PiB: more than any test machine's pool has free
    let provider = kvm_provider("kvm-full", cfg);
    let req = create_request("7e0c0c5e-0000-4000-8000-0000000000f1", "a");
    let err = match past_transient("the create's answer", Duration::from_secs(60), async || {
        provider.create(&req).await
    })
    .await
    {
        Err(e) => e,
        Ok(id) => panic!("created {id} in a pool without room"),
    };
    assert_eq!(err.class, ErrorClass::QuotaExceeded, "{err}");
    let message = err.to_string();
    assert!(
        message.contains("bytes free") && message.contains(&(1u64 << 50).to_string()),
        "names what is free and what is needed: {message}"
    );
    let left: Vec<String> = pool_volumes()
        .into_iter()
        .filter(|v| v.contains(req.name.as_str()))
        .collect();
    assert!(left.is_empty(), "nothing created: {left:?}");
}

#[actix_rt::test]
async fn a_base_deleted_behind_the_image_cache_is_fetched_again() {
    let bed = bed_or_skip!();
    let (cfg, hits, base, marker) = own_image(&bed, "48M").await;
    let provider = kvm_provider("kvm-forget", cfg);
    let first = create_request("7e0c0c5e-0000-4000-8000-0000000000e1", "a");
    let second = create_request("7e0c0c5e-0000-4000-8000-0000000000e2", "a");
    let _cleanup = RemoveOnDrop(vec![first.name.to_string(), second.name.to_string()]);
    let first_id = retry("first create", async || provider.create(&first).await).await;
    assert_eq!(hits.load(Ordering::SeqCst), 1);
    // The cache knows the base now; someone deletes it from the pool.
    for v in [&marker, &base] {
        virsh_ok(&["vol-delete", "--pool", "default", v.as_str()]);
    }
    // The next create finds it missing (transient), the cache forgets it,
    // and the retry fetches it again.
    let second_id = retry("second create", async || provider.create(&second).await).await;
    assert_eq!(hits.load(Ordering::SeqCst), 2, "fetched again");
    assert!(pool_volumes().contains(&base), "the base is back");
    for id in [&first_id, &second_id] {
        retry("delete", async || provider.delete(id).await).await;
    }
}
