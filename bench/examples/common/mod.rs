//! What the examples share: one pass of jobs through a tier.

use kvtier::Tier;
use std::time::{Duration, Instant};

/// Stores (or loads) `blocks` blocks with 8-byte keys `first..`, in jobs of
/// `job_blocks`, `window` jobs in flight, job `j` using rows from
/// `(j % window) * job_blocks` on (modulo `rows`); every job must succeed.
/// Returns GB/s (10^9 bytes per second) of `block`-byte blocks.
#[allow(clippy::too_many_arguments)]
pub fn pass(
    tier: &Tier,
    store: bool,
    first: u64,
    blocks: usize,
    job_blocks: usize,
    window: usize,
    rows: usize,
    block: usize,
) -> f64 {
    let start = Instant::now();
    let jobs = blocks / job_blocks;
    let (mut next, mut in_flight, mut done) = (0usize, 0usize, 0usize);
    while done < jobs {
        while in_flight < window && next < jobs {
            let keys: Vec<u8> = (0..job_blocks as u64)
                .flat_map(|i| (first + (next * job_blocks) as u64 + i).to_le_bytes())
                .collect();
            let slot = (next % window) * job_blocks;
            let ids: Vec<i64> = (0..job_blocks)
                .map(|i| ((slot + i) % rows) as i64)
                .collect();
            if store {
                tier.submit_store(next as u64, &keys, 8, &ids).unwrap();
            } else {
                tier.submit_load(next as u64, &keys, 8, &ids).unwrap();
            }
            next += 1;
            in_flight += 1;
        }
        tier.wait(Duration::from_millis(100));
        for r in tier.poll(64) {
            assert!(r.is_ok(), "{r:?}");
            in_flight -= 1;
            done += 1;
        }
    }
    (blocks * block) as f64 / start.elapsed().as_secs_f64() / 1e9
}
