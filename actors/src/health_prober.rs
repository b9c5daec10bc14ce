//! `HealthProber`: probes every watched proxy at its interval (start times
//! spread by jitter so probes do not align) on a bounded pool of
//! concurrent probes, folds results into each proxy's threshold state and
//! sends verdicts to the owning ProxyActor. A proxy whose previous probe is
//! still running skips a tick instead of piling up.
//!
//! The probes themselves run on [`ProbeThreads`], a small multi-threaded
//! runtime of their own: a TLS handshake is CPU work, and on the actor's
//! arbiter every probe would share one core with the scheduling and the
//! verdicts. The actor keeps all the state; probes report back to it.

use std::collections::{HashMap, VecDeque};
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use actix::WeakRecipient;
use actix::prelude::*;
use egress_proxies::adapters::probe::{ProbeFailure, ProbeResult, Prober};
use egress_proxies::domain::health::{HealthState, LatencyRule, ProbeTarget, RecordedVerdict, Sample};
use egress_proxies::domain::resource::ObjectKey;
use egress_proxies::telemetry::events::ProbeCompleted;
use futures::FutureExt;
use opentelemetry::trace::TraceContextExt;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tracing::Instrument;
use tracing::field::Empty;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// A health verdict for this actor's proxy (sent by the HealthProber to the
/// watcher named in `Watch`; a notification lives beside its sender).
#[derive(Message, Debug, Clone)]
#[rtype(result = "()")]
pub struct HealthVerdict {
    /// The proxy it is about, so one recipient can take the verdicts of many
    /// (a replica relaying its probes to the leader).
    pub key: ObjectKey,
    pub verdict: egress_proxies::domain::health::Verdict,
    /// The `health.probe` span behind it (when probes are traced): the
    /// reconcile a flip triggers links to it.
    pub span: Option<opentelemetry::trace::SpanContext>,
}

/// Start watching a proxy (or update what is watched).
#[derive(Message, Debug, Clone)]
#[rtype(result = "()")]
pub struct Watch {
    pub key: ObjectKey,
    /// Shared with the ProxyActor that asks.
    pub target: Arc<ProbeTarget>,
    /// Weak: the prober must never keep a stopped ProxyActor alive (its
    /// Supervisor would restart it).
    pub owner: WeakRecipient<HealthVerdict>,
    /// The verdict the proxy's status records for this target: where a
    /// proxy the prober does not watch yet starts from (after an operator
    /// restart its probes confirm it and report nothing). Apart from the
    /// target, so that a status change never re-registers it.
    pub recorded: Option<RecordedVerdict>,
}

/// Where a ProxyActor sends its `Watch` and `Unwatch`: the HealthProber
/// itself, or (when every replica serves) the ProbeRouter in front of it.
#[derive(Clone)]
pub struct Probes {
    pub watch: Recipient<Watch>,
    pub unwatch: Recipient<Unwatch>,
}

impl<A> From<Addr<A>> for Probes
where
    A: Actor<Context = Context<A>> + Handler<Watch> + Handler<Unwatch>,
{
    fn from(addr: Addr<A>) -> Self {
        Self {
            watch: addr.clone().recipient(),
            unwatch: addr.recipient(),
        }
    }
}

/// Stop watching a proxy.
#[derive(Message, Debug, Clone)]
#[rtype(result = "()")]
pub struct Unwatch {
    pub key: ObjectKey,
}

/// Counters for tests, the dashboard and benchmarks.
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "ProberStats")]
pub struct GetProberStats;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProberStats {
    pub watched: usize,
    pub probes: u64,
    pub failures: u64,
    pub skipped: u64,
    pub in_flight: usize,
}

#[derive(Message)]
#[rtype(result = "()")]
struct ProbeDone {
    key: ObjectKey,
    generation: u64,
    sample: Sample,
    span: Option<opentelemetry::trace::SpanContext>,
}

struct Watched {
    target: Arc<ProbeTarget>,
    owner: WeakRecipient<HealthVerdict>,
    state: HealthState,
    generation: u64,
    timer: SpawnHandle,
    in_flight: bool,
}

/// The threads probes run on; stopped (without waiting for probes in
/// flight) when dropped.
pub struct ProbeThreads {
    runtime: Option<tokio::runtime::Runtime>,
}

impl ProbeThreads {
    /// Most threads, whatever the machine: probes are short, and the rest
    /// of the operator needs cores too.
    pub const MAX: usize = 8;

    /// One thread per core the process may use (its cgroup's CPU quota
    /// included), at most [`Self::MAX`].
    pub fn per_core() -> std::io::Result<Self> {
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        Self::new(cores.clamp(1, Self::MAX))
    }

    pub fn new(threads: usize) -> std::io::Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads.max(1))
            .thread_name("health-probe")
            .enable_all()
            .build()?;
        Ok(Self {
            runtime: Some(runtime),
        })
    }

    pub fn handle(&self) -> Option<tokio::runtime::Handle> {
        self.runtime.as_ref().map(|r| r.handle().clone())
    }
}

impl Drop for ProbeThreads {
    fn drop(&mut self) {
        // Dropped inside the actor system: a blocking shutdown would panic.
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

pub struct HealthProber {
    prober: Prober,
    /// Where probes run; `None`: on the actor's own arbiter.
    threads: Option<tokio::runtime::Handle>,
    pool: Arc<Semaphore>,
    rule: LatencyRule,
    trace_probes: bool,
    watched: HashMap<ObjectKey, Watched>,
    next_generation: u64,
    stats: ProberStats,
    /// Proxies whose probe is due, waiting for a free worker (oldest
    /// first), with the registration they were due for.
    due: VecDeque<(ObjectKey, u64)>,
}

impl HealthProber {
    /// `workers` probes run at most at the same time.
    pub fn new(prober: Prober, workers: usize, trace_probes: bool) -> Self {
        Self {
            prober,
            threads: None,
            pool: Arc::new(Semaphore::new(workers.max(1))),
            rule: LatencyRule::default(),
            trace_probes,
            watched: HashMap::new(),
            next_generation: 0,
            stats: ProberStats::default(),
            due: VecDeque::new(),
        }
    }

    /// Runs the probes on `threads` instead of the actor's arbiter.
    pub fn on(mut self, threads: &ProbeThreads) -> Self {
        self.threads = threads.handle();
        self
    }

    fn schedule(&mut self, key: ObjectKey, interval: Duration, ctx: &mut Context<Self>) -> SpawnHandle {
        // First probe at a random point of the first interval, then every interval.
        let jitter = interval.mul_f64(fastrand::f64());
        ctx.run_later(jitter, move |actor, ctx| {
            actor.tick(&key, ctx);
            let every = key.clone();
            let handle = ctx.run_interval(interval, move |actor, ctx| actor.tick(&every, ctx));
            if let Some(w) = actor.watched.get_mut(&key) {
                w.timer = handle;
            }
        })
    }

    fn tick(&mut self, key: &ObjectKey, ctx: &mut Context<Self>) {
        let Some(w) = self.watched.get_mut(key) else {
            return;
        };
        if w.owner.upgrade().is_none_or(|owner| !owner.connected()) {
            // The owning ProxyActor is gone: prune.
            let w = self.watched.remove(key);
            if let Some(w) = w {
                ctx.cancel_future(w.timer);
            }
            return;
        }
        if w.in_flight {
            self.stats.skipped += 1;
            return;
        }
        w.in_flight = true;
        self.stats.in_flight += 1;
        self.due.push_back((key.clone(), w.generation));
        self.start_due(ctx);
    }

    /// Starts due probes while a worker is free. A probe waits in `due` (a
    /// key) rather than as a spawned task (a whole probe's state): ten
    /// thousand proxies due at once cost kilobytes, not tens of megabytes.
    fn start_due(&mut self, ctx: &mut Context<Self>) {
        while !self.due.is_empty() {
            let Ok(permit) = self.pool.clone().try_acquire_owned() else {
                return;
            };
            let Some((key, generation)) = self.due.pop_front() else {
                return;
            };
            // Unwatched or re-registered while it waited: nothing to probe.
            let Some(w) = self
                .watched
                .get(&key)
                .filter(|w| w.in_flight && w.generation == generation)
            else {
                self.stats.in_flight = self.stats.in_flight.saturating_sub(1);
                continue;
            };
            self.spawn_probe(key.clone(), generation, w.target.clone(), permit, ctx);
        }
    }

    fn spawn_probe(
        &self,
        key: ObjectKey,
        generation: u64,
        target: Arc<ProbeTarget>,
        permit: OwnedSemaphorePermit,
        ctx: &mut Context<Self>,
    ) {
        let (prober, me, trace) = (self.prober.clone(), ctx.address(), self.trace_probes);
        let probe = async move {
            // Opt-in: a root span per probe (thousands per second otherwise).
            let span = if trace {
                tracing::info_span!(
                    parent: None, "health.probe", otel.kind = "client", proxy = %key,
                    probe.result = Empty, probe.latency_ms = Empty, otel.status_code = Empty,
                    otel.status_description = Empty, traceID = Empty, spanID = Empty,
                )
            } else {
                tracing::Span::none()
            };
            egress_proxies::telemetry::otel::record_ids(&span);
            // A probe that panics is a failed probe, not a proxy never probed again.
            let probed = AssertUnwindSafe(prober.probe_target(&target).instrument(span.clone()))
                .catch_unwind()
                .await;
            let result = probed.unwrap_or_else(|panic| ProbeResult {
                outcome: Err(ProbeFailure::Panicked(crate::supervision::panic_message(
                    panic.as_ref(),
                ))),
                latency: Duration::ZERO,
            });
            span.record(
                "probe.result",
                result.outcome.as_ref().err().map_or("ok", |f| f.reason()),
            );
            span.record("probe.latency_ms", result.latency.as_secs_f64() * 1000.0);
            if let Err(failure) = &result.outcome {
                span.record("otel.status_code", "error");
                span.record("otel.status_description", failure.to_string());
            }
            let span_context = trace
                .then(|| span.context().span().span_context().clone())
                .filter(|sc| sc.is_valid());
            drop(span);
            ProbeCompleted {
                result: result.outcome.as_ref().err().map_or("ok", |f| f.reason()),
                duration: result.latency,
            }
            .emit();
            if trace {
                tracing::debug!(
                    proxy = %key, ok = result.outcome.is_ok(), latencyMs = result.latency.as_millis() as u64,
                    reason = result.outcome.as_ref().err().map(|f| f.reason()).unwrap_or(""), "health.probe"
                );
            }
            let sample = Sample {
                uid: target.uid.clone(),
                ok: result.outcome.is_ok(),
                latency: result.latency,
                reason: result.outcome.err().map(|f| f.to_string()),
            };
            // Free before the result arrives, so the next due probe can start.
            drop(permit);
            me.do_send(ProbeDone {
                key,
                generation,
                sample,
                span: span_context,
            });
        };
        match &self.threads {
            Some(threads) => drop(threads.spawn(probe)),
            None => drop(actix::spawn(probe)),
        }
    }
}

impl Actor for HealthProber {
    type Context = Context<Self>;

    fn stopped(&mut self, _: &mut Self::Context) {
        crate::supervision::stop_beating("health_prober");
    }

    fn started(&mut self, ctx: &mut Self::Context) {
        // In the tree from the start, then refreshed every second.
        self.report_tree();
        ctx.run_interval(Duration::from_secs(1), |prober, _| prober.report_tree());
        crate::supervision::beat_while_running::<Self>("health_prober", ctx);
        // After a restart: every proxy still watched is probed again.
        let keys: Vec<(ObjectKey, Duration)> = self
            .watched
            .iter()
            .map(|(key, w)| (key.clone(), w.target.check.interval))
            .collect();
        for (key, interval) in keys {
            let timer = self.schedule(key.clone(), interval, ctx);
            if let Some(w) = self.watched.get_mut(&key) {
                w.timer = timer;
            }
        }
    }
}

impl actix::Supervised for HealthProber {
    fn restarting(&mut self, _: &mut Self::Context) {
        // Timers and probes in flight went with the old context. The
        // watched proxies and their health state stay; a result of a probe
        // started before the crash is dropped (new generation).
        for w in self.watched.values_mut() {
            self.next_generation += 1;
            w.generation = self.next_generation;
            w.in_flight = false;
        }
        self.due.clear();
        self.stats.in_flight = 0;
    }
}

impl HealthProber {
    fn report_tree(&self) {
        let in_flight = self.watched.values().filter(|w| w.in_flight).count();
        crate::supervision::report_singleton(
            "health_prober",
            &format!("watching {}", self.watched.len()),
            in_flight,
        );
    }
}

impl Handler<Watch> for HealthProber {
    type Result = ();

    fn handle(&mut self, msg: Watch, ctx: &mut Self::Context) {
        if let Some(w) = self.watched.get_mut(&msg.key)
            && w.target == msg.target
        {
            w.owner = msg.owner;
            return;
        }
        // A target changed under the prober's eyes is judged afresh: the
        // recorded verdict is about the old one.
        let first = !self.watched.contains_key(&msg.key);
        if let Some(old) = self.watched.remove(&msg.key) {
            ctx.cancel_future(old.timer);
        }
        self.next_generation += 1;
        let timer = self.schedule(msg.key.clone(), msg.target.check.interval, ctx);
        let state = match &msg.recorded {
            Some(recorded) if first => HealthState::resuming(msg.target.uid.clone(), recorded),
            _ => HealthState::new(msg.target.uid.clone()),
        };
        self.watched.insert(
            msg.key,
            Watched {
                target: msg.target,
                owner: msg.owner,
                state,
                generation: self.next_generation,
                timer,
                in_flight: false,
            },
        );
    }
}

impl Handler<Unwatch> for HealthProber {
    type Result = ();

    fn handle(&mut self, msg: Unwatch, ctx: &mut Self::Context) {
        if let Some(w) = self.watched.remove(&msg.key) {
            ctx.cancel_future(w.timer);
        }
    }
}

impl Handler<ProbeDone> for HealthProber {
    type Result = ();

    fn handle(&mut self, msg: ProbeDone, ctx: &mut Self::Context) {
        self.start_due(ctx);
        self.stats.in_flight = self.stats.in_flight.saturating_sub(1);
        self.stats.probes += 1;
        if !msg.sample.ok {
            self.stats.failures += 1;
        }
        // A result for a proxy that is gone, or was re-registered meanwhile, is dropped.
        let Some(w) = self
            .watched
            .get_mut(&msg.key)
            .filter(|w| w.generation == msg.generation)
        else {
            return;
        };
        w.in_flight = false;
        let thresholds = w.target.check.thresholds;
        if let Some(verdict) = w
            .state
            .record(&msg.sample, thresholds, self.rule, jiff::Timestamp::now())
        {
            tracing::debug!(proxy = %msg.key, healthy = verdict.healthy, flipped = verdict.flipped, "health verdict");
            if let Some(owner) = w.owner.upgrade() {
                owner.do_send(HealthVerdict {
                    key: msg.key.clone(),
                    verdict,
                    span: msg.span.clone(),
                });
            }
        }
    }
}

impl Handler<GetProberStats> for HealthProber {
    type Result = MessageResult<GetProberStats>;

    fn handle(&mut self, _: GetProberStats, _: &mut Self::Context) -> Self::Result {
        MessageResult(ProberStats {
            watched: self.watched.len(),
            ..self.stats
        })
    }
}
