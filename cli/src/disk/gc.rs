//! `kvtier gc DIR --max-bytes B [--namespace N]`: brings the block files (of
//! every namespace directory, or of N's) under B bytes, least recently used
//! first, while tiers keep using them. Recency is the later of a file's
//! access time, which every load stamps (at most once a minute per block),
//! and its modification time, the store's. Each file goes only while its
//! name still holds the file that was listed (`remove_if_same`): a load
//! racing it is a miss, and a block stored again meanwhile stays. Stores go
//! on during a pass, so the directory is listed again after each pass that
//! removed something, up to [`PASSES`] passes: it ends within the budget
//! plus what tiers stored during the last pass.

use super::{open_root, walk, Meta};
use crate::progress::Progress;
use crate::report::{size, Outcome, DONE, PROBLEMS};
use crate::Common;
use kvtier::admin::disk::{remove_if_same, FanEntry, Removal};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Listings (each followed by removals) before gc gives up on tiers that
/// store faster than it removes.
const PASSES: usize = 4;

pub fn run(
    root: &Path,
    namespace: Option<&str>,
    budget: u64,
    common: &Common,
) -> Result<Outcome, String> {
    let started = Instant::now();
    let root = open_root(root, namespace)?;
    let (mut before, mut after) = (None, 0u64);
    let (mut removed, mut removed_bytes, mut replaced, mut passes) = (0u64, 0u64, 0u64, 0);
    let mut within = false;
    while passes < PASSES {
        passes += 1;
        let mut blocks = list_blocks(&root.namespaces, common);
        let mut usage: u64 = blocks.iter().map(|b| b.1.len).sum();
        before.get_or_insert(usage);
        after = usage;
        if usage <= budget {
            within = true;
            break;
        }
        blocks.sort_by_key(|b| b.1.last_use);
        let bar = Progress::new(common.progress, "gc: removing", 0);
        for (path, meta) in blocks {
            if usage <= budget {
                break;
            }
            match remove_if_same(&path, meta.stamp) {
                Ok(Removal::Removed) => {
                    usage -= meta.len;
                    removed += 1;
                    removed_bytes += meta.len;
                    bar.add(1);
                }
                Ok(Removal::Vanished) => usage -= meta.len,
                Ok(Removal::Replaced) => replaced += 1,
                Err(e) => return Err(format!("{}: {e}", path.display())),
            }
        }
        after = usage;
        within = usage <= budget;
    }
    let before = before.unwrap_or(0);
    let text = format!(
        "{}: {} before, {} after (budget {}): removed {removed} blocks ({}) in {passes} passes{}\n",
        root.path.display(),
        size(before),
        size(after),
        size(budget),
        size(removed_bytes),
        if within {
            ""
        } else {
            "; still over budget: tiers stored faster than gc removed"
        }
    );
    let json = json!({
        "store": root.path.display().to_string(),
        "kind": "disk",
        "budget": budget,
        "bytes_before": before,
        "bytes_after": after,
        "removed": removed,
        "removed_bytes": removed_bytes,
        "kept_replaced": replaced,
        "passes": passes,
        "within_budget": within,
        "elapsed_s": started.elapsed().as_secs_f64(),
    });
    Ok(Outcome {
        json,
        text,
        status: if within { DONE } else { PROBLEMS },
    })
}

/// Every block file (unsealed and sealed) of `namespaces`, with its size,
/// last use and identity.
fn list_blocks(namespaces: &[super::Namespace], common: &Common) -> Vec<(PathBuf, Meta)> {
    walk(
        namespaces,
        None,
        common.threads,
        common.progress.then_some("gc: listing"),
        true,
        Vec::new,
        |out: &mut Vec<(PathBuf, Meta)>, found| {
            let block = matches!(found.kind, FanEntry::Block | FanEntry::Sealed);
            if let Some(meta) = found.meta.filter(|m| block && m.regular) {
                out.push((
                    namespaces[found.ns].path.join(found.fan).join(found.name),
                    meta,
                ));
            }
        },
    )
    .into_iter()
    .flatten()
    .collect()
}
