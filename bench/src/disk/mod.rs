//! `--backend disk`: the disk backend against raw file I/O on the same
//! directory, measured in the same run, into the same report as the memory
//! backend. This file resolves the disk settings and runs the phases.
//!
//! Bounds, all with O_DIRECT (the page cache is bypassed by both sides):
//! - bandwidth: one file per block, created, written and closed (or opened,
//!   read and closed) by as many threads as the tier has I/O threads;
//! - a full tier's stores: the same writes, each with the unlink of an older
//!   file;
//! - 4 KiB store: exclusive create + O_DIRECT write + close + rename, the
//!   least a crash-safe store can do; 4 KiB load: open + O_DIRECT read + close.

mod bandwidth;
mod files;
mod latency;
mod recovery;
mod shared;
mod small;
mod steady;

use crate::cli::Settings;
use crate::report::{gib, Report};
use std::path::PathBuf;

/// Key namespaces, so the phases' key sets never collide (the memory
/// backend's are in `data`).
const NS_BANDWIDTH: u64 = 11;
const NS_SMALL: u64 = 12;
const NS_LATENCY: u64 = 13;
const NS_RECOVERY: u64 = 14;
// 15: the full-tier passes (`steady`).

/// The settings with the disk backend's own defaults applied.
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
    /// A directory the recovery phase keeps and reuses (None: under `dir`,
    /// deleted).
    pub recovery_dir: Option<PathBuf>,
    /// The tier's io_timeout_ms (None: the library's default).
    pub io_timeout_ms: Option<u32>,
    pub progress: bool,
}

impl Params {
    fn new(s: &Settings) -> Params {
        Params {
            dir: s.dir.clone().unwrap_or_else(|| {
                std::env::temp_dir().join(format!("kvtier-bench-{}", std::process::id()))
            }),
            // The library's default for disk: enough requests in flight to
            // keep a device's queue busy.
            io_threads: s.io_threads.unwrap_or(64),
            data_bytes: s.data_bytes,
            block_bytes: s.block_bytes,
            job_blocks: s.job_blocks,
            window: s.window.unwrap_or(4),
            repeat: s.repeat,
            // Every 4 KiB round trip creates a file: fewer than in memory.
            latency_iters: s.latency_iters.min(5_000),
            small_blocks: if s.quick { 512 } else { 4096 },
            recovery_blocks: s.recovery_blocks,
            recovery_dir: s.recovery_dir.clone(),
            io_timeout_ms: s.io_timeout_ms,
            progress: s.progress,
        }
    }
}

pub fn run(s: &Settings) -> Result<Report, String> {
    let p = Params::new(s);
    files::fresh_dir(&p.dir)?;
    let outcome = run_in(s, &p);
    let _ = std::fs::remove_dir_all(&p.dir);
    outcome
}

fn run_in(s: &Settings, p: &Params) -> Result<Report, String> {
    let mut report = Report::start("disk", s.quick);
    let source = if s.io_threads.is_some() {
        "--io-threads"
    } else {
        "disk default"
    };
    report.io_threads(p.io_threads, source, source);
    if s.recovery_only {
        let recovery = recovery::run(p)?;
        recovery.report(&mut report);
        report.field("verified_bytes", recovery.verified_bytes);
        report.verified(format!(
            "{} loaded back (1 in 64 recovered blocks)",
            gib(recovery.verified_bytes)
        ));
        report.finish();
        return Ok(report);
    }
    let bandwidth = bandwidth::run(p)?;
    let steady = steady::run(p)?;
    let latency = latency::run(p)?;
    let small = small::run(p)?;
    let recovery = recovery::run(p)?;
    bandwidth.report(p, &mut report);
    if let Some(steady) = &steady {
        steady.report(&mut report);
    }
    latency.report(&mut report);
    small.report(&mut report);
    recovery.report(&mut report);
    let verified = bandwidth.verified_bytes
        + steady.as_ref().map_or(0, |s| s.verified_bytes)
        + latency.verified_bytes
        + recovery.verified_bytes;
    report.field("verified_bytes", verified);
    report.verified(format!(
        "{} loaded back (bandwidth, the full tier's newest quarter, every 4 KiB round trip, 1 in 64 recovered blocks)",
        gib(verified)
    ));
    report.finish();
    Ok(report)
}
