//! Fills a directory with blocks through a disk tier and closes it cleanly
//! (a manifest is written when `shared` is not given), or a Redis keyspace
//! (`redis://...` for DIR: a shared tier, key_prefix `kvtier`): the store the
//! `kvtier` command's benchmarks read (`kvtier verify STORE --bench`, `kvtier
//! inspect DIR` from the manifest). Each block holds its own number.
//!
//!     cargo run --release -p kvtier-bench --example fill_dir -- DIR|URL BLOCKS [SIZE] [shared]

use kvtier::{PrimaryBuffer, Tier, TierConfig};
use std::time::{Duration, Instant};

/// Blocks per store job, and jobs in flight.
const JOB: usize = 64;
const WINDOW: u64 = 4;

fn main() {
    let mut args = std::env::args().skip(1);
    let usage = "usage: fill_dir DIR BLOCKS [SIZE] [shared]";
    let dir = args.next().expect(usage);
    let blocks: usize = args.next().expect(usage).parse().expect("BLOCKS");
    let size = args.next().unwrap_or_else(|| "4KiB".into());
    let bb = kvtier::parse_size("SIZE", &size).expect("SIZE") as usize;
    let shared = args.next().is_some_and(|a| a == "shared");
    let mut cfg = TierConfig::default();
    let capacity = ((blocks + 64) * bb).to_string();
    let settings: &[(&str, &str)] = if dir.starts_with("redis://") {
        &[("backend", "redis"), ("url", &dir), ("sharing", "shared")]
    } else {
        let shared = if shared { "true" } else { "false" };
        &[("backend", "disk"), ("path", &dir), ("shared", shared)]
    };
    for &(k, v) in settings {
        cfg.set(k, v).unwrap();
    }
    cfg.set("namespace", "kvtier-bench/fill").unwrap();
    cfg.set("capacity_bytes", &capacity).unwrap();
    let rows = JOB * WINDOW as usize;
    let mut buf = vec![0u8; rows * bb + 4096];
    let off = buf.as_ptr().align_offset(4096);
    // SAFETY: the rows outlive the tier, which is dropped at the end of main.
    let primary = unsafe { PrimaryBuffer::new(buf.as_mut_ptr().add(off), rows * bb, bb) }.unwrap();
    let row_ptr = |r: usize| unsafe { buf.as_ptr().add(off + r * bb) as *mut u8 };
    let tier = Tier::new(&cfg, primary).unwrap();
    let started = Instant::now();
    let (mut submitted, mut done, mut next) = (0u64, 0u64, 0usize);
    let jobs = blocks.div_ceil(JOB) as u64;
    while done < jobs {
        while submitted < jobs && submitted - done < WINDOW {
            let n = JOB.min(blocks - next);
            let slot = (submitted % WINDOW) as usize * JOB;
            let mut keys = Vec::with_capacity(n * 16);
            for i in 0..n {
                let id = (next + i) as u64;
                keys.extend_from_slice(&id.to_le_bytes());
                keys.extend_from_slice(&(!id).to_le_bytes());
                // SAFETY: row `slot + i` is this job's, not in any job in flight.
                let row = unsafe { std::slice::from_raw_parts_mut(row_ptr(slot + i), bb) };
                row.fill(id as u8);
                row[..8].copy_from_slice(&id.to_le_bytes());
            }
            let rows: Vec<i64> = (slot..slot + n).map(|r| r as i64).collect();
            tier.submit_store(submitted, &keys, 16, &rows).unwrap();
            next += n;
            submitted += 1;
        }
        for r in tier.poll(WINDOW as usize) {
            assert!(r.is_ok(), "{r:?}");
            done += 1;
        }
        tier.wait(Duration::from_millis(5));
        if done % 1000 == 0 {
            eprint!("\r{} of {blocks} blocks", (done as usize * JOB).min(blocks));
        }
    }
    let secs = started.elapsed().as_secs_f64();
    let t = Instant::now();
    drop(tier);
    eprintln!(
        "\r{blocks} blocks of {bb} bytes in {dir}: stored in {secs:.1} s, closed in {:.1} s",
        t.elapsed().as_secs_f64()
    );
}
