//! Page-aligned anonymous mappings (the primary buffers), resident-memory
//! readings, and helpers to spread row work over threads (timed or not).

use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Barrier;
use std::time::Instant;

/// An anonymous private mapping: page aligned (4 KiB), zero filled, unmapped on
/// drop. Rows are handed out as raw slices: the benchmark gives each row to one
/// writer at a time, and never touches a row a tier job in flight is using.
pub struct MappedBuf {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: plain bytes; the access discipline is described on the type.
unsafe impl Send for MappedBuf {}
unsafe impl Sync for MappedBuf {}

impl MappedBuf {
    pub fn new(len: usize) -> Result<MappedBuf, String> {
        Self::map(len, 0)
    }

    /// Address space only (`MAP_NORESERVE`), as the memory backend reserves
    /// its arena: no memory until pages are touched or populated.
    pub fn reserve(len: usize) -> Result<MappedBuf, String> {
        Self::map(len, libc::MAP_NORESERVE)
    }

    fn map(len: usize, extra_flags: libc::c_int) -> Result<MappedBuf, String> {
        assert!(len > 0);
        // SAFETY: a fresh anonymous mapping; no existing memory is affected.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | extra_flags,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(format!(
                "could not map {len} bytes: {}",
                std::io::Error::last_os_error()
            ));
        }
        Ok(MappedBuf {
            ptr: NonNull::new(ptr as *mut u8).expect("mmap returned NULL"),
            len,
        })
    }

    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// `len` bytes at `offset`, read-only.
    ///
    /// # Safety
    /// No one writes the range while the slice lives (no tier load into it).
    pub unsafe fn slice(&self, offset: usize, len: usize) -> &[u8] {
        assert!(offset.checked_add(len).is_some_and(|end| end <= self.len));
        std::slice::from_raw_parts(self.ptr.as_ptr().add(offset), len)
    }

    /// `len` bytes at `offset`, writable.
    ///
    /// # Safety
    /// No one else reads or writes the range while the slice lives.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn slice_mut(&self, offset: usize, len: usize) -> &mut [u8] {
        assert!(offset.checked_add(len).is_some_and(|end| end <= self.len));
        std::slice::from_raw_parts_mut(self.ptr.as_ptr().add(offset), len)
    }
}

impl Drop for MappedBuf {
    fn drop(&mut self) {
        // SAFETY: our own mapping; every tier over it was dropped first ('buf).
        unsafe { libc::munmap(self.ptr.as_ptr() as *mut libc::c_void, self.len) };
    }
}

/// Resident set size in bytes, from /proc/self/statm (0 if unreadable).
pub fn rss_bytes() -> u64 {
    let page = page_size();
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * page)
}

/// Anonymous memory backed by transparent huge pages, from
/// /proc/self/smaps_rollup (0 if unreadable).
pub fn anon_huge_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/smaps_rollup")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("AnonHugePages:"))?
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .ok()
        })
        .map_or(0, |kb| kb * 1024)
}

pub fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if page > 0 {
        page as u64
    } else {
        4096
    }
}

/// Runs `f(i)` for every `i` in `0..n` on `threads` threads (interleaved), and
/// returns the first error.
pub fn for_each_parallel<E: Send>(
    threads: usize,
    n: usize,
    f: impl Fn(usize) -> Result<(), E> + Sync,
) -> Result<(), E> {
    let threads = threads.clamp(1, n.max(1));
    let f = &f;
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| s.spawn(move || (t..n).step_by(threads).try_for_each(f)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("worker thread panicked"))
            .collect::<Result<Vec<()>, E>>()
            .map(|_| ())
    })
}

/// Runs `f(i)` for every `i` in `0..n` on `threads` threads, each taking the
/// next index when it finishes one, and returns the seconds from the first
/// thread's start to the last one's end. A bound (memcpy, raw file I/O) is
/// timed this way: each thread takes its own timestamps, since the calling
/// thread may not be running when the work starts or ends (on a 2-core
/// machine it competes with the workers for a core).
pub fn time_parallel<E: Send>(
    threads: usize,
    n: usize,
    f: impl Fn(usize) -> Result<(), E> + Sync,
) -> Result<f64, E> {
    let threads = threads.max(1);
    let ready = Barrier::new(threads);
    let next = AtomicUsize::new(0);
    let (ready, next, f) = (&ready, &next, &f);
    let spans = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(move || {
                    ready.wait();
                    let start = Instant::now();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= n {
                            return Ok((start, Instant::now()));
                        }
                        f(i)?;
                    }
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("worker thread panicked"))
            .collect::<Result<Vec<(Instant, Instant)>, E>>()
    })?;
    let first = spans.iter().map(|s| s.0).min().expect("one thread");
    let last = spans.iter().map(|s| s.1).max().expect("one thread");
    Ok((last - first).as_secs_f64())
}
