//! What an operator's tool (`kvtier::admin`, the `kvtier` command) reads of
//! a disk store without opening a tier, through this backend's own format
//! code: a namespace directory's name, identity, generations, manifest and
//! lock; a block file checked as every tier would check it; and the removal
//! of a file only while its name still holds the file that was examined.
//!
//! Nothing here writes a block. A file is examined through a descriptor
//! opened with `O_NOATIME` where the process may, so that checking a store
//! never makes its blocks look recently used (`kvtier gc` orders by access
//! time, which loads stamp: see `read`).

mod check;

pub use self::check::{remove_if_same, Checked, Checker, FileStamp, Removal, Verdict};
use super::generation::{parse_generation, GENERATION_FILE, SWEPT_GENERATIONS};
use super::manifest::{MANIFEST, MANIFEST_NEW, ORDER_HINT};
use super::{io, journal, layout, manifest};
use crate::backend::checksum::generation_fingerprint;
use crate::backend::SharedTenant;
use std::os::fd::OwnedFd;
use std::path::Path;

/// A namespace directory's name, read back: `<readable>-<fingerprint>-b<block
/// bytes>-v3` (or, the layout before, without `-v3`: never read by a tier).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NamespaceDir {
    /// The namespace's first 40 characters, `_` for any but `[A-Za-z0-9._-]`.
    pub readable: String,
    /// The namespace's fingerprint (see [`crate::admin::namespace_fingerprint`]).
    pub fingerprint: u64,
    /// The size of its blocks (the tiers' primary row size).
    pub block_bytes: usize,
    /// The layout before `-v3` (4096 fan-out directories), which no tier reads.
    pub legacy: bool,
}

impl NamespaceDir {
    /// The name of a directory entry, if it is a namespace directory's.
    pub fn parse(name: &str) -> Option<NamespaceDir> {
        let (rest, legacy) = match name.strip_suffix("-v3") {
            Some(rest) => (rest, false),
            None => (name, true),
        };
        let (rest, bytes) = rest.rsplit_once("-b")?;
        let (readable, fp) = rest.rsplit_once('-')?;
        let block_bytes: usize = bytes.parse().ok().filter(|&b| b > 0)?;
        if fp.len() != 16 || readable.is_empty() || bytes.starts_with('+') {
            return None;
        }
        let fingerprint = u64::from_str_radix(fp, 16).ok()?;
        Some(NamespaceDir {
            readable: readable.to_string(),
            fingerprint,
            block_bytes,
            legacy,
        })
    }

    /// The directory a tier of `namespace` with blocks of `block_bytes` uses.
    pub fn name_of(namespace: &str, block_bytes: usize) -> String {
        layout::namespace_dir(namespace, block_bytes)
    }
}

/// What a name in a fan-out directory is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FanEntry {
    /// `*.kvb`: an unsealed block file's name.
    Block,
    /// `*.kvs`: a sealed block file's name (readable only with its seal key).
    Sealed,
    /// `*.tmp`: a store's temporary file (debris once its store is over).
    Temporary,
    /// Anything else: no kvtier tier writes it.
    Other,
}

impl FanEntry {
    /// What the name `name` is.
    pub fn of(name: &str) -> FanEntry {
        if name.ends_with(layout::TMP_EXT) {
            FanEntry::Temporary
        } else if name.ends_with(layout::BLOCK_EXT) {
            FanEntry::Block
        } else if name.ends_with(layout::SEALED_EXT) {
            FanEntry::Sealed
        } else {
            FanEntry::Other
        }
    }
}

/// What a name directly in a namespace directory is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NsEntry {
    /// A fan-out directory's name (2 lowercase hex digits).
    FanDir,
    /// `.lock`, `.namespace`, the manifest, the order hint, the journals or
    /// a generation file: kept by tiers.
    Kept,
    /// Debris of an interrupted write (`.manifest.new`, a temporary file, a
    /// probe file of an open that died).
    Debris,
    /// Anything else: no kvtier tier writes it.
    Other,
}

impl NsEntry {
    /// What the name `name` is.
    pub fn of(name: &str) -> NsEntry {
        let kept = [
            ".lock",
            layout::IDENTITY_FILE,
            MANIFEST,
            ORDER_HINT,
            journal::JOURNAL,
            journal::JOURNAL_OLD,
        ];
        if name.len() == 2 && name.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            NsEntry::FanDir
        } else if name.ends_with(layout::TMP_EXT)
            || name == MANIFEST_NEW
            || name.starts_with(".odirect-probe.")
            || name.starts_with(".xattr-probe.")
        {
            NsEntry::Debris
        } else if kept.contains(&name) || generation_mark(name).is_some() {
            NsEntry::Kept
        } else {
            NsEntry::Other
        }
    }
}

/// The tenant mark of a generation file's name (`generation` is the unsealed
/// tiers', `generation-<tag>` a sealed tenant's).
fn generation_mark(name: &str) -> Option<SharedTenant> {
    SharedTenant::from_mark(name.strip_prefix(GENERATION_FILE)?)
}

/// The namespace's whole name, which each tier writes into `.namespace` at
/// open (None if no tier of this kvtier version opened the directory).
pub fn read_identity(ns_dir: &Path) -> Option<String> {
    let bytes = io::read_regular(&ns_dir.join(layout::IDENTITY_FILE)).ok()?;
    String::from_utf8(bytes).ok()
}

/// A tenant's clear generation in a shared namespace directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Generation {
    /// The file's name: `generation`, or `generation-<tag>` for a sealed tenant.
    pub file: String,
    /// The number mixed into the tenant's blocks' fingerprints (0: unsealed).
    pub tenant: u64,
    /// The generation, or None when the file does not hold a number (the
    /// next clear rewrites it).
    pub generation: Option<u64>,
}

impl Generation {
    /// Whether it is a sealed tenant's (its blocks are `.kvs` files).
    pub fn sealed(&self) -> bool {
        self.file != GENERATION_FILE
    }
}

/// The generation files of a namespace directory, sorted by name.
pub fn read_generations(ns_dir: &Path) -> std::io::Result<Vec<Generation>> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(ns_dir)?.flatten() {
        let Ok(name) = entry.file_name().into_string() else {
            continue;
        };
        let Some(tenant) = generation_mark(&name) else {
            continue;
        };
        let generation = io::read_regular(&entry.path())
            .ok()
            .and_then(|text| parse_generation(&text));
        found.push(Generation {
            file: name,
            tenant: tenant.number,
            generation,
        });
    }
    found.sort_by(|a, b| a.file.cmp(&b.file));
    Ok(found)
}

/// Raises a tenant's generation past `at_least` and the file's value, as a
/// tier's `clear()` does: its tiers leave the old generation's blocks at
/// their next read of the file (within `probe_ttl_ms`). Returns the new one.
pub fn raise_generation(ns_dir: &Path, of: &Generation, at_least: u64) -> std::io::Result<u64> {
    let mark = of.file.strip_prefix(GENERATION_FILE).unwrap_or("");
    let now = io::read_regular(&ns_dir.join(&of.file))
        .ok()
        .and_then(|text| parse_generation(&text))
        .unwrap_or(0);
    let next = now.max(at_least) + 1;
    super::generation::write_generation(ns_dir, mark, next)?;
    Ok(next)
}

/// The header fingerprints of the unsealed blocks of one namespace
/// directory: those every tier reads now, and those of the generations a
/// clear left behind (unreadable to every tier that follows the file).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Fingerprints {
    /// The namespace's own (a non-shared tier's blocks) and its current
    /// generation's (a shared tier's).
    pub current: Vec<u64>,
    /// The generations before the current one that a clear sweeps.
    pub stale: Vec<u64>,
}

impl Fingerprints {
    /// For the namespace of fingerprint `ns_fp` whose unsealed tiers are at
    /// `generation` (0 when no clear ever raised it).
    pub fn unsealed(ns_fp: u64, generation: u64) -> Fingerprints {
        let of = |g| generation_fingerprint(ns_fp, 0, g);
        Fingerprints {
            current: vec![ns_fp, of(generation)],
            stale: (generation.saturating_sub(SWEPT_GENERATIONS)..generation)
                .map(of)
                .collect(),
        }
    }
}

/// What a namespace directory's order files say (non-shared, unsealed tiers
/// keep them; see `manifest` and `journal`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OrderFiles {
    /// The manifest of the last clean close, if there is one.
    pub manifest: Option<ManifestState>,
    /// Keys the order hint names (a tier opened from a manifest since).
    pub hint_entries: Option<u64>,
    /// Keys the two store journals name, if either exists.
    pub journal_entries: Option<u64>,
}

/// A manifest as a tier's open would judge it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ManifestState {
    /// Damaged, or of another namespace or block size: an open scans.
    Invalid,
    /// Good, listing `blocks` keys; `unchanged`: no fan-out directory changed
    /// since it was written, so it lists exactly the block files (an open
    /// would trust it).
    Listed {
        /// Keys it lists.
        blocks: u64,
        /// No fan-out directory changed since it was written.
        unchanged: bool,
    },
}

/// Reads the order files of a namespace directory of `ns_fp` and
/// `block_bytes` (the manifest's 256 directory stamps included).
pub fn read_order_files(ns_dir: &Path, ns_fp: u64, block_bytes: usize) -> OrderFiles {
    let head = manifest::head(ns_fp, block_bytes);
    let count = |name: &str, stamped: bool| {
        let bytes = io::read_regular(&ns_dir.join(name)).ok()?;
        let mut n = 0u64;
        let stamps = stamped.then_some(ns_dir);
        Some(
            match manifest::parse(&bytes, &head, stamps, |_| true, |_| n += 1) {
                Some(unchanged) => ManifestState::Listed {
                    blocks: n,
                    unchanged,
                },
                None => ManifestState::Invalid,
            },
        )
    };
    let entries = |state: ManifestState| match state {
        ManifestState::Listed { blocks, .. } => blocks,
        ManifestState::Invalid => 0,
    };
    let journaled = [journal::JOURNAL, journal::JOURNAL_OLD]
        .iter()
        .any(|name| ns_dir.join(name).exists())
        .then(|| {
            journal::read(ns_dir, &journal::head(ns_fp, block_bytes))
                .keys
                .len() as u64
        });
    OrderFiles {
        manifest: count(MANIFEST, true),
        hint_entries: count(ORDER_HINT, false).map(entries),
        journal_entries: journaled,
    }
}

/// Who holds a namespace directory's lock now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Holder {
    /// No live tier (or the directory was never opened by one).
    Nobody,
    /// Live tiers opened with `shared=true`.
    Shared,
    /// A live tier opened with `shared=false`, which owns the directory.
    Exclusive,
}

fn open_lock(ns_dir: &Path) -> std::io::Result<Option<OwnedFd>> {
    match io::open(&ns_dir.join(".lock"), libc::O_RDONLY, 0) {
        Ok(fd) => Ok(Some(fd)),
        Err(e) if io::is_missing(&e) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Asks the directory lock, holding it only for the asking (a tier opening
/// meanwhile retries for 300 ms; see `open::LOCK_GRACE`). Creates nothing.
pub fn holder(ns_dir: &Path) -> std::io::Result<Holder> {
    let Some(fd) = open_lock(ns_dir)? else {
        return Ok(Holder::Nobody);
    };
    let busy = |e: &std::io::Error| e.raw_os_error() == Some(libc::EWOULDBLOCK);
    match io::try_flock(&fd, false) {
        Err(e) if busy(&e) => return Ok(Holder::Exclusive),
        Err(e) => return Err(e),
        Ok(()) => {}
    }
    match io::try_flock(&fd, true) {
        Err(e) if busy(&e) => Ok(Holder::Shared),
        Err(e) => Err(e),
        Ok(()) => Ok(Holder::Nobody),
    }
}

/// The directory's lock, held exclusively: no tier opens it meanwhile (an
/// open waits 300 ms, then fails), so no store is running in it. Dropping
/// it lets go.
pub struct DirLock(#[allow(dead_code)] OwnedFd);

/// Takes the exclusive lock if no tier holds the directory; None otherwise
/// (or when no tier ever opened it: there is no lock file to take).
pub fn lock_if_idle(ns_dir: &Path) -> Option<DirLock> {
    let fd = open_lock(ns_dir).ok()??;
    io::try_flock(&fd, true).ok()?;
    Some(DirLock(fd))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespace_directory_names_read_back() {
        let name =
            NamespaceDir::name_of("vllm/org-model-a/float16/t16/tp1pp1/r0/6859a213dc7a", 65536);
        let dir = NamespaceDir::parse(&name).unwrap();
        assert_eq!(dir.readable, "vllm_org-model-a_float16_t16_tp1pp1_r0_6");
        assert_eq!(
            dir.fingerprint,
            layout::namespace_fingerprint("vllm/org-model-a/float16/t16/tp1pp1/r0/6859a213dc7a")
        );
        assert_eq!((dir.block_bytes, dir.legacy), (65536, false));
        let legacy = NamespaceDir::parse(&layout::legacy_namespace_dir("a-b", 4096)).unwrap();
        assert!(legacy.legacy && legacy.readable == "a-b");
        for other in [
            "x",
            "a-00ff-b4096-v3",
            "a-zzzzzzzzzzzzzzzz-b1-v3",
            "a-0000000000000000-b0",
        ] {
            assert_eq!(NamespaceDir::parse(other), None, "{other}");
        }
    }

    #[test]
    fn names_in_a_namespace_directory_are_told_apart() {
        assert_eq!(NsEntry::of("0f"), NsEntry::FanDir);
        assert_eq!(NsEntry::of("0F"), NsEntry::Other);
        assert_eq!(NsEntry::of("generation"), NsEntry::Kept);
        assert_eq!(
            NsEntry::of(&format!("generation-{}", "ab".repeat(16))),
            NsEntry::Kept
        );
        assert_eq!(NsEntry::of("generation-xy"), NsEntry::Other);
        assert_eq!(NsEntry::of("generation.123.tmp"), NsEntry::Debris);
        assert_eq!(NsEntry::of(".manifest.new"), NsEntry::Debris);
        assert_eq!(NsEntry::of("notes.txt"), NsEntry::Other);
        assert_eq!(FanEntry::of("00.kvb.12-3.tmp"), FanEntry::Temporary);
        assert_eq!(FanEntry::of("00.kvs"), FanEntry::Sealed);
    }

    #[test]
    fn stale_generations_are_the_ones_a_clear_sweeps() {
        let fps = Fingerprints::unsealed(7, 20);
        assert_eq!(fps.current[0], 7);
        assert_eq!(fps.stale.len() as u64, SWEPT_GENERATIONS);
        assert!(!fps.stale.contains(&fps.current[1]));
        assert!(Fingerprints::unsealed(7, 0).stale.is_empty());
    }
}
