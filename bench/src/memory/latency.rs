//! Memory backend, small-job latency: one 4 KiB block per job, submitted and
//! then polled in a spin loop until its result arrives, one job at a time; and
//! how those figures are reported.

use crate::buffer::MappedBuf;
use crate::capi::{status_name, Config, Tier, TIER_OK};
use crate::cli::Settings;
use crate::data::{check_row, fill_row, write_key, KEY_LEN, NS_LATENCY, NS_LATENCY_PREFAULT};
use crate::jobs::{JobIds, Kind, Stream};
use crate::progress::Progress;
use crate::report::{mib, num, Cmp, Report};
use crate::stats::percentiles;
use kvtier::ffi::tier_job_result_t;
use serde_json::json;
use std::time::Instant;

pub const BLOCK_BYTES: usize = 4096;
/// Source rows 0..HALF, destination rows HALF..2*HALF.
const HALF: usize = 128;

pub struct Results {
    pub io_threads: usize,
    /// Caller's clock, submit call start to result polled.
    pub store_round_trip_ns: Vec<u64>,
    pub load_round_trip_ns: Vec<u64>,
    /// The submit call alone, on the caller's thread.
    pub submit_store_ns: Vec<u64>,
    pub submit_load_ns: Vec<u64>,
    /// The library's own submit-to-completion time (tier_job_result_t.elapsed_ns).
    pub store_job_ns: Vec<u64>,
    pub load_job_ns: Vec<u64>,
    pub verified_bytes: u64,
}

pub fn run(p: &Settings) -> Result<Results, String> {
    let (iterations, warmup) = (p.latency_iters, p.latency_warmup);
    let total = warmup + iterations;
    let buf = MappedBuf::new(2 * HALF * BLOCK_BYTES)?;
    for row in 0..2 * HALF {
        // SAFETY: no tier exists yet.
        let out = unsafe { buf.slice_mut(row * BLOCK_BYTES, BLOCK_BYTES) };
        if row < HALF {
            fill_row(row as u64, out);
        } else {
            out.fill(0);
        }
    }
    let slots = total.next_multiple_of(512) + 512;
    let mut cfg = Config::new().map_err(|e| e.to_string())?;
    cfg.set("capacity_bytes", &(slots * BLOCK_BYTES).to_string())
        .map_err(|e| e.to_string())?;
    if let Some(t) = p.io_threads {
        cfg.set("io_threads", &t.to_string())
            .map_err(|e| e.to_string())?;
    }
    let tier = Tier::new(&cfg, &buf, BLOCK_BYTES).map_err(|e| e.to_string())?;
    let io_threads = tier.stats().map_err(|e| e.to_string())?.io_threads as usize;
    let mut ids = JobIds::default();

    // Fault in every arena slot with big jobs, then drop the blocks: the measured
    // stores reuse resident slots, as in a long-running engine.
    let prefault_keys = crate::data::keys(NS_LATENCY_PREFAULT, 0, slots);
    let prefault_rows: Vec<i64> = (0..slots).map(|i| (i % HALF) as i64).collect();
    Stream {
        kind: Kind::Store,
        keys: &prefault_keys,
        key_len: KEY_LEN,
        rows: &prefault_rows,
        job_blocks: 256,
        window: 2 * io_threads,
        block_bytes: BLOCK_BYTES,
    }
    .run(&tier, &mut ids, |_| {})?;
    tier.clear().map_err(|e| e.to_string())?;

    let mut r = Results {
        io_threads,
        store_round_trip_ns: Vec::with_capacity(iterations),
        load_round_trip_ns: Vec::with_capacity(iterations),
        submit_store_ns: Vec::with_capacity(iterations),
        submit_load_ns: Vec::with_capacity(iterations),
        store_job_ns: Vec::with_capacity(iterations),
        load_job_ns: Vec::with_capacity(iterations),
        verified_bytes: 0,
    };
    let mut bar = Progress::new(p.progress, "latency: 4 KiB jobs", 2 * total as u64);
    let mut key = [0u8; KEY_LEN];
    let mut result = [tier_job_result_t::default()];
    for kind in [Kind::Store, Kind::Load] {
        for i in 0..total {
            write_key(NS_LATENCY, i as u64, &mut key);
            let src = i % HALF;
            let row = match kind {
                Kind::Store => src,
                Kind::Load => {
                    // Poison the destination so a load that copies nothing fails
                    // the check below.
                    // SAFETY: the previous job into this row was polled.
                    unsafe { buf.slice_mut((HALF + src) * BLOCK_BYTES, BLOCK_BYTES) }.fill(0xa5);
                    HALF + src
                }
            };
            let rows = [row as i64];
            let id = ids.next();
            let t0 = Instant::now();
            tier.submit(kind, id, &key, KEY_LEN, &rows)
                .map_err(|e| e.to_string())?;
            let t1 = Instant::now();
            while tier.poll(&mut result).map_err(|e| e.to_string())? == 0 {
                std::hint::spin_loop();
            }
            let t2 = Instant::now();
            let res = &result[0];
            if res.status != TIER_OK || res.job_id != id || res.num_done != 1 {
                return Err(format!(
                    "4 KiB {kind:?} job {id}: status {}, {}/{} blocks done",
                    status_name(res.status),
                    res.num_done,
                    res.num_blocks
                ));
            }
            if kind == Kind::Load {
                // SAFETY: the load into this row was polled.
                let got = unsafe { buf.slice(row * BLOCK_BYTES, BLOCK_BYTES) };
                if let Some(at) = check_row(src as u64, got) {
                    return Err(format!(
                        "verification failed: 4 KiB key {i} loaded into row {row} differs at byte {at}"
                    ));
                }
                r.verified_bytes += BLOCK_BYTES as u64;
            }
            if i >= warmup {
                let (rt, submit, job) = match kind {
                    Kind::Store => (
                        &mut r.store_round_trip_ns,
                        &mut r.submit_store_ns,
                        &mut r.store_job_ns,
                    ),
                    Kind::Load => (
                        &mut r.load_round_trip_ns,
                        &mut r.submit_load_ns,
                        &mut r.load_job_ns,
                    ),
                };
                rt.push((t2 - t0).as_nanos() as u64);
                submit.push((t1 - t0).as_nanos() as u64);
                job.push(res.elapsed_ns);
            }
            if i % 1024 == 1023 {
                bar.add(1024);
            }
        }
    }
    bar.finish();
    Ok(r)
}

impl Results {
    /// Round trips (with the < 10 us store target), submit-call costs, and the
    /// `latency_4k` JSON object.
    pub fn report(&self, s: &Settings, out: &mut Report) {
        out.line(
            "latency",
            format!(
                "4 KiB blocks, 1 job at a time, spin-polled; {} timed jobs per direction after {} warm-up",
                self.store_round_trip_ns.len(),
                s.latency_warmup
            ),
        );
        for (name, rt, job) in [
            ("store", &self.store_round_trip_ns, &self.store_job_ns),
            ("load", &self.load_round_trip_ns, &self.load_job_ns),
        ] {
            let (rt, job) = (percentiles(rt), percentiles(job));
            let median_us = rt.median as f64 / 1e3;
            let row = out.row(
                format!("4 KiB {name} round trip"),
                median_us,
                "us",
                format!(
                    "median; p99 {} us; library elapsed_ns median {} us",
                    num(rt.p99 as f64 / 1e3),
                    num(job.median as f64 / 1e3)
                ),
            );
            if name == "store" {
                row.target(
                    "4 KiB store round trip median < 10 us",
                    median_us,
                    Cmp::Below,
                    10.0,
                );
            }
        }
        for (name, v) in [
            ("tier_submit_store", &self.submit_store_ns),
            ("tier_submit_load", &self.submit_load_ns),
        ] {
            let p = percentiles(v);
            out.row(
                format!("{name} call (1 x 4 KiB)"),
                p.median as f64,
                "ns",
                format!("median; p99 {} ns; caller's thread", num(p.p99 as f64)),
            );
        }
        out.field(
            "latency_4k",
            json!({
                "block_bytes": BLOCK_BYTES,
                "warmup": s.latency_warmup,
                "store_round_trip_ns": percentiles(&self.store_round_trip_ns),
                "load_round_trip_ns": percentiles(&self.load_round_trip_ns),
                "store_elapsed_ns": percentiles(&self.store_job_ns),
                "load_elapsed_ns": percentiles(&self.load_job_ns),
                "submit_store_call_ns": percentiles(&self.submit_store_ns),
                "submit_load_call_ns": percentiles(&self.submit_load_ns),
                "verified_bytes": self.verified_bytes,
            }),
        );
        out.verified(format!(
            "every 4 KiB load ({})",
            mib(self.verified_bytes as f64)
        ));
    }
}
