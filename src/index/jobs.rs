//! What a job does to the index, one call per stage, so the engine never
//! walks a job's keys through the index itself:
//! - a store reserves its keys ([`Index::reserve_store`]: pins the present
//!   ones, evicts, claims slots) and later commits them
//!   ([`Index::commit_store`]);
//! - a load finds its blocks ([`Index::find_load`]), pins them
//!   ([`Index::pin_load`]) once the engine has its waits, and later releases
//!   them ([`Index::release_load`]);
//! - a block found in storage (recovery, a probe) is admitted
//!   ([`Index::admit_found`]).

use super::{try_long_tail, Index, SlotState, INLINE_KEY};
use crate::error::{try_reserve, try_vec, Result};
use crate::events::{RemovedReason, StoredReason};
use crate::key::PackedKeys;

/// One block a job copies: the key at position `pos`, primary row `row`,
/// index slot `slot`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Item {
    pub pos: u32,
    pub row: usize,
    pub slot: u32,
}

/// What a store reserved: its new keys' blocks (in key order, each with a
/// slot in state Storing) and the slots of its present keys (pinned).
pub(crate) struct StoreReservation {
    pub items: Vec<Item>,
    pub pinned: Vec<u32>,
    /// Blocks evicted to make room.
    pub evicted: usize,
}

/// What became of one block of a load, for [`Index::release_load`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LoadOutcome {
    /// Copied into its row: a use, the block becomes most recent.
    Copied,
    /// Not copied, through no fault of the stored block (a failure earlier in
    /// the job, no memory, a transient error not yet given up on): kept as is.
    Kept,
    /// The block is gone, bad, or failed too often: it stops being readable.
    Forget(RemovedReason),
}

/// What [`Index::delete`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Deleted {
    /// Removed; storage deletes the block.
    Removed,
    /// Not in the index.
    Missing,
    /// Pinned, being loaded or being stored: left in place.
    Busy,
}

/// What [`Index::admit_found`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Admitted {
    /// Added as most recent in `slot`; `evicted` says whether a block made
    /// room.
    Added { evicted: bool, slot: u32 },
    /// The key was in the index already.
    Present,
    /// Full, and every block is pinned or in flight.
    NoRoom,
}

impl Index {
    /// Reserves a store of the keys packed in `keys` from rows `rows`: keys
    /// present or in flight are skipped (and pinned: never evicted while the
    /// job runs, by its own evictions or anyone else's), duplicates are stored
    /// once, least recently used blocks that are not pinned, in flight or the
    /// job's own are evicted to make room, and a slot is claimed for each new
    /// key. `None` if there is not enough room (nothing changed).
    ///
    /// Every allocation comes first: `Alloc` changes nothing either.
    pub(crate) fn reserve_store(
        &mut self,
        keys: PackedKeys,
        rows: &[i64],
        victims: &mut Vec<u32>,
    ) -> Result<Option<StoreReservation>> {
        let (n, key_len) = (keys.len(), keys.key_len());
        debug_assert_eq!(n as usize, rows.len());
        let key = |pos| keys.get(pos);
        let mut new: Vec<(u32, u64)> = try_vec(n as usize, "the store's new keys")?;
        let mut pinned = Vec::new();
        for pos in 0..n {
            let hash = self.hash(key(pos));
            match self.find(key(pos), hash) {
                Some(slot) => {
                    try_reserve(&mut pinned, 1, "the store's present keys")?;
                    pinned.push(slot);
                }
                None => new.push((pos, hash)),
            }
        }
        if new.len() > 1 {
            // Unstable sorts do not allocate; the order is total (the position
            // breaks ties), so it is the one a stable sort would give.
            new.sort_unstable_by(|a, b| {
                a.1.cmp(&b.1)
                    .then_with(|| key(a.0).cmp(key(b.0)))
                    .then(a.0.cmp(&b.0))
            });
            new.dedup_by(|later, first| later.1 == first.1 && key(later.0) == key(first.0));
            new.sort_unstable_by_key(|e| e.0);
        }
        let free = self.free_slots() as usize;
        let need = new.len().saturating_sub(free);
        let mut items = try_vec(new.len(), "the store's blocks")?;
        let mut tails = Vec::new();
        if key_len > INLINE_KEY {
            tails = try_vec(new.len(), "the store's long keys")?;
            for &(pos, _) in &new {
                tails.push(try_long_tail(key(pos))?);
            }
        }
        victims.clear();
        try_reserve(victims, need, "eviction victims")?;
        self.reserve(new.len(), need, key_len)?;

        // Nothing below allocates.
        for &slot in &pinned {
            self.pin(slot);
        }
        if need > 0 && !self.pick_victims(need, victims) {
            for &slot in &pinned {
                self.unpin(slot);
            }
            return Ok(None);
        }
        for &v in &victims[..need] {
            self.evict(v);
        }
        let mut tails = tails.into_iter();
        items.extend(new.into_iter().map(|(pos, hash)| Item {
            pos,
            row: rows[pos as usize] as usize,
            slot: self.insert_storing_with(key(pos), hash, tails.next().flatten()),
        }));
        Ok(Some(StoreReservation {
            items,
            pinned,
            evicted: need,
        }))
    }

    /// Commits a store whose copies are done: each block of `items` whose
    /// copy succeeded (`copied(i)`) becomes readable (a STORED event) and most
    /// recent, the job's first key most recent of all; the others disappear.
    /// `settled(item, ok)` is told of each. Drops the job's pins, and returns how many of its keys
    /// (counting repeats) are in the index now, whatever happened meanwhile (a
    /// clear, evictions of keys it found present).
    pub(crate) fn commit_store(
        &mut self,
        keys: PackedKeys,
        items: &[Item],
        pinned: &[u32],
        copied: impl Fn(usize) -> bool,
        mut settled: impl FnMut(&Item, bool),
    ) -> u32 {
        // Reverse order: the job's first key ends most recent.
        for (i, item) in items.iter().enumerate().rev() {
            let ok = copied(i);
            self.finish_store(item.slot, ok);
            settled(item, ok);
        }
        if self.events_enabled() {
            // Announced in key order (recency was set in reverse): a job's
            // new blocks, readable now unless a clear came first.
            for item in items {
                if self.is_readable(item.slot) {
                    self.note_stored(item.slot, StoredReason::Written);
                }
            }
        }
        let present = (0..keys.len())
            .filter(|&pos| self.contains(keys.get(pos)))
            .count();
        for &slot in pinned {
            self.unpin(slot);
        }
        present as u32
    }

    /// A store reported failed while its copies still run (a storage call
    /// missed its deadline): its keys look up as MISS at once, so no load
    /// waits for it any more and a new store of them starts afresh. Its slots
    /// stay allocated until [`Index::commit_store`], which frees them and,
    /// for blocks whose copy did complete, reports them released (the
    /// backend deletes what they left in storage).
    pub(crate) fn abandon_store(&mut self, items: &[Item]) {
        for item in items {
            if self.state(item.slot) == SlotState::Storing {
                self.unlink(item.slot);
            }
        }
    }

    /// Finds a load's blocks in key order into `items` (which has room for
    /// all of them), up to the first key that is not stored, whose position
    /// is returned; or, with `past_misses`, every stored key's block (the
    /// first miss still returned). Blocks still being stored are also listed
    /// in `storing` as (slot, position). Changes nothing:
    /// [`Index::pin_load`] pins them once the engine has registered its
    /// waits.
    pub(crate) fn find_load(
        &self,
        keys: PackedKeys,
        rows: &[i64],
        past_misses: bool,
        items: &mut Vec<Item>,
        storing: &mut Vec<(u32, u32)>,
    ) -> Result<Option<u32>> {
        debug_assert!(items.capacity() >= rows.len());
        let mut first_miss = None;
        for pos in 0..rows.len() as u32 {
            let key = keys.get(pos);
            let slot = self.find(key, self.hash(key));
            let Some(slot) = slot.filter(|&s| self.state(s) != SlotState::Dead) else {
                first_miss = first_miss.or(Some(pos));
                if past_misses {
                    continue;
                }
                return Ok(first_miss);
            };
            if self.state(slot) == SlotState::Storing {
                try_reserve(storing, 1, "the load's keys in flight")?;
                storing.push((slot, pos));
            }
            items.push(Item {
                pos,
                row: rows[pos as usize] as usize,
                slot,
            });
        }
        Ok(first_miss)
    }

    /// Pins `key`'s block if a lookup would answer HIT for it (`tier_pin`):
    /// it is then never evicted or deleted until [`Index::unpin_slot`].
    /// Returns the slot pinned.
    pub(crate) fn pin_readable(&mut self, key: &[u8]) -> Option<u32> {
        let slot = self.find(key, self.hash(key))?;
        if !self.is_readable(slot) {
            return None;
        }
        self.pin(slot);
        Some(slot)
    }

    /// Drops a pin of [`Index::pin_readable`]; the slot is freed if its
    /// block was removed meanwhile (a clear) and this was its last pin.
    pub(crate) fn unpin_slot(&mut self, slot: u32) {
        self.unpin(slot);
    }

    /// Deletes `key`'s block (a delete job): removed from the index (a
    /// REMOVED event) and released to storage's deletion like an eviction,
    /// unless it is pinned or in flight.
    pub(crate) fn delete(&mut self, key: &[u8]) -> Deleted {
        let Some(slot) = self.find(key, self.hash(key)) else {
            return Deleted::Missing;
        };
        let s = self.slots[slot as usize];
        if s.state == SlotState::Dead || !s.linked {
            return Deleted::Missing;
        }
        if s.state != SlotState::Ready || s.pins > 0 {
            return Deleted::Busy;
        }
        self.note_removed(slot, RemovedReason::Deleted);
        self.unlink_quietly(slot);
        self.release_slot(slot);
        Deleted::Removed
    }

    /// Pins a load's blocks against eviction while they are read.
    pub(crate) fn pin_load(&mut self, items: &[Item]) {
        for item in items {
            self.pin(item.slot);
        }
    }

    /// Releases a load whose copies are done, by each block's `outcome(i)`:
    /// blocks copied become most recent (a read is a use; the job's first key
    /// ends most recent of all, as for a store or a touch), blocks to forget
    /// look up as MISS from now on (a REMOVED event); then unpins every block.
    pub(crate) fn release_load(
        &mut self,
        items: &[Item],
        mut outcome: impl FnMut(usize) -> LoadOutcome,
    ) {
        // Reverse order: the job's first key ends most recent.
        for (i, item) in items.iter().enumerate().rev() {
            match outcome(i) {
                LoadOutcome::Copied => self.refresh(item.slot),
                LoadOutcome::Kept => {}
                LoadOutcome::Forget(reason) => self.forget(item.slot, reason),
            }
        }
        for item in items {
            self.unpin(item.slot);
        }
    }

    /// Admits a block found in storage (recovery, probes) as the most
    /// recently used (a STORED event with `reason`), evicting the least
    /// recently used unpinned block if the index is full. `victims` is
    /// scratch space.
    pub(crate) fn admit_found(
        &mut self,
        key: &[u8],
        victims: &mut Vec<u32>,
        reason: StoredReason,
    ) -> Admitted {
        let hash = self.hash(key);
        if self.find(key, hash).is_some() {
            return Admitted::Present;
        }
        let evicted = self.free_slots() == 0;
        if evicted {
            if !self.pick_victims(1, victims) {
                return Admitted::NoRoom;
            }
            self.evict(victims[0]);
        }
        let slot = self.insert_ready(key, hash, reason);
        Admitted::Added { evicted, slot }
    }

    /// Whether `key` is in the index (stored or being stored).
    pub(crate) fn contains(&self, key: &[u8]) -> bool {
        self.find(key, self.hash(key)).is_some()
    }
}
