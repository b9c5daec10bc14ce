//! The supervisor every long-lived actor runs under. Like actix's own
//! `Supervisor`, it restarts an actor that stopped while others still hold
//! its address — in place, keeping the actor's value and its mailbox, after
//! `Supervised::restarting` — and, unlike it, it also restarts an actor that
//! panicked: in a handler, a timer or a future spawned on its context. (Under
//! actix's `Supervisor` a panic unwinds out of the task, the actor is gone for
//! good and every message to it fails.)
//!
//! Each restart is counted for the dashboard and the
//! `egress_proxies_actor_restarts_total` metric. An actor that keeps crashing
//! is restarted after a growing pause (a panic on start cannot spin a core),
//! and a singleton that crashes again and again turns `/healthz` unhealthy:
//! restarting the process is the next step.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use actix::dev::ContextFut;
use actix::prelude::*;
use egress_proxies::telemetry::events::ActorRestarted;

use super::Node;

/// Restarts within [`super::RESTART_WINDOW`] allowed without a pause.
const FREE_RESTARTS: usize = 3;
/// The longest pause before a restart.
const MAX_PAUSE: Duration = Duration::from_secs(30);

/// Starts `make`'s actor on the current arbiter under a supervisor.
pub fn start<A, F>(node: Node, make: F) -> Addr<A>
where
    A: Actor<Context = Context<A>> + actix::Supervised,
    F: FnOnce(&mut Context<A>) -> A,
{
    let mut ctx = Context::new();
    let actor = make(&mut ctx);
    let addr = ctx.address();
    actix::spawn(Restarting::new(node, ctx.into_future(actor)));
    addr
}

/// Starts `make`'s actor on `arbiter`'s thread under a supervisor.
pub fn start_in_arbiter<A, F>(arbiter: &ArbiterHandle, node: Node, make: F) -> Addr<A>
where
    A: Actor<Context = Context<A>> + actix::Supervised,
    F: FnOnce(&mut Context<A>) -> A + Send + 'static,
{
    let (tx, rx) = actix::dev::channel::channel(16);
    arbiter.spawn_fn(move || {
        let mut ctx = Context::with_receiver(rx);
        let actor = make(&mut ctx);
        actix::spawn(Restarting::new(node, ctx.into_future(actor)));
    });
    Addr::new(tx)
}

/// The actor's future, polled with panics caught.
struct Restarting<A>
where
    A: Actor<Context = Context<A>> + actix::Supervised,
{
    node: Node,
    actor: Pin<Box<ContextFut<A, Context<A>>>>,
    pause: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<A> Restarting<A>
where
    A: Actor<Context = Context<A>> + actix::Supervised,
{
    fn new(node: Node, actor: ContextFut<A, Context<A>>) -> Self {
        super::register(&node);
        Self {
            node,
            actor: Box::pin(actor),
            pause: None,
        }
    }

    /// Restarts the actor unless nobody can reach it any more; says whether it did.
    fn restart(&mut self, cause: &str) -> bool {
        // `ContextFut` is `Unpin`; the box only keeps this future small.
        if !self.actor.as_mut().get_mut().restart() {
            return false;
        }
        let recent = super::record_restart(&self.node);
        ActorRestarted {
            actor: self.node.kind,
            id: &self.node.id,
            cause,
        }
        .emit();
        if let Some(pause) = pause_after(recent) {
            tracing::warn!(
                actor = self.node.kind, id = %self.node.id, recentRestarts = recent, pause = ?pause,
                "actor keeps crashing; pausing before the next restart"
            );
            self.pause = Some(Box::pin(tokio::time::sleep(pause)));
        }
        true
    }
}

/// How long to wait before restarting an actor that restarted `recent`
/// times lately (this one included).
fn pause_after(recent: usize) -> Option<Duration> {
    let over = recent.checked_sub(FREE_RESTARTS).filter(|n| *n > 0)?;
    let pause = Duration::from_millis(100).saturating_mul(1 << over.min(16));
    Some(pause.min(MAX_PAUSE))
}

impl<A> Future for Restarting<A>
where
    A: Actor<Context = Context<A>> + actix::Supervised,
{
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<()> {
        let this = self.get_mut();
        loop {
            if let Some(pause) = this.pause.as_mut() {
                if pause.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                this.pause = None;
            }
            let polled = std::panic::catch_unwind(AssertUnwindSafe(|| this.actor.as_mut().poll(cx)));
            let cause = match polled {
                Ok(Poll::Pending) => return Poll::Pending,
                Ok(Poll::Ready(())) => "stopped".to_owned(),
                Err(panic) => {
                    let what = super::panic_message(panic.as_ref());
                    tracing::error!(
                        actor = this.node.kind, id = %this.node.id, panic = %what,
                        "actor panicked; its supervisor restarts it"
                    );
                    format!("panicked: {what}")
                }
            };
            if !this.restart(&cause) {
                super::unregister(&this.node);
                return Poll::Ready(());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_few_restarts_are_immediate_then_pauses_grow_to_a_cap() {
        assert_eq!(pause_after(1), None);
        assert_eq!(pause_after(FREE_RESTARTS), None);
        assert_eq!(pause_after(FREE_RESTARTS + 1), Some(Duration::from_millis(200)));
        assert_eq!(pause_after(FREE_RESTARTS + 2), Some(Duration::from_millis(400)));
        assert_eq!(pause_after(FREE_RESTARTS + 40), Some(MAX_PAUSE));
    }
}
