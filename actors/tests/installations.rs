//! Several installations side by side never touch each other's instances:
//! two operator processes against one fake API server, scoped to different
//! namespaces (sharing one installation id from the cluster); and two
//! standalone operators with state directories of their own.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use fake_apiserver::FakeApiServer;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, DynamicObject, ListParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::json;
use support::eventually_explained;
use support::operator::{LOCAL_PROVIDER, OperatorDir, OperatorProcess};
use support::process::health_target;

const WAIT: Duration = Duration::from_secs(30);

/// One operator in Kubernetes mode watching `namespace` only (its log
/// `<namespace>.log`, its state `state-<namespace>`), sweeping every 200 ms
/// with no grace.
async fn operator(dir: &OperatorDir, fake: &FakeApiServer, namespace: &str) -> OperatorProcess {
    dir.kubernetes(&fake.kubeconfig("operators"))
        .name(namespace)
        .state(&format!("state-{namespace}"))
        .args(["--proxy-namespace", namespace])
        .args(["--gc-interval", "200ms", "--gc-grace-period", "0s"])
        .start()
        .await
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
    let dir = OperatorDir::new("providers:\n  - {name: kubernetes, type: kubernetes}\n");
    let client = kube::Client::try_from(kube::Config::new(fake.url().parse().unwrap())).unwrap();
    let _a = operator(&dir, &fake, "team-a").await;
    let _b = operator(&dir, &fake, "team-b").await;

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
    let (a_pods, b_pods) = eventually_explained(
        "a pod in each namespace",
        WAIT,
        || dir.logs(),
        async || {
            let (a, b) = (
                pod_names(&client, "team-a").await,
                pod_names(&client, "team-b").await,
            );
            if a.len() == 1 && b.len() == 1 {
                Ok((a, b))
            } else {
                Err(format!("{a:?} {b:?}"))
            }
        },
    )
    .await;

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

    eventually_explained(
        "the orphan to be reaped",
        WAIT,
        || dir.logs(),
        async || {
            let names = pod_names(&client, "team-a").await;
            if names.contains(&"proxy-orphan".to_owned()) {
                Err(format!("{names:?}"))
            } else {
                Ok(())
            }
        },
    )
    .await;
    // A window in which nothing more may be reaped: many more sweeps of
    // both operators (every 200 ms, no grace).
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut expect_a = [
        a_pods.clone(),
        vec!["proxy-theirs".into(), "proxy-untagged".into()],
    ]
    .concat();
    expect_a.sort();
    assert_eq!(pod_names(&client, "team-a").await, expect_a, "{}", dir.logs());
    assert_eq!(pod_names(&client, "team-b").await, b_pods, "{}", dir.logs());
    let all = dir.logs();
    assert!(
        all.contains("without an installation tag"),
        "the untagged pod is reported\n{all}"
    );
    for namespace in ["team-a", "team-b"] {
        let log = std::fs::read_to_string(dir.path().join(format!("{namespace}.log"))).unwrap();
        assert_eq!(
            log.matches("pods/proxy-untagged").count(),
            1,
            "each operator reports it once, not every sweep\n{log}"
        );
    }
}

/// A standalone operator's directory (its own state) with one Proxy.
fn standalone_bed(health: &str) -> OperatorDir {
    let dir = OperatorDir::new(LOCAL_PROVIDER);
    dir.write_manifest(
        "p",
        &format!(
            "apiVersion: crawl.example.com/v1alpha1\nkind: Proxy\nmetadata: {{name: p, namespace: crawl}}\n\
             spec: {{mode: Managed, provider: local, healthCheck: {{url: \"{health}\", interval: 1s}}}}\n"
        ),
    );
    dir
}

/// The operator on `dir`, sweeping every 200 ms with no grace.
async fn sweeping(dir: &OperatorDir) -> OperatorProcess {
    dir.standalone()
        .setting("gcInterval", "200ms")
        .setting("gcGracePeriod", "0s")
        .start()
        .await
}

#[tokio::test]
async fn standalone_operators_with_their_own_state_keep_to_their_own_instances() {
    let health = health_target();
    let (one, two) = (standalone_bed(&health), standalone_bed(&health));
    let _first = sweeping(&one).await;
    let _second = sweeping(&two).await;
    let pid = |dir: &OperatorDir, names: &[String]| {
        support::process::instance_pid(&dir.state().join("local/local/instances").join(names.first()?))
    };
    // An instance each, its process started and recorded (the directory
    // appears a moment before the record).
    eventually_explained(
        "an instance each, running",
        WAIT,
        || format!("{}\n{}", one.logs(), two.logs()),
        async || {
            let (a, b) = (one.local_instances(), two.local_instances());
            (a.len() == 1 && b.len() == 1 && pid(&one, &a).is_some() && pid(&two, &b).is_some()).then_some(())
        },
    )
    .await;
    let (first_instances, second_instances) = (one.local_instances(), two.local_instances());
    let (pid_one, pid_two) = (pid(&one, &first_instances), pid(&two, &second_instances));

    // Each keeps its id in its own state database: two installations.
    let id_of = |dir: &OperatorDir| {
        let record: serde_json::Value = serde_json::from_slice(
            &std::fs::read(
                dir.state()
                    .join("local/local/instances")
                    .join(&dir.local_instances()[0])
                    .join("instance.json"),
            )
            .unwrap(),
        )
        .unwrap();
        record["installation"].as_str().unwrap().to_owned()
    };
    assert_ne!(id_of(&one), id_of(&two));

    // A window in which nothing may change: many sweeps of both; each
    // instance stays, with the same process.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(one.local_instances(), first_instances);
    assert_eq!(two.local_instances(), second_instances);
    assert_eq!(pid(&one, &first_instances), pid_one, "never replaced");
    assert_eq!(pid(&two, &second_instances), pid_two, "never replaced");
}
