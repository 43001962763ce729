//! Sealed against unsealed tiers in the same run: 2 MiB store and load
//! bandwidth on the disk backend (O_DIRECT where the directory allows it)
//! and on a Redis server this program starts, same threads and job shape,
//! repetitions alternating between the two so that both see the same noise;
//! beside them, the AEADs' own throughput on one core, so the reader sees
//! whether the seal or the device is the bound.
//!
//!     cargo run --release -p kvtier-bench --example seal_vs_plain -- [MiB per repetition] [repetitions]
//!
//! Defaults: 512 MiB, 5 repetitions. The disk runs in a fresh directory
//! under the system temp dir; Redis is skipped when redis-server is not on
//! PATH.

mod common;

use kvtier::{PrimaryBuffer, Tier, TierConfig};
use ring::aead::{self, Aad, LessSafeKey, Nonce, UnboundKey};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BLOCK: usize = 2 << 20;
const JOB_BLOCKS: usize = 16;
const WINDOW: usize = 4;
const SEAL: &str = "5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e";

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// GB/s of one AEAD sealing 2 MiB buffers in place on this thread.
fn aead_gbps(alg: &'static aead::Algorithm, open: bool) -> f64 {
    let key = LessSafeKey::new(UnboundKey::new(alg, &[7u8; 32]).unwrap());
    let mut buf = vec![1u8; BLOCK];
    let nonce = || Nonce::assume_unique_for_key([3u8; 12]);
    let tag = key
        .seal_in_place_separate_tag(nonce(), Aad::empty(), &mut buf)
        .unwrap();
    let sealed = buf.clone();
    let mut rates = Vec::new();
    for _ in 0..5 {
        let start = Instant::now();
        let n = 64;
        for _ in 0..n {
            if open {
                buf.copy_from_slice(&sealed);
                key.open_in_place_separate_tag(nonce(), Aad::empty(), tag, &mut buf, 0..)
                    .unwrap();
            } else {
                let _tag = key
                    .seal_in_place_separate_tag(nonce(), Aad::empty(), &mut buf)
                    .unwrap();
            }
        }
        rates.push((n * BLOCK) as f64 / start.elapsed().as_secs_f64() / 1e9);
    }
    median(rates)
}

/// The primary buffer: page-aligned rows, as an engine's pinned buffer, so
/// that O_DIRECT moves blocks in place.
struct Rows {
    ptr: *mut u8,
    len: usize,
}

impl Rows {
    fn new(len: usize) -> Rows {
        let layout = std::alloc::Layout::from_size_align(len, 4096).unwrap();
        // SAFETY: non-zero size; freed in drop with the same layout.
        let ptr = unsafe { std::alloc::alloc(layout) };
        assert!(!ptr.is_null());
        // SAFETY: len bytes just allocated.
        unsafe { std::ptr::write_bytes(ptr, 0x42, len) };
        Rows { ptr, len }
    }
}

impl Drop for Rows {
    fn drop(&mut self) {
        let layout = std::alloc::Layout::from_size_align(self.len, 4096).unwrap();
        // SAFETY: allocated in new with this layout; no tier uses it any more.
        unsafe { std::alloc::dealloc(self.ptr, layout) };
    }
}

/// Median store and load GB/s of unsealed and sealed tiers built from
/// `config`, alternating per repetition.
fn compare(name: &str, config: &TierConfig, mib: usize, reps: usize, rows: &Rows) {
    let blocks = (mib << 20) / BLOCK / JOB_BLOCKS * JOB_BLOCKS;
    let mut sealed_config = config.clone();
    sealed_config.set("seal_key", SEAL).unwrap();
    let mut rates = [[Vec::new(), Vec::new()], [Vec::new(), Vec::new()]];
    let nrows = rows.len / BLOCK;
    for rep in 0..reps {
        for (mode, cfg) in [config, &sealed_config].into_iter().enumerate() {
            // SAFETY: the rows outlive the tier, dropped below.
            let primary = unsafe { PrimaryBuffer::new(rows.ptr, rows.len, BLOCK) }.unwrap();
            let tier = Tier::new(cfg, primary).unwrap();
            let first_key = (rep * 2 + mode) as u64 * 1_000_000;
            rates[mode][0].push(common::pass(
                &tier, true, first_key, blocks, JOB_BLOCKS, WINDOW, nrows, BLOCK,
            ));
            rates[mode][1].push(common::pass(
                &tier, false, first_key, blocks, JOB_BLOCKS, WINDOW, nrows, BLOCK,
            ));
            tier.clear().expect("clear the tier");
            tier.drain();
            drop(tier);
        }
    }
    let [plain, sealed] = rates.map(|m| m.map(median));
    println!(
        "{name:5} 2 MiB store: unsealed {:.2} GB/s, sealed {:.2} GB/s, ratio {:.2}",
        plain[0],
        sealed[0],
        sealed[0] / plain[0]
    );
    println!(
        "{name:5} 2 MiB load:  unsealed {:.2} GB/s, sealed {:.2} GB/s, ratio {:.2}",
        plain[1],
        sealed[1],
        sealed[1] / plain[1]
    );
}

fn start_redis() -> Option<(Child, u16, std::path::PathBuf)> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .ok()?
        .local_addr()
        .ok()?
        .port();
    let dir = std::env::temp_dir().join(format!("kvtier-seal-bench-redis-{}", std::process::id()));
    std::fs::create_dir_all(&dir).ok()?;
    let child = Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .current_dir(&dir)
        .stdout(Stdio::null())
        .spawn()
        .ok()?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Some((child, port, dir))
}

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().unwrap())
        .collect();
    let mib = args.first().copied().unwrap_or(512);
    let reps = args.get(1).copied().unwrap_or(5);
    println!(
        "one core, 2 MiB buffers: AES-256-GCM seal {:.2} GB/s, open {:.2} GB/s; \
         ChaCha20-Poly1305 seal {:.2} GB/s, open {:.2} GB/s (open includes a 2 MiB copy \
         that restores the ciphertext)",
        aead_gbps(&aead::AES_256_GCM, false),
        aead_gbps(&aead::AES_256_GCM, true),
        aead_gbps(&aead::CHACHA20_POLY1305, false),
        aead_gbps(&aead::CHACHA20_POLY1305, true),
    );
    let rows = Rows::new(64 * BLOCK);
    let capacity = format!("{}MiB", mib * 2);
    let dir = std::env::temp_dir().join(format!("kvtier-seal-bench-{}", std::process::id()));
    let mut disk = TierConfig::default();
    for (k, v) in [
        ("backend", "disk"),
        ("path", dir.to_str().unwrap()),
        ("capacity_bytes", &capacity),
    ] {
        disk.set(k, v).unwrap();
    }
    println!(
        "{} MiB per direction per repetition, {reps} repetitions, medians; io_threads 8 (default)",
        mib
    );
    compare("disk", &disk, mib, reps, &rows);
    let _ = std::fs::remove_dir_all(&dir);
    match start_redis() {
        Some((mut child, port, rdir)) => {
            let mut redis = TierConfig::default();
            let url = format!("redis://127.0.0.1:{port}");
            for (k, v) in [
                ("backend", "redis"),
                ("url", &url),
                ("capacity_bytes", &capacity),
            ] {
                redis.set(k, v).unwrap();
            }
            compare("redis", &redis, mib, reps, &rows);
            let _ = child.kill();
            let _ = child.wait();
            let _ = std::fs::remove_dir_all(rdir);
        }
        None => println!("redis: skipped (redis-server not found or did not start)"),
    }
}
