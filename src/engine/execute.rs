//! What a worker does with a piece of work: copy a task's blocks through the
//! backend (no lock held), run a probe, or release evicted storage; and how a
//! planned job is cut into tasks and queued.

use super::jobs::{Crew, FailReason, Job, JobKind, LoadRow, Task, Work, WorkQueue, Worker};
use super::shared::Shared;
use crate::backend::{Batches, WatchedIo};
use crate::error::{Error, ErrorKind, Result};
use crate::workers::{Executor, Lane};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

impl Executor for Shared {
    type Task = Task;
    type Job = Job;

    fn queue(&self) -> &WorkQueue {
        &self.queue
    }

    fn crew(&self) -> &Crew {
        &self.crew
    }

    fn execute(&self, work: Work, worker: &Worker) {
        self.run(work, Some(worker))
    }

    fn expire(&self, job: &Arc<Job>, item: usize) {
        Shared::expire(self, job, item)
    }

    fn refuse(&self, work: Work) {
        if let Work::Copy(task) = work {
            let job = &task.job;
            // Not the stored blocks' fault: no transient failure counted.
            job.fail_items(task.range.clone(), ErrorKind::Io, FailReason::Unavailable);
            if job.task_done() {
                self.finish(Arc::clone(job));
            }
        }
    }
}

/// Released blocks per `Discards::discard` call: a job's evictions
/// (16 blocks in a typical job) in one, a clear of millions in many, each
/// well within one storage deadline.
const DISCARD_BATCH: usize = 64;

impl Shared {
    /// Hands released blocks to a worker, which lets the backend release their
    /// storage.
    pub(super) fn discard(&self, released: Vec<(u32, Vec<u8>)>) {
        if !released.is_empty() {
            if let Err(unqueued) = self
                .queue
                .push_all(Lane::Discards, [Work::Discard(released)].into_iter())
            {
                // No memory to queue it: release the storage here instead.
                unqueued.for_each(|work| self.run(work, None));
            }
        }
    }

    /// At the tier's drop, with threads left stuck on the device: the queued
    /// discards would hang the caller there, so a detached thread runs them
    /// (owning `shared`, like the stuck threads). Without a thread for them
    /// they are dropped, and the blocks come back at the next open, as after
    /// a crash.
    pub(super) fn discard_detached(shared: &Arc<Shared>, discards: Vec<Work>) {
        if discards.is_empty() {
            return;
        }
        let owned = Arc::clone(shared);
        let _ = std::thread::Builder::new()
            .name("kvtier-discard".into())
            .spawn(move || {
                for work in discards {
                    owned.run(work, None);
                }
            });
    }

    /// Queues a touch for storage that keeps its own recency. Best effort:
    /// without memory to copy the keys or queue the work, it is skipped.
    pub(super) fn forward_touch(&self, keys: &[u8], key_len: usize) {
        let mut copy = Vec::new();
        if copy.try_reserve_exact(keys.len()).is_err() {
            return;
        }
        copy.extend_from_slice(keys);
        let _ = self
            .queue
            .push_all(Lane::Probes, [Work::Touch(copy, key_len)].into_iter());
    }

    /// Whether a block of `key` is in use: stored, being stored, or cleared
    /// but still pinned by a load.
    pub(super) fn is_live(&self, key: &[u8]) -> bool {
        self.state.lock().index.holds_key(key)
    }

    /// Runs one piece of work; on a worker thread, its storage calls are
    /// watched against the deadline (background work has no job to report,
    /// but a thread stuck in it is replaced all the same).
    pub(super) fn run(&self, work: Work, worker: Option<&Worker>) {
        let watched = |call: &mut dyn FnMut()| match worker {
            Some(w) => w.watch(None, 0, call),
            None => call(),
        };
        match work {
            Work::Copy(task) => self.run_task(task, worker),
            Work::Discard(keys) => {
                // Queued only for a backend with discards (the index tracks
                // releases for no other).
                let Some(discards) = self.backend.discards() else {
                    return;
                };
                let is_live = |k: &[u8]| self.is_live(k);
                // A bounded batch per deadline: a clear releases every block
                // at once, which no single storage call should carry.
                for batch in keys.chunks(DISCARD_BATCH) {
                    watched(&mut || discards.discard(batch, &is_live));
                }
            }
            Work::Probe(keys) => watched(&mut || self.run_probes(&keys)),
            // A failed read is asked again by the next lookup that holds HITs.
            Work::Generation => watched(&mut || drop(self.check_generation())),
            Work::Touch(keys, key_len) => {
                if let Some(touches) = self.backend.touches() {
                    watched(&mut || touches.touch(&keys, key_len));
                }
            }
        }
    }

    /// Queues a planned job's copies, or completes it at once if there are none.
    pub(super) fn dispatch(&self, job: Arc<Job>) {
        if job.items.is_empty() {
            self.finish(job);
            return;
        }
        if self.crew.all_stuck() {
            // Every thread is stuck in storage and no replacement may start:
            // queued, the job would wait for the device to recover. Nothing
            // was read, so a load's keys are not held to blame.
            job.fail_items(0..job.items.len(), ErrorKind::Io, FailReason::Unavailable);
            self.finish(job);
            return;
        }
        let job_bytes = job.items.len() * self.primary.block_bytes();
        let min_task_bytes = match job.kind {
            JobKind::Store if job.evicts_nothing => self.backend.min_growing_task_bytes(),
            _ => self.backend.min_task_bytes(),
        };
        let max_tasks = self.io_threads.min(job_bytes / min_task_bytes).max(1);
        let min_items = job.items.len().div_ceil(max_tasks);
        let lane = match job.kind {
            JobKind::Load => Lane::Loads,
            // A delete is done at submit and never queued.
            JobKind::Store | JobKind::Delete => Lane::Stores,
        };
        let tasks = Arc::clone(&job).into_tasks(max_tasks, min_items);
        if self.queue.push_all(lane, tasks.map(Work::Copy)).is_err() {
            // No memory to queue the copies: the job fails as a whole, and is
            // reported like any failure.
            job.fail_all(ErrorKind::Alloc);
            self.finish(job);
        }
    }

    /// Copies a task's blocks through a batching backend, all in one go;
    /// returns how many it handed to the backend.
    fn copy_batch(&self, batches: &dyn Batches, task: &Task) -> u64 {
        let job = &task.job;
        match job.kind {
            JobKind::Store | JobKind::Delete => {
                let blocks: Vec<(u32, &[u8], &[u8])> = job.items[task.range.clone()]
                    .iter()
                    .map(|item| {
                        let bytes = self.primary.at(job.extent(item, &self.primary));
                        (item.slot, job.key(item.pos), bytes)
                    })
                    .collect();
                batches.store_batch(&blocks, &mut |i, outcome| match outcome {
                    Ok(bytes) => job.add_bytes(bytes),
                    Err(e) => job.store_failed(task.range.start + i, &e),
                });
                blocks.len() as u64
            }
            JobKind::Load => {
                let limit = job.copy_limit();
                let mut blocks: Vec<(u32, &[u8], &mut [u8])> = job.items[task.range.clone()]
                    .iter()
                    .take_while(|item| item.pos < limit)
                    // SAFETY: a load names each row once and its extents do
                    // not overlap (checked at submit), and this task alone
                    // holds these items.
                    .map(|item| {
                        (item.slot, job.key(item.pos), unsafe {
                            self.primary.at_mut(job.extent(item, &self.primary))
                        })
                    })
                    .collect();
                let lens: Vec<usize> = blocks.iter().map(|b| b.2.len()).collect();
                batches.load_batch(&mut blocks, &mut |i, outcome| match outcome {
                    Ok(()) => {
                        job.add_bytes(lens[i] as u64);
                        true
                    }
                    Err(e) => {
                        job.load_failed(task.range.start + i, &e);
                        job.per_item()
                    }
                });
                blocks.len() as u64
            }
        }
    }

    /// Stores item `i` of a store job. Under a deadline the backend is told
    /// how to see that the job was reported meanwhile, so a late write is not
    /// published, and reads the row only while the job is not reported (see
    /// `StoreJob`): the call may outlive the tier.
    fn store_item(&self, job: &Arc<Job>, i: usize, worker: Option<&Worker>) -> Result<u64> {
        let item = job.items[i];
        let key = job.key(item.pos);
        match self.watched(worker) {
            Some((w, io)) => {
                // No borrow of the row is held across the call: the backend
                // reads it only through the job (see `StoreJob`).
                let row = self.primary.at_unborrowed(job.extent(&item, &self.primary));
                w.watch(Some(job), i, || {
                    io.store_unless(item.slot, key, row, job.as_ref())
                })
            }
            None => {
                let block = self.primary.at(job.extent(&item, &self.primary));
                self.backend.store(item.slot, key, block)
            }
        }
    }

    /// Loads item `i` of a load job; `Ok(false)` if the job was reported
    /// meanwhile (nothing was written to its row since). Under a deadline the
    /// block is read into the worker's bounce buffer and copied to the row
    /// only while the job is not reported: a call that returns after the
    /// deadline must not write a row whose job the engine already counts as
    /// done. A backend that reads blocks in pieces gets a bounce buffer of a
    /// piece (see `WatchedIo::load_piece_bytes`), else one of a block.
    fn load_item(&self, job: &Arc<Job>, i: usize, worker: Option<&Worker>) -> Result<bool> {
        let item = job.items[i];
        let key = job.key(item.pos);
        let extent = job.extent(&item, &self.primary);
        let Some((w, io)) = self.watched(worker) else {
            // SAFETY: a load names each row once and its extents do not
            // overlap (checked at submit); this task alone holds this item.
            let dst = unsafe { self.primary.at_mut(extent) };
            return self.backend.load(item.slot, key, dst).map(|()| true);
        };
        let piece_bytes = io.load_piece_bytes();
        let bounce_bytes = piece_bytes.unwrap_or(self.primary.block_bytes());
        w.bounce(bounce_bytes, |buf| match piece_bytes {
            Some(_) => {
                let row = LoadRow {
                    job,
                    extent,
                    primary: &self.primary,
                };
                let complete =
                    w.watch(Some(job), i, || io.load_streamed(item.slot, key, buf, &row))?;
                // Every piece is in the row and the block verified: it
                // counts as delivered unless the job was reported since.
                Ok(complete && job.deliver(i, || {}))
            }
            None => {
                let buf = &mut buf[..extent.len];
                w.watch(Some(job), i, || self.backend.load(item.slot, key, buf))?;
                Ok(job.deliver(i, || {
                    // SAFETY: as for a load without a deadline, above.
                    unsafe { self.primary.at_mut(extent) }.copy_from_slice(buf)
                }))
            }
        })
        .unwrap_or_else(|| {
            Err(Error::new(
                ErrorKind::Alloc,
                format!("no memory for a {bounce_bytes}-byte bounce buffer"),
            ))
        })
    }

    /// The worker and the backend's deadline-aware calls, when the worker
    /// watches its calls against a deadline (a crew has one only over a
    /// backend with [`WatchedIo`], see `Tier::build`).
    fn watched<'a, 'w>(
        &'a self,
        worker: Option<&'a Worker<'w>>,
    ) -> Option<(&'a Worker<'w>, &'a dyn WatchedIo)> {
        let w = worker.filter(|w| w.has_deadline())?;
        Some((w, self.backend.watched_io()?))
    }

    /// A worker runs one task: copies its blocks (timed, for the job's `io_ns`
    /// and the per-block I/O histogram), then, if it is the job's last task,
    /// completes the job.
    pub(super) fn run_task(&self, task: Task, worker: Option<&Worker>) {
        let job = &task.job;
        let started_ns = job.age_ns();
        // Blocks whose copy ran, whatever its outcome.
        let mut attempted = 0u64;
        let copied = catch_unwind(AssertUnwindSafe(|| {
            let generation = match worker {
                Some(w) => w.watch(Some(job), task.range.start, || self.ensure_generation()),
                None => self.ensure_generation(),
            };
            if let Err(e) = generation {
                // No block is named or checked by a generation that may be stale.
                job.fail_items(task.range.clone(), e.kind(), FailReason::of(e.kind()));
                return true;
            }
            if let Some(batches) = self.backend.batches() {
                if self.queue.is_shut_down() {
                    return false;
                }
                attempted = self.copy_batch(batches, &task);
                return true;
            }
            for i in task.range.clone() {
                if self.queue.is_shut_down() {
                    return false;
                }
                if job.is_reported() {
                    break; // past a deadline: nothing more is wanted
                }
                if job.kind == JobKind::Load && job.items[i].pos >= job.copy_limit() {
                    break;
                }
                attempted += 1;
                let outcome = match job.kind {
                    JobKind::Store | JobKind::Delete => self.store_item(job, i, worker),
                    JobKind::Load => match self.load_item(job, i, worker) {
                        Ok(true) => Ok(job.extent(&job.items[i], &self.primary).len as u64),
                        Ok(false) => break,
                        Err(e) => Err(e),
                    },
                };
                match outcome {
                    Ok(bytes) => job.add_bytes(bytes),
                    Err(e) if job.kind == JobKind::Load => {
                        job.load_failed(i, &e);
                        if !job.per_item() {
                            break;
                        }
                    }
                    Err(e) => job.store_failed(i, &e),
                }
            }
            true
        }));
        let panicked = match copied {
            Ok(false) => return, // shutting down: the job is abandoned with the tier
            Ok(true) => false,
            Err(_) => true,
        };
        if attempted > 0 {
            let ended_ns = job.age_ns();
            job.add_io_span(started_ns, ended_ns);
            self.metrics
                .blocks_moved(job.kind, attempted, ended_ns.saturating_sub(started_ns));
        }
        if panicked {
            job.fail_items(
                task.range.clone(),
                ErrorKind::Panic,
                FailReason::of(ErrorKind::Panic),
            );
        }
        if job.task_done() {
            self.finish(Arc::clone(job));
        }
    }
}
