//! The manifest: the index of a non-shared, unsealed tier written at a clean
//! close, so that the next open reads one file instead of scanning every
//! fan-out directory (a million inode reads with a cold page cache).
//!
//! ```text
//! offset  size  field
//!      0     8  magic "KVTIERM\0"
//!      8     4  manifest version (2)
//!     12     4  flags (0: unsealed blocks, `.kvb` files)
//!     16     8  namespace fingerprint
//!     24     8  block size in bytes
//!     32     8  block file length (header + padded payload)
//!     40 98304  a stamp per fan-out directory 000..fff, 24 bytes each:
//!               inode, mtime and ctime in ns (all 0: no such directory)
//!  98344     …  entries, least recently used first: key length (1 byte,
//!               1..=128), key
//!    end-16  8  number of entries
//!    end-8   8  checksum: xxh64 chained over 64 KiB chunks of every byte
//!               before it (each chunk's hash seeds the next)
//! ```
//!
//! Rules (see `DiskBackend::recover` and `Persistence::save_on_close`):
//! - Written only at `tier_free`, after every worker has been joined, when
//!   the index lists exactly the block files on disk: never in shared mode,
//!   never for a sealed tier (its keys must not be written anywhere), never
//!   after a missed I/O deadline, a job left unfinished, or a file the tier
//!   knows it left unindexed. Temporary file, fsync, rename, fsync of the
//!   directory, after the fan-out directories this run changed were synced.
//! - Read at open and taken away (fsync of the directory) before the tier
//!   accepts any store, whether it was used or not: a later crash can never
//!   bring back a stale one. Anything wrong with it (magic, version,
//!   checksum, namespace, block size, sealing, counts) and the open scans.
//! - Taken away by renaming it to `.order-hint`, which is never trusted for
//!   what is on disk: if this run crashes, the next open scans, and the
//!   hint gives that scan the LRU order of the last clean close for every
//!   block file it lists that the hint names, without reading the file's
//!   inode (a million `lstat`s cost 4-6 s of kernel CPU with a cold page
//!   cache on 2 cores; listing the directories costs under 1 s). Files the
//!   hint does not name (stored since) are stat'ed as before and come after,
//!   oldest first; names in the hint with no file are nothing. A clean close
//!   replaces the hint with a manifest.
//! - Trusted only if no fan-out directory changed since the close: a block
//!   file deleted, added or renamed by anyone but the tier changes its
//!   directory's mtime (and ctime), a directory replaced changes its inode.
//!   The stamps are taken after the last change the tier made and compared
//!   at open (256 `lstat`s, in parallel: about what reading the manifest
//!   costs); any difference and the open scans. Without them a block deleted
//!   behind the tier's back would stay listed, and a store of its key would
//!   be taken for one already done.

use super::format::file_len;
use super::layout::{fan_name, FAN_DIRS};
use super::{io, DiskBackend};
use crate::backend::checksum::xxh64;
use crate::backend::EachBlock;
use crate::key::MAX_KEY_LEN;
use std::io::Write;
use std::path::{Path, PathBuf};

pub(super) const MANIFEST: &str = ".manifest";
/// Where a manifest is written before it is renamed into place; debris of a
/// close that died while writing, removed at open.
pub(super) const MANIFEST_NEW: &str = ".manifest.new";
/// A consumed manifest, kept for its order only (see the module's doc).
pub(super) const ORDER_HINT: &str = ".order-hint";
const MAGIC: [u8; 8] = *b"KVTIERM\0";
const VERSION: u32 = 2;
const HEAD_LEN: usize = 40;
const STAMP_LEN: usize = 24;
/// Where the entries start: after the head and the directory stamps.
pub(super) const ENTRIES_AT: usize = HEAD_LEN + FAN_DIRS * STAMP_LEN;
/// Threads taking the stamps at open (with a cold page cache each is an
/// inode read; one thread would leave the device's queue idle).
const STAMP_THREADS: usize = 16;
const TRAILER_LEN: usize = 16;
const CHUNK: usize = 64 << 10;
const SEED: u64 = 0x6d61_6e69_6665_7374;

/// What the last clean close's manifest gives an open.
pub(super) enum Taken {
    /// Nothing changed since the close: these keys, least recently used
    /// first, are exactly the blocks on disk.
    Trusted(Vec<Vec<u8>>),
    /// Keys in the LRU order of the last clean close, for a scan to order
    /// what it finds (see `scan`); no proof of what is on disk.
    Hint(Vec<Vec<u8>>),
    Nothing,
}

/// The manifest's checksum, fed in pieces: the same value for the same bytes
/// however they were split.
struct ChunkSum {
    sum: u64,
    pending: Vec<u8>,
}

impl ChunkSum {
    fn new() -> ChunkSum {
        ChunkSum {
            sum: SEED,
            pending: Vec::with_capacity(CHUNK),
        }
    }

    fn feed(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            let take = (CHUNK - self.pending.len()).min(bytes.len());
            self.pending.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
            if self.pending.len() == CHUNK {
                self.sum = xxh64(&self.pending, self.sum);
                self.pending.clear();
            }
        }
    }

    fn finish(mut self) -> u64 {
        if !self.pending.is_empty() {
            self.sum = xxh64(&self.pending, self.sum);
        }
        self.sum
    }
}

/// Every byte written goes through the checksum.
struct Summed<W: Write> {
    out: W,
    sum: ChunkSum,
}

impl<W: Write> Summed<W> {
    fn put(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.sum.feed(bytes);
        self.out.write_all(bytes)
    }
}

impl DiskBackend {
    fn manifest_path(&self, name: &str) -> PathBuf {
        self.ns_dir.join(name)
    }

    /// The head that identifies the block files this tier accepts.
    fn manifest_head(&self) -> [u8; HEAD_LEN] {
        head(self.ns_fp, self.block_bytes)
    }

    /// Whether this tier may trust a manifest at all (and write one).
    pub(super) fn manifest_applies(&self) -> bool {
        !self.shared && self.seal.is_none()
    }

    /// Takes the manifest a clean close left: its keys, oldest first,
    /// trusted if it is valid, this tier may use it and no fan-out directory
    /// changed since; only as an order hint if the directories changed or
    /// the manifest is gone and an earlier open left its hint. When this
    /// returns, the manifest is gone from disk (renamed to the hint, or
    /// deleted) and the directory synced; if it cannot be, nothing is used.
    pub(super) fn take_manifest(&self) -> Taken {
        let _ = std::fs::remove_file(self.manifest_path(MANIFEST_NEW));
        let path = self.manifest_path(MANIFEST);
        let bytes = match io::read_regular(&path) {
            Ok(bytes) => Some(bytes),
            Err(e) if io::is_missing(&e) => return self.read_hint(),
            Err(_) => None,
        };
        // The journals describe the run before that clean close.
        super::journal::remove(&self.ns_dir);
        let parsed = bytes
            .filter(|_| self.manifest_applies())
            .and_then(|bytes| self.parse_manifest(&bytes, true));
        // Never trusted again; kept for its order if it is a good one.
        let hint = self.manifest_path(ORDER_HINT);
        let kept = parsed.is_some() && std::fs::rename(&path, &hint).is_ok();
        if !kept {
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if io::is_missing(&e) => {}
                Err(_) => return Taken::Nothing,
            }
        }
        if io::sync_dir(&self.ns_dir).is_err() {
            return Taken::Nothing;
        }
        match parsed {
            Some((keys, true)) => Taken::Trusted(keys),
            Some((keys, false)) => Taken::Hint(keys),
            None => self.read_hint(),
        }
    }

    /// The order hint an earlier open kept, if it is a good one for this
    /// tier (it is left in place: it stays the best order known until a
    /// clean close writes a manifest).
    fn read_hint(&self) -> Taken {
        if !self.manifest_applies() {
            return Taken::Nothing;
        }
        match io::read_regular(&self.manifest_path(ORDER_HINT)) {
            Ok(bytes) => match self.parse_manifest(&bytes, false) {
                Some((keys, _)) => Taken::Hint(keys),
                None => Taken::Nothing,
            },
            Err(_) => Taken::Nothing,
        }
    }

    /// The keys of a manifest, and (if `stamped` asks) whether no fan-out
    /// directory changed since it was written; None if anything about it is
    /// wrong.
    fn parse_manifest(&self, bytes: &[u8], stamped: bool) -> Option<(Vec<Vec<u8>>, bool)> {
        let keys = std::cell::RefCell::new(Vec::new());
        let stamps = stamped.then_some(self.ns_dir.as_path());
        let unchanged = parse(
            bytes,
            &self.manifest_head(),
            stamps,
            |count| keys.borrow_mut().try_reserve_exact(count as usize).is_ok(),
            |key| keys.borrow_mut().push(key.to_vec()),
        )?;
        Some((keys.into_inner(), unchanged))
    }

    /// Writes the manifest of the blocks `each_block` lists (least recently
    /// used first). On any failure, no manifest is left.
    pub(super) fn write_manifest(&self, each_block: &mut EachBlock<'_>) -> std::io::Result<()> {
        let new = self.manifest_path(MANIFEST_NEW);
        let done = self.sync_changed_fans().and_then(|()| {
            let _ = std::fs::remove_file(&new);
            let fd = io::open(&new, libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL, 0o600)?;
            let file = std::fs::File::from(fd);
            let mut out = Summed {
                out: std::io::BufWriter::with_capacity(CHUNK, file),
                sum: ChunkSum::new(),
            };
            out.put(&self.manifest_head())?;
            // After the fan-out directories were synced: nothing changes them
            // now (every worker has been joined).
            out.put(&self.fan_stamps()?)?;
            let mut count = 0u64;
            let mut failed = None;
            each_block(&mut |_, key| {
                if failed.is_some() {
                    return;
                }
                let outcome = if key.is_empty() || key.len() > MAX_KEY_LEN {
                    Err(std::io::Error::from(std::io::ErrorKind::InvalidData))
                } else {
                    out.put(&[key.len() as u8]).and_then(|()| out.put(key))
                };
                match outcome {
                    Ok(()) => count += 1,
                    Err(e) => failed = Some(e),
                }
            });
            if let Some(e) = failed {
                return Err(e);
            }
            out.put(&count.to_le_bytes())?;
            let sum = out.sum.finish();
            let mut file = out.out.into_inner().map_err(|e| e.into_error())?;
            file.write_all(&sum.to_le_bytes())?;
            file.sync_all()?;
            drop(file);
            std::fs::rename(&new, self.manifest_path(MANIFEST))?;
            // The manifest's order is newer; a hint left behind would only
            // be read if this manifest were lost.
            let _ = std::fs::remove_file(self.manifest_path(ORDER_HINT));
            match self.journal.get() {
                Some(journal) => journal.remove(),
                None => super::journal::remove(&self.ns_dir),
            }
            io::sync_dir(&self.ns_dir)
        });
        if done.is_err() {
            let _ = std::fs::remove_file(&new);
            let _ = std::fs::remove_file(self.manifest_path(MANIFEST));
        }
        done
    }

    fn fan_stamps(&self) -> std::io::Result<Vec<u8>> {
        fan_stamps(&self.ns_dir)
    }

    /// fsyncs every fan-out directory in which this run created, renamed or
    /// deleted a file, so that the manifest never describes entries that a
    /// power loss could undo (a temporary file or an evicted block coming
    /// back, unlisted and never deleted).
    fn sync_changed_fans(&self) -> std::io::Result<()> {
        for (word, bits) in self.changed_fans.iter().enumerate() {
            let mut bits = bits.load(std::sync::atomic::Ordering::Acquire);
            while bits != 0 {
                let fan = word * 64 + bits.trailing_zeros() as usize;
                bits &= bits - 1;
                match io::sync_dir(&self.ns_dir.join(super::layout::fan_name(fan))) {
                    Ok(()) => {}
                    Err(e) if io::is_missing(&e) => {}
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(())
    }
}

/// The head of a manifest of `ns_fp`'s blocks of `block_bytes`.
pub(super) fn head(ns_fp: u64, block_bytes: usize) -> [u8; HEAD_LEN] {
    let mut head = [0u8; HEAD_LEN];
    head[0..8].copy_from_slice(&MAGIC);
    head[8..12].copy_from_slice(&VERSION.to_le_bytes());
    head[12..16].copy_from_slice(&0u32.to_le_bytes());
    head[16..24].copy_from_slice(&ns_fp.to_le_bytes());
    head[24..32].copy_from_slice(&(block_bytes as u64).to_le_bytes());
    head[32..40].copy_from_slice(&(file_len(block_bytes) as u64).to_le_bytes());
    head
}

/// Checks a manifest (`bytes`) against `head` and its checksum, hands
/// `reserve` the count it claims (false: give up) and `key` each key, least
/// recently used first; with `stamps_of`, whether no fan-out directory of
/// that namespace directory changed since it was written. None if anything
/// about it is wrong.
pub(super) fn parse(
    bytes: &[u8],
    head: &[u8; HEAD_LEN],
    stamps_of: Option<&Path>,
    reserve: impl FnOnce(u64) -> bool,
    mut key: impl FnMut(&[u8]),
) -> Option<bool> {
    if bytes.len() < HEAD_LEN + TRAILER_LEN || bytes[..HEAD_LEN] != head[..] {
        return None;
    }
    let (body, trailer) = bytes.split_at(bytes.len() - TRAILER_LEN);
    let u64_at = |at: usize| u64::from_le_bytes(trailer[at..at + 8].try_into().expect("8"));
    let (count, sum) = (u64_at(0), u64_at(8));
    let mut check = ChunkSum::new();
    check.feed(body);
    check.feed(&trailer[..8]);
    if check.finish() != sum || body.len() < ENTRIES_AT {
        return None;
    }
    // Each entry takes at least two bytes.
    let entries = &body[ENTRIES_AT..];
    if count > (entries.len() / 2) as u64 || !reserve(count) {
        return None;
    }
    let (mut at, mut seen) = (0, 0u64);
    while at < entries.len() {
        let len = entries[at] as usize;
        let bytes = entries.get(at + 1..at + 1 + len)?;
        if len == 0 || len > MAX_KEY_LEN {
            return None;
        }
        key(bytes);
        seen += 1;
        at += 1 + len;
    }
    if seen != count {
        return None;
    }
    // Stamped last: the 256 directories' stamps are read only for a
    // manifest that is good in every other way.
    Some(stamps_of.is_some_and(|ns_dir| {
        fan_stamps(ns_dir).is_ok_and(|now| body[HEAD_LEN..ENTRIES_AT] == now[..])
    }))
}

/// Every fan-out directory's stamp (see the module's doc), in order; all
/// zero for a directory that does not exist. Any other failure to stat
/// one is an error: neither written nor trusted.
pub(super) fn fan_stamps(ns_dir: &Path) -> std::io::Result<Vec<u8>> {
    let mut stamps = vec![0u8; FAN_DIRS * STAMP_LEN];
    let per_thread = FAN_DIRS.div_ceil(STAMP_THREADS);
    let stamp_chunk = |chunk: usize, out: &mut [u8]| -> std::io::Result<()> {
        for (i, stamp) in out.chunks_exact_mut(STAMP_LEN).enumerate() {
            let fan = chunk * per_thread + i;
            let st = match io::lstat_raw(&ns_dir.join(fan_name(fan))) {
                Ok(st) => st,
                Err(e) if io::is_missing(&e) => continue,
                Err(e) => return Err(e),
            };
            let ns = |s: i64, n: i64| {
                (s as u64)
                    .wrapping_mul(1_000_000_000)
                    .wrapping_add(n as u64)
            };
            stamp[0..8].copy_from_slice(&st.st_ino.to_le_bytes());
            stamp[8..16].copy_from_slice(&ns(st.st_mtime, st.st_mtime_nsec).to_le_bytes());
            stamp[16..24].copy_from_slice(&ns(st.st_ctime, st.st_ctime_nsec).to_le_bytes());
        }
        Ok(())
    };
    std::thread::scope(|scope| {
        let mut helpers = Vec::new();
        for (chunk, out) in stamps.chunks_mut(per_thread * STAMP_LEN).enumerate() {
            // No thread to be had: no stamps, so no manifest written or
            // trusted (the scan does without).
            let helper = std::thread::Builder::new()
                .name("kvtier-stamps".into())
                .spawn_scoped(scope, move || stamp_chunk(chunk, out))?;
            helpers.push(helper);
        }
        helpers.into_iter().try_for_each(|h| {
            h.join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        })
    })?;
    Ok(stamps)
}

#[cfg(test)]
mod tests {
    use super::ChunkSum;
    use crate::backend::checksum::xxh64;

    #[test]
    fn the_checksum_does_not_depend_on_how_bytes_are_fed() {
        let data: Vec<u8> = (0..200_000u32).map(|i| (i * 7) as u8).collect();
        let mut whole = ChunkSum::new();
        whole.feed(&data);
        let mut pieces = ChunkSum::new();
        for piece in data.chunks(37) {
            pieces.feed(piece);
        }
        let expected = data
            .chunks(super::CHUNK)
            .fold(super::SEED, |sum, chunk| xxh64(chunk, sum));
        assert_eq!(whole.finish(), expected);
        assert_eq!(pieces.finish(), expected);
    }
}
