//! Memory: in steady state a job allocates a bounded number of times, not
//! once per block (issue 9: "no per-block allocation in steady state beyond
//! the index"). A counting global allocator measures a full tier that keeps
//! storing new keys (each store evicts) and loading resident ones, with jobs
//! of 1 and of 32 blocks: the allocations per job may differ by a constant,
//! not by a multiple of the 31 extra blocks. A Redis tier over TLS is
//! allowed, on top, what rustls allocates per TLS record (see its check).
//!
//! One test in this binary, so no other test's threads allocate meanwhile.
//! Redis (a server, a three-master cluster, each plain then over TLS)
//! skips (with a printed reason) without redis-server, unless
//! KVTIER_REQUIRE_REDIS=1.

mod common;

use common::redis::{redis_available, redis_config_at, RedisCluster, RedisServer, TestCerts};
use common::{disk_config, memory_config, Harness};
use kvtier::TierConfig;
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};

struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        System.alloc(layout)
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        System.alloc_zeroed(layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        System.realloc(ptr, layout, new_size)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const BLOCK: usize = 16 << 10;
const CAPACITY_BLOCKS: usize = 1024;
const BIG_JOB: usize = 32;
const ROWS: usize = BIG_JOB;
/// Timed jobs per size and direction (all of a pass stays resident).
const JOBS: u64 = 16;
/// Rounds of 1-block and 32-block jobs; each check judges its lowest.
const ROUNDS: usize = 3;

/// Allocations per job of `blocks` blocks: `JOBS` stores of new keys (each
/// evicting old blocks once the tier is full, the evictions' storage
/// released in the background: the count waits for it), then `JOBS` loads
/// of the keys just stored (resident).
fn per_job(
    h: &Harness,
    stored: &dyn Fn() -> usize,
    next_key: &mut u64,
    next_job: &mut u64,
    blocks: usize,
) -> (f64, f64) {
    let rows: Vec<i64> = (0..blocks as i64).collect();
    for r in 0..blocks {
        h.fill(r, r as u64);
    }
    let first_key = *next_key;
    let jobs: Vec<(u64, Vec<u8>)> = (0..JOBS)
        .map(|j| {
            let ids: Vec<u64> = (0..blocks as u64)
                .map(|i| first_key + j * blocks as u64 + i)
                .collect();
            (*next_job + j, common::keys(&ids))
        })
        .collect();
    *next_key += JOBS * blocks as u64;
    *next_job += JOBS;
    let mut results = Vec::with_capacity(2 * JOBS as usize);

    let before = ALLOCATIONS.load(Ordering::Relaxed);
    for (job, keys) in &jobs {
        h.tier()
            .submit_store(*job, keys, common::KEY_LEN, &rows)
            .unwrap();
        results.push(h.result_of(*job));
    }
    let (left, uncounted) = settle(stored);
    let stores = ALLOCATIONS.load(Ordering::Relaxed) - before - uncounted;
    assert!(
        left <= CAPACITY_BLOCKS,
        "{left} blocks in storage for a capacity of {CAPACITY_BLOCKS}: the evicted \
         blocks' deletes had not finished, so the count above is short"
    );

    let before = ALLOCATIONS.load(Ordering::Relaxed);
    for (job, keys) in &jobs {
        let job = job + JOBS;
        h.tier()
            .submit_load(job, keys, common::KEY_LEN, &rows)
            .unwrap();
        results.push(h.result_of(job));
    }
    std::thread::sleep(std::time::Duration::from_millis(100));
    let loads = ALLOCATIONS.load(Ordering::Relaxed) - before;
    *next_job += JOBS;

    for r in &results {
        assert!(r.is_ok(), "{r:?}");
    }
    (stores as f64 / JOBS as f64, loads as f64 / JOBS as f64)
}

/// Waits for background work (the evicted blocks' deletes) to finish, up to
/// 30 s on a loaded machine: until storage holds no more than the capacity.
/// Returns the blocks left in storage and the allocations made while
/// counting them (by the count itself: a directory listing, a DBSIZE),
/// which are not the tier's.
fn settle(stored: &dyn Fn() -> usize) -> (usize, u64) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let mut uncounted = 0;
    loop {
        std::thread::sleep(std::time::Duration::from_millis(100));
        let before = ALLOCATIONS.load(Ordering::Relaxed);
        let left = stored();
        uncounted += ALLOCATIONS.load(Ordering::Relaxed) - before;
        if left <= CAPACITY_BLOCKS || std::time::Instant::now() > deadline {
            return (left, uncounted);
        }
    }
}

/// (kind, allowed allocations per block): memory and Redis none beyond the
/// index's (a store's eviction copies the evicted key out of the index, so
/// the backend can delete it: one per evicted block); disk pays a path per
/// file operation and the header's key on a load — a few per block, far below
/// the cost of the open, write, rename and fsync they name.
/// `stored` counts the blocks in the backend's storage (not the index).
fn check(
    name: &str,
    config: &TierConfig,
    stored: &dyn Fn() -> usize,
    (store_limit, load_limit): (f64, f64),
    failures: &mut Vec<String>,
) {
    let h = Harness::new(config, ROWS, BLOCK);
    let (mut next_key, mut next_job) = (1u64, 1u64);
    // Fill past capacity twice so every later store evicts, and let every
    // lazily grown buffer (connections, staging, queues) reach its size.
    while next_key < (3 * CAPACITY_BLOCKS) as u64 {
        per_job(&h, stored, &mut next_key, &mut next_job, BIG_JOB);
    }
    // The lowest of a few rounds: what the tier itself allocates per block
    // is in every round, while what a TLS server's record cutting adds
    // (see the TLS check) comes and goes with the machine's load.
    let extra = (BIG_JOB - 1) as f64;
    let rounds: Vec<[f64; 4]> = (0..ROUNDS)
        .map(|_| {
            let (small_store, small_load) = per_job(&h, stored, &mut next_key, &mut next_job, 1);
            let (big_store, big_load) = per_job(&h, stored, &mut next_key, &mut next_job, BIG_JOB);
            [small_store, big_store, small_load, big_load]
        })
        .collect();
    let lowest = |small: usize, big: usize| {
        rounds
            .iter()
            .min_by(|a, b| (a[big] - a[small]).total_cmp(&(b[big] - b[small])))
            .map(|r| (r[small], r[big]))
            .expect("at least one round")
    };
    let (small_store, big_store) = lowest(0, 1);
    let (small_load, big_load) = lowest(2, 3);
    let store_per_block = (big_store - small_store) / extra;
    let load_per_block = (big_load - small_load) / extra;
    eprintln!(
        "{name}: allocations per job, 1 / {BIG_JOB} blocks: store {small_store:.1} / \
         {big_store:.1} ({store_per_block:.2} per extra block), load {small_load:.1} / \
         {big_load:.1} ({load_per_block:.2} per extra block)"
    );
    if store_per_block > store_limit {
        failures.push(format!(
            "{name}: stores allocate {store_per_block:.2} times per block, over {store_limit} \
             ({small_store:.1} per 1-block job, {big_store:.1} per {BIG_JOB}-block job)"
        ));
    }
    if load_per_block > load_limit {
        failures.push(format!(
            "{name}: loads allocate {load_per_block:.2} times per block, over {load_limit} \
             ({small_load:.1} per 1-block job, {big_load:.1} per {BIG_JOB}-block job)"
        ));
    }
}

#[test]
fn steady_state_jobs_allocate_per_job_not_per_block() {
    let mut failures = Vec::new();
    let memory = memory_config(CAPACITY_BLOCKS, BLOCK);
    check("memory", &memory, &|| 0, (1.2, 0.2), &mut failures);
    let disk = disk_config(CAPACITY_BLOCKS, BLOCK);
    let dir = disk.disk.path.clone().unwrap();
    let files = || common::files(&dir, ".kvb").len();
    check("disk", &disk, &files, (6.0, 3.0), &mut failures);
    if redis_available() {
        let server = RedisServer::start().expect("redis-server starts");
        let config = redis_config_at(&server.url(), CAPACITY_BLOCKS, BLOCK);
        let keys = || server.cli(&["DBSIZE"]).trim().parse::<usize>().unwrap();
        check("redis", &config, &keys, (1.2, 0.2), &mut failures);
        // A cluster's jobs go direct too, a pipeline per master: the same
        // limits (the crate's cluster pipeline parsed every GET value into
        // a Vec of its own, one allocation per block).
        let cluster = RedisCluster::start(3, 0).expect("a redis cluster forms");
        let mut config = redis_config_at(&cluster.url(), CAPACITY_BLOCKS, BLOCK);
        config.set("cluster", "on").unwrap();
        let keys = || {
            cluster
                .masters()
                .iter()
                .map(|m| {
                    cluster
                        .cli_at(m.port, &["DBSIZE"])
                        .trim()
                        .parse::<usize>()
                        .unwrap()
                })
                .sum()
        };
        check("redis cluster", &config, &keys, (1.2, 0.2), &mut failures);
    }
    if let Some(certs) = redis_available().then(TestCerts::make).flatten() {
        let server = RedisServer::start_tls(&certs).expect("redis-server starts");
        // The tier trusts the test CA as a deployment would trust its own:
        // through SSL_CERT_FILE. Set here, with no other test in this binary
        // and the earlier tiers' threads gone.
        std::env::set_var("SSL_CERT_FILE", &certs.ca);
        let mut config = redis_config_at(&server.tls_url(), CAPACITY_BLOCKS, BLOCK);
        config.set("cluster", "off").unwrap();
        let keys = || server.cli(&["DBSIZE"]).trim().parse::<usize>().unwrap();
        // kvtier's own TLS connection allocates nothing per block either;
        // rustls (0.23) allocates one buffer per TLS record it encrypts and
        // per application-data record it receives (and resizes its input
        // buffer when it empties), which no public API avoids: 2-3 per 16
        // KiB block measured (2.1 on stores, where the server answers SETs
        // in records of their own; 2.3-2.8 on loads), by how the server cuts
        // its records. Hence the allowance above the plain server's limits,
        // with room for a loaded machine, where the server's writes meet a
        // fuller socket and cut more, smaller records. The crate's
        // connection, which TLS tiers used before, allocated 12-13 per block
        // on stores and 10-11 on loads here (its reply values, commands and
        // key names): still well above these limits. On an Intel Xeon VM of
        // this project (2 cores, the host stealing some of them) single
        // rounds measured 3.2 per block on stores and 4.7-5.7 on loads (the
        // server's replies cut into more records there), the lowest of
        // three rounds 2.7-4.8 on loads.
        let rustls = 5.0;
        let limits = (1.2 + rustls, 0.2 + rustls);
        check("redis tls", &config, &keys, limits, &mut failures);
        // A TLS cluster's jobs go direct too, a pipeline of kvtier's own TLS
        // connections per master: the TLS server's limits. Measured 3.4
        // per block on stores, 3.2-3.4 on loads: a 32-block job also pays
        // two more masters' pipelines than a 1-block job (rustls's
        // buffers per pipeline), counted here as per-block. The crate's
        // cluster connection, which TLS clusters used before, allocated
        // 21 per block on stores and 13 on loads here (every GET value
        // parsed into a Vec of its own).
        let cluster = RedisCluster::start_tls(3, 0, &certs).expect("a TLS redis cluster forms");
        let mut config = redis_config_at(&cluster.url(), CAPACITY_BLOCKS, BLOCK);
        config.set("cluster", "on").unwrap();
        let keys = || {
            cluster
                .ports()
                .iter()
                .map(|&p| {
                    cluster
                        .cli_at(p, &["DBSIZE"])
                        .trim()
                        .parse::<usize>()
                        .unwrap()
                })
                .sum()
        };
        check("redis tls cluster", &config, &keys, limits, &mut failures);
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
