//! The configuration keys as the documentation states them, against the
//! library's one table of keys (`kvtier::CONFIG_TABLE`, src/config/keys.rs):
//! every default the table states is set through `TierConfig::set` and must
//! leave the configuration as the library's default; docs/configuration.md's
//! table and the key list of `tier_config_set`'s doc (and so the header's)
//! are the table's rendering (`KVTIER_BLESS_DOCS=1 cargo test --test
//! config_docs` rewrites both); the other pages link to configuration.md
//! instead of copying a key's row, and the vLLM and SGLang pages' tables
//! hold only the adapters' own keys.

use kvtier::{BackendKind, ConfigKey, TierConfig, CONFIG_KEYS, CONFIG_TABLE};
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
/// explicit, so that a documented "64 for disk" equals an unset io_threads.
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
                ("persist_path", "none") => Some(base.persist_path.is_none()),
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

#[test]
fn every_default_the_table_states_is_the_librarys() {
    let wrong: Vec<String> = CONFIG_TABLE
        .iter()
        .filter_map(|key| {
            check_default(key.name, key.default)
                .err()
                .map(|why| format!("`{}` default {:?}: {why}", key.name, key.default))
        })
        .collect();
    assert!(
        wrong.is_empty(),
        "src/config/keys.rs states wrong defaults:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_table_names_every_backend_it_reads_and_accepts() {
    let backend = ConfigKey::find("backend").expect("the backend key");
    for name in backends() {
        assert!(
            backend.values.contains(&format!("`{name}`")),
            "the `backend` key's values lack `{name}`"
        );
    }
    for value in backend.values.split('`').skip(1).step_by(2) {
        TierConfig::default()
            .set("backend", value)
            .unwrap_or_else(|e| panic!("the `backend` key names {value:?}: {e}"));
    }
    let names: Vec<&str> = CONFIG_TABLE.iter().map(|k| k.name).collect();
    assert_eq!(names, CONFIG_KEYS, "CONFIG_KEYS is the table's names");
    for key in CONFIG_TABLE {
        assert!(!key.backends.is_empty(), "`{}` names no backend", key.name);
        assert!(
            !key.doc.is_empty() && !key.values.is_empty(),
            "`{}`",
            key.name
        );
    }
}

/// Which backends read a key, as the documentation says it.
fn backends_cell(key: &ConfigKey) -> String {
    if key.backends.len() == backends().len() {
        "all".to_string()
    } else {
        key.backends
            .iter()
            .map(|b| b.name())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

const MD_BEGIN: &str = "<!-- The table below is generated from src/config/keys.rs: \
KVTIER_BLESS_DOCS=1 cargo test --test config_docs -->";
const MD_END: &str = "<!-- end of the generated table -->";

/// docs/configuration.md's table, one row per key of the library's table.
fn markdown_table() -> String {
    let mut out =
        String::from("| key | backends | values | default | meaning |\n|---|---|---|---|---|\n");
    for key in CONFIG_TABLE {
        out += &format!(
            "| `{}` | {} | {} | {} | {} |\n",
            key.name,
            backends_cell(key),
            key.values,
            key.default,
            key.doc
        );
    }
    out
}

const DOC_BEGIN: &str = "/// Keys, as \"key\" [backends]: values; default; meaning (generated from";
const DOC_END: &str = "/// Returns TIER_OK;";

/// The key list of `tier_config_set`'s doc comment, wrapped at 80 columns.
fn doc_comment_list() -> String {
    let mut out = format!(
        "{DOC_BEGIN}\n/// src/config/keys.rs, with docs/configuration.md: KVTIER_BLESS_DOCS=1 cargo\n\
         /// test --test config_docs):\n"
    );
    for key in CONFIG_TABLE {
        let text = format!(
            "- \"{}\" [{}]: {}; default {}; {}.",
            key.name,
            backends_cell(key),
            key.values,
            key.default,
            key.doc
        );
        let mut line = String::from("///");
        for word in text.split(' ') {
            if line.len() + 1 + word.len() > 80 && line.len() > 6 {
                out += &line;
                out.push('\n');
                line = String::from("///  ");
            }
            line.push(' ');
            line += word;
        }
        out += &line;
        out.push('\n');
    }
    // A list ends with a blank line, so the text after it is not its last item.
    out + "///\n"
}

/// The text of `path` between `begin` (a line starting so, kept) and `end`
/// (a line starting so, kept), replaced by `generated` when blessing, else
/// compared with it.
fn check_generated(path: &str, begin: &str, end: &str, generated: &str) {
    let full = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    let text = read(path);
    let from = text
        .find(begin)
        .unwrap_or_else(|| panic!("{path}: no line {begin:?}"));
    let to = from
        + text[from..]
            .find(end)
            .unwrap_or_else(|| panic!("{path}: no line {end:?} after {begin:?}"));
    if std::env::var_os("KVTIER_BLESS_DOCS").is_some() {
        let blessed = format!("{}{generated}{}", &text[..from], &text[to..]);
        std::fs::write(&full, blessed).expect("rewrite");
        return;
    }
    assert!(
        text[from..to] == *generated,
        "{path} is not the rendering of src/config/keys.rs: run \
         `KVTIER_BLESS_DOCS=1 cargo test --test config_docs` (and then \
         `KVTIER_BLESS_HEADER=1 cargo test --test header`).\nExpected:\n{generated}\nFound:\n{}",
        &text[from..to]
    );
}

#[test]
fn the_configuration_page_is_the_tables_rendering() {
    let generated = format!("{MD_BEGIN}\n\n{}\n", markdown_table());
    check_generated("docs/configuration.md", MD_BEGIN, MD_END, &generated);
}

#[test]
fn tier_config_sets_doc_lists_the_table() {
    check_generated("src/ffi/api.rs", DOC_BEGIN, DOC_END, &doc_comment_list());
}

/// The header's doc comment of `tier_config_set`, its words, and the
/// table's rendering, its words: the first holds the second (cbindgen
/// re-indents, so only words are compared).
#[test]
fn the_header_lists_the_table() {
    let header = read("include/kvtier.h");
    let at = header
        .find("tier_status_t tier_config_set(")
        .expect("tier_config_set in include/kvtier.h");
    let doc = &header[header[..at].rfind("/**").expect("its doc comment")..at];
    let words = |text: &str| -> String {
        text.split_whitespace()
            .filter(|w| *w != "*" && *w != "///")
            .collect::<Vec<_>>()
            .join(" ")
    };
    let (doc, list) = (words(doc), words(&doc_comment_list()));
    assert!(
        doc.contains(&list),
        "include/kvtier.h's tier_config_set does not list the keys of src/config/keys.rs: \
         run `KVTIER_BLESS_HEADER=1 cargo test --test header`"
    );
}

/// The pages that describe the adapters or the front door, which link to
/// docs/configuration.md for the library's keys and copy none of them.
const LINKING_PAGES: &[(&str, &str)] = &[
    ("README.md", "docs/configuration.md"),
    ("python/README.md", "../docs/configuration.md"),
    ("docs/vllm.md", "configuration.md"),
    ("docs/sglang.md", "configuration.md"),
];

#[test]
fn other_pages_link_to_the_configuration_page_instead_of_copying_keys() {
    for (page, link) in LINKING_PAGES {
        let text = read(page);
        assert!(
            text.contains(&format!("]({link}")),
            "{page} does not link to {link}"
        );
        let copied: Vec<String> = tables(&text)
            .into_iter()
            .flat_map(|t| t.rows)
            .filter_map(|row| row.into_values().next())
            .flat_map(|first| {
                first
                    .split('`')
                    .skip(1)
                    .step_by(2)
                    .map(str::to_string)
                    .collect::<Vec<_>>()
            })
            .filter(|word| CONFIG_KEYS.contains(&word.as_str()))
            .collect();
        assert!(
            copied.is_empty(),
            "{page} copies rows of library keys {copied:?}: link to {link} instead"
        );
    }
}

/// The vLLM entry's keys that are the adapter's own or vLLM's factory's, not
/// the library's (python/kvtier/vllm.py), each in docs/vllm.md's table.
const VLLM_ADAPTER_KEYS: &[&str] = &[
    "type",
    "module_path",
    "backpressure",
    "enable_kv_events",
    "locality",
    "lookup_mirror",
];

#[test]
fn the_vllm_entry_table_has_the_adapters_own_keys() {
    let documented: BTreeSet<String> = rows_by_key(&read("docs/vllm.md"), "default")
        .into_keys()
        .collect();
    let adapter: BTreeSet<String> = VLLM_ADAPTER_KEYS.iter().map(|k| k.to_string()).collect();
    assert_eq!(documented, adapter, "docs/vllm.md's vLLM entry table");
}
