//! `kvtier verify DIR [--namespace N] [--repair] [--bench]`: every unsealed
//! block file read whole and checked as a tier of its directory checks it
//! (`kvtier::admin::disk::Checker`), every other name sorted out, and with
//! `--repair` only what `docs/reliability-rules.md` lets a tier delete
//! removed: damaged blocks and blocks of generations a clear left behind
//! (each only while its name still holds the file examined), and
//! temporaries older than a store can take (10 minutes), or all of them
//! while no tier holds the directory. Foreign files, sealed files (no key
//! here), blocks in a newer format and files that could not be read stay.

use super::{ns_entries, open_root, walk, Namespace};
use crate::progress::Progress;
use crate::report::{now_s, size, Outcome, DONE, PROBLEMS};
use crate::Common;
use kvtier::admin::disk::{
    lock_if_idle, remove_if_same, Checked, Checker, FanEntry, FileStamp, NsEntry, Removal, Verdict,
};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::fmt::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

/// A temporary file younger than this may be a store in progress in a
/// shared directory (a tier's own rule: `SHARED_TMP_GRACE`).
const TMP_GRACE_S: i64 = 600;

/// An unsealed block file to check.
struct Block {
    ns: usize,
    path: PathBuf,
    fan: String,
    name: String,
}

/// What a repair removed, and what it kept with why.
type Repaired = (Vec<PathBuf>, Vec<(PathBuf, String)>);

/// Everything found that is not a good block, with why.
#[derive(Default)]
struct Findings {
    ok: u64,
    bytes_read: u64,
    sealed: u64,
    in_progress: u64,
    /// (path, verdict, why, identity when opened)
    problems: Vec<(PathBuf, &'static str, String, Option<FileStamp>)>,
}

pub fn run(
    root: &Path,
    namespace: Option<&str>,
    repair: bool,
    bench: Option<usize>,
    common: &Common,
) -> Result<Outcome, String> {
    let started = Instant::now();
    let root = open_root(root, namespace)?;
    let namespaces = &root.namespaces;
    let now = now_s();
    let listed = walk(
        namespaces,
        None,
        common.threads,
        common.progress.then_some("verify: listing"),
        false,
        Vec::new,
        |out: &mut Vec<(usize, String, String, FanEntry)>, found| {
            out.push((
                found.ns,
                found.fan.to_string(),
                found.name.to_string(),
                found.kind,
            ));
        },
    );
    let mut findings = Findings::default();
    let mut blocks = Vec::new();
    let mut orphans_by_ns: HashMap<usize, Vec<PathBuf>> = HashMap::new();
    for (ns, fan, name, kind) in listed.into_iter().flatten() {
        let path = namespaces[ns].path.join(&fan).join(&name);
        match kind {
            FanEntry::Block => blocks.push(Block {
                ns,
                path,
                fan,
                name,
            }),
            FanEntry::Sealed => findings.sealed += 1,
            FanEntry::Temporary => {
                orphan_or_running(&mut findings, &mut orphans_by_ns, ns, path, now, namespaces)
            }
            FanEntry::Other => {
                findings
                    .problems
                    .push((path, "foreign", "not a name a tier writes".into(), None))
            }
        }
    }
    for (at, ns) in namespaces.iter().enumerate() {
        for (name, kind, _) in ns_entries(ns) {
            let path = ns.path.join(&name);
            match kind {
                NsEntry::Debris => {
                    orphan_or_running(&mut findings, &mut orphans_by_ns, at, path, now, namespaces)
                }
                NsEntry::Other => findings.problems.push((
                    path,
                    "foreign",
                    "not a name a tier writes".into(),
                    None,
                )),
                NsEntry::Kept | NsEntry::FanDir => {}
            }
        }
    }
    let checked = check_all(namespaces, &blocks, common)?;
    for (
        block,
        Checked {
            verdict,
            stamp,
            len,
        },
    ) in blocks.iter().zip(checked)
    {
        findings.bytes_read += len;
        let (what, why) = match verdict {
            Verdict::Good { .. } => {
                findings.ok += 1;
                continue;
            }
            Verdict::Vanished | Verdict::Newer => continue,
            Verdict::Stale => ("stale", "a generation a clear left behind".to_string()),
            Verdict::Damaged(why) => ("damaged", why),
            Verdict::Foreign(why) => ("foreign", why),
            Verdict::Unreadable(why) => ("unreadable", why),
        };
        findings
            .problems
            .push((block.path.clone(), what, why, stamp));
    }
    let elapsed = started.elapsed().as_secs_f64();
    let repaired = repair.then(|| do_repair(&findings, &orphans_by_ns, namespaces));
    let bench = match bench {
        Some(repeat) => Some(measure(namespaces, &blocks, common, repeat)?),
        None => None,
    };
    Ok(outcome(
        &root.path,
        blocks.len() as u64,
        findings,
        repaired,
        elapsed,
        bench,
    ))
}

fn orphan_or_running(
    findings: &mut Findings,
    orphans: &mut HashMap<usize, Vec<PathBuf>>,
    ns: usize,
    path: PathBuf,
    now: i64,
    namespaces: &[Namespace],
) {
    let old = std::fs::symlink_metadata(&path)
        .map(|m| now - super::Meta::of(&m).written > TMP_GRACE_S)
        .unwrap_or(false);
    let idle = kvtier::admin::disk::holder(&namespaces[ns].path)
        .is_ok_and(|h| h == kvtier::admin::disk::Holder::Nobody);
    if old || idle {
        orphans.entry(ns).or_default().push(path.clone());
        let why = if old {
            "older than 10 minutes"
        } else {
            "no tier holds the directory"
        };
        findings.problems.push((path, "orphan", why.into(), None));
    } else {
        findings.in_progress += 1;
    }
}

/// Checks every block on the common threads, in the blocks' order.
fn check_all(
    namespaces: &[Namespace],
    blocks: &[Block],
    common: &Common,
) -> Result<Vec<Checked>, String> {
    let bar = Progress::new(common.progress, "verify: checking", blocks.len() as u64);
    let results = each_block(blocks, common.threads, |checkers, i, block| {
        let checked = check_one(checkers, namespaces, block);
        bar.add(1);
        (i, checked)
    });
    let mut all: Vec<Option<Checked>> = (0..blocks.len()).map(|_| None).collect();
    for (at, checked) in results.into_iter().flatten() {
        all[at] = Some(checked);
    }
    Ok(all
        .into_iter()
        .map(|r| r.expect("every block checked"))
        .collect())
}

/// One checker per block size and thread.
type Checkers = HashMap<usize, std::io::Result<Checker>>;

fn check_one(checkers: &mut Checkers, namespaces: &[Namespace], block: &Block) -> Checked {
    let ns = &namespaces[block.ns];
    let bb = ns.dir.block_bytes;
    match checkers.entry(bb).or_insert_with(|| Checker::new(bb)) {
        Ok(checker) => checker.check(&ns.path, &block.fan, &block.name, &ns.fingerprints()),
        Err(e) => Checked {
            verdict: Verdict::Unreadable(format!("no buffer for a block of {bb} bytes: {e}")),
            stamp: None,
            len: 0,
        },
    }
}

/// Runs `f` over every block on `threads` threads (each with its checkers);
/// what each thread's calls returned.
fn each_block<R: Send>(
    blocks: &[Block],
    threads: usize,
    f: impl Fn(&mut Checkers, usize, &Block) -> R + Sync,
) -> Vec<Vec<R>> {
    let next = AtomicUsize::new(0);
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads.max(1))
            .map(|_| {
                scope.spawn(|| {
                    let mut checkers = Checkers::new();
                    let mut out = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(block) = blocks.get(i) else { break };
                        out.push(f(&mut checkers, i, block));
                    }
                    out
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().expect("a checking thread panicked"))
            .collect()
    })
}

/// Removes what a tier may remove; (removed, kept with why).
fn do_repair(
    findings: &Findings,
    orphans: &HashMap<usize, Vec<PathBuf>>,
    namespaces: &[Namespace],
) -> Repaired {
    let mut removed = Vec::new();
    let mut kept = Vec::new();
    for (path, what, _, stamp) in &findings.problems {
        match (*what, stamp) {
            ("damaged" | "stale", Some(stamp)) => match remove_if_same(path, *stamp) {
                Ok(Removal::Removed) => removed.push(path.clone()),
                Ok(Removal::Vanished) => {}
                Ok(Removal::Replaced) => {
                    kept.push((path.clone(), "replaced by a newer store meanwhile".into()))
                }
                Err(e) => kept.push((path.clone(), format!("could not remove: {e}"))),
            },
            ("orphan", _) => {}
            (what, _) => kept.push((path.clone(), format!("{what}: never removed"))),
        }
    }
    for (ns, paths) in orphans {
        // Held while the young ones go: no store can be running meanwhile.
        let lock = lock_if_idle(&namespaces[*ns].path);
        let now = now_s();
        for path in paths {
            let old = std::fs::symlink_metadata(path)
                .is_ok_and(|m| now - super::Meta::of(&m).written > TMP_GRACE_S);
            if !old && lock.is_none() {
                kept.push((
                    path.clone(),
                    "a tier holds the directory now: it may be a store's".into(),
                ));
                continue;
            }
            match std::fs::remove_file(path) {
                Ok(()) => removed.push(path.clone()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => kept.push((path.clone(), format!("could not remove: {e}"))),
            }
        }
    }
    (removed, kept)
}

/// Raw reads against checks of the same files, alternating, `repeat` times:
/// (raw GB/s, verify GB/s) medians and every run.
fn measure(
    namespaces: &[Namespace],
    blocks: &[Block],
    common: &Common,
    repeat: usize,
) -> Result<Value, String> {
    let mut raw = Vec::new();
    let mut checked = Vec::new();
    for _ in 0..repeat.max(1) {
        raw.push(pass(namespaces, blocks, common.threads, true)?);
        checked.push(pass(namespaces, blocks, common.threads, false)?);
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (mut r, mut c) = (raw.clone(), checked.clone());
    let (raw_med, check_med) = (median(&mut r), median(&mut c));
    Ok(json!({
        "threads": common.threads,
        "files": blocks.len(),
        "raw_gb_per_s": raw_med,
        "verify_gb_per_s": check_med,
        "ratio": if raw_med > 0.0 { check_med / raw_med } else { 0.0 },
        "raw_runs": raw,
        "verify_runs": checked,
    }))
}

/// One timed pass over every block: raw O_DIRECT reads, or checks; GB/s.
fn pass(
    namespaces: &[Namespace],
    blocks: &[Block],
    threads: usize,
    raw: bool,
) -> Result<f64, String> {
    let started = Instant::now();
    let bytes: u64 = each_block(blocks, threads, |checkers, _, block| {
        if !raw {
            let checked = check_one(checkers, namespaces, block);
            return if let Verdict::Good { .. } = checked.verdict {
                checked.len
            } else {
                0
            };
        }
        let bb = namespaces[block.ns].dir.block_bytes;
        match checkers.entry(bb).or_insert_with(|| Checker::new(bb)) {
            Ok(checker) => checker.read_raw(&block.path).unwrap_or(0) as u64,
            Err(_) => 0,
        }
    })
    .into_iter()
    .flatten()
    .sum();
    Ok(bytes as f64 / started.elapsed().as_secs_f64() / 1e9)
}

fn outcome(
    root: &Path,
    blocks: u64,
    findings: Findings,
    repaired: Option<Repaired>,
    elapsed: f64,
    bench: Option<Value>,
) -> Outcome {
    let list = |what: &str| -> Vec<String> {
        findings
            .problems
            .iter()
            .filter(|p| p.1 == what)
            .map(|p| p.0.display().to_string())
            .collect()
    };
    let details: Vec<Value> = findings
        .problems
        .iter()
        .map(|(path, what, why, _)| json!({"path": path.display().to_string(), "verdict": what, "why": why}))
        .collect();
    let mut text = String::new();
    for (path, what, why, _) in &findings.problems {
        let _ = writeln!(text, "{what}: {}: {why}", path.display());
    }
    let _ = writeln!(
        text,
        "{}: {blocks} block files, {} ok, {} sealed (not checked without their key), {} problems; read {} in {elapsed:.1} s",
        root.display(),
        findings.ok,
        findings.sealed,
        findings.problems.len(),
        size(findings.bytes_read)
    );
    let status = match &repaired {
        Some((_, kept)) if kept.is_empty() => DONE,
        Some(_) => PROBLEMS,
        None if findings.problems.is_empty() => DONE,
        None => PROBLEMS,
    };
    let repair = repaired.as_ref().map(|(removed, kept)| {
        let _ = writeln!(text, "repair: removed {}, kept {}", removed.len(), kept.len());
        for (path, why) in kept {
            let _ = writeln!(text, "  kept {}: {why}", path.display());
        }
        json!({
            "removed": removed.iter().map(|p| p.display().to_string()).collect::<Vec<_>>(),
            "kept": kept.iter().map(|(p, why)| json!({"path": p.display().to_string(), "why": why})).collect::<Vec<_>>(),
        })
    });
    if let Some(bench) = &bench {
        let _ = writeln!(
            text,
            "bench: verify {:.2} GB/s, raw O_DIRECT reads {:.2} GB/s of the same files: {:.2}x ({} threads)",
            bench["verify_gb_per_s"].as_f64().unwrap_or(0.0),
            bench["raw_gb_per_s"].as_f64().unwrap_or(0.0),
            bench["ratio"].as_f64().unwrap_or(0.0),
            bench["threads"]
        );
    }
    let json = json!({
        "store": root.display().to_string(),
        "kind": "disk",
        "blocks": blocks + findings.sealed,
        "ok": findings.ok,
        "damaged": list("damaged"),
        "foreign": list("foreign"),
        "orphans": list("orphan"),
        "stale": list("stale"),
        "unreadable": list("unreadable"),
        "sealed_unverified": findings.sealed,
        "temporaries_in_progress": findings.in_progress,
        "details": details,
        "repair": repair,
        "bytes_read": findings.bytes_read,
        "elapsed_s": elapsed,
        "bench": bench,
    });
    Outcome { json, text, status }
}
