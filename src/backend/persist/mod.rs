//! The persistent memory arena (`persist_path`): the memory backend's arena
//! and index kept in a file on tmpfs or hugetlbfs, mapped shared, so that the
//! next tier over the same directory and namespace, after the process was
//! killed or restarted, finds every block that was completely stored.
//!
//! - `file.rs`: the file (one per namespace), its lock, its identity header.
//! - `record.rs`: each slot's record and the commit protocol.
//! - here: the backend. A store copies the row into its slot and publishes
//!   the record; a load copies the slot out, and checksums it the first
//!   time it reads a block of the file's previous life (blocks stored by
//!   this process are memory it wrote, as trusted as the anonymous arena's).
//!   `recover` lists the committed blocks, least recently used first;
//!   `discard` withdraws evicted and cleared blocks, so a reopen does not
//!   bring them back.
//!
//! The index hands out slots; a recovered block keeps the arena slot it was
//! stored in and gets whichever index slot the index gives it, so the
//! backend maps index slots to arena slots (a permutation, fixed once the
//! tier is open).

mod file;
mod record;

use self::file::{ArenaFile, Opened, CLOCK_AT};
use self::record::{Found, Record, RECORD_BYTES};
use super::prefault::{ahead_window, allocate, ArenaProgress, Backing, Populator, Target};
use super::{Backend, Discards, EachBlock, Persistence};
use crate::checksum_copy::copy_with_xxh3;
use crate::config::Prefault;
use crate::error::{bail, Error, ErrorKind, Result};
use crate::sync::Mutex;
use std::collections::hash_map::{Entry, HashMap};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

pub(crate) struct PersistentArena {
    file: ArenaFile,
    block_bytes: usize,
    slots: usize,
    /// Index slot → arena slot.
    arena_of: Box<[AtomicU32]>,
    /// Arena slot → index slot (the inverse, kept so a placement is a swap).
    index_of: Box<[AtomicU32]>,
    /// Per arena slot: its bytes were written by this process or checked
    /// against their checksum since it opened the file.
    trusted: Box<[AtomicBool]>,
    /// The arena slots of the blocks `recover` listed, in its order.
    recovered: Mutex<Vec<u32>>,
    prefault: Prefault,
    progress: Arc<ArenaProgress>,
    /// Dropped (stopped and joined) before the file is unmapped.
    populator: Option<Populator>,
}

// SAFETY: the mapping is plain bytes and atomic records. The index gives
// each slot to one writer (a store, while the slot is Storing) or to readers
// (loads, while it is Ready and pinned), never both; records are only
// accessed through atomics; the file's lock keeps other processes out.
unsafe impl Send for PersistentArena {}
unsafe impl Sync for PersistentArena {}

impl PersistentArena {
    pub(crate) fn open(
        dir: &Path,
        namespace: &str,
        block_bytes: usize,
        slots: usize,
        prefault: Prefault,
    ) -> Result<PersistentArena> {
        let file = ArenaFile::open(dir, namespace, block_bytes, slots)?;
        let g = file.geometry;
        let data_len = g.file_bytes - g.data_at;
        // SAFETY: data_at..file_bytes lies inside the mapping.
        let data = unsafe { file.base().add(g.data_at) };
        if block_bytes >= 2 << 20 {
            // Huge pages where the file system offers them on request (tmpfs
            // with shmem_enabled=advise). Advisory.
            // SAFETY: advice on our own mapping.
            unsafe { libc::madvise(data as *mut libc::c_void, data_len, libc::MADV_HUGEPAGE) };
        }
        let mut arena = PersistentArena {
            block_bytes,
            slots,
            arena_of: (0..slots as u32).map(AtomicU32::new).collect(),
            index_of: (0..slots as u32).map(AtomicU32::new).collect(),
            trusted: (0..slots).map(|_| AtomicBool::new(true)).collect(),
            recovered: Mutex::new(Vec::new()),
            prefault,
            progress: Arc::new(ArenaProgress::new()),
            populator: None,
            file,
        };
        let target = match prefault {
            Prefault::Off => None,
            Prefault::Background => Some(Target::Ahead {
                window: ahead_window(slots * block_bytes),
            }),
            Prefault::Full => Some(Target::Full),
        };
        if let Some(target) = target {
            let backing = Backing {
                fd: arena.file.fd(),
                offset: g.data_at as u64,
            };
            // SAFETY: the data stays mapped, and the descriptor open, until
            // `drop`, which drops the populator (stopping and joining it)
            // first. On failure here `arena` is dropped, unmapping it.
            let populator = unsafe {
                Populator::start(
                    data,
                    data_len,
                    target,
                    Arc::clone(&arena.progress),
                    Some(backing),
                )?
            };
            arena.populator = Some(populator);
        }
        Ok(arena)
    }

    fn record(&self, arena_slot: u32) -> &Record {
        let g = &self.file.geometry;
        assert!((arena_slot as usize) < self.slots);
        // SAFETY: records_at + slots * RECORD_BYTES lies inside the mapping,
        // 64-aligned (records_at is), zero or written by this module; every
        // field is an atomic, valid for any bits.
        unsafe {
            &*(self
                .file
                .base()
                .add(g.records_at + arena_slot as usize * RECORD_BYTES)
                as *const Record)
        }
    }

    fn block_ptr(&self, arena_slot: u32) -> *mut u8 {
        assert!((arena_slot as usize) < self.slots);
        let at = self.file.geometry.data_at + arena_slot as usize * self.block_bytes;
        // SAFETY: inside the mapping (data_at + slots * block_bytes <= file_bytes).
        unsafe { self.file.base().add(at) }
    }

    fn arena_slot(&self, slot: u32) -> u32 {
        self.arena_of[slot as usize].load(Ordering::Relaxed)
    }

    /// The file's clock: the last stamp handed out.
    fn clock(&self) -> &AtomicU64 {
        // SAFETY: CLOCK_AT is an 8-aligned offset inside the header.
        unsafe { &*(self.file.base().add(CLOCK_AT) as *const AtomicU64) }
    }

    /// A new stamp, later than every one this file has handed out.
    fn tick(&self) -> u64 {
        self.clock().fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Allocates the slot's pages in the file the first time the slot is
    /// written, so that a full file system fails the store (a write into a
    /// hole tmpfs cannot fill is SIGBUS).
    fn allocate_slot(&self, arena_slot: u32, rec: &Record) -> Result<()> {
        if rec.allocated() {
            return Ok(());
        }
        let backing = Backing {
            fd: self.file.fd(),
            offset: self.file.geometry.data_at as u64,
        };
        let at = arena_slot as usize * self.block_bytes;
        if let Err(errno) = allocate(backing, at, self.block_bytes) {
            bail!(
                Io,
                "persist_path: cannot allocate a block in {}: {}",
                self.file.path.display(),
                std::io::Error::from_raw_os_error(errno)
            );
        }
        rec.set_allocated();
        Ok(())
    }
}

impl Backend for PersistentArena {
    fn store(&self, slot: u32, key: &[u8], block: &[u8]) -> Result<u64> {
        assert!(!block.is_empty() && block.len() <= self.block_bytes);
        let p = self.arena_slot(slot);
        let rec = self.record(p);
        self.allocate_slot(p, rec)?;
        rec.begin();
        // SAFETY: the slot's block inside the mapping, allocated in the file,
        // written by this store alone (see the Sync note); `block` is the
        // caller's row, a distinct mapping.
        let sum = unsafe { copy_with_xxh3(block.as_ptr(), self.block_ptr(p), block.len()) };
        let short_len = if block.len() == self.block_bytes {
            0
        } else {
            block.len() as u64
        };
        rec.publish(key, sum, self.tick(), short_len);
        self.trusted[p as usize].store(true, Ordering::Relaxed);
        let end = (p as usize + 1) * self.block_bytes;
        self.progress
            .note_stored(end, self.populator.as_ref().map(Populator::thread));
        Ok(block.len() as u64)
    }

    fn stores_extents(&self) -> bool {
        true
    }

    fn load(&self, slot: u32, _key: &[u8], dst: &mut [u8]) -> Result<()> {
        let p = self.arena_slot(slot);
        let rec = self.record(p);
        let stored = rec.payload_len(self.block_bytes);
        if dst.len() != stored {
            return Err(Error::new(
                ErrorKind::InvalidArg,
                format!(
                    "persist_path: the block was stored with {stored} bytes; the load asked for {}",
                    dst.len()
                ),
            )
            .wrong_length());
        }
        let src = self.block_ptr(p);
        if self.trusted[p as usize].load(Ordering::Relaxed) {
            // SAFETY: a Ready, pinned slot (no writer); dst is distinct.
            unsafe { std::ptr::copy_nonoverlapping(src, dst.as_mut_ptr(), dst.len()) }
        } else {
            // SAFETY: as above.
            let sum = unsafe { copy_with_xxh3(src, dst.as_mut_ptr(), dst.len()) };
            if sum != rec.sum() {
                // Never found again, by this tier or the next.
                rec.withdraw(rec.stamp());
                bail!(
                    Corrupt,
                    "persist_path: a block of {} failed its checksum",
                    self.file.path.display()
                );
            }
            self.trusted[p as usize].store(true, Ordering::Relaxed);
        }
        rec.touch(self.tick());
        Ok(())
    }

    fn describe(&self) -> String {
        let opened = match &self.file.opened {
            Opened::Created => "created".to_string(),
            Opened::Reopened => format!(
                "reopened with {} blocks of its previous life",
                self.recovered.lock().len()
            ),
            Opened::Reset(why) => format!("made anew: {why}"),
        };
        let mut line = format!(
            "memory: {} slots of {} bytes in {} ({}, format {}, {opened}), prefault {}",
            self.slots,
            self.block_bytes,
            self.file.path.display(),
            self.file.fs_name,
            file::VERSION,
            self.prefault.name()
        );
        if let Some(err) = self.progress.gave_up() {
            line.push_str(&format!(" (stopped early: {err})"));
        }
        line
    }

    fn resident_bytes(&self) -> u64 {
        self.file.allocated_bytes()
    }

    fn release_in_forked_child(&self) {
        self.file.release_lock_in_forked_child();
        // The child's page-table entries of the shared file; the pages stay
        // in the file, and a read would fault them in again, so nothing
        // dangles. Advisory.
        // SAFETY: advice on our own mapping, which no thread of this
        // process uses any more.
        unsafe {
            libc::madvise(
                self.file.base() as *mut libc::c_void,
                self.file.geometry.file_bytes,
                libc::MADV_DONTNEED,
            )
        };
    }

    fn persistence(&self) -> Option<&dyn Persistence> {
        Some(self)
    }

    fn discards(&self) -> Option<&dyn Discards> {
        Some(self)
    }
}

impl Persistence for PersistentArena {
    fn recover(&self) -> Result<Vec<Vec<u8>>> {
        let mut newest: HashMap<Vec<u8>, (u64, u32, u64)> = HashMap::new();
        let mut latest = 0;
        for p in 0..self.slots as u32 {
            let rec = self.record(p);
            match rec.read() {
                Found::Nothing => {}
                Found::Damaged(stamp) => {
                    rec.withdraw(stamp);
                }
                Found::Block(held) => {
                    latest = latest.max(held.stamp).max(held.used);
                    // The same key in two slots: a block evicted and stored
                    // again before its release reached the file. The more
                    // recently used one is the block; the other is withdrawn.
                    match newest.entry(held.key) {
                        Entry::Occupied(mut kept) => {
                            let (used, q, stamp) = *kept.get();
                            if used >= held.used {
                                rec.withdraw(held.stamp);
                            } else {
                                kept.insert((held.used, p, held.stamp));
                                self.record(q).withdraw(stamp);
                            }
                        }
                        Entry::Vacant(new) => {
                            new.insert((held.used, p, held.stamp));
                        }
                    }
                }
            }
        }
        self.clock().fetch_max(latest, Ordering::Relaxed);
        let mut blocks: Vec<(u64, u32, Vec<u8>)> = newest
            .into_iter()
            .map(|(key, (used, p, _))| (used, p, key))
            .collect();
        blocks.sort_unstable_by_key(|&(used, p, _)| (used, p));
        let mut recovered = self.recovered.lock();
        recovered.clear();
        for &(_, p, _) in &blocks {
            self.trusted[p as usize].store(false, Ordering::Relaxed);
            recovered.push(p);
        }
        Ok(blocks.into_iter().map(|(_, _, key)| key).collect())
    }

    fn recovered_at(&self, i: usize, slot: u32) {
        let Some(&p) = self.recovered.lock().get(i) else {
            return;
        };
        // Swap: `slot` now maps to `p`, and the index slot that mapped to
        // `p` takes what `slot` mapped to. Still a permutation.
        let old = self.arena_of[slot as usize].load(Ordering::Relaxed);
        let other = self.index_of[p as usize].load(Ordering::Relaxed);
        self.arena_of[other as usize].store(old, Ordering::Relaxed);
        self.index_of[old as usize].store(other, Ordering::Relaxed);
        self.arena_of[slot as usize].store(p, Ordering::Relaxed);
        self.index_of[p as usize].store(slot, Ordering::Relaxed);
    }

    fn save_on_close(&self, each_block: &mut EachBlock<'_>) {
        // Recency as the index knew it, touches included: stamps in LRU
        // order, every one later than any the file has.
        each_block(&mut |slot, _| self.record(self.arena_slot(slot)).touch(self.tick()));
    }
}

impl Discards for PersistentArena {
    fn discard(&self, released: &[(u32, Vec<u8>)], is_live: &dyn Fn(&[u8]) -> bool) {
        for (slot, key) in released {
            let rec = self.record(self.arena_slot(*slot));
            // Only the released block: the slot may hold a newer one (its
            // stamp differs) or another key already; and a key stored again
            // into the same slot is live.
            if let Some(stamp) = rec.holding(key) {
                if !is_live(key) {
                    rec.withdraw(stamp);
                }
            }
        }
    }
}

impl Drop for PersistentArena {
    fn drop(&mut self) {
        // The populator writes the mapping: it ends before the mapping does
        // (ArenaFile's drop, after this).
        drop(self.populator.take());
    }
}
