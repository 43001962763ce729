//! Finished-job results, the set of job ids in flight, and the waits on them:
//! blocking (`wait`, `drain`) or on the completion descriptor.
//!
//! The descriptor (an eventfd, made on first request) is readable exactly
//! while results are queued: `complete` signals it when the queue goes from
//! empty to not empty, and `poll` resets it when it takes the last result.
//! Both happen under the queue's lock, so the descriptor's state always
//! follows the queue's, and a result queued while a caller polls either is
//! taken by that poll or leaves the descriptor readable: no wake-up is lost.
//! It costs one write per empty-to-not-empty transition and one read per
//! poll that empties the queue, and nothing when no one asked for it.
//!
//! Callers may also hand in eventfds of their own, each for one job kind
//! (`tier_add_notify_fd`): every job of that kind that completes adds 1 to
//! it once its result is queued, so a caller that waits per kind (LMCache's
//! store and load descriptors) needs no thread of its own in between.

use super::eventfd::EventFd;
use crate::engine::jobs::JobResult;
use crate::error::{alloc_error, bail, Result};
use crate::job_kind::JobKind;
use crate::sync::{Condvar, Mutex};
use std::collections::{HashSet, VecDeque};
use std::os::fd::{BorrowedFd, RawFd};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

#[derive(Default)]
struct State {
    results: VecDeque<JobResult>,
    /// Accepted and not yet polled: a job id may not be reused before then.
    active: HashSet<u64>,
    /// Accepted and not yet completed.
    running: usize,
    /// The completion descriptor is readable (results are queued).
    signalled: bool,
    /// Callers' eventfds (the library's duplicates), each added 1 to as a
    /// job of its kind completes.
    notify: Vec<(JobKind, EventFd)>,
}

/// How many notify descriptors a tier takes: a few per kind is all a
/// caller needs, and each costs a write per job.
pub(crate) const MAX_NOTIFY_FDS: usize = 16;

#[derive(Default)]
pub(crate) struct Completions {
    state: Mutex<State>,
    changed: Condvar,
    /// Set once, under `state`'s lock; read without it only by the forked
    /// child's release.
    fd: OnceLock<EventFd>,
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
        let kind = result.kind;
        s.results.push_back(result);
        s.running -= 1;
        self.signal(&mut s);
        // Under the lock, after the result is queued: a caller woken by the
        // write finds it with its next poll, and `retire_fd` cannot run
        // between the check and the write.
        for (_, fd) in s.notify.iter().filter(|(k, _)| *k == kind) {
            fd.signal();
        }
        self.changed.notify_all();
    }

    /// Adds 1 to a duplicate of `fd` each time a job of `kind` completes,
    /// from now until the tier is freed. Fails with `InvalidArg` for a
    /// descriptor that is not an eventfd or past [`MAX_NOTIFY_FDS`], `Io`
    /// for want of descriptors, `Alloc`.
    pub(crate) fn add_notify(&self, kind: JobKind, fd: BorrowedFd<'_>) -> Result<()> {
        let dup = EventFd::duplicate(fd)?;
        let mut s = self.state.lock();
        if s.notify.len() >= MAX_NOTIFY_FDS {
            bail!(
                InvalidArg,
                "fd: this tier already writes {MAX_NOTIFY_FDS} notify descriptors, the most it takes"
            );
        }
        if s.notify.try_reserve(1).is_err() {
            return Err(alloc_error::<(JobKind, EventFd)>(
                s.notify.len() + 1,
                "the notify descriptors",
            ));
        }
        s.notify.push((kind, dup));
        Ok(())
    }

    /// Makes the descriptor readable, if there is one and it is not already.
    fn signal(&self, s: &mut State) {
        if !s.signalled {
            if let Some(fd) = self.fd.get() {
                fd.signal();
                s.signalled = true;
            }
        }
    }

    /// The completion descriptor, made on the first call (then readable at
    /// once if results are already queued).
    pub(crate) fn fd(&self) -> Result<RawFd> {
        if let Some(fd) = self.fd.get() {
            return Ok(fd.raw());
        }
        let mut s = self.state.lock();
        // Made under the lock: a result queued meanwhile is either seen here
        // or signalled by `complete`, which checks under the same lock.
        if self.fd.get().is_none() {
            let _ = self.fd.set(EventFd::new()?);
            if !s.results.is_empty() {
                self.signal(&mut s);
            }
        }
        Ok(self.fd.get().expect("set above").raw())
    }

    /// In a forked child: lets go of the parent's eventfd (see
    /// [`EventFd::detach_in_forked_child`]) without taking the lock.
    pub(crate) fn release_fd_in_forked_child(&self) {
        if let Some(fd) = self.fd.get() {
            fd.detach_in_forked_child();
        }
        // The notify duplicates are left as they are: taking the lock here
        // could deadlock, and no job can complete in the child to write them.
    }

    /// At `tier_free`, when the results outlive the tier (see
    /// [`EventFd::retire`]): the caller's eventfd is gone. Nobody polls any
    /// more; a result queued after this (not a stuck call's job, which was
    /// reported, but perhaps a load it unblocks when it returns) signals
    /// /dev/null, harmlessly.
    pub(crate) fn retire_fd(&self) {
        let mut s = self.state.lock();
        if let Some(fd) = self.fd.get() {
            fd.retire();
        }
        // The callers' eventfds are done with too: closing the duplicates
        // leaves theirs as they are.
        s.notify.clear();
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
        if s.signalled && s.results.is_empty() {
            self.fd.get().expect("signalled").reset();
            s.signalled = false;
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
