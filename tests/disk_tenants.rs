//! Whose files a disk tier may delete (docs/reliability-rules.md): a tier
//! opening a directory that holds another tenant's blocks (another seal
//! key, or sealed and unsealed) deletes none of them, shared or not; a
//! sealed tier in a shared directory deletes no damaged file, at its own
//! names or at another tenant's.

mod common;

use common::*;
use kvtier::{ErrorKind, TierConfig};
use std::path::{Path, PathBuf};

const BB: usize = 8192;

fn disk(dir: &Path, shared: bool, seal: Option<&str>) -> TierConfig {
    tenant_disk_config(dir, shared, seal, BB)
}

fn tier(config: &TierConfig) -> Harness {
    Harness::leaving_dir(config, 40, BB)
}

/// Every block file (sealed and unsealed) in `dir`, with its bytes.
fn snapshot(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut all: Vec<_> = [".kvs", ".kvb"]
        .iter()
        .flat_map(|ext| files(dir, ext))
        .map(|f| {
            let bytes = std::fs::read(&f).unwrap();
            (f, bytes)
        })
        .collect();
    all.sort();
    all
}

/// The file a store of `id` into `h` adds to `dir`.
fn stored_file(h: &Harness, dir: &Path, job: u64, id: u64) -> PathBuf {
    let before = files(dir, "");
    h.store_all(job, &[id]);
    let mut new: Vec<_> = files(dir, "")
        .into_iter()
        .filter(|f| !before.contains(f))
        .collect();
    assert_eq!(new.len(), 1, "{new:?}");
    new.pop().unwrap()
}

/// A fills a directory (not shared); B, with another seal key or the other
/// of sealed and unsealed, opens it shared and not shared, stores blocks of
/// its own under the same ids and goes; A reopens and loads every block
/// byte-exact, and not one of A's files changed.
#[test]
fn another_tenant_opening_a_directory_deletes_none_of_its_blocks() {
    let pairs = [
        ("sealed A, sealed B", Some(SEAL_A), Some(SEAL_B)),
        ("unsealed A, sealed B", None, Some(SEAL_B)),
        ("sealed A, unsealed B", Some(SEAL_A), None),
    ];
    for (what, a_key, b_key) in pairs {
        for b_shared in [false, true] {
            let case = format!("{what}, B shared={b_shared}");
            let dir = scratch_dir();
            let ids: Vec<u64> = (0..32).collect();
            let a = tier(&disk(&dir, false, a_key));
            a.store_all(1, &ids);
            drop(a);
            let mine = snapshot(&dir);
            assert_eq!(mine.len(), 32, "{case}");

            let b = tier(&disk(&dir, b_shared, b_key));
            assert_eq!(b.tier().stats().num_blocks, 0, "{case}: B adopts none");
            b.store_all(2, &[1, 2, 3]);
            drop(b);
            // Reopened once more by B (its own blocks back, A's untouched).
            let b = tier(&disk(&dir, b_shared, b_key));
            drop(b);

            let now = snapshot(&dir);
            for file in &mine {
                assert!(now.contains(file), "{case}: {:?} changed", file.0);
            }
            let a = tier(&disk(&dir, false, a_key));
            assert_eq!(a.tier().stats().num_blocks, 32, "{case}");
            for chunk in ids.chunks(8) {
                let rows: Vec<i64> = (0..chunk.len() as i64).collect();
                let r = a.load(3, chunk, &rows);
                assert!(r.is_ok(), "{case}: {r:?}");
                for (row, &id) in chunk.iter().enumerate() {
                    assert!(a.row_holds(row, id), "{case}: block {id}");
                }
            }
            drop(a);
            std::fs::remove_dir_all(&dir).unwrap();
        }
    }
}

/// In a shared directory a sealed tier deletes no file at its own names
/// that is truncated, extended or replaced by another of its own blocks (a
/// load is a miss, a reopening scan leaves them), and another tenant's tier
/// deletes no file at A's name whose content is its own block.
#[test]
fn a_shared_sealed_tier_deletes_no_damaged_file() {
    let dir = scratch_dir();
    let a = tier(&disk(&dir, true, Some(SEAL_A)));
    let f: Vec<PathBuf> = (1..=4).map(|id| stored_file(&a, &dir, id, id)).collect();
    let b = tier(&disk(&dir, true, Some(SEAL_B)));
    let b_block = std::fs::read(stored_file(&b, &dir, 10, 10)).unwrap();
    drop(b);

    let len = std::fs::metadata(&f[0]).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&f[0])
        .unwrap()
        .set_len(len - 100)
        .unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&f[1])
        .unwrap()
        .set_len(len + 4096)
        .unwrap();
    std::fs::copy(&f[3], &f[2]).unwrap();
    std::fs::write(&f[3], &b_block).unwrap();
    let damaged = snapshot(&dir);

    for (n, id) in (1..=4).enumerate() {
        let r = a.load(20 + n as u64, &[id], &[0]);
        assert_eq!(r.error, Some(ErrorKind::NotFound), "block {id}: {r:?}");
    }
    assert_eq!(snapshot(&dir), damaged, "A's loads deleted nothing");
    drop(a);
    // Reopening scans: A's tier and B's tier, shared.
    for key in [SEAL_A, SEAL_B] {
        let h = tier(&disk(&dir, true, Some(key)));
        drop(h);
        assert_eq!(snapshot(&dir), damaged, "a scan deleted something");
    }
    // The next store of a damaged key replaces its file; the block loads.
    let a = tier(&disk(&dir, true, Some(SEAL_A)));
    a.store_all(30, &[1, 2, 3, 4]);
    let rows: Vec<i64> = (0..4).collect();
    let r = a.load(31, &[1, 2, 3, 4], &rows);
    assert!(r.is_ok(), "{r:?}");
    assert!((0..4).all(|row| a.row_holds(row, row as u64 + 1)));
    drop(a);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Not shared, a sealed tier still deletes its own damaged block at its own
/// name (on load, and a file cut short at the reopening scan), and leaves
/// a file of its own under another of its names (which may be another
/// tenant's) in place.
#[test]
fn an_unshared_sealed_tier_deletes_only_its_own_damaged_blocks() {
    let dir = scratch_dir();
    let a = tier(&disk(&dir, false, Some(SEAL_A)));
    let f: Vec<PathBuf> = (1..=4).map(|id| stored_file(&a, &dir, id, id)).collect();
    let len = std::fs::metadata(&f[0]).unwrap().len();
    let mut bytes = std::fs::read(&f[0]).unwrap();
    bytes[5000] ^= 1;
    std::fs::write(&f[0], &bytes).unwrap();
    let r = a.load(10, &[1], &[0]);
    assert_eq!(r.error, Some(ErrorKind::Corrupt), "{r:?}");
    assert!(!f[0].exists(), "its own corrupt block, deleted");
    drop(a);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&f[1])
        .unwrap()
        .set_len(len - 100)
        .unwrap();
    std::fs::copy(&f[3], &f[2]).unwrap();
    let a = tier(&disk(&dir, false, Some(SEAL_A)));
    assert!(
        !f[1].exists(),
        "its own block cut short, deleted by the scan"
    );
    assert!(f[2].exists(), "its own block under another name, left");
    assert_eq!(a.tier().stats().num_blocks, 1, "block 4 alone");
    let r = a.load(11, &[4], &[0]);
    assert!(r.is_ok() && a.row_holds(0, 4), "{r:?}");
    drop(a);
    std::fs::remove_dir_all(&dir).unwrap();
}
