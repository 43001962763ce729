//! A forked child's *own* tiers work while the parent has idle workers parked
//! on their condition variables at the fork.
//!
//! This used to hang at random (`c_tests/test_fork.c` under load): a lock
//! library that keeps one process-wide table of parked threads (parking_lot)
//! still lists the parent's parked workers in the child, where those threads
//! do not exist and glibc hands their stacks (holding the listed nodes) to the
//! child's new threads. A new tier's condition variable that hashes to such a
//! bucket then loses wake-ups, and `drain` waits forever. So the parent parks
//! many workers (several tiers) and each child builds and drives many tiers,
//! so that new threads reuse those stacks and new keys meet stale buckets; the
//! child runs under `alarm`, which turns a hang into a failure.
//!
//! This file holds one test, so when it forks the harness's only other thread
//! is the main one, waiting for it without holding a lock.

use kvtier::{PrimaryBuffer, Tier, TierConfig};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;

const BLOCK: usize = 4096;
const KEY_LEN: usize = 36;
const ROWS: usize = 4;
/// Tiers of the parent, idle (workers parked) across every fork.
const PARENT_TIERS: usize = 4;
const IO_THREADS: &str = "2";
const FORKS: usize = 24;
/// Tiers each child builds in turn, and store/load round trips on each.
const CHILD_TIERS: usize = 12;
const ROUND_TRIPS: usize = 20;
/// A child that takes longer has hung (it needs well under a second).
const CHILD_ALARM_SECS: u32 = 30;

fn tier_over(rows: &mut [u8]) -> Tier {
    let primary = unsafe { PrimaryBuffer::new(rows.as_mut_ptr(), rows.len(), BLOCK) }.unwrap();
    let mut config = TierConfig::default();
    config.set("capacity_bytes", "1MiB").unwrap();
    config.set("io_threads", IO_THREADS).unwrap();
    Tier::new(&config, primary).unwrap()
}

fn finish(tier: &Tier) {
    tier.drain();
    let results = tier.poll(4);
    assert_eq!(results.len(), 1, "{results:?}");
    assert!(results[0].is_ok(), "{results:?}");
}

/// One store and one load through `tier`, checked byte for byte.
fn round_trip(tier: &Tier, rows: &mut [u8], job: u64) {
    let key = [job as u8; KEY_LEN];
    rows[..BLOCK].fill(job as u8 ^ 0xA5);
    tier.submit_store(2 * job, &key, KEY_LEN, &[0]).unwrap();
    finish(tier);
    rows[BLOCK..2 * BLOCK].fill(0);
    tier.submit_load(2 * job + 1, &key, KEY_LEN, &[1]).unwrap();
    finish(tier);
    assert!(rows[BLOCK..2 * BLOCK]
        .iter()
        .all(|&b| b == job as u8 ^ 0xA5));
}

/// Runs in the child; panics on a failed check. Each tier starts new worker
/// threads, which glibc gives stacks it reclaimed from the parent's threads.
fn child() {
    let mut rows = vec![0u8; ROWS * BLOCK];
    for _ in 0..CHILD_TIERS {
        let tier = tier_over(&mut rows);
        for job in 0..ROUND_TRIPS as u64 {
            round_trip(&tier, &mut rows, job);
        }
    }
}

#[test]
fn a_forked_childs_new_tiers_work_while_the_parent_has_parked_workers() {
    let mut parent_rows: Vec<Vec<u8>> =
        (0..PARENT_TIERS).map(|_| vec![0u8; ROWS * BLOCK]).collect();
    let parent_tiers: Vec<Tier> = parent_rows.iter_mut().map(|r| tier_over(r)).collect();
    // Every worker has parked at least once (so the lock library knows it),
    // and is parked again when each fork happens.
    for (i, tier) in parent_tiers.iter().enumerate() {
        round_trip(tier, &mut parent_rows[i], 1);
    }
    for fork_no in 0..FORKS {
        // Long enough for the worker that polls before sleeping to sleep.
        std::thread::sleep(Duration::from_millis(5));
        // SAFETY: the child runs only this test's code, then leaves with _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
        if pid == 0 {
            // SAFETY: plain libc calls; _exit skips the harness's teardown.
            // The parent's tiers are never touched here; their copies leak.
            unsafe { libc::alarm(CHILD_ALARM_SECS) };
            let ok = catch_unwind(AssertUnwindSafe(child)).is_ok();
            unsafe { libc::_exit(if ok { 0 } else { 1 }) };
        }
        let mut status = 0;
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "child {fork_no} of {FORKS} failed: {}",
            if libc::WIFSIGNALED(status) {
                format!(
                    "killed by signal {} (SIGALRM {}: its own tier hung)",
                    libc::WTERMSIG(status),
                    libc::SIGALRM
                )
            } else {
                format!("exit status {}", libc::WEXITSTATUS(status))
            }
        );
    }
    // The parent's tiers still work.
    for (i, tier) in parent_tiers.iter().enumerate() {
        round_trip(tier, &mut parent_rows[i], 2);
    }
}
