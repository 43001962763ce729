//! Opening a disk tier: the directory checked and locked, O_DIRECT and
//! extended attributes probed, and the hand-off to recovery (manifest, journal,
//! scan); kept apart from the store path so each reads on its own.

use super::format::{self, ALIGN, ATTR_NAME};
use super::fs_kind::FsKind;
use super::io;
use super::manifest::Taken;
use super::recover::OrderHint;
use super::{
    journal, layout, DiskBackend, LEFT_BEHIND, PIECE, RECOVERED_BY_HINTED_JOURNALED_SCAN,
    RECOVERED_BY_HINTED_SCAN, RECOVERED_BY_JOURNALED_SCAN, RECOVERED_BY_SCAN,
    RECOVERED_FROM_MANIFEST, RECOVERED_NOT_YET, STRIPES,
};
use crate::aligned::AlignedBuf;
use crate::backend::SharedTenant;
use crate::config::{BlockHeader, DirectIo, DiskConfig};
use crate::error::{bail, Result};
use crate::seal::{NonceLedger, Sealer};
use crate::striped::Striped;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::time::{Duration, Instant};

/// How long `tier_new` keeps retrying a directory lock that is held (see
/// `DiskBackend::flock_with_grace`) before reporting the directory in use.
const LOCK_GRACE: Duration = Duration::from_millis(300);

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
        Self::record_identity(&ns_dir, namespace);
        let fs = io::fs_type(&ns_dir).map(FsKind::of);
        // A new file's inode goes in its directory's block group, and ext4
        // without a journal steps over every inode deleted there in the
        // last minutes before it reuses one: fan-out directories in groups
        // of their own spread that cost, where in the group of the
        // directory the caller chose they share it with everything there.
        // Blocks over a piece are too few a GB for that walk to matter, while
        // spread, each file's directory and inode blocks sit in a group of
        // their own, more device requests to read and write
        // (docs/performance.md): they stay.
        let spread_fans = format::padded(block_bytes) <= PIECE
            && fs.as_ref().is_ok_and(FsKind::spreads_subdirs)
            && io::spread_subdirs(&ns_dir).is_ok();
        if cfg.prepare_dirs {
            Self::prepare_fan_dirs(&ns_dir)?;
        }
        let (direct, direct_note) = Self::choose_direct_io(&ns_dir, cfg.direct_io)?;
        let (attr_headers, header_note) =
            Self::choose_block_header(&ns_dir, cfg.block_header, &fs)?;
        let ns_fp = layout::namespace_fingerprint(namespace);
        Ok(DiskBackend {
            ns_fp,
            generation: AtomicU64::new(0),
            generation_fp: AtomicU64::new(ns_fp),
            tenant: SharedTenant::of(seal.as_ref(), ns_fp, block_bytes),
            ns_dir,
            block_bytes,
            direct,
            direct_note,
            attr_headers,
            header_note,
            spread_fans,
            fs: fs.unwrap_or_else(|_| FsKind::unreadable()),
            legacy_dir,
            sync: cfg.sync,
            shared: cfg.shared,
            seal,
            ledger: NonceLedger::new(),
            stripes: Striped::new(STRIPES, 2, || ()),
            tmp_counter: AtomicU64::new(0),
            pid: std::process::id(),
            changed_fans: (0..layout::FAN_DIRS / 64)
                .map(|_| AtomicU64::new(0))
                .collect(),
            unindexed: AtomicBool::new(false),
            stamps_use: AtomicBool::new(true),
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
    fn lock_dir(ns_dir: &Path, shared: bool) -> Result<OwnedFd> {
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
    fn held_by_freed_tier(fd: &OwnedFd) -> Option<usize> {
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
    fn flock_with_grace(fd: &OwnedFd, exclusive: bool) -> std::io::Result<()> {
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

    /// Writes the namespace's whole name beside its blocks (the directory's
    /// name keeps 40 characters of it and a fingerprint), so that `kvtier
    /// inspect` can name it for an operator who clears it; best effort, and
    /// only when it is missing or says otherwise.
    fn record_identity(ns_dir: &Path, namespace: &str) {
        let path = ns_dir.join(layout::IDENTITY_FILE);
        if namespace.is_empty()
            || io::read_regular(&path).is_ok_and(|known| known == namespace.as_bytes())
        {
            return;
        }
        let tmp = ns_dir.join(format!(
            "{}.{}{}",
            layout::IDENTITY_FILE,
            std::process::id(),
            layout::TMP_EXT
        ));
        let written = std::fs::write(&tmp, namespace).and_then(|()| std::fs::rename(&tmp, &path));
        if written.is_err() {
            let _ = std::fs::remove_file(&tmp);
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

    /// Rebuilds the index at open: from the manifest, else by a scan in the
    /// order of the hint and the journal (`Persistence::recover`).
    pub(super) fn recover_index(&self) -> Result<Vec<Vec<u8>>> {
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
}
