//! What a worker does with a piece of work: copy a task's blocks through the
//! backend (no lock held), run a probe, or release evicted storage; and how a
//! planned job is cut into tasks and queued.

use super::jobs::{Job, JobKind, Task};
use super::Shared;
use crate::error::ErrorKind;
use crate::workers::{Executor, Lane, Work, WorkQueue};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

impl Executor for Shared {
    fn queue(&self) -> &WorkQueue {
        &self.queue
    }

    fn execute(&self, work: Work) {
        self.run(work)
    }
}

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
                unqueued.for_each(|work| self.run(work));
            }
        }
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

    pub(super) fn run(&self, work: Work) {
        match work {
            Work::Copy(task) => self.run_task(task),
            Work::Discard(keys) => {
                for (_, key) in keys {
                    self.backend.discard(&key, &|k| self.is_live(k));
                }
            }
            Work::Probe(key) => self.run_probe(key),
            Work::Touch(keys, key_len) => self.backend.touch(&keys, key_len),
        }
    }

    /// Queues a planned job's copies, or completes it at once if there are none.
    pub(super) fn dispatch(&self, job: Arc<Job>) {
        if job.items.is_empty() {
            self.finish(job);
            return;
        }
        let job_bytes = job.items.len() * self.primary.block_bytes();
        let max_tasks = self
            .io_threads
            .min(job_bytes / self.backend.min_task_bytes())
            .max(1);
        let min_items = job.items.len().div_ceil(max_tasks);
        let lane = match job.kind {
            JobKind::Load => Lane::Loads,
            JobKind::Store => Lane::Stores,
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
    fn copy_batch(&self, task: &Task) -> u64 {
        let job = &task.job;
        let block_bytes = self.primary.block_bytes() as u64;
        match job.kind {
            JobKind::Store => {
                let blocks: Vec<(u32, &[u8], &[u8])> = job.items[task.range.clone()]
                    .iter()
                    .map(|item| (item.slot, job.key(item.pos), self.primary.row(item.row)))
                    .collect();
                self.backend
                    .store_batch(&blocks, &mut |i, outcome| match outcome {
                        Ok(bytes) => job.add_bytes(bytes),
                        Err(e) => job.item_failed(task.range.start + i, e.kind()),
                    });
                blocks.len() as u64
            }
            JobKind::Load => {
                let limit = job.copy_limit();
                let mut blocks: Vec<(u32, &[u8], &mut [u8])> = job.items[task.range.clone()]
                    .iter()
                    .take_while(|item| item.pos < limit)
                    // SAFETY: a load names each row once (checked at submit),
                    // and this task alone holds these items.
                    .map(|item| {
                        (item.slot, job.key(item.pos), unsafe {
                            self.primary.row_mut(item.row)
                        })
                    })
                    .collect();
                self.backend
                    .load_batch(&mut blocks, &mut |i, outcome| match outcome {
                        Ok(()) => {
                            job.add_bytes(block_bytes);
                            true
                        }
                        Err(e) => {
                            job.item_failed(task.range.start + i, e.kind());
                            false
                        }
                    });
                blocks.len() as u64
            }
        }
    }

    /// A worker runs one task: copies its blocks (timed, for the job's `io_ns`
    /// and the per-block I/O histogram), then, if it is the job's last task,
    /// completes the job.
    pub(super) fn run_task(&self, task: Task) {
        let job = &task.job;
        let block_bytes = self.primary.block_bytes() as u64;
        let started_ns = job.age_ns();
        // Blocks whose copy ran, whatever its outcome.
        let mut attempted = 0u64;
        let copied = catch_unwind(AssertUnwindSafe(|| {
            if self.backend.batches() {
                if self.queue.is_shut_down() {
                    return false;
                }
                attempted = self.copy_batch(&task);
                return true;
            }
            for i in task.range.clone() {
                if self.queue.is_shut_down() {
                    return false;
                }
                let item = job.items[i];
                if job.kind == JobKind::Load && item.pos >= job.copy_limit() {
                    break;
                }
                attempted += 1;
                let outcome = match job.kind {
                    JobKind::Store => self.primary.with_row(item.row, |block| {
                        self.backend.store(item.slot, job.key(item.pos), block)
                    }),
                    JobKind::Load => self
                        .primary
                        .with_row_mut(item.row, |dst| {
                            self.backend.load(item.slot, job.key(item.pos), dst)
                        })
                        .map(|()| block_bytes),
                };
                match outcome {
                    Ok(bytes) => job.add_bytes(bytes),
                    Err(e) => {
                        job.item_failed(i, e.kind());
                        if job.kind == JobKind::Load {
                            break;
                        }
                    }
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
            match job.kind {
                // None of this task's blocks may be published as stored.
                JobKind::Store => task
                    .range
                    .clone()
                    .for_each(|i| job.item_failed(i, ErrorKind::Panic)),
                JobKind::Load => job.fail(job.items[task.range.start].pos, ErrorKind::Panic),
            }
        }
        if job.task_done() {
            self.finish(Arc::clone(job));
        }
    }
}
