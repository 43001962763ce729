//! Disk backend, stores into a full tier: the state an engine's disk tier is
//! in once it has filled. A tier whose capacity is half a pass, filled once,
//! then timed passes of new keys in which every store evicts an older block,
//! whose file the tier deletes in the background. A pass ends when its jobs
//! are done and the directory holds no more block files than the tier holds
//! blocks, so the deletes are timed too. The bound: raw O_DIRECT writes of a
//! new file per block, each with the unlink of an older one, on as many
//! threads; passes alternating with the tier's.

use super::files::{count_block_files, fresh_dir, write_file};
use super::shared::{config, Primary};
use super::Params;
use crate::buffer::time_parallel;
use crate::data::keys;
use crate::jobs::{JobIds, Kind};
use crate::primary::verify_range;
use crate::progress::Progress;
use crate::report::{num, Report};
use crate::stats::{max, median, min, paired_ratio};
use std::path::Path;
use std::time::{Duration, Instant};

/// Key namespace of the full-tier passes.
const NS_STEADY: u64 = 15;
/// How long the evictions' deletes may trail a pass's last job.
const DELETE_WAIT: Duration = Duration::from_secs(60);

pub struct Results {
    pub capacity_blocks: usize,
    pub blocks: usize,
    /// GB/s per repetition; raw and tier entries of one index ran side by side.
    pub raw_gbps: Vec<f64>,
    pub store_gbps: Vec<f64>,
    /// Blocks the tier evicted per block stored, over the timed passes.
    pub evictions_per_store: f64,
    pub verified_bytes: u64,
}

/// None when half a pass would not hold twice the blocks in flight (a full
/// tier refuses stores it cannot evict for: `--quick` at 2 MiB).
pub fn run(p: &Params) -> Result<Option<Results>, String> {
    let block = p.block_bytes;
    let n = (p.data_bytes as usize).div_ceil(block).max(p.job_blocks);
    let capacity_blocks = n / 2;
    if capacity_blocks < 2 * p.window * p.job_blocks {
        return Ok(None);
    }
    let primary = Primary::new(n.min(256), block)?;
    let rows = primary.rows;
    let src = primary.sources(n);
    let mut ids = JobIds::default();
    let mut progress = Progress::new(p.progress, "disk full tier", (p.repeat * 2 * n) as u64);
    let tier_dir = p.dir.join("steady");
    let raw_dir = p.dir.join("steady-raw");
    fresh_dir(&raw_dir)?;
    let cfg = config(
        &tier_dir,
        p.io_threads,
        (capacity_blocks * block) as u64,
        true,
        p.io_timeout_ms,
    )?;
    let tier = primary.tier(&cfg)?;
    let raw_path = |pass: usize, i: usize| raw_dir.join(format!("{pass}-{i}.blk"));
    // Filled once, untimed: the tier ends full (having evicted the first
    // half), and the raw directory holds the files pass 1 deletes.
    let keys_of = |pass: usize| keys(NS_STEADY, (pass * n) as u64, n);
    primary
        .stream(Kind::Store, &keys_of(0), &src, p.job_blocks, p.window)
        .run(&tier, &mut ids, |_| {})?;
    wait_for_files(&tier_dir, capacity_blocks)?;
    time_parallel(p.io_threads, n, |i| {
        write_file(&raw_path(0, i), primary.row(i % rows), None)
    })?;
    let evictions_before = tier.stats().map_err(|e| e.to_string())?.evictions;
    let mut r = Results {
        capacity_blocks,
        blocks: n,
        raw_gbps: Vec::new(),
        store_gbps: Vec::new(),
        evictions_per_store: 0.0,
        verified_bytes: 0,
    };
    let gbps = |secs: f64| (n * block) as f64 / secs / 1e9;
    for rep in 0..p.repeat {
        let pass = rep + 1;
        let raw_first = rep % 2 == 0;
        for tier_turn in [!raw_first, raw_first] {
            if tier_turn {
                let start = Instant::now();
                primary
                    .stream(Kind::Store, &keys_of(pass), &src, p.job_blocks, p.window)
                    .run(&tier, &mut ids, |_| {})?;
                wait_for_files(&tier_dir, capacity_blocks)?;
                r.store_gbps.push(gbps(start.elapsed().as_secs_f64()));
            } else {
                let secs = time_parallel(p.io_threads, n, |i| {
                    write_file(&raw_path(pass, i), primary.row(i % rows), None)?;
                    std::fs::remove_file(raw_path(pass - 1, i)).map_err(|e| format!("unlink: {e}"))
                })?;
                r.raw_gbps.push(gbps(secs));
            }
            progress.add(n as u64);
        }
    }
    let stats = tier.stats().map_err(|e| e.to_string())?;
    r.evictions_per_store = (stats.evictions - evictions_before) as f64 / (p.repeat * n) as f64;
    if stats.num_blocks != capacity_blocks as u64 {
        return Err(format!(
            "full tier: {} blocks resident, expected its capacity {capacity_blocks}",
            stats.num_blocks
        ));
    }
    // The last pass's newest quarter must be resident, byte for byte.
    r.verified_bytes = verify_range(
        &tier,
        &primary,
        &keys_of(p.repeat),
        n - n / 4..n,
        p.job_blocks,
        &mut ids,
        "disk full tier",
    )?;
    progress.finish();
    drop(tier);
    let _ = std::fs::remove_dir_all(&tier_dir);
    let _ = std::fs::remove_dir_all(&raw_dir);
    Ok(Some(r))
}

/// Waits until the tier's directory holds at most `n` block files (its
/// evictions' deletes run in the background).
fn wait_for_files(dir: &Path, n: usize) -> Result<(), String> {
    let start = Instant::now();
    loop {
        let files = count_block_files(dir)?;
        if files <= n {
            return Ok(());
        }
        if start.elapsed() > DELETE_WAIT {
            return Err(format!(
                "full tier: {files} block files for {n} blocks {} s after the pass",
                DELETE_WAIT.as_secs()
            ));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

impl Results {
    pub fn report(&self, out: &mut Report) {
        let ratio = paired_ratio(&self.raw_gbps, &self.store_gbps);
        out.row(
            "raw O_DIRECT write + unlink, file per block",
            median(&self.raw_gbps),
            "GB/s",
            format!(
                "bound of a full tier's stores: a new file written and an older one deleted per block; median, min {} max {}",
                num(min(&self.raw_gbps)),
                num(max(&self.raw_gbps))
            ),
        );
        out.row(
            "tier store, full tier",
            median(&self.store_gbps),
            "GB/s",
            format!(
                "{}x raw write + unlink (median of paired runs); capacity {} blocks, {} new per pass, {} evictions per store (deletes timed); min {} max {}",
                num(ratio),
                self.capacity_blocks,
                self.blocks,
                num(self.evictions_per_store),
                num(min(&self.store_gbps)),
                num(max(&self.store_gbps))
            ),
        );
        out.field("steady_capacity_blocks", self.capacity_blocks);
        out.field("steady_raw_gbps", median(&self.raw_gbps));
        out.field("steady_store_gbps", median(&self.store_gbps));
        out.field("steady_store_over_raw", ratio);
    }
}
