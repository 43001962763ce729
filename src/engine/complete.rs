//! Completing a job whose copies are done: publishes or drops a store's
//! blocks, releases a load's pins (its copied blocks become most recent;
//! blocks found gone or failing are forgotten),
//! wakes loads that waited on a store, counts, and queues the result; and
//! reports a job whose storage call missed its deadline before that call
//! returns (its slots and pins stay until it does).

use super::jobs::{Job, JobKind};
use super::shared::Probe;
use super::shared::{Shared, State, WaitingLoad};
use super::MAX_TRANSIENT_LOAD_FAILURES;
use crate::error::ErrorKind;
use crate::events::RemovedReason;
use crate::index::LoadOutcome;
use crate::stats::Counters;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

impl Shared {
    /// Completes a job whose copies are done: publishes or releases its blocks,
    /// wakes loads that waited on them, then queues the result unless the
    /// watchdog reported it already.
    pub(super) fn finish(&self, job: Arc<Job>) {
        let mut unblocked = Vec::new();
        let mut released = Vec::new();
        if job.num_blocks > 0 && (job.kind == JobKind::Store || !job.items.is_empty()) {
            let mut st = self.state.lock();
            let State {
                index,
                load_failures,
                waiting,
                waiters,
                probes,
                ..
            } = &mut *st;
            job.set_settled();
            match job.kind {
                JobKind::Store => {
                    if job.is_reported() {
                        // Reported failed at a deadline while a copy ran:
                        // nothing of it becomes readable (done already,
                        // unless the deadline fired as the last copy ended).
                        index.abandon_store(&job.items);
                    }
                    let failed = job.failed_items();
                    let present = index.commit_store(
                        job.keys(),
                        &job.items,
                        &job.pinned,
                        |i| failed.of(i).is_none(),
                        |item, ok| {
                            if ok && !load_failures.is_empty() {
                                // A new block: earlier failures were another one's.
                                load_failures.remove(job.key(item.pos));
                            }
                            Self::wake_waiters(waiting, waiters, item.slot, ok, &mut unblocked);
                        },
                    );
                    job.set_present_after(present);
                    if job.per_item() {
                        job.note_absent_repeats(|key| index.contains(key));
                    }
                }
                JobKind::Load => {
                    let failed = job.failed_items();
                    let copied = job.copy_limit().min(job.num_blocks);
                    // A shared tier's probe would find the name again and
                    // answer HIT for a block this load just could not read
                    // (gone, a newer format, not this tenant's): MISS for a
                    // probe's time instead.
                    let missing_until = self
                        .backend
                        .probes()
                        .map(|_| Instant::now() + self.probe_ttl);
                    index.release_load(&job.items, |i| {
                        let key = job.key(job.items[i].pos);
                        let Some(kind) = failed.of(i) else {
                            if job.items[i].pos >= copied {
                                return LoadOutcome::Kept;
                            }
                            // Failures count only when consecutive.
                            if !load_failures.is_empty() {
                                load_failures.remove(key);
                            }
                            return LoadOutcome::Copied;
                        };
                        // The key must MISS once its block is gone or bad, or
                        // after repeated transient failures: either way the
                        // engine must not retry it forever.
                        let give_up = match kind {
                            ErrorKind::Corrupt => Some(RemovedReason::Corrupt),
                            ErrorKind::NotFound => Some(RemovedReason::Vanished),
                            ErrorKind::Io => {
                                let n = load_failures.entry(key.to_vec()).or_insert(0);
                                *n += 1;
                                (*n >= MAX_TRANSIENT_LOAD_FAILURES)
                                    .then_some(RemovedReason::Unreadable)
                            }
                            // No memory, a panic: not the stored block's fault.
                            _ => None,
                        };
                        match give_up {
                            Some(reason) => {
                                if reason == RemovedReason::Unreadable {
                                    self.dropped_unreadable.store(true, Ordering::Relaxed);
                                }
                                if let (ErrorKind::NotFound, Some(until)) = (kind, missing_until) {
                                    probes.insert(key.to_vec(), Probe::Missing(until));
                                }
                                load_failures.remove(key);
                                LoadOutcome::Forget(reason)
                            }
                            None => LoadOutcome::Kept,
                        }
                    });
                }
                JobKind::Delete => {}
            }
            released = st.index.take_released();
        }
        self.discard(released);
        for waiting in unblocked {
            self.dispatch(waiting);
        }
        if job.claim_report() {
            self.report(&job);
        }
    }

    /// A storage call of `job` (for its item `item`) missed its deadline:
    /// reports the job failed with `Io` now. A store's keys look up as MISS
    /// at once and loads waiting on them fail there; its slots, like a load's
    /// pins, are released only when the call returns and the job finishes.
    pub(super) fn expire(&self, job: &Arc<Job>, item: usize) {
        let mut unblocked = Vec::new();
        let released = {
            // Under the index lock, as settling is: a job settled already has
            // its own result on the way, and its slots may belong to other
            // jobs by now.
            let mut st = self.state.lock();
            if job.is_settled() || !job.claim_late_report(item) {
                return;
            }
            if job.kind == JobKind::Store {
                let State {
                    index,
                    waiting,
                    waiters,
                    ..
                } = &mut *st;
                index.abandon_store(&job.items);
                for item in &job.items {
                    Self::wake_waiters(waiting, waiters, item.slot, false, &mut unblocked);
                }
                let keys = job.keys();
                let present = (0..keys.len())
                    .filter(|&pos| index.contains(keys.get(pos)))
                    .count();
                job.set_present_after(present as u32);
            }
            st.index.take_released()
        };
        self.discard(released);
        for waiting in unblocked {
            self.dispatch(waiting);
        }
        self.report(job);
    }

    /// Counts a job's outcome and queues its result (once: the caller
    /// claimed the report).
    pub(super) fn report(&self, job: &Job) {
        let result = job.result();
        let c = &self.counters;
        match (job.kind, result.is_ok()) {
            (JobKind::Store, true) => Counters::add(&c.stores_ok, 1),
            (JobKind::Store, false) => Counters::add(&c.stores_failed, 1),
            (JobKind::Load, true) => Counters::add(&c.loads_ok, 1),
            (JobKind::Load, false) => Counters::add(&c.loads_failed, 1),
            (JobKind::Delete, _) => {}
        }
        match job.kind {
            JobKind::Store => Counters::add(&c.bytes_stored, result.bytes),
            JobKind::Load => Counters::add(&c.bytes_loaded, result.bytes),
            JobKind::Delete => {}
        }
        self.metrics.job_completed(job.kind, result.elapsed_ns);
        // Before the result is queued: once it can be polled, the caller's
        // result array is the caller's again.
        job.write_items();
        self.done.complete(result);
    }

    /// A store of `slot` finished: loads waiting on it lose a dependency (and
    /// fail at that key if the store failed); those with none left run.
    fn wake_waiters(
        waiting: &mut HashMap<u64, WaitingLoad>,
        waiters: &mut HashMap<u32, Vec<(u64, u32)>>,
        slot: u32,
        ok: bool,
        unblocked: &mut Vec<Arc<Job>>,
    ) {
        let Some(waiters) = waiters.remove(&slot) else {
            return;
        };
        for (wait_id, pos) in waiters {
            let load = waiting.get_mut(&wait_id).expect("waiting load");
            if !ok {
                load.job.fail(pos, ErrorKind::NotFound);
            }
            load.deps -= 1;
            if load.deps == 0 {
                let load = waiting.remove(&wait_id).expect("waiting load");
                unblocked.push(load.job);
            }
        }
    }
}
