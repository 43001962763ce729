//! The disk tier's manifest: the index written at a clean close (`tier_free`)
//! and read instead of a scan at the next open. It must give the same tier
//! a scan would (every key, the exact LRU order, the same events), be
//! deleted at open, be ignored whenever anything about it is wrong, and
//! never be written when the directory may hold what the index does not say.

mod common;

use common::*;
use kvtier::TierConfig;
use kvtier::{ErrorKind, EventKind, HangPoint, LookupState::*, RemovedReason, StoredReason};
use std::path::{Path, PathBuf};
use std::time::Duration;

const BB: usize = 4096;
const MANIFEST: &str = ".manifest";

fn config(dir: &Path, capacity_blocks: usize) -> TierConfig {
    let mut c = disk_config(capacity_blocks, BB);
    c.disk.path = Some(dir.to_path_buf());
    c
}

/// The namespace directory of `c` under its root (the one directory there
/// whose name starts with the namespace's).
fn ns_dir_of(root: &Path, namespace: &str, block_bytes: usize) -> PathBuf {
    let suffix = format!("-b{block_bytes}-v3");
    let dirs: Vec<PathBuf> = std::fs::read_dir(root)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            let name = p.file_name().unwrap().to_str().unwrap();
            p.is_dir() && name.starts_with(&format!("{namespace}-")) && name.ends_with(&suffix)
        })
        .collect();
    assert_eq!(dirs.len(), 1, "{dirs:?}");
    dirs[0].clone()
}

fn manifest(root: &Path) -> PathBuf {
    ns_dir_of(root, "contract", BB).join(MANIFEST)
}

fn journal(root: &Path) -> PathBuf {
    ns_dir_of(root, "contract", BB).join(".order-journal")
}

/// Removes a scratch root when the test ends, whatever happens.
struct Root(PathBuf);

impl Drop for Root {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn root() -> Root {
    Root(scratch_dir())
}

/// A harness that leaves its directory in place when dropped (a clean
/// close: `tier_free`).
fn open(c: &TierConfig, rows: usize) -> Harness {
    open_bb(c, rows, BB)
}

fn open_bb(c: &TierConfig, rows: usize, block_bytes: usize) -> Harness {
    let mut h = Harness::new(c, rows, block_bytes);
    h.scratch_dir = None;
    h
}

fn recovered_by(h: &Harness) -> &'static str {
    let line = h.tier().describe();
    if line.contains("recovered=manifest") {
        "manifest"
    } else if line.contains("recovered=scan") {
        "scan"
    } else {
        panic!("describe does not say how the tier was recovered: {line}")
    }
}

/// The ids of the blocks the open recovered, in its events' order (oldest
/// first).
fn recovered_ids(h: &Harness) -> Vec<u64> {
    h.events()
        .into_iter()
        .filter(|&(kind, _)| kind == EventKind::Stored(StoredReason::Recovered))
        .map(|(_, id)| id)
        .collect()
}

/// Block `id`'s file under the namespace directory `ns`.
fn block_file(ns: &Path, id: u64) -> PathBuf {
    let name = format!("{}.kvb", hex(&key(id)));
    files(ns, ".kvb")
        .into_iter()
        .find(|p| p.file_name().unwrap().to_str() == Some(name.as_str()))
        .unwrap()
}

const LONG: usize = 128;

fn long_key(i: u8) -> Vec<u8> {
    vec![i; LONG]
}

/// Stores keys 0..64 one job each, then touches 5, 0 and 10 (in that
/// order): the LRU order is then 1..=4, 6..=9, 11..=63, 5, 0, 10, which file
/// times cannot tell (a scan orders by mtime, ties by key).
fn fill_and_reorder(h: &Harness) {
    for i in 0..64 {
        h.store_all(i, &[i]);
    }
    for i in [5, 0, 10] {
        h.touch(&[i]);
    }
}

fn expected_lru() -> Vec<u64> {
    let mut order: Vec<u64> = (0..64).filter(|i| ![0, 5, 10].contains(i)).collect();
    order.extend([5, 0, 10]);
    order
}

#[test]
fn a_clean_close_keeps_every_key_and_the_exact_lru_order() {
    let root = root();
    {
        let h = open(&config(&root.0, 65), 8);
        fill_and_reorder(&h);
        // A key over 100 bytes: its file name is a hash, the manifest has
        // the key.
        h.fill(0, 777);
        h.tier()
            .submit_store(100, &long_key(7), LONG, &[0])
            .unwrap();
        assert!(h.result_of(100).is_ok());
        assert!(!manifest(&root.0).exists(), "written at close, not before");
    }
    assert!(manifest(&root.0).is_file(), "a clean close writes it");

    let h = open(&config(&root.0, 65), 8);
    assert_eq!(recovered_by(&h), "manifest");
    assert!(!manifest(&root.0).exists(), "deleted at open");
    assert_eq!(h.tier().stats().num_blocks, 65);
    assert_eq!(h.present(&(0..64).collect::<Vec<_>>()).len(), 64);
    h.tier().submit_load(1, &long_key(7), LONG, &[1]).unwrap();
    assert!(h.result_of(1).is_ok() && h.row_holds(1, 777));

    // The long key was stored last (most recent) and the load made it most
    // recent again; the 8 least recent of the rest go first, in LRU order.
    let order = expected_lru();
    for (n, id) in (1000..1008).enumerate() {
        h.store_all(id, &[id]);
        let gone: Vec<u64> = order[..=n].to_vec();
        let kept: Vec<u64> = order[n + 1..].to_vec();
        assert_eq!(
            h.present(&gone),
            Vec::<u64>::new(),
            "after {} stores",
            n + 1
        );
        assert_eq!(h.present(&kept), kept, "after {} stores", n + 1);
    }
    let r = h.load(2, &[0, 5, 10, 63], &[0, 1, 2, 3]);
    assert!(r.is_ok(), "{r:?}");
    assert!(h.row_holds(0, 0) && h.row_holds(1, 5) && h.row_holds(2, 10) && h.row_holds(3, 63));
}

#[test]
fn recovered_events_are_those_of_a_scan() {
    let root = root();
    let c = with_events(config(&root.0, 16), 256);
    {
        let h = open(&c, 8);
        for i in 0..12 {
            h.store_all(i, &[i]);
            // File times order the blocks for the scan as the LRU does.
            std::thread::sleep(Duration::from_millis(15));
        }
    }
    let from_manifest = {
        let h = open(&with_events(config(&root.0, 10), 256), 8);
        assert_eq!(recovered_by(&h), "manifest");
        h.events()
    };
    let recovered = EventKind::Stored(StoredReason::Recovered);
    let evicted = EventKind::Removed(RemovedReason::Evicted);
    let mut expected: Vec<(EventKind, u64)> = (0..10).map(|i| (recovered, i)).collect();
    expected.extend([(evicted, 0), (recovered, 10), (evicted, 1), (recovered, 11)]);
    assert_eq!(
        from_manifest, expected,
        "oldest first, evicted for want of room"
    );
    // The same open again, as after a crash: a scan of the same directory
    // (its 10 blocks) announces the same blocks in the same order.
    std::fs::remove_file(manifest(&root.0)).unwrap();
    let h = open(&with_events(config(&root.0, 10), 256), 8);
    assert_eq!(recovered_by(&h), "scan");
    let from_scan = h.events();
    let again: Vec<(EventKind, u64)> = (2..12).map(|i| (recovered, i)).collect();
    assert_eq!(from_scan, again);
}

/// The other process of the crash test (ignored when run directly).
#[test]
#[ignore]
fn child() {
    let Ok(dir) = std::env::var("KVTIER_CHILD_DIR") else {
        return;
    };
    let h = open(&config(Path::new(&dir), 64), 8);
    for i in 0..40 {
        h.store_all(i, &[i]);
    }
    // A crash: no tier_free.
    std::process::exit(0);
}

#[test]
fn a_crash_leaves_no_manifest_and_the_next_open_scans_everything() {
    let root = root();
    // An earlier clean close left a manifest; the child's open consumed it.
    drop(open(&config(&root.0, 64), 8));
    assert!(manifest(&root.0).is_file());
    let status = test_child("child")
        .env("KVTIER_CHILD_DIR", &root.0)
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(status.success(), "child: {status}");
    assert!(!manifest(&root.0).exists(), "no manifest without tier_free");
    let h = open(&config(&root.0, 64), 40);
    assert_eq!(recovered_by(&h), "scan");
    let ids: Vec<u64> = (0..40).collect();
    assert_eq!(h.present(&ids), ids);
    let r = h.load(1, &ids, &(0..40).collect::<Vec<_>>());
    assert!(r.is_ok(), "{r:?}");
    assert!(ids.iter().all(|&i| h.row_holds(i as usize, i)));
}

/// The other process of the order-hint test (ignored when run directly): a
/// run that opened from a manifest (which that open renamed to the order
/// hint), stored keys 100..108, and crashed.
#[test]
#[ignore]
fn hint_child() {
    let Ok(dir) = std::env::var("KVTIER_CHILD_DIR") else {
        return;
    };
    let h = open(&config(Path::new(&dir), 80), 8);
    assert_eq!(recovered_by(&h), "manifest");
    for i in 100..108 {
        h.store_all(i, &[i]);
        // File times order these for the scan.
        std::thread::sleep(Duration::from_millis(15));
    }
    std::process::exit(0);
}

/// After a crash of a run that had opened from a manifest, the scan takes
/// the last clean close's LRU order (which file times cannot tell: touches
/// do not change them) from the hint that open kept, without reading those
/// files' inodes; blocks stored since come after, oldest first. The hint
/// proves nothing: a file it names that is gone is not found. It stays
/// until a clean close writes a manifest, which removes it.
#[test]
fn a_scan_after_a_crash_takes_the_last_clean_close_order_from_the_hint() {
    let root = root();
    let c = config(&root.0, 80);
    {
        let h = open(&c, 8);
        fill_and_reorder(&h);
    }
    let status = test_child("hint_child")
        .env("KVTIER_CHILD_DIR", &root.0)
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(status.success(), "child: {status}");
    let ns = ns_dir_of(&root.0, "contract", BB);
    let hint = ns.join(".order-hint");
    assert!(!ns.join(MANIFEST).exists(), "no manifest without tier_free");
    assert!(
        hint.is_file(),
        "the child's open kept the manifest as the hint"
    );
    // A block the hint names, deleted behind the tier's back.
    let gone = 7u64;
    std::fs::remove_file(block_file(&ns, gone)).unwrap();
    // And one cut short: the hinted scan reads no inode, so its first load
    // finds it out (Corrupt: the file is condemned, the key forgotten).
    let torn = 20u64;
    let torn_file = block_file(&ns, torn);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&torn_file)
        .unwrap()
        .set_len(100)
        .unwrap();

    let h = open(&with_events(c.clone(), 256), 8);
    assert!(
        h.tier()
            .describe()
            .contains("recovered=scan ordered by the last close's manifest"),
        "{}",
        h.tier().describe()
    );
    let mut want: Vec<u64> = expected_lru().into_iter().filter(|&i| i != gone).collect();
    want.extend(100..108);
    assert_eq!(
        recovered_ids(&h),
        want,
        "hint order first, then the newer blocks"
    );
    assert_eq!(h.lookup(&[gone, torn]), [Miss, Hit]);
    let r = h.load(2, &[torn], &[0]);
    assert_eq!(r.error, Some(ErrorKind::Corrupt), "{r:?}");
    assert_eq!(h.lookup(&[torn]), [Miss]);
    assert!(!torn_file.exists(), "condemned by the load that read it");
    let ids: Vec<u64> = (60..64).chain(100..104).collect();
    let r = h.load(1, &ids, &(0..8).collect::<Vec<_>>());
    assert!(r.is_ok(), "{r:?}");
    assert!(ids.iter().enumerate().all(|(row, &i)| h.row_holds(row, i)));
    assert!(hint.is_file(), "kept until a clean close");
    drop(h);
    assert!(ns.join(MANIFEST).is_file() && !hint.exists());
}

/// The order in which the journal test's child stores its keys: no file
/// time or key order can tell it.
fn journal_order(n: u64) -> Vec<u64> {
    (0..n).map(|i| (i * 17 + 5) % n).collect()
}

/// The other process of the journal tests (ignored when run directly): a
/// first run in an empty directory (no manifest was ever written) that
/// stores `KVTIER_CHILD_KEYS` keys in `journal_order`, then crashes.
#[test]
#[ignore]
fn journal_child() {
    let Ok(dir) = std::env::var("KVTIER_CHILD_DIR") else {
        return;
    };
    let capacity: usize = std::env::var("KVTIER_CHILD_CAPACITY")
        .unwrap()
        .parse()
        .unwrap();
    let n: u64 = std::env::var("KVTIER_CHILD_KEYS").unwrap().parse().unwrap();
    let h = open(&config(Path::new(&dir), capacity), 8);
    assert_eq!(recovered_by(&h), "scan");
    for i in journal_order(n) {
        h.store_all(i, &[i]);
    }
    std::process::exit(0);
}

fn run_journal_child(root: &Path, capacity: usize, keys: u64) {
    let status = test_child("journal_child")
        .env("KVTIER_CHILD_DIR", root)
        .env("KVTIER_CHILD_CAPACITY", capacity.to_string())
        .env("KVTIER_CHILD_KEYS", keys.to_string())
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(status.success(), "child: {status}");
}

/// A crash of a run that never opened from a manifest (a first fill): the
/// scan takes the order of its stores from the store journal, which file
/// times cannot tell (they were all stored within a few milliseconds). A
/// clean close then writes a manifest and deletes the journal, which is
/// older than it.
#[test]
fn a_scan_after_a_crash_takes_the_order_of_stores_from_the_journal() {
    let root = root();
    let c = config(&root.0, 64);
    run_journal_child(&root.0, 64, 40);
    let ns = ns_dir_of(&root.0, "contract", BB);
    assert!(!ns.join(MANIFEST).exists() && !ns.join(".order-hint").exists());
    assert!(ns.join(".order-journal").is_file());
    // A block the journal names, deleted behind the tier's back: nothing.
    let gone = journal_order(40)[3];
    std::fs::remove_file(block_file(&ns, gone)).unwrap();

    let h = open(&with_events(c.clone(), 256), 8);
    let line = h.tier().describe();
    assert!(
        line.contains("recovered=scan ordered by the store journal"),
        "{line}"
    );
    let want: Vec<u64> = journal_order(40)
        .into_iter()
        .filter(|&i| i != gone)
        .collect();
    assert_eq!(recovered_ids(&h), want, "the order of the child's stores");
    assert_eq!(h.lookup(&[gone]), [Miss]);
    // This run goes on with the journal; a clean close supersedes it.
    h.store_all(1000, &[1000]);
    drop(h);
    assert!(ns.join(MANIFEST).is_file());
    assert!(!ns.join(".order-journal").exists() && !ns.join(".order-journal.old").exists());
    let h = open(&with_events(c, 256), 8);
    assert_eq!(recovered_by(&h), "manifest");
    let mut want = want;
    want.push(1000);
    assert_eq!(recovered_ids(&h), want);
}

/// The journal is bounded: at the tier's capacity in blocks it becomes the
/// old generation and a new one starts, and the two still order every block
/// a full tier holds after many more stores than it has room for.
#[test]
fn the_journal_rotates_at_the_capacity_and_still_orders_a_full_tier() {
    let root = root();
    let capacity = 10;
    run_journal_child(&root.0, capacity, 45);
    let ns = ns_dir_of(&root.0, "contract", BB);
    let journal_len = |name: &str| std::fs::metadata(ns.join(name)).unwrap().len();
    // 45 stores in generations of 10: the old one holds 10 entries, the
    // current one 5 (each entry a length byte and the key, after a
    // 32-byte head).
    let entry = 1 + KEY_LEN as u64;
    assert_eq!(journal_len(".order-journal.old"), 32 + 10 * entry);
    assert_eq!(journal_len(".order-journal"), 32 + 5 * entry);
    let h = open(&with_events(config(&root.0, capacity), 64), 8);
    let line = h.tier().describe();
    assert!(
        line.contains("recovered=scan ordered by the store journal"),
        "{line}"
    );
    let stored = journal_order(45);
    assert_eq!(recovered_ids(&h), stored[45 - capacity..].to_vec());
}

#[test]
fn a_damaged_manifest_is_ignored_deleted_and_the_scan_finds_everything() {
    let root = root();
    let c = config(&root.0, 64);
    drop(open(&c, 8));
    let h = open(&c, 8);
    for i in 0..20 {
        h.store_all(i, &[i]);
    }
    drop(h);
    let good = std::fs::read(manifest(&root.0)).unwrap();
    // 40-byte head, 256 directory stamps of 24 bytes, 20 entries of 1 + 36
    // bytes, count and checksum.
    const ENTRIES: usize = 40 + 256 * 24;
    assert_eq!(good.len(), ENTRIES + 20 * 37 + 16);
    type Damage = Box<dyn Fn(&mut Vec<u8>)>;
    let flip = |at: usize| -> Damage { Box::new(move |b: &mut Vec<u8>| b[at] ^= 0x10) };
    let damages: Vec<(&str, Damage)> = vec![
        ("magic", flip(1)),
        ("version", flip(8)),
        ("flags", flip(12)),
        ("namespace", flip(17)),
        ("block size", flip(25)),
        ("file length", flip(33)),
        ("a directory stamp", flip(40 + 24 * 100 + 9)),
        ("a key length", flip(ENTRIES)),
        ("a key byte", flip(ENTRIES + 1 + 37 * 7)),
        ("the count", flip(good.len() - 16)),
        ("the checksum", flip(good.len() - 1)),
        (
            "truncated",
            Box::new(|b: &mut Vec<u8>| b.truncate(b.len() - 37)),
        ),
        (
            "cut in an entry",
            Box::new(|b: &mut Vec<u8>| b.truncate(ENTRIES + 300)),
        ),
        (
            "cut in the stamps",
            Box::new(|b: &mut Vec<u8>| b.truncate(1000)),
        ),
        ("empty", Box::new(|b: &mut Vec<u8>| b.clear())),
        ("extended", Box::new(|b: &mut Vec<u8>| b.extend([0u8; 37]))),
    ];
    for (what, damage) in &damages {
        let path = manifest(&root.0);
        // Each round's clean close wrote a good manifest again.
        assert_eq!(std::fs::read(&path).unwrap(), good, "{what}");
        let mut bad = good.clone();
        damage(&mut bad);
        std::fs::write(&path, &bad).unwrap();
        let h = open(&c, 8);
        assert_eq!(recovered_by(&h), "scan", "{what}");
        assert!(!path.exists(), "{what}: deleted at open");
        let ids: Vec<u64> = (0..20).collect();
        assert_eq!(h.present(&ids), ids, "{what}");
        // A use of no block: the next manifest lists the same order. (The
        // scan's order is the files' mtimes; the stores were one per job,
        // so that order may differ from the first one: compare from now.)
        drop(h);
        let h = open(&c, 8);
        assert_eq!(recovered_by(&h), "manifest", "{what}");
        drop(h);
        let fresh = std::fs::read(&path).unwrap();
        assert_eq!(fresh.len(), good.len(), "{what}");
        std::fs::write(&path, &good).unwrap();
    }
    // The undamaged one is used.
    let h = open(&c, 8);
    assert_eq!(recovered_by(&h), "manifest");
}

#[test]
fn a_manifest_of_another_namespace_block_size_or_sealing_is_ignored() {
    let root = root();
    let c = config(&root.0, 64);
    drop(open(&c, 8));
    let h = open(&c, 8);
    h.store_all(1, &[1, 2, 3]);
    drop(h);
    let theirs = std::fs::read(manifest(&root.0)).unwrap();

    // Another namespace: its own directory and blocks.
    let mut other = config(&root.0, 64);
    other.namespace = "other".into();
    drop(open(&other, 8));
    let other_dir = ns_dir_of(&root.0, "other", BB);
    let h = open(&other, 8);
    h.store_all(1, &[7]);
    drop(h);
    std::fs::write(other_dir.join(MANIFEST), &theirs).unwrap();
    let h = open(&other, 8);
    assert_eq!(recovered_by(&h), "scan");
    assert_eq!(h.present(&[1, 2, 3, 7]), vec![7]);
    assert!(!other_dir.join(MANIFEST).exists());
    drop(h);

    // Another block size.
    let big = config(&root.0, 64);
    drop(open_bb(&big, 8, 2 * BB));
    let big_dir = ns_dir_of(&root.0, "contract", 2 * BB);
    std::fs::write(big_dir.join(MANIFEST), &theirs).unwrap();
    let h = open_bb(&big, 8, 2 * BB);
    assert!(h.tier().describe().contains("recovered=scan"));
    assert_eq!(h.lookup(&[1, 2, 3]), vec![Miss, Miss, Miss]);
    assert!(!big_dir.join(MANIFEST).exists());
    drop(h);

    // A sealed tier in the same directory: it never uses (nor writes) one.
    let mut sealed = config(&root.0, 64);
    sealed.set("seal_key", SEAL_A).unwrap();
    assert!(manifest(&root.0).is_file());
    let h = open(&sealed, 8);
    assert_eq!(recovered_by(&h), "scan");
    assert_eq!(h.lookup(&[1, 2, 3]), vec![Miss, Miss, Miss]);
    assert!(!manifest(&root.0).exists());
    h.store_all(2, &[9]);
    drop(h);
    assert!(!manifest(&root.0).exists(), "a sealed tier writes none");
    assert!(
        !journal(&root.0).exists(),
        "nor a store journal (its keys are written nowhere)"
    );
    // The unsealed tier scans, and finds its own blocks only.
    let h = open(&c, 8);
    assert_eq!(recovered_by(&h), "scan");
    assert_eq!(h.present(&[1, 2, 3, 9]), vec![1, 2, 3]);
}

#[test]
fn a_shared_tier_never_writes_a_manifest_and_deletes_one_it_finds() {
    let root = root();
    let c = config(&root.0, 64);
    let mut shared = config(&root.0, 64);
    shared.disk.shared = true;
    let h = open(&shared, 8);
    h.store_all(1, &[1, 2]);
    drop(h);
    assert!(!manifest(&root.0).exists(), "shared: no manifest");
    assert!(!journal(&root.0).exists(), "shared: no store journal");
    // A clean close of an exclusive tier writes one; a shared open deletes it.
    drop(open(&c, 8));
    assert!(manifest(&root.0).is_file());
    let h = open(&shared, 8);
    assert!(!manifest(&root.0).exists());
    assert_eq!(recovered_by(&h), "scan");
    h.store_all(2, &[3]);
    drop(h);
    assert!(!manifest(&root.0).exists());
    let h = open(&c, 8);
    assert_eq!(recovered_by(&h), "scan");
    assert_eq!(h.present(&[1, 2, 3]), vec![1, 2, 3]);
}

#[test]
fn a_block_file_deleted_between_close_and_open_makes_the_open_scan() {
    let root = root();
    let c = with_events(config(&root.0, 64), 64);
    let h = open(&c, 8);
    for i in 1..=3 {
        h.store_all(i, &[i]);
    }
    drop(h);
    let gone = files(&root.0, ".kvb")
        .into_iter()
        .find(|p| {
            let name = p.file_name().unwrap().to_str().unwrap();
            name == format!("{}.kvb", hex(&key(2)))
        })
        .unwrap();
    std::fs::remove_file(&gone).unwrap();
    // The deletion changed its directory: the manifest no longer describes
    // the disk, so the open scans and the key is a MISS at once (listed, a
    // store of it would have been taken for one already done).
    let h = open(&c, 8);
    assert_eq!(recovered_by(&h), "scan");
    assert!(!manifest(&root.0).exists());
    assert_eq!(h.lookup(&[1, 2, 3]), [Hit, Miss, Hit]);
    h.fill(0, 2);
    let r = h.store(12, &[2], &[0]);
    assert!(
        r.is_ok() && r.bytes == h.block_bytes as u64,
        "stored again: {r:?}"
    );
    let r = h.load(13, &[1, 2, 3], &[0, 1, 2]);
    assert!(
        r.is_ok() && h.row_holds(0, 1) && h.row_holds(1, 2) && h.row_holds(2, 3),
        "{r:?}"
    );
    drop(h);
    let h = open(&c, 8);
    assert_eq!(recovered_by(&h), "manifest");
    assert_eq!(h.tier().stats().num_blocks, 3);
}

#[test]
fn a_block_file_added_between_close_and_open_makes_the_open_scan() {
    let root = root();
    let c = config(&root.0, 64);
    let h = open(&c, 8);
    h.store_all(1, &[1]);
    drop(h);
    // Another tier (or a copy) puts a block of the same namespace there.
    let other_root = Root(scratch_dir());
    let other = config(&other_root.0, 64);
    let h = open(&other, 8);
    h.store_all(1, &[7]);
    drop(h);
    let from = files(&other_root.0, ".kvb").pop().unwrap();
    let rel = from.strip_prefix(&other_root.0).unwrap();
    let to = root.0.join(rel);
    std::fs::create_dir_all(to.parent().unwrap()).unwrap();
    std::fs::copy(&from, &to).unwrap();
    let h = open(&c, 8);
    assert_eq!(recovered_by(&h), "scan");
    assert_eq!(h.lookup(&[1, 7]), [Hit, Hit]);
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn no_manifest_after_a_missed_io_deadline() {
    let root = root();
    let mut c = config(&root.0, 64);
    // Long enough that no healthy call misses it on a loaded machine (see
    // tests/disk_deadline.rs): only the hung read does.
    c.io_timeout_ms = Some(1000);
    let h = open(&c, 8);
    h.store_all(1, &[1, 2]);
    h.tier().hang_disk_io(HangPoint::Read, 0, 1);
    let r = h.load(2, &[1], &[5]);
    assert_eq!(r.error, Some(ErrorKind::Io), "{r:?}");
    assert_eq!(h.tier().stats().io_deadlines_missed, 1);
    h.tier().release_disk_io();
    assert!(h.tier().wait_disk_io_released(Duration::from_secs(10)));
    drop(h);
    assert!(
        !manifest(&root.0).exists(),
        "storage that hung is not trusted"
    );
    // Without the hang, the same tier writes one.
    drop(open(&c, 8));
    assert!(manifest(&root.0).is_file());
}

#[test]
fn no_manifest_while_a_job_is_left_unfinished() {
    let root = root();
    let c = config(&root.0, 64);
    let manual = |run: bool| {
        let mut h = Harness::manual(&c, 8, BB);
        h.scratch_dir = None;
        h.fill(0, 1);
        h.tier()
            .submit_store(1, &keys(&[1]), KEY_LEN, &[0])
            .unwrap();
        if run {
            assert!(h.tier().run_queued_job(1));
            assert!(h.result_of(1).is_ok());
        }
        drop(h);
    };
    manual(false);
    assert!(!manifest(&root.0).exists(), "a store still queued at close");
    manual(true);
    assert!(manifest(&root.0).is_file(), "all jobs done");
}

#[test]
fn a_close_that_died_writing_leaves_debris_the_next_open_removes() {
    let root = root();
    let c = config(&root.0, 64);
    let h = open(&c, 8);
    h.store_all(1, &[1, 2]);
    drop(h);
    let dir = ns_dir_of(&root.0, "contract", BB);
    std::fs::rename(dir.join(MANIFEST), dir.join(".manifest.new")).unwrap();
    let h = open(&c, 8);
    assert_eq!(recovered_by(&h), "scan");
    assert!(!dir.join(".manifest.new").exists());
    assert_eq!(h.present(&[1, 2]), vec![1, 2]);
    drop(h);
    // Not a regular file: ignored (never followed or waited on), removed.
    std::fs::remove_file(dir.join(MANIFEST)).unwrap();
    std::os::unix::fs::symlink("/dev/zero", dir.join(MANIFEST)).unwrap();
    let h = open(&c, 8);
    assert_eq!(recovered_by(&h), "scan");
    assert!(std::fs::symlink_metadata(dir.join(MANIFEST)).is_err());
    assert_eq!(h.present(&[1, 2]), vec![1, 2]);
}

#[test]
fn a_tier_built_from_a_manifest_stores_and_evicts_normally() {
    let root = root();
    let c = config(&root.0, 8);
    let h = open(&c, 8);
    for i in 0..8 {
        h.store_all(i, &[i]);
    }
    drop(h);
    let h = open(&c, 8);
    assert_eq!(recovered_by(&h), "manifest");
    for i in 8..12 {
        h.store_all(i, &[i]);
    }
    // Evicted files are deleted (on a worker).
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while files(&root.0, ".kvb").len() != 8 {
        assert!(std::time::Instant::now() < deadline, "evicted files stay");
        std::thread::sleep(Duration::from_millis(5));
    }
    drop(h);
    let h = open(&c, 8);
    assert_eq!(recovered_by(&h), "manifest");
    assert_eq!(
        h.present(&(0..12).collect::<Vec<_>>()),
        (4..12).collect::<Vec<_>>()
    );
}
