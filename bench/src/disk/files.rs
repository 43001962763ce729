//! Raw file I/O for the disk bounds (what a file-per-block store must do at
//! least, with O_DIRECT like the tier) and the scratch-directory chores.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).expect("path without NUL")
}

fn os_err(what: &str, p: &Path) -> String {
    format!(
        "{what} {}: {}",
        p.display(),
        std::io::Error::last_os_error()
    )
}

/// Opens `path` with `flags | O_DIRECT`, runs one positioned transfer of
/// `len` bytes on the descriptor, and closes it.
fn direct_io(
    path: &Path,
    flags: libc::c_int,
    len: usize,
    transfer: impl FnOnce(libc::c_int) -> isize,
) -> Result<(), String> {
    let c = cpath(path);
    // SAFETY: valid C string; the result is checked.
    let fd = unsafe { libc::open(c.as_ptr(), flags | libc::O_DIRECT | libc::O_CLOEXEC, 0o600) };
    if fd < 0 {
        return Err(os_err("open", path));
    }
    let n = transfer(fd);
    // SAFETY: fd is ours.
    unsafe { libc::close(fd) };
    if n != len as isize {
        let what = if flags & libc::O_WRONLY != 0 {
            "write"
        } else {
            "read"
        };
        return Err(os_err(what, path));
    }
    Ok(())
}

/// Exclusive create + O_DIRECT write + close of `path`; with `tmp`, the file is
/// written there and renamed into place, as a crash-safe store must.
pub fn write_file(path: &Path, data: &[u8], tmp: Option<&Path>) -> Result<(), String> {
    let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL;
    direct_io(tmp.unwrap_or(path), flags, data.len(), |fd| {
        // SAFETY: data is a live, 4 KiB-aligned buffer of its length.
        unsafe { libc::pwrite(fd, data.as_ptr() as *const libc::c_void, data.len(), 0) }
    })?;
    if let Some(tmp) = tmp {
        std::fs::rename(tmp, path).map_err(|e| format!("rename {}: {e}", path.display()))?;
    }
    Ok(())
}

/// Open + O_DIRECT read + close, into `out` (4 KiB aligned).
pub fn read_file(path: &Path, out: &mut [u8]) -> Result<(), String> {
    let len = out.len();
    direct_io(path, libc::O_RDONLY, len, |fd| {
        // SAFETY: out is a live, 4 KiB-aligned buffer of its length.
        unsafe { libc::pread(fd, out.as_mut_ptr() as *mut libc::c_void, len, 0) }
    })
}

/// Deletes every block file under `dir` (keeping the directories), so a
/// reopened tier starts empty on fan-out directories already made.
pub fn remove_block_files(dir: &Path) -> Result<(), String> {
    for_each_block_file(dir, &mut |path| {
        std::fs::remove_file(path).map_err(|e| format!("{}: {e}", path.display()))
    })
}

/// Block files (`*.kvb`) under `dir`, at any depth.
pub fn count_block_files(dir: &Path) -> Result<usize, String> {
    let mut count = 0;
    for_each_block_file(dir, &mut |_| {
        count += 1;
        Ok(())
    })?;
    Ok(count)
}

/// Calls `f` with every block file (`*.kvb`) under `dir`, at any depth.
fn for_each_block_file(
    dir: &Path,
    f: &mut dyn FnMut(&Path) -> Result<(), String>,
) -> Result<(), String> {
    for entry in std::fs::read_dir(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .flatten()
    {
        let path = entry.path();
        if path.is_dir() {
            for_each_block_file(&path, f)?;
        } else if path.extension().is_some_and(|e| e == "kvb") {
            f(&path)?;
        }
    }
    Ok(())
}

pub fn fresh_dir(path: &Path) -> Result<(), String> {
    let _ = std::fs::remove_dir_all(path);
    std::fs::create_dir_all(path).map_err(|e| format!("create {}: {e}", path.display()))
}

/// Drops the page cache (root only) so a recovery scan starts cold.
pub fn drop_caches() -> bool {
    // SAFETY: sync has no preconditions.
    unsafe { libc::sync() };
    std::fs::write("/proc/sys/vm/drop_caches", "3\n").is_ok()
}
