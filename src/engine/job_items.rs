//! A job's result per key (extent and delete jobs): each key's outcome as
//! the job goes, and the hand-over to the caller's sink when it is
//! reported.

use super::jobs::{FailReason, Item, ItemResult, ItemSink, ItemStatus, Job};
use crate::error::{try_vec, ErrorKind, Result};
use crate::primary::{Extent, PrimaryBuffer};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

/// Marks an outcome as set (0 means nothing went wrong so far).
const ITEM_SET: u32 = 1 << 31;

/// An item's status for a failure of `kind`: a miss is MISS, else FAILED.
pub(super) fn status_of(kind: ErrorKind) -> ItemStatus {
    match kind {
        ErrorKind::NotFound => ItemStatus::Miss,
        _ => ItemStatus::Failed,
    }
}

impl Job {
    /// Makes this a job with a result per key (extent and delete jobs):
    /// `extents` (empty for a delete) name each key's bytes, `sink` gets
    /// the results. Fails with `Alloc` if there is no memory for them.
    pub(crate) fn with_items(
        mut self,
        extents: &[Extent],
        sink: Option<Arc<dyn ItemSink>>,
    ) -> Result<Job> {
        let n = self.num_blocks as usize;
        let mut copy = try_vec(extents.len(), "the job's extents")?;
        copy.extend_from_slice(extents);
        let mut outcomes = try_vec(n, "the job's item results")?;
        outcomes.extend((0..n).map(|_| AtomicU32::new(0)));
        self.extents = copy;
        self.outcomes = outcomes;
        self.sink = sink;
        Ok(self)
    }

    /// Whether the job reports a result per key.
    pub(crate) fn per_item(&self) -> bool {
        !self.outcomes.is_empty()
    }

    /// The bytes of the primary buffer item `item` copies: its extent, or
    /// its row.
    pub(crate) fn extent(&self, item: &Item, primary: &PrimaryBuffer) -> Extent {
        match self.extents.get(item.row) {
            Some(&extent) => extent,
            None => primary.row_extent(item.row),
        }
    }

    /// Records the outcome of the key at `pos` (the first one wins); a no-op
    /// for jobs without per-item results.
    pub(crate) fn note_item(&self, pos: u32, status: ItemStatus, reason: FailReason) {
        if let Some(outcome) = self.outcomes.get(pos as usize) {
            let packed = ITEM_SET | (status as u32) << 16 | reason as u32;
            let _ = outcome.compare_exchange(0, packed, Ordering::AcqRel, Ordering::Acquire);
        }
    }

    /// The outcome of the key at `pos`: OK unless something was noted.
    fn item_result(&self, pos: usize) -> ItemResult {
        match self.outcomes[pos].load(Ordering::Acquire) {
            0 => ItemResult {
                status: ItemStatus::Ok,
                reason: FailReason::None,
            },
            v => ItemResult {
                status: ItemStatus::from_u32((v & !ITEM_SET) >> 16),
                reason: FailReason::from_u32(v & 0xffff),
            },
        }
    }

    /// Keys whose outcome is OK so far.
    pub(super) fn items_ok(&self) -> u32 {
        (0..self.outcomes.len())
            .filter(|&pos| self.item_result(pos).status == ItemStatus::Ok)
            .count() as u32
    }

    /// Hands every key's result to the sink (once, as the job is reported).
    pub(crate) fn write_items(&self) {
        if let Some(sink) = &self.sink {
            for pos in 0..self.outcomes.len() {
                sink.put(pos, self.item_result(pos));
            }
        }
    }

    /// A failed store: a key repeated in the job shares the outcome of its
    /// first position, so a repeat not noted whose key `present` denies
    /// failed for the job's reason.
    pub(crate) fn note_absent_repeats(&self, present: impl Fn(&[u8]) -> bool) {
        let Some((_, kind, reason)) = self.failure_reason() else {
            return;
        };
        for pos in 0..self.outcomes.len() as u32 {
            if self.item_result(pos as usize).status == ItemStatus::Ok && !present(self.key(pos)) {
                self.note_item(pos, status_of(kind), reason);
            }
        }
    }

    /// Notes every key not yet noted as failed with `reason` (a job that
    /// failed as a whole).
    pub(super) fn note_all(&self, kind: ErrorKind, reason: FailReason) {
        for pos in 0..self.outcomes.len() as u32 {
            self.note_item(pos, status_of(kind), reason);
        }
    }
}
