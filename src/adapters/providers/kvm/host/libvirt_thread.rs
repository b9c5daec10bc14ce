//! A host's libvirt thread: the one place its blocking libvirt calls run
//! (never on the async executor), one at a time, over one connection.
//!
//! Each job tells its waiter when it *starts*, then answers. The waiter
//! gives a call its deadline only from that moment: time spent queued
//! behind the host's other calls is not the call's fault, so a burst of
//! creates on one host never reads as a hung link.

use std::sync::mpsc;
use std::time::Duration;

use super::calls::HostCall;
use super::session::HostSession;
use crate::adapters::providers::kvm::errors::KvmError;
use crate::adapters::providers::kvm::ops::OpError;
use tokio::sync::oneshot;

/// One call boxed for the thread. Dropped unrun (the link went down, the
/// thread ended), its waiter hears [`Waited::NotRun`].
pub struct Job<S = HostSession>(Box<dyn FnOnce(&S) + Send>);

/// The waiting side of a [`Job`].
pub struct Pending<T> {
    started: oneshot::Receiver<()>,
    answer: oneshot::Receiver<Result<T, OpError>>,
}

/// How waiting for a job ended.
#[derive(Debug)]
pub enum Waited<T> {
    Answered(Result<T, OpError>),
    /// The job never started: the thread is gone, or the job was dropped.
    NotRun,
    /// It started and then ended without an answer (the thread died in it).
    Vanished,
    /// It started and was still running at its deadline: the call hangs.
    Overran,
}

impl<S: 'static> Job<S> {
    /// A job running `f` on the session; the pending side awaits its answer.
    pub fn new<T: Send + 'static>(
        f: impl FnOnce(&S) -> Result<T, OpError> + Send + 'static,
    ) -> (Self, Pending<T>) {
        let (started_tx, started) = oneshot::channel();
        let (answer_tx, answer) = oneshot::channel();
        let job = Job(Box::new(move |session: &S| {
            // Nobody waits any more (the host actor restarted): skip the call.
            if started_tx.send(()).is_err() {
                return;
            }
            let _ = answer_tx.send(f(session));
        }));
        (job, Pending { started, answer })
    }
}

impl Job<HostSession> {
    /// A job running one [`HostCall`].
    pub fn call<C: HostCall>(call: C) -> (Self, Pending<C::Output>) {
        Job::new(move |session| call.run(session))
    }
}

impl<T> Pending<T> {
    /// Waits without limit for the job to start, then at most `deadline`
    /// for its answer.
    pub async fn wait(self, deadline: Duration) -> Waited<T> {
        if self.started.await.is_err() {
            return Waited::NotRun;
        }
        match tokio::time::timeout(deadline, self.answer).await {
            Ok(Ok(answer)) => Waited::Answered(answer),
            Ok(Err(_)) => Waited::Vanished,
            Err(_) => Waited::Overran,
        }
    }
}

/// The sending end of a host's libvirt thread; dropping it ends the thread
/// once the job it is running returns.
pub struct LibvirtThread<S = HostSession> {
    jobs: mpsc::Sender<Job<S>>,
}

impl<S> LibvirtThread<S> {
    /// Queues a job; hands it back when the thread has ended.
    pub fn submit(&self, job: Job<S>) -> Result<(), Job<S>> {
        self.jobs.send(job).map_err(|refused| refused.0)
    }
}

impl LibvirtThread<HostSession> {
    /// Starts the thread for `host`; it opens `uri` (the SSH link's local
    /// socket) first, and the receiver says whether that worked.
    pub fn spawn(uri: &str, host: &str, pool: &str) -> (Self, oneshot::Receiver<Result<(), KvmError>>) {
        let (tx, rx) = mpsc::channel::<Job>();
        let (ready_tx, ready_rx) = oneshot::channel();
        let (uri, host, pool) = (uri.to_owned(), host.to_owned(), pool.to_owned());
        let spawned = std::thread::Builder::new()
            .name(format!("libvirt-{host}"))
            .spawn(move || match HostSession::open(&uri, &host, &pool) {
                Ok(session) => {
                    let _ = ready_tx.send(Ok(()));
                    serve(&session, rx);
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                }
            });
        if let Err(e) = spawned {
            // The ready sender is gone with the closure: the actor hears "ended".
            tracing::warn!(error = %e, "starting the libvirt thread failed");
        }
        (LibvirtThread { jobs: tx }, ready_rx)
    }
}

/// Runs jobs in arrival order until every sender is gone.
fn serve<S>(session: &S, jobs: mpsc::Receiver<Job<S>>) {
    for Job(run) in jobs {
        run(session);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;

    fn thread() -> LibvirtThread<()> {
        let (tx, rx) = mpsc::channel::<Job<()>>();
        std::thread::spawn(move || serve(&(), rx));
        LibvirtThread { jobs: tx }
    }

    fn sleeping(for_: Duration) -> (Job<()>, Pending<Duration>) {
        Job::new(move |_: &()| {
            std::thread::sleep(for_);
            Ok(for_)
        })
    }

    #[tokio::test]
    async fn queued_jobs_get_their_deadline_from_their_start() {
        let thread = thread();
        let deadline = Duration::from_millis(400);
        let started = Instant::now();
        // Eight jobs of 150 ms each: the last one waits ~1 s, well past the deadline.
        let waits = (0..8).map(|_| {
            let (job, pending) = sleeping(Duration::from_millis(150));
            assert!(thread.submit(job).is_ok());
            pending.wait(deadline)
        });
        for waited in futures::future::join_all(waits).await {
            assert!(matches!(waited, Waited::Answered(Ok(_))), "{waited:?}");
        }
        assert!(
            started.elapsed() > 2 * deadline,
            "the jobs did queue past the deadline"
        );
    }

    #[tokio::test]
    async fn a_call_running_past_its_deadline_overruns_and_queued_ones_are_not_blamed() {
        let thread = thread();
        let (hung, hung_pending) = sleeping(Duration::from_millis(800));
        let (next, next_pending) = sleeping(Duration::from_millis(10));
        assert!(thread.submit(hung).is_ok());
        assert!(thread.submit(next).is_ok());
        let deadline = Duration::from_millis(200);
        let (hung_waited, next_waited) =
            tokio::join!(hung_pending.wait(deadline), next_pending.wait(deadline));
        assert!(matches!(hung_waited, Waited::Overran), "{hung_waited:?}");
        assert!(matches!(next_waited, Waited::Answered(Ok(_))), "{next_waited:?}");
    }

    #[tokio::test]
    async fn a_job_dropped_unrun_or_whose_thread_dies_says_so() {
        let (job, pending) = sleeping(Duration::ZERO);
        drop(job);
        assert!(matches!(
            pending.wait(Duration::from_secs(1)).await,
            Waited::NotRun
        ));

        let thread = thread();
        let (dies, pending) = Job::new(|_: &()| -> Result<(), OpError> { panic!("in the call") });
        assert!(thread.submit(dies).is_ok());
        assert!(matches!(
            pending.wait(Duration::from_secs(1)).await,
            Waited::Vanished
        ));
        let (after, pending) = sleeping(Duration::ZERO);
        // The thread is gone: the job comes back, or (queued just before) never runs.
        if thread.submit(after).is_ok() {
            assert!(matches!(
                pending.wait(Duration::from_secs(1)).await,
                Waited::NotRun
            ));
        }
    }

    #[tokio::test]
    async fn a_job_whose_waiter_left_is_skipped() {
        let thread = thread();
        let ran = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = ran.clone();
        let (job, pending) = Job::new(move |_: &()| {
            flag.store(true, std::sync::atomic::Ordering::SeqCst);
            Ok(())
        });
        drop(pending);
        assert!(thread.submit(job).is_ok());
        let (probe, probe_pending) = sleeping(Duration::ZERO);
        assert!(thread.submit(probe).is_ok());
        assert!(matches!(
            probe_pending.wait(Duration::from_secs(1)).await,
            Waited::Answered(_)
        ));
        assert!(!ran.load(std::sync::atomic::Ordering::SeqCst));
    }
}
