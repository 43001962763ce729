//! Drives one Redis tier with loads or stores only, for profiling the data
//! path (`perf stat`/`perf record` on this process; the server's CPU share
//! from /proc alongside): `load` stores `MiB` of blocks once, then repeats
//! timed load passes for `secs` seconds; `store` clears the tier before each
//! timed store pass and has the server release the freed memory (`MEMORY
//! PURGE`), so every pass is a first fill; `steady` gives the tier a capacity of half a pass and
//! stores new keys every pass, so every store evicts (and deletes) an older
//! block. Prints GB/s per pass, the server's CPU share during the timed
//! passes and this process's CPU seconds per GB. With RL_PERF_SERVER=1 it
//! also runs `perf stat` on the server (system calls, page faults,
//! task-clock) for the timed passes only.
//!
//!     cargo run --release -p kvtier-bench --example redis_loads -- \
//!         redis://127.0.0.1:PORT [load|store|steady] [block KiB] [MiB] [secs] \
//!         [io_threads] [window] [job_blocks] [connections]
//!
//! Defaults: load, 2048 KiB, 1024 MiB, 10 s, 8 threads, 4 jobs of 16 blocks
//! in flight, the library's connections. RL_CLUSTER=1 opens the tier with
//! `cluster=on` (URL: any node of a Redis Cluster; the server CPU share is
//! then that node's alone). Loads are checked by the tier's
//! checksums only (the bench proper verifies every byte).

mod common;

use kvtier::{PrimaryBuffer, Tier, TierConfig};
use std::time::{Duration, Instant};

fn arg<T: std::str::FromStr>(args: &[String], i: usize, default: T) -> T {
    args.get(i).and_then(|a| a.parse().ok()).unwrap_or(default)
}

/// CPU ticks (user + system) of process `pid`, from /proc/<pid>/stat.
fn ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    // Fields after the command: state is [0]; utime [11], stime [12].
    f.get(11).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
        + f.get(12).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
}

/// This process's user and system CPU seconds.
fn own_cpu() -> (f64, f64) {
    // SAFETY: getrusage fills the struct.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let s = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    (s(ru.ru_utime), s(ru.ru_stime))
}

fn server_pid(url: &str) -> Option<u32> {
    let port = url.rsplit(':').next()?.trim_end_matches('/');
    let out = std::process::Command::new("redis-cli")
        .args(["-p", port, "info", "server"])
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("process_id:"))
        .and_then(|v| v.trim().parse().ok())
}

/// `MEMORY PURGE` on the server of `url` (jemalloc returns its free memory
/// to the kernel), best effort. In a cluster, only that node's.
fn release_free_memory(url: &str) {
    let Some(port) = url.rsplit(':').next().map(|p| p.trim_end_matches('/')) else {
        return;
    };
    let _ = std::process::Command::new("redis-cli")
        .args(["-p", port, "memory", "purge"])
        .output();
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let url = args.first().cloned().expect("usage: redis_loads URL ...");
    let store = args.get(1).is_some_and(|a| a == "store" || a == "steady");
    // steady: capacity half a pass, new keys every pass (every store evicts).
    let steady = args.get(1).is_some_and(|a| a == "steady");
    let block = arg(&args, 2, 2048usize) << 10;
    let mib = arg(&args, 3, 1024usize);
    let secs = arg(&args, 4, 10.0f64);
    let threads = arg(&args, 5, 8usize);
    let window = arg(&args, 6, 4usize);
    let jb = arg(&args, 7, 16usize);
    let connections = arg(&args, 8, 0usize);
    let blocks = ((mib << 20) / block / jb * jb).max(jb);
    let rows = window * jb;
    let len = rows * block;
    let layout = std::alloc::Layout::from_size_align(len, 4096).unwrap();
    // SAFETY: non-zero size; never freed (the process ends).
    let ptr = unsafe { std::alloc::alloc(layout) };
    for i in 0..len {
        // SAFETY: within the allocation.
        unsafe { *ptr.add(i) = (i / 4096) as u8 };
    }
    // SAFETY: the rows live as long as the process.
    let primary = unsafe { PrimaryBuffer::new(ptr, len, block) }.unwrap();
    let mut cfg = TierConfig::default();
    cfg.set("backend", "redis").unwrap();
    cfg.set("url", &url).unwrap();
    cfg.set("sharing", "owned").unwrap();
    let cluster = std::env::var("RL_CLUSTER").is_ok_and(|v| v == "1");
    cfg.set("cluster", if cluster { "on" } else { "off" })
        .unwrap();
    cfg.set("key_prefix", &format!("rl{}", std::process::id()))
        .unwrap();
    let capacity = if steady { blocks / 2 } else { blocks + 64 };
    cfg.set("capacity_bytes", &(capacity * block).to_string())
        .unwrap();
    cfg.set("io_threads", &threads.to_string()).unwrap();
    if connections > 0 {
        cfg.set("connections", &connections.to_string()).unwrap();
    }
    let tier = Tier::new(&cfg, primary).unwrap();
    let mut first = 0u64;
    if !store || steady {
        common::pass(&tier, true, first, blocks, jb, window, rows, block);
        if steady {
            first += blocks as u64;
        }
    }
    let pid = server_pid(&url);
    // RL_PERF_SERVER=1: `perf stat` on the server for the timed passes only.
    let perf = std::env::var("RL_PERF_SERVER").ok().and(pid).map(|p| {
        let c = std::process::Command::new("perf")
            .args(["stat", "-e", "syscalls:sys_enter_writev,syscalls:sys_enter_write,syscalls:sys_enter_read,syscalls:sys_enter_epoll_wait,page-faults,task-clock", "-p"])
            .arg(p.to_string())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(300));
        c
    });
    let own0 = own_cpu();
    let hz = 100.0;
    let (t0, s0) = (Instant::now(), pid.map_or(0, ticks));
    let mut rates = Vec::new();
    while t0.elapsed().as_secs_f64() < secs {
        if store && !steady {
            tier.clear().expect("clear the tier");
            tier.drain();
            // A first fill faults fresh memory in: not the memory the
            // clear's DELs just freed, which jemalloc keeps for ~10 s.
            release_free_memory(&url);
        }
        rates.push(common::pass(
            &tier, store, first, blocks, jb, window, rows, block,
        ));
        if steady {
            first += blocks as u64;
        }
    }
    let wall = t0.elapsed().as_secs_f64();
    let server_cpu = pid.map_or(f64::NAN, |p| (ticks(p) - s0) as f64 / hz / wall);
    let own = own_cpu();
    let gb = (rates.len() * blocks * block) as f64 / 1e9;
    if let Some(mut c) = perf {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(c.id() as i32, libc::SIGINT) };
        let _ = c.wait();
        println!("timed: {} requests", rates.len() * blocks);
    }
    rates.sort_by(f64::total_cmp);
    println!(
        "{} {} KiB x{} blocks, {threads} threads, window {window}, {jb}-block jobs: median {:.2} GB/s over {} passes (min {:.2} max {:.2}); server CPU {:.2} cores; this process {:.3} s user + {:.3} s sys per GB",
        if store { "store" } else { "load" },
        block >> 10,
        blocks,
        rates[rates.len() / 2],
        rates.len(),
        rates[0],
        rates[rates.len() - 1],
        server_cpu,
        (own.0 - own0.0) / gb,
        (own.1 - own0.1) / gb,
    );
    tier.clear().expect("clear the tier");
    tier.drain();
}
