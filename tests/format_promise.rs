//! The promise on shared storage across versions: a reader that meets a
//! block written in a newer format than it reads treats it as a miss and never
//! deletes it (a fleet rolled forward host by host shares one directory).

mod common;

use common::*;
use kvtier::{ErrorKind, FailReason, LookupState, TierConfig};
use std::path::{Path, PathBuf};

const BB: usize = 4096;
/// The block file header's layout (src/backend/disk/format.rs): version at
/// 8..12, xxh64 of the bytes before it at the header's last 8.
const HEADER_LEN: usize = 4096;

fn config(dir: &Path, form: &str) -> TierConfig {
    let mut c = disk_config(16, BB);
    c.disk.path = Some(dir.to_path_buf());
    c.set("block_header", form).unwrap();
    c
}

fn block_files(root: &Path) -> Vec<PathBuf> {
    let mut all = Vec::new();
    for ns in std::fs::read_dir(root).unwrap().flatten() {
        if ns.path().is_dir() {
            all.extend(files(&ns.path(), ".kvb"));
        }
    }
    all
}

/// Rewrites a block file's in-file header as a later version would write
/// it: same magic, a higher version, a valid header checksum.
fn make_newer(file: &Path) {
    let mut bytes = std::fs::read(file).unwrap();
    assert!(bytes.len() > HEADER_LEN && &bytes[..8] == b"KVTIERB\0");
    let version = u32::from_le_bytes(bytes[8..12].try_into().unwrap());
    bytes[8..12].copy_from_slice(&(version + 1).to_le_bytes());
    let sum = twox_hash::XxHash64::oneshot(0, &bytes[..HEADER_LEN - 8]);
    bytes[HEADER_LEN - 8..HEADER_LEN].copy_from_slice(&sum.to_le_bytes());
    std::fs::write(file, &bytes).unwrap();
}

#[test]
fn a_block_in_a_newer_format_is_a_miss_and_is_never_deleted() {
    let dir = scratch_dir();
    let cfg = config(&dir, "file");
    {
        let mut h = Harness::new(&cfg, 8, BB);
        h.scratch_dir = None; // reopened below
        h.store_all(1, &[1, 2]);
    }
    let files = block_files(&dir);
    assert_eq!(files.len(), 2, "{files:?}");
    make_newer(&files[0]);
    let newer = std::fs::read(&files[0]).unwrap();

    for round in 0..2u64 {
        // Reopened (recovery sees it), loaded, reopened again: every time a
        // miss for the newer block, the other block intact, the file kept.
        let mut h = Harness::new(&cfg, 8, BB);
        if round == 0 {
            h.scratch_dir = None;
        }
        let results: Vec<_> = [1u64, 2]
            .iter()
            .map(|&i| (i, h.load(10 * round + i, &[i], &[4])))
            .collect();
        let failed: Vec<_> = results.iter().filter(|(_, r)| !r.is_ok()).collect();
        assert_eq!(failed.len(), 1, "round {round}: {results:?}");
        let (old_id, r) = failed[0];
        assert_eq!(r.error, Some(ErrorKind::NotFound), "round {round}: {r:?}");
        assert_eq!(r.reason, FailReason::NotFound);
        assert_eq!(h.lookup(&[*old_id]), [LookupState::Miss]);
        let other = 3 - old_id;
        assert!(h.load(100 + round, &[other], &[5]).is_ok());
        assert!(h.row_holds(5, other));
        h.tier = None;
        assert_eq!(
            std::fs::read(&files[0]).ok().as_deref(),
            Some(&newer[..]),
            "round {round}: the newer block must stay on disk, unchanged"
        );
    }
}

/// A long key's block file is named by a hash, so reopening reads its header
/// to learn the key: a newer header there is kept too (unindexed: a miss),
/// whether the reopen reads the manifest or scans the directory.
#[test]
fn a_hashed_block_in_a_newer_format_survives_reopening() {
    const LONG: usize = 120;
    let long_key = |i: u8| vec![i; LONG];
    for scan in [false, true] {
        let dir = scratch_dir();
        let cfg = config(&dir, "file");
        {
            let mut h = Harness::new(&cfg, 8, BB);
            h.scratch_dir = None;
            h.tier().submit_store(1, &long_key(7), LONG, &[0]).unwrap();
            assert!(h.result_of(1).is_ok());
        }
        let files = block_files(&dir);
        assert_eq!(files.len(), 1, "{files:?}");
        make_newer(&files[0]);
        let newer = std::fs::read(&files[0]).unwrap();
        if scan {
            for ns in std::fs::read_dir(&dir).unwrap().flatten() {
                for name in [".manifest", ".order-hint", ".order-journal"] {
                    let _ = std::fs::remove_file(ns.path().join(name));
                }
            }
        }
        let mut h = Harness::new(&cfg, 8, BB);
        h.tier().submit_load(2, &long_key(7), LONG, &[1]).unwrap();
        let r = h.result_of(2);
        assert_eq!(r.error, Some(ErrorKind::NotFound), "scan {scan}: {r:?}");
        h.tier = None;
        assert_eq!(
            std::fs::read(&files[0]).ok().as_deref(),
            Some(&newer[..]),
            "scan {scan}: the newer block must stay on disk, unchanged"
        );
        h.scratch_dir = Some(dir);
    }
}

/// The same promise in a Redis keyspace shared across versions: a value whose
/// header carries a newer format version is a miss and stays on the server.
#[test]
fn a_redis_value_in_a_newer_format_is_a_miss_and_is_never_deleted() {
    use common::redis::{redis_config_at, RedisServer};
    let server = redis_or_skip!(RedisServer::start());
    let config = redis_config_at(&server.url(), 8, BB);
    let h = Harness::new(&config, 8, BB);
    h.store_all(1, &[1, 2]);
    let names: Vec<String> = server
        .cli(&[
            "--scan",
            "--pattern",
            &format!("{}:*", config.redis.key_prefix),
        ])
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");
    let hex1: String = key(1).iter().map(|b| format!("{b:02x}")).collect();
    let one = names.iter().find(|n| n.contains(&hex1)).unwrap();
    // The format version's low byte (bytes 8..12, little-endian) made 0x7f.
    server.cli(&["SETRANGE", one, "8", "\u{7f}"]);
    let before = server.cli(&["GET", one]);
    let r = h.load(2, &[1], &[4]);
    assert_eq!(r.error, Some(ErrorKind::NotFound), "{r:?}");
    assert_eq!(h.lookup(&[1]), [LookupState::Miss]);
    assert_eq!(server.cli(&["EXISTS", one]), "1", "the newer value is kept");
    assert_eq!(server.cli(&["GET", one]), before);
    assert!(h.load(3, &[2], &[5]).is_ok() && h.row_holds(5, 2));
}
