//! The work queue and the I/O worker threads that drain it.
//!
//! Loads are served before stores: a load is on a request's critical path, a
//! store is background work. Idle workers poll briefly before sleeping, so a
//! stream of small jobs does not pay a thread wake-up per job.

use crate::jobs::{JobKind, Task};
use parking_lot::{Condvar, Mutex};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

#[derive(Default)]
struct Queues {
    loads: VecDeque<Task>,
    stores: VecDeque<Task>,
}

impl Queues {
    fn pop(&mut self) -> Option<Task> {
        self.loads.pop_front().or_else(|| self.stores.pop_front())
    }
}

pub(crate) struct WorkQueue {
    queues: Mutex<Queues>,
    available: Condvar,
    queued: AtomicUsize,
    sleepers: AtomicUsize,
    shutdown: AtomicBool,
}

impl WorkQueue {
    pub(crate) fn new() -> WorkQueue {
        WorkQueue {
            queues: Mutex::new(Queues::default()),
            available: Condvar::new(),
            queued: AtomicUsize::new(0),
            sleepers: AtomicUsize::new(0),
            shutdown: AtomicBool::new(false),
        }
    }

    pub(crate) fn push_all(&self, tasks: impl IntoIterator<Item = Task>) {
        let mut q = self.queues.lock();
        let mut added = 0;
        for task in tasks {
            match task.job.kind {
                JobKind::Load => q.loads.push_back(task),
                JobKind::Store => q.stores.push_back(task),
            }
            added += 1;
        }
        self.queued.fetch_add(added, Ordering::SeqCst);
        if self.sleepers.load(Ordering::SeqCst) > 0 {
            for _ in 0..added {
                self.available.notify_one();
            }
        }
    }

    fn try_pop(&self) -> Option<Task> {
        let mut q = self.queues.lock();
        let task = q.pop()?;
        self.queued.fetch_sub(1, Ordering::SeqCst);
        Some(task)
    }

    /// Next task for a worker; None once shut down. Polls for `spin` before
    /// sleeping.
    pub(crate) fn next(&self, spin: Duration) -> Option<Task> {
        let mut spin_until: Option<Instant> = None;
        loop {
            if self.shutdown.load(Ordering::Acquire) {
                return None;
            }
            if self.queued.load(Ordering::SeqCst) > 0 {
                if let Some(task) = self.try_pop() {
                    return Some(task);
                }
            }
            let deadline = *spin_until.get_or_insert_with(|| Instant::now() + spin);
            if Instant::now() < deadline {
                for _ in 0..64 {
                    std::hint::spin_loop();
                }
                continue;
            }
            let mut q = self.queues.lock();
            self.sleepers.fetch_add(1, Ordering::SeqCst);
            while q.loads.is_empty()
                && q.stores.is_empty()
                && !self.shutdown.load(Ordering::Acquire)
            {
                self.available.wait(&mut q);
            }
            self.sleepers.fetch_sub(1, Ordering::SeqCst);
            drop(q);
            spin_until = None;
        }
    }

    /// Removes the queued task of job `job_id` (manual stepping in tests).
    pub(crate) fn take_job(&self, job_id: u64) -> Option<Task> {
        let mut q = self.queues.lock();
        let Queues { loads, stores } = &mut *q;
        for list in [loads, stores] {
            if let Some(i) = list.iter().position(|t| t.job.id == job_id) {
                self.queued.fetch_sub(1, Ordering::SeqCst);
                return list.remove(i);
            }
        }
        None
    }

    pub(crate) fn is_shut_down(&self) -> bool {
        self.shutdown.load(Ordering::Acquire)
    }

    /// Stops the workers: queued tasks are dropped, running ones stop after
    /// their current block.
    pub(crate) fn shut_down(&self) {
        let mut q = self.queues.lock();
        self.shutdown.store(true, Ordering::Release);
        q.loads.clear();
        q.stores.clear();
        self.queued.store(0, Ordering::SeqCst);
        self.available.notify_all();
    }
}
