//! The payload checksum's speed on one core: XXH3-64 (written since format
//! version 2) against XXH64 (version 1), over one 2 MiB or 64 KiB buffer
//! again and again (hot: in cache) and over 512 MiB in chunks of that size
//! (cold: from memory, as a store's rows usually are). Best of 5 passes.
//!
//!     cargo run --release -p kvtier-bench --example checksums

use std::hint::black_box;
use std::time::Instant;

fn rate(bytes: usize, pass: impl Fn() -> u64) -> f64 {
    let mut best = f64::MAX;
    let mut sink = 0;
    for _ in 0..5 {
        let t = Instant::now();
        sink ^= pass();
        best = best.min(t.elapsed().as_secs_f64());
    }
    black_box(sink);
    bytes as f64 / best / 1e9
}

fn main() {
    let big: Vec<u8> = (0..512usize << 20)
        .map(|i| (i * 7 + i / 4096) as u8)
        .collect();
    let xxh64 = |b: &[u8]| twox_hash::XxHash64::oneshot(0, b);
    let xxh3 = |b: &[u8]| twox_hash::XxHash3_64::oneshot(b);
    for chunk in [2usize << 20, 64 << 10] {
        let hot = &big[..chunk];
        let reps = (256 << 20) / chunk;
        for (name, f) in [
            ("XXH64", &xxh64 as &dyn Fn(&[u8]) -> u64),
            ("XXH3-64", &xxh3),
        ] {
            let hot_rate = rate(reps * chunk, || {
                (0..reps).fold(0, |x, _| x ^ f(black_box(hot)))
            });
            let cold_rate = rate(big.len(), || {
                big.chunks(chunk).fold(0, |x, c| x ^ f(black_box(c)))
            });
            println!(
                "{name:8} {:>4} KiB: hot {hot_rate:5.1} GB/s, cold {cold_rate:5.1} GB/s",
                chunk >> 10
            );
        }
    }
}
