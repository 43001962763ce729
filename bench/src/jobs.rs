//! Streams many jobs through a tier with a window of jobs in flight, refilling
//! the window as results arrive (tier_wait + tier_poll_finished), and checks
//! every result.

pub use crate::capi::Kind;
use crate::capi::{status_name, Tier, TIER_OK};
use kvtier::ffi::tier_job_result_t;
use std::time::Instant;

/// A tier that delivers nothing for this long is reported as hung.
const STALL_LIMIT_MS: u32 = 60_000;

/// Job ids unique over the run.
#[derive(Default)]
pub struct JobIds(u64);

impl JobIds {
    pub fn next(&mut self) -> u64 {
        self.0 += 1;
        self.0
    }
}

/// One pass: wall time from the first submit to the last result polled, bytes
/// the results report, and each job's submit-to-completion time.
pub struct PassStats {
    pub secs: f64,
    pub bytes: u64,
    pub job_ns: Vec<u64>,
}

impl PassStats {
    pub fn gbps(&self) -> f64 {
        self.bytes as f64 / self.secs / 1e9
    }
}

/// What a stream of jobs covers: key `i` (packed in `keys`) goes with primary
/// row `rows[i]`, `job_blocks` keys per job, `window` jobs in flight.
pub struct Stream<'a> {
    pub kind: Kind,
    pub keys: &'a [u8],
    pub key_len: usize,
    pub rows: &'a [i64],
    pub job_blocks: usize,
    pub window: usize,
    pub block_bytes: usize,
}

impl Stream<'_> {
    /// Runs every job. Fails on a rejected submit, a failed job, or a result
    /// that did not copy every block. `on_bytes` sees progress.
    pub fn run(
        &self,
        tier: &Tier,
        ids: &mut JobIds,
        mut on_bytes: impl FnMut(u64),
    ) -> Result<PassStats, String> {
        let n = self.rows.len();
        assert_eq!(self.keys.len(), n * self.key_len);
        let jobs = n.div_ceil(self.job_blocks);
        let mut results = vec![tier_job_result_t::default(); self.window.max(16)];
        let mut job_ns = Vec::with_capacity(jobs);
        let (mut next, mut in_flight, mut bytes) = (0usize, 0usize, 0u64);
        let start = Instant::now();
        loop {
            while in_flight < self.window && next < jobs {
                let first = next * self.job_blocks;
                let end = (first + self.job_blocks).min(n);
                let keys = &self.keys[first * self.key_len..end * self.key_len];
                let rows = &self.rows[first..end];
                let id = ids.next();
                tier.submit(self.kind, id, keys, self.key_len, rows)
                    .map_err(|e| e.to_string())?;
                next += 1;
                in_flight += 1;
            }
            if in_flight == 0 {
                break;
            }
            if !tier.wait(STALL_LIMIT_MS).map_err(|e| e.to_string())? {
                return Err(format!(
                    "{} jobs: no result within {} s with {in_flight} in flight",
                    self.kind.name(),
                    STALL_LIMIT_MS / 1000
                ));
            }
            let got = tier.poll(&mut results).map_err(|e| e.to_string())?;
            for r in &results[..got] {
                self.check(r)?;
                bytes += r.bytes;
                job_ns.push(r.elapsed_ns);
                on_bytes(r.bytes);
            }
            in_flight -= got;
        }
        Ok(PassStats {
            secs: start.elapsed().as_secs_f64(),
            bytes,
            job_ns,
        })
    }

    fn check(&self, r: &tier_job_result_t) -> Result<(), String> {
        let full = r.num_blocks as u64 * self.block_bytes as u64;
        if r.status != TIER_OK
            || r.kind != self.kind.code()
            || r.num_done != r.num_blocks
            || r.bytes != full
        {
            return Err(format!(
                "{} job {} failed: status {}, kind {}, {}/{} blocks done, {} of {full} bytes copied",
                self.kind.name(),
                r.job_id,
                status_name(r.status),
                r.kind,
                r.num_done,
                r.num_blocks,
                r.bytes
            ));
        }
        Ok(())
    }
}
