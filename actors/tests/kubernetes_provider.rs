//! The kubernetes provider against the fake API server, and a whole
//! operator whose Proxy goes Running when its pod runs.

mod support;

use std::process::Command;
use std::time::{Duration, Instant};

use egress_proxies::config::KubernetesConfig;
use egress_proxies::provider::kubernetes::KubernetesProvider;
use egress_proxies::provider::{
    CreateRequest, ErrorClass, InstanceState, Provider, ProviderId, instance_name,
};
use egress_proxies::resource::Placement;
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

#[actix_rt::test]
async fn pods_are_created_mapped_listed_and_deleted() {
    let fake = FakeApiServer::start().unwrap();
    let c = client(&fake);
    let provider = KubernetesProvider::new("cluster", KubernetesConfig::default(), c.clone());
    let credentials = egress_proxies::credentials::ProxyCredentials::generate().unwrap();
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
    let spec = pod.spec.as_ref().unwrap();
    let volume = &spec.volumes.as_ref().unwrap()[0];
    let secret = volume.secret.as_ref().unwrap();
    assert_eq!(
        secret.secret_name.as_deref(),
        Some(format!("{}-credentials", req.name).as_str())
    );
    assert_eq!(secret.items.as_ref().unwrap()[0].key, "htpasswd");
    let mount = &container.volume_mounts.as_ref().unwrap()[0];
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
        egress_proxies::provider::Ownership {
            uid: Some("uid-1".into()),
            namespace: Some("crawl".into()),
            installation: Some(support::INSTALLATION.into()),
            released: false,
        }
    );
    assert!(i.created_at.is_some());
    mark(&pods, req.name.as_str(), json!({"phase": "Running", "podIP": "10.1.2.3", "conditions": [{"type": "Ready", "status": "False"}]})).await;
    assert_eq!(
        provider.get(&id).await.unwrap().state,
        InstanceState::Provisioning,
        "running but not ready"
    );
    mark(
        &pods,
        req.name.as_str(),
        json!({"phase": "Running", "podIP": "10.1.2.3", "conditions": [{"type": "Ready", "status": "True"}]}),
    )
    .await;
    let running = provider.get(&id).await.unwrap();
    assert_eq!(running.state, InstanceState::Running);
    assert_eq!(running.ip.map(|ip| ip.to_string()).as_deref(), Some("10.1.2.3"));
    mark(&pods, req.name.as_str(), json!({"phase": "Failed"})).await;
    assert_eq!(provider.get(&id).await.unwrap().state, InstanceState::Stopped);

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
    assert_eq!(provider.get(&id).await.unwrap_err().class, ErrorClass::NotFound);
    let err = provider
        .get(&ProviderId("zones/a/instances/b".into()))
        .await
        .unwrap_err();
    assert_eq!(err.class, ErrorClass::Permanent);
}

#[actix_rt::test]
async fn a_kubernetes_provider_proxy_runs_when_its_pod_runs() {
    let fake = FakeApiServer::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("kubeconfig"), fake.kubeconfig("crawl")).unwrap();
    std::fs::write(
        dir.path().join("providers.yaml"),
        "providers:\n  - {name: cluster, type: kubernetes}\n",
    )
    .unwrap();
    // The "pod" serves on loopback: a built-in forward proxy run by the test.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(egress_proxies::forward_proxy::serve(listener, None));
    let (target, _) =
        support::target_server::http_target_with(support::target_server::Behaviour::Status(204)).await;

    let log = std::fs::File::create(dir.path().join("operator.log")).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_egress-proxies-operator"))
        .arg("run")
        .arg("--providers-config")
        .arg(dir.path().join("providers.yaml"))
        .args([
            "--metrics-bind-address",
            "0",
            "--discovery-bind-address",
            "0",
            "--health-probe-bind-address",
            "0",
        ])
        .env("KUBECONFIG", dir.path().join("kubeconfig"))
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    let c = client(&fake);
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("crawl.example.com", "v1alpha1", "Proxy"),
        "proxies",
    );
    let proxies: Api<DynamicObject> = Api::namespaced_with(c.clone(), "crawl", &ar);
    let p: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "crawl.example.com/v1alpha1", "kind": "Proxy",
        "metadata": {"name": "pod-proxy", "namespace": "crawl"},
        "spec": {"mode": "Managed", "provider": "cluster", "port": port,
                 "healthCheck": {"url": format!("http://{target}/"), "interval": "200ms"}}
    }))
    .unwrap();
    proxies.create(&PostParams::default(), &p).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(c.clone(), "crawl");
    let deadline = Instant::now() + Duration::from_secs(30);
    let pod_name = loop {
        let list = pods.list(&Default::default()).await.unwrap();
        if let Some(pod) = list.items.first() {
            break pod.metadata.name.clone().unwrap();
        }
        assert!(Instant::now() < deadline, "no pod was created");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(
        proxies.get("pod-proxy").await.unwrap().data["status"]["phase"],
        "Provisioning"
    );
    // The kubelet's part: the pod runs, ready, with an address (loopback here).
    mark(&pods, &pod_name, json!({"phase": "Running", "podIP": "127.0.0.1", "conditions": [{"type": "Ready", "status": "True"}]})).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let status = proxies.get("pod-proxy").await.unwrap().data["status"].clone();
        if status["phase"] == "Ready" {
            assert_eq!(status["endpoint"], format!("127.0.0.1:{port}"));
            break;
        }
        assert!(Instant::now() < deadline, "proxy never became Ready: {status}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = child.kill();
    let _ = child.wait();
    support::rbac::assert_covered(&fake.accesses.lock().unwrap());
}
