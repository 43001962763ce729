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

pub use crate::codes::*;
pub use crate::status::*;

/// Longest accepted key, in bytes (keys are 1..=TIER_MAX_KEY_LEN bytes).
pub const TIER_MAX_KEY_LEN: u32 = 128;

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
        let (kind, reason) = e.kind.codes();
        let dropped = match e.kind {
            EventKind::Lost { dropped } => dropped,
            EventKind::Stored(_) | EventKind::Removed(_) => 0,
        };
        let mut out = tier_event_t {
            seq: e.seq,
            dropped,
            kind: kind.code(),
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
            kind: r.kind.code(),
            num_blocks: r.num_blocks,
            num_done: r.num_done,
            bytes: r.bytes,
            elapsed_ns: r.elapsed_ns,
            io_ns: r.io_ns,
            reason: r.reason.code(),
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
        assert_eq!(
            std::mem::size_of::<tier_item_result_t>(),
            TIER_ITEM_RESULT_SIZE_V1 as usize
        );
    }

    #[test]
    fn abi_1_sizes_are_the_structs_sizes() {
        // The first version's sizes are the floor; later versions only
        // append: KVTIER_1.1's tier_stats_t field starts where ABI 1's
        // struct ended.
        let info = tier_abi_info_t::current();
        assert_eq!(
            std::mem::offset_of!(tier_stats_t, probes_in_flight),
            TIER_STATS_SIZE_V1 as usize
        );
        assert_eq!(info.stats_size, TIER_STATS_SIZE_V1 + 8);
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
        assert_eq!(size_of::<tier_stats_t>(), 25 * 8);
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
