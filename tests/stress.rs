//! Several threads on one tier with real workers: random stores, loads,
//! lookups, touches, polls, waits and clears. What must hold whatever the
//! interleaving: each accepted job is reported exactly once, every successful
//! load (and the copied prefix of a failed one) holds the key's bytes, and the
//! counters add up.

mod common;

use common::*;
use kvtier::{ErrorKind, JobKind, JobResult, TierConfig};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

const BB: usize = 4096;
const KEYS: u64 = 48;
const THREADS: usize = 4;
const ROWS_PER_THREAD: usize = 8;

/// Results polled by any thread, handed to the thread that submitted the job.
#[derive(Default)]
struct Mailbox {
    results: Mutex<HashMap<u64, JobResult>>,
    arrived: Condvar,
    duplicates: AtomicU64,
}

impl Mailbox {
    fn poll_into(&self, h: &Harness) {
        let polled = h.tier().poll(8);
        if polled.is_empty() {
            return;
        }
        let mut map = self.results.lock().unwrap();
        for r in polled {
            if map.insert(r.job_id, r).is_some() {
                self.duplicates.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.arrived.notify_all();
    }

    fn wait_for(&self, h: &Harness, job: u64) -> JobResult {
        loop {
            if let Some(r) = self.results.lock().unwrap().get(&job) {
                return *r;
            }
            h.tier().wait(Duration::from_millis(1));
            self.poll_into(h);
            let map = self.results.lock().unwrap();
            if !map.contains_key(&job) {
                drop(self.arrived.wait_timeout(map, Duration::from_millis(1)));
            }
        }
    }
}

#[test]
fn threads_hammering_one_tier_keep_the_contract() {
    let config = TierConfig {
        capacity_bytes: (24 * BB) as u64,
        io_threads: Some(2),
        ..TierConfig::default()
    };
    let rows = KEYS as usize + THREADS * ROWS_PER_THREAD;
    let h = Harness::new(&config, rows, BB);
    for k in 0..KEYS {
        h.fill(k as usize, k);
    }
    let mailbox = Mailbox::default();
    let accepted = AtomicU64::new(0);
    let stores = AtomicU64::new(0);
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (h, mailbox, accepted, stores) = (&h, &mailbox, &accepted, &stores);
            s.spawn(move || {
                let mut rng = Rng::new(t as u64 * 7919);
                let my_rows = KEYS as usize + t * ROWS_PER_THREAD;
                for i in 0..1500u64 {
                    let job = (t as u64) << 32 | i;
                    let n = 1 + rng.below(6);
                    let ks: Vec<u64> = (0..n).map(|_| rng.below(KEYS)).collect();
                    match rng.below(100) {
                        0..=44 => {
                            let src: Vec<i64> = ks.iter().map(|&k| k as i64).collect();
                            h.tier()
                                .submit_store(job, &keys(&ks), KEY_LEN, &src)
                                .unwrap();
                            accepted.fetch_add(1, Ordering::Relaxed);
                            stores.fetch_add(1, Ordering::Relaxed);
                        }
                        45..=74 => {
                            let dst: Vec<i64> =
                                (0..n as usize).map(|p| (my_rows + p) as i64).collect();
                            h.tier()
                                .submit_load(job, &keys(&ks), KEY_LEN, &dst)
                                .unwrap();
                            accepted.fetch_add(1, Ordering::Relaxed);
                            // This thread's rows are its own until the load is reported.
                            let r = mailbox.wait_for(h, job);
                            assert_eq!(r.kind, JobKind::Load);
                            match r.error {
                                None => assert_eq!(r.num_done as u64, n),
                                Some(ErrorKind::NotFound) => assert!((r.num_done as u64) < n),
                                Some(other) => panic!("load failed with {other:?}"),
                            }
                            for (p, &k) in ks.iter().enumerate().take(r.num_done as usize) {
                                assert!(h.row_holds(my_rows + p, k), "thread {t} job {i} pos {p}");
                            }
                        }
                        75..=84 => {
                            let states = h.lookup(&ks);
                            assert_eq!(states.len(), ks.len());
                        }
                        85..=92 => h.touch(&ks),
                        93..=98 => mailbox.poll_into(h),
                        _ => {
                            if rng.chance(20) {
                                h.tier().clear().unwrap();
                            }
                        }
                    }
                }
            });
        }
    });
    h.tier().drain();
    while h.tier().stats().results_queued > 0 {
        mailbox.poll_into(&h);
    }
    let results = mailbox.results.lock().unwrap();
    assert_eq!(
        mailbox.duplicates.load(Ordering::Relaxed),
        0,
        "a job was reported twice"
    );
    assert_eq!(
        results.len() as u64,
        accepted.load(Ordering::Relaxed),
        "a job was never reported"
    );
    let s = h.tier().stats();
    assert_eq!(
        s.stores_ok + s.stores_failed,
        stores.load(Ordering::Relaxed)
    );
    assert_eq!(
        s.stores_ok + s.stores_failed + s.loads_ok + s.loads_failed,
        results.len() as u64
    );
    assert_eq!(s.jobs_in_flight, 0);
    for r in results.values() {
        if r.kind == JobKind::Store {
            assert!(matches!(r.error, None | Some(ErrorKind::NoSpace)), "{r:?}");
        }
    }
    assert!(s.used_bytes <= s.capacity_bytes);
}
