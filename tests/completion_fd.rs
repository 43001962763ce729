//! The completion descriptor (`Tier::completion_fd`, `tier_completion_fd`):
//! readable exactly while results wait, reset by the poll that takes the
//! last one, and never silent while a result waits, however completions and
//! polls interleave. Also the job's `io_ns`, which excludes queueing.

mod common;

use common::*;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

const BB: usize = 4096;

/// Whether `fd` is readable within `timeout` (poll(2), level-triggered).
fn readable(fd: BorrowedFd<'_>, timeout: Duration) -> bool {
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let n = unsafe { libc::poll(&mut p, 1, timeout.as_millis() as libc::c_int) };
    assert!(n >= 0, "poll: {}", std::io::Error::last_os_error());
    n == 1 && p.revents & libc::POLLIN != 0
}

fn now(fd: BorrowedFd<'_>) -> bool {
    readable(fd, Duration::ZERO)
}

#[test]
fn readable_from_a_completion_until_the_poll_that_takes_the_last_result() {
    let h = Harness::manual(&memory_config(8, BB), 8, BB);
    let t = h.tier();
    let fd = t.completion_fd().unwrap();
    assert_eq!(
        t.completion_fd().unwrap().as_raw_fd(),
        fd.as_raw_fd(),
        "one descriptor"
    );
    assert!(!now(fd), "nothing finished yet");

    t.submit_store(1, &keys(&[1]), KEY_LEN, &[0]).unwrap();
    t.submit_store(2, &keys(&[2]), KEY_LEN, &[1]).unwrap();
    assert!(!now(fd), "submitted is not finished");
    assert!(t.run_queued_job(1));
    assert!(now(fd), "a result waits");
    assert!(t.run_queued_job(2));
    assert!(now(fd));

    // A poll that leaves a result queued leaves the descriptor readable.
    assert_eq!(t.poll(1).len(), 1);
    assert!(now(fd), "one result still waits");
    assert_eq!(t.poll(1)[0].job_id, 2);
    assert!(!now(fd), "the last result was taken");
    assert!(t.poll(1).is_empty());
    assert!(!now(fd));

    // Re-armed with no call: the next completion signals again.
    t.submit_load(3, &keys(&[1]), KEY_LEN, &[4]).unwrap();
    assert!(t.run_queued_job(3));
    assert!(now(fd));
    assert!(t.poll(8)[0].is_ok());
    assert!(!now(fd));
}

#[test]
fn a_descriptor_made_after_results_are_queued_is_readable_at_once() {
    let h = Harness::new(&memory_config(8, BB), 8, BB);
    let t = h.tier();
    // An empty job completes in the submit call itself.
    t.submit_store(7, &[], KEY_LEN, &[]).unwrap();
    let fd = t.completion_fd().unwrap();
    assert!(now(fd));
    assert_eq!(t.poll(8).len(), 1);
    assert!(!now(fd));
}

#[test]
fn a_waiter_on_the_descriptor_alone_never_misses_a_result() {
    // A submitter thread keeps completing jobs while this thread waits only
    // on the descriptor and polls a few results at a time, so results keep
    // arriving during polls. A lost wake-up would leave results queued and
    // the descriptor silent: the generous wait below then fails the test.
    const JOBS: u64 = 20_000;
    const WINDOW: u64 = 64;
    let h = Harness::new(&memory_config(64, BB), 64, BB);
    let t = h.tier();
    let fd = t.completion_fd().unwrap();
    let polled = AtomicU64::new(0);
    // Set when the waiter gives up, so that the submitter stops too and the
    // test fails instead of hanging.
    let gave_up = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            for job in 0..JOBS {
                // Bounded in flight (job ids stay distinct anyway).
                while job - polled.load(Ordering::Acquire) >= WINDOW {
                    if gave_up.load(Ordering::Relaxed) {
                        return;
                    }
                    std::thread::yield_now();
                }
                let key = job % 32;
                let row = (job % 64) as i64;
                if job % 3 == 0 {
                    t.submit_load(job, &keys(&[key]), KEY_LEN, &[row]).unwrap();
                } else {
                    t.submit_store(job, &keys(&[key]), KEY_LEN, &[row]).unwrap();
                }
            }
        });
        let mut seen = vec![false; JOBS as usize];
        let mut count = 0u64;
        while count < JOBS {
            if !readable(fd, Duration::from_secs(30)) {
                gave_up.store(true, Ordering::Relaxed);
                panic!(
                    "no wake-up in 30 s with {count} of {JOBS} results polled and {} waiting",
                    t.stats().results_queued
                );
            }
            for r in t.poll(3) {
                assert!(!std::mem::replace(&mut seen[r.job_id as usize], true));
                count += 1;
            }
            polled.store(count, Ordering::Release);
        }
    });
    assert!(!now(fd), "every result taken");
}

#[test]
fn io_time_excludes_the_time_a_job_waited_in_the_queue() {
    let h = Harness::manual(&memory_config(8, BB), 8, BB);
    let t = h.tier();
    t.submit_store(1, &keys(&[1, 2, 3]), KEY_LEN, &[0, 1, 2])
        .unwrap();
    let queued = Duration::from_millis(200);
    std::thread::sleep(queued);
    assert!(t.run_queued_job(1));
    let r = t.poll(1)[0];
    assert!(r.is_ok(), "{r:?}");
    assert!(r.io_ns > 0, "{r:?}");
    // elapsed covers the wait before a worker started the copies; io_ns does not.
    assert!(r.elapsed_ns - r.io_ns >= queued.as_nanos() as u64, "{r:?}");

    // Nothing copied: no I/O time.
    t.submit_store(2, &keys(&[1, 2]), KEY_LEN, &[0, 1]).unwrap(); // already stored
    t.submit_store(3, &[], KEY_LEN, &[]).unwrap();
    let rs = t.poll(8);
    assert_eq!(rs.len(), 2, "{rs:?}");
    assert!(
        rs.iter().all(|r| r.is_ok() && r.io_ns == 0 && r.bytes == 0),
        "{rs:?}"
    );
}
