//! The key index: which key owns which storage slot, in which state, and the LRU
//! order of the readable ones.
//!
//! Memory layout is chosen for a million-block tier, where the whole index
//! (about 72 bytes per block, no allocation per block) no longer fits in cache
//! but the parts lookups and touches read mostly do:
//! - an open-addressing table of 12-byte buckets (32-bit hash tag, slot, and a
//!   hot word of 30 more hash bits + lookup state), about 18 MiB per million
//!   blocks: a lookup reads one place;
//! - the LRU links (two u32 per slot), 8 MiB;
//! - the 48-byte records (key inline up to 40 bytes, state, pins), which only
//!   jobs read: they verify the full key, while lookups and touches decide by
//!   62 bits of hash (a collision could only make a lookup answer HIT for a
//!   key whose load then fails cleanly, never move wrong bytes).
//!
//! Batches of lookups and touches run as a software pipeline: hash a key and
//! prefetch its bucket, decide a key a few places back (touch adds stages that
//! prefetch the LRU links it will rewrite, then relinks). The memory reads of
//! successive keys overlap instead of waiting one after another.
//!
//! Slot numbers double as the storage location in the memory backend's arena.
//!
//! Files: `jobs` (what a store or a load does to the index, one call per
//! stage), `table` (the hash table and hot words), `lru` (recency list and
//! victims), `slots` (slot allocation and reservation), `batch` (the lookup
//! and touch pipelines), `releases` (freed keys, for backends that release
//! storage), `events` (block events at state changes). This file holds the
//! index itself and the per-slot state machine.

mod batch;
mod events;
mod jobs;
mod lru;
mod releases;
mod slots;
mod table;
#[cfg(test)]
mod tests;

use self::lru::Link;
use self::table::{hot_matches, hot_state, hot_word, tag_of, Bucket, Table};
use crate::events::{EventLog, RemovedReason, StoredReason};
use crate::key::{KeyHasher, MAX_KEY_LEN};
use std::collections::HashMap;

pub(crate) use self::jobs::{Admitted, Deleted, Item, LoadOutcome};
use self::slots::try_long_tail;

/// Key bytes kept in the slot record; longer keys keep the rest apart.
pub(crate) const INLINE_KEY: usize = 40;
const NIL: u32 = u32::MAX;

/// The state of an allocated slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum SlotState {
    /// On the free list.
    Free,
    /// A store job is copying into it; looks up as PENDING, not evictable.
    Storing,
    /// Readable; in the LRU list while linked.
    Ready,
    /// Its store failed while a load was waiting on it, or its stored block
    /// was forgotten while pinned; freed at the last unpin.
    Dead,
}

/// What a lookup reports for one key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum LookupState {
    /// Not stored.
    Miss = 0,
    /// Stored and readable.
    Hit = 1,
    /// Being stored; ask again.
    Pending = 2,
}

impl LookupState {
    /// The state a lookup byte (`TIER_MISS`, `TIER_HIT`, `TIER_PENDING`)
    /// stands for; any other byte reads as a miss.
    #[inline]
    pub fn from_byte(byte: u8) -> LookupState {
        match byte {
            1 => LookupState::Hit,
            2 => LookupState::Pending,
            _ => LookupState::Miss,
        }
    }
}

/// One block's record, read by jobs (which verify full keys), not by lookups.
#[derive(Clone, Copy)]
struct Slot {
    key: [u8; INLINE_KEY],
    key_len: u8,
    state: SlotState,
    /// In the hash table (and, when Ready, in the LRU list). Cleared entries that
    /// are still in use by a job stay allocated but unlinked until released.
    linked: bool,
    pins: u32,
}

impl Slot {
    const EMPTY: Slot = Slot {
        key: [0; INLINE_KEY],
        key_len: 0,
        state: SlotState::Free,
        linked: false,
        pins: 0,
    };
}

/// Counts from one lookup batch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct LookupCounts {
    pub hits: u64,
    pub misses: u64,
    pub pending: u64,
}

/// The index. Not thread-safe by itself; the tier keeps it under one mutex.
pub(crate) struct Index {
    hasher: KeyHasher,
    slots: Vec<Slot>,
    links: Vec<Link>,
    free: Vec<u32>,
    capacity: u32,
    table: Table,
    /// Tails of keys longer than the inline part, by slot.
    long_keys: HashMap<u32, Box<[u8]>>,
    lru_head: u32,
    lru_tail: u32,
    ready: u32,
    /// Keys of freed blocks that held data, for backends that must release
    /// storage (`None`: not tracked).
    released: Option<Vec<(u32, Vec<u8>)>>,
    /// With `released`: keys of allocated but unlinked slots (cleared or
    /// forgotten while a job still uses them), with their count. Their storage
    /// is still in use although lookups no longer see them.
    unlinked_keys: HashMap<Box<[u8]>, u32>,
    /// Block events, when the tier records them.
    events: Option<EventLog>,
}

impl Index {
    /// An index for at most `capacity` blocks.
    pub(crate) fn new(capacity: u32, hasher: KeyHasher) -> Index {
        assert!(capacity < NIL, "capacity must fit below u32::MAX");
        Index {
            hasher,
            slots: Vec::new(),
            links: Vec::new(),
            free: Vec::new(),
            capacity,
            table: Table::with_capacity(capacity.min(1024) as usize),
            long_keys: HashMap::new(),
            lru_head: NIL,
            lru_tail: NIL,
            ready: 0,
            released: None,
            unlinked_keys: HashMap::new(),
            events: None,
        }
    }

    pub(crate) fn capacity(&self) -> u32 {
        self.capacity
    }

    /// Slots held by blocks (ready, being stored, or released-but-in-use).
    pub(crate) fn allocated(&self) -> u32 {
        (self.slots.len() - self.free.len()) as u32
    }

    /// Readable blocks reachable by lookup.
    pub(crate) fn ready(&self) -> u32 {
        self.ready
    }

    fn free_slots(&self) -> u32 {
        self.capacity - self.allocated()
    }

    /// Bytes of memory the index uses: the parts of its arrays in use (their
    /// unused growth reserve is address space, not resident memory) and the
    /// whole hash table.
    pub(crate) fn metadata_bytes(&self) -> usize {
        self.slots.len() * std::mem::size_of::<Slot>()
            + self.links.len() * std::mem::size_of::<Link>()
            + self.free.len() * 4
            + self.table.buckets.len() * std::mem::size_of::<Bucket>()
            + self.long_keys.values().map(|k| k.len() + 32).sum::<usize>()
    }

    #[inline]
    fn hash(&self, key: &[u8]) -> u64 {
        self.hasher.hash(key)
    }

    #[inline]
    fn key_eq(&self, slot: u32, key: &[u8]) -> bool {
        let s = &self.slots[slot as usize];
        if s.key_len as usize != key.len() {
            return false;
        }
        let inline = key.len().min(INLINE_KEY);
        s.key[..inline] == key[..inline]
            && (key.len() <= INLINE_KEY || *self.long_keys[&slot] == key[INLINE_KEY..])
    }

    /// Writes slot `slot`'s key into `out` and returns its length.
    fn key_of(&self, slot: u32, out: &mut [u8; MAX_KEY_LEN]) -> usize {
        let s = &self.slots[slot as usize];
        let len = s.key_len as usize;
        let inline = len.min(INLINE_KEY);
        out[..inline].copy_from_slice(&s.key[..inline]);
        if len > INLINE_KEY {
            out[INLINE_KEY..len].copy_from_slice(&self.long_keys[&slot]);
        }
        len
    }

    /// The linked slot holding `key`, whose hash is `hash`, verified against
    /// the full key (for jobs, which must never mistake one block for another).
    #[inline]
    fn find(&self, key: &[u8], hash: u64) -> Option<u32> {
        self.table
            .first(tag_of(hash), |b| self.key_eq(b.slot1 - 1, key))
            .map(|b| b.slot1 - 1)
    }

    /// The linked slot whose key has this 64-bit hash (32 bits as the tag,
    /// 30 more in the hot word), and its lookup state, from the table alone:
    /// two keys share 62 bits of hash with probability 2^-62, and a wrong
    /// answer could only send a load to a key it then fails to find, because
    /// jobs verify the full key.
    #[inline(always)]
    fn find_hashed(&self, hash: u64) -> Option<(u32, LookupState)> {
        self.table
            .first(tag_of(hash), |b| hot_matches(b.hot, hash))
            .map(|b| (b.slot1 - 1, hot_state(b.hot)))
    }

    fn state(&self, slot: u32) -> SlotState {
        self.slots[slot as usize].state
    }

    fn pin(&mut self, s: u32) {
        let slot = &mut self.slots[s as usize];
        slot.pins = slot.pins.checked_add(1).expect("pin count overflow");
    }

    /// Drops one pin; frees the slot if it was released while pinned. Returns
    /// true if the slot was freed.
    fn unpin(&mut self, s: u32) -> bool {
        let slot = &mut self.slots[s as usize];
        debug_assert!(slot.pins > 0);
        slot.pins -= 1;
        if slot.pins == 0 && !slot.linked && slot.state != SlotState::Storing {
            self.free_slot(s);
            return true;
        }
        false
    }

    /// Removes a Ready, linked, unpinned slot and frees it (eviction).
    /// Allocates nothing once [`Index::reserve`] made room.
    fn evict(&mut self, s: u32) {
        debug_assert_eq!(self.slots[s as usize].state, SlotState::Ready);
        debug_assert_eq!(self.slots[s as usize].pins, 0);
        debug_assert!(self.slots[s as usize].linked);
        self.note_removed(s, RemovedReason::Evicted);
        // Unlinked and freed at once: never counted among unlinked keys.
        self.unlink_quietly(s);
        self.release_slot(s);
    }

    /// Takes the slot out of the table (and the LRU list); it stays allocated.
    fn unlink(&mut self, s: u32) {
        if !self.slots[s as usize].linked {
            return;
        }
        self.unlink_quietly(s);
        self.note_unlinked(s, 1);
    }

    /// [`Index::unlink`] of a linked slot, without counting it among unlinked
    /// keys.
    fn unlink_quietly(&mut self, s: u32) {
        let hash = self.slot_hash(s);
        self.table.remove(tag_of(hash), s);
        if self.slots[s as usize].state == SlotState::Ready {
            self.lru_unlink(s);
            self.ready -= 1;
        }
        self.slots[s as usize].linked = false;
    }

    fn slot_hash(&self, s: u32) -> u64 {
        let mut buf = [0u8; MAX_KEY_LEN];
        let len = self.key_of(s, &mut buf);
        self.hasher.hash(&buf[..len])
    }

    /// Adds a readable block found in storage (recovery, probes) as the most
    /// recently used. The caller has checked `free_slots() > 0` and that the key
    /// is absent.
    fn insert_ready(&mut self, key: &[u8], hash: u64, reason: StoredReason) -> u32 {
        let s = self.insert_storing(key, hash);
        self.finish_store(s, true);
        self.note_stored(s, reason);
        s
    }

    /// Forgets a block whose storage turned out missing, corrupt or unreadable:
    /// it looks up as MISS at once, and its slot is freed when the last pin
    /// goes. The slot is not reported as released: what is in storage is the
    /// backend's to judge (already removed, gone, or kept because nothing was
    /// proved against it, or because it is a newer block of another writer).
    fn forget(&mut self, s: u32, reason: RemovedReason) {
        if self.slots[s as usize].state != SlotState::Ready || !self.slots[s as usize].linked {
            return;
        }
        self.note_removed(s, reason);
        self.unlink(s);
        self.slots[s as usize].state = SlotState::Dead;
        if self.slots[s as usize].pins == 0 {
            self.free_slot(s);
        }
    }

    /// Finishes a store into `s`: on success the block becomes readable and most
    /// recently used; on failure it disappears (or turns Dead while pinned).
    fn finish_store(&mut self, s: u32, ok: bool) {
        debug_assert_eq!(self.slots[s as usize].state, SlotState::Storing);
        let linked = self.slots[s as usize].linked;
        if ok {
            self.slots[s as usize].state = SlotState::Ready;
            if linked {
                let hash = self.slot_hash(s);
                self.table
                    .set_hot(tag_of(hash), s, hot_word(hash, LookupState::Hit));
                self.lru_push_mru(s);
                self.ready += 1;
                return;
            }
        } else {
            self.unlink(s);
            self.slots[s as usize].state = SlotState::Dead;
        }
        if self.slots[s as usize].pins == 0 {
            self.free_slot(s);
        }
    }

    /// Whether the slot holds a block lookups answer HIT for.
    fn is_readable(&self, s: u32) -> bool {
        let slot = &self.slots[s as usize];
        slot.state == SlotState::Ready && slot.linked
    }

    /// Makes a readable block the most recently used (a load read it).
    fn refresh(&mut self, s: u32) {
        if self.is_readable(s) {
            self.lru_unlink(s);
            self.lru_push_mru(s);
        }
    }

    /// Drops every block. Blocks in use by a job (being stored, or pinned by a
    /// load) are unlinked at once, so they look up as MISS, and are freed when
    /// their job releases them.
    pub(crate) fn clear(&mut self) {
        for s in 0..self.slots.len() as u32 {
            let slot = self.slots[s as usize];
            if slot.state == SlotState::Free || !slot.linked {
                continue;
            }
            if slot.state == SlotState::Ready {
                self.note_removed(s, RemovedReason::Cleared);
            }
            self.slots[s as usize].linked = false;
            self.links[s as usize] = Link::NONE;
            self.note_unlinked(s, 1);
            if slot.state == SlotState::Ready && slot.pins == 0 {
                self.free_slot(s);
            }
        }
        self.table.clear();
        self.lru_head = NIL;
        self.lru_tail = NIL;
        self.ready = 0;
    }
}
