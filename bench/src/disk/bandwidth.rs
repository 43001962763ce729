//! Disk backend, bandwidth: large blocks stored and loaded by the tier against
//! raw O_DIRECT file-per-block writes and reads by as many threads, passes
//! alternating (ABBA) in one run; and how those figures are reported.

use super::files::{fresh_dir, read_file, remove_block_files, write_file};
use super::shared::{config, Primary};
use super::{Params, NS_BANDWIDTH};
use crate::buffer::time_parallel;
use crate::data::keys;
use crate::jobs::{JobIds, Kind};
use crate::primary::verify_all;
use crate::progress::Progress;
use crate::report::{num, size, Cmp, Report};
use crate::stats::{max, median, min, paired_ratio};

pub struct Results {
    pub describe: String,
    pub blocks: usize,
    /// GB/s per repetition; raw and tier entries of one index ran side by side.
    pub raw_write_gbps: Vec<f64>,
    pub raw_read_gbps: Vec<f64>,
    pub store_gbps: Vec<f64>,
    pub load_gbps: Vec<f64>,
    pub verified_bytes: u64,
}

pub fn run(p: &Params) -> Result<Results, String> {
    let block = p.block_bytes;
    let n = (p.data_bytes as usize).div_ceil(block).max(p.job_blocks);
    // Source rows (cycled) and as many destination rows.
    let primary = Primary::new(n.min(256), block)?;
    let rows = primary.rows;
    let src = primary.sources(n);
    let dst = primary.destinations(n);
    let key_bytes = keys(NS_BANDWIDTH, 0, n);
    let mut ids = JobIds::default();
    let mut progress = Progress::new(p.progress, "disk bandwidth", (p.repeat * 4 * n) as u64);
    let tier_dir = p.dir.join("bandwidth");
    let cfg = config(
        &tier_dir,
        p.io_threads,
        (n as u64 + 64) * (block as u64 + 4096),
        true,
        p.io_timeout_ms,
    )?;
    let mut r = Results {
        describe: String::new(),
        blocks: n,
        raw_write_gbps: Vec::new(),
        raw_read_gbps: Vec::new(),
        store_gbps: Vec::new(),
        load_gbps: Vec::new(),
        verified_bytes: 0,
    };
    let gbps = |secs: f64| (n * block) as f64 / secs / 1e9;
    for rep in 0..p.repeat {
        // Each repetition opens the tier on the same prepared directory,
        // emptied of the previous repetition's blocks. The disk slows down as
        // data accumulates, so raw and tier passes swap order every repetition.
        let tier = primary.tier(&cfg)?;
        r.describe = tier.describe();
        let raw_dir = p.dir.join(format!("raw-{rep}"));
        fresh_dir(&raw_dir)?;
        let raw_first = rep % 2 == 0;
        // Stores and raw writes, then loads and raw reads, in this
        // repetition's order.
        let directions = [
            (Kind::Store, &src, &mut r.store_gbps, &mut r.raw_write_gbps),
            (Kind::Load, &dst, &mut r.load_gbps, &mut r.raw_read_gbps),
        ];
        for (kind, tier_rows, tier_gbps, raw_gbps) in directions {
            for tier_turn in [!raw_first, raw_first] {
                if tier_turn {
                    let pass = primary
                        .stream(kind, &key_bytes, tier_rows, p.job_blocks, p.window)
                        .run(&tier, &mut ids, |_| {})?;
                    tier_gbps.push(pass.gbps());
                } else {
                    let secs = time_parallel(p.io_threads, n, |i| {
                        let path = raw_dir.join(format!("{i}.blk"));
                        match kind {
                            Kind::Store => write_file(&path, primary.row(i % rows), None),
                            // Reads land in destination rows; several threads
                            // may share one, which is fine for a bound (the
                            // bytes are not checked).
                            Kind::Load => read_file(&path, primary.row(rows + i % rows)),
                        }
                    })?;
                    raw_gbps.push(gbps(secs));
                }
                progress.add(n as u64);
            }
        }
        if rep == 0 {
            r.verified_bytes +=
                verify_all(&tier, &primary, &key_bytes, p.job_blocks, &mut ids, "disk")?;
        }
        drop(tier);
        remove_block_files(&tier_dir)?;
        let _ = std::fs::remove_dir_all(&raw_dir);
    }
    progress.finish();
    let _ = std::fs::remove_dir_all(&tier_dir);
    Ok(r)
}

impl Results {
    /// The raw bounds, the tier's store and load with their >= 0.95x targets
    /// (median of the paired ratios), and the bandwidth JSON keys.
    pub fn report(&self, p: &Params, out: &mut Report) {
        out.line("tier", self.describe.clone());
        out.line(
            "bandwidth",
            format!(
                "{} blocks of {}, {}-block jobs, {} in flight, {} repetitions, raw and tier passes alternating; page cache bypassed (O_DIRECT) on both sides; GB = 10^9 bytes",
                self.blocks,
                size(p.block_bytes),
                p.job_blocks,
                p.window,
                p.repeat
            ),
        );
        out.line(
            "steady state",
            "fan-out directories prepared (prepare_dirs=true) unless noted".into(),
        );
        let store_ratio = paired_ratio(&self.raw_write_gbps, &self.store_gbps);
        let load_ratio = paired_ratio(&self.raw_read_gbps, &self.load_gbps);
        for (op, raw, name, tier, ratio) in [
            (
                "write",
                &self.raw_write_gbps,
                "store",
                &self.store_gbps,
                store_ratio,
            ),
            (
                "read",
                &self.raw_read_gbps,
                "load",
                &self.load_gbps,
                load_ratio,
            ),
        ] {
            out.row(
                format!("raw O_DIRECT {op}, file per block"),
                median(raw),
                "GB/s",
                format!("bound; median, min {} max {}", num(min(raw)), num(max(raw))),
            );
            out.row(
                format!("tier {name}"),
                median(tier),
                "GB/s",
                format!(
                    "{}x raw {op} (median of paired runs); min {} max {}",
                    num(ratio),
                    num(min(tier)),
                    num(max(tier))
                ),
            )
            .target(
                format!("{name} >= 0.95x raw O_DIRECT {op}s"),
                ratio,
                Cmp::AtLeast,
                0.95,
            );
        }
        out.field("describe", &self.describe);
        out.field("blocks", self.blocks);
        out.field("block_bytes", p.block_bytes);
        out.field("job_blocks", p.job_blocks);
        out.field("repeat", p.repeat);
        out.field("raw_write_gbps", median(&self.raw_write_gbps));
        out.field("store_gbps", median(&self.store_gbps));
        out.field("store_over_raw", store_ratio);
        out.field("raw_read_gbps", median(&self.raw_read_gbps));
        out.field("load_gbps", median(&self.load_gbps));
        out.field("load_over_raw", load_ratio);
    }
}
