//! Whose files a disk tier may delete (docs/reliability-rules.md): a tier
//! opening a directory that holds another tenant's blocks (another seal
//! key, or sealed and unsealed) deletes none of them, shared or not.

mod common;

use common::*;
use kvtier::TierConfig;
use std::path::{Path, PathBuf};

const BB: usize = 8192;

fn disk(dir: &Path, shared: bool, seal: Option<&str>) -> TierConfig {
    let mut c = disk_config(64, BB);
    c.disk.path = Some(dir.to_path_buf());
    c.disk.shared = shared;
    c.probe_ttl_ms = 50;
    if let Some(seal) = seal {
        c.set("seal_key", seal).unwrap();
    }
    c
}

/// A harness that leaves the directory to the test.
fn tier(config: &TierConfig) -> Harness {
    let mut h = Harness::new(config, 40, BB);
    h.scratch_dir = None;
    h
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
