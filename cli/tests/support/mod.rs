//! What the `kvtier` command's tests share: the built command run with its
//! JSON parsed, and the live tier a child process keeps busy meanwhile (a
//! worker: stores new blocks, loads its own and its peer's, and fails on any
//! byte that is not the block's, or any error that is not a miss).

#![allow(dead_code)]

use crate::common::{keys, test_child, Harness, Rng, KEY_LEN};
use kvtier::{ErrorKind, LookupState, TierConfig};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

/// Blocks per store job of a worker.
pub const JOB_BLOCKS: usize = 4;

/// Runs the built `kvtier` with `args` (and `--json`); its exit status and
/// the JSON object it printed.
pub fn kvtier(args: &[&str]) -> (i32, Value) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kvtier"))
        .args(args)
        .arg("--json")
        .output()
        .expect("the kvtier command runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let json = serde_json::from_str(stdout.trim()).unwrap_or_else(|e| {
        panic!(
            "kvtier {args:?}: no JSON ({e}); stdout {stdout:?}, stderr {:?}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code().unwrap_or(-1), json)
}

/// The strings of a JSON list.
pub fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap_or_else(|| panic!("not a list: {v}"))
        .iter()
        .map(|s| s.as_str().expect("a string").to_string())
        .collect()
}

/// A tier configuration as `key=value` lines, to hand a worker.
pub fn config_text(pairs: &[(&str, String)]) -> String {
    pairs.iter().map(|(k, v)| format!("{k}={v}\n")).collect()
}

/// A live tier in a child process: worker `id` stores blocks of ids
/// `id * 1_000_000 ..` and loads its own and worker `peer`'s, until `stop`
/// exists; it stores one job every `store_every_ms`.
pub fn spawn_worker(
    test: &str,
    config: &str,
    block_bytes: usize,
    id: u64,
    peer: u64,
    stop: &Path,
    store_every_ms: u64,
) -> Child {
    test_child(test)
        .env("KVTIER_WORKER_CONFIG", config)
        .env("KVTIER_WORKER_BLOCK", block_bytes.to_string())
        .env("KVTIER_WORKER_ID", id.to_string())
        .env("KVTIER_WORKER_PEER", peer.to_string())
        .env("KVTIER_WORKER_STOP", stop)
        .env("KVTIER_WORKER_EVERY_MS", store_every_ms.to_string())
        .stdout(Stdio::piped())
        .spawn()
        .expect("a worker starts")
}

/// Waits for a worker and returns what it said; fails the test if it failed.
pub fn finish_worker(child: Child) -> String {
    let out = child.wait_with_output().expect("the worker ends");
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "a worker failed: {said}");
    eprintln!("{}", said.trim());
    said
}

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is set for a worker"))
}

/// The worker's body (each test binary runs it as its ignored `worker` test).
pub fn worker() {
    let Ok(text) = std::env::var("KVTIER_WORKER_CONFIG") else {
        return;
    };
    // SAFETY: prctl with plain integer arguments: a worker dies with the test.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
    let mut config = TierConfig::default();
    for line in text.lines().filter(|l| !l.is_empty()) {
        let (k, v) = line.split_once('=').expect("key=value");
        config.set(k, v).unwrap();
    }
    let bb: usize = env("KVTIER_WORKER_BLOCK").parse().unwrap();
    let id: u64 = env("KVTIER_WORKER_ID").parse().unwrap();
    let peer: u64 = env("KVTIER_WORKER_PEER").parse().unwrap();
    let stop = PathBuf::from(env("KVTIER_WORKER_STOP"));
    let every = Duration::from_millis(env("KVTIER_WORKER_EVERY_MS").parse().unwrap());
    let h = Harness::leaving_dir(&config, 2 * JOB_BLOCKS + 4, bb);
    let mut rng = Rng::new(id);
    let mut next_id = id * 1_000_000;
    let mut mine: Vec<u64> = Vec::new();
    let (mut job, mut exact, mut missed) = (0u64, 0u64, 0u64);
    let mut next_store = Instant::now();
    while !stop.exists() {
        if Instant::now() >= next_store {
            let ids: Vec<u64> = (next_id..next_id + JOB_BLOCKS as u64).collect();
            next_id += JOB_BLOCKS as u64;
            job += 1;
            h.store_all(job, &ids);
            mine.extend(&ids);
            next_store = Instant::now() + every;
        }
        let mut want: Vec<u64> = (0..2)
            .map(|_| mine[rng.below(mine.len() as u64) as usize])
            .collect();
        want.extend((0..2).map(|_| peer * 1_000_000 + rng.below(next_id - id * 1_000_000)));
        want.sort_unstable();
        want.dedup();
        let states = h.lookup_settled(&want, Duration::from_secs(30));
        let hits: Vec<u64> = want
            .iter()
            .zip(&states)
            .filter(|(_, s)| **s == LookupState::Hit)
            .map(|(&i, _)| i)
            .collect();
        if hits.is_empty() {
            continue;
        }
        job += 1;
        let rows: Vec<i64> = (JOB_BLOCKS..JOB_BLOCKS + hits.len())
            .map(|r| r as i64)
            .collect();
        let r = h.load(job, &hits, &rows);
        for (n, &i) in hits.iter().enumerate().take(r.num_done as usize) {
            assert!(
                h.row_holds(JOB_BLOCKS + n, i),
                "worker {id}: block {i} loaded other bytes"
            );
            exact += 1;
        }
        if let Some(error) = r.error {
            // A block gone (gc, repair, a clear, a peer's eviction) is a miss.
            assert_eq!(
                error,
                ErrorKind::NotFound,
                "worker {id}: load failed otherwise: {r:?}"
            );
            missed += 1;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    // Capacity accounting: what the index holds is what loads find.
    let held = accounted(&h, &mine);
    println!(
        "WORKER {id} ok: stored {} blocks, {exact} loads exact, {missed} misses, {held} held",
        mine.len()
    );
}

/// Loads every block the tier still answers HIT for (a missing one becomes a
/// MISS), then checks that the tier counts exactly those that loaded.
fn accounted(h: &Harness, mine: &[u64]) -> u64 {
    let mut loaded = 0u64;
    for (n, chunk) in mine.chunks(64).enumerate() {
        let states = h.lookup_settled(chunk, Duration::from_secs(30));
        for (&i, s) in chunk.iter().zip(states) {
            if s != LookupState::Hit {
                continue;
            }
            let r = h.load(10_000_000 + n as u64 * 64 + i % 64, &[i], &[0]);
            if r.is_ok() {
                assert!(h.row_holds(0, i));
                loaded += 1;
            }
        }
    }
    let still: Vec<u64> = mine.to_vec();
    let hits = still
        .chunks(64)
        .map(|c| {
            h.tier()
                .lookup(&keys(c), KEY_LEN)
                .unwrap()
                .iter()
                .filter(|s| **s == LookupState::Hit)
                .count() as u64
        })
        .sum::<u64>();
    assert!(
        hits <= loaded,
        "the index answers HIT for {hits} blocks, {loaded} of them loaded"
    );
    let stats = h.tier().stats();
    assert!(stats.num_blocks <= stats.capacity_blocks, "{stats:?}");
    assert_eq!(
        stats.used_bytes,
        stats.num_blocks * stats.block_bytes,
        "{stats:?}"
    );
    loaded
}

/// The bytes of every block file under `dir`.
pub fn block_bytes_on_disk(dir: &Path) -> u64 {
    crate::common::files(dir, ".kvb")
        .iter()
        .chain(&crate::common::files(dir, ".kvs"))
        .filter_map(|p| std::fs::metadata(p).ok())
        .map(|m| m.len())
        .sum()
}

/// A stop file's path in `dir`, removed first.
pub fn stop_file(dir: &Path, name: &str) -> PathBuf {
    let p = dir.join(name);
    let _ = std::fs::remove_file(&p);
    p
}
