//! The memory backend's run: bandwidth against memcpy, 4 KiB job latency,
//! lookup/touch cost and memory per block, each phase skippable, into one
//! report.

mod bandwidth;
mod latency;
mod lookup;
mod prefault;
mod prefault_report;
mod verify;

use crate::cli::Settings;
use crate::report::Report;

pub fn run(s: &Settings) -> Result<Report, String> {
    let mut report = Report::start("memory", s.quick);
    let helper_threads = report.cores();
    // Each phase opens its own tier; all report the library's thread count.
    let mut io_threads = None;
    if !s.skip_bandwidth {
        let r = bandwidth::run(s, helper_threads)?;
        io_threads = Some(r.io_threads);
        r.report(s, &mut report);
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
