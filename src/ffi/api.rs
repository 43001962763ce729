//! The exported functions of a tier's lifetime and configuration: version,
//! status names, the last error, config handles, tier_new and tier_free. Each
//! body is a few lines: convert arguments through `boundary`, call the core,
//! map the result (the job exports are in `api_jobs`, observing in `api_observe`).

use super::boundary::{
    self, as_mut, as_ref, free_handle, or_default, sized_out, status, this_export, utf8, OK,
};
use super::types::*;
use crate::config::TierConfig;
use crate::engine::Tier;
use crate::error::Result;
use crate::primary::PrimaryBuffer;
use std::ffi::{c_char, c_void};

/// The tier behind a handle. Every export that takes a tier (except
/// tier_free) goes through here, so a handle inherited across fork() fails
/// every call at once with TIER_ERR_SHUTDOWN, before any lock is taken: in the
/// child the tier's I/O threads do not exist, so a submit would never be
/// reported and a drain would never return.
pub(super) unsafe fn tier_ref<'a>(tier: *mut tier_t) -> Result<&'a Tier> {
    let tier = as_ref(tier as *const Tier, "tier")?;
    tier.check_process()?;
    Ok(tier)
}

static VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), "\0");

/// The library version, e.g. "0.2.0" (KVTIER_VERSION_STRING of the header the
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
/// TIER_ABI_INFO_SIZE_V1 or above PTRDIFF_MAX). `*out` is written only on
/// success.
/// Threads: any thread; needs no tier.
#[no_mangle]
pub unsafe extern "C" fn tier_abi_info(
    out: *mut tier_abi_info_t,
    out_size: usize,
) -> tier_status_t {
    status(this_export!(), || {
        let out = sized_out(out, out_size, 1, TIER_ABI_INFO_SIZE_V1, "out")?;
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
    or_default(this_export!(), 0, || {
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
    or_default(this_export!(), std::ptr::null_mut(), || {
        Box::into_raw(Box::new(TierConfig::default())) as *mut tier_config_t
    })
}

/// Sets one configuration option from strings. Every key, with its default,
/// is in docs/configuration.md (tests/config_docs.rs checks this list too).
///
/// Keys: "backend" ("memory", the default; "disk"; "redis", also "valkey");
/// "capacity_bytes" (bytes, or a number with KiB, MiB, GiB or TiB; default
/// 1GiB); "io_threads" (1..=256; default min(cores, 4) for memory, 32 for
/// disk, 8 for redis); "idle_spin_us" (0..=1000000, default 50: how long idle
/// workers poll for work before sleeping).
/// Memory backend: "prefault" ("off": no resident memory until stores write
/// it; "background", the default: a low-priority thread keeps a window of
/// arena ahead of the stored slots resident, an eighth of the capacity within
/// 64 MiB..1 GiB; "full": the whole capacity, from tier_new on). Other
/// backends accept only "off"; anything else fails tier_new with
/// TIER_ERR_CONFIG. "persist_path" (a directory on tmpfs or hugetlbfs,
/// created owner-only if missing: the arena and its index live there in a
/// file per namespace, mapped shared, so that the next tier_new over the
/// same directory and namespace, after a crash or a restart, finds every
/// block that was completely stored; one process at a time; not with
/// "shared"; default none: the arena dies with the process; a file of
/// another namespace or format is refused with TIER_ERR_CONFIG, one of
/// another geometry is made anew: docs/memory.md).
/// Disk and Redis: "namespace" (what the blocks mean: model and revision,
/// dtype, tokens per block, parallel layout, rank; blocks of other
/// namespaces or block sizes are never loaded; required on shared storage,
/// disk "shared"="true" or redis "sharing"="shared", where tier_new fails
/// with TIER_ERR_CONFIG without one: docs/sharing.md);
/// "probe_ttl_ms" (shared storage: how long a "not stored" answer is reused,
/// and how long, at least 250 ms, the namespace's clear generation is
/// trusted before it is read again; tier_clear returns after twice that;
/// 0..=3600000, default 1000).
/// Disk backend: "path" (directory, created owner-only if missing, parent must
/// exist; required); "o_direct" ("auto", the default, "on", "off");
/// "block_header" ("auto", the default: each block file's header in its
/// extended attribute where a local file system keeps them, so a file is
/// its payload alone, else in the file; "xattr": the attribute, or tier_new
/// fails; "file": in the file; any form is read whatever this says); "sync"
/// ("none", the default, or "data": fsync before a block is published);
/// "shared" ("false", or "true": several processes or hosts use the directory;
/// see tier_lookup); "prepare_dirs" ("false", or "true": create all 256
/// fan-out directories at open rather than on first use, so early stores do
/// not pay for a mkdir).
/// Redis backend: "url" ("redis://[user[:password]@]host[:port][/db]", or
/// rediss:// for TLS; several seeds of a cluster comma-separated; required);
/// "cluster" ("auto", the default: ask the server; "on"; "off"); "sharing"
/// ("owned", the default: this tier's keys, deleted when evicted; "shared":
/// one keyspace for a fleet, never deleted by this tier); "key_prefix" (the
/// first part of every key name, 1 to 64 bytes without braces, default
/// "kvtier"); "ttl_s" (expiry of stored blocks in seconds, default 0: none);
/// "connections" (1..=1024 per server node, default one per I/O thread).
/// Deadline (disk, redis): "io_timeout_ms" ("auto", the default, or
/// 0..=600000, 0: none): a block's storage call past it fails its job with
/// TIER_ERR_IO on time. Disk "auto" reads the directory's file system type:
/// network, cluster and FUSE file systems (NFS, SMB, Lustre, GPFS, BeeGFS,
/// CephFS, FUSE, 9p, AFS, ...) and unknown ones get 10000, local ones
/// (ext4, xfs, btrfs, f2fs, ..., tmpfs) none, so loads go straight into the
/// row; tier_describe says which and why. Redis "auto" is 3000; it must not
/// be 0.
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
    status(this_export!(), || {
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
    free_handle::<_, TierConfig>(this_export!(), cfg)
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
    status(this_export!(), || {
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
    free_handle::<_, Tier>(this_export!(), tier)
}
