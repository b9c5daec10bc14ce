//! The Kubernetes docs, run as written: one fake cluster (the fake API
//! server with a cluster's rules), the real `/usr/bin/kubectl`, and the
//! operator started the way the cluster would start the Deployment that
//! kubectl applied.
//!
//! Order: docs/install.md's `kubernetes` blocks (but its Uninstall
//! section), then every other page's `kubernetes` blocks in the order of
//! [`support::doc_blocks::user_docs`], then install.md's Uninstall blocks.
//! Each page runs in one `bash -euo pipefail` (variables and the working
//! directory carry from block to block), in the fresh checkout the
//! standalone doc test uses too (`support::checkout`), with `KUBECONFIG`
//! naming the fake, `kubectl` the real one, `cargo` the real one (built
//! there first with `cargo run --release -- --version`) and
//! `egress-proxies-operator` the binary that build leaves in
//! `target/release/`. After each page every Proxy is `Ready` and every
//! pool's `Ready` condition true, but where a page's `expect` marker says
//! otherwise (`support::doc_blocks`).
//!
//! The test stands in for the parts of a cluster the fake has not got:
//! - the kubelet of the operator's Deployment ([`Kubelet`]): once the
//!   Deployment exists it runs the real binary with the container's args
//!   and env (Secret and ConfigMap references resolved from the fake, as
//!   the kubelet does; a Secret never created fails the test), its volumes
//!   as temporary directories, and only its listen addresses moved to a
//!   loopback address of its own; an image that would be pulled from a registry that
//!   does not have it fails the test. It restarts the operator when the
//!   pod template changes and stops it when the Deployment goes. Its
//!   substitutions, each said where it is made: one replica of the
//!   Deployment's two (it leads, and serves from its own share; the
//!   replicas together are tested in replicas_*.rs); `status.podIP` is the
//!   pod's loopback address below; a
//!   kubeconfig for the service account; mount paths (and the default
//!   `--state-dir` under the `/tmp` volume) rewritten into the pod's
//!   directory; listen addresses on a loopback address of the pod's own
//!   (its "pod IP", `127.x.y.z`), each on its container port;
//! - cluster DNS for the operator's Services: `~/.curlrc` maps each
//!   `<service>.<namespace>.svc:<port>` to the pod address and port behind
//!   it (`connect-to`), and resolves the name to the pod address
//!   (`resolve`, which curl applies to a proxy's name too: `-x`), so the
//!   docs' curl commands keep the in-cluster URL;
//! - the Internet, as far as the samples need it: their health check's
//!   `https://www.gstatic.com/generate_204`, served on loopback with a
//!   certificate of the test's own CA, which the operator's probes trust
//!   (`HEALTH_CA_FILE`, set by the kubelet beside `KUBECONFIG`);
//! - the pods of the kubernetes provider: a sample's Squid pod runs, on a
//!   pod address of its own, as a stand-in that relays `CONNECT
//!   www.gstatic.com:443` to that Internet and answers anything else `503`
//!   (a Squid that cannot reach it), so the samples' Proxies become Ready
//!   as in a cluster; after install.md the test adds one Proxy of its own,
//!   health-checked against a loopback target, whose pod is the built-in
//!   forward proxy;
//! - the operator's pod object (`kubectl get pod $POD_NAME`), created
//!   with the template's labels and containers when the kubelet starts it.
//!
//! README's Kubernetes summary must repeat install.md's commands.

mod support;

use std::collections::BTreeMap;
use std::io::Write;
use std::net::{IpAddr, SocketAddr};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use fake_apiserver::{FakeApiServer, KINDS, Selector};
use serde_json::{Value, json};
use support::doc_blocks::{Bed, Marker, ShellBlock, repo_root, shell_blocks, user_docs};
use support::operator::BIN;
use support::process::{Killed, reap_under};

/// The real kubectl: `EPO_KUBECTL` (tests/run.sh sets it to the one
/// tests/manifests.sh makes sure of), else the first `kubectl` on `PATH`.
fn kubectl() -> PathBuf {
    if let Some(path) = std::env::var_os("EPO_KUBECTL") {
        return PathBuf::from(path);
    }
    std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .map(|dir| dir.join("kubectl"))
        .find(|candidate| candidate.is_file())
        .expect(
            "the doc test needs the real kubectl on PATH or in EPO_KUBECTL (tests/manifests.sh installs it)",
        )
}
/// How long one block may run.
const BLOCK_TIMEOUT: Duration = Duration::from_secs(240);
/// How long the Proxies of a page get to show a phase.
const PHASE_TIMEOUT: Duration = Duration::from_secs(60);
/// The namespace of the test's own Ready proxy (the samples' crawler namespace).
const CRAWLERS: &str = "crawlers";

/// A temporary directory whose processes are killed before it goes.
struct Scratch(tempfile::TempDir);

impl Drop for Scratch {
    fn drop(&mut self) {
        reap_under(self.0.path());
    }
}

impl Scratch {
    fn path(&self) -> &Path {
        self.0.path()
    }
}

fn kind(group: &str, plural: &str) -> usize {
    KINDS
        .iter()
        .position(|k| k.group == group && k.plural == plural)
        .expect("the fake serves it")
}

fn list(fake: &FakeApiServer, group: &str, plural: &str, namespace: Option<&str>) -> Vec<Value> {
    let state = fake.state.lock().unwrap();
    state.list(kind(group, plural), namespace, &Selector::default(), &[])["items"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

fn get(fake: &FakeApiServer, group: &str, plural: &str, namespace: &str, name: &str) -> Option<Value> {
    fake.state
        .lock()
        .unwrap()
        .get(kind(group, plural), namespace, name)
        .ok()
}

/// The kubelet of the operator's Deployment, and of the test's own proxy pod.
struct Kubelet {
    fake: FakeApiServer,
    /// Where pods' volumes, logs and the curl configuration live.
    root: PathBuf,
    home: PathBuf,
    kubeconfig: PathBuf,
    /// The running operator and the pod template it runs.
    operator: Option<(Killed, Value, PathBuf)>,
    /// Why the Deployment's pod cannot run, if it cannot.
    waiting: Option<String>,
    /// An image pull that can never succeed: fails the test at once.
    pull_failure: Option<String>,
    started: usize,
    /// The UID of the test's own proxy, once created.
    own_proxy: Option<String>,
    /// The operator's pod object in the fake: (namespace, name).
    pod_record: Option<(String, String)>,
    /// The Internet's stand-in (`www.gstatic.com:443`) and its CA (PEM).
    internet: (SocketAddr, PathBuf),
}

impl Kubelet {
    /// The operator's Deployment: the one whose container runs the operator's image.
    fn deployment(&self) -> Option<Value> {
        list(&self.fake, "apps", "deployments", None)
            .into_iter()
            .find(|d| {
                d["spec"]["template"]["spec"]["containers"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|c| {
                        image_repository(c["image"].as_str().unwrap_or_default()) == "egress-proxies-operator"
                    })
            })
    }

    /// One look at the cluster: start, restart or stop the operator; run the own proxy's pod.
    fn tick(&mut self) {
        self.run_proxy_pods();
        let Some(deployment) = self.deployment() else {
            if let Some((mut operator, _, _)) = self.operator.take() {
                stop(&mut operator);
            }
            if let Some((namespace, name)) = self.pod_record.take() {
                let _ =
                    self.fake
                        .state
                        .lock()
                        .unwrap()
                        .delete(kind("", "pods"), &namespace, &name, &json!({}));
            }
            self.waiting = None;
            return;
        };
        let template = deployment["spec"]["template"].clone();
        if let Some((_, running, _)) = &self.operator
            && *running == template
        {
            return;
        }
        match self.pod_from(&deployment) {
            Ok(pod) => {
                if let Some((mut old, _, _)) = self.operator.take() {
                    stop(&mut old);
                }
                self.waiting = None;
                self.start(pod, template);
            }
            Err(Wait::Pull(why)) => self.pull_failure = Some(why),
            Err(Wait::Config(why)) => self.waiting = Some(why),
        }
    }

    fn start(&mut self, pod: Pod, template: Value) {
        self.started += 1;
        let log = self.root.join(format!("operator-{}.log", self.started));
        let out = std::fs::File::create(&log).unwrap();
        let mut command = Command::new(BIN);
        command
            .args(&pod.args)
            .env_clear()
            .envs(pod.env.iter().cloned())
            // In a pod the operator finds the API server through its
            // service account; here through a kubeconfig.
            .env("KUBECONFIG", &self.kubeconfig)
            // The Internet's stand-in is signed by the test's own CA.
            .env("HEALTH_CA_FILE", &self.internet.1)
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .current_dir(&pod.dir)
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .process_group(0);
        let child = Killed(command.spawn().unwrap());
        self.write_curlrc(&pod.ports);
        self.record_pod(&pod, &template);
        self.operator = Some((child, template, log));
    }

    /// The operator's pod as the API shows it (`kubectl get pod $POD_NAME`):
    /// the template's labels and containers, `Running`; the pod it replaces
    /// is deleted, as its Deployment's rollout would.
    fn record_pod(&mut self, pod: &Pod, template: &Value) {
        let mut state = self.fake.state.lock().unwrap();
        if let Some((namespace, name)) = self.pod_record.take() {
            let _ = state.delete(kind("", "pods"), &namespace, &name, &json!({}));
        }
        let object = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": pod.name, "namespace": pod.namespace,
                         "labels": template["metadata"]["labels"]},
            "spec": template["spec"],
            "status": {"phase": "Running"}
        });
        state
            .create(kind("", "pods"), &pod.namespace, object)
            .expect("the operator's pod is recorded");
        self.pod_record = Some((pod.namespace.clone(), pod.name.clone()));
    }

    /// `~/.curlrc`: each Service selecting the operator's pod, by its
    /// in-cluster name, connects to the loopback port behind it.
    fn write_curlrc(&self, ports: &BTreeMap<String, (u16, SocketAddr)>) {
        let Some(deployment) = self.deployment() else {
            return;
        };
        let labels = &deployment["spec"]["template"]["metadata"]["labels"];
        let mut lines = String::new();
        let mut names = serde_json::Map::new();
        for service in list(&self.fake, "", "services", None) {
            let selector = service["spec"]["selector"]
                .as_object()
                .cloned()
                .unwrap_or_default();
            if selector.is_empty() || selector.iter().any(|(k, v)| labels[k] != *v) {
                continue;
            }
            let (name, ns) = (
                service["metadata"]["name"].as_str().unwrap_or_default(),
                service["metadata"]["namespace"].as_str().unwrap_or_default(),
            );
            for port in service["spec"]["ports"].as_array().into_iter().flatten() {
                let target = &port["targetPort"];
                let found = ports.iter().find(|(port_name, (container, _))| {
                    target.as_str() == Some(port_name.as_str())
                        || target.as_u64() == Some(u64::from(*container))
                        || (target.is_null() && port["port"].as_u64() == Some(u64::from(*container)))
                });
                if let Some((_, (_, host))) = found {
                    for domain in ["svc", "svc.cluster.local"] {
                        lines.push_str(&format!(
                            "connect-to = \"{name}.{ns}.{domain}:{}:{}:{}\"\n",
                            port["port"],
                            host.ip(),
                            host.port()
                        ));
                        // A proxy's name (`-x`) is resolved, never connected-to.
                        if port["port"].as_u64() == Some(u64::from(host.port())) {
                            names.insert(format!("{name}.{ns}.{domain}"), json!(host.ip().to_string()));
                            lines.push_str(&format!(
                                "resolve = \"{name}.{ns}.{domain}:{}:{}\"\n",
                                port["port"],
                                host.ip()
                            ));
                        }
                    }
                }
            }
        }
        std::fs::write(self.home.join(".curlrc"), lines).unwrap();
        // The same names for a crawler's Python process ([`crawler_pod_leases`]).
        std::fs::write(
            self.root.join("cluster-dns.json"),
            Value::Object(names).to_string(),
        )
        .unwrap();
    }

    /// What the kubelet would run for the Deployment's pod, or why it cannot.
    fn pod_from(&self, deployment: &Value) -> Result<Pod, Wait> {
        let ns = deployment["metadata"]["namespace"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let spec = &deployment["spec"]["template"]["spec"];
        let container = spec["containers"]
            .as_array()
            .and_then(|c| c.first())
            .ok_or_else(|| Wait::Config("the pod template has no container".into()))?;
        check_pull(container)?;
        let dir = self.root.join(format!("pod-{}", self.started + 1));
        std::fs::create_dir_all(&dir).unwrap();
        let pod_name = format!(
            "{}-kubelet-{}",
            deployment["metadata"]["name"].as_str().unwrap_or("pod"),
            self.started + 1
        );

        // The pod's own IP (`status.podIP`), where its listeners keep
        // their container ports.
        let pod_ip = pod_ip();

        // Env, in order: `$(VAR)` refers to variables defined before.
        let mut env: Vec<(String, String)> = Vec::new();
        for var in container["env"].as_array().into_iter().flatten() {
            let name = var["name"].as_str().unwrap_or_default().to_owned();
            let value = if let Some(v) = var["value"].as_str() {
                Some(expand(v, &env))
            } else {
                self.env_from(&var["valueFrom"], &ns, &pod_name, pod_ip)?
            };
            if let Some(value) = value {
                env.push((name, value));
            }
        }

        // Volumes as directories: each mount path is rewritten into `dir`.
        let mut mounts: Vec<(String, PathBuf)> = Vec::new();
        for mount in container["volumeMounts"].as_array().into_iter().flatten() {
            let path = mount["mountPath"].as_str().unwrap_or_default().to_owned();
            let host = dir.join(format!("mount{path}"));
            let volume = spec["volumes"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|v| v["name"] == mount["name"])
                .ok_or_else(|| Wait::Config(format!("volume {} is not defined", mount["name"])))?;
            let files = self.volume_files(volume, &ns)?;
            match mount["subPath"].as_str() {
                Some(key) => {
                    let content = files.get(key).ok_or_else(|| {
                        Wait::Config(format!("volume {}: no key {key} for subPath", mount["name"]))
                    })?;
                    std::fs::create_dir_all(host.parent().unwrap()).unwrap();
                    std::fs::write(&host, content).unwrap();
                }
                None => {
                    std::fs::create_dir_all(&host).unwrap();
                    for (key, content) in &files {
                        std::fs::write(host.join(key), content).unwrap();
                    }
                }
            }
            mounts.push((path, host));
        }
        mounts.sort_by_key(|(path, _)| std::cmp::Reverse(path.len()));
        let rewrite = |value: &str| -> String {
            for (path, host) in &mounts {
                if let Some(rest) = value.strip_prefix(path.as_str())
                    && (rest.is_empty() || rest.starts_with('/'))
                {
                    return format!("{}{rest}", host.display());
                }
            }
            value.to_owned()
        };

        // Args: `$(VAR)` expanded; mount paths rewritten; listen addresses
        // moved to the pod's own loopback address, each on its port (the
        // ports are remembered by name for the Services).
        let named_ports: BTreeMap<u64, String> = container["ports"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|p| {
                (
                    p["containerPort"].as_u64().unwrap_or(0),
                    p["name"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect();
        let mut ports = BTreeMap::new();
        let mut args = Vec::new();
        let mut state_dir = false;
        let given: Vec<String> = container["args"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|a| expand(a.as_str().unwrap_or_default(), &env))
            .collect();
        let mut iter = given.iter().peekable();
        while let Some(arg) = iter.next() {
            let (flag, value) = match arg.split_once('=') {
                Some((f, v)) if f.starts_with("--") => (f.to_owned(), Some(v.to_owned())),
                _ if arg.starts_with("--")
                    && iter.peek().is_some_and(|n| !n.starts_with("--"))
                    && takes_value(arg) =>
                {
                    (arg.clone(), iter.next().cloned())
                }
                _ => (arg.clone(), None),
            };
            state_dir |= flag == "--state-dir";
            match value {
                Some(v) if flag.ends_with("-bind-address") && v != "0" => {
                    let container_port: u16 = v.rsplit(':').next().and_then(|p| p.parse().ok()).unwrap_or(0);
                    let host = SocketAddr::new(pod_ip, container_port);
                    let name = named_ports
                        .get(&u64::from(container_port))
                        .cloned()
                        .unwrap_or_default();
                    ports.insert(name, (container_port, host));
                    args.push(format!("{flag}={host}"));
                }
                Some(v) => args.push(format!("{flag}={}", rewrite(&v))),
                None => args.push(rewrite(&flag)),
            }
        }
        // The default state directory (/tmp/egress-proxies-operator) lies
        // on the pod's /tmp volume: said explicitly, rewritten like a mount.
        if !state_dir {
            args.push(format!("--state-dir={}", rewrite("/tmp/egress-proxies-operator")));
        }
        // Any listener the args leave at its default would bind all
        // interfaces: keep it on loopback.
        for (flag, port) in [
            ("--metrics-bind-address", 8080u16),
            ("--health-probe-bind-address", 8081),
            ("--discovery-bind-address", 8090),
            ("--replica-bind-address", 8091),
        ] {
            if !given.iter().any(|a| a.starts_with(flag)) {
                let host = SocketAddr::new(pod_ip, port);
                let name = named_ports.get(&u64::from(port)).cloned().unwrap_or_default();
                ports.insert(name, (port, host));
                args.push(format!("{flag}={host}"));
            }
        }
        Ok(Pod {
            name: pod_name,
            namespace: ns,
            args,
            env,
            dir,
            ports,
        })
    }

    /// An env var's `valueFrom`: `None` for an optional reference that is missing.
    fn env_from(
        &self,
        from: &Value,
        ns: &str,
        pod_name: &str,
        pod_ip: IpAddr,
    ) -> Result<Option<String>, Wait> {
        if let Some(field) = from["fieldRef"]["fieldPath"].as_str() {
            return match field {
                "metadata.name" => Ok(Some(pod_name.to_owned())),
                "metadata.namespace" => Ok(Some(ns.to_owned())),
                "status.podIP" => Ok(Some(pod_ip.to_string())),
                other => Err(Wait::Config(format!(
                    "fieldRef {other} is not known to this kubelet"
                ))),
            };
        }
        for (key, plural, what) in [
            ("secretKeyRef", "secrets", "Secret"),
            ("configMapKeyRef", "configmaps", "ConfigMap"),
        ] {
            let reference = &from[key];
            if reference.is_null() {
                continue;
            }
            let name = reference["name"].as_str().unwrap_or_default();
            let item = reference["key"].as_str().unwrap_or_default();
            let optional = reference["optional"] == true;
            let Some(object) = get(&self.fake, "", plural, ns, name) else {
                return if optional {
                    Ok(None)
                } else {
                    Err(Wait::Config(format!(
                        "CreateContainerConfigError: {what} {ns}/{name} not found (the pod does not start without it)"
                    )))
                };
            };
            return match object_data(&object).remove(item) {
                Some(bytes) => Ok(Some(String::from_utf8_lossy(&bytes).into_owned())),
                None if optional => Ok(None),
                None => Err(Wait::Config(format!(
                    "CreateContainerConfigError: {what} {ns}/{name} has no key {item}"
                ))),
            };
        }
        Err(Wait::Config(format!(
            "valueFrom {from} is not known to this kubelet"
        )))
    }

    /// The files a volume holds (key → content).
    fn volume_files(&self, volume: &Value, ns: &str) -> Result<BTreeMap<String, Vec<u8>>, Wait> {
        for (key, plural, name_key) in [
            ("configMap", "configmaps", "name"),
            ("secret", "secrets", "secretName"),
        ] {
            let source = &volume[key];
            if source.is_null() {
                continue;
            }
            let name = source[name_key].as_str().unwrap_or_default();
            return match get(&self.fake, "", plural, ns, name) {
                Some(object) => Ok(object_data(&object)),
                None if source["optional"] == true => Ok(BTreeMap::new()),
                None => Err(Wait::Config(format!(
                    "volume {}: {key} {ns}/{name} not found (the pod does not start without it)",
                    volume["name"]
                ))),
            };
        }
        if volume.get("emptyDir").is_some() {
            return Ok(BTreeMap::new());
        }
        Err(Wait::Config(format!(
            "volume {volume} is not known to this kubelet"
        )))
    }

    /// The pods of the kubernetes provider (the operator creates them, each
    /// labelled with its Proxy's UID), run once the pod exists: the test's
    /// own proxy as the built-in forward proxy on 127.0.0.1 (its
    /// `spec.port`); any other (the samples' Squid) as a stand-in for a
    /// Squid, on a pod address of its
    /// own at the container's port ([`squid_stand_in`]): it reaches the
    /// Internet's stand-in only, so the samples' health checks pass without
    /// any packet leaving loopback.
    fn run_proxy_pods(&mut self) {
        for pod in list(&self.fake, "", "pods", None) {
            let Some(uid) = pod["metadata"]["labels"]["crawl.example.com/uid"].as_str() else {
                continue;
            };
            if pod["status"]["phase"] == "Running" {
                continue;
            }
            let ip = if self.own_proxy.as_deref() == Some(uid) {
                IpAddr::from([127, 0, 0, 1])
            } else {
                let ip = pod_ip();
                let ports: Vec<u16> = pod["spec"]["containers"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .flat_map(|c| c["ports"].as_array().cloned().unwrap_or_default())
                    .filter_map(|p| p["containerPort"].as_u64().and_then(|p| u16::try_from(p).ok()))
                    .collect();
                for port in ports {
                    let listener = std::net::TcpListener::bind(SocketAddr::new(ip, port)).unwrap();
                    listener.set_nonblocking(true).unwrap();
                    let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                    tokio::spawn(squid_stand_in(listener, self.internet.0));
                }
                ip
            };
            let (ns, name) = (
                pod["metadata"]["namespace"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                pod["metadata"]["name"].as_str().unwrap_or_default().to_owned(),
            );
            let mut state = self.fake.state.lock().unwrap();
            let running = json!({"status": {"phase": "Running", "podIP": ip.to_string(),
                "conditions": [{"type": "Ready", "status": "True"}]}});
            state
                .patch(
                    kind("", "pods"),
                    &ns,
                    &name,
                    "application/merge-patch+json",
                    running,
                    true,
                )
                .unwrap();
        }
    }

    /// Why the operator is not running, for failure messages.
    fn explain(&self) -> String {
        let mut out = String::new();
        if let Some(why) = &self.waiting {
            out.push_str(&format!("the operator's pod cannot start: {why}\n"));
        }
        if let Some((_, _, log)) = &self.operator {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            out.push_str(&format!(
                "--- the operator's log (last 60 lines)\n{}\n",
                lines[lines.len().saturating_sub(60)..].join("\n")
            ));
        } else if self.deployment().is_none() {
            out.push_str("no operator Deployment in the cluster\n");
        }
        out
    }
}

/// Why the kubelet cannot run the pod.
enum Wait {
    /// It never will: the image cannot be pulled.
    Pull(String),
    /// Not yet: something it needs does not exist (yet).
    Config(String),
}

/// What the kubelet runs.
struct Pod {
    /// The pod's name (`POD_NAME`), under which the kubelet records it.
    name: String,
    namespace: String,
    args: Vec<String>,
    env: Vec<(String, String)>,
    dir: PathBuf,
    /// Container port name → (container port, where it listens).
    ports: BTreeMap<String, (u16, SocketAddr)>,
}

/// The part of the Internet the samples need: their health check's
/// `https://www.gstatic.com/generate_204`, served on loopback with a
/// certificate from a CA of the test's own (written to `dir`, trusted by
/// the operator's probes through `HEALTH_CA_FILE`), answering `204`.
async fn internet(dir: &Path) -> (SocketAddr, PathBuf) {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    let key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec![GSTATIC.to_owned()])
        .unwrap()
        .signed_by(&key, &issuer)
        .unwrap();
    let ca_file = dir.join("internet-ca.pem");
    std::fs::write(&ca_file, ca.pem()).unwrap();
    let config = rustls::ServerConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(
        vec![CertificateDer::from(leaf.der().to_vec())],
        PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
    )
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(stream).await else {
                    return;
                };
                let mut head = Vec::new();
                let mut buf = [0u8; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match tls.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let _ = tls
                    .write_all(b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                    .await;
                let _ = tls.shutdown().await;
            });
        }
    });
    (addr, ca_file)
}

/// The samples' health check host, which [`internet`] stands in for.
const GSTATIC: &str = "www.gstatic.com";

/// A sample's Squid pod: `CONNECT www.gstatic.com:443` is relayed to the
/// Internet's stand-in, as a Squid with Internet access would; anything
/// else is answered `503 Service Unavailable`, as Squid answers a
/// destination it cannot reach — no packet leaves loopback.
async fn squid_stand_in(listener: tokio::net::TcpListener, internet: SocketAddr) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    while let Ok((mut stream, _)) = listener.accept().await {
        tokio::spawn(async move {
            let mut head = Vec::new();
            let mut buf = [0u8; 4096];
            let end = loop {
                if let Some(at) = head.windows(4).position(|w| w == b"\r\n\r\n") {
                    break at + 4;
                }
                if head.len() > 65_536 {
                    return;
                }
                match stream.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => head.extend_from_slice(&buf[..n]),
                }
            };
            if head.starts_with(format!("CONNECT {GSTATIC}:443 ").as_bytes())
                && let Ok(mut upstream) = tokio::net::TcpStream::connect(internet).await
            {
                if stream
                    .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                    .await
                    .is_err()
                    || upstream.write_all(&head[end..]).await.is_err()
                {
                    return;
                }
                let _ = tokio::io::copy_bidirectional(&mut stream, &mut upstream).await;
                return;
            }
            let _ = stream
                .write_all(
                    b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                )
                .await;
        });
    }
}

/// A loopback address of a pod's own, as a pod has its own IP: the
/// operator's listeners keep their container ports on it. Checked free on
/// the ports the operator listens on.
fn pod_ip() -> IpAddr {
    loop {
        let bytes = uuid::Uuid::new_v4().into_bytes();
        let ip = IpAddr::from([127, bytes[0].max(1), bytes[1], bytes[2].clamp(2, 254)]);
        if [8080u16, 8081, 8090, 8091, 8888]
            .iter()
            .all(|port| std::net::TcpListener::bind(SocketAddr::new(ip, *port)).is_ok())
        {
            return ip;
        }
    }
}

fn takes_value(flag: &str) -> bool {
    !matches!(
        flag,
        "--leader-elect"
            | "--every-replica-serves"
            | "--trace-health-probes"
            | "--insecure-discovery-without-token"
            | "--gcp-wire-log-full-payloads"
    )
}

/// `$(VAR)` references to variables defined before, as Kubernetes expands them.
fn expand(value: &str, env: &[(String, String)]) -> String {
    let mut out = value.to_owned();
    for (name, v) in env {
        out = out.replace(&format!("$({name})"), v);
    }
    out
}

/// A Secret's or ConfigMap's keys and contents.
fn object_data(object: &Value) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    for (key, value) in object["data"].as_object().into_iter().flatten() {
        let text = value.as_str().unwrap_or_default();
        let bytes = if object["kind"] == "Secret" {
            data_encoding::BASE64.decode(text.as_bytes()).unwrap_or_default()
        } else {
            text.as_bytes().to_vec()
        };
        out.insert(key.clone(), bytes);
    }
    for (key, value) in object["stringData"].as_object().into_iter().flatten() {
        out.insert(
            key.clone(),
            value.as_str().unwrap_or_default().as_bytes().to_vec(),
        );
    }
    out
}

/// `registry.example:5000/team/egress-proxies-operator:1` → `egress-proxies-operator`.
fn image_repository(image: &str) -> &str {
    let last = image.rsplit('/').next().unwrap_or(image);
    last.split(['@', ':']).next().unwrap_or(last)
}

/// An image named without a registry host is one built on a machine and
/// loaded onto the nodes: pulling it (pull policy `Always`, said or implied
/// by `:latest` or no tag) asks Docker Hub, which does not have it.
fn check_pull(container: &Value) -> Result<(), Wait> {
    let image = container["image"].as_str().unwrap_or_default();
    let last = image.rsplit('/').next().unwrap_or(image);
    let tag = last.split_once(':').map(|(_, t)| t);
    let policy = container["imagePullPolicy"]
        .as_str()
        .unwrap_or(if matches!(tag, None | Some("latest")) {
            "Always"
        } else {
            "IfNotPresent"
        });
    let first = image.split('/').next().unwrap_or_default();
    let registry =
        image.contains('/') && (first.contains('.') || first.contains(':') || first == "localhost");
    if policy == "Always" && !registry {
        return Err(Wait::Pull(format!(
            "ErrImagePull: image {image} (pull policy Always) would be pulled from a registry that does not have it: \
             a locally built image is loaded onto the nodes and must not be pulled"
        )));
    }
    Ok(())
}

/// SIGTERM, as the kubelet stops a container, then SIGKILL after a grace period.
fn stop(operator: &mut Killed) {
    let pid = nix::unistd::Pid::from_raw(operator.0.id() as i32);
    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if operator.0.try_wait().ok().flatten().is_some() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// One page's shell: `bash -euo pipefail` reading what to source from a pipe.
struct Shell {
    child: Killed,
    dir: PathBuf,
    log: PathBuf,
    blocks: usize,
    backgrounds: Vec<(String, PathBuf)>,
}

impl Shell {
    fn new(scratch: &Path, page: &str, cwd: &Path, env: &[(String, String)]) -> Self {
        let dir = scratch.join(format!("shell-{page}"));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("output.log");
        let out = std::fs::File::create(&log).unwrap();
        let child = Command::new("bash")
            .args(["-euo", "pipefail"])
            .env_clear()
            .envs(env.iter().cloned())
            .current_dir(cwd)
            .stdin(Stdio::piped())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .process_group(0)
            .spawn()
            .unwrap();
        Self {
            child: Killed(child),
            dir,
            log,
            blocks: 0,
            backgrounds: Vec::new(),
        }
    }

    fn send(&mut self, text: &str) {
        let stdin = self.child.0.stdin.as_mut().unwrap();
        stdin.write_all(text.as_bytes()).unwrap();
        stdin.flush().unwrap();
    }

    fn output(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(80)..].join("\n")
    }

    /// Runs one block; returns once it is done, the kubelet ticking meanwhile.
    async fn run(&mut self, block: &ShellBlock, background: bool, kubelet: &mut Kubelet) {
        self.blocks += 1;
        let n = self.blocks;
        let file = self.dir.join(format!("block-{n}.sh"));
        std::fs::write(&file, block.commands()).unwrap();
        let done = self.dir.join(format!("done-{n}"));
        let marker = format!("printf '\\n--- %s\\n' '{}' >&2\n", block.place());
        if background {
            let pid = self.dir.join(format!("background-{n}"));
            self.send(&format!(
                "{marker}source {f} </dev/null &\necho $! > {p}\n: > {d}\n",
                f = file.display(),
                p = pid.display(),
                d = done.display()
            ));
            self.backgrounds.push((block.place(), pid));
        } else {
            self.send(&format!(
                "{marker}source {} </dev/null\n: > {}\n",
                file.display(),
                done.display()
            ));
        }
        eprintln!(
            "running {}{}",
            block.place(),
            if background { " (background)" } else { "" }
        );
        let started = Instant::now();
        loop {
            kubelet.tick();
            if let Some(why) = &kubelet.pull_failure {
                panic!("{}: the operator's pod cannot run: {why}", block.place());
            }
            if done.exists() {
                break;
            }
            if let Some(status) = self.child.0.try_wait().unwrap() {
                panic!(
                    "{} failed ({status})\n--- its shell's output\n{}\n{}",
                    block.place(),
                    self.output(),
                    kubelet.explain()
                );
            }
            if started.elapsed() > BLOCK_TIMEOUT {
                panic!(
                    "{} did not finish within {BLOCK_TIMEOUT:?}\n--- its shell's output\n{}\n{}",
                    block.place(),
                    self.output(),
                    kubelet.explain()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if background {
            // A background block is a server: it must keep running.
            let pid_file = &self.backgrounds.last().unwrap().1;
            tokio::time::sleep(Duration::from_secs(5)).await;
            let pid: i32 = std::fs::read_to_string(pid_file).unwrap().trim().parse().unwrap();
            assert!(
                alive(pid),
                "{}: the background block exited within 5 s\n--- its shell's output\n{}",
                block.place(),
                self.output()
            );
        }
    }

    /// At the end of the page: every background block still running.
    fn finish(mut self) {
        for (place, pid_file) in &self.backgrounds {
            let pid: i32 = std::fs::read_to_string(pid_file).unwrap().trim().parse().unwrap();
            assert!(
                alive(pid),
                "{place}: the background block stopped before the page ended\n{}",
                self.output()
            );
        }
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(self.child.0.id() as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
        let _ = self.child.0.wait();
    }
}

fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            !s.rsplit(')')
                .next()
                .unwrap_or_default()
                .trim_start()
                .starts_with('Z')
        })
        .unwrap_or(false)
}

/// The `## ` heading a block is under.
fn section_of(block: &ShellBlock) -> String {
    let text = std::fs::read_to_string(&block.file).unwrap();
    text.lines()
        .take(block.line)
        .filter(|l| l.starts_with("## "))
        .last()
        .unwrap_or_default()
        .trim_start_matches("## ")
        .to_owned()
}

fn kubernetes_blocks(file: &Path) -> Vec<(ShellBlock, bool)> {
    shell_blocks(file)
        .into_iter()
        .filter_map(|b| match &b.marker {
            Some(Ok(Marker::Run {
                bed: Bed::Kubernetes,
                background,
            })) => {
                let background = *background;
                Some((b, background))
            }
            _ => None,
        })
        .collect()
}

/// After a page: every Proxy `Ready` and every pool's `Ready` condition
/// true, but where the pages so far expect otherwise (`expect` markers;
/// `support::doc_blocks`); a phase still changing gets [`PHASE_TIMEOUT`].
async fn phases_as_expected(
    page: &str,
    kubelet: &mut Kubelet,
    expected: &BTreeMap<(String, String), String>,
) {
    let started = Instant::now();
    loop {
        kubelet.tick();
        let proxies = list(&kubelet.fake, "crawl.example.com", "proxies", None);
        let pools = list(&kubelet.fake, "crawl.example.com", "proxypools", None);
        let wrong = support::doc_blocks::unexpected_phases(true, &proxies, &pools, expected);
        if wrong.is_empty() {
            return;
        }
        assert!(
            started.elapsed() < PHASE_TIMEOUT,
            "after {page}: {}\n{}",
            wrong.join("; "),
            kubelet.explain()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Adds the `kubernetes` expectations of `page` to `expected`.
fn expect_from(page: &Path, expected: &mut BTreeMap<(String, String), String>) {
    for expectation in support::doc_blocks::expectations(page) {
        let expectation = expectation.unwrap_or_else(|e| panic!("{}: {e}", page.display()));
        if expectation.bed == Bed::Kubernetes {
            expected.insert((expectation.kind, expectation.name), expectation.phase);
        }
    }
}

/// The test's own Ready proxy in the crawler namespace (see the module doc).
async fn add_own_proxy(kubelet: &mut Kubelet) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(egress_proxies::adapters::forward_proxy::serve(
        listener,
        support::open_to_loopback(),
        None,
    ));
    let (target, _) =
        support::target_server::http_target_with(support::target_server::Behaviour::Status(204)).await;
    let proxy = json!({
        "apiVersion": "crawl.example.com/v1alpha1", "kind": "Proxy",
        "metadata": {"name": "doc-test-ready", "namespace": CRAWLERS},
        "spec": {"mode": "Managed", "provider": "kubernetes", "port": addr.port(),
                 "healthCheck": {"url": format!("http://{target}/generate_204"), "interval": "1s"}}
    });
    let created = kubelet
        .fake
        .state
        .lock()
        .unwrap()
        .create(kind("crawl.example.com", "proxies"), CRAWLERS, proxy)
        .expect("the crawler namespace and the Proxy CRD exist after install.md");
    let uid = created["metadata"]["uid"].as_str().unwrap().to_owned();
    kubelet.own_proxy = Some(uid);
    let started = Instant::now();
    loop {
        kubelet.tick();
        let phase = get(
            &kubelet.fake,
            "crawl.example.com",
            "proxies",
            CRAWLERS,
            "doc-test-ready",
        )
        .map(|p| p["status"].clone())
        .unwrap_or_default();
        if phase["phase"] == "Ready" {
            return;
        }
        assert!(
            started.elapsed() < PHASE_TIMEOUT,
            "the test's own proxy did not become Ready: {phase}\n{}",
            kubelet.explain()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A crawler pod as docs/install.md and docs/clients.md write it leases
/// with the Python client: the `env` of each of their YAML examples that
/// sets `EGRESS_PROXIES_URL` is resolved as the kubelet would (values, and
/// Secret keys from the crawler namespace) and given, with nothing else of
/// ours, to a Python process that takes and gives back a lease. Cluster DNS
/// for the Service names is a `sitecustomize` mapping them to the pod
/// addresses behind them (as `~/.curlrc` does for curl).
fn crawler_pod_leases(kubelet: &Kubelet) {
    let Some(python) = support::clients_python() else {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must install the Python client's venv (tests/python-clients-setup.sh)"
        );
        eprintln!(
            "SKIP: the crawler pod's lease with the Python client: no venv (tests/python-clients-setup.sh)"
        );
        return;
    };
    let dns = std::fs::read_to_string(kubelet.root.join("cluster-dns.json")).unwrap();
    let site = kubelet.root.join("crawler-pod-site");
    std::fs::create_dir_all(&site).unwrap();
    std::fs::write(
        site.join("sitecustomize.py"),
        format!(
            "# Cluster DNS for the doc test's crawler pod: Service names to pod addresses.\n\
             import socket\n_names = {dns}\n_real = socket.getaddrinfo\n\
             def _getaddrinfo(host, *args, **kwargs):\n    return _real(_names.get(host, host), *args, **kwargs)\n\
             socket.getaddrinfo = _getaddrinfo\n"
        ),
    )
    .unwrap();
    let mut checked = 0;
    for page in ["docs/install.md", "docs/clients.md"] {
        let text = std::fs::read_to_string(repo_root().join(page)).unwrap();
        for (line, yaml) in yaml_blocks(&text) {
            let Ok(documents) = serde_saphyr::from_multiple::<Value>(&yaml) else {
                continue;
            };
            for env in documents.iter().flat_map(container_envs) {
                if !env.iter().any(|v| v["name"] == "EGRESS_PROXIES_URL") {
                    continue;
                }
                checked += 1;
                let place = format!("{page}:{line}");
                let mut vars: Vec<(String, String)> = Vec::new();
                for var in &env {
                    let name = var["name"].as_str().unwrap_or_default().to_owned();
                    let value = match (var["value"].as_str(), &var["valueFrom"]["secretKeyRef"]) {
                        (Some(value), _) => value.to_owned(),
                        (None, secret) if secret.is_object() => {
                            let (secret_name, key) = (
                                secret["name"].as_str().unwrap_or_default(),
                                secret["key"].as_str().unwrap_or_default(),
                            );
                            let found = get(&kubelet.fake, "", "secrets", CRAWLERS, secret_name).unwrap_or_else(|| {
                                panic!("{place}: the crawler pod's Secret {CRAWLERS}/{secret_name} does not exist after install.md")
                            });
                            let data = object_data(&found);
                            let bytes = data.get(key).unwrap_or_else(|| {
                                panic!("{place}: Secret {CRAWLERS}/{secret_name} has no key {key}")
                            });
                            String::from_utf8(bytes.clone()).unwrap()
                        }
                        _ => panic!("{place}: env {name} is neither a value nor a Secret key"),
                    };
                    vars.push((name, value));
                }
                let out = Command::new(&python)
                    .args([
                        "-c",
                        "from egress_proxies import LeaseClient\n\
                         with LeaseClient() as client:\n    \
                         lease = client.acquire('example.org')\n    \
                         client.release(lease)\n    \
                         print(lease.proxy.name)\n",
                    ])
                    .env_clear()
                    .envs(vars.iter().cloned())
                    .env("PATH", "/usr/bin:/bin")
                    .env(
                        "PYTHONPATH",
                        format!(
                            "{}:{}",
                            repo_root().join("clients/python/src").display(),
                            site.display()
                        ),
                    )
                    .env("PYTHONDONTWRITEBYTECODE", "1")
                    .output()
                    .unwrap();
                assert!(
                    out.status.success(),
                    "{place}: a crawler pod with this environment ({}) cannot lease with the Python client:\n{}",
                    vars.iter()
                        .map(|(k, _)| k.as_str())
                        .collect::<Vec<_>>()
                        .join(", "),
                    String::from_utf8_lossy(&out.stderr)
                );
                eprintln!(
                    "{place}: a crawler pod with this environment leased {}",
                    String::from_utf8_lossy(&out.stdout).trim()
                );
            }
        }
    }
    assert!(
        checked >= 2,
        "install.md and clients.md each show a crawler pod's env ({checked} found)"
    );
}

/// The YAML blocks of a Markdown text, with their 1-based opening lines.
fn yaml_blocks(text: &str) -> Vec<(usize, String)> {
    let mut blocks = Vec::new();
    let mut open: Option<(usize, usize, String)> = None;
    for (n, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        match &mut open {
            None if trimmed.starts_with("```yaml") || trimmed.starts_with("```yml") => {
                open = Some((n + 1, indent, String::new()));
            }
            Some((at, _, code)) if trimmed.starts_with("```") => {
                blocks.push((*at, std::mem::take(code)));
                open = None;
            }
            Some((_, indent, code)) => {
                code.push_str(
                    line.get((*indent).min(line.len() - trimmed.len())..)
                        .unwrap_or(""),
                );
                code.push('\n');
            }
            None => {}
        }
    }
    blocks
}

/// Every `env` list of a container anywhere in a YAML document.
fn container_envs(document: &Value) -> Vec<Vec<Value>> {
    let mut found = Vec::new();
    match document {
        Value::Object(map) => {
            for (key, value) in map {
                match (key.as_str(), value) {
                    ("env", Value::Array(vars)) => found.push(vars.clone()),
                    _ => found.extend(container_envs(value)),
                }
            }
        }
        Value::Array(items) => found.extend(items.iter().flat_map(container_envs)),
        _ => {}
    }
    found
}

/// The label crawler pods carry (install.md, clients.md).
const CRAWLER_LABEL: (&str, &str) = ("crawl.example.com/proxy-client", "true");

/// Whether `selector` (matchLabels only; empty matches all) matches `labels`.
fn selects(selector: &Value, labels: &Value) -> bool {
    assert!(
        selector.get("matchExpressions").is_none(),
        "this check reads matchLabels only: {selector}"
    );
    selector["matchLabels"]
        .as_object()
        .into_iter()
        .flatten()
        .all(|(k, v)| labels[k] == *v)
}

/// Whether the cluster's NetworkPolicies let a pod with `from_labels` in
/// namespace `from_ns` reach TCP `port` of a pod with `labels` in `ns`, as a
/// network plugin enforcing them would: allowed when no policy selects the
/// target for ingress, else when a rule of one that does admits the peer.
fn admitted(
    fake: &FakeApiServer,
    from_ns: &str,
    from_labels: &Value,
    ns: &str,
    labels: &Value,
    port: u64,
) -> bool {
    let ns_labels = get(fake, "", "namespaces", "", from_ns)
        .map(|n| n["metadata"]["labels"].clone())
        .unwrap_or_default();
    let policies: Vec<Value> = list(fake, "networking.k8s.io", "networkpolicies", Some(ns))
        .into_iter()
        .filter(|p| selects(&p["spec"]["podSelector"], labels))
        .filter(|p| {
            p["spec"]["policyTypes"]
                .as_array()
                .is_none_or(|t| t.iter().any(|t| t == "Ingress"))
        })
        .collect();
    policies.is_empty()
        || policies.iter().any(|policy| {
            policy["spec"]["ingress"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|rule| {
                    let peer = rule["from"].as_array().is_none_or(|peers| {
                        peers.iter().any(|peer| {
                            let in_ns = match peer.get("namespaceSelector") {
                                Some(selector) => selects(selector, &ns_labels),
                                None => from_ns == ns,
                            };
                            in_ns && peer.get("podSelector").is_none_or(|s| selects(s, from_labels))
                        })
                    });
                    let on_port = rule["ports"]
                        .as_array()
                        .is_none_or(|ports| ports.iter().any(|p| p["port"].as_u64() == Some(port)));
                    peer && on_port
                })
        })
}

/// A crawler pod as install.md and clients.md describe it (the label, in
/// the namespace `crawlers`) reaches the lease API, the gateway and a Squid
/// pod; one without the label reaches none, so the label is what the docs
/// must say.
fn crawler_pods_are_admitted(kubelet: &Kubelet) {
    let (key, value) = CRAWLER_LABEL;
    for page in ["docs/install.md", "docs/clients.md"] {
        let text = std::fs::read_to_string(repo_root().join(page)).unwrap();
        assert!(
            text.contains(&format!("{key}: \"{value}\"")),
            "{page} names the crawler label {key}: \"{value}\""
        );
    }
    let fake = &kubelet.fake;
    let crawler = json!({ key: value, "app": "crawler" });
    let stranger = json!({"app": "crawler"});
    let deployment = kubelet.deployment().expect("the operator's Deployment");
    let operator_ns = deployment["metadata"]["namespace"].as_str().unwrap_or_default();
    let operator_labels = &deployment["spec"]["template"]["metadata"]["labels"];
    let container_port = |name: &str| {
        deployment["spec"]["template"]["spec"]["containers"][0]["ports"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|p| p["name"] == name)
            .and_then(|p| p["containerPort"].as_u64())
            .unwrap_or_else(|| panic!("the container's {name} port"))
    };
    let (discovery_port, gateway_port) = (container_port("discovery"), container_port("gateway"));
    let squid = list(fake, "", "pods", Some(CRAWLERS))
        .into_iter()
        .next()
        .expect("a Squid pod of the samples in crawlers");
    let squid_port = squid["spec"]["containers"][0]["ports"][0]["containerPort"]
        .as_u64()
        .unwrap_or(3128);
    let squid_labels = &squid["metadata"]["labels"];
    for (what, ns, labels, port) in [
        ("the lease API", operator_ns, operator_labels, discovery_port),
        ("the gateway", operator_ns, operator_labels, gateway_port),
        ("a Squid pod", CRAWLERS, squid_labels, squid_port),
    ] {
        assert!(
            admitted(fake, CRAWLERS, &crawler, ns, labels, port),
            "a labelled crawler pod reaches {what}"
        );
        assert!(
            !admitted(fake, CRAWLERS, &stranger, ns, labels, port),
            "the NetworkPolicies keep an unlabelled pod from {what}"
        );
    }
}

/// README's Kubernetes summary repeats install.md's commands, word for word.
fn readme_summary_matches_install(install: &[(ShellBlock, bool)]) {
    let readme = repo_root().join("README.md");
    let install_text: Vec<String> = install.iter().map(|(b, _)| b.commands()).collect();
    let install_text = install_text.join("\n");
    let normal = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
    let install_lines: Vec<String> = install_text
        .replace("\\\n", " ")
        .lines()
        .map(|l| normal(l.split(" #").next().unwrap_or(l)))
        .collect();
    for block in shell_blocks(&readme)
        .into_iter()
        .filter(|b| section_of(b) == "Kubernetes mode")
    {
        for line in block.commands().replace("\\\n", " ").lines() {
            let line = normal(line.split(" #").next().unwrap_or(line));
            if line.is_empty() {
                continue;
            }
            assert!(
                install_lines.iter().any(|l| l == &line),
                "{}: `{line}` is not a command of docs/install.md",
                block.place()
            );
        }
    }
}

#[actix_rt::test]
async fn the_kubernetes_docs_work_as_written_against_a_cluster() {
    let kubectl = kubectl();
    let fake = FakeApiServer::start_cluster().unwrap();
    let scratch = Scratch(tempfile::tempdir().unwrap());
    // The docs run in the fresh checkout, with the real cargo.
    let checkout = support::checkout::Checkout::take();
    let _checkout_reaper = support::process::Reaper(checkout.root().to_owned());
    let repo = checkout.root().to_owned();
    let (home, bin) = (scratch.path().join("home"), scratch.path().join("bin"));
    for dir in [&home, &bin] {
        std::fs::create_dir_all(dir).unwrap();
    }
    let kubeconfig = scratch.path().join("kubeconfig");
    std::fs::write(&kubeconfig, fake.kubeconfig("default")).unwrap();
    std::os::unix::fs::symlink(&kubectl, bin.join("kubectl")).unwrap();
    std::os::unix::fs::symlink(checkout.release_binary(), bin.join("egress-proxies-operator")).unwrap();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let mut env: Vec<(String, String)> = vec![
        ("PATH".into(), path),
        ("HOME".into(), home.display().to_string()),
        ("KUBECONFIG".into(), kubeconfig.display().to_string()),
        ("TMPDIR".into(), scratch.path().display().to_string()),
    ];
    env.extend(support::checkout::cargo_env());
    checkout.build_release(&env, &scratch.path().join("cargo-build.log"));
    let mut expected = BTreeMap::new();
    let mut kubelet = Kubelet {
        fake: fake.clone(),
        root: scratch.path().join("kubelet"),
        home: home.clone(),
        kubeconfig: kubeconfig.clone(),
        operator: None,
        waiting: None,
        pull_failure: None,
        started: 0,
        own_proxy: None,
        pod_record: None,
        internet: internet(scratch.path()).await,
    };
    std::fs::create_dir_all(&kubelet.root).unwrap();

    let install = repo_root().join("docs/install.md");
    // Fixed ports a block binds (a local operator's listeners) must be free.
    let busy: Vec<String> = user_docs()
        .iter()
        .flat_map(|page| kubernetes_blocks(page))
        .flat_map(|(block, _)| {
            support::doc_blocks::named_ports(&block.commands())
                .into_iter()
                .map(move |addr| (addr, block.place()))
        })
        .filter(|(addr, _)| std::net::TcpListener::bind(addr).is_err())
        .map(|(addr, place)| format!("{addr} (named at {place})"))
        .collect();
    assert!(
        busy.is_empty(),
        "ports the docs' blocks use are in use by something else; stop it first:\n{}",
        busy.join("\n")
    );
    let install_blocks = kubernetes_blocks(&install);
    assert!(
        !install_blocks.is_empty(),
        "docs/install.md has kubernetes blocks"
    );
    readme_summary_matches_install(&install_blocks);
    let (uninstall, install_steps): (Vec<_>, Vec<_>) = install_blocks
        .into_iter()
        .partition(|(b, _)| section_of(b) == "Uninstall");

    // install.md, as a reader follows it.
    let mut shell = Shell::new(scratch.path(), "install", &repo, &env);
    for (block, background) in &install_steps {
        shell.run(block, *background, &mut kubelet).await;
    }
    shell.finish();
    assert!(
        kubelet.operator.is_some(),
        "after docs/install.md the operator runs\n{}",
        kubelet.explain()
    );
    // The image the Deployment runs is the one install.md builds and loads.
    let deployment = kubelet.deployment().unwrap();
    let image = deployment["spec"]["template"]["spec"]["containers"][0]["image"]
        .as_str()
        .unwrap()
        .to_owned();
    // A tag per build: the version and the checkout's commit.
    let commit = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(&repo)
        .output()
        .unwrap();
    let version = env!("CARGO_PKG_VERSION");
    let tag = format!("{version}-{}", String::from_utf8_lossy(&commit.stdout).trim());
    assert_eq!(
        image,
        format!("egress-proxies-operator:{tag}"),
        "the Deployment runs the image of this build"
    );
    let text = std::fs::read_to_string(&install).unwrap();
    assert!(
        text.contains("docker build") && text.matches("egress-proxies-operator:$TAG").count() >= 2,
        "docs/install.md builds and loads egress-proxies-operator:$TAG, the image the Deployment runs"
    );
    expect_from(&install, &mut expected);
    phases_as_expected("docs/install.md", &mut kubelet, &expected).await;
    crawler_pods_are_admitted(&kubelet);
    add_own_proxy(&mut kubelet).await;
    crawler_pod_leases(&kubelet);

    // Every other page.
    for page in user_docs() {
        if page == install {
            continue;
        }
        let blocks = kubernetes_blocks(&page);
        if blocks.is_empty() {
            continue;
        }
        let name = page.file_stem().unwrap().to_string_lossy().into_owned();
        let mut shell = Shell::new(scratch.path(), &name, &repo, &env);
        for (block, background) in &blocks {
            shell.run(block, *background, &mut kubelet).await;
        }
        shell.finish();
        expect_from(&page, &mut expected);
        phases_as_expected(
            &page
                .strip_prefix(repo_root())
                .unwrap_or(&page)
                .display()
                .to_string(),
            &mut kubelet,
            &expected,
        )
        .await;
    }

    // install.md's Uninstall, last: the cluster is left without the install.
    let mut shell = Shell::new(scratch.path(), "uninstall", &repo, &env);
    for (block, background) in &uninstall {
        shell.run(block, *background, &mut kubelet).await;
    }
    shell.finish();
    kubelet.tick();
    assert!(kubelet.operator.is_none(), "after the uninstall no operator runs");
    let left: Vec<String> = [
        ("", "namespaces"),
        ("apiextensions.k8s.io", "customresourcedefinitions"),
    ]
    .into_iter()
    .flat_map(|(g, p)| list(&fake, g, p, None))
    .map(|o| o["metadata"]["name"].as_str().unwrap_or_default().to_owned())
    .filter(|n| !["default", "kube-system", "kube-public", "kube-node-lease", "dev"].contains(&n.as_str()))
    .collect();
    assert!(left.is_empty(), "the uninstall leaves {left:?}");
}
