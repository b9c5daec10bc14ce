//! Several installations side by side never touch each other's instances:
//! two operator processes against one fake API server, scoped to different
//! namespaces (sharing one installation id from the cluster); and two
//! standalone operators with state directories of their own.

mod support;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use fake_apiserver::FakeApiServer;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, DynamicObject, ListParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::json;
use support::process::{InstanceReaper, Killed, free_port, health_target, standalone};

const BIN: &str = env!("CARGO_BIN_EXE_egress-proxies-operator");
const WAIT: Duration = Duration::from_secs(30);

fn free_addr() -> String {
    format!("127.0.0.1:{}", free_port())
}

/// One operator in Kubernetes mode watching `namespace` only, sweeping every 200 ms with no grace.
fn operator(dir: &Path, namespace: &str) -> Killed {
    let log = std::fs::File::create(dir.join(format!("{namespace}.log"))).unwrap();
    Killed(
        Command::new(BIN)
            .arg("run")
            .arg("--providers-config")
            .arg(dir.join("providers.yaml"))
            .arg("--state-dir")
            .arg(dir.join(format!("state-{namespace}")))
            .args(["--metrics-bind-address", "0", "--discovery-bind-address", "0"])
            .args(["--health-probe-bind-address", &free_addr()])
            .args(["--proxy-namespace", namespace])
            .args([
                "--gc-interval",
                "200ms",
                "--gc-grace-period",
                "0s",
                "--log-format",
                "text",
            ])
            .env("KUBECONFIG", dir.join("kubeconfig"))
            .env_remove("POD_NAME")
            .env_remove("POD_NAMESPACE")
            .env_remove("INSTALLATION_ID")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap(),
    )
}

fn logs(dir: &Path) -> String {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "log"))
        .map(|e| std::fs::read_to_string(e.path()).unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n---\n")
}

async fn pod_names(client: &kube::Client, namespace: &str) -> Vec<String> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let mut names: Vec<String> = pods
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .collect();
    names.sort();
    names
}

/// A pod tagged managed, as an operator (or a person) might have left it.
async fn plant(client: &kube::Client, namespace: &str, name: &str, labels: &[(&str, &str)]) {
    let labels: BTreeMap<String, String> = labels
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {"containers": [{"name": "squid", "image": "squid"}]}
    }))
    .unwrap();
    Api::<Pod>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();
}

#[actix_rt::test]
async fn operators_scoped_to_different_namespaces_never_reap_each_others_pods() {
    let fake = FakeApiServer::start().unwrap();
    let root = tempfile::tempdir().unwrap();
    let dir = root.path();
    std::fs::write(dir.join("kubeconfig"), fake.kubeconfig("operators")).unwrap();
    std::fs::write(
        dir.join("providers.yaml"),
        "providers:\n  - {name: kubernetes, type: kubernetes}\n",
    )
    .unwrap();
    let client = kube::Client::try_from(kube::Config::new(fake.url().parse().unwrap())).unwrap();
    let _a = operator(dir, "team-a");
    let _b = operator(dir, "team-b");

    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("crawl.example.com", "v1alpha1", "Proxy"),
        "proxies",
    );
    for namespace in ["team-a", "team-b"] {
        let proxy: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "crawl.example.com/v1alpha1", "kind": "Proxy",
            "metadata": {"name": "crawler", "namespace": namespace},
            "spec": {"mode": "Managed", "provider": "kubernetes"}
        }))
        .unwrap();
        Api::<DynamicObject>::namespaced_with(client.clone(), namespace, &ar)
            .create(&PostParams::default(), &proxy)
            .await
            .unwrap();
    }
    let deadline = Instant::now() + WAIT;
    let (a_pods, b_pods) = loop {
        let (a, b) = (
            pod_names(&client, "team-a").await,
            pod_names(&client, "team-b").await,
        );
        if a.len() == 1 && b.len() == 1 {
            break (a, b);
        }
        assert!(Instant::now() < deadline, "pods never made\n{}", logs(dir));
        tokio::time::sleep(Duration::from_millis(100)).await;
    };

    // Both replicas share the installation kept in the cluster.
    let kept = Api::<ConfigMap>::namespaced(client.clone(), "operators")
        .get("egress-proxies-installation")
        .await
        .unwrap();
    let installation = kept.data.unwrap()["id"].clone();
    for namespace in ["team-a", "team-b"] {
        let pod = Api::<Pod>::namespaced(client.clone(), namespace)
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .remove(0);
        assert_eq!(
            pod.metadata.labels.unwrap()["crawl.example.com/installation"],
            installation
        );
    }

    // In team-a: a true orphan of this installation, one of another
    // installation, and one an earlier version made (no installation tag).
    let managed = ("crawl.example.com/managed", "true");
    let ours = ("crawl.example.com/installation", installation.as_str());
    plant(
        &client,
        "team-a",
        "proxy-orphan",
        &[managed, ("crawl.example.com/uid", "gone-1"), ours],
    )
    .await;
    plant(
        &client,
        "team-a",
        "proxy-theirs",
        &[
            managed,
            ("crawl.example.com/uid", "gone-2"),
            ("crawl.example.com/installation", "iother"),
        ],
    )
    .await;
    plant(
        &client,
        "team-a",
        "proxy-untagged",
        &[managed, ("crawl.example.com/uid", "gone-3")],
    )
    .await;

    let deadline = Instant::now() + WAIT;
    while pod_names(&client, "team-a")
        .await
        .contains(&"proxy-orphan".to_owned())
    {
        assert!(
            Instant::now() < deadline,
            "the orphan was never reaped\n{}",
            logs(dir)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Many more sweeps of both operators (every 200 ms, no grace).
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut expect_a = [
        a_pods.clone(),
        vec!["proxy-theirs".into(), "proxy-untagged".into()],
    ]
    .concat();
    expect_a.sort();
    assert_eq!(pod_names(&client, "team-a").await, expect_a, "{}", logs(dir));
    assert_eq!(pod_names(&client, "team-b").await, b_pods, "{}", logs(dir));
    let all = logs(dir);
    assert!(
        all.contains("without an installation tag"),
        "the untagged pod is reported\n{all}"
    );
    for namespace in ["team-a", "team-b"] {
        let log = std::fs::read_to_string(dir.join(format!("{namespace}.log"))).unwrap();
        assert_eq!(
            log.matches("pods/proxy-untagged").count(),
            1,
            "each operator reports it once, not every sweep\n{log}"
        );
    }
}

/// A standalone operator over `dir` (its own state), sweeping every 200 ms with no grace.
fn standalone_bed(dir: &Path, health: &str) {
    std::fs::create_dir_all(dir.join("proxies")).unwrap();
    std::fs::write(
        dir.join("providers.yaml"),
        "providers:\n  - {name: local, type: local, local: {implementation: builtin, destinations: {allow: [127.0.0.0/8]}}}\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("standalone.yaml"),
        "providersConfig: providers.yaml\nmanifests: proxies\nstateDir: state\n\
         healthProbeBindAddress: \"0\"\ndiscoveryBindAddress: \"0\"\nmanifestPollInterval: 100ms\n\
         gcInterval: 200ms\ngcGracePeriod: 0s\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("proxies/p.yaml"),
        format!(
            "apiVersion: crawl.example.com/v1alpha1\nkind: Proxy\nmetadata: {{name: p, namespace: crawl}}\n\
             spec: {{mode: Managed, provider: local, healthCheck: {{url: \"{health}\", interval: 1s}}}}\n"
        ),
    )
    .unwrap();
}

fn instances(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir.join("state/local/local/instances"))
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| !n.starts_with('.'))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

#[tokio::test]
async fn standalone_operators_with_their_own_state_keep_to_their_own_instances() {
    let root = tempfile::tempdir().unwrap();
    let (one, two) = (root.path().join("one"), root.path().join("two"));
    let _reapers = (
        InstanceReaper(one.join("state")),
        InstanceReaper(two.join("state")),
    );
    let health = health_target();
    standalone_bed(&one, &health);
    standalone_bed(&two, &health);
    let _first = standalone(BIN, &one);
    let _second = standalone(BIN, &two);
    let deadline = Instant::now() + WAIT;
    while instances(&one).len() != 1 || instances(&two).len() != 1 {
        assert!(Instant::now() < deadline, "instances never made");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (first_instances, second_instances) = (instances(&one), instances(&two));
    let pid = |dir: &Path, names: &[String]| {
        support::process::instance_pid(&dir.join("state/local/local/instances").join(&names[0]))
    };
    let (pid_one, pid_two) = (pid(&one, &first_instances), pid(&two, &second_instances));

    // Each keeps its id in its own state database: two installations.
    let id_of = |dir: &Path| {
        let record: serde_json::Value = serde_json::from_slice(
            &std::fs::read(
                dir.join("state/local/local/instances")
                    .join(&instances(dir)[0])
                    .join("instance.json"),
            )
            .unwrap(),
        )
        .unwrap();
        record["installation"].as_str().unwrap().to_owned()
    };
    assert_ne!(id_of(&one), id_of(&two));

    // Many sweeps of both: each instance stays, with the same process.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(instances(&one), first_instances);
    assert_eq!(instances(&two), second_instances);
    assert_eq!(pid(&one, &first_instances), pid_one, "never replaced");
    assert_eq!(pid(&two, &second_instances), pid_two, "never replaced");
}
