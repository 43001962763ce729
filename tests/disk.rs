//! The disk backend beyond the common contract (which tests/contract.rs runs on
//! it too): file layout, restart, crash safety, corruption, faults, sharing.

mod common;

use common::*;
use kvtier::{
    ErrorKind, EventKind, LookupState::*, RemovedReason, StoredReason, TierConfig,
    MAX_TRANSIENT_LOAD_FAILURES,
};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BB: usize = 4096;

fn config(dir: &Path, capacity_blocks: usize) -> TierConfig {
    let mut c = disk_config(capacity_blocks, BB);
    c.disk.path = Some(dir.to_path_buf());
    c
}

/// The namespace directory a tier made under `root`.
fn ns_dir(root: &Path) -> PathBuf {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(root)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    assert_eq!(dirs.len(), 1, "{dirs:?}");
    dirs.pop().unwrap()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

const LONG_KEY_LEN: usize = 120;

/// A key long enough for a hashed file name.
fn long_key(i: u64) -> Vec<u8> {
    let mut k = key(i);
    k.resize(LONG_KEY_LEN, 0x5a);
    k
}

/// File descriptors held open until dropped, so that only `spare` are left
/// below a lowered RLIMIT_NOFILE (child processes only: the limit and the
/// shortage are process-wide).
struct FdHoard {
    _held: Vec<std::fs::File>,
}

impl FdHoard {
    fn leaving(spare: usize) -> FdHoard {
        let limit = libc::rlimit {
            rlim_cur: 256,
            rlim_max: 256,
        };
        // SAFETY: a valid rlimit value.
        assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) }, 0);
        let mut held = Vec::new();
        loop {
            match std::fs::File::open("/dev/null") {
                Ok(f) => held.push(f),
                Err(e) if e.raw_os_error() == Some(libc::EMFILE) => break,
                Err(e) => panic!("{e}"),
            }
        }
        held.truncate(held.len() - spare);
        FdHoard { _held: held }
    }
}

/// The block file of key `i`.
fn block_file(root: &Path, i: u64) -> PathBuf {
    let name = format!("{}.kvb", hex(&key(i)));
    files(&ns_dir(root), ".kvb")
        .into_iter()
        .find(|p| p.file_name().unwrap().to_str() == Some(&name))
        .unwrap_or_else(|| panic!("no file for key {i}"))
}

/// Where the payload starts in a block file: after the 4096-byte header in
/// the file, or at 0 when the header is the file's attribute (a file of the
/// padded payload's length; see src/backend/disk/format.rs).
fn payload_at(file: &Path) -> usize {
    match std::fs::metadata(file).unwrap().len() as usize {
        len if len == BB + 4096 => 4096,
        len if len == BB => 0,
        len => panic!("{}: a block file of {len} bytes", file.display()),
    }
}

const HEADER_ATTR: &std::ffi::CStr = c"user.kvtier";

/// The block header attribute of a file, if it has one.
fn header_attr(file: &Path) -> Option<Vec<u8>> {
    let path = std::ffi::CString::new(file.as_os_str().as_encoded_bytes()).unwrap();
    let mut value = vec![0u8; 256];
    // SAFETY: NUL-terminated strings and a buffer of the length given.
    let n = unsafe {
        libc::getxattr(
            path.as_ptr(),
            HEADER_ATTR.as_ptr(),
            value.as_mut_ptr().cast(),
            value.len(),
        )
    };
    (n >= 0).then(|| value[..n as usize].to_vec())
}

/// Sets (or with None removes) a file's block header attribute.
fn set_header_attr(file: &Path, value: Option<&[u8]>) {
    let path = std::ffi::CString::new(file.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: NUL-terminated strings and a value of the length given.
    let rc = unsafe {
        match value {
            Some(v) => libc::setxattr(
                path.as_ptr(),
                HEADER_ATTR.as_ptr(),
                v.as_ptr().cast(),
                v.len(),
                0,
            ),
            None => libc::removexattr(path.as_ptr(), HEADER_ATTR.as_ptr()),
        }
    };
    assert_eq!(
        rc,
        0,
        "{}: {}",
        file.display(),
        std::io::Error::last_os_error()
    );
}

/// Copies a block file with its header attribute (std::fs::copy leaves
/// attributes behind).
fn copy_block_file(from: &Path, to: &Path) {
    std::fs::copy(from, to).unwrap();
    if let Some(attr) = header_attr(from) {
        set_header_attr(to, Some(&attr));
    }
}

/// Waits until background discards have deleted files down to `n`.
fn wait_for_files(dir: &Path, n: usize) -> usize {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let count = files(dir, ".kvb").len();
        if count == n || Instant::now() > deadline {
            return count;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A full tier under a stream of stores, with more jobs in flight than it
/// has workers, keeps its directory near its capacity: the deletes of what
/// its stores evict are not left behind the stores (before, they waited
/// until no store was queued, and the files of every block stored stayed).
#[test]
fn a_stream_of_stores_leaves_the_directory_near_capacity() {
    let dir = scratch_dir();
    let (capacity, job_blocks, window, jobs) = (256, 8, 16, 300);
    let h = Harness::new(&config(&dir, capacity), job_blocks, BB);
    let most = h.stream_stores(1000, jobs, job_blocks, window, 5, || {
        files(&dir, ".kvb").len()
    });
    let bound = Harness::stream_bound(capacity, window, job_blocks);
    assert!(
        most <= bound,
        "{most} block files for a {capacity}-block tier (bound {bound}; {} stored)",
        jobs as usize * job_blocks
    );
    h.tier().drain();
    assert_eq!(wait_for_files(&dir, capacity), capacity);
}

/// A store submitted into a stream of loads, with more load jobs in flight
/// than the tier has workers, finishes while the loads go on (before, stores
/// waited until no load was queued).
#[test]
fn a_store_finishes_within_a_stream_of_loads() {
    let dir = scratch_dir();
    let job_blocks = 16;
    let mut cfg = config(&dir, 64);
    cfg.io_threads = Some(1);
    let h = Harness::new(&cfg, 2 * job_blocks, BB);
    let loaded: Vec<u64> = (1..=job_blocks as u64).collect();
    h.store_all(1, &loaded);
    let load_rows: Vec<i64> = (0..job_blocks as i64).collect();
    let store_rows: Vec<i64> = (job_blocks as i64..2 * job_blocks as i64).collect();
    let stored: Vec<u64> = (100..100 + job_blocks as u64).collect();
    for (&row, &i) in store_rows.iter().zip(&stored) {
        h.fill(row as usize, i);
    }
    let (loads, window, store_after, store_job) = (600u64, 8u64, 20u64, 1_000_000u64);
    let (mut submitted, mut done) = (0u64, 0u64);
    let mut store_done_at = None;
    let deadline = Instant::now() + Duration::from_secs(60);
    while done < loads {
        while submitted < loads && submitted - done < window {
            h.tier()
                .submit_load(10 + submitted, &keys(&loaded), KEY_LEN, &load_rows)
                .unwrap();
            submitted += 1;
        }
        if done >= store_after && submitted == done + window && store_done_at.is_none() {
            // Once: the store joins a queue that holds loads.
            h.tier()
                .submit_store(store_job, &keys(&stored), KEY_LEN, &store_rows)
                .unwrap();
            store_done_at = Some(None);
        }
        let results = h.tier().poll(16);
        if results.is_empty() {
            assert!(Instant::now() < deadline, "jobs stopped");
            h.tier().wait(Duration::from_millis(10));
        }
        for r in results {
            assert!(r.is_ok(), "{r:?}");
            if r.job_id == store_job {
                store_done_at = Some(Some(done));
            } else {
                done += 1;
            }
        }
    }
    let at = store_done_at
        .expect("the store was submitted")
        .expect("the store finished only after the last load");
    assert!(
        at < store_after + 100,
        "the store finished after {} more loads",
        at - store_after
    );
    assert_eq!(h.present(&stored), stored);
}

#[test]
fn files_are_laid_out_by_key_with_owner_only_root() {
    let dir = scratch_dir();
    let mut h = Harness::new(&config(&dir, 16), 16, BB);
    h.scratch_dir = None; // reopened below; removed at the end
    h.store_all(1, &[1, 2, 3]);
    assert_eq!(
        std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777,
        0o700
    );
    let ns = ns_dir(&dir);
    assert!(ns
        .file_name()
        .unwrap()
        .to_str()
        .unwrap()
        .starts_with("contract-"));
    let blocks = files(&ns, ".kvb");
    assert_eq!(blocks.len(), 3);
    // The header is an attribute where the file system keeps them (ext4,
    // xfs, tmpfs), else the file's first 4096 bytes (ramfs: the re-run of
    // these tests in o_direct_auto_falls_back...).
    let line = h.tier().describe();
    let in_attr = line.contains("headers in xattrs");
    assert!(in_attr || line.contains("headers in the files"), "{line}");
    for p in &blocks {
        assert_eq!(
            std::fs::metadata(p).unwrap().len(),
            if in_attr { BB } else { 2 * BB } as u64,
            "payload, after a header unless it is an attribute: {line}"
        );
        assert_eq!(header_attr(p).map(|v| v.len()), in_attr.then_some(56));
        let fan = p.parent().unwrap().file_name().unwrap().to_str().unwrap();
        assert_eq!(fan.len(), 2, "fan-out directory");
        assert!(fan
            .bytes()
            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
    }
    assert!(files(&ns, ".tmp").is_empty());
    let name = ns.file_name().unwrap().to_str().unwrap();
    assert!(name.ends_with(&format!("-b{BB}-v3")), "{name}");
    assert!(
        line.contains("disk:") && !line.contains("older kvtier"),
        "{line}"
    );
    drop(h);

    // The layout before -v3 (4096 fan-out directories) beside it is left
    // alone, and tier_describe says it is there.
    let legacy = dir.join(name.strip_suffix("-v3").unwrap());
    std::fs::create_dir_all(legacy.join("abc")).unwrap();
    std::fs::write(legacy.join("abc").join("0101.kvb"), b"an old block").unwrap();
    let mut h = Harness::new(&config(&dir, 16), 16, BB);
    h.scratch_dir = None;
    assert_eq!(h.present(&[1, 2, 3]), [1, 2, 3]);
    let line = h.tier().describe();
    assert!(
        line.contains("older kvtier's layout, not read")
            && line.contains(name.strip_suffix("-v3").unwrap()),
        "{line}"
    );
    drop(h);
    assert!(legacy.join("abc").join("0101.kvb").exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn prepare_dirs_creates_every_fan_out_directory_once() {
    let dir = scratch_dir();
    let mut c = config(&dir, 8);
    c.disk.prepare_dirs = true;
    {
        let mut h = Harness::new(&c, 8, BB);
        h.scratch_dir = None;
    }
    let fans = std::fs::read_dir(ns_dir(&dir))
        .unwrap()
        .flatten()
        .filter(|e| e.path().is_dir())
        .count();
    assert_eq!(fans, 256);
    // Reopening finds them in place; the tier works as usual.
    let h = Harness::new(&c, 8, BB);
    h.store_all(1, &[1, 2]);
    assert!(h.load(2, &[1, 2], &[5, 6]).is_ok() && h.row_holds(6, 2));
}

#[test]
fn reopening_rebuilds_the_index_and_loads_byte_exact() {
    let dir = scratch_dir();
    {
        let mut h = Harness::new(&config(&dir, 64), 64, BB);
        for job in 0..4 {
            let ids: Vec<u64> = (job * 10..job * 10 + 10).collect();
            h.store_all(job, &ids);
        }
        let long = vec![7u8; 128];
        h.fill(0, 999);
        h.tier().submit_store(9, &long, 128, &[0]).unwrap();
        assert!(h.result_of(9).is_ok());
        h.scratch_dir = None; // keep the directory
    }
    // Debris of an interrupted store. Only a crash leaves it, and a crash
    // leaves no manifest: the open scans (tests/manifest.rs covers the
    // clean close).
    std::fs::remove_file(ns_dir(&dir).join(".manifest")).unwrap();
    let fan = files(&ns_dir(&dir), ".kvb")[0]
        .parent()
        .unwrap()
        .to_path_buf();
    std::fs::write(fan.join("00ff.kvb.123-4.tmp"), b"partial").unwrap();
    let h = Harness::new(&config(&dir, 64), 64, BB);
    assert!(
        files(&ns_dir(&dir), ".tmp").is_empty(),
        "temp debris removed at open"
    );
    assert_eq!(h.tier().stats().num_blocks, 41);
    let ids: Vec<u64> = (0..40).collect();
    assert!(h.lookup(&ids).iter().all(|&s| s == Hit));
    let rows: Vec<i64> = (0..40).collect();
    let r = h.load(1, &ids, &rows);
    assert!(r.is_ok(), "{r:?}");
    for &i in &ids {
        assert!(h.row_holds(i as usize, i), "block {i}");
    }
    h.tier().submit_load(2, &[7u8; 128], 128, &[63]).unwrap();
    assert!(h.result_of(2).is_ok());
    assert!(
        h.row_holds(63, 999),
        "a long key (hashed file name) is recovered"
    );
}

#[test]
fn reopening_with_less_capacity_keeps_the_newest_blocks() {
    let dir = scratch_dir();
    {
        let mut h = Harness::new(&config(&dir, 16), 16, BB);
        for i in 0..8 {
            h.store_all(i, &[i]);
            // File times order the blocks at the next open.
            std::thread::sleep(Duration::from_millis(15));
        }
        h.scratch_dir = None;
    }
    let h = Harness::new(&config(&dir, 4), 16, BB);
    assert_eq!(h.present(&(0..8).collect::<Vec<_>>()), vec![4, 5, 6, 7]);
    assert_eq!(
        wait_for_files(&ns_dir(&dir), 4),
        4,
        "evicted at open, files deleted"
    );
}

/// Recovery scans the fan-out directories on several threads: the order of
/// the blocks is still their files' modification times across every
/// directory, and a misplaced or upper-case name (a key decodes from it, but
/// no lookup would find it there) is deleted while its rightful copy stays.
#[test]
fn recovery_orders_blocks_by_mtime_across_all_fan_out_directories() {
    let dir = scratch_dir();
    let n = 256u64;
    {
        let mut h = Harness::new(&config(&dir, n as usize), 64, BB);
        for job in 0..n / 64 {
            h.store_all(job, &(job * 64..job * 64 + 64).collect::<Vec<_>>());
        }
        h.scratch_dir = None;
    }
    // As after a crash (no manifest), the open scans: ages unrelated to key
    // order or directory: block i is rank (i * 97) % n seconds newer than
    // the oldest.
    std::fs::remove_file(ns_dir(&dir).join(".manifest")).unwrap();
    let base = std::time::SystemTime::now() - Duration::from_secs(3600);
    let rank = |i: u64| (i * 97) % n;
    for i in 0..n {
        let f = std::fs::File::options()
            .write(true)
            .open(block_file(&dir, i))
            .unwrap();
        f.set_modified(base + Duration::from_secs(rank(i))).unwrap();
    }
    let ns = ns_dir(&dir);
    let newest_key = (0..n).find(|&i| rank(i) == n - 1).unwrap();
    let original = block_file(&dir, newest_key);
    let fan = original
        .parent()
        .unwrap()
        .file_name()
        .unwrap()
        .to_str()
        .unwrap()
        .to_string();
    let other_fan = ns.join(if fan == "000" { "001" } else { "000" });
    std::fs::create_dir_all(&other_fan).unwrap();
    let misplaced = other_fan.join(original.file_name().unwrap());
    std::fs::copy(&original, &misplaced).unwrap();
    let upper = original.with_file_name(format!("{}.kvb", hex(&key(newest_key)).to_uppercase()));
    std::fs::copy(&original, &upper).unwrap();

    // Half the capacity: the newer half of the blocks stays, by rank.
    let h = Harness::new(&config(&dir, n as usize / 2), 64, BB);
    let mut newest: Vec<u64> = (0..n).filter(|&i| rank(i) >= n / 2).collect();
    newest.sort_unstable();
    assert_eq!(h.present(&(0..n).collect::<Vec<_>>()), newest);
    assert!(!misplaced.exists(), "a misplaced copy is deleted");
    assert!(!upper.exists(), "an upper-case name is deleted");
    assert!(original.exists(), "the block's own file stays");
    assert_eq!(wait_for_files(&ns, n as usize / 2), n as usize / 2);
}

#[test]
fn other_namespaces_and_block_sizes_are_never_mixed() {
    let dir = scratch_dir();
    {
        let mut h = Harness::new(&config(&dir, 16), 16, BB);
        h.store_all(1, &[1, 2]);
        h.scratch_dir = None;
    }
    let mut other = config(&dir, 16);
    other.namespace = "another-model".into();
    {
        let mut h = Harness::new(&other, 16, BB);
        assert_eq!(h.lookup(&[1, 2]), [Miss, Miss]);
        h.scratch_dir = None;
    }
    let h = Harness::new(&config(&dir, 16), 16, 2 * BB);
    assert_eq!(h.lookup(&[1, 2]), [Miss, Miss], "another block size");
}

#[test]
fn evictions_delete_files() {
    let dir = scratch_dir();
    let h = Harness::new(&config(&dir, 4), 8, BB);
    for i in 0..10 {
        h.store_all(i, &[i]);
    }
    assert_eq!(wait_for_files(&ns_dir(&dir), 4), 4);
    assert_eq!(h.present(&(0..10).collect::<Vec<_>>()), vec![6, 7, 8, 9]);
    h.tier().clear().unwrap();
    assert_eq!(wait_for_files(&ns_dir(&dir), 0), 0);
}

#[test]
fn damaged_files_fail_their_block_only_and_become_misses() {
    let dir = scratch_dir();
    let h = Harness::new(&config(&dir, 32), 32, BB);
    h.store_all(1, &[1, 2, 3, 4, 5, 6, 7, 8]);
    let ns = ns_dir(&dir);

    // Truncated: a short read.
    let f = block_file(&dir, 3);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&f)
        .unwrap()
        .set_len(5000)
        .unwrap();
    let r = h.load(10, &[1, 2, 3, 4], &[20, 21, 22, 23]);
    assert_eq!((r.error, r.num_done), (Some(ErrorKind::Corrupt), 2));
    assert!(h.row_holds(20, 1) && h.row_holds(21, 2));
    assert!(!f.exists(), "a corrupt file is removed");
    assert_eq!(h.lookup(&[2, 3, 4]), [Hit, Miss, Hit]);

    // A flipped payload byte.
    let f = block_file(&dir, 4);
    let mut bytes = std::fs::read(&f).unwrap();
    bytes[payload_at(&f) + 100] ^= 0x40;
    std::fs::write(&f, &bytes).unwrap();
    let r = h.load(11, &[4], &[20]);
    assert_eq!((r.error, r.num_done), (Some(ErrorKind::Corrupt), 0));
    assert_eq!(h.lookup(&[4]), [Miss]);

    // Two files swapped: each header names the other key.
    let (f5, f6) = (block_file(&dir, 5), block_file(&dir, 6));
    let tmp = ns.join("swap");
    std::fs::rename(&f5, &tmp).unwrap();
    std::fs::rename(&f6, &f5).unwrap();
    std::fs::rename(&tmp, &f6).unwrap();
    let r = h.load(12, &[1, 5], &[20, 21]);
    assert_eq!((r.error, r.num_done), (Some(ErrorKind::Corrupt), 1));
    let r = h.load(13, &[6], &[22]);
    assert_eq!(r.error, Some(ErrorKind::Corrupt));
    assert_eq!(h.lookup(&[5, 6]), [Miss, Miss]);

    // A file of another namespace under our key's name.
    let foreign_dir = scratch_dir();
    let mut foreign_cfg = config(&foreign_dir, 4);
    foreign_cfg.namespace = "other".into();
    let foreign = Harness::new(&foreign_cfg, 4, BB);
    foreign.store_all(1, &[7]);
    let f7 = block_file(&dir, 7);
    copy_block_file(&block_file(&foreign_dir, 7), &f7);
    let r = h.load(14, &[7], &[20]);
    assert_eq!(r.error, Some(ErrorKind::Corrupt));
    assert_eq!(h.lookup(&[7]), [Miss]);

    // A file deleted behind the tier's back: not found, and a miss.
    std::fs::remove_file(block_file(&dir, 8)).unwrap();
    let r = h.load(15, &[8], &[20]);
    assert_eq!(r.error, Some(ErrorKind::NotFound));
    assert_eq!(h.lookup(&[8]), [Miss]);

    // Untouched blocks still load; the damaged keys can be stored again.
    let r = h.load(16, &[1, 2], &[30, 31]);
    assert!(r.is_ok() && h.row_holds(30, 1) && h.row_holds(31, 2));
    h.store_all(17, &[3, 4]);
    assert_eq!(h.lookup(&[3, 4]), [Hit, Hit]);
}

/// Block events on disk: blocks found at open are announced (STORED,
/// recovered; those over the capacity then REMOVED, evicted), a corrupt file
/// and a deleted one are REMOVED with their reason, each once.
#[test]
fn events_report_recovered_corrupt_and_vanished_blocks() {
    let recovered = EventKind::Stored(StoredReason::Recovered);
    let written = EventKind::Stored(StoredReason::Written);
    let dir = scratch_dir();
    {
        let mut h = Harness::new(&with_events(config(&dir, 8), 64), 8, BB);
        h.scratch_dir = None;
        for i in 1..=4 {
            h.store_all(i, &[i]);
            // File times order the blocks at the next open.
            std::thread::sleep(Duration::from_millis(15));
        }
        assert_eq!(h.events().len(), 4);
    }
    let h = Harness::new(&with_events(config(&dir, 3), 64), 8, BB);
    assert_eq!(
        h.events(),
        [
            (recovered, 1),
            (recovered, 2),
            (recovered, 3),
            (EventKind::Removed(RemovedReason::Evicted), 1),
            (recovered, 4)
        ],
        "oldest first; the oldest evicted again for want of room"
    );
    let f = block_file(&dir, 3);
    let mut bytes = std::fs::read(&f).unwrap();
    bytes[payload_at(&f) + 7] ^= 1;
    std::fs::write(&f, &bytes).unwrap();
    std::fs::remove_file(block_file(&dir, 4)).unwrap();
    assert_eq!(h.load(10, &[3], &[0]).error, Some(ErrorKind::Corrupt));
    assert_eq!(h.load(11, &[4], &[0]).error, Some(ErrorKind::NotFound));
    assert_eq!(
        h.load(12, &[2, 3, 4], &[0, 1, 2]).error,
        Some(ErrorKind::NotFound)
    );
    assert_eq!(
        h.events(),
        [
            (EventKind::Removed(RemovedReason::Corrupt), 3),
            (EventKind::Removed(RemovedReason::Vanished), 4)
        ]
    );
    h.store_all(13, &[3]);
    assert_eq!(h.events(), [(written, 3)], "stored again, announced again");
}

/// A shared directory: a block another process stored joins this tier's
/// index when a lookup's probe finds it, announced as found.
#[test]
fn a_block_found_in_a_shared_directory_is_announced_as_found() {
    let dir = scratch_dir();
    let mut writer = Harness::new(&shared_config(&dir), 4, BB);
    writer.scratch_dir = None;
    // The reader owns (and removes) the scratch directory.
    let reader = Harness::new(&with_events(shared_config(&dir), 64), 4, BB);
    writer.store_all(1, &[5]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while reader.lookup(&[5]) != [Hit] {
        assert!(Instant::now() < deadline, "never found the block");
        std::thread::sleep(Duration::from_millis(2));
    }
    assert_eq!(
        reader.events(),
        [(EventKind::Stored(StoredReason::Found), 5)]
    );
}

/// Something other than a regular file where a block file should be can never
/// heal: its load fails CORRUPT at once (a FIFO must not block the worker in
/// open(2)), the key becomes a MISS, and the entry is removed, unless it is a
/// directory, which kvtier never made. A symlink is never followed.
#[test]
fn a_non_file_at_a_block_path_fails_that_block_and_never_hangs() {
    let dir = scratch_dir();
    let h = Harness::new(&config(&dir, 8), 8, BB);
    h.store_all(1, &[1, 2, 3, 4]);
    let (fifo, subdir, link) = (
        block_file(&dir, 1),
        block_file(&dir, 2),
        block_file(&dir, 3),
    );
    std::fs::remove_file(&fifo).unwrap();
    assert!(Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    std::fs::remove_file(&subdir).unwrap();
    std::fs::create_dir(&subdir).unwrap();
    let aside = link.with_extension("aside");
    std::fs::rename(&link, &aside).unwrap();
    std::os::unix::fs::symlink(&aside, &link).unwrap();

    for (job, id) in [(10, 1), (11, 2), (12, 3)] {
        h.tier()
            .submit_load(job, &keys(&[id]), KEY_LEN, &[6])
            .unwrap();
        if !h.tier().wait(Duration::from_secs(10)) {
            // Release a worker stuck opening the FIFO (a non-blocking open
            // for writing succeeds only if a reader is there), then fail.
            use std::os::unix::fs::OpenOptionsExt;
            let _ = std::fs::OpenOptions::new()
                .write(true)
                .custom_flags(libc::O_NONBLOCK)
                .open(&fifo);
            panic!("the load of block {id} never completed");
        }
        let r = h.result_of(job);
        assert_eq!(r.error, Some(ErrorKind::Corrupt), "block {id}: {r:?}");
        assert_eq!(h.lookup(&[id]), [Miss], "block {id}");
    }
    assert!(std::fs::symlink_metadata(&fifo).is_err(), "FIFO removed");
    assert!(subdir.is_dir(), "a directory is left alone");
    assert!(std::fs::symlink_metadata(&link).is_err(), "symlink removed");
    assert!(aside.is_file(), "the symlink's target is untouched");
    assert!(h.load(13, &[4], &[6]).is_ok() && h.row_holds(6, 4));
    h.store_all(14, &[1, 3]);
    assert!(h.load(15, &[1, 3], &[6, 7]).is_ok() && h.row_holds(6, 1) && h.row_holds(7, 3));
    h.tier().drain();
}

/// A transient failure (here: no file descriptor left) fails the load with
/// TIER_ERR_IO and keeps the file; the key is dropped only after
/// MAX_TRANSIENT_LOAD_FAILURES in a row, and a success resets the count.
#[test]
fn transient_load_failures_keep_the_file_and_drop_the_key_after_a_few() {
    let dir = scratch_dir();
    {
        let mut h = Harness::new(&config(&dir, 8), 8, BB);
        h.scratch_dir = None;
        h.store_all(1, &[1, 2]);
    }
    let status = spawn_child("fd-starved-loads", &dir).wait().unwrap();
    assert!(status.success(), "child: {status}");
    assert!(
        !ns_dir(&dir).join(".manifest").exists(),
        "a key dropped while its file stays: no manifest, the next open scans"
    );
    let h = Harness::new(&config(&dir, 8), 8, BB);
    let r = h.load(1, &[1, 2], &[4, 5]);
    assert!(r.is_ok() && h.row_holds(4, 1) && h.row_holds(5, 2), "{r:?}");
}

/// Where the file system keeps attributes, a block's header is its file's
/// `user.kvtier` attribute, and a load trusts nothing the attribute does not
/// prove: one missing, garbled or naming another key fails that block as
/// corrupt and removes the file. A key too long for a file name keeps its
/// header in the file (the scan reads the key from there).
#[test]
fn attribute_headers_prove_their_blocks() {
    let dir = scratch_dir();
    let h = Harness::new(&config(&dir, 32), 32, BB);
    if !h.tier().describe().contains("headers in xattrs") {
        // ramfs (the o_direct re-run) keeps no user attributes; the
        // in-file form is what every other test there runs on.
        if std::env::var_os(NO_XATTRS_EXPECTED).is_none() {
            common::skip(&format!("no user xattrs here: {}", h.tier().describe()));
        }
        return;
    }
    h.store_all(1, &[1, 2, 3, 4, 5]);
    for i in 1..=5 {
        assert_eq!(
            std::fs::metadata(block_file(&dir, i)).unwrap().len(),
            BB as u64
        );
    }
    // No attribute: a file of the payload's length proves nothing.
    set_header_attr(&block_file(&dir, 1), None);
    let f2 = block_file(&dir, 2);
    // Garbage of the right length.
    set_header_attr(&f2, Some(&[0x5a; 56]));
    // Another key's header over this key's payload.
    let f4 = block_file(&dir, 4);
    set_header_attr(&f4, Some(&header_attr(&block_file(&dir, 5)).unwrap()));
    // One byte longer than a header: not one.
    let f3 = block_file(&dir, 3);
    let mut long = header_attr(&f3).unwrap();
    long.push(0);
    set_header_attr(&f3, Some(&long));
    for (job, i) in [(10, 1), (11, 2), (12, 3), (13, 4)] {
        let f = block_file(&dir, i);
        let r = h.load(job, &[i], &[20]);
        assert_eq!(r.error, Some(ErrorKind::Corrupt), "block {i}: {r:?}");
        assert!(!f.exists(), "block {i}: a corrupt file is removed");
    }
    assert_eq!(h.lookup(&[1, 2, 3, 4, 5]), [Miss, Miss, Miss, Miss, Hit]);
    let r = h.load(14, &[5], &[20]);
    assert!(r.is_ok() && h.row_holds(20, 5), "{r:?}");

    // A long key: the header in the file, and both forms load.
    let long_keys: Vec<u8> = (6..8).flat_map(long_key).collect();
    h.fill(0, 6);
    h.fill(1, 7);
    h.tier()
        .submit_store(15, &long_keys, LONG_KEY_LEN, &[0, 1])
        .unwrap();
    assert!(h.result_of(15).is_ok());
    let long_files: Vec<PathBuf> = files(&ns_dir(&dir), ".kvb")
        .into_iter()
        .filter(|p| p.file_name().unwrap().to_str().unwrap().starts_with('h'))
        .collect();
    assert_eq!(long_files.len(), 2);
    for p in &long_files {
        assert_eq!(std::fs::metadata(p).unwrap().len(), 2 * BB as u64);
        assert_eq!(header_attr(p), None);
    }
    h.tier()
        .submit_load(16, &long_keys, LONG_KEY_LEN, &[21, 22])
        .unwrap();
    assert!(h.result_of(16).is_ok());
    assert!(h.row_holds(21, 6) && h.row_holds(22, 7));
}

/// A directory written with headers in the files (an older kvtier, or
/// `block_header=file`) is read by a tier that writes attributes, and the
/// other way round, after a clean close and after a crash (a scan).
#[test]
fn both_header_forms_are_read_whoever_wrote_them() {
    let dir = scratch_dir();
    let mut in_file = config(&dir, 64);
    in_file.set("block_header", "file").unwrap();
    let auto = config(&dir, 64);
    let reopen = |c: &TierConfig, crash: bool| {
        if crash {
            let _ = std::fs::remove_file(ns_dir(&dir).join(".manifest"));
        }
        let mut h = Harness::new(c, 16, BB);
        h.scratch_dir = None;
        h
    };
    {
        let h = reopen(&in_file, false);
        assert!(h.tier().describe().contains("headers in the files"));
        h.store_all(1, &[1, 2, 3]);
    }
    for (round, crash) in [(0u64, false), (1, true)] {
        let h = reopen(&auto, crash);
        let first = 10 + 2 * round;
        h.store_all(1, &[first, first + 1]);
        let mut all = vec![1, 2, 3];
        all.extend((0..=round).flat_map(|r| [10 + 2 * r, 11 + 2 * r]));
        let rows: Vec<i64> = (0..all.len() as i64).map(|r| r + 8).collect();
        let r = h.load(2, &all, &rows);
        assert!(r.is_ok(), "round {round}: {r:?}");
        assert!(all
            .iter()
            .zip(&rows)
            .all(|(&i, &row)| h.row_holds(row as usize, i)));
        drop(h);
        let h = reopen(&in_file, crash);
        assert_eq!(h.present(&all), all, "round {round}");
        let r = h.load(3, &all, &rows);
        assert!(r.is_ok(), "round {round}: {r:?}");
        assert!(all
            .iter()
            .zip(&rows)
            .all(|(&i, &row)| h.row_holds(row as usize, i)));
    }
    let in_attr = header_attr(&block_file(&dir, 10)).is_some();
    assert_eq!(payload_at(&block_file(&dir, 1)), 4096);
    assert_eq!(
        payload_at(&block_file(&dir, 10)),
        if in_attr { 0 } else { 4096 }
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Reopening with almost no file descriptors to spare fails cleanly or
/// indexes what it can read, and deletes nothing it could not read: a block
/// file is condemned only on what was read from it.
#[test]
fn recovery_short_of_descriptors_deletes_nothing() {
    let dir = scratch_dir();
    {
        let mut h = Harness::new(&config(&dir, 64), 32, BB);
        h.scratch_dir = None;
        h.store_all(1, &(0..32).collect::<Vec<_>>());
        // Keys over 100 bytes get hashed file names: recovery must read their
        // headers to learn the key.
        let long: Vec<u8> = (0..32).flat_map(long_key).collect();
        h.tier()
            .submit_store(2, &long, LONG_KEY_LEN, &(0..32).collect::<Vec<_>>())
            .unwrap();
        assert!(h.result_of(2).is_ok());
    }
    assert_eq!(files(&dir, ".kvb").len(), 64);
    let status = spawn_child("fd-starved-open", &dir).wait().unwrap();
    assert!(status.success(), "child: {status}");
    assert_eq!(files(&dir, ".kvb").len(), 64, "no block file deleted");
    let h = Harness::new(&config(&dir, 64), 32, BB);
    assert_eq!(h.tier().stats().num_blocks, 64);
    let r = h.load(
        3,
        &(0..32).collect::<Vec<_>>(),
        &(0..32).collect::<Vec<_>>(),
    );
    assert!(r.is_ok(), "{r:?}");
    assert!((0..32).all(|i| h.row_holds(i, i as u64)));
    let long: Vec<u8> = (0..32).flat_map(long_key).collect();
    h.tier()
        .submit_load(4, &long, LONG_KEY_LEN, &(0..32).collect::<Vec<_>>())
        .unwrap();
    assert!(h.result_of(4).is_ok());
    assert!((0..32).all(|i| h.row_holds(i, i as u64)));
}

/// Loads racing into one row with buffered I/O (the payload passes through a
/// private buffer): neither fails, no block is harmed.
#[test]
fn buffered_loads_racing_into_one_row_harm_no_block() {
    let dir = scratch_dir();
    let bb = 64 << 10;
    let mut c = config(&dir, 4);
    c.capacity_bytes = (4 * bb) as u64;
    c.set("o_direct", "off").unwrap();
    let h = Harness::new(&c, 4, bb);
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
    assert_eq!(files(&dir, ".kvb").len(), 2);
    assert!(h.load(2, &[1, 2], &[2, 3]).is_ok());
    assert!(h.row_holds(2, 1) && h.row_holds(3, 2));
}

/// Whether the file system of the scratch directories takes O_DIRECT (the
/// disk tests also run once on one that does not, see
/// `o_direct_auto_falls_back_to_buffered_io_where_the_file_system_refuses_it`).
fn scratch_takes_o_direct() -> bool {
    let h = Harness::new(&disk_config(8, BB), 8, BB);
    h.tier()
        .describe()
        .contains("O_DIRECT: page cache bypassed")
}

#[test]
fn buffered_synced_and_unaligned_blocks_round_trip() {
    let direct = scratch_takes_o_direct();
    for (o_direct, sync, bb) in [
        ("off", "none", BB),
        ("on", "data", BB),
        ("auto", "none", 1000),
    ] {
        let dir = scratch_dir();
        let mut c = disk_config(8, bb);
        c.disk.path = Some(dir.clone());
        c.set("o_direct", o_direct).unwrap();
        c.set("sync", sync).unwrap();
        if o_direct == "on" && !direct {
            let buf = Buffer::new(8 * bb);
            let primary = unsafe { kvtier::PrimaryBuffer::new(buf.ptr(), buf.len(), bb) }.unwrap();
            let err = kvtier::Tier::new(&c, primary).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::Config, "{err}");
            let _ = std::fs::remove_dir_all(&dir);
            continue;
        }
        let h = Harness::new(&c, 8, bb);
        h.store_all(1, &[1, 2]);
        let r = h.load(2, &[1, 2], &[6, 7]);
        assert!(r.is_ok(), "{o_direct} {sync} {bb}: {r:?}");
        assert!(
            h.row_holds(6, 1) && h.row_holds(7, 2),
            "{o_direct} {sync} {bb}"
        );
        let d = h.tier().describe();
        assert_eq!(
            d.contains("O_DIRECT: page cache bypassed"),
            o_direct != "off" && direct,
            "{d}"
        );
    }
}

#[test]
fn bad_paths_fail_at_open_with_a_clear_message() {
    let mut c = disk_config(8, BB);
    for (path, expect) in [
        ("/nonexistent-parent-kvtier/tier", "parent"),
        ("/dev/null/tier", "/dev/null"),
    ] {
        c.disk.path = Some(path.into());
        let buf = Buffer::new(8 * BB);
        let primary = unsafe { kvtier::PrimaryBuffer::new(buf.ptr(), buf.len(), BB) }.unwrap();
        let err = kvtier::Tier::new(&c, primary).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Config, "{err}");
        assert!(err.message().contains(expect), "{err}");
    }
    c.disk.path = None;
    let buf = Buffer::new(8 * BB);
    let primary = unsafe { kvtier::PrimaryBuffer::new(buf.ptr(), buf.len(), BB) }.unwrap();
    assert!(kvtier::Tier::new(&c, primary)
        .unwrap_err()
        .message()
        .contains("path"));
}

#[test]
fn a_directory_has_one_exclusive_user() {
    let dir = scratch_dir();
    let _first = Harness::new(&config(&dir, 8), 8, BB);
    let buf = Buffer::new(8 * BB);
    let primary = unsafe { kvtier::PrimaryBuffer::new(buf.ptr(), buf.len(), BB) }.unwrap();
    let err = kvtier::Tier::new(&config(&dir, 8), primary).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config);
    assert!(err.message().contains("in use"), "{err}");
}

/// Mounts a tmpfs of `bytes` at a fresh directory, if this process may.
fn small_file_system(bytes: usize) -> Option<PathBuf> {
    mount_tmpfs(&format!("size={bytes}"))
}

fn mount_tmpfs(options: &str) -> Option<PathBuf> {
    let dir = scratch_dir();
    std::fs::create_dir_all(&dir).ok()?;
    let ok = Command::new("mount")
        .args(["-t", "tmpfs", "-o", options, "tmpfs"])
        .arg(&dir)
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    ok.then_some(dir)
}

/// A mounted scratch file system, unmounted and removed on drop (also when
/// the test fails).
struct Mounted(PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Set in the re-run of the disk tests on ramfs, which keeps no user xattrs:
/// there the xattr test returns early by design, not as a skip.
const NO_XATTRS_EXPECTED: &str = "KVTIER_NO_XATTRS_EXPECTED";

/// Mounts a file system that refuses O_DIRECT at a fresh directory: ramfs
/// (tmpfs accepts O_DIRECT since Linux 6.6, so it no longer serves). None,
/// with the reason, where this process may not mount.
fn mount_without_o_direct() -> Result<Mounted, String> {
    let dir = scratch_dir();
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let out = Command::new("mount")
        .args(["-t", "ramfs", "-o", "mode=0700", "ramfs"])
        .arg(&dir)
        .output();
    match out {
        Ok(out) if out.status.success() => Ok(Mounted(dir)),
        Ok(out) => {
            let _ = std::fs::remove_dir_all(&dir);
            Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
        }
        Err(e) => {
            let _ = std::fs::remove_dir_all(&dir);
            Err(format!("cannot run mount: {e}"))
        }
    }
}

#[test]
fn o_direct_auto_falls_back_to_buffered_io_where_the_file_system_refuses_it() {
    let fs = match mount_without_o_direct() {
        Ok(fs) => fs,
        Err(why) => {
            // Every other test runs on a file system with O_DIRECT then; the
            // fallback is a branch no test reaches without a mount.
            common::skip(&format!("cannot mount a ramfs here (needs root): {why}"));
            return;
        }
    };
    let tier_dir = fs.0.join("tier");
    // on: refused at open, saying why.
    let mut c = config(&tier_dir, 16);
    c.set("o_direct", "on").unwrap();
    let buf = Buffer::new(16 * BB);
    let primary = unsafe { kvtier::PrimaryBuffer::new(buf.ptr(), buf.len(), BB) }.unwrap();
    let err = kvtier::Tier::new(&c, primary).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
    assert!(
        err.message().contains("o_direct=on")
            && err.message().contains("does not support O_DIRECT"),
        "{err}"
    );
    // ramfs keeps no user attributes either: block_header=xattr is refused
    // at open, saying why, and auto keeps headers in the files.
    let mut c = config(&tier_dir, 16);
    c.set("block_header", "xattr").unwrap();
    let buf = Buffer::new(16 * BB);
    let primary = unsafe { kvtier::PrimaryBuffer::new(buf.ptr(), buf.len(), BB) }.unwrap();
    let err = kvtier::Tier::new(&c, primary).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
    assert!(
        err.message().contains("block_header=xattr")
            && err.message().contains("no user extended attributes"),
        "{err}"
    );
    // auto: buffered I/O, and tier_describe says so.
    let c = config(&tier_dir, 16);
    let h = Harness::new(&c, 16, BB);
    let line = h.tier().describe();
    assert!(
        line.contains("o_direct=auto: O_DIRECT refused") && line.contains("buffered I/O"),
        "{line}"
    );
    assert!(
        line.contains("headers in the files (no user xattrs here)"),
        "{line}"
    );
    h.store_all(1, &[1, 2, 3]);
    let r = h.load(2, &[1, 2, 3], &[5, 6, 7]);
    assert!(r.is_ok() && h.row_holds(5, 1) && h.row_holds(7, 3), "{r:?}");
    drop(h);
    let h = Harness::new(&c, 16, BB);
    assert_eq!(h.lookup(&[1, 2, 3]), vec![Hit, Hit, Hit]);
    let r = h.load(3, &[2], &[8]);
    assert!(r.is_ok() && h.row_holds(8, 2), "{r:?}");
    drop(h);
    // And every other disk test once on it: this binary again, its scratch
    // directories (the system temp dir) on the ramfs.
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--skip",
            "o_direct_auto_falls_back_to_buffered_io_where_the_file_system_refuses_it",
            "--test-threads=2",
        ])
        .env("TMPDIR", &fs.0)
        .env(NO_XATTRS_EXPECTED, "1")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the disk tests failed on a file system without O_DIRECT:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let summary = String::from_utf8_lossy(&out.stdout);
    assert!(summary.contains("test result: ok"), "{summary}");
}

#[test]
fn an_unwritable_directory_fails_at_open_with_a_clear_message() {
    // Permission bits stop everyone but root; a read-only file system stops
    // root too.
    let root_user = unsafe { libc::geteuid() } == 0;
    let (parent, mounted, expect) = match mount_tmpfs("ro,size=64k") {
        Some(dir) => (dir, true, "Read-only"),
        None if !root_user => {
            let dir = scratch_dir();
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o500)).unwrap();
            (dir, false, "Permission denied")
        }
        None => {
            common::skip(
                "root without mount permission: no way to make a directory unwritable here",
            );
            return;
        }
    };
    let mut c = disk_config(8, BB);
    c.disk.path = Some(parent.join("tier"));
    let buf = Buffer::new(8 * BB);
    let primary = unsafe { kvtier::PrimaryBuffer::new(buf.ptr(), buf.len(), BB) }.unwrap();
    let err = kvtier::Tier::new(&c, primary).unwrap_err();
    if mounted {
        let _ = Command::new("umount").arg(&parent).status();
    } else {
        let _ = std::fs::set_permissions(&parent, std::fs::Permissions::from_mode(0o700));
    }
    let _ = std::fs::remove_dir_all(&parent);
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
    assert!(err.message().contains(expect), "{err}");
}

#[test]
fn a_full_device_fails_stores_and_recovers_when_space_returns() {
    let mounted = small_file_system(96 * 1024);
    let root = mounted.clone().unwrap_or_else(scratch_dir);
    if mounted.is_none() {
        eprintln!("cannot mount a small tmpfs here: simulating a full device instead");
    }
    let tier_dir = root.join("tier");
    let h = Harness::new(&config(&tier_dir, 64), 64, BB);
    h.store_all(1, &[1, 2, 3]);
    let mut job = 10;
    let failed = loop {
        if mounted.is_none() && job == 14 {
            h.tier().simulate_full_device(true);
        }
        let ids = [job * 2, job * 2 + 1];
        for (r, &i) in ids.iter().enumerate() {
            h.fill(r, i);
        }
        let r = h.store(job, &ids, &[0, 1]);
        if !r.is_ok() {
            break r;
        }
        job += 1;
        assert!(job < 100, "the device never filled up");
    };
    assert_eq!(failed.error, Some(ErrorKind::Io), "{failed:?}");
    let ids = [job * 2, job * 2 + 1];
    assert!(
        h.lookup(&ids).contains(&Miss),
        "a failed block is not published"
    );
    assert!(
        files(&ns_dir(&tier_dir), ".tmp").is_empty(),
        "no temp debris"
    );
    // Nothing already stored is damaged.
    let r = h.load(200, &[1, 2, 3], &[10, 11, 12]);
    assert!(
        r.is_ok() && h.row_holds(10, 1) && h.row_holds(12, 3),
        "{r:?}"
    );
    // Space returns: the tier works again.
    h.tier().simulate_full_device(false);
    h.tier().clear().unwrap();
    wait_for_files(&ns_dir(&tier_dir), 0);
    h.store_all(201, &[500, 501]);
    assert!(h.load(202, &[500, 501], &[20, 21]).is_ok() && h.row_holds(21, 501));
    drop(h);
    if let Some(dir) = mounted {
        let _ = Command::new("umount").arg(&dir).status();
        let _ = std::fs::remove_dir_all(&dir);
    } else {
        let _ = std::fs::remove_dir_all(&root);
    }
}

// ---- several processes ----

/// Runs this test binary's `child` test in a new process with `role`.
fn spawn_child(role: &str, dir: &Path) -> std::process::Child {
    test_child("child")
        .env("KVTIER_CHILD_ROLE", role)
        .env("KVTIER_CHILD_DIR", dir)
        .stdout(Stdio::null())
        .spawn()
        .unwrap()
}

fn shared_config(dir: &Path) -> TierConfig {
    let mut c = config(dir, 256);
    c.disk.shared = true;
    c.probe_ttl_ms = 50;
    c
}

/// The other process in multi-process tests (ignored when run directly).
#[test]
#[ignore]
fn child() {
    let (Ok(role), Ok(dir)) = (
        std::env::var("KVTIER_CHILD_ROLE"),
        std::env::var("KVTIER_CHILD_DIR"),
    ) else {
        return;
    };
    let dir = PathBuf::from(dir);
    match role.as_str() {
        // Stores blocks forever, one per job, until killed.
        "store-forever" => {
            let mut c = config(&dir, 1 << 20);
            c.io_threads = Some(4);
            let mut h = Harness::new(&c, 16, BB);
            h.scratch_dir = None;
            for r in 0..16 {
                h.fill(r, r as u64);
            }
            for job in 0u64.. {
                let ids: Vec<u64> = (job * 16..job * 16 + 16).collect();
                for (r, &i) in ids.iter().enumerate() {
                    h.fill(r, i);
                }
                h.tier()
                    .submit_store(job, &keys(&ids), KEY_LEN, &(0..16).collect::<Vec<_>>())
                    .unwrap();
                h.tier().drain();
                h.tier().poll(16);
            }
        }
        // Stores keys 1000..1010 into a shared directory and exits.
        "shared-store" => {
            let mut h = Harness::new(&shared_config(&dir), 16, BB);
            h.scratch_dir = None; // the parent owns the directory
            h.store_all(1, &(1000..1010).collect::<Vec<_>>());
        }
        // Finds keys 2000..2005 stored by the parent, checks their bytes.
        "shared-load" => {
            let mut h = Harness::new(&shared_config(&dir), 16, BB);
            h.scratch_dir = None;
            let ids: Vec<u64> = (2000..2005).collect();
            let deadline = Instant::now() + Duration::from_secs(10);
            while h.lookup(&ids).iter().any(|&s| s != Hit) {
                assert!(Instant::now() < deadline, "never found the parent's blocks");
                std::thread::sleep(Duration::from_millis(5));
            }
            let r = h.load(1, &ids, &(0..5).collect::<Vec<_>>());
            assert!(r.is_ok(), "{r:?}");
            for (r, &i) in ids.iter().enumerate() {
                assert!(h.row_holds(r, i), "block {i}");
            }
        }
        // Loads while no descriptor is left: transient failures.
        "fd-starved-loads" => {
            let mut h = Harness::new(&with_events(config(&dir, 8), 64), 8, BB);
            h.scratch_dir = None;
            assert_eq!(h.lookup(&[1, 2]), [Hit, Hit]);
            let mut recovered = h.events();
            recovered.sort_unstable_by_key(|&(_, id)| id);
            let found = EventKind::Stored(StoredReason::Recovered);
            assert_eq!(recovered, [(found, 1), (found, 2)]);
            let mut job = 0;
            let mut fail_load = |h: &Harness, id: u64| {
                job += 1;
                let r = h.load(job, &[id], &[4]);
                assert_eq!(r.error, Some(ErrorKind::Io), "{r:?}");
            };
            let hoard = FdHoard::leaving(0);
            for attempt in 1..=MAX_TRANSIENT_LOAD_FAILURES {
                fail_load(&h, 1);
                let expect = if attempt < MAX_TRANSIENT_LOAD_FAILURES {
                    Hit
                } else {
                    Miss
                };
                assert_eq!(h.lookup(&[1]), [expect], "after {attempt} failures");
            }
            let unreadable = EventKind::Removed(RemovedReason::Unreadable);
            assert_eq!(h.events(), [(unreadable, 1)], "given up on once");
            for _ in 1..MAX_TRANSIENT_LOAD_FAILURES {
                fail_load(&h, 2);
            }
            drop(hoard);
            assert!(block_file(&dir, 1).is_file(), "the file is kept");
            assert!(h.load(100, &[2], &[4]).is_ok() && h.row_holds(4, 2));
            let hoard = FdHoard::leaving(0);
            for _ in 1..MAX_TRANSIENT_LOAD_FAILURES {
                fail_load(&h, 2);
            }
            drop(hoard);
            assert_eq!(h.lookup(&[2]), [Hit], "a success resets the count");
            assert_eq!(h.events(), [], "key 2 was never given up on");
        }
        // Opens the tier again and again with 0..=4 descriptors to spare.
        "fd-starved-open" => {
            for spare in 0..=4 {
                let hoard = FdHoard::leaving(spare);
                let buffer = Buffer::new(4 * BB);
                let primary =
                    unsafe { kvtier::PrimaryBuffer::new(buffer.ptr(), buffer.len(), BB) }.unwrap();
                match kvtier::Tier::new(&config(&dir, 64), primary) {
                    Ok(tier) => drop(tier),
                    Err(e) => assert_eq!(e.kind(), ErrorKind::Io, "{spare} spare: {e}"),
                }
                drop(hoard);
            }
        }
        other => panic!("unknown role {other}"),
    }
}

#[test]
fn a_killed_writer_leaves_no_debris_and_only_whole_blocks() {
    let dir = scratch_dir();
    std::fs::create_dir_all(&dir).unwrap();
    let mut child = spawn_child("store-forever", &dir);
    // Let it publish a good number of blocks, then kill it mid-stream.
    let deadline = Instant::now() + Duration::from_secs(20);
    while dir.read_dir().map_or(0, |d| d.count()) == 0 || files(&dir, ".kvb").len() < 300 {
        assert!(Instant::now() < deadline, "the child stored too little");
        std::thread::sleep(Duration::from_millis(10));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let h = Harness::new(&config(&dir, 1 << 20), 64, BB);
    assert!(
        files(&dir, ".tmp").is_empty(),
        "temp debris left after reopening"
    );
    let n = h.tier().stats().num_blocks;
    assert!(n >= 300, "{n} blocks recovered");
    // Every key that looks up HIT loads byte-exact.
    let ids: Vec<u64> = (0..n + 64).collect();
    let present = h.present(&ids);
    assert_eq!(present.len() as u64, n);
    for (c, chunk) in present.chunks(64).enumerate() {
        let rows: Vec<i64> = (0..chunk.len() as i64).collect();
        let r = h.load(c as u64, chunk, &rows);
        assert!(r.is_ok(), "{r:?}");
        for (row, &i) in chunk.iter().enumerate() {
            assert!(h.row_holds(row, i), "block {i}");
        }
    }
}

#[test]
fn two_processes_share_a_directory() {
    let dir = scratch_dir();
    std::fs::create_dir_all(&dir).unwrap();
    let h = Harness::new(&shared_config(&dir), 16, BB);
    let theirs: Vec<u64> = (1000..1010).collect();
    assert!(h.lookup(&theirs).iter().all(|&s| s != Hit));
    // Let those first probes settle before the other process stores: a probe
    // still queued when it stores (a busy machine) would find its block and
    // the key would turn HIT with no PENDING seen below.
    let deadline = Instant::now() + Duration::from_secs(10);
    while h.lookup(&theirs).iter().any(|&s| s != Miss) {
        assert!(Instant::now() < deadline, "the first probes never settled");
        std::thread::sleep(Duration::from_millis(2));
    }
    // The other process stores; this one finds the blocks without restarting.
    assert!(spawn_child("shared-store", &dir).wait().unwrap().success());
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut saw_pending = false;
    loop {
        let states = h.lookup(&theirs);
        saw_pending |= states.contains(&Pending);
        if states.iter().all(|&s| s == Hit) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "never found the other process's blocks: {states:?}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(
        saw_pending,
        "an unseen key is probed (PENDING), not answered MISS"
    );
    let r = h.load(1, &theirs, &(0..10).collect::<Vec<_>>());
    assert!(r.is_ok(), "{r:?}");
    for (r, &i) in theirs.iter().enumerate() {
        assert!(h.row_holds(r, i), "block {i}");
    }
    // And the other way round.
    h.store_all(2, &(2000..2005).collect::<Vec<_>>());
    assert!(spawn_child("shared-load", &dir).wait().unwrap().success());
    // A key nobody stored settles on MISS.
    let deadline = Instant::now() + Duration::from_secs(5);
    while h.lookup(&[77]) != [Miss] {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Reopening a shared directory that holds more blocks than the capacity
/// deletes the oldest while lookups probe those very keys: a probe and the
/// deletion of its key are serialised, so every key that answers HIT loads.
#[test]
fn shared_probes_never_answer_hit_for_a_block_being_deleted() {
    let ids: Vec<u64> = (0..512).collect();
    let mut hits = 0;
    for round in 0..4 {
        let dir = scratch_dir();
        std::fs::create_dir_all(&dir).unwrap();
        let mut c = shared_config(&dir);
        c.capacity_bytes = (ids.len() * BB) as u64;
        {
            let mut h = Harness::new(&c, 64, BB);
            h.scratch_dir = None;
            for chunk in ids.chunks(64) {
                h.store_all(chunk[0], chunk);
            }
        }
        c.capacity_bytes = (ids.len() / 2 * BB) as u64;
        c.probe_ttl_ms = 60_000;
        let h = Harness::new(&c, 64, BB);
        // Probe every key while the excess is being deleted, until no probe
        // is left in flight; then nothing changes the index any more.
        let deadline = Instant::now() + Duration::from_secs(20);
        let present = loop {
            let states = h.lookup(&ids);
            if !states.contains(&Pending) {
                break h.present(&ids);
            }
            assert!(Instant::now() < deadline, "probes never settled");
        };
        hits += present.len();
        for (c, chunk) in present.chunks(64).enumerate() {
            let rows: Vec<i64> = (0..chunk.len() as i64).collect();
            let r = h.load(c as u64, chunk, &rows);
            assert!(r.is_ok(), "round {round}: a HIT failed to load: {r:?}");
            assert!(chunk
                .iter()
                .enumerate()
                .all(|(row, &i)| h.row_holds(row, i)));
        }
    }
    assert!(hits > 0);
}

/// A shared tier remembers "not in storage" answers in a bounded LRU map: a
/// key looked up often keeps its cached MISS while 100,000 other absent keys
/// pass through (no cliff where every answer is forgotten at once).
#[test]
fn a_hot_absent_key_keeps_its_cached_miss() {
    let dir = scratch_dir();
    std::fs::create_dir_all(&dir).unwrap();
    let mut c = shared_config(&dir);
    c.probe_ttl_ms = 600_000;
    let h = Harness::new(&c, 16, BB);
    let hot = [7u64];
    let deadline = Instant::now() + Duration::from_secs(10);
    while h.lookup(&hot) != [Miss] {
        assert!(Instant::now() < deadline, "the hot key never settled");
        std::thread::sleep(Duration::from_millis(1));
    }
    for batch in 0..100u64 {
        let others: Vec<u64> = (1_000_000 + batch * 1000..).take(1000).collect();
        h.lookup(&others);
        assert_eq!(
            h.lookup(&hot),
            [Miss],
            "the hot key was asked of storage again after {} other keys",
            (batch + 1) * 1000
        );
    }
    h.tier().drain();
}
