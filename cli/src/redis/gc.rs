//! `kvtier gc redis://... --max-bytes B [--namespace N]`: brings the block
//! values under the prefix (or N's) under B bytes (their lengths, as their names
//! give them: header and payload), those idle
//! longest first: `OBJECT IDLETIME`, the server's own record of each key's
//! last use, which every GET and the TOUCH tiers send keep (no cost to a
//! load). A load racing the UNLINK is a miss. Listed again after each pass
//! that removed something, as on disk (`disk::gc`).

use super::{each_node, open, scan, Attribution, Keyspace};
use crate::report::{size, Outcome, DONE, PROBLEMS};
use crate::Common;
use kvtier::admin::redis::KeyName;
use redis::Value;
use serde_json::json;
use std::time::Instant;

const PASSES: usize = 4;
/// UNLINKs per pipeline.
const UNLINK_BATCH: usize = 1000;

/// A block value: (master, name, bytes, idle seconds).
type Block = (usize, Vec<u8>, u64, Option<i64>);

pub fn run(
    seeds: &[&str],
    key_prefix: &str,
    namespace: Option<&str>,
    budget: u64,
    common: &Common,
) -> Result<Outcome, String> {
    let started = Instant::now();
    let ks = open(seeds, key_prefix)?;
    let named = namespace.map(kvtier::admin::namespace_fingerprint);
    let (mut before, mut after) = (None, 0u64);
    let (mut removed, mut removed_bytes, mut passes, mut within) = (0u64, 0u64, 0, false);
    let mut idle_unknown = false;
    while passes < PASSES {
        passes += 1;
        let mut blocks = list(&ks, named, common)?;
        idle_unknown |= blocks.iter().any(|b| b.3.is_none());
        let mut usage: u64 = blocks.iter().map(|b| b.2).sum();
        before.get_or_insert(usage);
        after = usage;
        if usage <= budget {
            within = true;
            break;
        }
        // Idle longest first; a key whose idle time is unknown (an LFU
        // policy keeps none) after those whose is known.
        blocks.sort_by_key(|b| std::cmp::Reverse(b.3.unwrap_or(-1)));
        let mut doomed: Vec<Vec<(Vec<u8>, u64)>> = ks.nodes.iter().map(|_| Vec::new()).collect();
        for (node, name, len, _) in blocks {
            if usage <= budget {
                break;
            }
            usage -= len;
            doomed[node].push((name, len));
        }
        for result in each_node(&ks, |node| unlink(&ks, node, &doomed[node])) {
            let (n, bytes) = result?;
            removed += n;
            removed_bytes += bytes;
        }
        after = usage;
        within = usage <= budget;
    }
    let before = before.unwrap_or(0);
    let text = format!(
        "{}: {} before, {} after (budget {}): removed {removed} blocks ({}) in {passes} passes{}\n",
        seeds.join(","),
        size(before),
        size(after),
        size(budget),
        size(removed_bytes),
        if idle_unknown {
            "; some idle times unknown (an LFU maxmemory-policy): those went last"
        } else {
            ""
        }
    );
    let json = json!({
        "store": seeds.join(","),
        "kind": "redis",
        "budget": budget,
        "bytes_before": before,
        "bytes_after": after,
        "removed": removed,
        "removed_bytes": removed_bytes,
        "passes": passes,
        "within_budget": within,
        "idle_time_unknown": idle_unknown,
        "elapsed_s": started.elapsed().as_secs_f64(),
    });
    Ok(Outcome {
        json,
        text,
        status: if within { DONE } else { PROBLEMS },
    })
}

/// Every block value under the prefix (only `named`'s, when given).
fn list(ks: &Keyspace, named: Option<u64>, common: &Common) -> Result<Vec<Block>, String> {
    let bar = crate::progress::Progress::new(common.progress, "gc: scanning", 0);
    let mut gens = Vec::new();
    let mut all = Vec::new();
    for result in each_node(ks, |node| {
        let mut found = Vec::new();
        let mut gens = Vec::new();
        scan(ks, node, true, |c, batch| {
            bar.add(batch.len() as u64);
            for key in batch {
                match key.what {
                    KeyName::Block {
                        fp, block_bytes, ..
                    } => found.push((
                        (node, key.name, key.len.unwrap_or(0), key.idle_s),
                        fp,
                        block_bytes,
                    )),
                    KeyName::Generation { .. } if named.is_some() => {
                        let value: Option<String> =
                            redis::cmd("GET").arg(&key.name).query(c).ok().flatten();
                        gens.push((key.what, value.and_then(|v| v.trim().parse().ok())));
                    }
                    _ => {}
                }
            }
            Ok(())
        })?;
        Ok::<_, String>((found, gens))
    }) {
        let (found, g) = result?;
        all.extend(found);
        gens.extend(g);
    }
    let Some(named) = named else {
        return Ok(all.into_iter().map(|b| b.0).collect());
    };
    let mut sizes: Vec<usize> = all.iter().map(|b| b.2).collect();
    sizes.sort_unstable();
    sizes.dedup();
    let attribution = Attribution::new(&gens, Some(named), &sizes);
    Ok(all
        .into_iter()
        .filter(|(_, fp, bb)| {
            attribution
                .owner(*fp, *bb)
                .is_some_and(|o| o.namespace_fp == named)
        })
        .map(|b| b.0)
        .collect())
}

/// UNLINKs `names` on master `node`, one key per command (a cluster's keys
/// of one pipeline may be in different slots); (removed, their bytes).
pub fn unlink(ks: &Keyspace, node: usize, names: &[(Vec<u8>, u64)]) -> Result<(u64, u64), String> {
    if names.is_empty() {
        return Ok((0, 0));
    }
    let mut c = ks.nodes[node].connect()?;
    let (mut removed, mut bytes) = (0, 0);
    for batch in names.chunks(UNLINK_BATCH) {
        let mut pipe = redis::pipe();
        for (name, _) in batch {
            pipe.cmd("UNLINK").arg(name);
        }
        let answers: Vec<Value> = pipe
            .ignore_errors()
            .query(&mut c)
            .map_err(|e| format!("{}: UNLINK: {e}", ks.nodes[node].name))?;
        for ((_, len), answer) in batch.iter().zip(answers) {
            // A key moved to another master meanwhile (MOVED) stays.
            if let Value::Int(1) = answer {
                removed += 1;
                bytes += len;
            }
        }
    }
    Ok((removed, bytes))
}
