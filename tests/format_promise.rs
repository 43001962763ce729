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
    files_ending(root, ".kvb")
}

fn files_ending(root: &Path, ext: &str) -> Vec<PathBuf> {
    let mut all = Vec::new();
    for ns in std::fs::read_dir(root).unwrap().flatten() {
        if ns.path().is_dir() {
            all.extend(files(&ns.path(), ext));
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
    // Rewritten as a later format would write it: the version (bytes 8..12,
    // little-endian) raised, the header's own checksum made again.
    let mut value = raw_get(&server.url(), one);
    value[8..12].copy_from_slice(&0x7fu32.to_le_bytes());
    reseal_redis_header(&mut value);
    raw_set(&server.url(), one, &value);
    let r = h.load(2, &[1], &[4]);
    assert_eq!(r.error, Some(ErrorKind::NotFound), "{r:?}");
    assert_eq!(h.lookup(&[1]), [LookupState::Miss]);
    assert_eq!(server.cli(&["EXISTS", one]), "1", "the newer value is kept");
    assert_eq!(raw_get(&server.url(), one), value);
    assert!(h.load(3, &[2], &[5]).is_ok() && h.row_holds(5, 2));
}

/// A Redis value whose version byte alone was damaged (its header's
/// checksum no longer holds) is no newer format: it is corrupt, and an
/// owned tier deletes it (it was once kept for ever as "newer").
#[test]
fn a_redis_value_with_a_damaged_version_byte_is_corrupt() {
    use common::redis::{redis_config_at, RedisServer};
    let server = redis_or_skip!(RedisServer::start());
    let config = redis_config_at(&server.url(), 8, BB);
    let h = Harness::new(&config, 8, BB);
    h.store_all(1, &[1, 2]);
    let hex1: String = key(1).iter().map(|b| format!("{b:02x}")).collect();
    let one = server
        .cli(&["--scan", "--pattern", &format!("*{hex1}*")])
        .trim()
        .to_string();
    assert!(!one.is_empty());
    server.cli(&["SETRANGE", &one, "8", "\u{7f}"]);
    let r = h.load(2, &[1], &[4]);
    assert_eq!(r.error, Some(ErrorKind::Corrupt), "{r:?}");
    assert_eq!(h.lookup(&[1]), [LookupState::Miss]);
    assert_eq!(
        server.cli(&["EXISTS", &one]),
        "0",
        "the damaged value is deleted"
    );
    assert!(h.load(3, &[2], &[5]).is_ok() && h.row_holds(5, 2));
}

fn raw_connection(url: &str) -> ::redis::Connection {
    ::redis::Client::open(url)
        .unwrap()
        .get_connection()
        .unwrap()
}

fn raw_get(url: &str, name: &str) -> Vec<u8> {
    ::redis::cmd("GET")
        .arg(name)
        .query(&mut raw_connection(url))
        .unwrap()
}

fn raw_set(url: &str, name: &str, value: &[u8]) {
    ::redis::cmd("SET")
        .arg(name)
        .arg(value)
        .query::<()>(&mut raw_connection(url))
        .unwrap()
}

/// Makes a Redis value's header checksum again (src/backend/redis/format.rs:
/// the header's length at 12..16, its xxh64 its last 8 bytes), as a writer
/// of that header would.
fn reseal_redis_header(value: &mut [u8]) {
    let len = u32::from_le_bytes(value[12..16].try_into().unwrap()) as usize;
    let sum = twox_hash::XxHash64::oneshot(0, &value[..len - 8]);
    value[len - 8..len].copy_from_slice(&sum.to_le_bytes());
}

/// The sealed record's layout (src/seal/record.rs): magic "KVTIERS\0", the
/// format version at 8..12 (little-endian), the nonce at 32..44, the key
/// field at 60..189 and its tag at 189..205, sealed (AES-256-GCM) under a
/// subkey of the tenant's key with bytes 0..44 as additional data. A later
/// format keeps those, so that a reader proves a record newer by opening its
/// key field; the payload's seal it cannot check (the payload's layout may
/// change), so a record rewritten here opens no payload.
const SEALED_MAGIC: &[u8; 8] = b"KVTIERS\0";
const SEALED_VERSION: u32 = 1;
/// Bytes of the sealed record before a Redis value's ciphertext.
const SEALED_RECORD: usize = 205;

/// Rewrites a sealed record (at the start of `bytes`, sealed with
/// [`SEAL_A`]) as a later version would: same magic, the next version, the
/// key field sealed again over the new binding.
fn make_sealed_newer(bytes: &mut [u8]) {
    use ring::aead::{self, Aad, LessSafeKey, UnboundKey};
    assert_eq!(&bytes[..8], SEALED_MAGIC);
    assert_eq!(bytes[8..12], SEALED_VERSION.to_le_bytes());
    let secret: Vec<u8> = (0..SEAL_A.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&SEAL_A[i..i + 2], 16).unwrap())
        .collect();
    let master = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &secret);
    let sub = ring::hmac::sign(&master, b"kvtier seal v1: key field");
    let field_key = LessSafeKey::new(UnboundKey::new(&aead::AES_256_GCM, sub.as_ref()).unwrap());
    let nonce = || aead::Nonce::try_assume_unique_for_key(&bytes[32..44]).unwrap();
    let mut field = bytes[60..189].to_vec();
    let tag = aead::Tag::try_from(&bytes[189..205]).unwrap();
    let old_binding = bytes[..44].to_vec();
    field_key
        .open_in_place_separate_tag(nonce(), Aad::from(&old_binding), tag, &mut field, 0..)
        .expect("a record sealed with SEAL_A");
    let nonce = nonce();
    bytes[8..12].copy_from_slice(&(SEALED_VERSION + 1).to_le_bytes());
    let new_binding = bytes[..44].to_vec();
    let tag = field_key
        .seal_in_place_separate_tag(nonce, Aad::from(&new_binding), &mut field)
        .unwrap();
    bytes[60..189].copy_from_slice(&field);
    bytes[189..205].copy_from_slice(tag.as_ref());
}

/// A sealed record whose version byte alone is damaged: the next version,
/// nothing sealed again.
fn damage_sealed_version(bytes: &mut [u8]) {
    assert_eq!(&bytes[..8], SEALED_MAGIC);
    bytes[8..12].copy_from_slice(&(SEALED_VERSION + 1).to_le_bytes());
}

fn sealed_config(dir: &Path, shared: bool) -> TierConfig {
    let mut c = disk_config(16, BB);
    c.disk.path = Some(dir.to_path_buf());
    c.disk.shared = shared;
    c.set("seal_key", SEAL_A).unwrap();
    c
}

/// Sealed block files (`seal_key`) keep the promise: a record of a newer
/// sealed format, of the same length or not, is a miss when loaded by the
/// tier that indexed it and after a reopen's scan, shared or not, and stays
/// on disk unchanged.
#[test]
fn a_sealed_block_in_a_newer_format_is_a_miss_and_is_never_deleted() {
    for shared in [false, true] {
        let dir = scratch_dir();
        let cfg = sealed_config(&dir, shared);
        let mut writer = Harness::new(&cfg, 8, BB);
        writer.scratch_dir = None; // reopened below
        let mut by_id = Vec::new();
        for id in 1..=3u64 {
            let before = files_ending(&dir, ".kvs");
            writer.store_all(id, &[id]);
            let mut new: Vec<_> = files_ending(&dir, ".kvs")
                .into_iter()
                .filter(|f| !before.contains(f))
                .collect();
            assert_eq!(new.len(), 1, "{new:?}");
            by_id.push((id, new.pop().unwrap()));
        }
        // Rewritten under the tier that indexed them (as a newer host
        // sharing the directory would): block 1 as the next sealed version,
        // same length; block 2 the same and a longer file; block 3 intact.
        let mut newer = Vec::new();
        for (id, file) in &by_id[..2] {
            let mut bytes = std::fs::read(file).unwrap();
            make_sealed_newer(&mut bytes);
            if *id == 2 {
                bytes.extend_from_slice(&[0u8; 4096]);
            }
            std::fs::write(file, &bytes).unwrap();
            newer.push((*id, file.clone(), bytes));
        }
        let mut writer = Some(writer);
        for round in 0..3u64 {
            // Round 0: loaded by the writer; then reopened (the scan sees
            // them), loaded, reopened again.
            let mut h = writer.take().unwrap_or_else(|| Harness::new(&cfg, 8, BB));
            if round < 2 {
                h.scratch_dir = None;
            }
            for (id, file, bytes) in &newer {
                let r = h.load(10 * round + id, &[*id], &[4]);
                assert_eq!(
                    r.error,
                    Some(ErrorKind::NotFound),
                    "shared {shared}, round {round}, block {id}: {r:?}"
                );
                assert_eq!(r.reason, FailReason::NotFound);
                let settled = h.lookup_settled(&[*id], std::time::Duration::from_secs(10));
                assert_eq!(settled, [LookupState::Miss]);
                assert_eq!(
                    std::fs::read(file).ok().as_deref(),
                    Some(&bytes[..]),
                    "shared {shared}, round {round}: block {id} must stay on disk, unchanged"
                );
            }
            if shared {
                let settled = h.lookup_settled(&[3], std::time::Duration::from_secs(10));
                assert_eq!(settled, [LookupState::Hit]);
            }
            let r = h.load(100 + round, &[3], &[5]);
            assert!(r.is_ok(), "shared {shared}, round {round}: {r:?}");
            assert!(h.row_holds(5, 3));
            h.tier = None;
            for (id, file, bytes) in &newer {
                assert_eq!(
                    std::fs::read(file).ok().as_deref(),
                    Some(&bytes[..]),
                    "shared {shared}, round {round}: block {id} must survive the close"
                );
            }
        }
    }
}

/// Sealed Redis values keep the promise too: a value whose record carries a
/// newer sealed format version (of the same length or not) is a miss, stays
/// on the server, and an owned tier reopened over the keyspace (adopting its
/// keys) leaves it there.
#[test]
fn a_sealed_redis_value_in_a_newer_format_is_a_miss_and_is_never_deleted() {
    use common::redis::{redis_config_at, RedisServer};
    let server = redis_or_skip!(RedisServer::start());
    for shared in [false, true] {
        let mut config = redis_config_at(&server.url(), 8, BB);
        config
            .set("sharing", if shared { "shared" } else { "owned" })
            .unwrap();
        config.set("namespace", "shared-test").unwrap();
        config.set("seal_key", SEAL_A).unwrap();
        let pattern = format!("{}:*", config.redis.key_prefix);
        let names = || -> Vec<String> {
            server
                .cli(&["--scan", "--pattern", &pattern])
                .lines()
                .filter(|l| !l.is_empty())
                .map(str::to_string)
                .collect()
        };
        let h = Harness::new(&config, 8, BB);
        let mut by_id = Vec::new();
        for id in 1..=3u64 {
            let before = names();
            h.store_all(id, &[id]);
            let new: Vec<_> = names()
                .into_iter()
                .filter(|n| !before.contains(n))
                .collect();
            assert_eq!(new.len(), 1, "{new:?}");
            by_id.push((id, new[0].clone()));
        }
        // Block 1: the next sealed version (as a later writer seals it);
        // block 2: the same and a longer value.
        let (one, two) = (&by_id[0].1, &by_id[1].1);
        for name in [one, two] {
            let mut value = raw_get(&server.url(), name);
            make_sealed_newer(&mut value);
            raw_set(&server.url(), name, &value);
        }
        let len = |name: &str| server.cli(&["STRLEN", name]);
        assert_eq!(len(one), (SEALED_RECORD + BB).to_string());
        server.cli(&["APPEND", two, "a longer value"]);
        let before: Vec<String> = [one, two].iter().map(|n| server.cli(&["GET", n])).collect();
        let check = |h: &Harness, job: u64, when: &str| {
            for (id, name) in [(1u64, one), (2, two)] {
                if shared {
                    // Its name exists: a shared tier's probe finds it.
                    let found = h.lookup_settled(&[id], std::time::Duration::from_secs(10));
                    assert_eq!(found, [LookupState::Hit], "{when}, block {id}");
                }
                let r = h.load(job + id, &[id], &[4]);
                assert_eq!(
                    r.error,
                    Some(ErrorKind::NotFound),
                    "shared {shared}, {when}, block {id}: {r:?}"
                );
                // Shared too: the failed load's verdict is kept for a
                // probe's time (a probe asks only whether the name exists).
                assert_eq!(h.lookup(&[id]), [LookupState::Miss]);
                assert_eq!(
                    server.cli(&["EXISTS", name]),
                    "1",
                    "shared {shared}, {when}: the newer value {id} is kept"
                );
            }
            let after: Vec<String> = [one, two].iter().map(|n| server.cli(&["GET", n])).collect();
            assert_eq!(after, before, "shared {shared}, {when}: values unchanged");
            // (A reopened shared tier finds block 3 by probing first.)
            let settled = h.lookup_settled(&[3], std::time::Duration::from_secs(10));
            assert_eq!(settled, [LookupState::Hit], "shared {shared}, {when}");
            let r = h.load(job + 10, &[3], &[5]);
            assert!(r.is_ok(), "shared {shared}, {when}: {r:?}");
            assert!(h.row_holds(5, 3));
        };
        check(&h, 10, "loaded");
        drop(h);
        // Reopened: an owned tier adopts the keyspace's keys.
        let h = Harness::new(&config, 8, BB);
        if !shared {
            assert_eq!(h.tier().stats().num_blocks, 1, "only block 3 is adopted");
        }
        check(&h, 30, "reopened");
        drop(h);
        for name in [one, two] {
            assert_eq!(server.cli(&["EXISTS", name]), "1", "shared {shared}");
        }
    }
}

/// A sealed record whose version byte alone is damaged (its key field does
/// not open over that version) is damage, not a newer format: an unshared
/// tier finds it corrupt and removes the file, a shared one finds it a miss
/// and leaves it (it deletes nothing for being bad), and the next store of
/// the key replaces it. Such files were once kept for ever as "newer".
#[test]
fn a_sealed_block_with_a_damaged_version_byte_is_damage() {
    for shared in [false, true] {
        let dir = scratch_dir();
        let h = Harness::new(&sealed_config(&dir, shared), 8, BB);
        h.store_all(1, &[1]);
        let files = files_ending(&dir, ".kvs");
        assert_eq!(files.len(), 1, "{files:?}");
        h.store_all(2, &[2]);
        let mut bytes = std::fs::read(&files[0]).unwrap();
        damage_sealed_version(&mut bytes);
        std::fs::write(&files[0], &bytes).unwrap();
        let r = h.load(3, &[1], &[4]);
        let want = if shared {
            ErrorKind::NotFound
        } else {
            ErrorKind::Corrupt
        };
        assert_eq!(r.error, Some(want), "shared {shared}: {r:?}");
        assert_eq!(files[0].exists(), shared, "shared {shared}");
        assert!(h.load(4, &[2], &[5]).is_ok() && h.row_holds(5, 2));
        h.store_all(5, &[1]);
        assert!(h.load(6, &[1], &[4]).is_ok() && h.row_holds(4, 1));
    }
}

/// The same in a Redis keyspace: an owned sealed tier deletes a value whose
/// version byte alone is damaged (it once survived even `tier_clear`), a
/// shared sealed one leaves it, a miss; a store replaces it.
#[test]
fn a_sealed_redis_value_with_a_damaged_version_byte_is_damage() {
    use common::redis::{redis_config_at, RedisServer};
    let server = redis_or_skip!(RedisServer::start());
    for shared in [false, true] {
        let mut config = redis_config_at(&server.url(), 8, BB);
        config
            .set("sharing", if shared { "shared" } else { "owned" })
            .unwrap();
        config.set("namespace", "shared-test").unwrap();
        config.set("seal_key", SEAL_A).unwrap();
        let pattern = format!("{}:*", config.redis.key_prefix);
        let h = Harness::new(&config, 8, BB);
        h.store_all(1, &[1]);
        let names = server.cli(&["--scan", "--pattern", &pattern]);
        let one = names.trim().to_string();
        assert!(!one.is_empty() && !one.contains('\n'), "{names:?}");
        h.store_all(2, &[2]);
        let mut value = raw_get(&server.url(), &one);
        damage_sealed_version(&mut value);
        raw_set(&server.url(), &one, &value);
        let r = h.load(3, &[1], &[4]);
        let want = if shared {
            ErrorKind::NotFound
        } else {
            ErrorKind::Corrupt
        };
        assert_eq!(r.error, Some(want), "shared {shared}: {r:?}");
        let kept = if shared { "1" } else { "0" };
        assert_eq!(server.cli(&["EXISTS", &one]), kept, "shared {shared}");
        assert!(h.load(4, &[2], &[5]).is_ok() && h.row_holds(5, 2));
        h.store_all(5, &[1]);
        assert!(h.load(6, &[1], &[4]).is_ok() && h.row_holds(4, 1));
    }
}

/// A shared tier that loads a block it cannot read (a newer format) keeps
/// that verdict as a MISS for `probe_ttl_ms`: no probe in that time finds
/// the file again and answers HIT for it (each such block once cost a
/// failed load per lookup in a mixed-version fleet). After the TTL it is
/// asked again: the probe reads the header, so the newer block stays a
/// MISS (and on disk), and a block another writer put there is a HIT.
#[test]
fn a_shared_tier_keeps_a_newer_block_a_miss_for_the_probe_ttl() {
    let dir = scratch_dir();
    let mut cfg = config(&dir, "file");
    cfg.disk.shared = true;
    cfg.probe_ttl_ms = 1000;
    let h = Harness::new(&cfg, 8, BB);
    h.store_all(1, &[1]);
    let files = block_files(&dir);
    assert_eq!(files.len(), 1, "{files:?}");
    make_newer(&files[0]);
    let r = h.load(2, &[1], &[4]);
    assert_eq!(r.error, Some(ErrorKind::NotFound), "{r:?}");
    let failed_at = std::time::Instant::now();
    while failed_at.elapsed() < std::time::Duration::from_millis(500) {
        assert_eq!(h.lookup(&[1]), [LookupState::Miss]);
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    std::thread::sleep(std::time::Duration::from_millis(600));
    let settled = h.lookup_settled(&[1], std::time::Duration::from_secs(5));
    assert_eq!(
        settled,
        [LookupState::Miss],
        "asked again: still unreadable"
    );
    assert!(files[0].exists(), "the newer block is kept");
    // Another writer of this format stores the key over it.
    let other = Harness::leaving_dir(&cfg, 8, BB);
    other.store_all(3, &[1]);
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let settled = h.lookup_settled(&[1], std::time::Duration::from_secs(5));
    assert_eq!(settled, [LookupState::Hit], "asked again after the TTL");
    assert!(h.load(4, &[1], &[4]).is_ok() && h.row_holds(4, 1));
}
