//! The disk backend: one file per block, written to a temporary name and
//! published by rename, verified by checksum on every load.
//!
//! What it guarantees, beyond the common contract:
//! - A file under a final name is always complete: stores write a temporary
//!   file (exclusive create, no symlink followed), optionally sync it, and
//!   rename it into place. A crash leaves at worst temporary files, which the
//!   next open deletes.
//! - A load checks that the path names a regular file of the block's size, then
//!   verifies header (magic, version, namespace, block size, key) and payload
//!   checksum. A short, torn, corrupted or foreign file, or anything but a
//!   regular file at the path, fails that block with TIER_ERR_CORRUPT and is
//!   removed (a directory is left); a missing one fails with
//!   TIER_ERR_NOT_FOUND; either way the key becomes a MISS. Transient errors
//!   (descriptors, memory, permissions, device errors) fail the block with
//!   TIER_ERR_IO and leave the file alone. Nothing is condemned on what was
//!   seen in the engine's row alone: a private read confirms it first.
//! - Reopening a directory after a clean close reads the manifest `tier_free`
//!   wrote (the index in LRU order, see `manifest`) and deletes it. Without a
//!   valid one it rebuilds the index from the files, deleting leftover
//!   temporary files and its own blocks it read and found bad at their own
//!   names (none for a sealed shared tier), never another tenant's file or
//!   a file it could not read (docs/reliability-rules.md): in the order of the last clean close's hint and the store
//!   journal (`journal`) for the files they name, by modification time
//!   (oldest first) for the others.
//! - Eviction deletes files, on a worker, never a file that a newer store of the
//!   same key has published (publish and delete of one key are serialized by a
//!   striped lock, and deletion re-checks that the key is not live).
//!
//! Shared mode (`shared=true`): several processes (or hosts on a network file
//! system) use one directory. Each process's index holds the blocks it stored
//! and the ones it found on disk; a key absent from it is looked up on the file
//! system by a worker (the lookup answers PENDING, then HIT or MISS; a MISS is
//! reused for `probe_ttl_ms`). Capacity is accounted per process over the blocks
//! in its own index, and eviction deletes those files whoever wrote them, so the
//! directory holds at most the sum of the processes' capacities; another
//! process that still lists a deleted block gets NOT_FOUND on load and drops it.

// Files: `examine` (what the operator's `kvtier` command reads of a store
// through `kvtier::admin`: names, order files, locks, a block checked as a
// tier checks it), `format` (the block file format and its checksum), `fs_kind` (what
// the directory's file system is: deadline and header choices), `hang` (a test
// seam: storage calls that hang), `io` (the system calls), `layout` (where a key's file lives), `read` (the verified load),
// `recover` (reopening a directory), `staged` (loads of blocks over a piece:
// staged or straight into the row), `manifest` (the index written at a clean
// close, read at the next open), `journal` (the order of stores since, for
// the scan after a crash), `open` (opening: checks, lock, probes, the hand-off
// to recovery), `write` (the store path, the mirror of `read`); this file: the
// backend's state, deleting, and the glue of the `Backend` trait and of the
// capabilities a disk tier has (watched I/O, discards, persistence, probes
// when shared, test seams).
pub(crate) mod examine;
mod format;
mod fs_kind;
mod generation;
#[cfg(feature = "test-hooks")]
pub(crate) mod hang;
mod io;
mod journal;
mod layout;
mod manifest;
mod open;
mod read;
mod recover;
mod sealed;
mod staged;
mod write;

use self::format::{Form, Header, ALIGN};
use self::fs_kind::FsKind;
use super::checksum::PayloadSum;
use super::{Backend, Discards, LoadJob, Persistence, Probes, Row, StoreJob, Unwatched, WatchedIo};
use crate::aligned::AlignedBuf;
use crate::config::SyncMode;
use crate::error::{Error, ErrorKind, Result};
use crate::seal::{NonceLedger, Sealer};
use crate::striped::Striped;
use crate::sync::Mutex;
use std::cell::RefCell;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::time::Duration;

/// Temporary files older than this are debris even in shared mode, where a
/// younger one may belong to another process's store in progress.
const SHARED_TMP_GRACE: Duration = Duration::from_secs(600);
const STRIPES: usize = 256;

const RECOVERED_NOT_YET: u8 = 0;
const RECOVERED_BY_SCAN: u8 = 1;
const RECOVERED_FROM_MANIFEST: u8 = 2;
const RECOVERED_BY_HINTED_SCAN: u8 = 3;
const RECOVERED_BY_JOURNALED_SCAN: u8 = 4;
const RECOVERED_BY_HINTED_JOURNALED_SCAN: u8 = 5;

thread_local! {
    /// Per-worker aligned scratch: header, and a bounce buffer for rows that
    /// O_DIRECT cannot use in place.
    static SCRATCH: RefCell<Option<AlignedBuf>> = const { RefCell::new(None) };
}

/// The piece a large block is streamed in under a deadline; blocks larger
/// than this are also staged without one.
const PIECE: usize = 1 << 20;

/// The piece a block larger than [`PIECE`] is staged in without a deadline:
/// one huge page, so a 2 MiB block is one device request (a virtio disk
/// takes 4 MiB a request) instead of two read one after the other.
const STAGE_PIECE: usize = 2 << 20;

/// What `describe` says of a tier whose blocks are larger than a piece.
const STAGED_NOTE: &str =
    ", stores staged whole, loads staged in 2 MiB pieces into rows O_DIRECT cannot use in place";

/// Runs `f` on this thread's scratch of at least `len` bytes; an error of
/// kind `OutOfMemory` if the scratch cannot grow to that.
fn with_scratch<R>(
    len: usize,
    f: impl FnOnce(&mut [u8]) -> std::io::Result<R>,
) -> std::io::Result<R> {
    SCRATCH.with(|cell| f(AlignedBuf::reuse(&mut cell.borrow_mut(), len)?))
}

fn io_error(what: &str, path: &Path, err: std::io::Error) -> Error {
    let kind = if io::is_missing(&err) {
        ErrorKind::NotFound
    } else if err.kind() == std::io::ErrorKind::OutOfMemory {
        ErrorKind::Alloc
    } else {
        ErrorKind::Io
    };
    Error::new(kind, format!("{what} {}: {err}", path.display()))
}

pub(crate) struct DiskBackend {
    ns_dir: PathBuf,
    /// The namespace's fingerprint: the manifest's and the journal's.
    ns_fp: u64,
    /// Shared: the clear generation this tier uses (see `generation`), and
    /// the fingerprint its blocks' names and headers carry.
    generation: AtomicU64,
    generation_fp: AtomicU64,
    /// Whose generation a shared tier keeps: unsealed tiers', or its seal key's.
    tenant: super::SharedTenant,
    block_bytes: usize,
    direct: bool,
    direct_note: String,
    /// Block headers go to an extended attribute (format version 3) for
    /// keys that a file name spells; see `format`.
    attr_headers: bool,
    header_note: &'static str,
    /// The fan-out directories are made in block groups of their own.
    spread_fans: bool,
    /// The directory's file system, for `io_timeout_ms=auto`.
    fs: FsKind,
    /// The name of the directory an older kvtier (layout before `-v3`)
    /// left beside this one, unread: `describe` says so.
    legacy_dir: Option<String>,
    sync: SyncMode,
    shared: bool,
    /// The tenant's keys when the tier is sealed (see `sealed`).
    seal: Option<Sealer>,
    /// The version of each sealed block this process last wrote or saw.
    ledger: NonceLedger,
    /// Serializes publish (rename) and delete of the same key.
    stripes: Striped<()>,
    tmp_counter: AtomicU64,
    /// This process's id, for temporary file names (a getpid per store
    /// otherwise; a tier is inert in a forked child, so it never changes).
    pid: u32,
    /// One bit per fan-out directory in which this run created, renamed or
    /// deleted a file: synced before a manifest is written.
    changed_fans: Vec<AtomicU64>,
    /// Set when a block file may be on disk that the index does not list
    /// (one the scan could not read, one a deletion failed to remove): a
    /// manifest would hide it from every later open, so none is written.
    unindexed: AtomicBool,
    /// Loads stamp their file's access time (see `read::stamp_use`); off
    /// once the file system refused this process (not the files' owner).
    stamps_use: AtomicBool,
    /// How the index was rebuilt at open (`RECOVERED_*`), for `describe`.
    recovered_by: AtomicU8,
    /// The tier's capacity in blocks: a journal generation's length.
    capacity_blocks: usize,
    /// The order of this run's stores (see `journal`), set by `recover`
    /// for non-shared, unsealed tiers.
    journal: std::sync::OnceLock<journal::Journal>,
    /// Test seam for a full device where no small file system can be mounted.
    #[cfg(feature = "test-hooks")]
    simulate_full: AtomicBool,
    /// Test seam: storage calls that hang until a test lets them go (shared
    /// with the test, which may let them go after the tier was freed).
    #[cfg(feature = "test-hooks")]
    seam: std::sync::Arc<hang::HangSeam>,
    /// Holds the directory lock for the tier's lifetime, and past it while
    /// storage calls the freed tier left behind are stuck (see
    /// `WatchedIo::left_behind`).
    lock: OwnedFd,
    /// The lock file's identity (device, inode), by which a later open of
    /// the directory in this process recognises a lock held by a tier it
    /// freed; None if it could not be read.
    lock_id: Option<(u64, u64)>,
    /// Set once the tier was freed with calls stuck: listed in
    /// [`LEFT_BEHIND`] until this backend drops.
    listed: AtomicBool,
}

/// Directory locks (by lock file identity) of disk tiers this process freed
/// while storage calls were stuck past their deadline, with how many were:
/// the lock is held until those calls return and the backend drops.
static LEFT_BEHIND: Mutex<Vec<((u64, u64), usize)>> = Mutex::new(Vec::new());

impl Drop for DiskBackend {
    fn drop(&mut self) {
        if self.listed.load(Ordering::Acquire) {
            let mut list = LEFT_BEHIND.lock();
            if let Some(at) = list.iter().position(|&(id, _)| Some(id) == self.lock_id) {
                list.swap_remove(at);
            }
        }
    }
}

impl DiskBackend {
    /// The form this tier writes `key`'s block in. A key too long for a
    /// file name keeps its header in the file: the scan reads the key from
    /// there, and an attribute holds only its hash.
    fn form_for(&self, key: &[u8]) -> Form {
        if self.attr_headers && self.seal.is_none() && key.len() <= layout::LONG_KEY {
            Form::Attr
        } else {
            Form::InFile
        }
    }

    /// Notes that this run changed the fan-out directory holding `path`.
    fn changed(&self, path: &Path) {
        if let Some(dir) = path.parent() {
            self.changed_fan(dir);
        }
    }

    /// Notes that this run changed the fan-out directory `dir`.
    fn changed_fan(&self, dir: &Path) {
        let fan = dir
            .file_name()
            .and_then(|name| name.to_str())
            .and_then(|name| usize::from_str_radix(name, 16).ok());
        match fan {
            Some(fan) if fan < layout::FAN_DIRS && self.changed_fans.len() > fan / 64 => {
                self.changed_fans[fan / 64].fetch_or(1 << (fan % 64), Ordering::Release);
            }
            // Not a fan-out directory of ours: nothing a manifest lists.
            _ => {}
        }
    }

    /// A file the index does not list may stay on disk (see `unindexed`).
    fn left_unindexed(&self) {
        self.unindexed.store(true, Ordering::Relaxed);
    }

    fn path_of(&self, key: &[u8]) -> PathBuf {
        match &self.seal {
            Some(seal) => layout::sealed_block_path(
                &self.ns_dir,
                &seal.name_tag(self.block_fp(), self.block_bytes, key),
            ),
            None => layout::block_path(&self.ns_dir, key),
        }
    }

    /// Whether `path` holds a complete block of `key` that this tier can
    /// read: for a sealed tier, one whose header authenticates as this key's.
    fn published(&self, path: &Path, key: &[u8]) -> bool {
        match &self.seal {
            Some(seal) => self.sealed_present(seal, path, key),
            None => self.unsealed_present(path),
        }
    }

    fn header(&self, key: &[u8], payload: &[u8]) -> Header {
        Header {
            namespace_fp: self.block_fp(),
            payload_len: payload.len() as u64,
            key: key.to_vec(),
            payload_sum: PayloadSum::of(payload),
        }
    }

    /// O_DIRECT can transfer a row in place only if it is aligned.
    fn in_place(&self, row: &[u8]) -> bool {
        self.aligned(row.as_ptr(), row.len())
    }

    fn aligned(&self, ptr: *const u8, len: usize) -> bool {
        self.direct && ptr as usize % ALIGN == 0 && len % ALIGN == 0
    }

    fn exists_complete(&self, path: &Path) -> bool {
        std::fs::symlink_metadata(path)
            .is_ok_and(|m| m.is_file() && Form::of_len(m.len(), self.block_bytes).is_some())
    }

    fn discard_one(&self, key: &[u8], is_live: &dyn Fn(&[u8]) -> bool) {
        let _guard = self.stripes.of(key).lock();
        // A newer store of the key may have published (or be about to publish)
        // the file: then it is not ours to delete.
        if !is_live(key) {
            let path = self.path_of(key);
            self.changed(&path);
            if let Err(e) = std::fs::remove_file(&path) {
                if !io::is_missing(&e) {
                    self.left_unindexed();
                }
            }
            self.ledger.forget(key);
        }
    }
}

impl WatchedIo for DiskBackend {
    fn store_unless(&self, _slot: u32, key: &[u8], block: Row, job: &dyn StoreJob) -> Result<u64> {
        self.store_checked(key, block, job)
    }

    fn auto_io_timeout(&self) -> Option<(u32, String)> {
        Some(self.fs.auto_deadline())
    }

    /// Whole blocks up to 1 MiB; a larger one in 1 MiB pieces: a buffer of
    /// a whole block per thread no longer stays in the L3 cache between the
    /// read and the copy, and smaller pieces pay a read's fixed cost more
    /// often (`kvtier-bench --backend disk --repeat 3 --gib 1`; the runs are
    /// in docs/runs/disk.md).
    fn load_piece_bytes(&self) -> Option<usize> {
        // A sealed block is opened whole (its tag covers all of it).
        self.seal
            .is_none()
            .then(|| PIECE.min(format::padded(self.block_bytes)))
    }

    fn load_streamed(
        &self,
        _slot: u32,
        key: &[u8],
        piece: &mut [u8],
        job: &dyn LoadJob,
    ) -> Result<bool> {
        self.read_streamed(&self.path_of(key), key, piece, job)
    }

    fn left_behind(&self, calls: usize) {
        // The lock stays held: the stuck calls may still write here (a late
        // write's temporary file, its removal), and a new exclusive tier of
        // this directory would take their files for debris and delete them,
        // or have its own blocks deleted by a late discard.
        if let Some(id) = self.lock_id {
            LEFT_BEHIND.lock().push((id, calls));
            self.listed.store(true, Ordering::Release);
        }
    }
}

impl Discards for DiskBackend {
    fn discard(&self, released: &[(u32, Vec<u8>)], is_live: &dyn Fn(&[u8]) -> bool) {
        for (_, key) in released {
            self.discard_one(key, is_live);
        }
    }
}

impl Persistence for DiskBackend {
    fn recover(&self) -> Result<Vec<Vec<u8>>> {
        self.recover_index()
    }

    fn save_on_close(&self, each_block: &mut super::EachBlock<'_>) {
        if !self.manifest_applies() || self.unindexed.load(Ordering::Relaxed) {
            return;
        }
        // Still this directory's only user (the lock is not lost while the
        // descriptor is open, but a manifest is worth one more system call).
        if io::try_flock(&self.lock, true).is_err() {
            return;
        }
        // A failure leaves no manifest: the next open scans.
        let _ = self.write_manifest(each_block);
    }
}

impl Probes for DiskBackend {
    fn read_generation(&self) -> Result<u64> {
        self.read_generation_file()
    }

    fn generation(&self) -> u64 {
        self.current_generation()
    }

    fn use_generation(&self, generation: u64) {
        self.set_generation(generation)
    }

    fn advance_generation(&self) -> Result<u64> {
        self.advance_generation_file()
    }

    fn sweep_before(
        &self,
        generation: u64,
        began: std::time::SystemTime,
        deadline: std::time::Instant,
    ) -> Result<u64> {
        // Names do not carry the generation: what was written before the
        // new one began is the old one's.
        self.sweep_blocks(generation, began, deadline)
    }

    fn probe(&self, key: &[u8], record: &mut dyn FnMut(bool)) {
        // Under the stripe lock, as deletion of this key is: a block seen here
        // is in the index before a deletion checks whether it is live, so a
        // probe can never answer HIT for a file being deleted.
        let _guard = self.stripes.of(key).lock();
        record(self.published(&self.path_of(key), key));
    }
}

#[cfg(feature = "test-hooks")]
impl super::TestSeams for DiskBackend {
    fn simulate_full_device(&self, full: bool) {
        self.simulate_full.store(full, Ordering::Relaxed);
    }

    fn block_path(&self, key: &[u8]) -> Option<PathBuf> {
        Some(self.path_of(key))
    }

    fn hang_seam(&self) -> Option<&std::sync::Arc<hang::HangSeam>> {
        Some(&self.seam)
    }
}

impl Backend for DiskBackend {
    fn store(&self, _slot: u32, key: &[u8], block: &[u8]) -> Result<u64> {
        self.store_checked(key, Row::of(block), &Unwatched)
    }

    fn stores_extents(&self) -> bool {
        // A sealed record's layout is fixed to the block size.
        self.seal.is_none()
    }

    fn seals(&self) -> bool {
        self.seal.is_some()
    }

    fn load(&self, _slot: u32, key: &[u8], dst: &mut [u8]) -> Result<()> {
        let loaded = match &self.seal {
            Some(seal) => self.read_sealed(seal, &self.path_of(key), key, dst),
            None if self.stages_load(dst) => self.read_staged(&self.path_of(key), key, dst),
            None => self.read_verified(&self.path_of(key), key, dst),
        };
        self.read_returned();
        loaded
    }

    fn min_task_bytes(&self) -> usize {
        1
    }

    fn probes(&self) -> Option<&dyn Probes> {
        self.shared.then_some(self)
    }

    fn discards(&self) -> Option<&dyn Discards> {
        Some(self)
    }

    fn persistence(&self) -> Option<&dyn Persistence> {
        Some(self)
    }

    fn watched_io(&self) -> Option<&dyn WatchedIo> {
        Some(self)
    }

    #[cfg(feature = "test-hooks")]
    fn test_seams(&self) -> Option<&dyn super::TestSeams> {
        Some(self)
    }

    fn release_in_forked_child(&self) {
        if let Some(journal) = self.journal.get() {
            journal.stop();
        }
        // The directory lock is a flock on an open file description, which
        // the child's copy of the descriptor shares with the parent. While
        // the child holds it the lock outlives the parent's tier: the parent
        // could not open the directory again after freeing its tier. So the
        // child gives up its reference by pointing the descriptor at
        // /dev/null (dup3 is atomic). Closing it instead would leave `lock`
        // naming a free descriptor number that a later open in the child
        // could get. The parent's lock is untouched while the parent holds
        // its own descriptor.
        // SAFETY: plain descriptor calls on a NUL-terminated path and on our
        // own descriptor; the results are checked.
        unsafe {
            let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
            if null >= 0 {
                libc::dup3(null, self.lock.as_raw_fd(), libc::O_CLOEXEC);
                libc::close(null);
            }
        }
    }

    fn describe(&self) -> String {
        format!(
            "disk: {} ({}{}, {}{}, sync={}, shared={}{}{}){}",
            self.ns_dir.display(),
            self.direct_note,
            if self.stages_blocks() && self.seal.is_none() {
                STAGED_NOTE
            } else {
                ""
            },
            self.header_note,
            if self.spread_fans {
                ", fan-out directories spread over block groups"
            } else {
                ""
            },
            match self.sync {
                SyncMode::None => "none",
                SyncMode::Data => "data",
            },
            self.shared,
            if self.seal.is_some() { ", sealed" } else { "" },
            match self.recovered_by.load(Ordering::Relaxed) {
                RECOVERED_BY_SCAN => ", recovered=scan",
                RECOVERED_BY_HINTED_SCAN => ", recovered=scan ordered by the last close's manifest",
                RECOVERED_BY_JOURNALED_SCAN => ", recovered=scan ordered by the store journal",
                RECOVERED_BY_HINTED_JOURNALED_SCAN => {
                    ", recovered=scan ordered by the last close's manifest and the store journal"
                }
                RECOVERED_FROM_MANIFEST => ", recovered=manifest",
                _ => "",
            },
            match &self.legacy_dir {
                Some(name) => format!(
                    "; {name} beside it is an older kvtier's layout, not read (remove it to free its space)"
                ),
                None => String::new(),
            }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn padded_payload_is_aligned() {
        assert_eq!(format::padded(1), ALIGN);
        assert_eq!(format::padded(ALIGN + 1), 2 * ALIGN);
    }
}
