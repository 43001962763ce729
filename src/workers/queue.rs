//! The work queue and the I/O worker threads that drain it.
//!
//! Order of service: loads (a request waits for them), probes (a lookup waits
//! for them), stores (background), discards (housekeeping). One idle worker
//! polls briefly before sleeping, so a stream of small jobs does not pay a
//! thread wake-up per job; the others sleep at once, so idle workers do not
//! compete with the engine's threads for cores.

use crate::engine::jobs::{JobKind, Task};
use crate::sync::{Condvar, Mutex};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// One unit of work for a worker.
pub(crate) enum Work {
    /// Copy a run of one job's blocks.
    Copy(Task),
    /// Does storage hold this key (shared disk tiers)?
    Probe(Vec<u8>),
    /// Release the storage of evicted or cleared blocks (slot, key).
    Discard(Vec<(u32, Vec<u8>)>),
    /// Tell storage these keys were used (packed, `key_len` bytes each).
    Touch(Vec<u8>, usize),
}

/// Which queue a piece of work waits in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Lane {
    Loads,
    Probes,
    Stores,
    Discards,
}

impl Work {
    fn lane(&self) -> Lane {
        match self {
            Work::Copy(t) if t.job.kind == JobKind::Load => Lane::Loads,
            Work::Copy(_) => Lane::Stores,
            // Background work a lookup or touch asked for, dropped when the
            // tier shuts down.
            Work::Probe(_) | Work::Touch(..) => Lane::Probes,
            Work::Discard(_) => Lane::Discards,
        }
    }
}

#[derive(Default)]
struct Queues {
    loads: VecDeque<Work>,
    probes: VecDeque<Work>,
    stores: VecDeque<Work>,
    discards: VecDeque<Work>,
}

impl Queues {
    fn pop(&mut self) -> Option<Work> {
        self.loads
            .pop_front()
            .or_else(|| self.probes.pop_front())
            .or_else(|| self.stores.pop_front())
            .or_else(|| self.discards.pop_front())
    }

    fn is_empty(&self) -> bool {
        self.loads.is_empty()
            && self.probes.is_empty()
            && self.stores.is_empty()
            && self.discards.is_empty()
    }

    fn lane(&mut self, lane: Lane) -> &mut VecDeque<Work> {
        match lane {
            Lane::Loads => &mut self.loads,
            Lane::Probes => &mut self.probes,
            Lane::Stores => &mut self.stores,
            Lane::Discards => &mut self.discards,
        }
    }
}

pub(crate) struct WorkQueue {
    queues: Mutex<Queues>,
    available: Condvar,
    queued: AtomicUsize,
    /// Workers waiting on `available` (changed under the `queues` lock).
    sleepers: AtomicUsize,
    /// 1 while a worker polls for work (at most one does).
    spinning: AtomicUsize,
    shutdown: AtomicBool,
}

impl WorkQueue {
    pub(crate) fn new() -> WorkQueue {
        WorkQueue {
            queues: Mutex::new(Queues::default()),
            available: Condvar::new(),
            queued: AtomicUsize::new(0),
            sleepers: AtomicUsize::new(0),
            spinning: AtomicUsize::new(0),
            shutdown: AtomicBool::new(false),
        }
    }

    /// Queues `work`, all of it for `lane`. If the queue cannot grow (out of
    /// memory), queues nothing and hands `work` back.
    pub(crate) fn push_all<I: ExactSizeIterator<Item = Work>>(
        &self,
        lane: Lane,
        work: I,
    ) -> Result<(), I> {
        let mut q = self.queues.lock();
        let queue = q.lane(lane);
        if queue.try_reserve(work.len()).is_err() {
            return Err(work);
        }
        let mut added = 0;
        for w in work {
            debug_assert_eq!(w.lane(), lane);
            queue.push_back(w);
            added += 1;
        }
        self.queued.fetch_add(added, Ordering::SeqCst);
        // A polling worker takes one task without being woken. It announces it
        // is giving up before it takes the lock to sleep, so either it sees
        // these tasks or this sees it gone.
        let wake = added.saturating_sub(self.spinning.load(Ordering::SeqCst));
        for _ in 0..wake.min(self.sleepers.load(Ordering::SeqCst)) {
            self.available.notify_one();
        }
        Ok(())
    }

    fn try_pop(&self) -> Option<Work> {
        let mut q = self.queues.lock();
        let work = q.pop()?;
        self.queued.fetch_sub(1, Ordering::SeqCst);
        Some(work)
    }

    fn poll(&self) -> Option<Work> {
        if self.queued.load(Ordering::SeqCst) > 0 {
            self.try_pop()
        } else {
            None
        }
    }

    /// Next work for a worker; None once shut down. If no other worker is
    /// polling, polls for `spin` before sleeping.
    pub(crate) fn next(&self, spin: Duration) -> Option<Work> {
        loop {
            if self.shutdown.load(Ordering::Acquire) {
                return None;
            }
            if let Some(work) = self.poll() {
                return Some(work);
            }
            let polling = !spin.is_zero()
                && self
                    .spinning
                    .compare_exchange(0, 1, Ordering::SeqCst, Ordering::SeqCst)
                    .is_ok();
            if polling {
                let deadline = Instant::now() + spin;
                let mut found = None;
                while found.is_none()
                    && !self.shutdown.load(Ordering::Acquire)
                    && Instant::now() < deadline
                {
                    for _ in 0..64 {
                        std::hint::spin_loop();
                    }
                    found = self.poll();
                    // Give the core away if anything else is runnable (a
                    // worker whose I/O just completed, the engine): on a
                    // small machine a spinning thread would delay them.
                    std::thread::yield_now();
                }
                self.spinning.store(0, Ordering::SeqCst);
                if found.is_some() {
                    return found;
                }
            }
            let mut q = self.queues.lock();
            self.sleepers.fetch_add(1, Ordering::SeqCst);
            while q.is_empty() && !self.shutdown.load(Ordering::Acquire) {
                self.available.wait(&mut q);
            }
            self.sleepers.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// A worker leaves for good: wakes another if work is queued. A push
    /// that saw this worker polling woke nobody, trusting it to come back
    /// for the work.
    pub(crate) fn hand_over(&self) {
        let q = self.queues.lock();
        if !q.is_empty() {
            self.available.notify_one();
        }
    }

    /// Removes every queued copy task (no thread is left to run them).
    pub(crate) fn take_copies(&self) -> Vec<Work> {
        let mut q = self.queues.lock();
        let Queues { loads, stores, .. } = &mut *q;
        let work: Vec<Work> = loads.drain(..).chain(stores.drain(..)).collect();
        self.queued.fetch_sub(work.len(), Ordering::SeqCst);
        work
    }

    /// Removes the queued copy task of job `job_id` (manual stepping in tests).
    #[cfg(feature = "test-hooks")]
    pub(crate) fn take_job(&self, job_id: u64) -> Option<Task> {
        let mut q = self.queues.lock();
        let Queues { loads, stores, .. } = &mut *q;
        for list in [loads, stores] {
            let found = list
                .iter()
                .position(|w| matches!(w, Work::Copy(t) if t.job.id == job_id));
            if let Some(i) = found {
                self.queued.fetch_sub(1, Ordering::SeqCst);
                if let Some(Work::Copy(task)) = list.remove(i) {
                    return Some(task);
                }
            }
        }
        None
    }

    /// Removes all queued background work (probes and discards).
    #[cfg(feature = "test-hooks")]
    pub(crate) fn take_background(&self) -> Vec<Work> {
        let mut q = self.queues.lock();
        let Queues {
            probes, discards, ..
        } = &mut *q;
        let work: Vec<Work> = probes.drain(..).chain(discards.drain(..)).collect();
        self.queued.fetch_sub(work.len(), Ordering::SeqCst);
        work
    }

    pub(crate) fn is_shut_down(&self) -> bool {
        self.shutdown.load(Ordering::Acquire)
    }

    /// Stops the workers: queued copies and probes are dropped, running copies
    /// stop after their current block. Returns queued discards, which the
    /// caller still runs so that evicted storage is released.
    pub(crate) fn shut_down(&self) -> Vec<Work> {
        let mut q = self.queues.lock();
        self.shutdown.store(true, Ordering::Release);
        let discards = q.discards.drain(..).collect();
        *q = Queues::default();
        self.queued.store(0, Ordering::SeqCst);
        self.available.notify_all();
        discards
    }
}
