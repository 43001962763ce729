//! Shared storage keeps identity (docs/sharing.md): a shared tier needs a
//! namespace; a block of another namespace is never served, whatever its
//! name; and `clear()` on shared storage clears its namespace for every tier
//! that uses it, and nothing else, on disk, a Redis server and a Redis
//! Cluster. Tiers of one test are separate instances over the same storage,
//! as two engine processes would be (they share nothing but the storage).

mod common;

use common::redis::{redis_available, redis_config_at, shared_cluster, shared_server};
use common::*;
use kvtier::{ErrorKind, LookupState::*, PrimaryBuffer, Tier, TierConfig};
use std::path::Path;
use std::time::{Duration, Instant};

const BB: usize = 8192;
const SETTLE: Duration = Duration::from_secs(10);
const PROBE_TTL_MS: u64 = 50;

fn open_err(config: &TierConfig) -> kvtier::Error {
    let mut rows = vec![0u8; 4 * BB];
    let primary = unsafe { PrimaryBuffer::new(rows.as_mut_ptr(), rows.len(), BB) }.unwrap();
    Tier::new(config, primary).expect_err("tier_new should fail")
}

fn shared_disk(dir: &Path, namespace: &str) -> TierConfig {
    let mut c = disk_config(64, BB);
    c.disk.path = Some(dir.to_path_buf());
    c.disk.shared = true;
    c.probe_ttl_ms = PROBE_TTL_MS as u32;
    c.namespace = namespace.into();
    c
}

fn shared_redis(url: &str, prefix: &str, namespace: &str, cluster: bool) -> TierConfig {
    let mut c = redis_config_at(url, 64, BB);
    c.set("key_prefix", prefix).unwrap();
    c.set("sharing", "shared").unwrap();
    c.set("namespace", namespace).unwrap();
    if cluster {
        c.set("cluster", "on").unwrap();
    }
    c.probe_ttl_ms = PROBE_TTL_MS as u32;
    c
}

fn tier(config: &TierConfig) -> Harness {
    Harness::leaving_dir(config, 16, BB)
}

/// Stores blocks `ids` with contents of `seed + id`, rows 0.., and checks it worked.
fn store_seeded(h: &Harness, job: u64, ids: &[u64], seed: u64) {
    let rows: Vec<i64> = (0..ids.len() as i64).collect();
    for (row, &id) in ids.iter().enumerate() {
        h.fill(row, seed + id);
    }
    let r = h.store(job, ids, &rows);
    assert!(r.error.is_none(), "store: {r:?}");
}

/// Loads `ids` into rows 8.. and checks the bytes are those of `seed + id`.
fn loads_seeded(h: &Harness, job: u64, ids: &[u64], seed: u64) -> bool {
    let rows: Vec<i64> = (8..8 + ids.len() as i64).collect();
    let r = h.load(job, ids, &rows);
    r.error.is_none()
        && ids
            .iter()
            .enumerate()
            .all(|(i, &id)| h.row_holds(8 + i, seed + id))
}

#[test]
fn shared_storage_without_a_namespace_is_refused_and_says_what_to_set() {
    let dir = scratch_dir();
    for namespace in ["", "  "] {
        let e = open_err(&shared_disk(&dir, namespace));
        assert_eq!(e.kind(), ErrorKind::Config, "{e}");
        assert!(
            e.message().contains("namespace") && e.message().contains("shared=true"),
            "{e}"
        );
        // Refused before any server is asked: no Redis needed for this.
        let e = open_err(&shared_redis("redis://127.0.0.1:1", "p", namespace, false));
        assert_eq!(e.kind(), ErrorKind::Config, "{e}");
        assert!(
            e.message().contains("namespace") && e.message().contains("sharing=shared"),
            "{e}"
        );
    }
    // A directory that is not shared keeps working without one.
    let mut owned = shared_disk(&dir, "");
    owned.disk.shared = false;
    let h = tier(&owned);
    store_seeded(&h, 1, &[1], 0);
    assert!(loads_seeded(&h, 2, &[1], 0));
    drop(h);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The namespace directory of `namespace` under `root`.
fn ns_dir(root: &Path, namespace: &str) -> std::path::PathBuf {
    let readable: String = namespace
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    std::fs::read_dir(root)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with(&format!("{readable}-"))
        })
        .unwrap()
}

#[test]
fn a_disk_block_of_another_namespace_under_a_colliding_name_is_a_miss() {
    let dir = scratch_dir();
    let a = tier(&shared_disk(&dir, "model-a"));
    store_seeded(&a, 1, &[1, 2], 100);
    let b = tier(&shared_disk(&dir, "model-b"));
    store_seeded(&b, 2, &[3], 200);
    // Model A's files copied into model B's directory, at the very names
    // model B would use for the same keys.
    let (from, to) = (ns_dir(&dir, "model-a"), ns_dir(&dir, "model-b"));
    let mut copied = 0;
    for file in files(&from, ".kvb") {
        let rel = file.strip_prefix(&from).unwrap();
        std::fs::create_dir_all(to.join(rel).parent().unwrap()).unwrap();
        std::fs::copy(&file, to.join(rel)).unwrap();
        // The header attribute travels with the bytes (a real collision).
        if let Some(attr) = xattr_get(&file) {
            xattr_set(&to.join(rel), &attr);
        }
        copied += 1;
    }
    assert_eq!(copied, 2);
    let fresh = tier(&shared_disk(&dir, "model-b"));
    assert_eq!(fresh.lookup_settled(&[1, 2], SETTLE), [Miss, Miss]);
    assert!(!loads_seeded(&fresh, 3, &[1], 100), "never loaded");
    assert_eq!(fresh.lookup_settled(&[3], SETTLE), [Hit]);
    assert!(loads_seeded(&fresh, 4, &[3], 200));
    drop((a, b, fresh));
    std::fs::remove_dir_all(&dir).unwrap();
}

fn xattr_get(path: &Path) -> Option<Vec<u8>> {
    use std::os::unix::ffi::OsStrExt;
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    let mut value = vec![0u8; 4096];
    // SAFETY: valid C strings and a buffer of `value.len()` bytes.
    let n = unsafe {
        libc::getxattr(
            c_path.as_ptr(),
            c"user.kvtier".as_ptr(),
            value.as_mut_ptr().cast(),
            value.len(),
        )
    };
    (n >= 0).then(|| {
        value.truncate(n as usize);
        value
    })
}

fn xattr_set(path: &Path, value: &[u8]) {
    use std::os::unix::ffi::OsStrExt;
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: valid C strings and a buffer of `value.len()` bytes.
    let rc = unsafe {
        libc::setxattr(
            c_path.as_ptr(),
            c"user.kvtier".as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    assert_eq!(rc, 0, "setxattr {}", path.display());
}

/// What a clear on shared storage promises, over three tiers made by
/// `open(namespace)` on one store: A and B of one namespace, C of another.
fn clear_clears_the_namespace_for_every_tier(open: &dyn Fn(&str) -> Harness) {
    let a = open("llama/bf16/t16/tp1");
    let b = open("llama/bf16/t16/tp1");
    let c = open("mistral/bf16/t16/tp1");
    store_seeded(&a, 1, &[1, 2, 3, 4], 1000);
    store_seeded(&c, 2, &[1, 2, 3, 4], 5000);
    // B learns A's blocks (its index now lists them).
    assert_eq!(b.lookup_settled(&[1, 2, 3, 4], SETTLE), [Hit; 4]);
    assert!(loads_seeded(&b, 3, &[1, 2], 1000));

    let started = Instant::now();
    a.tier().clear().unwrap();
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(2 * PROBE_TTL_MS),
        "returns two leases after the raise: {took:?}"
    );

    // At once, in every tier of the namespace: no HIT, no load.
    for (h, who) in [(&a, "the clearing tier"), (&b, "another tier")] {
        let now = h.lookup(&[1, 2, 3, 4]);
        assert!(!now.contains(&Hit), "{who}: {now:?}");
    }
    assert!(
        !loads_seeded(&b, 4, &[1], 1000),
        "B loads nothing of before"
    );
    assert_eq!(b.lookup_settled(&[1, 2, 3, 4], SETTLE), [Miss; 4]);
    let later = open("llama/bf16/t16/tp1");
    assert_eq!(later.lookup_settled(&[1, 2, 3, 4], SETTLE), [Miss; 4]);

    // Another namespace's blocks stay, byte-exact.
    assert_eq!(c.lookup_settled(&[1, 2, 3, 4], SETTLE), [Hit; 4]);
    assert!(loads_seeded(&c, 5, &[1, 2, 3, 4], 5000));

    // The namespace works on: a block stored after the clear is everybody's
    // (once their "not stored" answers, reused for a probe TTL, expire).
    store_seeded(&b, 6, &[2], 2000);
    assert_eq!(hit_within(&a, 2), Hit);
    assert!(loads_seeded(&a, 7, &[2], 2000));
    assert_eq!(hit_within(&later, 2), Hit);
    assert_eq!(later.lookup_settled(&[3], SETTLE), [Miss]);
    assert!(loads_seeded(&later, 8, &[2], 2000));
}

/// Looks `id` up until it is a HIT (or [`SETTLE`] passes): its last answer.
fn hit_within(h: &Harness, id: u64) -> kvtier::LookupState {
    let deadline = Instant::now() + SETTLE;
    loop {
        let state = h.lookup(&[id])[0];
        if state == Hit || Instant::now() > deadline {
            return state;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn clear_on_a_shared_directory_clears_the_namespace_for_every_tier() {
    let dir = scratch_dir();
    clear_clears_the_namespace_for_every_tier(&|ns| tier(&shared_disk(&dir, ns)));
    // The old generation's files are gone: B's block of after, C's four.
    let left = files(&dir, ".kvb").len();
    assert_eq!(left, 5, "{:?}", files(&dir, ".kvb"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn clear_on_a_shared_redis_server_clears_the_namespace_for_every_tier() {
    if !redis_available() {
        return;
    }
    let server = shared_server().expect("a Redis server");
    let prefix = format!("clear{}", std::process::id());
    clear_clears_the_namespace_for_every_tier(&|ns| {
        tier(&shared_redis(&server.url(), &prefix, ns, false))
    });
    let names = server.cli(&["--scan", "--pattern", &format!("{prefix}:*")]);
    let blocks = names.lines().filter(|n| !n.contains(":generation")).count();
    assert_eq!(blocks, 5, "B's block of after and C's four:\n{names}");
}

#[test]
fn clear_on_a_shared_redis_cluster_clears_the_namespace_on_every_master() {
    if !redis_available() {
        return;
    }
    let cluster = shared_cluster().expect("a Redis cluster");
    let prefix = format!("clearc{}", std::process::id());
    clear_clears_the_namespace_for_every_tier(&|ns| {
        tier(&shared_redis(&cluster.url(), &prefix, ns, true))
    });
    let mut blocks = 0;
    for master in cluster.masters() {
        let names = cluster.cli_at(
            master.port,
            &["--scan", "--pattern", &format!("{prefix}:*")],
        );
        blocks += names.lines().filter(|n| !n.contains(":generation")).count();
    }
    assert_eq!(
        blocks, 5,
        "B's block of after and C's four, over every master"
    );
}

/// Blocks a shared tier wrote before namespaces were enforced (the
/// namespace's own fingerprint, as an owned tier still writes) are misses
/// for the shared tiers of now, and a shared open deletes none of them.
#[test]
fn blocks_of_before_the_upgrade_are_misses_and_never_deleted() {
    let dir = scratch_dir();
    let mut old = shared_disk(&dir, "llama");
    old.disk.shared = false;
    let h = tier(&old);
    store_seeded(&h, 1, &[1, 2], 0);
    drop(h);
    let before = files(&dir, ".kvb");
    let new = tier(&shared_disk(&dir, "llama"));
    assert_eq!(new.lookup_settled(&[1, 2], SETTLE), [Miss, Miss]);
    assert_eq!(files(&dir, ".kvb"), before, "nothing deleted");
    drop(new);
    std::fs::remove_dir_all(&dir).unwrap();

    if !redis_available() {
        return;
    }
    let server = shared_server().expect("a Redis server");
    let prefix = format!("upgrade{}", std::process::id());
    let mut owned = shared_redis(&server.url(), &prefix, "llama", false);
    owned.set("sharing", "owned").unwrap();
    let h = tier(&owned);
    store_seeded(&h, 1, &[1, 2], 0);
    drop(h);
    let pattern = format!("{prefix}:*");
    let before = server.cli(&["--scan", "--pattern", &pattern]);
    let new = tier(&shared_redis(&server.url(), &prefix, "llama", false));
    assert_eq!(new.lookup_settled(&[1, 2], SETTLE), [Miss, Miss]);
    let mut after = server.cli(&["--scan", "--pattern", &pattern]);
    after = after
        .lines()
        .filter(|n| !n.contains(":generation"))
        .collect::<Vec<_>>()
        .join("\n");
    let mut b: Vec<&str> = before.lines().collect();
    let mut a: Vec<&str> = after.lines().collect();
    b.sort();
    a.sort();
    assert_eq!(a, b, "nothing deleted");
}

/// A tier whose lease still holds the generation before a clear meets the
/// blocks a peer stored after it, under the same names (and the peer meets
/// the lagging tier's): each is a miss, never `Corrupt`, and a block of the
/// later generation is never deleted by the tier that has not seen it yet.
#[test]
fn a_tier_behind_a_clear_misses_the_new_generation_and_deletes_none_of_it() {
    let dir = scratch_dir();
    let mut lagging = shared_disk(&dir, "llama");
    // A lease longer than the test: it reads the generation once, at open.
    lagging.probe_ttl_ms = 600_000;
    let a = tier(&lagging);
    let b = tier(&shared_disk(&dir, "llama"));
    store_seeded(&a, 1, &[1], 100);
    assert!(loads_seeded(&a, 2, &[1], 100));
    b.tier().clear().unwrap();
    // B stores block 1 again in the new generation, where A's file was.
    store_seeded(&b, 3, &[1], 300);
    let before = files(&dir, ".kvb");
    assert_eq!(before.len(), 1, "{before:?}");
    // A still lists block 1 and still names blocks with the old generation.
    let r = a.load(4, &[1], &[8]);
    assert_eq!(r.error, Some(ErrorKind::NotFound), "{r:?}");
    assert_eq!(
        files(&dir, ".kvb"),
        before,
        "the new generation's block stays"
    );
    assert!(loads_seeded(&b, 5, &[1], 300), "and B still loads it");
    // The other way round: A, behind, overwrites B's block 2 with one of the
    // old generation, which B then meets: a miss too (and, being of before
    // the clear, removed).
    store_seeded(&b, 6, &[2], 400);
    store_seeded(&a, 7, &[2], 200);
    let r = b.load(8, &[2], &[8]);
    assert_eq!(r.error, Some(ErrorKind::NotFound), "{r:?}");
    assert_eq!(files(&dir, ".kvb").len(), 1, "{:?}", files(&dir, ".kvb"));
    drop((a, b));
    std::fs::remove_dir_all(&dir).unwrap();
}
