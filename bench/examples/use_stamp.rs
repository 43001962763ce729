//! What the use stamp costs a disk tier's load (a load stamps its block
//! file's access time when it is more than a minute old, so `kvtier gc` can
//! remove the least recently used blocks of shared storage first): loads of
//! blocks whose access time was set an hour back (each load stamps) against
//! loads of the same blocks just stamped (none does), in the same run,
//! `ROUNDS` times; and a bare `futimens` on an open file, timed alone.
//!
//!     cargo run --release -p kvtier-bench --example use_stamp -- [DIR] [BLOCKS] [SIZE] [ROUNDS]

use kvtier::{PrimaryBuffer, Tier, TierConfig};
use std::fs::{File, FileTimes};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

const JOB: usize = 64;
const WINDOW: usize = 4;

fn main() {
    let mut args = std::env::args().skip(1);
    let dir = PathBuf::from(args.next().unwrap_or_else(|| {
        std::env::temp_dir()
            .join(format!("kvtier-use-stamp-{}", std::process::id()))
            .display()
            .to_string()
    }));
    let blocks: usize = args.next().map_or(4096, |a| a.parse().expect("BLOCKS"));
    let bb = kvtier::parse_size("SIZE", &args.next().unwrap_or_else(|| "64KiB".into()))
        .expect("SIZE") as usize;
    let rounds: usize = args.next().map_or(5, |a| a.parse().expect("ROUNDS"));
    let _ = std::fs::remove_dir_all(&dir);
    let mut cfg = TierConfig::default();
    for (k, v) in [
        ("backend", "disk"),
        ("path", &dir.display().to_string()),
        ("namespace", "kvtier-bench/use-stamp"),
        ("capacity_bytes", &((blocks + 64) * bb).to_string()),
    ] {
        cfg.set(k, v).unwrap();
    }
    let rows = JOB * WINDOW;
    let mut buf = vec![0u8; rows * bb + 4096];
    let off = buf.as_ptr().align_offset(4096);
    // SAFETY: the rows outlive the tier, which is dropped before main returns.
    let primary = unsafe { PrimaryBuffer::new(buf.as_mut_ptr().add(off), rows * bb, bb) }.unwrap();
    let tier = Tier::new(&cfg, primary).unwrap();
    let keys: Vec<u8> = (0..blocks as u64)
        .flat_map(|i| i.to_le_bytes().repeat(2))
        .collect();
    run(&tier, 1, &keys, blocks, true);
    let files = block_files(&dir);
    assert_eq!(files.len(), blocks, "one file per block");
    println!(
        "{blocks} blocks of {bb} bytes in {}; {}",
        dir.display(),
        tier.describe()
    );
    let (mut stamped, mut fresh) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        let an_hour_ago = SystemTime::now() - Duration::from_secs(3600);
        for f in &files {
            let times = FileTimes::new().set_accessed(an_hour_ago);
            File::open(f).unwrap().set_times(times).unwrap();
        }
        let t = Instant::now();
        run(&tier, 100 + round as u64 * 2, &keys, blocks, false);
        stamped.push(t.elapsed().as_secs_f64());
        let accessed = std::fs::metadata(&files[0]).unwrap().accessed().unwrap();
        assert!(
            accessed > an_hour_ago + Duration::from_secs(3000),
            "the load stamped it"
        );
        let t = Instant::now();
        run(&tier, 101 + round as u64 * 2, &keys, blocks, false);
        fresh.push(t.elapsed().as_secs_f64());
        println!(
            "round {round}: loads that stamp {:.2} us each, loads that do not {:.2} us each",
            stamped[round] * 1e6 / blocks as f64,
            fresh[round] * 1e6 / blocks as f64
        );
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2] * 1e6 / blocks as f64
    };
    let (s, f) = (median(&mut stamped), median(&mut fresh));
    println!(
        "median per load: {s:.2} us stamping, {f:.2} us not: the stamp costs {:.2} us",
        s - f
    );
    let t = Instant::now();
    let opened: Vec<File> = files.iter().map(|p| File::open(p).unwrap()).collect();
    let open_secs = t.elapsed().as_secs_f64();
    let t = Instant::now();
    for f in &opened {
        f.set_times(FileTimes::new().set_accessed(SystemTime::now()))
            .unwrap();
    }
    println!(
        "futimens alone: {:.2} us per file (opening them: {:.2} us each)",
        t.elapsed().as_secs_f64() * 1e6 / blocks as f64,
        open_secs * 1e6 / blocks as f64
    );
    drop(tier);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Stores (`store`) or loads every block, `JOB` a job, `WINDOW` in flight.
fn run(tier: &Tier, job_base: u64, keys: &[u8], blocks: usize, store: bool) {
    let jobs = blocks.div_ceil(JOB);
    let (mut submitted, mut done) = (0usize, 0usize);
    while done < jobs {
        while submitted < jobs && submitted - done < WINDOW {
            let first = submitted * JOB;
            let n = JOB.min(blocks - first);
            let slot = (submitted % WINDOW) * JOB;
            let rows: Vec<i64> = (slot..slot + n).map(|r| r as i64).collect();
            let k = &keys[first * 16..(first + n) * 16];
            let id = job_base * 1_000_000 + submitted as u64;
            match store {
                true => tier.submit_store(id, k, 16, &rows).unwrap(),
                false => tier.submit_load(id, k, 16, &rows).unwrap(),
            }
            submitted += 1;
        }
        for r in tier.poll(WINDOW) {
            assert!(r.is_ok(), "{r:?}");
            done += 1;
        }
        tier.wait(Duration::from_millis(1));
    }
}

fn block_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for ns in std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter(|e| e.path().is_dir())
    {
        for fan in std::fs::read_dir(ns.path())
            .unwrap()
            .flatten()
            .filter(|e| e.path().is_dir())
        {
            for f in std::fs::read_dir(fan.path()).unwrap().flatten() {
                if f.file_name().to_string_lossy().ends_with(".kvb") {
                    out.push(f.path());
                }
            }
        }
    }
    out
}
