//! The status codes of the C ABI, defined in the core so that error kinds
//! (src/error.rs) take their numbers from below and the FFI re-exports them.
//! Codes are stable: a retired number is never reused.
#![allow(non_camel_case_types)]

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
