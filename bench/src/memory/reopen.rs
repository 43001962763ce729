//! Memory backend with `--persist-path`: a persistent arena of
//! `--reopen-gib` is filled, freed and reopened `--repeat` times. Measured:
//! how long `tier_new` takes to find every block (the reopen), the first
//! lookup of every key, and the first load of every block after the reopen
//! (each checksummed as it is read for the first time, through a mapping
//! whose pages are not yet in this process's page tables). Every block is
//! loaded back and compared byte for byte after the first reopen.

use crate::buffer::{for_each_parallel, MappedBuf};
use crate::capi::{Config, Tier, TIER_HIT};
use crate::cli::Settings;
use crate::data::{check_row, fill_row, keys, KEY_LEN, NS_REOPEN};
use crate::jobs::{JobIds, Kind, Stream};
use crate::progress::Progress;
use crate::report::{gib, num, Cmp, Report};
use crate::stats::{dist, max, median, min};
use serde_json::json;
use std::path::Path;
use std::time::Instant;

/// Source rows, and as many destination rows.
const ROWS: usize = 64;

pub struct Results {
    pub io_threads: usize,
    pub arena_bytes: u64,
    pub blocks: usize,
    /// Filling, with the generation of each block's distinct contents.
    pub fill_gbps: f64,
    pub reopen_secs: Vec<f64>,
    pub lookup_ns_per_key: Vec<f64>,
    pub first_load_gbps: Vec<f64>,
    pub verified_bytes: u64,
    pub describe: String,
}

pub fn run(s: &Settings, helpers: usize, dir: &Path) -> Result<Results, String> {
    let block = s.block_bytes;
    let n = (s.reopen_bytes / block as u64).max(1) as usize;
    let rows = ROWS.min(n);
    let buf = MappedBuf::new(2 * rows * block)?;
    let mut cfg = Config::new().map_err(|e| e.to_string())?;
    let set = |cfg: &mut Config, k: &str, v: &str| cfg.set(k, v).map_err(|e| e.to_string());
    set(&mut cfg, "capacity_bytes", &(n * block).to_string())?;
    set(&mut cfg, "persist_path", &dir.to_string_lossy())?;
    set(&mut cfg, "namespace", "kvtier-bench/reopen")?;
    set(&mut cfg, "prefault", "off")?;
    if let Some(t) = s.io_threads {
        set(&mut cfg, "io_threads", &t.to_string())?;
    }
    let key_bytes = keys(NS_REOPEN, 0, n);
    let tier = Tier::new(&cfg, &buf, block).map_err(|e| e.to_string())?;
    let io_threads = tier.stats().map_err(|e| e.to_string())?.io_threads as usize;
    let window = s
        .window
        .unwrap_or(2 * io_threads)
        .clamp(1, rows / s.job_blocks.min(rows));
    let stream = |kind, keys, rows| Stream {
        kind,
        keys,
        key_len: KEY_LEN,
        rows,
        job_blocks: s.job_blocks,
        window,
        block_bytes: block,
    };
    let mut ids = JobIds::default();

    // Fill: each block its own contents (fill_row of its key's number),
    // `rows` at a time.
    let arena_bytes = (n * block) as u64;
    let mut bar = Progress::new(s.progress, "reopen: fill the arena", arena_bytes);
    let src_rows: Vec<i64> = (0..rows as i64).collect();
    let started = Instant::now();
    for first in (0..n).step_by(rows) {
        let count = rows.min(n - first);
        for_each_parallel(helpers, count, |r| {
            // SAFETY: one thread per row; no job is in flight.
            fill_row((first + r) as u64, unsafe {
                buf.slice_mut(r * block, block)
            });
            Ok::<(), String>(())
        })?;
        let keys = &key_bytes[first * KEY_LEN..(first + count) * KEY_LEN];
        stream(Kind::Store, keys, &src_rows[..count]).run(&tier, &mut ids, |b| bar.add(b))?;
    }
    let fill_gbps = arena_bytes as f64 / started.elapsed().as_secs_f64() / 1e9;
    bar.finish();
    drop(tier);

    let dst_rows: Vec<i64> = (0..n).map(|i| (rows + i % rows) as i64).collect();
    let mut r = Results {
        io_threads,
        arena_bytes,
        blocks: n,
        fill_gbps,
        reopen_secs: Vec::new(),
        lookup_ns_per_key: Vec::new(),
        first_load_gbps: Vec::new(),
        verified_bytes: 0,
        describe: String::new(),
    };
    let mut bar = Progress::new(
        s.progress,
        "reopen: reopen, look up, load",
        (s.repeat as u64 + 1) * arena_bytes,
    );
    let mut states = [0u8; 64];
    for rep in 0..s.repeat {
        let started = Instant::now();
        let tier = Tier::new(&cfg, &buf, block).map_err(|e| e.to_string())?;
        r.reopen_secs.push(started.elapsed().as_secs_f64());
        let found = tier.stats().map_err(|e| e.to_string())?.num_blocks;
        if found != n as u64 {
            return Err(format!("reopen found {found} of {n} blocks"));
        }
        let started = Instant::now();
        for chunk in key_bytes.chunks(64 * KEY_LEN) {
            let out = &mut states[..chunk.len() / KEY_LEN];
            tier.lookup(chunk, KEY_LEN, out)
                .map_err(|e| e.to_string())?;
            if out.iter().any(|&st| st != TIER_HIT) {
                return Err("a block of the reopened arena did not look up HIT".into());
            }
        }
        r.lookup_ns_per_key
            .push(started.elapsed().as_secs_f64() * 1e9 / n as f64);
        let l = stream(Kind::Load, &key_bytes, &dst_rows).run(&tier, &mut ids, |b| bar.add(b))?;
        r.first_load_gbps.push(l.gbps());
        if rep == 0 {
            r.describe = tier.describe();
            r.verified_bytes = verify(&tier, &buf, &key_bytes, n, rows, block, helpers, &mut ids)?;
            bar.add(arena_bytes);
        }
    }
    bar.finish();
    Ok(r)
}

/// Loads every block, `rows` at a time, and compares it with what was stored.
#[allow(clippy::too_many_arguments)]
fn verify(
    tier: &Tier,
    buf: &MappedBuf,
    key_bytes: &[u8],
    n: usize,
    rows: usize,
    block: usize,
    helpers: usize,
    ids: &mut JobIds,
) -> Result<u64, String> {
    let dst: Vec<i64> = (rows as i64..2 * rows as i64).collect();
    for first in (0..n).step_by(rows) {
        let count = rows.min(n - first);
        let load = Stream {
            kind: Kind::Load,
            keys: &key_bytes[first * KEY_LEN..(first + count) * KEY_LEN],
            key_len: KEY_LEN,
            rows: &dst[..count],
            job_blocks: count,
            window: 1,
            block_bytes: block,
        };
        load.run(tier, ids, |_| {})?;
        for_each_parallel(helpers, count, |r| {
            // SAFETY: the load into this row was polled.
            let row = unsafe { buf.slice((rows + r) * block, block) };
            match check_row((first + r) as u64, row) {
                None => Ok(()),
                Some(at) => Err(format!(
                    "reopen: block {} differs from what was stored at byte {at}",
                    first + r
                )),
            }
        })?;
    }
    Ok((n * block) as u64)
}

impl Results {
    pub fn report(&self, out: &mut Report) {
        let reps = self.reopen_secs.len();
        out.line(
            "reopen",
            format!(
                "a persistent arena of {} ({} blocks), filled at {} GB/s (untimed: with the \
                 generation of each block's contents), freed and reopened {reps} times: {}",
                gib(self.arena_bytes),
                self.blocks,
                num(self.fill_gbps),
                self.describe
            ),
        );
        let secs = median(&self.reopen_secs);
        out.row(
            format!(
                "reopen (tier_new) of a full {} arena",
                gib(self.arena_bytes)
            ),
            secs * 1e3,
            "ms",
            format!(
                "median of {reps}; min {} max {} ms; every block found",
                num(min(&self.reopen_secs) * 1e3),
                num(max(&self.reopen_secs) * 1e3)
            ),
        )
        .target("reopen < 1 s", secs, Cmp::Below, 1.0);
        out.row(
            "first lookup of every key after the reopen",
            median(&self.lookup_ns_per_key),
            "ns/key",
            format!("median of {reps}; 64-key batches"),
        );
        out.row(
            "first loads after the reopen (each block checksummed once)",
            median(&self.first_load_gbps),
            "GB/s",
            format!(
                "median of {reps}; min {} max {}; pages not yet in this process's page tables",
                num(min(&self.first_load_gbps)),
                num(max(&self.first_load_gbps))
            ),
        );
        out.field(
            "reopen",
            json!({
                "arena_bytes": self.arena_bytes,
                "blocks": self.blocks,
                "fill_gbps_untimed": self.fill_gbps,
                "reopen_secs": dist(&self.reopen_secs),
                "lookup_ns_per_key": dist(&self.lookup_ns_per_key),
                "first_load_gbps": dist(&self.first_load_gbps),
                "verified_bytes": self.verified_bytes,
                "describe": self.describe,
            }),
        );
        out.verified(format!(
            "{} reloaded after a reopen",
            gib(self.verified_bytes)
        ));
    }
}
