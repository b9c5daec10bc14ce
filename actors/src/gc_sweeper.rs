//! `GcSweeper`: runs an orphan-GC sweep every `--gc-interval` (leader only
//! in Kubernetes mode). A sweep never overlaps the previous one.

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use std::collections::HashSet;

use egress_proxies::domain::gc::{self, Scope, SweepReport};
use egress_proxies::domain::provider_contract::ProviderId;
use egress_proxies::domain::provider_contract::Providers;
use egress_proxies::domain::resource_store::ProxyStore;
use egress_proxies::telemetry::events::{GcNotOurs, GcSweepCompleted};
use tracing::Instrument;
use tracing::field::Empty;

/// Run a sweep now; answers with its report (tests, admin).
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "Option<SweepReport>")]
pub struct SweepNow;

pub struct GcSweeper {
    store: Arc<dyn ProxyStore>,
    providers: Arc<Providers>,
    interval: Duration,
    grace: Duration,
    scope: Arc<Scope>,
    running: bool,
    /// Untagged instances already reported (each is logged once).
    reported: HashSet<(String, ProviderId)>,
}

impl GcSweeper {
    pub fn new(
        store: Arc<dyn ProxyStore>,
        providers: Arc<Providers>,
        scope: Scope,
        interval: Duration,
        grace: Duration,
    ) -> Self {
        Self {
            store,
            providers,
            interval,
            grace,
            scope: Arc::new(scope),
            running: false,
            reported: HashSet::new(),
        }
    }

    fn sweep(&mut self) -> Option<ResponseActFuture<Self, Option<SweepReport>>> {
        if self.running {
            return None;
        }
        self.running = true;
        let (store, providers, grace) = (self.store.clone(), self.providers.clone(), self.grace);
        let scope = self.scope.clone();
        let span = tracing::info_span!(
            parent: None, "gc.sweep", gc.listed = Empty, gc.orphans = Empty, gc.deleted = Empty,
            gc.leftovers_deleted = Empty, traceID = Empty, spanID = Empty,
        );
        egress_proxies::telemetry::otel::record_ids(&span);
        let recorded = span.clone();
        let work = async move {
            let result = gc::sweep(store.as_ref(), &providers, &scope, grace, jiff::Timestamp::now())
                .instrument(recorded.clone())
                .await;
            if let Ok(r) = &result {
                recorded.record("gc.listed", r.listed);
                recorded.record("gc.orphans", r.orphans);
                recorded.record("gc.deleted", r.deleted);
                recorded.record("gc.leftovers_deleted", r.leftovers_deleted);
            }
            result
        };
        Some(Box::pin(work.into_actor(self).map(|result, actor, _| {
            actor.running = false;
            match result {
                Ok(report) => {
                    for ((provider, reason), count) in &report.not_ours {
                        GcNotOurs {
                            provider,
                            reason: reason.as_str(),
                            count: *count,
                        }
                        .emit();
                    }
                    for (provider, id) in &report.untagged {
                        if actor.reported.insert((provider.clone(), id.clone())) {
                            tracing::warn!(
                                provider, providerID = %id,
                                "GC: instance tagged managed but without an installation tag (made by hand or by an \
                                 earlier version): never reaped; see docs/operations.md to adopt or remove it"
                            );
                        }
                    }
                    GcSweepCompleted {
                        outcome: Ok(report.figures()),
                    }
                    .emit();
                    Some(report)
                }
                Err(e) => {
                    GcSweepCompleted { outcome: Err(&e) }.emit();
                    None
                }
            }
        })))
    }
}

impl Actor for GcSweeper {
    type Context = Context<Self>;

    fn stopped(&mut self, _: &mut Self::Context) {
        crate::supervision::stop_beating("gc_sweeper");
    }

    fn started(&mut self, ctx: &mut Self::Context) {
        crate::supervision::report_singleton("gc_sweeper", "idle", 0);
        crate::supervision::beat_while_running::<Self>("gc_sweeper", ctx);
        ctx.run_interval(self.interval, |actor, ctx| {
            if let Some(work) = actor.sweep() {
                ctx.spawn(work.map(|_, _, _| ()));
            }
        });
    }
}

impl actix::Supervised for GcSweeper {
    fn restarting(&mut self, _: &mut Self::Context) {
        // A sweep cut short is safe to run again: every step re-checks.
        self.running = false;
    }
}

impl Handler<SweepNow> for GcSweeper {
    type Result = ResponseActFuture<Self, Option<SweepReport>>;

    fn handle(&mut self, _: SweepNow, _: &mut Self::Context) -> Self::Result {
        match self.sweep() {
            Some(work) => work,
            None => Box::pin(actix::fut::ready(None)),
        }
    }
}
