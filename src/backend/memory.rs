//! The in-memory backend: one anonymous mapping of `capacity` slots.
//!
//! The mapping is reserved, not committed (`MAP_NORESERVE`), so capacity that
//! was never written costs no resident memory; a slot's pages become resident on
//! its first store, or earlier through `prefault` (see `prefault.rs`), and are
//! reused after eviction.

use super::prefault::{ahead_window, ArenaProgress, Populator, Target};
use super::Backend;
use crate::config::Prefault;
use crate::error::{bail, Error, ErrorKind, Result};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

pub(crate) struct MemoryBackend {
    arena: NonNull<u8>,
    mapped_len: usize,
    block_bytes: usize,
    slots: usize,
    prefault: Prefault,
    progress: Arc<ArenaProgress>,
    /// Dropped (stopped and joined) before the arena is unmapped.
    populator: Option<Populator>,
    /// Each slot's stored length (1 to `block_bytes`: an extent store may
    /// be shorter than a block), written by its store, read by its loads.
    lengths: Vec<AtomicU32>,
}

// SAFETY: the arena is plain bytes. The index gives each slot to one writer
// (a store, while the slot is Storing) or to readers (loads, while it is Ready
// and pinned), never both, so no two threads race on one slot.
unsafe impl Send for MemoryBackend {}
unsafe impl Sync for MemoryBackend {}

impl MemoryBackend {
    pub(crate) fn new(
        block_bytes: usize,
        slots: usize,
        prefault: Prefault,
    ) -> Result<MemoryBackend> {
        let Some(len) = block_bytes
            .checked_mul(slots)
            .filter(|&l| l <= isize::MAX as usize / 2)
        else {
            bail!(Config, "capacity_bytes: {slots} blocks of {block_bytes} bytes do not fit in the address space");
        };
        let mut lengths = crate::error::try_vec(slots, "the memory backend's block lengths")?;
        lengths.extend((0..slots).map(|_| AtomicU32::new(0)));
        let page = 4096;
        let mapped_len = len.div_ceil(page) * page;
        // SAFETY: a fresh private anonymous mapping; no existing memory is affected.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                mapped_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            let err = std::io::Error::last_os_error();
            bail!(
                Alloc,
                "could not reserve {mapped_len} bytes for the memory backend: {err}"
            );
        }
        if block_bytes >= 2 << 20 {
            // Whole huge pages per block: fewer page faults on first store and
            // fewer TLB misses per copy. Advisory; failure changes nothing.
            // SAFETY: advice on our own mapping.
            unsafe { libc::madvise(ptr, mapped_len, libc::MADV_HUGEPAGE) };
        }
        let mut backend = MemoryBackend {
            arena: NonNull::new(ptr as *mut u8).expect("mmap returned NULL"),
            mapped_len,
            block_bytes,
            slots,
            prefault,
            progress: Arc::new(ArenaProgress::new()),
            populator: None,
            lengths,
        };
        let target = match prefault {
            Prefault::Off => None,
            Prefault::Background => Some(Target::Ahead {
                window: ahead_window(len),
            }),
            Prefault::Full => Some(Target::Full),
        };
        if let Some(target) = target {
            let progress = Arc::clone(&backend.progress);
            // SAFETY: the arena stays mapped until `drop`, which drops the
            // populator (stopping and joining it) before unmapping. On
            // failure here `backend` is dropped, unmapping the arena.
            let populator =
                unsafe { Populator::start(ptr as *mut u8, mapped_len, target, progress, None)? };
            backend.populator = Some(populator);
        }
        Ok(backend)
    }

    fn slot_ptr(&self, slot: u32) -> *mut u8 {
        let slot = slot as usize;
        assert!(slot < self.slots, "slot {slot} outside the arena");
        // SAFETY: in bounds of the mapping (checked above).
        unsafe { self.arena.as_ptr().add(slot * self.block_bytes) }
    }
}

impl Backend for MemoryBackend {
    fn store(&self, slot: u32, _key: &[u8], block: &[u8]) -> Result<u64> {
        assert!(!block.is_empty() && block.len() <= self.block_bytes);
        let dst = self.slot_ptr(slot);
        // SAFETY: dst is this slot's block inside the arena, written by this
        // store alone (see the Sync note); `block` is a distinct allocation.
        unsafe { std::ptr::copy_nonoverlapping(block.as_ptr(), dst, block.len()) }
        self.lengths[slot as usize].store(block.len() as u32, Ordering::Release);
        let end = (slot as usize + 1) * self.block_bytes;
        self.progress
            .note_stored(end, self.populator.as_ref().map(Populator::thread));
        Ok(block.len() as u64)
    }

    fn load(&self, slot: u32, _key: &[u8], dst: &mut [u8]) -> Result<()> {
        let src = self.slot_ptr(slot);
        let stored = self.lengths[slot as usize].load(Ordering::Acquire) as usize;
        if dst.len() != stored {
            return Err(Error::new(
                ErrorKind::InvalidArg,
                format!(
                    "the block was stored with {stored} bytes; the load asked for {}",
                    dst.len()
                ),
            )
            .wrong_length());
        }
        // SAFETY: src is a Ready, pinned slot (no writer); dst is distinct.
        unsafe { std::ptr::copy_nonoverlapping(src, dst.as_mut_ptr(), dst.len()) }
        Ok(())
    }

    fn stores_extents(&self) -> bool {
        true
    }

    fn describe(&self) -> String {
        let mut line = format!(
            "memory: {} slots of {} bytes, prefault {}",
            self.slots,
            self.block_bytes,
            self.prefault.name()
        );
        if let Some(err) = self.progress.gave_up() {
            line.push_str(&format!(" (stopped early: {err})"));
        }
        line
    }

    fn resident_bytes(&self) -> u64 {
        self.progress.resident_bytes(self.mapped_len)
    }

    fn release_in_forked_child(&self) {
        // The child shares the arena's pages with the parent copy-on-write.
        // MADV_DONTNEED drops the child's references (its resident memory
        // falls, and the parent's next writes to those pages need no copy)
        // while the mapping stays valid: a read would see zeros, not fault,
        // so `arena` does not dangle. Unmapping would make it dangle. The
        // parent's pages are its own and unaffected. Advisory; a failure
        // only means the pages stay shared until the child exits.
        // SAFETY: advice on our own private mapping, which no thread of this
        // process uses any more (the workers live in the parent only, and
        // every call on the tier is refused in the child).
        unsafe {
            libc::madvise(
                self.arena.as_ptr() as *mut libc::c_void,
                self.mapped_len,
                libc::MADV_DONTNEED,
            )
        };
    }
}

impl Drop for MemoryBackend {
    fn drop(&mut self) {
        // The populator writes the arena: it ends before the mapping does.
        drop(self.populator.take());
        // SAFETY: unmapping our own mapping; workers have been joined.
        unsafe { libc::munmap(self.arena.as_ptr() as *mut libc::c_void, self.mapped_len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    /// Pages of the arena the kernel holds resident, by `mincore`.
    fn pages_in_core(b: &MemoryBackend) -> usize {
        let mut vec = vec![0u8; b.mapped_len.div_ceil(4096)];
        // SAFETY: our own mapping, and one byte of `vec` per page.
        let rc = unsafe {
            libc::mincore(
                b.arena.as_ptr() as *mut libc::c_void,
                b.mapped_len,
                vec.as_mut_ptr(),
            )
        };
        assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
        vec.iter().filter(|&&v| v & 1 == 1).count()
    }

    #[test]
    fn resident_bytes_agrees_with_the_kernel() {
        let block = 64 << 10;
        let off = MemoryBackend::new(block, 64, Prefault::Off).unwrap();
        assert_eq!((off.resident_bytes(), pages_in_core(&off)), (0, 0));
        off.store(2, b"k", &vec![7u8; block]).unwrap();
        // Slots 0 and 1 were never written: counted resident all the same,
        // since the allocator hands slots out in order (see prefault.rs).
        assert_eq!(off.resident_bytes(), 3 * block as u64);
        assert_eq!(pages_in_core(&off), block / 4096);

        let full = MemoryBackend::new(block, 64, Prefault::Full).unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        while full.resident_bytes() < (64 * block) as u64 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(2));
        }
        assert_eq!(full.resident_bytes(), (64 * block) as u64);
        assert_eq!(pages_in_core(&full), 64 * block / 4096);
    }
}
