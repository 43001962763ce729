//! Store and load bandwidth of large jobs, against a memcpy baseline run with
//! the same number of threads over the same rows, with every byte verified.

use crate::buffer::{anon_huge_bytes, for_each_parallel, rss_bytes, MappedBuf};
use crate::capi::{Config, Tier};
use crate::data::{check_row, fill_row, keys, KEY_LEN, NS_BANDWIDTH};
use crate::jobs::{JobIds, Kind, PassStats, Stream};
use crate::progress::Progress;
use std::sync::Barrier;
use std::time::Instant;

pub struct Params {
    pub io_threads: Option<usize>,
    pub data_bytes: u64,
    pub block_bytes: usize,
    pub job_blocks: usize,
    pub window: Option<usize>,
    pub repeat: usize,
    pub helper_threads: usize,
    pub progress: bool,
}

pub struct Report {
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
    /// Resident memory the cold pass added, and how much of it is huge pages.
    pub cold_rss_added: u64,
    pub cold_huge_added: u64,
    /// Job submit-to-completion times over the steady passes.
    pub store_job_ns: Vec<u64>,
    pub load_job_ns: Vec<u64>,
    pub verified_bytes: u64,
    pub verify_passes: usize,
}

pub fn run(p: &Params) -> Result<Report, String> {
    let block = p.block_bytes;
    let n = (p.data_bytes.div_ceil(block as u64) as usize).max(1);
    let pass_bytes = (n * block) as u64;
    // Source rows 0..n, destination rows n..2n.
    let buf = MappedBuf::new(2 * n * block)?;
    let capacity = ((n + p.job_blocks) * block) as u64;
    let mut cfg = Config::new().map_err(|e| e.to_string())?;
    cfg.set("capacity_bytes", &capacity.to_string())
        .map_err(|e| e.to_string())?;
    if let Some(t) = p.io_threads {
        cfg.set("io_threads", &t.to_string())
            .map_err(|e| e.to_string())?;
    }
    let tier = Tier::new(&cfg, &buf, block).map_err(|e| e.to_string())?;
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
    let helpers = p.helper_threads;
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
    let units = 3 + 5 * p.repeat as u64;
    let mut bar = Progress::new(p.progress, "bandwidth: passes", units * pass_bytes);
    let mut verified_bytes = 0;
    let mut verify_passes = 0;

    let (rss0, huge0) = (rss_bytes(), anon_huge_bytes());
    let cold = store.run(&tier, &mut ids, |b| bar.add(b))?;
    let (rss1, huge1) = (rss_bytes(), anon_huge_bytes());
    verified_bytes += verify(&tier, &buf, &load, n, block, helpers, &mut ids, &mut bar)?;
    verify_passes += 1;

    let mut r = Report {
        io_threads,
        rows: n,
        bytes_per_pass: pass_bytes,
        window,
        capacity_bytes: stats.capacity_bytes,
        memcpy: Vec::new(),
        store: Vec::new(),
        load: Vec::new(),
        store_cold: cold.gbps(),
        cold_rss_added: rss1.saturating_sub(rss0),
        cold_huge_added: huge1.saturating_sub(huge0),
        store_job_ns: Vec::new(),
        load_job_ns: Vec::new(),
        verified_bytes: 0,
        verify_passes: 0,
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
    if after.stores_failed != 0 || after.loads_failed != 0 || after.evictions != 0 {
        return Err(format!(
            "tier counters after the bandwidth runs: {} stores failed, {} loads failed, {} evictions (expected none)",
            after.stores_failed, after.loads_failed, after.evictions
        ));
    }
    Ok(r)
}

/// Copies every source row to its destination row with `threads` threads, each
/// `copy_nonoverlapping` one block at a time; returns seconds from the first
/// thread's start to the last one's end. Each thread takes its own timestamps:
/// the main thread may not be running when the copies start or end (on a
/// 2-core machine it competes with the copying threads for a core).
fn memcpy_pass(buf: &MappedBuf, n: usize, block: usize, threads: usize) -> f64 {
    let threads = threads.max(1);
    let ready = Barrier::new(threads);
    let spans: Vec<(Instant, Instant)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let ready = &ready;
                s.spawn(move || {
                    ready.wait();
                    let start = Instant::now();
                    for i in (t..n).step_by(threads) {
                        // SAFETY: rows i and n + i are distinct, in bounds, and
                        // owned by this thread; no tier job is in flight.
                        unsafe {
                            std::ptr::copy_nonoverlapping(
                                buf.as_ptr().add(i * block),
                                buf.as_ptr().add((n + i) * block),
                                block,
                            );
                        }
                    }
                    (start, Instant::now())
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("memcpy thread panicked"))
            .collect()
    });
    let start = spans.iter().map(|s| s.0).min().expect("one thread");
    let end = spans.iter().map(|s| s.1).max().expect("one thread");
    (end - start).as_secs_f64()
}

/// Untimed: poisons the destination rows, loads every key into them and
/// compares every byte with the data its source row was filled with.
#[allow(clippy::too_many_arguments)]
fn verify(
    tier: &Tier,
    buf: &MappedBuf,
    load: &Stream,
    n: usize,
    block: usize,
    helpers: usize,
    ids: &mut JobIds,
    bar: &mut Progress,
) -> Result<u64, String> {
    for_each_parallel(helpers, n, |i| {
        // SAFETY: one thread per row; no job is in flight.
        unsafe { buf.slice_mut((n + i) * block, block) }.fill(0xa5);
        Ok::<(), String>(())
    })?;
    load.run(tier, ids, |b| bar.add(b))?;
    for_each_parallel(helpers, n, |i| {
        // SAFETY: the loads into these rows were all polled.
        let row = unsafe { buf.slice((n + i) * block, block) };
        match check_row(i as u64, row) {
            None => Ok(()),
            Some(at) => Err(format!(
                "verification failed: key {i} loaded into row {} differs from what was stored at byte {at}",
                n + i
            )),
        }
    })?;
    bar.add((n * block) as u64);
    Ok((n * block) as u64)
}
