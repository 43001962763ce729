//! C types and constants. Everything here is `#[repr(C)]` with fixed-width
//! fields: no bools, no enums by value, so ctypes and other FFIs map it 1:1.

use crate::engine::jobs::JobResult;
use crate::stats::Stats;

/// Status of a call: `TIER_OK` (0), a positive non-error outcome
/// (`TIER_TIMEOUT`), or a negative `TIER_ERR_*` code. Codes are stable.
pub type tier_status_t = i32;

/// Success.
pub const TIER_OK: tier_status_t = 0;
/// `tier_wait` timed out before a result was ready (not an error).
pub const TIER_TIMEOUT: tier_status_t = 1;
/// A required pointer argument was NULL.
pub const TIER_ERR_NULL_ARG: tier_status_t = -1;
/// An argument has an invalid value (key length, sizes, alignment, capacity 0…).
pub const TIER_ERR_INVALID_ARG: tier_status_t = -2;
/// A block id is negative or not below the number of primary rows.
pub const TIER_ERR_OUT_OF_RANGE: tier_status_t = -3;
/// The job id is already in flight (submitted and not yet polled).
pub const TIER_ERR_DUPLICATE_JOB: tier_status_t = -4;
/// Job result: a store could not get space, even after eviction.
pub const TIER_ERR_NO_SPACE: tier_status_t = -5;
/// Job result: a load asked for a key that is not stored.
pub const TIER_ERR_NOT_FOUND: tier_status_t = -6;
/// Backend I/O error.
pub const TIER_ERR_IO: tier_status_t = -7;
/// Stored data failed verification.
pub const TIER_ERR_CORRUPT: tier_status_t = -8;
/// Unknown configuration key, unparsable value, or unusable configuration.
pub const TIER_ERR_CONFIG: tier_status_t = -9;
/// The tier is shutting down.
pub const TIER_ERR_SHUTDOWN: tier_status_t = -10;
/// An internal panic was caught at the library boundary.
pub const TIER_ERR_PANIC: tier_status_t = -11;
/// Memory, threads or another resource could not be allocated.
pub const TIER_ERR_ALLOC: tier_status_t = -12;

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

/// Longest accepted key, in bytes (keys are 1..=TIER_MAX_KEY_LEN bytes).
pub const TIER_MAX_KEY_LEN: u32 = 128;

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
    /// for the job's bookkeeping or I/O buffers after it was accepted).
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
        assert_eq!(size_of::<tier_job_result_t>(), 40);
        assert_eq!(size_of::<tier_stats_t>(), 22 * 8);
    }
}
