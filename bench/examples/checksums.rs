//! The payload checksum's speed on one core: XXH3-64 (written since format
//! version 2) against XXH64 (version 1), over one 2 MiB or 64 KiB buffer
//! again and again (hot: in cache) and over 512 MiB in chunks of that size
//! (cold: from memory, as a store's rows usually are), the 512 MiB on 4 KiB
//! pages and on transparent huge pages. Best of 5 passes.
//!
//! The page size matters from memory: cold rows on 4 KiB pages read more
//! slowly than on huge pages, and software prefetching does not close the
//! gap (docs/runs/checksums.md). A store from an engine buffer of 4 KiB
//! pages (vLLM's, or `numpy` over an anonymous mapping) pays the slower rate.
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
    for huge in [false, true] {
        let big = Region::new(512 << 20, huge);
        println!(
            "{}:",
            if huge {
                "cold rows on huge pages (MADV_HUGEPAGE)"
            } else {
                "cold rows on 4 KiB pages (MADV_NOHUGEPAGE)"
            }
        );
        measure(big.bytes());
    }
}

fn measure(big: &[u8]) {
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

/// A private anonymous mapping, 2 MiB aligned, filled with a pattern.
struct Region {
    base: *mut libc::c_void,
    mapped: usize,
    start: usize,
    len: usize,
}

impl Region {
    fn new(len: usize, huge: bool) -> Region {
        let align = 2 << 20;
        let mapped = len + align;
        // SAFETY: a fresh private anonymous mapping, unmapped in Drop; the
        // slice below lies inside it.
        unsafe {
            let base = libc::mmap(
                std::ptr::null_mut(),
                mapped,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            assert_ne!(base, libc::MAP_FAILED, "mmap of {mapped} bytes");
            let start = (base as usize).next_multiple_of(align);
            let advice = if huge {
                libc::MADV_HUGEPAGE
            } else {
                libc::MADV_NOHUGEPAGE
            };
            libc::madvise(start as *mut libc::c_void, len, advice);
            let bytes = std::slice::from_raw_parts_mut(start as *mut u8, len);
            for (i, b) in bytes.iter_mut().enumerate() {
                *b = (i * 7 + i / 4096) as u8;
            }
            Region {
                base,
                mapped,
                start,
                len,
            }
        }
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: inside the mapping, initialised in `new`.
        unsafe { std::slice::from_raw_parts(self.start as *const u8, self.len) }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: our own mapping.
        unsafe { libc::munmap(self.base, self.mapped) };
    }
}
