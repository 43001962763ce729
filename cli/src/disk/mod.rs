//! A disk store as the command sees it: the namespace directories under a
//! tier's `path` (named and read by `kvtier::admin::disk`), and a walk of
//! their fan-out directories on several threads, which hands each name (and,
//! when asked, what `lstat` says of it) to the subcommand.

pub mod clear;
pub mod gc;
pub mod inspect;
pub mod verify;

use crate::progress::Progress;
use crate::report::fp;
use kvtier::admin::disk::{
    read_generations, read_identity, FanEntry, FileStamp, Fingerprints, Generation, NamespaceDir,
    NsEntry,
};
use serde_json::{json, Value};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

/// One namespace directory (one namespace and block size).
pub struct Namespace {
    pub path: PathBuf,
    pub name: String,
    pub dir: NamespaceDir,
    /// The namespace's whole name, where a tier wrote it (`.namespace`).
    pub identity: Option<String>,
    pub generations: Vec<Generation>,
}

impl Namespace {
    /// The unsealed tiers' clear generation (0: never cleared).
    pub fn unsealed_generation(&self) -> u64 {
        self.generations
            .iter()
            .find(|g| !g.sealed())
            .and_then(|g| g.generation)
            .unwrap_or(0)
    }

    /// The header fingerprints its unsealed blocks carry now, and those of
    /// the generations a clear left behind.
    pub fn fingerprints(&self) -> Fingerprints {
        Fingerprints::unsealed(self.dir.fingerprint, self.unsealed_generation())
    }

    /// What names it, for reports.
    pub fn json_head(&self) -> serde_json::Map<String, Value> {
        let mut m = serde_json::Map::new();
        m.insert("dir".into(), json!(self.name));
        m.insert("namespace".into(), json!(self.identity));
        m.insert("readable".into(), json!(self.dir.readable));
        m.insert("fingerprint".into(), json!(fp(self.dir.fingerprint)));
        m.insert("block_bytes".into(), json!(self.dir.block_bytes));
        m
    }

    /// Its name for a line of text.
    pub fn label(&self) -> String {
        match &self.identity {
            Some(name) => format!("{name:?} ({} B blocks)", self.dir.block_bytes),
            None => format!("{} ({} B blocks)", self.name, self.dir.block_bytes),
        }
    }
}

/// The namespace directories under a tier's `path`.
pub struct Root {
    pub path: PathBuf,
    pub namespaces: Vec<Namespace>,
    /// Directories of the layout before `-v3`, which no tier reads.
    pub legacy: Vec<String>,
}

/// Reads the namespace directories under `root`, only those of `only` (a
/// namespace's name) when given.
pub fn open_root(root: &Path, only: Option<&str>) -> Result<Root, String> {
    let entries = std::fs::read_dir(root)
        .map_err(|e| format!("{}: not a readable directory: {e}", root.display()))?;
    let want = only.map(kvtier::admin::namespace_fingerprint);
    let mut namespaces = Vec::new();
    let mut legacy = Vec::new();
    for entry in entries.flatten() {
        let Ok(name) = entry.file_name().into_string() else {
            continue;
        };
        let Some(dir) = NamespaceDir::parse(&name) else {
            continue;
        };
        if !entry.file_type().is_ok_and(|t| t.is_dir())
            || want.is_some_and(|f| f != dir.fingerprint)
        {
            continue;
        }
        if dir.legacy {
            legacy.push(name);
            continue;
        }
        let path = entry.path();
        namespaces.push(Namespace {
            identity: read_identity(&path).or_else(|| only.map(str::to_string)),
            generations: read_generations(&path).unwrap_or_default(),
            path,
            name,
            dir,
        });
    }
    namespaces.sort_by(|a, b| a.name.cmp(&b.name));
    legacy.sort();
    Ok(Root {
        path: root.to_path_buf(),
        namespaces,
        legacy,
    })
}

/// What `lstat` says of a name.
#[derive(Clone, Copy, Debug)]
pub struct Meta {
    pub len: u64,
    /// The later of access and modification time: the block's last use
    /// (loads stamp the access time, stores write the file).
    pub last_use: i64,
    pub written: i64,
    pub regular: bool,
    pub stamp: FileStamp,
}

impl Meta {
    pub fn of(m: &std::fs::Metadata) -> Meta {
        Meta {
            len: m.len(),
            last_use: m.atime().max(m.mtime()),
            written: m.mtime(),
            regular: m.file_type().is_file(),
            stamp: FileStamp {
                dev: m.dev(),
                ino: m.ino(),
            },
        }
    }
}

/// A name found in a fan-out directory.
pub struct Found<'a> {
    pub ns: usize,
    pub fan: &'a str,
    pub name: &'a str,
    pub kind: FanEntry,
    /// None when the walk was not asked to stat, or the name vanished.
    pub meta: Option<Meta>,
}

/// The names directly in a namespace directory that are not fan-out
/// directories, with what they are.
pub fn ns_entries(ns: &Namespace) -> Vec<(String, NsEntry, Option<Meta>)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(&ns.path).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let kind = NsEntry::of(&name);
        let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
        if kind == NsEntry::FanDir && is_dir {
            continue;
        }
        let kind = if kind == NsEntry::FanDir {
            NsEntry::Other
        } else {
            kind
        };
        out.push((name, kind, entry.metadata().ok().map(|m| Meta::of(&m))));
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// Walks every fan-out directory of `namespaces` (of those `only` lists,
/// when given) on `threads` threads, each with a state from `init` that
/// `visit` fills; returns the states. With `stat`, each name is `lstat`ed
/// (a block's size and times).
#[allow(clippy::too_many_arguments)]
pub fn walk<T: Send>(
    namespaces: &[Namespace],
    only: Option<&[usize]>,
    threads: usize,
    progress: Option<&str>,
    stat: bool,
    init: impl Fn() -> T + Sync,
    visit: impl Fn(&mut T, &Found) + Sync,
) -> Vec<T> {
    let mut fans = Vec::new();
    for (at, ns) in namespaces.iter().enumerate() {
        if only.is_some_and(|only| !only.contains(&at)) {
            continue;
        }
        for entry in std::fs::read_dir(&ns.path).into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if NsEntry::of(&name) == NsEntry::FanDir && entry.file_type().is_ok_and(|t| t.is_dir())
            {
                fans.push((at, name));
            }
        }
    }
    fans.sort();
    let bar = Progress::new(
        progress.is_some(),
        progress.unwrap_or(""),
        fans.len() as u64,
    );
    let next = AtomicUsize::new(0);
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads.clamp(1, fans.len().max(1)))
            .map(|_| {
                scope.spawn(|| {
                    let mut state = init();
                    while let Some((ns, fan)) = fans.get(next.fetch_add(1, Ordering::Relaxed)) {
                        let dir = namespaces[*ns].path.join(fan);
                        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                            let name = entry.file_name().to_string_lossy().into_owned();
                            let meta = stat.then(|| entry.metadata().ok()).flatten();
                            let found = Found {
                                ns: *ns,
                                fan,
                                name: &name,
                                kind: FanEntry::of(&name),
                                meta: meta.as_ref().map(Meta::of),
                            };
                            visit(&mut state, &found);
                        }
                        bar.add(1);
                    }
                    state
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().expect("a walking thread panicked"))
            .collect()
    })
}

/// Bytes and count of a set of files.
#[derive(Clone, Copy, Default, Debug)]
pub struct Tally {
    pub files: u64,
    pub bytes: u64,
}

impl Tally {
    pub fn add(&mut self, bytes: u64) {
        self.files += 1;
        self.bytes += bytes;
    }

    pub fn merge(&mut self, other: Tally) {
        self.files += other.files;
        self.bytes += other.bytes;
    }
}
