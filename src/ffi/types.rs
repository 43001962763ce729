//! C types and constants. Everything here is `#[repr(C)]` with fixed-width
//! fields: no bools, no enums by value, so ctypes and other FFIs map it 1:1.

use crate::engine::jobs::JobResult;
use crate::events::{Event, EventKind};
use crate::stats::Stats;

/// The ABI this header describes (tier_abi_info() gives the library's). It
/// is the soname's number, libkvtier.so.TIER_ABI_VERSION, and changes only
/// when an existing function or struct changes incompatibly.
pub const TIER_ABI_VERSION: u32 = 1;

/// sizeof(tier_stats_t) in ABI 1, the least `out_size` tier_stats accepts.
pub const TIER_STATS_SIZE_V1: u32 = 192;
/// sizeof(tier_job_result_t) in ABI 1, the least `result_size`
/// tier_poll_finished accepts.
pub const TIER_JOB_RESULT_SIZE_V1: u32 = 56;
/// sizeof(tier_event_t) in ABI 1, the least `event_size` tier_poll_events
/// accepts.
pub const TIER_EVENT_SIZE_V1: u32 = 160;
/// sizeof(tier_abi_info_t) in ABI 1, the least `out_size` tier_abi_info
/// accepts.
pub const TIER_ABI_INFO_SIZE_V1: u32 = 20;
/// sizeof(tier_item_result_t) when it was added (KVTIER_1.1), the least
/// `result_size` the extent and delete submits accept.
pub const TIER_ITEM_RESULT_SIZE_V1: u32 = 8;

pub use crate::status::*;

/// Job result reason: the job succeeded.
pub const TIER_FAIL_NONE: u32 = 0;
/// Job result reason: a store found no room, even after eviction
/// (TIER_ERR_NO_SPACE).
pub const TIER_FAIL_NO_SPACE: u32 = 1;
/// Job result reason: a load's key is not stored, or storage no longer holds
/// its block (TIER_ERR_NOT_FOUND): a miss.
pub const TIER_FAIL_NOT_FOUND: u32 = 2;
/// Job result reason: a stored block failed verification (TIER_ERR_CORRUPT).
pub const TIER_FAIL_CORRUPT: u32 = 3;
/// Job result reason: storage returned an error (TIER_ERR_IO).
pub const TIER_FAIL_IO_ERROR: u32 = 4;
/// Job result reason: a storage call missed its deadline, io_timeout_ms
/// (TIER_ERR_IO): a hung device or server.
pub const TIER_FAIL_DEADLINE: u32 = 5;
/// Job result reason: storage was known to be unavailable, so nothing was
/// tried (TIER_ERR_IO): every I/O thread stuck on a hung device, a Redis
/// server down or being reconnected to.
pub const TIER_FAIL_UNAVAILABLE: u32 = 6;
/// Job result reason: the tier was shutting down (TIER_ERR_SHUTDOWN).
pub const TIER_FAIL_SHUTDOWN: u32 = 7;
/// Job result reason: no memory for the job's buffers (TIER_ERR_ALLOC).
pub const TIER_FAIL_ALLOC: u32 = 8;
/// Job result reason: a panic inside the library was caught (TIER_ERR_PANIC).
pub const TIER_FAIL_PANIC: u32 = 9;
/// Item reason: an extent load's length differs from the length stored
/// with the block; nothing was copied (KVTIER_1.1).
pub const TIER_FAIL_LENGTH_MISMATCH: u32 = 10;
/// Item reason: a delete found the block pinned (tier_pin), being loaded or
/// being stored, and left it (KVTIER_1.1).
pub const TIER_FAIL_BUSY: u32 = 11;

/// Item status: stored, loaded or deleted.
pub const TIER_ITEM_OK: u32 = 0;
/// Item status: the key is not in the tier (nothing to load or delete).
pub const TIER_ITEM_MISS: u32 = 1;
/// Item status: the item failed; `reason` says why.
pub const TIER_ITEM_FAILED: u32 = 2;
/// Item status: a delete left the block in place (TIER_FAIL_BUSY).
pub const TIER_ITEM_BUSY: u32 = 3;

/// Lookup state: the key is not stored.
pub const TIER_MISS: u8 = 0;
/// Lookup state: the key is stored and readable.
pub const TIER_HIT: u8 = 1;
/// Lookup state: the key is being stored; ask again later.
pub const TIER_PENDING: u8 = 2;

/// Job kind: primary rows copied into the tier.
pub const TIER_JOB_STORE: u32 = 1;
/// Job kind: tier blocks copied into primary rows.
pub const TIER_JOB_LOAD: u32 = 2;
/// Job kind: keys deleted from the tier and its storage (KVTIER_1.1).
pub const TIER_JOB_DELETE: u32 = 3;

/// Longest accepted key, in bytes (keys are 1..=TIER_MAX_KEY_LEN bytes).
pub const TIER_MAX_KEY_LEN: u32 = 128;

/// Event kind: the key's block became readable in the tier (a lookup answers
/// TIER_HIT). `reason` is a TIER_STORED_* code.
pub const TIER_EVENT_STORED: u32 = 1;
/// Event kind: the key's block stopped being readable in the tier (a lookup
/// answers TIER_MISS). `reason` is a TIER_REMOVED_* code.
pub const TIER_EVENT_REMOVED: u32 = 2;
/// Event kind: the event ring was full and `dropped` events (sequence numbers
/// `seq` to `seq + dropped - 1`) were dropped at this place; `key_len` is 0
/// and `reason` 0. What the consumer mirrored is stale: forget it.
pub const TIER_EVENT_LOST: u32 = 3;

/// STORED reason: a store job of this tier wrote the block.
pub const TIER_STORED_WRITTEN: u32 = 1;
/// STORED reason: storage held the block when the tier was opened (disk
/// restart, Redis sharing=owned adopting its keys).
pub const TIER_STORED_RECOVERED: u32 = 2;
/// STORED reason: shared storage (disk shared=true, Redis sharing=shared): a
/// lookup's probe found a block another writer stored.
pub const TIER_STORED_FOUND: u32 = 3;

/// REMOVED reason: least recently used, evicted to make room.
pub const TIER_REMOVED_EVICTED: u32 = 1;
/// REMOVED reason: tier_clear.
pub const TIER_REMOVED_CLEARED: u32 = 2;
/// REMOVED reason: a load found the stored block corrupt (TIER_ERR_CORRUPT).
pub const TIER_REMOVED_CORRUPT: u32 = 3;
/// REMOVED reason: a load found that storage no longer holds the block
/// (TIER_ERR_NOT_FOUND: a file deleted, a Redis key expired or evicted).
pub const TIER_REMOVED_VANISHED: u32 = 4;
/// REMOVED reason: the block's loads failed transiently (TIER_ERR_IO)
/// MAX_TRANSIENT_LOAD_FAILURES times in a row (failures that never reached
/// storage, such as a server known to be down, not counted); storage may
/// still hold it.
pub const TIER_REMOVED_UNREADABLE: u32 = 5;
/// REMOVED reason: a delete job removed the block (tier_submit_delete,
/// KVTIER_1.1).
pub const TIER_REMOVED_DELETED: u32 = 6;

/// One key's outcome in an extent or delete job, written by the library
/// into the caller's array (at the caller's `result_size` stride) before
/// the job is reported by tier_poll_finished. Added in KVTIER_1.1.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct tier_item_result_t {
    /// A TIER_ITEM_* code.
    pub status: u32,
    /// TIER_FAIL_NONE when OK, else a TIER_FAIL_* code: why not.
    pub reason: u32,
}

impl From<crate::ItemResult> for tier_item_result_t {
    fn from(r: crate::ItemResult) -> tier_item_result_t {
        tier_item_result_t {
            status: r.status as u32,
            reason: r.reason as u32,
        }
    }
}

/// One block event, filled in by `tier_poll_events`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct tier_event_t {
    /// Sequence number: 0, 1, 2, … in the order events were recorded, dropped
    /// ones included (a TIER_EVENT_LOST carries the first dropped number), so
    /// events polled by several threads can be put back in order.
    pub seq: u64,
    /// TIER_EVENT_LOST: how many events were dropped here. 0 otherwise.
    pub dropped: u64,
    /// TIER_EVENT_STORED, TIER_EVENT_REMOVED or TIER_EVENT_LOST.
    pub kind: u32,
    /// STORED: a TIER_STORED_* code; REMOVED: a TIER_REMOVED_* code; LOST: 0.
    pub reason: u32,
    /// Bytes of `key` in use (0 for TIER_EVENT_LOST).
    pub key_len: u32,
    /// The block's key; bytes past `key_len` are 0.
    pub key: [u8; TIER_MAX_KEY_LEN as usize],
    /// 0: spells out the struct's tail padding.
    pub reserved: u32,
}

impl From<&Event> for tier_event_t {
    fn from(e: &Event) -> tier_event_t {
        let (kind, reason, dropped) = match e.kind {
            EventKind::Stored(r) => (TIER_EVENT_STORED, r as u32, 0),
            EventKind::Removed(r) => (TIER_EVENT_REMOVED, r as u32, 0),
            EventKind::Lost { dropped } => (TIER_EVENT_LOST, 0, dropped),
        };
        let mut out = tier_event_t {
            seq: e.seq,
            dropped,
            kind,
            reason,
            key_len: e.key().len() as u32,
            key: [0; TIER_MAX_KEY_LEN as usize],
            reserved: 0,
        };
        out.key[..e.key().len()].copy_from_slice(e.key());
        out
    }
}

/// An opaque tier handle, created by `tier_new` and destroyed by `tier_free`.
/// Every function may be called on one handle from any thread, concurrently,
/// except `tier_free`, which must be the last call.
pub struct tier_t {
    _private: [u8; 0],
}

/// An opaque configuration builder, created by `tier_config_new` and destroyed
/// by `tier_config_free`. Not safe for concurrent mutation.
pub struct tier_config_t {
    _private: [u8; 0],
}

/// The result of one finished job, filled in by `tier_poll_finished`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct tier_job_result_t {
    /// The job id given at submit.
    pub job_id: u64,
    /// TIER_OK, or why the job failed (TIER_ERR_NO_SPACE, TIER_ERR_NOT_FOUND,
    /// TIER_ERR_IO, TIER_ERR_CORRUPT, TIER_ERR_PANIC, TIER_ERR_ALLOC: no memory
    /// for the job's bookkeeping or I/O buffers after it was accepted); see
    /// `reason` for the detail.
    pub status: tier_status_t,
    /// TIER_JOB_STORE or TIER_JOB_LOAD.
    pub kind: u32,
    /// Blocks (keys) in the job.
    pub num_blocks: u32,
    /// Store: the job's blocks (keys, counting repeats) in the tier when the
    /// job completed, stored or being stored by another job: num_blocks on
    /// success unless a tier_clear came first. Load: leading blocks copied
    /// before the first failure (num_blocks on success).
    pub num_done: u32,
    /// Bytes copied by the job.
    pub bytes: u64,
    /// Nanoseconds from submit to completion.
    pub elapsed_ns: u64,
    /// Nanoseconds the job's blocks spent in backend I/O and copies on the
    /// tier's threads: wall time from the moment a worker started the job's
    /// first copy task to the moment its last copy task ended (tasks running
    /// in parallel count once). Excludes time queued before the first task
    /// started and a load's wait for stores of its keys in flight; the
    /// "active transfer time". 0 when no block was copied (n = 0, a store
    /// of keys already present, a job failed before any copy, such as
    /// TIER_ERR_NO_SPACE). Never more than elapsed_ns.
    pub io_ns: u64,
    /// TIER_FAIL_NONE on success, else a TIER_FAIL_* code: why the job
    /// failed, finer than `status` (TIER_FAIL_DEADLINE, a hung device, and
    /// TIER_FAIL_UNAVAILABLE both come with TIER_ERR_IO; a miss is
    /// TIER_FAIL_NOT_FOUND). Added in ABI 1.
    pub reason: u32,
    /// 0: spells out the struct's tail padding.
    pub reserved: u32,
}

/// What a library offers, filled in by `tier_abi_info`: a consumer that loads
/// the library at run time (dlopen, ctypes) checks it before any other call.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct tier_abi_info_t {
    /// The library's TIER_ABI_VERSION (its soname's number).
    pub abi_version: u32,
    /// sizeof(tier_abi_info_t) in the library.
    pub abi_info_size: u32,
    /// sizeof(tier_stats_t) in the library.
    pub stats_size: u32,
    /// sizeof(tier_job_result_t) in the library.
    pub job_result_size: u32,
    /// sizeof(tier_event_t) in the library.
    pub event_size: u32,
}

impl tier_abi_info_t {
    /// This library's ABI.
    pub fn current() -> tier_abi_info_t {
        use std::mem::size_of;
        tier_abi_info_t {
            abi_version: TIER_ABI_VERSION,
            abi_info_size: size_of::<tier_abi_info_t>() as u32,
            stats_size: size_of::<tier_stats_t>() as u32,
            job_result_size: size_of::<tier_job_result_t>() as u32,
            event_size: size_of::<tier_event_t>() as u32,
        }
    }
}

impl From<JobResult> for tier_job_result_t {
    fn from(r: JobResult) -> tier_job_result_t {
        tier_job_result_t {
            job_id: r.job_id,
            status: r.status_code(),
            kind: r.kind as u32,
            num_blocks: r.num_blocks,
            num_done: r.num_done,
            bytes: r.bytes,
            elapsed_ns: r.elapsed_ns,
            io_ns: r.io_ns,
            reason: r.reason as u32,
            reserved: 0,
        }
    }
}

/// The stats struct of the C API is the core's [`Stats`], `#[repr(C)]`
/// (cbindgen names it `tier_stats_t` from src/stats.rs).
/// cbindgen:ignore
pub type tier_stats_t = Stats;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constants_match_the_core() {
        assert_eq!(TIER_MAX_KEY_LEN as usize, crate::MAX_KEY_LEN);
        assert_eq!(TIER_JOB_STORE, crate::JobKind::Store as u32);
        assert_eq!(TIER_JOB_LOAD, crate::JobKind::Load as u32);
        assert_eq!(TIER_HIT, crate::LookupState::Hit as u8);
        assert_eq!(TIER_MISS, crate::LookupState::Miss as u8);
        assert_eq!(TIER_PENDING, crate::LookupState::Pending as u8);
        use crate::{RemovedReason as R, StoredReason as S};
        assert_eq!(TIER_STORED_WRITTEN, S::Written as u32);
        assert_eq!(TIER_STORED_RECOVERED, S::Recovered as u32);
        assert_eq!(TIER_STORED_FOUND, S::Found as u32);
        assert_eq!(TIER_REMOVED_EVICTED, R::Evicted as u32);
        assert_eq!(TIER_REMOVED_CLEARED, R::Cleared as u32);
        assert_eq!(TIER_REMOVED_CORRUPT, R::Corrupt as u32);
        assert_eq!(TIER_REMOVED_VANISHED, R::Vanished as u32);
        assert_eq!(TIER_REMOVED_UNREADABLE, R::Unreadable as u32);
        assert_eq!(TIER_REMOVED_DELETED, R::Deleted as u32);
        assert_eq!(TIER_JOB_DELETE, crate::JobKind::Delete as u32);
        use crate::ItemStatus as I;
        assert_eq!(TIER_ITEM_OK, I::Ok as u32);
        assert_eq!(TIER_ITEM_MISS, I::Miss as u32);
        assert_eq!(TIER_ITEM_FAILED, I::Failed as u32);
        assert_eq!(TIER_ITEM_BUSY, I::Busy as u32);
        assert_eq!(
            std::mem::size_of::<tier_item_result_t>(),
            TIER_ITEM_RESULT_SIZE_V1 as usize
        );
        use crate::FailReason as F;
        assert_eq!(TIER_FAIL_NONE, F::None as u32);
        assert_eq!(TIER_FAIL_NO_SPACE, F::NoSpace as u32);
        assert_eq!(TIER_FAIL_NOT_FOUND, F::NotFound as u32);
        assert_eq!(TIER_FAIL_CORRUPT, F::Corrupt as u32);
        assert_eq!(TIER_FAIL_IO_ERROR, F::IoError as u32);
        assert_eq!(TIER_FAIL_DEADLINE, F::Deadline as u32);
        assert_eq!(TIER_FAIL_UNAVAILABLE, F::Unavailable as u32);
        assert_eq!(TIER_FAIL_SHUTDOWN, F::Shutdown as u32);
        assert_eq!(TIER_FAIL_ALLOC, F::Alloc as u32);
        assert_eq!(TIER_FAIL_PANIC, F::Panic as u32);
        assert_eq!(TIER_FAIL_LENGTH_MISMATCH, F::LengthMismatch as u32);
        assert_eq!(TIER_FAIL_BUSY, F::Busy as u32);
    }

    #[test]
    fn abi_1_sizes_are_the_structs_sizes() {
        // In ABI 1 the first version's sizes are the current ones; later
        // versions only append, so these stay the floor.
        let info = tier_abi_info_t::current();
        assert_eq!(info.stats_size, TIER_STATS_SIZE_V1);
        assert_eq!(info.job_result_size, TIER_JOB_RESULT_SIZE_V1);
        assert_eq!(info.event_size, TIER_EVENT_SIZE_V1);
        assert_eq!(info.abi_info_size, TIER_ABI_INFO_SIZE_V1);
    }

    #[test]
    fn result_layout_is_the_documented_one() {
        use std::mem::{offset_of, size_of};
        assert_eq!(offset_of!(tier_job_result_t, job_id), 0);
        assert_eq!(offset_of!(tier_job_result_t, status), 8);
        assert_eq!(offset_of!(tier_job_result_t, kind), 12);
        assert_eq!(offset_of!(tier_job_result_t, num_blocks), 16);
        assert_eq!(offset_of!(tier_job_result_t, num_done), 20);
        assert_eq!(offset_of!(tier_job_result_t, bytes), 24);
        assert_eq!(offset_of!(tier_job_result_t, elapsed_ns), 32);
        assert_eq!(offset_of!(tier_job_result_t, io_ns), 40);
        assert_eq!(offset_of!(tier_job_result_t, reason), 48);
        assert_eq!(offset_of!(tier_job_result_t, reserved), 52);
        assert_eq!(size_of::<tier_job_result_t>(), 56);
        assert_eq!(size_of::<tier_stats_t>(), 24 * 8);
        assert_eq!(offset_of!(tier_event_t, seq), 0);
        assert_eq!(offset_of!(tier_event_t, dropped), 8);
        assert_eq!(offset_of!(tier_event_t, kind), 16);
        assert_eq!(offset_of!(tier_event_t, reason), 20);
        assert_eq!(offset_of!(tier_event_t, key_len), 24);
        assert_eq!(offset_of!(tier_event_t, key), 28);
        assert_eq!(offset_of!(tier_event_t, reserved), 156);
        assert_eq!(size_of::<tier_event_t>(), 160);
    }
}
