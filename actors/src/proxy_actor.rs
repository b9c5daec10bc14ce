//! `ProxyActor`: one per Proxy. Runs the reconcile for its object — never two
//! at once — and sets its one timer for the next as the Proxy's
//! [`Schedule`](egress_proxies::domain::reconcile::Schedule) says. It registers its proxy with the HealthProber
//! while the proxy serves, and folds verdicts into the status. A panicking
//! reconcile panics the actor: its supervisor restarts it, and it resumes
//! from the stored state, still serving where it served.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use actix::prelude::*;
use egress_proxies::domain::health::ProbeTarget;
use egress_proxies::domain::reconcile::{self, Job, Next, ProxyMemory, ReconcileError, jobs_for_verdict};
use egress_proxies::domain::resource::ObjectKey;
use egress_proxies::domain::resource::Phase;
use egress_proxies::telemetry::events::{ProxyPhaseChanged, ReconcileCompleted};
use futures::FutureExt;
use tracing::Instrument;
use tracing::field::Empty;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::health_prober::{HealthVerdict, Probes, Unwatch, Watch};
use crate::lease_store_actor::{LeaseStoreActor, RemoveProxy, UpdateAvailability};

/// Look at the proxy again now (its object changed, or a caller asks).
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "()")]
pub struct Reconcile;

/// The object is gone: stop for good.
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "()")]
pub struct Shutdown;

pub use egress_proxies::domain::reconcile::Timing;

type JobResult = std::thread::Result<Result<Next, ReconcileError>>;

/// What every ProxyActor of a registry shares: one copy for the fleet,
/// not one per proxy (and another in each supervisor's restart closure).
#[derive(Clone)]
pub struct ProxyActorShared {
    pub ctx: reconcile::ReconcileContext,
    pub timing: Timing,
    /// Restarts of all the registry's actors.
    pub restarts: Arc<AtomicU64>,
    pub prober: Option<Probes>,
    pub leases: Option<Addr<LeaseStoreActor>>,
    /// Jobs running at once, across every proxy ([`MAX_RUNNING_JOBS`]).
    pub slots: Arc<tokio::sync::Semaphore>,
}

/// Reconcile and health jobs running at once (controller-runtime's
/// `MaxConcurrentReconciles`). A start of 10,000 Proxies would otherwise
/// begin 10,000 reconciles together, each a few kilobytes of future
/// waiting on the store; waiting here, a job is only its inputs. A job
/// waiting on a slow provider holds its slot, so the bound is generous.
pub const MAX_RUNNING_JOBS: usize = 256;

pub struct ProxyActor {
    key: ObjectKey,
    shared: Arc<ProxyActorShared>,
    /// What the lease store was last told.
    announced: Option<Arc<egress_proxies::domain::lease::Availability>>,
    /// The phase this proxy is counted under in the proxies-by-phase gauge.
    counted_phase: Option<Phase>,
    /// The probe span whose verdict asked for the next reconcile (linked to it).
    /// (Boxed: rarely there, and the actor's context is allocated for every proxy.)
    probe_link: Option<Box<opentelemetry::trace::SpanContext>>,
    /// What the prober currently watches for this proxy.
    watching: Option<Arc<ProbeTarget>>,
    work: Work,
    /// The next reconcile, when the schedule set one.
    timer: Option<SpawnHandle>,
}

/// Where the actor's work stands.
enum Work {
    /// No job runs; the memory waits here for the next.
    Waiting(Box<ProxyMemory>),
    /// A job runs with the memory. What is asked meanwhile runs after it:
    /// the strongest job asked for, and the latest verdict.
    Running {
        again: Option<Job>,
        verdict: Option<Box<HealthVerdict>>,
    },
}

impl ProxyActor {
    pub fn new(key: ObjectKey, shared: Arc<ProxyActorShared>) -> Self {
        let memory = ProxyMemory::default().with_verdicts(shared.prober.is_some());
        Self {
            key,
            shared,
            announced: None,
            counted_phase: None,
            probe_link: None,
            watching: None,
            work: Work::Waiting(Box::new(memory)),
            timer: None,
        }
    }

    fn memory(&self) -> Option<&ProxyMemory> {
        match &self.work {
            Work::Waiting(memory) => Some(memory),
            Work::Running { .. } => None,
        }
    }

    fn start(&mut self, job: Job, ctx: &mut Context<Self>) {
        let idle = Work::Running {
            again: None,
            verdict: None,
        };
        let mut memory = match std::mem::replace(&mut self.work, idle) {
            Work::Waiting(memory) => memory,
            Work::Running { again, verdict } => {
                // Serial per object: remember the strongest request and run it afterwards.
                let again = if again == Some(Job::Reconcile) {
                    again
                } else {
                    Some(job)
                };
                self.work = Work::Running { again, verdict };
                return;
            }
        };
        if job == Job::Reconcile
            && let Some(timer) = self.timer.take()
        {
            ctx.cancel_future(timer);
        }
        let key = self.key.clone();
        let shared = self.shared.clone();
        let span = match job {
            Job::Reconcile => {
                let span = tracing::info_span!(
                    parent: None, "Reconcile Proxy", otel.kind = "internal", proxy = %key,
                    reconcile.result = Empty, reconcile.requeue_after_ms = Empty,
                    otel.status_code = Empty, otel.status_description = Empty,
                    traceID = Empty, spanID = Empty,
                );
                if let Some(link) = self.probe_link.take() {
                    span.add_link(*link);
                }
                egress_proxies::telemetry::otel::record_ids(&span);
                span
            }
            Job::Health => tracing::Span::none(),
        };
        let recorded = span.clone();
        let work = async move {
            // Never closed: the semaphore lives as long as the actors.
            let _slot = shared.slots.clone().acquire_owned().await.ok();
            let started = Instant::now();
            // Boxed once it runs: a job still waiting for its slot holds only its inputs.
            let result = match job {
                Job::Reconcile => {
                    let run = Box::pin(
                        reconcile::reconcile(&key, &shared.ctx, &mut memory).instrument(span.clone()),
                    );
                    AssertUnwindSafe(run).catch_unwind().await
                }
                Job::Health => {
                    let run = Box::pin(reconcile::record_health(&key, &shared.ctx, &mut memory));
                    AssertUnwindSafe(run)
                        .catch_unwind()
                        .await
                        .map(|r| r.map(|()| Next::Idle))
                }
            };
            (result, memory, started.elapsed())
        };
        ctx.spawn(
            work.into_actor(self)
                .map(move |(result, memory, took), actor, ctx| {
                    if job == Job::Reconcile {
                        let outcome = match &result {
                            Ok(Ok(_)) => "ok".to_owned(),
                            Ok(Err(e)) => e.metric_label(),
                            Err(_) => "panic".to_owned(),
                        };
                        ReconcileCompleted {
                            proxy: &actor.key.to_string(),
                            result: &outcome,
                            duration: took,
                        }
                        .emit();
                        recorded.record("reconcile.result", outcome.as_str());
                        match &result {
                            Ok(Ok(_)) => {}
                            Ok(Err(e)) => {
                                recorded.record("otel.status_code", "error");
                                recorded.record("otel.status_description", e.to_string());
                            }
                            Err(_) => {
                                recorded.record("otel.status_code", "error");
                                recorded.record("otel.status_description", "the reconcile panicked");
                            }
                        }
                    }
                    actor.finished(job, result, memory, &recorded, ctx)
                }),
        );
    }

    /// `span`: the reconcile's span (none for health jobs), told when the next one is due.
    fn finished(
        &mut self,
        job: Job,
        result: JobResult,
        mut memory: Box<ProxyMemory>,
        span: &tracing::Span,
        ctx: &mut Context<Self>,
    ) {
        let outcome = match result {
            Ok(outcome) => outcome,
            // Its supervisor restarts the actor (and logs the panic).
            Err(panic) => std::panic::resume_unwind(panic),
        };
        let timing = &self.shared.timing;
        let (mut again, verdict) = match &mut self.work {
            Work::Running { again, verdict } => (again.take(), verdict.take()),
            Work::Waiting(_) => (None, None),
        };
        let delay = match (job, &outcome) {
            (Job::Health, Ok(_)) => None,
            (Job::Health, Err(error)) => {
                tracing::warn!(proxy = %self.key, error = %error, "recording a health verdict failed; reconciling");
                again = Some(Job::Reconcile);
                None
            }
            (Job::Reconcile, _) => {
                // The schedule is pure: its jitter is drawn here.
                let delay = memory.schedule.after(&outcome, timing, fastrand::f64());
                if let Err(error) = &outcome {
                    tracing::warn!(
                        proxy = %self.key, error = %error, class = %error.class(),
                        retryIn = ?delay, "reconcile failed"
                    );
                }
                delay
            }
        };
        self.work = Work::Waiting(memory);
        self.announce();
        if job == Job::Reconcile {
            self.sync_watch(ctx);
            if let Some(delay) = delay {
                span.record("reconcile.requeue_after_ms", delay.as_millis() as u64);
                self.timer = Some(ctx.run_later(delay, |actor, ctx| {
                    actor.timer = None;
                    actor.start(Job::Reconcile, ctx);
                }));
            }
        }
        if let Some(verdict) = verdict {
            self.accept(*verdict, ctx);
        }
        if let Some(next) = again {
            self.start(next, ctx);
        }
    }

    /// Tells the lease store when the proxy's availability changed.
    fn announce(&mut self) {
        let current = self.memory().and_then(|m| m.availability.clone());
        let phase = current
            .as_ref()
            .and_then(|a| Phase::ALL.into_iter().find(|p| p.as_str() == a.phase));
        self.count_phase(phase);
        self.report_tree();
        if current == self.announced {
            return;
        }
        if let Some(leases) = &self.shared.leases {
            match &current {
                Some(a) => leases.do_send(UpdateAvailability(a.as_ref().clone())),
                None => leases.do_send(RemoveProxy(self.key.clone())),
            }
        }
        self.announced = current;
    }

    /// This actor's entry in the supervision tree (dashboard).
    fn report_tree(&self) {
        crate::supervision::report_state(
            "proxy",
            &self.key.to_string(),
            self.counted_phase.map_or("starting", Phase::as_str),
            match &self.work {
                Work::Waiting(_) => 0,
                Work::Running { again, .. } => 1 + usize::from(again.is_some()),
            },
        );
    }

    /// Moves this proxy between the proxies-by-phase gauge's phases.
    fn count_phase(&mut self, phase: Option<Phase>) {
        if phase != self.counted_phase {
            ProxyPhaseChanged {
                proxy: &self.key.to_string(),
                from: self.counted_phase.map(Phase::as_str),
                to: phase.map(Phase::as_str),
            }
            .emit();
            self.counted_phase = phase;
        }
    }

    /// Keeps the prober's registration in step with where the proxy serves.
    fn sync_watch(&mut self, ctx: &mut Context<Self>) {
        let wanted = self.memory().and_then(|m| m.serving.clone());
        if wanted == self.watching {
            return;
        }
        if let Some(prober) = &self.shared.prober {
            match &wanted {
                Some(target) => prober.watch.do_send(Watch {
                    key: self.key.clone(),
                    target: target.clone(),
                    owner: ctx.address().downgrade().recipient(),
                    recorded: self.memory().and_then(|m| m.recorded.clone()),
                }),
                None => prober.unwatch.do_send(Unwatch {
                    key: self.key.clone(),
                }),
            }
        }
        self.watching = wanted;
    }

    /// Takes a verdict into memory and runs the jobs it asks for.
    fn accept(&mut self, verdict: HealthVerdict, ctx: &mut Context<Self>) {
        let memory = match &mut self.work {
            Work::Waiting(memory) => memory,
            Work::Running { verdict: pending, .. } => {
                *pending = Some(Box::new(verdict));
                return;
            }
        };
        let current = memory
            .serving
            .as_ref()
            .is_some_and(|s| s.uid == verdict.verdict.uid);
        if !current {
            return;
        }
        let healthy = verdict.verdict.healthy;
        if !healthy {
            self.probe_link = verdict.span.map(Box::new);
        }
        memory.health = Some(verdict.verdict);
        let jobs = jobs_for_verdict(healthy, memory.holds_first_status());
        for job in jobs {
            self.start(*job, ctx);
        }
    }
}

impl Actor for ProxyActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        self.start(Job::Reconcile, ctx);
    }

    /// Stopped for good (its Proxy is gone; a crash restarts without
    /// stopping): no longer leasable, nor probed.
    fn stopped(&mut self, _: &mut Self::Context) {
        self.count_phase(None);
        if let Some(leases) = &self.shared.leases {
            leases.do_send(RemoveProxy(self.key.clone()));
        }
        if let (Some(prober), Some(_)) = (&self.shared.prober, self.watching.take()) {
            prober.unwatch.do_send(Unwatch {
                key: self.key.clone(),
            });
        }
    }
}

impl Supervised for ProxyActor {
    fn restarting(&mut self, _: &mut Self::Context) {
        self.shared.restarts.fetch_add(1, Ordering::Relaxed);
        self.timer = None;
        // The memory may be lost with the job the crash dropped; what the
        // prober and the lease store were told is not.
        self.work = Work::Waiting(Box::new(
            ProxyMemory::resuming(self.watching.clone(), self.announced.clone())
                .with_verdicts(self.shared.prober.is_some()),
        ));
    }
}

impl Handler<Reconcile> for ProxyActor {
    type Result = ();

    fn handle(&mut self, _: Reconcile, ctx: &mut Self::Context) {
        self.start(Job::Reconcile, ctx);
    }
}

impl Handler<HealthVerdict> for ProxyActor {
    type Result = ();

    fn handle(&mut self, verdict: HealthVerdict, ctx: &mut Self::Context) {
        self.accept(verdict, ctx);
    }
}

impl Handler<Shutdown> for ProxyActor {
    type Result = ();

    fn handle(&mut self, _: Shutdown, ctx: &mut Self::Context) {
        ctx.stop();
    }
}
