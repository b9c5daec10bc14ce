//! A gateway request waiting in turn at the lease store (see
//! [`super::turns`]): woken by its lease, by a rest ending, or at the end
//! of its wait; leaving the queue when dropped.

use std::time::Instant;

use tokio::sync::oneshot;

use crate::adapters::gateway::Upstream;
use crate::domain::lease::{AcquireError, AcquireRequest};

use super::{LeaseStore, State};

/// A gateway request waiting in turn; leaving the queue when dropped.
pub(super) struct InTurn {
    store: LeaseStore,
    seq: u64,
    /// Taken once the lease arrived (or the wait ended).
    receive: Option<oneshot::Receiver<Upstream>>,
}

/// What ended a waiter's sleep.
enum Woke {
    Served(Box<Result<Upstream, oneshot::error::RecvError>>),
    At(Instant),
    /// The next opening moved; false: it never will again.
    Changed(bool),
}

impl InTurn {
    pub(super) fn new(store: LeaseStore, seq: u64, receive: oneshot::Receiver<Upstream>) -> Self {
        Self {
            store,
            seq,
            receive: Some(receive),
        }
    }

    pub(super) async fn wait(
        &mut self,
        request: &AcquireRequest,
        until: Instant,
    ) -> Result<Upstream, AcquireError> {
        let mut opening = Some(self.store.lock().turns.watch_opening());
        loop {
            let Some(receive) = self.receive.as_mut() else {
                return Err(AcquireError::NoCapacity {
                    target: request.target.clone(),
                });
            };
            // Woken by the lease (served at a release or a pass), by a
            // rest ending (a pass then, unless one ran since), or at the end.
            let wake = opening
                .as_ref()
                .and_then(|o| *o.borrow())
                .map_or(until, |at| at.min(until));
            let changed = async {
                match opening.as_mut() {
                    Some(o) => o.changed().await.is_ok(),
                    None => std::future::pending().await,
                }
            };
            let woke = tokio::select! {
                granted = receive => Woke::Served(Box::new(granted)),
                () = tokio::time::sleep_until(wake.into()) => Woke::At(wake),
                alive = changed => Woke::Changed(alive),
            };
            match woke {
                Woke::Served(granted) => {
                    self.receive = None;
                    return (*granted)
                        .map_err(|_| AcquireError::Unavailable("the lease store restarted".into()));
                }
                Woke::Changed(alive) => {
                    if !alive {
                        opening = None;
                    }
                    continue;
                }
                Woke::At(at) => {
                    let store = self.store.clone();
                    let mut state = store.lock();
                    if Instant::now() < until {
                        if !state.turns.passed_since(at) {
                            state.serve_waiters();
                        }
                        continue;
                    }
                    return self.time_up(&mut state, request);
                }
            }
        }
    }

    /// Out of time: one denial for the whole wait, unless the lease came
    /// just now.
    fn time_up(&mut self, state: &mut State, request: &AcquireRequest) -> Result<Upstream, AcquireError> {
        if let Some(receive) = self.receive.as_mut()
            && let Ok(granted) = receive.try_recv()
        {
            self.receive = None;
            return Ok(granted);
        }
        self.receive = None;
        state.turns.leave(self.seq);
        state.book.count_denial(request);
        let refused = AcquireError::NoCapacity {
            target: request.target.clone(),
        };
        state.account(&Err(refused.clone()));
        // Shares it held others back by may have changed.
        state.serve_waiters();
        Err(refused)
    }
}

impl Drop for InTurn {
    fn drop(&mut self) {
        let Some(mut receive) = self.receive.take() else {
            return;
        };
        // Gave up: out of the queue, and a lease granted meanwhile back.
        let mut state = self.store.lock();
        if state.turns.leave(self.seq).is_some() {
            state.serve_waiters();
            return;
        }
        if let Ok(granted) = receive.try_recv() {
            state.turns.ended(&granted.lease_id);
            state.book.cancel(&granted.lease_id, Instant::now());
            state.serve_waiters();
        }
    }
}
