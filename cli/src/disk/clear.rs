//! `kvtier clear DIR --namespace N`: removes namespace N's blocks, with the
//! mechanism live tiers follow. For each of N's directories (one per block
//! size): every sealed tenant's generation file is raised, then a shared
//! tier of N clears it through the library (`kvtier::admin::clear_namespace`:
//! the unsealed tiers' generation raised, the old generation's blocks swept,
//! return two `probe_ttl_ms` later, when no tier answers HIT for or loads a
//! block stored before), once more per `--seal-key-file` for that tenant;
//! last, every block file still there that was written before the clear
//! began is removed (sealed tenants' without a key given, blocks of before
//! generations), each only while its name still holds the file listed.

use super::{open_root, walk, Namespace};
use crate::report::{Outcome, DONE, PROBLEMS};
use crate::Common;
use kvtier::admin::disk::{
    holder, raise_generation, remove_if_same, FanEntry, FileStamp, Holder, Removal,
};
use kvtier::{BackendKind, TierConfig};
use serde_json::{json, Value};
use std::fmt::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

pub struct ClearArgs<'a> {
    pub namespace: &'a str,
    pub probe_ttl_ms: u32,
    pub seal_key_files: &'a [PathBuf],
}

pub fn run(root: &Path, args: &ClearArgs, common: &Common) -> Result<Outcome, String> {
    let found = open_root(root, Some(args.namespace))?;
    let mut text = String::new();
    let mut dirs = Vec::new();
    let mut failed = false;
    for ns in &found.namespaces {
        match clear_dir(root, ns, args, common) {
            Ok((json, line)) => {
                text.push_str(&line);
                dirs.push(json);
            }
            Err(e) => {
                failed = true;
                let _ = writeln!(text, "{}: not cleared: {e}", ns.label());
                let mut json = ns.json_head();
                json.insert("error".into(), json!(e));
                dirs.push(Value::Object(json));
            }
        }
    }
    if found.namespaces.is_empty() {
        let _ = writeln!(
            text,
            "{}: no directory of namespace {:?}: nothing to clear",
            root.display(),
            args.namespace
        );
    }
    let removed: u64 = dirs.iter().filter_map(|d| d["removed"].as_u64()).sum();
    let json = json!({
        "store": root.display().to_string(),
        "kind": "disk",
        "namespace": args.namespace,
        "removed": removed,
        "directories": dirs,
    });
    Ok(Outcome {
        json,
        text,
        status: if failed { PROBLEMS } else { DONE },
    })
}

fn clear_dir(
    root: &Path,
    ns: &Namespace,
    args: &ClearArgs,
    common: &Common,
) -> Result<(Value, String), String> {
    if holder(&ns.path).map_err(|e| e.to_string())? == Holder::Exclusive {
        return Err(
            "a tier opened with shared=false holds it: clear through that tier, or stop it first"
                .into(),
        );
    }
    let began = SystemTime::now();
    let before = count_blocks(ns, common, None).len() as u64;
    for generation in ns.generations.iter().filter(|g| g.sealed()) {
        raise_generation(&ns.path, generation, 0)
            .map_err(|e| format!("raising {}: {e}", generation.file))?;
    }
    let mut config = TierConfig {
        backend: BackendKind::Disk,
        namespace: args.namespace.to_string(),
        probe_ttl_ms: args.probe_ttl_ms,
        ..TierConfig::default()
    };
    config.disk.path = Some(root.to_path_buf());
    config.disk.shared = true;
    let bb = ns.dir.block_bytes;
    kvtier::admin::clear_namespace(&config, bb).map_err(|e| e.to_string())?;
    for key_file in args.seal_key_files {
        let mut sealed = config.clone();
        sealed
            .set("seal_key_file", &key_file.display().to_string())
            .map_err(|e| e.to_string())?;
        kvtier::admin::clear_namespace(&sealed, bb).map_err(|e| e.to_string())?;
    }
    let mut removed_late = 0u64;
    for (path, stamp) in count_blocks(ns, common, Some(began)) {
        if let Ok(Removal::Removed) = remove_if_same(&path, stamp) {
            removed_late += 1;
        }
    }
    let after = count_blocks(ns, common, None).len() as u64;
    let old_left = count_blocks(ns, common, Some(began)).len() as u64;
    let generation = kvtier::admin::disk::read_generations(&ns.path)
        .unwrap_or_default()
        .into_iter()
        .find(|g| !g.sealed())
        .and_then(|g| g.generation);
    let mut json = ns.json_head();
    let extra = json!({
        "blocks_before": before,
        "blocks_after": after,
        "old_blocks_left": old_left,
        "removed": before.saturating_sub(old_left),
        "removed_after_the_sweep": removed_late,
        "generation": generation,
    });
    json.extend(extra.as_object().expect("an object").clone());
    let line = format!(
        "{}: cleared; {before} blocks before, {old_left} of them left, {} stored since; generation {}\n",
        ns.label(),
        after.saturating_sub(old_left),
        generation.map_or("?".into(), |g| g.to_string())
    );
    Ok((Value::Object(json), line))
}

/// The block files of `ns` (written before `written_before`, when given).
fn count_blocks(
    ns: &Namespace,
    common: &Common,
    written_before: Option<SystemTime>,
) -> Vec<(PathBuf, FileStamp)> {
    let cutoff =
        written_before.map(|t| t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default());
    walk(
        std::slice::from_ref(ns),
        None,
        common.threads,
        None,
        true,
        Vec::new,
        |out: &mut Vec<(PathBuf, FileStamp)>, found| {
            let Some(meta) = found.meta.filter(|m| m.regular) else {
                return;
            };
            if !matches!(found.kind, FanEntry::Block | FanEntry::Sealed) {
                return;
            }
            let path = ns.path.join(found.fan).join(found.name);
            let old = match cutoff {
                None => true,
                Some(cutoff) => std::fs::symlink_metadata(&path).is_ok_and(|m| {
                    (m.mtime(), m.mtime_nsec())
                        < (cutoff.as_secs() as i64, cutoff.subsec_nanos() as i64)
                }),
            };
            if old {
                out.push((path, meta.stamp));
            }
        },
    )
    .into_iter()
    .flatten()
    .collect()
}
