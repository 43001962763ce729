//! Extent stores and loads, per-key deletes and pins (issue 59), with their
//! per-item results, on every backend that stores extents.

mod common;

use common::*;
use kvtier::{
    EventKind, Extent, FailReason, ItemResult, ItemResults, ItemStatus, LookupState, RemovedReason,
    TierConfig,
};
use std::sync::Arc;

type Backend = fn(usize, usize) -> TierConfig;

const BB: usize = 8192;
const ROWS: usize = 16;

fn ok() -> ItemResult {
    ItemResult {
        status: ItemStatus::Ok,
        reason: FailReason::None,
    }
}

fn item(status: ItemStatus, reason: FailReason) -> ItemResult {
    ItemResult { status, reason }
}

/// Writes `data` at byte `offset` of the harness's buffer.
fn write_at(h: &Harness, offset: usize, data: &[u8]) {
    assert!(offset + data.len() <= h.buffer.len());
    unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), h.buffer.ptr().add(offset), data.len()) }
}

fn read_at(h: &Harness, offset: usize, len: usize) -> Vec<u8> {
    assert!(offset + len <= h.buffer.len());
    unsafe { std::slice::from_raw_parts(h.buffer.ptr().add(offset), len) }.to_vec()
}

fn extents(spans: &[(usize, usize)]) -> Vec<Extent> {
    spans
        .iter()
        .map(|&(offset, len)| Extent { offset, len })
        .collect()
}

/// Stores `ids` from `spans` (each filled with its pattern first) and
/// returns the per-item results, after the job's.
fn store(h: &Harness, job: u64, ids: &[u64], spans: &[(usize, usize)]) -> Vec<ItemResult> {
    for (&i, &(offset, len)) in ids.iter().zip(spans) {
        write_at(h, offset, &pattern(i, len));
    }
    let results = Arc::new(ItemResults::new(ids.len()));
    h.tier()
        .submit_store_extents(
            job,
            &keys(ids),
            KEY_LEN,
            &extents(spans),
            Some(results.clone()),
        )
        .unwrap();
    let r = h.result_of(job);
    assert_eq!(r.num_blocks, ids.len() as u32);
    results.get().into_iter().map(Option::unwrap).collect()
}

/// Loads `ids` into `spans`; the job's result and the per-item results.
fn load(
    h: &Harness,
    job: u64,
    ids: &[u64],
    spans: &[(usize, usize)],
) -> (kvtier::JobResult, Vec<ItemResult>) {
    let results = Arc::new(ItemResults::new(ids.len()));
    h.tier()
        .submit_load_extents(
            job,
            &keys(ids),
            KEY_LEN,
            &extents(spans),
            Some(results.clone()),
        )
        .unwrap();
    let r = h.result_of(job);
    (r, results.get().into_iter().map(Option::unwrap).collect())
}

fn delete(h: &Harness, job: u64, ids: &[u64]) -> Vec<ItemResult> {
    let results = Arc::new(ItemResults::new(ids.len()));
    h.tier()
        .submit_delete(job, &keys(ids), KEY_LEN, Some(results.clone()))
        .unwrap();
    let r = h.result_of(job);
    assert_eq!((r.kind, r.error), (kvtier::JobKind::Delete, None));
    results.get().into_iter().map(Option::unwrap).collect()
}

pub fn scattered_unaligned_extents_round_trip(cfg: Backend) {
    let h = Harness::new(&cfg(32, BB), ROWS, BB);
    // Odd offsets and lengths, across row boundaries, up to a whole block.
    let from = [
        (1, 1),
        (13, 4095),
        (5000, BB),
        (20_001, 777),
        (40_000, BB - 3),
        (70_003, 4096),
    ];
    let to = [
        (100_001, 1),
        (90_000, 4095),
        (7, BB),
        (60_123, 777),
        (110_000, BB - 3),
        (81_111, 4096),
    ];
    let ids = [1, 2, 3, 4, 5, 6];
    assert_eq!(store(&h, 1, &ids, &from), vec![ok(); 6]);
    assert_eq!(h.lookup(&ids), vec![LookupState::Hit; 6]);
    let (r, items) = load(&h, 2, &ids, &to);
    assert_eq!((r.error, r.num_done), (None, 6), "{r:?}");
    assert_eq!(items, vec![ok(); 6]);
    for (&i, &(offset, len)) in ids.iter().zip(&to) {
        assert_eq!(read_at(&h, offset, len), pattern(i, len), "block {i}");
    }
    assert_eq!(r.bytes, to.iter().map(|s| s.1 as u64).sum::<u64>());
}

/// Blocks over a MiB: a disk tier under O_DIRECT reads them through its
/// staging pieces.
pub fn large_unaligned_extents_round_trip(cfg: Backend) {
    let bb = (1 << 20) + 8192;
    let h = Harness::new(&cfg(8, bb), 4, bb);
    let from = [(3, bb), (bb + 5, bb - 7), (2 * bb + 100, (1 << 20) + 1)];
    let to = [(2 * bb + 9, bb), (11, bb - 7), (bb + 4096, (1 << 20) + 1)];
    let ids = [1, 2, 3];
    for (&i, &(offset, len)) in ids.iter().zip(&from) {
        write_at(&h, offset, &pattern(i, len));
    }
    let results = Arc::new(ItemResults::new(3));
    h.tier()
        .submit_store_extents(
            1,
            &keys(&ids),
            KEY_LEN,
            &extents(&from),
            Some(results.clone()),
        )
        .unwrap();
    assert!(h.result_of(1).is_ok());
    let (r, items) = load(&h, 2, &ids, &to);
    assert_eq!((r.error, items), (None, vec![ok(); 3]));
    for (&i, &(offset, len)) in ids.iter().zip(&to) {
        assert!(read_at(&h, offset, len) == pattern(i, len), "block {i}");
    }
    // A length mismatch is found before a byte is copied.
    write_at(&h, 0, &[0x5a; 64]);
    let (_, items) = load(&h, 3, &[2], &[(0, bb - 8)]);
    assert_eq!(
        items,
        vec![item(ItemStatus::Failed, FailReason::LengthMismatch)]
    );
    assert_eq!(read_at(&h, 0, 64), [0x5a; 64]);
}

pub fn a_length_mismatch_fails_that_item_and_copies_nothing(cfg: Backend) {
    let h = Harness::new(&cfg(32, BB), ROWS, BB);
    assert_eq!(
        store(&h, 1, &[1, 2], &[(0, 100), (4096, 300)]),
        vec![ok(); 2]
    );
    let sentinel = vec![0xa5u8; 200];
    write_at(&h, 50_000, &sentinel);
    let (r, items) = load(&h, 2, &[1, 2], &[(50_000, 101), (60_000, 300)]);
    assert_eq!(
        items,
        vec![item(ItemStatus::Failed, FailReason::LengthMismatch), ok()]
    );
    assert_eq!((r.reason, r.num_done), (FailReason::LengthMismatch, 1));
    assert_eq!(read_at(&h, 50_000, 200), sentinel, "nothing copied");
    assert_eq!(read_at(&h, 60_000, 300), pattern(2, 300));
    // The stored block is kept, and loads at its own length.
    assert_eq!(h.lookup(&[1]), vec![LookupState::Hit]);
    let (r, items) = load(&h, 3, &[1], &[(70_000, 100)]);
    assert_eq!((r.error, items), (None, vec![ok()]));
    assert_eq!(read_at(&h, 70_000, 100), pattern(1, 100));
}

pub fn per_item_results_go_on_past_a_failed_item(cfg: Backend) {
    let h = Harness::new(&cfg(32, BB), ROWS, BB);
    assert_eq!(
        store(
            &h,
            1,
            &[1, 2, 3, 4],
            &[(0, 10), (BB, 20), (2 * BB, 30), (3 * BB, 40)]
        ),
        vec![ok(); 4]
    );
    let to = [
        (40_000, 10),
        (50_000, 99),
        (60_000, 20),
        (70_000, 31),
        (80_000, 40),
    ];
    let (r, items) = load(&h, 2, &[1, 99, 2, 3, 4], &to);
    assert_eq!(
        items,
        vec![
            ok(),
            item(ItemStatus::Miss, FailReason::NotFound),
            ok(),
            item(ItemStatus::Failed, FailReason::LengthMismatch),
            ok(),
        ]
    );
    assert_eq!(
        r.error,
        Some(kvtier::ErrorKind::NotFound),
        "the first failure"
    );
    assert_eq!(r.num_done, 3);
    for (i, (offset, len)) in [(1, to[0]), (2, to[2]), (4, to[4])] {
        assert_eq!(read_at(&h, offset, len), pattern(i, len), "block {i}");
    }
}

pub fn extents_outside_the_buffer_are_refused(cfg: Backend) {
    let h = Harness::new(&cfg(32, BB), ROWS, BB);
    let len = h.buffer.len();
    let tier = h.tier();
    for bad in [
        (len - 10, 11),
        (len, 1),
        (usize::MAX - 2, 4),
        (0, 0),
        (0, BB + 1),
    ] {
        for load in [false, true] {
            let e = extents(&[(0, 8), bad]);
            let err = if load {
                tier.submit_load_extents(7, &keys(&[1, 2]), KEY_LEN, &e, None)
            } else {
                tier.submit_store_extents(7, &keys(&[1, 2]), KEY_LEN, &e, None)
            }
            .unwrap_err();
            assert_eq!(err.kind(), kvtier::ErrorKind::InvalidArg, "{bad:?}: {err}");
        }
    }
    // Overlapping destinations of one load are refused too.
    let err = tier
        .submit_load_extents(
            7,
            &keys(&[1, 2]),
            KEY_LEN,
            &extents(&[(0, 100), (99, 10)]),
            None,
        )
        .unwrap_err();
    assert_eq!(err.kind(), kvtier::ErrorKind::InvalidArg, "{err}");
    // Nothing was queued: the job id is free, the tier empty.
    tier.drain();
    assert!(tier.poll(10).is_empty());
    assert_eq!(h.lookup(&[1, 2]), vec![LookupState::Miss; 2]);
    assert_eq!(store(&h, 7, &[1], &[(len - 10, 10)]), vec![ok()]);
}

pub fn delete_removes_present_keys_and_reports_absent_and_pinned(cfg: Backend) {
    let h = Harness::new(&with_events(cfg(32, BB), 64), ROWS, BB);
    assert_eq!(
        store(&h, 1, &[1, 2, 3], &[(0, 10), (BB, BB), (2 * BB, 5)]),
        vec![ok(); 3]
    );
    h.events();
    assert_eq!(
        h.tier().pin(&keys(&[2, 77]), KEY_LEN).unwrap(),
        [LookupState::Hit, LookupState::Miss]
    );
    let items = delete(&h, 2, &[1, 99, 2]);
    assert_eq!(
        items,
        vec![
            ok(),
            item(ItemStatus::Miss, FailReason::NotFound),
            item(ItemStatus::Busy, FailReason::Busy),
        ]
    );
    assert_eq!(
        h.lookup(&[1, 2, 3]),
        [LookupState::Miss, LookupState::Hit, LookupState::Hit]
    );
    assert_eq!(
        h.events(),
        vec![(EventKind::Removed(RemovedReason::Deleted), 1)]
    );
    // Deleted from storage too: a load misses.
    let (r, items) = load(&h, 3, &[1], &[(0, 10)]);
    assert_eq!(r.error, Some(kvtier::ErrorKind::NotFound));
    assert_eq!(items, vec![item(ItemStatus::Miss, FailReason::NotFound)]);
    // Once unpinned it can go.
    h.tier().unpin(&keys(&[2]), KEY_LEN).unwrap();
    assert_eq!(delete(&h, 4, &[2, 3]), vec![ok(); 2]);
    assert_eq!(h.lookup(&[2, 3]), vec![LookupState::Miss; 2]);
    assert_eq!(
        h.events(),
        vec![
            (EventKind::Removed(RemovedReason::Deleted), 2),
            (EventKind::Removed(RemovedReason::Deleted), 3)
        ]
    );
}

pub fn pins_block_eviction_until_unpinned(cfg: Backend) {
    let h = Harness::new(&cfg(2, BB), ROWS, BB);
    assert_eq!(store(&h, 1, &[1, 2], &[(0, 10), (BB, 20)]), vec![ok(); 2]);
    let states = h.tier().pin(&keys(&[1, 2]), KEY_LEN).unwrap();
    assert_eq!(states, [LookupState::Hit; 2]);
    // Every block pinned: the store fails for want of room, nothing evicted.
    let items = store(&h, 2, &[3], &[(2 * BB, 30)]);
    assert_eq!(items, vec![item(ItemStatus::Failed, FailReason::NoSpace)]);
    assert_eq!(
        h.lookup(&[1, 2, 3]),
        [LookupState::Hit, LookupState::Hit, LookupState::Miss]
    );
    // Unpinning one lets the store evict it, and only it.
    h.tier().unpin(&keys(&[1]), KEY_LEN).unwrap();
    assert_eq!(store(&h, 3, &[3], &[(2 * BB, 30)]), vec![ok()]);
    assert_eq!(
        h.lookup(&[1, 2, 3]),
        [LookupState::Miss, LookupState::Hit, LookupState::Hit]
    );
    let (r, items) = load(&h, 4, &[2, 3], &[(5 * BB, 20), (6 * BB, 30)]);
    assert_eq!((r.error, items), (None, vec![ok(); 2]));
}

pub fn unpin_ignores_unknown_keys_and_counts_pins(cfg: Backend) {
    let h = Harness::new(&cfg(8, BB), ROWS, BB);
    let tier = h.tier();
    tier.unpin(&keys(&[5, 6]), KEY_LEN).unwrap(); // never pinned, never stored
    assert_eq!(store(&h, 1, &[1], &[(0, 10)]), vec![ok()]);
    tier.unpin(&keys(&[1]), KEY_LEN).unwrap(); // stored, never pinned
    tier.pin(&keys(&[1]), KEY_LEN).unwrap();
    tier.pin(&keys(&[1]), KEY_LEN).unwrap();
    tier.unpin(&keys(&[1]), KEY_LEN).unwrap();
    let busy = item(ItemStatus::Busy, FailReason::Busy);
    assert_eq!(delete(&h, 2, &[1]), vec![busy], "one pin is left");
    tier.unpin(&keys(&[1, 1, 1]), KEY_LEN).unwrap(); // one more than pinned
    assert_eq!(delete(&h, 3, &[1]), vec![ok()]);
    // A pinned block cleared away leaves nothing behind once unpinned.
    assert_eq!(store(&h, 4, &[2], &[(0, 10)]), vec![ok()]);
    tier.pin(&keys(&[2]), KEY_LEN).unwrap();
    tier.clear().unwrap();
    tier.unpin(&keys(&[2]), KEY_LEN).unwrap();
    let stats = tier.stats();
    assert_eq!((stats.num_blocks, stats.used_bytes), (0, 0), "{stats:?}");
}

/// An empty extent store is accepted and reported at once, with no item:
/// how a caller asks a tier whether it stores extents (a sealed tier
/// refuses it, below). The LMCache adapter asks so.
pub fn an_empty_extent_store_is_reported_at_once(cfg: Backend) {
    let h = Harness::new(&cfg(8, BB), ROWS, BB);
    let results = Arc::new(ItemResults::new(0));
    h.tier()
        .submit_store_extents(1, &[], KEY_LEN, &[], Some(results.clone()))
        .unwrap();
    let r = h.tier().poll(10);
    assert_eq!(r.len(), 1, "{r:?}");
    assert_eq!((r[0].job_id, r[0].num_blocks, r[0].error), (1, 0, None));
    assert!(results.get().is_empty());
    assert_eq!(store(&h, 1, &[1], &[(3, 10)]), vec![ok()]);
}

macro_rules! extent_tests {
    ($backend:expr, $ready:expr; $($name:ident),* $(,)?) => {
        $( #[test] fn $name() { if $ready() { super::$name($backend) } } )*
    };
}

/// Instantiates every extent test for one backend.
macro_rules! extent_suite {
    ($module:ident, $backend:expr) => {
        extent_suite!($module, $backend, || true);
    };
    ($module:ident, $backend:expr, $ready:expr) => {
        mod $module {
            extent_tests!(
                $backend, $ready;
                scattered_unaligned_extents_round_trip,
                large_unaligned_extents_round_trip,
                a_length_mismatch_fails_that_item_and_copies_nothing,
                per_item_results_go_on_past_a_failed_item,
                extents_outside_the_buffer_are_refused,
                delete_removes_present_keys_and_reports_absent_and_pinned,
                pins_block_eviction_until_unpinned,
                unpin_ignores_unknown_keys_and_counts_pins,
                an_empty_extent_store_is_reported_at_once,
            );
        }
    };
}

/// A disk tier that keeps each header in the file (not an attribute).
fn disk_in_file_config(capacity_blocks: usize, block_bytes: usize) -> TierConfig {
    let mut c = disk_config(capacity_blocks, block_bytes);
    c.set("block_header", "file").unwrap();
    c
}

/// A disk tier under O_DIRECT whatever the file system says.
fn disk_direct_config(capacity_blocks: usize, block_bytes: usize) -> TierConfig {
    let mut c = disk_config(capacity_blocks, block_bytes);
    c.set("o_direct", "on").unwrap();
    c
}

extent_suite!(memory, crate::common::memory_config);
extent_suite!(disk, crate::common::disk_config);
extent_suite!(disk_in_file, super::disk_in_file_config);
extent_suite!(disk_direct, super::disk_direct_config);
extent_suite!(memory_persist, crate::common::memory_persist_config);
extent_suite!(redis, crate::common::redis::standalone_config, || {
    crate::common::redis::redis_available() && crate::common::redis::shared_server().is_some()
});

/// An extent's length outlives the process with a persistent arena: a
/// reopened tier loads it at its length and refuses another.
#[test]
fn a_persistent_arena_keeps_extent_lengths_across_a_reopen() {
    let cfg = memory_persist_config(8, BB);
    {
        let h = Harness::leaving_dir(&cfg, ROWS, BB);
        assert_eq!(store(&h, 1, &[1, 2], &[(3, 100), (BB, BB)]), vec![ok(); 2]);
    }
    let h = Harness::new(&cfg, ROWS, BB);
    assert_eq!(h.lookup(&[1, 2]), [LookupState::Hit; 2]);
    let (r, items) = load(&h, 2, &[1, 2, 1], &[(50_000, 100), (0, BB), (60_000, 99)]);
    assert_eq!(
        items,
        vec![
            ok(),
            ok(),
            item(ItemStatus::Failed, FailReason::LengthMismatch)
        ]
    );
    assert_eq!(r.num_done, 2);
    assert_eq!(read_at(&h, 50_000, 100), pattern(1, 100));
    assert_eq!(read_at(&h, 0, BB), pattern(2, BB));
}

/// A delete reaches storage: a disk tier opened again over the directory
/// does not find the deleted block, and finds the other.
#[test]
fn a_deleted_disk_block_stays_deleted_after_a_reopen() {
    let cfg = disk_config(8, BB);
    {
        let h = Harness::leaving_dir(&cfg, ROWS, BB);
        assert_eq!(store(&h, 1, &[1, 2], &[(0, 10), (BB, 20)]), vec![ok(); 2]);
        assert_eq!(delete(&h, 2, &[1]), vec![ok()]);
    }
    let h = Harness::new(&cfg, ROWS, BB);
    assert_eq!(h.lookup(&[1, 2]), [LookupState::Miss, LookupState::Hit]);
    let (r, items) = load(&h, 3, &[2], &[(5, 20)]);
    assert_eq!((r.error, items), (None, vec![ok()]));
    assert_eq!(read_at(&h, 5, 20), pattern(2, 20));
}

/// A tier that does not store extents yet (sealed disk) refuses them at
/// submit, clearly;
/// deletes and pins work there as everywhere.
#[test]
fn backends_without_extents_refuse_them_and_still_delete_and_pin() {
    {
        let cfg = sealed_disk_config(8, BB);
        let h = Harness::new(&cfg, ROWS, BB);
        let err = h
            .tier()
            .submit_store_extents(1, &keys(&[1]), KEY_LEN, &extents(&[(0, 10)]), None)
            .unwrap_err();
        assert_eq!(err.kind(), kvtier::ErrorKind::InvalidArg);
        assert!(err.message().contains("does not store extents"), "{err}");
        // An empty one too: the answer to whether the tier stores extents.
        let err = h
            .tier()
            .submit_store_extents(1, &[], KEY_LEN, &[], None)
            .unwrap_err();
        assert_eq!(err.kind(), kvtier::ErrorKind::InvalidArg);
        h.store_all(2, &[1, 2]);
        assert_eq!(
            h.tier().pin(&keys(&[2]), KEY_LEN).unwrap(),
            [LookupState::Hit]
        );
        let busy = item(ItemStatus::Busy, FailReason::Busy);
        assert_eq!(delete(&h, 3, &[1, 2]), vec![ok(), busy]);
        assert_eq!(h.lookup(&[1, 2]), [LookupState::Miss, LookupState::Hit]);
    }
}

/// A delete on a shared disk directory removes the file for every tier
/// there: another tier that had found the block misses it at its next load.
#[test]
fn a_delete_in_a_shared_directory_reaches_the_other_tiers() {
    let dir = scratch_dir();
    let cfg = tenant_disk_config(&dir, true, None, BB);
    let a = Harness::leaving_dir(&cfg, ROWS, BB);
    let b = Harness::leaving_dir(&cfg, ROWS, BB);
    assert_eq!(store(&a, 1, &[1], &[(3, 100)]), vec![ok()]);
    let found = b.lookup_settled(&[1], std::time::Duration::from_secs(10));
    assert_eq!(found, [LookupState::Hit]);
    assert_eq!(delete(&b, 2, &[1]), vec![ok()]);
    b.tier().drain();
    // The deletion runs on b's I/O threads after the job is reported.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let (r, items) = load(&a, 3, &[1], &[(0, 100)]);
        if items == [item(ItemStatus::Miss, FailReason::NotFound)] {
            assert_eq!(r.error, Some(kvtier::ErrorKind::NotFound));
            break;
        }
        assert_eq!(items, vec![ok()], "{r:?}");
        assert!(std::time::Instant::now() < deadline, "the file stayed");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    drop((a, b));
    std::fs::remove_dir_all(&dir).unwrap();
}
