//! `kvtier clear redis://... --namespace N`: removes namespace N's blocks
//! with the mechanism live tiers follow. For each block size N has blocks
//! of: every sealed tenant's generation key of N is raised (INCR), then a
//! shared tier of N clears through the library
//! (`kvtier::admin::clear_namespace`: the unsealed generation raised, the
//! old generations' blocks swept, return two `probe_ttl_ms` later), once more
//! per `--seal-key-file`; last, every name still attributed to N that is not
//! its tenant's new generation (an owned tier's, or one older than a sweep
//! reaches) is unlinked.

use super::gc::unlink;
use super::{each_node, names, open, scan, Attribution, Keyspace};
use crate::disk::clear::ClearArgs;
use crate::report::{fp, Outcome, DONE, PROBLEMS};
use crate::Common;
use kvtier::admin::redis::KeyName;
use kvtier::TierConfig;
use serde_json::json;
use std::fmt::Write;

pub fn run(
    url: &str,
    seeds: &[&str],
    key_prefix: &str,
    args: &ClearArgs,
    _common: &Common,
) -> Result<Outcome, String> {
    let ks = open(seeds, key_prefix)?;
    let ns = kvtier::admin::namespace_fingerprint(args.namespace);
    let before = names(&ks)?;
    let attribution = Attribution::new(&before.generations, Some(ns), &before.sizes());
    let mut sizes: Vec<usize> = before
        .groups
        .iter()
        .filter(|(f, bb)| {
            attribution
                .owner(*f, *bb)
                .is_some_and(|o| o.namespace_fp == ns)
        })
        .map(|g| g.1)
        .collect();
    for (key, _) in &before.generations {
        if let KeyName::Generation {
            namespace_fp,
            block_bytes,
            ..
        } = key
        {
            if *namespace_fp == ns {
                sizes.push(*block_bytes);
            }
        }
    }
    sizes.sort_unstable();
    sizes.dedup();
    let counted_before = count(&ks, ns, &attribution, false)?;
    let mut text = String::new();
    let mut failed = Vec::new();
    for &bb in &sizes {
        for ((key, _), name) in before.generations.iter().zip(&before.generation_keys) {
            if let KeyName::Generation {
                namespace_fp,
                sealed: true,
                block_bytes,
                tenant,
            } = key
            {
                if *namespace_fp == ns && *block_bytes == bb {
                    if let Err(e) = incr(&ks, name) {
                        failed.push(format!("raising tenant {}'s generation: {e}", fp(*tenant)));
                    }
                }
            }
        }
        let mut config = TierConfig::default();
        let set = |c: &mut TierConfig, k: &str, v: &str| c.set(k, v).map_err(|e| e.to_string());
        set(&mut config, "backend", "redis")?;
        set(&mut config, "url", url)?;
        set(&mut config, "key_prefix", key_prefix)?;
        set(&mut config, "sharing", "shared")?;
        set(&mut config, "namespace", args.namespace)?;
        config.probe_ttl_ms = args.probe_ttl_ms;
        if let Err(e) = kvtier::admin::clear_namespace(&config, bb) {
            failed.push(format!("{bb} B blocks: {e}"));
            continue;
        }
        for key_file in args.seal_key_files {
            let mut sealed = config.clone();
            set(
                &mut sealed,
                "seal_key_file",
                &key_file.display().to_string(),
            )?;
            if let Err(e) = kvtier::admin::clear_namespace(&sealed, bb) {
                failed.push(format!(
                    "{bb} B blocks, tenant of {}: {e}",
                    key_file.display()
                ));
            }
        }
        let _ = writeln!(
            text,
            "namespace {:?}, {bb} B blocks: generation raised",
            args.namespace
        );
    }
    // What the sweeps could not reach: an owned tier's names, generations
    // older than a sweep looks back, tenants raised above.
    let after = names(&ks)?;
    let attribution = Attribution::new(&after.generations, Some(ns), &after.sizes());
    let leftovers = count(&ks, ns, &attribution, true)?;
    let removed_late: u64 = each_node(&ks, |node| unlink(&ks, node, &leftovers[node]).map(|r| r.0))
        .into_iter()
        .sum::<Result<u64, String>>()?;
    let counted_after = count(&ks, ns, &attribution, false)?;
    let old_left: usize = count(&ks, ns, &attribution, true)?
        .iter()
        .map(Vec::len)
        .sum();
    let (b, a): (usize, usize) = (
        counted_before.iter().map(Vec::len).sum(),
        counted_after.iter().map(Vec::len).sum(),
    );
    let _ = writeln!(
        text,
        "{}: {b} blocks of {:?} before; {old_left} of before the clear left, {a} stored since; \
         {removed_late} unlinked after the sweeps",
        seeds.join(","),
        args.namespace,
    );
    for f in &failed {
        let _ = writeln!(text, "failed: {f}");
    }
    let json = json!({
        "store": seeds.join(","),
        "kind": "redis",
        "namespace": args.namespace,
        "fingerprint": fp(ns),
        "block_sizes": sizes,
        "blocks_before": b,
        "blocks_after": a,
        "old_blocks_left": old_left,
        "removed": b.saturating_sub(old_left),
        "removed_after_the_sweep": removed_late,
        "failed": failed,
    });
    Ok(Outcome {
        json,
        text,
        status: if failed.is_empty() { DONE } else { PROBLEMS },
    })
}

/// INCR on whichever master holds `name`.
fn incr(ks: &Keyspace, name: &[u8]) -> Result<(), String> {
    let mut last = String::new();
    for node in &ks.nodes {
        let mut c = node.connect()?;
        match redis::cmd("INCR").arg(name).query::<i64>(&mut c) {
            Ok(_) => return Ok(()),
            Err(e) => last = e.to_string(),
        }
    }
    Err(last)
}

/// Names and their sizes, per master.
type PerMaster = Vec<Vec<(Vec<u8>, u64)>>;

/// Per master, the names attributed to namespace `ns` (with `leftover`,
/// only those that are not a tenant's current generation, or are an owned
/// tier's), with their sizes.
fn count(
    ks: &Keyspace,
    ns: u64,
    attribution: &Attribution,
    leftover: bool,
) -> Result<PerMaster, String> {
    each_node(ks, |node| {
        let mut out = Vec::new();
        scan(ks, node, false, |_, batch| {
            for key in batch {
                if let KeyName::Block {
                    fp, block_bytes, ..
                } = key.what
                {
                    let Some(owner) = attribution
                        .owner(fp, block_bytes)
                        .filter(|o| o.namespace_fp == ns)
                    else {
                        continue;
                    };
                    if !leftover || owner.stale || fp == ns {
                        out.push((key.name, 0));
                    }
                }
            }
            Ok(())
        })?;
        Ok(out)
    })
    .into_iter()
    .collect()
}
