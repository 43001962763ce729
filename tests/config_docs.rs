//! The configuration keys as the documentation states them, against the
//! library: `docs/configuration.md` lists exactly `kvtier::CONFIG_KEYS`, the
//! header's `tier_config_set` names exactly those keys, `docs/vllm.md`'s
//! table of the vLLM entry has every key the adapter passes through, and
//! `docs/sglang.md` every key the SGLang adapter does. Every default those
//! tables (and the README's) state is set through `TierConfig::set` and must
//! leave the configuration as the library's default, and the backends the
//! `backend` rows name are the library's.

use kvtier::{BackendKind, TierConfig, CONFIG_KEYS};
use std::collections::{BTreeMap, BTreeSet};

fn read(path: &str) -> String {
    let full = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("{}: {e}", full.display()))
}

/// Every backend, by name; a backend added to the library fails to compile
/// here until the list (and so the documentation checks) include it.
fn backends() -> Vec<&'static str> {
    let all = [BackendKind::Memory, BackendKind::Disk, BackendKind::Redis];
    all.iter()
        .map(|b| match b {
            BackendKind::Memory | BackendKind::Disk | BackendKind::Redis => b.name(),
        })
        .collect()
}

fn accepted() -> BTreeSet<String> {
    CONFIG_KEYS.iter().map(|k| k.to_string()).collect()
}

/// One markdown table: its header's cells, and each row's cells by header.
struct Table {
    header: Vec<String>,
    rows: Vec<BTreeMap<String, String>>,
}

fn cells(line: &str) -> Vec<String> {
    let inner = line.trim().trim_start_matches('|').trim_end_matches('|');
    inner.split('|').map(|c| c.trim().to_string()).collect()
}

/// The tables of a markdown page, in order.
fn tables(markdown: &str) -> Vec<Table> {
    let mut found = Vec::new();
    let mut lines = markdown.lines().peekable();
    while let Some(line) = lines.next() {
        if !line.starts_with('|') {
            continue;
        }
        let header = cells(line);
        if lines.next_if(|l| l.starts_with("|---")).is_none() {
            continue;
        }
        let mut rows = Vec::new();
        while let Some(row) = lines.next_if(|l| l.starts_with('|')) {
            rows.push(header.iter().cloned().zip(cells(row)).collect());
        }
        found.push(Table { header, rows });
    }
    found
}

/// The rows of the page's tables whose header starts with `key` and has a
/// `column`, by key (the first cell, one backquoted word).
fn rows_by_key(markdown: &str, column: &str) -> BTreeMap<String, BTreeMap<String, String>> {
    tables(markdown)
        .into_iter()
        .filter(|t| t.header.first().map(String::as_str) == Some("key"))
        .filter(|t| t.header.iter().any(|h| h == column))
        .flat_map(|t| t.rows)
        .filter_map(|row| {
            let key = row
                .get("key")?
                .strip_prefix('`')?
                .strip_suffix('`')?
                .to_string();
            key.bytes()
                .all(|b| b.is_ascii_lowercase() || b == b'_')
                .then_some((key, row))
        })
        .collect()
}

/// The configuration with every setting the library resolves at open made
/// explicit, so that a documented "32 for disk" equals an unset io_threads.
fn effective(config: &TierConfig) -> TierConfig {
    let mut c = config.clone();
    c.io_threads = Some(config.resolved_io_threads());
    c.io_timeout_ms = Some(config.resolved_io_timeout_ms());
    c.prefault = Some(config.resolved_prefault().expect("a default prefault"));
    c
}

/// The cell's clauses, split at commas outside parentheses.
fn clauses(cell: &str) -> Vec<&str> {
    let (mut depth, mut start, mut out) = (0, 0, Vec::new());
    for (i, ch) in cell.char_indices() {
        match ch {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(cell[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(cell[start..].trim());
    out
}

/// The backends `list` names ("disk", "disk and redis"), if it names only backends.
fn named(list: &str) -> Option<Vec<&str>> {
    let names: Vec<&str> = list.split(" and ").map(str::trim).collect();
    names
        .iter()
        .all(|n| backends().contains(n))
        .then_some(names)
}

/// A clause's value and the backends it is stated for ("X for disk and
/// redis", "X (memory)"); none named: the default backend.
fn value_and_backends(clause: &str) -> (&str, Vec<&str>) {
    if let Some((value, list)) = clause.rsplit_once(" for ") {
        if let Some(names) = named(list) {
            return (value.trim(), names);
        }
    }
    if let Some((value, note)) = clause.rsplit_once(" (") {
        let note = note.trim_end_matches(')');
        return (value.trim(), named(note).unwrap_or_default());
    }
    (clause, Vec::new())
}

/// Checks one documented default of `key` against the library; the reason
/// it is wrong, if it is.
fn check_default(key: &str, cell: &str) -> Result<(), String> {
    for clause in clauses(cell) {
        let (value, named) = value_and_backends(clause);
        let value = value.trim_matches('`').trim_matches('"');
        let bases: Vec<TierConfig> = if named.is_empty() {
            vec![TierConfig::default()]
        } else {
            named
                .iter()
                .map(|b| {
                    let mut c = TierConfig::default();
                    c.set("backend", b).expect("a backend name");
                    c
                })
                .collect()
        };
        for base in bases {
            // Defaults that are an absence, or depend on the machine.
            let special = match (key, value) {
                ("path", "required") => Some(base.disk.path.is_none()),
                ("url", "required") => Some(base.redis.urls.is_empty()),
                ("seal_key" | "seal_key_file", "none") => Some(base.seal.is_none()),
                ("connections", "one per I/O thread") => Some(base.redis.connections.is_none()),
                ("io_threads", "min(cores, 4)") => {
                    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
                    Some(base.resolved_io_threads() == cores.clamp(1, 4))
                }
                _ => None,
            };
            let holds = match special {
                Some(holds) => holds,
                None => {
                    let value = if value == "empty" { "" } else { value };
                    let mut set = base.clone();
                    set.set(key, value)
                        .map_err(|e| format!("{clause:?}: {e}"))?;
                    effective(&set) == effective(&base)
                }
            };
            if !holds {
                return Err(format!(
                    "{clause:?} is not the default for backend {}",
                    base.backend.name()
                ));
            }
        }
    }
    Ok(())
}

/// Every default stated in `column` of the page's key tables, checked; the
/// keys in `skip` (another program's own) are left alone.
fn check_defaults(page: &str, column: &str, skip: &[&str]) {
    let wrong: Vec<String> = rows_by_key(&read(page), column)
        .into_iter()
        .filter(|(key, _)| !skip.contains(&key.as_str()))
        .filter_map(|(key, row)| {
            let cell = &row[column];
            check_default(&key, cell)
                .err()
                .map(|why| format!("`{key}` default {cell:?}: {why}"))
        })
        .collect();
    assert!(
        wrong.is_empty(),
        "{page} states wrong defaults:\n{}",
        wrong.join("\n")
    );
}

/// The `backend` row names every backend as a backquoted value, and each
/// value it names is accepted.
fn check_backend_row(page: &str, column: &str) {
    let rows = rows_by_key(&read(page), column);
    let row = rows
        .get("backend")
        .unwrap_or_else(|| panic!("{page}: no `backend` row"));
    let text: String = row
        .iter()
        .filter(|(header, _)| *header != "key")
        .map(|(_, cell)| cell.as_str())
        .collect::<Vec<_>>()
        .join(" | ");
    for name in backends() {
        assert!(
            text.contains(&format!("`{name}`")),
            "{page}: the `backend` row lacks `{name}`"
        );
    }
    for value in text.split('`').skip(1).step_by(2) {
        let value = value.trim_matches('"');
        if value.bytes().all(|b| b.is_ascii_lowercase()) {
            TierConfig::default()
                .set("backend", value)
                .unwrap_or_else(|e| panic!("{page}: the `backend` row names {value:?}: {e}"));
        }
    }
}

#[test]
fn the_configuration_page_lists_exactly_the_keys_the_library_accepts() {
    let documented: BTreeSet<String> = rows_by_key(&read("docs/configuration.md"), "default")
        .into_keys()
        .collect();
    let accepted = accepted();
    let undocumented: Vec<_> = accepted.difference(&documented).collect();
    let unknown: Vec<_> = documented.difference(&accepted).collect();
    assert!(
        undocumented.is_empty() && unknown.is_empty(),
        "docs/configuration.md is out of date: keys accepted but not documented {undocumented:?}, \
         documented but not accepted {unknown:?}"
    );
}

#[test]
fn every_key_in_the_readme_table_is_accepted() {
    let unknown: Vec<_> = rows_by_key(&read("README.md"), "default")
        .into_keys()
        .filter(|key| !CONFIG_KEYS.contains(&key.as_str()))
        .collect();
    assert!(
        unknown.is_empty(),
        "README.md lists keys the library does not accept: {unknown:?}"
    );
}

#[test]
fn the_documented_defaults_are_the_librarys() {
    check_defaults("docs/configuration.md", "default", &[]);
    check_defaults("README.md", "default", &[]);
    check_defaults("docs/vllm.md", "default", VLLM_ADAPTER_KEYS);
}

#[test]
fn the_backend_rows_name_the_librarys_backends() {
    check_backend_row("docs/configuration.md", "default");
    check_backend_row("README.md", "default");
    check_backend_row("docs/vllm.md", "default");
}

/// The vLLM entry's keys that are the adapter's own or vLLM's factory's, not
/// the library's (python/kvtier/vllm.py).
const VLLM_ADAPTER_KEYS: &[&str] = &[
    "type",
    "module_path",
    "backpressure",
    "enable_kv_events",
    "locality",
    "lookup_mirror",
];

#[test]
fn the_vllm_entry_table_has_every_key_the_adapter_passes_through() {
    let documented: BTreeSet<String> = rows_by_key(&read("docs/vllm.md"), "default")
        .into_keys()
        .collect();
    // The adapter turns the library's events on itself and refuses `events`.
    let passed: BTreeSet<String> = accepted().into_iter().filter(|k| k != "events").collect();
    let adapter: BTreeSet<String> = VLLM_ADAPTER_KEYS.iter().map(|k| k.to_string()).collect();
    let missing: Vec<_> = passed.difference(&documented).collect();
    let unknown: Vec<_> = documented
        .difference(&passed)
        .filter(|k| !adapter.contains(*k))
        .collect();
    assert!(
        missing.is_empty() && unknown.is_empty(),
        "docs/vllm.md's vLLM entry table: library keys missing {missing:?}, keys neither the \
         library's nor the adapter's {unknown:?}"
    );
}

#[test]
fn the_sglang_page_names_every_key() {
    let page = read("docs/sglang.md");
    let table = tables(&page)
        .into_iter()
        .find(|t| t.header == ["key", "meaning"])
        .expect("docs/sglang.md: the table of kvtier's keys (| key | meaning |)");
    let documented: BTreeSet<String> = table
        .rows
        .iter()
        .flat_map(|row| row["key"].split('`').skip(1).step_by(2).map(str::to_string))
        .collect();
    let accepted = accepted();
    let missing: Vec<_> = accepted.difference(&documented).collect();
    let unknown: Vec<_> = documented.difference(&accepted).collect();
    assert!(
        missing.is_empty() && unknown.is_empty(),
        "docs/sglang.md's key table: missing {missing:?}, not the library's {unknown:?}"
    );
}

#[test]
fn the_header_documents_exactly_the_keys_and_every_backend() {
    let header = read("include/kvtier.h");
    let at = header
        .find("tier_status_t tier_config_set(")
        .expect("tier_config_set in include/kvtier.h");
    let doc = &header[header[..at].rfind("/**").expect("its doc comment")..at];
    let keys: BTreeSet<String> = quoted_words_before_parenthesis(doc);
    let accepted = accepted();
    let missing: Vec<_> = accepted.difference(&keys).collect();
    let unknown: Vec<_> = keys.difference(&accepted).collect();
    assert!(
        missing.is_empty() && unknown.is_empty(),
        "tier_config_set's doc (src/ffi/api.rs): keys missing {missing:?}, not accepted {unknown:?}"
    );
    let backend = &doc[doc.find("\"backend\" (").expect("the backend key")..];
    let backend = &backend[..backend.find(')').expect("its values")];
    for name in backends() {
        assert!(
            backend.contains(&format!("\"{name}\"")),
            "tier_config_set's doc: \"backend\" lacks \"{name}\""
        );
    }
}

/// Every `"word" (` of `text`: the keys of a doc comment that describes each
/// key in parentheses after its name.
fn quoted_words_before_parenthesis(text: &str) -> BTreeSet<String> {
    let parts: Vec<&str> = text.split('"').collect();
    (1..parts.len().saturating_sub(1))
        .step_by(2)
        .filter(|&i| {
            let after = parts[i + 1].trim_start_matches(|c: char| c.is_whitespace() || c == '*');
            after.starts_with('(')
        })
        .map(|i| parts[i])
        .filter(|w| !w.is_empty() && w.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'))
        .map(str::to_string)
        .collect()
}
