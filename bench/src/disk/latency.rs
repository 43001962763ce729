//! Disk backend, 4 KiB round trips: one block per job, one job at a time,
//! against the raw create-write-rename and open-read sequences, interleaved so
//! both see the same machine; and how those figures are reported.

use super::files::{fresh_dir, read_file, write_file};
use super::shared::{config, one_result, Primary};
use super::{Params, NS_LATENCY};
use crate::capi::Tier;
use crate::data::{check_row, fill_row, write_key, KEY_LEN};
use crate::jobs::{JobIds, Kind};
use crate::progress::Progress;
use crate::report::{num, Cmp, Report};
use crate::stats::percentile;
use std::time::Instant;

const B: usize = 4096;
/// Raw and tier alternate in batches, so both see the same machine state
/// while each runs back to back, as an engine's stream of jobs would.
const BATCH: usize = 50;
/// The tier's fan-out, which the raw bound copies.
const FANS: u64 = 256;

/// Nanoseconds per operation, warm-up excluded.
#[derive(Default)]
pub struct Results {
    pub raw_store_ns: Vec<u64>,
    pub raw_store_flat_ns: Vec<u64>,
    pub raw_load_ns: Vec<u64>,
    pub store_ns: Vec<u64>,
    pub load_ns: Vec<u64>,
    pub verified_bytes: u64,
}

/// The fan-out directory of block `i`: spread like the tier's.
fn fan(i: usize) -> String {
    format!(
        "{:02x}",
        (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 56
    )
}

pub fn run(p: &Params) -> Result<Results, String> {
    // Row 0: store source; row 1: tier load destination; row 2: raw reads.
    let primary = Primary::new(2, B)?;
    let tier_dir = p.dir.join("lat-tier");
    // The raw bound does the same file operations in the same shape of
    // directory tree as the tier: 256 fan-out directories, prepared like the
    // tier's (a single directory is faster on ext4: its renames share
    // directory blocks; that figure is reported beside it).
    let raw_dir = p.dir.join("lat-raw");
    fresh_dir(&raw_dir)?;
    for f in 0..FANS {
        std::fs::create_dir(raw_dir.join(format!("{f:02x}"))).map_err(|e| e.to_string())?;
    }
    let flat_dir = p.dir.join("lat-raw-flat");
    fresh_dir(&flat_dir)?;
    let cfg = config(
        &tier_dir,
        p.io_threads,
        ((p.latency_iters * 2 + 64) * (B + 4096)) as u64,
        true,
        p.io_timeout_ms,
    )?;
    let tier = primary.tier(&cfg)?;
    let warmup = p.latency_iters / 5;
    let total = warmup + p.latency_iters;
    let mut progress = Progress::new(p.progress, "disk 4 KiB latency", 2 * total as u64);
    let mut ids = JobIds::default();
    let mut r = Results::default();
    let timed = |i: usize, samples: &mut Vec<u64>, op: &mut dyn FnMut() -> Result<(), String>| {
        let t = Instant::now();
        op()?;
        if i >= warmup {
            samples.push(t.elapsed().as_nanos() as u64);
        }
        Ok::<(), String>(())
    };
    for batch in (0..total).step_by(BATCH) {
        let range = batch..(batch + BATCH).min(total);
        for i in range.clone() {
            fill_row(i as u64, primary.row(0));
            for (dir, samples) in [
                (raw_dir.join(fan(i)), &mut r.raw_store_ns),
                (flat_dir.clone(), &mut r.raw_store_flat_ns),
            ] {
                let (path, tmp) = (
                    dir.join(format!("{i}.blk")),
                    dir.join(format!("{i}.blk.tmp")),
                );
                timed(i, samples, &mut || {
                    write_file(&path, primary.row(0), Some(&tmp))
                })?;
            }
        }
        for i in range {
            fill_row(i as u64, primary.row(0));
            let key = key(i);
            timed(i, &mut r.store_ns, &mut || {
                round_trip(&tier, ids.next(), &key, Kind::Store)
            })?;
            progress.add(1);
        }
    }
    for batch in (0..total).step_by(BATCH) {
        let range = batch..(batch + BATCH).min(total);
        for i in range.clone() {
            let path = raw_dir.join(fan(i)).join(format!("{i}.blk"));
            timed(i, &mut r.raw_load_ns, &mut || {
                read_file(&path, primary.row(2))
            })?;
        }
        for i in range {
            let key = key(i);
            timed(i, &mut r.load_ns, &mut || {
                round_trip(&tier, ids.next(), &key, Kind::Load)
            })?;
            if let Some(at) = check_row(i as u64, primary.row(1)) {
                return Err(format!("4 KiB load of key {i} differs at byte {at}"));
            }
            r.verified_bytes += B as u64;
            progress.add(1);
        }
    }
    progress.finish();
    drop(tier);
    let _ = std::fs::remove_dir_all(&tier_dir);
    let _ = std::fs::remove_dir_all(&raw_dir);
    let _ = std::fs::remove_dir_all(&flat_dir);
    Ok(r)
}

fn key(i: usize) -> [u8; KEY_LEN] {
    let mut key = [0u8; KEY_LEN];
    write_key(NS_LATENCY, i as u64, &mut key);
    key
}

/// `key` stored from row 0 or loaded into row 1, spin-polled.
fn round_trip(tier: &Tier, id: u64, key: &[u8], kind: Kind) -> Result<(), String> {
    let row = match kind {
        Kind::Store => 0,
        Kind::Load => 1,
    };
    tier.submit(kind, id, key, KEY_LEN, &[row])
        .map_err(|e| e.to_string())?;
    let res = one_result(tier, true)?;
    if res.status != 0 {
        return Err(format!(
            "4 KiB {} failed: status {}",
            kind.name(),
            res.status
        ));
    }
    Ok(())
}

impl Results {
    /// Raw bounds and tier round trips (with their <= 1.5x targets), and the
    /// 4 KiB JSON keys.
    pub fn report(&self, out: &mut Report) {
        let us = |v: &[u64], q: f64| percentile(v, q) as f64 / 1e3;
        let (raw_store, store) = (us(&self.raw_store_ns, 0.5), us(&self.store_ns, 0.5));
        let (raw_load, load) = (us(&self.raw_load_ns, 0.5), us(&self.load_ns, 0.5));
        out.row(
            "raw 4 KiB create+write+rename",
            raw_store,
            "us",
            format!(
                "median, 256 fan-out dirs; p99 {} us; one dir: {} us",
                num(us(&self.raw_store_ns, 0.99)),
                num(us(&self.raw_store_flat_ns, 0.5))
            ),
        );
        out.row(
            "tier 4 KiB store round trip",
            store,
            "us",
            format!(
                "{}x raw; p99 {} us",
                num(store / raw_store),
                num(us(&self.store_ns, 0.99))
            ),
        )
        .target(
            "4 KiB store round trip <= 1.5x raw create+write+rename",
            store / raw_store,
            Cmp::AtMost,
            1.5,
        );
        out.row(
            "raw 4 KiB open+read",
            raw_load,
            "us",
            format!(
                "median, 256 fan-out dirs; p99 {} us",
                num(us(&self.raw_load_ns, 0.99))
            ),
        );
        out.row(
            "tier 4 KiB load round trip",
            load,
            "us",
            format!(
                "{}x raw; p99 {} us",
                num(load / raw_load),
                num(us(&self.load_ns, 0.99))
            ),
        )
        .target(
            "4 KiB load round trip <= 1.5x raw open+read",
            load / raw_load,
            Cmp::AtMost,
            1.5,
        );
        let q = percentile;
        out.field("raw_store_4k_ns_p50", q(&self.raw_store_ns, 0.5));
        out.field("store_4k_ns_p50", q(&self.store_ns, 0.5));
        out.field("store_4k_ns_p99", q(&self.store_ns, 0.99));
        out.field("raw_load_4k_ns_p50", q(&self.raw_load_ns, 0.5));
        out.field("load_4k_ns_p50", q(&self.load_ns, 0.5));
        out.field("load_4k_ns_p99", q(&self.load_ns, 0.99));
    }
}
