//! A thread of its own for the Leases that must be renewed in time: the
//! leader Lease and this replica's member Lease.
//!
//! Everything else of the operator runs on the actix system thread, and a
//! burst of work there (thousands of Proxies reconciled at once) can keep a
//! renewal loop from being polled for longer than the renew deadline: the
//! leader then took its tenure for lapsed and exited although every renewal
//! it sent had been answered. On the keeper's thread the loops, their timers
//! and the lease client's connections (a connection's task runs where the
//! call that opened it was polled, so every call of that client is made
//! here) wait on nothing but the API server.
//!
//! ```text
//!  actix system thread                      keeper thread (current-thread runtime)
//!  ───────────────────                      ──────────────────────────────────────
//!  acts while the Tenure lasts ◄─ Tenure ─── leader Lease: campaign, renewals, release
//!  follows the holder        ◄─ Standing ───
//!  serves while a member     ◄─ Tenure ───── member Lease and roster (members::keep)
//! ```

use std::future::Future;

use tokio::sync::{oneshot, watch};

use super::leader::{Attempt, LeaderElector, Tenure};

/// The keeper thread; dropping it stops the thread (its tasks are dropped).
pub struct LeaseKeeper {
    handle: tokio::runtime::Handle,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl LeaseKeeper {
    pub fn start() -> std::io::Result<Self> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let handle = runtime.handle().clone();
        let (stop, stopped) = oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("lease-keeper".to_owned())
            .spawn(move || {
                runtime.block_on(async {
                    let _ = stopped.await;
                });
            })?;
        Ok(Self {
            handle,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// Runs `task` on the keeper thread.
    pub fn spawn<F>(&self, task: F) -> tokio::task::JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.handle.spawn(task)
    }

    /// Runs `task` on the keeper thread and waits for it here.
    pub async fn run<F>(&self, task: F) -> Result<F::Output, tokio::task::JoinError>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.spawn(task).await
    }

    /// A client for the Leases: its background worker runs on the keeper
    /// thread (and its calls must be made there too, see the module docs).
    pub fn client(&self, config: kube::Config) -> Result<kube::Client, kube::Error> {
        let _inside = self.handle.enter();
        super::kube_client::client(config, None)
    }

    /// Stands for the leader Lease on the keeper thread: an attempt every
    /// retry period until this replica leads (`tenure` extended), then a
    /// renewal every retry period until [`Election::stop`] or a lost
    /// leadership.
    pub fn elect(&self, elector: LeaderElector, tenure: Tenure) -> Election {
        let (standing_tx, standing) = watch::channel(Standing::Candidate);
        let (stop, stopped) = oneshot::channel();
        let task = self.spawn(stand(elector, tenure, standing_tx, stopped));
        Election { standing, stop, task }
    }
}

impl Drop for LeaseKeeper {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Where this replica stands in the election, as the keeper last saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Standing {
    /// No answer yet.
    Candidate,
    /// Another candidate holds the Lease (its identity; empty when it
    /// won a race to create it).
    Following(String),
    Leading,
    /// Leadership lost: the tenure ended without a renewal, or another
    /// candidate took the Lease.
    Lost(&'static str),
}

/// What [`Election::stop`] does with the Lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Release {
    /// Hand it over at once (a shutdown, a step-down).
    Release,
    /// Let it expire (another may have taken it).
    Keep,
}

/// This replica's candidacy, running on the keeper thread.
pub struct Election {
    standing: watch::Receiver<Standing>,
    /// Dropped without a send (the Election dropped): renewals end, the
    /// Lease expires by itself.
    stop: oneshot::Sender<Release>,
    task: tokio::task::JoinHandle<()>,
}

impl Election {
    /// The standing, to watch for changes.
    pub fn standing(&self) -> watch::Receiver<Standing> {
        self.standing.clone()
    }

    /// Resolves once this replica leads (true), or never leads any more
    /// (false: the keeper stopped).
    pub async fn leading(&mut self) -> bool {
        self.standing
            .wait_for(|s| matches!(s, Standing::Leading | Standing::Lost(_)))
            .await
            .is_ok_and(|s| *s == Standing::Leading)
    }

    /// Resolves once the leadership is lost, with the reason.
    pub async fn lost(&mut self) -> &'static str {
        match self.standing.wait_for(|s| matches!(s, Standing::Lost(_))).await {
            Ok(s) => match &*s {
                Standing::Lost(why) => why,
                _ => STOPPED,
            },
            Err(_) => STOPPED,
        }
    }

    /// Stops standing (renewals end first), releasing the Lease if it is
    /// held and `release` says so; waits for the keeper to be done.
    pub async fn stop(self, release: Release) {
        let _ = self.stop.send(release);
        if let Err(e) = self.task.await {
            tracing::warn!(error = %e, "the leader election task failed");
        }
    }
}

const STOPPED: &str = "the renewals stopped";

/// The keeper's side of an [`Election`].
async fn stand(
    mut elector: LeaderElector,
    tenure: Tenure,
    standing: watch::Sender<Standing>,
    mut stopped: oneshot::Receiver<Release>,
) {
    let retry = elector.timings().retry_period;
    // Stopped (or the Election dropped, which asks for no release).
    let stop_asked = |r: Result<Release, oneshot::error::RecvError>| r.unwrap_or(Release::Keep);
    loop {
        let attempt = tokio::select! {
            attempt = elector.try_acquire_or_renew() => attempt,
            _ = &mut stopped => return,
        };
        match attempt {
            Ok(Attempt::Leading { until }) => {
                tenure.extend(until);
                standing.send_replace(Standing::Leading);
                break;
            }
            Ok(Attempt::Following { holder }) => {
                standing.send_replace(Standing::Following(holder));
            }
            Err(e) => tracing::warn!(error = %e, "leader election attempt failed"),
        }
        tokio::select! {
            _ = tokio::time::sleep(retry) => {}
            _ = &mut stopped => return,
        }
    }
    let mut asked = None;
    let kept = {
        let stop = async {
            asked = Some(stop_asked((&mut stopped).await));
        };
        tokio::pin!(stop);
        keep_leading(&mut elector, &tenure, stop).await
    };
    tenure.end();
    if let Err(why) = kept {
        standing.send_replace(Standing::Lost(why));
    }
    // Lost: wait for the stop (the Lease is another's or expiring).
    let asked = match asked {
        Some(asked) => asked,
        None => stop_asked(stopped.await),
    };
    // A lost Lease is not released: another candidate may hold it already.
    if asked == Release::Release
        && *standing.borrow() == Standing::Leading
        && let Err(e) = elector.release().await
    {
        tracing::warn!(error = %e, "releasing the leader Lease failed; it expires by itself");
    }
}

/// Renews the Lease until `stop` resolves (Ok), or until the tenure ends
/// without a successful renew or another candidate holds the Lease (Err,
/// why). The tenure deadline is raced against the renew in flight, so a
/// hanging request cannot keep this replica acting past it.
async fn keep_leading(
    elector: &mut LeaderElector,
    tenure: &Tenure,
    mut stop: std::pin::Pin<&mut impl Future<Output = ()>>,
) -> Result<(), &'static str> {
    let retry = elector.timings().retry_period;
    let identity = elector.identity().to_owned();
    let lapsed = || {
        tenure.end();
        tracing::error!(
            identity,
            "could not renew the leader Lease within the renew deadline; stopped acting"
        );
        "renew deadline passed"
    };
    loop {
        let deadline = tokio::time::Instant::from_std(tenure.until().unwrap_or_else(std::time::Instant::now));
        tokio::select! {
            () = &mut stop => return Ok(()),
            _ = tokio::time::sleep_until(deadline) => return Err(lapsed()),
            _ = tokio::time::sleep(retry) => {}
        }
        let attempt = tokio::select! {
            () = &mut stop => return Ok(()),
            _ = tokio::time::sleep_until(deadline) => return Err(lapsed()),
            attempt = elector.try_acquire_or_renew() => attempt,
        };
        match attempt {
            Ok(Attempt::Leading { until }) => tenure.extend(until),
            Ok(Attempt::Following { holder }) => {
                tenure.end();
                tracing::error!(holder, "another candidate holds the leader Lease");
                return Err("another candidate holds the Lease");
            }
            Err(e) => tracing::warn!(error = %e, "renewing the leader Lease failed"),
        }
    }
}
