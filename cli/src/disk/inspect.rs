//! `kvtier inspect DIR`: per namespace directory, its blocks and bytes (by
//! tenant and header form), their ages, temporary debris, the manifest's and
//! journals' state, its generations and who holds it. A closed directory
//! whose manifest is trusted (no fan-out directory changed since the last
//! clean close) is counted from the manifest alone; otherwise, or with
//! `--scan`, every file is `lstat`ed.

use super::{ns_entries, open_root, walk, Namespace, Tally};
use crate::report::{now_s, size, Ages, Outcome, DONE};
use crate::Common;
use kvtier::admin::disk::{
    holder, read_order_files, FanEntry, Holder, ManifestState, NsEntry, OrderFiles,
};
use serde_json::{json, Value};
use std::fmt::Write;
use std::path::Path;

/// What a scan found in one namespace directory.
#[derive(Default, Clone, Copy)]
struct Counts {
    unsealed: Tally,
    attr_form: u64,
    in_file_form: u64,
    sealed: Tally,
    temporaries: Tally,
    foreign: Tally,
    ages: Ages,
}

impl Counts {
    fn merge(&mut self, o: &Counts) {
        self.unsealed.merge(o.unsealed);
        self.attr_form += o.attr_form;
        self.in_file_form += o.in_file_form;
        self.sealed.merge(o.sealed);
        self.temporaries.merge(o.temporaries);
        self.foreign.merge(o.foreign);
        self.ages.merge(&o.ages);
    }
}

pub fn run(
    root: &Path,
    namespace: Option<&str>,
    scan: bool,
    common: &Common,
) -> Result<Outcome, String> {
    let started = std::time::Instant::now();
    let root = open_root(root, namespace)?;
    let now = now_s();
    let mut listed = Vec::new();
    let mut scanned = Vec::new();
    for (at, ns) in root.namespaces.iter().enumerate() {
        let held = holder(&ns.path).unwrap_or(Holder::Nobody);
        let order = read_order_files(&ns.path, ns.dir.fingerprint, ns.dir.block_bytes);
        let trusted = match order.manifest {
            Some(ManifestState::Listed {
                blocks,
                unchanged: true,
            }) if held == Holder::Nobody => Some(blocks),
            _ => None,
        };
        match trusted {
            Some(blocks) if !scan => listed.push((at, held, order, blocks)),
            _ => scanned.push((at, held, order)),
        }
    }
    let to_scan: Vec<usize> = scanned.iter().map(|s| s.0).collect();
    let states = walk(
        &root.namespaces,
        Some(&to_scan),
        common.threads,
        common.progress.then_some("inspect: listing"),
        true,
        || vec![Counts::default(); root.namespaces.len()],
        |counts, found| {
            let c = &mut counts[found.ns];
            let Some(meta) = found.meta else { return };
            let bb = root.namespaces[found.ns].dir.block_bytes as u64;
            match found.kind {
                _ if !meta.regular => c.foreign.add(meta.len),
                FanEntry::Block => {
                    c.unsealed.add(meta.len);
                    if meta.len == bb.div_ceil(4096) * 4096 {
                        c.attr_form += 1;
                    } else {
                        c.in_file_form += 1;
                    }
                    c.ages.add(now - meta.last_use);
                }
                FanEntry::Sealed => {
                    c.sealed.add(meta.len);
                    c.ages.add(now - meta.last_use);
                }
                FanEntry::Temporary => c.temporaries.add(meta.len),
                FanEntry::Other => c.foreign.add(meta.len),
            }
        },
    );
    let mut counts = vec![Counts::default(); root.namespaces.len()];
    for state in &states {
        for (total, c) in counts.iter_mut().zip(state) {
            total.merge(c);
        }
    }
    let mut reports = Vec::new();
    for (at, held, order) in scanned {
        reports.push((
            at,
            report(&root.namespaces[at], held, &order, &counts[at], true),
        ));
    }
    for (at, held, order, blocks) in listed {
        let ns = &root.namespaces[at];
        let per_block =
            sample_block_len(&ns.path).unwrap_or(ns.dir.block_bytes.div_ceil(4096) as u64 * 4096);
        let c = Counts {
            unsealed: Tally {
                files: blocks,
                bytes: blocks * per_block,
            },
            ..Counts::default()
        };
        reports.push((at, report(ns, held, &order, &c, false)));
    }
    reports.sort_by_key(|r| r.0);
    let (mut blocks, mut bytes, mut ages) = (0u64, 0u64, Ages::default());
    let mut text = format!(
        "{}: {} namespace directories\n",
        root.path.display(),
        reports.len()
    );
    let mut list = Vec::new();
    for (at, (json, lines)) in reports {
        blocks += json["blocks"].as_u64().unwrap_or(0);
        bytes += json["bytes"].as_u64().unwrap_or(0);
        ages.merge(&counts[at].ages);
        text.push_str(&lines);
        list.push(json);
    }
    for legacy in &root.legacy {
        let _ = writeln!(
            text,
            "{legacy}: an older kvtier's layout, read by no tier (remove it to free its space)"
        );
    }
    let _ = writeln!(text, "total: {blocks} blocks, {}", size(bytes));
    let json = json!({
        "store": root.path.display().to_string(),
        "kind": "disk",
        "blocks": blocks,
        "bytes": bytes,
        "ages": ages.json(),
        "namespaces": list,
        "legacy_dirs": root.legacy,
        "elapsed_s": started.elapsed().as_secs_f64(),
    });
    Ok(Outcome {
        json,
        text,
        status: DONE,
    })
}

/// The length of one unsealed block file of the directory: the size each
/// block of a manifest is counted at (a tier writes one form per directory).
fn sample_block_len(ns_dir: &Path) -> Option<u64> {
    for fan in std::fs::read_dir(ns_dir).ok()?.flatten() {
        if NsEntry::of(&fan.file_name().to_string_lossy()) != NsEntry::FanDir {
            continue;
        }
        for file in std::fs::read_dir(fan.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            if FanEntry::of(&file.file_name().to_string_lossy()) == FanEntry::Block {
                return file.metadata().ok().map(|m| m.len());
            }
        }
    }
    None
}

fn report(
    ns: &Namespace,
    held: Holder,
    order: &OrderFiles,
    c: &Counts,
    scanned: bool,
) -> (Value, String) {
    let blocks = c.unsealed.files + c.sealed.files;
    let bytes = c.unsealed.bytes + c.sealed.bytes;
    let mut debris = Vec::new();
    let mut others = Vec::new();
    for (name, kind, _) in ns_entries(ns) {
        match kind {
            NsEntry::Debris => debris.push(name),
            NsEntry::Other => others.push(name),
            NsEntry::Kept | NsEntry::FanDir => {}
        }
    }
    let held_by = match held {
        Holder::Nobody => "nobody",
        Holder::Shared => "shared tiers",
        Holder::Exclusive => "a non-shared tier",
    };
    let manifest = match order.manifest {
        None => Value::Null,
        Some(ManifestState::Invalid) => json!("invalid"),
        Some(ManifestState::Listed { blocks, unchanged }) => {
            json!({"blocks": blocks, "trusted": unchanged})
        }
    };
    let generations: Vec<Value> = ns
        .generations
        .iter()
        .map(|g| json!({"file": g.file, "sealed": g.sealed(), "generation": g.generation}))
        .collect();
    let mut json = ns.json_head();
    let extra = json!({
        "held_by": held_by,
        "source": if scanned { "scan" } else { "manifest" },
        "blocks": blocks,
        "bytes": bytes,
        "tenants": [
            {"tenant": "unsealed", "generation": ns.unsealed_generation(),
             "blocks": c.unsealed.files, "bytes": c.unsealed.bytes},
            {"tenant": "sealed (all keys)", "blocks": c.sealed.files, "bytes": c.sealed.bytes},
        ],
        "generations": generations,
        "formats": if scanned {
            json!({"xattr_header": c.attr_form, "in_file_header": c.in_file_form, "sealed": c.sealed.files})
        } else {
            Value::Null
        },
        "ages": if scanned { c.ages.json() } else { Value::Null },
        "temporaries": {"files": c.temporaries.files, "bytes": c.temporaries.bytes},
        "foreign": {"files": c.foreign.files, "bytes": c.foreign.bytes},
        "debris": debris,
        "other_files": others,
        "manifest": manifest,
        "order_hint_entries": order.hint_entries,
        "journal_entries": order.journal_entries,
    });
    json.extend(extra.as_object().expect("an object").clone());
    let mut text = format!(
        "{}: {blocks} blocks, {} ({}; held by {held_by})\n",
        ns.label(),
        size(bytes),
        if scanned {
            "scanned"
        } else {
            "from the manifest"
        }
    );
    let _ = writeln!(
        text,
        "  unsealed {} (generation {}), sealed {}; temporaries {}, foreign files {}",
        c.unsealed.files,
        ns.unsealed_generation(),
        c.sealed.files,
        c.temporaries.files,
        c.foreign.files
    );
    if scanned {
        let _ = writeln!(text, "  ages:{}", c.ages.line());
    }
    if !debris.is_empty() || !others.is_empty() {
        let _ = writeln!(text, "  debris: {debris:?}; other files: {others:?}");
    }
    (Value::Object(json), text)
}
