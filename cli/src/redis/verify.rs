//! `kvtier verify redis://... [--namespace N] [--repair] [--bench]`: every
//! unsealed block's value is read (GETs pipelined per master, a bounded
//! number of bytes at a time) and checked against its name as a tier checks
//! it (`kvtier::admin::redis::check_value`). Blocks of generations a clear
//! left behind are stale. With `--repair`, damaged and stale blocks are
//! deleted, each only if its value did not change since it was read (WATCH,
//! then MULTI/DEL/EXEC). Sealed blocks (no key here), names of no kvtier
//! format, values in a newer format and generation keys stay.

use super::{each_node, names, open, scan, Attribution, Keyspace};
use crate::report::{size, Outcome, DONE, PROBLEMS};
use crate::Common;
use kvtier::admin::redis::{check_value, BlockTag, KeyName, ValueVerdict};
use redis::{Connection, Value};
use serde_json::{json, Value as Json};
use std::fmt::Write;
use std::time::Instant;

/// The most value bytes one pipeline of GETs asks for.
const WINDOW_BYTES: usize = 64 << 20;

/// What a repair removed, and what it kept with why.
type Repaired = (Vec<String>, Vec<(String, String)>);

/// One name that is not a good block.
struct Problem {
    node: usize,
    name: Vec<u8>,
    /// A damaged block's name parts (fingerprint, block size, tag), to
    /// check its value again before it goes.
    block: Option<(u64, usize, BlockTag)>,
    what: &'static str,
    why: String,
}

#[derive(Default)]
struct Tally {
    blocks: u64,
    ok: u64,
    sealed: u64,
    newer: u64,
    bytes_read: u64,
    problems: Vec<Problem>,
    /// Unsealed blocks' names (the bench reads them again).
    names: Vec<(Vec<u8>, usize, u64, usize, BlockTag)>,
}

pub fn run(
    seeds: &[&str],
    key_prefix: &str,
    namespace: Option<&str>,
    repair: bool,
    bench: Option<usize>,
    common: &Common,
) -> Result<Outcome, String> {
    let started = Instant::now();
    let ks = open(seeds, key_prefix)?;
    let named = namespace.map(kvtier::admin::namespace_fingerprint);
    let found = names(&ks)?;
    let attribution = Attribution::new(&found.generations, named, &found.sizes());
    let bar = crate::progress::Progress::new(common.progress, "verify: reading", 0);
    let per_node = each_node(&ks, |node| {
        let mut t = Tally::default();
        scan(&ks, node, false, |c, batch| {
            bar.add(batch.len() as u64);
            let mut reads = Vec::new();
            for found in batch {
                match found.what {
                    KeyName::Block {
                        fp,
                        block_bytes,
                        tag,
                    } => {
                        let owner = attribution.owner(fp, block_bytes);
                        if named.is_some() && owner.is_none_or(|o| Some(o.namespace_fp) != named) {
                            continue;
                        }
                        t.blocks += 1;
                        if owner.is_some_and(|o| o.stale) {
                            t.problems.push(Problem {
                                node,
                                name: found.name,
                                block: None,
                                what: "stale",
                                why: "a generation a clear left behind".into(),
                            });
                        } else if tag == BlockTag::Sealed {
                            t.sealed += 1;
                        } else {
                            reads.push((found.name, fp, block_bytes, tag));
                        }
                    }
                    KeyName::Generation { .. } => {}
                    KeyName::Other if named.is_none() => t.problems.push(Problem {
                        node,
                        name: found.name,
                        block: None,
                        what: "foreign",
                        why: "not a name a tier writes".into(),
                    }),
                    KeyName::Other => {}
                }
            }
            read_and_check(c, node, reads, &mut t)
        })?;
        Ok::<_, String>(t)
    });
    drop(bar);
    let mut tally = Tally::default();
    let mut names = Vec::new();
    for t in per_node {
        let t = t?;
        tally.blocks += t.blocks;
        tally.ok += t.ok;
        tally.sealed += t.sealed;
        tally.newer += t.newer;
        tally.bytes_read += t.bytes_read;
        tally.problems.extend(t.problems);
        names.extend(t.names);
    }
    let elapsed = started.elapsed().as_secs_f64();
    let repaired = repair.then(|| do_repair(&ks, &tally.problems));
    let bench = match bench {
        Some(repeat) => Some(measure(&ks, &names, repeat)?),
        None => None,
    };
    Ok(outcome(seeds, &tally, repaired, elapsed, bench))
}

/// GETs `reads` in windows of at most [`WINDOW_BYTES`] and checks each value.
fn read_and_check(
    c: &mut Connection,
    node: usize,
    reads: Vec<(Vec<u8>, u64, usize, BlockTag)>,
    t: &mut Tally,
) -> Result<(), String> {
    let mut at = 0;
    while at < reads.len() {
        let per = (WINDOW_BYTES / reads[at].2.max(1)).max(1);
        let window = &reads[at..(at + per).min(reads.len())];
        let mut pipe = redis::pipe();
        for (name, ..) in window {
            pipe.cmd("GET").arg(name);
        }
        let values: Vec<Value> = pipe
            .ignore_errors()
            .query(c)
            .map_err(|e| format!("GET: {e}"))?;
        for ((name, fp, bb, tag), value) in window.iter().zip(values) {
            let verdict = match value {
                Value::Nil => continue,
                Value::BulkString(bytes) => {
                    t.bytes_read += bytes.len() as u64;
                    check_value(*fp, *bb, tag, &bytes)
                }
                Value::ServerError(e) if e.code() == "WRONGTYPE" => {
                    ValueVerdict::Damaged("a value of another type than a string".into())
                }
                other => return Err(format!("GET answered {other:?}")),
            };
            let (what, why) = match verdict {
                ValueVerdict::Good { .. } => {
                    t.ok += 1;
                    t.names.push((name.clone(), node, *fp, *bb, tag.clone()));
                    continue;
                }
                ValueVerdict::Newer => {
                    t.newer += 1;
                    continue;
                }
                ValueVerdict::Damaged(why) => ("damaged", why),
                ValueVerdict::Foreign(why) => ("foreign", why),
            };
            let block = Some((*fp, *bb, tag.clone()));
            t.problems.push(Problem {
                node,
                name: name.clone(),
                block,
                what,
                why,
            });
        }
        at += window.len();
    }
    Ok(())
}

/// Deletes damaged and stale blocks whose value did not change since: WATCH,
/// read again, then DEL in a transaction that fails if it changed meanwhile.
fn do_repair(ks: &Keyspace, problems: &[Problem]) -> Repaired {
    let mut removed = Vec::new();
    let mut kept = Vec::new();
    let mut conns: Vec<Option<Connection>> = ks.nodes.iter().map(|_| None).collect();
    for p in problems {
        let shown = String::from_utf8_lossy(&p.name).into_owned();
        if p.what != "damaged" && p.what != "stale" {
            kept.push((shown, format!("{}: never removed", p.what)));
            continue;
        }
        let c = match &mut conns[p.node] {
            Some(c) => c,
            slot => match ks.nodes[p.node].connect() {
                Ok(c) => slot.insert(c),
                Err(e) => {
                    kept.push((shown, e));
                    continue;
                }
            },
        };
        match delete_if_unchanged(c, p) {
            Ok(true) => removed.push(shown),
            Ok(false) => kept.push((
                shown,
                "changed since it was read (a newer store): kept".into(),
            )),
            Err(e) => kept.push((shown, e)),
        }
    }
    (removed, kept)
}

fn delete_if_unchanged(c: &mut Connection, p: &Problem) -> Result<bool, String> {
    let e = |e: redis::RedisError| e.to_string();
    redis::cmd("WATCH").arg(&p.name).exec(c).map_err(e)?;
    let still = match &p.block {
        None => {
            redis::cmd("EXISTS")
                .arg(&p.name)
                .query::<i64>(c)
                .map_err(e)?
                == 1
        }
        Some((fp, block_bytes, tag)) => match redis::cmd("GET").arg(&p.name).query::<Value>(c) {
            Ok(Value::Nil) => false,
            Ok(Value::BulkString(bytes)) => {
                matches!(
                    check_value(*fp, *block_bytes, tag, &bytes),
                    ValueVerdict::Damaged(_)
                )
            }
            Ok(_) => false,
            Err(err) if err.code() == Some("WRONGTYPE") => true,
            Err(err) => return Err(err.to_string()),
        },
    };
    if !still {
        redis::cmd("UNWATCH").exec(c).map_err(e)?;
        return Ok(false);
    }
    let done: Value = redis::pipe()
        .atomic()
        .cmd("DEL")
        .arg(&p.name)
        .query(c)
        .map_err(e)?;
    Ok(!matches!(done, Value::Nil))
}

/// Raw GETs of the good unsealed blocks against GETs and checks of them,
/// one thread per master, alternating `repeat` times: GB/s.
fn measure(
    ks: &Keyspace,
    names: &[(Vec<u8>, usize, u64, usize, BlockTag)],
    repeat: usize,
) -> Result<Json, String> {
    let pass = |check: bool| -> Result<f64, String> {
        let started = Instant::now();
        let bytes = each_node(ks, |node| {
            let mut c = ks.nodes[node].connect()?;
            let mine: Vec<_> = names.iter().filter(|n| n.1 == node).collect();
            let mut bytes = 0u64;
            let mut at = 0;
            while at < mine.len() {
                let per = (WINDOW_BYTES / mine[at].3.max(1)).max(1);
                let window = &mine[at..(at + per).min(mine.len())];
                let mut pipe = redis::pipe();
                for n in window {
                    pipe.cmd("GET").arg(&n.0);
                }
                let values: Vec<Value> = pipe
                    .ignore_errors()
                    .query(&mut c)
                    .map_err(|e| e.to_string())?;
                for (n, v) in window.iter().zip(values) {
                    if let Value::BulkString(b) = v {
                        if !check
                            || matches!(check_value(n.2, n.3, &n.4, &b), ValueVerdict::Good { .. })
                        {
                            bytes += b.len() as u64;
                        }
                    }
                }
                at += window.len();
            }
            Ok::<_, String>(bytes)
        });
        let mut total = 0;
        for b in bytes {
            total += b?;
        }
        Ok(total as f64 / started.elapsed().as_secs_f64() / 1e9)
    };
    let (mut raw, mut checked) = (Vec::new(), Vec::new());
    for _ in 0..repeat.max(1) {
        raw.push(pass(false)?);
        checked.push(pass(true)?);
    }
    let median = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (r, c) = (median(&raw), median(&checked));
    Ok(json!({
        "threads": ks.nodes.len(), "blocks": names.len(),
        "raw_gb_per_s": r, "verify_gb_per_s": c, "ratio": if r > 0.0 { c / r } else { 0.0 },
        "raw_runs": raw, "verify_runs": checked,
    }))
}

fn outcome(
    seeds: &[&str],
    t: &Tally,
    repaired: Option<Repaired>,
    elapsed: f64,
    bench: Option<Json>,
) -> Outcome {
    let list = |what: &str| -> Vec<String> {
        t.problems
            .iter()
            .filter(|p| p.what == what)
            .map(|p| String::from_utf8_lossy(&p.name).into_owned())
            .collect()
    };
    let mut text = String::new();
    for p in &t.problems {
        let _ = writeln!(
            text,
            "{}: {}: {}",
            p.what,
            String::from_utf8_lossy(&p.name),
            p.why
        );
    }
    let _ = writeln!(
        text,
        "{}: {} blocks, {} ok, {} sealed (not checked without their key), {} problems; read {} in {elapsed:.1} s",
        seeds.join(","),
        t.blocks,
        t.ok,
        t.sealed,
        t.problems.len(),
        size(t.bytes_read)
    );
    let status = match &repaired {
        Some((_, kept)) if kept.is_empty() => DONE,
        Some(_) => PROBLEMS,
        None if t.problems.is_empty() => DONE,
        None => PROBLEMS,
    };
    let repair = repaired.as_ref().map(|(removed, kept)| {
        let _ = writeln!(
            text,
            "repair: removed {}, kept {}",
            removed.len(),
            kept.len()
        );
        json!({
            "removed": removed,
            "kept": kept.iter().map(|(k, why)| json!({"key": k, "why": why})).collect::<Vec<_>>(),
        })
    });
    if let Some(b) = &bench {
        let _ = writeln!(
            text,
            "bench: verify {:.2} GB/s, raw GETs {:.2} GB/s of the same keys: {:.2}x",
            b["verify_gb_per_s"].as_f64().unwrap_or(0.0),
            b["raw_gb_per_s"].as_f64().unwrap_or(0.0),
            b["ratio"].as_f64().unwrap_or(0.0)
        );
    }
    let details: Vec<Json> = t
        .problems
        .iter()
        .map(|p| json!({"key": String::from_utf8_lossy(&p.name), "verdict": p.what, "why": p.why}))
        .collect();
    let json = json!({
        "store": seeds.join(","),
        "kind": "redis",
        "blocks": t.blocks,
        "ok": t.ok,
        "damaged": list("damaged"),
        "foreign": list("foreign"),
        "orphans": Vec::<String>::new(),
        "stale": list("stale"),
        "sealed_unverified": t.sealed,
        "newer": t.newer,
        "details": details,
        "repair": repair,
        "bytes_read": t.bytes_read,
        "elapsed_s": elapsed,
        "bench": bench,
    });
    Outcome { json, text, status }
}
