//! Finished-job results, the set of job ids in flight, and the waits on them.

use crate::engine::jobs::JobResult;
use crate::error::{alloc_error, bail, Result};
use parking_lot::{Condvar, Mutex};
use std::collections::{HashSet, VecDeque};
use std::time::{Duration, Instant};

#[derive(Default)]
struct State {
    results: VecDeque<JobResult>,
    /// Accepted and not yet polled: a job id may not be reused before then.
    active: HashSet<u64>,
    /// Accepted and not yet completed.
    running: usize,
}

#[derive(Default)]
pub(crate) struct Completions {
    state: Mutex<State>,
    changed: Condvar,
}

impl Completions {
    /// Claims `job_id` for a new job, with room for its result: completing a
    /// job never allocates. Fails with `Alloc` if that room is not available.
    pub(crate) fn register(&self, job_id: u64) -> Result<()> {
        let mut s = self.state.lock();
        // Every job registered and not completed queues one result.
        let results = s.running + 1;
        if s.results.try_reserve(results).is_err() {
            return Err(alloc_error::<JobResult>(
                s.results.len() + results,
                "the result queue",
            ));
        }
        if s.active.try_reserve(1).is_err() {
            return Err(alloc_error::<u64>(s.active.len() + 1, "the set of job ids"));
        }
        if !s.active.insert(job_id) {
            bail!(
                DuplicateJob,
                "job_id: {job_id} is already in flight (submitted and not yet polled)"
            );
        }
        s.running += 1;
        Ok(())
    }

    /// Undoes [`Completions::register`] for a job that was then rejected.
    pub(crate) fn unregister(&self, job_id: u64) {
        let mut s = self.state.lock();
        s.active.remove(&job_id);
        s.running -= 1;
        self.changed.notify_all();
    }

    pub(crate) fn complete(&self, result: JobResult) {
        let mut s = self.state.lock();
        s.results.push_back(result);
        s.running -= 1;
        self.changed.notify_all();
    }

    /// Hands up to `max` results to `f`, oldest first, and frees their ids.
    pub(crate) fn poll(&self, max: usize, mut f: impl FnMut(JobResult)) -> usize {
        let mut s = self.state.lock();
        let n = max.min(s.results.len());
        for _ in 0..n {
            let r = s.results.pop_front().expect("counted");
            s.active.remove(&r.job_id);
            f(r);
        }
        n
    }

    /// Waits until a result is queued; false on timeout.
    pub(crate) fn wait(&self, timeout: Duration) -> bool {
        let deadline = Instant::now().checked_add(timeout);
        let mut s = self.state.lock();
        while s.results.is_empty() {
            match deadline {
                Some(d) => {
                    if self.changed.wait_until(&mut s, d).timed_out() {
                        return !s.results.is_empty();
                    }
                }
                None => self.changed.wait(&mut s),
            }
        }
        true
    }

    /// Waits until every accepted job has completed.
    pub(crate) fn drain(&self) {
        let mut s = self.state.lock();
        while s.running > 0 {
            self.changed.wait(&mut s);
        }
    }

    pub(crate) fn running(&self) -> usize {
        self.state.lock().running
    }

    pub(crate) fn queued(&self) -> usize {
        self.state.lock().results.len()
    }
}
