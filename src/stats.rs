//! Counters and the statistics snapshot.

use std::sync::atomic::{AtomicU64, Ordering};

// Defined once, for Rust and C: cbindgen reads this file too and names the
// struct `tier_stats_t` in the header (cbindgen.toml), so it stays `repr(C)`
// with fixed-width fields only.

/// A snapshot of a tier's state and counters, filled in by `tier_stats`
/// (`Tier::stats` in Rust).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
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
    /// Lookups answered TIER_PENDING since the tier opened: a counter, not
    /// how many are pending now (`probes_in_flight` is that gauge).
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
    /// Block events dropped because the event ring was full (events=true);
    /// tier_poll_events reports each loss in place as a TIER_EVENT_LOST.
    pub events_dropped: u64,
    /// Bytes of the memory backend's arena that are resident: made so by
    /// `prefault` or written by a store (0 for disk and Redis). Counted from
    /// the populator's progress and the highest slot stored, not asked of
    /// the kernel; with `persist_path`, the bytes the arena's file holds in
    /// memory (its allocated pages, from fstat).
    pub resident_bytes: u64,
    /// Storage calls that missed their deadline (`io_timeout_ms`); each
    /// failed its job with TIER_ERR_IO on time.
    pub io_deadlines_missed: u64,
    /// Threads in a storage call past its deadline right now (replaced, up
    /// to io_threads more, while they are).
    pub io_threads_stuck: u64,
    /// Keys of a shared tier's lookups whose probe of storage is queued or
    /// running right now (a gauge; 0 for a tier that does not share its
    /// storage): once 0, every probe so far has entered its answer in the
    /// tier. Appended in KVTIER_1.1.
    pub probes_in_flight: u64,
}

#[derive(Default)]
pub(crate) struct Counters {
    pub lookups: AtomicU64,
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    pub pending: AtomicU64,
    pub evictions: AtomicU64,
    pub stores_ok: AtomicU64,
    pub stores_failed: AtomicU64,
    pub loads_ok: AtomicU64,
    pub loads_failed: AtomicU64,
    pub bytes_stored: AtomicU64,
    pub bytes_loaded: AtomicU64,
    /// A gauge, unlike the others: see `Stats::probes_in_flight`.
    pub probes_in_flight: AtomicU64,
}

impl Counters {
    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        if n != 0 {
            counter.fetch_add(n, Ordering::Relaxed);
        }
    }

    pub(crate) fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
}
