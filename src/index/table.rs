//! The hash table lookups read: 12-byte buckets holding a hash tag, a slot
//! number and the slot's hot word (more hash bits and the lookup state), so a
//! lookup decides a key by reading one place in memory.

use super::LookupState;
use crate::error::{alloc_error, Result};

/// One table entry, 12 bytes: the high half of the key's hash (`tag`, which
/// also places it), the slot number plus one (0: empty), and the slot's hot
/// word (see [`hot_word`]), so that a lookup reads one place in memory.
#[derive(Clone, Copy, Default)]
#[repr(C)]
pub(super) struct Bucket {
    pub(super) tag: u32,
    pub(super) slot1: u32,
    pub(super) hot: u32,
}

/// Open addressing with linear probing and backward-shift deletion. The size
/// is any number (it grows by half), and a bucket's home is the tag scaled to
/// it, so the table can be rebuilt without rehashing keys.
pub(super) struct Table {
    pub(super) buckets: Vec<Bucket>,
    pub(super) len: usize,
}

#[inline(always)]
pub(super) fn tag_of(hash: u64) -> u32 {
    (hash >> 32) as u32
}

impl Table {
    pub(super) fn with_capacity(entries: usize) -> Table {
        Table {
            buckets: vec![Bucket::default(); (entries.max(8) * 4 / 3) + 1],
            len: 0,
        }
    }

    #[inline(always)]
    pub(super) fn home(&self, tag: u32) -> usize {
        ((tag as u64 * self.buckets.len() as u64) >> 32) as usize
    }

    #[inline(always)]
    pub(super) fn next(&self, i: usize) -> usize {
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
    pub(super) fn try_reserve(&mut self, more: usize) -> Result<()> {
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

    /// The first bucket of `tag`'s probe sequence that `matches` accepts
    /// (only buckets with this tag are offered), or None at an empty bucket.
    #[inline(always)]
    pub(super) fn first(&self, tag: u32, matches: impl Fn(Bucket) -> bool) -> Option<Bucket> {
        let mut i = self.home(tag);
        loop {
            let b = self.buckets[i];
            if b.slot1 == 0 {
                return None;
            }
            if b.tag == tag && matches(b) {
                return Some(b);
            }
            i = self.next(i);
        }
    }

    pub(super) fn insert(&mut self, tag: u32, slot: u32, hot: u32) {
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
    pub(super) fn position(&self, tag: u32, slot: u32) -> usize {
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

    pub(super) fn set_hot(&mut self, tag: u32, slot: u32, hot: u32) {
        let i = self.position(tag, slot);
        self.buckets[i].hot = hot;
    }

    pub(super) fn remove(&mut self, tag: u32, slot: u32) {
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

    pub(super) fn clear(&mut self) {
        self.buckets.iter_mut().for_each(|b| *b = Bucket::default());
        self.len = 0;
    }
}

/// A slot's lookup word: 30 more bits of the key's hash (beyond the table's
/// 32-bit tag) and what a lookup answers for it. Zero for slots lookups must
/// not see (free, or unlinked by a clear).
#[inline(always)]
pub(super) fn hot_word(hash: u64, state: LookupState) -> u32 {
    (hash as u32) & !3 | state as u32
}

#[inline(always)]
pub(super) fn hot_matches(word: u32, hash: u64) -> bool {
    word != 0 && word & !3 == (hash as u32) & !3
}

#[inline(always)]
pub(super) fn hot_state(word: u32) -> LookupState {
    LookupState::from_byte((word & 3) as u8)
}
