//! Two operator installations sharing one KVM host (the test bed's real
//! libvirtd behind its real sshd): each has its own store, Proxies,
//! installation id and provider with its own host links, and runs orphan GC
//! (`gc::sweep`, pool sweep included) many times with a short grace. Neither
//! deletes the other's domains or volumes; each still reaps its own true
//! orphans and their leftover volumes. A released domain is listed and
//! deleted by no one and keeps running with its mark persistent; a domain
//! marked by an earlier version (no installation) is reported untagged and
//! never reaped — until an admin tags it by hand with the `virsh metadata`
//! line of docs/kvm-provider.md, after which its installation adopts it.
//! Its own test binary: its sweeps cover the whole shared pool.

mod support;

use std::collections::{BTreeSet, HashMap};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use egress_proxies::adapters::providers::kvm::metadata::{self, METADATA_URI};
use egress_proxies::adapters::providers::kvm::ops::{overlay_name, seed_name};
use egress_proxies::adapters::providers::kvm::provider::KvmProvider;
use egress_proxies::adapters::stores::embedded::{EmbeddedStore, ManifestSet};
use egress_proxies::domain::config::{ImageFormat, KvmConfig};
use egress_proxies::domain::gc;
use egress_proxies::domain::installation::InstallationId;
use egress_proxies::domain::provider_contract::{
    CloudInitBytes, CreateRequest, Instance, Provider, ProviderError, ProviderId, Providers, instance_name,
};
use egress_proxies::domain::resource::ObjectKey;
use egress_proxies::domain::resource::{Placement, Proxy};
use egress_proxies::domain::resource_store::ProxyStore;
use egress_proxies_operator::kvm::runner_factory;
use serde_json::json;
use sha2::Digest;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const GRACE: Duration = Duration::from_millis(800);

/// Serves one small qcow2 image; returns its URL and digest.
async fn image_server() -> (String, String) {
    let body = Arc::new(support::kvm_bed::tiny_qcow2("128M"));
    let digest = hex::encode(sha2::Sha256::digest(body.as_slice()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let body = body.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 2048];
                let _ = s.read(&mut buf).await;
                let head = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                );
                let _ = s.write_all(head.as_bytes()).await;
                let _ = s.write_all(&body).await;
            });
        }
    });
    (format!("http://{addr}/tiny.qcow2"), digest)
}

/// One installation's provider config: the bed's host "a", the test image
/// pinned to its digest, a 96 MiB machine type.
fn config(bed: &HashMap<String, String>, url: &str, digest: &str) -> KvmConfig {
    let mut config = support::kvm_bed::provider_config(bed, url);
    config.hosts.retain(|h| h.name == "a");
    if let Some(tiny) = config.images.get_mut("tiny") {
        tiny.sha256 = Some(digest.to_owned());
    }
    if let Some(small) = config.machine_types.get_mut("small") {
        small.memory_mib = 96;
    }
    config
}

fn proxy(name: &str) -> Proxy {
    serde_json::from_value(json!({
        "apiVersion": "crawl.example.com/v1alpha1", "kind": "Proxy",
        "metadata": {"name": name, "namespace": "crawl"},
        "spec": {"mode": "Managed", "provider": "kvm-home"}
    }))
    .unwrap()
}

/// One operator installation: its store (with its Proxies), id and provider.
struct Installation {
    id: InstallationId,
    store: EmbeddedStore,
    _dir: tempfile::TempDir,
    provider: Arc<KvmProvider>,
    providers: Providers,
}

impl Installation {
    fn new(id: &str, cfg: &KvmConfig) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let (store, _events) = EmbeddedStore::open(dir.path()).unwrap();
        // Both call their provider "kvm-home": separate operators, separate links.
        let provider = Arc::new(KvmProvider::new(
            "kvm-home",
            cfg.clone(),
            runner_factory()("kvm-home", cfg).unwrap(),
        ));
        Self {
            id: InstallationId::parse(id).unwrap(),
            store,
            _dir: dir,
            providers: Providers::from_providers([provider.clone() as Arc<dyn Provider>]),
            provider,
        }
    }

    /// Makes exactly these Proxies exist; returns their UIDs by name.
    async fn proxies(&self, names: &[&str]) -> HashMap<String, String> {
        let set = ManifestSet {
            proxies: names
                .iter()
                .map(|n| (ObjectKey::new("crawl", *n), proxy(n)))
                .collect(),
            ..Default::default()
        };
        self.store.apply(&set).unwrap();
        let mut uids = HashMap::new();
        for n in names {
            let p = self
                .store
                .get(&ObjectKey::new("crawl", *n))
                .await
                .unwrap()
                .unwrap();
            uids.insert((*n).to_owned(), p.metadata.uid.unwrap());
        }
        uids
    }

    fn request(&self, uid: &str) -> CreateRequest {
        CreateRequest {
            name: instance_name(uid),
            uid: uid.into(),
            namespace: "crawl".into(),
            installation: self.id.clone(),
            cloud_init: Some(CloudInitBytes(b"#!/bin/sh\necho proxy\n".to_vec())),
            placement: Placement {
                zone: Some("a".into()),
                machine_type: Some("small".into()),
                image: Some("tiny".into()),
                region: None,
            },
            port: 3128,
            credentials: None,
            quarantined: Vec::new(),
        }
    }

    async fn create(&self, uid: &str) -> ProviderId {
        let req = self.request(uid);
        retry("create", async || self.provider.create(&req).await).await
    }

    async fn sweep(&self) -> gc::SweepReport {
        let scope = gc::Scope {
            installation: self.id.clone(),
            namespaces: None,
        };
        gc::sweep(
            &self.store,
            &self.providers,
            &scope,
            GRACE,
            jiff::Timestamp::now(),
        )
        .await
        .unwrap()
    }

    async fn list(&self) -> Vec<Instance> {
        retry("list", async || self.provider.list_by_tag().await).await
    }
}

async fn retry<T>(what: &str, f: impl AsyncFnMut() -> Result<T, ProviderError>) -> T {
    support::kvm_bed::past_transient(what, Duration::from_secs(90), f)
        .await
        .unwrap_or_else(|e| panic!("{what}: {e}"))
}

fn virsh(args: &[&str]) -> std::process::Output {
    Command::new("virsh")
        .args(["-c", "qemu:///system"])
        .args(args)
        .output()
        .unwrap()
}

fn virsh_ok(args: &[&str]) -> String {
    let out = virsh(args);
    assert!(
        out.status.success(),
        "virsh {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

fn domains() -> BTreeSet<String> {
    virsh_ok(&["list", "--all", "--name"])
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect()
}

fn volumes() -> BTreeSet<String> {
    virsh_ok(&["vol-list", "default"])
        .lines()
        .skip(2)
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

fn state(domain: &str) -> String {
    virsh_ok(&["domstate", domain])
}

/// The operator's mark on a domain as libvirt keeps it (`--config`: the
/// persistent definition; `--live`: the running one).
fn mark(domain: &str, which: &str) -> metadata::InstanceMetadata {
    let xml = virsh_ok(&["metadata", domain, "--uri", METADATA_URI, which]);
    metadata::parse(&xml).unwrap_or_else(|| panic!("{domain} {which}: unparsable mark {xml}"))
}

/// Removes the test's domains and their volumes, also when it fails half-way
/// (a running domain is a QEMU process: none may be left behind).
struct Cleanup(Vec<String>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        for name in &self.0 {
            let _ = virsh(&["destroy", name]);
            let _ = virsh(&["undefine", name, "--nvram"]);
            for v in [overlay_name(name), seed_name(name)] {
                let _ = virsh(&["vol-delete", "--pool", "default", &v]);
            }
        }
    }
}

fn instance_volumes(name: &str) -> [String; 2] {
    [overlay_name(name), seed_name(name)]
}

/// What an earlier version wrote into a domain: managed, uid, createdAt only.
fn earlier_version_domain(name: &str, uid: &str, overlay: &str) -> String {
    format!(
        "<domain type='qemu'><name>{name}</name>\
         <metadata><epo:instance xmlns:epo='{METADATA_URI}'><epo:managed>true</epo:managed>\
         <epo:uid>{uid}</epo:uid><epo:createdAt>2025-01-01T00:00:00Z</epo:createdAt></epo:instance></metadata>\
         <memory unit='MiB'>64</memory><vcpu>1</vcpu><os><type arch='x86_64' machine='q35'>hvm</type></os>\
         <devices><disk type='file' device='disk'><driver name='qemu' type='qcow2'/>\
         <source file='{overlay}'/><target dev='vda' bus='virtio'/></disk></devices></domain>"
    )
}

#[actix_rt::test]
async fn two_installations_on_one_host_never_reap_each_other() {
    let bed = bed_or_skip!();
    let (url, digest) = image_server().await;
    let cfg = config(&bed, &url, &digest);
    let base = egress_proxies::adapters::providers::kvm::base_image::base_volume(&digest, ImageFormat::Qcow2);
    let a = Installation::new("epo-test-a", &cfg);
    let b = Installation::new("epo-test-b", &cfg);

    // Each installation: a live Proxy with its VM, a true orphan (a VM
    // whose Proxy is gone), and A a Proxy it will release with skip-cleanup.
    let a_uids = a.proxies(&["web", "kept"]).await;
    let b_uids = b.proxies(&["web"]).await;
    let a_orphan_uid = uuid::Uuid::new_v4().to_string();
    let b_orphan_uid = uuid::Uuid::new_v4().to_string();
    let old_uid = uuid::Uuid::new_v4().to_string();
    let names = |uid: &str| instance_name(uid).to_string();
    let (a_live, a_kept, b_live) = (
        names(&a_uids["web"]),
        names(&a_uids["kept"]),
        names(&b_uids["web"]),
    );
    let (a_orphan, b_orphan, old) = (names(&a_orphan_uid), names(&b_orphan_uid), names(&old_uid));
    // Crash leftovers (volumes, no domain) of each installation's instances.
    let (a_crash, b_crash) = (
        names(&uuid::Uuid::new_v4().to_string()),
        names(&uuid::Uuid::new_v4().to_string()),
    );
    let _cleanup = Cleanup(
        [
            &a_live, &a_kept, &b_live, &a_orphan, &b_orphan, &old, &a_crash, &b_crash,
        ]
        .map(|s| s.clone())
        .to_vec(),
    );

    let ids: HashMap<&str, ProviderId> = HashMap::from([
        ("a_live", a.create(&a_uids["web"]).await),
        ("a_kept", a.create(&a_uids["kept"]).await),
        ("a_orphan", a.create(&a_orphan_uid).await),
        ("b_live", b.create(&b_uids["web"]).await),
        ("b_orphan", b.create(&b_orphan_uid).await),
    ]);

    // What create wrote, read back through get: the whole owner.
    let got = retry("get", async || a.provider.get(&ids["a_live"]).await).await;
    assert_eq!(got.owner.uid.as_deref(), Some(a_uids["web"].as_str()));
    assert_eq!(got.owner.namespace.as_deref(), Some("crawl"));
    assert_eq!(got.owner.installation.as_deref(), Some("epo-test-a"));
    assert!(!got.owner.released);
    let got = retry("get", async || a.provider.get(&ids["b_live"]).await).await;
    assert_eq!(
        got.owner.installation.as_deref(),
        Some("epo-test-b"),
        "either provider reads the other's mark"
    );

    // An instance an earlier version made (no installation in its mark), its Proxy long gone.
    let overlay_path = format!("/var/lib/libvirt/images/{}", overlay_name(&old));
    for (v, size) in [(overlay_name(&old), "1M"), (seed_name(&old), "1M")] {
        virsh_ok(&["vol-create-as", "default", &v, size]);
    }
    let xml_file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        xml_file.path(),
        earlier_version_domain(&old, &old_uid, &overlay_path),
    )
    .unwrap();
    virsh_ok(&["define", xml_file.path().to_str().unwrap()]);
    // Crash leftovers: an overlay and a seed whose domain never came.
    for name in [&a_crash, &b_crash] {
        for v in instance_volumes(name) {
            virsh_ok(&["vol-create-as", "default", &v, "1M"]);
        }
    }

    // Both list every managed domain with its owner, whoever made it.
    for installation in [&a, &b] {
        let listed = installation.list().await;
        let owner_of = |name: &str| {
            listed
                .iter()
                .find(|i| i.id.as_str().ends_with(&format!("/{name}")))
                .map(|i| i.owner.clone())
                .unwrap_or_else(|| panic!("{name} listed: {listed:?}"))
        };
        assert_eq!(owner_of(&a_orphan).installation.as_deref(), Some("epo-test-a"));
        assert_eq!(owner_of(&b_orphan).installation.as_deref(), Some("epo-test-b"));
        assert_eq!(owner_of(&b_live).namespace.as_deref(), Some("crawl"));
        let old_owner = owner_of(&old);
        assert_eq!(
            old_owner.installation, None,
            "an earlier version's mark is untagged"
        );
        assert_eq!(old_owner.uid.as_deref(), Some(old_uid.as_str()));
    }

    // skip-cleanup on A's "kept": released, then its Proxy is gone.
    retry("release", async || a.provider.release(&ids["a_kept"]).await).await;
    a.proxies(&["web"]).await;
    for which in ["--config", "--live"] {
        let m = mark(&a_kept, which);
        assert!(!m.managed && m.released, "{which}: {m:?}");
        assert_eq!(m.installation.as_deref(), Some("epo-test-a"), "{which}");
        assert_eq!(m.uid, a_uids["kept"], "{which}");
        assert_eq!(m.namespace.as_deref(), Some("crawl"), "{which}");
    }
    assert_eq!(state(&a_kept), "running", "a released domain keeps running");
    for installation in [&a, &b] {
        let listed = installation.list().await;
        assert!(
            !listed.iter().any(|i| i.id == ids["a_kept"]),
            "a released domain is listed by no GC: {listed:?}"
        );
    }
    // Releasing again, or one that is gone, succeeds.
    retry("release again", async || a.provider.release(&ids["a_kept"]).await).await;
    let gone = ProviderId(format!(
        "hosts/a/domains/{}",
        names(&uuid::Uuid::new_v4().to_string())
    ));
    retry("release a gone domain", async || a.provider.release(&gone).await).await;

    // Many sweeps by both, interleaved, past the grace period.
    let (mut a_reaped, mut b_reaped) = (0, 0);
    let mut leftovers_deleted = 0;
    let mut untagged_reports = (0, 0);
    for round in 0..8 {
        let ra = a.sweep().await;
        let rb = b.sweep().await;
        for r in [&ra, &rb] {
            assert!(r.skipped_providers.is_empty(), "round {round}: {r:?}");
            assert_eq!(r.failed_deletes, 0, "round {round}: {r:?}");
            assert_eq!(r.leftover_errors, 0, "round {round}: {r:?}");
        }
        a_reaped += ra.deleted;
        b_reaped += rb.deleted;
        untagged_reports.0 += ra
            .untagged
            .iter()
            .filter(|(_, id)| id.as_str().ends_with(&old))
            .count();
        untagged_reports.1 += rb
            .untagged
            .iter()
            .filter(|(_, id)| id.as_str().ends_with(&old))
            .count();
        let others =
            |r: &gc::SweepReport| r.not_ours[&("kvm-home".to_owned(), gc::NotOurs::OtherInstallation)];
        // The other's domains are counted as the other's, not judged.
        if round == 0 {
            // At least: a domain another test run left on the shared bed
            // (another installation's) counts too; what matters is below —
            // each one survives.
            assert!(others(&ra) >= 2, "b_live and b_orphan: {ra:?}");
            assert!(others(&rb) >= 1, "a_live at least: {rb:?}");
        }
        leftovers_deleted += ra.leftovers_deleted + rb.leftovers_deleted;
        let present = domains();
        for live in [&a_live, &b_live, &a_kept, &old] {
            assert!(
                present.contains(live),
                "round {round}: {live} must stay: {present:?}"
            );
        }
        let vols = volumes();
        for name in [&a_live, &b_live, &a_kept, &old] {
            for v in instance_volumes(name) {
                assert!(vols.contains(&v), "round {round}: {v} must stay");
            }
        }
        assert!(vols.contains(&base), "round {round}: the base in use stays");
        // Sweep rounds a grace period apart, as an interval would space them.
        tokio::time::sleep(GRACE + Duration::from_millis(100)).await;
    }
    assert_eq!(a_reaped, 1, "A reaped its own orphan only");
    assert_eq!(b_reaped, 1, "B reaped its own orphan only");
    assert!(
        untagged_reports.0 >= 8 && untagged_reports.1 >= 8,
        "{untagged_reports:?}"
    );
    let present = domains();
    for orphan in [&a_orphan, &b_orphan] {
        assert!(!present.contains(orphan), "{orphan} reaped");
    }
    let vols = volumes();
    for name in [&a_orphan, &b_orphan, &a_crash, &b_crash] {
        for v in instance_volumes(name) {
            assert!(!vols.contains(&v), "{v} swept: {vols:?}");
        }
    }
    assert!(
        leftovers_deleted >= 4,
        "the crash leftovers went through the pool sweep"
    );
    assert_eq!(state(&a_kept), "running", "still running after every sweep");
    assert_eq!(state(&a_live), "running");
    assert_eq!(state(&b_live), "running");

    // The release is in the persistent definition: it survives a restart.
    virsh_ok(&["destroy", &a_kept]);
    virsh_ok(&["start", &a_kept]);
    let got = retry("get after restart", async || a.provider.get(&ids["a_kept"]).await).await;
    assert!(got.owner.released, "{got:?}");
    assert_eq!(got.owner.installation.as_deref(), Some("epo-test-a"));
    let r = a.sweep().await;
    assert_eq!(r.deleted, 0, "{r:?}");
    assert!(domains().contains(&a_kept));

    // An admin tags the earlier version's domain for A (docs/kvm-provider.md):
    // A now owns it, and as its Proxy is gone, reaps it with its volumes.
    let tagged = format!(
        "<instance><managed>true</managed><uid>{old_uid}</uid><namespace>crawl</namespace>\
         <installation>epo-test-a</installation><released>false</released>\
         <createdAt>2025-01-01T00:00:00Z</createdAt></instance>"
    );
    virsh_ok(&[
        "metadata",
        &old,
        "--uri",
        METADATA_URI,
        "--key",
        "epo",
        "--set",
        &tagged,
        "--config",
    ]);
    let rb = b.sweep().await;
    assert_eq!(rb.deleted, 0, "B leaves A's: {rb:?}");
    let ra = a.sweep().await;
    assert_eq!(ra.deleted, 1, "{ra:?}");
    assert!(!domains().contains(&old));
    let vols = volumes();
    for v in instance_volumes(&old) {
        assert!(!vols.contains(&v), "{v} deleted with its domain");
    }
    for name in [&a_live, &b_live, &a_kept] {
        assert!(domains().contains(name));
    }
}
