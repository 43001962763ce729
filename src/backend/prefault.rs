//! Making the memory arena resident before stores need it (`prefault`).
//!
//! A fresh arena costs no memory, but the first store into each page pays a
//! page fault (and the kernel's zeroing of the page) on the copy path: a cold
//! tier stores at the speed of the fault path, a fraction of memcpy. The
//! populator is one low-priority thread that makes arena pages resident ahead
//! of the slot allocator, so stores find them ready:
//!
//! - `full`: the whole capacity, from `tier_new` on; then the thread ends.
//! - `background`: at most [`ahead_window`] bytes beyond the highest slot
//!   stored so far. The slot allocator hands out never-used slots in
//!   ascending order (`src/index/slots.rs`: new slots are pushed at the end;
//!   freed ones are reused from the free list and are resident already), so
//!   "the highest slot stored" is where the next cold stores land. An idle
//!   tier therefore holds at most the window; the thread sleeps until stores
//!   have used half of it, then tops it up.
//!
//! It never blocks `tier_new` (the thread is only started there) or a store
//! (a store only records its slot in an atomic, and wakes the thread when it
//! crosses the mark the thread asked for). Pages are populated with
//! `MADV_POPULATE_WRITE` (Linux 5.14), which faults pages in without writing
//! them, so it is safe while a store writes the same pages; on older kernels
//! each page is touched with an atomic `fetch_or(0)`, which also leaves its
//! bytes as they are. Work goes in [`CHUNK`]s: dropping the tier stops the
//! thread after the chunk in progress and joins it.
//!
//! The thread runs at nice 19 (`setpriority` on its own thread id): it takes
//! idle CPU from the engine, never the engine's. Not `SCHED_IDLE`: on a busy
//! host that could starve it indefinitely while holding the arena's memory
//! map lock for reading in the middle of a fault.
//!
//! A persistent arena (`persist_path`) is a shared mapping of a file on
//! tmpfs or hugetlbfs: there each chunk is allocated in the file
//! (`fallocate`) before it is populated, so that a full file system stops the
//! populator with an error rather than a later store with SIGBUS.
//!
//! Fork: a child has no populator thread and never joins it (an inherited
//! tier is abandoned, not dropped: see `Tier::abandon_in_forked_child`).

use crate::error::{bail, Result};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::{JoinHandle, Thread};

/// Bytes populated per system call: what `tier_free` may wait for at most
/// (1-6 ms of CPU at the 0.7-4 GB/s the fault path reaches here; more wall
/// time when other processes keep the nice-19 thread off the CPU, hence
/// small). Two huge pages, so THP stays possible.
pub(crate) const CHUNK: usize = 4 << 20;

/// `background`: how far beyond the highest slot stored so far the arena is
/// kept resident: an eighth of the capacity, at least 64 MiB and at most
/// 1 GiB, never more than the capacity. Large enough to absorb a burst of
/// cascaded stores (vLLM: 16 jobs of 16 x 2 MiB = 512 MiB in flight), small
/// enough that an idle tier of any size holds at most 1 GiB it did not use.
pub(crate) fn ahead_window(capacity: usize) -> usize {
    (capacity / 8).clamp(64 << 20, 1 << 30).min(capacity)
}

/// What the populator and the stores tell each other.
#[derive(Debug)]
pub(crate) struct ArenaProgress {
    /// Bytes from the arena's start that the populator made resident.
    populated: AtomicUsize,
    /// End (in bytes from the arena's start) of the highest slot stored so
    /// far: everything below was written by a store or lies below it.
    stored_end: AtomicUsize,
    /// `background`: a store reaching this end wakes the sleeping populator.
    wake_at: AtomicUsize,
    stop: AtomicBool,
    /// The errno that made the populator give up (0: it did not).
    gave_up_errno: AtomicI32,
}

impl ArenaProgress {
    pub(crate) fn new() -> ArenaProgress {
        ArenaProgress {
            populated: AtomicUsize::new(0),
            stored_end: AtomicUsize::new(0),
            wake_at: AtomicUsize::new(usize::MAX),
            stop: AtomicBool::new(false),
            gave_up_errno: AtomicI32::new(0),
        }
    }

    /// A store wrote the arena up to `end`. Cheap on the common path (a slot
    /// below the high-water mark: one relaxed load).
    #[inline]
    pub(crate) fn note_stored(&self, end: usize, populator: Option<&Thread>) {
        if end <= self.stored_end.load(Ordering::Relaxed) {
            return;
        }
        self.stored_end.fetch_max(end, Ordering::SeqCst);
        // SeqCst pairs with the populator's store of `wake_at` and reload of
        // `stored_end` before it parks: one of the two sees the other.
        if let Some(thread) = populator {
            if end >= self.wake_at.load(Ordering::SeqCst) {
                thread.unpark();
            }
        }
    }

    /// Arena bytes made resident: populated ahead, or written by stores
    /// (slots below the highest one stored were all handed out before it and
    /// stay resident after eviction, which reuses them). Not a `mincore`
    /// count: the kernel could still reclaim pages under memory pressure
    /// (never for anonymous memory without swap).
    pub(crate) fn resident_bytes(&self, arena_len: usize) -> u64 {
        let populated = self.populated.load(Ordering::Relaxed);
        let stored = self.stored_end.load(Ordering::Relaxed);
        populated.max(stored).min(arena_len) as u64
    }

    /// Why population stopped early, if it did.
    pub(crate) fn gave_up(&self) -> Option<std::io::Error> {
        match self.gave_up_errno.load(Ordering::Relaxed) {
            0 => None,
            errno => Some(std::io::Error::from_raw_os_error(errno)),
        }
    }
}

/// The file behind a persistent arena: the descriptor chunks are allocated
/// through, and where the arena starts in it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Backing {
    pub fd: std::os::fd::RawFd,
    pub offset: u64,
}

/// How much of the arena to keep resident.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Target {
    /// Everything.
    Full,
    /// `window` bytes beyond the highest slot stored.
    Ahead { window: usize },
}

/// The running populator thread.
pub(crate) struct Populator {
    handle: Option<JoinHandle<()>>,
    thread: Thread,
    progress: Arc<ArenaProgress>,
}

impl Populator {
    /// Starts populating `len` bytes at `arena` towards `target`.
    ///
    /// # Safety
    /// `arena..arena + len` stays mapped read-write (private anonymous, or
    /// shared over `backing`'s file, whose descriptor stays open) until this
    /// populator is dropped.
    pub(crate) unsafe fn start(
        arena: *mut u8,
        len: usize,
        target: Target,
        progress: Arc<ArenaProgress>,
        backing: Option<Backing>,
    ) -> Result<Populator> {
        let arena = arena as usize;
        let shared = Arc::clone(&progress);
        // Waits for the thread to run (not to populate anything): see
        // `crate::thread`.
        let spawned = crate::thread::spawn_running(
            std::thread::Builder::new().name("kvtier-prefault".into()),
            move || populate_arena(arena, len, target, backing, &shared),
        );
        let handle = match spawned {
            Ok(handle) => handle,
            Err(e) => bail!(Alloc, "could not start the prefault thread: {e}"),
        };
        Ok(Populator {
            thread: handle.thread().clone(),
            handle: Some(handle),
            progress,
        })
    }

    /// The thread a store wakes when it uses up the window.
    pub(crate) fn thread(&self) -> &Thread {
        &self.thread
    }
}

impl Drop for Populator {
    /// Stops the thread after its current chunk and waits for it.
    fn drop(&mut self) {
        self.progress.stop.store(true, Ordering::SeqCst);
        self.thread.unpark();
        if let Some(handle) = self.handle.take() {
            let _ = handle.join();
        }
    }
}

/// The populator thread's body.
fn populate_arena(
    arena: usize,
    len: usize,
    target: Target,
    backing: Option<Backing>,
    p: &ArenaProgress,
) {
    lower_own_priority();
    while !p.stop.load(Ordering::SeqCst) {
        let stored = p.stored_end.load(Ordering::SeqCst);
        let goal = match target {
            Target::Full => len,
            Target::Ahead { window } => stored.saturating_add(window).min(len),
        };
        let from = p.populated.load(Ordering::Relaxed).max(stored);
        if from >= goal {
            let Target::Ahead { window } = target else {
                return; // everything is resident
            };
            if goal == len {
                return; // the window reached the end of the arena
            }
            // Sleep until stores have used half the window.
            p.wake_at.store(goal - window / 2, Ordering::SeqCst);
            if p.stored_end.load(Ordering::SeqCst) < goal - window / 2 {
                std::thread::park();
            }
            p.wake_at.store(usize::MAX, Ordering::SeqCst);
            continue;
        }
        let end = goal.min(from + CHUNK);
        // Page-aligned start: `stored` ends on a slot boundary, which need
        // not be a page boundary.
        let start = from / PAGE * PAGE;
        if let Some(file) = backing {
            if let Err(errno) = allocate(file, start, end - start) {
                p.gave_up_errno.store(errno, Ordering::Relaxed);
                return;
            }
        }
        // SAFETY: `start..end` lies inside the arena, which the owner keeps
        // mapped until it has joined this thread (and allocated in its file,
        // if it has one).
        if let Err(errno) = unsafe { populate((arena + start) as *mut u8, end - start) } {
            p.gave_up_errno.store(errno, Ordering::Relaxed);
            return;
        }
        p.populated.fetch_max(end, Ordering::Relaxed);
    }
}

const PAGE: usize = 4096;

/// Allocates `len` bytes of the arena from byte `at` in its file (pages it
/// holds already stay as they are); the errno on failure (ENOSPC).
pub(crate) fn allocate(file: Backing, at: usize, len: usize) -> std::result::Result<(), i32> {
    // SAFETY: a plain system call on a descriptor the arena's owner keeps open.
    let rc = unsafe {
        libc::fallocate(
            file.fd,
            0,
            (file.offset + at as u64) as libc::off_t,
            len as libc::off_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
    }
}

/// Makes `len` bytes at `ptr` resident and writable without changing them;
/// the errno on failure (out of memory, a signal).
///
/// # Safety
/// The range is inside a read-write mapping: private anonymous, or shared
/// over a file whose pages in the range are allocated (a store into a hole
/// of a full tmpfs is SIGBUS, which the fallback's writes would meet).
unsafe fn populate(ptr: *mut u8, len: usize) -> std::result::Result<(), i32> {
    if libc::madvise(ptr as *mut libc::c_void, len, libc::MADV_POPULATE_WRITE) == 0 {
        return Ok(());
    }
    let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
    if errno != libc::EINVAL {
        return Err(errno);
    }
    // A kernel before 5.14 (no MADV_POPULATE_WRITE): write-fault every page
    // with an atomic read-modify-write that leaves its bytes unchanged, so a
    // store writing the same page concurrently loses nothing.
    let mut at = ptr.align_offset(PAGE);
    while at < len {
        // SAFETY: page-aligned (so 8-byte aligned) and inside the range.
        let word = &*(ptr.add(at) as *const AtomicU64);
        word.fetch_or(0, Ordering::Relaxed);
        at += PAGE;
    }
    Ok(())
}

/// Nice 19 for the calling thread only (Linux applies `setpriority` to a
/// thread id). Best effort: at normal priority it still works, just less
/// politely.
fn lower_own_priority() {
    // SAFETY: plain system calls on the calling thread.
    unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        libc::setpriority(libc::PRIO_PROCESS, tid, 19);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_is_an_eighth_of_capacity_within_64_mib_and_1_gib() {
        assert_eq!(ahead_window(1 << 20), 1 << 20, "never above the capacity");
        assert_eq!(ahead_window(256 << 20), 64 << 20);
        assert_eq!(ahead_window(1 << 30), 128 << 20);
        assert_eq!(ahead_window(64 << 30), 1 << 30);
    }

    #[test]
    fn populating_keeps_bytes_a_store_wrote() {
        let len = 4 * PAGE;
        // SAFETY: a fresh private anonymous mapping, unmapped below.
        unsafe {
            let ptr = libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            ) as *mut u8;
            assert_ne!(ptr as *mut libc::c_void, libc::MAP_FAILED);
            ptr.add(PAGE + 7).write(0x5a);
            populate(ptr, len).unwrap();
            assert_eq!(ptr.add(PAGE + 7).read(), 0x5a);
            assert_eq!(ptr.add(2 * PAGE).read(), 0);
            libc::munmap(ptr as *mut libc::c_void, len);
        }
    }
}
