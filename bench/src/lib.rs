//! kvtier-bench: drives kvtier through its C ABI, the code path C engines use,
//! and reports bandwidth against memcpy (or raw O_DIRECT I/O for the disk
//! backend, the redis crate and redis-benchmark for the Redis backend), job latency, lookup cost and memory per block. See `--help` and
//! bench/README.md. This file picks the backend and prints its report; the
//! `kvtier-bench` binary (`main.rs`) and `kvtier bench` (`cli/`) both run it.

mod buffer;
mod capi;
mod cli;
mod contention;
mod data;
mod disk;
mod jobs;
mod machine;
mod memory;
mod primary;
mod progress;
mod redis;
mod report;
mod stats;

use cli::{Backend, Settings};
use std::ffi::OsString;
use std::process::ExitCode;

/// Runs the benchmark with the command line `args` (the first one names the
/// program, as `std::env::args_os()` does).
pub fn run(args: impl IntoIterator<Item = OsString>) -> ExitCode {
    let settings = Settings::from_args(args);
    if settings.backend == Backend::Redis {
        if let Some(reason) = redis::skip_reason(&settings) {
            // Not a failure: this machine has no server to measure. The
            // marker is what CTest's SKIP_REGULAR_EXPRESSION matches.
            eprintln!("kvtier-bench: KVTIER-SKIP: {reason}");
            return ExitCode::SUCCESS;
        }
    }
    let report = match settings.backend {
        Backend::Memory => memory::run(&settings),
        Backend::Disk => disk::run(&settings),
        Backend::Redis => redis::run(&settings),
    };
    match report {
        Ok(report) if settings.json => {
            print!("{}", report.json());
            ExitCode::SUCCESS
        }
        Ok(report) => {
            print!("{}", report.table());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("kvtier-bench: FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}
