//! The system calls the disk backend makes, behind a small safe surface: file
//! descriptors as std's `OwnedFd` (which closes them), aligned buffers,
//! vectored positional I/O that finishes short transfers, and errno
//! classification; `dir` holds the directory calls of recovery's scan, apart
//! because only the scan makes them.

mod dir;

pub(crate) use self::dir::{open_dir, read_names, stat_at, unlink_at, DirNames};
use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Runs `f` with `path` as a NUL-terminated C string, built on the stack
/// when it fits (every block path does), as std does for its own file
/// calls: block I/O allocates nothing for it.
pub(crate) fn with_cpath<T>(path: &Path, f: impl FnOnce(&CStr) -> io::Result<T>) -> io::Result<T> {
    const STACK: usize = 512;
    let bytes = path.as_os_str().as_bytes();
    let invalid = || io::Error::from(io::ErrorKind::InvalidInput);
    if bytes.len() < STACK {
        let mut buf = [0u8; STACK];
        buf[..bytes.len()].copy_from_slice(bytes);
        f(CStr::from_bytes_with_nul(&buf[..=bytes.len()]).map_err(|_| invalid())?)
    } else {
        f(&CString::new(bytes).map_err(|_| invalid())?)
    }
}

/// `open(2)` with close-on-exec and without following a final symlink.
pub(crate) fn open(path: &Path, flags: libc::c_int, mode: libc::mode_t) -> io::Result<OwnedFd> {
    with_cpath(path, |c| {
        // SAFETY: a valid NUL-terminated path; the result is checked.
        let fd = unsafe {
            libc::open(
                c.as_ptr(),
                flags | libc::O_CLOEXEC | libc::O_NOFOLLOW,
                mode as libc::c_uint,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: open(2) just returned this descriptor, owned by nothing else.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    })
}

/// A new file that must not exist yet (no symlink is followed), for writing.
pub(crate) fn create_exclusive(path: &Path, direct: bool) -> io::Result<OwnedFd> {
    let direct = if direct { libc::O_DIRECT } else { 0 };
    open(
        path,
        libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | direct,
        0o600,
    )
}

/// Opens a block file for reading. O_NONBLOCK so that a FIFO put where a block
/// file should be cannot block the worker in open(2) until a writer appears;
/// on a regular file it changes nothing (reads of regular files never return
/// EAGAIN), so it is not cleared.
pub(crate) fn open_read(path: &Path, direct: bool) -> io::Result<OwnedFd> {
    let direct = if direct { libc::O_DIRECT } else { 0 };
    open(path, libc::O_RDONLY | libc::O_NONBLOCK | direct, 0)
}

/// A small regular file's bytes (a manifest, a journal): no symlink
/// followed, no FIFO waited on, anything but a regular file refused.
pub(crate) fn read_regular(path: &Path) -> io::Result<Vec<u8>> {
    let fd = open_read(path, false)?;
    let meta = fstat(&fd)?;
    if !meta.is_regular() {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    let mut bytes = Vec::new();
    bytes.try_reserve_exact(meta.len as usize)?;
    std::io::Read::read_to_end(&mut std::fs::File::from(fd), &mut bytes)?;
    Ok(bytes)
}

/// What a file is, as fstat/lstat say: enough to tell a regular block file of
/// the right size, and whether a path still names the file a descriptor has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FileId {
    pub dev: u64,
    pub ino: u64,
    pub mode: u32,
    pub len: u64,
    /// Last access, in seconds since the epoch: a load's use stamp.
    pub atime_s: i64,
}

impl FileId {
    fn from_stat(st: &libc::stat) -> FileId {
        FileId {
            dev: st.st_dev,
            ino: st.st_ino,
            mode: st.st_mode,
            len: st.st_size as u64,
            atime_s: st.st_atime,
        }
    }

    pub(crate) fn is_regular(&self) -> bool {
        self.mode & libc::S_IFMT == libc::S_IFREG
    }

    pub(crate) fn is_dir(&self) -> bool {
        self.mode & libc::S_IFMT == libc::S_IFDIR
    }

    /// Same file (device and inode).
    pub(crate) fn same_file(&self, other: &FileId) -> bool {
        self.dev == other.dev && self.ino == other.ino
    }

    /// A short description for messages: "a FIFO", "a directory", ...
    pub(crate) fn kind_name(&self) -> &'static str {
        match self.mode & libc::S_IFMT {
            libc::S_IFREG => "a regular file",
            libc::S_IFDIR => "a directory",
            libc::S_IFIFO => "a FIFO",
            libc::S_IFLNK => "a symbolic link",
            libc::S_IFSOCK => "a socket",
            libc::S_IFCHR => "a character device",
            libc::S_IFBLK => "a block device",
            _ => "not a regular file",
        }
    }
}

pub(crate) fn fstat(fd: &OwnedFd) -> io::Result<FileId> {
    // SAFETY: a valid descriptor and a zeroed out-parameter of the right type.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(FileId::from_stat(&st))
}

/// `lstat(2)`'s whole answer (times included), a symlink not followed.
pub(crate) fn lstat_raw(path: &Path) -> io::Result<libc::stat> {
    with_cpath(path, |c| {
        // SAFETY: a valid NUL-terminated path and a zeroed out-parameter.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        if unsafe { libc::lstat(c.as_ptr(), &mut st) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(st)
    })
}

/// `lstat(2)`: the path's own entry, a symlink not followed.
pub(crate) fn lstat(path: &Path) -> io::Result<FileId> {
    lstat_raw(path).map(|st| FileId::from_stat(&st))
}

/// The most parts one vectored call takes (a header and a row, today): the
/// iovecs live on the stack, so block I/O allocates nothing for them.
const MAX_PARTS: usize = 4;

/// Non-empty `(pointer, length)` parts as iovecs on the stack, and how many.
fn iovecs(
    parts: impl Iterator<Item = (*mut u8, usize)>,
) -> io::Result<([libc::iovec; MAX_PARTS], usize)> {
    let mut iov = [libc::iovec {
        iov_base: std::ptr::null_mut(),
        iov_len: 0,
    }; MAX_PARTS];
    let mut n = 0;
    for (base, len) in parts.filter(|&(_, len)| len > 0) {
        let Some(slot) = iov.get_mut(n) else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("more than {MAX_PARTS} parts in one vectored I/O"),
            ));
        };
        *slot = libc::iovec {
            iov_base: base as *mut libc::c_void,
            iov_len: len,
        };
        n += 1;
    }
    Ok((iov, n))
}

type VectoredIo =
    unsafe extern "C" fn(libc::c_int, *const libc::iovec, libc::c_int, libc::off_t) -> isize;

/// Runs `call` (preadv or pwritev) until every iovec is done, retrying EINTR
/// and continuing after short transfers; returns the bytes moved, which is
/// short only if the call moved nothing (end of file, or a device that takes
/// no more).
///
/// # Safety
/// The iovecs must describe live buffers, writable ones for preadv.
unsafe fn transfer(
    fd: &OwnedFd,
    iov: &mut [libc::iovec],
    mut offset: u64,
    call: VectoredIo,
) -> io::Result<usize> {
    let (mut first, mut total) = (0, 0);
    while first < iov.len() {
        let n = call(
            fd.as_raw_fd(),
            iov[first..].as_ptr(),
            (iov.len() - first) as libc::c_int,
            offset as libc::off_t,
        );
        if n < 0 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        if n == 0 {
            break;
        }
        offset += n as u64;
        total += n as usize;
        first = advance(iov, first, n as usize);
    }
    Ok(total)
}

/// Writes all of `parts` at `offset`, retrying short writes and EINTR.
pub(crate) fn write_all_at(fd: &OwnedFd, parts: &[&[u8]], offset: u64) -> io::Result<()> {
    // SAFETY: the parts are slices borrowed for this call.
    unsafe {
        write_parts(
            fd,
            parts.iter().map(|p| (p.as_ptr() as *mut u8, p.len())),
            offset,
        )
    }
}

/// Writes `header` and then `len` bytes at `row` at `offset`, like
/// [`write_all_at`], for a row the caller may unmap meanwhile (a store left
/// behind by `tier_free`, see `WatchedIo::store_unless`): the row's address is
/// handed to the kernel, never read here. An address no longer mapped fails
/// the write with EFAULT; one mapped again since is read into the file,
/// which is then never published and is removed (see `store_checked`).
pub(crate) fn write_header_and_row(
    fd: &OwnedFd,
    header: &[u8],
    row: *const u8,
    len: usize,
    offset: u64,
) -> io::Result<()> {
    let parts = [
        (header.as_ptr() as *mut u8, header.len()),
        (row as *mut u8, len),
    ];
    // SAFETY: `header` is borrowed for this call; the row is only read by
    // the kernel, which checks the address itself.
    unsafe { write_parts(fd, parts.into_iter(), offset) }
}

/// Writes `len` bytes at `row` at `offset`: [`write_header_and_row`]
/// without a header, for the same rows.
pub(crate) fn write_row(fd: &OwnedFd, row: *const u8, len: usize, offset: u64) -> io::Result<()> {
    // SAFETY: the row is only read by the kernel, which checks the address.
    unsafe { write_parts(fd, std::iter::once((row as *mut u8, len)), offset) }
}

/// Sets the extended attribute `name` of an open file.
pub(crate) fn set_attr(fd: &OwnedFd, name: &CStr, value: &[u8]) -> io::Result<()> {
    // SAFETY: a valid descriptor, a NUL-terminated name and a borrowed value.
    let rc = unsafe {
        libc::fsetxattr(
            fd.as_raw_fd(),
            name.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Reads the extended attribute `name` of an open file into `buf`; returns
/// its length. ENODATA if the file has none, ERANGE if it is longer than
/// `buf`.
pub(crate) fn get_attr(fd: &OwnedFd, name: &CStr, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        // SAFETY: a valid descriptor, a NUL-terminated name, and a buffer
        // exclusively borrowed for the call.
        let n = unsafe {
            libc::fgetxattr(
                fd.as_raw_fd(),
                name.as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
            )
        };
        if n >= 0 {
            return Ok(n as usize);
        }
        let err = io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EINTR) {
            return Err(err);
        }
    }
}

/// Whether an attribute read failed because the file has none, or one too
/// long to be ours: either proves the file is no block of this form.
pub(crate) fn is_attr_missing_or_foreign(err: &io::Error) -> bool {
    matches!(err.raw_os_error(), Some(libc::ENODATA) | Some(libc::ERANGE))
}

/// Whether an attribute write failed because the file system keeps no
/// user attributes.
pub(crate) fn is_attr_unsupported(err: &io::Error) -> bool {
    matches!(err.raw_os_error(), Some(libc::ENOTSUP) | Some(libc::EPERM))
}

/// The file system type (`statfs`'s `f_type`) of the one holding `path`.
pub(crate) fn fs_type(path: &Path) -> io::Result<i64> {
    with_cpath(path, |c| {
        // SAFETY: statfs fills the zeroed struct it is given.
        let mut st: libc::statfs = unsafe { std::mem::zeroed() };
        // SAFETY: a NUL-terminated path and a struct to fill.
        if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
            return Err(io::Error::last_os_error());
        }
        #[allow(clippy::unnecessary_cast)] // its width differs by target
        Ok(st.f_type as i64)
    })
}

/// `pwritev` of every part, retrying short writes and EINTR.
///
/// # Safety
/// Each part must be readable memory for the call, or an address only the
/// kernel reads (it fails the write with EFAULT if unmapped).
unsafe fn write_parts(
    fd: &OwnedFd,
    parts: impl Iterator<Item = (*mut u8, usize)>,
    offset: u64,
) -> io::Result<()> {
    let (mut iov, n) = iovecs(parts)?;
    let want: usize = iov[..n].iter().map(|v| v.iov_len).sum();
    if transfer(fd, &mut iov[..n], offset, libc::pwritev)? < want {
        return Err(io::Error::from(io::ErrorKind::WriteZero));
    }
    Ok(())
}

/// Reads into all of `parts` from `offset`; returns the bytes read, which is
/// less than requested only at end of file.
pub(crate) fn read_at(fd: &OwnedFd, parts: &mut [&mut [u8]], offset: u64) -> io::Result<usize> {
    let (mut iov, n) = iovecs(parts.iter_mut().map(|p| (p.as_mut_ptr(), p.len())))?;
    // SAFETY: the iovecs describe slices exclusively borrowed for this call.
    unsafe { transfer(fd, &mut iov[..n], offset, libc::preadv) }
}

/// Drops `n` transferred bytes from the front of `iov[first..]`.
fn advance(iov: &mut [libc::iovec], mut first: usize, mut n: usize) -> usize {
    while n > 0 && first < iov.len() {
        if n >= iov[first].iov_len {
            n -= iov[first].iov_len;
            first += 1;
        } else {
            // SAFETY: stays within the same slice (n < iov_len).
            iov[first].iov_base =
                unsafe { (iov[first].iov_base as *mut u8).add(n) } as *mut libc::c_void;
            iov[first].iov_len -= n;
            n = 0;
        }
    }
    first
}

/// fsync: data and all metadata, extended attributes included.
pub(crate) fn fsync(fd: &OwnedFd) -> io::Result<()> {
    // SAFETY: a valid descriptor.
    if unsafe { libc::fsync(fd.as_raw_fd()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

pub(crate) fn fdatasync(fd: &OwnedFd) -> io::Result<()> {
    // SAFETY: a valid descriptor.
    if unsafe { libc::fdatasync(fd.as_raw_fd()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// fsync of a directory, so a rename into it survives a power loss.
pub(crate) fn sync_dir(dir: &Path) -> io::Result<()> {
    let fd = open(dir, libc::O_RDONLY | libc::O_DIRECTORY, 0)?;
    // SAFETY: a valid descriptor.
    if unsafe { libc::fsync(fd.as_raw_fd()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Takes an advisory lock on `fd` without waiting: exclusive or shared.
pub(crate) fn try_flock(fd: &OwnedFd, exclusive: bool) -> io::Result<()> {
    let op = if exclusive {
        libc::LOCK_EX
    } else {
        libc::LOCK_SH
    } | libc::LOCK_NB;
    // SAFETY: a valid descriptor.
    if unsafe { libc::flock(fd.as_raw_fd(), op) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Sets the file's access time to now and leaves its modification time:
/// a load's use stamp, the recency `kvtier gc` orders blocks by (mtime stays
/// the store's time, which recovery and a clear's sweep read). Only the
/// file's owner may (EPERM otherwise).
pub(crate) fn stamp_access(fd: &OwnedFd) -> io::Result<()> {
    let now = libc::timespec {
        tv_sec: 0,
        tv_nsec: libc::UTIME_NOW,
    };
    let keep = libc::timespec {
        tv_sec: 0,
        tv_nsec: libc::UTIME_OMIT,
    };
    let times = [now, keep];
    // SAFETY: a valid descriptor and two timespecs, as futimens reads them.
    if unsafe { libc::futimens(fd.as_raw_fd(), times.as_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `rename(2)` that fails with EEXIST instead of replacing `to`.
pub(crate) fn rename_noreplace(from: &Path, to: &Path) -> io::Result<()> {
    with_cpath(from, |from| {
        with_cpath(to, |to| {
            // SAFETY: two valid NUL-terminated paths, relative to nothing.
            let r = unsafe {
                libc::renameat2(
                    libc::AT_FDCWD,
                    from.as_ptr(),
                    libc::AT_FDCWD,
                    to.as_ptr(),
                    libc::RENAME_NOREPLACE,
                )
            };
            if r != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        })
    })
}

/// Creates one directory with owner-only permissions.
pub(crate) fn mkdir(path: &Path) -> io::Result<()> {
    with_cpath(path, |c| {
        // SAFETY: a valid NUL-terminated path.
        if unsafe { libc::mkdir(c.as_ptr(), 0o700) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    })
}

/// Marks `dir` as the top of a directory hierarchy (`chattr +T`), so that
/// ext2/3/4 place the directories made in it in block groups of their own.
pub(crate) fn spread_subdirs(dir: &Path) -> io::Result<()> {
    const FS_TOPDIR_FL: libc::c_int = 0x0002_0000;
    let fd = open_dir(dir)?;
    // An int, as the file systems read and write it (and lsattr passes it),
    // whatever type the ioctl's number was declared with.
    let mut flags: libc::c_int = 0;
    // SAFETY: a valid descriptor and the int the ioctl reads or writes; the
    // results are checked.
    unsafe {
        if libc::ioctl(fd.as_raw_fd(), libc::FS_IOC_GETFLAGS, &mut flags) != 0 {
            return Err(io::Error::last_os_error());
        }
        if flags & FS_TOPDIR_FL == 0 {
            flags |= FS_TOPDIR_FL;
            if libc::ioctl(fd.as_raw_fd(), libc::FS_IOC_SETFLAGS, &flags) != 0 {
                return Err(io::Error::last_os_error());
            }
        }
    }
    Ok(())
}

/// True for errors that say the storage itself is bad or gone, as opposed to
/// a transient condition (descriptors, permissions, interrupts, symlink loops)
/// after which the file must be kept.
pub(crate) fn is_missing(err: &io::Error) -> bool {
    matches!(err.raw_os_error(), Some(libc::ENOENT) | Some(libc::ENOTDIR))
}

/// True for errors that say the process or system ran short of a resource
/// (descriptors, kernel memory): not a property of the path, so not a
/// configuration error.
pub(crate) fn is_resource_shortage(err: &io::Error) -> bool {
    matches!(
        err.raw_os_error(),
        Some(libc::EMFILE) | Some(libc::ENFILE) | Some(libc::ENOMEM)
    )
}

/// True for errors that mean the device is full.
pub(crate) fn is_full(err: &io::Error) -> bool {
    matches!(err.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vectored_io_round_trips_through_a_file() {
        let dir = std::env::temp_dir().join(format!("kvtier-io-{}", std::process::id()));
        let _ = std::fs::create_dir(&dir);
        let path = dir.join("f");
        let _ = std::fs::remove_file(&path);
        let fd = create_exclusive(&path, false).unwrap();
        assert_eq!(
            create_exclusive(&path, false).err().unwrap().raw_os_error(),
            Some(libc::EEXIST)
        );
        write_all_at(&fd, &[b"hello ", b"", b"world"], 0).unwrap();
        drop(fd);
        let fd = open_read(&path, false).unwrap();
        let mut a = [0u8; 3];
        let mut b = [0u8; 20];
        let n = read_at(&fd, &mut [&mut a, &mut b], 0).unwrap();
        assert_eq!(n, 11);
        assert_eq!(&a, b"hel");
        assert_eq!(&b[..8], b"lo world");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
