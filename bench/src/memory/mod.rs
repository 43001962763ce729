//! The memory backend's run: bandwidth against memcpy, 4 KiB job latency,
//! lookup/touch cost and memory per block, each phase skippable, into one
//! report; with `--persist-path`, bandwidth on a persistent arena and the
//! reopen of a filled one.

mod bandwidth;
mod latency;
mod lookup;
mod prefault;
mod prefault_report;
mod reopen;
mod verify;

use crate::cli::Settings;
use crate::report::Report;
use std::path::{Path, PathBuf};

/// A new directory under `--persist-path`, removed with its arena files
/// when dropped (a 16 GiB arena on tmpfs is 16 GiB of memory).
struct ArenaDir(PathBuf);

impl ArenaDir {
    fn new(parent: &Path) -> Result<ArenaDir, String> {
        let dir = parent.join(format!("kvtier-bench-{}", std::process::id()));
        std::fs::create_dir_all(&dir)
            .map_err(|e| format!("--persist-path: cannot create {}: {e}", dir.display()))?;
        Ok(ArenaDir(dir))
    }
}

impl Drop for ArenaDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn run(s: &Settings) -> Result<Report, String> {
    let mut report = Report::start("memory", s.quick);
    let helper_threads = report.cores();
    // Each phase opens its own tier; all report the library's thread count.
    let mut io_threads = None;
    // The persistent arenas' files live in a directory of this run's own,
    // deleted when the run ends, however it ends.
    let arena_dir = s.persist_path.as_deref().map(ArenaDir::new).transpose()?;
    let arena_path = arena_dir.as_ref().map(|d| d.0.as_path());
    if !s.skip_bandwidth {
        let r = bandwidth::run(s, helper_threads, arena_path)?;
        io_threads = Some(r.io_threads);
        r.report(s, &mut report);
    }
    if let Some(dir) = arena_path {
        let r = reopen::run(s, helper_threads, dir)?;
        io_threads = io_threads.or(Some(r.io_threads));
        r.report(&mut report);
    }
    if !s.skip_latency {
        let r = latency::run(s)?;
        io_threads = io_threads.or(Some(r.io_threads));
        r.report(s, &mut report);
    }
    if !s.skip_lookup {
        let r = lookup::run(s)?;
        io_threads = io_threads.or(Some(r.io_threads));
        r.report(s, &mut report);
    }
    let source = if s.io_threads.is_some() {
        ("--io-threads", "--io-threads")
    } else {
        ("library default", "library default, min(cores, 4)")
    };
    report.io_threads(io_threads.unwrap_or(0), source.0, source.1);
    report.finish();
    Ok(report)
}
