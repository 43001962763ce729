//! Redis backend, lookups of resident keys: ns per key in batches, against a
//! memory tier holding the same keys, runs alternating between the two; and
//! how those figures are reported.

use super::server::Server;
use super::{Params, NS_LOOKUP};
use crate::capi::{Config, Tier, TIER_HIT};
use crate::data::{keys, write_key, Rng, KEY_LEN};
use crate::jobs::{JobIds, Kind};
use crate::primary::Primary;
use crate::report::{num, Cmp, Report};
use crate::stats::{median, paired_ratio};
use serde_json::json;
use std::time::Instant;

const B: usize = 4096;
/// Keys of random resident blocks, cycled through by the timed calls.
const POOL: usize = 1 << 16;

pub struct Results {
    pub resident: u64,
    pub redis_ns: Vec<f64>,
    pub memory_ns: Vec<f64>,
}

pub fn run(p: &Params, server: &Server) -> Result<Results, String> {
    let n = p.lookup_blocks;
    let primary = Primary::new(64, B)?;
    let key_bytes = keys(NS_LOOKUP, 0, n);
    let src = primary.sources(n);
    let capacity = ((n + 64) * B) as u64;
    let prefix = format!("{}-lookup", p.prefix);
    let redis = primary.tier(&p.config(server, &prefix, capacity)?)?;
    let mut cfg = Config::new().map_err(|e| e.to_string())?;
    cfg.set("capacity_bytes", &capacity.to_string())
        .map_err(|e| e.to_string())?;
    let memory = primary.tier(&cfg)?;
    let mut ids = JobIds::default();
    for tier in [&redis, &memory] {
        primary
            .stream(Kind::Store, &key_bytes, &src, 16, 4)
            .run(tier, &mut ids, |_| {})?;
    }
    let resident = redis.stats().map_err(|e| e.to_string())?.num_blocks;
    let mut rng = Rng::new(24);
    let mut pool = vec![0u8; POOL * KEY_LEN];
    for k in pool.chunks_exact_mut(KEY_LEN) {
        write_key(NS_LOOKUP, rng.below(n as u64), k);
    }
    let mut r = Results {
        resident,
        redis_ns: Vec::new(),
        memory_ns: Vec::new(),
    };
    let mut states = vec![0u8; p.lookup_batch];
    let batch_bytes = p.lookup_batch * KEY_LEN;
    for run in 0..p.lookup_runs {
        let order = if run % 2 == 0 {
            [(&redis, true), (&memory, false)]
        } else {
            [(&memory, false), (&redis, true)]
        };
        for (tier, is_redis) in order {
            let ns = timed_lookups(tier, &pool, batch_bytes, &mut states, p.lookup_run_secs)?;
            if is_redis {
                r.redis_ns.push(ns);
            } else {
                r.memory_ns.push(ns);
            }
        }
    }
    drop(redis);
    server.delete_prefix(&prefix)?;
    Ok(r)
}

/// ns per key of lookups of the pool's keys in calls of `states.len()` keys,
/// for about `secs`; every answer must be HIT.
fn timed_lookups(
    tier: &Tier,
    pool: &[u8],
    batch_bytes: usize,
    states: &mut [u8],
    secs: f64,
) -> Result<f64, String> {
    let start = Instant::now();
    let mut done = 0usize;
    'runs: loop {
        for chunk in pool.chunks_exact(batch_bytes) {
            tier.lookup(chunk, KEY_LEN, states)
                .map_err(|e| e.to_string())?;
            if states.iter().any(|&s| s != TIER_HIT) {
                return Err("a lookup of a resident key did not answer HIT".into());
            }
            done += states.len();
            if done % (64 * states.len()) == 0 && start.elapsed().as_secs_f64() >= secs {
                break 'runs;
            }
        }
    }
    Ok(start.elapsed().as_nanos() as f64 / done as f64)
}

impl Results {
    pub fn report(&self, p: &Params, out: &mut Report) {
        let ratio = paired_ratio(&self.memory_ns, &self.redis_ns);
        out.row(
            "lookup, memory tier",
            median(&self.memory_ns),
            "ns/key",
            format!(
                "same keys; batches of {}, {} resident, median of {} runs",
                p.lookup_batch, self.resident, p.lookup_runs
            ),
        );
        out.row(
            "lookup, redis tier",
            median(&self.redis_ns),
            "ns/key",
            format!(
                "{}x memory (paired runs); answered from the index, no server round trip",
                num(ratio)
            ),
        )
        .target(
            "lookup of resident keys <= 1.1x memory backend ns/key",
            ratio,
            Cmp::AtMost,
            1.1,
        );
        out.field("lookup_ns_per_key", median(&self.redis_ns));
        out.field("memory_lookup_ns_per_key", median(&self.memory_ns));
        out.field("lookup_over_memory", ratio);
        out.field(
            "lookup",
            json!({
                "resident": self.resident,
                "batch": p.lookup_batch,
                "redis_ns_per_key": self.redis_ns,
                "memory_ns_per_key": self.memory_ns,
            }),
        );
    }
}
