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

/// The most value bytes one pipeline of GETs asks for (a reading thread
/// holds one window's values).
const WINDOW_BYTES: usize = 8 << 20;

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
        let mut reads = Reads::new();
        scan(&ks, node, false, |_, batch| {
            bar.add(batch.len() as u64);
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
            Ok(())
        })?;
        let read = read_parallel(
            &ks,
            node,
            &reads,
            common.threads,
            |t: &mut Tally, at, value| check_read(node, &reads[at], value, t),
        )?;
        for r in read {
            t.merge(r);
        }
        Ok::<_, String>(t)
    });
    drop(bar);
    let mut tally = Tally::default();
    for t in per_node {
        tally.merge(t?);
    }
    let names = std::mem::take(&mut tally.names);
    let elapsed = started.elapsed().as_secs_f64();
    let repaired = repair.then(|| do_repair(&ks, &tally.problems));
    let bench = match bench {
        Some(repeat) => Some(measure(&ks, &names, common.threads, repeat)?),
        None => None,
    };
    Ok(outcome(seeds, &tally, repaired, elapsed, bench))
}

/// Unsealed blocks to read: (name, fingerprint, block size, tag).
type Reads = Vec<(Vec<u8>, u64, usize, BlockTag)>;

impl Tally {
    fn merge(&mut self, t: Tally) {
        self.blocks += t.blocks;
        self.ok += t.ok;
        self.sealed += t.sealed;
        self.newer += t.newer;
        self.bytes_read += t.bytes_read;
        self.problems.extend(t.problems);
        self.names.extend(t.names);
    }
}

/// Checks the value a GET of `read` (master `node`'s) brought.
fn check_read(
    node: usize,
    read: &(Vec<u8>, u64, usize, BlockTag),
    value: Value,
    t: &mut Tally,
) -> Result<(), String> {
    let (name, fp, bb, tag) = read;
    let verdict = match value {
        Value::Nil => return Ok(()),
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
            return Ok(());
        }
        ValueVerdict::Newer => {
            t.newer += 1;
            return Ok(());
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
    Ok(())
}

/// GETs `reads` of master `node` on `threads` connections of their own, a
/// window of at most [`WINDOW_BYTES`] per pipeline, handing each value (and
/// its index in `reads`) to `f` with the thread's accumulator.
fn read_parallel<T: Default + Send>(
    ks: &Keyspace,
    node: usize,
    reads: &Reads,
    threads: usize,
    f: impl Fn(&mut T, usize, Value) -> Result<(), String> + Sync,
) -> Result<Vec<T>, String> {
    // Windows first, so that threads take whole pipelines.
    let mut windows = Vec::new();
    let mut at = 0;
    while at < reads.len() {
        let per = (WINDOW_BYTES / reads[at].2.max(1)).max(1);
        windows.push(at..(at + per).min(reads.len()));
        at += per;
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads.clamp(1, windows.len().max(1)))
            .map(|_| {
                scope.spawn(|| {
                    let mut acc = T::default();
                    let mut c = ks.nodes[node].connect()?;
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(window) = windows.get(i) else { break };
                        let mut pipe = redis::pipe();
                        for (name, ..) in &reads[window.clone()] {
                            pipe.cmd("GET").arg(name);
                        }
                        let values: Vec<Value> = pipe
                            .ignore_errors()
                            .query(&mut c)
                            .map_err(|e| format!("GET: {e}"))?;
                        for (at, value) in window.clone().zip(values) {
                            f(&mut acc, at, value)?;
                        }
                    }
                    Ok::<_, String>(acc)
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().expect("a reading thread panicked"))
            .collect()
    })
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
/// `threads` connections per master, alternating `repeat` times: GB/s.
fn measure(
    ks: &Keyspace,
    names: &[(Vec<u8>, usize, u64, usize, BlockTag)],
    threads: usize,
    repeat: usize,
) -> Result<Json, String> {
    let per_node: Vec<Reads> = (0..ks.nodes.len())
        .map(|node| {
            names
                .iter()
                .filter(|n| n.1 == node)
                .map(|n| (n.0.clone(), n.2, n.3, n.4.clone()))
                .collect()
        })
        .collect();
    let pass = |check: bool| -> Result<f64, String> {
        let started = Instant::now();
        let mut total = 0u64;
        for bytes in each_node(ks, |node| {
            let reads = &per_node[node];
            let counted = read_parallel(ks, node, reads, threads, |n: &mut u64, at, v| {
                if let Value::BulkString(b) = v {
                    let (_, fp, bb, tag) = &reads[at];
                    if !check || matches!(check_value(*fp, *bb, tag, &b), ValueVerdict::Good { .. })
                    {
                        *n += b.len() as u64;
                    }
                }
                Ok(())
            })?;
            Ok::<_, String>(counted.into_iter().sum::<u64>())
        }) {
            total += bytes?;
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
        "connections_per_master": threads, "masters": ks.nodes.len(), "blocks": names.len(),
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
