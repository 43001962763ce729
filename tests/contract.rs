//! The contract of DESIGN.md §3, written once and run on every backend.
//!
//! Each test takes a `Backend`: a function from (capacity in blocks, block
//! bytes) to a configuration. `contract_suite!` instantiates the suite for one.

mod common;

use common::*;
use kvtier::{
    ErrorKind, EventKind, JobKind, LookupState::*, RemovedReason, StoredReason, TierConfig,
};
use std::collections::HashSet;
use std::time::{Duration, Instant};

type Backend = fn(usize, usize) -> TierConfig;

const BB: usize = 4096;

pub fn empty_job_is_reported_as_success(cfg: Backend) {
    let h = Harness::new(&cfg(8, BB), 8, BB);
    for (job, kind) in [
        (1, JobKind::Store),
        (2, JobKind::Load),
        (3, JobKind::Delete),
    ] {
        match kind {
            JobKind::Store => h.tier().submit_store(job, &[], KEY_LEN, &[]).unwrap(),
            JobKind::Load => h.tier().submit_load(job, &[], KEY_LEN, &[]).unwrap(),
            JobKind::Delete => h.tier().submit_delete(job, &[], KEY_LEN, None).unwrap(),
        }
        let r = h.result_of(job);
        assert_eq!(
            (r.kind, r.error, r.num_blocks, r.num_done, r.bytes),
            (kind, None, 0, 0, 0)
        );
    }
}

pub fn every_job_is_reported_exactly_once(cfg: Backend) {
    let h = Harness::new(&cfg(64, BB), 32, BB);
    for r in 0..16 {
        h.fill(r, r as u64);
    }
    let mut accepted = HashSet::new();
    for job in 0..200u64 {
        let ids: Vec<u64> = (0..(job % 5)).map(|i| (job * 7 + i) % 40).collect();
        let rows: Vec<i64> = ids.iter().map(|&i| (i % 16) as i64).collect();
        let dst: Vec<i64> = ids.iter().enumerate().map(|(p, _)| 16 + p as i64).collect();
        if job % 3 == 2 {
            h.tier()
                .submit_load(job, &keys(&ids), KEY_LEN, &dst)
                .unwrap();
        } else {
            h.tier()
                .submit_store(job, &keys(&ids), KEY_LEN, &rows)
                .unwrap();
        }
        accepted.insert(job);
        if job % 50 == 0 {
            h.tier().drain();
        }
    }
    h.tier().drain();
    assert_eq!(h.tier().stats().jobs_in_flight, 0);
    let results = h.tier().poll(usize::MAX);
    let ids: Vec<u64> = results.iter().map(|r| r.job_id).collect();
    assert_eq!(
        ids.len(),
        accepted.len(),
        "a job was reported twice or not at all"
    );
    assert_eq!(ids.iter().copied().collect::<HashSet<_>>(), accepted);
    assert!(h.tier().poll(16).is_empty());
    let s = h.tier().stats();
    assert_eq!(
        s.stores_ok + s.stores_failed + s.loads_ok + s.loads_failed,
        200
    );
}

pub fn store_skips_present_and_duplicate_keys(cfg: Backend) {
    let h = Harness::new(&cfg(8, BB), 8, BB);
    h.fill(0, 1);
    h.fill(1, 2);
    let r = h.store(1, &[1, 1, 2, 1], &[0, 0, 1, 0]);
    assert_eq!(
        (r.error, r.num_blocks, r.num_done, r.bytes),
        (None, 4, 4, 2 * BB as u64)
    );
    // Stored again: nothing to copy, still success.
    let r = h.store(2, &[2, 1], &[1, 0]);
    assert_eq!((r.error, r.num_done, r.bytes), (None, 2, 0));
    assert_eq!(h.tier().stats().num_blocks, 2);
}

pub fn bytes_round_trip_exactly(cfg: Backend) {
    let h = Harness::new(&cfg(16, BB), 16, BB);
    for i in 0..8 {
        h.fill(i, 100 + i as u64);
    }
    let ids: Vec<u64> = (100..108).collect();
    let r = h.store(1, &ids, &(0..8).collect::<Vec<_>>());
    assert!(r.is_ok(), "{r:?}");
    for i in 0..8 {
        h.write_row(i, &vec![0xAA; BB]);
    }
    let r = h.load(2, &ids, &(8..16).rev().collect::<Vec<_>>());
    assert_eq!((r.error, r.num_done, r.bytes), (None, 8, 8 * BB as u64));
    for (p, &i) in ids.iter().enumerate() {
        assert!(h.row_holds(15 - p, i), "row {} lost block {i}", 15 - p);
    }
    assert!(
        h.row(0).iter().all(|&b| b == 0xAA),
        "a load wrote outside its rows"
    );
}

pub fn eviction_is_lru_and_honours_touch(cfg: Backend) {
    let h = Harness::new(&cfg(4, BB), 8, BB);
    for i in 1..=4 {
        h.fill(0, i);
        assert!(h.store(i, &[i], &[0]).is_ok());
    }
    h.fill(0, 5);
    assert!(h.store(5, &[5], &[0]).is_ok());
    assert_eq!(
        h.present(&[1, 2, 3, 4, 5]),
        vec![2, 3, 4, 5],
        "1 was least recent"
    );
    h.touch(&[2]);
    assert!(h.store(6, &[6], &[0]).is_ok());
    assert_eq!(
        h.present(&[2, 3, 4, 5, 6]),
        vec![2, 4, 5, 6],
        "touch saved 2, 3 went"
    );
    // Order now 4 5 2 6. The first key of a touch ends most recent: touch
    // [4, 5] → 2 6 5 4, so the next two evictions take 2 then 6.
    h.touch(&[4, 5, 99]);
    assert!(h.store(7, &[7], &[0]).is_ok());
    assert_eq!(h.present(&[2, 4, 5, 6, 7]), vec![4, 5, 6, 7]);
    assert!(h.store(8, &[8], &[0]).is_ok());
    assert_eq!(h.present(&[4, 5, 6, 7, 8]), vec![4, 5, 7, 8]);
    // Order 5 4 7 8. A load is a use: loading 5 saves it, 4 goes.
    assert!(h.load(9, &[5], &[1]).is_ok());
    assert!(h.store(10, &[10], &[0]).is_ok());
    assert_eq!(h.present(&[4, 5, 7, 8, 10]), vec![5, 7, 8, 10]);
    // Order 7 8 5 10. Its first key ends most recent: loading [8, 7] gives
    // 5 10 7 8, so 5 goes next.
    assert!(h.load(11, &[8, 7], &[1, 2]).is_ok());
    assert!(h.store(12, &[12], &[0]).is_ok());
    assert_eq!(h.present(&[5, 7, 8, 10, 12]), vec![7, 8, 10, 12]);
    assert_eq!(h.tier().stats().evictions, 6);
}

pub fn a_block_read_outlives_an_unread_one(cfg: Backend) {
    // A prefix served again and again from the tier must not age as if
    // unused: under capacity pressure the blocks read survive and the blocks
    // stored after them but never read are evicted.
    let h = Harness::new(&cfg(8, BB), 8, BB);
    h.store_all(1, &[100, 101]);
    let mut job = 10;
    for round in 0..6u64 {
        let fresh = [200 + 2 * round, 201 + 2 * round];
        h.store_all(job, &fresh);
        let r = h.load(job + 1, &[100, 101], &[2, 3]);
        assert!(r.is_ok(), "round {round}: {r:?}");
        job += 2;
    }
    // 14 keys stored into 8 slots: the read prefix is still there, the
    // oldest unread blocks went.
    assert_eq!(h.present(&[100, 101]), vec![100, 101]);
    assert_eq!(h.present(&[200, 201, 202, 203]), Vec::<u64>::new());
    assert_eq!(h.tier().stats().evictions, 6);
    assert!(h.row_holds(2, 100) && h.row_holds(3, 101));
}

pub fn store_order_makes_first_key_most_recent(cfg: Backend) {
    let h = Harness::new(&cfg(3, BB), 8, BB);
    assert!(h.store(1, &[1, 2, 3], &[0, 1, 2]).is_ok());
    // Order (LRU first): 3 2 1.
    assert!(h.store(2, &[4], &[3]).is_ok());
    assert_eq!(h.present(&[1, 2, 3, 4]), vec![1, 2, 4]);
}

pub fn no_space_fails_whole_and_changes_nothing(cfg: Backend) {
    let h = Harness::manual(&cfg(4, BB), 8, BB);
    // Two blocks stored, one being stored (not evictable), one free slot.
    for (job, i) in [(1, 1), (2, 2)] {
        h.tier()
            .submit_store(job, &keys(&[i]), KEY_LEN, &[0])
            .unwrap();
        assert!(h.tier().run_queued_job(job));
        assert!(h.tier().poll(1)[0].is_ok());
    }
    h.tier()
        .submit_store(3, &keys(&[3]), KEY_LEN, &[0])
        .unwrap();
    let before = h.tier().stats();
    // Four new keys need 4 slots; 1 free + 2 evictable = 3.
    h.tier()
        .submit_store(4, &keys(&[10, 11, 1, 12, 13]), KEY_LEN, &[0; 5])
        .unwrap();
    let r = h.tier().poll(1)[0];
    assert_eq!(
        (r.job_id, r.error, r.num_done, r.bytes),
        (4, Some(ErrorKind::NoSpace), 1, 0)
    );
    assert_eq!(
        h.lookup(&[1, 2, 3, 10, 11, 12, 13]),
        [Hit, Hit, Pending, Miss, Miss, Miss, Miss]
    );
    let after = h.tier().stats();
    assert_eq!(after.evictions, before.evictions);
    assert_eq!(after.used_bytes, before.used_bytes);
    assert_eq!(after.stores_failed, before.stores_failed + 1);
    assert!(h.tier().run_queued_job(3));
    // Three new keys fit now: 1 free + 2 evictable, but not 1 (key of the job).
    h.tier()
        .submit_store(5, &keys(&[1, 20, 21]), KEY_LEN, &[0; 3])
        .unwrap();
    assert!(h.tier().run_queued_job(5));
    let results = h.tier().poll(8);
    assert!(results.iter().all(|r| r.is_ok()), "{results:?}");
    assert_eq!(h.present(&[1, 2, 3, 20, 21]), vec![1, 3, 20, 21]);
}

pub fn never_evicts_keys_of_the_same_job(cfg: Backend) {
    let h = Harness::new(&cfg(2, BB), 4, BB);
    assert!(h.store(1, &[1], &[0]).is_ok());
    assert!(h.store(2, &[2], &[0]).is_ok());
    // 1 is least recent, but it is part of this job: 2 goes instead.
    let r = h.store(3, &[1, 3], &[0, 1]);
    assert_eq!((r.error, r.num_done), (None, 2));
    assert_eq!(h.present(&[1, 2, 3]), vec![1, 3]);
    // A job whose own keys fill the tier cannot evict them for its new ones.
    let r = h.store(4, &[1, 3, 4], &[0, 1, 2]);
    assert_eq!((r.error, r.num_done), (Some(ErrorKind::NoSpace), 2));
    assert_eq!(h.present(&[1, 3, 4]), vec![1, 3]);
}

pub fn keys_of_a_store_in_flight_are_not_evicted(cfg: Backend) {
    let h = Harness::manual(&cfg(2, BB), 4, BB);
    h.tier()
        .submit_store(1, &keys(&[1]), KEY_LEN, &[0])
        .unwrap();
    assert!(h.tier().run_queued_job(1));
    // Job 2 finds 1 present and stores 2: while it runs, 1 is not evictable.
    h.tier()
        .submit_store(2, &keys(&[1, 2]), KEY_LEN, &[0, 1])
        .unwrap();
    h.tier()
        .submit_store(3, &keys(&[3]), KEY_LEN, &[2])
        .unwrap();
    assert!(h.tier().run_queued_job(2));
    let results = h.tier().poll(8);
    let r3 = results.iter().find(|r| r.job_id == 3).unwrap();
    assert_eq!(r3.error, Some(ErrorKind::NoSpace));
    let r2 = results.iter().find(|r| r.job_id == 2).unwrap();
    assert_eq!((r2.error, r2.num_done, r2.bytes), (None, 2, BB as u64));
    // Once it completed, 1 (least recent) is evictable again.
    h.tier()
        .submit_store(4, &keys(&[3]), KEY_LEN, &[2])
        .unwrap();
    assert!(h.tier().run_queued_job(4));
    assert_eq!(h.lookup(&[1, 2, 3]), [Miss, Hit, Hit]);
}

pub fn load_of_missing_key_reports_leading_blocks(cfg: Backend) {
    let h = Harness::new(&cfg(8, BB), 8, BB);
    for (row, i) in [(0, 1), (1, 2), (2, 3)] {
        h.fill(row, i);
    }
    assert!(h.store(1, &[1, 2, 3], &[0, 1, 2]).is_ok());
    let r = h.load(2, &[1, 2, 99, 3], &[4, 5, 6, 7]);
    assert_eq!(
        (r.error, r.num_blocks, r.num_done, r.bytes),
        (Some(ErrorKind::NotFound), 4, 2, 2 * BB as u64)
    );
    assert!(h.row_holds(4, 1) && h.row_holds(5, 2));
    let r = h.load(3, &[99, 1], &[4, 5]);
    assert_eq!(
        (r.error, r.num_done, r.bytes),
        (Some(ErrorKind::NotFound), 0, 0)
    );
    assert_eq!(h.tier().stats().loads_failed, 2);
}

pub fn load_waits_for_a_store_in_flight(cfg: Backend) {
    // Real workers: the load is submitted while the store is still copying.
    let bb = 1 << 20;
    let h = Harness::new(&cfg(64, bb), 64, bb);
    let ids: Vec<u64> = (0..32).collect();
    for &i in &ids {
        h.fill(i as usize, i);
    }
    h.tier()
        .submit_store(1, &keys(&ids), KEY_LEN, &(0..32).collect::<Vec<_>>())
        .unwrap();
    h.tier()
        .submit_load(2, &keys(&ids), KEY_LEN, &(32..64).collect::<Vec<_>>())
        .unwrap();
    h.tier().drain();
    let results = h.tier().poll(4);
    assert_eq!(results.len(), 2);
    assert!(
        results.iter().all(|r| r.is_ok() && r.num_done == 32),
        "{results:?}"
    );
    for &i in &ids {
        assert!(h.row_holds(32 + i as usize, i), "block {i}");
    }
}

pub fn lookup_is_pending_while_storing_then_hit(cfg: Backend) {
    let h = Harness::manual(&cfg(8, BB), 8, BB);
    h.fill(0, 1);
    h.tier()
        .submit_store(1, &keys(&[1, 2]), KEY_LEN, &[0, 0])
        .unwrap();
    assert_eq!(h.lookup(&[1, 2, 3]), [Pending, Pending, Miss]);
    // Storing the same key again while in flight counts as done, copies nothing.
    h.tier()
        .submit_store(2, &keys(&[1]), KEY_LEN, &[0])
        .unwrap();
    let r = h.tier().poll(1)[0];
    assert_eq!((r.job_id, r.error, r.num_done, r.bytes), (2, None, 1, 0));
    assert!(h.tier().run_queued_job(1));
    assert_eq!(h.lookup(&[1, 2, 3]), [Hit, Hit, Miss]);
    let s = h.tier().stats();
    assert_eq!(
        (s.lookups, s.hits, s.misses, s.lookups_pending),
        (6, 2, 2, 2)
    );
}

pub fn loads_pin_blocks_against_eviction(cfg: Backend) {
    let h = Harness::manual(&cfg(4, BB), 8, BB);
    for (job, i) in [(1, 1), (2, 2), (3, 3), (4, 4)] {
        h.fill(0, i);
        h.tier()
            .submit_store(job, &keys(&[i]), KEY_LEN, &[0])
            .unwrap();
        assert!(h.tier().run_queued_job(job));
        h.fill(i as usize, i);
    }
    assert_eq!(h.tier().poll(8).len(), 4);
    // Load of 1 (least recent) is queued: 1 is pinned.
    h.tier().submit_load(5, &keys(&[1]), KEY_LEN, &[7]).unwrap();
    h.tier()
        .submit_store(6, &keys(&[5]), KEY_LEN, &[4])
        .unwrap();
    assert_eq!(
        h.lookup(&[1, 2, 5]),
        [Hit, Miss, Pending],
        "2 evicted, not pinned 1"
    );
    // Three unpinned blocks (3, 4 and the in-flight 5 is not evictable): 3 new keys don't fit.
    h.tier()
        .submit_store(7, &keys(&[6, 7, 8]), KEY_LEN, &[0; 3])
        .unwrap();
    assert_eq!(h.tier().poll(1)[0].error, Some(ErrorKind::NoSpace));
    assert!(h.tier().run_queued_job(5));
    let r = h.tier().poll(1)[0];
    assert_eq!((r.job_id, r.error), (5, None));
    assert!(h.row_holds(7, 1));
    assert!(h.tier().run_queued_job(6));
    // Unpinned now; the load made 1 most recent, so 3 is the least recent.
    h.tier()
        .submit_store(8, &keys(&[9]), KEY_LEN, &[0])
        .unwrap();
    assert_eq!(h.lookup(&[1, 3]), [Hit, Miss]);
}

pub fn blocks_in_flight_are_not_evicted(cfg: Backend) {
    let h = Harness::manual(&cfg(2, BB), 4, BB);
    h.tier()
        .submit_store(1, &keys(&[1]), KEY_LEN, &[0])
        .unwrap();
    assert!(h.tier().run_queued_job(1));
    h.tier()
        .submit_store(2, &keys(&[2]), KEY_LEN, &[0])
        .unwrap();
    h.tier()
        .submit_store(3, &keys(&[3]), KEY_LEN, &[0])
        .unwrap();
    assert_eq!(h.lookup(&[1, 2, 3]), [Miss, Pending, Pending]);
    h.tier()
        .submit_store(4, &keys(&[4]), KEY_LEN, &[0])
        .unwrap();
    let results = h.tier().poll(8);
    let r = results.iter().find(|r| r.job_id == 4).unwrap();
    assert_eq!(r.error, Some(ErrorKind::NoSpace));
}

pub fn clear_drops_blocks_and_jobs_in_flight_still_report(cfg: Backend) {
    let h = Harness::manual(&cfg(8, BB), 8, BB);
    h.fill(0, 1);
    h.fill(1, 2);
    h.tier()
        .submit_store(1, &keys(&[1]), KEY_LEN, &[0])
        .unwrap();
    assert!(h.tier().run_queued_job(1));
    h.tier()
        .submit_store(2, &keys(&[2]), KEY_LEN, &[1])
        .unwrap();
    h.tier()
        .submit_load(3, &keys(&[1, 2]), KEY_LEN, &[4, 5])
        .unwrap();
    h.tier().clear().unwrap();
    assert_eq!(h.lookup(&[1, 2]), [Miss, Miss]);
    assert!(h.tier().run_queued_job(2));
    assert!(
        h.tier().run_queued_job(3),
        "the load ran once its store finished"
    );
    let results = h.tier().poll(8);
    assert_eq!(
        results.iter().map(|r| r.job_id).collect::<Vec<_>>(),
        vec![1, 2, 3]
    );
    assert!(results.iter().all(|r| r.is_ok()), "{results:?}");
    assert_eq!(
        results[1].num_done, 0,
        "the cleared store left nothing behind"
    );
    assert_eq!(results[2].num_done, 2);
    assert!(
        h.row_holds(4, 1) && h.row_holds(5, 2),
        "pinned before clear, loaded intact"
    );
    assert_eq!(
        h.lookup(&[1, 2]),
        [Miss, Miss],
        "a store finishing after clear is dropped"
    );
    let s = h.tier().stats();
    assert_eq!((s.num_blocks, s.used_bytes), (0, 0));
    // Everything is usable again.
    h.tier()
        .submit_store(4, &keys(&[1]), KEY_LEN, &[0])
        .unwrap();
    assert!(h.tier().run_queued_job(4));
    assert!(h.tier().poll(1)[0].is_ok());
    assert_eq!(h.lookup(&[1]), [Hit]);
}

pub fn free_with_jobs_queued_returns_promptly(cfg: Backend) {
    const JOBS: u64 = 64;
    let bb = 4 << 20;
    let mut h = Harness::new(&cfg(256, bb), 32, bb);
    let rows_of =
        |job: u64| -> Vec<i64> { (0..16).map(|r| (r + (job as i64 % 2) * 16) % 32).collect() };
    // One job run alone first, so that "promptly" is measured against this
    // backend on this machine now: free may finish the jobs running, never
    // the queue (which would take about JOBS such jobs).
    let alone = Instant::now();
    let ids: Vec<u64> = (JOBS * 16..JOBS * 16 + 16).collect();
    assert_eq!(h.store(JOBS, &ids, &rows_of(0)).error, None);
    let one_job = alone.elapsed();
    for job in 0..JOBS {
        let ids: Vec<u64> = (job * 16..job * 16 + 16).collect();
        h.tier()
            .submit_store(job, &keys(&ids), KEY_LEN, &rows_of(job))
            .unwrap();
    }
    let start = Instant::now();
    h.tier.take();
    let bound = (one_job * (JOBS as u32 / 4)).max(Duration::from_secs(2));
    assert!(
        start.elapsed() < bound,
        "free took {:?}; one job alone took {one_job:?}, so a quarter of the queue is {bound:?}",
        start.elapsed()
    );
}

pub fn rejected_submits_produce_no_result(cfg: Backend) {
    let h = Harness::new(&cfg(8, BB), 8, BB);
    let t = h.tier();
    let k = keys(&[1, 2]);
    let kind = |r: kvtier::Result<()>| r.unwrap_err().kind();
    assert_eq!(
        kind(t.submit_store(1, &k, KEY_LEN, &[0, 8])),
        ErrorKind::OutOfRange
    );
    assert_eq!(
        kind(t.submit_load(1, &k, KEY_LEN, &[-1, 0])),
        ErrorKind::OutOfRange
    );
    assert_eq!(
        kind(t.submit_store(1, &k, 0, &[0, 1])),
        ErrorKind::InvalidArg
    );
    assert_eq!(
        kind(t.submit_store(1, &vec![0; 129 * 2], 129, &[0, 1])),
        ErrorKind::InvalidArg
    );
    assert_eq!(
        kind(t.submit_store(1, &k, KEY_LEN, &[0])),
        ErrorKind::InvalidArg
    );
    t.submit_store(1, &k, KEY_LEN, &[0, 1]).unwrap();
    assert_eq!(
        kind(t.submit_load(1, &k, KEY_LEN, &[2, 3])),
        ErrorKind::DuplicateJob
    );
    t.drain();
    let results = t.poll(16);
    assert_eq!(results.len(), 1);
    assert_eq!(results[0].job_id, 1);
    // Once polled, the id is free again.
    t.submit_load(1, &k, KEY_LEN, &[2, 3]).unwrap();
    t.drain();
    assert!(t.poll(16)[0].is_ok());
}

pub fn keys_of_every_length_round_trip(cfg: Backend) {
    let h = Harness::new(&cfg(16, BB), 16, BB);
    for (n, len) in [1usize, 8, 16, 20, 36, 40, 41, 64, 128]
        .into_iter()
        .enumerate()
    {
        let mut key = vec![0u8; len];
        key[len - 1] = n as u8 + 1;
        h.fill(n, 500 + n as u64);
        h.tier()
            .submit_store(10 + n as u64, &key, len, &[n as i64])
            .unwrap();
        h.tier().drain();
        assert!(h.tier().poll(1)[0].is_ok());
        assert_eq!(h.tier().lookup(&key, len).unwrap(), [Hit]);
        // Same bytes as a prefix of a longer key is a different key.
        let mut longer = key.clone();
        longer.push(0);
        if longer.len() <= 128 {
            assert_eq!(h.tier().lookup(&longer, len + 1).unwrap(), [Miss]);
        }
        h.tier()
            .submit_load(100 + n as u64, &key, len, &[15])
            .unwrap();
        h.tier().drain();
        assert!(h.tier().poll(1)[0].is_ok());
        assert!(h.row_holds(15, 500 + n as u64), "key length {len}");
    }
}

pub fn stats_count_what_happened(cfg: Backend) {
    let h = Harness::new(&cfg(2, BB), 4, BB);
    assert!(h.store(1, &[1, 2], &[0, 1]).is_ok());
    assert!(h.store(2, &[3], &[2]).is_ok());
    assert!(h.load(3, &[3], &[3]).is_ok());
    // Store [1, 2] left 2 least recent (the first key ends most recent).
    assert!(!h.load(4, &[2], &[3]).is_ok());
    h.lookup(&[1, 3, 9]);
    let s = h.tier().stats();
    assert_eq!(s.capacity_bytes, 2 * BB as u64);
    assert_eq!(s.capacity_blocks, 2);
    assert_eq!(s.block_bytes, BB as u64);
    assert_eq!((s.num_blocks, s.used_bytes), (2, 2 * BB as u64));
    assert_eq!(
        (s.stores_ok, s.stores_failed, s.loads_ok, s.loads_failed),
        (2, 0, 1, 1)
    );
    assert_eq!((s.bytes_stored, s.bytes_loaded), (3 * BB as u64, BB as u64));
    assert_eq!((s.lookups, s.hits, s.misses, s.evictions), (3, 2, 1, 1));
    assert_eq!((s.jobs_in_flight, s.results_queued), (0, 0));
    assert!(s.metadata_bytes > 0 && s.io_threads >= 1);
}

/// A load writes each row once: a job naming a row twice is rejected at
/// submit (no result), however long the job, and harms no stored block.
pub fn a_load_naming_a_row_twice_is_rejected(cfg: Backend) {
    let h = Harness::new(&cfg(64, BB), 64, BB);
    let ids: Vec<u64> = (0..40).collect();
    h.store_all(1, &ids);
    for n in [2usize, 3, 32, 33, 40] {
        let mut rows: Vec<i64> = (0..n as i64).collect();
        rows[n - 1] = rows[n / 2 - 1];
        let err = h
            .tier()
            .submit_load(100 + n as u64, &keys(&ids[..n]), KEY_LEN, &rows)
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArg, "{n} rows: {err}");
        assert!(err.message().contains("appears twice"), "{err}");
    }
    assert!(
        h.tier().poll(usize::MAX).is_empty(),
        "a rejected load reports nothing"
    );
    let rows: Vec<i64> = (0..40).rev().collect();
    assert!(h.load(2, &ids, &rows).is_ok());
    for (&i, &row) in ids.iter().zip(&rows) {
        assert!(h.row_holds(row as usize, i), "block {i}");
    }
    // A store may read one row for several keys.
    assert!(h.store(3, &[50, 51], &[7, 7]).is_ok());
}

/// Two loads in flight into one row leave that row's bytes undefined, but
/// never fail or harm the blocks they read.
pub fn loads_racing_into_one_row_harm_no_block(cfg: Backend) {
    let bb = 64 << 10;
    let h = Harness::new(&cfg(4, bb), 4, bb);
    h.store_all(1, &[1, 2]);
    for round in 0..200u64 {
        let (a, b) = (1000 + 2 * round, 1001 + 2 * round);
        h.tier().submit_load(a, &keys(&[1]), KEY_LEN, &[3]).unwrap();
        h.tier().submit_load(b, &keys(&[2]), KEY_LEN, &[3]).unwrap();
        h.tier().drain();
        for r in h.tier().poll(2) {
            assert!(r.is_ok(), "round {round}: {r:?}");
        }
    }
    assert_eq!(h.lookup(&[1, 2]), [Hit, Hit]);
    assert!(h.load(2, &[1, 2], &[2, 3]).is_ok());
    assert!(h.row_holds(2, 1) && h.row_holds(3, 2));
}

const STORED: EventKind = EventKind::Stored(StoredReason::Written);
const EVICTED: EventKind = EventKind::Removed(RemovedReason::Evicted);
const CLEARED: EventKind = EventKind::Removed(RemovedReason::Cleared);

pub fn events_announce_each_store_and_eviction_once(cfg: Backend) {
    let h = Harness::new(&with_events(cfg(4, BB), 64), 8, BB);
    h.store_all(1, &[1, 2, 3]);
    assert_eq!(
        h.events(),
        [(STORED, 1), (STORED, 2), (STORED, 3)],
        "in the job's key order"
    );
    // Keys already stored are not stored again; lookups, touches and loads
    // change no block's presence: no event.
    h.store_all(2, &[2, 3]);
    h.touch(&[1]);
    assert!(h.load(3, &[1, 2], &[4, 5]).is_ok());
    assert_eq!(h.lookup(&[1, 2, 3, 9]), [Hit, Hit, Hit, Miss]);
    assert_eq!(h.events(), []);
    // Order 3 2 1 (the load made 1 most recent of all): storing 4 and 5
    // fills the free slot and evicts 3.
    h.store_all(4, &[4, 5]);
    assert_eq!(h.events(), [(EVICTED, 3), (STORED, 4), (STORED, 5)]);
    h.store_all(5, &[6, 7, 8]);
    let got = h.events();
    assert_eq!(&got[3..], [(STORED, 6), (STORED, 7), (STORED, 8)]);
    let mut evicted: Vec<u64> = got[..3].iter().map(|&(_, id)| id).collect();
    assert!(got[..3].iter().all(|&(kind, _)| kind == EVICTED), "{got:?}");
    evicted.sort_unstable();
    assert_eq!(evicted, [1, 2, 5], "each evicted block reported once");
    assert_eq!(h.present(&[1, 2, 3, 4, 5, 6, 7, 8]), [4, 6, 7, 8]);
    let s = h.tier().stats();
    assert_eq!((s.evictions, s.events_dropped), (4, 0));
    // A store that fails leaves nothing to announce.
    let r = h.store(6, &[10, 11, 12, 13, 14], &[0, 1, 2, 3, 4]);
    assert_eq!(r.error, Some(ErrorKind::NoSpace));
    assert_eq!(h.events(), []);
}

pub fn clear_reports_every_readable_block_removed(cfg: Backend) {
    let h = Harness::manual(&with_events(cfg(8, BB), 64), 8, BB);
    h.tier()
        .submit_store(1, &keys(&[1, 2, 3]), KEY_LEN, &[0, 1, 2])
        .unwrap();
    assert!(h.tier().run_queued_job(1));
    // Being stored at the clear: never readable, so never announced.
    h.tier()
        .submit_store(2, &keys(&[4]), KEY_LEN, &[3])
        .unwrap();
    assert_eq!(h.events(), [(STORED, 1), (STORED, 2), (STORED, 3)]);
    h.tier().clear().unwrap();
    let mut got = h.events();
    got.sort_unstable_by_key(|&(_, id)| id);
    assert_eq!(got, [(CLEARED, 1), (CLEARED, 2), (CLEARED, 3)]);
    assert!(h.tier().run_queued_job(2));
    assert_eq!(h.tier().poll(2).len(), 2);
    assert_eq!(h.lookup(&[4]), [Miss]);
    assert_eq!(h.events(), [], "a store completing after the clear");
    h.tier().clear().unwrap();
    assert_eq!(h.events(), [], "nothing left to remove");
}

pub fn a_full_event_ring_drops_the_oldest_and_says_so(cfg: Backend) {
    let h = Harness::new(&with_events(cfg(16, BB), 4), 8, BB);
    for i in 0..10 {
        h.store_all(i, &[i]);
    }
    assert_eq!(h.tier().stats().events_dropped, 6);
    let events = h.tier().poll_events(usize::MAX).unwrap();
    assert_eq!(events[0].kind, EventKind::Lost { dropped: 6 });
    assert_eq!((events[0].seq, events[0].key()), (0, &[][..]));
    let kept: Vec<(u64, u64)> = events[1..]
        .iter()
        .map(|e| (e.seq, id_of(e.key())))
        .collect();
    assert_eq!(
        kept,
        [(6, 6), (7, 7), (8, 8), (9, 9)],
        "the newest are kept"
    );
    // Nothing more was lost: no marker, numbers follow on.
    h.store_all(10, &[10]);
    let events = h.tier().poll_events(usize::MAX).unwrap();
    assert_eq!(
        (events.len(), events[0].seq, events[0].kind),
        (1, 10, STORED)
    );
    // A poll in small pieces hands each event out once.
    for i in 11..14 {
        h.store_all(i, &[i]);
    }
    let mut pieces = Vec::new();
    while let Some(e) = h.tier().poll_events(1).unwrap().pop() {
        pieces.push(e.seq);
    }
    assert_eq!(pieces, [11, 12, 13]);
    assert_eq!(h.tier().stats().events_dropped, 6);
}

pub fn events_follow_each_key_in_order_under_concurrency(cfg: Backend) {
    // Writers store, load, touch and clear at random over a tier much smaller
    // than the keys, while two pollers drain events. Merged by sequence
    // number, each key's events alternate STORED, REMOVED, starting with
    // STORED, and replaying them gives exactly the keys the tier holds.
    let h = Harness::new(&with_events(cfg(12, BB), 1 << 16), 64, BB);
    let stop = std::sync::atomic::AtomicBool::new(false);
    let polled = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                let mut mine = Vec::new();
                loop {
                    let done = stop.load(std::sync::atomic::Ordering::Acquire);
                    let got = h.tier().poll_events(7).unwrap();
                    if let (Some(a), Some(b)) = (mine.last(), got.first()) {
                        let (a, b): (&kvtier::Event, &kvtier::Event) = (a, b);
                        assert!(a.seq < b.seq, "one poller's events are in order");
                    }
                    let empty = got.is_empty();
                    mine.extend(got);
                    if done && empty {
                        break;
                    }
                }
                polled.lock().unwrap().extend(mine);
            });
        }
        let writers: Vec<_> = (0..3u64)
            .map(|w| {
                let h = &h;
                s.spawn(move || {
                    let mut rng = Rng::new(w);
                    for j in 0..150u64 {
                        let job = w << 32 | j;
                        let ids: Vec<u64> = (0..1 + rng.below(3)).map(|_| rng.below(30)).collect();
                        let rows: Vec<i64> =
                            (0..ids.len() as i64).map(|r| w as i64 * 8 + r).collect();
                        match rng.below(10) {
                            0..=5 => h.tier().submit_store(job, &keys(&ids), KEY_LEN, &rows),
                            6..=7 => h.tier().submit_load(job, &keys(&ids), KEY_LEN, &rows),
                            8 => h.tier().touch(&keys(&ids), KEY_LEN),
                            _ if j % 40 == 0 => {
                                h.tier().clear().unwrap();
                                Ok(())
                            }
                            _ => Ok(()),
                        }
                        .unwrap();
                    }
                })
            })
            .collect();
        for w in writers {
            w.join().unwrap();
        }
        h.tier().drain();
        stop.store(true, std::sync::atomic::Ordering::Release);
    });
    // Results are polled by nobody above: only events matter here.
    let mut events = polled.into_inner().unwrap();
    events.sort_unstable_by_key(|e| e.seq);
    assert!(
        events.windows(2).all(|p| p[1].seq == p[0].seq + 1),
        "no event lost or repeated"
    );
    let mut present = std::collections::BTreeSet::new();
    for e in &events {
        let id = id_of(e.key());
        match e.kind {
            EventKind::Stored(_) => assert!(present.insert(id), "key {id} stored twice: {e:?}"),
            EventKind::Removed(_) => {
                assert!(present.remove(&id), "key {id} removed unstored: {e:?}")
            }
            EventKind::Lost { .. } => panic!("the ring was large enough: {e:?}"),
        }
    }
    let ids: Vec<u64> = (0..30).collect();
    let held: std::collections::BTreeSet<u64> = h.present(&ids).into_iter().collect();
    assert_eq!(present, held, "the events mirror the tier");
    assert_eq!(h.tier().stats().num_blocks, held.len() as u64);
}

pub fn polling_events_needs_them_turned_on(cfg: Backend) {
    let h = Harness::new(&cfg(4, BB), 4, BB);
    h.store_all(1, &[1]);
    let err = h.tier().poll_events(16).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config);
    assert!(err.message().contains("events=true"), "{err}");
    assert_eq!(h.tier().stats().events_dropped, 0);
}

/// Emits one `#[test]` per contract test, calling it with `$backend` when
/// `$ready()` (the backend's server is there, or the test is skipped).
macro_rules! contract_tests {
    ($backend:expr, $ready:expr; $($name:ident),* $(,)?) => {
        $( #[test] fn $name() { if $ready() { super::$name($backend) } } )*
    };
}

/// Instantiates every contract test for one backend.
macro_rules! contract_suite {
    ($module:ident, $backend:expr) => {
        contract_suite!($module, $backend, || true);
    };
    ($module:ident, $backend:expr, $ready:expr) => {
        mod $module {
            contract_tests!(
                $backend, $ready;
                empty_job_is_reported_as_success,
                every_job_is_reported_exactly_once,
                store_skips_present_and_duplicate_keys,
                bytes_round_trip_exactly,
                eviction_is_lru_and_honours_touch,
                a_block_read_outlives_an_unread_one,
                store_order_makes_first_key_most_recent,
                no_space_fails_whole_and_changes_nothing,
                never_evicts_keys_of_the_same_job,
                keys_of_a_store_in_flight_are_not_evicted,
                load_of_missing_key_reports_leading_blocks,
                load_waits_for_a_store_in_flight,
                lookup_is_pending_while_storing_then_hit,
                loads_pin_blocks_against_eviction,
                blocks_in_flight_are_not_evicted,
                clear_drops_blocks_and_jobs_in_flight_still_report,
                free_with_jobs_queued_returns_promptly,
                rejected_submits_produce_no_result,
                keys_of_every_length_round_trip,
                stats_count_what_happened,
                a_load_naming_a_row_twice_is_rejected,
                loads_racing_into_one_row_harm_no_block,
                events_announce_each_store_and_eviction_once,
                clear_reports_every_readable_block_removed,
                a_full_event_ring_drops_the_oldest_and_says_so,
                events_follow_each_key_in_order_under_concurrency,
                polling_events_needs_them_turned_on,
            );
        }
    };
}

contract_suite!(memory, crate::common::memory_config);
contract_suite!(
    memory_prefault_full,
    crate::common::memory_full_prefault_config
);
contract_suite!(
    memory_prefault_off,
    crate::common::memory_no_prefault_config
);
contract_suite!(memory_persist, crate::common::memory_persist_config);
contract_suite!(disk, crate::common::disk_config);
contract_suite!(disk_sealed, crate::common::sealed_disk_config);
contract_suite!(redis, crate::common::redis::standalone_config, || {
    crate::common::redis::redis_available() && crate::common::redis::shared_server().is_some()
});
contract_suite!(
    redis_sealed,
    crate::common::redis::sealed_standalone_config,
    || {
        crate::common::redis::redis_available() && crate::common::redis::shared_server().is_some()
    }
);
contract_suite!(
    redis_cluster_sealed,
    crate::common::redis::sealed_cluster_config,
    || crate::common::redis::redis_available() && crate::common::redis::shared_cluster().is_some()
);
contract_suite!(redis_cluster, crate::common::redis::cluster_config, || {
    crate::common::redis::redis_available() && crate::common::redis::shared_cluster().is_some()
});
