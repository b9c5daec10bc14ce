//! `KvmHostActor`: one per configured KVM host, each under its own
//! Supervisor. It owns the host's SSH link and a worker thread holding the
//! libvirt connection, where every blocking libvirt call runs (never on the
//! async executor). A dead link, a transport error or a call past its
//! deadline stops the actor — tearing the link down, which also releases a
//! call blocked on it — and its supervisor restarts it (fresh dial, with
//! backoff), while the other hosts carry on.
//!
//! [`KvmHosts`] is the provider's [`HostRunner`]: it routes jobs to the host
//! actors and keeps one image download per (host, image).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::supervision::Node;
use actix::prelude::*;
use async_trait::async_trait;
use egress_proxies::config::{KvmConfig, KvmHost};
use egress_proxies::kvm::image::{
    self, CachedBase, DownloadLimits, Downloader, ImageSpec, Progress, fetch_to_pool,
};
use egress_proxies::kvm::ops;
use egress_proxies::kvm::pool_gc::{self, PoolSweep, SweepPlan};
use egress_proxies::kvm::provider::{HostJob, HostOutput, HostRunner, RunError};
use egress_proxies::kvm::redial::Redial;
use egress_proxies::kvm::session::{HostSession, KvmError};
use egress_proxies::kvm::ssh_key::load_private_key;
use egress_proxies::kvm::ssh_link::{LinkTarget, SshLink};
use egress_proxies::provider::ErrorClass;
use egress_proxies::telemetry::events::KvmHostLinkChanged;
use russh::keys::PrivateKey;
use tokio::sync::oneshot;

/// Longest a single job may take before the link is torn down.
const JOB_DEADLINE: Duration = Duration::from_secs(60);
const DIAL_TIMEOUT: Duration = Duration::from_secs(10);

/// Run a job on this host.
#[derive(Message)]
#[rtype(result = "Result<HostOutput, RunError>")]
pub struct Run(pub HostJob);

/// The link's libvirt URI, while the link is up (image downloads open their own connection).
#[derive(Message)]
#[rtype(result = "Option<String>")]
pub struct LinkUri;

type Reply = oneshot::Sender<Result<HostOutput, (RunError, bool)>>;

struct Worker {
    jobs: std::sync::mpsc::Sender<(HostJob, Reply)>,
}

/// Key material, read lazily and cached once it works (shared across restarts).
#[derive(Default)]
pub struct KeyCache(Mutex<Option<Arc<PrivateKey>>>);

pub struct KvmHostActor {
    host: KvmHost,
    config: Arc<KvmConfig>,
    keys: Arc<KeyCache>,
    restarts: Arc<AtomicU32>,
    last_error: Arc<Mutex<Option<String>>>,
    link: Option<SshLink>,
    worker: Option<Worker>,
    /// Jobs that arrived while the link was being dialed: sent once it is up.
    queued: Vec<(HostJob, Reply)>,
    /// When to dial again after a loss (backs off, resets once healthy).
    redial: Redial,
    /// The wait before this incarnation's dial.
    dial_in: Duration,
}

impl KvmHostActor {
    pub fn new(host: KvmHost, config: Arc<KvmConfig>, keys: Arc<KeyCache>) -> Self {
        Self {
            host,
            config,
            keys,
            restarts: Arc::new(AtomicU32::new(0)),
            last_error: Arc::new(Mutex::new(None)),
            link: None,
            worker: None,
            queued: Vec::new(),
            redial: Redial::default(),
            dial_in: Duration::ZERO,
        }
    }

    fn key(&self) -> Result<Arc<PrivateKey>, RunError> {
        let mut cached = self.keys.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(key) = cached.as_ref() {
            return Ok(key.clone());
        }
        let key = load_private_key(&self.config.ssh_key_file)
            .map(Arc::new)
            .map_err(|e| RunError {
                class: if e.is_transient() {
                    ErrorClass::Transient
                } else {
                    ErrorClass::Permanent
                },
                message: e.to_string(),
            })?;
        *cached = Some(key.clone());
        Ok(key)
    }

    /// This host's entry in the supervision tree (dashboard).
    fn report_tree(&self, state: &str) {
        crate::supervision::report_state("kvm_host", &self.host.name, state, self.queued.len());
    }

    fn fail(&mut self, why: String, ctx: &mut Context<Self>) {
        self.report_tree(&format!("down: {why}"));
        KvmHostLinkChanged {
            host: &self.host.name,
            connected: false,
            reason: Some(&why),
        }
        .emit();
        for (_, reply) in self.queued.drain(..) {
            let _ = reply.send(Err((
                RunError {
                    class: ErrorClass::Transient,
                    message: format!("link to host {} is down ({why})", self.host.name),
                },
                false,
            )));
        }
        *self.last_error.lock().unwrap_or_else(|p| p.into_inner()) = Some(why);
        self.worker = None;
        if let Some(link) = self.link.take() {
            actix::spawn(link.close());
        }
        ctx.stop();
    }
}

impl Actor for KvmHostActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        self.report_tree("connecting");
        let delay = self.dial_in;
        let target = LinkTarget {
            address: self.host.address.clone(),
            user: self.host.user.clone(),
            remote_socket: self.host.socket.clone(),
            known_hosts: (!self.config.insecure_ignore_host_key)
                .then(|| self.config.known_hosts_file.clone())
                .flatten(),
        };
        let key = self.key();
        let dial = async move {
            tokio::time::sleep(delay).await;
            let key = key.map_err(|e| e.message)?;
            SshLink::dial(&target, key, DIAL_TIMEOUT)
                .await
                .map_err(|e| e.to_string())
        };
        ctx.spawn(
            dial.into_actor(self)
                .then(|result, actor, _| {
                    // The worker opens libvirt through the link's socket, whose
                    // forwarder runs on this thread's runtime: wait for it asynchronously.
                    let started = result.map(|link| {
                        let (uri, host, pool) = (
                            link.libvirt_uri(),
                            actor.host.name.clone(),
                            actor.host.pool.clone(),
                        );
                        actor.link = Some(link);
                        spawn_worker(&uri, &host, &pool)
                    });
                    async move {
                        match started {
                            Ok((worker, ready)) => match ready.await {
                                Ok(Ok(())) => Ok(worker),
                                Ok(Err(e)) => Err(format!("opening libvirt: {e}")),
                                Err(_) => Err("libvirt worker ended".to_owned()),
                            },
                            Err(e) => Err(format!("dial failed: {e}")),
                        }
                    }
                    .into_actor(actor)
                })
                .map(|result, actor, ctx| match result {
                    Ok(worker) => {
                        for queued in actor.queued.drain(..) {
                            let _ = worker.jobs.send(queued);
                        }
                        actor.worker = Some(worker);
                        actor.redial.connected(Instant::now());
                        *actor.last_error.lock().unwrap_or_else(|p| p.into_inner()) = None;
                        KvmHostLinkChanged {
                            host: &actor.host.name,
                            connected: true,
                            reason: None,
                        }
                        .emit();
                        actor.report_tree("connected");
                    }
                    Err(e) => actor.fail(e, ctx),
                }),
        );
        // Notice a link that died on its own (keepalive failure, sshd gone).
        ctx.run_interval(Duration::from_secs(1), |actor, ctx| {
            if actor.link.as_ref().is_some_and(SshLink::is_closed) {
                actor.fail("SSH connection closed".into(), ctx);
            }
        });
    }
}

impl Supervised for KvmHostActor {
    fn restarting(&mut self, _: &mut Self::Context) {
        self.restarts.fetch_add(1, Ordering::Relaxed);
        self.dial_in = self.redial.lost(Instant::now());
        self.link = None;
        self.worker = None;
    }
}

/// Starts the host's libvirt thread; the receiver says when its connection is open.
fn spawn_worker(uri: &str, host: &str, pool: &str) -> (Worker, oneshot::Receiver<Result<(), KvmError>>) {
    let (tx, rx) = std::sync::mpsc::channel::<(HostJob, Reply)>();
    let (ready_tx, ready_rx) = oneshot::channel();
    let (uri, host, pool) = (uri.to_owned(), host.to_owned(), pool.to_owned());
    let spawned = std::thread::Builder::new()
        .name(format!("libvirt-{host}"))
        .spawn(move || {
            let session = match HostSession::open(&uri, &host, &pool) {
                Ok(s) => {
                    let _ = ready_tx.send(Ok(()));
                    s
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    return;
                }
            };
            for (job, reply) in rx {
                let _ = reply.send(execute(&session, job));
            }
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "starting the libvirt thread failed");
    }
    (Worker { jobs: tx }, ready_rx)
}

/// Runs one job; the flag says whether the link must be re-established.
fn execute(s: &HostSession, job: HostJob) -> Result<HostOutput, (RunError, bool)> {
    let op = |e: ops::OpError| {
        let transport = matches!(&e, ops::OpError::Libvirt(k) if k.is_transport());
        (
            RunError {
                class: e.class(),
                message: e.to_string(),
            },
            transport,
        )
    };
    let kvm = |e: KvmError| {
        let transport = e.is_transport();
        (
            RunError {
                class: e.class(),
                message: e.to_string(),
            },
            transport,
        )
    };
    match job {
        HostJob::Create(plan) => ops::create(s, &plan).map(|()| HostOutput::Done).map_err(op),
        HostJob::Get(name) => ops::get(s, &name).map(HostOutput::Observed).map_err(op),
        HostJob::Delete(name) => ops::delete(s, &name).map(|()| HostOutput::Done).map_err(op),
        HostJob::Release(name) => ops::release(s, &name).map(HostOutput::Released).map_err(op),
        HostJob::List => s.managed_domains().map(HostOutput::Listed).map_err(kvm),
        HostJob::LookupBase(spec) => image::lookup(s, &spec).map(HostOutput::Base).map_err(kvm),
        HostJob::SweepPool(plan) => pool_gc::sweep(s, &plan).map(HostOutput::Swept).map_err(kvm),
    }
}

impl Handler<Run> for KvmHostActor {
    type Result = ResponseActFuture<Self, Result<HostOutput, RunError>>;

    fn handle(&mut self, Run(job): Run, _: &mut Self::Context) -> Self::Result {
        let (tx, rx) = oneshot::channel();
        if let Some(worker) = &self.worker {
            if worker.jobs.send((job, tx)).is_err() {
                let err = RunError {
                    class: ErrorClass::Transient,
                    message: "libvirt worker ended".into(),
                };
                return Box::pin(actix::fut::ready(Err(err)));
            }
        } else if self
            .last_error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_none()
        {
            // The first dial is under way: wait for it rather than fail.
            // (While re-dialing after a failure, callers hear why at once.)
            self.queued.push((job, tx));
        } else {
            let why = self
                .last_error
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone()
                .unwrap_or_else(|| "connecting".into());
            let err = RunError {
                class: ErrorClass::Transient,
                message: format!("link to host {} is down ({why})", self.host.name),
            };
            return Box::pin(actix::fut::ready(Err(err)));
        }
        Box::pin(tokio::time::timeout(JOB_DEADLINE, rx).into_actor(self).map(
            |result, actor, ctx| match result {
                Ok(Ok(Ok(out))) => Ok(out),
                Ok(Ok(Err((err, transport)))) => {
                    if transport {
                        actor.fail(format!("transport error: {}", err.message), ctx);
                    }
                    Err(err)
                }
                Ok(Err(_)) => {
                    actor.fail("libvirt worker ended".into(), ctx);
                    Err(RunError {
                        class: ErrorClass::Transient,
                        message: "libvirt worker ended".into(),
                    })
                }
                Err(_) => {
                    // A call hung: tearing the link down makes it return.
                    actor.fail(format!("a libvirt call exceeded {JOB_DEADLINE:?}"), ctx);
                    Err(RunError {
                        class: ErrorClass::Transient,
                        message: "libvirt call timed out".into(),
                    })
                }
            },
        ))
    }
}

impl Handler<LinkUri> for KvmHostActor {
    type Result = Option<String>;
    fn handle(&mut self, _: LinkUri, _: &mut Self::Context) -> Option<String> {
        self.link
            .as_ref()
            .filter(|_| self.worker.is_some())
            .map(SshLink::libvirt_uri)
    }
}

/// The kvm provider's runner: one supervised actor per host, and the image cache.
pub struct KvmHosts {
    hosts: HashMap<String, Addr<KvmHostActor>>,
    images: Addr<ImageCacheActor>,
}

impl KvmHosts {
    /// Starts one supervised actor per configured host (call inside the actix system).
    pub fn start(config: &KvmConfig) -> Result<Self, reqwest::Error> {
        egress_proxies::kvm::libvirt::ensure_client_setup();
        egress_proxies::tls::ensure_crypto_provider();
        let shared = Arc::new(config.clone());
        let keys = Arc::new(KeyCache::default());
        let hosts = config
            .hosts
            .iter()
            .map(|h| {
                let (host, cfg, keys) = (h.clone(), shared.clone(), keys.clone());
                (
                    h.name.clone(),
                    crate::supervision::start(
                        Node::member("kvm_host", h.name.clone(), "system"),
                        move |_| KvmHostActor::new(host, cfg, keys),
                    ),
                )
            })
            .collect();
        let images = ImageCacheActor::new(Downloader::new(DownloadLimits::default())?);
        let images = crate::supervision::start(Node::singleton("kvm_image_cache"), |_| images);
        Ok(Self { hosts, images })
    }

    fn addr(&self, host: &KvmHost) -> Result<&Addr<KvmHostActor>, RunError> {
        self.hosts.get(&host.name).ok_or_else(|| RunError {
            class: ErrorClass::Permanent,
            message: format!("host {} is not configured", host.name),
        })
    }
}

fn mailbox(e: MailboxError) -> RunError {
    RunError {
        class: ErrorClass::Transient,
        message: format!("actor unavailable: {e}"),
    }
}

#[async_trait]
impl HostRunner for KvmHosts {
    async fn run(&self, host: &KvmHost, job: HostJob) -> Result<HostOutput, RunError> {
        self.addr(host)?.send(Run(job)).await.map_err(mailbox)?
    }

    async fn ensure_image(&self, host: &KvmHost, image: &ImageSpec) -> Result<CachedBase, RunError> {
        let host_actor = self.addr(host)?.clone();
        self.images
            .send(Ensure {
                host: host.clone(),
                image: image.clone(),
                host_actor,
            })
            .await
            .map_err(mailbox)?
    }

    async fn sweep_pool(&self, host: &KvmHost, mut plan: SweepPlan) -> Result<PoolSweep, RunError> {
        let addr = self.addr(host)?;
        // Asked right before the sweep: a fetch starting later writes volumes
        // too new to be due, so it cannot lose them.
        let fetching = self
            .images
            .send(FetchingVolumes(host.name.clone()))
            .await
            .map_err(mailbox)?;
        plan.protect.extend(fetching);
        match addr
            .send(Run(HostJob::SweepPool(plan)))
            .await
            .map_err(mailbox)??
        {
            HostOutput::Swept(swept) => Ok(swept),
            _ => Err(RunError {
                class: ErrorClass::Transient,
                message: "unexpected answer to a pool sweep".into(),
            }),
        }
    }
}

/// Have an image in a host's pool.
#[derive(Message)]
#[rtype(result = "Result<CachedBase, RunError>")]
pub struct Ensure {
    pub host: KvmHost,
    pub image: ImageSpec,
    pub host_actor: Addr<KvmHostActor>,
}

/// The volumes fetches are writing on a host right now (the pool sweep spares them).
#[derive(Message)]
#[rtype(result = "Vec<String>")]
pub struct FetchingVolumes(pub String);

#[derive(Message)]
#[rtype(result = "()")]
struct Finished {
    key: DownloadKey,
    result: Result<CachedBase, RunError>,
}

/// (host, image).
type DownloadKey = (String, ImageSpec);

type Waiter = oneshot::Sender<Result<CachedBase, RunError>>;

/// `ImageCacheActor`: one fetch per (host, image) at a time; callers that
/// arrive meanwhile wait for its result. The fetch itself runs beside the
/// actor, so neither a ProxyActor nor the host's other callers wait on it.
/// Where each image stands is reported to [`crate::supervision`] (dashboard).
pub struct ImageCacheActor {
    http: Downloader,
    waiters: HashMap<DownloadKey, Vec<Waiter>>,
}

impl ImageCacheActor {
    pub fn new(http: Downloader) -> Self {
        Self {
            http,
            waiters: HashMap::new(),
        }
    }
}

impl Actor for ImageCacheActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        crate::supervision::beat_while_running::<Self>("kvm_image_cache", ctx);
        ctx.run_interval(std::time::Duration::from_secs(1), |cache, _| {
            crate::supervision::report_singleton(
                "kvm_image_cache",
                &format!("fetching {}", cache.waiters.len()),
                0,
            );
        });
    }
}

/// Fetches run beside the actor and report to its address, and waiters are
/// kept: a restarted cache carries on with both.
impl Supervised for ImageCacheActor {}

impl Handler<Ensure> for ImageCacheActor {
    type Result = ResponseFuture<Result<CachedBase, RunError>>;

    fn handle(&mut self, msg: Ensure, ctx: &mut Self::Context) -> Self::Result {
        let key = (msg.host.name.clone(), msg.image.clone());
        let (tx, rx) = oneshot::channel();
        let queue = self.waiters.entry(key.clone()).or_default();
        queue.push(tx);
        if queue.len() == 1 {
            let progress = Arc::new(Progress::default());
            crate::supervision::report_fetching(&key.0, &key.1, progress.clone());
            let (http, me) = (self.http.clone(), ctx.address());
            actix::spawn(async move {
                let fetch = ensure(&http, &msg.host, &msg.image, &msg.host_actor, &progress);
                // A panic must not leave the image "being fetched" for ever:
                // its waiters get an error and the next create fetches again.
                let result = match futures::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(fetch)).await
                {
                    Ok(result) => result,
                    Err(panic) => {
                        let what = crate::supervision::panic_message(panic.as_ref());
                        tracing::error!(host = %key.0, url = %key.1.url, panic = %what, "image fetch panicked");
                        Err(RunError {
                            class: ErrorClass::Transient,
                            message: format!("the image fetch failed unexpectedly ({what}); it is retried"),
                        })
                    }
                };
                me.do_send(Finished { key, result });
            });
        }
        Box::pin(async move {
            rx.await.unwrap_or_else(|_| {
                Err(RunError {
                    class: ErrorClass::Transient,
                    message: "image cache restarted".into(),
                })
            })
        })
    }
}

impl Handler<Finished> for ImageCacheActor {
    type Result = ();

    fn handle(&mut self, msg: Finished, _: &mut Self::Context) {
        crate::supervision::report_fetched(
            &msg.key.0,
            &msg.key.1.url,
            msg.result.as_ref().map_err(|e| e.message.as_str()),
        );
        for waiter in self.waiters.remove(&msg.key).unwrap_or_default() {
            let _ = waiter.send(msg.result.clone());
        }
    }
}

impl Handler<FetchingVolumes> for ImageCacheActor {
    type Result = Vec<String>;

    fn handle(&mut self, FetchingVolumes(host): FetchingVolumes, _: &mut Self::Context) -> Vec<String> {
        self.waiters
            .keys()
            .filter(|(h, _)| *h == host)
            .flat_map(|(_, image)| image.fetch_volumes())
            .collect()
    }
}

/// Finds the image's complete base in the pool, or fetches it.
async fn ensure(
    http: &Downloader,
    host: &KvmHost,
    image: &ImageSpec,
    addr: &Addr<KvmHostActor>,
    progress: &Progress,
) -> Result<CachedBase, RunError> {
    if let HostOutput::Base(Some(base)) = addr
        .send(Run(HostJob::LookupBase(image.clone())))
        .await
        .map_err(mailbox)??
    {
        return Ok(base);
    }
    let uri = addr
        .send(LinkUri)
        .await
        .map_err(mailbox)?
        .ok_or_else(|| RunError {
            class: ErrorClass::Transient,
            message: format!("link to host {} is down", host.name),
        })?;
    fetch_to_pool(http, image, &uri, &host.name, &host.pool, progress)
        .await
        .map(|fetched| fetched.base)
        .map_err(|e| RunError {
            class: e.class(),
            message: e.to_string(),
        })
}

/// Host actors started on first use, inside the actor system (providers are
/// built before it runs).
pub struct LazyKvmHosts {
    config: KvmConfig,
    hosts: std::sync::OnceLock<Result<KvmHosts, String>>,
}

impl LazyKvmHosts {
    fn get(&self) -> Result<&KvmHosts, RunError> {
        self.hosts
            .get_or_init(|| KvmHosts::start(&self.config).map_err(|e| e.to_string()))
            .as_ref()
            .map_err(|e| RunError {
                class: ErrorClass::Transient,
                message: format!("starting KVM host links: {e}"),
            })
    }
}

#[async_trait]
impl HostRunner for LazyKvmHosts {
    async fn run(&self, host: &KvmHost, job: HostJob) -> Result<HostOutput, RunError> {
        self.get()?.run(host, job).await
    }

    async fn ensure_image(&self, host: &KvmHost, image: &ImageSpec) -> Result<CachedBase, RunError> {
        self.get()?.ensure_image(host, image).await
    }

    async fn sweep_pool(&self, host: &KvmHost, plan: SweepPlan) -> Result<PoolSweep, RunError> {
        self.get()?.sweep_pool(host, plan).await
    }
}

/// The factory the providers registry uses for kvm instances.
pub fn runner_factory() -> egress_proxies::provider::KvmRunnerFactory {
    Arc::new(|_name, config| {
        Ok(Arc::new(LazyKvmHosts {
            config: config.clone(),
            hosts: std::sync::OnceLock::new(),
        }) as Arc<dyn HostRunner>)
    })
}
