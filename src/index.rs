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

use crate::error::{alloc_error, try_reserve as try_reserve_vec, Result};
use crate::hash::KeyHasher;
use std::collections::HashMap;

/// Longest accepted key, in bytes.
pub const MAX_KEY_LEN: usize = 128;
/// Key bytes kept in the slot record; longer keys keep the rest apart.
pub(crate) const INLINE_KEY: usize = 40;
const NIL: u32 = u32::MAX;
/// Pipeline distance between hashing a key and deciding it.
const AHEAD: usize = 16;
/// Ring of in-flight lookups (a power of two above AHEAD).
const RING: usize = 64;
/// Pipeline distance between a touch's stages.
const TOUCH_AHEAD: usize = 16;
/// Ring of in-flight touches (a power of two above 3 * TOUCH_AHEAD).
const TOUCH_RING: usize = 128;

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

/// A slot's neighbours in the LRU list (NIL at the ends and when unlisted).
#[derive(Clone, Copy)]
struct Link {
    prev: u32,
    next: u32,
}

impl Link {
    const NONE: Link = Link {
        prev: NIL,
        next: NIL,
    };
}

/// One table entry, 12 bytes: the high half of the key's hash (`tag`, which
/// also places it), the slot number plus one (0: empty), and the slot's hot
/// word (see [`hot_word`]), so that a lookup reads one place in memory.
#[derive(Clone, Copy, Default)]
#[repr(C)]
struct Bucket {
    tag: u32,
    slot1: u32,
    hot: u32,
}

/// Open addressing with linear probing and backward-shift deletion. The size
/// is any number (it grows by half), and a bucket's home is the tag scaled to
/// it, so the table can be rebuilt without rehashing keys.
struct Table {
    buckets: Vec<Bucket>,
    len: usize,
}

#[inline(always)]
fn tag_of(hash: u64) -> u32 {
    (hash >> 32) as u32
}

impl Table {
    fn with_capacity(entries: usize) -> Table {
        Table {
            buckets: vec![Bucket::default(); (entries.max(8) * 4 / 3) + 1],
            len: 0,
        }
    }

    #[inline(always)]
    fn home(&self, tag: u32) -> usize {
        ((tag as u64 * self.buckets.len() as u64) >> 32) as usize
    }

    #[inline(always)]
    fn next(&self, i: usize) -> usize {
        if i + 1 == self.buckets.len() {
            0
        } else {
            i + 1
        }
    }

    fn place(&mut self, bucket: Bucket) {
        let mut i = self.home(bucket.tag);
        while self.buckets[i].slot1 != 0 {
            i = self.next(i);
        }
        self.buckets[i] = bucket;
    }

    /// The size `insert` grows a table of `size` buckets to until `entries`
    /// fit (by half each time).
    fn grown_size(mut size: usize, entries: usize) -> usize {
        while entries * 4 > size * 3 {
            size = size * 3 / 2 + 1;
        }
        size
    }

    fn rebuild(&mut self, buckets: Vec<Bucket>) {
        let old = std::mem::replace(&mut self.buckets, buckets);
        for b in old.into_iter().filter(|b| b.slot1 != 0) {
            self.place(b);
        }
    }

    /// Grows the table now, as `insert` would, so that `more` inserts do not
    /// allocate; fails with `Alloc` (changing nothing) if memory is short.
    fn try_reserve(&mut self, more: usize) -> Result<()> {
        let size = Self::grown_size(self.buckets.len(), self.len + more);
        if size == self.buckets.len() {
            return Ok(());
        }
        let mut buckets = Vec::new();
        if buckets.try_reserve_exact(size).is_err() {
            return Err(alloc_error::<Bucket>(size, "the index table"));
        }
        buckets.resize(size, Bucket::default());
        self.rebuild(buckets);
        Ok(())
    }

    fn insert(&mut self, tag: u32, slot: u32, hot: u32) {
        if (self.len + 1) * 4 > self.buckets.len() * 3 {
            self.rebuild(vec![Bucket::default(); self.buckets.len() * 3 / 2 + 1]);
        }
        self.place(Bucket {
            tag,
            slot1: slot + 1,
            hot,
        });
        self.len += 1;
    }

    /// The position of slot `slot`, whose tag is `tag`.
    fn position(&self, tag: u32, slot: u32) -> usize {
        let mut i = self.home(tag);
        while self.buckets[i].slot1 != slot + 1 {
            assert!(
                self.buckets[i].slot1 != 0,
                "slot {slot} missing from the table"
            );
            i = self.next(i);
        }
        i
    }

    fn set_hot(&mut self, tag: u32, slot: u32, hot: u32) {
        let i = self.position(tag, slot);
        self.buckets[i].hot = hot;
    }

    fn remove(&mut self, tag: u32, slot: u32) {
        let mut i = self.position(tag, slot);
        // Backward shift: pull later members of the probe run into the hole
        // when the hole lies on their path from home.
        let mut j = i;
        loop {
            j = self.next(j);
            let b = self.buckets[j];
            if b.slot1 == 0 {
                break;
            }
            let home = self.home(b.tag);
            let hole_on_path = if i <= j {
                home <= i || home > j
            } else {
                home <= i && home > j
            };
            if hole_on_path {
                self.buckets[i] = b;
                i = j;
            }
        }
        self.buckets[i] = Bucket::default();
        self.len -= 1;
    }

    fn clear(&mut self) {
        self.buckets.iter_mut().for_each(|b| *b = Bucket::default());
        self.len = 0;
    }
}

/// A slot's lookup word: 30 more bits of the key's hash (beyond the table's
/// 32-bit tag) and what a lookup answers for it. Zero for slots lookups must
/// not see (free, or unlinked by a clear).
#[inline(always)]
fn hot_word(hash: u64, state: LookupState) -> u32 {
    (hash as u32) & !3 | state as u32
}

#[inline(always)]
fn hot_matches(word: u32, hash: u64) -> bool {
    word != 0 && word & !3 == (hash as u32) & !3
}

#[inline(always)]
fn hot_state(word: u32) -> LookupState {
    match word & 3 {
        1 => LookupState::Hit,
        2 => LookupState::Pending,
        _ => LookupState::Miss,
    }
}

#[inline(always)]
fn prefetch<T>(p: *const T) {
    // SAFETY: a prefetch is a hint; it never faults, even on a bad address, and
    // SSE is part of the x86_64 baseline.
    #[cfg(target_arch = "x86_64")]
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p as *const i8)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// The part of `key` kept outside the slot record (None if it fits inline),
/// copied for [`Index::insert_storing_with`]; `Alloc` if memory is short.
pub(crate) fn try_long_tail(key: &[u8]) -> Result<Option<Box<[u8]>>> {
    let Some(tail) = key.get(INLINE_KEY..).filter(|t| !t.is_empty()) else {
        return Ok(None);
    };
    let mut v = Vec::new();
    if v.try_reserve_exact(tail.len()).is_err() {
        return Err(alloc_error::<u8>(tail.len(), "a long key"));
    }
    v.extend_from_slice(tail);
    Ok(Some(v.into_boxed_slice()))
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
        }
    }

    /// Makes room for a store of `new_keys` keys (of `key_len` bytes) absent
    /// from the index, after `evictions` evictions, so that neither allocates:
    /// slot records, the free list, the table, long-key tails' map, released
    /// keys. Fails with `Alloc`, changing nothing a lookup can see, if memory
    /// is short. The tails themselves come from [`try_long_tail`].
    pub(crate) fn reserve(
        &mut self,
        new_keys: usize,
        evictions: usize,
        key_len: usize,
    ) -> Result<()> {
        let reused = self.free.len() + evictions;
        let pushed = new_keys
            .saturating_sub(reused)
            .min(self.capacity as usize - self.slots.len());
        try_reserve_vec(&mut self.slots, pushed, "the index's slot records")?;
        try_reserve_vec(&mut self.links, pushed, "the index's LRU links")?;
        // Room for every slot on the free list: frees (evictions, completing
        // jobs) never allocate.
        let room = self.slots.len() + pushed - self.free.len();
        try_reserve_vec(&mut self.free, room, "the free list")?;
        // Evictions leave the table before the new keys enter it.
        self.table.try_reserve(new_keys.saturating_sub(evictions))?;
        if key_len > INLINE_KEY && self.long_keys.try_reserve(new_keys).is_err() {
            return Err(alloc_error::<(u32, Box<[u8]>)>(
                self.long_keys.len() + new_keys,
                "the index's long keys",
            ));
        }
        if let Some(released) = self.released.as_mut() {
            try_reserve_vec(released, evictions, "released keys")?;
        }
        Ok(())
    }

    /// Starts recording the keys of freed blocks (see [`Index::take_released`]).
    pub(crate) fn track_releases(&mut self) {
        self.released.get_or_insert_with(Vec::new);
    }

    /// Whether any slot (linked, or unlinked but still in use) holds `key`.
    pub(crate) fn holds_key(&self, key: &[u8]) -> bool {
        self.find(key, self.hash(key)).is_some() || self.unlinked_keys.contains_key(key)
    }

    fn note_unlinked(&mut self, s: u32, delta: i32) {
        if self.released.is_none() {
            return;
        }
        let mut buf = [0u8; MAX_KEY_LEN];
        let len = self.key_of(s, &mut buf);
        let key = &buf[..len];
        if delta > 0 {
            *self.unlinked_keys.entry(key.into()).or_insert(0) += 1;
        } else if let Some(n) = self.unlinked_keys.get_mut(key) {
            *n -= 1;
            if *n == 0 {
                self.unlinked_keys.remove(key);
            }
        }
    }

    /// Blocks freed since the last call, with their keys, if tracked.
    pub(crate) fn take_released(&mut self) -> Vec<(u32, Vec<u8>)> {
        self.released
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
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

    pub(crate) fn free_slots(&self) -> u32 {
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
    pub(crate) fn hash(&self, key: &[u8]) -> u64 {
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
    pub(crate) fn key_of(&self, slot: u32, out: &mut [u8; MAX_KEY_LEN]) -> usize {
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
    pub(crate) fn find(&self, key: &[u8], hash: u64) -> Option<u32> {
        let tag = tag_of(hash);
        let mut i = self.table.home(tag);
        loop {
            let b = self.table.buckets[i];
            if b.slot1 == 0 {
                return None;
            }
            if b.tag == tag && self.key_eq(b.slot1 - 1, key) {
                return Some(b.slot1 - 1);
            }
            i = self.table.next(i);
        }
    }

    /// The linked slot whose key has this 64-bit hash (32 bits as the tag,
    /// 30 more in the hot word), and its lookup state, from the table alone:
    /// two keys share 62 bits of hash with probability 2^-62, and a wrong
    /// answer could only send a load to a key it then fails to find, because
    /// jobs verify the full key.
    #[inline(always)]
    fn find_hashed(&self, hash: u64) -> Option<(u32, LookupState)> {
        let tag = tag_of(hash);
        let mut i = self.table.home(tag);
        loop {
            let b = self.table.buckets[i];
            if b.slot1 == 0 {
                return None;
            }
            if b.tag == tag && hot_matches(b.hot, hash) {
                return Some((b.slot1 - 1, hot_state(b.hot)));
            }
            i = self.table.next(i);
        }
    }

    /// Prefetches the home bucket of `hash` (both lines if it straddles).
    #[inline(always)]
    fn prefetch_home(&self, hash: u64) {
        let b = &self.table.buckets[self.table.home(tag_of(hash))];
        prefetch(b);
        prefetch((b as *const Bucket as *const u8).wrapping_add(11));
    }

    pub(crate) fn state(&self, slot: u32) -> SlotState {
        self.slots[slot as usize].state
    }

    /// Resolves `n` keys (`key_at(j)` is the j-th) by hash as a pipeline: step
    /// i hashes key i and prefetches its bucket, and resolves key i - AHEAD,
    /// calling `f(j, found)` in order of j. The memory reads of successive
    /// keys overlap instead of waiting one after another.
    fn resolve_stream<'k>(
        &self,
        n: usize,
        key_at: impl Fn(usize) -> &'k [u8],
        mut f: impl FnMut(usize, Option<(u32, LookupState)>),
    ) {
        let mut hashes = [0u64; RING];
        for i in 0..n + AHEAD {
            if i < n {
                let h = self.hasher.hash(key_at(i));
                hashes[i % RING] = h;
                self.prefetch_home(h);
            }
            if let Some(j) = i.checked_sub(AHEAD) {
                f(j, self.find_hashed(hashes[j % RING]));
            }
        }
    }

    /// Writes one [`LookupState`] per key into `out`.
    pub(crate) fn lookup_batch(&self, keys: &[u8], key_len: usize, out: &mut [u8]) -> LookupCounts {
        let mut counts = LookupCounts::default();
        let n = keys.len() / key_len;
        let key_at = |j: usize| &keys[j * key_len..][..key_len];
        self.resolve_stream(n, key_at, |i, found| {
            let state = found.map_or(LookupState::Miss, |(_, state)| state);
            match state {
                LookupState::Hit => counts.hits += 1,
                LookupState::Miss => counts.misses += 1,
                LookupState::Pending => counts.pending += 1,
            }
            out[i] = state as u8;
        });
        counts
    }

    /// Makes the readable keys among `keys` most recently used, the first key
    /// most recent of all (see [`Tier::touch`](crate::Tier::touch)). Returns how
    /// many were found.
    ///
    /// A pipeline like [`Index::resolve_stream`] with two more stages: once a
    /// key resolves, prefetch its links; a stage later, its neighbours'; a
    /// stage later, relink it. Keys are taken last to first, so that the first
    /// ends most recent, and relinked in that order.
    pub(crate) fn touch_batch(&mut self, keys: &[u8], key_len: usize) -> u64 {
        const STAGES: usize = 4;
        const AHEAD: usize = TOUCH_AHEAD;
        let n = keys.len() / key_len;
        let key_at = |j: usize| &keys[(n - 1 - j) * key_len..][..key_len];
        let mut hashes = [0u64; TOUCH_RING];
        let mut found = [NIL; TOUCH_RING];
        let mut touched = 0;
        for i in 0..n + (STAGES - 1) * AHEAD {
            if i < n {
                let h = self.hasher.hash(key_at(i));
                hashes[i % TOUCH_RING] = h;
                self.prefetch_home(h);
            }
            if let Some(j) = i.checked_sub(AHEAD).filter(|&j| j < n) {
                found[j % TOUCH_RING] = match self.find_hashed(hashes[j % TOUCH_RING]) {
                    Some((slot, LookupState::Hit)) => {
                        prefetch(&self.links[slot as usize]);
                        slot
                    }
                    _ => NIL,
                };
            }
            if let Some(j) = i.checked_sub(2 * AHEAD).filter(|&j| j < n) {
                let slot = found[j % TOUCH_RING];
                if slot != NIL {
                    let Link { prev, next } = self.links[slot as usize];
                    if prev != NIL {
                        prefetch(&self.links[prev as usize]);
                    }
                    if next != NIL {
                        prefetch(&self.links[next as usize]);
                    }
                }
            }
            if let Some(j) = i.checked_sub(3 * AHEAD) {
                let slot = found[j % TOUCH_RING];
                // Hit in the hot word: in the table, Ready, so in the LRU list.
                if slot != NIL {
                    if self.lru_tail != slot {
                        self.lru_unlink(slot);
                        self.lru_push_mru(slot);
                    }
                    touched += 1;
                }
            }
        }
        touched
    }

    // ---- LRU list (Ready, linked slots only) ----

    fn lru_unlink(&mut self, s: u32) {
        let Link { prev, next } = self.links[s as usize];
        if prev == NIL {
            self.lru_head = next;
        } else {
            self.links[prev as usize].next = next;
        }
        if next == NIL {
            self.lru_tail = prev;
        } else {
            self.links[next as usize].prev = prev;
        }
        self.links[s as usize] = Link::NONE;
    }

    fn lru_push_mru(&mut self, s: u32) {
        let tail = self.lru_tail;
        self.links[s as usize] = Link {
            prev: tail,
            next: NIL,
        };
        if tail == NIL {
            self.lru_head = s;
        } else {
            self.links[tail as usize].next = s;
        }
        self.lru_tail = s;
    }

    /// Readable keys from least to most recently used (tests and debugging).
    #[cfg(test)]
    pub(crate) fn lru_order(&self) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        let mut s = self.lru_head;
        let mut buf = [0u8; MAX_KEY_LEN];
        while s != NIL {
            let len = self.key_of(s, &mut buf);
            out.push(buf[..len].to_vec());
            s = self.links[s as usize].next;
        }
        out
    }

    // ---- pins ----

    pub(crate) fn pin(&mut self, s: u32) {
        let slot = &mut self.slots[s as usize];
        slot.pins = slot.pins.checked_add(1).expect("pin count overflow");
    }

    /// Drops one pin; frees the slot if it was released while pinned. Returns
    /// true if the slot was freed.
    pub(crate) fn unpin(&mut self, s: u32) -> bool {
        let slot = &mut self.slots[s as usize];
        debug_assert!(slot.pins > 0);
        slot.pins -= 1;
        if slot.pins == 0 && !slot.linked && slot.state != SlotState::Storing {
            self.free_slot(s);
            return true;
        }
        false
    }

    // ---- eviction and allocation ----

    /// Collects up to `need` eviction victims from the LRU end, skipping pinned
    /// slots. Returns false (with `out` partially filled) if there are not enough.
    pub(crate) fn pick_victims(&self, need: usize, out: &mut Vec<u32>) -> bool {
        out.clear();
        let mut s = self.lru_head;
        while out.len() < need && s != NIL {
            if self.slots[s as usize].pins == 0 {
                out.push(s);
            }
            s = self.links[s as usize].next;
        }
        out.len() == need
    }

    /// Removes a Ready, linked, unpinned slot and frees it (eviction).
    /// Allocates nothing once [`Index::reserve`] made room.
    pub(crate) fn evict(&mut self, s: u32) {
        debug_assert_eq!(self.slots[s as usize].state, SlotState::Ready);
        debug_assert_eq!(self.slots[s as usize].pins, 0);
        debug_assert!(self.slots[s as usize].linked);
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

    fn free_slot(&mut self, s: u32) {
        self.note_unlinked(s, -1);
        self.release_slot(s);
    }

    /// [`Index::free_slot`] of a slot never counted among unlinked keys.
    fn release_slot(&mut self, s: u32) {
        debug_assert!(!self.slots[s as usize].linked);
        if self.released.is_some() && self.slots[s as usize].state == SlotState::Ready {
            let mut buf = [0u8; MAX_KEY_LEN];
            let len = self.key_of(s, &mut buf);
            if let Some(released) = self.released.as_mut() {
                released.push((s, buf[..len].to_vec()));
            }
        }
        self.slots[s as usize] = Slot::EMPTY;
        self.links[s as usize] = Link::NONE;
        self.long_keys.remove(&s);
        self.free.push(s);
    }

    /// Allocates a slot for a new key (absent from the table) in state
    /// Storing and links it. The caller has checked `free_slots() > 0`.
    pub(crate) fn insert_storing(&mut self, key: &[u8], hash: u64) -> u32 {
        let tail = (key.len() > INLINE_KEY).then(|| key[INLINE_KEY..].into());
        self.insert_storing_with(key, hash, tail)
    }

    /// [`Index::insert_storing`] with the key's tail beyond the inline part
    /// (from [`try_long_tail`]) already copied: after [`Index::reserve`], this
    /// allocates nothing.
    pub(crate) fn insert_storing_with(
        &mut self,
        key: &[u8],
        hash: u64,
        tail: Option<Box<[u8]>>,
    ) -> u32 {
        assert!(self.free_slots() > 0, "insert_storing without a free slot");
        debug_assert!(key.len() <= MAX_KEY_LEN && !key.is_empty());
        let s = match self.free.pop() {
            Some(s) => s,
            None => {
                self.slots.push(Slot::EMPTY);
                self.links.push(Link::NONE);
                if self.free.capacity() < self.slots.len() {
                    // Frees never allocate (see `reserve`).
                    self.free.reserve(self.slots.len() - self.free.len());
                }
                (self.slots.len() - 1) as u32
            }
        };
        let slot = &mut self.slots[s as usize];
        let inline = key.len().min(INLINE_KEY);
        slot.key[..inline].copy_from_slice(&key[..inline]);
        slot.key_len = key.len() as u8;
        slot.state = SlotState::Storing;
        slot.linked = true;
        if key.len() > INLINE_KEY {
            let tail = tail.expect("the tail of a long key");
            debug_assert_eq!(*tail, key[INLINE_KEY..]);
            self.long_keys.insert(s, tail);
        }
        self.table
            .insert(tag_of(hash), s, hot_word(hash, LookupState::Pending));
        s
    }

    fn slot_hash(&self, s: u32) -> u64 {
        let mut buf = [0u8; MAX_KEY_LEN];
        let len = self.key_of(s, &mut buf);
        self.hasher.hash(&buf[..len])
    }

    /// Adds a readable block found in storage (recovery, probes) as the most
    /// recently used. The caller has checked `free_slots() > 0` and that the key
    /// is absent.
    pub(crate) fn insert_ready(&mut self, key: &[u8], hash: u64) -> u32 {
        let s = self.insert_storing(key, hash);
        self.finish_store(s, true);
        s
    }

    /// Forgets a block whose storage turned out missing, corrupt or unreadable:
    /// it looks up as MISS at once, and its slot is freed when the last pin
    /// goes. The slot is not reported as released: what is in storage is the
    /// backend's to judge (already removed, gone, or kept because nothing was
    /// proved against it, or because it is a newer block of another writer).
    pub(crate) fn forget(&mut self, s: u32) {
        if self.slots[s as usize].state != SlotState::Ready || !self.slots[s as usize].linked {
            return;
        }
        self.unlink(s);
        self.slots[s as usize].state = SlotState::Dead;
        if self.slots[s as usize].pins == 0 {
            self.free_slot(s);
        }
    }

    /// Finishes a store into `s`: on success the block becomes readable and most
    /// recently used; on failure it disappears (or turns Dead while pinned).
    pub(crate) fn finish_store(&mut self, s: u32, ok: bool) {
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

    /// Drops every block. Blocks in use by a job (being stored, or pinned by a
    /// load) are unlinked at once, so they look up as MISS, and are freed when
    /// their job releases them.
    pub(crate) fn clear(&mut self) {
        for s in 0..self.slots.len() as u32 {
            let slot = self.slots[s as usize];
            if slot.state == SlotState::Free || !slot.linked {
                continue;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn key(i: u32) -> Vec<u8> {
        let mut k = vec![0u8; 36];
        k[..4].copy_from_slice(&i.to_be_bytes());
        k
    }

    fn store(ix: &mut Index, k: &[u8]) -> u32 {
        let h = ix.hash(k);
        let s = ix.insert_storing(k, h);
        ix.finish_store(s, true);
        s
    }

    fn lookup(ix: &Index, k: &[u8]) -> LookupState {
        let mut out = [9u8];
        ix.lookup_batch(k, k.len(), &mut out);
        match out[0] {
            0 => LookupState::Miss,
            1 => LookupState::Hit,
            2 => LookupState::Pending,
            other => panic!("bad state {other}"),
        }
    }

    #[test]
    fn insert_find_evict_many_with_a_tiny_table() {
        // A fixed seed and many keys force long probe runs, table growth and
        // backward shifts.
        let mut ix = Index::new(5000, KeyHasher::with_seed(7));
        let slots: Vec<u32> = (0..5000).map(|i| store(&mut ix, &key(i))).collect();
        assert_eq!(ix.ready(), 5000);
        assert_eq!(ix.free_slots(), 0);
        for i in (0..5000).step_by(3) {
            ix.evict(slots[i as usize]);
        }
        for i in 0..5000u32 {
            let want = if i % 3 == 0 {
                LookupState::Miss
            } else {
                LookupState::Hit
            };
            assert_eq!(lookup(&ix, &key(i)), want, "key {i}");
            let found = ix.find(&key(i), ix.hash(&key(i)));
            assert_eq!(found.is_some(), i % 3 != 0);
        }
    }

    #[test]
    fn batch_lookup_matches_single_lookups_including_tag_collisions() {
        let mut ix = Index::new(10_000, KeyHasher::with_seed(3));
        for i in 0..2000 {
            store(&mut ix, &key(i * 2));
        }
        let keys: Vec<u8> = (0..4000).flat_map(key).collect();
        let mut out = vec![9u8; 4000];
        let counts = ix.lookup_batch(&keys, 36, &mut out);
        assert_eq!(counts.hits, 2000);
        assert_eq!(counts.misses, 2000);
        for (i, &s) in out.iter().enumerate() {
            assert_eq!(s, (i % 2 == 0) as u8, "key {i}");
        }
    }

    #[test]
    fn long_and_short_keys_coexist() {
        let mut ix = Index::new(100, KeyHasher::with_seed(1));
        let long_a = vec![1u8; 128];
        let mut long_b = vec![1u8; 128];
        long_b[127] = 2;
        let short = vec![1u8; 1];
        for k in [&long_a, &long_b, &short] {
            store(&mut ix, k);
        }
        assert_eq!(lookup(&ix, &long_a), LookupState::Hit);
        assert_eq!(lookup(&ix, &long_b), LookupState::Hit);
        assert_eq!(lookup(&ix, &short), LookupState::Hit);
        assert_eq!(lookup(&ix, &[1u8; 127]), LookupState::Miss);
        let mut buf = [0u8; MAX_KEY_LEN];
        let s = ix.find(&long_b, ix.hash(&long_b)).unwrap();
        let len = ix.key_of(s, &mut buf);
        assert_eq!(&buf[..len], &long_b[..]);
        ix.evict(s);
        assert_eq!(lookup(&ix, &long_b), LookupState::Miss);
        assert_eq!(lookup(&ix, &long_a), LookupState::Hit);
    }

    #[test]
    fn lru_order_follows_store_touch_and_skips_pins() {
        let mut ix = Index::new(10, KeyHasher::with_seed(1));
        for i in 0..4 {
            store(&mut ix, &key(i));
        }
        assert_eq!(ix.lru_order(), vec![key(0), key(1), key(2), key(3)]);
        // Touch [1, 0]: key 1 (first) ends most recent.
        let keys: Vec<u8> = [key(1), key(0), key(99)].concat();
        assert_eq!(ix.touch_batch(&keys, 36), 2);
        assert_eq!(ix.lru_order(), vec![key(2), key(3), key(0), key(1)]);
        let s2 = ix.find(&key(2), ix.hash(&key(2))).unwrap();
        ix.pin(s2);
        let mut victims = Vec::new();
        assert!(ix.pick_victims(2, &mut victims));
        let names: Vec<u32> = victims.clone();
        assert!(!names.contains(&s2));
        assert!(!ix.pick_victims(4, &mut victims));
        assert!(!ix.unpin(s2));
    }

    #[test]
    fn pending_then_hit_or_gone() {
        let mut ix = Index::new(10, KeyHasher::with_seed(1));
        let h = ix.hash(&key(1));
        let s = ix.insert_storing(&key(1), h);
        assert_eq!(lookup(&ix, &key(1)), LookupState::Pending);
        ix.finish_store(s, true);
        assert_eq!(lookup(&ix, &key(1)), LookupState::Hit);
        let h = ix.hash(&key(2));
        let s = ix.insert_storing(&key(2), h);
        ix.pin(s);
        ix.finish_store(s, false);
        assert_eq!(ix.state(s), SlotState::Dead);
        assert_eq!(lookup(&ix, &key(2)), LookupState::Miss);
        assert!(ix.unpin(s));
        assert_eq!(ix.allocated(), 1);
    }

    #[test]
    fn clear_keeps_in_use_slots_until_released() {
        let mut ix = Index::new(10, KeyHasher::with_seed(1));
        let a = store(&mut ix, &key(1));
        store(&mut ix, &key(2));
        let h = ix.hash(&key(3));
        let c = ix.insert_storing(&key(3), h);
        ix.pin(a);
        ix.track_releases();
        ix.clear();
        assert!(
            ix.holds_key(&key(1)) && ix.holds_key(&key(3)),
            "still in use"
        );
        assert!(!ix.holds_key(&key(2)));
        assert_eq!(ix.take_released(), vec![(1, key(2))]);
        assert_eq!(ix.allocated(), 2);
        for i in 1..=3 {
            assert_eq!(lookup(&ix, &key(i)), LookupState::Miss);
        }
        assert!(ix.unpin(a));
        ix.finish_store(c, true);
        assert_eq!(ix.allocated(), 0);
        assert_eq!(ix.take_released(), vec![(a, key(1)), (c, key(3))]);
        assert!(!ix.holds_key(&key(1)) && ix.unlinked_keys.is_empty());
        // The same key can be stored again while nothing is left of the old one.
        store(&mut ix, &key(3));
        assert_eq!(lookup(&ix, &key(3)), LookupState::Hit);
    }

    #[test]
    fn forget_drops_a_pinned_block_at_its_last_unpin() {
        let mut ix = Index::new(4, KeyHasher::with_seed(1));
        let s = store(&mut ix, &key(1));
        ix.pin(s);
        ix.forget(s);
        assert_eq!(lookup(&ix, &key(1)), LookupState::Miss);
        assert_eq!(ix.allocated(), 1);
        assert!(ix.unpin(s));
        assert_eq!(ix.allocated(), 0);
        let h = ix.hash(&key(2));
        ix.insert_ready(&key(2), h);
        assert_eq!(lookup(&ix, &key(2)), LookupState::Hit);
    }

    #[test]
    fn table_reserve_grows_to_the_size_inserts_would() {
        for n in [0usize, 1, 7, 100, 5000] {
            let (mut a, mut b) = (Table::with_capacity(8), Table::with_capacity(8));
            b.try_reserve(n).unwrap();
            let reserved = b.buckets.len();
            for i in 0..n as u32 {
                let tag = ((i as u64 * 0x9e37_79b9_7f4a_7c15) >> 32) as u32;
                a.insert(tag, i, 1);
                b.insert(tag, i, 1);
            }
            assert_eq!(b.buckets.len(), reserved, "{n} inserts after reserve");
            assert_eq!(a.buckets.len(), b.buckets.len(), "{n} inserts");
        }
    }

    #[test]
    fn a_reserved_store_allocates_nothing() {
        for key_len in [36usize, 100] {
            let k = |i: u32| {
                let mut v = key(i);
                v.resize(key_len, 7);
                v
            };
            let mut ix = Index::new(5000, KeyHasher::with_seed(9));
            ix.track_releases();
            for i in 0..100 {
                store(&mut ix, &k(i));
            }
            ix.take_released();
            ix.reserve(3000, 10, key_len).unwrap();
            let room = |ix: &Index| {
                (
                    ix.slots.capacity(),
                    ix.links.capacity(),
                    ix.free.capacity(),
                    ix.table.buckets.as_ptr(),
                    ix.long_keys.capacity(),
                    ix.released.as_ref().unwrap().capacity(),
                    ix.unlinked_keys.capacity(),
                )
            };
            let before = room(&ix);
            let mut victims = Vec::new();
            assert!(ix.pick_victims(10, &mut victims));
            for &v in &victims {
                ix.evict(v);
            }
            let mut slots = Vec::new();
            for i in 1000..4000 {
                let kk = k(i);
                let h = ix.hash(&kk);
                slots.push(ix.insert_storing_with(&kk, h, try_long_tail(&kk).unwrap()));
            }
            assert_eq!(room(&ix), before, "key_len {key_len}");
            assert!(ix.unlinked_keys.is_empty());
            assert_eq!(ix.take_released().len(), 10);
            // Every slot fits on the free list without growing it.
            assert!(ix.free.capacity() >= ix.slots.len());
            for s in slots {
                ix.finish_store(s, true);
            }
            assert_eq!(ix.ready(), 3090);
            assert_eq!(lookup(&ix, &k(1500)), LookupState::Hit);
            assert_eq!(lookup(&ix, &k(50)), LookupState::Hit);
        }
    }

    #[test]
    fn slot_record_stays_small() {
        assert_eq!(std::mem::size_of::<Slot>(), 48);
        assert_eq!(std::mem::size_of::<Link>(), 8);
    }
}
