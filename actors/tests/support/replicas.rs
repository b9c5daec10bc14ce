//! Several operator replicas as real processes against one in-process fake
//! API server, as a Deployment runs them: each replica `i` (from 0) is the
//! pod `replica-i` (`POD_NAME`), binds every listener (health, discovery,
//! gateway, metrics) on a loopback address of its own, `127.R.S.(i+1)` with
//! R and S drawn per bed (its pod IP), and reaches the API server through a
//! [`link`](FakeApiServer::link) of its own — so a test can cut one replica
//! off alone ([`ReplicaBed::cut`]) and tell each replica's requests apart
//! ([`ReplicaBed::api_requests`]). All run with `--leader-elect
//! --lease-duration 3s --insecure-discovery-without-token` on one shared
//! [`OperatorDir`] (its `state/` a shared volume: the local provider's
//! instances outlive the replica that made them and are adopted by the
//! next leader), with the gateway open to loopback sites.
//!
//! A restarted replica ([`ReplicaBed::restart`]) keeps its addresses and
//! link, as a restarted container keeps its pod. Nothing outlives the bed:
//! every process is SIGKILLed when it is dropped (and the directory's
//! reaper kills the proxies).

use std::ffi::OsString;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener};
use std::time::Duration;

use fake_apiserver::{FakeApiServer, RequestCounts};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, DynamicObject, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};

use super::operator::{OperatorBuilder, OperatorDir, OperatorProcess};
use super::service::{Backend, FakeService};

/// The namespace everything lives in (the kubeconfigs' namespace).
pub const NAMESPACE: &str = "crawl";
/// The leader Lease's name.
pub const LEADER_LEASE: &str = "egress-proxies-operator";
/// `--lease-duration` of every replica.
pub const LEASE_DURATION: Duration = Duration::from_secs(3);
/// How long a wait for a replica (its start, its readiness) may take.
const PATIENCE: Duration = Duration::from_secs(60);

/// The listeners of one replica, all on its own IP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplicaAddrs {
    pub ip: Ipv4Addr,
    /// `/healthz`, `/readyz`.
    pub health: SocketAddr,
    /// The discovery and lease API (and the dashboard).
    pub discovery: SocketAddr,
    pub gateway: SocketAddr,
    /// `/metrics`, plain HTTP.
    pub metrics: SocketAddr,
    /// The replicas' internal listener (`--replica-bind-address`).
    pub internal: SocketAddr,
}

/// Which of a replica's ports a [`FakeService`] fronts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Port {
    Discovery,
    Gateway,
}

/// How to start a bed; [`ReplicaBed::start`] for the defaults.
pub struct ReplicaBedBuilder {
    replicas: usize,
    args: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
    providers: Option<String>,
    gateway: String,
}

impl ReplicaBedBuilder {
    /// Arguments every replica gets after the bed's own.
    pub fn args<S: Into<OsString>>(mut self, args: impl IntoIterator<Item = S>) -> Self {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Only the leader serves crawlers (`--every-replica-serves=false`),
    /// as before every replica served.
    pub fn leader_only(self) -> Self {
        self.args(["--every-replica-serves=false"])
    }

    /// An environment variable of every replica (`DISCOVERY_TOKEN`, say).
    pub fn env(mut self, key: impl Into<OsString>, value: impl Into<OsString>) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    /// `providers.yaml` (default: [`ReplicaBed::local_provider`], the local
    /// provider whose proxies leave from the bed's proxy network).
    pub fn providers(mut self, yaml: &str) -> Self {
        self.providers = Some(yaml.to_owned());
        self
    }

    /// More of the gateway's settings (`--gateway-config`), YAML flow-map
    /// members after `destinations` (`capacityWait: 10s, blocks: [...]`).
    pub fn gateway(mut self, settings: &str) -> Self {
        self.gateway = settings.to_owned();
        self
    }

    /// Starts the fake API server and every replica, each waited for until
    /// it answers `/healthz` (not until one leads: [`ReplicaBed::wait_leader`]).
    pub async fn start(self) -> ReplicaBed {
        let fake = FakeApiServer::start().unwrap();
        let (r, s) = draw_network(self.replicas);
        let providers = self
            .providers
            .unwrap_or_else(|| ReplicaBed::local_provider_on(&proxy_network(r, s)));
        let dir = OperatorDir::new(&providers);
        let settings = if self.gateway.is_empty() {
            String::new()
        } else {
            format!(", {}", self.gateway)
        };
        dir.write(
            "gateway.yaml",
            format!("{{destinations: {{allow: [127.0.0.0/8, 1024-65535]}}{settings}}}\n"),
        );
        let client = kube::Client::try_from(kube::Config::new(fake.url().parse().unwrap())).unwrap();
        let mut bed = ReplicaBed {
            client,
            dir,
            network: (r, s),
            args: self.args,
            env: self.env,
            replicas: Vec::new(),
            fake,
        };
        for i in 0..self.replicas {
            let ip = Ipv4Addr::new(127, r, s, u8::try_from(i + 1).unwrap());
            let ports = free_ports(ip, 5);
            let addrs = ReplicaAddrs {
                ip,
                health: SocketAddr::from((ip, ports[0])),
                discovery: SocketAddr::from((ip, ports[1])),
                gateway: SocketAddr::from((ip, ports[2])),
                metrics: SocketAddr::from((ip, ports[3])),
                internal: SocketAddr::from((ip, ports[4])),
            };
            let link = bed.fake.link().unwrap();
            bed.replicas.push(Replica {
                addrs,
                link,
                process: None,
            });
        }
        let spawned: Vec<OperatorProcess> = (0..self.replicas)
            .map(|i| bed.replica_builder(i).spawn())
            .collect();
        for (i, process) in spawned.into_iter().enumerate() {
            process.wait_healthy().await;
            bed.replicas[i].process = Some(process);
        }
        bed
    }
}

struct Replica {
    addrs: ReplicaAddrs,
    link: FakeApiServer,
    /// `None` only while the bed starts.
    process: Option<OperatorProcess>,
}

/// The bed; see the module's documentation.
pub struct ReplicaBed {
    // Processes first: they are killed before the directory goes.
    replicas: Vec<Replica>,
    pub dir: OperatorDir,
    /// The fake API server (the test's own address to it; each replica has a link).
    pub fake: FakeApiServer,
    /// A client on the fake's own address: the test's requests never count
    /// on a replica's link.
    pub client: kube::Client,
    network: (u8, u8),
    args: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
}

impl ReplicaBed {
    /// `n` replicas where only the leader serves, with `extra_args`.
    pub async fn start_leader_only(n: usize, extra_args: &[&str]) -> Self {
        Self::builder(n).leader_only().args(extra_args).start().await
    }

    pub fn builder(n: usize) -> ReplicaBedBuilder {
        ReplicaBedBuilder {
            replicas: n,
            args: Vec::new(),
            env: Vec::new(),
            providers: None,
            gateway: String::new(),
        }
    }

    /// The local provider (built-in proxies) open to loopback sites, its
    /// proxies leaving from addresses in `network` (one each).
    pub fn local_provider_on(network: &str) -> String {
        format!(
            "providers:\n  - {{name: local, type: local, local: {{implementation: builtin, \
             destinations: {{allow: [127.0.0.0/8, 1024-65535]}}, outgoingAddresses: [{network}]}}}}\n"
        )
    }

    /// Where the default provider's proxies leave from: `127.R.S.128/26`,
    /// so a [`Site`](super::site::Site) tells the proxies apart.
    pub fn proxy_network(&self) -> String {
        proxy_network(self.network.0, self.network.1)
    }

    /// How many replicas the bed has.
    pub fn len(&self) -> usize {
        self.replicas.len()
    }

    pub fn pod_name(i: usize) -> String {
        format!("replica-{i}")
    }

    /// The replica a pod name names.
    pub fn index_of(pod: &str) -> Option<usize> {
        pod.strip_prefix("replica-")?.parse().ok()
    }

    pub fn addrs(&self, i: usize) -> ReplicaAddrs {
        self.replicas[i].addrs
    }

    /// Replica `i`'s running (or exited) process.
    pub fn process(&self, i: usize) -> &OperatorProcess {
        self.replicas[i].process.as_ref().expect("started")
    }

    /// Replica `i`'s own path to the API server.
    pub fn link(&self, i: usize) -> &FakeApiServer {
        &self.replicas[i].link
    }

    /// The requests replica `i` made to the API server (every process of
    /// it, restarts included), by verb, resource and code.
    pub fn api_requests(&self, i: usize) -> RequestCounts {
        self.replicas[i].link.link_requests()
    }

    /// Cuts replica `i` off the API server alone: its requests and watch
    /// events are held unanswered, connections open, until [`heal`](Self::heal).
    pub fn cut(&self, i: usize) {
        self.replicas[i].link.stall();
    }

    pub fn heal(&self, i: usize) {
        self.replicas[i].link.resume();
    }

    /// Drops `arg` from the arguments of every later (re)start, as a
    /// rollout of other flags would (`--every-replica-serves=false` gone).
    pub fn forget_arg(&mut self, arg: &str) {
        self.args.retain(|a| a != arg);
    }

    /// SIGKILLs replica `i` and waits until it has exited.
    pub async fn kill(&self, i: usize) -> std::process::ExitStatus {
        self.process(i).kill().await
    }

    /// Starts replica `i` again (killing it first if it runs), on the same
    /// addresses and link; returns once it answers `/healthz`.
    pub async fn restart(&mut self, i: usize) {
        self.kill(i).await;
        let process = self.replica_builder(i).spawn();
        process.wait_healthy().await;
        self.replicas[i].process = Some(process);
    }

    /// Whether replica `i` answers `/readyz` with 200 within a second.
    pub async fn ready(&self, i: usize) -> bool {
        let look = super::http::try_request(self.addrs(i).health, "GET", "/readyz");
        matches!(
            tokio::time::timeout(Duration::from_secs(1), look).await,
            Ok(Ok(200))
        )
    }

    /// The replicas ready now.
    pub async fn ready_replicas(&self) -> Vec<usize> {
        let mut ready = Vec::new();
        for i in 0..self.len() {
            if self.ready(i).await {
                ready.push(i);
            }
        }
        ready
    }

    /// The replica the leader Lease names as its holder (it may be dead:
    /// the record outlives its holder by the lease duration).
    pub async fn leader(&self) -> Option<usize> {
        let leases: Api<Lease> = Api::namespaced(self.client.clone(), NAMESPACE);
        let lease = leases.get_opt(LEADER_LEASE).await.ok()??;
        Self::index_of(&lease.spec?.holder_identity?)
    }

    /// Waits until the Lease's holder is ready; returns it. (Whether the
    /// others are ready too is the test's to say: today they are not.)
    pub async fn wait_leader(&self) -> usize {
        super::eventually_explained(
            "a replica holding the leader Lease and ready",
            PATIENCE,
            || self.logs(),
            async || {
                let holder = self.leader().await;
                match holder {
                    Some(h) if self.ready(h).await => Ok(h),
                    _ => Err(format!(
                        "holder {holder:?}, ready {:?}",
                        self.ready_replicas().await
                    )),
                }
            },
        )
        .await
    }

    /// Replica `i`'s `/metrics` text.
    pub async fn metrics(&self, i: usize) -> String {
        let (status, text) = super::http::request(self.addrs(i).metrics, "GET", "/metrics", &[], None).await;
        assert_eq!(status, 200, "replica {i}'s /metrics: {text}");
        text
    }

    /// One sample of replica `i`'s metrics: `name` with exactly `labels`
    /// (`r#"{state="ready"}"#`, or `""` for none).
    pub async fn metric(&self, i: usize, name: &str, labels: &str) -> Option<f64> {
        let wanted = format!("{name}{labels} ");
        self.metrics(i)
            .await
            .lines()
            .find_map(|l| l.strip_prefix(&wanted)?.trim().parse().ok())
    }

    /// Waits until every replica's share holds `slots` slots
    /// (`egress_proxies_share_slots`).
    pub async fn wait_share_slots(&self, slots: f64, what: &str) {
        super::eventually_explained(
            what,
            PATIENCE,
            || self.logs(),
            async || {
                let mut held = Vec::new();
                for i in 0..self.len() {
                    held.push(self.metric(i, "egress_proxies_share_slots", "").await);
                }
                held.iter()
                    .all(|h| *h == Some(slots))
                    .then_some(())
                    .ok_or(format!("{held:?}"))
            },
        )
        .await;
    }

    /// Replica `i`'s dashboard data (`GET /v1/dashboard`): `None` while it
    /// does not answer 200 (a follower today).
    pub async fn dashboard(&self, i: usize) -> Option<Value> {
        let ask = super::http::try_request(self.addrs(i).discovery, "GET", "/v1/dashboard");
        if !matches!(
            tokio::time::timeout(Duration::from_secs(2), ask).await,
            Ok(Ok(200))
        ) {
            return None;
        }
        let (status, text) =
            super::http::request(self.addrs(i).discovery, "GET", "/v1/dashboard", &[], None).await;
        (status == 200)
            .then(|| serde_json::from_str(&text).ok())
            .flatten()
    }

    /// A Service over every replica's `port` (discovery or gateway),
    /// routing to the ready ones.
    pub async fn service(&self, port: Port) -> FakeService {
        let backends = self
            .replicas
            .iter()
            .map(|r| Backend {
                health: r.addrs.health,
                serve: match port {
                    Port::Discovery => r.addrs.discovery,
                    Port::Gateway => r.addrs.gateway,
                },
            })
            .collect();
        FakeService::start(backends).await
    }

    /// Every replica's log, each headed by its file name.
    pub fn logs(&self) -> String {
        self.dir.logs()
    }

    /// The Proxies API in the bed's namespace.
    pub fn proxies(&self) -> Api<DynamicObject> {
        let ar = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("crawl.example.com", "v1alpha1", "Proxy"),
            "proxies",
        );
        Api::namespaced_with(self.client.clone(), NAMESPACE, &ar)
    }

    /// Creates many Proxies, 32 requests at a time (3,000 in seconds).
    pub async fn apply_proxies(&self, proxies: impl IntoIterator<Item = (String, Value)>) {
        use futures::StreamExt;
        futures::stream::iter(proxies)
            .map(|(name, spec)| async move { self.apply_proxy(&name, spec).await })
            .buffer_unordered(32)
            .collect::<Vec<()>>()
            .await;
    }

    /// Creates the Proxy `name` with `spec`.
    pub async fn apply_proxy(&self, name: &str, spec: Value) {
        let obj: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "crawl.example.com/v1alpha1", "kind": "Proxy",
            "metadata": {"name": name, "namespace": NAMESPACE}, "spec": spec
        }))
        .unwrap();
        // A connection the server closed as the request went out (an idle
        // keep-alive one) is tried again: a create that got through before
        // answers 409 then, which is as good.
        let mut tries = 0;
        loop {
            match self.proxies().create(&PostParams::default(), &obj).await {
                Ok(_) => return,
                Err(kube::Error::Api(status)) if status.code == 409 && tries > 0 => return,
                Err(kube::Error::Service(e)) if tries < 5 => {
                    tries += 1;
                    eprintln!("creating Proxy {name}: {e}; trying again");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("creating Proxy {name}: {e}"),
            }
        }
    }

    /// Waits until every Proxy named is in `phase` (its status as written).
    pub async fn wait_phase(&self, names: &[&str], phase: &str) {
        super::eventually_explained(
            &format!("{names:?} {phase}"),
            PATIENCE,
            || self.logs(),
            async || {
                let mut not = Vec::new();
                for name in names {
                    let obj = self.proxies().get_opt(name).await.unwrap();
                    let seen = obj.as_ref().map(|o| o.data["status"]["phase"].clone());
                    if seen.as_ref().and_then(Value::as_str) != Some(phase) {
                        not.push(format!("{name}: {seen:?}"));
                    }
                }
                if not.is_empty() {
                    Err(not.join(", "))
                } else {
                    Ok(())
                }
            },
        )
        .await;
    }

    /// Waits until every Proxy named has the condition `kind` (`Healthy`,
    /// `Ready`, `InstanceReady`) with `status` (`"True"`).
    pub async fn wait_condition(&self, names: &[&str], kind: &str, status: &str) {
        super::eventually_explained(
            &format!("{names:?} {kind}={status}"),
            PATIENCE,
            || self.logs(),
            async || {
                let mut not = Vec::new();
                for name in names {
                    let obj = self.proxies().get_opt(name).await.unwrap();
                    let conditions = obj.map(|o| o.data["status"]["conditions"].clone());
                    let has = conditions
                        .as_ref()
                        .and_then(Value::as_array)
                        .is_some_and(|c| c.iter().any(|c| c["type"] == kind && c["status"] == status));
                    if !has {
                        not.push(format!("{name}: {conditions:?}"));
                    }
                }
                if not.is_empty() {
                    Err(not.join(", "))
                } else {
                    Ok(())
                }
            },
        )
        .await;
    }

    /// How replica `i` is started: its name, addresses, link, the bed's flags.
    fn replica_builder(&self, i: usize) -> OperatorBuilder {
        let replica = &self.replicas[i];
        let name = Self::pod_name(i);
        let mut builder = self
            .dir
            .kubernetes(&replica.link.kubeconfig(NAMESPACE))
            .name(&name)
            .env("POD_NAME", &name)
            .health_at(replica.addrs.health)
            .discovery_at(replica.addrs.discovery)
            .metrics_at(replica.addrs.metrics)
            .gateway_at(replica.addrs.gateway)
            .arg("--metrics-secure=false")
            .args(["--leader-elect", "--lease-duration"])
            .arg(format!("{}s", LEASE_DURATION.as_secs()))
            .arg("--insecure-discovery-without-token")
            .arg("--gateway-config")
            .arg(self.dir.path().join("gateway.yaml"))
            // Every replica serves by default; its internal listener is on
            // its own address (the default, :8091, would be shared).
            .arg("--replica-bind-address")
            .arg(replica.addrs.internal.to_string())
            .args(self.args.iter().cloned());
        for (k, v) in &self.env {
            builder = builder.env(k.clone(), v.clone());
        }
        builder
    }
}

fn proxy_network(r: u8, s: u8) -> String {
    format!("127.{r}.{s}.128/26")
}

/// R and S of `127.R.S.0/24`, drawn so that every replica's address binds
/// (any 127/8 address does on Linux) and clear of the 127.0.x.y networks
/// other tests name.
fn draw_network(replicas: usize) -> (u8, u8) {
    loop {
        let (r, s) = (fastrand::u8(100..=254), fastrand::u8(1..=254));
        let binds = (1..=replicas).all(|i| {
            let ip = Ipv4Addr::new(127, r, s, u8::try_from(i).unwrap_or(u8::MAX));
            TcpListener::bind((ip, 0)).is_ok()
        });
        if binds {
            return (r, s);
        }
    }
}

/// `n` distinct ports free on `ip`, below the ephemeral range (see
/// [`free_port`](super::process::free_port) for why).
fn free_ports(ip: Ipv4Addr, n: usize) -> Vec<u16> {
    let mut ports = Vec::with_capacity(n);
    while ports.len() < n {
        let port = 20_000 + fastrand::u16(..12_000);
        if !ports.contains(&port) && TcpListener::bind((IpAddr::V4(ip), port)).is_ok() {
            ports.push(port);
        }
    }
    ports
}
