//! The worker threads: each takes work from the queue and hands it to the
//! executor, until the queue shuts down.

use super::{Work, WorkQueue};
use crate::error::{bail, Result};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// What runs the work the threads take: the engine.
pub(crate) trait Executor: Send + Sync + 'static {
    /// The queue the threads drain.
    fn queue(&self) -> &WorkQueue;
    /// Runs one piece of work on the calling worker thread.
    fn execute(&self, work: Work);
}

/// The running worker threads (none for a tier stepped by hand in tests).
#[derive(Default)]
pub(crate) struct Pool {
    threads: Vec<JoinHandle<()>>,
}

impl Pool {
    /// Starts `count` threads named `kvtier-io-N`. An idle thread polls the
    /// queue for `spin` before sleeping (see [`WorkQueue::next`]). On failure
    /// the threads already started keep running: [`Pool::join`] stops them.
    pub(crate) fn start<E: Executor>(
        &mut self,
        executor: &Arc<E>,
        count: usize,
        spin: Duration,
    ) -> Result<()> {
        for i in 0..count {
            let executor = Arc::clone(executor);
            let thread = std::thread::Builder::new()
                .name(format!("kvtier-io-{i}"))
                .spawn(move || {
                    while let Some(work) = executor.queue().next(spin) {
                        executor.execute(work);
                    }
                });
            match thread {
                Ok(handle) => self.threads.push(handle),
                Err(e) => bail!(Alloc, "could not start I/O thread {i}: {e}"),
            }
        }
        Ok(())
    }

    /// True for a tier stepped by hand (tests).
    #[cfg(feature = "test-hooks")]
    pub(crate) fn is_empty(&self) -> bool {
        self.threads.is_empty()
    }

    /// Waits for every thread to end (the queue must be shut down first).
    pub(crate) fn join(&mut self) {
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }

    /// In a forked child, where the threads do not exist: forgets their
    /// handles without joining or detaching (see `Tier`'s drop in a child).
    pub(crate) fn forget_in_forked_child(&mut self) {
        std::mem::forget(std::mem::take(&mut self.threads));
    }
}
