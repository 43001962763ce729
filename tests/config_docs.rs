//! `docs/configuration.md` lists every configuration key the library accepts,
//! and nothing else: its table is compared with `kvtier::CONFIG_KEYS`.

use std::collections::BTreeSet;

/// The first cell of each table row, when it is one backquoted word.
fn documented_keys(markdown: &str) -> BTreeSet<String> {
    markdown
        .lines()
        .filter_map(|line| line.strip_prefix("| `"))
        .filter_map(|rest| rest.split_once("` |"))
        .map(|(key, _)| key)
        .filter(|key| key.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'))
        .map(str::to_string)
        .collect()
}

#[test]
fn the_configuration_page_lists_exactly_the_keys_the_library_accepts() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/configuration.md");
    let page = std::fs::read_to_string(path).expect("docs/configuration.md");
    let documented = documented_keys(&page);
    let accepted: BTreeSet<String> = kvtier::CONFIG_KEYS.iter().map(|k| k.to_string()).collect();
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
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/README.md");
    let readme = std::fs::read_to_string(path).expect("README.md");
    let unknown: Vec<_> = documented_keys(&readme)
        .into_iter()
        .filter(|key| !kvtier::CONFIG_KEYS.contains(&key.as_str()))
        .collect();
    assert!(
        unknown.is_empty(),
        "README.md lists keys the library does not accept: {unknown:?}"
    );
}
