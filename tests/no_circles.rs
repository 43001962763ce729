//! The house has no circle: no file of `src/`, nor of the bench's
//! `bench/src/`, nor of the `kvtier` command's `cli/src/`, reaches itself through the
//! files it imports (`use crate::...`, `use super::...`, `use self::...`
//! and inline `crate::`/`super::` paths, each resolved to the file of the
//! deepest module it names). Declaring a child module (`mod x;`) is not an
//! import, nor is a module's own file (`mod.rs`, `lib.rs`) using or
//! re-exporting what its submodules define: the children may use their
//! parent, the parent composes them. A file's `mod tests` is left out: it
//! is a module of its own that nothing imports. Fails naming every circle found (docs/architecture.md, "the
//! rule: arrows point down").

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// The crate's root file: `lib.rs`, or a binary's `main.rs` (the bench).
fn root_of(src: &Path) -> PathBuf {
    let lib = src.join("lib.rs");
    if lib.is_file() {
        lib
    } else {
        src.join("main.rs")
    }
}

/// The file of a module path (`[]` is the crate's root file), if it exists.
fn file_of(src: &Path, module: &[String]) -> Option<PathBuf> {
    if module.is_empty() {
        return Some(root_of(src));
    }
    let dir: PathBuf = module.iter().collect();
    let flat = src.join(&dir).with_extension("rs");
    if flat.is_file() {
        return Some(flat);
    }
    let nested = src.join(&dir).join("mod.rs");
    nested.is_file().then_some(nested)
}

/// The module path of a file under `src/`.
fn module_of(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).unwrap();
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().unwrap();
    if !["mod.rs", "lib.rs", "main.rs"].contains(&last.as_str()) {
        parts.push(last.trim_end_matches(".rs").to_string());
    }
    parts
}

/// Expands a use tree (`a::{b, c::{d, e}}`) into its paths.
fn expand(tree: &str) -> Vec<String> {
    let tree = tree.trim();
    let Some(open) = tree.find('{') else {
        return vec![tree.to_string()];
    };
    let prefix = &tree[..open];
    let inner = &tree[open + 1..tree.rfind('}').unwrap()];
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (i, ch) in inner.char_indices() {
        match ch {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&inner[start..]);
    parts
        .into_iter()
        .filter(|p| !p.trim().is_empty())
        .flat_map(expand)
        .map(|p| format!("{prefix}{p}"))
        .collect()
}

/// Paths starting at `crate::`, `super::` or `self::` in a line of code.
fn inline_paths(line: &str) -> Vec<String> {
    let mut found = Vec::new();
    let bytes = line.as_bytes();
    for root in ["crate::", "super::"] {
        let mut from = 0;
        while let Some(at) = line[from..].find(root) {
            let at = from + at;
            from = at + root.len();
            let before = at.checked_sub(1).map(|i| bytes[i] as char);
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                continue;
            }
            let end = line[at..]
                .find(|c: char| !(c.is_alphanumeric() || "_:$".contains(c)))
                .map_or(line.len(), |e| at + e);
            found.push(line[at..end].trim_end_matches(':').to_string());
        }
    }
    found
}

/// The file a path names, from a use in `module` (the file's module and
/// the inline modules open around the use); `None` for outside crates.
fn resolve(
    src: &Path,
    file_module: &[String],
    inline: &[String],
    path: &str,
    idents: &BTreeSet<String>,
) -> Option<PathBuf> {
    let segs: Vec<&str> = path.split("::").map(str::trim).collect();
    let mut at: Vec<String> = file_module.iter().chain(inline).cloned().collect();
    let mut rest = &segs[..];
    match rest.first() {
        Some(&"crate") | Some(&"$crate") => {
            at.clear();
            rest = &rest[1..];
        }
        Some(&"super") | Some(&"self") => {
            while let Some(&s) = rest.first() {
                match s {
                    "super" => {
                        at.pop();
                    }
                    "self" => {}
                    _ => break,
                }
                rest = &rest[1..];
            }
        }
        Some(first) if file_of(src, &[&at[..], &[first.to_string()]].concat()).is_some() => {}
        _ => return None,
    }
    if at.len() > file_module.len() {
        // Still inside one of the file's inline modules.
        return Some(file_of(src, file_module).unwrap());
    }
    let mut target = file_of(src, &at)?;
    for seg in rest {
        at.push(seg.to_string());
        match file_of(src, &at) {
            Some(f) => target = f,
            None => {
                at.pop();
                return Some(through_reexport(src, &at, target, seg, idents));
            }
        }
    }
    Some(target)
}

/// Whether `text` defines `name` as a public item.
fn defines(text: &str, name: &str) -> bool {
    ["const", "static", "fn", "struct", "enum", "type", "trait"]
        .iter()
        .any(|kind| {
            text.lines().any(|l| {
                let l = l.trim_start();
                l.starts_with("pub") && {
                    let rest = l.split_once(&format!("{kind} {name}")).map(|(_, r)| r);
                    rest.is_some_and(|r| !r.starts_with(|c: char| c.is_alphanumeric() || c == '_'))
                }
            })
        })
}

/// The file that defines `name` when a path names it through `module`'s
/// file: a child the file re-exports it from (`pub use child::*`, `pub use
/// child::name`), or the file itself. A macro's metavariable (`$constant`)
/// stands for any of `idents`, the identifiers of the file using it.
fn through_reexport(
    src: &Path,
    module: &[String],
    face: PathBuf,
    name: &str,
    idents: &BTreeSet<String>,
) -> PathBuf {
    let text = fs::read_to_string(&face).unwrap();
    let wanted: Vec<&str> = if name.starts_with('$') {
        idents.iter().map(String::as_str).collect()
    } else {
        vec![name]
    };
    for line in text.lines() {
        let Some(tree) = line.trim().strip_prefix("pub use ") else {
            continue;
        };
        if tree.contains('{') != tree.contains('}') {
            continue;
        }
        for path in expand(tree.trim_end_matches(';')) {
            let segs: Vec<&str> = path.split("::").map(str::trim).collect();
            let [child @ .., last] = &segs[..] else {
                continue;
            };
            let mut at = module.to_vec();
            at.extend(
                child
                    .iter()
                    .filter(|s| **s != "self")
                    .map(|s| s.to_string()),
            );
            let Some(file) = file_of(src, &at).filter(|f| *f != face) else {
                continue;
            };
            let child_text = fs::read_to_string(&file).unwrap();
            let hit = |n: &str| match *last {
                "*" => defines(&child_text, n),
                l => l == n,
            };
            if wanted.iter().any(|n| hit(n)) {
                return file;
            }
        }
    }
    face
}

/// The name of an inline module a line opens (`mod tests {`).
fn mod_opening(line: &str) -> Option<&str> {
    let decl = line
        .trim_start_matches("pub(crate) ")
        .trim_start_matches("pub(super) ")
        .trim_start_matches("pub ");
    decl.strip_prefix("mod ").and_then(|d| d.strip_suffix(" {"))
}

/// The files each file of `src/` imports (outside its test modules).
fn graph(src: &Path) -> BTreeMap<PathBuf, BTreeSet<PathBuf>> {
    let mut files = Vec::new();
    let mut dirs = vec![src.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                files.push(p);
            }
        }
    }
    let mut edges = BTreeMap::new();
    for file in files {
        let module = module_of(src, &file);
        let text = fs::read_to_string(&file).unwrap();
        let idents: BTreeSet<String> = text
            .split(|c: char| !(c.is_alphanumeric() || c == '_'))
            .filter(|w| w.starts_with(|c: char| c.is_ascii_uppercase()))
            .map(str::to_string)
            .collect();
        let mut to = BTreeSet::new();
        // Inline modules open at each line: (name, indentation of its `}`).
        let mut open: Vec<(String, String)> = Vec::new();
        let mut pending_use: Option<String> = None;
        for raw in text.lines() {
            let code = match raw.find("// ") {
                Some(i) => &raw[..i],
                None => raw,
            };
            let trimmed = code.trim_start();
            if trimmed.starts_with("//") {
                continue;
            }
            if let Some((_, close)) = open.last() {
                if code.trim_end() == close {
                    open.pop();
                    continue;
                }
            }
            let inline: Vec<String> = open.iter().map(|(n, _)| n.clone()).collect();
            // A test module is a module of its own that nothing imports: a
            // test may use what stands above the code it tests.
            if inline.iter().any(|n| n == "tests") {
                if let Some(name) = mod_opening(trimmed) {
                    let indent = &code[..code.len() - trimmed.len()];
                    open.push((name.to_string(), format!("{indent}}}")));
                }
                continue;
            }
            let stmt = match pending_use.take() {
                Some(mut s) => {
                    s.push_str(trimmed);
                    Some(s)
                }
                None => {
                    let t = trimmed
                        .trim_start_matches("pub(crate) ")
                        .trim_start_matches("pub(super) ")
                        .trim_start_matches("pub ");
                    t.strip_prefix("use ").map(str::to_string)
                }
            };
            if let Some(s) = stmt {
                match s.find(';') {
                    Some(end) => {
                        for p in expand(&s[..end]) {
                            let p = p.split(" as ").next().unwrap().to_string();
                            if let Some(t) = resolve(src, &module, &inline, &p, &idents) {
                                to.insert(t);
                            }
                        }
                    }
                    None => pending_use = Some(s),
                }
                continue;
            }
            for p in inline_paths(code) {
                if let Some(t) = resolve(src, &module, &inline, &p, &idents) {
                    to.insert(t);
                }
            }
            if let Some(name) = mod_opening(trimmed) {
                let indent = &code[..code.len() - trimmed.len()];
                open.push((name.to_string(), format!("{indent}}}")));
            }
        }
        to.remove(&file);
        // A module's own file composes and re-exports its children: an
        // arrow from it down into its own submodules is not counted.
        if let Some(dir) = (file.ends_with("mod.rs") || file == root_of(src))
            .then(|| file.parent().unwrap().to_path_buf())
        {
            to.retain(|t| !t.starts_with(&dir));
        }
        edges.insert(file, to);
    }
    edges
}

/// Every circle, as the sorted files of each strongly connected component
/// with more than one file (Tarjan's algorithm).
fn circles(edges: &BTreeMap<PathBuf, BTreeSet<PathBuf>>) -> Vec<Vec<PathBuf>> {
    struct State<'a> {
        edges: &'a BTreeMap<PathBuf, BTreeSet<PathBuf>>,
        index: BTreeMap<&'a PathBuf, usize>,
        low: BTreeMap<&'a PathBuf, usize>,
        stack: Vec<&'a PathBuf>,
        on_stack: BTreeSet<&'a PathBuf>,
        found: Vec<Vec<PathBuf>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a PathBuf) {
        let i = s.index.len();
        s.index.insert(v, i);
        s.low.insert(v, i);
        s.stack.push(v);
        s.on_stack.insert(v);
        for w in s.edges.get(v).into_iter().flatten() {
            let Some((w, _)) = s.edges.get_key_value(w) else {
                continue;
            };
            if !s.index.contains_key(w) {
                visit(s, w);
                let low = s.low[v].min(s.low[w]);
                s.low.insert(v, low);
            } else if s.on_stack.contains(w) {
                let low = s.low[v].min(s.index[w]);
                s.low.insert(v, low);
            }
        }
        if s.low[v] == s.index[v] {
            let mut component = Vec::new();
            loop {
                let w = s.stack.pop().unwrap();
                s.on_stack.remove(w);
                component.push(w.clone());
                if w == v {
                    break;
                }
            }
            if component.len() > 1 {
                component.sort();
                s.found.push(component);
            }
        }
    }
    let mut s = State {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for v in edges.keys() {
        if !s.index.contains_key(v) {
            visit(&mut s, v);
        }
    }
    s.found
}

/// Fails naming every circle among the files of the crate at `src`.
fn assert_no_circle(src: &Path) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let edges = graph(src);
    let name = |p: &PathBuf| p.strip_prefix(root).unwrap().display().to_string();
    let mut found = Vec::new();
    for circle in circles(&edges) {
        let files: Vec<String> = circle.iter().map(name).collect();
        let arrows: Vec<String> = circle
            .iter()
            .flat_map(|f| {
                edges[f]
                    .iter()
                    .filter(|t| circle.contains(t))
                    .map(move |t| format!("{} -> {}", name(f), name(t)))
            })
            .collect();
        found.push(format!("{files:?}:\n    {}", arrows.join("\n    ")));
    }
    assert!(found.is_empty(), "circles of files:\n{}", found.join("\n"));
}

#[test]
fn no_file_of_src_reaches_itself_through_its_imports() {
    assert_no_circle(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
}

#[test]
fn no_file_of_the_bench_reaches_itself_through_its_imports() {
    assert_no_circle(&Path::new(env!("CARGO_MANIFEST_DIR")).join("bench/src"));
}

#[test]
fn no_file_of_the_kvtier_command_reaches_itself_through_its_imports() {
    assert_no_circle(&Path::new(env!("CARGO_MANIFEST_DIR")).join("cli/src"));
}

#[test]
fn the_checker_sees_a_use_of_a_sibling_and_an_inline_parent_path() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let src = root.join("src");
    let edges = graph(&src);
    let from = src.join("backend/redis/routed.rs");
    assert!(edges[&from].contains(&src.join("backend/redis/client/mod.rs")));
    assert!(edges[&from].contains(&src.join("backend/redis/mod.rs")));
    let calls = src.join("backend/redis/client/calls.rs");
    assert!(edges[&calls].contains(&src.join("backend/redis/client/fanout.rs")));
    assert!(edges[&src.join("error.rs")].contains(&src.join("status.rs")));
    let bench = root.join("bench/src");
    let edges = graph(&bench);
    let from = bench.join("memory/prefault.rs");
    assert!(edges[&from].contains(&bench.join("memory/verify.rs")));
    assert!(edges[&from].contains(&bench.join("capi.rs")));
}
