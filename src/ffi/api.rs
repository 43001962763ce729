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

/// Creates a configuration with every key at its default (listed at
/// tier_config_set and in docs/configuration.md).
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

/// Sets one configuration option from strings. Every key is in
/// docs/configuration.md; tier_config_keys lists their names and
/// tier_config_get reads a value back.
///
/// Keys, as "key" [backends]: values; default; meaning (generated from
/// src/config/keys.rs, with docs/configuration.md: KVTIER_BLESS_DOCS=1 cargo
/// test --test config_docs):
/// - "backend" [all]: `memory`, `disk`, `redis` (also `valkey`); default
///   `memory`; where blocks live.
/// - "capacity_bytes" [all]: bytes, or a number with `KiB`/`MiB`/`GiB`/`TiB`;
///   default `1GiB`; block data the tier may hold, rounded down to whole
///   blocks.
/// - "io_threads" [all]: 1..=256; default min(cores, 4) for memory, 64 for
///   disk, 8 for redis; worker threads that copy blocks (for disk and redis,
///   the queue depth).
/// - "idle_spin_us" [all]: 0..=1000000; default 50; how long one idle worker
///   polls for work before it sleeps, in microseconds.
/// - "prefault" [all]: memory: `off`, `background`, `full`; other backends:
///   `off` only (`tier_new` refuses the others); default `background` (memory),
///   `off` for disk and redis; when the memory arena becomes resident: `off`
///   when stores write it, `background` a low-priority thread keeps capacity/8
///   (within 64 MiB..1 GiB) resident ahead of the stored slots, `full` all of
///   it from `tier_new` on.
/// - "persist_path" [memory]: a directory on tmpfs or hugetlbfs (created
///   owner-only; its parent must exist); default none; where the arena and its
///   index live, a file per namespace mapped shared, so that the next tier over
///   it after a crash or restart finds every block completely stored; one
///   process at a time, not with `shared`; a file of another namespace or
///   format is refused, one of another geometry made anew.
/// - "path" [disk]: a directory (created owner-only; its parent must exist);
///   default required; the tier's root directory.
/// - "namespace" [disk, redis]: text, up to 4096 bytes; default empty; what the
///   blocks mean (model and revision, dtype, tokens per block, parallel layout,
///   rank); blocks of another namespace or block size are never served;
///   required on shared storage (`shared=true`, `sharing=shared`), where
///   `tier_new` fails without one.
/// - "o_direct" [disk]: `auto`, `on`, `off`; default `auto`; bypass the page
///   cache: `auto` probes the directory and falls back to buffered I/O.
/// - "block_header" [disk]: `auto`, `xattr`, `file`; default `auto`; where each
///   block file's header lives: `auto` in its `user.kvtier` extended attribute
///   where a local file system keeps them (a 64 KiB block is a 64 KiB file),
///   else in the file's first 4 KiB; `xattr` the attribute or `tier_new` fails;
///   `file` in the file; either form is read whatever this says.
/// - "sync" [disk]: `none`, `data`; default `none`; `data`: fsync the file and
///   its directory before a block is published, so it survives a power loss.
/// - "shared" [disk]: `true`, `false` (also `1`/`0`, `on`/`off`, `yes`/`no`);
///   default `false`; several processes or hosts use the directory at once.
/// - "probe_ttl_ms" [disk, redis]: 0..=3600000; default 1000; shared storage:
///   how long a "not stored" answer is reused, and how long (at least 250 ms)
///   the namespace's clear generation is trusted before it is read again (a
///   lookup past half of it has it read again; past all of it HITs answer
///   PENDING until that read returns); `tier_clear` returns after twice this.
/// - "prepare_dirs" [disk]: `true`, `false`; default `false`; create all 256
///   fan-out directories at open, so early stores do not pay for a mkdir.
/// - "url" [redis]: `redis://[user[:password]@]host[:port][/db]` or `rediss://`
///   (TLS); a cluster's seeds comma-separated; default required; the servers.
/// - "cluster" [redis]: `auto`, `on`, `off`; default `auto`; a Redis Cluster
///   (keys routed by slot) or one server; `auto` asks the server.
/// - "sharing" [redis]: `owned`, `shared`; default `owned`; `owned`: this
///   tier's keys, deleted when evicted; `shared`: one keyspace for a fleet,
///   never deleted by this tier.
/// - "key_prefix" [redis]: 1 to 64 bytes without braces; default `kvtier`; the
///   first part of every key name.
/// - "ttl_s" [redis]: seconds (0: none); default 0; expiry of stored blocks.
/// - "io_timeout_ms" [disk, redis]: `auto`, or 0..=600000 (0: none, disk only);
///   default `auto` for disk, 3000 for redis; the deadline of one block's
///   storage call; past it the job fails with TIER_ERR_IO on time; disk `auto`:
///   10000 on network, cluster, FUSE and unknown file systems, none on local
///   ones (`tier_describe` says which).
/// - "connections" [redis]: 1..=1024; default one per I/O thread; connections
///   per server node.
/// - "events" [all]: `true`, `false`; default `false`; record block events for
///   `tier_poll_events`.
/// - "events_capacity" [all]: 1..=4194304; default 65536; events held until
///   polled (160 bytes each, allocated at `tier_new`); beyond it the oldest are
///   dropped and reported as TIER_EVENT_LOST.
/// - "seal_key" [disk, redis]: 64 hex digits; default none; the tenant's
///   256-bit seal key: blocks are encrypted and authenticated (AES-256-GCM) and
///   named by HMAC-SHA-256 of their key, so only holders of it can read, find
///   or forge them; never shown, wiped when freed; not with `seal_key_file`.
/// - "seal_key_file" [disk, redis]: a file holding the 64 hex digits,
///   accessible to its owner only; default none; the seal key, read from a
///   file; not with `seal_key`.
///
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
