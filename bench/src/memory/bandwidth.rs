//! Memory backend: store and load bandwidth of large jobs, against a memcpy
//! baseline run with the same number of threads over the same rows, with every
//! byte verified; and how those figures are reported.

use super::prefault;
use super::verify::verify;
use crate::buffer::{anon_huge_bytes, for_each_parallel, rss_bytes, time_parallel, MappedBuf};
use crate::capi::{Config, Tier};
use crate::cli::Settings;
use crate::data::{fill_row, keys, KEY_LEN, NS_BANDWIDTH};
use crate::jobs::{JobIds, Kind, PassStats, Stream};
use crate::progress::Progress;
use crate::report::{gib, mib, num, size, Cmp, Report};
use crate::stats::{dist, max, median, min, percentiles};
use serde_json::json;
use std::path::Path;

pub struct Results {
    pub io_threads: usize,
    pub rows: usize,
    pub bytes_per_pass: u64,
    pub window: usize,
    pub capacity_bytes: u64,
    /// Per repetition, GB/s.
    pub memcpy: Vec<f64>,
    pub store: Vec<f64>,
    pub load: Vec<f64>,
    /// The first store into the fresh tier (arena pages faulted in).
    pub store_cold: f64,
    /// The raw first-touch copy into fresh memory just before it.
    pub first_touch_cold: f64,
    /// Resident memory the cold pass added, and how much of it is huge pages.
    pub cold_rss_added: u64,
    pub cold_huge_added: u64,
    /// Job submit-to-completion times over the steady passes.
    pub store_job_ns: Vec<u64>,
    pub load_job_ns: Vec<u64>,
    pub verified_bytes: u64,
    pub verify_passes: usize,
    /// The first-fill phase (None with --skip-first-fill or --persist-path).
    pub first_fill: Option<prefault::Results>,
    /// The persistent arena's `tier_describe` (None: an anonymous arena).
    pub arena: Option<String>,
}

/// `helper_threads` fill and verify rows (untimed). With `arena_dir`, the
/// tier's arena persists there (`persist_path`).
pub fn run(
    p: &Settings,
    helper_threads: usize,
    arena_dir: Option<&Path>,
) -> Result<Results, String> {
    let block = p.block_bytes;
    let n = (p.data_bytes.div_ceil(block as u64) as usize).max(1);
    let pass_bytes = (n * block) as u64;
    // Source rows 0..n, destination rows n..2n.
    let buf = MappedBuf::new(2 * n * block)?;
    let capacity = ((n + p.job_blocks) * block) as u64;
    let mut cfg = Config::new().map_err(|e| e.to_string())?;
    cfg.set("capacity_bytes", &capacity.to_string())
        .map_err(|e| e.to_string())?;
    // The cold pass measures the fault path itself (the first-fill phase
    // measures what prefault changes); steady state is the same either way.
    cfg.set("prefault", "off").map_err(|e| e.to_string())?;
    if let Some(t) = p.io_threads {
        cfg.set("io_threads", &t.to_string())
            .map_err(|e| e.to_string())?;
    }
    if let Some(dir) = arena_dir {
        cfg.set("persist_path", &dir.to_string_lossy())
            .map_err(|e| e.to_string())?;
        cfg.set("namespace", "kvtier-bench/bandwidth")
            .map_err(|e| e.to_string())?;
    }
    let tier = Tier::new(&cfg, &buf, block).map_err(|e| e.to_string())?;
    let arena = arena_dir.map(|_| tier.describe());
    let stats = tier.stats().map_err(|e| e.to_string())?;
    let io_threads = stats.io_threads as usize;
    let window = p.window.unwrap_or(2 * io_threads).max(1);

    let key_bytes = keys(NS_BANDWIDTH, 0, n);
    let src_rows: Vec<i64> = (0..n as i64).collect();
    let dst_rows: Vec<i64> = (n as i64..2 * n as i64).collect();
    let stream = |kind, rows| Stream {
        kind,
        keys: &key_bytes,
        key_len: KEY_LEN,
        rows,
        job_blocks: p.job_blocks,
        window,
        block_bytes: block,
    };
    let store = stream(Kind::Store, &src_rows);
    let load = stream(Kind::Load, &dst_rows);
    let mut ids = JobIds::default();

    // Fill sources; write destinations once so their pages are resident.
    let helpers = helper_threads;
    let mut prep = Progress::new(p.progress, "bandwidth: fill primary", 2 * pass_bytes);
    for_each_parallel(helpers, 2 * n, |row| {
        // SAFETY: each row goes to one thread; no tier job is in flight.
        let out = unsafe { buf.slice_mut(row * block, block) };
        if row < n {
            fill_row(row as u64, out);
        } else {
            out.fill(0);
        }
        Ok::<(), String>(())
    })?;
    prep.add(2 * pass_bytes);
    prep.finish();

    // Per pass unit: cold store + its verification (load + compare), then
    // per repetition memcpy, store, load and verification.
    let units = 4 + 5 * p.repeat as u64;
    let mut bar = Progress::new(p.progress, "bandwidth: passes", units * pass_bytes);
    let mut verified_bytes = 0;
    let mut verify_passes = 0;

    // The same first touch done raw, into a region kept mapped through the
    // tier's cold pass: both then get pages this process never used (on a VM
    // that hands freed memory back to its host, such a page costs the host's
    // fault too, several times the guest kernel's).
    let (touch_gbps, touched) = prefault::first_touch_copy(
        &buf,
        n,
        block,
        io_threads,
        prefault::arena_huge_pages(block),
    )?;
    bar.add(pass_bytes);
    let (rss0, huge0) = (rss_bytes(), anon_huge_bytes());
    let cold = store.run(&tier, &mut ids, |b| bar.add(b))?;
    let (rss1, huge1) = (rss_bytes(), anon_huge_bytes());
    drop(touched);
    verified_bytes += verify(&tier, &buf, &load, n, block, helpers, &mut ids, &mut bar)?;
    verify_passes += 1;

    let mut r = Results {
        io_threads,
        rows: n,
        bytes_per_pass: pass_bytes,
        window,
        capacity_bytes: stats.capacity_bytes,
        memcpy: Vec::new(),
        store: Vec::new(),
        load: Vec::new(),
        store_cold: cold.gbps(),
        first_touch_cold: touch_gbps,
        cold_rss_added: rss1.saturating_sub(rss0),
        cold_huge_added: huge1.saturating_sub(huge0),
        store_job_ns: Vec::new(),
        load_job_ns: Vec::new(),
        verified_bytes: 0,
        verify_passes: 0,
        first_fill: None,
        arena,
    };
    for _ in 0..p.repeat {
        let secs = memcpy_pass(&buf, n, block, io_threads);
        r.memcpy.push(pass_bytes as f64 / secs / 1e9);
        bar.add(pass_bytes);

        // Dropping the blocks keeps their slots' pages resident for the next store.
        tier.clear().map_err(|e| e.to_string())?;
        let s: PassStats = store.run(&tier, &mut ids, |b| bar.add(b))?;
        r.store.push(s.gbps());
        r.store_job_ns.extend(s.job_ns);

        let l = load.run(&tier, &mut ids, |b| bar.add(b))?;
        r.load.push(l.gbps());
        r.load_job_ns.extend(l.job_ns);

        verified_bytes += verify(&tier, &buf, &load, n, block, helpers, &mut ids, &mut bar)?;
        verify_passes += 1;
    }
    bar.finish();
    r.verified_bytes = verified_bytes;
    r.verify_passes = verify_passes;
    let after = tier.stats().map_err(|e| e.to_string())?;
    if !p.skip_first_fill && arena_dir.is_none() {
        // Not beside a resident 2 GiB arena it has no use for.
        drop(tier);
        let setup = prefault::Setup {
            buf: &buf,
            store: &store,
            load: &load,
            rows: n,
            block,
            capacity,
            io_threads,
            helpers,
        };
        r.first_fill = Some(prefault::run(p, &setup)?);
        return check_counters(after).map(|()| r);
    }
    check_counters(after)?;
    Ok(r)
}

fn check_counters(after: kvtier::ffi::tier_stats_t) -> Result<(), String> {
    if after.stores_failed != 0 || after.loads_failed != 0 || after.evictions != 0 {
        return Err(format!(
            "tier counters after the bandwidth runs: {} stores failed, {} loads failed, {} evictions (expected none)",
            after.stores_failed, after.loads_failed, after.evictions
        ));
    }
    Ok(())
}

/// Copies every source row to its destination row with `threads` threads, each
/// `copy_nonoverlapping` one block at a time; returns seconds from the first
/// thread's start to the last one's end.
fn memcpy_pass(buf: &MappedBuf, n: usize, block: usize, threads: usize) -> f64 {
    time_parallel(threads, n, |i| {
        // SAFETY: rows i and n + i are distinct, in bounds, and taken by one
        // thread; no tier job is in flight.
        unsafe {
            std::ptr::copy_nonoverlapping(
                buf.as_ptr().add(i * block),
                buf.as_ptr().add((n + i) * block),
                block,
            );
        }
        Ok::<(), ()>(())
    })
    .expect("a copy cannot fail")
}

impl Results {
    /// The memcpy baseline, the cold and steady store/load rows with their
    /// targets, job latencies, and the `bandwidth` JSON object.
    pub fn report(&self, s: &Settings, out: &mut Report) {
        let memcpy = median(&self.memcpy);
        let reps = self.memcpy.len();
        out.line(
            "bandwidth",
            format!(
                "{} blocks, {}-block jobs, {} jobs in flight, {} per direction per repetition, {} repetitions; GB = 10^9 bytes",
                size(s.block_bytes),
                s.job_blocks,
                self.window,
                gib(self.bytes_per_pass),
                self.store.len()
            ),
        );
        if let Some(arena) = &self.arena {
            out.line("arena", format!("persistent (--persist-path): {arena}"));
        }
        out.row(
            format!("memcpy, {} threads (baseline)", self.io_threads),
            memcpy,
            "GB/s",
            format!(
                "median of {reps}; min {} max {}",
                num(min(&self.memcpy)),
                num(max(&self.memcpy))
            ),
        );
        out.row(
            format!(
                "first-touch memcpy into fresh memory, {} threads",
                self.io_threads
            ),
            self.first_touch_cold,
            "GB/s",
            format!(
                "raw, pages this process never used, the arena's page policy; {}x memcpy",
                num(self.first_touch_cold / memcpy)
            ),
        );
        out.row(
            if self.arena.is_some() {
                "store, first pass (new arena file: each slot allocated, prefault=off)"
            } else {
                "store, first pass (cold arena, prefault=off)"
            },
            self.store_cold,
            "GB/s",
            format!(
                "{}x first-touch memcpy, {}x memcpy; faults in {} of arena ({} as huge pages)",
                num(self.store_cold / self.first_touch_cold),
                num(self.store_cold / memcpy),
                mib(self.cold_rss_added as f64),
                mib(self.cold_huge_added as f64)
            ),
        );
        // The persistent arena's target is the (56): 0.9x memcpy.
        let bound = if self.arena.is_some() { 0.9 } else { 0.85 };
        for (name, v) in [("store", &self.store), ("load", &self.load)] {
            let m = median(v);
            out.row(
                format!("{name}, steady state"),
                m,
                "GB/s",
                format!(
                    "{}x memcpy; median of {reps}; min {} max {}",
                    num(m / memcpy),
                    num(min(v)),
                    num(max(v))
                ),
            )
            .target(
                format!("{name} >= {bound}x memcpy (same thread count)"),
                m / memcpy,
                Cmp::AtLeast,
                bound,
            );
        }
        for (name, v) in [("store", &self.store_job_ns), ("load", &self.load_job_ns)] {
            let p = percentiles(v);
            out.row(
                format!(
                    "{name} job latency, {} x {}",
                    s.job_blocks,
                    size(s.block_bytes)
                ),
                p.median as f64 / 1e6,
                "ms",
                format!(
                    "median; p99 {} ms; {} jobs in flight",
                    num(p.p99 as f64 / 1e6),
                    self.window
                ),
            );
        }
        let ratios =
            |v: &[f64]| -> Vec<f64> { v.iter().zip(&self.memcpy).map(|(x, m)| x / m).collect() };
        out.field(
            "bandwidth",
            json!({
                "unit": "GB/s (10^9 bytes per second)",
                "block_bytes": s.block_bytes,
                "job_blocks": s.job_blocks,
                "jobs_in_flight": self.window,
                "bytes_per_direction": self.bytes_per_pass,
                "blocks_per_direction": self.rows,
                "repetitions": self.store.len(),
                "tier_capacity_bytes": self.capacity_bytes,
                "memcpy_threads": self.io_threads,
                "memcpy": dist(&self.memcpy),
                "store_cold_first_pass": self.store_cold,
                "store_cold_ratio": self.store_cold / memcpy,
                "first_touch_copy_cold": self.first_touch_cold,
                "store_cold_over_first_touch_copy": self.store_cold / self.first_touch_cold,
                "store_cold_rss_added_bytes": self.cold_rss_added,
                "store_cold_huge_pages_added_bytes": self.cold_huge_added,
                "store": dist(&self.store),
                "load": dist(&self.load),
                "store_ratio": median(&self.store) / memcpy,
                "load_ratio": median(&self.load) / memcpy,
                "store_ratio_per_repetition": ratios(&self.store),
                "load_ratio_per_repetition": ratios(&self.load),
                "store_job_latency_ns": percentiles(&self.store_job_ns),
                "load_job_latency_ns": percentiles(&self.load_job_ns),
                "verified_bytes": self.verified_bytes,
                "persistent_arena": self.arena,
            }),
        );
        out.verified(format!(
            "{} in {} load-and-compare passes",
            gib(self.verified_bytes),
            self.verify_passes
        ));
        if let Some(first_fill) = &self.first_fill {
            first_fill.report(memcpy, out);
        }
    }
}
