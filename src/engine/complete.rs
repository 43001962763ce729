//! Completing a job whose copies are done: publishes or drops a store's
//! blocks, releases a load's pins (forgetting blocks found gone or failing),
//! wakes loads that waited on a store, counts, and queues the result.

use super::jobs::{Job, JobKind};
use super::{Shared, State, MAX_TRANSIENT_LOAD_FAILURES};
use crate::error::ErrorKind;
use crate::stats::Counters;
use std::sync::Arc;

impl Shared {
    /// Completes a job whose copies are done: publishes or releases its blocks,
    /// wakes loads that waited on them, then queues the result.
    pub(super) fn finish(&self, job: Arc<Job>) {
        let mut unblocked = Vec::new();
        let mut released = Vec::new();
        if job.num_blocks > 0 && (job.kind == JobKind::Store || !job.items.is_empty()) {
            let mut st = self.state.lock();
            match job.kind {
                JobKind::Store => {
                    let failed = job.failed_items();
                    // Reverse order: the job's first key ends most recent.
                    for (i, item) in job.items.iter().enumerate().rev() {
                        let ok = failed.of(i).is_none();
                        st.index.finish_store(item.slot, ok);
                        if ok && !st.load_failures.is_empty() {
                            // A new block: earlier failures were another one's.
                            st.load_failures.remove(job.key(item.pos));
                        }
                        Self::wake_waiters(&mut st, item.slot, ok, &mut unblocked);
                    }
                    // What the job leaves behind, whatever happened meanwhile
                    // (a clear, evictions of keys it found present).
                    let present = (0..job.num_blocks)
                        .filter(|&p| {
                            st.index
                                .find(job.key(p), st.index.hash(job.key(p)))
                                .is_some()
                        })
                        .count();
                    job.set_present_after(present as u32);
                    for &slot in &job.pinned {
                        st.index.unpin(slot);
                    }
                }
                JobKind::Load => {
                    let State {
                        index,
                        load_failures,
                        ..
                    } = &mut *st;
                    for &(i, kind) in job.failed_items().listed() {
                        let item = job.items[i];
                        let key = job.key(item.pos);
                        // The key must MISS once its block is gone or bad, or
                        // after repeated transient failures: either way the
                        // engine must not retry it forever.
                        let give_up = match kind {
                            ErrorKind::Corrupt | ErrorKind::NotFound => true,
                            _ => {
                                let n = load_failures.entry(key.to_vec()).or_insert(0);
                                *n += 1;
                                *n >= MAX_TRANSIENT_LOAD_FAILURES
                            }
                        };
                        if give_up {
                            load_failures.remove(key);
                            index.forget(item.slot);
                        }
                    }
                    if !load_failures.is_empty() {
                        // Failures count only when consecutive.
                        let copied = job.copy_limit().min(job.num_blocks);
                        for item in job.items.iter().filter(|it| it.pos < copied) {
                            load_failures.remove(job.key(item.pos));
                        }
                    }
                    for item in &job.items {
                        st.index.unpin(item.slot);
                    }
                }
            }
            released = st.index.take_released();
        }
        self.discard(released);
        for waiting in unblocked {
            self.dispatch(waiting);
        }
        let result = job.result();
        let c = &self.counters;
        match (job.kind, result.is_ok()) {
            (JobKind::Store, true) => Counters::add(&c.stores_ok, 1),
            (JobKind::Store, false) => Counters::add(&c.stores_failed, 1),
            (JobKind::Load, true) => Counters::add(&c.loads_ok, 1),
            (JobKind::Load, false) => Counters::add(&c.loads_failed, 1),
        }
        match job.kind {
            JobKind::Store => Counters::add(&c.bytes_stored, result.bytes),
            JobKind::Load => Counters::add(&c.bytes_loaded, result.bytes),
        }
        self.done.complete(result);
    }

    /// A store of `slot` finished: loads waiting on it lose a dependency (and
    /// fail at that key if the store failed); those with none left run.
    pub(super) fn wake_waiters(st: &mut State, slot: u32, ok: bool, unblocked: &mut Vec<Arc<Job>>) {
        let Some(waiters) = st.waiters.remove(&slot) else {
            return;
        };
        for (wait_id, pos) in waiters {
            let waiting = st.waiting.get_mut(&wait_id).expect("waiting load");
            if !ok {
                waiting.job.fail(pos, ErrorKind::NotFound);
            }
            waiting.deps -= 1;
            if waiting.deps == 0 {
                let waiting = st.waiting.remove(&wait_id).expect("waiting load");
                unblocked.push(waiting.job);
            }
        }
    }
}
