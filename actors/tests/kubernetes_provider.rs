//! The kubernetes provider against the fake API server, and a whole
//! operator whose Proxy goes Running when its pod runs.

mod support;

use std::process::Command;
use std::time::Duration;

use egress_proxies::adapters::providers::kubernetes::KubernetesProvider;
use egress_proxies::domain::config::KubernetesConfig;
use egress_proxies::domain::provider_contract::{
    CreateRequest, ErrorClass, InstanceState, Provider, ProviderId, instance_name,
};
use egress_proxies::domain::resource::Placement;
use fake_apiserver::FakeApiServer;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::json;

fn client(fake: &FakeApiServer) -> kube::Client {
    kube::Client::try_from(kube::Config::new(fake.url().parse().unwrap())).unwrap()
}

fn request(uid: &str, port: u16) -> CreateRequest {
    CreateRequest {
        name: instance_name(uid),
        uid: uid.to_owned(),
        namespace: "crawl".into(),
        installation: support::installation(),
        cloud_init: None,
        placement: Placement::default(),
        port,
        credentials: None,
        quarantined: Vec::new(),
    }
}

async fn mark(pods: &Api<Pod>, name: &str, status: serde_json::Value) {
    pods.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": status})),
    )
    .await
    .unwrap();
}

/// A kubernetes provider built from a providers file, with the operator's
/// cluster networks: its pods' Squid refuses the cluster networks and the
/// default ranges, except what `destinations.allow` lists.
#[actix_rt::test]
async fn the_pods_squid_config_carries_the_destination_rules() {
    let fake = FakeApiServer::start().unwrap();
    let config = egress_proxies::domain::config::ProvidersConfig::parse(
        "providers:\n  - {name: kubernetes, type: kubernetes, kubernetes: {destinations: {allow: [10.1.0.0/16, 8443], deny: [10.1.2.0/24]}}}\n",
        "test",
    )
    .unwrap();
    let state = tempfile::tempdir().unwrap();
    let ctx = egress_proxies::adapters::providers::BuildContext {
        state_dir: state.path().to_owned(),
        operator_exe: env!("CARGO_BIN_EXE_egress-proxies-operator").into(),
        kube_client: Some(client(&fake)),
        kvm_runner: None,
        gcp: Default::default(),
        cluster_networks: vec!["10.96.0.0/12".parse().unwrap()],
    };
    let providers = egress_proxies::adapters::providers::build(&config, &ctx).unwrap();
    let req = request("uid-rules", 3128);
    providers.get("kubernetes").unwrap().create(&req).await.unwrap();
    let pod = Api::<Pod>::namespaced(client(&fake), "crawl")
        .get(req.name.as_str())
        .await
        .unwrap();
    let conf = pod.spec.unwrap().containers[0].env.as_ref().unwrap()[0]
        .value
        .clone()
        .unwrap();
    for line in [
        "acl SSL_ports port 443 8443\n",
        "acl epo_denied_dst dst 10.1.2.0/24\n",
        "http_access deny CONNECT !SSL_ports\n",
        // Denies only, the allowed network cut out of the default ones: a
        // name with one allowed address does not pass a refused one.
        "http_access deny epo_default_denied_dst\n",
        "http_access deny epo_default_denied_embedded_dst\n",
        "http_access deny manager\n",
    ] {
        assert!(conf.contains(line), "{line:?} in {conf}");
    }
    assert!(
        conf.contains("acl epo_default_denied_dst dst 0.0.0.0/8 127.0.0.0/8 169.254.0.0/16")
            && conf.contains(" 10.0.0.0/16 10.2.0.0/15 10.4.0.0/14 ")
            && !conf.contains(" 10.1.0.0/16")
            && conf.contains(" fc00::/7 2001::/32 64:ff9b:1::/48 10.96.0.0/12\n")
            && conf.contains(" 2002:a60::/28\n"),
        "defaults and the cluster network, also in its embedded forms: {conf}"
    );
    let rules_end = conf.find("http_access deny epo_default_denied_dst").unwrap();
    assert!(
        rules_end < conf.find("http_access allow all").unwrap(),
        "the rules come before the final allow: {conf}"
    );
}

#[actix_rt::test]
async fn pods_are_created_mapped_listed_and_deleted() {
    let fake = FakeApiServer::start().unwrap();
    let c = client(&fake);
    let provider = KubernetesProvider::new("kubernetes", KubernetesConfig::default(), c.clone());
    let credentials = egress_proxies::domain::credentials::ProxyCredentials::generate(
        &egress_proxies::adapters::random::SystemRandom,
    )
    .unwrap();
    let req = CreateRequest {
        credentials: Some(credentials.clone()),
        ..request("uid-1", 3128)
    };
    let id = provider.create(&req).await.unwrap();
    assert_eq!(id.as_str(), format!("namespaces/crawl/pods/{}", req.name));
    assert_eq!(provider.create(&req).await.unwrap(), id, "idempotent on the name");

    let pods: Api<Pod> = Api::namespaced(c.clone(), "crawl");
    let pod = pods.get(req.name.as_str()).await.unwrap();
    let labels = pod.metadata.labels.clone().unwrap();
    assert_eq!(labels["crawl.example.com/managed"], "true");
    assert_eq!(labels["crawl.example.com/uid"], "uid-1");
    assert_eq!(labels["crawl.example.com/installation"], support::INSTALLATION);
    let container = &pod.spec.as_ref().unwrap().containers[0];
    assert_eq!(container.image.as_deref(), Some("ubuntu/squid:6.6-24.04_edge"));
    assert_eq!(container.ports.as_ref().unwrap()[0].container_port, 3128);
    let conf = container.env.as_ref().unwrap()[0].value.clone().unwrap();
    assert!(
        conf.contains("http_port 3128") && conf.contains("max_filedescriptors"),
        "{conf}"
    );
    // Squid checks credentials against the passwd file of the Proxy's Secret.
    assert!(
        conf.contains("auth_param basic program /usr/lib/squid/basic_ncsa_auth /etc/squid-auth/passwd\n")
            && conf.find("http_access deny !authenticated") < conf.find("http_access allow"),
        "{conf}"
    );
    // Its 407 names the credentials' own realm, which the lease book hands the gateway.
    assert!(
        conf.contains(&format!("auth_param basic realm {}\n", credentials.realm())),
        "{conf}"
    );
    let spec = pod.spec.as_ref().unwrap();
    let volume = spec.volumes.iter().flatten().find(|v| v.name == "auth").unwrap();
    let secret = volume.secret.as_ref().unwrap();
    assert_eq!(
        secret.secret_name.as_deref(),
        Some(format!("{}-credentials", req.name).as_str())
    );
    assert_eq!(secret.items.as_ref().unwrap()[0].key, "htpasswd");
    let mount = container
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| m.name == "auth")
        .unwrap();
    assert_eq!(
        (mount.mount_path.as_str(), mount.read_only),
        ("/etc/squid-auth", Some(true))
    );
    let whole_pod = serde_json::to_string(&pod).unwrap();
    assert!(
        !whole_pod.contains(&credentials.password),
        "the pod carries no password"
    );

    let i = provider.get(&id).await.unwrap();
    assert_eq!((i.state, i.ip), (InstanceState::Provisioning, None));
    assert_eq!(
        i.owner,
        egress_proxies::domain::provider_contract::Ownership {
            uid: Some("uid-1".into()),
            namespace: Some("crawl".into()),
            installation: Some(support::INSTALLATION.into()),
            released: false,
        }
    );
    assert!(i.created_at.is_some());
    // The provider reads pods from its watch cache: a change shows once
    // the watch has delivered it.
    let state_becomes = async |want: InstanceState| {
        support::eventually(
            &format!("the instance {want:?}"),
            Duration::from_secs(10),
            async || {
                let i = provider.get(&id).await.unwrap();
                (i.state == want).then_some(i)
            },
        )
        .await
    };
    mark(&pods, req.name.as_str(), json!({"phase": "Running", "podIP": "10.1.2.3", "conditions": [{"type": "Ready", "status": "False"}]})).await;
    for _ in 0..10 {
        assert_eq!(
            provider.get(&id).await.unwrap().state,
            InstanceState::Provisioning,
            "running but not ready"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    mark(
        &pods,
        req.name.as_str(),
        json!({"phase": "Running", "podIP": "10.1.2.3", "conditions": [{"type": "Ready", "status": "True"}]}),
    )
    .await;
    let running = state_becomes(InstanceState::Running).await;
    assert_eq!(running.state, InstanceState::Running);
    assert_eq!(running.ip.map(|ip| ip.to_string()).as_deref(), Some("10.1.2.3"));
    mark(&pods, req.name.as_str(), json!({"phase": "Failed"})).await;
    state_becomes(InstanceState::Stopped).await;

    // Only labelled pods are the operator's.
    let foreign: Pod = serde_json::from_value(
        json!({"metadata": {"name": "someone-elses"}, "spec": {"containers": [{"name": "x", "image": "x"}]}}),
    )
    .unwrap();
    pods.create(&PostParams::default(), &foreign).await.unwrap();
    let listed = provider.list_by_tag().await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].id, id);

    // Released: no longer listed as managed by any installation, still there.
    let kept = request("uid-2", 3128);
    let kept_id = provider.create(&kept).await.unwrap();
    provider.release(&kept_id).await.unwrap();
    let labels = pods
        .get(kept.name.as_str())
        .await
        .unwrap()
        .metadata
        .labels
        .unwrap();
    assert!(!labels.contains_key("crawl.example.com/managed"), "{labels:?}");
    assert_eq!(labels["crawl.example.com/released"], "true");
    assert!(provider.get(&kept_id).await.unwrap().owner.released);
    assert_eq!(provider.list_by_tag().await.unwrap().len(), 1, "only uid-1's pod");
    provider
        .release(&ProviderId("namespaces/crawl/pods/gone".into()))
        .await
        .unwrap();

    provider.delete(&id).await.unwrap();
    provider.delete(&id).await.unwrap();
    // Gone once the watch has delivered the deletion (a pod the cache does
    // not hold is confirmed with the API server).
    support::eventually("the deleted pod NotFound", Duration::from_secs(10), async || {
        provider
            .get(&id)
            .await
            .err()
            .filter(|e| e.class == ErrorClass::NotFound)
    })
    .await;
    let err = provider
        .get(&ProviderId("zones/a/instances/b".into()))
        .await
        .unwrap_err();
    assert_eq!(err.class, ErrorClass::Permanent);
}

#[actix_rt::test]
async fn a_kubernetes_provider_proxy_runs_when_its_pod_runs() {
    let fake = FakeApiServer::start().unwrap();
    let dir = support::operator::OperatorDir::new("providers:\n  - {name: kubernetes, type: kubernetes}\n");
    // The "pod" serves on loopback: a built-in forward proxy run by the test.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(egress_proxies::adapters::forward_proxy::serve(
        listener,
        support::open_to_loopback(),
        None,
    ));
    let (target, _) =
        support::target_server::http_target_with(support::target_server::Behaviour::Status(204)).await;

    let operator = dir.kubernetes(&fake.kubeconfig("crawl")).start().await;
    let c = client(&fake);
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("crawl.example.com", "v1alpha1", "Proxy"),
        "proxies",
    );
    let proxies: Api<DynamicObject> = Api::namespaced_with(c.clone(), "crawl", &ar);
    let p: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "crawl.example.com/v1alpha1", "kind": "Proxy",
        "metadata": {"name": "pod-proxy", "namespace": "crawl"},
        "spec": {"mode": "Managed", "provider": "kubernetes", "port": port,
                 "healthCheck": {"url": format!("http://{target}/"), "interval": "1s"}}
    }))
    .unwrap();
    proxies.create(&PostParams::default(), &p).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(c.clone(), "crawl");
    let pod_name = operator
        .eventually("a pod", Duration::from_secs(30), async || {
            let list = pods.list(&Default::default()).await.unwrap();
            list.items.first()?.metadata.name.clone()
        })
        .await;
    // The pod is created before the status saying so is written: wait for it.
    operator
        .eventually("the Proxy Provisioning", Duration::from_secs(30), async || {
            let phase = proxies.get("pod-proxy").await.ok()?.data["status"]["phase"].clone();
            (phase == "Provisioning").then_some(())
        })
        .await;
    // The kubelet's part: the pod runs, ready, with an address (loopback here).
    mark(&pods, &pod_name, json!({"phase": "Running", "podIP": "127.0.0.1", "conditions": [{"type": "Ready", "status": "True"}]})).await;
    let status = operator
        .eventually("the proxy Ready", Duration::from_secs(30), async || {
            let status = proxies.get("pod-proxy").await.unwrap().data["status"].clone();
            if status["phase"] == "Ready" {
                Ok(status)
            } else {
                Err(status)
            }
        })
        .await;
    assert_eq!(status["endpoint"], format!("127.0.0.1:{port}"));
    // Probed (and reconciled) a while longer while Ready.
    tokio::time::sleep(Duration::from_secs(3)).await;
    drop(operator);
    let accesses = fake.accesses.lock().unwrap();
    // Each reconcile read the pod from the watch cache: not one GET.
    let gets: Vec<String> = accesses
        .iter()
        .filter(|a| a.resource == "pods" && a.verb == "get")
        .map(|a| format!("{a:?}"))
        .collect();
    assert_eq!(gets, Vec::<String>::new(), "reads of pods go to the watch cache");
    assert!(
        accesses.iter().any(|a| a.resource == "pods" && a.verb == "watch"),
        "the pods are watched"
    );
    support::rbac::assert_covered(&accesses);
}

/// Runs the pod's container as a container runtime would under the pod's
/// security settings — the root filesystem read-only, its `emptyDir` mounts
/// writable and empty, its Secret mounts read-only from `secrets` (volume
/// name → a directory holding the Secret's items), as the pod's user, every
/// capability dropped — with the host's Squid standing in for the image's.
fn run_like_the_kubelet(pod: &Pod, secrets: &[(&str, &std::path::Path)]) -> support::process::Killed {
    let spec = pod.spec.as_ref().unwrap();
    let user = spec.security_context.as_ref().unwrap();
    let container = &spec.containers[0];
    let mut bwrap = Command::new("bwrap");
    // A read-only root assembled from the host's (bwrap cannot make a mount
    // point inside a read-only bind): each top-level entry, and /etc entry by
    // entry so the pod's mount points can be made there; then remounted
    // read-only.
    let mirror = |bwrap: &mut Command, dir: &str, skip: &[&str]| {
        for entry in std::fs::read_dir(dir).unwrap().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if skip.contains(&name.as_str()) {
                continue;
            }
            let path = format!("{}/{name}", dir.trim_end_matches('/'));
            match std::fs::read_link(&path) {
                Ok(target) => bwrap.arg("--symlink").arg(target).arg(&path),
                Err(_) => bwrap.args(["--ro-bind", &path, &path]),
            };
        }
    };
    mirror(&mut bwrap, "/", &["proc", "dev", "tmp", "etc", "sys", "run"]);
    bwrap.args(["--dir", "/etc"]);
    mirror(&mut bwrap, "/etc", &[]);
    bwrap.args(["--dev", "/dev", "--proc", "/proc"]);
    for mount in container.volume_mounts.iter().flatten() {
        match secrets.iter().find(|(name, _)| *name == mount.name) {
            Some((_, dir)) => bwrap.arg("--ro-bind").arg(dir).arg(&mount.mount_path),
            None => bwrap.args(["--tmpfs", &mount.mount_path]),
        };
    }
    bwrap.args(["--remount-ro", "/"]);
    bwrap
        .args([
            "--unshare-user",
            "--unshare-pid",
            "--cap-drop",
            "ALL",
            "--die-with-parent",
            "--clearenv",
        ])
        .args(["--uid", &user.run_as_user.unwrap().to_string()])
        .args(["--gid", &user.run_as_group.unwrap().to_string()])
        .args(["--setenv", "PATH", "/usr/sbin:/usr/bin:/sbin:/bin"]);
    for var in container.env.iter().flatten() {
        bwrap.args(["--setenv", &var.name, var.value.as_deref().unwrap_or_default()]);
    }
    bwrap
        .arg("--")
        .args(container.command.iter().flatten())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    support::process::Killed(bwrap.spawn().unwrap())
}

#[actix_rt::test]
async fn the_squid_pod_meets_the_restricted_profile_and_serves_read_only_as_non_root() {
    let fake = FakeApiServer::start().unwrap();
    let c = client(&fake);
    // Its fetches go to this machine's loopback: allowed for this test.
    let config = KubernetesConfig {
        destinations: support::loopback_rules(),
        ..KubernetesConfig::default()
    };
    let provider = KubernetesProvider::new("kubernetes", config, c.clone());
    let port = support::process::free_port();
    let credentials = egress_proxies::domain::credentials::ProxyCredentials::generate(
        &egress_proxies::adapters::random::SystemRandom,
    )
    .unwrap();
    let req = CreateRequest {
        credentials: Some(credentials.clone()),
        ..request("uid-hardened", port)
    };
    provider.create(&req).await.unwrap();
    // What the API server received.
    let pod = Api::<Pod>::namespaced(c, "crawl")
        .get(req.name.as_str())
        .await
        .unwrap();
    let violations = support::pod_security::restricted_violations(&pod);
    assert!(violations.is_empty(), "{violations:?}");
    // The check can fail: the same pod with root and its capabilities.
    let mut loose = pod.clone();
    let spec = loose.spec.as_mut().unwrap();
    spec.security_context = None;
    spec.containers[0].security_context = None;
    let violations = support::pod_security::restricted_violations(&loose);
    assert_eq!(violations.len(), 4, "{violations:?}");

    if Command::new("bwrap").arg("--version").output().is_err() || support::squid::binary().is_none() {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must have bubblewrap and squid installed"
        );
        eprintln!("skipping the run under the pod's restrictions: bwrap or squid missing");
        return;
    }
    let (target, _) =
        support::target_server::http_target_with(support::target_server::Behaviour::Status(204)).await;
    // The credentials Secret's passwd line, where the kubelet would mount it.
    let secret = tempfile::tempdir().unwrap();
    std::fs::write(
        secret.path().join("passwd"),
        egress_proxies::adapters::random::htpasswd_line(&credentials).unwrap() + "\n",
    )
    .unwrap();
    let _squid = run_like_the_kubelet(&pod, &[("auth", secret.path())]);
    let proxy: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    support::eventually(
        "Squid to listen under the pod's restrictions",
        Duration::from_secs(20),
        async || tokio::net::TcpStream::connect(proxy).await,
    )
    .await;
    let fetch = async |authorization: Option<String>| {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(proxy).await.unwrap();
        let auth = authorization
            .map(|a| format!("Proxy-Authorization: {a}\r\n"))
            .unwrap_or_default();
        s.write_all(
            format!("GET http://{target}/ HTTP/1.1\r\nHost: {target}\r\n{auth}Connection: close\r\n\r\n")
                .as_bytes(),
        )
        .await
        .unwrap();
        let mut out = String::new();
        let _ = s.read_to_string(&mut out).await;
        out.lines().next().unwrap_or_default().to_owned()
    };
    let refused = fetch(None).await;
    assert!(refused.starts_with("HTTP/1.1 407"), "{refused}");
    let status = fetch(Some(credentials.basic_authorization())).await;
    assert!(status.starts_with("HTTP/1.1 204"), "{status}");
}
