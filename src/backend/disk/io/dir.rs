//! The directory calls of recovery's scan (open a directory, list its names
//! with getdents64, stat and unlink entries relative to it), apart from the
//! block I/O because only the scan makes them.

use super::open;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;

/// A directory opened for `*at` calls relative to it (no symlink followed).
pub(crate) fn open_dir(path: &Path) -> io::Result<OwnedFd> {
    open(path, libc::O_RDONLY | libc::O_DIRECTORY, 0)
}

/// What recovery needs of a directory entry: its type, size and
/// modification time.
pub(crate) struct EntryStat {
    pub(crate) mode: u32,
    pub(crate) len: u64,
    pub(crate) modified: std::time::SystemTime,
}

impl EntryStat {
    pub(crate) fn is_regular(&self) -> bool {
        self.mode & libc::S_IFMT == libc::S_IFREG
    }
}

fn time(secs: i64, nanos: u32) -> std::time::SystemTime {
    use std::time::{Duration, UNIX_EPOCH};
    let since = Duration::new(secs.unsigned_abs(), nanos.min(999_999_999));
    if secs >= 0 {
        UNIX_EPOCH + since
    } else {
        UNIX_EPOCH - since
    }
}

/// The entry `name` of `dir`, a symlink not followed. `statx` asks only for
/// type, size and mtime, relative to the directory's descriptor (no path walk
/// from the root per file) and without forcing a sync with a network file
/// system's server; kernels or sandboxes without `statx` get `fstatat`.
pub(crate) fn stat_at(dir: &OwnedFd, name: &std::ffi::CStr) -> io::Result<EntryStat> {
    // SAFETY: a valid descriptor, a NUL-terminated name and a zeroed
    // out-parameter of the right type; the result is checked.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    let rc = unsafe {
        libc::statx(
            dir.as_raw_fd(),
            name.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW | libc::AT_STATX_DONT_SYNC,
            libc::STATX_TYPE | libc::STATX_SIZE | libc::STATX_MTIME,
            &mut stx,
        )
    };
    if rc == 0 {
        let modified = if stx.stx_mask & libc::STATX_MTIME != 0 {
            time(stx.stx_mtime.tv_sec, stx.stx_mtime.tv_nsec)
        } else {
            std::time::UNIX_EPOCH
        };
        return Ok(EntryStat {
            mode: stx.stx_mode as u32,
            len: stx.stx_size,
            modified,
        });
    }
    let err = io::Error::last_os_error();
    if !matches!(err.raw_os_error(), Some(libc::ENOSYS | libc::EPERM)) {
        return Err(err);
    }
    // SAFETY: as above, for fstatat's out-parameter.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe {
        libc::fstatat(
            dir.as_raw_fd(),
            name.as_ptr(),
            &mut st,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    } != 0
    {
        return Err(io::Error::last_os_error());
    }
    Ok(EntryStat {
        mode: st.st_mode,
        len: st.st_size as u64,
        modified: time(st.st_mtime, st.st_mtime_nsec as u32),
    })
}

/// `unlinkat(2)` of a file entry of `dir`.
pub(crate) fn unlink_at(dir: &OwnedFd, name: &std::ffi::CStr) -> io::Result<()> {
    // SAFETY: a valid descriptor and NUL-terminated name.
    if unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A directory's entries (but `.` and `..`).
pub(crate) struct DirNames {
    /// The names, each NUL-terminated, packed in one buffer.
    pub(crate) names: Vec<u8>,
    /// (inode, offset of the name in `names`, file type as `d_type` says:
    /// `libc::DT_REG`, `DT_DIR`, ... or `DT_UNKNOWN`) per entry.
    pub(crate) entries: Vec<(u64, usize, u8)>,
}

/// A directory's entries (but `.` and `..`), by `getdents64` on
/// the descriptor the caller already holds: no second open of the directory
/// and no allocation per entry, which a million-file recovery would pay for.
pub(crate) fn read_names(dir: &OwnedFd) -> io::Result<DirNames> {
    let mut names = Vec::new();
    let mut entries = Vec::new();
    let mut buf = vec![0u8; 64 << 10];
    loop {
        // SAFETY: a valid descriptor and a writable buffer of the given
        // length; the kernel writes whole records into it.
        let n = unsafe {
            libc::syscall(
                libc::SYS_getdents64,
                dir.as_raw_fd(),
                buf.as_mut_ptr(),
                buf.len(),
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        if n == 0 {
            return Ok(DirNames { names, entries });
        }
        // struct linux_dirent64: d_ino u64, d_off i64, d_reclen u16,
        // d_type u8, d_name (NUL-terminated, padded to d_reclen).
        let mut at = 0;
        while at + 19 <= n as usize {
            let ino = u64::from_ne_bytes(buf[at..at + 8].try_into().expect("8 bytes"));
            let reclen =
                u16::from_ne_bytes(buf[at + 16..at + 18].try_into().expect("2 bytes")) as usize;
            let kind = buf[at + 18];
            if reclen < 19 || at + reclen > n as usize {
                return Err(io::Error::from_raw_os_error(libc::EIO));
            }
            let name = &buf[at + 19..at + reclen];
            let len = name.iter().position(|&c| c == 0).unwrap_or(name.len());
            let name = &name[..len];
            if name != b"." && name != b".." {
                entries.push((ino, names.len(), kind));
                names.extend_from_slice(name);
                names.push(0);
            }
            at += reclen;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_names_lists_what_read_dir_lists() {
        use std::os::unix::fs::DirEntryExt;
        let dir = std::env::temp_dir().join(format!("kvtier-names-{}", std::process::id()));
        std::fs::create_dir(&dir).unwrap();
        // More entries than one getdents64 buffer holds.
        for i in 0..3000 {
            std::fs::write(dir.join(format!("{i:040x}.kvb")), b"").unwrap();
        }
        std::fs::create_dir(dir.join("sub")).unwrap();
        let DirNames { names, entries } = read_names(&open_dir(&dir).unwrap()).unwrap();
        let mut got: Vec<(u64, Vec<u8>, bool)> = entries
            .iter()
            .map(|&(ino, at, kind)| {
                let name = std::ffi::CStr::from_bytes_until_nul(&names[at..]).unwrap();
                (ino, name.to_bytes().to_vec(), kind == libc::DT_DIR)
            })
            .collect();
        let mut want: Vec<(u64, Vec<u8>, bool)> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap())
            .map(|e| {
                let is_dir = e.file_type().unwrap().is_dir();
                (e.ino(), e.file_name().into_encoded_bytes(), is_dir)
            })
            .collect();
        got.sort();
        want.sort();
        assert_eq!(got.len(), 3001);
        assert_eq!(got, want);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
