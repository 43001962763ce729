//! kvtier-bench: drives kvtier through its C ABI, the code path C engines use,
//! and reports bandwidth against memcpy, job latency, lookup cost and memory
//! per block. See `--help` and bench/README.md.

mod args;
mod bandwidth;
mod buffer;
mod capi;
mod contention;
mod data;
mod disk;
mod jobs;
mod json;
mod latency;
mod lookup;
mod progress;
mod report;
mod stats;

use args::{Settings, HELP};
use report::{Machine, Results};
use std::process::ExitCode;
use std::time::Instant;

fn main() -> ExitCode {
    let settings = match Settings::parse(std::env::args().skip(1)) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("kvtier-bench: {e}\nTry --help.");
            return ExitCode::from(2);
        }
    };
    if settings.help {
        print!("{HELP}");
        return ExitCode::SUCCESS;
    }
    if settings.disk {
        return run_disk(&settings);
    }
    match run(&settings) {
        Ok(results) => {
            if settings.json {
                print!("{}", report::json(&settings, &results));
            } else {
                print!("{}", report::table(&settings, &results));
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("kvtier-bench: FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run_disk(s: &Settings) -> ExitCode {
    let params = disk::Params {
        dir: s.dir.clone().unwrap_or_else(|| {
            std::env::temp_dir().join(format!("kvtier-bench-{}", std::process::id()))
        }),
        io_threads: s.io_threads.unwrap_or(8),
        data_bytes: s.data_bytes,
        block_bytes: s.block_bytes,
        job_blocks: s.job_blocks,
        window: s.window.unwrap_or(4),
        repeat: s.repeat,
        latency_iters: s.latency_iters.min(5_000),
        small_blocks: if s.quick { 512 } else { 4096 },
        recovery_blocks: s.recovery_blocks,
        progress: s.progress,
    };
    match disk::run(&params) {
        Ok(r) => {
            if s.json {
                print!("{}", disk::json(&params, &r));
            } else {
                print!("{}", disk::table(&params, &r));
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("kvtier-bench: FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(s: &Settings) -> Result<Results, String> {
    let start = Instant::now();
    let cpu_start = contention::Snapshot::take();
    let mut machine = Machine::probe(capi::version());
    let helper_threads = machine.cores;
    let mut io_threads = None;
    let bandwidth = if s.skip_bandwidth {
        None
    } else {
        let r = bandwidth::run(&bandwidth::Params {
            io_threads: s.io_threads,
            data_bytes: s.data_bytes,
            block_bytes: s.block_bytes,
            job_blocks: s.job_blocks,
            window: s.window,
            repeat: s.repeat,
            helper_threads,
            progress: s.progress,
        })?;
        io_threads = Some(r.io_threads);
        Some(r)
    };
    let latency = if s.skip_latency {
        None
    } else {
        let r = latency::run(&latency::Params {
            io_threads: s.io_threads,
            iterations: s.latency_iters,
            warmup: s.latency_warmup,
            progress: s.progress,
        })?;
        io_threads = io_threads.or(Some(r.io_threads));
        Some(r)
    };
    let lookup = if s.skip_lookup {
        None
    } else {
        let r = lookup::run(&lookup::Params {
            io_threads: s.io_threads,
            small: s.lookup_small.min(s.lookup_large),
            large: s.lookup_large,
            batch: s.lookup_batch,
            pool_keys: s.lookup_pool_keys,
            runs: s.lookup_runs,
            run_secs: s.lookup_run_secs,
            progress: s.progress,
        })?;
        io_threads = io_threads.or(Some(r.io_threads));
        Some(r)
    };
    machine.contention = cpu_start.as_ref().and_then(contention::Snapshot::since);
    Ok(Results {
        machine,
        io_threads: io_threads.unwrap_or(0),
        bandwidth,
        latency,
        lookup,
        elapsed_secs: start.elapsed().as_secs_f64(),
    })
}
