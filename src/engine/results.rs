//! What a job's result says, as the C ABI hands it out (`tier_job_result_t`
//! is this struct): the caller-facing results, apart from the engine's own
//! job record (`jobs`).

use crate::codes::c_codes;
use crate::error::ErrorKind;
use crate::job_kind::JobKind;
use std::sync::PoisonError;

c_codes! {
    /// Why a job failed, finer than its [`ErrorKind`]: a hung device
    /// (`Deadline`) and storage known to be down (`Unavailable`) both fail with
    /// `Io`, a miss with `NotFound`. The discriminant is the C `TIER_FAIL_*` code.
    pub enum FailReason: u32 {
        /// The job succeeded.
        None = TIER_FAIL_NONE,
        /// A store found no room, even after eviction.
        NoSpace = TIER_FAIL_NO_SPACE,
        /// A load's key is not stored (or storage no longer holds it).
        NotFound = TIER_FAIL_NOT_FOUND,
        /// A stored block failed verification.
        Corrupt = TIER_FAIL_CORRUPT,
        /// Storage returned an error.
        IoError = TIER_FAIL_IO_ERROR,
        /// A storage call missed its deadline (`io_timeout_ms`).
        Deadline = TIER_FAIL_DEADLINE,
        /// Storage was known to be unavailable, so nothing was tried: every I/O
        /// thread stuck on a hung device, a server down or being reconnected to.
        Unavailable = TIER_FAIL_UNAVAILABLE,
        /// The tier was shutting down.
        Shutdown = TIER_FAIL_SHUTDOWN,
        /// Memory for the job's buffers could not be allocated.
        Alloc = TIER_FAIL_ALLOC,
        /// A panic inside the library was caught.
        Panic = TIER_FAIL_PANIC,
        /// An extent load's length differs from the length stored with the
        /// block: nothing was copied.
        LengthMismatch = TIER_FAIL_LENGTH_MISMATCH,
        /// A delete found the block pinned (`tier_pin`), being loaded or being
        /// stored: it stays.
        Busy = TIER_FAIL_BUSY,
    }
}

impl FailReason {
    /// The reason a failure of `kind` has when nothing more is known.
    pub fn of(kind: ErrorKind) -> FailReason {
        match kind {
            ErrorKind::NoSpace => FailReason::NoSpace,
            ErrorKind::NotFound => FailReason::NotFound,
            ErrorKind::Corrupt => FailReason::Corrupt,
            ErrorKind::Shutdown => FailReason::Shutdown,
            ErrorKind::Alloc => FailReason::Alloc,
            ErrorKind::Panic => FailReason::Panic,
            _ => FailReason::IoError,
        }
    }

    /// The reason stored as `code`; an unknown number (never written) reads
    /// as an I/O error rather than success.
    pub(super) fn from_u32(code: u32) -> FailReason {
        FailReason::from_code(code).unwrap_or(FailReason::IoError)
    }
}

c_codes! {
    /// What became of one key of an extent or delete job.
    pub enum ItemStatus: u32 {
        /// Stored, loaded, or deleted.
        Ok = TIER_ITEM_OK,
        /// The key is not in the tier: nothing to load or delete.
        Miss = TIER_ITEM_MISS,
        /// The item failed; its reason says why.
        Failed = TIER_ITEM_FAILED,
        /// A delete left the block in place: pinned, being loaded or stored.
        Busy = TIER_ITEM_BUSY,
    }
}

impl ItemStatus {
    /// An item's status for a failure of `kind`: a miss is MISS, else FAILED.
    pub(crate) fn for_failure(kind: ErrorKind) -> ItemStatus {
        match kind {
            ErrorKind::NotFound => ItemStatus::Miss,
            _ => ItemStatus::Failed,
        }
    }

    /// The status stored as `code`; an unknown number (never written) reads
    /// as a failure rather than success.
    pub(super) fn from_u32(code: u32) -> ItemStatus {
        ItemStatus::from_code(code).unwrap_or(ItemStatus::Failed)
    }
}

/// One key's outcome in an extent or delete job, in submit order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ItemResult {
    /// What became of the key.
    pub status: ItemStatus,
    /// `FailReason::None` when OK, else why not.
    pub reason: FailReason,
}

/// Where a job's per-item results go: the job hands each key's result to
/// [`ItemSink::put`] once, in the moment before the job is reported, and
/// never afterwards (the C shell writes them into the caller's array).
pub trait ItemSink: Send + Sync {
    /// The result of the key at position `pos` of the job.
    fn put(&self, pos: usize, result: ItemResult);
}

/// An [`ItemSink`] that keeps the results, for Rust callers.
#[derive(Debug, Default)]
pub struct ItemResults(std::sync::Mutex<Vec<Option<ItemResult>>>);

impl ItemResults {
    /// Room for `n` results, none yet.
    pub fn new(n: usize) -> ItemResults {
        ItemResults(std::sync::Mutex::new(vec![None; n]))
    }

    /// The results so far (`None` until the job is reported).
    pub fn get(&self) -> Vec<Option<ItemResult>> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl ItemSink for ItemResults {
    fn put(&self, pos: usize, result: ItemResult) {
        let mut results = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(slot) = results.get_mut(pos) {
            *slot = Some(result);
        }
    }
}

/// The outcome of one job, reported exactly once by [`Tier::poll`](crate::Tier::poll).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JobResult {
    /// The caller's job id.
    pub job_id: u64,
    /// Store or load.
    pub kind: JobKind,
    /// `None` on success, else why the job failed.
    pub error: Option<ErrorKind>,
    /// `FailReason::None` on success, else why the job failed, in detail.
    pub reason: FailReason,
    /// Blocks (keys) in the job.
    pub num_blocks: u32,
    /// Store: the job's blocks (keys, counting repeats) in the tier when the job
    /// completed, stored or being stored by another job: `num_blocks` on
    /// success unless a [`Tier::clear`](crate::Tier::clear) came first. Load:
    /// leading blocks copied before the first failure (all of them on success).
    pub num_done: u32,
    /// Bytes copied by this job.
    pub bytes: u64,
    /// Nanoseconds from submit to completion.
    pub elapsed_ns: u64,
    /// Nanoseconds the job's blocks spent moving through the backend: from
    /// the moment a worker started the job's first copy task to the moment
    /// its last copy task ended (wall time, so tasks running in parallel
    /// count once). Excludes time queued before the first task started and a
    /// load's wait for stores in flight. 0 when no block was copied (an empty
    /// job, a store of keys already present, a job failed before any copy).
    pub io_ns: u64,
}

impl JobResult {
    /// True if the job succeeded.
    pub fn is_ok(&self) -> bool {
        self.error.is_none()
    }

    /// The C status code: 0 or a negative `TIER_ERR_*`.
    pub fn status_code(&self) -> i32 {
        self.error.map_or(0, |k| k.code())
    }
}
