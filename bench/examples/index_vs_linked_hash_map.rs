//! Why kvtier's block index is its own table rather than a `LinkedHashMap`
//! (hashlink), the obvious LRU map: memory per block and lookup cost at a
//! million blocks, measured side by side in one process.
//!
//!     cargo run --release -p kvtier-bench --example index_vs_linked_hash_map
//!
//! Both hold the same 1,000,000 random 36-byte keys (vLLM's key size) in LRU
//! order and answer the same lookups: all hits, in random order, 64 keys per
//! call (kvtier's batch call; the map is asked one key at a time, which is all
//! it offers). Memory is resident-set growth while the keys go in (kvtier's
//! 64-byte blocks are subtracted: the arena is the blocks, not the index).
//! Medians of 5 passes.

use hashlink::LinkedHashMap;
use kvtier::{PrimaryBuffer, Tier, TierConfig};
use std::time::Instant;

const BLOCKS: usize = 1_000_000;
const KEY_LEN: usize = 36;
const BATCH: usize = 64;
const BLOCK_BYTES: usize = 64;

fn rss_bytes() -> usize {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("statm");
    let pages: usize = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

fn key(i: u64) -> [u8; KEY_LEN] {
    let mut k = [0u8; KEY_LEN];
    for (j, chunk) in k.chunks_mut(8).enumerate() {
        let v = splitmix(i * 8 + j as u64).to_le_bytes();
        chunk.copy_from_slice(&v[..chunk.len()]);
    }
    k
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// A random lookup order over all keys, packed.
fn lookup_order() -> Vec<u8> {
    let mut order: Vec<u64> = (0..BLOCKS as u64).collect();
    for i in (1..order.len()).rev() {
        order.swap(i, (splitmix(i as u64 ^ 0xabc) % (i as u64 + 1)) as usize);
    }
    order.iter().flat_map(|&i| key(i)).collect()
}

fn main() {
    let probes = lookup_order();

    // kvtier's index, through the public Rust API.
    let mut rows = vec![0u8; BATCH * BLOCK_BYTES];
    let primary =
        unsafe { PrimaryBuffer::new(rows.as_mut_ptr(), rows.len(), BLOCK_BYTES) }.unwrap();
    let mut config = TierConfig::default();
    config
        .set("capacity_bytes", &(BLOCKS * BLOCK_BYTES).to_string())
        .unwrap();
    let before = rss_bytes();
    let tier = Tier::new(&config, primary).unwrap();
    let ids: Vec<i64> = (0..BATCH as i64).collect();
    for (job, start) in (0..BLOCKS).step_by(BATCH).enumerate() {
        let keys: Vec<u8> = (start..start + BATCH).flat_map(|i| key(i as u64)).collect();
        tier.submit_store(job as u64, &keys, KEY_LEN, &ids).unwrap();
        if job % 64 == 63 {
            tier.drain();
            tier.poll(usize::MAX);
        }
    }
    tier.drain();
    tier.poll(usize::MAX);
    let kvtier_bytes = rss_bytes() - before - BLOCKS * BLOCK_BYTES;
    let mut out = [0u8; BATCH];
    let kvtier_ns = median(
        (0..5)
            .map(|_| {
                let t = Instant::now();
                for chunk in probes.chunks(BATCH * KEY_LEN) {
                    tier.lookup_into(chunk, KEY_LEN, &mut out).unwrap();
                    assert!(out.iter().all(|&s| s == 1));
                }
                t.elapsed().as_nanos() as f64 / BLOCKS as f64
            })
            .collect(),
    );
    let metadata = tier.stats().metadata_bytes as f64 / BLOCKS as f64;
    drop(tier);

    // hashlink's LinkedHashMap: key → slot, in LRU order.
    let before = rss_bytes();
    let mut map: LinkedHashMap<[u8; KEY_LEN], u32> = LinkedHashMap::new();
    for i in 0..BLOCKS {
        map.insert(key(i as u64), i as u32);
    }
    let map_bytes = rss_bytes() - before;
    let map_ns = median(
        (0..5)
            .map(|_| {
                let t = Instant::now();
                for k in probes.chunks(KEY_LEN) {
                    let k: &[u8; KEY_LEN] = k.try_into().unwrap();
                    assert!(map.get(k).is_some());
                }
                t.elapsed().as_nanos() as f64 / BLOCKS as f64
            })
            .collect(),
    );

    println!("{BLOCKS} blocks, {KEY_LEN}-byte keys, all-hit lookups in random order, medians of 5");
    println!(
        "kvtier index:   {:6.1} bytes/block resident ({metadata:.1} counted by tier_stats), {kvtier_ns:5.1} ns/lookup (batches of {BATCH})",
        kvtier_bytes as f64 / BLOCKS as f64
    );
    println!(
        "LinkedHashMap:  {:6.1} bytes/block resident, {map_ns:5.1} ns/lookup (one key per call, no state, no pins)",
        map_bytes as f64 / BLOCKS as f64
    );
}
