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
use egress_proxies::domain::backoff::ladders;
use egress_proxies::telemetry::events::ActorRestarted;

use super::Node;

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
/// times lately (this one included): the [`ladders::ACTOR_RESTART`] ladder's
/// attempt `recent - 1`, `None` while it restarts at once.
fn pause_after(recent: usize) -> Option<Duration> {
    let attempt = u32::try_from(recent.saturating_sub(1)).unwrap_or(u32::MAX);
    Some(ladders::ACTOR_RESTART.step(attempt)).filter(|pause| !pause.is_zero())
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

    /// Restarts within [`super::super::RESTART_WINDOW`] allowed without a pause.
    const FREE_RESTARTS: usize = ladders::ACTOR_RESTART.immediate as usize;
    /// The longest pause before a restart.
    const MAX_PAUSE: Duration = ladders::ACTOR_RESTART.cap;

    #[test]
    fn a_few_restarts_are_immediate_then_pauses_grow_to_a_cap() {
        assert_eq!(pause_after(1), None);
        assert_eq!(pause_after(FREE_RESTARTS), None);
        assert_eq!(pause_after(FREE_RESTARTS + 1), Some(Duration::from_millis(200)));
        assert_eq!(pause_after(FREE_RESTARTS + 2), Some(Duration::from_millis(400)));
        assert_eq!(pause_after(FREE_RESTARTS + 40), Some(MAX_PAUSE));
    }

    /// Counts what it handled; panics when told to.
    #[derive(Default)]
    struct Fragile {
        handled: u32,
        restarted: u32,
    }

    impl Actor for Fragile {
        type Context = Context<Self>;
    }

    impl actix::Supervised for Fragile {
        fn restarting(&mut self, _: &mut Self::Context) {
            self.restarted += 1;
        }
    }

    #[derive(Message)]
    #[rtype(result = "(u32, u32)")]
    struct Count;

    #[derive(Message)]
    #[rtype(result = "()")]
    struct Explode;

    impl Handler<Count> for Fragile {
        type Result = MessageResult<Count>;
        fn handle(&mut self, _: Count, _: &mut Self::Context) -> Self::Result {
            self.handled += 1;
            MessageResult((self.handled, self.restarted))
        }
    }

    impl Handler<Explode> for Fragile {
        type Result = ();
        fn handle(&mut self, _: Explode, _: &mut Self::Context) {
            panic!("boom");
        }
    }

    fn entry(kind: &str) -> Option<super::super::ActorInfo> {
        super::super::snapshot().into_iter().find(|a| a.kind == kind)
    }

    #[actix_rt::test]
    async fn a_panicking_actor_is_restarted_in_place_and_a_crash_loop_is_reported() {
        let _turn = super::super::HEALTH_TESTS.lock().await;
        let addr = start(Node::singleton("test_fragile"), |_| Fragile::default());
        assert_eq!(addr.send(Count).await.unwrap(), (1, 0));

        // Under actix's own Supervisor the first panic would end the actor
        // and this send would fail: here the caller of the panicking message
        // hears that its answer is lost, the actor keeps its state and mailbox.
        assert!(addr.send(Explode).await.is_err());
        assert_eq!(addr.send(Count).await.unwrap(), (2, 1));
        assert_eq!(entry("test_fragile").map(|a| a.restarts), Some(1));
        assert!(
            super::super::crash_looping()
                .iter()
                .all(|(kind, _)| kind != "test_fragile")
        );

        // Crashing again and again: restarts slow down and /healthz is told.
        let started = std::time::Instant::now();
        for _ in 0..super::super::CRASH_LOOP {
            assert!(addr.send(Explode).await.is_err());
        }
        assert_eq!(addr.send(Count).await.unwrap(), (3, 6));
        assert!(
            started.elapsed() >= Duration::from_millis(200 + 400 + 800),
            "paused before restarts 4–6: {:?}",
            started.elapsed()
        );
        assert!(super::super::crash_looping().contains(&("test_fragile".to_owned(), 6)));

        // Nobody holds its address any more: it ends and leaves the tree.
        drop(addr);
        for _ in 0..50 {
            if entry("test_fragile").is_none() {
                return;
            }
            actix_rt::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("the ended actor is still in the tree");
    }
}
