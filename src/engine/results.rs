//! What a job's result says, as the C ABI hands it out (`tier_job_result_t`
//! is this struct): the caller-facing results, apart from the engine's own
//! job record (`jobs`).

use crate::error::ErrorKind;
use crate::job_kind::JobKind;
use std::sync::PoisonError;

/// Why a job failed, finer than its [`ErrorKind`]: a hung device
/// (`Deadline`) and storage known to be down (`Unavailable`) both fail with
/// `Io`, a miss with `NotFound`. The discriminant is the C `TIER_FAIL_*` code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum FailReason {
    /// The job succeeded.
    None = 0,
    /// A store found no room, even after eviction.
    NoSpace = 1,
    /// A load's key is not stored (or storage no longer holds it).
    NotFound = 2,
    /// A stored block failed verification.
    Corrupt = 3,
    /// Storage returned an error.
    IoError = 4,
    /// A storage call missed its deadline (`io_timeout_ms`).
    Deadline = 5,
    /// Storage was known to be unavailable, so nothing was tried: every I/O
    /// thread stuck on a hung device, a server down or being reconnected to.
    Unavailable = 6,
    /// The tier was shutting down.
    Shutdown = 7,
    /// Memory for the job's buffers could not be allocated.
    Alloc = 8,
    /// A panic inside the library was caught.
    Panic = 9,
    /// An extent load's length differs from the length stored with the
    /// block: nothing was copied.
    LengthMismatch = 10,
    /// A delete found the block pinned (`tier_pin`), being loaded or being
    /// stored: it stays.
    Busy = 11,
}

impl FailReason {
    const ALL: [FailReason; 12] = [
        FailReason::None,
        FailReason::NoSpace,
        FailReason::NotFound,
        FailReason::Corrupt,
        FailReason::IoError,
        FailReason::Deadline,
        FailReason::Unavailable,
        FailReason::Shutdown,
        FailReason::Alloc,
        FailReason::Panic,
        FailReason::LengthMismatch,
        FailReason::Busy,
    ];

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

    pub(super) fn from_u32(v: u32) -> FailReason {
        Self::ALL
            .get(v as usize)
            .copied()
            .unwrap_or(FailReason::IoError)
    }
}

/// What became of one key of an extent or delete job.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum ItemStatus {
    /// Stored, loaded, or deleted.
    Ok = 0,
    /// The key is not in the tier: nothing to load or delete.
    Miss = 1,
    /// The item failed; its reason says why.
    Failed = 2,
    /// A delete left the block in place: pinned, being loaded or stored.
    Busy = 3,
}

impl ItemStatus {
    pub(super) fn from_u32(v: u32) -> ItemStatus {
        match v {
            0 => ItemStatus::Ok,
            1 => ItemStatus::Miss,
            3 => ItemStatus::Busy,
            _ => ItemStatus::Failed,
        }
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
