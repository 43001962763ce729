//! Tenant-sealed blocks (`seal_key`) on shared storage: tenants read only
//! their own blocks, see everyone else's as misses and delete none of them;
//! tampering is detected on every load; no name or stored byte shows a key;
//! the seal key shows in no formatted string. (The whole contract suite runs
//! on a sealed disk tier too: tests/contract.rs, `disk_sealed`.)

mod common;

use common::*;
use kvtier::{ErrorKind, LookupState::*, TierConfig};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

const BB: usize = 8192;

fn disk(dir: &Path, shared: bool, seal: Option<&str>) -> TierConfig {
    tenant_disk_config(dir, shared, seal, BB)
}

fn tier(config: &TierConfig) -> Harness {
    Harness::leaving_dir(config, 16, BB)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The file a store of `ids` into `h` adds to `dir`.
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

/// Stores block `data_id`'s pattern under key `key_id`.
fn store_as(h: &Harness, job: u64, key_id: u64, data_id: u64) {
    h.fill(0, data_id);
    let r = h.store(job, &[key_id], &[0]);
    assert!(r.is_ok(), "{r:?}");
}

#[test]
fn two_tenants_and_an_unsealed_tier_share_a_directory() {
    let dir = scratch_dir();
    let a = tier(&disk(&dir, true, Some(SEAL_A)));
    let b = tier(&disk(&dir, true, Some(SEAL_B)));
    let u = tier(&disk(&dir, true, None));
    // The same keys, each tenant with its own bytes; key 10 is A's alone.
    for id in 1..=4 {
        store_as(&a, id, id, id);
        store_as(&b, id, id, 100 + id);
        store_as(&u, id, id, 200 + id);
    }
    store_as(&a, 10, 10, 10);
    assert_eq!(files(&dir, ".kvs").len(), 9);
    assert_eq!(files(&dir, ".kvb").len(), 4);
    for (h, base) in [(&a, 0), (&b, 100), (&u, 200)] {
        let r = h.load(50, &[1, 2, 3, 4], &[4, 5, 6, 7]);
        assert!(r.is_ok(), "{r:?}");
        for (row, id) in (4..8).zip(1..=4) {
            assert!(h.row_holds(row, base + id), "tier {base}, block {id}");
        }
    }
    // Existence does not leak: B and the unsealed tier probe key 10 and miss.
    assert_eq!(b.lookup_settled(&[10], Duration::from_secs(10)), [Miss]);
    assert_eq!(u.lookup_settled(&[10], Duration::from_secs(10)), [Miss]);
    assert_eq!(a.lookup_settled(&[10], Duration::from_secs(10)), [Hit]);

    // A writes garbage under a name it can compute: only its own view suffers.
    let garbage_at = stored_file(&a, &dir, 60, 11);
    std::fs::write(
        &garbage_at,
        vec![0x5a; std::fs::metadata(&garbage_at).unwrap().len() as usize],
    )
    .unwrap();
    let r = a.load(61, &[11], &[4]);
    assert_eq!(r.error, Some(ErrorKind::NotFound), "a miss in shared mode");
    assert!(garbage_at.exists(), "never deleted in shared mode");
    assert_eq!(b.lookup_settled(&[11], Duration::from_secs(10)), [Miss]);
    for h in [&b, &u] {
        assert!(h.load(62, &[1, 2, 3, 4], &[4, 5, 6, 7]).is_ok());
    }

    // Reopened (recovery, probes), each finds exactly its own blocks again
    // and deletes nobody's.
    let counts = (files(&dir, ".kvs").len(), files(&dir, ".kvb").len());
    drop((a, b, u));
    let a = tier(&disk(&dir, true, Some(SEAL_A)));
    let b = tier(&disk(&dir, true, Some(SEAL_B)));
    let u = tier(&disk(&dir, true, None));
    assert_eq!(
        a.tier().stats().num_blocks,
        5,
        "A's 1..=4 and 10, not the garbage"
    );
    assert!(garbage_at.exists());
    assert_eq!(b.tier().stats().num_blocks, 4);
    assert_eq!(u.tier().stats().num_blocks, 4);
    assert_eq!(
        (files(&dir, ".kvs").len(), files(&dir, ".kvb").len()),
        counts
    );
    assert!(b.load(70, &[3], &[4]).is_ok() && b.row_holds(4, 103));
    // Evictions and clears delete only one's own files.
    b.tier().clear().unwrap();
    b.tier().drain();
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(files(&dir, ".kvs").len(), counts.0 - 4);
    assert!(a.load(71, &[1, 10], &[4, 5]).is_ok() && a.row_holds(5, 10));
    assert!(u.load(72, &[2], &[4]).is_ok() && u.row_holds(4, 202));
    drop((a, b, u));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_foreign_key_is_left_alone_in_an_unshared_directory() {
    let dir = scratch_dir();
    let a = tier(&disk(&dir, false, Some(SEAL_A)));
    a.store_all(1, &[1, 2, 3]);
    drop(a);
    // The unsealed tier leaves sealed files alone.
    let u = tier(&disk(&dir, false, None));
    assert_eq!(u.tier().stats().num_blocks, 0);
    drop(u);
    assert_eq!(files(&dir, ".kvs").len(), 3);
    // Same tenant after a restart: everything back, byte-exact.
    let a = tier(&disk(&dir, false, Some(SEAL_A)));
    assert_eq!(a.tier().stats().num_blocks, 3);
    assert!(a.load(2, &[1, 2, 3], &[4, 5, 6]).is_ok() && a.row_holds(6, 3));
    drop(a);
    // Another key, not shared: not its blocks, and not its to delete.
    let b = tier(&disk(&dir, false, Some(SEAL_B)));
    assert_eq!(b.tier().stats().num_blocks, 0);
    assert_eq!(files(&dir, ".kvs").len(), 3);
    drop(b);
    let a = tier(&disk(&dir, false, Some(SEAL_A)));
    assert_eq!(a.tier().stats().num_blocks, 3);
    drop(a);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Record offsets (see src/seal/record.rs) and a spread of header, ciphertext
/// and padding-free payload bytes. The version is lowered (8: 1 becomes 0);
/// a version raised by damage is damage too, and only a record whose key
/// field opens over its raised version is a newer format, a miss left in
/// place (tests/format_promise.rs).
const FLIPS: &[usize] = &[
    0,
    8,
    13,
    17,
    25,
    33,
    40,
    43, // magic, version, length, namespace, size, nonce
    44,
    59, // payload tag
    60,
    61,
    100,
    188, // key field
    189,
    204, // key field tag
    205,
    3000,
    4095, // header past the record
    4096,
    4096 + 1,
    4096 + 4000,
    4096 + BB - 1, // ciphertext
];

#[test]
fn tampering_is_detected_on_every_load() {
    let dir = scratch_dir();
    for shared in [false, true] {
        let h = tier(&disk(&dir, shared, Some(SEAL_A)));
        let mut job = 0;
        for (n, &at) in FLIPS.iter().enumerate() {
            let id = 1000 * shared as u64 + n as u64;
            job += 2;
            let f = stored_file(&h, &dir, job, id);
            let mut bytes = std::fs::read(&f).unwrap();
            bytes[at] ^= 0x01;
            std::fs::write(&f, &bytes).unwrap();
            let r = h.load(job + 1, &[id], &[4]);
            let expect = if shared {
                ErrorKind::NotFound
            } else {
                ErrorKind::Corrupt
            };
            assert_eq!(r.error, Some(expect), "flip at {at}, shared={shared}");
            assert_eq!(f.exists(), shared, "removed only when not shared");
        }
        drop(h);
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn swapped_and_replayed_blocks_are_detected() {
    let dir = scratch_dir();
    let h = tier(&disk(&dir, false, Some(SEAL_A)));
    let f1 = stored_file(&h, &dir, 1, 1);
    let f2 = stored_file(&h, &dir, 2, 2);
    let (b1, b2) = (std::fs::read(&f1).unwrap(), std::fs::read(&f2).unwrap());
    std::fs::write(&f1, &b2).unwrap();
    std::fs::write(&f2, &b1).unwrap();
    assert_eq!(h.load(3, &[1], &[4]).error, Some(ErrorKind::Corrupt));
    assert_eq!(h.load(4, &[2], &[4]).error, Some(ErrorKind::Corrupt));

    // An old version put back under the block's name after a newer store.
    for round in 0..5 {
        let job = 10 + 10 * round;
        let f = stored_file(&h, &dir, job, 3);
        let old = std::fs::read(&f).unwrap();
        h.tier().clear().unwrap();
        h.tier().drain();
        let deadline = Instant::now() + Duration::from_secs(5);
        while f.exists() {
            assert!(Instant::now() < deadline, "clear never deleted the file");
            std::thread::sleep(Duration::from_millis(2));
        }
        store_as(&h, job + 1, 3, 3);
        assert!(h.load(job + 2, &[3], &[4]).is_ok() && h.row_holds(4, 3));
        std::fs::write(&f, &old).unwrap();
        let r = h.load(job + 3, &[3], &[4]);
        assert_eq!(r.error, Some(ErrorKind::Corrupt), "round {round}");
    }
    drop(h);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn no_name_or_stored_byte_shows_a_key_or_the_plaintext() {
    let dir = scratch_dir();
    let h = tier(&disk(&dir, false, Some(SEAL_A)));
    let ids: Vec<u64> = (1..=12).collect();
    h.store_all(1, &ids);
    let all = files(&dir, "");
    assert_eq!(files(&dir, ".kvs").len(), ids.len());
    for f in &all {
        let name = f.to_string_lossy().to_string();
        let bytes = std::fs::read(f).unwrap();
        for &id in &ids {
            let k = key(id);
            assert!(!name.contains(&hex(&k[..8])), "{name} names key {id}");
            assert!(
                !bytes.windows(16).any(|w| w == &k[..16]),
                "{name} holds key {id}"
            );
            assert!(!bytes.windows(8).any(|w| w == &k[32..36].repeat(2)[..8]));
            let plain = pattern(id, BB);
            assert!(
                !bytes.windows(32).any(|w| w == &plain[64..96]),
                "{name} holds plaintext"
            );
        }
    }
    drop(h);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_seal_key_shows_in_no_formatted_string() {
    let dir = scratch_dir();
    let mut c = disk(&dir, false, Some(SEAL_A));
    c.events = true;
    let h = tier(&c);
    h.store_all(1, &[1, 2]);
    let f = files(&dir, ".kvs").pop().unwrap();
    std::fs::write(&f, vec![0; std::fs::metadata(&f).unwrap().len() as usize]).unwrap();
    let _ = h.load(2, &[1, 2], &[4, 5]);
    let fragments: Vec<&str> = (0..SEAL_A.len() - 8)
        .step_by(8)
        .map(|i| &SEAL_A[i..i + 16.min(SEAL_A.len() - i)])
        .collect();
    let shown = [
        format!("{c:?}"),
        h.tier().describe(),
        h.tier().metrics(),
        format!("{:?}", h.tier().stats()),
        format!("{:?}", h.events()),
    ];
    for text in &shown {
        for frag in &fragments {
            assert!(!text.to_lowercase().contains(frag), "{text}");
        }
    }
    assert!(h.tier().describe().contains("sealed"));
    // Bad values are refused without being repeated.
    let mut bad = TierConfig::default();
    let wrong = format!("{}zz", &SEAL_A[..62]);
    let err = bad.set("seal_key", &wrong).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config);
    assert!(!err.message().contains(&wrong[..16]), "{err}");
    assert!(bad.set("seal_key", &SEAL_A[..40]).is_err());
    drop(h);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn seal_configuration_is_strict() {
    let dir = scratch_dir();
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("seal.key");
    std::fs::write(&file, format!("{SEAL_B}\n")).unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let mut c = TierConfig::default();
    let err = c.set("seal_key_file", file.to_str().unwrap()).unwrap_err();
    assert!(err.message().contains("group or others"), "{err}");
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    c.set("seal_key_file", file.to_str().unwrap()).unwrap();
    let err = c.set("seal_key", SEAL_A).unwrap_err();
    assert!(err.message().contains("both"), "{err}");
    // A key file and the same key inline seal alike.
    let by_file = {
        let mut d = disk(&dir.join("t"), false, None);
        d.set("seal_key_file", file.to_str().unwrap()).unwrap();
        d
    };
    let h = tier(&by_file);
    h.store_all(1, &[7]);
    drop(h);
    let h = tier(&disk(&dir.join("t"), false, Some(SEAL_B)));
    assert!(h.load(2, &[7], &[4]).is_ok() && h.row_holds(4, 7));
    drop(h);
    // The memory backend refuses a seal key.
    let mut m = memory_config(4, BB);
    m.set("seal_key", SEAL_A).unwrap();
    let buffer = Buffer::new(4 * BB);
    let primary = unsafe { kvtier::PrimaryBuffer::new(buffer.ptr(), buffer.len(), BB) }.unwrap();
    let err = kvtier::Tier::new(&m, primary).err().unwrap();
    assert_eq!(err.kind(), ErrorKind::Config);
    assert!(err.message().contains("memory backend"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The other process of the crash test (ignored when run directly): stores
/// sealed blocks forever, until killed.
#[test]
#[ignore]
fn sealed_child() {
    let Ok(dir) = std::env::var("KVTIER_SEAL_CHILD_DIR") else {
        return;
    };
    let mut c = disk(Path::new(&dir), false, Some(SEAL_A));
    c.capacity_bytes = 1 << 30;
    let h = tier(&c);
    for job in 0u64.. {
        let ids: Vec<u64> = (job * 8..job * 8 + 8).collect();
        h.store_all(job, &ids);
    }
}

#[test]
fn a_killed_sealed_writer_leaves_no_debris_and_only_whole_blocks() {
    let dir = scratch_dir();
    std::fs::create_dir_all(&dir).unwrap();
    let mut child = test_child("sealed_child")
        .env("KVTIER_SEAL_CHILD_DIR", &dir)
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while files(&dir, ".kvs").len() < 200 {
        assert!(Instant::now() < deadline, "the child stored too little");
        std::thread::sleep(Duration::from_millis(10));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let mut c = disk(&dir, false, Some(SEAL_A));
    c.capacity_bytes = 1 << 30;
    let h = tier(&c);
    assert!(files(&dir, ".tmp").is_empty(), "temp debris left");
    let n = h.tier().stats().num_blocks;
    assert!(n >= 200, "{n} blocks recovered");
    let present = h.present(&(0..n + 64).collect::<Vec<_>>());
    assert_eq!(present.len() as u64, n);
    for (c, chunk) in present.chunks(16).enumerate() {
        let r = h.load(
            c as u64,
            chunk,
            &(0..chunk.len() as i64).collect::<Vec<_>>(),
        );
        assert!(r.is_ok(), "{r:?}");
        for (row, &i) in chunk.iter().enumerate() {
            assert!(h.row_holds(row, i), "block {i}");
        }
    }
    drop(h);
    std::fs::remove_dir_all(&dir).unwrap();
}

// ---- Redis ----

mod on_redis {
    use super::*;
    use common::redis::{redis_config_at, RedisServer};

    const RB: usize = 4096;
    /// Bytes of the sealed record before the ciphertext (src/seal/record.rs).
    const RECORD: usize = 205;

    fn redis(server: &RedisServer, prefix: &str, shared: bool, seal: Option<&str>) -> TierConfig {
        let mut c = redis_config_at(&server.url(), 64, RB);
        c.set("key_prefix", prefix).unwrap();
        c.set("sharing", if shared { "shared" } else { "owned" })
            .unwrap();
        c.set("namespace", "shared-test").unwrap();
        c.probe_ttl_ms = 50;
        if let Some(seal) = seal {
            c.set("seal_key", seal).unwrap();
        }
        c
    }

    fn names(server: &RedisServer, prefix: &str) -> Vec<String> {
        let mut names: Vec<String> = server
            .cli(&["--scan", "--pattern", &format!("{prefix}:*")])
            .lines()
            .filter(|l| !l.is_empty())
            .map(str::to_string)
            .collect();
        names.sort();
        names
    }

    fn raw(server: &RedisServer) -> ::redis::Connection {
        ::redis::Client::open(server.url())
            .unwrap()
            .get_connection()
            .unwrap()
    }

    fn get(server: &RedisServer, name: &str) -> Vec<u8> {
        ::redis::cmd("GET")
            .arg(name)
            .query(&mut raw(server))
            .unwrap()
    }

    fn set(server: &RedisServer, name: &str, value: &[u8]) {
        ::redis::cmd("SET")
            .arg(name)
            .arg(value)
            .query::<()>(&mut raw(server))
            .unwrap()
    }

    /// The name a store of block `id` adds under `prefix`.
    fn stored_name(h: &Harness, server: &RedisServer, prefix: &str, job: u64, id: u64) -> String {
        let before = names(server, prefix);
        h.store_all(job, &[id]);
        let mut new: Vec<_> = names(server, prefix)
            .into_iter()
            .filter(|n| !before.contains(n))
            .collect();
        assert_eq!(new.len(), 1, "{new:?}");
        new.pop().unwrap()
    }

    fn harness(config: &TierConfig) -> Harness {
        Harness::new(config, 16, RB)
    }

    #[test]
    fn two_tenants_and_an_unsealed_tier_share_a_keyspace() {
        let server = redis_or_skip!();
        let a = harness(&redis(&server, "shared", true, Some(SEAL_A)));
        let b = harness(&redis(&server, "shared", true, Some(SEAL_B)));
        let u = harness(&redis(&server, "shared", true, None));
        for id in 1..=4 {
            store_as(&a, id, id, id);
            store_as(&b, id, id, 100 + id);
            store_as(&u, id, id, 200 + id);
        }
        store_as(&a, 10, 10, 10);
        assert_eq!(names(&server, "shared").len(), 13);
        for (h, base) in [(&a, 0), (&b, 100), (&u, 200)] {
            let r = h.load(50, &[1, 2, 3, 4], &[4, 5, 6, 7]);
            assert!(r.is_ok(), "{r:?}");
            for (row, id) in (4..8).zip(1..=4) {
                assert!(h.row_holds(row, base + id), "tier {base}, block {id}");
            }
        }
        assert_eq!(b.lookup_settled(&[10], Duration::from_secs(10)), [Miss]);
        assert_eq!(u.lookup_settled(&[10], Duration::from_secs(10)), [Miss]);
        // Garbage under a name A computes: A misses, nothing is deleted.
        let name = stored_name(&a, &server, "shared", 60, 11);
        set(&server, &name, &vec![0x5a; RECORD + RB]);
        assert_eq!(a.load(61, &[11], &[4]).error, Some(ErrorKind::NotFound));
        assert_eq!(names(&server, "shared").len(), 14, "nothing deleted");
        assert_eq!(b.lookup_settled(&[11], Duration::from_secs(10)), [Miss]);
        for h in [&b, &u] {
            assert!(h.load(62, &[1, 2, 3, 4], &[4, 5, 6, 7]).is_ok());
        }
    }

    #[test]
    fn owned_keyspaces_adopt_only_their_tenants_blocks() {
        let server = redis_or_skip!();
        let a = harness(&redis(&server, "owned", false, Some(SEAL_A)));
        a.store_all(1, &[1, 2, 3]);
        drop(a);
        let u = harness(&redis(&server, "owned", false, None));
        let b = harness(&redis(&server, "owned", false, Some(SEAL_B)));
        assert_eq!(u.tier().stats().num_blocks, 0);
        assert_eq!(b.tier().stats().num_blocks, 0);
        drop((u, b));
        let a = harness(&redis(&server, "owned", false, Some(SEAL_A)));
        assert_eq!(a.tier().stats().num_blocks, 3);
        assert!(a.load(2, &[1, 2, 3], &[4, 5, 6]).is_ok() && a.row_holds(6, 3));
    }

    #[test]
    fn tampered_swapped_and_replayed_values_are_detected() {
        let server = redis_or_skip!();
        // The version is lowered (a raised one is damage too unless its key
        // field opens over it, tests/format_promise.rs).
        let flips = [
            0,
            8,
            13,
            17,
            25,
            33,
            43,
            44,
            59,
            60,
            100,
            188,
            189,
            204, // record
            RECORD,
            RECORD + 1,
            RECORD + 2000,
            RECORD + RB - 1, // ciphertext
        ];
        for shared in [false, true] {
            let prefix = if shared { "tamper-s" } else { "tamper-o" };
            let h = harness(&redis(&server, prefix, shared, Some(SEAL_A)));
            let expect = if shared {
                ErrorKind::NotFound
            } else {
                ErrorKind::Corrupt
            };
            for (n, &at) in flips.iter().enumerate() {
                let (id, job) = (n as u64, 10 * n as u64);
                let name = stored_name(&h, &server, prefix, job, id);
                let mut value = get(&server, &name);
                value[at] ^= 1;
                set(&server, &name, &value);
                let r = h.load(job + 1, &[id], &[4]);
                assert_eq!(r.error, Some(expect), "flip at {at}, shared={shared}");
                let kept = names(&server, prefix).contains(&name);
                assert_eq!(kept, shared, "deleted only when owned");
            }
        }
        let h = harness(&redis(&server, "swap", false, Some(SEAL_A)));
        let one = stored_name(&h, &server, "swap", 1, 1);
        let two = stored_name(&h, &server, "swap", 2, 2);
        let (v1, v2) = (get(&server, &one), get(&server, &two));
        set(&server, &one, &v2);
        set(&server, &two, &v1);
        assert_eq!(h.load(3, &[1], &[4]).error, Some(ErrorKind::Corrupt));
        assert_eq!(h.load(4, &[2], &[4]).error, Some(ErrorKind::Corrupt));
        for round in 0..3 {
            let job = 10 + 10 * round;
            let name = stored_name(&h, &server, "swap", job, 3);
            let old = get(&server, &name);
            h.tier().clear().unwrap();
            h.tier().drain();
            assert!(common::redis::wait_until(Duration::from_secs(5), || {
                !names(&server, "swap").contains(&name)
            }));
            store_as(&h, job + 1, 3, 3);
            assert!(h.load(job + 2, &[3], &[4]).is_ok() && h.row_holds(4, 3));
            set(&server, &name, &old);
            let r = h.load(job + 3, &[3], &[4]);
            assert_eq!(r.error, Some(ErrorKind::Corrupt), "round {round}");
        }
    }

    #[test]
    fn no_key_name_or_value_shows_a_key_or_the_plaintext() {
        let server = redis_or_skip!();
        let h = harness(&redis(&server, "clear", false, Some(SEAL_A)));
        let ids: Vec<u64> = (1..=12).collect();
        h.store_all(1, &ids);
        let all = names(&server, "clear");
        assert_eq!(all.len(), ids.len());
        for name in &all {
            let value = get(&server, name);
            for &id in &ids {
                let k = key(id);
                assert!(!name.contains(&hex(&k[..8])), "{name} names key {id}");
                assert!(
                    !value.windows(16).any(|w| w == &k[..16]),
                    "{name} holds key {id}"
                );
                let plain = pattern(id, RB);
                assert!(!value.windows(32).any(|w| w == &plain[64..96]));
            }
        }
        assert!(h.tier().describe().contains("sealed"));
        assert!(!h.tier().describe().contains(&SEAL_A[..16]));
    }
}
