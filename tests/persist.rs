//! The persistent memory arena (`persist_path`, docs/memory.md) beyond the
//! common contract (which tests/contract.rs runs on it too): blocks outlive
//! the tier and the process, in their recency order; a store cut off by
//! SIGKILL is a miss, never wrong bytes; one process at a time; the file's
//! identity; damaged blocks and files that are not arenas.
//!
//! The SIGKILL loop runs 20 cycles here; the long run is
//! `KVTIER_KILL_CYCLES=200 cargo test --release --test persist a_sigkilled`.

mod common;

use common::*;
use kvtier::{ErrorKind, EventKind, LookupState::*, StoredReason, Tier, TierConfig};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

const BB: usize = 4096;

fn config(dir: &Path, capacity_blocks: usize, block_bytes: usize) -> TierConfig {
    TierConfig {
        persist_path: Some(dir.to_path_buf()),
        namespace: "persist-test".into(),
        events: true,
        ..memory_config(capacity_blocks, block_bytes)
    }
}

/// A scratch directory on /dev/shm, removed when dropped.
struct ShmDir(PathBuf);

impl ShmDir {
    fn new() -> ShmDir {
        let dir = shm_scratch_dir();
        std::fs::create_dir_all(&dir).unwrap();
        ShmDir(dir)
    }

    /// The arena file(s) in it.
    fn arenas(&self) -> Vec<PathBuf> {
        files(&self.0, ".arena")
    }

    fn arena(&self) -> PathBuf {
        let mut all = self.arenas();
        assert_eq!(all.len(), 1, "{all:?}");
        all.pop().unwrap()
    }
}

impl Drop for ShmDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn open(c: &TierConfig, rows: usize, block_bytes: usize) -> Harness {
    Harness::leaving_dir(c, rows, block_bytes)
}

fn config_error(c: &TierConfig) -> String {
    let buffer = Buffer::new(BB);
    // SAFETY: the buffer outlives the tier, which tier_new refuses anyway.
    let primary = unsafe { kvtier::PrimaryBuffer::new(buffer.ptr(), BB, BB) }.unwrap();
    match Tier::new(c, primary) {
        Ok(_) => panic!("tier_new succeeded"),
        Err(e) => {
            assert_eq!(e.kind(), ErrorKind::Config, "{e}");
            e.message().to_string()
        }
    }
}

/// The ids of the blocks a freshly opened tier recovered, in event order
/// (least recently used first).
fn recovered(h: &Harness) -> Vec<u64> {
    h.events()
        .into_iter()
        .map(|(kind, id)| {
            assert_eq!(kind, EventKind::Stored(StoredReason::Recovered), "{id}");
            id
        })
        .collect()
}

#[test]
fn blocks_outlive_the_tier_byte_exact_in_their_recency_order() {
    let dir = ShmDir::new();
    let c = config(&dir.0, 8, BB);
    let h = open(&c, 8, BB);
    h.store_all(1, &[10, 11, 12, 13]);
    h.store_all(2, &[14, 15]);
    // A load is a use: 11 becomes the most recent.
    assert!(h.load(3, &[11], &[7]).is_ok());
    assert!(h.tier().describe().contains("created"));
    drop(h);

    let h = open(&c, 8, BB);
    assert!(
        h.tier().describe().contains("reopened with 6 blocks"),
        "{}",
        h.tier().describe()
    );
    // The first key of a store ends most recent (the contract's rule).
    assert_eq!(recovered(&h), [13, 12, 10, 15, 14, 11]);
    assert_eq!(h.tier().stats().num_blocks, 6);
    let ids = [10, 11, 12, 13, 14, 15];
    assert!(h.lookup(&ids).iter().all(|&s| s == Hit));
    assert!(h.load(4, &ids, &[0, 1, 2, 3, 4, 5]).is_ok());
    for (row, &id) in ids.iter().enumerate() {
        assert!(h.row_holds(row, id), "block {id}");
    }
    // The load made them all recent again, its first key most recent, so
    // the next eviction takes 15.
    h.store_all(5, &[20, 21, 22]);
    assert_eq!(h.present(&ids), [10, 11, 12, 13, 14]);
}

#[test]
fn a_clean_close_keeps_touches_in_the_order() {
    let dir = ShmDir::new();
    let c = config(&dir.0, 4, BB);
    let h = open(&c, 4, BB);
    h.store_all(1, &[1]);
    h.store_all(2, &[2]);
    h.store_all(3, &[3]);
    // A touch reaches only the index; the order is written at tier_free.
    h.touch(&[1]);
    drop(h);
    let h = open(&c, 4, BB);
    assert_eq!(recovered(&h), [2, 3, 1]);
}

#[test]
fn cleared_and_evicted_blocks_stay_gone() {
    let dir = ShmDir::new();
    let c = config(&dir.0, 4, BB);
    let h = open(&c, 4, BB);
    h.store_all(1, &[1, 2, 3, 4]);
    h.store_all(2, &[5, 6]);
    assert_eq!(h.present(&[1, 2, 3, 4, 5, 6]), [1, 2, 5, 6]);
    drop(h);
    let h = open(&c, 4, BB);
    assert_eq!(h.present(&[1, 2, 3, 4, 5, 6]), [1, 2, 5, 6]);
    h.tier().clear().unwrap();
    h.store_all(3, &[7]);
    drop(h);
    let h = open(&c, 4, BB);
    assert_eq!(recovered(&h), [7]);
    assert_eq!(h.present(&[1, 2, 3, 4, 5, 6, 7]), [7]);
}

#[test]
fn namespaces_keep_their_own_arenas_and_a_file_of_another_is_refused() {
    let dir = ShmDir::new();
    let a = config(&dir.0, 4, BB);
    let b = TierConfig {
        namespace: "another-model".into(),
        ..a.clone()
    };
    let ha = open(&a, 4, BB);
    let hb = open(&b, 4, BB);
    ha.store_all(1, &[1]);
    hb.store_all(1, &[2]);
    drop((ha, hb));
    assert_eq!(dir.arenas().len(), 2);
    let ha = open(&a, 4, BB);
    assert_eq!(ha.present(&[1, 2]), [1]);
    drop(ha);
    let hb = open(&b, 4, BB);
    assert_eq!(hb.present(&[1, 2]), [2]);
    drop(hb);

    // B's file under A's name: never served to A, and left as it was.
    let arenas = dir.arenas();
    let (a_file, b_file) = {
        let h = open(&a, 4, BB);
        let d = h.tier().describe();
        if d.contains(arenas[0].to_str().unwrap()) {
            (arenas[0].clone(), arenas[1].clone())
        } else {
            (arenas[1].clone(), arenas[0].clone())
        }
    };
    std::fs::rename(&b_file, &a_file).unwrap();
    let before = std::fs::read(&a_file).unwrap();
    let msg = config_error(&a);
    assert!(
        msg.contains("another-model") && msg.contains("persist-test"),
        "{msg}"
    );
    assert_eq!(std::fs::read(&a_file).unwrap(), before);
}

#[test]
fn another_geometry_makes_the_arena_anew() {
    let dir = ShmDir::new();
    let h = open(&config(&dir.0, 4, BB), 4, BB);
    h.store_all(1, &[1, 2]);
    drop(h);
    for (capacity, block) in [(8, BB), (8, 2 * BB)] {
        let h = open(&config(&dir.0, capacity, block), 4, block);
        let d = h.tier().describe();
        assert!(d.contains("made anew") && d.contains("it held"), "{d}");
        assert_eq!(h.tier().stats().num_blocks, 0);
        assert_eq!(h.present(&[1, 2]), Vec::<u64>::new());
        h.store_all(2, &[3]);
    }
    assert_eq!(dir.arenas().len(), 1);
}

#[test]
fn a_file_that_is_not_a_readable_arena_is_refused_and_kept() {
    let dir = ShmDir::new();
    let c = config(&dir.0, 4, BB);
    drop(open(&c, 4, BB));
    let arena = dir.arena();
    let good = std::fs::read(&arena).unwrap();
    // Not ours: another magic. Newer: format 2.
    let mut foreign = good.clone();
    foreign[..8].copy_from_slice(b"NOTKVTIR");
    let mut newer = good.clone();
    newer[8] = 2;
    for (bytes, says) in [
        (foreign, "is not a kvtier arena"),
        (newer, "format 2"),
        (b"short".to_vec(), "is not a kvtier arena"),
    ] {
        std::fs::write(&arena, &bytes).unwrap();
        let msg = config_error(&c);
        assert!(
            msg.contains(says) && msg.contains("neither opened nor changed"),
            "{msg}"
        );
        assert_eq!(std::fs::read(&arena).unwrap(), bytes);
    }
}

/// Where block `slot` of a tier of `capacity` blocks of BB bytes is in its
/// arena file (docs/memory.md: the layout).
fn block_offset(capacity: usize, slot: usize) -> usize {
    (8192 + capacity * 192).next_multiple_of(2 << 20) + slot * BB
}

#[test]
fn a_damaged_block_is_a_miss_never_wrong_bytes() {
    let dir = ShmDir::new();
    let c = config(&dir.0, 4, BB);
    let h = open(&c, 4, BB);
    h.store_all(1, &[1, 2]);
    drop(h);
    // Slots are handed out in order in a new arena: block 1 is in slot 0.
    let arena = dir.arena();
    let mut bytes = std::fs::read(&arena).unwrap();
    bytes[block_offset(4, 0) + 100] ^= 0x40;
    // Block 2's record: its checksum no longer matches its check.
    bytes[8192 + 192 + 8] ^= 1;
    std::fs::write(&arena, &bytes).unwrap();

    let h = open(&c, 4, BB);
    assert_eq!(recovered(&h), [1]);
    // Found at open, its payload is checked at its first load.
    let r = h.load(2, &[1], &[0]);
    assert_eq!(r.error, Some(ErrorKind::Corrupt), "{r:?}");
    assert_eq!(h.present(&[1, 2]), Vec::<u64>::new());
    drop(h);
    let h = open(&c, 4, BB);
    assert_eq!(h.tier().stats().num_blocks, 0);
}

#[test]
fn one_process_at_a_time() {
    let dir = ShmDir::new();
    let c = config(&dir.0, 4, BB);
    let h = open(&c, 4, BB);
    let msg = config_error(&c);
    assert!(msg.contains("in use by another kvtier tier"), "{msg}");
    drop(h);
    // Another process holds it until it dies.
    let mut child = spawn_child("hold", &dir.0, 0);
    // After the test harness's own words ("test child ... open").
    let opened = BufReader::new(child.stdout.as_mut().unwrap())
        .lines()
        .any(|line| line.unwrap().trim_end().ends_with(" open"));
    assert!(opened, "the child did not open the tier");
    let msg = config_error(&c);
    assert!(msg.contains("in use by another kvtier tier"), "{msg}");
    child.kill().unwrap();
    child.wait().unwrap();
    drop(open(&c, 4, BB));
}

#[test]
fn persist_path_is_the_memory_backends_on_a_memory_file_system() {
    let dir = ShmDir::new();
    let mut c = config(&dir.0, 4, BB);
    c.backend = kvtier::BackendKind::Disk;
    c.disk.path = Some(dir.0.join("disk"));
    assert!(config_error(&c).starts_with("persist_path:"));
    let mut c = config(&dir.0, 4, BB);
    c.disk.shared = true;
    assert!(config_error(&c).starts_with("shared:"));
    let on_disk = std::env::current_dir().unwrap().join("target");
    let msg = config_error(&config(&on_disk, 4, BB));
    assert!(msg.contains("not on tmpfs or hugetlbfs"), "{msg}");
    let mut c = TierConfig::default();
    let err = c.set("persist_path", "").unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config);
}

#[test]
fn a_forked_child_does_not_keep_the_arena_locked() {
    let dir = ShmDir::new();
    let out = spawn_child("fork", &dir.0, 0).wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains("reopened"), "{text}");
}

// ---- several processes ----

/// Runs this test binary's `child` test in a new process with `role`.
fn spawn_child(role: &str, dir: &Path, seed: u64) -> std::process::Child {
    test_child("child")
        .env("KVTIER_CHILD_ROLE", role)
        .env("KVTIER_CHILD_DIR", dir)
        .env("KVTIER_CHILD_SEED", seed.to_string())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap()
}

const KILL_BB: usize = 256 << 10;
const KILL_CAPACITY: usize = 48;
const KILL_ROWS: usize = 64;

fn kill_config(dir: &Path) -> TierConfig {
    TierConfig {
        io_threads: Some(4),
        ..config(dir, KILL_CAPACITY, KILL_BB)
    }
}

/// Block `id`'s bytes in the SIGKILL loop: one of 16 patterns, by `id`'s
/// last 4 bits, with `id` in the first 8 bytes of every 4 KiB, so that a
/// block torn between two stores of different keys differs from both.
fn kill_content(id: u64) -> Vec<u8> {
    let mut bytes = pattern(id % 16, KILL_BB);
    for page in bytes.chunks_mut(4096) {
        page[..8].copy_from_slice(&id.to_le_bytes());
    }
    bytes
}

/// [`kill_content`] of `id` in a row that holds that of an id with the same
/// last 4 bits.
fn stamp_row(h: &Harness, row: usize, id: u64) {
    for page in 0..KILL_BB / 4096 {
        // SAFETY: inside `row`, which no job uses now.
        unsafe {
            std::ptr::copy_nonoverlapping(
                id.to_le_bytes().as_ptr(),
                h.buffer.ptr().add(row * KILL_BB + page * 4096),
                8,
            )
        }
    }
}

/// The other process in multi-process tests (ignored when run directly).
#[test]
#[ignore]
fn child() {
    let (Ok(role), Ok(dir), Ok(seed)) = (
        std::env::var("KVTIER_CHILD_ROLE"),
        std::env::var("KVTIER_CHILD_DIR"),
        std::env::var("KVTIER_CHILD_SEED"),
    ) else {
        return;
    };
    let dir = PathBuf::from(dir);
    let seed: u64 = seed.parse().unwrap();
    match role.as_str() {
        "hold" => {
            let _h = open(&config(&dir, 4, BB), 4, BB);
            println!("open");
            std::thread::sleep(Duration::from_secs(60));
        }
        // Stores, reloads and sometimes clears until killed: four store
        // jobs in flight, keys from a window that moves on, so blocks are
        // evicted, stored again and loaded while others are written. Rows
        // hold their content already but for each page's stamp, so the
        // child spends its time in the tier's copies.
        "store-forever" => {
            let h = open(&kill_config(&dir), KILL_ROWS, KILL_BB);
            for row in 0..32 {
                h.write_row(row, &kill_content(row as u64));
            }
            let mut rng = Rng::new(seed);
            let base = seed * 100_000;
            let mut job = 0u64;
            for round in 0u64.. {
                for j in 0..4 {
                    let rows: Vec<i64> = (j * 8..j * 8 + 8).collect();
                    let ids: Vec<u64> = rows
                        .iter()
                        .map(|&r| (base + round + rng.below(64)) / 16 * 16 + r as u64 % 16)
                        .collect();
                    for (&r, &i) in rows.iter().zip(&ids) {
                        stamp_row(&h, r as usize, i);
                    }
                    job += 1;
                    h.tier()
                        .submit_store(job, &keys(&ids), KEY_LEN, &rows)
                        .unwrap();
                }
                let ids: Vec<u64> = (0..8).map(|_| base + round + rng.below(64)).collect();
                job += 1;
                // Rows 32.. are loads' only: no store reads them.
                let rows: Vec<i64> = (32..40).collect();
                h.tier()
                    .submit_load(job, &keys(&ids), KEY_LEN, &rows)
                    .unwrap();
                if rng.chance(1) {
                    h.tier().clear().unwrap();
                }
                h.tier().drain();
                h.tier().poll(16);
            }
        }
        // A tier inherited by a forked child lets go of the lock when the
        // child frees it: the parent then frees its own and opens the arena
        // again while the child still lives.
        "fork" => {
            let c = config(&dir, 4, BB);
            let mut h = open(&c, 4, BB);
            h.store_all(1, &[7]);
            let mut ends = [0; 2];
            // SAFETY: a pipe into a two-element array.
            assert_eq!(unsafe { libc::pipe(ends.as_mut_ptr()) }, 0);
            // SAFETY: the child calls only the tier's fork-safe release and
            // libc, then leaves with _exit.
            let pid = unsafe { libc::fork() };
            assert!(pid >= 0);
            if pid == 0 {
                drop(h.tier.take());
                // SAFETY: plain libc calls on our own descriptor.
                unsafe {
                    libc::write(ends[1], b"x".as_ptr() as *const libc::c_void, 1);
                    libc::sleep(30);
                    libc::_exit(0);
                }
            }
            let mut byte = 0u8;
            // SAFETY: one byte into `byte`.
            assert_eq!(
                unsafe { libc::read(ends[0], &mut byte as *mut u8 as *mut libc::c_void, 1) },
                1
            );
            drop(h);
            let h = open(&c, 4, BB);
            assert_eq!(h.present(&[7]), [7]);
            // SAFETY: our own child.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            println!("reopened");
        }
        other => panic!("unknown role {other}"),
    }
}

/// Cycles of: a child stores (`store-forever`), is SIGKILLed at a random
/// moment, and this process reopens the arena and loads every block it
/// reports, comparing every byte.
#[test]
fn a_sigkilled_writer_leaves_only_whole_blocks() {
    let cycles: u64 = std::env::var("KVTIER_KILL_CYCLES")
        .ok()
        .map_or(20, |v| v.parse().expect("KVTIER_KILL_CYCLES: a number"));
    let dir = ShmDir::new();
    let mut rng = Rng::new(0x5eed);
    let (mut verified, mut wrong, mut failed) = (0u64, 0u64, 0u64);
    let started = Instant::now();
    for cycle in 1..=cycles {
        let mut child = spawn_child("store-forever", &dir.0, cycle);
        // Sometimes during tier_new, mostly amid the stores.
        std::thread::sleep(Duration::from_millis(rng.below(300)));
        child.kill().unwrap();
        child.wait().unwrap();
        let h = open(&kill_config(&dir.0), KILL_ROWS, KILL_BB);
        let ids = recovered(&h);
        assert!(ids.len() <= KILL_CAPACITY);
        assert!(h.lookup(&ids).iter().all(|&s| s == Hit));
        for chunk in ids.chunks(KILL_ROWS) {
            let rows: Vec<i64> = (0..chunk.len() as i64).collect();
            let r = h.load(cycle, chunk, &rows);
            if !r.is_ok() {
                failed += chunk.len() as u64;
                continue;
            }
            for (row, &id) in chunk.iter().enumerate() {
                let want = kill_content(id);
                wrong += h.row(row).iter().zip(&want).filter(|(a, b)| a != b).count() as u64;
                verified += 1;
            }
        }
        assert_eq!((wrong, failed), (0, 0), "cycle {cycle}");
    }
    eprintln!(
        "{cycles} SIGKILL cycles in {:.1} s: {verified} blocks verified, {wrong} wrong bytes, \
         {failed} loads failed",
        started.elapsed().as_secs_f64()
    );
    assert!(verified > 0, "no cycle left a block");
}
