//! The job exports: lookups, touches, submitting stores and loads, polling and
//! waiting for finished jobs, draining and clearing; kept apart from the
//! lifecycle exports (`api`) so each file reads on its own.

use super::api::tier_ref;
use super::boundary::{
    self, as_mut_slice, as_slice, or_default, poll_into, status, this_export, Export, OK,
};
use super::types::*;
use crate::error::bail;
use crate::job_kind::JobKind;
use std::os::fd::AsRawFd;
use std::time::Duration;

/// Looks up `n` keys of `key_len` bytes, packed back to back in `keys`, and
/// writes one state per key to `out_states`, in input order: TIER_HIT (stored
/// and readable), TIER_MISS, or TIER_PENDING (being stored; ask again).
///
/// Never waits for a copy or for storage: the answer comes from the in-memory
/// index. A shared disk tier answers TIER_PENDING for a key it has not seen and
/// asks the file system on a worker; a later lookup gets TIER_HIT or TIER_MISS.
/// Does not change recency (see tier_touch). Needs no memory of its own, so it
/// never fails for lack of it (a shared tier short of memory to ask the file
/// system answers TIER_MISS, or TIER_PENDING and asks on a later lookup).
/// Returns TIER_OK; TIER_ERR_NULL_ARG; TIER_ERR_INVALID_ARG (key_len outside
/// 1..=TIER_MAX_KEY_LEN); TIER_ERR_SHUTDOWN (a handle inherited across fork(),
/// see tier_new). `out_states` is written only on success.
/// Ownership: both buffers are borrowed for the call.
/// NULL: `keys` and `out_states` may be NULL when `n` is 0.
/// Threads: any thread, concurrently with other calls.
#[no_mangle]
pub unsafe extern "C" fn tier_lookup(
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
        tier.lookup_into(keys, key_len, out)?;
        OK
    })
}

/// Makes the stored keys among `n` packed keys the most recently used, the
/// first key most recent of all (so a prefix's head outlives its tail).
/// Unknown keys and keys still being stored are ignored.
///
/// Allocates nothing.
/// Returns TIER_OK; TIER_ERR_NULL_ARG; TIER_ERR_INVALID_ARG (key_len);
/// TIER_ERR_SHUTDOWN (inherited across fork(), see tier_new).
/// Ownership: `keys` is borrowed for the call.
/// NULL: `keys` may be NULL when `n` is 0.
/// Threads: any thread, concurrently with other calls.
#[no_mangle]
pub unsafe extern "C" fn tier_touch(
    tier: *mut tier_t,
    keys: *const u8,
    key_len: usize,
    n: usize,
) -> tier_status_t {
    status(this_export!(), || {
        let tier = tier_ref(tier)?;
        let keys = boundary::keys(keys, key_len, n)?;
        tier.touch(keys, key_len)?;
        OK
    })
}

/// A submit call's job as the caller passed it: its id and `n` packed keys
/// with their block ids.
struct RawJob {
    job_id: u64,
    keys: *const u8,
    key_len: usize,
    block_ids: *const i64,
    n: usize,
}

/// The body of tier_submit_store and tier_submit_load, which differ only in
/// the job's kind.
unsafe fn submit(function: Export, kind: JobKind, tier: *mut tier_t, job: RawJob) -> tier_status_t {
    status(function, || {
        let tier = tier_ref(tier)?;
        let keys = boundary::keys(job.keys, job.key_len, job.n)?;
        let block_ids = as_slice(job.block_ids, job.n, "block_ids")?;
        tier.submit(kind, job.job_id, keys, job.key_len, block_ids)?;
        OK
    })
}

/// Submits a job that copies primary rows `block_ids[i]` into the tier under
/// keys `i` (n keys of key_len bytes, packed). Returns at once; the copy runs
/// on the tier's threads.
///
/// Keys already stored or being stored count as done and are not copied again;
/// duplicate keys in the job are stored once; keys of the job are not evicted
/// while it runs. Room comes from free capacity, then from evicting least
/// recently used blocks that are not being loaded, not being stored, and not
/// keys of a store in flight. If that is not enough the job fails
/// as a whole with TIER_ERR_NO_SPACE and the tier is unchanged. While copying,
/// the new keys look up as TIER_PENDING; on success they become TIER_HIT and
/// most recently used (the first key most recent).
/// The codes of a failed store, by backend: every backend TIER_ERR_NO_SPACE;
/// disk and redis also TIER_ERR_IO (a full device or a write error; an
/// unreachable, silent or refusing server, or a cluster master that is down;
/// the deadline).
/// Returns TIER_OK if accepted: its result is then reported exactly once by
/// tier_poll_finished. A rejected call produces no result: TIER_ERR_NULL_ARG,
/// TIER_ERR_INVALID_ARG (key_len), TIER_ERR_OUT_OF_RANGE (a block id that is
/// negative or not below the row count), TIER_ERR_DUPLICATE_JOB (job_id
/// submitted and not yet polled), TIER_ERR_ALLOC (no memory for the job's copy
/// of its keys and block ids and its planning, whose size grows with n: the
/// tier is unchanged, job_id stays free, and smaller jobs may still succeed),
/// TIER_ERR_SHUTDOWN (a handle inherited across fork(), see tier_new).
/// n = 0 is accepted and reported as a success.
/// Ownership: `keys` and `block_ids` are copied before return. The rows are read
/// until the job is polled: do not modify them before.
/// NULL: `keys` and `block_ids` may be NULL when `n` is 0.
/// Threads: any thread, concurrently with other calls.
#[no_mangle]
pub unsafe extern "C" fn tier_submit_store(
    tier: *mut tier_t,
    job_id: u64,
    keys: *const u8,
    key_len: usize,
    block_ids: *const i64,
    n: usize,
) -> tier_status_t {
    let job = RawJob {
        job_id,
        keys,
        key_len,
        block_ids,
        n,
    };
    submit(this_export!(), JobKind::Store, tier, job)
}

/// Submits a job that copies the blocks of `n` packed keys into primary rows
/// `block_ids[i]`. Returns at once; the copy runs on the tier's threads.
///
/// Blocks are pinned against eviction while read. A key whose store is still in
/// flight is waited for, not failed. At the first key that is not stored the
/// job fails with TIER_ERR_NOT_FOUND; its result's num_done is the number of
/// leading blocks copied. A read is a use: when the job completes, the blocks
/// it copied become the most recently used, its first key most recent of all
/// (as for tier_touch and a store).
/// A stored block found corrupt or gone fails the job with TIER_ERR_CORRUPT or
/// TIER_ERR_NOT_FOUND and its key becomes a MISS (a TIER_EVENT_REMOVED with
/// TIER_REMOVED_CORRUPT or TIER_REMOVED_VANISHED). The codes of a failed
/// load, by backend: memory: TIER_ERR_NOT_FOUND; disk: TIER_ERR_NOT_FOUND (no
/// file), TIER_ERR_CORRUPT (a file that is not this block: wrong type, size,
/// header or checksum), TIER_ERR_IO (a transient error or the deadline);
/// redis: TIER_ERR_NOT_FOUND (no value), TIER_ERR_CORRUPT (a value that is
/// not this block: no kvtier header, a bad checksum, a list, hash or other
/// non-string type), TIER_ERR_IO (an unreachable or silent server, the
/// deadline, a server's refusal). A sealed tier in shared storage reports a
/// block that does not authenticate as TIER_ERR_NOT_FOUND and deletes
/// nothing. A transient storage error
/// fails it with TIER_ERR_IO and keeps the key (and the stored data) until
/// its loads fail that way 3 times in a row, after which the key is a MISS
/// (TIER_REMOVED_UNREADABLE; the data stays in storage, found again by the
/// next open). A load failed at once because storage is known to be
/// unavailable (every I/O thread stuck on a hung device, a Redis server that
/// stopped answering or is being reconnected to) fails with TIER_ERR_IO too
/// but does not count: the key survives an outage the engine retries through.
/// Rows: each row may appear once in `block_ids`; a job naming a row twice is
/// rejected with TIER_ERR_INVALID_ARG. Two load jobs in flight into one row
/// leave that row's contents undefined until both are polled, but neither
/// job fails for it and no stored block is harmed.
/// Returns TIER_OK if accepted (reported exactly once by tier_poll_finished);
/// rejections as for tier_submit_store (plus a repeated row), with no result,
/// including TIER_ERR_ALLOC (the tier is then unchanged).
/// Ownership: `keys` and `block_ids` are copied before return. The destination
/// rows are written until the job is polled: do not read them before.
/// NULL: `keys` and `block_ids` may be NULL when `n` is 0.
/// Threads: any thread, concurrently with other calls.
#[no_mangle]
pub unsafe extern "C" fn tier_submit_load(
    tier: *mut tier_t,
    job_id: u64,
    keys: *const u8,
    key_len: usize,
    block_ids: *const i64,
    n: usize,
) -> tier_status_t {
    let job = RawJob {
        job_id,
        keys,
        key_len,
        block_ids,
        n,
    };
    submit(this_export!(), JobKind::Load, tier, job)
}

/// Moves up to `cap` finished job results, oldest first, into `out` and writes
/// their number to `*out_n` (0 if none is ready). Each accepted job is reported
/// exactly once; afterwards its job id may be reused.
///
/// `result_size` is the caller's sizeof(tier_job_result_t): result i is
/// written at byte offset i * result_size, min(result_size, the library's
/// size) bytes of it, so a program built against an older or newer header
/// gets exactly the fields it knows.
/// Never blocks (see tier_wait) and allocates nothing: room for every accepted
/// job's result is made when it is submitted. Returns TIER_OK; TIER_ERR_NULL_ARG;
/// TIER_ERR_INVALID_ARG (cap 0, result_size below TIER_JOB_RESULT_SIZE_V1, or
/// cap * result_size above PTRDIFF_MAX);
/// TIER_ERR_SHUTDOWN (inherited across fork(), see tier_new). Outputs are
/// written only on success.
/// Ownership: `out` and `out_n` are borrowed for the call.
/// NULL: `out` and `out_n` are required.
/// Threads: any thread; concurrent pollers each get distinct results.
#[no_mangle]
pub unsafe extern "C" fn tier_poll_finished(
    tier: *mut tier_t,
    out: *mut tier_job_result_t,
    result_size: usize,
    cap: usize,
    out_n: *mut usize,
) -> tier_status_t {
    status(this_export!(), || {
        let tier = tier_ref(tier)?;
        let v1 = TIER_JOB_RESULT_SIZE_V1;
        poll_into(out, result_size, cap, v1, out_n, "a result", |max, put| {
            tier.poll_with(max, |r| put(&r.into()));
            Ok(())
        })
    })
}

/// Waits until at least one finished result is ready to poll, or `timeout_ms`
/// milliseconds pass.
///
/// Returns TIER_OK when a result is ready, TIER_TIMEOUT (positive, not an
/// error) on timeout, TIER_ERR_NULL_ARG, TIER_ERR_SHUTDOWN at once for a handle
/// inherited across fork() (see tier_new). Does not consume results. With
/// nothing in flight it waits the full timeout (another thread may submit).
/// Threads: any thread, concurrently with other calls; it is the call that
/// blocks, for the caller's own thread only.
#[no_mangle]
pub unsafe extern "C" fn tier_wait(tier: *mut tier_t, timeout_ms: u32) -> tier_status_t {
    status(this_export!(), || {
        let tier = tier_ref(tier)?;
        Ok(if tier.wait(Duration::from_millis(timeout_ms as u64)) {
            TIER_OK
        } else {
            TIER_TIMEOUT
        })
    })
}

/// A file descriptor to wait on (poll, epoll, select) for finished results:
/// it is readable exactly while at least one result waits for
/// tier_poll_finished.
///
/// The rule: when a job completes and the results queue goes from empty to
/// not empty, the descriptor becomes readable; when a tier_poll_finished call
/// takes the last queued result, it becomes unreadable again (the library
/// resets it). A tier_poll_finished that leaves results queued (cap smaller
/// than their number) leaves it readable. Both transitions happen under the
/// queue's lock, so a result completed while the caller polls is either
/// returned by that poll or leaves the descriptor readable: no wake-up is
/// lost. It can be briefly readable with nothing to take only when another
/// thread polled the results first (that poll then returns 0).
/// Re-arming: nothing to do; wait on it again after polling. With
/// level-triggered waits (poll, select, epoll without EPOLLET) poll once per
/// wake-up; with EPOLLET call tier_poll_finished until it returns fewer than
/// cap results, since no new edge comes while results remain queued.
/// tier_wait and tier_drain work as before, independently of it, and do not
/// change it.
/// Returns the descriptor (>= 0): an eventfd (EFD_NONBLOCK | EFD_CLOEXEC)
/// made by the first call, which is readable at once if results are already
/// queued; every later call returns the same one. On failure a negative
/// status: TIER_ERR_NULL_ARG; TIER_ERR_SHUTDOWN (a handle inherited across
/// fork(), see tier_new); TIER_ERR_IO (no descriptor left: EMFILE, ENFILE);
/// TIER_ERR_ALLOC. A failed call creates nothing; a later one may succeed.
/// Ownership: the tier owns the descriptor and closes it in tier_free. The
/// caller must not read, write or close it (reading it would hide results
/// from later waits); remove it from an epoll set before tier_free.
/// Fork: a forked child inherits the number, which still refers to the
/// parent's eventfd: the child must not wait on it. tier_free on the
/// inherited handle points it at /dev/null, so the child can no longer
/// affect the parent's.
/// Threads: any thread, concurrently with other calls.
#[no_mangle]
pub unsafe extern "C" fn tier_completion_fd(tier: *mut tier_t) -> i32 {
    let function = this_export!();
    or_default(function, TIER_ERR_PANIC, || {
        let fd = tier_ref(tier).and_then(|tier| tier.completion_fd());
        match fd {
            Ok(fd) => fd.as_raw_fd(),
            Err(e) => {
                boundary::record_error(function, &e);
                e.kind().code()
            }
        }
    })
}

/// Has the library add 1 to the caller's eventfd `fd` each time a job of
/// `job_kind` (TIER_JOB_STORE, TIER_JOB_LOAD or TIER_JOB_DELETE) completes,
/// from now until tier_free: a caller that waits per kind (one descriptor for
/// stores, one for loads) is woken by the library's own thread, with no
/// thread of its own between tier_completion_fd and its waiters.
///
/// The rule: the write comes after the job's result is queued, so a
/// tier_poll_finished made after the descriptor was seen readable returns
/// that result (unless another thread polled it first). One write per job;
/// the caller reads the descriptor to reset it, as usual for an eventfd, and
/// may read it at any time (nothing is lost: results wait in the queue).
/// Jobs completed before the call are not counted. The same descriptor may
/// be given for several kinds (one call each); the completion descriptor
/// works as before beside it.
/// Returns TIER_OK; TIER_ERR_NULL_ARG; TIER_ERR_INVALID_ARG (an unknown
/// job_kind; `fd` not an open eventfd; already 16 descriptors on this tier);
/// TIER_ERR_IO (no descriptor left for the duplicate: EMFILE, ENFILE);
/// TIER_ERR_ALLOC; TIER_ERR_SHUTDOWN (a handle inherited across fork(), see
/// tier_new). A failed call registers nothing.
/// Ownership: the tier writes a duplicate of `fd` (close-on-exec) and closes
/// it in tier_free; the caller keeps `fd` and may close it at any time (the
/// eventfd then lives on until tier_free). Nothing is written after tier_free
/// returns.
/// Threads: any thread, concurrently with other calls. (KVTIER_1.1)
#[no_mangle]
pub unsafe extern "C" fn tier_add_notify_fd(
    tier: *mut tier_t,
    job_kind: u32,
    fd: i32,
) -> tier_status_t {
    status(this_export!(), || {
        let tier = tier_ref(tier)?;
        let Some(kind) = JobKind::from_code(job_kind) else {
            bail!(
                InvalidArg,
                "job_kind: {job_kind} is not TIER_JOB_STORE, TIER_JOB_LOAD or TIER_JOB_DELETE"
            );
        };
        if fd < 0 {
            bail!(InvalidArg, "fd: {fd} is not a descriptor");
        }
        // SAFETY: borrowed only for the call, which duplicates it; a number
        // that is not open fails the duplicate's check with a clear error.
        let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
        tier.add_notify_fd(kind, fd)?;
        OK
    })
}

/// Blocks until every job accepted so far has completed and its result is
/// queued for tier_poll_finished (the results are not consumed).
///
/// Returns TIER_OK; TIER_ERR_NULL_ARG; TIER_ERR_SHUTDOWN at once for a handle
/// inherited across fork() (see tier_new), whose jobs can never complete.
/// Threads: any thread; jobs submitted by other threads meanwhile are waited
/// for too.
#[no_mangle]
pub unsafe extern "C" fn tier_drain(tier: *mut tier_t) -> tier_status_t {
    status(this_export!(), || {
        tier_ref(tier)?.drain();
        OK
    })
}

/// Drops every stored block. Blocks in use by jobs in flight look up as MISS at
/// once and are released when their jobs finish; those jobs complete and are
/// reported as usual.
///
/// On shared storage (disk shared=true, redis sharing=shared) it clears the
/// tier's namespace for every process: storage's clear generation is raised,
/// the older generation's blocks are deleted (best effort), and the call
/// blocks until two probe_ttl_ms (each at least 250 ms) have passed since
/// the raise (2 s by default). When it returns, no tier of that namespace, in any process,
/// answers TIER_HIT for or loads a block stored before the call. Blocks of
/// other namespaces are untouched.
///
/// Returns TIER_OK; TIER_ERR_NULL_ARG; TIER_ERR_SHUTDOWN (inherited across
/// fork(), see tier_new); on shared storage TIER_ERR_IO (or TIER_ERR_CORRUPT)
/// when the generation could not be raised (this tier's blocks are dropped,
/// other processes may still read theirs) or not every old block could be
/// deleted (none is readable any more); the message says which.
/// Threads: any thread, concurrently with other calls.
#[no_mangle]
pub unsafe extern "C" fn tier_clear(tier: *mut tier_t) -> tier_status_t {
    status(this_export!(), || {
        tier_ref(tier)?.clear()?;
        OK
    })
}
