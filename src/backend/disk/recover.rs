//! Reopening a directory: the blocks earlier runs left, oldest first, with
//! temporary debris and files proved bad deleted, and nothing deleted that
//! could not be read. After a crash, the last clean close's order (an
//! `OrderHint`, see `manifest`) orders the files it names and spares their
//! inode reads.

use super::format::{Form, Header, HEADER_LEN};
use super::layout::FAN_DIRS;
use super::{io, layout, DiskBackend, SHARED_TMP_GRACE};
use crate::backend::checksum::xxh64;
use crate::error::{bail, Result};
use crate::seal::Sealer;
use std::ffi::{CStr, OsStr};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::SystemTime;

/// Threads scanning fan-out directories at once (the opening thread is one).
/// With a cold page cache every file's size and mtime cost an inode-table
/// read: one thread keeps one read in flight, which leaves a device's queue
/// idle; with the cache warm the scan is CPU work and the extra threads only
/// take turns on the cores.
const SCAN_THREADS: usize = 16;

/// A block the scan found on disk and the hint does not name.
struct Recovered {
    key: Vec<u8>,
    modified: SystemTime,
}

/// What one scanning thread found.
#[derive(Default)]
struct Found {
    /// Ranks in the hint of the block files it names (their keys are the
    /// hint's: nothing is decoded into a new allocation for them).
    hinted: Vec<u32>,
    others: Vec<Recovered>,
}

/// The LRU order of the last clean close, by key: a scan takes a listed
/// block file's place from it instead of its mtime, and does not stat the
/// file. It proves nothing about what is on disk: only files listed are
/// found, and a file whose length or header is wrong is found out by its
/// first load (which condemns it), not by the scan.
pub(crate) struct OrderHint {
    /// Least recently used first.
    keys: Vec<Vec<u8>>,
    /// (XXH64 of the key with seeds 0 and 1, rank) of every key with a hex
    /// file name, grouped by fan-out directory and sorted within each group:
    /// a directory's lookups then search a few kilobytes that stay in cache,
    /// where a map of a million keys costs cache misses per file.
    entries: Vec<(u64, u64, u32)>,
    /// Directory i's group is `entries[starts[i]..starts[i + 1]]`.
    starts: Vec<usize>,
}

impl OrderHint {
    /// Keys least recently used first.
    pub(crate) fn new(keys: Vec<Vec<u8>>) -> OrderHint {
        let mut starts = vec![0usize; FAN_DIRS + 1];
        let named: Vec<(usize, (u64, u64, u32))> = keys
            .iter()
            .enumerate()
            .filter(|(_, key)| key.len() <= layout::LONG_KEY)
            .map(|(rank, key)| {
                let h0 = xxh64(key, 0);
                (layout::fan_of_hash(h0), (h0, xxh64(key, 1), rank as u32))
            })
            .collect();
        for &(fan, _) in &named {
            starts[fan + 1] += 1;
        }
        for i in 0..FAN_DIRS {
            starts[i + 1] += starts[i];
        }
        let mut next = starts.clone();
        let mut entries = vec![(0, 0, 0); named.len()];
        for (fan, entry) in named {
            entries[next[fan]] = entry;
            next[fan] += 1;
        }
        for fan in 0..FAN_DIRS {
            entries[starts[fan]..starts[fan + 1]].sort_unstable();
        }
        OrderHint {
            keys,
            entries,
            starts,
        }
    }

    /// The rank of `key` (a block with a hex file name), if the hint has it.
    /// Two 64-bit hashes stand for the key: a file taken for another key
    /// would need both to collide.
    fn rank_of(&self, key: &[u8]) -> Option<u32> {
        let hashes = (xxh64(key, 0), xxh64(key, 1));
        let fan = layout::fan_of_hash(hashes.0);
        let group = &self.entries[self.starts[fan]..self.starts[fan + 1]];
        let at = group
            .binary_search_by(|&(h0, h1, _)| (h0, h1).cmp(&hashes))
            .ok()?;
        Some(group[at].2)
    }
}

/// What every fan-out directory's scan compares against.
struct Want {
    /// The block size, for the file lengths of its forms.
    block_bytes: usize,
    ext: &'static str,
    now: SystemTime,
}

impl DiskBackend {
    /// Blocks on disk from earlier runs, oldest first, deleting temporary files
    /// (in shared mode only stale ones) and files of the wrong size.
    pub(crate) fn scan(&self, order_hint: Option<OrderHint>) -> Result<Vec<Vec<u8>>> {
        let hint = order_hint.as_ref();
        let fans = match std::fs::read_dir(&self.ns_dir) {
            Ok(d) => d,
            Err(e) => bail!(Io, "cannot scan {}: {e}", self.ns_dir.display()),
        };
        let mut fans_seen = Vec::new();
        for fan in fans {
            match fan.and_then(|fan| Ok((fan.file_type()?, fan))) {
                Ok((kind, fan)) if kind.is_dir() => fans_seen.push(fan.file_name()),
                Ok(_) => {}
                // An entry not read may be a fan-out directory of blocks.
                Err(_) => self.left_unindexed(),
            }
        }
        let fans = fans_seen;
        let want = Want {
            block_bytes: self.block_bytes,
            // Sealed and unsealed tiers leave each other's files alone.
            ext: if self.seal.is_some() {
                layout::SEALED_EXT
            } else {
                layout::BLOCK_EXT
            },
            now: SystemTime::now(),
        };
        let next = AtomicUsize::new(0);
        let work = || {
            let mut found = Found::default();
            while let Some(fan) = fans.get(next.fetch_add(1, Ordering::Relaxed)) {
                self.scan_fan(fan, &want, hint, &mut found);
            }
            found
        };
        let found = std::thread::scope(|s| {
            // A helper that cannot be started leaves its share to the others.
            let helpers: Vec<_> = (1..SCAN_THREADS.min(fans.len()))
                .map_while(|_| {
                    std::thread::Builder::new()
                        .name("kvtier-scan".into())
                        .spawn_scoped(s, work)
                        .ok()
                })
                .collect();
            let mut found = work();
            for helper in helpers {
                match helper.join() {
                    Ok(mut more) => {
                        found.hinted.append(&mut more.hinted);
                        found.others.append(&mut more.others);
                    }
                    Err(panic) => std::panic::resume_unwind(panic),
                }
            }
            found
        });
        // Hinted blocks first, in the hint's order; then the others by mtime
        // (stored since the hint was written), the key breaking ties, so the
        // order does not depend on which thread scanned what.
        let Found { hinted, mut others } = found;
        others.sort_unstable_by(|a, b| (a.modified, &a.key).cmp(&(b.modified, &b.key)));
        let mut keys = Vec::with_capacity(hinted.len() + others.len());
        if let Some(hint) = order_hint {
            let mut listed = vec![false; hint.keys.len()];
            hinted.iter().for_each(|&rank| listed[rank as usize] = true);
            let in_order = hint
                .keys
                .into_iter()
                .zip(listed)
                .filter(|(_, listed)| *listed);
            keys.extend(in_order.map(|(key, _)| key));
        }
        keys.extend(others.into_iter().map(|r| r.key));
        Ok(keys)
    }

    /// One fan-out directory's blocks into `found`, deleting debris and
    /// files proved bad. Entries are examined in inode order: a cold scan
    /// then reads each inode-table block once, in order, instead of
    /// seeking back and forth in name-hash order (figures in
    /// docs/runs/disk.md).
    fn scan_fan(&self, fan: &OsStr, want: &Want, hint: Option<&OrderHint>, found: &mut Found) {
        let fan_path = self.ns_dir.join(fan);
        let Ok(dir) = io::open_dir(&fan_path) else {
            self.left_unindexed();
            return;
        };
        let Ok(io::DirNames {
            names,
            entries: mut files,
        }) = io::read_names(&dir)
        else {
            self.left_unindexed();
            return;
        };
        files.sort_unstable_by_key(|f| f.0);
        // Not a fan-out directory's name: none of its files is in its place.
        let fan = fan.to_str().unwrap_or("");
        for (_, at, kind) in files {
            let Ok(cname) = CStr::from_bytes_until_nul(&names[at..]) else {
                continue;
            };
            let Ok(name) = cname.to_str() else { continue };
            // A regular file the hint orders: no inode read (only unsealed,
            // unshared tiers have hints; a hashed name needs its header).
            if let Some(hint) = hint.filter(|_| kind == libc::DT_REG) {
                let mut key = [0u8; layout::LONG_KEY];
                let rank = layout::key_from_name_into(name, &mut key)
                    .map(|len| &key[..len])
                    .filter(|key| layout::is_hex_block_path(fan, name, key))
                    .and_then(|key| hint.rank_of(key));
                if let Some(rank) = rank {
                    found.hinted.push(rank);
                    continue;
                }
            }
            let meta = match io::stat_at(&dir, cname) {
                Ok(meta) => meta,
                Err(e) => {
                    if !io::is_missing(&e) {
                        self.left_unindexed();
                    }
                    continue;
                }
            };
            let modified = meta.modified;
            if name.ends_with(layout::TMP_EXT) {
                let stale =
                    want.now.duration_since(modified).unwrap_or_default() > SHARED_TMP_GRACE;
                if !self.shared || stale {
                    self.unlink_debris(&dir, &fan_path, cname);
                }
                continue;
            }
            if !name.ends_with(want.ext) || !meta.is_regular() {
                continue;
            }
            if let Some(seal) = &self.seal {
                let file = (&dir, fan_path.as_path(), cname);
                if let Some(key) = self.scan_sealed(seal, file, meta.len, want) {
                    found.others.push(Recovered { key, modified });
                }
                continue;
            }
            let hashed = layout::is_hashed_name(name);
            // Only a file whose name spells its key can have its header in
            // an attribute (see `DiskBackend::form_for`); the scan leaves
            // that header to the first load, as it leaves the payload.
            let form_allowed = match Form::of_len(meta.len, want.block_bytes) {
                Some(Form::InFile) => true,
                Some(Form::Attr) => !hashed,
                None => false,
            };
            if !form_allowed {
                self.unlink_debris(&dir, &fan_path, cname);
                continue;
            }
            let key = if hashed {
                match self.read_key(&fan_path.join(name)) {
                    Ok(key) => key,
                    // Not read (descriptors, permissions, I/O): nothing is
                    // proved about the block, so it stays on disk,
                    // unindexed until an open that can read it (a scan:
                    // no manifest is written while it is there).
                    Err(_) => {
                        self.left_unindexed();
                        continue;
                    }
                }
            } else {
                layout::key_from_name(name)
            };
            match key {
                Some(key)
                    if !key.is_empty()
                        && key.len() <= crate::MAX_KEY_LEN
                        && if hashed {
                            self.path_of(&key) == fan_path.join(name)
                        } else {
                            layout::is_hex_block_path(fan, name, &key)
                        } =>
                {
                    // Shared: a block of another clear generation (or one
                    // stored before generations) is nobody's now; it stays
                    // for a clear's sweep, unindexed.
                    if !self.shared || self.unsealed_present(&fan_path.join(name)) {
                        found.others.push(Recovered { key, modified })
                    }
                }
                // Read and found misplaced or not a block header: no
                // lookup would ever find it.
                _ => self.unlink_debris(&dir, &fan_path, cname),
            }
        }
    }

    /// The key of a sealed block file the scan found, if it is this
    /// tenant's block at its own name. Only a file whose header opens under
    /// this tier's key and names the key this file is named after is provably
    /// the tier's own: one cut short or grown is then corrupt (deleted unless
    /// shared, see docs/reliability-rules.md). Anything else stays, unindexed:
    /// another tenant's block, a header damaged beyond telling whose it is,
    /// or this tenant's block under a name that may be another tenant's.
    fn scan_sealed(
        &self,
        seal: &Sealer,
        (dir, fan_path, cname): (&OwnedFd, &Path, &CStr),
        len: u64,
        want: &Want,
    ) -> Option<Vec<u8>> {
        let path = fan_path.join(OsStr::from_bytes(cname.to_bytes()));
        let opened = match self.read_sealed_header(seal, &path) {
            Ok(Ok(opened)) => opened,
            Ok(Err(_)) | Err(_) => {
                self.left_unindexed();
                return None;
            }
        };
        let key = opened.key();
        if key.is_empty() || key.len() > crate::MAX_KEY_LEN || self.path_of(key) != path {
            self.left_unindexed();
            return None;
        }
        if Form::of_len(len, want.block_bytes) != Some(Form::InFile) {
            if self.shared {
                self.left_unindexed();
            } else {
                self.unlink_debris(dir, fan_path, cname);
            }
            return None;
        }
        self.ledger.record(key, opened.nonce);
        Some(key.to_vec())
    }

    /// Deletes a file the scan proved is no block of this tier's index; one
    /// that stays (the deletion failed) is on disk unlisted.
    fn unlink_debris(&self, dir: &OwnedFd, fan_path: &Path, name: &CStr) {
        self.changed_fan(fan_path);
        if let Err(e) = io::unlink_at(dir, name) {
            if !io::is_missing(&e) {
                self.left_unindexed();
            }
        }
    }

    /// The key in a block file's header: `Ok(None)` when the header was read
    /// and is not one of this layout (proved bad), `Err` when it could not be
    /// read at all (which proves nothing).
    pub(super) fn read_key(&self, path: &Path) -> std::io::Result<Option<Vec<u8>>> {
        let fd = io::open_read(path, false)?;
        if !io::fstat(&fd)?.is_regular() {
            return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
        }
        let mut h = vec![0u8; HEADER_LEN];
        let n = io::read_at(&fd, &mut [&mut h], 0)?;
        if Header::is_newer(&h[..n]) {
            // Another version's block proves nothing bad: it stays on disk.
            return Err(std::io::Error::other("a block in a newer format"));
        }
        Ok((n == HEADER_LEN)
            .then(|| Header::decode(&h).ok().map(|h| h.key))
            .flatten())
    }
}
