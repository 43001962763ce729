//! Out of memory is an error, not an abort: a job too big for the memory left
//! is rejected with `Alloc` (`TIER_ERR_ALLOC`), produces no result, leaves its
//! job id free and the tier unchanged, and the tier keeps working.
//!
//! Each case runs in a child process (this test binary re-run with
//! `--exact child --ignored`) that lowers its address-space limit
//! (`RLIMIT_AS`): a limit would hit every test thread of one process. The
//! caller's buffers of the big jobs are zeroed allocations made before the
//! limit: address space, not memory. The limit leaves `MARGIN` bytes above
//! what the child has mapped: room for small jobs, far too little for the big
//! jobs' own copies and per-key vectors.

mod common;

use common::{key, keys, pattern, KEY_LEN};
use kvtier::ffi::*;

const RESULT_SIZE: usize = std::mem::size_of::<tier_job_result_t>();
use kvtier::{ErrorKind, JobKind, PrimaryBuffer, Tier, TierConfig};
use std::process::Stdio;
use std::time::{Duration, Instant};

const MARGIN: usize = 128 << 20;
const BLOCK: usize = 64;
const ROWS: usize = 16;
const BIG_ID: u64 = 1000;
const DONE: &str = "oom child: all checks passed";

fn run_child(role: &str) {
    let out = common::test_child("child")
        .env("KVTIER_OOM_ROLE", role)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains(DONE),
        "child {role}: {}\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
        out.status
    );
}

/// A store whose key copy alone exceeds the memory left.
#[test]
fn big_store_fails_cleanly() {
    run_child("store-keys");
}

/// A store whose keys copy fits but whose per-key planning does not.
#[test]
fn big_store_of_short_keys_fails_cleanly() {
    run_child("store-plan");
}

/// A load whose key copy alone exceeds the memory left.
#[test]
fn big_load_fails_cleanly() {
    run_child("load-keys");
}

/// A load of one present key many times: keys fit, its items do not.
#[test]
fn big_load_of_short_keys_fails_cleanly() {
    run_child("load-plan");
}

/// `Tier::lookup` allocates its answer.
#[test]
fn big_lookup_fails_cleanly() {
    run_child("lookup");
}

/// Through the C ABI: TIER_ERR_ALLOC and a message.
#[test]
fn big_jobs_fail_cleanly_through_the_c_abi() {
    run_child("c-abi");
}

/// The child process (ignored when run directly).
#[test]
#[ignore]
fn child() {
    let Ok(role) = std::env::var("KVTIER_OOM_ROLE") else {
        return;
    };
    if role == "c-abi" {
        c_abi_child();
    } else {
        rust_child(&role);
    }
    println!("{DONE}");
}

fn vm_size() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status
        .lines()
        .find(|l| l.starts_with("VmSize:"))
        .expect("VmSize in /proc/self/status");
    let kib: usize = line
        .trim_start_matches("VmSize:")
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .unwrap();
    kib * 1024
}

/// Caps the address space at what is mapped now plus `MARGIN`. Something
/// may unmap meanwhile (a thread's memory given back after it finished its
/// part of the warm-up), leaving more room than the margin: then the limit
/// is set again from the new size, until a mapping as big as the margin
/// fails.
fn limit_address_space() {
    for _ in 0..20 {
        let limit = (vm_size() + MARGIN) as libc::rlim_t;
        let rl = libc::rlimit {
            rlim_cur: limit,
            rlim_max: libc::RLIM_INFINITY,
        };
        // SAFETY: a valid rlimit for this process.
        assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_AS, &rl) }, 0);
        // The limit bites: a mapping as big as the margin fails.
        if Vec::<u8>::new().try_reserve_exact(MARGIN).is_err() {
            println!("address space limited to {} MiB", limit >> 20);
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    panic!("a mapping of the margin still fits under the limit after 20 tries");
}

fn config() -> TierConfig {
    let mut c = TierConfig::default();
    c.set("capacity_bytes", &(BLOCK << 20).to_string()).unwrap();
    c.set("io_threads", "2").unwrap();
    c
}

/// Rows 0..8 hold blocks 1..=8; the round trip loads them into rows 8..16.
/// Rows past 16 are left alone: in a primary buffer sized for a big load they
/// stay untouched zero pages (address space, not memory).
fn fill_rows(rows: &mut [u8]) {
    for i in 0..8 {
        rows[i * BLOCK..][..BLOCK].copy_from_slice(&pattern(i as u64 + 1, BLOCK));
    }
    rows[8 * BLOCK..ROWS * BLOCK].fill(0);
}

/// The rows of a big job: a load writes each row once, so its rows are
/// distinct (and the primary buffer has that many).
fn big_rows(n: usize) -> Vec<i64> {
    (0..n as i64).collect()
}

fn check_loaded(rows: &[u8]) {
    for i in 0..8 {
        assert_eq!(
            &rows[(8 + i) * BLOCK..][..BLOCK],
            &pattern(i as u64 + 1, BLOCK)[..],
            "row {} after the load",
            8 + i
        );
    }
}

fn wait_results(tier: &Tier, n: usize) -> Vec<kvtier::JobResult> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut out = Vec::new();
    while out.len() < n {
        assert!(Instant::now() < deadline, "results missing: {out:?}");
        tier.wait(Duration::from_millis(100));
        out.extend(tier.poll(16));
    }
    out
}

/// Stores and loads blocks 1..=8, with `store_id` for the store.
fn round_trip(tier: &Tier, rows: &mut [u8], store_id: u64, load_id: u64) {
    let ids: Vec<u64> = (1..=8).collect();
    let src: Vec<i64> = (0..8).collect();
    let dst: Vec<i64> = (8..16).collect();
    tier.submit_store(store_id, &keys(&ids), KEY_LEN, &src)
        .unwrap();
    let stored = wait_results(tier, 1);
    assert_eq!(stored.len(), 1);
    assert_eq!(
        (stored[0].job_id, stored[0].kind),
        (store_id, JobKind::Store)
    );
    assert!(stored[0].is_ok(), "{stored:?}");
    tier.submit_load(load_id, &keys(&ids), KEY_LEN, &dst)
        .unwrap();
    let loaded = wait_results(tier, 1);
    assert_eq!(loaded.len(), 1);
    assert_eq!((loaded[0].job_id, loaded[0].kind), (load_id, JobKind::Load));
    assert!(loaded[0].is_ok(), "{loaded:?}");
    check_loaded(rows);
}

fn expect_alloc(what: &str, r: kvtier::Result<()>) {
    match r {
        Err(e) if e.kind() == ErrorKind::Alloc => {
            assert!(e.message().contains("bytes"), "{what}: {e}");
            println!("{what}: {e}");
        }
        other => panic!("{what}: expected an Alloc error, got {other:?}"),
    }
}

fn rust_child(role: &str) {
    // The caller's buffers: zeroed, so address space rather than memory.
    let (key_len, n) = match role {
        "store-keys" | "load-keys" => (KEY_LEN, 8 << 20), // 288 MiB of keys
        "store-plan" | "load-plan" => (1, 32 << 20),      // 32 MiB of keys, 512 MiB of items
        "lookup" => (1, 256 << 20),                       // 256 MiB of answers
        other => panic!("unknown role {other}"),
    };
    let primary_rows = if role.starts_with("load") { n } else { ROWS };
    let mut rows = vec![0u8; primary_rows * BLOCK];
    fill_rows(&mut rows);
    let primary = unsafe { PrimaryBuffer::new(rows.as_mut_ptr(), rows.len(), BLOCK) }.unwrap();
    let tier = Tier::new(&config(), primary).unwrap();
    // Warm up: every thread has run and allocated before the limit.
    round_trip(&tier, &mut rows, 1, 2);
    tier.clear().unwrap();
    fill_rows(&mut rows);
    let one = [0u8; 1];
    if role == "load-plan" {
        // The present key the big load repeats.
        tier.submit_store(3, &one, 1, &[0]).unwrap();
        assert!(wait_results(&tier, 1)[0].is_ok());
    }
    let big_keys = vec![0u8; n * key_len];
    let big_rows = match role {
        "lookup" => Vec::new(),
        "load-keys" | "load-plan" => big_rows(n),
        // A store may read one row for many keys.
        _ => vec![0i64; n],
    };
    let before = tier.stats();
    println!("hello from the child");
    limit_address_space();

    let r = match role {
        "store-keys" | "store-plan" => tier.submit_store(BIG_ID, &big_keys, key_len, &big_rows),
        "load-keys" | "load-plan" => tier.submit_load(BIG_ID, &big_keys, key_len, &big_rows),
        _ => tier.lookup(&big_keys, key_len).map(|_| ()),
    };
    expect_alloc(role, r);

    // Nothing changed, nothing is reported, nothing is in flight.
    let after = tier.stats();
    assert_eq!(after.num_blocks, before.num_blocks);
    assert_eq!(after.used_bytes, before.used_bytes);
    assert_eq!(after.jobs_in_flight, 0);
    assert_eq!(after.results_queued, 0);
    assert!(tier.poll(16).is_empty());
    if role == "load-plan" {
        assert_eq!(
            tier.lookup(&one, 1).unwrap(),
            vec![kvtier::LookupState::Hit]
        );
    }
    // Small jobs work under the same limit, and the big job's id is free.
    round_trip(&tier, &mut rows, BIG_ID, BIG_ID + 1);
    let small: Vec<u8> = (1..=8).flat_map(key).collect();
    assert_eq!(
        tier.lookup(&small, KEY_LEN).unwrap(),
        vec![kvtier::LookupState::Hit; 8]
    );
    tier.drain();
    assert!(tier.poll(16).is_empty(), "only the small jobs are reported");
    assert_eq!(tier.stats().jobs_in_flight, 0);
}

fn c_poll(tier: *mut tier_t, n: usize) -> Vec<tier_job_result_t> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut out = Vec::new();
    while out.len() < n {
        assert!(Instant::now() < deadline, "results missing");
        let mut buf = [tier_job_result_t::default(); 16];
        let mut got = 0usize;
        unsafe {
            tier_wait(tier, 100);
            assert_eq!(
                tier_poll_finished(tier, buf.as_mut_ptr(), RESULT_SIZE, 16, &mut got),
                TIER_OK
            );
        }
        out.extend_from_slice(&buf[..got]);
    }
    out
}

fn last_error() -> String {
    let mut buf = vec![0u8; 512];
    let n = unsafe { tier_last_error(buf.as_mut_ptr() as *mut std::ffi::c_char, buf.len()) };
    buf.truncate(n.min(511));
    String::from_utf8(buf).unwrap()
}

fn check_c_alloc(function: &str, status: tier_status_t) {
    assert_eq!(status, TIER_ERR_ALLOC, "big {function}");
    let msg = last_error();
    assert!(msg.starts_with(function) && msg.contains("bytes"), "{msg}");
    println!("{msg}");
}

fn c_abi_child() {
    let n = 8usize << 20;
    let mut rows = vec![0u8; n * BLOCK];
    fill_rows(&mut rows);
    let ids: Vec<u64> = (1..=8).collect();
    let small = keys(&ids);
    let src: Vec<i64> = (0..8).collect();
    let dst: Vec<i64> = (8..16).collect();
    let big_keys = vec![0u8; n * KEY_LEN];
    let big_rows = big_rows(n);
    unsafe {
        let cfg = tier_config_new();
        let cap = std::ffi::CString::new((BLOCK << 20).to_string()).unwrap();
        assert_eq!(
            tier_config_set(cfg, c"capacity_bytes".as_ptr(), cap.as_ptr()),
            0
        );
        assert_eq!(
            tier_config_set(cfg, c"io_threads".as_ptr(), c"2".as_ptr()),
            0
        );
        let mut tier = std::ptr::null_mut();
        let status = tier_new(cfg, rows.as_mut_ptr().cast(), rows.len(), BLOCK, &mut tier);
        assert_eq!(status, TIER_OK);
        tier_config_free(cfg);
        // Warm up every thread.
        let (k, kl) = (small.as_ptr(), KEY_LEN);
        assert_eq!(tier_submit_store(tier, 1, k, kl, src.as_ptr(), 8), TIER_OK);
        assert_eq!(c_poll(tier, 1)[0].status, TIER_OK);
        assert_eq!(tier_submit_load(tier, 2, k, kl, dst.as_ptr(), 8), TIER_OK);
        assert_eq!(c_poll(tier, 1)[0].status, TIER_OK);
        assert_eq!(tier_clear(tier), TIER_OK);
        rows[8 * BLOCK..ROWS * BLOCK].fill(0);
        println!("hello from the child");
        limit_address_space();

        let (bk, br) = (big_keys.as_ptr(), big_rows.as_ptr());
        let status = tier_submit_store(tier, BIG_ID, bk, kl, br, n);
        check_c_alloc("tier_submit_store", status);
        let status = tier_submit_load(tier, BIG_ID, bk, kl, br, n);
        check_c_alloc("tier_submit_load", status);
        let mut stats = tier_stats_t::default();
        assert_eq!(
            tier_stats(tier, &mut stats, std::mem::size_of::<tier_stats_t>()),
            TIER_OK
        );
        assert_eq!((stats.jobs_in_flight, stats.results_queued), (0, 0));
        // Small jobs under the limit, the big job's id reused.
        assert_eq!(
            tier_submit_store(tier, BIG_ID, k, kl, src.as_ptr(), 8),
            TIER_OK
        );
        let r = c_poll(tier, 1);
        assert_eq!((r.len(), r[0].job_id, r[0].status), (1, BIG_ID, TIER_OK));
        assert_eq!(
            tier_submit_load(tier, BIG_ID + 1, k, kl, dst.as_ptr(), 8),
            TIER_OK
        );
        let r = c_poll(tier, 1);
        assert_eq!(
            (r.len(), r[0].job_id, r[0].status),
            (1, BIG_ID + 1, TIER_OK)
        );
        let mut states = [9u8; 8];
        assert_eq!(tier_lookup(tier, k, kl, 8, states.as_mut_ptr()), TIER_OK);
        assert_eq!(states, [TIER_HIT; 8]);
        assert_eq!(tier_drain(tier), TIER_OK);
        let mut got = 0usize;
        let mut buf = [tier_job_result_t::default(); 4];
        assert_eq!(
            tier_poll_finished(tier, buf.as_mut_ptr(), RESULT_SIZE, 4, &mut got),
            TIER_OK
        );
        assert_eq!(got, 0, "only the small jobs are reported");
        tier_free(tier);
    }
    check_loaded(&rows);
}
