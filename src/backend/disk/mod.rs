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

// Files: `format` (the block file format and its checksum), `fs_kind` (what
// the directory's file system is: deadline and header choices), `hang` (a test
// seam: storage calls that hang), `io` (the system calls), `layout` (where a key's file lives), `read` (the verified load),
// `recover` (reopening a directory), `manifest` (the index written at a clean
// close, read at the next open), `journal` (the order of stores since, for
// the scan after a crash); this file: opening, storing, deleting.
mod format;
mod fs_kind;
#[cfg(feature = "test-hooks")]
pub(crate) mod hang;
mod io;
mod journal;
mod layout;
mod manifest;
mod read;
mod recover;
mod sealed;

use self::format::{file_len, AttrHeader, Form, Header, ALIGN, ATTR_NAME, HEADER_LEN};
use self::fs_kind::FsKind;
use self::io::Fd;
use self::manifest::Taken;
use self::recover::OrderHint;
use super::checksum::{xxh64, PayloadSum};
use super::{Backend, LoadJob, Row, StoreJob, Unwatched};
use crate::aligned::AlignedBuf;
use crate::config::{BlockHeader, DirectIo, DiskConfig, SyncMode};
use crate::error::{bail, Error, ErrorKind, Result};
use crate::seal::{Nonce, NonceLedger, Sealer};
use crate::sync::Mutex;
use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::time::{Duration, Instant};

/// How long `tier_new` keeps retrying a directory lock that is held (see
/// `DiskBackend::flock_with_grace`) before reporting the directory in use.
const LOCK_GRACE: Duration = Duration::from_millis(300);

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
    ns_fp: u64,
    block_bytes: usize,
    direct: bool,
    direct_note: String,
    /// Block headers go to an extended attribute (format version 3) for
    /// keys that a file name spells; see `format`.
    attr_headers: bool,
    header_note: &'static str,
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
    stripes: Vec<Mutex<()>>,
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
    /// `Backend::left_behind`).
    lock: Fd,
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
    pub(crate) fn open(
        cfg: &DiskConfig,
        namespace: &str,
        block_bytes: usize,
        capacity_blocks: usize,
        seal: Option<Sealer>,
    ) -> Result<DiskBackend> {
        let Some(root) = cfg.path.clone() else {
            bail!(
                Config,
                "path: the disk backend needs a directory (set \"path\")"
            );
        };
        match std::fs::metadata(&root) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => bail!(
                Config,
                "path: {} exists and is not a directory",
                root.display()
            ),
            Err(e) if io::is_missing(&e) => {
                if let Err(e) = io::mkdir(&root) {
                    bail!(
                        Config,
                        "path: cannot create {}: {e} (its parent must exist and be writable)",
                        root.display()
                    );
                }
            }
            Err(e) => bail!(Config, "path: cannot use {}: {e}", root.display()),
        }
        let ns_dir = root.join(layout::namespace_dir(namespace, block_bytes));
        let legacy = layout::legacy_namespace_dir(namespace, block_bytes);
        let legacy_dir = root.join(&legacy).is_dir().then_some(legacy);
        match io::mkdir(&ns_dir) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {}
            Err(e) => bail!(Config, "path: cannot create {}: {e}", ns_dir.display()),
        }
        let lock = Self::lock_dir(&ns_dir, cfg.shared)?;
        if cfg.prepare_dirs {
            Self::prepare_fan_dirs(&ns_dir)?;
        }
        let (direct, direct_note) = Self::choose_direct_io(&ns_dir, cfg.direct_io)?;
        let fs = io::fs_type(&ns_dir).map(FsKind::of);
        let (attr_headers, header_note) =
            Self::choose_block_header(&ns_dir, cfg.block_header, &fs)?;
        Ok(DiskBackend {
            ns_fp: layout::namespace_fingerprint(namespace),
            ns_dir,
            block_bytes,
            direct,
            direct_note,
            attr_headers,
            header_note,
            fs: fs.unwrap_or_else(|_| FsKind::unreadable()),
            legacy_dir,
            sync: cfg.sync,
            shared: cfg.shared,
            seal,
            ledger: NonceLedger::new(),
            stripes: (0..STRIPES).map(|_| Mutex::new(())).collect(),
            tmp_counter: AtomicU64::new(0),
            pid: std::process::id(),
            changed_fans: (0..layout::FAN_DIRS / 64)
                .map(|_| AtomicU64::new(0))
                .collect(),
            unindexed: AtomicBool::new(false),
            recovered_by: AtomicU8::new(RECOVERED_NOT_YET),
            capacity_blocks,
            journal: std::sync::OnceLock::new(),
            #[cfg(feature = "test-hooks")]
            simulate_full: AtomicBool::new(false),
            #[cfg(feature = "test-hooks")]
            seam: Default::default(),
            lock_id: io::fstat(&lock).ok().map(|id| (id.dev, id.ino)),
            lock,
            listed: AtomicBool::new(false),
        })
    }

    /// One exclusive user, or any number of shared users, per namespace dir:
    /// two exclusive tiers would delete each other's files as "debris".
    fn lock_dir(ns_dir: &Path, shared: bool) -> Result<Fd> {
        let path = ns_dir.join(".lock");
        let fd = match io::open(&path, libc::O_RDWR | libc::O_CREAT, 0o600) {
            Ok(fd) => fd,
            Err(e) if io::is_resource_shortage(&e) => {
                bail!(Io, "cannot open {}: {e}", path.display())
            }
            Err(e) => bail!(Config, "path: cannot open {}: {e}", path.display()),
        };
        if let Err(e) = Self::flock_with_grace(&fd, !shared) {
            if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
                if let Some(calls) = Self::held_by_freed_tier(&fd) {
                    bail!(
                        Io,
                        "path: {} is still in use by a kvtier tier this process freed while \
                         {calls} I/O {} stuck past io_timeout_ms (a hung device): it may \
                         still write there, so it keeps the directory locked until {} \
                         return; retry once the device recovers",
                        ns_dir.display(),
                        if calls == 1 { "call was" } else { "calls were" },
                        if calls == 1 { "that call" } else { "they" }
                    );
                }
                bail!(
                    Config,
                    "path: {} is in use by another kvtier tier{}",
                    ns_dir.display(),
                    if shared {
                        " opened with shared=false"
                    } else {
                        " (open every user with shared=true to share it)"
                    }
                );
            }
            bail!(Config, "path: cannot lock {}: {e}", path.display());
        }
        Ok(fd)
    }

    /// How many calls were stuck when this process freed the tier that holds
    /// the lock on `fd`'s file, if one did.
    fn held_by_freed_tier(fd: &Fd) -> Option<usize> {
        let id = io::fstat(fd).ok()?;
        let list = LEFT_BEHIND.lock();
        list.iter()
            .find(|&&(held, _)| held == (id.dev, id.ino))
            .map(|&(_, calls)| calls)
    }

    /// Takes the directory lock, retrying for [`LOCK_GRACE`] while it is
    /// held. The lock belongs to an open file description, which every
    /// `fork` copies: a process that spawns a helper (`posix_spawn`,
    /// Python's `subprocess`) just as a tier of the same directory is freed
    /// leaves the lock held by the child until its `exec` closes the
    /// descriptor (`O_CLOEXEC`). A reopen in that window is not a second
    /// user; a real one still holds the lock after the grace period.
    fn flock_with_grace(fd: &Fd, exclusive: bool) -> std::io::Result<()> {
        let deadline = Instant::now() + LOCK_GRACE;
        loop {
            match io::try_flock(fd, exclusive) {
                Err(e)
                    if e.raw_os_error() == Some(libc::EWOULDBLOCK) && Instant::now() < deadline =>
                {
                    std::thread::sleep(Duration::from_millis(5));
                }
                other => return other,
            }
        }
    }

    /// Creates every fan-out directory that does not exist yet, so no store
    /// pays for a mkdir.
    fn prepare_fan_dirs(ns_dir: &Path) -> Result<()> {
        for i in 0..layout::FAN_DIRS {
            let dir = ns_dir.join(layout::fan_name(i));
            match io::mkdir(&dir) {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {}
                Err(e) => bail!(Config, "prepare_dirs: cannot create {}: {e}", dir.display()),
            }
        }
        Ok(())
    }

    /// Writes one aligned page with O_DIRECT to see whether the file system
    /// accepts it (tmpfs on old kernels, overlayfs and some NFS setups do not).
    fn choose_direct_io(ns_dir: &Path, policy: DirectIo) -> Result<(bool, String)> {
        if policy == DirectIo::Off {
            return Ok((false, "o_direct=off: buffered I/O".into()));
        }
        let probe = ns_dir.join(format!(".odirect-probe.{}", std::process::id()));
        let _ = std::fs::remove_file(&probe);
        let outcome = io::create_exclusive(&probe, true).and_then(|fd| {
            let page = AlignedBuf::new(ALIGN)?;
            io::write_all_at(&fd, &[page.as_slice()], 0)
        });
        let _ = std::fs::remove_file(&probe);
        match (outcome, policy) {
            (Ok(()), _) => Ok((true, "O_DIRECT: page cache bypassed".into())),
            // Says nothing about O_DIRECT: do not settle for buffered I/O.
            (Err(e), _) if io::is_resource_shortage(&e) => {
                bail!(Io, "cannot probe O_DIRECT in {}: {e}", ns_dir.display())
            }
            (Err(e), DirectIo::On) => {
                bail!(
                    Config,
                    "o_direct=on: {} does not support O_DIRECT: {e}",
                    ns_dir.display()
                )
            }
            (Err(e), _) => Ok((
                false,
                format!("o_direct=auto: O_DIRECT refused ({e}); buffered I/O"),
            )),
        }
    }

    /// Where block headers go. `auto` puts them in an extended attribute on
    /// a local file system that keeps user attributes: on a network file
    /// system reading one is a round trip of its own, which would cost more
    /// than the file block it saves.
    fn choose_block_header(
        ns_dir: &Path,
        policy: BlockHeader,
        fs: &std::io::Result<FsKind>,
    ) -> Result<(bool, &'static str)> {
        const IN_FILE: &str = "headers in the files";
        const IN_ATTR: &str = "headers in xattrs";
        if policy == BlockHeader::File {
            return Ok((false, IN_FILE));
        }
        if policy == BlockHeader::Auto {
            match fs {
                Ok(kind) if kind.is_remote() => {
                    return Ok((false, "headers in the files (a network file system)"))
                }
                Ok(_) => {}
                Err(e) => bail!(Io, "cannot statfs {}: {e}", ns_dir.display()),
            }
        }
        let probe = ns_dir.join(format!(".xattr-probe.{}", std::process::id()));
        let _ = std::fs::remove_file(&probe);
        let outcome = io::create_exclusive(&probe, false)
            .and_then(|fd| io::set_attr(&fd, ATTR_NAME, &[0u8; format::ATTR_LEN]));
        let _ = std::fs::remove_file(&probe);
        match (outcome, policy) {
            (Ok(()), _) => Ok((true, IN_ATTR)),
            (Err(e), BlockHeader::Auto) if io::is_attr_unsupported(&e) => {
                Ok((false, "headers in the files (no user xattrs here)"))
            }
            (Err(e), BlockHeader::Xattr) if io::is_attr_unsupported(&e) => bail!(
                Config,
                "block_header=xattr: {} keeps no user extended attributes: {e}",
                ns_dir.display()
            ),
            (Err(e), _) => bail!(
                Io,
                "cannot probe extended attributes in {}: {e}",
                ns_dir.display()
            ),
        }
    }

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

    fn stripe(&self, key: &[u8]) -> &Mutex<()> {
        &self.stripes[xxh64(key, 2) as usize % STRIPES]
    }

    fn path_of(&self, key: &[u8]) -> PathBuf {
        match &self.seal {
            Some(seal) => layout::sealed_block_path(
                &self.ns_dir,
                &seal.name_tag(self.ns_fp, self.block_bytes, key),
            ),
            None => layout::block_path(&self.ns_dir, key),
        }
    }

    /// Whether `path` holds a complete block of `key` that this tier can
    /// read: for a sealed tier, one whose header authenticates as this key's.
    fn published(&self, path: &Path, key: &[u8]) -> bool {
        match &self.seal {
            Some(seal) => self.sealed_present(seal, path, key),
            None => self.exists_complete(path),
        }
    }

    fn header(&self, key: &[u8], payload: &[u8]) -> Header {
        Header {
            namespace_fp: self.ns_fp,
            payload_len: self.block_bytes as u64,
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

    /// Writes the block file; for a sealed tier, returns the nonce it sealed
    /// with. `None` means the job was reported before its row was read:
    /// nothing is to be published. Also returns the file's identity, taken
    /// by `fstat` once it is created (cheaper than an
    /// `lstat` of its path), so that a rename withdrawn later can tell
    /// whether the path still names this file. The file is closed here,
    /// before it is published: on NFS, `close` is where written data
    /// reaches the server, so another client must not find the name first.
    ///
    /// The row is the caller's and this call may outlive the tier (see
    /// `Backend::store_unless`), so it is read from user space (checksum,
    /// copy, sealing) only inside `job.read_row`, after the file is created
    /// (an `open` on a hung mount is where a store waits longest) and into
    /// this thread's scratch. Only an aligned row under O_DIRECT is written
    /// from where it is, by the kernel, and only if the job was not reported
    /// by the time the file was created: a write left behind by `tier_free`
    /// gets EFAULT if the caller unmapped the row (never a fault here), and
    /// its file is never published and is removed when the call returns.
    fn write_tmp(
        &self,
        tmp: &Path,
        key: &[u8],
        row: Row,
        job: &dyn StoreJob,
    ) -> std::io::Result<(io::FileId, Option<Option<Nonce>>)> {
        let fd = match io::create_exclusive(tmp, self.direct) {
            Err(e) if io::is_missing(&e) => {
                let dir = tmp.parent().expect("fan-out dir");
                match io::mkdir(dir) {
                    Err(e) if e.raw_os_error() != Some(libc::EEXIST) => return Err(e),
                    _ => io::create_exclusive(tmp, self.direct)?,
                }
            }
            other => other?,
        };
        let ours = io::fstat(&fd)?;
        #[cfg(feature = "test-hooks")]
        self.seam.pause(hang::HangPoint::Create);
        #[cfg(feature = "test-hooks")]
        if self.simulate_full.load(Ordering::Relaxed) {
            return Err(std::io::Error::from_raw_os_error(libc::ENOSPC));
        }
        let in_place = self.seal.is_none() && self.aligned(row.as_ptr(), row.len());
        if self.form_for(key) == Form::Attr {
            let written = self.write_attr_form(&fd, key, row, job, in_place)?;
            return Ok((ours, written));
        }
        let staged_len = if in_place {
            HEADER_LEN
        } else {
            file_len(self.block_bytes)
        };
        let nonce = with_scratch(staged_len, |buf| {
            let mut staged = Ok(None);
            let read = job.read_row(row, &mut |row| {
                staged = match &self.seal {
                    Some(seal) => self.seal_into(seal, buf, key, row).map(Some),
                    None => {
                        let (h, payload) = buf.split_at_mut(HEADER_LEN);
                        self.header(key, row).encode(h);
                        if !in_place {
                            payload[..row.len()].copy_from_slice(row);
                            payload[row.len()..].fill(0);
                        }
                        Ok(None)
                    }
                };
            });
            if !read {
                return Ok(None);
            }
            let nonce = staged?;
            if in_place {
                io::write_header_and_row(&fd, buf, row.as_ptr(), row.len(), 0)?;
            } else {
                io::write_all_at(&fd, &[buf], 0)?;
            }
            Ok(Some(nonce))
        })?;
        if nonce.is_some() && self.sync == SyncMode::Data {
            io::fdatasync(&fd)?;
        }
        Ok((ours, nonce))
    }

    /// `write_tmp` for a block whose header is the file's attribute: the
    /// file holds the padded payload alone, written from the row in place
    /// when O_DIRECT allows, else from this thread's scratch. The header's
    /// checksum is taken inside `job.read_row`: in place, after the write,
    /// as the header is written last anyway, so the device starts on the
    /// payload a hash earlier. On a loop device (whose driver copies the
    /// row on this machine's CPU), 2 MiB stores through vLLM ran 0.80–0.91×
    /// vLLM's fs tier hashing first and 0.92–1.01× hashing after (six
    /// alternating rounds each); the process's CPU per GB hardly moved, so
    /// it is the overlap that improved, not the hash. 64 KiB stores did not
    /// change. A row changed while its store is in flight (which the
    /// contract forbids) fails its checksum on load, in either order.
    fn write_attr_form(
        &self,
        fd: &Fd,
        key: &[u8],
        row: Row,
        job: &dyn StoreJob,
        in_place: bool,
    ) -> std::io::Result<Option<Option<Nonce>>> {
        // `staged`: the scratch the payload is copied into, or None to
        // write the row in place.
        let write = |mut staged: Option<&mut [u8]>| -> std::io::Result<bool> {
            if staged.is_none() {
                // A job reported while the file was created (a hung open)
                // has its row back with the caller: the kernel must not read
                // it either.
                if job.abandoned() {
                    return Ok(false);
                }
                io::write_row(fd, row.as_ptr(), row.len(), 0)?;
            }
            let mut header = None;
            let read = job.read_row(row, &mut |row| {
                header = Some(AttrHeader::of(self.ns_fp, key, row).encode());
                if let Some(buf) = staged.as_deref_mut() {
                    buf[..row.len()].copy_from_slice(row);
                    buf[row.len()..].fill(0);
                }
            });
            let Some(header) = header.filter(|_| read) else {
                return Ok(false);
            };
            if let Some(buf) = staged {
                io::write_all_at(fd, &[buf], 0)?;
            }
            io::set_attr(fd, ATTR_NAME, &header)?;
            Ok(true)
        };
        let written = if in_place {
            write(None)?
        } else {
            with_scratch(Form::Attr.file_len(self.block_bytes), |buf| {
                write(Some(buf))
            })?
        };
        // The header is metadata: fsync, where fdatasync might leave it out.
        if written && self.sync == SyncMode::Data {
            io::fsync(fd)?;
        }
        Ok(written.then_some(None))
    }
}

impl DiskBackend {
    /// Stores a block: writes a temporary file and publishes it by rename,
    /// unless `job.abandoned()` says the job was reported failed meanwhile (a
    /// storage call missed its deadline). The check and the rename are under
    /// the key's stripe lock; a rename that was already under way when the
    /// job was reported is withdrawn when it returns (the file removed if the
    /// path still names it, never a file published since), so the index
    /// never lists it and no later store is overwritten. The row is read
    /// only as `write_tmp` says; a call that returns after `tier_free` reads
    /// nothing of it, publishes nothing and removes its temporary file (or
    /// the next open does, if the call never returns).
    fn store_checked(&self, key: &[u8], block: Row, job: &dyn StoreJob) -> Result<u64> {
        let path = self.path_of(key);
        // Another process may have published this key already.
        if self.shared && self.published(&path, key) {
            return Ok(0);
        }
        let n = self.tmp_counter.fetch_add(1, Ordering::Relaxed);
        let tmp = layout::tmp_path(&path, self.pid, n);
        self.changed(&path);
        let written = self.write_tmp(&tmp, key, block, job);
        #[cfg(feature = "test-hooks")]
        self.seam.pause(hang::HangPoint::Write);
        let mut withdrawn = false;
        let published = written.and_then(|(ours, nonce)| {
            let _guard = self.stripe(key).lock();
            // `None`: reported before its row was read, nothing written.
            let Some(nonce) = nonce.filter(|_| !job.abandoned()) else {
                withdrawn = true;
                return Err(std::io::Error::from(std::io::ErrorKind::TimedOut));
            };
            std::fs::rename(&tmp, &path)?;
            #[cfg(feature = "test-hooks")]
            self.seam.pause(hang::HangPoint::Publish);
            if job.abandoned() {
                withdrawn = true;
                if io::lstat(&path).is_ok_and(|now| now.same_file(&ours))
                    && std::fs::remove_file(&path).is_err()
                {
                    self.left_unindexed();
                }
                return Err(std::io::Error::from(std::io::ErrorKind::TimedOut));
            }
            if let Some(nonce) = nonce {
                self.ledger.record(key, nonce);
            }
            Ok(())
        });
        if let Err(e) = published {
            if let Err(e) = std::fs::remove_file(&tmp) {
                if !io::is_missing(&e) {
                    self.left_unindexed();
                }
            }
            if withdrawn || job.abandoned() {
                bail!(
                    Io,
                    "{}: not published: the job was reported failed at its I/O deadline",
                    path.display()
                );
            }
            if e.kind() == std::io::ErrorKind::OutOfMemory {
                bail!(Alloc, "cannot store {}: {e}", path.display());
            }
            let what = if io::is_full(&e) {
                "no space to store"
            } else {
                "cannot store"
            };
            bail!(Io, "{what} {}: {e}", path.display());
        }
        if let Some(journal) = self.journal.get() {
            journal.record(key);
        }
        if self.sync == SyncMode::Data {
            if let Err(e) = io::sync_dir(path.parent().expect("fan-out dir")) {
                bail!(Io, "cannot sync directory of {}: {e}", path.display());
            }
        }
        Ok(self.block_bytes as u64)
    }
}

impl DiskBackend {
    /// Starts this run's store journal (non-shared, unsealed tiers), going
    /// on with the one a crashed run left; returns that one's keys, oldest
    /// first (empty if there is none).
    fn start_journal(&self) -> Vec<Vec<u8>> {
        if !self.manifest_applies() {
            return Vec::new();
        }
        let head = journal::head(self.ns_fp, self.block_bytes);
        let found = journal::read(&self.ns_dir, &head);
        let opened = journal::Journal::open(&self.ns_dir, head, self.capacity_blocks, &found);
        if let Some(journal) = opened {
            let _ = self.journal.set(journal);
        }
        found.keys
    }

    fn discard_one(&self, key: &[u8], is_live: &dyn Fn(&[u8]) -> bool) {
        let _guard = self.stripe(key).lock();
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

impl Backend for DiskBackend {
    fn store(&self, _slot: u32, key: &[u8], block: &[u8]) -> Result<u64> {
        self.store_checked(key, Row::of(block), &Unwatched)
    }

    fn store_unless(&self, _slot: u32, key: &[u8], block: Row, job: &dyn StoreJob) -> Result<u64> {
        self.store_checked(key, block, job)
    }

    fn needs_watchdog(&self) -> bool {
        true
    }

    fn auto_io_timeout(&self) -> Option<(u32, String)> {
        Some(self.fs.auto_deadline())
    }

    fn load(&self, _slot: u32, key: &[u8], dst: &mut [u8]) -> Result<()> {
        let loaded = match &self.seal {
            Some(seal) => self.read_sealed(seal, &self.path_of(key), key, dst),
            None => self.read_verified(&self.path_of(key), key, dst),
        };
        self.read_returned();
        loaded
    }

    /// Whole blocks up to 1 MiB; a larger one in 1 MiB pieces: a buffer of
    /// a whole block per thread no longer stays in the L3 cache between the
    /// read and the copy, and smaller pieces pay a read's fixed cost more
    /// often (`kvtier-bench --backend disk --repeat 3 --gib 1`; the runs are
    /// in docs/runs/disk.md).
    fn load_piece_bytes(&self) -> Option<usize> {
        const PIECE: usize = 1 << 20;
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

    fn wants_discards(&self) -> bool {
        true
    }

    fn discard(&self, released: &[(u32, Vec<u8>)], is_live: &dyn Fn(&[u8]) -> bool) {
        for (_, key) in released {
            self.discard_one(key, is_live);
        }
    }

    fn recover(&self) -> Result<Vec<Vec<u8>>> {
        // Whether used or not, the manifest is gone from disk before the
        // tier accepts a store (and with it any journal older than it).
        let taken = self.take_manifest();
        // Empty after a manifest (an open that finds one deletes the
        // journals); else the stores since, newer than any hint's order.
        let journaled = self.start_journal();
        let (mut order, hinted) = match taken {
            Taken::Trusted(keys) => {
                self.recovered_by
                    .store(RECOVERED_FROM_MANIFEST, Ordering::Relaxed);
                return Ok(keys);
            }
            Taken::Hint(keys) => (keys, true),
            Taken::Nothing => (Vec::new(), false),
        };
        let how = match (hinted, !journaled.is_empty()) {
            (false, false) => RECOVERED_BY_SCAN,
            (true, false) => RECOVERED_BY_HINTED_SCAN,
            (false, true) => RECOVERED_BY_JOURNALED_SCAN,
            (true, true) => RECOVERED_BY_HINTED_JOURNALED_SCAN,
        };
        order.extend(journaled);
        let hint = (how != RECOVERED_BY_SCAN).then(|| OrderHint::new(order));
        let keys = self.scan(hint)?;
        self.recovered_by.store(how, Ordering::Relaxed);
        Ok(keys)
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

    fn probes_absent_keys(&self) -> bool {
        self.shared
    }

    fn probe(&self, key: &[u8], record: &mut dyn FnMut(bool)) {
        // Under the stripe lock, as deletion of this key is: a block seen here
        // is in the index before a deletion checks whether it is live, so a
        // probe can never answer HIT for a file being deleted.
        let _guard = self.stripe(key).lock();
        record(self.published(&self.path_of(key), key));
    }

    fn min_task_bytes(&self) -> usize {
        1
    }

    #[cfg(feature = "test-hooks")]
    fn simulate_full_device(&self, full: bool) {
        self.simulate_full.store(full, Ordering::Relaxed);
    }

    #[cfg(feature = "test-hooks")]
    fn block_path(&self, key: &[u8]) -> Option<PathBuf> {
        Some(self.path_of(key))
    }

    #[cfg(feature = "test-hooks")]
    fn hang_seam(&self) -> Option<&std::sync::Arc<hang::HangSeam>> {
        Some(&self.seam)
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
                libc::dup3(null, self.lock.raw(), libc::O_CLOEXEC);
                libc::close(null);
            }
        }
    }

    fn describe(&self) -> String {
        format!(
            "disk: {} ({}, {}, sync={}, shared={}{}{}){}",
            self.ns_dir.display(),
            self.direct_note,
            self.header_note,
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
