//! Real Redis (or Valkey) servers for tests: the launcher is the
//! `kvtier-redis-harness` crate (`redis-harness/`), shared with the benchmark
//! and the Python tests; this file adds the skip macro and tier
//! configurations on the shared server and cluster.

#![allow(dead_code)]

#[allow(unused_imports)]
pub use kvtier_redis_harness::*;

/// Evaluates to the server or cluster `$start` gives (`RedisServer::start()`
/// when omitted), or returns from the test when Redis is not installed (the
/// reason is already printed). Panics instead when `KVTIER_REQUIRE_REDIS=1`
/// or `CI=true`.
#[macro_export]
macro_rules! redis_or_skip {
    () => {
        $crate::redis_or_skip!($crate::common::redis::RedisServer::start())
    };
    ($start:expr) => {
        match $start {
            Some(started) => started,
            None => return,
        }
    };
}

/// A Redis tier configuration on `url` with a key prefix of its own, so that
/// tests sharing a server never see each other's blocks.
pub fn redis_config_at(
    url: &str,
    capacity_blocks: usize,
    block_bytes: usize,
) -> kvtier::TierConfig {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut c = super::memory_config(capacity_blocks, block_bytes);
    c.set("backend", "redis").unwrap();
    c.set("url", url).unwrap();
    c.set("key_prefix", &format!("t{}-{n}", std::process::id()))
        .unwrap();
    c.set("io_timeout_ms", "5000").unwrap();
    c
}

/// A configuration on the binary's standalone server (call after checking
/// [`shared_server`]).
pub fn standalone_config(capacity_blocks: usize, block_bytes: usize) -> kvtier::TierConfig {
    let server = shared_server().expect("a Redis server (check shared_server() first)");
    redis_config_at(&server.url(), capacity_blocks, block_bytes)
}

/// [`standalone_config`] sealed with tenant A's key.
pub fn sealed_standalone_config(capacity_blocks: usize, block_bytes: usize) -> kvtier::TierConfig {
    let mut c = standalone_config(capacity_blocks, block_bytes);
    c.set("seal_key", super::SEAL_A).unwrap();
    c
}

/// [`cluster_config`] sealed with tenant A's key (a direct pipeline per master,
/// sealed values from the worker's buffer).
pub fn sealed_cluster_config(capacity_blocks: usize, block_bytes: usize) -> kvtier::TierConfig {
    let mut c = cluster_config(capacity_blocks, block_bytes);
    c.set("seal_key", super::SEAL_A).unwrap();
    c
}

/// A configuration on the binary's cluster (check [`shared_cluster`] first).
pub fn cluster_config(capacity_blocks: usize, block_bytes: usize) -> kvtier::TierConfig {
    let cluster = shared_cluster().expect("a Redis cluster (check shared_cluster() first)");
    let mut c = redis_config_at(&cluster.url(), capacity_blocks, block_bytes);
    c.set("cluster", "on").unwrap();
    c
}
