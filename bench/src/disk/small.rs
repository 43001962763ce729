//! Disk backend, small blocks: 64 KiB blocks in 16-block jobs, several in
//! flight, in blocks per second against raw create+write+rename and open+read
//! by as many threads; then lookups against the resident blocks. And how
//! those figures are reported.

use super::files::{fresh_dir, read_file, write_file};
use super::shared::{config, Primary};
use super::{Params, NS_SMALL};
use crate::buffer::time_parallel;
use crate::capi::TIER_HIT;
use crate::data::{keys, KEY_LEN};
use crate::jobs::{JobIds, Kind};
use crate::report::{num, Report};
use crate::stats::median;
use std::time::Instant;

const B: usize = 64 << 10;
/// 4 jobs of 16 in flight: 64 destination rows keep every load's rows its own.
const ROWS: usize = 64;
const JOB_BLOCKS: usize = 16;
const WINDOW: usize = 4;
/// Keys per lookup call.
const LOOKUP_BATCH: usize = 64;

pub struct Results {
    pub blocks: usize,
    pub store_blocks_per_s: f64,
    /// Into a new directory: stores create the fan-out directories as they go.
    pub store_cold_blocks_per_s: f64,
    pub load_blocks_per_s: f64,
    pub raw_store_blocks_per_s: f64,
    pub raw_load_blocks_per_s: f64,
    pub lookup_ns_per_key: f64,
    pub lookup_resident: u64,
}

pub fn run(p: &Params) -> Result<Results, String> {
    let n = p.small_blocks;
    let primary = Primary::new(ROWS, B)?;
    let key_bytes = keys(NS_SMALL, 0, n);
    let src = primary.sources(n);
    let dst = primary.destinations(n);
    let mut ids = JobIds::default();
    // Raw: the same files, written by as many threads as the tier has.
    let raw_dir = p.dir.join("small-raw");
    fresh_dir(&raw_dir)?;
    let secs = time_parallel(p.io_threads, n, |i| {
        let path = raw_dir.join(format!("{i}.blk"));
        let tmp = raw_dir.join(format!("{i}.tmp"));
        write_file(&path, primary.row(i % ROWS), Some(&tmp))
    })?;
    let raw_store_blocks_per_s = n as f64 / secs;
    let secs = time_parallel(p.io_threads, n, |i| {
        read_file(
            &raw_dir.join(format!("{i}.blk")),
            primary.row(ROWS + i % ROWS),
        )
    })?;
    let raw_load_blocks_per_s = n as f64 / secs;
    let _ = std::fs::remove_dir_all(&raw_dir);
    let capacity = ((n + 64) * (B + 4096)) as u64;
    let blocks_per_s = |secs: f64| n as f64 / secs;
    // A new directory: stores create the 256 fan-out directories as
    // they go (the raw bound writes into one existing directory).
    let store_cold_blocks_per_s = {
        let cold_dir = p.dir.join("small-cold");
        let tier = primary.tier(&config(
            &cold_dir,
            p.io_threads,
            capacity,
            false,
            p.io_timeout_ms,
        )?)?;
        let stored = primary
            .stream(Kind::Store, &key_bytes, &src, JOB_BLOCKS, WINDOW)
            .run(&tier, &mut ids, |_| {})?;
        drop(tier);
        let _ = std::fs::remove_dir_all(&cold_dir);
        blocks_per_s(stored.secs)
    };
    let dir = p.dir.join("small");
    let tier = primary.tier(&config(
        &dir,
        p.io_threads,
        capacity,
        true,
        p.io_timeout_ms,
    )?)?;
    let stored = primary
        .stream(Kind::Store, &key_bytes, &src, JOB_BLOCKS, WINDOW)
        .run(&tier, &mut ids, |_| {})?;
    let loaded = primary
        .stream(Kind::Load, &key_bytes, &dst, JOB_BLOCKS, WINDOW)
        .run(&tier, &mut ids, |_| {})?;

    // Lookups: every key is answered HIT in the same call, from the index.
    let mut states = [0u8; LOOKUP_BATCH];
    let mut runs = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        let mut done = 0usize;
        for chunk in key_bytes.chunks(LOOKUP_BATCH * KEY_LEN).cycle().take(2000) {
            let k = chunk.len() / KEY_LEN;
            tier.lookup(chunk, KEY_LEN, &mut states[..k])
                .map_err(|e| e.to_string())?;
            if states[..k].iter().any(|&s| s != TIER_HIT) {
                return Err("a disk lookup did not answer HIT in the same call".into());
            }
            done += k;
        }
        runs.push(t.elapsed().as_nanos() as f64 / done as f64);
    }
    let lookup_resident = tier.stats().map_err(|e| e.to_string())?.num_blocks;
    drop(tier);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(Results {
        blocks: n,
        store_blocks_per_s: blocks_per_s(stored.secs),
        store_cold_blocks_per_s,
        load_blocks_per_s: blocks_per_s(loaded.secs),
        raw_store_blocks_per_s,
        raw_load_blocks_per_s,
        lookup_ns_per_key: median(&runs),
        lookup_resident,
    })
}

impl Results {
    /// Blocks per second beside the raw figures, the lookup cost, and their
    /// JSON keys.
    pub fn report(&self, out: &mut Report) {
        out.row(
            "64 KiB blocks, 16-block jobs, store",
            self.store_blocks_per_s,
            "blocks/s",
            format!(
                "{}x raw create+write+rename ({:.0}/s); {:.0}/s in a new directory",
                num(self.store_blocks_per_s / self.raw_store_blocks_per_s),
                self.raw_store_blocks_per_s,
                self.store_cold_blocks_per_s
            ),
        );
        out.row(
            "64 KiB blocks, 16-block jobs, load",
            self.load_blocks_per_s,
            "blocks/s",
            format!(
                "{}x raw open+read ({:.0}/s); {} blocks",
                num(self.load_blocks_per_s / self.raw_load_blocks_per_s),
                self.raw_load_blocks_per_s,
                self.blocks
            ),
        );
        out.row(
            "lookup, non-shared",
            self.lookup_ns_per_key,
            "ns/key",
            format!(
                "batches of {LOOKUP_BATCH}, {} resident, answered in the same call",
                self.lookup_resident
            ),
        );
        out.field("small_store_blocks_per_s", self.store_blocks_per_s);
        out.field(
            "small_store_cold_blocks_per_s",
            self.store_cold_blocks_per_s,
        );
        out.field("small_load_blocks_per_s", self.load_blocks_per_s);
        out.field("raw_small_store_blocks_per_s", self.raw_store_blocks_per_s);
        out.field("raw_small_load_blocks_per_s", self.raw_load_blocks_per_s);
        out.field("lookup_ns_per_key", self.lookup_ns_per_key);
    }
}
