//! `ProxyActor`: one per Proxy. Runs the reconcile for its object — never two
//! at once — and schedules the next one: a short backoff while something is
//! in flight, the resync period once running, exponential backoff on errors,
//! minutes on quota errors. A panicking reconcile stops the actor; its
//! Supervisor restarts it and it resumes from the stored state.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use actix::prelude::*;
use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};
use egress_proxies::provider::ErrorClass;
use egress_proxies::reconcile::{self, Next, ReconcileError};
use egress_proxies::store::ObjectKey;
use futures::FutureExt;

use crate::messages::{Reconcile, Shutdown};

/// How often a ProxyActor looks again.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    pub poll_min: Duration,
    pub poll_max: Duration,
    pub resync: Duration,
    pub error_min: Duration,
    pub error_max: Duration,
    pub quota_min: Duration,
    pub quota_max: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        Self {
            poll_min: Duration::from_millis(500),
            poll_max: Duration::from_secs(15),
            resync: Duration::from_secs(30),
            error_min: Duration::from_secs(1),
            error_max: Duration::from_secs(300),
            quota_min: Duration::from_secs(120),
            quota_max: Duration::from_secs(600),
        }
    }
}

fn backoff(min: Duration, max: Duration) -> ExponentialBackoff {
    ExponentialBuilder::default()
        .with_min_delay(min)
        .with_max_delay(max)
        .with_jitter()
        .without_max_times()
        .build()
}

pub struct ProxyActor {
    key: ObjectKey,
    ctx: reconcile::Context,
    timing: Timing,
    restarts: Arc<AtomicU64>,
    /// Kept between reconciles; lent to the running one.
    memory: Option<reconcile::Memory>,
    running: bool,
    again: bool,
    timer: Option<SpawnHandle>,
    polls: ExponentialBackoff,
    errors: ExponentialBackoff,
    quota: ExponentialBackoff,
}

impl ProxyActor {
    pub fn new(key: ObjectKey, ctx: reconcile::Context, timing: Timing, restarts: Arc<AtomicU64>) -> Self {
        Self {
            key,
            ctx,
            timing,
            restarts,
            memory: Some(reconcile::Memory::default()),
            running: false,
            again: false,
            timer: None,
            polls: backoff(timing.poll_min, timing.poll_max),
            errors: backoff(timing.error_min, timing.error_max),
            quota: backoff(timing.quota_min, timing.quota_max),
        }
    }

    fn start_reconcile(&mut self, ctx: &mut Context<Self>) {
        if self.running {
            // Serial per object: note the request and run once more afterwards.
            self.again = true;
            return;
        }
        if let Some(timer) = self.timer.take() {
            ctx.cancel_future(timer);
        }
        self.running = true;
        let key = self.key.clone();
        let rctx = self.ctx.clone();
        let mut memory = self.memory.take().unwrap_or_default();
        let work = async move {
            let result = AssertUnwindSafe(reconcile::reconcile(&key, &rctx, &mut memory))
                .catch_unwind()
                .await;
            (result, memory)
        };
        ctx.spawn(work.into_actor(self).map(|(result, memory), actor, ctx| {
            actor.memory = Some(memory);
            actor.finished(result, ctx)
        }));
    }

    fn finished(
        &mut self,
        result: std::thread::Result<Result<Next, ReconcileError>>,
        ctx: &mut Context<Self>,
    ) {
        self.running = false;
        let delay = match result {
            Err(panic) => {
                let what = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                tracing::error!(proxy = %self.key, panic = %what, "reconcile panicked; restarting the actor");
                ctx.stop();
                return;
            }
            Ok(Ok(next)) => {
                self.errors = backoff(self.timing.error_min, self.timing.error_max);
                self.quota = backoff(self.timing.quota_min, self.timing.quota_max);
                match next {
                    Next::Poll => self.polls.next(),
                    Next::Resync => {
                        self.polls = backoff(self.timing.poll_min, self.timing.poll_max);
                        Some(self.timing.resync)
                    }
                    Next::Idle | Next::Gone => {
                        self.polls = backoff(self.timing.poll_min, self.timing.poll_max);
                        None
                    }
                }
            }
            Ok(Err(error)) => {
                let delay = match error.class() {
                    ErrorClass::QuotaExceeded => self.quota.next(),
                    _ => self.errors.next(),
                };
                tracing::warn!(
                    proxy = %self.key, error = %error, class = %error.class(),
                    retryIn = ?delay, "reconcile failed"
                );
                delay
            }
        };
        if std::mem::take(&mut self.again) {
            self.start_reconcile(ctx);
        } else if let Some(delay) = delay {
            self.timer = Some(ctx.run_later(delay, |actor, ctx| {
                actor.timer = None;
                actor.start_reconcile(ctx);
            }));
        }
    }
}

impl Actor for ProxyActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        self.start_reconcile(ctx);
    }
}

impl Supervised for ProxyActor {
    fn restarting(&mut self, _: &mut Self::Context) {
        self.restarts.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(proxy = %self.key, "ProxyActor restarted by its supervisor");
        self.running = false;
        self.again = false;
        self.timer = None;
        self.memory = Some(reconcile::Memory::default());
        self.polls = backoff(self.timing.poll_min, self.timing.poll_max);
    }
}

impl Handler<Reconcile> for ProxyActor {
    type Result = ();

    fn handle(&mut self, _: Reconcile, ctx: &mut Self::Context) {
        self.start_reconcile(ctx);
    }
}

impl Handler<Shutdown> for ProxyActor {
    type Result = ();

    fn handle(&mut self, _: Shutdown, ctx: &mut Self::Context) {
        ctx.stop();
    }
}
