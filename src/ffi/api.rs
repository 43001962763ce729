//! The exported functions. Each body is a few lines: convert arguments through
//! `boundary`, call the core, map the result.

use super::boundary::{
    self, as_mut, as_mut_slice, as_ref, as_slice, free_handle, or_default, sized_out, status, utf8,
    OK,
};
use super::types::*;
use crate::config::TierConfig;
use crate::engine::Tier;
use crate::error::{bail, Result};
use crate::primary::PrimaryBuffer;
use std::ffi::{c_char, c_void};
use std::os::fd::AsRawFd;
use std::time::Duration;

/// The tier behind a handle. Every export that takes a tier (except
/// tier_free) goes through here, so a handle inherited across fork() fails
/// every call at once with TIER_ERR_SHUTDOWN, before any lock is taken: in the
/// child the tier's I/O threads do not exist, so a submit would never be
/// reported and a drain would never return.
unsafe fn tier_ref<'a>(tier: *mut tier_t) -> Result<&'a Tier> {
    let tier = as_ref(tier as *const Tier, "tier")?;
    tier.check_process()?;
    Ok(tier)
}

static VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), "\0");

/// The library version, e.g. "0.1.0" (KVTIER_VERSION_STRING of the header the
/// library was built with).
///
/// Returns a static NUL-terminated string; never NULL, never freed.
/// Threads: any thread.
#[no_mangle]
pub extern "C" fn tier_version() -> *const c_char {
    VERSION.as_ptr() as *const c_char
}

/// Describes the library's ABI: its TIER_ABI_VERSION and the size of each
/// struct it writes. A consumer that loads the library at run time (dlopen,
/// ctypes) calls it first and refuses a library whose abi_version differs
/// from its header's TIER_ABI_VERSION.
///
/// Writes min(`out_size`, the library's sizeof(tier_abi_info_t)) bytes to
/// `*out`; pass sizeof(tier_abi_info_t) (bytes past the library's size are
/// left as they are).
/// Returns TIER_OK; TIER_ERR_NULL_ARG; TIER_ERR_INVALID_ARG (`out_size` below
/// TIER_ABI_INFO_SIZE_V1). `*out` is written only on success.
/// Threads: any thread; needs no tier.
#[no_mangle]
pub unsafe extern "C" fn tier_abi_info(
    out: *mut tier_abi_info_t,
    out_size: usize,
) -> tier_status_t {
    status("tier_abi_info", || {
        let mut out = sized_out(out, out_size, 1, TIER_ABI_INFO_SIZE_V1, "out")?;
        out.write(0, &tier_abi_info_t::current());
        OK
    })
}

/// The name of a status code, e.g. "TIER_ERR_NO_SPACE" for -5.
///
/// Returns a static NUL-terminated string; "TIER_UNKNOWN_STATUS" for a code this
/// version does not define. Never NULL, never freed.
/// Threads: any thread.
#[no_mangle]
pub extern "C" fn tier_status_str(status: tier_status_t) -> *const c_char {
    let name = match status {
        TIER_OK => c"TIER_OK",
        TIER_TIMEOUT => c"TIER_TIMEOUT",
        _ => crate::ErrorKind::from_code(status).map_or(c"TIER_UNKNOWN_STATUS", |k| k.c_name()),
    };
    name.as_ptr()
}

/// Copies the message of this thread's most recent failed call into `buf`.
///
/// Returns the message's full length in bytes, excluding the NUL (0 if no call
/// on this thread has failed). Writes at most `cap - 1` bytes plus a NUL, so a
/// return value >= `cap` means the copy was truncated.
/// Ownership: `buf` is borrowed for the call.
/// NULL: `buf` may be NULL (or `cap` 0) to query the length only.
/// Threads: per thread; a successful call does not clear the message.
#[no_mangle]
pub unsafe extern "C" fn tier_last_error(buf: *mut c_char, cap: usize) -> usize {
    or_default("tier_last_error", 0, || {
        boundary::copy_last_error(boundary::text_out(buf, cap))
    })
}

/// Creates a configuration with the defaults: backend "memory", capacity_bytes
/// 1 GiB, io_threads chosen from the core count.
///
/// Returns a new builder, or NULL if allocation failed. The caller owns it and
/// frees it with tier_config_free; tier_new does not take it over.
/// Threads: any thread.
#[no_mangle]
pub extern "C" fn tier_config_new() -> *mut tier_config_t {
    or_default("tier_config_new", std::ptr::null_mut(), || {
        Box::into_raw(Box::new(TierConfig::default())) as *mut tier_config_t
    })
}

/// Sets one configuration option from strings.
///
/// Keys: "backend" ("memory" or "disk"); "capacity_bytes" (bytes, or a number
/// with KiB, MiB, GiB or TiB); "io_threads" (1..=256; default min(cores, 4) for
/// memory, 32 for disk, 8 for redis); "idle_spin_us" (0..=1000000: how long idle workers poll
/// for work before sleeping).
/// Memory backend: "prefault" ("off": no resident memory until stores write
/// it; "background", the default: a low-priority thread keeps a window of
/// arena ahead of the stored slots resident, an eighth of the capacity within
/// 64 MiB..1 GiB; "full": the whole capacity, from tier_new on). Other
/// backends accept only "off"; anything else fails tier_new with
/// TIER_ERR_CONFIG.
/// Disk backend: "path" (directory, created owner-only if missing, parent must
/// exist); "namespace" (names the block layout: model, dtype, geometry; blocks
/// of other namespaces or block sizes are never loaded); "o_direct" ("auto",
/// "on", "off"); "block_header" ("auto": each block file's header in its
/// extended attribute where a local file system keeps them, so a file is
/// its payload alone, else in the file; "xattr": the attribute, or tier_new
/// fails; "file": in the file; any form is read whatever this says); "sync" ("none", or "data": fsync before a block is published);
/// "shared" ("false", or "true": several processes or hosts use the directory;
/// see tier_lookup); "probe_ttl_ms" (shared: how long a negative answer from
/// the file system is reused, default 1000); "prepare_dirs" ("false", or
/// "true": create all 4096 fan-out directories at open rather than on first
/// use, so early stores do not pay for a mkdir).
/// Deadline (disk, redis): "io_timeout_ms" ("auto", the default, or
/// 0..=600000, 0: none): a block's storage call past it fails its job with
/// TIER_ERR_IO on time. Disk "auto" reads the directory's file system type:
/// network, cluster and FUSE file systems (NFS, SMB, Lustre, GPFS, BeeGFS,
/// CephFS, FUSE, 9p, AFS, ...) and unknown ones get 10000, local ones
/// (ext4, xfs, btrfs, f2fs, ..., tmpfs) none, so loads go straight into the
/// row; tier_describe says which and why. Also the Redis backend's deadline
/// ("auto": 3000; it must not be 0).
/// Events: "events" ("false", or "true": record block events for
/// tier_poll_events); "events_capacity" (1..=4194304, default 65536: events
/// held until polled, 160 bytes each, allocated at tier_new; beyond it the
/// oldest are dropped and reported as TIER_EVENT_LOST).
/// Sealing (disk, redis): "seal_key" (64 hex digits: a tenant's 256-bit key;
/// blocks are encrypted and authenticated with AES-256-GCM and named by
/// HMAC-SHA-256 of their key, so only holders of the key can read, find or
/// forge them) or "seal_key_file" (a file holding the 64 hex digits, refused
/// if group or others may access it); not both; the memory backend refuses
/// them at tier_new. The key never appears in a message, tier_describe,
/// metrics or events, and is wiped when the tier and the builder are freed
/// (the caller's own copy of `value` is the caller's to wipe).
/// Returns TIER_OK; TIER_ERR_CONFIG for an unknown key, a bad value or non-UTF-8
/// text (the configuration is then unchanged); TIER_ERR_NULL_ARG.
/// Ownership: `key` and `value` are copied; the caller keeps them.
/// NULL: every argument is required.
/// Threads: one thread at a time per builder.
#[no_mangle]
pub unsafe extern "C" fn tier_config_set(
    cfg: *mut tier_config_t,
    key: *const c_char,
    value: *const c_char,
) -> tier_status_t {
    status("tier_config_set", || {
        let cfg = as_mut(cfg as *mut TierConfig, "cfg")?;
        cfg.set(utf8(key, "key")?, utf8(value, "value")?)?;
        OK
    })
}

/// Destroys a configuration builder.
///
/// Ownership: takes `cfg` back; it must not be used afterwards.
/// NULL: a no-op.
/// Threads: not concurrently with other calls on `cfg`.
#[no_mangle]
pub unsafe extern "C" fn tier_config_free(cfg: *mut tier_config_t) {
    free_handle::<_, TierConfig>("tier_config_free", cfg)
}

/// Creates a tier over the caller's primary buffer of `primary_len` bytes, cut
/// into rows of `block_bytes` (the row stride). Starts the I/O threads.
///
/// Returns TIER_OK and writes the handle to `*out`; otherwise `*out` is not
/// written and nothing is left behind. The codes, by backend:
/// - every backend: TIER_ERR_NULL_ARG (`primary` or `out`);
///   TIER_ERR_INVALID_ARG (block_bytes 0 or larger than the buffer,
///   primary_len not a multiple of block_bytes); TIER_ERR_CONFIG (a setting
///   the backend refuses, capacity below one block); TIER_ERR_ALLOC (memory
///   for the storage or index, the I/O threads, or registering the fork
///   handler); TIER_ERR_PANIC.
/// - disk: TIER_ERR_CONFIG (a `path` that cannot be a tier's directory: not a
///   directory, not creatable, not writable, or in use by another tier);
///   TIER_ERR_IO (the directory could not be locked, probed or scanned for
///   want of file descriptors or kernel memory, or could not be read:
///   nothing was changed on disk, retry when the condition clears).
/// - redis: TIER_ERR_CONFIG (no usable url, several seeds for a single
///   server, io_timeout_ms 0, a refused password or user); TIER_ERR_IO (no
///   seed answers, or none gives a cluster's slot map; the message names the
///   nodes that failed). A cluster with a master down opens: that master's
///   slots fail their jobs with TIER_ERR_IO until it or a replica serves
///   them.
///
/// Reopening a disk directory deletes only temporary files of interrupted
/// stores and this tier's own blocks at their own names that it read and
/// found bad (a sealed tier with shared=true: none); another tenant's
/// files, and any file it could not read, stay on disk, unindexed.
/// Ownership: `cfg` is read, not taken (free it when convenient). The primary
/// buffer stays the caller's and must outlive the tier; the tier reads a row
/// only during a store of it and writes a row only during a load into it, until
/// that job is polled. The handle is freed with tier_free.
/// NULL: `cfg` NULL means defaults; `primary` and `out` are required.
/// Threads: any thread.
/// Fork: a tier belongs to the process that created it. In a child made by
/// fork() (which copies only the calling thread, so none of the tier's I/O
/// threads), every call on an inherited handle fails at once with
/// TIER_ERR_SHUTDOWN and tier_last_error names the owning process; create a
/// new tier in the child. tier_free on the inherited handle is safe (see
/// there), as is abandoning it. The parent's tier is unaffected. Children
/// made without the pthread_atfork handlers (glibc's _Fork, a raw clone) are
/// not detected and must not use the handle.
#[no_mangle]
pub unsafe extern "C" fn tier_new(
    cfg: *const tier_config_t,
    primary: *mut c_void,
    primary_len: usize,
    block_bytes: usize,
    out: *mut *mut tier_t,
) -> tier_status_t {
    status("tier_new", || {
        let defaults = TierConfig::default();
        let cfg = if cfg.is_null() {
            &defaults
        } else {
            as_ref(cfg as *const TierConfig, "cfg")?
        };
        let out = as_mut(out, "out")?;
        let primary = PrimaryBuffer::new(primary as *mut u8, primary_len, block_bytes)?;
        let tier = Tier::new(cfg, primary)?;
        *out = Box::into_raw(Box::new(tier)) as *mut tier_t;
        OK
    })
}

/// Destroys a tier: stops the I/O threads after the block each is copying,
/// abandons queued jobs (they are not reported), and frees everything.
///
/// When it returns, the library never touches the primary buffer again.
/// A disk storage call stuck past io_timeout_ms (a hung device) is not waited
/// for: its thread is left behind and ends when the call returns (its job was
/// reported already; it publishes nothing). Only the kernel may still read a
/// row such a stuck write was given (O_DIRECT from an aligned row): unmapped,
/// that write fails with EFAULT. Until those calls return, the disk
/// directory stays locked (a new tier on it fails with TIER_ERR_IO).
/// Ownership: takes `tier`; it must not be used afterwards.
/// NULL: a no-op.
/// Threads: must be the last call on `tier`, with no call on it in progress.
/// Fork: on a handle inherited by a forked child, returns at once without
/// waiting for threads (they exist only in the parent) or taking locks (a
/// parent thread may have held one at the fork). It releases the child's
/// copy of the memory backend's storage and of the disk backend's directory
/// lock, and leaks the rest of the child's copy of the tier (the index, the
/// queued jobs) until the child exits. The parent's tier is unaffected.
#[no_mangle]
pub unsafe extern "C" fn tier_free(tier: *mut tier_t) {
    free_handle::<_, Tier>("tier_free", tier)
}

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
    status("tier_lookup", || {
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
    status("tier_touch", || {
        let tier = tier_ref(tier)?;
        let keys = boundary::keys(keys, key_len, n)?;
        tier.touch(keys, key_len)?;
        OK
    })
}

#[allow(clippy::too_many_arguments)]
unsafe fn submit(
    function: &str,
    store: bool,
    tier: *mut tier_t,
    job_id: u64,
    keys: *const u8,
    key_len: usize,
    block_ids: *const i64,
    n: usize,
) -> tier_status_t {
    status(function, || {
        let tier = tier_ref(tier)?;
        let keys = boundary::keys(keys, key_len, n)?;
        let block_ids = as_slice(block_ids, n, "block_ids")?;
        if store {
            tier.submit_store(job_id, keys, key_len, block_ids)?;
        } else {
            tier.submit_load(job_id, keys, key_len, block_ids)?;
        }
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
    submit(
        "tier_submit_store",
        true,
        tier,
        job_id,
        keys,
        key_len,
        block_ids,
        n,
    )
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
    submit(
        "tier_submit_load",
        false,
        tier,
        job_id,
        keys,
        key_len,
        block_ids,
        n,
    )
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
/// TIER_ERR_INVALID_ARG (cap 0, result_size below TIER_JOB_RESULT_SIZE_V1);
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
    status("tier_poll_finished", || {
        let tier = tier_ref(tier)?;
        let out_n = as_mut(out_n, "out_n")?;
        let mut out = sized_out(out, result_size, cap, TIER_JOB_RESULT_SIZE_V1, "out")?;
        if cap == 0 {
            bail!(InvalidArg, "cap is 0: no room for a result");
        }
        let mut n = 0;
        tier.poll_with(out.len(), |r| {
            out.write(n, &r.into());
            n += 1;
        });
        *out_n = n;
        OK
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
    status("tier_wait", || {
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
    or_default("tier_completion_fd", TIER_ERR_PANIC, || {
        let fd = tier_ref(tier).and_then(|tier| tier.completion_fd());
        match fd {
            Ok(fd) => fd.as_raw_fd(),
            Err(e) => {
                boundary::record_error("tier_completion_fd", &e);
                e.kind().code()
            }
        }
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
    status("tier_drain", || {
        tier_ref(tier)?.drain();
        OK
    })
}

/// Drops every stored block. Blocks in use by jobs in flight look up as MISS at
/// once and are released when their jobs finish; those jobs complete and are
/// reported as usual.
///
/// Returns TIER_OK; TIER_ERR_NULL_ARG; TIER_ERR_SHUTDOWN (inherited across
/// fork(), see tier_new).
/// Threads: any thread, concurrently with other calls.
#[no_mangle]
pub unsafe extern "C" fn tier_clear(tier: *mut tier_t) -> tier_status_t {
    status("tier_clear", || {
        tier_ref(tier)?.clear();
        OK
    })
}

/// Moves up to `cap` block events, oldest first, into `out` and writes their
/// number to `*out_n` (0 if none is waiting). Events are recorded only by a
/// tier created with the config key events=true.
///
/// A block's events: TIER_EVENT_STORED once when it becomes readable (a store
/// committed it; or, with reason TIER_STORED_RECOVERED / TIER_STORED_FOUND,
/// storage already held it at tier_new, or a shared tier's lookup found it),
/// then TIER_EVENT_REMOVED once when it stops being readable, with the reason.
/// A key's events come in the order they happened (its STORED before its
/// REMOVED). Blocks being stored, and stores that fail, produce no event.
/// The ring holds events_capacity events; when it is full the oldest are
/// dropped (never blocking a job), counted in tier_stats_t.events_dropped,
/// and reported in their place by one TIER_EVENT_LOST event: the consumer's
/// view is stale and must be rebuilt (e.g. forget every block it mirrors).
///
/// `event_size` is the caller's sizeof(tier_event_t): event i is written at
/// byte offset i * event_size, min(event_size, the library's size) bytes of
/// it.
/// Never blocks on a job, allocates nothing, and holds the tier's index lock
/// for a few dozen events at a time. Returns TIER_OK; TIER_ERR_NULL_ARG;
/// TIER_ERR_INVALID_ARG (cap 0, event_size below TIER_EVENT_SIZE_V1);
/// TIER_ERR_CONFIG (the tier was created
/// without events=true); TIER_ERR_SHUTDOWN (inherited across fork(), see
/// tier_new). Outputs are written only on success.
/// Ownership: `out` and `out_n` are borrowed for the call.
/// NULL: `out` and `out_n` are required.
/// Threads: any thread; concurrent pollers each get distinct events (order
/// them by `seq`).
#[no_mangle]
pub unsafe extern "C" fn tier_poll_events(
    tier: *mut tier_t,
    out: *mut tier_event_t,
    event_size: usize,
    cap: usize,
    out_n: *mut usize,
) -> tier_status_t {
    status("tier_poll_events", || {
        let tier = tier_ref(tier)?;
        let out_n = as_mut(out_n, "out_n")?;
        let mut out = sized_out(out, event_size, cap, TIER_EVENT_SIZE_V1, "out")?;
        if cap == 0 {
            bail!(InvalidArg, "cap is 0: no room for an event");
        }
        let mut n = 0;
        tier.poll_events_with(out.len(), |e| {
            out.write(n, &e.into());
            n += 1;
        })?;
        *out_n = n;
        OK
    })
}

/// Copies a one-line description of the tier into `buf`: library version,
/// backend and its storage choices (e.g. whether O_DIRECT is in use and why),
/// I/O threads. For logs.
///
/// Returns the description's full length in bytes, excluding the NUL. Writes
/// at most `cap - 1` bytes plus a NUL. Returns 0 and writes nothing if `tier`
/// is NULL or was inherited across fork() (see tier_new); tier_last_error
/// then says which (a description is never empty).
/// NULL: `buf` may be NULL (or `cap` 0) to query the length only.
/// Threads: any thread, concurrently with other calls.
#[no_mangle]
pub unsafe extern "C" fn tier_describe(tier: *mut tier_t, buf: *mut c_char, cap: usize) -> usize {
    or_default("tier_describe", 0, || match tier_ref(tier) {
        Ok(tier) => boundary::copy_text(&tier.describe(), boundary::text_out(buf, cap)),
        Err(e) => {
            boundary::record_error("tier_describe", &e);
            0
        }
    })
}

/// Copies the tier's metrics into `buf` as Prometheus text (exposition
/// format 0.0.4, what a `/metrics` endpoint serves): the counters and gauges
/// of tier_stats (kvtier_lookups_total, kvtier_jobs_total{kind,outcome},
/// kvtier_transferred_bytes_total{kind}, kvtier_used_bytes, ...) and two
/// histograms by job kind (kind="store"|"load"): kvtier_job_latency_seconds
/// (submit to completion, one observation per job) and
/// kvtier_block_io_seconds (worker time per block moved through the backend),
/// with fixed buckets from 100 ns to 100 s (1, 2.5, 5 per decade). Every
/// sample carries backend="memory"|"disk"|"redis", and namespace="..." when
/// the tier has a namespace. Each family has # HELP and # TYPE lines.
///
/// Returns the text's full length in bytes, excluding the NUL. Writes at most
/// `cap - 1` bytes plus a NUL, so a return value >= `cap` means the copy was
/// truncated: call again with a buffer of at least the returned length + 1
/// (the length may grow between calls as counters grow). Returns 0 and writes
/// nothing if `tier` is NULL or was inherited across fork() (see tier_new);
/// tier_last_error then says which (the text is never empty).
/// Recording the histograms takes no lock and allocates nothing; this call
/// allocates the text (a few tens of KiB) and reads the counters.
/// NULL: `buf` may be NULL (or `cap` 0) to query the length only.
/// Threads: any thread, concurrently with other calls.
#[no_mangle]
pub unsafe extern "C" fn tier_metrics(tier: *mut tier_t, buf: *mut c_char, cap: usize) -> usize {
    or_default("tier_metrics", 0, || match tier_ref(tier) {
        Ok(tier) => boundary::copy_text(&tier.metrics(), boundary::text_out(buf, cap)),
        Err(e) => {
            boundary::record_error("tier_metrics", &e);
            0
        }
    })
}

/// Writes a snapshot of the tier's state and counters to `*out`.
///
/// `out_size` is the caller's sizeof(tier_stats_t): the library writes
/// min(out_size, its own size) bytes, so a program built against an older
/// header is never written past its struct, and one built against a newer
/// header finds the fields this library lacks as it left them.
/// Returns TIER_OK; TIER_ERR_NULL_ARG; TIER_ERR_INVALID_ARG (`out_size` below
/// TIER_STATS_SIZE_V1); TIER_ERR_SHUTDOWN (inherited across fork(), see
/// tier_new). `*out` is written only on success.
/// Threads: any thread, concurrently with other calls.
#[no_mangle]
pub unsafe extern "C" fn tier_stats(
    tier: *mut tier_t,
    out: *mut tier_stats_t,
    out_size: usize,
) -> tier_status_t {
    status("tier_stats", || {
        let tier = tier_ref(tier)?;
        let mut out = sized_out(out, out_size, 1, TIER_STATS_SIZE_V1, "out")?;
        out.write(0, &tier.stats());
        OK
    })
}
