//! Redis backend, stores in steady state: a tier whose capacity is half a
//! pass (`sharing=owned`), filled once to its plateau, then timed passes of
//! new keys in which every store evicts an older block, which the tier
//! deletes from the server (DEL). The server then reuses the memory the
//! deleted values freed, as under an engine whose tier is full, instead of
//! faulting in fresh memory as the first fill does (see `bandwidth`). A pass
//! ends when its jobs are done and the server holds no more keys than the
//! tier does (the evictions' DELs run in the background, and are timed too).

use super::server::Server;
use super::Params;
use crate::capi::{Tier, TIER_HIT};
use crate::data::{keys, KEY_LEN};
use crate::jobs::{JobIds, Kind};
use crate::primary::{verify_range, Primary};
use crate::stats::median;
use std::time::{Duration, Instant};

/// Key namespace of the steady-state passes.
const NS_STEADY: u64 = 22;
/// How long the evictions' DELs may trail a pass's last job.
const DEL_WAIT: Duration = Duration::from_secs(30);
/// Timed passes per repetition, back to back; the repetition's figure is
/// their median: one pass of 8192 64 KiB blocks lasts about 0.15 s, and
/// single passes of one build spread widely (`redis_loads ... steady 64 512
/// 5`; docs/runs/redis.md), so one pass per repetition made the figure a
/// draw of that spread.
pub const PASSES_PER_REPETITION: usize = 3;
/// Untimed passes before them in each repetition. A repetition's steady
/// passes follow the bounds' redis-benchmark runs on the same server, and
/// the first passes after those ran slower than the later ones of the same
/// tier (docs/runs/redis.md, "each repetition's steady passes follow two
/// untimed settling passes"): a transient of the server after the bounds'
/// load, not the tier's steady state. Their rate is still reported beside
/// the figure.
pub const SETTLING_PASSES: usize = 2;

/// One repetition's timed passes.
pub struct Pass {
    /// Each pass's GB/s.
    pub pass_gbps: Vec<f64>,
    /// The untimed settling passes' GB/s (see [`SETTLING_PASSES`]).
    pub settling_gbps: Vec<f64>,
    /// Minor faults of the server process per block stored (None: the
    /// server does not run here).
    pub faults_per_store: Option<f64>,
    /// INFO memory `used_memory` before and after the pass.
    pub memory_before: u64,
    pub memory_after: u64,
    /// Blocks the tier evicted during the passes (one per store in steady
    /// state).
    pub evictions: u64,
}

impl Pass {
    /// The repetition's figure: the median of its passes' GB/s.
    pub fn gbps(&self) -> f64 {
        median(&self.pass_gbps)
    }
}

pub struct Steady<'a> {
    tier: Tier<'a>,
    prefix: String,
    block: usize,
    n: usize,
    /// Passes stored so far (each has keys of its own).
    passes: u64,
    server_pid: Option<u32>,
    pub describe: String,
    pub capacity_blocks: usize,
}

impl<'a> Steady<'a> {
    /// A tier of capacity n / 2 blocks, filled by one untimed pass of n new
    /// keys (it ends full, having evicted and deleted the first half); None
    /// when half a pass would not hold twice the blocks in flight (a full
    /// tier refuses stores it cannot evict for: `--quick` at 2 MiB).
    pub fn open(
        p: &Params,
        server: &Server,
        primary: &'a Primary,
        src: &[i64],
        ids: &mut JobIds,
    ) -> Result<Option<Steady<'a>>, String> {
        let (block, n) = (primary.block, src.len());
        let capacity_blocks = n / 2;
        if capacity_blocks < 2 * p.window * p.job_blocks {
            return Ok(None);
        }
        let prefix = format!("{}-steady-b{block}", p.prefix);
        let tier = primary.tier(&p.config(server, &prefix, (capacity_blocks * block) as u64)?)?;
        let mut s = Steady {
            describe: tier.describe(),
            tier,
            prefix,
            block,
            n,
            passes: 0,
            server_pid: server.started_here().and_then(|_| server.pid()),
            capacity_blocks,
        };
        s.store_pass(p, server, primary, src, ids)?;
        Ok(Some(s))
    }

    /// [`SETTLING_PASSES`] untimed, then [`PASSES_PER_REPETITION`] timed
    /// passes of n new keys each, every store evicting an older block.
    pub fn pass(
        &mut self,
        p: &Params,
        server: &Server,
        primary: &Primary,
        src: &[i64],
        ids: &mut JobIds,
    ) -> Result<Pass, String> {
        let resident = self.resident()?;
        if resident != self.capacity_blocks as u64 {
            return Err(format!(
                "steady state: the tier holds {resident} blocks, expected its capacity {}",
                self.capacity_blocks
            ));
        }
        let mut settling_gbps = Vec::with_capacity(SETTLING_PASSES);
        for _ in 0..SETTLING_PASSES {
            let secs = self.store_pass(p, server, primary, src, ids)?;
            settling_gbps.push((self.n * self.block) as f64 / secs / 1e9);
        }
        let evictions_before = self.stats_evictions()?;
        let memory_before = server.used_memory();
        let faults_before = server.minor_faults(self.server_pid);
        let mut pass_gbps = Vec::with_capacity(PASSES_PER_REPETITION);
        for _ in 0..PASSES_PER_REPETITION {
            let secs = self.store_pass(p, server, primary, src, ids)?;
            pass_gbps.push((self.n * self.block) as f64 / secs / 1e9);
        }
        let faults_after = server.minor_faults(self.server_pid);
        let stores = (PASSES_PER_REPETITION * self.n) as f64;
        Ok(Pass {
            pass_gbps,
            settling_gbps,
            faults_per_store: faults_before
                .zip(faults_after)
                .map(|(a, b)| (b - a) as f64 / stores),
            memory_before,
            memory_after: server.used_memory(),
            evictions: self.stats_evictions()? - evictions_before,
        })
    }

    /// Stores the next pass's keys; returns the seconds from the first
    /// submit until the server holds only the tier's blocks of this prefix
    /// again (its other keys unchanged).
    fn store_pass(
        &mut self,
        p: &Params,
        server: &Server,
        primary: &Primary,
        src: &[i64],
        ids: &mut JobIds,
    ) -> Result<f64, String> {
        let key_bytes = self.keys(self.passes);
        let others = server.dbsize()? - self.resident()?;
        let start = Instant::now();
        primary
            .stream(Kind::Store, &key_bytes, src, p.job_blocks, p.window)
            .run(&self.tier, ids, |_| {})?;
        let expected = others + self.resident()?;
        loop {
            let keys = server.dbsize()?;
            if keys <= expected {
                break;
            }
            if start.elapsed() > DEL_WAIT {
                return Err(format!(
                    "steady state: the server still holds {keys} keys, {} more than the tier, {} s after the pass began",
                    keys - expected,
                    DEL_WAIT.as_secs()
                ));
            }
            std::thread::sleep(Duration::from_micros(500));
        }
        self.passes += 1;
        Ok(start.elapsed().as_secs_f64())
    }

    /// Checks every byte of the last pass's newest quarter, which the tier
    /// must hold (every key a HIT); the bytes verified.
    pub fn verify(&self, p: &Params, primary: &Primary, ids: &mut JobIds) -> Result<u64, String> {
        let key_bytes = self.keys(self.passes - 1);
        let range = self.n - self.n / 4..self.n;
        let mut states = vec![0u8; range.len()];
        self.tier
            .lookup(
                &key_bytes[range.start * KEY_LEN..range.end * KEY_LEN],
                KEY_LEN,
                &mut states,
            )
            .map_err(|e| e.to_string())?;
        if let Some(at) = states.iter().position(|&s| s != TIER_HIT) {
            return Err(format!(
                "steady state: key {} of the last pass is not resident",
                range.start + at
            ));
        }
        verify_range(
            &self.tier,
            primary,
            &key_bytes,
            range,
            p.job_blocks,
            ids,
            "redis steady state",
        )
    }

    /// Drops the tier and deletes its keys from the server.
    pub fn close(self, server: &Server) -> Result<(), String> {
        let prefix = self.prefix.clone();
        drop(self);
        server.delete_prefix(&prefix).map(drop)
    }

    fn keys(&self, pass: u64) -> Vec<u8> {
        keys(NS_STEADY ^ self.block as u64, pass * self.n as u64, self.n)
    }

    fn resident(&self) -> Result<u64, String> {
        Ok(self.tier.stats().map_err(|e| e.to_string())?.num_blocks)
    }

    fn stats_evictions(&self) -> Result<u64, String> {
        Ok(self.tier.stats().map_err(|e| e.to_string())?.evictions)
    }
}
