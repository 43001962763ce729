//! What a `kvtier gc` running beside an engine costs its loads and stores: a
//! shared disk tier stores and loads 64 KiB blocks for a few seconds alone,
//! then as long with `kvtier gc DIR --max-bytes B` run again and again beside
//! it (B: 80% of what the directory holds, so each gc lists and removes),
//! alternating, and reports blocks per second of each, and the loads that
//! found their block gone (misses, never errors).
//!
//!     cargo run --release -p kvtier-bench --example gc_beside -- KVTIER DIR [SECONDS] [ROUNDS]
//!
//! KVTIER is the built command (target/release/kvtier).

use kvtier::{ErrorKind, PrimaryBuffer, Tier, TierConfig};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

const BB: usize = 64 << 10;
const JOB: usize = 16;

fn main() {
    let mut args = std::env::args().skip(1);
    let usage = "usage: gc_beside KVTIER DIR [SECONDS] [ROUNDS]";
    let kvtier = args.next().expect(usage);
    let dir = args.next().expect(usage);
    let secs: f64 = args.next().map_or(4.0, |a| a.parse().expect("SECONDS"));
    let rounds: usize = args.next().map_or(2, |a| a.parse().expect("ROUNDS"));
    let _ = std::fs::remove_dir_all(&dir);
    let mut cfg = TierConfig::default();
    for (k, v) in [
        ("backend", "disk"),
        ("path", dir.as_str()),
        ("shared", "true"),
        ("namespace", "kvtier-bench/gc-beside"),
        ("capacity_bytes", &(1_000_000 * BB).to_string()),
    ] {
        cfg.set(k, v).unwrap();
    }
    let rows = 2 * JOB;
    let mut buf = vec![0u8; rows * BB + 4096];
    let off = buf.as_ptr().align_offset(4096);
    // SAFETY: the rows outlive the tier, which is dropped before main returns.
    let primary = unsafe { PrimaryBuffer::new(buf.as_mut_ptr().add(off), rows * BB, BB) }.unwrap();
    let tier = Tier::new(&cfg, primary).unwrap();
    let mut next = 0u64;
    let mut job = 0u64;
    for _ in 0..128 {
        store(&tier, &mut job, &mut next);
    }
    let mut alone = Vec::new();
    let mut beside = Vec::new();
    for round in 0..rounds {
        for with_gc in [false, true] {
            let stop = AtomicBool::new(false);
            let gcs = AtomicU64::new(0);
            let (stored, loaded, missed, took) = std::thread::scope(|scope| {
                if with_gc {
                    scope.spawn(|| {
                        while !stop.load(Ordering::Relaxed) {
                            let held = bytes_in(&dir);
                            let budget = (held * 4 / 5).to_string();
                            let ran = std::process::Command::new(&kvtier)
                                .args(["gc", &dir, "--max-bytes", &budget, "--no-progress"])
                                .output()
                                .expect("kvtier gc runs");
                            assert!(
                                ran.status.success(),
                                "{}",
                                String::from_utf8_lossy(&ran.stdout)
                            );
                            gcs.fetch_add(1, Ordering::Relaxed);
                        }
                    });
                }
                let started = Instant::now();
                let (mut stored, mut loaded, mut missed) = (0u64, 0u64, 0u64);
                while started.elapsed().as_secs_f64() < secs {
                    store(&tier, &mut job, &mut next);
                    stored += JOB as u64;
                    let (l, m) = load(&tier, &mut job, next);
                    loaded += l;
                    missed += m;
                }
                stop.store(true, Ordering::Relaxed);
                (stored, loaded, missed, started.elapsed().as_secs_f64())
            });
            let line = format!(
                "round {round} {}: {:.0} stores/s, {:.0} loads/s, {missed} loads missed, {} gc runs",
                if with_gc { "with gc" } else { "alone  " },
                stored as f64 / took,
                loaded as f64 / took,
                gcs.load(Ordering::Relaxed)
            );
            println!("{line}");
            let rate = (stored + loaded) as f64 / took;
            if with_gc {
                beside.push(rate)
            } else {
                alone.push(rate)
            }
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (a, b) = (median(&mut alone), median(&mut beside));
    println!(
        "blocks/s (stores + loads): {a:.0} alone, {b:.0} with gc beside: {:.2}x",
        b / a
    );
    drop(tier);
    let _ = std::fs::remove_dir_all(&dir);
}

fn store(tier: &Tier, job: &mut u64, next: &mut u64) {
    let keys: Vec<u8> = (*next..*next + JOB as u64)
        .flat_map(|i| i.to_le_bytes().repeat(2))
        .collect();
    let rows: Vec<i64> = (0..JOB as i64).collect();
    *job += 1;
    tier.submit_store(*job, &keys, 16, &rows).unwrap();
    let r = wait(tier, *job);
    assert!(r.is_ok(), "{r:?}");
    *next += JOB as u64;
}

/// Loads the last job's worth of blocks but one: (loaded, missed).
fn load(tier: &Tier, job: &mut u64, next: u64) -> (u64, u64) {
    let first = next.saturating_sub(2 * JOB as u64);
    let keys: Vec<u8> = (first..first + JOB as u64)
        .flat_map(|i| i.to_le_bytes().repeat(2))
        .collect();
    let rows: Vec<i64> = (JOB as i64..2 * JOB as i64).collect();
    *job += 1;
    tier.submit_load(*job, &keys, 16, &rows).unwrap();
    let r = wait(tier, *job);
    match r.error {
        None => (r.num_done as u64, 0),
        Some(ErrorKind::NotFound) => (r.num_done as u64, 1),
        Some(other) => panic!("a load failed otherwise than a miss: {other:?} {r:?}"),
    }
}

fn wait(tier: &Tier, job: u64) -> kvtier::JobResult {
    loop {
        if let Some(r) = tier.poll(1).pop() {
            assert_eq!(r.job_id, job);
            return r;
        }
        tier.wait(Duration::from_millis(1));
    }
}

fn bytes_in(dir: &str) -> u64 {
    fn walk(p: &std::path::Path) -> u64 {
        std::fs::read_dir(p)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| match e.file_type() {
                Ok(t) if t.is_dir() => walk(&e.path()),
                _ if e.file_name().to_string_lossy().ends_with(".kvb") => {
                    e.metadata().map_or(0, |m| m.len())
                }
                _ => 0,
            })
            .sum()
    }
    walk(std::path::Path::new(dir))
}
