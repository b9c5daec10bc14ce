//! `KvmHostActor`: one per configured KVM host, each under its own
//! Supervisor. It owns the host's SSH link and the host's
//! [libvirt thread](egress_proxies::adapters::providers::kvm::host::libvirt_thread), where every blocking libvirt
//! call runs. A dead link, a transport error or a call past its deadline
//! stops the actor — tearing the link down, which also releases a call
//! blocked on it — and its supervisor restarts it (fresh dial, with
//! backoff), while the other hosts carry on.
//!
//! Requests arrive as [`Call`]s, each answered with the call's own type.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix::prelude::*;
use egress_proxies::adapters::providers::kvm::host::{
    HostCall, Job, LibvirtThread, LinkTarget, Redial, RunError, SshLink, Waited, load_private_key,
};
use egress_proxies::domain::config::{KvmConfig, KvmHost};
use egress_proxies::telemetry::events::KvmHostLinkChanged;
use russh::keys::PrivateKey;

/// Longest a single libvirt call may run, counted from when it starts on
/// the host's libvirt thread, before the link is torn down.
pub const JOB_DEADLINE: Duration = Duration::from_secs(60);
const DIAL_TIMEOUT: Duration = Duration::from_secs(10);

/// Run one call on this host; the answer is the call's own type.
pub struct Call<C>(pub C);

impl<C: HostCall> Message for Call<C> {
    type Result = Result<C::Output, RunError>;
}

/// The link's libvirt URI, while the link is up (image downloads open their own connection).
#[derive(Message)]
#[rtype(result = "Option<String>")]
pub struct LinkUri;

/// Key material, read lazily and cached once it works (shared across restarts).
#[derive(Default)]
pub struct KeyCache(Mutex<Option<Arc<PrivateKey>>>);

pub struct KvmHostActor {
    host: KvmHost,
    config: Arc<KvmConfig>,
    keys: Arc<KeyCache>,
    job_deadline: Duration,
    restarts: Arc<AtomicU32>,
    last_error: Arc<Mutex<Option<String>>>,
    link: Option<SshLink>,
    worker: Option<LibvirtThread>,
    /// Jobs that arrived while the link was being dialed: sent once it is up.
    queued: Vec<Job>,
    /// When to dial again after a loss (backs off, resets once healthy).
    redial: Redial,
    /// The wait before this incarnation's dial.
    dial_in: Duration,
}

impl KvmHostActor {
    /// `job_deadline`: how long one call may run once started ([`JOB_DEADLINE`] in production).
    pub fn new(host: KvmHost, config: Arc<KvmConfig>, keys: Arc<KeyCache>, job_deadline: Duration) -> Self {
        Self {
            host,
            config,
            keys,
            job_deadline,
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
            .map_err(RunError::from)?;
        *cached = Some(key.clone());
        Ok(key)
    }

    /// This host's entry in the supervision tree (dashboard).
    fn report_tree(&self, state: &str) {
        crate::supervision::report_state("kvm_host", &self.host.name, state, self.queued.len());
    }

    fn last_error(&self) -> Option<String> {
        self.last_error.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// What callers hear while the link is down.
    fn link_down(&self) -> RunError {
        let why = self.last_error().unwrap_or_else(|| "connecting".into());
        RunError::LinkDown {
            host: self.host.name.clone(),
            why,
        }
    }

    fn fail(&mut self, why: String, ctx: &mut Context<Self>) {
        self.report_tree(&format!("down: {why}"));
        KvmHostLinkChanged {
            host: &self.host.name,
            connected: false,
            reason: Some(&why),
        }
        .emit();
        *self.last_error.lock().unwrap_or_else(|p| p.into_inner()) = Some(why);
        // Never run; the actor stops, and its callers' waits end with it.
        self.queued.clear();
        self.worker = None;
        if let Some(link) = self.link.take() {
            actix::spawn(link.close());
        }
        ctx.stop();
    }

    /// Hands a job to the libvirt thread, or keeps it while the first dial runs.
    fn submit(&mut self, job: Job) -> Result<(), RunError> {
        if let Some(worker) = &self.worker {
            return worker.submit(job).map_err(|_| RunError::WorkerEnded {
                host: self.host.name.clone(),
            });
        }
        if self.last_error().is_none() {
            // The first dial is under way: wait for it rather than fail.
            // (While re-dialing after a failure, callers hear why at once.)
            self.queued.push(job);
            return Ok(());
        }
        Err(self.link_down())
    }

    /// The caller's answer to a finished wait; tears the link down when the
    /// wait shows it is broken.
    fn answer<T>(&mut self, waited: Waited<T>, call: &str, ctx: &mut Context<Self>) -> Result<T, RunError> {
        match waited {
            Waited::Answered(Ok(out)) => Ok(out),
            Waited::Answered(Err(e)) => {
                if e.is_transport() {
                    self.fail(format!("transport error: {e}"), ctx);
                }
                Err(RunError::Call(e))
            }
            Waited::NotRun | Waited::Vanished => {
                if self.worker.is_some() {
                    self.fail("libvirt worker ended".into(), ctx);
                }
                Err(self.link_down())
            }
            Waited::Overran => {
                // A call hung: tearing the link down makes it return.
                let deadline = self.job_deadline;
                self.fail(
                    format!("a libvirt call ({call}) ran past its {deadline:?} deadline"),
                    ctx,
                );
                Err(RunError::Overran {
                    host: self.host.name.clone(),
                    call: call.to_owned(),
                    deadline,
                })
            }
        }
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
            let key = key.map_err(|e| e.to_string())?;
            SshLink::dial(&target, key, DIAL_TIMEOUT)
                .await
                .map_err(|e| e.to_string())
        };
        ctx.spawn(
            dial.into_actor(self)
                .then(|result, actor, _| {
                    // The thread opens libvirt through the link's socket, whose
                    // forwarder runs on this thread's runtime: wait for it asynchronously.
                    let started = result.map(|link| {
                        let (uri, host, pool) = (
                            link.libvirt_uri(),
                            actor.host.name.clone(),
                            actor.host.pool.clone(),
                        );
                        actor.link = Some(link);
                        LibvirtThread::spawn(&uri, &host, &pool)
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
                        for job in actor.queued.drain(..) {
                            // A thread that ended already answers these jobs "not run".
                            let _ = worker.submit(job);
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

impl<C: HostCall> Handler<Call<C>> for KvmHostActor {
    type Result = ResponseActFuture<Self, Result<C::Output, RunError>>;

    fn handle(&mut self, Call(call): Call<C>, ctx: &mut Self::Context) -> Self::Result {
        let (job, pending) = Job::call(call);
        if let Err(refused) = self.submit(job) {
            if self.worker.is_some() {
                // The thread is gone: only a fresh link brings a new one.
                self.fail("libvirt worker ended".into(), ctx);
            }
            return Box::pin(actix::fut::ready(Err(refused)));
        }
        // The deadline starts when the call does, not while it waits its turn.
        Box::pin(
            pending
                .wait(self.job_deadline)
                .into_actor(self)
                .map(|waited, actor, ctx| actor.answer(waited, C::NAME, ctx)),
        )
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
