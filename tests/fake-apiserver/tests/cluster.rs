//! A cluster's rules ([`FakeApiServer::start_cluster`]) and what kubectl
//! reads before it writes: discovery, OpenAPI v3, namespaces that must
//! exist, custom kinds served only while their CRD exists. The last test
//! drives the real kubectl through `kubectl apply -k`.

use std::path::Path;
use std::time::Duration;

use fake_apiserver::{FakeApiServer, KINDS};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// One HTTP/1.1 request; the status code and the JSON body.
async fn call(fake: &FakeApiServer, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    let mut stream = tokio::net::TcpStream::connect(fake.addr).await.unwrap();
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let content_type = if method == "PATCH" {
        "application/merge-patch+json"
    } else {
        "application/json"
    };
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: fake\r\nConnection: close\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await.unwrap();
    let answer = String::from_utf8(answer).unwrap();
    let code = answer[9..12].parse().unwrap();
    let (_, body) = answer.split_once("\r\n\r\n").unwrap();
    (code, serde_json::from_str(body).unwrap_or(Value::Null))
}

fn crd() -> Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "proxies.crawl.example.com"},
        "spec": {"group": "crawl.example.com", "scope": "Namespaced",
                 "names": {"plural": "proxies", "singular": "proxy", "kind": "Proxy", "shortNames": ["px"]},
                 "versions": [{"name": "v1alpha1", "served": true, "storage": true}]}
    })
}

fn proxy(name: &str) -> Value {
    json!({"apiVersion": "crawl.example.com/v1alpha1", "kind": "Proxy", "metadata": {"name": name}, "spec": {"mode": "External"}})
}

const PROXIES: &str = "/apis/crawl.example.com/v1alpha1/namespaces/default/proxies";
const CRDS: &str = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions";

#[actix_rt::test]
async fn discovery_and_openapi_describe_what_is_served() {
    let fake = FakeApiServer::start_cluster().unwrap();
    let (code, version) = call(&fake, "GET", "/version", None).await;
    assert_eq!((code, version["major"].as_str()), (200, Some("1")));
    let (_, api) = call(&fake, "GET", "/api", None).await;
    assert_eq!(api["versions"], json!(["v1"]));
    let (_, core) = call(&fake, "GET", "/api/v1", None).await;
    let names: Vec<&str> = core["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    for want in [
        "namespaces",
        "namespaces/status",
        "secrets",
        "configmaps",
        "services",
        "serviceaccounts",
        "pods",
    ] {
        assert!(names.contains(&want), "{want} in {names:?}");
    }
    let deployments = call(&fake, "GET", "/apis/apps/v1", None).await.1["resources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "deployments")
        .cloned()
        .unwrap();
    assert_eq!(
        (
            deployments["namespaced"].clone(),
            deployments["shortNames"].clone()
        ),
        (json!(true), json!(["deploy"]))
    );
    let (_, groups) = call(&fake, "GET", "/apis", None).await;
    let group_names: Vec<&str> = groups["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["name"].as_str().unwrap())
        .collect();
    for want in [
        "apps",
        "rbac.authorization.k8s.io",
        "networking.k8s.io",
        "apiextensions.k8s.io",
    ] {
        assert!(group_names.contains(&want), "{want} in {group_names:?}");
    }
    assert!(
        !group_names.contains(&"crawl.example.com"),
        "no CRD yet: {group_names:?}"
    );

    // OpenAPI v3: an index of group versions, each with the PATCH of every
    // kind and its fieldValidation parameter (what kubectl's validation asks).
    let (_, index) = call(&fake, "GET", "/openapi/v3", None).await;
    let url = index["paths"]["apis/apps/v1"]["serverRelativeURL"]
        .as_str()
        .unwrap()
        .to_owned();
    let (code, doc) = call(&fake, "GET", &url, None).await;
    assert_eq!(code, 200);
    let patch = &doc["paths"]["/apis/apps/v1/namespaces/{namespace}/deployments/{name}"]["patch"];
    assert_eq!(
        patch["x-kubernetes-group-version-kind"],
        json!({"group": "apps", "version": "v1", "kind": "Deployment"})
    );
    assert!(
        patch["parameters"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["name"] == "fieldValidation" && p["in"] == "query")
    );
    let apps_paths = doc["paths"].as_object().unwrap();
    assert!(
        apps_paths.keys().all(|k| k.contains("{namespace}")),
        "apps kinds are namespaced: {apps_paths:?}"
    );
    let (_, rbac) = call(
        &fake,
        "GET",
        "/openapi/v3/apis/rbac.authorization.k8s.io/v1",
        None,
    )
    .await;
    assert!(rbac["paths"]["/apis/rbac.authorization.k8s.io/v1/clusterroles/{name}"]["patch"].is_object());
    assert_eq!(
        call(&fake, "GET", "/openapi/v3/apis/crawl.example.com/v1alpha1", None)
            .await
            .0,
        404
    );
}

#[actix_rt::test]
async fn custom_kinds_are_served_only_while_their_crd_exists() {
    let fake = FakeApiServer::start_cluster().unwrap();
    let (code, status) = call(&fake, "POST", PROXIES, Some(proxy("a"))).await;
    assert_eq!((code, status["reason"].as_str()), (404, Some("NotFound")));
    assert_eq!(
        call(&fake, "GET", "/apis/crawl.example.com/v1alpha1", None)
            .await
            .0,
        404
    );

    let (code, stored) = call(&fake, "POST", CRDS, Some(crd())).await;
    assert_eq!(code, 201);
    let conditions = stored["status"]["conditions"].as_array().unwrap();
    assert!(
        conditions
            .iter()
            .any(|c| c["type"] == "Established" && c["status"] == "True"),
        "{conditions:?}"
    );
    assert_eq!(stored["status"]["acceptedNames"]["kind"], "Proxy");
    let (_, resources) = call(&fake, "GET", "/apis/crawl.example.com/v1alpha1", None).await;
    let proxies = resources["resources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "proxies")
        .cloned()
        .unwrap();
    assert_eq!(proxies["shortNames"], json!(["px"]), "the CRD's short names");
    let (_, index) = call(&fake, "GET", "/openapi/v3", None).await;
    assert!(index["paths"]["apis/crawl.example.com/v1alpha1"].is_object());
    assert_eq!(call(&fake, "POST", PROXIES, Some(proxy("a"))).await.0, 201);

    // Deleting the CRD deletes its objects; the kind is no longer served.
    let (code, _) = call(
        &fake,
        "DELETE",
        &format!("{CRDS}/proxies.crawl.example.com"),
        None,
    )
    .await;
    assert_eq!(code, 200);
    assert_eq!(call(&fake, "GET", &format!("{PROXIES}/a"), None).await.0, 404);
    call(&fake, "POST", CRDS, Some(crd())).await;
    assert_eq!(
        call(&fake, "GET", &format!("{PROXIES}/a"), None).await.0,
        404,
        "gone with the CRD, not back with a new one"
    );
}

#[actix_rt::test]
async fn objects_live_only_in_namespaces_that_exist() {
    let fake = FakeApiServer::start_cluster().unwrap();
    let (_, default) = call(&fake, "GET", "/api/v1/namespaces/default", None).await;
    assert_eq!(
        default["metadata"]["labels"]["kubernetes.io/metadata.name"],
        "default"
    );
    assert_eq!(default["status"]["phase"], "Active");
    for ns in ["kube-system", "kube-public", "kube-node-lease"] {
        assert_eq!(
            call(&fake, "GET", &format!("/api/v1/namespaces/{ns}"), None)
                .await
                .0,
            200,
            "{ns}"
        );
    }

    let secret =
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}, "stringData": {"k": "v"}});
    let (code, status) = call(
        &fake,
        "POST",
        "/api/v1/namespaces/crawlers/secrets",
        Some(secret.clone()),
    )
    .await;
    assert_eq!(
        (code, status["message"].as_str()),
        (404, Some("namespaces \"crawlers\" not found"))
    );

    let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "crawlers"}});
    assert_eq!(call(&fake, "POST", "/api/v1/namespaces", Some(ns)).await.0, 201);
    assert_eq!(
        call(
            &fake,
            "POST",
            "/api/v1/namespaces/crawlers/secrets",
            Some(secret.clone())
        )
        .await
        .0,
        201
    );

    // An object with a finalizer holds its namespace in Terminating, where
    // nothing new may be created; removing the finalizer lets both go.
    let held = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "held", "finalizers": ["example.com/hold"]}});
    assert_eq!(
        call(
            &fake,
            "POST",
            "/api/v1/namespaces/crawlers/configmaps",
            Some(held)
        )
        .await
        .0,
        201
    );
    let (code, terminating) = call(&fake, "DELETE", "/api/v1/namespaces/crawlers", None).await;
    assert_eq!(
        (code, terminating["status"]["phase"].as_str()),
        (200, Some("Terminating"))
    );
    // The namespace controller empties it soon after, not at once (what
    // `kubectl delete -k` deletes after the namespace is still there).
    assert_eq!(
        call(&fake, "GET", "/api/v1/namespaces/crawlers/secrets/s", None)
            .await
            .0,
        200
    );
    let mut waited = 0;
    while call(&fake, "GET", "/api/v1/namespaces/crawlers/secrets/s", None)
        .await
        .0
        != 404
    {
        assert!(waited < 50, "the namespace's Secret is deleted within 5 s");
        waited += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (code, status) = call(&fake, "POST", "/api/v1/namespaces/crawlers/secrets", Some(secret)).await;
    assert_eq!((code, status["reason"].as_str()), (403, Some("Forbidden")));
    assert_eq!(
        call(&fake, "GET", "/api/v1/namespaces/crawlers", None).await.0,
        200
    );
    let release = json!({"metadata": {"finalizers": null}});
    assert_eq!(
        call(
            &fake,
            "PATCH",
            "/api/v1/namespaces/crawlers/configmaps/held",
            Some(release)
        )
        .await
        .0,
        200
    );
    assert_eq!(
        call(&fake, "GET", "/api/v1/namespaces/crawlers", None).await.0,
        404
    );
}

#[actix_rt::test]
async fn without_a_cluster_any_namespace_and_kind_is_served() {
    let fake = FakeApiServer::start().unwrap();
    assert_eq!(
        call(
            &fake,
            "POST",
            PROXIES.replace("default", "anywhere").as_str(),
            Some(proxy("a"))
        )
        .await
        .0,
        201
    );
    assert!(KINDS.iter().any(|k| k.custom));
}

/// The real kubectl: `EPO_KUBECTL` (tests/run.sh sets it), else the first
/// `kubectl` on `PATH`.
fn kubectl_path() -> std::path::PathBuf {
    if let Some(path) = std::env::var_os("EPO_KUBECTL") {
        return path.into();
    }
    std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .map(|dir| dir.join("kubectl"))
        .find(|candidate| candidate.is_file())
        .unwrap_or_default()
}

async fn kubectl(fake_kubeconfig: &Path, home: &Path, args: &[&str]) -> std::process::Output {
    let mut command = tokio::process::Command::new(kubectl_path());
    command
        .args(args)
        .env_clear()
        .env("KUBECONFIG", fake_kubeconfig)
        .env("HOME", home)
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("../.."));
    tokio::time::timeout(Duration::from_secs(60), command.output())
        .await
        .expect("kubectl finishes")
        .unwrap()
}

/// The real kubectl: `apply -k` creates (GET, then POST), a second apply
/// changes nothing, a namespace that contradicts `-n` is refused by kubectl,
/// one that does not exist by the server.
#[actix_rt::test]
async fn kubectl_applies_kustomizations() {
    assert!(
        kubectl_path().is_file(),
        "this test needs the real kubectl on PATH or in EPO_KUBECTL (tests/manifests.sh installs it)"
    );
    let fake = FakeApiServer::start_cluster().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, fake.kubeconfig("default")).unwrap();
    let run = async |args: &[&str]| {
        let out = kubectl(&kubeconfig, dir.path(), args).await;
        (
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    };

    let (ok, out) = run(&["apply", "-k", "deploy/crd"]).await;
    assert!(ok && out.contains("proxies.crawl.example.com created"), "{out}");
    let (ok, out) = run(&[
        "wait",
        "--for",
        "condition=established",
        "--timeout=10s",
        "crd/proxies.crawl.example.com",
    ])
    .await;
    assert!(ok, "{out}");
    let (ok, out) = run(&["apply", "-k", "deploy/crd"]).await;
    assert!(ok && out.contains("proxies.crawl.example.com unchanged"), "{out}");

    // The samples before the operator's namespace exists: the server refuses
    // the NetworkPolicy of that namespace.
    let (ok, out) = run(&["apply", "-k", "deploy/samples"]).await;
    assert!(
        !ok && out.contains("namespaces \"egress-proxies-system\" not found"),
        "{out}"
    );
    // A namespace on the command line that contradicts the objects' own.
    let (ok, out) = run(&["apply", "-n", "elsewhere", "-k", "deploy/samples"]).await;
    assert!(!ok && out.contains("does not match the namespace"), "{out}");

    let (ok, out) = run(&["apply", "-k", "deploy/default"]).await;
    assert!(
        ok && out.contains("deployment.apps/egress-proxies-operator created"),
        "{out}"
    );
    // What the refused apply created stays; the rest is created now.
    let (ok, out) = run(&["apply", "-k", "deploy/samples"]).await;
    assert!(
        ok && out.contains("proxy.crawl.example.com/kubernetes-1 unchanged")
            && out.contains("networkpolicy.networking.k8s.io/egress-proxies-operator-ingress created"),
        "{out}"
    );
    let (ok, out) = run(&["-n", "crawlers", "get", "px", "-o", "name"]).await;
    assert!(
        ok && out.contains("proxy.crawl.example.com/kubernetes-1"),
        "{out}"
    );
    let (ok, out) = run(&["apply", "-k", "deploy/default"]).await;
    assert!(
        ok && out.contains("deployment.apps/egress-proxies-operator unchanged"),
        "{out}"
    );

    // An upgrade: a new image tag and one more env var. kubectl sends a
    // strategic merge patch; the container keeps everything else.
    let (ok, rendered) = run(&["kustomize", "deploy/default"]).await;
    assert!(ok, "{rendered}");
    let upgraded = rendered
        .replace(
            "image: egress-proxies-operator:0.1.0",
            "image: egress-proxies-operator:9.9.9",
        )
        .replacen(
            "        env:\n",
            "        env:\n        - name: EXTRA\n          value: \"1\"\n",
            1,
        );
    assert!(
        upgraded.contains("9.9.9") && upgraded.contains("EXTRA"),
        "{upgraded}"
    );
    let file = dir.path().join("upgraded.yaml");
    std::fs::write(&file, upgraded).unwrap();
    let (ok, out) = run(&["apply", "-f", file.to_str().unwrap()]).await;
    assert!(
        ok && out.contains("deployment.apps/egress-proxies-operator configured"),
        "{out}"
    );
    let deployments = KINDS.iter().position(|k| k.plural == "deployments").unwrap();
    let stored = fake
        .state
        .lock()
        .unwrap()
        .get(deployments, "egress-proxies-system", "egress-proxies-operator")
        .unwrap();
    let container = &stored["spec"]["template"]["spec"]["containers"][0];
    assert!(
        container["image"].as_str().unwrap().ends_with(":9.9.9"),
        "{container}"
    );
    assert_eq!(container["args"][0], "run", "{container}");
    let env: Vec<&str> = container["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(env[..2], ["EXTRA", "DISCOVERY_TOKEN"], "{env:?}");
    assert!(
        !stored.to_string().contains("$setElementOrder"),
        "directives are not stored"
    );
}

/// kubectl's typed commands send protobuf: decoded for the kinds they write.
#[actix_rt::test]
async fn kubectl_creates_secrets_configmaps_and_namespaces() {
    let fake = FakeApiServer::start_cluster().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, fake.kubeconfig("default")).unwrap();
    let run = async |args: &[&str]| {
        let out = kubectl(&kubeconfig, dir.path(), args).await;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    };
    let (ok, out) = run(&[
        "-n",
        "proto",
        "create",
        "secret",
        "generic",
        "s",
        "--from-literal=token=abc",
    ])
    .await;
    assert!(!ok && out.contains("namespaces \"proto\" not found"), "{out}");
    let (ok, out) = run(&["create", "namespace", "proto"]).await;
    assert!(ok, "{out}");
    let (ok, out) = run(&[
        "-n",
        "proto",
        "create",
        "secret",
        "generic",
        "s",
        "--from-literal=token=abc",
        "--from-literal=other=x y",
    ])
    .await;
    assert!(ok, "{out}");
    let (ok, out) = run(&["-n", "proto", "create", "configmap", "c", "--from-literal=k=v"]).await;
    assert!(ok, "{out}");
    let secret = fake.state.lock().unwrap().get(
        KINDS.iter().position(|k| k.plural == "secrets").unwrap(),
        "proto",
        "s",
    );
    let secret = secret.unwrap();
    assert_eq!(secret["data"], json!({"token": "YWJj", "other": "eCB5"}));
    assert!(
        secret.get("type").is_none(),
        "unset, as kubectl sent it (defaulting is not modelled)"
    );
    let (ok, out) = run(&["-n", "proto", "get", "configmap", "c", "-o", "jsonpath={.data.k}"]).await;
    assert_eq!((ok, out.as_str()), (true, "v"));
    let (_, ns) = call(&fake, "GET", "/api/v1/namespaces/proto", None).await;
    assert_eq!(ns["metadata"]["labels"]["kubernetes.io/metadata.name"], "proto");
}
