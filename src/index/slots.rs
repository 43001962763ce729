//! Slot allocation: the free list, new slots for stored keys, freeing, and
//! the reservation that lets a store claim everything it needs before the
//! index changes (so running out of memory changes nothing).

use super::table::{hot_word, tag_of};
use super::{Index, Link, LookupState, Slot, SlotState, INLINE_KEY, MAX_KEY_LEN};
use crate::error::{alloc_error, try_reserve as try_reserve_vec, Result};

/// The part of `key` kept outside the slot record (None if it fits inline),
/// copied for [`Index::insert_storing_with`]; `Alloc` if memory is short.
pub(super) fn try_long_tail(key: &[u8]) -> Result<Option<Box<[u8]>>> {
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

impl Index {
    /// Makes room for a store of `new_keys` keys (of `key_len` bytes) absent
    /// from the index, after `evictions` evictions, so that neither allocates:
    /// slot records, the free list, the table, long-key tails' map, released
    /// keys. Fails with `Alloc`, changing nothing a lookup can see, if memory
    /// is short. The tails themselves come from [`try_long_tail`].
    pub(super) fn reserve(
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

    pub(super) fn free_slot(&mut self, s: u32) {
        self.note_unlinked(s, -1);
        self.release_slot(s);
    }

    /// [`Index::free_slot`] of a slot never counted among unlinked keys.
    pub(super) fn release_slot(&mut self, s: u32) {
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
    pub(super) fn insert_storing(&mut self, key: &[u8], hash: u64) -> u32 {
        let tail = (key.len() > INLINE_KEY).then(|| key[INLINE_KEY..].into());
        self.insert_storing_with(key, hash, tail)
    }

    /// [`Index::insert_storing`] with the key's tail beyond the inline part
    /// (from [`try_long_tail`]) already copied: after [`Index::reserve`], this
    /// allocates nothing.
    pub(super) fn insert_storing_with(
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
}
