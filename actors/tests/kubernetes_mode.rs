//! The whole operator process in Kubernetes mode against the fake API
//! server, through its unchanged kube::Client over real HTTP.

mod support;

use std::time::Duration;

use egress_proxies::adapters::stores::credentials_secret::credentials_secret_name;
use fake_apiserver::FakeApiServer;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};
use support::operator::{LOCAL_PROVIDER, OperatorBuilder, OperatorDir, OperatorProcess};
use support::{eventually, eventually_explained};

const WAIT: Duration = Duration::from_secs(30);

struct Bed {
    fake: FakeApiServer,
    dir: OperatorDir,
    client: kube::Client,
    target: String,
}

impl Bed {
    async fn new(providers: &str) -> Self {
        let fake = FakeApiServer::start().unwrap();
        let dir = OperatorDir::new(providers);
        let client = kube::Client::try_from(kube::Config::new(fake.url().parse().unwrap())).unwrap();
        let (target, _) =
            support::target_server::http_target_with(support::target_server::Behaviour::Status(204)).await;
        Self {
            fake,
            dir,
            client,
            target: format!("http://{target}/generate_204"),
        }
    }

    /// An operator against the fake, its log in `<name>.log`.
    fn operator(&self, name: &str) -> OperatorBuilder {
        self.dir.kubernetes(&self.fake.kubeconfig("crawl")).name(name)
    }

    async fn start(&self, extra: &[&str], name: &str) -> OperatorProcess {
        self.operator(name).args(extra).start().await
    }

    fn proxies(&self) -> Api<DynamicObject> {
        let ar = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("crawl.example.com", "v1alpha1", "Proxy"),
            "proxies",
        );
        Api::namespaced_with(self.client.clone(), "crawl", &ar)
    }

    async fn apply(&self, name: &str, spec: Value, annotations: Value) {
        let obj: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "crawl.example.com/v1alpha1", "kind": "Proxy",
            "metadata": {"name": name, "namespace": "crawl", "annotations": annotations}, "spec": spec
        }))
        .unwrap();
        self.proxies().create(&PostParams::default(), &obj).await.unwrap();
    }

    async fn until<T>(
        &self,
        what: &str,
        mut check: impl AsyncFnMut(Option<DynamicObject>) -> Option<T>,
        name: &str,
    ) -> T {
        eventually_explained(
            &format!("{what} of {name}"),
            WAIT,
            || self.dir.logs(),
            async || {
                let obj = self.proxies().get_opt(name).await.unwrap();
                let data = obj.as_ref().map(|o| o.data.to_string());
                check(obj)
                    .await
                    .ok_or_else(|| data.unwrap_or_else(|| "no such Proxy".into()))
            },
        )
        .await
    }

    async fn phase(&self, name: &str, phase: &str) -> DynamicObject {
        self.until(
            &format!("phase {phase}"),
            async |o| o.filter(|o| o.data["status"]["phase"] == phase),
            name,
        )
        .await
    }

    fn instances(&self) -> Vec<String> {
        self.dir.local_instances()
    }
}

fn managed(target: &str) -> Value {
    json!({"mode": "Managed", "provider": "local", "healthCheck": {"url": target, "interval": "1s"}})
}

fn hash(o: &DynamicObject) -> String {
    o.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get("crawl.example.com/spec-hash"))
        .cloned()
        .unwrap_or_default()
}

#[actix_rt::test]
async fn the_operator_runs_every_path_against_the_api_server() {
    let bed = Bed::new(LOCAL_PROVIDER).await;
    let _op = bed
        .start(
            &[
                "--gc-interval",
                "1s",
                "--gc-grace-period",
                "30s",
                // The External proxy below is this test's own, on IPv4 loopback.
                "--allow-external-endpoint-networks",
                "127.0.0.0/8",
            ],
            "operator",
        )
        .await;

    // An External proxy: the built-in forward proxy of this test, demanding
    // the credentials of a Secret the Proxy names; probed through with them.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let ext_port = listener.local_addr().unwrap().port();
    let vendor =
        egress_proxies::domain::credentials::ProxyCredentials::new("vendor", "vendor-s3cret").unwrap();
    tokio::spawn(egress_proxies::adapters::forward_proxy::serve(
        listener,
        support::open_to_loopback(),
        Some(egress_proxies::domain::credentials::BasicAuthorization::of(
            &vendor,
        )),
    ));
    let vendor_secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "vendor-proxy", "namespace": "crawl"},
        "stringData": {"user": "vendor", "password": "vendor-s3cret"}
    }))
    .unwrap();
    Api::<Secret>::namespaced(bed.client.clone(), "crawl")
        .create(&PostParams::default(), &vendor_secret)
        .await
        .unwrap();
    bed.apply(
        "ext",
        json!({"mode": "External", "endpoint": {"host": "127.0.0.1", "port": ext_port,
            "credentialsSecretRef": {"name": "vendor-proxy", "usernameKey": "user"}},
        "healthCheck": {"url": bed.target, "interval": "1s"}}),
        json!({}),
    )
    .await;
    let ext = bed.phase("ext", "Ready").await;
    assert_eq!(ext.data["status"]["endpoint"], format!("127.0.0.1:{ext_port}"));
    assert!(ext.metadata.finalizers.is_none());

    // Loopback outside the allowed networks (the same proxy over IPv6) and
    // the metadata server are refused before any probe, saying why.
    for (name, host) in [("ext-v6", "::1"), ("metadata", "169.254.169.254")] {
        bed.apply(
            name,
            json!({"mode": "External", "endpoint": {"host": host, "port": ext_port},
                "healthCheck": {"url": bed.target}}),
            json!({}),
        )
        .await;
        let refused = bed.phase(name, "Failed").await;
        let message = refused.data["status"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("External endpoints on loopback or link-local addresses are refused")
                && message.contains("--allow-external-endpoint-networks"),
            "{name}: {message}"
        );
        assert!(refused.data["status"]["endpoint"].is_null(), "{name}: not served");
    }

    // A health check the CRD's rules would refuse (this API server does not
    // run them, as one whose CRD predates the rules would not): the
    // operator's own check keeps it from probing every 100 ms.
    bed.apply(
        "eager",
        json!({"mode": "External", "endpoint": {"host": "127.0.0.1", "port": ext_port},
            "healthCheck": {"url": bed.target, "interval": "100ms"}}),
        json!({}),
    )
    .await;
    let eager = bed
        .until(
            "the health check refused",
            async |o| {
                o.filter(|o| {
                    o.data["status"]["message"]
                        .as_str()
                        .is_some_and(|m| m.starts_with("not probed"))
                })
            },
            "eager",
        )
        .await;
    assert_eq!(
        eager.data["status"]["message"],
        "not probed: healthCheck.interval must be between 1s and 24h (got \"100ms\")"
    );

    // A Managed proxy: finalizer, hash, Ready, Events.
    bed.apply("m", managed(&bed.target), json!({})).await;
    let m = bed.phase("m", "Ready").await;
    assert_eq!(
        m.metadata.finalizers,
        Some(vec!["crawl.example.com/finalizer".to_owned()])
    );
    let first_hash = hash(&m);
    assert_eq!(first_hash.len(), 64);
    assert_eq!(m.data["status"]["observedGeneration"], 1);
    assert_eq!(bed.instances().len(), 1);
    let events: Api<DynamicObject> = Api::namespaced_with(
        bed.client.clone(),
        "crawl",
        &ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("events.k8s.io", "v1", "Event"), "events"),
    );
    // (The Event follows the status write: it may come a moment later.)
    let reasons = eventually("m's Ready Event", WAIT, async || {
        let reasons: Vec<String> = events
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .iter()
            .filter(|e| e.data["regarding"]["name"] == "m")
            .map(|e| e.data["reason"].as_str().unwrap_or_default().to_owned())
            .collect();
        reasons.iter().any(|r| r == "Ready").then_some(reasons)
    })
    .await;
    assert!(
        reasons.iter().any(|r| r == "Ready"),
        "Events on phase transitions: {reasons:?}"
    );
    // External proxies: a refusal is a Warning Event, coming up healthy is
    // none (the refused ones were applied after `ext` was Ready).
    let about = |name: &str, items: &[DynamicObject]| {
        items
            .iter()
            .filter(|e| e.data["regarding"]["name"] == name)
            .map(|e| e.data["reason"].as_str().unwrap_or_default().to_owned())
            .collect::<Vec<_>>()
    };
    let items = events.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(about("ext-v6", &items), ["Failed"], "the refusal's Warning");
    assert!(about("ext", &items).is_empty(), "{:?}", about("ext", &items));

    // Its credentials: a Secret owned by the Proxy, holding the passwd line.
    let secrets: Api<Secret> = Api::namespaced(bed.client.clone(), "crawl");
    let uid = m.metadata.uid.clone().unwrap();
    let password_of = async |secrets: &Api<Secret>| {
        let secret = secrets.get(&credentials_secret_name(&uid)).await.unwrap();
        let owner = &secret.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!((owner.kind.as_str(), owner.uid.as_str()), ("Proxy", uid.as_str()));
        let data = secret.data.unwrap();
        let text = |k: &str| String::from_utf8(data[k].0.clone()).unwrap();
        let htpasswd = text("htpasswd");
        assert!(
            htpasswd.starts_with(&format!("{}:$6$", text("username"))),
            "{htpasswd}"
        );
        assert!(!htpasswd.contains(&text("password")));
        text("password")
    };
    let first_password = password_of(&secrets).await;

    // A spec edit replaces the instance (same name, one at a time).
    bed.proxies()
        .patch(
            "m",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"port": 3129}})),
        )
        .await
        .unwrap();
    let replaced = bed
        .until(
            "a new spec hash",
            async |o| o.filter(|o| hash(o) != first_hash && o.data["status"]["phase"] == "Ready"),
            "m",
        )
        .await;
    assert_eq!(replaced.metadata.generation, Some(2));
    assert_eq!(bed.instances().len(), 1);
    let second_password = password_of(&secrets).await;
    assert_ne!(second_password, first_password, "a new instance, new credentials");

    // The rotate annotation replaces the instance with new credentials.
    let before_rotation = hash(&replaced);
    bed.proxies()
        .patch(
            "m",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"annotations": {"crawl.example.com/rotate-credentials": "1"}}}),
            ),
        )
        .await
        .unwrap();
    bed.until(
        "the rotated instance Ready",
        async |o| o.filter(|o| hash(o) != before_rotation && o.data["status"]["phase"] == "Ready"),
        "m",
    )
    .await;
    let rotated_password = password_of(&secrets).await;
    assert_ne!(
        rotated_password, second_password,
        "rotation renews the credentials"
    );
    assert_eq!(bed.instances().len(), 1);
    // Neither Events nor status show a password.
    let notes = serde_json::to_string(&events.list(&ListParams::default()).await.unwrap().items).unwrap();
    let status = serde_json::to_string(&bed.proxies().get("m").await.unwrap().data["status"]).unwrap();
    for password in [&first_password, &second_password, &rotated_password] {
        assert!(!notes.contains(password.as_str()) && !status.contains(password.as_str()));
    }

    // Its process killed: a Warning Event says how, and a replacement serves.
    support::process::kill_local_instance(&bed.dir.state());
    let stopped = bed
        .until(
            "an InstanceStopped Event",
            async |_| {
                let list = events.list(&ListParams::default()).await.ok()?;
                list.items
                    .into_iter()
                    .find(|e| e.data["reason"] == "InstanceStopped")
            },
            "m",
        )
        .await;
    assert_eq!(stopped.data["type"], "Warning");
    let note = stopped.data["note"].as_str().unwrap_or_default();
    assert!(
        note.contains("instance stopped: the proxy process was killed by signal 9 (SIGKILL)"),
        "{note}"
    );
    bed.until(
        "the replacement Ready",
        async |o| {
            o.filter(|o| {
                o.data["status"]["phase"] == "Ready" && o.data["status"]["replacement"]["count"] == 1
            })
        },
        "m",
    )
    .await;

    // Cloud-init from a labelled Secret; rotating it replaces the instance.
    let secrets: Api<Secret> = Api::namespaced(bed.client.clone(), "crawl");
    let secret = |content: &str, labelled: bool| -> Secret {
        serde_json::from_value(json!({"metadata": {"name": "ci", "labels": if labelled { json!({"crawl.example.com/cloud-init": "true"}) } else { json!({}) }},
            "stringData": {"user-data": content}, "data": {"user-data": data_encoding::BASE64.encode(content.as_bytes())}})).unwrap()
    };
    secrets
        .create(&PostParams::default(), &secret("#!/bin/sh\necho v1\n", true))
        .await
        .unwrap();
    let mut spec = managed(&bed.target);
    spec["cloudInit"] = json!({"secretRef": {"name": "ci"}});
    bed.apply("ci", spec, json!({})).await;
    let before = bed.phase("ci", "Ready").await;
    let rotated = secret("#!/bin/sh\necho v2\n", true);
    secrets
        .patch(
            "ci",
            &PatchParams::default(),
            &Patch::Merge(serde_json::to_value(&rotated).unwrap()),
        )
        .await
        .unwrap();
    bed.until(
        "replacement after rotation",
        async |o| o.filter(|o| hash(o) != hash(&before) && o.data["status"]["phase"] == "Ready"),
        "ci",
    )
    .await;

    // An unlabelled Secret is a CloudInitError.
    secrets
        .create(&PostParams::default(), &{
            let mut s = secret("x", false);
            s.metadata.name = Some("plain".into());
            s
        })
        .await
        .unwrap();
    let mut spec = managed(&bed.target);
    spec["cloudInit"] = json!({"secretRef": {"name": "plain"}});
    bed.apply("bad-ci", spec, json!({})).await;
    let bad = bed
        .until(
            "CloudInitError",
            async |o| {
                o.filter(|o| {
                    o.data["status"]["conditions"]
                        .as_array()
                        .is_some_and(|c| c.iter().any(|c| c["reason"] == "CloudInitError"))
                })
            },
            "bad-ci",
        )
        .await;
    assert!(
        bad.data["status"]["message"]
            .as_str()
            .unwrap()
            .contains("not labelled"),
        "{}",
        bad.data["status"]
    );

    // Deletion: finalizer flow, instance gone before the object.
    let instances_before = bed.instances().len();
    bed.proxies().delete("m", &DeleteParams::default()).await.unwrap();
    bed.until("deletion", async |o| o.is_none().then_some(()), "m")
        .await;
    assert_eq!(bed.instances().len(), instances_before - 1);

    // skip-cleanup: released, instance left running.
    bed.apply(
        "kept",
        managed(&bed.target),
        json!({"crawl.example.com/skip-cleanup": "true"}),
    )
    .await;
    bed.phase("kept", "Ready").await;
    let with_kept = bed.instances().len();
    bed.proxies()
        .delete("kept", &DeleteParams::default())
        .await
        .unwrap();
    bed.until("release", async |o| o.is_none().then_some(()), "kept")
        .await;
    assert_eq!(
        bed.instances().len(),
        with_kept,
        "skip-cleanup leaves the instance"
    );

    // GC: the kept instance was released (never reaped); an old planted
    // orphan of this installation is reaped.
    let installation = Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(bed.client.clone(), "crawl")
        .get("egress-proxies-installation")
        .await
        .unwrap()
        .data
        .unwrap()["id"]
        .clone();
    let instances_dir = bed.dir.state().join("local/local/instances");
    let planted = instances_dir.join("proxy-plantedorphan00");
    std::fs::create_dir_all(&planted).unwrap();
    std::fs::write(
        planted.join("instance.json"),
        serde_json::to_vec(&json!({
            "name": "proxy-plantedorphan00", "managed": true, "uid": "uid-of-a-long-gone-proxy",
            "namespace": "crawl", "installation": installation,
            "createdAt": "2026-01-01T00:00:00Z", "listen": "127.0.0.1", "port": 9, "implementation": "builtin"
        }))
        .unwrap(),
    )
    .unwrap();
    eventually_explained(
        "GC to reap the planted orphan",
        WAIT,
        || bed.dir.logs(),
        async || (!planted.exists()).then_some(()),
    )
    .await;
    assert_eq!(
        bed.instances().len(),
        with_kept,
        "the released instance (skip-cleanup's) is spared"
    );
    // Every reconcile, finalizer and annotation edit, GC sweep and restart
    // check read its Proxies from the watch cache: not one GET.
    let gets: Vec<String> = bed
        .fake
        .accesses
        .lock()
        .unwrap()
        .iter()
        .filter(|a| a.verb == "get" && matches!(a.resource.as_str(), "proxies" | "proxypools"))
        .map(|a| format!("{a:?}"))
        .collect();
    assert_eq!(
        gets,
        Vec::<String>::new(),
        "reads of Proxies go to the watch cache"
    );
    support::rbac::assert_covered(&bed.fake.accesses.lock().unwrap());
}

#[actix_rt::test]
async fn an_operator_limited_to_one_namespace_needs_only_the_namespaced_rbac() {
    let bed = Bed::new(LOCAL_PROVIDER).await;
    let _op = bed
        .start(
            &[
                "--proxy-namespace",
                "crawl",
                "--gc-interval",
                "1s",
                "--gc-grace-period",
                "30s",
            ],
            "operator",
        )
        .await;
    bed.apply("m", managed(&bed.target), json!({})).await;
    bed.phase("m", "Ready").await;
    bed.proxies().delete("m", &DeleteParams::default()).await.unwrap();
    bed.until("deletion", async |o| o.is_none().then_some(()), "m")
        .await;
    // Two more GC sweeps (each reads the Proxies from the watch cache and
    // lists the provider's instances). Without --proxy-namespace this
    // fails: Proxies and Secrets are watched cluster-wide.
    let sweeps = || bed.dir.logs().matches("gc.sweep").count();
    let before = sweeps();
    eventually_explained(
        "two GC sweeps",
        WAIT,
        || bed.dir.logs(),
        async || (sweeps() >= before + 2).then_some(()),
    )
    .await;
    support::rbac::assert_namespaced(&bed.fake.accesses.lock().unwrap(), "crawl");
}

#[actix_rt::test]
async fn metrics_are_served_over_https_to_tokens_allowed_get_metrics_only() {
    let bed = Bed::new(LOCAL_PROVIDER).await;
    {
        let mut reviews = bed.fake.reviews.lock().unwrap();
        reviews.add_token(
            "prometheus-token",
            "system:serviceaccount:monitoring:prometheus",
            &[],
        );
        reviews.grant_non_resource("system:serviceaccount:monitoring:prometheus", "/metrics", "get");
        reviews.add_token("someone-token", "system:serviceaccount:crawl:crawler", &[]);
    }
    let op = bed.operator("operator").metrics().start().await;
    let addr = op.metrics();
    egress_proxies::tls::ensure_crypto_provider();
    // Self-signed (no --metrics-cert-dir): the token is what protects.
    let client = reqwest::Client::builder()
        .danger_accept_invalid_certs(true)
        .build()
        .unwrap();
    let url = format!("https://{addr}/metrics");
    let scrape = async |token: Option<&str>| {
        let mut req = client.get(&url);
        if let Some(token) = token {
            req = req.bearer_auth(token);
        }
        let resp = req.send().await.ok()?;
        Some((resp.status().as_u16(), resp.text().await.unwrap_or_default()))
    };
    let (status, _) = eventually("the metrics listener to answer over HTTPS", WAIT, async || {
        scrape(None).await
    })
    .await;
    assert_eq!(status, 401, "no token");
    assert_eq!(
        scrape(Some("forged")).await.unwrap().0,
        401,
        "a token the API server does not know"
    );
    let (status, body) = scrape(Some("someone-token")).await.unwrap();
    assert_eq!(status, 403, "authenticated, not allowed get /metrics: {body}");
    assert!(body.contains("system:serviceaccount:crawl:crawler"), "{body}");
    let (status, body) = scrape(Some("prometheus-token")).await.unwrap();
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("egress_proxies_"), "{body}");
    // The operator's own API requests are counted: its Proxy watch, and
    // the TokenReviews these scrapes cost.
    eventually("the operator's API requests counted", WAIT, async || {
        let (_, body) = scrape(Some("prometheus-token")).await?;
        let series = "egress_proxies_kube_api_requests_total";
        (body.contains(&format!(
            "{series}{{verb=\"watch\",resource=\"proxies\",code=\"200\"}}"
        )) && body.contains(&format!(
            "{series}{{verb=\"create\",resource=\"tokenreviews\",code="
        )))
        .then_some(())
    })
    .await;
    // Plain HTTP gets nothing from the TLS listener.
    let plain = reqwest::get(format!("http://{addr}/metrics")).await;
    assert!(!plain.is_ok_and(|r| r.status().is_success()));
    support::rbac::assert_covered(&bed.fake.accesses.lock().unwrap());
}

#[actix_rt::test]
async fn a_provider_removed_from_the_config_holds_deletion_until_skip_cleanup() {
    let bed = Bed::new(LOCAL_PROVIDER).await;
    let op = bed.start(&[], "first").await;
    bed.apply("m", managed(&bed.target), json!({})).await;
    bed.phase("m", "Ready").await;
    drop(op);
    std::fs::write(bed.dir.path().join("providers.yaml"), "providers: []\n").unwrap();
    let _op = bed.start(&[], "second").await;
    bed.proxies().delete("m", &DeleteParams::default()).await.unwrap();
    let held = bed
        .until(
            "the not-configured message",
            async |o| {
                o.filter(|o| {
                    o.data["status"]["message"]
                        .as_str()
                        .is_some_and(|m| m.contains("is not configured"))
                })
            },
            "m",
        )
        .await;
    assert!(held.metadata.deletion_timestamp.is_some());
    bed.proxies()
        .patch(
            "m",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"crawl.example.com/skip-cleanup": "true"}}})),
        )
        .await
        .unwrap();
    bed.until("release", async |o| o.is_none().then_some(()), "m")
        .await;
}

async fn ready(op: &OperatorProcess) -> bool {
    let (status, _) = support::http::request(op.health(), "GET", "/readyz", &[], None).await;
    status == 200
}

#[actix_rt::test]
async fn only_the_leader_acts_and_a_follower_takes_over() {
    let bed = Bed::new(LOCAL_PROVIDER).await;
    let args = [
        "--leader-elect",
        "--lease-duration",
        "3s",
        "--every-replica-serves=false",
    ];
    let mut operators = vec![bed.start(&args, "a").await, bed.start(&args, "b").await];
    let leases: Api<Lease> = Api::namespaced(bed.client.clone(), "crawl");
    let leader = eventually("a leader", WAIT, async || {
        let (ra, rb) = (ready(&operators[0]).await, ready(&operators[1]).await);
        assert!(!(ra && rb), "two leaders at once");
        if ra || rb {
            Some(if ra { 0 } else { 1 })
        } else {
            None
        }
    })
    .await;
    let follower = operators.remove(1 - leader);
    let leader = operators.remove(0);
    let holder = leases
        .get("egress-proxies-operator")
        .await
        .unwrap()
        .spec
        .unwrap()
        .holder_identity
        .unwrap();
    assert!(!holder.is_empty());

    bed.apply("m", managed(&bed.target), json!({})).await;
    bed.phase("m", "Ready").await;
    assert_eq!(bed.instances().len(), 1);
    assert!(!ready(&follower).await, "the follower stays idle");

    // The leader dies without releasing: the follower takes over after the lease expires.
    drop(leader);
    let killed = std::time::Instant::now();
    eventually_explained(
        "the follower to take over",
        WAIT,
        || bed.dir.logs(),
        async || ready(&follower).await.then_some(()),
    )
    .await;
    eprintln!("takeover after the leader's death: {:?}", killed.elapsed());
    let new_holder = leases
        .get("egress-proxies-operator")
        .await
        .unwrap()
        .spec
        .unwrap()
        .holder_identity
        .unwrap();
    assert_ne!(new_holder, holder);
    bed.apply("n", managed(&bed.target), json!({})).await;
    bed.phase("n", "Ready").await;
    assert_eq!(
        bed.instances().len(),
        2,
        "one instance per Proxy after the takeover, nothing duplicated"
    );
    support::rbac::assert_covered(&bed.fake.accesses.lock().unwrap());
}

fn proxy_pools(client: &kube::Client) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("crawl.example.com", "v1alpha1", "ProxyPool"),
        "proxypools",
    );
    Api::namespaced_with(client.clone(), "crawl", &ar)
}

/// The pool's members that are Ready and not being deleted, by name.
async fn ready_members(bed: &Bed, pool: &str) -> Vec<String> {
    let members = bed
        .proxies()
        .list(&ListParams::default().labels(&format!("crawl.example.com/pool={pool}")))
        .await
        .unwrap();
    let mut names: Vec<String> = members
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none() && p.data["status"]["phase"] == "Ready")
        .filter_map(|p| p.metadata.name)
        .collect();
    names.sort();
    names
}

#[actix_rt::test]
async fn a_pool_owns_its_members_follows_its_scale_and_goes_with_them() {
    let bed = Bed::new(LOCAL_PROVIDER).await;
    let _op = bed.start(&[], "operator").await;
    let pools = proxy_pools(&bed.client);
    let pool: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "crawl.example.com/v1alpha1", "kind": "ProxyPool",
        "metadata": {"name": "eu", "namespace": "crawl"},
        "spec": {"replicas": 1, "template": {"labels": {"team": "shop"}, "spec": managed(&bed.target)}}
    }))
    .unwrap();
    let pool = pools.create(&PostParams::default(), &pool).await.unwrap();
    let pool_uid = pool.metadata.uid.clone().unwrap();
    let until_members = async |what: &str, count: usize| -> Vec<String> {
        eventually_explained(
            what,
            WAIT,
            || bed.dir.logs(),
            async || {
                let ready = ready_members(&bed, "eu").await;
                let all = bed
                    .proxies()
                    .list(&ListParams::default())
                    .await
                    .unwrap()
                    .items
                    .len();
                let status = pools.get("eu").await.unwrap().data["status"].clone();
                (ready.len() == count
                    && all == count
                    && status["ready"] == count
                    && bed.instances().len() == count)
                    .then_some(ready.clone())
                    .ok_or(format!(
                        "ready {ready:?}, {all} proxies, status {status}, instances {:?}",
                        bed.instances()
                    ))
            },
        )
        .await
    };

    let first = until_members("one Ready member", 1).await;
    let member = bed.proxies().get(&first[0]).await.unwrap();
    assert!(first[0].starts_with("eu-"), "{first:?}");
    let owner = &member.metadata.owner_references.clone().unwrap()[0];
    assert_eq!(
        (
            owner.kind.as_str(),
            owner.name.as_str(),
            owner.uid.as_str(),
            owner.controller
        ),
        ("ProxyPool", "eu", pool_uid.as_str(), Some(true))
    );
    assert_eq!(member.metadata.labels.as_ref().unwrap()["team"], "shop");

    // kubectl scale pp/eu --replicas=3
    pools
        .patch_scale(
            "eu",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 3}})),
        )
        .await
        .unwrap();
    let three = until_members("three Ready members", 3).await;
    let scale = pools.get_scale("eu").await.unwrap();
    assert_eq!(scale.status.unwrap().replicas, 3);

    // A member deleted by hand is replaced; its instance goes.
    bed.proxies()
        .delete(&three[0], &DeleteParams::default())
        .await
        .unwrap();
    let replaced = eventually_explained(
        "the deleted member replaced",
        WAIT,
        || bed.dir.logs(),
        async || {
            let ready = ready_members(&bed, "eu").await;
            (ready.len() == 3 && !ready.contains(&three[0]) && bed.instances().len() == 3)
                .then_some(ready.clone())
                .ok_or(format!("{ready:?}, instances {:?}", bed.instances()))
        },
    )
    .await;
    assert_eq!(
        replaced.iter().filter(|n| three.contains(n)).count(),
        2,
        "the other two kept"
    );

    pools
        .patch_scale(
            "eu",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 1}})),
        )
        .await
        .unwrap();
    until_members("back to one member", 1).await;

    // Deleting the pool: the garbage collector deletes the members, their
    // finalizers hold them until their instances are gone.
    pools.delete("eu", &DeleteParams::default()).await.unwrap();
    eventually_explained(
        "no member and no instance left",
        WAIT,
        || bed.dir.logs(),
        async || {
            let left = bed
                .proxies()
                .list(&ListParams::default())
                .await
                .unwrap()
                .items
                .len();
            (left == 0 && bed.instances().is_empty())
                .then_some(())
                .ok_or(format!("{left} proxies, instances {:?}", bed.instances()))
        },
    )
    .await;
    support::rbac::assert_covered(&bed.fake.accesses.lock().unwrap());
}

const GATEWAY_TOKEN: &str = "k8s-gw-t0ken-51d2";

/// A request through the gateway `gateway` with the crawler token; its
/// status line and head, or `None` when nothing is answered within `wait`.
async fn through_gateway(
    gateway: std::net::SocketAddr,
    head: &str,
    wait: Duration,
) -> (tokio::net::TcpStream, Option<String>) {
    use base64::Engine;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(gateway).await.unwrap();
    let auth = base64::engine::general_purpose::STANDARD.encode(format!("crawler:{GATEWAY_TOKEN}"));
    let head = head.replace(
        "\r\n\r\n",
        &format!("\r\nProxy-Authorization: Basic {auth}\r\n\r\n"),
    );
    s.write_all(head.as_bytes()).await.unwrap();
    let read = async {
        let mut got = Vec::new();
        let mut byte = [0u8; 1];
        while !got.ends_with(b"\r\n\r\n") {
            if s.read(&mut byte).await.unwrap_or(0) == 0 {
                break;
            }
            got.push(byte[0]);
        }
        String::from_utf8_lossy(&got).into_owned()
    };
    let answer = tokio::time::timeout(wait, read).await.ok();
    (s, answer)
}

/// The leases the leader's checkpoint holds, as the cluster stores them.
async fn checkpointed_leases(client: &kube::Client) -> String {
    let maps: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(client.clone(), "crawl");
    maps.list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|m| {
            m.metadata
                .name
                .as_deref()
                .is_some_and(|n| n.starts_with("egress-proxies-leases-"))
        })
        .filter_map(|m| m.data.and_then(|d| d.get("leases.json").cloned()))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The gateway in Kubernetes mode: the leader serves it from its lease
/// book (a gateway lease counts on the proxy while its tunnel is open, and
/// is not checkpointed into the cluster, unlike what it leaves behind); a follower
/// serves nothing (it has no book) until it takes over.
#[actix_rt::test]
async fn the_gateway_leases_from_the_leaders_book() {
    let provider = "providers:\n  - {name: local, type: local, local: {implementation: builtin, destinations: {allow: [127.0.0.0/8, 1024-65535]}}}\n";
    let bed = Bed::new(provider).await;
    bed.dir.write(
        "gateway.yaml",
        "destinations: {allow: [127.0.0.0/8, 1024-65535]}\n",
    );
    let config = bed.dir.path().join("gateway.yaml");
    let gateways = [
        std::net::SocketAddr::from(([127, 0, 0, 1], support::process::free_port())),
        std::net::SocketAddr::from(([127, 0, 0, 1], support::process::free_port())),
    ];
    let start = async |name: &str, gateway: std::net::SocketAddr| {
        bed.operator(name)
            .discovery()
            .env("DISCOVERY_TOKEN", GATEWAY_TOKEN)
            .args([
                "--leader-elect",
                "--every-replica-serves=false",
                "--lease-duration",
                "3s",
                "--lease-cooldown",
                "100ms",
                // The tunnel's lease and an API lease at once.
                "--max-leases-per-proxy",
                "2",
                // Joins the gateway's default denies (TEST-NET-3: nothing
                // is ever sent there, the gateway refuses it first).
                "--cluster-networks",
                "203.0.113.0/24",
            ])
            .arg("--gateway-config")
            .arg(&config)
            .arg(format!("--gateway-bind-address={gateway}"))
            .start()
            .await
    };
    let mut operators = vec![start("a", gateways[0]).await, start("b", gateways[1]).await];
    let leader = eventually("a leader", WAIT, async || {
        let (ra, rb) = (ready(&operators[0]).await, ready(&operators[1]).await);
        if ra || rb { Some(usize::from(rb)) } else { None }
    })
    .await;
    let (leader_gw, follower_gw) = (gateways[leader], gateways[1 - leader]);
    let follower = operators.remove(1 - leader);
    let leader = operators.remove(0);
    assert!(
        leader.logs().contains("gateway listening"),
        "the leader serves the gateway\n{}",
        leader.logs()
    );
    bed.apply("m", managed(&bed.target), json!({})).await;
    bed.phase("m", "Ready").await;
    let target = bed
        .target
        .trim_start_matches("http://")
        .trim_end_matches("/generate_204")
        .to_owned();

    // A plain request: fetched through the leased proxy (once the lease
    // store has heard that the proxy is Ready: 503 no_capacity until then).
    let get = format!(
        "GET {} HTTP/1.1\r\nHost: {target}\r\nConnection: close\r\n\r\n",
        bed.target
    );
    leader
        .eventually("a fetch through the leader's gateway", WAIT, async || {
            let (_, answer) = through_gateway(leader_gw, &get, WAIT).await;
            let answer = answer.expect("the leader's gateway answers");
            if answer.starts_with("HTTP/1.1 204") {
                Ok(())
            } else {
                assert!(answer.contains("no_capacity"), "{answer}");
                Err(answer)
            }
        })
        .await;

    // A cluster network is refused by the gateway itself, before a lease:
    // its own 403 and reason, not the leased proxy's refusal relayed.
    let (_, answer) = through_gateway(
        leader_gw,
        "GET http://203.0.113.7/ HTTP/1.1\r\nHost: 203.0.113.7\r\nConnection: close\r\n\r\n",
        WAIT,
    )
    .await;
    let answer = answer.expect("the leader's gateway answers").to_ascii_lowercase();
    assert!(answer.starts_with("http/1.1 403"), "{answer}");
    assert!(
        answer.contains("egress-gateway-error: destination_refused"),
        "the gateway refused it, not the proxy: {answer}"
    );
    assert!(
        leader.logs().contains("203.0.113.0/24 is denied by default"),
        "{}",
        leader.logs()
    );

    // A tunnel holds its lease while open: the leader's book counts it and
    // its checkpoint in the cluster holds it, taken for the gateway.
    let active = async || {
        let (status, body) = support::http::request(
            leader.discovery(),
            "GET",
            "/v1/proxies",
            &[("Authorization", &format!("Bearer {GATEWAY_TOKEN}"))],
            None,
        )
        .await;
        assert_eq!(status, 200, "{body}");
        let list: Value = serde_json::from_str(&body).unwrap();
        list.as_array().unwrap()[0]["activeLeases"].as_u64().unwrap()
    };
    // (the fetch's release left the proxy resting for the target: briefly)
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (tunnel, answer) = through_gateway(
        leader_gw,
        &format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n"),
        WAIT,
    )
    .await;
    let answer = answer.expect("the leader's gateway answers the CONNECT");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert_eq!(active().await, 1, "the open tunnel holds a lease");
    // The tunnel's lease is not checkpointed: it ends with this process.
    // An API lease taken after it is, so once that one is in the
    // checkpoint, the tunnel's would be too if it were written at all.
    let auth = format!("Bearer {GATEWAY_TOKEN}");
    let headers = [
        ("Authorization", auth.as_str()),
        ("Content-Type", "application/json"),
    ];
    let (status, body) = support::http::request(
        leader.discovery(),
        "POST",
        "/v1/leases",
        &headers,
        Some(r#"{"target":"sync.example","client":"spider"}"#),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let api_lease: Value = serde_json::from_str(&body).unwrap();
    let api_lease = api_lease["id"].as_str().unwrap().to_owned();
    eventually("the API lease in the checkpoint", WAIT, async || {
        checkpointed_leases(&bed.client)
            .await
            .contains(&api_lease)
            .then_some(())
    })
    .await;
    let checkpoint = checkpointed_leases(&bed.client).await;
    assert!(
        !checkpoint.contains("gateway/crawler"),
        "the gateway's lease is not checkpointed: {checkpoint}"
    );
    assert!(
        !checkpoint.contains(GATEWAY_TOKEN),
        "the token is not in the checkpoint"
    );
    let (status, body) = support::http::request(
        leader.discovery(),
        "DELETE",
        &format!("/v1/leases/{api_lease}"),
        &headers,
        None,
    )
    .await;
    assert_eq!(status, 204, "{body}");
    drop(tunnel);
    eventually("the tunnel's lease released", WAIT, async || {
        (active().await == 0).then_some(())
    })
    .await;

    // A follower has no book: it serves nothing, not even a refusal (its
    // port only queues connections; the Service does not route to it, as
    // it is not ready).
    let (queued, answer) = through_gateway(follower_gw, &get, Duration::from_secs(2)).await;
    assert_eq!(answer, None, "a follower's gateway answers nothing");
    assert!(!ready(&follower).await);
    drop(queued);
    for log in [leader.logs(), follower.logs()] {
        assert!(!log.contains(GATEWAY_TOKEN), "the token is never logged");
    }

    // Once it leads, it serves the gateway from the book it took over.
    drop(leader);
    eventually_explained(
        "the follower to take over",
        WAIT,
        || bed.dir.logs(),
        async || ready(&follower).await.then_some(()),
    )
    .await;
    let fetched = eventually_explained(
        "a fetch through the new leader's gateway",
        WAIT,
        || bed.dir.logs(),
        async || {
            let (_, answer) = through_gateway(follower_gw, &get, Duration::from_secs(5)).await;
            answer.filter(|a| a.starts_with("HTTP/1.1 204"))
        },
    )
    .await;
    assert!(fetched.starts_with("HTTP/1.1 204"));
}

/// Status writes the fake served (`patch proxies/status`, any answer).
fn status_patches(fake: &FakeApiServer) -> u64 {
    fake.requests()
        .0
        .iter()
        .filter(|(k, _)| k.verb == "patch" && k.resource == "proxies/status")
        .map(|(_, n)| n)
        .sum()
}

/// At fleet scale every status write is an API request. External proxies
/// come up with one status write each (their first status waits for the
/// first verdict and carries it), and a restarted operator finds every
/// status right: its probes confirm the recorded verdicts and it writes
/// nothing, while the proxies stay leasable from the recorded `Ready`.
#[actix_rt::test]
async fn external_proxies_come_up_with_one_status_write_each_and_a_restart_writes_none() {
    const N: usize = 20;
    const TOKEN: &str = "k8s-fleet-t0ken-39";
    let bed = Bed::new(LOCAL_PROVIDER).await;
    // Probes of proxy i fetch /ext-i: the target counts each proxy's probes.
    let (target, seen) =
        support::target_server::http_target_with(support::target_server::Behaviour::Status(204)).await;
    let probes_of = |i: usize| {
        let path = format!("GET /ext-{i} ");
        seen.lock()
            .unwrap()
            .iter()
            .filter(|h| h.starts_with(&path))
            .count()
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let proxy_port = listener.local_addr().unwrap().port();
    tokio::spawn(egress_proxies::adapters::forward_proxy::serve(
        listener,
        support::open_to_loopback(),
        None,
    ));
    let start = async |name: &str| {
        bed.operator(name)
            .discovery()
            .env("DISCOVERY_TOKEN", TOKEN)
            .args(["--allow-external-endpoint-networks", "127.0.0.0/8"])
            // Each verdict the prober reports is logged.
            .log_level("info,egress_proxies_operator::health_prober=debug")
            .start()
            .await
    };
    let statuses = async || -> Vec<Value> {
        let mut list = bed.proxies().list(&ListParams::default()).await.unwrap().items;
        list.sort_by_key(|p| p.metadata.name.clone());
        list.into_iter().map(|p| p.data["status"].clone()).collect()
    };
    let all_ready = async |op: &OperatorProcess| {
        op.eventually(&format!("{N} proxies Ready"), WAIT, async || {
            let phases: Vec<Value> = statuses().await.iter().map(|s| s["phase"].clone()).collect();
            (phases.len() == N && phases.iter().all(|p| p == "Ready"))
                .then_some(())
                .ok_or(format!("{phases:?}"))
        })
        .await
    };
    // Two more probes of every proxy from now on, and a moment for what
    // they might write.
    let two_more_probe_rounds = async |op: &OperatorProcess| {
        let before: Vec<usize> = (0..N).map(probes_of).collect();
        op.eventually("two more probes of every proxy", WAIT, async || {
            let now: Vec<usize> = (0..N).map(probes_of).collect();
            now.iter()
                .zip(&before)
                .all(|(now, before)| *now >= before + 2)
                .then_some(())
                .ok_or(format!("probes {now:?}, before {before:?}"))
        })
        .await;
        tokio::time::sleep(Duration::from_millis(500)).await;
    };

    let first = start("first").await;
    for i in 0..N {
        bed.apply(
            &format!("ext-{i}"),
            json!({"mode": "External", "endpoint": {"host": "127.0.0.1", "port": proxy_port},
                "healthCheck": {"url": format!("http://{target}/ext-{i}"), "interval": "1s"}}),
            json!({}),
        )
        .await;
    }
    all_ready(&first).await;
    two_more_probe_rounds(&first).await;
    let recorded = statuses().await;
    // Every one of them needed a write to be Ready: N writes are one each.
    assert_eq!(
        status_patches(&bed.fake),
        N as u64,
        "one status write per proxy coming up (no interim Running), none for probes that agree: {recorded:#?}"
    );
    for status in &recorded {
        assert_eq!(status["endpoint"], format!("127.0.0.1:{proxy_port}"), "{status}");
        assert!(status["health"]["latencyMs"].is_u64(), "{status}");
        let conditions = status["conditions"].as_array().unwrap();
        for kind in ["InstanceReady", "Healthy", "Ready"] {
            assert!(
                conditions
                    .iter()
                    .any(|c| c["type"] == kind && c["status"] == "True"),
                "{kind}: {status}"
            );
        }
    }

    // A restart (the process killed, as a crash or a failover would): the
    // same fake, the same objects.
    let first_logs = first.logs();
    drop(first);
    let second = start("second").await;
    let before = status_patches(&bed.fake);
    // Leasable at once from the recorded Ready: a lease for each proxy.
    let auth = format!("Bearer {TOKEN}");
    let headers = [
        ("Authorization", auth.as_str()),
        ("Content-Type", "application/json"),
    ];
    let mut leased = std::collections::BTreeSet::new();
    for i in 0..N {
        let body = format!(r#"{{"target":"t{i}.example","client":"spider"}}"#);
        let lease: Value = second
            .eventually("a lease from the restarted operator", WAIT, async || {
                let (status, answer) =
                    support::http::request(second.discovery(), "POST", "/v1/leases", &headers, Some(&body))
                        .await;
                (status == 201)
                    .then(|| serde_json::from_str::<Value>(&answer).unwrap())
                    .ok_or(format!("{status} {answer}"))
            })
            .await;
        leased.insert(lease["proxy"]["name"].as_str().unwrap().to_owned());
    }
    assert_eq!(leased.len(), N, "every proxy leasable: {leased:?}");
    two_more_probe_rounds(&second).await;
    assert_eq!(
        status_patches(&bed.fake),
        before,
        "the restarted operator's probes confirm the recorded verdicts: no status write"
    );
    assert_eq!(statuses().await, recorded, "the statuses as they were");
    // Not even a verdict to record (which could have written the same status).
    assert!(first_logs.contains("health verdict"), "verdicts are logged");
    let logs = second.logs();
    assert!(
        !logs.contains("health verdict") && !logs.contains("phase changed"),
        "{logs}"
    );
}
