//! What the storage backends' phases share: a primary buffer of source and
//! destination rows, the streams of jobs over it, and waiting for one job.

use crate::buffer::MappedBuf;
use crate::capi::{Config, Tier};
use crate::data::check_row;
use crate::data::{fill_row, KEY_LEN};
use crate::jobs::{JobIds, Kind, Stream};
use crate::report::size;
use kvtier::ffi::tier_job_result_t;
use std::time::Instant;

/// A tier that delivers nothing for this long is reported as hung.
const STALL_SECS: u64 = 60;

/// A primary buffer of source rows `0..rows`, filled with their regenerable
/// contents, and as many destination rows `rows..2 * rows` for loads.
pub struct Primary {
    pub buf: MappedBuf,
    pub block: usize,
    pub rows: usize,
}

impl Primary {
    pub fn new(rows: usize, block: usize) -> Result<Primary, String> {
        let p = Primary {
            buf: MappedBuf::new(2 * rows * block)?,
            block,
            rows,
        };
        for i in 0..rows {
            fill_row(i as u64, p.row(i));
        }
        Ok(p)
    }

    /// Row `i` as a slice, also for raw I/O threads (each touches only the
    /// rows it was given, or only reads).
    #[allow(clippy::mut_from_ref)]
    pub fn row(&self, i: usize) -> &mut [u8] {
        assert!((i + 1) * self.block <= self.buf.len());
        // SAFETY: in bounds; callers give each thread distinct rows or only
        // read, and never touch a row a tier job in flight is using.
        unsafe { self.buf.slice_mut(i * self.block, self.block) }
    }

    /// Source rows for keys `0..n`, cycling.
    pub fn sources(&self, n: usize) -> Vec<i64> {
        (0..n).map(|i| (i % self.rows) as i64).collect()
    }

    /// Destination rows for keys `0..n`, cycling.
    pub fn destinations(&self, n: usize) -> Vec<i64> {
        (0..n).map(|i| (self.rows + i % self.rows) as i64).collect()
    }

    pub fn tier(&self, config: &Config) -> Result<Tier<'_>, String> {
        Tier::new(config, &self.buf, self.block).map_err(|e| e.to_string())
    }

    /// Jobs of `job_blocks` keys with `window` in flight, key `i` with `rows[i]`.
    pub fn stream<'a>(
        &self,
        kind: Kind,
        keys: &'a [u8],
        rows: &'a [i64],
        job_blocks: usize,
        window: usize,
    ) -> Stream<'a> {
        Stream {
            kind,
            keys,
            key_len: KEY_LEN,
            rows,
            job_blocks,
            window,
            block_bytes: self.block,
        }
    }
}

/// Waits for one job's result: blocking (`spin` false), or spinning on the
/// poll as a latency-bound engine would.
pub fn one_result(tier: &Tier, spin: bool) -> Result<tier_job_result_t, String> {
    let mut out = [tier_job_result_t::default(); 1];
    let start = Instant::now();
    loop {
        if tier.poll(&mut out).map_err(|e| e.to_string())? == 1 {
            return Ok(out[0]);
        }
        let waited = if spin {
            std::hint::spin_loop();
            start.elapsed().as_secs() <= STALL_SECS
        } else {
            tier.wait(STALL_SECS as u32 * 1000)
                .map_err(|e| e.to_string())?
        };
        if !waited {
            return Err(format!("a job did not finish within {STALL_SECS} s"));
        }
    }
}

/// Poisons the destination rows, loads every key one job at a time, and
/// checks every byte against the source row it was stored from.
pub fn verify_all(
    tier: &Tier,
    primary: &Primary,
    key_bytes: &[u8],
    job_blocks: usize,
    ids: &mut JobIds,
    backend: &str,
) -> Result<u64, String> {
    let n = key_bytes.len() / KEY_LEN;
    verify_range(tier, primary, key_bytes, 0..n, job_blocks, ids, backend)
}

/// [`verify_all`] for keys `range` of `key_bytes` only (key `i` was stored
/// from source row `i % rows`).
pub fn verify_range(
    tier: &Tier,
    primary: &Primary,
    key_bytes: &[u8],
    range: std::ops::Range<usize>,
    job_blocks: usize,
    ids: &mut JobIds,
    backend: &str,
) -> Result<u64, String> {
    let rows = primary.rows;
    let n = range.end;
    let per_job = job_blocks.min(rows);
    let mut verified = 0;
    for first in range.step_by(per_job) {
        let end = (first + per_job).min(n);
        let dst: Vec<i64> = (first..end).map(|i| (rows + (i - first)) as i64).collect();
        for &d in &dst {
            primary.row(d as usize).fill(0xA5);
        }
        let id = ids.next();
        tier.submit(
            Kind::Load,
            id,
            &key_bytes[first * KEY_LEN..end * KEY_LEN],
            KEY_LEN,
            &dst,
        )
        .map_err(|e| e.to_string())?;
        let res = one_result(tier, false)?;
        if res.status != 0 || res.num_done as usize != end - first {
            return Err(format!(
                "verification load {id} failed: status {}, {}/{} blocks",
                res.status,
                res.num_done,
                end - first
            ));
        }
        for (j, i) in (first..end).enumerate() {
            if let Some(at) = check_row((i % rows) as u64, primary.row(rows + j)) {
                return Err(format!(
                    "{backend} verification: {} key {i} differs at byte {at}",
                    size(primary.block)
                ));
            }
            verified += primary.block as u64;
        }
    }
    Ok(verified)
}
