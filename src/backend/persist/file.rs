//! The persistent arena's file: where it lives (one file per namespace in
//! the `persist_path` directory, on tmpfs or hugetlbfs), its lock, its header
//! (the identity a reopen checks) and its mapping.
//!
//! Layout (format 1, little-endian):
//!
//! - bytes 0..8192, the header: magic `KVTIERMA`, format version, block
//!   size, slot count, where the records and the data start, the file's
//!   size, the namespace's fingerprint and length, an XXH64 check over all
//!   of those and the namespace; at byte 128 the clock (the last stamp
//!   handed out); at byte 4096 the namespace itself (up to 4096 bytes);
//! - from byte 8192, one 192-byte record per slot (`record.rs`);
//! - from the next 2 MiB boundary (or huge page), the blocks, one per slot.
//!
//! A file is made whole under a temporary name and renamed into place, so a
//! file under the arena's name always has a complete header. Every change
//! of the file as a whole happens under `<name>.lock`, an `flock` held for
//! the tier's life: one process at a time.

use super::record::RECORD_BYTES;
use crate::checksum::{namespace_fingerprint, xxh64};
use crate::error::{bail, Result};
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::time::{Duration, Instant};

const MAGIC: [u8; 8] = *b"KVTIERMA";
/// The format this build writes and reads.
pub(super) const VERSION: u32 = 1;
const HEADER_BYTES: usize = 8192;
const CHECK_AT: usize = 80;
pub(super) const CLOCK_AT: usize = 128;
const NAMESPACE_AT: usize = 4096;
const CHECK_SEED: u64 = 0x006b_7661_7265_6e61;
/// Blocks start on a 2 MiB boundary, so a file system that backs the arena
/// with huge pages maps each 2 MiB block with one.
const DATA_ALIGN: usize = 2 << 20;

const TMPFS_MAGIC: i64 = 0x0102_1994;
const HUGETLBFS_MAGIC: i64 = 0x9584_58f6;

/// How long `tier_new` retries a held lock: a process that forks (Python's
/// `subprocess`) just as the previous tier is freed leaves the lock's
/// descriptor in the child until its `exec` closes it (`O_CLOEXEC`).
const LOCK_GRACE: Duration = Duration::from_millis(300);

/// Where everything is in the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Geometry {
    pub block_bytes: usize,
    pub slots: usize,
    pub records_at: usize,
    pub data_at: usize,
    pub file_bytes: usize,
}

impl Geometry {
    /// `page`: the file system's page (a huge page on hugetlbfs).
    fn new(block_bytes: usize, slots: usize, page: usize) -> Result<Geometry> {
        let align = DATA_ALIGN.max(page);
        let sizes = (|| {
            let records_end = slots.checked_mul(RECORD_BYTES)?.checked_add(HEADER_BYTES)?;
            let data_at = records_end.checked_next_multiple_of(align)?;
            let data = block_bytes.checked_mul(slots)?;
            let file_bytes = data_at.checked_add(data)?.checked_next_multiple_of(align)?;
            (file_bytes <= isize::MAX as usize / 2).then_some((data_at, file_bytes))
        })();
        let Some((data_at, file_bytes)) = sizes else {
            bail!(Config, "capacity_bytes: {slots} blocks of {block_bytes} bytes do not fit in the address space");
        };
        Ok(Geometry {
            block_bytes,
            slots,
            records_at: HEADER_BYTES,
            data_at,
            file_bytes,
        })
    }
}

/// How the file came to be what the tier uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Opened {
    Created,
    Reopened,
    /// Another arena of this namespace was there, and why it was not used.
    Reset(String),
}

/// The open, locked and mapped arena file.
pub(super) struct ArenaFile {
    pub path: PathBuf,
    pub geometry: Geometry,
    pub opened: Opened,
    pub fs_name: &'static str,
    base: NonNull<u8>,
    file: File,
    /// Held (`flock`, exclusive) until dropped.
    lock: File,
}

impl ArenaFile {
    /// Opens (or makes) the arena of `namespace` in `dir` for `slots` blocks
    /// of `block_bytes`, locked for this process.
    pub(super) fn open(
        dir: &Path,
        namespace: &str,
        block_bytes: usize,
        slots: usize,
    ) -> Result<ArenaFile> {
        ensure_dir(dir)?;
        let (fs_name, page) = memory_fs(dir)?;
        let geometry = Geometry::new(block_bytes, slots, page)?;
        let name = format!("{:016x}", namespace_fingerprint(namespace));
        let path = dir.join(format!("{name}.arena"));
        let lock = lock(&dir.join(format!("{name}.lock")), &path)?;
        let tmp = dir.join(format!("{name}.arena.tmp"));
        // Left by a creation cut short; under the lock nobody else makes one.
        let _ = std::fs::remove_file(&tmp);
        let existing = match OpenOptions::new().read(true).write(true).open(&path) {
            Ok(file) => Some(file),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => bail!(Config, "persist_path: cannot open {}: {e}", path.display()),
        };
        let (file, opened) = match existing {
            Some(file) => match judge(&file, &path, &geometry, namespace, page)? {
                None => (file, Opened::Reopened),
                Some(why) => (
                    create(&tmp, &path, &geometry, namespace)?,
                    Opened::Reset(why),
                ),
            },
            None => (create(&tmp, &path, &geometry, namespace)?, Opened::Created),
        };
        let base = map(&file, geometry.file_bytes, &path)?;
        Ok(ArenaFile {
            path,
            geometry,
            opened,
            fs_name,
            base,
            file,
            lock,
        })
    }

    /// The start of the mapped file.
    pub(super) fn base(&self) -> *mut u8 {
        self.base.as_ptr()
    }

    pub(super) fn fd(&self) -> std::os::fd::RawFd {
        self.file.as_raw_fd()
    }

    /// Bytes of memory the file holds (its allocated pages, header included).
    pub(super) fn allocated_bytes(&self) -> u64 {
        use std::os::unix::fs::MetadataExt;
        self.file.metadata().map_or(0, |m| m.blocks() * 512)
    }

    /// In a forked child: gives up the child's share of the lock (the
    /// descriptor is pointed at /dev/null, atomically; closing it would
    /// leave a descriptor number a later `open` could get), so that the lock
    /// dies with the parent's tier, as the disk backend's does.
    pub(super) fn release_lock_in_forked_child(&self) {
        // SAFETY: plain descriptor calls on a NUL-terminated path and on our
        // own descriptor.
        unsafe {
            let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
            if null >= 0 {
                libc::dup3(null, self.lock.as_raw_fd(), libc::O_CLOEXEC);
                libc::close(null);
            }
        }
    }
}

impl Drop for ArenaFile {
    fn drop(&mut self) {
        // SAFETY: our own mapping; its users (the backend's workers and
        // populator) are gone before the backend drops this.
        unsafe {
            libc::munmap(
                self.base.as_ptr() as *mut libc::c_void,
                self.geometry.file_bytes,
            )
        };
    }
}

fn ensure_dir(dir: &Path) -> Result<()> {
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => bail!(
            Config,
            "persist_path: {} exists and is not a directory",
            dir.display()
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            match std::fs::DirBuilder::new().mode(0o700).create(dir) {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
                Err(e) => bail!(
                    Config,
                    "persist_path: cannot create {}: {e} (its parent must exist and be writable)",
                    dir.display()
                ),
            }
        }
        Err(e) => bail!(Config, "persist_path: cannot use {}: {e}", dir.display()),
    }
}

/// The file system's name and page size, if it keeps files in memory.
fn memory_fs(dir: &Path) -> Result<(&'static str, usize)> {
    let Ok(cpath) = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()) else {
        bail!(Config, "persist_path: {} holds a NUL byte", dir.display());
    };
    // SAFETY: a plain C struct of integers, for which zero is valid.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: statfs fills `st`; the path is NUL-terminated.
    if unsafe { libc::statfs(cpath.as_ptr(), &mut st) } != 0 {
        let e = std::io::Error::last_os_error();
        bail!(Config, "persist_path: cannot statfs {}: {e}", dir.display());
    }
    match st.f_type as i64 {
        TMPFS_MAGIC => Ok(("tmpfs", 4096)),
        HUGETLBFS_MAGIC => Ok(("hugetlbfs", (st.f_bsize as usize).max(4096))),
        other => bail!(
            Config,
            "persist_path: {} is not on tmpfs or hugetlbfs (file system type {other:#x}): \
             the arena would be written back to a device; use a directory in /dev/shm or on \
             a hugetlbfs mount (or backend=disk for a device)",
            dir.display()
        ),
    }
}

fn lock(lock_path: &Path, arena: &Path) -> Result<File> {
    let file = match OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(lock_path)
    {
        Ok(file) => file,
        Err(e) => bail!(
            Config,
            "persist_path: cannot open {}: {e}",
            lock_path.display()
        ),
    };
    let deadline = Instant::now() + LOCK_GRACE;
    loop {
        // SAFETY: a plain system call on our own descriptor.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Ok(file);
        }
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EWOULDBLOCK) {
            bail!(
                Config,
                "persist_path: cannot lock {}: {e}",
                lock_path.display()
            );
        }
        if Instant::now() >= deadline {
            bail!(
                Config,
                "persist_path: {} is in use by another kvtier tier (an arena belongs to one \
                 process at a time: give another engine its own persist_path or namespace)",
                arena.display()
            );
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Whether the arena file at `path` can be reopened as `geometry` for
/// `namespace`: `None` if so, `Some(why)` if it is this namespace's but must
/// be made anew; an error if it is not ours to use or to replace.
fn judge(
    file: &File,
    path: &Path,
    geometry: &Geometry,
    namespace: &str,
    page: usize,
) -> Result<Option<String>> {
    let not_ours = |what: String| -> Result<Option<String>> {
        bail!(
            Config,
            "persist_path: {} {what}; it was neither opened nor changed: remove it, or \
             choose another persist_path",
            path.display()
        )
    };
    let size = match file.metadata() {
        Ok(m) => m.len() as usize,
        Err(e) => bail!(Config, "persist_path: cannot stat {}: {e}", path.display()),
    };
    if size < HEADER_BYTES {
        return not_ours(format!("is not a kvtier arena ({size} bytes)"));
    }
    let header = read_header(file, path, page)?;
    if header[..8] != MAGIC {
        return not_ours("is not a kvtier arena".into());
    }
    let version = u32::from_le_bytes(header[8..12].try_into().unwrap());
    if version != VERSION {
        return not_ours(format!(
            "is an arena of format {version}, which this build (format {VERSION}) does not read"
        ));
    }
    let word = |at: usize| u64::from_le_bytes(header[at..at + 8].try_into().unwrap());
    let ns_len = (u32::from_le_bytes(header[72..76].try_into().unwrap()) as usize)
        .min(HEADER_BYTES - NAMESPACE_AT);
    let stored_ns = &header[NAMESPACE_AT..NAMESPACE_AT + ns_len];
    if word(CHECK_AT) != header_check(&header) {
        return Ok(Some("its header failed its check".into()));
    }
    if stored_ns != namespace.as_bytes() {
        return not_ours(format!(
            "holds the arena of namespace {:?}, not {namespace:?}",
            String::from_utf8_lossy(stored_ns)
        ));
    }
    let found = (word(16) as usize, word(24) as usize);
    let layout = [word(32), word(40), word(48), word(56)].map(|w| w as usize);
    if found != (geometry.block_bytes, geometry.slots)
        || layout
            != [
                RECORD_BYTES,
                geometry.records_at,
                geometry.data_at,
                geometry.file_bytes,
            ]
    {
        return Ok(Some(format!(
            "it held {} blocks of {} bytes, this tier {} of {}",
            found.1, found.0, geometry.slots, geometry.block_bytes
        )));
    }
    if size < geometry.file_bytes {
        return Ok(Some(format!(
            "it is {size} bytes, shorter than its header says ({})",
            geometry.file_bytes
        )));
    }
    Ok(None)
}

/// A copy of the file's header, read through a mapping (hugetlbfs has no
/// `read`).
fn read_header(file: &File, path: &Path, page: usize) -> Result<Vec<u8>> {
    let len = HEADER_BYTES.next_multiple_of(page);
    let base = map(file, len, path)?;
    // SAFETY: the file is at least HEADER_BYTES long (checked by the
    // caller), so those bytes of the fresh mapping are readable.
    let header = unsafe { std::slice::from_raw_parts(base.as_ptr(), HEADER_BYTES) }.to_vec();
    // SAFETY: the mapping made just above, no longer used.
    unsafe { libc::munmap(base.as_ptr() as *mut libc::c_void, len) };
    Ok(header)
}

/// The check over a header's identity fields and its namespace.
fn header_check(header: &[u8]) -> u64 {
    let ns_len = (u32::from_le_bytes(header[72..76].try_into().unwrap()) as usize)
        .min(HEADER_BYTES - NAMESPACE_AT);
    let mut all = header[..CHECK_AT].to_vec();
    all.extend_from_slice(&header[NAMESPACE_AT..NAMESPACE_AT + ns_len]);
    xxh64(&all, CHECK_SEED)
}

fn header_of(geometry: &Geometry, namespace: &str) -> Vec<u8> {
    let mut h = vec![0u8; HEADER_BYTES];
    h[..8].copy_from_slice(&MAGIC);
    h[8..12].copy_from_slice(&VERSION.to_le_bytes());
    h[12..16].copy_from_slice(&(HEADER_BYTES as u32).to_le_bytes());
    let words = [
        geometry.block_bytes,
        geometry.slots,
        RECORD_BYTES,
        geometry.records_at,
        geometry.data_at,
        geometry.file_bytes,
    ];
    for (i, w) in words.iter().enumerate() {
        h[16 + 8 * i..24 + 8 * i].copy_from_slice(&(*w as u64).to_le_bytes());
    }
    h[64..72].copy_from_slice(&namespace_fingerprint(namespace).to_le_bytes());
    h[72..76].copy_from_slice(&(namespace.len() as u32).to_le_bytes());
    h[NAMESPACE_AT..NAMESPACE_AT + namespace.len()].copy_from_slice(namespace.as_bytes());
    let check = header_check(&h);
    h[CHECK_AT..CHECK_AT + 8].copy_from_slice(&check.to_le_bytes());
    h
}

/// Makes a new, empty arena under `tmp` and renames it to `path`; the file
/// is then the one at `path`.
fn create(tmp: &Path, path: &Path, geometry: &Geometry, namespace: &str) -> Result<File> {
    let made = (|| -> std::result::Result<File, String> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(tmp)
            .map_err(|e| format!("cannot create {}: {e}", tmp.display()))?;
        file.set_len(geometry.file_bytes as u64)
            .map_err(|e| format!("cannot size {}: {e}", tmp.display()))?;
        // The header and records now, so writing them below cannot meet a
        // full file system; blocks are allocated slot by slot as stores
        // (or `prefault`) first reach them.
        // SAFETY: a plain system call on our own descriptor.
        let rc =
            unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, geometry.data_at as libc::off_t) };
        if rc != 0 {
            let e = std::io::Error::last_os_error();
            return Err(format!(
                "cannot allocate the first {} bytes of {}: {e}",
                geometry.data_at,
                tmp.display()
            ));
        }
        let base = map(&file, geometry.data_at, tmp).map_err(|e| e.message().to_string())?;
        let header = header_of(geometry, namespace);
        // SAFETY: the fresh mapping is data_at >= HEADER_BYTES bytes long,
        // allocated, and ours alone.
        unsafe {
            std::ptr::copy_nonoverlapping(header.as_ptr(), base.as_ptr(), header.len());
            libc::munmap(base.as_ptr() as *mut libc::c_void, geometry.data_at);
        }
        std::fs::rename(tmp, path)
            .map_err(|e| format!("cannot rename {} into place: {e}", tmp.display()))?;
        Ok(file)
    })();
    made.or_else(|why| {
        let _ = std::fs::remove_file(tmp);
        bail!(Config, "persist_path: {why}")
    })
}

/// Maps `len` bytes of `file`, shared.
fn map(file: &File, len: usize, path: &Path) -> Result<NonNull<u8>> {
    // SAFETY: a new shared mapping of our own descriptor; no existing memory
    // is affected.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        let e = std::io::Error::last_os_error();
        bail!(
            Alloc,
            "persist_path: cannot map {} bytes of {}: {e} (on hugetlbfs: are there enough free huge pages?)",
            len,
            path.display()
        );
    }
    Ok(NonNull::new(ptr as *mut u8).expect("mmap returned NULL"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_start_aligned_after_the_records_and_the_file_ends_aligned() {
        let g = Geometry::new(2 << 20, 8192, 4096).unwrap();
        assert_eq!(g.records_at, HEADER_BYTES);
        assert_eq!(g.data_at, 2 << 20, "{g:?}");
        assert_eq!(g.file_bytes, (2 << 20) + 8192 * (2 << 20));
        let g = Geometry::new(65536, 100_000, 4096).unwrap();
        assert!(g.data_at >= HEADER_BYTES + 100_000 * RECORD_BYTES);
        assert_eq!(g.data_at % DATA_ALIGN, 0);
        let g = Geometry::new(4096, 3, 1 << 30).unwrap();
        assert_eq!((g.data_at, g.file_bytes), (1 << 30, 2 << 30));
        assert!(Geometry::new(1 << 30, usize::MAX / 4, 4096).is_err());
    }

    #[test]
    fn a_header_checks_its_identity_and_namespace() {
        let g = Geometry::new(4096, 16, 4096).unwrap();
        let h = header_of(&g, "ns/a");
        assert_eq!(
            u64::from_le_bytes(h[CHECK_AT..CHECK_AT + 8].try_into().unwrap()),
            header_check(&h)
        );
        for at in [0, 9, 20, 60, 70, NAMESPACE_AT + 3] {
            let mut bad = h.clone();
            bad[at] ^= 1;
            assert_ne!(header_check(&bad), header_check(&h), "byte {at}");
        }
        assert_ne!(
            header_check(&header_of(&g, "ns/b")),
            header_check(&h),
            "the namespace is checked"
        );
    }
}
