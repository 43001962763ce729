//! The disk backend's I/O deadline (`io_timeout_ms`): a storage call that
//! hangs fails its job with TIER_ERR_IO on time, its thread is replaced (up to
//! a bound), the late call's outcome is discarded, and the tier works normally
//! once the device recovers.
//!
//! The hangs come from a test seam in the disk backend (calls that block at a
//! chosen point until the test lets them go), which gives the exact
//! interleavings: a read that completes after its job was reported, a write
//! that completes late, a rename under way when the deadline fires.
//! "On time" is checked with generous slack: it is a correctness property
//! (the result does not wait for the call), not a speed claim.

mod common;

use common::*;
use kvtier::{ErrorKind, HangPoint, LookupState::*, TierConfig};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const BB: usize = 4096;
/// The tiers' deadline. Every healthy call must finish well inside it: at
/// 200 ms, on a 2-core machine running other tests, a healthy open or write
/// sometimes did not (an ext4 journal stall), and the store or load that
/// should show the tier working normally failed on time instead (2 runs of
/// 25 with both cores busy, and once in CI).
const TIMEOUT_MS: u64 = 1000;
/// How late a result may come and still count as on time: the watchdog's
/// tick plus a loaded machine's scheduling delays.
const SLACK: Duration = Duration::from_secs(3);
/// How long a test waits for something that should happen soon.
const PATIENCE: Duration = Duration::from_secs(10);

fn config(io_threads: usize) -> TierConfig {
    let mut c = disk_config(64, BB);
    c.io_threads = Some(io_threads);
    c.io_timeout_ms = Some(TIMEOUT_MS as u32);
    c
}

fn dir_of(h: &Harness) -> PathBuf {
    h.scratch_dir.clone().expect("scratch dir")
}

/// Submits a load and waits for its result, checking it came on time.
fn timed(h: &Harness, submit: impl FnOnce(), job: u64) -> (kvtier::JobResult, Duration) {
    let start = Instant::now();
    submit();
    let r = h.result_of(job);
    (r, start.elapsed())
}

fn assert_on_time(r: &kvtier::JobResult, took: Duration) {
    let deadline = Duration::from_millis(TIMEOUT_MS);
    assert_eq!(r.error, Some(ErrorKind::Io), "{r:?}");
    assert_eq!(r.reason, kvtier::FailReason::Deadline, "{r:?}");
    assert!(
        took >= deadline,
        "reported after {took:?}, before its deadline"
    );
    assert!(
        took < deadline + SLACK,
        "reported after {took:?}: the deadline is {deadline:?}"
    );
}

/// Waits until `f` holds, up to PATIENCE.
fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let end = Instant::now() + PATIENCE;
    while !f() {
        assert!(Instant::now() < end, "never: {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_load_past_its_deadline_is_reported_on_time_and_never_writes_its_row() {
    let h = Harness::new(&config(2), 16, BB);
    h.store_all(1, &[1, 2]);
    let tier = h.tier();
    let sentinel = vec![0xeeu8; BB];
    h.write_row(5, &sentinel);
    tier.hang_disk_io(HangPoint::Read, 0, 1);
    let (r, took) = timed(
        &h,
        || tier.submit_load(2, &keys(&[1]), KEY_LEN, &[5]).unwrap(),
        2,
    );
    assert_on_time(&r, took);
    assert_eq!(r.num_done, 0, "no block reached the row");
    assert_eq!(tier.wait_disk_io_hung(1, PATIENCE), 1);
    let stats = tier.stats();
    assert_eq!(stats.io_deadlines_missed, 1);
    assert_eq!(stats.io_threads_stuck, 1);
    assert_eq!(stats.loads_failed, 1);
    // A replacement serves the queue while the call hangs.
    h.fill(6, 3);
    assert!(h.store(3, &[3], &[6]).is_ok());
    let r = h.load(4, &[2], &[7]);
    assert!(r.is_ok() && h.row_holds(7, 2), "{r:?}");
    assert_eq!(h.lookup(&[1, 2, 3]), vec![Hit, Hit, Hit]);

    // The device recovers: the late read's bytes never reach the row, the
    // job is not reported again, the extra thread leaves.
    tier.release_disk_io();
    assert!(tier.wait_disk_io_released(PATIENCE));
    eventually("the stuck thread is back", || {
        tier.stats().io_threads_stuck == 0
    });
    eventually("the crew is back to io_threads", || {
        tier.io_threads_alive() == 2
    });
    assert_eq!(h.row(5), &sentinel[..], "the reported load wrote its row");
    assert!(tier.poll(8).is_empty(), "a job was reported twice");
    let r = h.load(5, &[1], &[5]);
    assert!(r.is_ok() && h.row_holds(5, 1), "{r:?}");
    assert_eq!(tier.stats().jobs_in_flight, 0);
}

#[test]
fn a_load_reports_the_blocks_it_delivered_before_its_deadline() {
    // One thread copies the job's blocks in order: the first arrives, the
    // second hangs. The result says one block was copied; the rows of the
    // stuck block and of the one after it are never written.
    let h = Harness::new(&config(1), 16, BB);
    h.store_all(1, &[1, 2, 3]);
    let tier = h.tier();
    let sentinel = vec![0xeeu8; BB];
    for row in 10..13 {
        h.write_row(row, &sentinel);
    }
    tier.hang_disk_io(HangPoint::Read, 1, 1);
    let (r, took) = timed(
        &h,
        || {
            tier.submit_load(2, &keys(&[1, 2, 3]), KEY_LEN, &[10, 11, 12])
                .unwrap()
        },
        2,
    );
    assert_on_time(&r, took);
    assert_eq!(r.num_done, 1, "{r:?}");
    assert!(h.row_holds(10, 1));
    tier.release_disk_io();
    assert!(tier.wait_disk_io_released(PATIENCE));
    eventually("the stuck thread is back", || {
        tier.stats().io_threads_stuck == 0
    });
    assert_eq!(h.row(11), &sentinel[..], "the late block was copied");
    assert_eq!(
        h.row(12),
        &sentinel[..],
        "a block after the stuck one was copied"
    );
    assert!(tier.poll(8).is_empty());
    // The blocks stay stored.
    assert_eq!(h.lookup(&[1, 2, 3]), vec![Hit, Hit, Hit]);
}

/// A block larger than the 1 MiB pieces a load under a deadline reads it
/// in: two whole pieces and a tail that is not a multiple of 4096.
const LARGE: usize = (2 << 20) + 4096 + 100;
const PIECE: usize = 1 << 20;

fn large_config(header: &str, o_direct: &str) -> TierConfig {
    let mut c = disk_config(8, LARGE);
    c.io_threads = Some(2);
    c.io_timeout_ms = Some(TIMEOUT_MS as u32);
    c.set("block_header", header).unwrap();
    c.set("o_direct", o_direct).unwrap();
    c
}

#[test]
fn blocks_larger_than_a_piece_load_byte_exact_under_a_deadline() {
    for (header, o_direct) in [("auto", "auto"), ("file", "auto"), ("auto", "off")] {
        let h = Harness::new(&large_config(header, o_direct), 6, LARGE);
        h.store_all(1, &[1, 2, 3]);
        for row in 3..6 {
            h.write_row(row, &vec![0xee; LARGE]);
        }
        let r = h.load(2, &[3, 1, 2], &[3, 4, 5]);
        assert!(r.is_ok(), "{header}/{o_direct}: {r:?}");
        assert_eq!(r.num_done, 3);
        for (row, i) in [(3, 3), (4, 1), (5, 2)] {
            assert!(h.row_holds(row, i), "{header}/{o_direct}: row {row}");
        }
    }
}

#[test]
fn a_damaged_later_piece_fails_its_block_as_corrupt_and_removes_the_file() {
    // The first piece is intact, so its bytes may reach the row before the
    // checksum, taken over all the pieces, proves the file bad.
    for damaged_at in [PIECE + PIECE / 2, LARGE - 1] {
        let h = Harness::new(&large_config("file", "auto"), 4, LARGE);
        h.store_all(1, &[1, 2]);
        let dir = dir_of(&h);
        let file = files(&dir, ".kvb")
            .into_iter()
            .find(|f| {
                let bytes = std::fs::read(f).unwrap();
                bytes[4096..4096 + LARGE] == pattern(2, LARGE)[..]
            })
            .expect("block 2's file");
        let mut bytes = std::fs::read(&file).unwrap();
        bytes[4096 + damaged_at] ^= 0x40;
        std::fs::write(&file, &bytes).unwrap();
        let r = h.load(2, &[1, 2], &[2, 3]);
        assert_eq!(
            (r.error, r.num_done),
            (Some(ErrorKind::Corrupt), 1),
            "damaged at {damaged_at}: {r:?}"
        );
        assert!(h.row_holds(2, 1));
        assert!(!file.exists(), "a corrupt file is removed");
        assert_eq!(h.lookup(&[1, 2]), vec![Hit, Miss]);
    }
}

#[test]
fn a_piece_read_past_the_deadline_never_reaches_the_row() {
    // The block's first piece arrives in time; the read of its second hangs
    // past the deadline. The job is reported then; when the read returns,
    // neither it nor any later piece is copied.
    let h = Harness::new(&large_config("auto", "auto"), 4, LARGE);
    h.store_all(1, &[1]);
    let tier = h.tier();
    let sentinel = vec![0xeeu8; LARGE];
    h.write_row(2, &sentinel);
    tier.hang_disk_io(HangPoint::Read, 1, 1);
    let (r, took) = timed(
        &h,
        || tier.submit_load(2, &keys(&[1]), KEY_LEN, &[2]).unwrap(),
        2,
    );
    assert_on_time(&r, took);
    assert_eq!(r.num_done, 0, "the block did not reach its row whole");
    assert_eq!(tier.wait_disk_io_hung(1, PATIENCE), 1);
    tier.release_disk_io();
    assert!(tier.wait_disk_io_released(PATIENCE));
    eventually("the stuck thread is back", || {
        tier.stats().io_threads_stuck == 0
    });
    assert_eq!(
        &h.row(2)[PIECE..],
        &sentinel[PIECE..],
        "a piece read after the report reached the row"
    );
    assert!(tier.poll(8).is_empty(), "a job was reported twice");
    // The block stays stored and loads whole.
    let r = h.load(3, &[1], &[2]);
    assert!(r.is_ok() && h.row_holds(2, 1), "{r:?}");
}

#[test]
fn a_store_past_its_deadline_never_publishes_its_block() {
    let h = Harness::new(&config(2), 16, BB);
    let tier = h.tier();
    let dir = dir_of(&h);
    tier.hang_disk_io(HangPoint::Write, 0, 1);
    h.fill(0, 7);
    let (r, took) = timed(
        &h,
        || tier.submit_store(1, &keys(&[7]), KEY_LEN, &[0]).unwrap(),
        1,
    );
    assert_on_time(&r, took);
    assert_eq!(r.num_done, 0);
    // At once a miss, not pending: nobody waits for the hung write.
    assert_eq!(h.lookup(&[7]), vec![Miss]);
    let r = h.load(2, &[7], &[3]);
    assert_eq!(r.error, Some(ErrorKind::NotFound), "{r:?}");

    tier.release_disk_io();
    assert!(tier.wait_disk_io_released(PATIENCE));
    eventually("the stuck thread is back", || {
        tier.stats().io_threads_stuck == 0
    });
    assert!(
        files(&dir, ".kvb").is_empty(),
        "the late write was published"
    );
    eventually("the late write's temporary file is removed", || {
        files(&dir, ".tmp").is_empty()
    });
    assert_eq!(h.lookup(&[7]), vec![Miss]);
    assert!(tier.poll(8).is_empty(), "a job was reported twice");
    // The key stores normally now.
    let r = h.store(3, &[7], &[0]);
    assert!(r.is_ok(), "{r:?}");
    let r = h.load(4, &[7], &[4]);
    assert!(r.is_ok() && h.row_holds(4, 7), "{r:?}");
}

/// Bytes this process has handed to `write`-family calls (`wchar` in
/// `/proc/self/io`, every thread's, O_DIRECT writes included).
fn bytes_written_by_process() -> u64 {
    let io = std::fs::read_to_string("/proc/self/io").unwrap();
    let line = io.lines().find(|l| l.starts_with("wchar:")).unwrap();
    line["wchar:".len()..].trim().parse().unwrap()
}

#[test]
fn a_store_reported_while_creating_its_file_writes_none_of_its_row() {
    run_in_child("child_store_reported_at_create");
}

/// A store reported at its deadline while its file was being created (an
/// `open` on a hung mount) has given its row back to the caller, who may be
/// writing it again: when the open returns, not even the kernel may read the
/// row into a file. In a child, so that no other test's writes are counted.
#[test]
#[ignore]
fn child_store_reported_at_create() {
    if std::env::var(CHILD_ENV).is_err() {
        return;
    }
    let h = Harness::new(&config(2), 16, BB);
    let tier = h.tier();
    let dir = dir_of(&h);
    tier.hang_disk_io(HangPoint::Create, 0, 1);
    h.fill(0, 7);
    let (r, took) = timed(
        &h,
        || tier.submit_store(1, &keys(&[7]), KEY_LEN, &[0]).unwrap(),
        1,
    );
    assert_on_time(&r, took);
    // Nothing may print from here until the late call is done: the test's
    // output is a write too.
    let before = bytes_written_by_process();
    tier.release_disk_io();
    assert!(tier.wait_disk_io_released(PATIENCE));
    eventually("the stuck thread is back", || {
        tier.stats().io_threads_stuck == 0
    });
    eventually("the late store's temporary file is removed", || {
        files(&dir, ".tmp").is_empty()
    });
    let written = bytes_written_by_process() - before;
    assert!(
        written < BB as u64,
        "the late store wrote {written} bytes after its job was reported"
    );
    assert!(
        files(&dir, ".kvb").is_empty(),
        "the late store was published"
    );
    // The key stores normally now.
    let r = h.store(2, &[7], &[0]);
    assert!(r.is_ok(), "{r:?}");
    let r = h.load(3, &[7], &[4]);
    assert!(r.is_ok() && h.row_holds(4, 7), "{r:?}");
}

#[test]
fn a_late_write_never_replaces_a_newer_store_of_its_key() {
    let h = Harness::new(&config(2), 16, BB);
    let tier = h.tier();
    tier.hang_disk_io(HangPoint::Write, 0, 1);
    h.fill(0, 7);
    let (r, took) = timed(
        &h,
        || tier.submit_store(1, &keys(&[7]), KEY_LEN, &[0]).unwrap(),
        1,
    );
    assert_on_time(&r, took);
    // A newer store of the same key, with other bytes, while the first
    // write still hangs.
    let newer = pattern(777, BB);
    h.write_row(1, &newer);
    assert!(h.store(2, &[7], &[1]).is_ok());
    tier.release_disk_io();
    assert!(tier.wait_disk_io_released(PATIENCE));
    eventually("the stuck thread is back", || {
        tier.stats().io_threads_stuck == 0
    });
    let r = h.load(3, &[7], &[2]);
    assert!(r.is_ok(), "{r:?}");
    assert_eq!(
        h.row(2),
        &newer[..],
        "the late write replaced the newer block"
    );
}

#[test]
fn a_rename_under_way_at_the_deadline_is_withdrawn() {
    let h = Harness::new(&config(2), 16, BB);
    let tier = h.tier();
    let dir = dir_of(&h);
    h.store_all(1, &[1]);
    tier.hang_disk_io(HangPoint::Publish, 0, 1);
    h.fill(0, 8);
    let (r, took) = timed(
        &h,
        || tier.submit_store(2, &keys(&[8]), KEY_LEN, &[0]).unwrap(),
        2,
    );
    assert_on_time(&r, took);
    assert_eq!(h.lookup(&[8]), vec![Miss]);
    tier.release_disk_io();
    assert!(tier.wait_disk_io_released(PATIENCE));
    eventually("the stuck thread is back", || {
        tier.stats().io_threads_stuck == 0
    });
    eventually("the withdrawn file is gone", || {
        files(&dir, ".kvb").len() == 1
    });
    assert_eq!(h.lookup(&[1, 8]), vec![Hit, Miss]);
    // Reopened, the directory holds only the block stored on time.
    let cfg = {
        let mut c = config(2);
        c.disk.path = Some(dir.clone());
        c
    };
    let mut h = h;
    h.scratch_dir = None; // the next harness removes it
    drop(h);
    let h = Harness::new(&cfg, 16, BB);
    assert_eq!(h.lookup(&[1, 8]), vec![Hit, Miss]);
}

#[test]
fn a_load_waiting_on_a_stuck_store_fails_on_time_too() {
    let h = Harness::new(&config(2), 16, BB);
    let tier = h.tier();
    tier.hang_disk_io(HangPoint::Write, 0, 1);
    h.fill(0, 9);
    let start = Instant::now();
    tier.submit_store(1, &keys(&[9]), KEY_LEN, &[0]).unwrap();
    assert_eq!(tier.wait_disk_io_hung(1, PATIENCE), 1);
    tier.submit_load(2, &keys(&[9]), KEY_LEN, &[3]).unwrap();
    let mut results = Vec::new();
    while results.len() < 2 {
        assert!(start.elapsed() < Duration::from_millis(TIMEOUT_MS) + SLACK);
        results.extend(tier.poll(2));
        tier.wait(Duration::from_millis(10));
    }
    results.sort_by_key(|r| r.job_id);
    assert_eq!(results[0].error, Some(ErrorKind::Io), "{results:?}");
    assert_eq!(results[0].reason, kvtier::FailReason::Deadline);
    assert_eq!(results[1].error, Some(ErrorKind::NotFound), "{results:?}");
    tier.release_disk_io();
    assert!(tier.wait_disk_io_released(PATIENCE));
    eventually("the stuck thread is back", || {
        tier.stats().io_threads_stuck == 0
    });
    assert!(tier.poll(8).is_empty());
}

#[test]
fn when_every_thread_is_stuck_new_jobs_fail_fast_and_lookups_answer() {
    // One thread and one replacement: two hung reads take both.
    let h = Harness::new(&config(1), 16, BB);
    h.store_all(1, &[1, 2, 3]);
    let tier = h.tier();
    tier.hang_disk_io(HangPoint::Read, 0, 2);
    let (r, took) = timed(
        &h,
        || tier.submit_load(2, &keys(&[1]), KEY_LEN, &[5]).unwrap(),
        2,
    );
    assert_on_time(&r, took);
    let (r, took) = timed(
        &h,
        || tier.submit_load(3, &keys(&[2]), KEY_LEN, &[6]).unwrap(),
        3,
    );
    assert_on_time(&r, took);
    assert_eq!(tier.stats().io_threads_stuck, 2);
    assert_eq!(
        tier.io_threads_alive(),
        2,
        "no more than io_threads replacements"
    );
    // No thread is left: a new job fails at once instead of queueing. The
    // engine retries key 3 more often than MAX_TRANSIENT_LOAD_FAILURES, but
    // nothing was read: the key is not forgotten.
    let start = Instant::now();
    let retries = [(4, 7), (40, 13), (41, 14), (42, 15)];
    assert!(retries.len() as u32 > kvtier::MAX_TRANSIENT_LOAD_FAILURES);
    for (job, row) in retries {
        tier.submit_load(job, &keys(&[3]), KEY_LEN, &[row]).unwrap();
    }
    h.fill(8, 4);
    tier.submit_store(5, &keys(&[4]), KEY_LEN, &[8]).unwrap();
    let mut results = Vec::new();
    while results.len() < retries.len() + 1 {
        results.extend(tier.poll(8));
        tier.wait(Duration::from_millis(5));
        assert!(start.elapsed() < SLACK, "{results:?}");
    }
    assert!(
        start.elapsed() < Duration::from_millis(TIMEOUT_MS),
        "queued instead of failing fast: {:?}",
        start.elapsed()
    );
    assert!(
        results
            .iter()
            .all(|r| r.error == Some(ErrorKind::Io) && r.reason == kvtier::FailReason::Unavailable),
        "{results:?}"
    );
    // Lookups never wait on storage.
    assert_eq!(h.lookup(&[1, 2, 3, 4]), vec![Hit, Hit, Hit, Miss]);

    tier.release_disk_io();
    assert!(tier.wait_disk_io_released(PATIENCE));
    eventually("the crew is back to io_threads", || {
        tier.io_threads_alive() == 1 && tier.stats().io_threads_stuck == 0
    });
    assert!(tier.poll(8).is_empty(), "a job was reported twice");
    h.fill(8, 4);
    assert!(h.store(6, &[4], &[8]).is_ok());
    let r = h.load(7, &[1, 2, 3, 4], &[9, 10, 11, 12]);
    assert!(
        r.is_ok() && h.row_holds(9, 1) && h.row_holds(12, 4),
        "{r:?}"
    );
}

#[test]
fn repeated_hangs_leak_no_threads_beyond_the_bound() {
    let h = Harness::new(&config(2), 16, BB);
    let tier = h.tier();
    for round in 0..6u64 {
        let key = 100 + round;
        h.store_all(10 * round + 1, &[key]);
        tier.hang_disk_io(HangPoint::Read, 0, 1);
        let job = 10 * round + 2;
        let (r, took) = timed(
            &h,
            || tier.submit_load(job, &keys(&[key]), KEY_LEN, &[5]).unwrap(),
            job,
        );
        assert_on_time(&r, took);
        assert!(tier.io_threads_alive() <= 4);
        tier.release_disk_io();
        assert!(tier.wait_disk_io_released(PATIENCE));
        eventually("the crew is back to io_threads", || {
            tier.io_threads_alive() == 2 && tier.stats().io_threads_stuck == 0
        });
    }
    assert_eq!(tier.stats().io_deadlines_missed, 6);
    let named = kvtier_threads();
    // Other tests of this binary run tiers too (at most a few threads each).
    assert!(named <= 40, "{named} kvtier threads");
}

#[test]
fn a_block_that_hangs_every_time_is_dropped_after_a_few_tries() {
    let h = Harness::new(&config(2), 16, BB);
    h.store_all(1, &[1]);
    let tier = h.tier();
    for attempt in 0..kvtier::MAX_TRANSIENT_LOAD_FAILURES as u64 {
        assert_eq!(h.lookup(&[1]), vec![Hit]);
        tier.hang_disk_io(HangPoint::Read, 0, 1);
        let job = 10 + attempt;
        let (r, took) = timed(
            &h,
            || tier.submit_load(job, &keys(&[1]), KEY_LEN, &[5]).unwrap(),
            job,
        );
        assert_on_time(&r, took);
        tier.release_disk_io();
        assert!(tier.wait_disk_io_released(PATIENCE));
        eventually("the stuck thread is back", || {
            tier.stats().io_threads_stuck == 0
        });
    }
    // The engine is not told HIT for it forever (vLLM's livelock on one bad
    // block file).
    eventually("the key is dropped", || h.lookup(&[1]) == vec![Miss]);
}

/// Threads of this process named by kvtier.
fn kvtier_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .flatten()
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.starts_with("kvtier"))
        })
        .count()
}

#[test]
fn the_deadline_shows_in_describe_and_0_turns_it_off() {
    let h = Harness::new(&config(2), 16, BB);
    let line = h.tier().describe();
    assert!(
        line.contains(&format!("io_timeout_ms={TIMEOUT_MS}")),
        "{line}"
    );
    let mut c = config(2);
    c.io_timeout_ms = Some(0);
    let off = Harness::new(&c, 16, BB);
    let line = off.tier().describe();
    assert!(!line.contains("io_timeout_ms"), "{line}");
    // Without a deadline the tier still works (in-place I/O, no watchdog).
    off.store_all(1, &[1]);
    let r = off.load(2, &[1], &[5]);
    assert!(r.is_ok() && off.row_holds(5, 1));
    let mut c = disk_config(16, BB);
    c.io_timeout_ms = None;
    let default = Harness::new(&c, 16, BB);
    let line = default.tier().describe();
    // The default is auto, chosen by file system (tests/disk_auto_deadline.rs).
    assert!(line.contains("io_timeout_ms=auto ("), "{line}");
}

// ---- a real hung mount ----

/// A FUSE mount whose server never answers: every call that reaches it
/// (a lookup of a name under it, an open, a stat) sleeps in the kernel, as
/// on a hung NFS or Lustre mount, until the connection is aborted by
/// closing the device ([`HungMount::recover`]). Needs root and /dev/fuse.
struct HungMount {
    at: PathBuf,
    device: Option<std::fs::File>,
}

impl HungMount {
    fn mount(at: &Path) -> Result<HungMount, String> {
        use std::os::fd::AsRawFd;
        use std::os::unix::ffi::OsStrExt;
        let device = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/fuse")
            .map_err(|e| format!("/dev/fuse: {e}"))?;
        let target = std::ffi::CString::new(at.as_os_str().as_bytes()).unwrap();
        let data = std::ffi::CString::new(format!(
            "fd={},rootmode=40000,user_id=0,group_id=0",
            device.as_raw_fd()
        ))
        .unwrap();
        // SAFETY: NUL-terminated strings that outlive the call.
        let rc = unsafe {
            libc::mount(
                c"kvtier-hung".as_ptr(),
                target.as_ptr(),
                c"fuse".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV,
                data.as_ptr() as *const libc::c_void,
            )
        };
        if rc != 0 {
            return Err(format!("mount: {}", std::io::Error::last_os_error()));
        }
        // The kernel's INIT request is never read, let alone answered: the
        // connection never initializes, and every request waits for it.
        Ok(HungMount {
            at: at.to_path_buf(),
            device: Some(device),
        })
    }

    /// The device recovers: the connection is aborted (calls under the
    /// mount return ENOTCONN) and the mount is detached.
    fn recover(&mut self) {
        self.device.take();
        let target = std::ffi::CString::new(self.at.as_os_str().to_str().unwrap()).unwrap();
        // SAFETY: a NUL-terminated path.
        unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
    }
}

impl Drop for HungMount {
    fn drop(&mut self) {
        self.recover();
    }
}

/// A key (by id) whose block lands in fan-out directory `fan`, and one that
/// does not.
fn keys_in_and_out_of(dir: &Path, fan: &Path) -> (u64, u64) {
    let path_of = |i: u64| {
        let name = format!(
            "{}.kvb",
            key(i)
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<String>()
        );
        files(dir, ".kvb")
            .into_iter()
            .find(|p| p.file_name().unwrap().to_str() == Some(&name))
    };
    let inside = (1..64).find(|&i| path_of(i).is_some_and(|p| p.parent() == Some(fan)));
    let outside = (1..64).find(|&i| path_of(i).is_some_and(|p| p.parent() != Some(fan)));
    (inside.unwrap(), outside.unwrap())
}

#[test]
fn a_hung_mount_fails_its_own_blocks_on_time_and_nothing_else() {
    let h = Harness::new(&config(2), 64, BB);
    let tier = h.tier();
    let dir = dir_of(&h);
    let ids: Vec<u64> = (1..64).collect();
    h.store_all(1, &ids);
    // The fan-out directory of block 1 goes to a hung device: its files are
    // hidden under a mount whose server never answers.
    let fan = files(&dir, ".kvb")
        .into_iter()
        .find(|p| {
            p.file_name().unwrap().to_str()
                == Some(&format!(
                    "{}.kvb",
                    key(1)
                        .iter()
                        .map(|b| format!("{b:02x}"))
                        .collect::<String>()
                ))
        })
        .unwrap()
        .parent()
        .unwrap()
        .to_path_buf();
    let (hung, healthy) = keys_in_and_out_of(&dir, &fan);
    let mut mount = match HungMount::mount(&fan) {
        Ok(m) => m,
        Err(why) => {
            common::skip(&format!(
                "cannot mount a FUSE file system here (needs root and /dev/fuse): {why}"
            ));
            return;
        }
    };
    let sentinel = vec![0xeeu8; BB];
    h.write_row(40, &sentinel);
    let (r, took) = timed(
        &h,
        || tier.submit_load(2, &keys(&[hung]), KEY_LEN, &[40]).unwrap(),
        2,
    );
    assert_on_time(&r, took);
    assert_eq!(tier.stats().io_threads_stuck, 1);
    // Blocks elsewhere load, lookups answer.
    let r = h.load(3, &[healthy], &[41]);
    assert!(r.is_ok() && h.row_holds(41, healthy), "{r:?}");
    assert_eq!(h.lookup(&[hung, healthy]), vec![Hit, Hit]);

    // The device recovers: the stuck open returns an error, which is
    // discarded; the row was never written; the tier works normally.
    mount.recover();
    eventually("the stuck thread is back", || {
        tier.stats().io_threads_stuck == 0 && tier.io_threads_alive() == 2
    });
    assert_eq!(h.row(40), &sentinel[..]);
    assert!(tier.poll(8).is_empty(), "a job was reported twice");
    let r = h.load(4, &[hung], &[40]);
    assert!(r.is_ok() && h.row_holds(40, hung), "{r:?}");
}

// ---- tier_free with calls stuck on the device ----
//
// Each runs in a child process (this binary again, one ignored test): it
// counts the process's kvtier threads, which other tests would add to, and
// unmaps the primary buffer after `tier_free`, so a late touch of it kills
// that process only.

/// Set for a child process run by [`run_in_child`].
const CHILD_ENV: &str = "KVTIER_DEADLINE_CHILD";
/// How long `tier_free` may take with calls stuck: the healthy threads'
/// drain (nothing here) on a loaded machine, not the stuck call.
const FREE_BOUND: Duration = Duration::from_secs(2);

/// Runs the ignored test `name` of this binary in a new process and checks
/// that it passed (and exited: a leftover thread stuck forever would not stop
/// it, but a hung `tier_free` would, and is killed after a while).
fn run_in_child(name: &str) {
    let child = test_child(name)
        .env(CHILD_ENV, "1")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let out = match rx.recv_timeout(Duration::from_secs(120)) {
        Ok(out) => out.unwrap(),
        Err(_) => {
            // SAFETY: a plain signal to our own child.
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
            panic!("{name} never ended");
        }
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "{name} failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    // Anywhere in a line: with --nocapture the child's output follows
    // libtest's "test <name> ... " on the same line.
    if let Some((_, why)) = stdout.lines().find_map(|l| l.split_once("skipped:")) {
        common::skip(why.trim());
    }
}

/// A primary buffer of its own pages, which the test unmaps after
/// `tier_free`: the library touching it afterwards faults.
struct Mapped {
    ptr: *mut u8,
    len: usize,
}

impl Mapped {
    fn new(len: usize) -> Mapped {
        // SAFETY: an anonymous private mapping; the result is checked.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(ptr, libc::MAP_FAILED);
        Mapped {
            ptr: ptr as *mut u8,
            len,
        }
    }

    fn primary(&self) -> kvtier::PrimaryBuffer {
        // SAFETY: mapped until `unmap`, which the tests call only after the
        // tier is freed.
        unsafe { kvtier::PrimaryBuffer::new(self.ptr, self.len, BB) }.unwrap()
    }

    fn fill(&self, row: usize, i: u64) {
        let bytes = pattern(i, BB);
        assert!((row + 1) * BB <= self.len);
        // SAFETY: in bounds; no job uses the row meanwhile.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.ptr.add(row * BB), BB) };
    }

    fn unmap(self) {
        // SAFETY: our own mapping, unmapped once.
        assert_eq!(
            unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.len) },
            0
        );
    }
}

fn result_of(tier: &kvtier::Tier, job: u64) -> kvtier::JobResult {
    let end = Instant::now() + PATIENCE;
    loop {
        if let Some(r) = tier.poll(1).first() {
            assert_eq!(r.job_id, job, "unexpected result {r:?}");
            return *r;
        }
        assert!(Instant::now() < end, "job {job} never finished");
        tier.wait(Duration::from_millis(10));
    }
}

/// Frees `tier` and returns how long that took; fails if it takes longer
/// than [`FREE_BOUND`] (after letting the device recover, so the process can
/// end).
fn free_promptly(tier: kvtier::Tier, recover: impl FnOnce()) -> Duration {
    let (tx, rx) = std::sync::mpsc::channel();
    let start = Instant::now();
    std::thread::spawn(move || {
        drop(tier);
        let _ = tx.send(());
    });
    match rx.recv_timeout(FREE_BOUND) {
        Ok(()) => start.elapsed(),
        Err(_) => {
            recover();
            panic!("tier_free waited more than {FREE_BOUND:?}: it waits for the stuck call");
        }
    }
}

/// Opens a tier on `cfg`'s directory again, as soon as the freed tier lets
/// go of it.
fn reopen(cfg: &TierConfig, primary: &Mapped) -> kvtier::Tier {
    let end = Instant::now() + PATIENCE;
    loop {
        match kvtier::Tier::new(cfg, primary.primary()) {
            Ok(tier) => return tier,
            Err(e) => assert!(
                Instant::now() < end,
                "the directory never came back: {}",
                e.message()
            ),
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The reopen of a directory a freed tier still holds fails, saying why.
fn assert_held_by_freed_tier(cfg: &TierConfig, calls: &str) {
    let other = Mapped::new(16 * BB);
    let e = kvtier::Tier::new(cfg, other.primary()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Io, "{}", e.message());
    assert!(
        e.message().contains(&format!("freed while {calls} stuck")),
        "{}",
        e.message()
    );
    other.unmap();
}

fn assert_no_kvtier_thread_left() {
    eventually("every kvtier thread has ended", || kvtier_threads() == 0);
}

/// One call hangs at `point` (a store's for Create, Write and Publish, a
/// load's for Read) and the tier is freed meanwhile.
fn free_while_stuck_at(point: HangPoint) {
    let dir = scratch_dir();
    let mut cfg = config(2);
    cfg.disk.path = Some(dir.clone());
    let mem = Mapped::new(16 * BB);
    let tier = kvtier::Tier::new(&cfg, mem.primary()).unwrap();
    mem.fill(0, 1);
    tier.submit_store(1, &keys(&[1]), KEY_LEN, &[0]).unwrap();
    assert!(result_of(&tier, 1).is_ok());
    mem.fill(0, 7);
    let seam = tier.disk_io_seam();
    tier.hang_disk_io(point, 0, 1);
    let start = Instant::now();
    match point {
        HangPoint::Read => tier.submit_load(2, &keys(&[1]), KEY_LEN, &[5]),
        _ => tier.submit_store(2, &keys(&[7]), KEY_LEN, &[0]),
    }
    .unwrap();
    let r = result_of(&tier, 2);
    assert_on_time(&r, start.elapsed());
    assert_eq!(tier.wait_disk_io_hung(1, PATIENCE), 1);
    assert_eq!(tier.stats().io_threads_stuck, 1);

    // Freed while the call hangs: it returns without waiting for it.
    let took = free_promptly(tier, || seam.release());
    println!("{point:?}: tier_free took {took:?} with a call stuck");
    // The caller takes its buffer back; the stuck thread touching it now
    // would kill this process.
    mem.unmap();
    // The freed tier's call may still write in the directory: it keeps it.
    assert_held_by_freed_tier(&cfg, "1 I/O call was");

    // The device recovers: the late call finds its job reported, publishes
    // nothing, removes its temporary file, and its thread ends, letting go
    // of the directory.
    seam.release();
    let mem = Mapped::new(16 * BB);
    let tier = reopen(&cfg, &mem);
    assert!(files(&dir, ".tmp").is_empty(), "{:?}", files(&dir, ".tmp"));
    assert_eq!(files(&dir, ".kvb").len(), 1, "the late store was published");
    assert_eq!(
        tier.lookup(&keys(&[1, 7]), KEY_LEN).unwrap(),
        vec![Hit, Miss]
    );
    tier.submit_load(3, &keys(&[1]), KEY_LEN, &[2]).unwrap();
    assert!(result_of(&tier, 3).is_ok());
    drop(tier);
    mem.unmap();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn tier_free_leaves_stuck_calls_behind_and_they_clean_up_when_they_return() {
    run_in_child("child_free_while_stuck");
}

#[test]
#[ignore]
fn child_free_while_stuck() {
    if std::env::var(CHILD_ENV).is_err() {
        return;
    }
    for point in [
        HangPoint::Create,
        HangPoint::Write,
        HangPoint::Publish,
        HangPoint::Read,
    ] {
        free_while_stuck_at(point);
    }
    assert_no_kvtier_thread_left();
}

#[test]
fn tier_free_on_a_hung_mount_returns_at_once_and_the_process_ends_cleanly() {
    run_in_child("child_free_on_a_hung_mount");
}

#[test]
#[ignore]
fn child_free_on_a_hung_mount() {
    if std::env::var(CHILD_ENV).is_err() {
        return;
    }
    let dir = scratch_dir();
    let mut cfg = config(2);
    cfg.disk.path = Some(dir.clone());
    let mem = Mapped::new(64 * BB);
    let tier = kvtier::Tier::new(&cfg, mem.primary()).unwrap();
    mem.fill(0, 1);
    tier.submit_store(1, &keys(&[1]), KEY_LEN, &[0]).unwrap();
    assert!(result_of(&tier, 1).is_ok());
    // Block 1's fan-out directory goes to a hung device, and so does the
    // file a store of block `new` would create there.
    let fan = tier
        .disk_block_path(&key(1))
        .parent()
        .unwrap()
        .to_path_buf();
    let new = (1000..1_000_000)
        .find(|&i| tier.disk_block_path(&key(i)).parent() == Some(fan.as_path()))
        .unwrap();
    let mut mount = match HungMount::mount(&fan) {
        Ok(m) => m,
        Err(why) => {
            // The parent (run_in_child) reports the skip, or fails under CI=true.
            println!(
                "skipped: cannot mount a FUSE file system here (needs root and /dev/fuse): {why}"
            );
            return;
        }
    };
    let start = Instant::now();
    tier.submit_load(2, &keys(&[1]), KEY_LEN, &[5]).unwrap();
    mem.fill(6, new);
    tier.submit_store(3, &keys(&[new]), KEY_LEN, &[6]).unwrap();
    let mut results = Vec::new();
    while results.len() < 2 {
        assert!(start.elapsed() < PATIENCE, "{results:?}");
        results.extend(tier.poll(2));
        tier.wait(Duration::from_millis(10));
    }
    results.sort_by_key(|r| r.job_id);
    assert_eq!(results[0].job_id, 2);
    for r in &results {
        assert_on_time(r, start.elapsed());
    }
    assert_eq!(tier.stats().io_threads_stuck, 2);

    // Freed with both calls asleep in the kernel.
    let took = free_promptly(tier, || mount.recover());
    println!("tier_free took {took:?} with 2 calls stuck on a hung mount");
    mem.unmap();
    assert_held_by_freed_tier(&cfg, "2 I/O calls were");
    // The threads left behind are the stuck ones (and nothing more). The
    // joined ones may stay listed in /proc/self/task a moment after their
    // join returned (see tests/prefault.rs).
    eventually("only the 2 stuck kvtier threads are left", || {
        kvtier_threads() <= 2
    });

    // The device recovers: the stuck calls fail (ENOTCONN), their threads
    // clean up and end, and the directory is free again.
    mount.recover();
    let mem = Mapped::new(64 * BB);
    let tier = reopen(&cfg, &mem);
    assert_eq!(
        tier.lookup(&keys(&[1, new]), KEY_LEN).unwrap(),
        vec![Hit, Miss]
    );
    tier.submit_load(4, &keys(&[1]), KEY_LEN, &[5]).unwrap();
    assert!(result_of(&tier, 4).is_ok());
    assert!(files(&dir, ".tmp").is_empty(), "{:?}", files(&dir, ".tmp"));
    drop(tier);
    mem.unmap();
    assert_no_kvtier_thread_left();
    drop(mount);
    let _ = std::fs::remove_dir_all(&dir);
}
