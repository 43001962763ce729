//! Memory backend: lookup and touch cost per key, in batches, at a small and a
//! large number of resident blocks; the tier's memory per resident block at
//! the large size; and how those figures are reported.

use crate::buffer::{page_size, rss_bytes, MappedBuf};
use crate::capi::{ApiResult, Config, Tier, TIER_HIT, TIER_MISS};
use crate::cli::Settings;
use crate::data::{check_row, fill_row, write_key, Rng, KEY_LEN, NS_LOOKUP, NS_LOOKUP_MISS};
use crate::jobs::{JobIds, Kind, Stream};
use crate::progress::Progress;
use crate::report::{mib, Cmp, Report};
use crate::stats::{dist, median, paired_ratio};
use serde_json::json;
use std::time::Instant;

/// Tiny rows, so a million blocks fill in about a second.
pub const BLOCK_BYTES: usize = 64;
/// Source rows 0..HALF, destination rows HALF..2*HALF (for verification).
const HALF: usize = 4096;
/// Keys per fill job.
const FILL_JOB: usize = 16384;
/// Keys generated per fill chunk (allocated up front, so RSS readings only
/// see the tier's own memory).
const FILL_CHUNK: usize = 1 << 16;

/// ns per key, one entry per run.
pub struct AtSize {
    pub resident: u64,
    pub hit: Vec<f64>,
    pub miss: Vec<f64>,
    pub touch: Vec<f64>,
}

pub struct Memory {
    pub resident_blocks: u64,
    pub metadata_bytes: u64,
    pub rss_before: u64,
    pub rss_after: u64,
    /// Arena bytes the stores wrote, rounded up to pages.
    pub arena_touched: u64,
}

pub struct Results {
    pub io_threads: usize,
    pub small: AtSize,
    pub large: AtSize,
    pub memory: Memory,
    pub fill_secs: f64,
    pub verified_bytes: u64,
}

fn random_present(n_keys: usize, resident: usize, seed: u64) -> Vec<u8> {
    let mut rng = Rng::new(seed);
    let mut out = vec![0u8; n_keys * KEY_LEN];
    for k in out.chunks_exact_mut(KEY_LEN) {
        write_key(NS_LOOKUP, rng.below(resident as u64), k);
    }
    out
}

pub fn run(p: &Settings) -> Result<Results, String> {
    let small_blocks = p.lookup_small.min(p.lookup_large);
    let pool_keys = p.lookup_pool_keys.next_multiple_of(p.lookup_batch);
    let buf = MappedBuf::new(2 * HALF * BLOCK_BYTES)?;
    for row in 0..HALF {
        // SAFETY: no tier exists yet.
        fill_row(row as u64, unsafe {
            buf.slice_mut(row * BLOCK_BYTES, BLOCK_BYTES)
        });
    }
    // SAFETY: as above; faults the destination rows in before the RSS reading.
    unsafe { buf.slice_mut(HALF * BLOCK_BYTES, HALF * BLOCK_BYTES) }.fill(0);
    let hit_small = random_present(pool_keys, small_blocks, 11);
    let hit_large = random_present(pool_keys, p.lookup_large, 12);
    let miss = crate::data::keys(NS_LOOKUP_MISS, 0, pool_keys);
    let mut chunk = FillChunk {
        keys: vec![0u8; FILL_CHUNK * KEY_LEN],
        rows: vec![0i64; FILL_CHUNK],
    };
    let mut ids = JobIds::default();

    // The large tier first, alone, so the RSS difference is its memory only.
    let rss_before = rss_bytes();
    let large_tier = new_tier(p, &buf, p.lookup_large)?;
    let io_threads = large_tier.stats().map_err(|e| e.to_string())?.io_threads as usize;
    let bar = Progress::new(p.progress, "lookup: fill large tier", p.lookup_large as u64);
    let start = Instant::now();
    chunk.fill(&large_tier, p.lookup_large, io_threads, &mut ids, bar)?;
    let fill_secs = start.elapsed().as_secs_f64();
    let stats = large_tier.stats().map_err(|e| e.to_string())?;
    let rss_after = rss_bytes();
    if stats.num_blocks != p.lookup_large as u64 || stats.evictions != 0 {
        return Err(format!(
            "expected {} resident blocks and no evictions, found {} and {}",
            p.lookup_large, stats.num_blocks, stats.evictions
        ));
    }
    let memory = Memory {
        resident_blocks: stats.num_blocks,
        metadata_bytes: stats.metadata_bytes,
        rss_before,
        rss_after,
        // What the stores wrote plus what prefault populated ahead of them
        // (the whole arena here: the window covers this small capacity).
        arena_touched: stats
            .resident_bytes
            .max(((p.lookup_large * BLOCK_BYTES) as u64).div_ceil(page_size()) * page_size()),
    };

    // A small tier of the same configuration holding the first keys.
    let small_tier = new_tier(p, &buf, p.lookup_large)?;
    let bar = Progress::new(p.progress, "lookup: fill small tier", small_blocks as u64);
    chunk.fill(&small_tier, small_blocks, io_threads, &mut ids, bar)?;

    let mut states = vec![0u8; p.lookup_batch];
    let small = Side::new(&small_tier, small_blocks, &hit_small, &miss);
    let large = Side::new(&large_tier, p.lookup_large, &hit_large, &miss);
    for side in [&small, &large] {
        side.check_answers(p.lookup_batch, &mut states)?;
    }
    let [small, large] = measure(p, [small, large], &mut states)?;
    let verified_bytes = verify_all(&small_tier, &buf, small_blocks, &mut ids)?
        + verify_all(&large_tier, &buf, p.lookup_large, &mut ids)?;
    Ok(Results {
        io_threads,
        small,
        large,
        memory,
        fill_secs,
        verified_bytes,
    })
}

fn new_tier<'b>(
    p: &Settings,
    buf: &'b MappedBuf,
    capacity_blocks: usize,
) -> Result<Tier<'b>, String> {
    let mut cfg = Config::new().map_err(|e| e.to_string())?;
    cfg.set(
        "capacity_bytes",
        &(capacity_blocks * BLOCK_BYTES).to_string(),
    )
    .map_err(|e| e.to_string())?;
    if let Some(t) = p.io_threads {
        cfg.set("io_threads", &t.to_string())
            .map_err(|e| e.to_string())?;
    }
    Tier::new(&cfg, buf, BLOCK_BYTES).map_err(|e| e.to_string())
}

/// Key and row buffers for filling a tier, allocated once up front.
struct FillChunk {
    keys: Vec<u8>,
    rows: Vec<i64>,
}

impl FillChunk {
    /// Stores keys 0..n of NS_LOOKUP, key i from source row i % HALF.
    fn fill(
        &mut self,
        tier: &Tier,
        n: usize,
        io_threads: usize,
        ids: &mut JobIds,
        mut bar: Progress,
    ) -> Result<(), String> {
        let mut first = 0;
        while first < n {
            let count = (n - first).min(FILL_CHUNK);
            for j in 0..count {
                let i = first + j;
                write_key(
                    NS_LOOKUP,
                    i as u64,
                    &mut self.keys[j * KEY_LEN..][..KEY_LEN],
                );
                self.rows[j] = (i % HALF) as i64;
            }
            Stream {
                kind: Kind::Store,
                keys: &self.keys[..count * KEY_LEN],
                key_len: KEY_LEN,
                rows: &self.rows[..count],
                job_blocks: FILL_JOB,
                window: 2 * io_threads,
                block_bytes: BLOCK_BYTES,
            }
            .run(tier, ids, |_| {})?;
            bar.add(count as u64);
            first += count;
        }
        bar.finish();
        Ok(())
    }
}

/// One tier under measurement, with its key pools and pool positions.
struct Side<'a, 'b> {
    tier: &'a Tier<'b>,
    resident: usize,
    hits: &'a [u8],
    misses: &'a [u8],
    cursors: [usize; 3],
}

impl<'a, 'b> Side<'a, 'b> {
    fn new(tier: &'a Tier<'b>, resident: usize, hits: &'a [u8], misses: &'a [u8]) -> Self {
        Side {
            tier,
            resident,
            hits,
            misses,
            cursors: [0; 3],
        }
    }

    /// Untimed: every pool key answers as expected.
    fn check_answers(&self, batch: usize, states: &mut [u8]) -> Result<(), String> {
        for (pool, want) in [(self.hits, TIER_HIT), (self.misses, TIER_MISS)] {
            for b in pool.chunks_exact(batch * KEY_LEN) {
                self.tier
                    .lookup(b, KEY_LEN, states)
                    .map_err(|e| e.to_string())?;
                if let Some(s) = states.iter().find(|&&s| s != want) {
                    return Err(format!(
                        "lookup at {} resident blocks answered {s}, expected {want}",
                        self.resident
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Times hit lookups, miss lookups and touches on both tiers, alternating run
/// by run, so that the machine's noise hits both sizes alike.
fn measure(p: &Settings, sides: [Side; 2], states: &mut [u8]) -> Result<[AtSize; 2], String> {
    let mut bar = Progress::new(p.progress, "lookup: timing", p.lookup_runs as u64);
    let mut out = sides.each_ref().map(|side| AtSize {
        resident: side.resident as u64,
        hit: Vec::new(),
        miss: Vec::new(),
        touch: Vec::new(),
    });
    let mut sides = sides;
    for _ in 0..p.lookup_runs {
        for (side, at) in sides.iter_mut().zip(out.iter_mut()) {
            let tier = side.tier;
            let [hit_at, miss_at, touch_at] = &mut side.cursors;
            at.hit.push(timed(p, side.hits, hit_at, |b| {
                tier.lookup(b, KEY_LEN, states)
            })?);
            at.miss.push(timed(p, side.misses, miss_at, |b| {
                tier.lookup(b, KEY_LEN, states)
            })?);
            at.touch
                .push(timed(p, side.hits, touch_at, |b| tier.touch(b, KEY_LEN))?);
        }
        bar.add(1);
    }
    bar.finish();
    Ok(out)
}

/// Runs `op` over consecutive batches of `pool` (wrapping) for at least
/// `run_secs`; returns ns per key.
fn timed(
    p: &Settings,
    pool: &[u8],
    cursor: &mut usize,
    mut op: impl FnMut(&[u8]) -> ApiResult<()>,
) -> Result<f64, String> {
    const BATCHES_PER_CLOCK: usize = 64;
    let batch_bytes = p.lookup_batch * KEY_LEN;
    let batches = pool.len() / batch_bytes;
    let start = Instant::now();
    let mut keys = 0u64;
    loop {
        for _ in 0..BATCHES_PER_CLOCK {
            op(&pool[*cursor * batch_bytes..][..batch_bytes]).map_err(|e| e.to_string())?;
            *cursor = (*cursor + 1) % batches;
        }
        keys += (BATCHES_PER_CLOCK * p.lookup_batch) as u64;
        let elapsed = start.elapsed();
        if elapsed.as_secs_f64() >= p.lookup_run_secs {
            return Ok(elapsed.as_nanos() as f64 / keys as f64);
        }
    }
}

/// Untimed: loads every block of the tier (keys 0..resident), HALF per job,
/// and compares each with its source row.
fn verify_all(
    tier: &Tier,
    buf: &MappedBuf,
    resident: usize,
    ids: &mut JobIds,
) -> Result<u64, String> {
    let mut keys = vec![0u8; HALF * KEY_LEN];
    let rows: Vec<i64> = (HALF as i64..2 * HALF as i64).collect();
    let mut first = 0;
    while first < resident {
        let n = (resident - first).min(HALF);
        for j in 0..n {
            write_key(
                NS_LOOKUP,
                (first + j) as u64,
                &mut keys[j * KEY_LEN..][..KEY_LEN],
            );
        }
        Stream {
            kind: Kind::Load,
            keys: &keys[..n * KEY_LEN],
            key_len: KEY_LEN,
            rows: &rows[..n],
            job_blocks: HALF,
            window: 1,
            block_bytes: BLOCK_BYTES,
        }
        .run(tier, ids, |_| {})?;
        for j in 0..n {
            // SAFETY: the load job was polled.
            let got = unsafe { buf.slice((HALF + j) * BLOCK_BYTES, BLOCK_BYTES) };
            if let Some(at) = check_row(((first + j) % HALF) as u64, got) {
                return Err(format!(
                    "verification failed: key {} of a lookup tier differs at byte {at}",
                    first + j
                ));
            }
        }
        first += n;
    }
    Ok((resident * BLOCK_BYTES) as u64)
}

/// "1K", "1M": how the table names the two tier sizes.
fn blocks_label(n: u64) -> String {
    match n {
        n if n >= 1_000_000 && n % 1_000_000 == 0 => format!("{}M", n / 1_000_000),
        n if n >= 1_000 && n % 1_000 == 0 => format!("{}K", n / 1_000),
        n => n.to_string(),
    }
}

impl Results {
    /// Per-key costs at both sizes and their ratio (with the < 150 ns and
    /// <= 1.5x targets), memory per block, and the `lookup` and `memory` JSON
    /// objects.
    pub fn report(&self, s: &Settings, out: &mut Report) {
        let small = blocks_label(self.small.resident);
        let large = blocks_label(self.large.resident);
        out.line(
            "lookup",
            format!(
                "{}-byte keys, {}-byte blocks, {} and {} resident blocks; filling {} keys took {:.2} s",
                KEY_LEN,
                BLOCK_BYTES,
                self.small.resident,
                self.large.resident,
                self.large.resident,
                self.fill_secs
            ),
        );
        for (name, a, b, limited) in [
            ("lookup, all hits", &self.small.hit, &self.large.hit, true),
            (
                "lookup, all misses",
                &self.small.miss,
                &self.large.miss,
                false,
            ),
            ("touch", &self.small.touch, &self.large.touch, true),
        ] {
            for (label, v) in [(&small, a), (&large, b)] {
                let m = median(v);
                let row = out.row(
                    format!("{name}, {label} blocks"),
                    m,
                    "ns/key",
                    format!("batches of {}; median of {} runs", s.lookup_batch, a.len()),
                );
                if limited {
                    row.target(
                        format!("{name} at {label} blocks < 150 ns/key"),
                        m,
                        Cmp::Below,
                        150.0,
                    );
                }
            }
            let ratio = paired_ratio(a, b);
            let row = out.row(
                format!("{name}, {large}/{small} ratio"),
                ratio,
                "x",
                format!("median of {} runs alternating the two tiers", a.len()),
            );
            if limited {
                row.target(
                    format!("{name}: {large} cost <= 1.5x {small} cost"),
                    ratio,
                    Cmp::AtMost,
                    1.5,
                );
            }
        }
        let m = &self.memory;
        let per_block = m.metadata_bytes as f64 / m.resident_blocks as f64;
        out.row(
            format!("metadata per block, {large} blocks"),
            per_block,
            "bytes",
            format!(
                "tier_stats().metadata_bytes = {}",
                mib(m.metadata_bytes as f64)
            ),
        )
        .target(
            format!("metadata < 100 bytes per block at {large} blocks"),
            per_block,
            Cmp::Below,
            100.0,
        );
        let rss_delta = m.rss_after as f64 - m.rss_before as f64;
        let rss_per_block = (rss_delta - m.arena_touched as f64) / m.resident_blocks as f64;
        out.row(
            format!("RSS per block, {large} blocks"),
            rss_per_block,
            "bytes",
            format!(
                "RSS +{} minus {} of arena data ({}-byte blocks)",
                mib(rss_delta),
                mib(m.arena_touched as f64),
                BLOCK_BYTES
            ),
        );
        let sizes = |a: &[f64], b: &[f64]| json!({"small": dist(a), "large": dist(b), "ratio_large_to_small": paired_ratio(a, b)});
        out.field(
            "lookup",
            json!({
                "unit": "ns per key",
                "key_len": KEY_LEN,
                "batch": s.lookup_batch,
                "small_blocks": self.small.resident,
                "large_blocks": self.large.resident,
                "hit": sizes(&self.small.hit, &self.large.hit),
                "miss": sizes(&self.small.miss, &self.large.miss),
                "touch": sizes(&self.small.touch, &self.large.touch),
                "fill_seconds": self.fill_secs,
            }),
        );
        out.field(
            "memory",
            json!({
                "resident_blocks": m.resident_blocks,
                "block_bytes": BLOCK_BYTES,
                "metadata_bytes": m.metadata_bytes,
                "metadata_bytes_per_block": per_block,
                "rss_before_bytes": m.rss_before,
                "rss_after_bytes": m.rss_after,
                "arena_bytes_touched": m.arena_touched,
                "rss_bytes_per_block_minus_arena": rss_per_block,
            }),
        );
        out.verified(format!(
            "all {} blocks of the lookup tiers",
            self.verified_bytes / BLOCK_BYTES as u64
        ));
    }
}
