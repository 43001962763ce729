//! Disk backend, restart recovery: store many 4 KiB blocks, close the tier,
//! drop the page cache if allowed, and time reopening the directory; a sample
//! of the recovered blocks is loaded back byte-exact. And how it is reported.

use super::files::drop_caches;
use super::shared::{config, one_result, Primary};
use super::{Params, NS_RECOVERY};
use crate::data::{check_row, keys, KEY_LEN};
use crate::jobs::{JobIds, Kind};
use crate::progress::Progress;
use crate::report::Report;
use std::time::Instant;

const B: usize = 4096;
const ROWS: usize = 64;
/// One recovered block in this many is loaded and compared.
const SAMPLE: usize = 64;

pub struct Results {
    pub blocks: u64,
    pub secs: f64,
    /// The page cache was dropped before the reopen (needs root).
    pub cold: bool,
    pub verified_bytes: u64,
}

pub fn run(p: &Params) -> Result<Results, String> {
    let n = p.recovery_blocks;
    let primary = Primary::new(ROWS, B)?;
    let dir = p.dir.join("recovery");
    let capacity = ((n + 64) * B) as u64;
    let key_bytes = keys(NS_RECOVERY, 0, n);
    let src = primary.sources(n);
    let mut ids = JobIds::default();
    {
        let tier = primary.tier(&config(
            &dir,
            p.io_threads,
            capacity,
            true,
            p.io_timeout_ms,
        )?)?;
        let mut progress = Progress::new(p.progress, "disk recovery fill", n as u64);
        primary
            .stream(Kind::Store, &key_bytes, &src, 64, 4)
            .run(&tier, &mut ids, |b| progress.add(b / B as u64))?;
        progress.finish();
    }
    let cold = drop_caches();
    let cfg = config(&dir, p.io_threads, capacity, false, p.io_timeout_ms)?;
    let t = Instant::now();
    let tier = primary.tier(&cfg)?;
    let secs = t.elapsed().as_secs_f64();
    let blocks = tier.stats().map_err(|e| e.to_string())?.num_blocks;
    if blocks != n as u64 {
        return Err(format!("recovered {blocks} of {n} blocks"));
    }
    let mut verified_bytes = 0;
    for i in (0..n).step_by(SAMPLE) {
        let id = ids.next();
        tier.submit(
            Kind::Load,
            id,
            &key_bytes[i * KEY_LEN..(i + 1) * KEY_LEN],
            KEY_LEN,
            &[ROWS as i64],
        )
        .map_err(|e| e.to_string())?;
        if one_result(&tier, false)?.status != 0 {
            return Err(format!("recovered key {i} failed to load"));
        }
        if let Some(at) = check_row((i % ROWS) as u64, primary.row(ROWS)) {
            return Err(format!("recovered key {i} differs at byte {at}"));
        }
        verified_bytes += B as u64;
    }
    drop(tier);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(Results {
        blocks,
        secs,
        cold,
        verified_bytes,
    })
}

impl Results {
    pub fn report(&self, out: &mut Report) {
        out.row(
            "restart recovery",
            self.secs,
            "s",
            format!(
                "{} blocks ({} page cache)",
                self.blocks,
                if self.cold {
                    "cold: dropped"
                } else {
                    "warm: could not drop"
                }
            ),
        );
        out.field("recovery_blocks", self.blocks);
        out.field("recovery_secs", self.secs);
        out.field("recovery_cold_cache", self.cold);
    }
}
