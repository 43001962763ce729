//! Jobs and the tasks workers run for them.

use super::job_items::status_of;
use crate::backend::{LoadJob, StoreJob};
use crate::error::{try_vec, Error, ErrorKind, Result};
pub(crate) use crate::index::Item;
use crate::key::PackedKeys;
use crate::primary::{Extent, PrimaryBuffer, Row};
use crate::sync::{Mutex, MutexGuard, RwLock};
use crate::workers::{self, CopyTask};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

pub use super::results::{FailReason, ItemResult, ItemResults, ItemSink, ItemStatus, JobResult};
pub use crate::job_kind::JobKind;

/// The reason a backend's error gives a job: a deadline missed is
/// `Deadline`, else what its kind says.
fn reason_of(e: &Error) -> FailReason {
    if e.is_wrong_length() {
        FailReason::LengthMismatch
    } else if e.missed_deadline() {
        FailReason::Deadline
    } else {
        FailReason::of(e.kind())
    }
}

const NO_FAILURE: u64 = u64::MAX;

/// An accepted job. Shared by its tasks; the last task to finish completes it.
pub(crate) struct Job {
    pub id: u64,
    pub kind: JobKind,
    pub num_blocks: u32,
    pub submitted: Instant,
    /// The job's keys, packed (a copy of the caller's).
    pub keys: Vec<u8>,
    pub key_len: usize,
    /// Blocks to copy, in key order.
    pub items: Vec<Item>,
    /// Store: slots of keys already present, pinned until the job completes.
    pub pinned: Vec<u32>,
    /// Store: made room without evicting, so every block it copies adds to
    /// what storage holds (a tier filling up); set when planned.
    pub evicts_nothing: bool,
    /// Store: positions whose key is in the tier (stored or being stored) when
    /// the job completes; set under the index lock at completion.
    present_after: AtomicU32,
    tasks_left: AtomicU32,
    /// Earliest failure: `pos << 32 | reason << 16 | -code`, or NO_FAILURE.
    failure: AtomicU64,
    /// Items whose copy failed (rare: a locked Vec).
    failed_items: Mutex<FailedItems>,
    bytes: AtomicU64,
    /// When a worker first started one of the job's tasks, and when the last
    /// one ended, in nanoseconds after `submitted` (NOT_STARTED / 0 until then).
    io_started_ns: AtomicU64,
    io_ended_ns: AtomicU64,
    /// True once the result is reported: by the last task, or by the
    /// watchdog when a storage call missed its deadline. A worker copies a
    /// loaded block into the caller's row, or a store's backend reads its
    /// row, only under the read side, while it is false; reporting takes the
    /// write side, so no row is touched after its job was reported (nor,
    /// since a reported job's stuck thread may outlive the tier, after
    /// `tier_free`).
    reported: RwLock<bool>,
    /// Load: items whose block reached the caller's row through a worker's
    /// bounce buffer (under a deadline), so a report at the deadline knows
    /// how many leading blocks were copied.
    delivered: Vec<AtomicBool>,
    /// Set under the index lock once the job's last task finished and the
    /// index took its outcome (slots, pins): a deadline firing after that
    /// changes nothing, the job's own result is on its way.
    settled: AtomicBool,
    /// Extent jobs: each key's range of the primary buffer, by position
    /// (their items' `row` is the position); empty for jobs of rows.
    pub(super) extents: Vec<Extent>,
    /// Extent and delete jobs: each key's outcome, by position, as
    /// `ITEM_SET | status << 16 | reason` (0 while nothing went wrong), so a
    /// load goes on past a failed key and the caller learns which.
    pub(super) outcomes: Vec<AtomicU32>,
    /// Where the per-item results go when the job is reported.
    pub(super) sink: Option<Arc<dyn ItemSink>>,
}

const NOT_STARTED: u64 = u64::MAX;

impl Job {
    /// A job of `num_blocks` keys packed in `keys`, which it copies. A load
    /// also gets room for an item per key. Fails with `Alloc` if that memory
    /// is not available.
    pub(crate) fn new(
        id: u64,
        kind: JobKind,
        num_blocks: u32,
        keys: &[u8],
        key_len: usize,
    ) -> Result<Job> {
        let mut copy = try_vec(keys.len(), "the job's keys")?;
        copy.extend_from_slice(keys);
        let (items, delivered) = match kind {
            JobKind::Load => {
                let mut delivered = try_vec(num_blocks as usize, "the load's blocks")?;
                delivered.extend((0..num_blocks).map(|_| AtomicBool::new(false)));
                (
                    try_vec(num_blocks as usize, "the load's blocks")?,
                    delivered,
                )
            }
            JobKind::Store | JobKind::Delete => (Vec::new(), Vec::new()), // sized when planned
        };
        Ok(Job {
            id,
            kind,
            num_blocks,
            submitted: Instant::now(),
            keys: copy,
            key_len,
            items,
            pinned: Vec::new(),
            evicts_nothing: false,
            present_after: AtomicU32::new(0),
            tasks_left: AtomicU32::new(0),
            failure: AtomicU64::new(NO_FAILURE),
            failed_items: Mutex::new(FailedItems::default()),
            bytes: AtomicU64::new(0),
            io_started_ns: AtomicU64::new(NOT_STARTED),
            io_ended_ns: AtomicU64::new(0),
            reported: RwLock::new(false),
            delivered,
            settled: AtomicBool::new(false),
            extents: Vec::new(),
            outcomes: Vec::new(),
            sink: None,
        })
    }

    /// The job's keys.
    pub(crate) fn keys(&self) -> PackedKeys<'_> {
        PackedKeys::new(&self.keys, self.key_len)
    }

    pub(crate) fn key(&self, pos: u32) -> &[u8] {
        &self.keys[pos as usize * self.key_len..][..self.key_len]
    }

    /// Records a failure at key position `pos`; the earliest one wins.
    pub(crate) fn fail(&self, pos: u32, kind: ErrorKind) {
        self.fail_with(pos, kind, FailReason::of(kind));
    }

    /// Records a failure at `pos` with a reason finer than its kind.
    pub(crate) fn fail_with(&self, pos: u32, kind: ErrorKind, reason: FailReason) {
        self.note_item(pos, status_of(kind), reason);
        let low = (reason as u32) << 16 | (-kind.code()) as u32 & 0xffff;
        let packed = (pos as u64) << 32 | low as u64;
        self.failure.fetch_min(packed, Ordering::AcqRel);
    }

    /// The earliest failure so far.
    pub(crate) fn failure(&self) -> Option<(u32, ErrorKind)> {
        self.failure_reason().map(|(pos, kind, _)| (pos, kind))
    }

    pub(super) fn failure_reason(&self) -> Option<(u32, ErrorKind, FailReason)> {
        let f = self.failure.load(Ordering::Acquire);
        (f != NO_FAILURE).then(|| {
            let kind = ErrorKind::from_code(-((f & 0xffff) as i32)).expect("valid code");
            let reason = FailReason::from_u32((f as u32) >> 16);
            ((f >> 32) as u32, kind, reason)
        })
    }

    /// Position before which blocks are still worth copying: a job of rows
    /// stops at its first failure, one with per-item results goes on.
    pub(crate) fn copy_limit(&self) -> u32 {
        if self.per_item() {
            return u32::MAX;
        }
        self.failure().map_or(u32::MAX, |(pos, _)| pos)
    }

    /// A store of item `item` failed with `e`.
    pub(crate) fn store_failed(&self, item: usize, e: &Error) {
        self.item_failed_with(item, e.kind(), reason_of(e));
    }

    pub(crate) fn item_failed_with(&self, item: usize, kind: ErrorKind, reason: FailReason) {
        let mut failed = self.failed_items.lock();
        if !failed.list.iter().any(|&(i, _)| i == item) {
            if failed.list.try_reserve(1).is_ok() {
                failed.list.push((item, kind));
            } else {
                // No memory to say which: count them all as failed.
                failed.all.get_or_insert(kind);
            }
        }
        drop(failed);
        self.fail_with(self.items[item].pos, kind, reason);
    }

    /// A load of item `item` failed with `e`. A failure that never reached
    /// storage proves nothing about the block: it fails the job from the
    /// item's position on without blaming the item, so its key does not
    /// count it among its transient failures (`MAX_TRANSIENT_LOAD_FAILURES`).
    pub(crate) fn load_failed(&self, item: usize, e: &Error) {
        if e.reached_storage() {
            self.item_failed_with(item, e.kind(), reason_of(e));
        } else if e.missed_deadline() {
            self.fail_with(self.items[item].pos, e.kind(), FailReason::Deadline);
        } else {
            self.fail_with(self.items[item].pos, e.kind(), FailReason::Unavailable);
        }
    }

    /// Fails items `range` of the job, whose copies did not run or were cut
    /// short: a store's items each, so none is published as stored; a load
    /// from the range's first item on, where it stops, with `reason` saying
    /// whether the block is to blame.
    pub(crate) fn fail_items(
        &self,
        range: std::ops::Range<usize>,
        kind: ErrorKind,
        reason: FailReason,
    ) {
        match self.kind {
            // Nothing recorded yet for a whole job: one mark instead of a list.
            JobKind::Store
                if range.len() == self.items.len() && self.failed_items.lock().list.is_empty() =>
            {
                self.fail_all_with(kind, reason)
            }
            JobKind::Store => range.for_each(|i| self.item_failed_with(i, kind, reason)),
            JobKind::Load if self.per_item() => {
                range.for_each(|i| self.fail_with(self.items[i].pos, kind, reason))
            }
            JobKind::Load | JobKind::Delete => {
                self.fail_with(self.items[range.start].pos, kind, reason)
            }
        }
    }

    /// Fails every item of the job (none of its copies ran).
    pub(crate) fn fail_all(&self, kind: ErrorKind) {
        self.fail_all_with(kind, FailReason::of(kind));
    }

    pub(crate) fn fail_all_with(&self, kind: ErrorKind, reason: FailReason) {
        self.failed_items.lock().all.get_or_insert(kind);
        self.note_all(kind, reason);
        self.fail_with(self.items.first().map_or(0, |i| i.pos), kind, reason);
    }

    /// The items whose copy failed, locked (held briefly, at completion).
    pub(crate) fn failed_items(&self) -> MutexGuard<'_, FailedItems> {
        self.failed_items.lock()
    }

    /// Marks the job settled (under the index lock, see `settled`).
    pub(crate) fn set_settled(&self) {
        self.settled.store(true, Ordering::Relaxed);
    }

    /// Whether the job is settled (read under the index lock).
    pub(crate) fn is_settled(&self) -> bool {
        self.settled.load(Ordering::Relaxed)
    }

    /// Claims the right to report the job's result: true exactly once.
    pub(crate) fn claim_report(&self) -> bool {
        !std::mem::replace(&mut *self.reported.write(), true)
    }

    /// Whether the result was reported already (by the watchdog, when a
    /// copy is still running): its remaining copies are not wanted.
    pub(crate) fn is_reported(&self) -> bool {
        *self.reported.read()
    }

    /// Load: runs `copy` (bounce buffer to the caller's row) for item `item`
    /// unless the job was reported, and counts the item's block as in its
    /// row; true if it ran.
    pub(crate) fn deliver(&self, item: usize, copy: impl FnOnce()) -> bool {
        self.unless_reported(|| {
            copy();
            self.delivered[item].store(true, Ordering::Release);
        })
    }

    /// Runs `f` (which reads or writes one of the job's rows) unless the job
    /// was reported; true if it ran. The report waits while `f` runs.
    fn unless_reported(&self, f: impl FnOnce()) -> bool {
        let reported = self.reported.read();
        if *reported {
            return false;
        }
        f();
        true
    }

    /// Store: runs `read` over `row` (a backend reading the caller's row)
    /// unless the job was reported; see [`StoreJob`].
    fn read_row_unless_reported(&self, row: Row, read: &mut dyn FnMut(&[u8])) -> bool {
        // SAFETY: `row` is one of this job's rows of the primary buffer,
        // which lives as long as the tier. The tier is not freed yet: the job
        // is not reported, and `tier_free` returns only once the job of every
        // call it leaves behind is (see `Crew::stop`), while
        // `unless_reported` holds the report off until the slice is gone.
        self.unless_reported(|| read(unsafe { row.bytes() }))
    }

    /// The storage call for item `item` missed its deadline: claims the
    /// report and fails the job with `Io` there (a load: at its first block
    /// not yet in the caller's row, as the result counts leading blocks
    /// copied). False if the job was reported already.
    pub(crate) fn claim_late_report(&self, item: usize) -> bool {
        let mut reported = self.reported.write();
        if *reported {
            return false;
        }
        *reported = true;
        if self.per_item() {
            // Every key not yet in place fails: a load's undelivered
            // blocks, a store's new blocks (none of them becomes readable).
            for (i, item) in self.items.iter().enumerate() {
                let delivered = self
                    .delivered
                    .get(i)
                    .is_some_and(|d| d.load(Ordering::Acquire));
                if !delivered {
                    self.fail_with(item.pos, ErrorKind::Io, FailReason::Deadline);
                }
            }
        } else if self.kind == JobKind::Load {
            let first_missing = (0..self.items.len())
                .find(|&i| !self.delivered[i].load(Ordering::Acquire))
                .unwrap_or(item);
            self.fail_with(
                self.items[first_missing].pos,
                ErrorKind::Io,
                FailReason::Deadline,
            );
        }
        // The stuck block itself counts as a transient failure of its key.
        self.item_failed_with(item, ErrorKind::Io, FailReason::Deadline);
        true
    }

    pub(crate) fn add_bytes(&self, n: u64) {
        self.bytes.fetch_add(n, Ordering::Relaxed);
    }

    /// Nanoseconds since the job was submitted.
    pub(crate) fn age_ns(&self) -> u64 {
        self.submitted.elapsed().as_nanos() as u64
    }

    /// Records that a task copied blocks from `started_ns` to `ended_ns`
    /// (both [`Job::age_ns`] readings).
    pub(crate) fn add_io_span(&self, started_ns: u64, ended_ns: u64) {
        self.io_started_ns.fetch_min(started_ns, Ordering::Relaxed);
        self.io_ended_ns.fetch_max(ended_ns, Ordering::Relaxed);
    }

    /// Splits the items into at most `max_tasks` contiguous tasks of at least
    /// `min_items` items each, and arms the completion countdown.
    pub(crate) fn into_tasks(
        self: Arc<Self>,
        max_tasks: usize,
        min_items: usize,
    ) -> impl ExactSizeIterator<Item = Task> {
        let n = self.items.len();
        let tasks = n.div_ceil(min_items.max(1)).clamp(1, max_tasks.max(1));
        let per = n.div_ceil(tasks).max(1);
        let count = n.div_ceil(per);
        self.tasks_left.store(count as u32, Ordering::Release);
        (0..count).map(move |t| Task {
            job: Arc::clone(&self),
            range: t * per..((t + 1) * per).min(n),
        })
    }

    pub(crate) fn set_present_after(&self, n: u32) {
        self.present_after.store(n, Ordering::Release);
    }

    /// Marks one task done; true for the last one.
    pub(crate) fn task_done(&self) -> bool {
        self.tasks_left.fetch_sub(1, Ordering::AcqRel) == 1
    }

    /// The result once every task is done.
    pub(crate) fn result(&self) -> JobResult {
        let failure = self.failure_reason();
        let num_done = match self.kind {
            JobKind::Load | JobKind::Delete if self.per_item() => self.items_ok(),
            JobKind::Load | JobKind::Delete => failure.map_or(self.num_blocks, |(pos, _, _)| pos),
            JobKind::Store => self.present_after.load(Ordering::Acquire),
        };
        JobResult {
            job_id: self.id,
            kind: self.kind,
            error: failure.map(|(_, kind, _)| kind),
            reason: failure.map_or(FailReason::None, |(_, _, reason)| reason),
            num_blocks: self.num_blocks,
            num_done,
            bytes: self.bytes.load(Ordering::Relaxed),
            elapsed_ns: self.age_ns(),
            io_ns: match self.io_started_ns.load(Ordering::Relaxed) {
                NOT_STARTED => 0,
                started => self
                    .io_ended_ns
                    .load(Ordering::Relaxed)
                    .saturating_sub(started),
            },
        }
    }
}

/// A store job as its backend sees it under a deadline: after the job is
/// reported, its rows are the caller's again (and after `tier_free` perhaps
/// unmapped), so the backend reads a row only under the read side of
/// `reported`, as a load writes one (`Job::deliver`). The watchdog's report
/// (`Job::claim_late_report`) takes the write side: it waits for a read in
/// progress, and every later one is refused.
impl StoreJob for Job {
    fn abandoned(&self) -> bool {
        self.is_reported()
    }

    fn read_row(&self, row: Row, read: &mut dyn FnMut(&[u8])) -> bool {
        self.read_row_unless_reported(row, read)
    }
}

/// One block of a load job under a deadline, as a backend that reads in
/// pieces writes it (see `LoadJob`): each piece goes to the caller's row
/// under the read side of `reported`, as `Job::deliver` copies a whole block.
pub(crate) struct LoadRow<'a> {
    pub job: &'a Job,
    pub extent: Extent,
    pub primary: &'a PrimaryBuffer,
}

impl LoadJob for LoadRow<'_> {
    fn write_row(&self, offset: usize, piece: &[u8]) -> bool {
        self.job.unless_reported(|| {
            // SAFETY: a load's extents do not overlap (checked at submit),
            // and this item's task alone writes this one.
            let dst = unsafe { self.primary.at_mut(self.extent) };
            dst[offset..offset + piece.len()].copy_from_slice(piece)
        })
    }

    fn row_len(&self) -> usize {
        self.extent.len
    }
}

/// A contiguous run of one job's items, copied by one worker.
pub(crate) struct Task {
    pub job: Arc<Job>,
    pub range: std::ops::Range<usize>,
}

impl CopyTask for Task {
    fn kind(&self) -> JobKind {
        self.job.kind
    }

    #[cfg(feature = "test-hooks")]
    fn job_id(&self) -> u64 {
        self.job.id
    }
}

/// The workers' types over this engine's tasks and jobs.
pub(crate) type Work = workers::Work<Task>;
pub(crate) type WorkQueue = workers::WorkQueue<Task>;
pub(crate) type Crew = workers::Crew<Job>;
pub(crate) type Worker<'a> = workers::Worker<'a, Job>;

/// The items of a job whose copy failed.
#[derive(Default)]
pub(crate) struct FailedItems {
    /// Indices into the job's `items`, and why.
    list: Vec<(usize, ErrorKind)>,
    /// Every item failed, for this reason (the job could not be queued, or
    /// there was no memory to record which item failed).
    all: Option<ErrorKind>,
}

impl FailedItems {
    /// Why the copy of item `i` failed, if it did.
    pub(crate) fn of(&self, i: usize) -> Option<ErrorKind> {
        self.all.or_else(|| {
            self.list
                .iter()
                .find(|&&(f, _)| f == i)
                .map(|&(_, kind)| kind)
        })
    }
}
