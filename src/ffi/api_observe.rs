//! The observing exports: block events, describe, features, metrics and
//! stats, which read a tier without changing its blocks.

use super::api::tier_ref;
use super::boundary::{self, as_mut, or_default, poll_into, sized_out, status, this_export, OK};
use super::types::*;
use std::ffi::c_char;

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
/// TIER_ERR_INVALID_ARG (cap 0, event_size below TIER_EVENT_SIZE_V1, or
/// cap * event_size above PTRDIFF_MAX);
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
    status(this_export!(), || {
        let tier = tier_ref(tier)?;
        poll_into(
            out,
            event_size,
            cap,
            TIER_EVENT_SIZE_V1,
            out_n,
            "an event",
            |max, put| tier.poll_events_with(max, |e| put(&e.into())).map(drop),
        )
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
    let function = this_export!();
    or_default(function, 0, || match tier_ref(tier) {
        Ok(tier) => boundary::copy_text(&tier.describe(), boundary::text_out(buf, cap)),
        Err(e) => {
            boundary::record_error(function, &e);
            0
        }
    })
}

/// Writes what the tier can do or is to `*out_features`: the bitwise OR of
/// its TIER_FEATURE_* bits (TIER_FEATURE_EXTENTS: it takes extent jobs;
/// TIER_FEATURE_SHARED: other processes may store into its storage, so a
/// lookup may answer TIER_PENDING while storage is probed;
/// TIER_FEATURE_SEALED: blocks are sealed with a seal_key;
/// TIER_FEATURE_PERSISTENT: stored blocks outlive the tier). Fixed when the
/// tier is created. Bits this header does not name may be set by a newer
/// library: ignore them.
/// Returns TIER_OK; TIER_ERR_NULL_ARG; TIER_ERR_SHUTDOWN (inherited across
/// fork(), see tier_new). `*out_features` is written only on success.
/// NULL: `tier` and `out_features` are required.
/// Threads: any thread, concurrently with other calls; takes no lock.
/// Added in KVTIER_1.1.
#[no_mangle]
pub unsafe extern "C" fn tier_features(
    tier: *const tier_t,
    out_features: *mut u64,
) -> tier_status_t {
    status(this_export!(), || {
        let tier = tier_ref(tier.cast_mut())?;
        *as_mut(out_features, "out_features")? = tier.features();
        OK
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
    let function = this_export!();
    or_default(function, 0, || match tier_ref(tier) {
        Ok(tier) => boundary::copy_text(&tier.metrics(), boundary::text_out(buf, cap)),
        Err(e) => {
            boundary::record_error(function, &e);
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
/// TIER_STATS_SIZE_V1 or above PTRDIFF_MAX); TIER_ERR_SHUTDOWN (inherited
/// across fork(), see tier_new). `*out` is written only on success.
/// Threads: any thread, concurrently with other calls.
#[no_mangle]
pub unsafe extern "C" fn tier_stats(
    tier: *mut tier_t,
    out: *mut tier_stats_t,
    out_size: usize,
) -> tier_status_t {
    status(this_export!(), || {
        let tier = tier_ref(tier)?;
        let out = sized_out(out, out_size, 1, TIER_STATS_SIZE_V1, "out")?;
        out.write(0, &tier.stats());
        OK
    })
}
