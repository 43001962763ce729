//! The worker threads: each takes work from the queue and hands it to the
//! executor, until the queue shuts down; and the watchdog, which reports
//! storage calls past their deadline and replaces their stuck threads.

use super::crew::{Crew, Worker};
use super::{CopyTask, Work, WorkQueue};
use crate::error::{bail, Result};
use crate::thread::spawn_running;
use std::sync::Arc;
use std::time::Duration;

/// What runs the work the threads take: the engine, which names its own
/// task and job types; the threads only pass them along.
pub(crate) trait Executor: Send + Sync + 'static {
    /// A copy task, as the queue holds it.
    type Task: CopyTask;
    /// What a storage call copies for: handed back by the watchdog when the
    /// call is past its deadline.
    type Job: Send + Sync + 'static;
    /// The queue the threads drain.
    fn queue(&self) -> &WorkQueue<Self::Task>;
    /// The threads' accounting and deadlines.
    fn crew(&self) -> &Crew<Self::Job>;
    /// Runs one piece of work on the calling worker thread.
    fn execute(&self, work: Work<Self::Task>, worker: &Worker<Self::Job>);
    /// A storage call for item `item` of `job` is past its deadline: report
    /// the job failed now (exactly once), although the call has not returned.
    fn expire(&self, job: &Arc<Self::Job>, item: usize);
    /// Every thread is stuck and no replacement may start: fail this queued
    /// work instead of letting it wait for the device.
    fn refuse(&self, work: Work<Self::Task>);
}

/// Starts the tier's threads; the [`Crew`] keeps their handles.
pub(crate) struct Pool;

impl Pool {
    /// Starts the crew's threads, named `kvtier-io-N`, and its watchdog if
    /// storage calls have a deadline. An idle thread polls the queue for
    /// `spin` before sleeping (see [`WorkQueue::next`]). On failure the
    /// threads already started keep running: [`Crew::stop`] stops them.
    pub(crate) fn start<E: Executor>(executor: &Arc<E>, spin: Duration) -> Result<()> {
        while let Some(id) = executor.crew().enlist() {
            if let Err(e) = spawn_worker(executor, id, spin) {
                bail!(Alloc, "could not start I/O thread {id}: {e}");
            }
        }
        if let Some(timeout) = executor.crew().timeout() {
            let watched = Arc::clone(executor);
            let watchdog = spawn_running(
                std::thread::Builder::new().name("kvtier-watchdog".into()),
                move || watchdog(&watched, timeout, spin),
            );
            match watchdog {
                Ok(handle) => executor.crew().set_watchdog(handle),
                Err(e) => bail!(Alloc, "could not start the I/O watchdog thread: {e}"),
            }
        }
        Ok(())
    }
}

fn spawn_worker<E: Executor>(executor: &Arc<E>, id: usize, spin: Duration) -> std::io::Result<()> {
    let owned = Arc::clone(executor);
    let builder = std::thread::Builder::new().name(format!("kvtier-io-{id}"));
    let thread = spawn_running(builder, move || {
        // Counts the thread out however it ends (a panic included), so
        // that `Crew::stop` never waits for a thread that is gone.
        let mut leaving = Leaving {
            crew: owned.crew(),
            id,
            counted: true,
        };
        let worker = Worker::new(owned.crew(), id);
        while let Some(work) = owned.queue().next(spin) {
            owned.execute(work, &worker);
            if owned.crew().retire_if_surplus(id) {
                leaving.counted = false;
                // Work queued while this thread was busy may have been
                // left for it to find (see `WorkQueue::push_all`).
                owned.queue().hand_over();
                return;
            }
        }
    });
    match thread {
        Ok(handle) => {
            executor.crew().add_handle(handle);
            Ok(())
        }
        Err(e) => {
            executor.crew().discharge(id);
            Err(e)
        }
    }
}

/// A worker thread on its way out: still counted alive until dropped.
struct Leaving<'a, J> {
    crew: &'a Crew<J>,
    id: usize,
    /// False once the thread was counted out (`Crew::retire_if_surplus`).
    counted: bool,
}

impl<J> Drop for Leaving<'_, J> {
    fn drop(&mut self) {
        if self.counted {
            self.crew.leave(self.id);
        }
    }
}

/// Checks the deadlines a few times per timeout: a call is reported at most
/// an eighth of the timeout (and never more than 100 ms) late.
fn watchdog<E: Executor>(executor: &Arc<E>, timeout: Duration, spin: Duration) {
    let tick = (timeout / 8).clamp(Duration::from_millis(1), Duration::from_millis(100));
    let crew = executor.crew();
    while !crew.wait_stop(tick) {
        // A round marks calls expired and reports their jobs as one step for
        // `Crew::stop` (see `Crew::begin_round`).
        let Some(_round) = crew.begin_round() else {
            break;
        };
        for (job, item) in crew.collect_expired() {
            if let Some(job) = job {
                executor.expire(&job, item);
            }
            // Without threads to spare, the queue waits for a stuck one.
            if let Some(id) = crew.enlist() {
                let _ = spawn_worker(executor, id, spin);
            }
        }
        if crew.all_stuck() {
            for work in executor.queue().take_copies() {
                executor.refuse(work);
            }
        }
    }
}
