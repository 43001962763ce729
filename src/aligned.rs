//! Buffers for O_DIRECT I/O: page-aligned, and physically contiguous where
//! that matters.
//!
//! An O_DIRECT read or write takes one scatter-gather segment per run of
//! physically contiguous memory, and a device splits a request with more
//! segments than it allows: 254 on virtio-blk, 127-128 on many NVMe drives,
//! 128 of at most 64 KiB on a loop device. Memory of scattered 4 KiB pages
//! is a segment per page, so a 1 MiB read into it goes to such a device as
//! two or more requests. A buffer of 256 KiB or more is therefore mapped in
//! huge pages (2 MiB-aligned, `MADV_HUGEPAGE`) where the kernel grants them
//! (`kvtier-bench --backend disk --repeat 3 --gib 1`; the runs are in
//! docs/runs/disk.md).

use std::io;
use std::ptr::NonNull;

const PAGE: usize = 4096;
const HUGE_PAGE: usize = 2 << 20;
/// Smaller buffers have at most 64 pages, within every device's segment
/// limit; a huge page each would waste memory (32 workers loading 64 KiB
/// blocks would hold 64 MiB).
const HUGE_FROM: usize = 256 << 10;

/// A zero-initialized buffer, 4096-byte aligned; from 256 KiB, in huge
/// pages when transparent huge pages are not turned off (the advice is
/// advisory: without it the buffer is 4 KiB pages, and works the same).
pub(crate) struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
    /// The mapping, which starts at or before `ptr` (huge-page alignment).
    map: NonNull<u8>,
    mapped: usize,
}

// SAFETY: plain owned bytes.
unsafe impl Send for AlignedBuf {}

impl AlignedBuf {
    /// A buffer of at least `len` bytes (rounded up to whole pages, or to
    /// whole huge pages from 256 KiB); an error of kind `OutOfMemory` if the
    /// memory is not available.
    pub(crate) fn new(len: usize) -> io::Result<AlignedBuf> {
        let no_memory = |err: Option<io::Error>| {
            let why = err.map(|e| format!(": {e}")).unwrap_or_default();
            io::Error::new(
                io::ErrorKind::OutOfMemory,
                format!("could not allocate {len} bytes for an aligned I/O buffer{why}"),
            )
        };
        let huge = len >= HUGE_FROM;
        let unit = if huge { HUGE_PAGE } else { PAGE };
        let rounded = len
            .max(1)
            .checked_next_multiple_of(unit)
            .ok_or_else(|| no_memory(None))?;
        // mmap returns whole pages; one huge page more leaves room to align
        // the start to one.
        let mapped = rounded
            .checked_add(if huge { HUGE_PAGE } else { 0 })
            .ok_or_else(|| no_memory(None))?;
        // SAFETY: a fresh private anonymous mapping; no existing memory is
        // affected.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                mapped,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if map == libc::MAP_FAILED {
            return Err(no_memory(Some(io::Error::last_os_error())));
        }
        let map = NonNull::new(map as *mut u8).expect("mmap returned NULL");
        let start = map.as_ptr().align_offset(unit);
        // SAFETY: `start` < `unit` when huge (0 otherwise: mmap returns whole
        // pages), so `start + rounded` <= `mapped`.
        let ptr = unsafe { map.add(start) };
        if huge {
            // SAFETY: advice on our own mapping; refused (THP off), it
            // changes nothing.
            unsafe { libc::madvise(ptr.as_ptr().cast(), rounded, libc::MADV_HUGEPAGE) };
        }
        Ok(AlignedBuf {
            ptr,
            len: rounded,
            map,
            mapped,
        })
    }

    /// The first `len` bytes of the buffer kept in `slot`, which is replaced
    /// by a larger one first if it holds fewer (or none): for a buffer
    /// reused call after call by one thread. The old buffer is freed before
    /// the new one is mapped, so the two never take memory at once.
    pub(crate) fn reuse(slot: &mut Option<AlignedBuf>, len: usize) -> io::Result<&mut [u8]> {
        if slot.as_ref().is_none_or(|b| b.len() < len) {
            *slot = None;
            *slot = Some(AlignedBuf::new(len)?);
        }
        let buf = slot.as_mut().expect("filled above");
        Ok(&mut buf.as_mut_slice()[..len])
    }

    /// Usable bytes: at least what [`AlignedBuf::new`] was asked for.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn as_slice(&self) -> &[u8] {
        // SAFETY: owned, mapped (so initialized: zero or written), len bytes.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and exclusively borrowed.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: our own mapping, no longer borrowed (`&mut self`).
        unsafe { libc::munmap(self.map.as_ptr().cast(), self.mapped) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_buffers_are_page_aligned_zeroed_whole_pages() {
        let mut b = AlignedBuf::new(8000).unwrap();
        assert_eq!(b.len(), 8192);
        assert_eq!(b.as_slice().as_ptr() as usize % PAGE, 0);
        assert!(b.as_slice().iter().all(|&x| x == 0));
        b.as_mut_slice()[8191] = 7;
        assert_eq!(b.as_slice()[8191], 7);
    }

    #[test]
    fn large_buffers_start_on_a_huge_page_and_are_zeroed() {
        let mut b = AlignedBuf::new(1 << 20).unwrap();
        assert_eq!(b.len(), HUGE_PAGE, "rounded up to a whole huge page");
        assert_eq!(b.as_slice().as_ptr() as usize % HUGE_PAGE, 0);
        assert!(b.as_slice().iter().all(|&x| x == 0));
        b.as_mut_slice()[HUGE_PAGE - 1] = 9;
        assert_eq!(b.as_slice()[HUGE_PAGE - 1], 9);
    }

    #[test]
    fn a_reused_buffer_grows_only_when_asked_for_more() {
        let mut slot = None;
        AlignedBuf::reuse(&mut slot, 100).unwrap()[99] = 1;
        let first = slot.as_ref().unwrap().as_slice().as_ptr();
        assert_eq!(AlignedBuf::reuse(&mut slot, 4096).unwrap()[99], 1, "kept");
        assert_eq!(slot.as_ref().unwrap().as_slice().as_ptr(), first);
        assert_eq!(
            AlignedBuf::reuse(&mut slot, 1 << 20).unwrap().len(),
            1 << 20
        );
        assert_eq!(slot.as_ref().unwrap().len(), HUGE_PAGE);
        let err = AlignedBuf::reuse(&mut slot, usize::MAX - 4096)
            .err()
            .unwrap();
        assert_eq!(err.kind(), io::ErrorKind::OutOfMemory);
    }

    #[test]
    fn an_impossible_size_is_out_of_memory_not_a_panic() {
        let err = AlignedBuf::new(usize::MAX - 4096).err().unwrap();
        assert_eq!(err.kind(), io::ErrorKind::OutOfMemory);
        let err = AlignedBuf::new(isize::MAX as usize).err().unwrap();
        assert_eq!(err.kind(), io::ErrorKind::OutOfMemory);
    }
}
