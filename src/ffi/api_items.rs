//! The exports added in KVTIER_1.1 for engines whose objects are not rows
//! (LMCache): extent stores and loads, per-key deletes and pins, with a
//! result per key written into the caller's array.

use super::api::tier_ref;
use super::boundary::{self, as_mut_slice, as_slice, sized_out, status, this_export, SizedOut, OK};
use super::types::*;
use crate::error::{bail, try_vec, Result};
use crate::{Extent, ItemResult, ItemSink};
use std::sync::Arc;

/// The caller's `tier_item_result_t` array of a job, written once, just
/// before the job is reported (see `Job::write_items`).
struct CallerResults(SizedOut<tier_item_result_t>);

// SAFETY: the caller keeps the array alive and leaves it alone until the job
// is polled (tier_submit_store_extents' ownership rule); the library writes
// it from one thread, before the result can be polled.
unsafe impl Send for CallerResults {}
unsafe impl Sync for CallerResults {}

impl ItemSink for CallerResults {
    fn put(&self, pos: usize, result: ItemResult) {
        if pos < self.0.len() {
            self.0.write(pos, &result.into());
        }
    }
}

/// The per-item results sink of a submit: none when `results` is NULL.
///
/// # Safety
/// As for `sized_out`, for `n` elements.
unsafe fn results_sink(
    results: *mut tier_item_result_t,
    result_size: usize,
    n: usize,
) -> Result<Option<Arc<dyn ItemSink>>> {
    if results.is_null() {
        return Ok(None);
    }
    let out = sized_out(results, result_size, n, TIER_ITEM_RESULT_SIZE_V1, "results")?;
    let sink: Arc<dyn ItemSink> = Arc::new(CallerResults(out));
    Ok(Some(sink))
}

/// The `n` extents given as offsets and lengths.
///
/// # Safety
/// As for `as_slice`.
unsafe fn extents(offsets: *const u64, lengths: *const u64, n: usize) -> Result<Vec<Extent>> {
    let offsets = as_slice(offsets, n, "offsets")?;
    let lengths = as_slice(lengths, n, "lengths")?;
    let mut out = try_vec(n, "the job's extents")?;
    for (i, (&offset, &len)) in offsets.iter().zip(lengths).enumerate() {
        let (Ok(offset), Ok(len)) = (usize::try_from(offset), usize::try_from(len)) else {
            bail!(
                InvalidArg,
                "offsets[{i}], lengths[{i}]: beyond the address space"
            );
        };
        out.push(Extent { offset, len });
    }
    Ok(out)
}

/// An extent job as the caller passed it.
struct RawExtents {
    job_id: u64,
    keys: *const u8,
    key_len: usize,
    offsets: *const u64,
    lengths: *const u64,
    n: usize,
    results: *mut tier_item_result_t,
    result_size: usize,
}

/// The body of the two extent submits, which differ only in the job's kind.
unsafe fn submit_extents(
    function: boundary::Export,
    load: bool,
    tier: *mut tier_t,
    job: RawExtents,
) -> tier_status_t {
    status(function, || {
        let tier = tier_ref(tier)?;
        let keys = boundary::keys(job.keys, job.key_len, job.n)?;
        let extents = extents(job.offsets, job.lengths, job.n)?;
        let sink = results_sink(job.results, job.result_size, job.n)?;
        if load {
            tier.submit_load_extents(job.job_id, keys, job.key_len, &extents, sink)?;
        } else {
            tier.submit_store_extents(job.job_id, keys, job.key_len, &extents, sink)?;
        }
        OK
    })
}

/// Submits a job that stores key `i` (n keys of key_len bytes, packed) from
/// the `lengths[i]` bytes at byte `offsets[i]` of the primary buffer given
/// to tier_new. Lengths are 1 to the tier's block_bytes; offsets need not be
/// row-aligned. The length is stored with the block: a load must ask for the
/// same. Otherwise as tier_submit_store (present keys count as done, room by
/// eviction of unpinned blocks, TIER_ERR_NO_SPACE as a whole).
/// Per key, `results[i]` (if `results` is not NULL) is written before the
/// job is reported: TIER_ITEM_OK, or TIER_ITEM_FAILED with a TIER_FAIL_*
/// reason (TIER_FAIL_NO_SPACE when the job found no room).
/// Returns TIER_OK if accepted (reported exactly once by
/// tier_poll_finished, kind TIER_JOB_STORE). A rejected call produces no
/// result and writes nothing: TIER_ERR_NULL_ARG; TIER_ERR_INVALID_ARG
/// (key_len; a length of 0 or above block_bytes, or an extent that runs past
/// the primary buffer; result_size below TIER_ITEM_RESULT_SIZE_V1; a backend
/// that does not store extents); TIER_ERR_DUPLICATE_JOB; TIER_ERR_ALLOC;
/// TIER_ERR_SHUTDOWN.
/// Ownership: `keys`, `offsets` and `lengths` are copied before return. The
/// extents are read, and `results` written, until the job is polled: leave
/// them alone and alive until then.
/// NULL: `keys`, `offsets` and `lengths` may be NULL when `n` is 0;
/// `results` may be NULL (no per-key results).
/// Threads: any thread, concurrently with other calls.
#[no_mangle]
pub unsafe extern "C" fn tier_submit_store_extents(
    tier: *mut tier_t,
    job_id: u64,
    keys: *const u8,
    key_len: usize,
    offsets: *const u64,
    lengths: *const u64,
    n: usize,
    results: *mut tier_item_result_t,
    result_size: usize,
) -> tier_status_t {
    let job = RawExtents {
        job_id,
        keys,
        key_len,
        offsets,
        lengths,
        n,
        results,
        result_size,
    };
    submit_extents(this_export!(), false, tier, job)
}

/// Submits a job that loads key `i` into the `lengths[i]` bytes at byte
/// `offsets[i]` of the primary buffer. Unlike tier_submit_load the job goes
/// on past a key that misses or fails, so `results[i]` says which keys
/// loaded: TIER_ITEM_OK, TIER_ITEM_MISS (not stored; TIER_FAIL_NOT_FOUND),
/// or TIER_ITEM_FAILED with its reason: TIER_FAIL_LENGTH_MISMATCH (the
/// block was stored with another length: nothing copied, the block kept),
/// TIER_FAIL_CORRUPT, TIER_FAIL_IO_ERROR, TIER_FAIL_DEADLINE, ... as for
/// tier_submit_load. The job's status is its first failure's (TIER_OK if
/// every key loaded); num_done counts the keys loaded.
/// The extents of one load must not overlap (TIER_ERR_INVALID_ARG).
/// Returns and rejections as for tier_submit_store_extents (kind
/// TIER_JOB_LOAD). Ownership: as for tier_submit_store_extents; the extents
/// are written until the job is polled.
/// NULL: as for tier_submit_store_extents.
/// Threads: any thread, concurrently with other calls.
#[no_mangle]
pub unsafe extern "C" fn tier_submit_load_extents(
    tier: *mut tier_t,
    job_id: u64,
    keys: *const u8,
    key_len: usize,
    offsets: *const u64,
    lengths: *const u64,
    n: usize,
    results: *mut tier_item_result_t,
    result_size: usize,
) -> tier_status_t {
    let job = RawExtents {
        job_id,
        keys,
        key_len,
        offsets,
        lengths,
        n,
        results,
        result_size,
    };
    submit_extents(this_export!(), true, tier, job)
}

/// Submits a job that deletes `n` packed keys from the tier and its storage
/// (a shared tier's storage too, for the blocks this tier knows), reported
/// by tier_poll_finished like any job (kind TIER_JOB_DELETE, status
/// TIER_OK, num_done the keys removed). Per key, `results[i]`: TIER_ITEM_OK
/// (removed: lookups answer TIER_MISS at once, a TIER_EVENT_REMOVED with
/// TIER_REMOVED_DELETED, storage deletes the block as it does an evicted
/// one), TIER_ITEM_MISS (not in the tier), TIER_ITEM_BUSY (TIER_FAIL_BUSY:
/// pinned by tier_pin, being loaded or being stored; left in place).
/// Rejections as for tier_submit_store_extents, with no result.
/// Ownership: `keys` is copied before return; `results` is written before
/// the job is reported. NULL: `keys` when `n` is 0; `results` (no per-key
/// results). Threads: any thread, concurrently with other calls.
#[no_mangle]
pub unsafe extern "C" fn tier_submit_delete(
    tier: *mut tier_t,
    job_id: u64,
    keys: *const u8,
    key_len: usize,
    n: usize,
    results: *mut tier_item_result_t,
    result_size: usize,
) -> tier_status_t {
    status(this_export!(), || {
        let tier = tier_ref(tier)?;
        let keys = boundary::keys(keys, key_len, n)?;
        let sink = results_sink(results, result_size, n)?;
        tier.submit_delete(job_id, keys, key_len, sink)?;
        OK
    })
}

/// Looks up `n` packed keys as tier_lookup does, writing one state per key
/// to `out_states`, and pins every key answered TIER_HIT: its block is not
/// evicted (a store that finds every block pinned fails with
/// TIER_ERR_NO_SPACE instead) nor deleted (TIER_ITEM_BUSY) until tier_unpin
/// is called for it as many times. Pins belong to this tier handle, in this
/// process: on shared storage another process may still delete the stored
/// block (a later load of it then fails TIER_ITEM_MISS).
/// Returns TIER_OK; TIER_ERR_NULL_ARG; TIER_ERR_INVALID_ARG (key_len);
/// TIER_ERR_ALLOC (nothing pinned); TIER_ERR_SHUTDOWN. `out_states` is
/// written only on success.
/// Ownership: both buffers are borrowed for the call.
/// NULL: `keys` and `out_states` may be NULL when `n` is 0.
/// Threads: any thread, concurrently with other calls.
#[no_mangle]
pub unsafe extern "C" fn tier_pin(
    tier: *mut tier_t,
    keys: *const u8,
    key_len: usize,
    n: usize,
    out_states: *mut u8,
) -> tier_status_t {
    status(this_export!(), || {
        let tier = tier_ref(tier)?;
        let keys = boundary::keys(keys, key_len, n)?;
        let out = as_mut_slice(out_states, n, "out_states")?;
        tier.pin_into(keys, key_len, out)?;
        OK
    })
}

/// Drops one tier_pin of each of `n` packed keys. Keys never pinned, or
/// unpinned as often as pinned, are ignored; a handle inherited across
/// fork() does nothing. Returns TIER_OK, or for bad arguments only:
/// TIER_ERR_NULL_ARG, TIER_ERR_INVALID_ARG (key_len).
/// Ownership: `keys` is borrowed for the call. NULL: `keys` when `n` is 0.
/// Threads: any thread, concurrently with other calls.
#[no_mangle]
pub unsafe extern "C" fn tier_unpin(
    tier: *mut tier_t,
    keys: *const u8,
    key_len: usize,
    n: usize,
) -> tier_status_t {
    status(this_export!(), || {
        let tier = tier_ref(tier)?;
        let keys = boundary::keys(keys, key_len, n)?;
        tier.unpin(keys, key_len)?;
        OK
    })
}
