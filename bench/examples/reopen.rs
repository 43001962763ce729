//! Times reopening a disk tier directory that `kvtier-bench --backend disk
//! --recovery-dir DIR` filled, without filling or dropping anything: a
//! target for `perf record` and `strace -c` on recovery alone. Each reopen
//! after the first reads the manifest the previous one's clean close wrote;
//! with `scan` the manifest is removed before each open, which then scans;
//! with `hint` it is renamed to the order hint (as a crash after an open
//! from it leaves it), and the open scans in the hint's order.
//!
//!     cargo run --release -p kvtier-bench --example reopen -- DIR [TIMES] [scan|hint]

use kvtier::{PrimaryBuffer, Tier, TierConfig};
use std::time::Instant;

const B: usize = 4096;
const ROWS: usize = 64;

fn main() {
    let mut args = std::env::args().skip(1);
    let dir = args.next().expect("usage: reopen DIR [TIMES]");
    let times: usize = args.next().map_or(1, |t| t.parse().expect("TIMES"));
    let mode = args.next().unwrap_or_default();
    let mut rows = vec![0u8; ROWS * B + B];
    let off = rows.as_ptr().align_offset(B);
    // The bench's recovery phase: its namespace, and room for what it stored.
    let mut cfg = TierConfig::default();
    for (k, v) in [
        ("backend", "disk"),
        ("path", dir.as_str()),
        ("namespace", "kvtier-bench"),
        ("o_direct", "on"),
        ("capacity_bytes", &(((1usize << 24) + 64) * B).to_string()),
    ] {
        cfg.set(k, v).unwrap();
    }
    for _ in 0..times {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let manifest = entry.path().join(".manifest");
            match mode.as_str() {
                "scan" => drop(std::fs::remove_file(manifest)),
                "hint" => drop(std::fs::rename(
                    &manifest,
                    manifest.with_file_name(".order-hint"),
                )),
                _ => {}
            }
        }
        // SAFETY: the rows outlive the tier, which is dropped in this loop.
        let primary =
            unsafe { PrimaryBuffer::new(rows.as_mut_ptr().add(off), ROWS * B, B) }.unwrap();
        let t = Instant::now();
        let tier = Tier::new(&cfg, primary).unwrap();
        let secs = t.elapsed().as_secs_f64();
        let line = tier.describe();
        let how = line
            .split(", ")
            .find(|part| part.starts_with("recovered="))
            .unwrap_or("recovered=?");
        println!("{} blocks in {secs:.3} s ({how})", tier.stats().num_blocks);
    }
}
