//! The safe API in a forked child (issue 12, defect 6): an inherited tier
//! refuses work at once, nothing blocks, dropping it returns, a new tier works,
//! and the parent's tier is unaffected. (`c_tests/test_fork.c` covers the C
//! API, `python/tests/test_binding.py` the binding.)
//!
//! This file holds one test, so when it forks the harness's only other thread
//! is the main one, waiting for it without holding a lock. The child never
//! unwinds into the harness: it reports through its exit status.

use kvtier::{ErrorKind, LookupState, PrimaryBuffer, Stats, Tier, TierConfig};
use std::os::fd::AsRawFd;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

const BLOCK: usize = 4096;
const KEY_LEN: usize = 36;

fn key(i: u8) -> [u8; KEY_LEN] {
    [i; KEY_LEN]
}

fn tier_over(rows: &mut [u8]) -> Tier {
    let primary = unsafe { PrimaryBuffer::new(rows.as_mut_ptr(), rows.len(), BLOCK) }.unwrap();
    let mut config = TierConfig::default();
    config.set("capacity_bytes", "1MiB").unwrap();
    config.set("io_threads", "2").unwrap();
    Tier::new(&config, primary).unwrap()
}

fn finish(tier: &Tier, n: usize) {
    tier.drain();
    let results = tier.poll(16);
    assert_eq!(results.len(), n, "{results:?}");
    assert!(results.iter().all(|r| r.is_ok()), "{results:?}");
}

/// Where descriptor `fd` of this process points.
fn fd_target(fd: i32) -> std::path::PathBuf {
    std::fs::read_link(format!("/proc/self/fd/{fd}")).unwrap()
}

/// Runs in the child; panics on a failed check. `completion_fd` is the
/// number of the parent's completion descriptor.
fn child(inherited: Tier, parent: u32, completion_fd: i32) {
    let owner = format!("the tier belongs to process {parent}");
    let refused = |what: &str, r: kvtier::Result<()>| {
        let e = r.expect_err(what);
        assert_eq!(e.kind(), ErrorKind::Shutdown, "{what}: {e}");
        assert!(e.message().contains(&owner), "{what}: {e}");
        assert!(
            e.message().contains("create a new tier after fork"),
            "{what}: {e}"
        );
    };
    refused("check_process", inherited.check_process());
    refused(
        "submit_store",
        inherited.submit_store(10, &key(9), KEY_LEN, &[0]),
    );
    refused(
        "submit_load",
        inherited.submit_load(11, &key(1), KEY_LEN, &[1]),
    );
    refused("lookup", inherited.lookup(&key(1), KEY_LEN).map(drop));
    refused("touch", inherited.touch(&key(1), KEY_LEN));
    refused("completion_fd", inherited.completion_fd().map(drop));
    assert!(fd_target(completion_fd)
        .to_string_lossy()
        .contains("eventfd"));
    // The calls without a Result return at once, having done nothing.
    let start = Instant::now();
    assert!(inherited.poll(16).is_empty());
    assert!(!inherited.wait(Duration::from_secs(60)));
    inherited.drain();
    inherited.clear().unwrap();
    assert!(
        start.elapsed() < Duration::from_secs(30),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(inherited.stats(), Stats::default());
    assert!(inherited.describe().contains("inherited across fork"));
    assert_eq!(inherited.rows(), 4);
    drop(inherited); // joins no thread, takes no lock
                     // The child let go of the parent's eventfd; the number stays taken.
    assert_eq!(fd_target(completion_fd), std::path::Path::new("/dev/null"));

    let mut rows = vec![0u8; 4 * BLOCK];
    rows[..BLOCK].fill(0x5A);
    let own = tier_over(&mut rows);
    own.check_process().unwrap();
    own.submit_store(1, &key(3), KEY_LEN, &[0]).unwrap();
    finish(&own, 1);
    own.submit_load(2, &key(3), KEY_LEN, &[2]).unwrap();
    finish(&own, 1);
    drop(own);
    assert!(rows[2 * BLOCK..3 * BLOCK].iter().all(|&b| b == 0x5A));
}

#[test]
fn inherited_tier_is_inert_in_a_forked_child() {
    let mut rows = vec![0u8; 4 * BLOCK];
    rows[..BLOCK].fill(1);
    rows[BLOCK..2 * BLOCK].fill(2);
    let tier = tier_over(&mut rows);
    let completion_fd = tier.completion_fd().unwrap().as_raw_fd();
    tier.submit_store(1, &key(1), KEY_LEN, &[0]).unwrap();
    finish(&tier, 1);
    // In flight across the fork: reported to the parent, exactly once.
    tier.submit_store(2, &key(2), KEY_LEN, &[1]).unwrap();
    let parent = std::process::id();

    // SAFETY: the child runs only this test's code, then leaves with _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        // SAFETY: plain libc calls; _exit skips the harness's teardown.
        unsafe { libc::alarm(20) }; // a hang becomes SIGALRM, seen by the parent
                                    // The inherited tier moves into the child's checks: its copy of
                                    // `tier` is dropped there (the parent's is untouched).
        let ok = catch_unwind(AssertUnwindSafe(move || child(tier, parent, completion_fd))).is_ok();
        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
    }
    let mut status = 0;
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "child failed: {}",
        if libc::WIFSIGNALED(status) {
            format!(
                "killed by signal {} (SIGALRM {}: a call hung; SIGABRT {}: a panic in drop)",
                libc::WTERMSIG(status),
                libc::SIGALRM,
                libc::SIGABRT
            )
        } else {
            format!("exit status {}", libc::WEXITSTATUS(status))
        }
    );

    // The parent's descriptor still signals its results.
    let mut p = libc::pollfd {
        fd: completion_fd,
        events: libc::POLLIN,
        revents: 0,
    };
    assert_eq!(
        unsafe { libc::poll(&mut p, 1, 30_000) },
        1,
        "the result of job 2"
    );
    finish(&tier, 1);
    assert_eq!(
        tier.lookup(&[key(1), key(2)].concat(), KEY_LEN).unwrap(),
        vec![LookupState::Hit, LookupState::Hit]
    );
    tier.submit_load(3, &[key(1), key(2)].concat(), KEY_LEN, &[2, 3])
        .unwrap();
    finish(&tier, 1);
    drop(tier);
    assert!(rows[2 * BLOCK..3 * BLOCK].iter().all(|&b| b == 1));
    assert!(rows[3 * BLOCK..].iter().all(|&b| b == 2));
}
