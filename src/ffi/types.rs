//! C types and constants. Everything here is `#[repr(C)]` with fixed-width
//! fields: no bools, no enums by value, so ctypes and other FFIs map it 1:1.

use crate::jobs::JobResult;
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

/// A snapshot of a tier's state and counters, filled in by `tier_stats`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct tier_stats_t {
    /// Capacity in bytes (whole blocks).
    pub capacity_bytes: u64,
    /// Bytes held by blocks, including blocks being stored.
    pub used_bytes: u64,
    /// Readable blocks.
    pub num_blocks: u64,
    /// Keys looked up.
    pub lookups: u64,
    /// Lookups answered TIER_HIT.
    pub hits: u64,
    /// Lookups answered TIER_MISS.
    pub misses: u64,
    /// Blocks evicted to make room.
    pub evictions: u64,
    /// Store jobs that succeeded.
    pub stores_ok: u64,
    /// Store jobs that failed.
    pub stores_failed: u64,
    /// Load jobs that succeeded.
    pub loads_ok: u64,
    /// Load jobs that failed.
    pub loads_failed: u64,
    /// Bytes copied into the tier.
    pub bytes_stored: u64,
    /// Bytes copied out of the tier.
    pub bytes_loaded: u64,
    /// Jobs accepted and not yet completed.
    pub jobs_in_flight: u64,
    /// Lookups answered TIER_PENDING.
    pub lookups_pending: u64,
    /// Bytes per block (the primary row size).
    pub block_bytes: u64,
    /// Capacity in blocks.
    pub capacity_blocks: u64,
    /// Heap bytes used by the index (keys, LRU links, hash table).
    pub metadata_bytes: u64,
    /// Finished results waiting for tier_poll_finished.
    pub results_queued: u64,
    /// I/O worker threads.
    pub io_threads: u64,
}

impl From<Stats> for tier_stats_t {
    fn from(s: Stats) -> tier_stats_t {
        tier_stats_t {
            capacity_bytes: s.capacity_bytes,
            used_bytes: s.used_bytes,
            num_blocks: s.num_blocks,
            lookups: s.lookups,
            hits: s.hits,
            misses: s.misses,
            evictions: s.evictions,
            stores_ok: s.stores_ok,
            stores_failed: s.stores_failed,
            loads_ok: s.loads_ok,
            loads_failed: s.loads_failed,
            bytes_stored: s.bytes_stored,
            bytes_loaded: s.bytes_loaded,
            jobs_in_flight: s.jobs_in_flight,
            lookups_pending: s.lookups_pending,
            block_bytes: s.block_bytes,
            capacity_blocks: s.capacity_blocks,
            metadata_bytes: s.metadata_bytes,
            results_queued: s.results_queued,
            io_threads: s.io_threads,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    #[test]
    fn constants_match_the_core() {
        assert_eq!(TIER_MAX_KEY_LEN as usize, crate::MAX_KEY_LEN);
        let codes = [
            (TIER_ERR_NULL_ARG, ErrorKind::NullArg),
            (TIER_ERR_INVALID_ARG, ErrorKind::InvalidArg),
            (TIER_ERR_OUT_OF_RANGE, ErrorKind::OutOfRange),
            (TIER_ERR_DUPLICATE_JOB, ErrorKind::DuplicateJob),
            (TIER_ERR_NO_SPACE, ErrorKind::NoSpace),
            (TIER_ERR_NOT_FOUND, ErrorKind::NotFound),
            (TIER_ERR_IO, ErrorKind::Io),
            (TIER_ERR_CORRUPT, ErrorKind::Corrupt),
            (TIER_ERR_CONFIG, ErrorKind::Config),
            (TIER_ERR_SHUTDOWN, ErrorKind::Shutdown),
            (TIER_ERR_PANIC, ErrorKind::Panic),
            (TIER_ERR_ALLOC, ErrorKind::Alloc),
        ];
        for (code, kind) in codes {
            assert_eq!(code, kind.code(), "{kind:?}");
        }
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
        assert_eq!(size_of::<tier_stats_t>(), 20 * 8);
    }
}
