//! `kvtier inspect redis://... [--key-prefix P] [--namespace N]`: one SCAN of
//! every master (with OBJECT IDLETIME per block, pipelined; sizes from names),
//! grouped by the fingerprint and block size in the names; a group is named
//! after the namespace and tenant whose generation key (or `--namespace`)
//! gives that fingerprint, current or left by a clear.

use super::{each_node, open, scan, Attribution, Owner};
use crate::report::{fp, size, Ages, Outcome, DONE};
use crate::Common;
use kvtier::admin::redis::{BlockTag, KeyName};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::fmt::Write;

/// Per namespace (fingerprint, block size), per tenant (number, sealed):
/// its blocks of the current generation and of those a clear left.
type ByNamespace = BTreeMap<(Option<u64>, usize), BTreeMap<(u64, bool), (Group, Group)>>;

#[derive(Default, Clone, Copy)]
struct Group {
    blocks: u64,
    bytes: u64,
    sealed: u64,
    ages: Ages,
}

pub fn run(
    seeds: &[&str],
    key_prefix: &str,
    namespace: Option<&str>,
    common: &Common,
) -> Result<Outcome, String> {
    let started = std::time::Instant::now();
    let ks = open(seeds, key_prefix)?;
    let bar = crate::progress::Progress::new(common.progress, "inspect: scanning", 0);
    let per_node = each_node(&ks, |node| {
        let mut groups: BTreeMap<(u64, usize), Group> = BTreeMap::new();
        let mut gens = Vec::new();
        let mut others = 0u64;
        scan(&ks, node, true, |c, batch| {
            bar.add(batch.len() as u64);
            for found in batch {
                match &found.what {
                    KeyName::Block {
                        fp,
                        block_bytes,
                        tag,
                    } => {
                        let g = groups.entry((*fp, *block_bytes)).or_default();
                        g.blocks += 1;
                        g.bytes += found.len.unwrap_or(0);
                        g.sealed += u64::from(*tag == BlockTag::Sealed);
                        if let Some(idle) = found.idle_s {
                            g.ages.add(idle);
                        }
                    }
                    KeyName::Generation { .. } => {
                        let value: Option<String> =
                            redis::cmd("GET").arg(&found.name).query(c).ok().flatten();
                        gens.push((
                            found.what.clone(),
                            value.and_then(|v| v.trim().parse().ok()),
                        ));
                    }
                    KeyName::Other => others += 1,
                }
            }
            Ok(())
        })?;
        Ok::<_, String>((groups, gens, others))
    });
    drop(bar);
    let mut groups: BTreeMap<(u64, usize), Group> = BTreeMap::new();
    let mut gens = Vec::new();
    let mut others = 0;
    for result in per_node {
        let (g, gs, o) = result?;
        for (k, v) in g {
            let t = groups.entry(k).or_default();
            t.blocks += v.blocks;
            t.bytes += v.bytes;
            t.sealed += v.sealed;
            t.ages.merge(&v.ages);
        }
        gens.extend(gs);
        others += o;
    }
    let named = namespace.map(kvtier::admin::namespace_fingerprint);
    let sizes: Vec<usize> = groups.keys().map(|k| k.1).collect();
    let attribution = Attribution::new(&gens, named, &sizes);
    // Namespace (fingerprint, block size) -> tenant -> (current, stale).
    let mut namespaces: ByNamespace = BTreeMap::new();
    let mut unattributed = Vec::new();
    let (mut blocks, mut bytes, mut ages) = (0, 0, Ages::default());
    for (&(group_fp, bb), g) in &groups {
        blocks += g.blocks;
        bytes += g.bytes;
        ages.merge(&g.ages);
        match attribution.owner(group_fp, bb) {
            Some(Owner {
                namespace_fp,
                tenant,
                sealed,
                stale,
            }) => {
                if named.is_some_and(|n| n != namespace_fp) {
                    continue;
                }
                let tenants = namespaces.entry((Some(namespace_fp), bb)).or_default();
                let slot = tenants.entry((tenant, sealed)).or_default();
                let part = if stale { &mut slot.1 } else { &mut slot.0 };
                part.blocks += g.blocks;
                part.bytes += g.bytes;
                part.sealed += g.sealed;
                part.ages.merge(&g.ages);
            }
            None if named.is_none() => unattributed.push((group_fp, bb, *g)),
            None => {}
        }
    }
    let mut text = format!(
        "{} ({}, {} masters), key_prefix {key_prefix:?}\n",
        seeds.join(","),
        if ks.cluster {
            "cluster"
        } else {
            "single server"
        },
        ks.nodes.len()
    );
    let mut list = Vec::new();
    for (&(ns_fp, bb), tenants) in &namespaces {
        let ns_fp = ns_fp.expect("attributed");
        let name = named.filter(|&n| n == ns_fp).and(namespace);
        let (mut nb, mut nbytes, mut nages) = (0, 0, Ages::default());
        let mut tenant_list = Vec::new();
        for (&(tenant, sealed), (current, stale)) in tenants {
            nb += current.blocks + stale.blocks;
            nbytes += current.bytes + stale.bytes;
            nages.merge(&current.ages);
            nages.merge(&stale.ages);
            let generation = gens.iter().find_map(|(k, v)| match k {
                KeyName::Generation {
                    namespace_fp,
                    tenant: t,
                    block_bytes,
                    ..
                } if *namespace_fp == ns_fp && *t == tenant && *block_bytes == bb => {
                    Some(v.unwrap_or(0))
                }
                _ => None,
            });
            tenant_list.push(json!({
                "tenant": if sealed { format!("sealed {}", fp(tenant)) } else { "unsealed".into() },
                "generation": generation.unwrap_or(0),
                "blocks": current.blocks, "bytes": current.bytes,
                "stale_blocks": stale.blocks, "stale_bytes": stale.bytes,
            }));
        }
        let _ = writeln!(
            text,
            "namespace {} ({} B blocks): {nb} blocks, {}; ages:{}",
            name.map_or_else(|| fp(ns_fp), |n| format!("{n:?}")),
            bb,
            size(nbytes),
            nages.line()
        );
        list.push(json!({
            "namespace": name, "fingerprint": fp(ns_fp), "attributed": true, "block_bytes": bb,
            "blocks": nb, "bytes": nbytes, "tenants": tenant_list, "ages": nages.json(),
        }));
    }
    for (group_fp, bb, g) in &unattributed {
        let _ = writeln!(
            text,
            "blocks named {} ({} B blocks; no generation key names them: pass --namespace): {} blocks, {}",
            fp(*group_fp),
            bb,
            g.blocks,
            size(g.bytes)
        );
        list.push(json!({
            "namespace": Value::Null, "fingerprint": fp(*group_fp), "attributed": false, "block_bytes": bb,
            "blocks": g.blocks, "bytes": g.bytes, "sealed_blocks": g.sealed, "ages": g.ages.json(),
        }));
    }
    let _ = writeln!(
        text,
        "total: {blocks} blocks, {}; {others} other keys under the prefix",
        size(bytes)
    );
    let generations: Vec<Value> = gens
        .iter()
        .map(|(k, v)| match k {
            KeyName::Generation {
                namespace_fp,
                tenant,
                sealed,
                block_bytes,
            } => json!({
                "namespace_fingerprint": fp(*namespace_fp), "tenant": fp(*tenant), "sealed": sealed,
                "block_bytes": block_bytes, "generation": v,
            }),
            _ => Value::Null,
        })
        .collect();
    let json = json!({
        "store": seeds.join(","),
        "kind": "redis",
        "cluster": ks.cluster,
        "masters": ks.nodes.iter().map(|n| n.name.clone()).collect::<Vec<_>>(),
        "key_prefix": key_prefix,
        "blocks": blocks,
        "bytes": bytes,
        "ages": ages.json(),
        "namespaces": list,
        "generations": generations,
        "other_keys": others,
        "elapsed_s": started.elapsed().as_secs_f64(),
    });
    Ok(Outcome {
        json,
        text,
        status: DONE,
    })
}
