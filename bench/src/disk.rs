//! `--backend disk`: the disk backend against raw file I/O on the same
//! directory, measured in the same run.
//!
//! Bounds, all with O_DIRECT (the page cache is bypassed by both sides):
//! - bandwidth: one file per block, created, written and closed (or opened,
//!   read and closed) by as many threads as the tier has I/O threads;
//! - 4 KiB store: exclusive create + O_DIRECT write + close + rename, the
//!   least a crash-safe store can do; 4 KiB load: open + O_DIRECT read + close.
//!
//! The tier runs with `o_direct=on`, so a file system without O_DIRECT fails
//! the run instead of silently measuring the page cache.

use crate::buffer::MappedBuf;
use crate::capi::{Config, Tier, TIER_HIT};
use crate::data::{check_row, fill_row, keys, KEY_LEN};
use crate::jobs::{JobIds, Kind, Stream};
use crate::progress::Progress;
use crate::stats::{median, percentile};
use kvtier::ffi::tier_job_result_t;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

const NS_DISK: u64 = 11;
const NS_SMALL: u64 = 12;
const NS_LAT: u64 = 13;
const NS_RECOVERY: u64 = 14;

pub struct Params {
    pub dir: PathBuf,
    pub io_threads: usize,
    pub data_bytes: u64,
    pub block_bytes: usize,
    pub job_blocks: usize,
    pub window: usize,
    pub repeat: usize,
    pub latency_iters: usize,
    pub small_blocks: usize,
    pub recovery_blocks: usize,
    pub progress: bool,
}

#[derive(Default)]
pub struct Results {
    pub describe: String,
    pub io_threads: usize,
    pub blocks: usize,
    pub raw_write_gbps: Vec<f64>,
    pub raw_read_gbps: Vec<f64>,
    pub store_gbps: Vec<f64>,
    pub load_gbps: Vec<f64>,
    pub verified_bytes: u64,
    pub raw_store_4k_ns: Vec<u64>,
    pub raw_store_4k_flat_ns: Vec<u64>,
    pub raw_load_4k_ns: Vec<u64>,
    pub store_4k_ns: Vec<u64>,
    pub load_4k_ns: Vec<u64>,
    pub small_store_blocks_per_s: f64,
    pub small_store_cold_blocks_per_s: f64,
    pub small_load_blocks_per_s: f64,
    pub raw_small_store_blocks_per_s: f64,
    pub raw_small_load_blocks_per_s: f64,
    pub lookup_ns_per_key: f64,
    pub lookup_resident: u64,
    pub recovery_blocks: u64,
    pub recovery_secs: f64,
    pub recovery_cold: bool,
}

fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).expect("path without NUL")
}

fn os_err(what: &str, p: &Path) -> String {
    format!(
        "{what} {}: {}",
        p.display(),
        std::io::Error::last_os_error()
    )
}

/// Raw O_DIRECT primitives: what a file-per-block store must do at least.
mod raw {
    use super::{cpath, os_err};
    use std::path::Path;

    pub fn write_file(path: &Path, data: &[u8], tmp: Option<&Path>) -> Result<(), String> {
        let target = tmp.unwrap_or(path);
        let c = cpath(target);
        // SAFETY: valid C string; the result is checked.
        let fd = unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_DIRECT | libc::O_CLOEXEC,
                0o600,
            )
        };
        if fd < 0 {
            return Err(os_err("open", target));
        }
        // SAFETY: data is a live, 4 KiB-aligned buffer of its length.
        let n = unsafe { libc::pwrite(fd, data.as_ptr() as *const libc::c_void, data.len(), 0) };
        // SAFETY: fd is ours.
        unsafe { libc::close(fd) };
        if n != data.len() as isize {
            return Err(os_err("write", target));
        }
        if let Some(tmp) = tmp {
            std::fs::rename(tmp, path).map_err(|e| format!("rename {}: {e}", path.display()))?;
        }
        Ok(())
    }

    pub fn read_file(path: &Path, out: &mut [u8]) -> Result<(), String> {
        let c = cpath(path);
        // SAFETY: valid C string; the result is checked.
        let fd = unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_RDONLY | libc::O_DIRECT | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(os_err("open", path));
        }
        // SAFETY: out is a live, 4 KiB-aligned buffer of its length.
        let n = unsafe { libc::pread(fd, out.as_mut_ptr() as *mut libc::c_void, out.len(), 0) };
        // SAFETY: fd is ours.
        unsafe { libc::close(fd) };
        if n != out.len() as isize {
            return Err(os_err("read", path));
        }
        Ok(())
    }
}

/// Rows of a primary buffer as raw slices, for raw I/O threads (each touches
/// only the rows it was given).
struct Rows<'a> {
    buf: &'a MappedBuf,
    block: usize,
}

impl Rows<'_> {
    #[allow(clippy::mut_from_ref)]
    fn row(&self, i: usize) -> &mut [u8] {
        assert!((i + 1) * self.block <= self.buf.len());
        // SAFETY: in bounds; callers give each thread distinct rows or only read.
        unsafe { std::slice::from_raw_parts_mut(self.buf.as_ptr().add(i * self.block), self.block) }
    }
}

/// Runs `work(i)` for i in 0..n on `threads` threads; returns the seconds from
/// the first start to the last finish, as the threads saw them.
fn parallel(
    threads: usize,
    n: usize,
    work: impl Fn(usize) -> Result<(), String> + Sync,
) -> Result<f64, String> {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let spans: Vec<Result<(Instant, Instant), String>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let start = Instant::now();
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        if i >= n {
                            return Ok((start, Instant::now()));
                        }
                        work(i)?;
                    }
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("worker"))
            .collect()
    });
    let spans = spans.into_iter().collect::<Result<Vec<_>, _>>()?;
    let first = spans.iter().map(|s| s.0).min().expect("threads");
    let last = spans.iter().map(|s| s.1).max().expect("threads");
    Ok(last.duration_since(first).as_secs_f64())
}

/// A disk tier configuration; `prepared` creates the fan-out directories at
/// open, so timed stores see a tier in steady state.
fn config(dir: &Path, io_threads: usize, capacity: u64, prepared: bool) -> Result<Config, String> {
    let mut c = Config::new().map_err(|e| e.to_string())?;
    for (k, v) in [
        ("prepare_dirs", prepared.to_string()),
        ("backend", "disk".to_string()),
        ("path", dir.display().to_string()),
        ("namespace", "kvtier-bench".to_string()),
        ("o_direct", "on".to_string()),
        ("io_threads", io_threads.to_string()),
        ("capacity_bytes", capacity.to_string()),
    ] {
        c.set(k, &v).map_err(|e| e.to_string())?;
    }
    Ok(c)
}

/// Deletes every block file under `dir` (keeping the directories).
fn remove_block_files(dir: &Path) -> Result<(), String> {
    for entry in std::fs::read_dir(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .flatten()
    {
        let path = entry.path();
        if path.is_dir() {
            remove_block_files(&path)?;
        } else if path.extension().is_some_and(|e| e == "kvb") {
            std::fs::remove_file(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        }
    }
    Ok(())
}

fn fresh_dir(path: &Path) -> Result<(), String> {
    let _ = std::fs::remove_dir_all(path);
    std::fs::create_dir_all(path).map_err(|e| format!("create {}: {e}", path.display()))
}

/// Drops the page cache (root only) so a recovery scan starts cold.
fn drop_caches() -> bool {
    // SAFETY: sync has no preconditions.
    unsafe { libc::sync() };
    std::fs::write("/proc/sys/vm/drop_caches", "3\n").is_ok()
}

pub fn run(p: &Params) -> Result<Results, String> {
    fresh_dir(&p.dir)?;
    let outcome = run_in(p);
    let _ = std::fs::remove_dir_all(&p.dir);
    outcome
}

fn run_in(p: &Params) -> Result<Results, String> {
    let mut r = Results {
        io_threads: p.io_threads,
        ..Results::default()
    };
    bandwidth(p, &mut r)?;
    latency(p, &mut r)?;
    small_jobs_and_lookup(p, &mut r)?;
    recovery(p, &mut r)?;
    Ok(r)
}

/// 2 MiB blocks: raw write/read passes alternate with tier store/load passes.
fn bandwidth(p: &Params, r: &mut Results) -> Result<(), String> {
    let block = p.block_bytes;
    let n = (p.data_bytes as usize).div_ceil(block).max(p.job_blocks);
    r.blocks = n;
    // Source rows (cycled) and as many destination rows.
    let rows = n.min(256);
    let primary = MappedBuf::new(2 * rows * block)?;
    let view = Rows {
        buf: &primary,
        block,
    };
    for i in 0..rows {
        fill_row(i as u64, view.row(i));
    }
    let src: Vec<i64> = (0..n).map(|i| (i % rows) as i64).collect();
    let dst: Vec<i64> = (0..n).map(|i| (rows + i % rows) as i64).collect();
    let key_bytes = keys(NS_DISK, 0, n);
    let mut ids = JobIds::default();
    let mut progress = Progress::new(p.progress, "disk bandwidth", (p.repeat * 4 * n) as u64);
    let tier_dir = p.dir.join("bandwidth");
    let cfg = config(
        &tier_dir,
        p.io_threads,
        (n as u64 + 64) * (block as u64 + 4096),
        true,
    )?;
    for rep in 0..p.repeat {
        // Each repetition opens the tier on the same prepared directory,
        // emptied of the previous repetition's blocks. The disk slows down as
        // data accumulates, so raw and tier passes swap order every repetition.
        let tier = Tier::new(&cfg, &primary, block).map_err(|e| e.to_string())?;
        r.describe = tier.describe();
        let raw_dir = p.dir.join(format!("raw-{rep}"));
        fresh_dir(&raw_dir)?;
        let raw_first = rep % 2 == 0;
        for tier_turn in [!raw_first, raw_first] {
            if tier_turn {
                let stored = stream(Kind::Store, &key_bytes, &src, p.job_blocks, p.window, block)
                    .run(&tier, &mut ids, |_| {})?;
                r.store_gbps.push(stored.gbps());
            } else {
                let secs = parallel(p.io_threads, n, |i| {
                    raw::write_file(&raw_dir.join(format!("{i}.blk")), view.row(i % rows), None)
                })?;
                r.raw_write_gbps.push((n * block) as f64 / secs / 1e9);
            }
            progress.add(n as u64);
        }
        for tier_turn in [!raw_first, raw_first] {
            if tier_turn {
                let loaded = stream(Kind::Load, &key_bytes, &dst, p.job_blocks, p.window, block)
                    .run(&tier, &mut ids, |_| {})?;
                r.load_gbps.push(loaded.gbps());
            } else {
                // Reads land in destination rows; several threads may share
                // one, which is fine for a bound (the bytes are not checked).
                let secs = parallel(p.io_threads, n, |i| {
                    raw::read_file(&raw_dir.join(format!("{i}.blk")), view.row(rows + i % rows))
                })?;
                r.raw_read_gbps.push((n * block) as f64 / secs / 1e9);
            }
            progress.add(n as u64);
        }
        if rep == 0 {
            r.verified_bytes += verify_all(&tier, &view, &key_bytes, rows, p.job_blocks, &mut ids)?;
        }
        drop(tier);
        remove_block_files(&tier_dir)?;
        let _ = std::fs::remove_dir_all(&raw_dir);
    }
    progress.finish();
    let _ = std::fs::remove_dir_all(&tier_dir);
    Ok(())
}

fn stream<'a>(
    kind: Kind,
    keys: &'a [u8],
    rows: &'a [i64],
    job_blocks: usize,
    window: usize,
    block_bytes: usize,
) -> Stream<'a> {
    Stream {
        kind,
        keys,
        key_len: KEY_LEN,
        rows,
        job_blocks,
        window,
        block_bytes,
    }
}

/// Loads every key one job at a time into the destination rows and checks
/// every byte against the source row it was stored from.
fn verify_all(
    tier: &Tier,
    view: &Rows,
    key_bytes: &[u8],
    rows: usize,
    job_blocks: usize,
    ids: &mut JobIds,
) -> Result<u64, String> {
    let n = key_bytes.len() / KEY_LEN;
    let mut verified = 0;
    for first in (0..n).step_by(job_blocks.min(rows)) {
        let end = (first + job_blocks.min(rows)).min(n);
        let dst: Vec<i64> = (first..end).map(|i| (rows + (i - first)) as i64).collect();
        for &d in &dst {
            view.row(d as usize).fill(0xA5);
        }
        let id = ids.next();
        tier.submit_load(
            id,
            &key_bytes[first * KEY_LEN..end * KEY_LEN],
            KEY_LEN,
            &dst,
        )
        .map_err(|e| e.to_string())?;
        let res = wait_one(tier)?;
        if res.status != 0 || res.num_done as usize != end - first {
            return Err(format!(
                "verification load {id} failed: status {}",
                res.status
            ));
        }
        for (j, i) in (first..end).enumerate() {
            if let Some(at) = check_row((i % rows) as u64, view.row(rows + j)) {
                return Err(format!("disk verification: key {i} differs at byte {at}"));
            }
            verified += view.block as u64;
        }
    }
    Ok(verified)
}

fn wait_one(tier: &Tier) -> Result<tier_job_result_t, String> {
    let mut out = [tier_job_result_t::default(); 1];
    loop {
        if tier.poll(&mut out).map_err(|e| e.to_string())? == 1 {
            return Ok(out[0]);
        }
        if !tier.wait(60_000).map_err(|e| e.to_string())? {
            return Err("a job did not finish within 60 s".into());
        }
    }
}

fn spin_one(tier: &Tier) -> Result<tier_job_result_t, String> {
    let mut out = [tier_job_result_t::default(); 1];
    let start = Instant::now();
    loop {
        if tier.poll(&mut out).map_err(|e| e.to_string())? == 1 {
            return Ok(out[0]);
        }
        if start.elapsed().as_secs() > 60 {
            return Err("a job did not finish within 60 s".into());
        }
        std::hint::spin_loop();
    }
}

/// 4 KiB blocks, one per job, one at a time: tier round trips against the raw
/// create-write-rename and open-read sequences, interleaved so both see the
/// same machine.
fn latency(p: &Params, r: &mut Results) -> Result<(), String> {
    const B: usize = 4096;
    let primary = MappedBuf::new(4 * B)?;
    let view = Rows {
        buf: &primary,
        block: B,
    };
    let tier_dir = p.dir.join("lat-tier");
    // The raw bound does the same file operations in the same shape of
    // directory tree as the tier: 4096 fan-out directories, prepared like the
    // tier's (a single directory is faster on ext4: its renames share
    // directory blocks; that figure is reported beside it).
    let raw_dir = p.dir.join("lat-raw");
    fresh_dir(&raw_dir)?;
    const FANS: u64 = 4096;
    for f in 0..FANS {
        std::fs::create_dir(raw_dir.join(format!("{f:03x}"))).map_err(|e| e.to_string())?;
    }
    let fan = |i: usize| {
        format!(
            "{:03x}",
            (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 52
        )
    };
    let flat_dir = p.dir.join("lat-raw-flat");
    fresh_dir(&flat_dir)?;
    let cfg = config(
        &tier_dir,
        p.io_threads,
        ((p.latency_iters * 2 + 64) * (B + 4096)) as u64,
        true,
    )?;
    let tier = Tier::new(&cfg, &primary, B).map_err(|e| e.to_string())?;
    let warmup = p.latency_iters / 5;
    let total = warmup + p.latency_iters;
    let mut progress = Progress::new(p.progress, "disk 4 KiB latency", 2 * total as u64);
    let mut key = vec![0u8; KEY_LEN];
    let mut ids = JobIds::default();
    // Raw and tier alternate in batches, so both see the same machine state
    // while each runs back to back, as an engine's stream of jobs would.
    const BATCH: usize = 50;
    for batch in (0..total).step_by(BATCH) {
        let range = batch..(batch + BATCH).min(total);
        for i in range.clone() {
            fill_row(i as u64, view.row(0));
            let final_path = raw_dir.join(fan(i)).join(format!("{i}.blk"));
            let tmp_path = raw_dir.join(fan(i)).join(format!("{i}.blk.tmp"));
            let t = Instant::now();
            raw::write_file(&final_path, view.row(0), Some(&tmp_path))?;
            if i >= warmup {
                r.raw_store_4k_ns.push(t.elapsed().as_nanos() as u64);
            }
            let flat = flat_dir.join(format!("{i}.blk"));
            let t = Instant::now();
            raw::write_file(
                &flat,
                view.row(0),
                Some(&flat_dir.join(format!("{i}.blk.tmp"))),
            )?;
            if i >= warmup {
                r.raw_store_4k_flat_ns.push(t.elapsed().as_nanos() as u64);
            }
        }
        for i in range {
            fill_row(i as u64, view.row(0));
            crate::data::write_key(NS_LAT, i as u64, &mut key);
            let t = Instant::now();
            tier.submit_store(ids.next(), &key, KEY_LEN, &[0])
                .map_err(|e| e.to_string())?;
            let res = spin_one(&tier)?;
            let store = t.elapsed().as_nanos() as u64;
            if res.status != 0 {
                return Err(format!("4 KiB store failed: status {}", res.status));
            }
            if i >= warmup {
                r.store_4k_ns.push(store);
            }
            progress.add(1);
        }
    }
    for batch in (0..total).step_by(BATCH) {
        let range = batch..(batch + BATCH).min(total);
        for i in range.clone() {
            let t = Instant::now();
            raw::read_file(&raw_dir.join(fan(i)).join(format!("{i}.blk")), view.row(2))?;
            if i >= warmup {
                r.raw_load_4k_ns.push(t.elapsed().as_nanos() as u64);
            }
        }
        for i in range {
            crate::data::write_key(NS_LAT, i as u64, &mut key);
            let t = Instant::now();
            tier.submit_load(ids.next(), &key, KEY_LEN, &[1])
                .map_err(|e| e.to_string())?;
            let res = spin_one(&tier)?;
            let load = t.elapsed().as_nanos() as u64;
            if res.status != 0 {
                return Err(format!("4 KiB load failed: status {}", res.status));
            }
            if let Some(at) = check_row(i as u64, view.row(1)) {
                return Err(format!("4 KiB load of key {i} differs at byte {at}"));
            }
            r.verified_bytes += B as u64;
            if i >= warmup {
                r.load_4k_ns.push(load);
            }
            progress.add(1);
        }
    }
    progress.finish();
    drop(tier);
    let _ = std::fs::remove_dir_all(&tier_dir);
    let _ = std::fs::remove_dir_all(&raw_dir);
    let _ = std::fs::remove_dir_all(&flat_dir);
    Ok(())
}

/// 64 KiB blocks in 16-block jobs, several in flight: blocks per second; then
/// lookups against the resident blocks, answered in the same call.
fn small_jobs_and_lookup(p: &Params, r: &mut Results) -> Result<(), String> {
    const B: usize = 64 << 10;
    let n = p.small_blocks;
    let rows = 64;
    let primary = MappedBuf::new(2 * rows * B)?;
    let view = Rows {
        buf: &primary,
        block: B,
    };
    for i in 0..rows {
        fill_row(i as u64, view.row(i));
    }
    let dir = p.dir.join("small");
    let key_bytes = keys(NS_SMALL, 0, n);
    let src: Vec<i64> = (0..n).map(|i| (i % rows) as i64).collect();
    // 4 jobs of 16 in flight: 64 destination rows keep every load's rows its own.
    let dst: Vec<i64> = (0..n).map(|i| (rows + i % rows) as i64).collect();
    let mut ids = JobIds::default();
    // Raw: the same files, written by as many threads as the tier has.
    let raw_dir = p.dir.join("small-raw");
    fresh_dir(&raw_dir)?;
    let secs = parallel(p.io_threads, n, |i| {
        let path = raw_dir.join(format!("{i}.blk"));
        raw::write_file(
            &path,
            view.row(i % rows),
            Some(&raw_dir.join(format!("{i}.tmp"))),
        )
    })?;
    r.raw_small_store_blocks_per_s = n as f64 / secs;
    let secs = parallel(p.io_threads, n, |i| {
        raw::read_file(&raw_dir.join(format!("{i}.blk")), view.row(rows + i % rows))
    })?;
    r.raw_small_load_blocks_per_s = n as f64 / secs;
    let _ = std::fs::remove_dir_all(&raw_dir);
    // A new directory: stores create most of the 4096 fan-out directories as
    // they go (the raw bound writes into one existing directory).
    {
        let cold_dir = p.dir.join("small-cold");
        let cfg = config(
            &cold_dir,
            p.io_threads,
            ((n + 64) * (B + 4096)) as u64,
            false,
        )?;
        let tier = Tier::new(&cfg, &primary, B).map_err(|e| e.to_string())?;
        let stored =
            stream(Kind::Store, &key_bytes, &src, 16, 4, B).run(&tier, &mut ids, |_| {})?;
        r.small_store_cold_blocks_per_s = n as f64 / stored.secs;
        drop(tier);
        let _ = std::fs::remove_dir_all(&cold_dir);
    }
    let cfg = config(&dir, p.io_threads, ((n + 64) * (B + 4096)) as u64, true)?;
    let tier = Tier::new(&cfg, &primary, B).map_err(|e| e.to_string())?;
    let stored = stream(Kind::Store, &key_bytes, &src, 16, 4, B).run(&tier, &mut ids, |_| {})?;
    r.small_store_blocks_per_s = n as f64 / stored.secs;
    let loaded = stream(Kind::Load, &key_bytes, &dst, 16, 4, B).run(&tier, &mut ids, |_| {})?;
    r.small_load_blocks_per_s = n as f64 / loaded.secs;

    // Lookups: every key is answered HIT in the same call, from the index.
    let mut states = [0u8; 64];
    let mut runs = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        let mut done = 0usize;
        for chunk in key_bytes.chunks(64 * KEY_LEN).cycle().take(2000) {
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
    r.lookup_ns_per_key = median(&runs);
    r.lookup_resident = tier.stats().map_err(|e| e.to_string())?.num_blocks;
    drop(tier);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// Stores `recovery_blocks` 4 KiB blocks, closes the tier, drops the page cache
/// if allowed, and times reopening the directory.
fn recovery(p: &Params, r: &mut Results) -> Result<(), String> {
    const B: usize = 4096;
    let n = p.recovery_blocks;
    let rows = 64;
    let primary = MappedBuf::new(2 * rows * B)?;
    let view = Rows {
        buf: &primary,
        block: B,
    };
    for i in 0..rows {
        fill_row(i as u64, view.row(i));
    }
    let dir = p.dir.join("recovery");
    let capacity = ((n + 64) * B) as u64;
    let key_bytes = keys(NS_RECOVERY, 0, n);
    let src: Vec<i64> = (0..n).map(|i| (i % rows) as i64).collect();
    let mut ids = JobIds::default();
    {
        let cfg = config(&dir, p.io_threads, capacity, true)?;
        let tier = Tier::new(&cfg, &primary, B).map_err(|e| e.to_string())?;
        let mut progress = Progress::new(p.progress, "disk recovery fill", n as u64);
        stream(Kind::Store, &key_bytes, &src, 64, 4, B)
            .run(&tier, &mut ids, |b| progress.add(b / B as u64))?;
        progress.finish();
    }
    r.recovery_cold = drop_caches();
    let cfg = config(&dir, p.io_threads, capacity, false)?;
    let t = Instant::now();
    let tier = Tier::new(&cfg, &primary, B).map_err(|e| e.to_string())?;
    r.recovery_secs = t.elapsed().as_secs_f64();
    r.recovery_blocks = tier.stats().map_err(|e| e.to_string())?.num_blocks;
    if r.recovery_blocks != n as u64 {
        return Err(format!("recovered {} of {n} blocks", r.recovery_blocks));
    }
    // Recovered blocks load byte-exact (a sample of 1 in 64).
    for i in (0..n).step_by(64) {
        let id = ids.next();
        tier.submit_load(
            id,
            &key_bytes[i * KEY_LEN..(i + 1) * KEY_LEN],
            KEY_LEN,
            &[rows as i64],
        )
        .map_err(|e| e.to_string())?;
        if wait_one(&tier)?.status != 0 {
            return Err(format!("recovered key {i} failed to load"));
        }
        if let Some(at) = check_row((i % rows) as u64, view.row(rows)) {
            return Err(format!("recovered key {i} differs at byte {at}"));
        }
        r.verified_bytes += B as u64;
    }
    drop(tier);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

fn ratio_line(name: &str, value: f64, unit: &str, detail: String, target: &str) -> String {
    format!("{name:<38} {value:>9.2}  {unit:<8} {detail:<62} {target}\n")
}

pub fn table(p: &Params, r: &Results) -> String {
    let raw_w = median(&r.raw_write_gbps);
    let raw_r = median(&r.raw_read_gbps);
    let (st, ld) = (median(&r.store_gbps), median(&r.load_gbps));
    let store_ratio = crate::stats::paired_ratio(&r.raw_write_gbps, &r.store_gbps);
    let load_ratio = crate::stats::paired_ratio(&r.raw_read_gbps, &r.load_gbps);
    let us = |v: &[u64], q: f64| percentile(v, q) as f64 / 1000.0;
    let (rs, ts) = (us(&r.raw_store_4k_ns, 0.5), us(&r.store_4k_ns, 0.5));
    let (rl, tl) = (us(&r.raw_load_4k_ns, 0.5), us(&r.load_4k_ns, 0.5));
    let met = |ok: bool| if ok { "met" } else { "MISSED" };
    let mut out = String::new();
    out += &format!("kvtier-bench: disk backend, {}\n", r.describe);
    out += &format!(
        "bandwidth: {} blocks of {} KiB, {}-block jobs, {} in flight, {} I/O threads, {} repetitions; page cache bypassed (O_DIRECT) on both sides; GB = 10^9 bytes\n",
        r.blocks,
        p.block_bytes / 1024,
        p.job_blocks,
        p.window,
        r.io_threads,
        p.repeat
    );
    out += "steady state: fan-out directories prepared (prepare_dirs=true) unless noted\n";
    out += &format!(
        "verified:  {:.2} GiB loaded back and compared byte for byte\n\n",
        r.verified_bytes as f64 / (1u64 << 30) as f64
    );
    out += &format!(
        "{:<38} {:>9}  {:<8} {:<62} {}\n",
        "metric", "value", "unit", "ratio / detail", "target"
    );
    out += &ratio_line(
        "raw O_DIRECT write, file per block",
        raw_w,
        "GB/s",
        format!(
            "bound; median, min {:.2} max {:.2}",
            crate::stats::min(&r.raw_write_gbps),
            crate::stats::max(&r.raw_write_gbps)
        ),
        "",
    );
    out += &ratio_line(
        "tier store",
        st,
        "GB/s",
        format!(
            "{store_ratio:.2}x raw write (median of paired runs); min {:.2} max {:.2}",
            crate::stats::min(&r.store_gbps),
            crate::stats::max(&r.store_gbps)
        ),
        &format!(">= 0.95  {}", met(store_ratio >= 0.95)),
    );
    out += &ratio_line(
        "raw O_DIRECT read, file per block",
        raw_r,
        "GB/s",
        format!(
            "bound; median, min {:.2} max {:.2}",
            crate::stats::min(&r.raw_read_gbps),
            crate::stats::max(&r.raw_read_gbps)
        ),
        "",
    );
    out += &ratio_line(
        "tier load",
        ld,
        "GB/s",
        format!(
            "{load_ratio:.2}x raw read (median of paired runs); min {:.2} max {:.2}",
            crate::stats::min(&r.load_gbps),
            crate::stats::max(&r.load_gbps)
        ),
        &format!(">= 0.95  {}", met(load_ratio >= 0.95)),
    );
    out += &ratio_line(
        "raw 4 KiB create+write+rename",
        rs,
        "us",
        format!(
            "median, 4096 fan-out dirs; p99 {:.1} us; one dir: {:.1} us",
            us(&r.raw_store_4k_ns, 0.99),
            us(&r.raw_store_4k_flat_ns, 0.5)
        ),
        "",
    );
    out += &ratio_line(
        "tier 4 KiB store round trip",
        ts,
        "us",
        format!(
            "{:.2}x raw; p99 {:.1} us",
            ts / rs,
            us(&r.store_4k_ns, 0.99)
        ),
        &format!("<= 1.5x  {}", met(ts / rs <= 1.5)),
    );
    out += &ratio_line(
        "raw 4 KiB open+read",
        rl,
        "us",
        format!(
            "median, 4096 fan-out dirs; p99 {:.1} us",
            us(&r.raw_load_4k_ns, 0.99)
        ),
        "",
    );
    out += &ratio_line(
        "tier 4 KiB load round trip",
        tl,
        "us",
        format!("{:.2}x raw; p99 {:.1} us", tl / rl, us(&r.load_4k_ns, 0.99)),
        &format!("<= 1.5x  {}", met(tl / rl <= 1.5)),
    );
    out += &ratio_line(
        "64 KiB blocks, 16-block jobs, store",
        r.small_store_blocks_per_s,
        "blocks/s",
        format!(
            "{:.2}x raw create+write+rename ({:.0}/s); {:.0}/s in a new directory",
            r.small_store_blocks_per_s / r.raw_small_store_blocks_per_s,
            r.raw_small_store_blocks_per_s,
            r.small_store_cold_blocks_per_s
        ),
        "",
    );
    out += &ratio_line(
        "64 KiB blocks, 16-block jobs, load",
        r.small_load_blocks_per_s,
        "blocks/s",
        format!(
            "{:.2}x raw open+read ({:.0}/s); {} blocks",
            r.small_load_blocks_per_s / r.raw_small_load_blocks_per_s,
            r.raw_small_load_blocks_per_s,
            p.small_blocks
        ),
        "",
    );
    out += &ratio_line(
        "lookup, non-shared",
        r.lookup_ns_per_key,
        "ns/key",
        format!(
            "batches of 64, {} resident, answered in the same call",
            r.lookup_resident
        ),
        "",
    );
    out += &ratio_line(
        "restart recovery",
        r.recovery_secs,
        "s",
        format!(
            "{} blocks ({} page cache)",
            r.recovery_blocks,
            if r.recovery_cold {
                "cold: dropped"
            } else {
                "warm: could not drop"
            }
        ),
        "",
    );
    out
}

pub fn json(p: &Params, r: &Results) -> String {
    let q = |v: &[u64], x: f64| percentile(v, x);
    format!(
        "{{\"backend\":\"disk\",\"describe\":{:?},\"io_threads\":{},\"blocks\":{},\"block_bytes\":{},\"job_blocks\":{},\"repeat\":{},\
\"raw_write_gbps\":{:.3},\"store_gbps\":{:.3},\"store_over_raw\":{:.3},\"raw_read_gbps\":{:.3},\"load_gbps\":{:.3},\"load_over_raw\":{:.3},\
\"raw_store_4k_ns_p50\":{},\"store_4k_ns_p50\":{},\"store_4k_ns_p99\":{},\"raw_load_4k_ns_p50\":{},\"load_4k_ns_p50\":{},\"load_4k_ns_p99\":{},\
\"small_store_blocks_per_s\":{:.0},\"small_store_cold_blocks_per_s\":{:.0},\"small_load_blocks_per_s\":{:.0},\"raw_small_store_blocks_per_s\":{:.0},\"raw_small_load_blocks_per_s\":{:.0},\"lookup_ns_per_key\":{:.1},\
\"recovery_blocks\":{},\"recovery_secs\":{:.3},\"recovery_cold_cache\":{},\"verified_bytes\":{}}}\n",
        r.describe,
        r.io_threads,
        r.blocks,
        p.block_bytes,
        p.job_blocks,
        p.repeat,
        median(&r.raw_write_gbps),
        median(&r.store_gbps),
        crate::stats::paired_ratio(&r.raw_write_gbps, &r.store_gbps),
        median(&r.raw_read_gbps),
        median(&r.load_gbps),
        crate::stats::paired_ratio(&r.raw_read_gbps, &r.load_gbps),
        q(&r.raw_store_4k_ns, 0.5),
        q(&r.store_4k_ns, 0.5),
        q(&r.store_4k_ns, 0.99),
        q(&r.raw_load_4k_ns, 0.5),
        q(&r.load_4k_ns, 0.5),
        q(&r.load_4k_ns, 0.99),
        r.small_store_blocks_per_s,
        r.small_store_cold_blocks_per_s,
        r.small_load_blocks_per_s,
        r.raw_small_store_blocks_per_s,
        r.raw_small_load_blocks_per_s,
        r.lookup_ns_per_key,
        r.recovery_blocks,
        r.recovery_secs,
        r.recovery_cold,
        r.verified_bytes
    )
}
