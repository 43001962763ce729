//! One slot's record in the arena file, and the commit protocol that makes a
//! block readable after a crash only if every byte of it was written.
//!
//! A store first clears the slot's commit word, then writes the payload and
//! the record (key, checksum, recency, a check over them), then writes the
//! commit word: the stamp of this store, unique in the file's life. A full
//! fence (`mfence` on x86, `dmb ish` on Arm) separates each step, so the
//! writes reach the shared pages in that order even where `memcpy` uses
//! non-temporal stores, which an ordinary release store does not order. A
//! process killed at any point leaves the page cache with either the old
//! commit word, zero (the payload may be torn: a miss) or the new stamp
//! after all of the new block. Nothing is flushed: page-cache pages outlive
//! the process, not the host.
//!
//! Records are 192 bytes (three cache lines) and only ever accessed through
//! atomics, so that a release (`Discards`) may read a record a store is
//! rewriting without a data race.

use crate::checksum::xxh64;
use crate::key::MAX_KEY_LEN;
use std::sync::atomic::{fence, AtomicU64, Ordering};

const KEY_WORDS: usize = MAX_KEY_LEN / 8;

/// Bytes of one record in the file.
pub(super) const RECORD_BYTES: usize = 192;

/// Seed of a record's check, so that no other XXH64 of the same bytes
/// (a namespace fingerprint, a file name) is mistaken for one.
const CHECK_SEED: u64 = 0x6b76_7265_636f_7264;

#[repr(C, align(64))]
pub(super) struct Record {
    /// 0: no block. Otherwise the stamp of the store that completed the
    /// block, written after everything else.
    commit: AtomicU64,
    /// XXH3-64 of the payload.
    sum: AtomicU64,
    /// Recency: the stamp of the block's last store or load (or of its place
    /// in the order saved at a clean close).
    used: AtomicU64,
    key_len: AtomicU64,
    /// XXH64 of the key, its length, `sum` and the commit stamp: a record
    /// whose words do not belong together is no block.
    check: AtomicU64,
    /// Nonzero once the slot's pages are allocated in the file (`fallocate`):
    /// a store into a hole of a full tmpfs would be SIGBUS, not an error.
    allocated: AtomicU64,
    /// The payload's length when shorter than the block size (an extent
    /// store), in the check; 0 for a whole block, whose check leaves it out,
    /// as records written before extents were.
    short_len: AtomicU64,
    _reserved: AtomicU64,
    key: [AtomicU64; KEY_WORDS],
}

const _: () = assert!(std::mem::size_of::<Record>() == RECORD_BYTES);

/// A block a record holds, as recovery reads it.
pub(super) struct Held {
    pub key: Vec<u8>,
    pub used: u64,
    pub stamp: u64,
}

/// What a record says.
pub(super) enum Found {
    Nothing,
    Block(Held),
    /// Committed (at this stamp) but its words do not check.
    Damaged(u64),
}

fn key_words(key: &[u8]) -> [u64; KEY_WORDS] {
    let mut words = [0u64; KEY_WORDS];
    for (word, bytes) in words.iter_mut().zip(key.chunks(8)) {
        let mut w = [0u8; 8];
        w[..bytes.len()].copy_from_slice(bytes);
        *word = u64::from_le_bytes(w);
    }
    words
}

fn check_of(words: &[u64; KEY_WORDS], key_len: u64, sum: u64, stamp: u64, short_len: u64) -> u64 {
    let mut all = [0u8; 8 * (KEY_WORDS + 4)];
    let tail = [key_len, sum, stamp, short_len];
    for (at, w) in all.chunks_mut(8).zip(words.iter().chain(&tail)) {
        at.copy_from_slice(&w.to_le_bytes());
    }
    // A whole block's check is over the words before `short_len`.
    let len = if short_len == 0 {
        all.len() - 8
    } else {
        all.len()
    };
    xxh64(&all[..len], CHECK_SEED)
}

impl Record {
    /// Before a store writes the slot's payload: the slot holds no block,
    /// and that is in memory before any byte of the new payload.
    pub(super) fn begin(&self) {
        self.commit.store(0, Ordering::Relaxed);
        fence(Ordering::SeqCst);
    }

    /// After the payload: the record, then (fenced) the commit word.
    pub(super) fn publish(&self, key: &[u8], sum: u64, stamp: u64, short_len: u64) {
        debug_assert!(stamp != 0 && !key.is_empty() && key.len() <= MAX_KEY_LEN);
        let words = key_words(key);
        for (slot, &w) in self.key.iter().zip(&words) {
            slot.store(w, Ordering::Relaxed);
        }
        self.key_len.store(key.len() as u64, Ordering::Relaxed);
        self.sum.store(sum, Ordering::Relaxed);
        self.used.store(stamp, Ordering::Relaxed);
        self.short_len.store(short_len, Ordering::Relaxed);
        self.check.store(
            check_of(&words, key.len() as u64, sum, stamp, short_len),
            Ordering::Relaxed,
        );
        // The payload (non-temporal stores included) and the record before
        // the commit word.
        fence(Ordering::SeqCst);
        self.commit.store(stamp, Ordering::Release);
    }

    /// The block this record holds, if any (recovery: no store runs).
    pub(super) fn read(&self) -> Found {
        let stamp = self.commit.load(Ordering::Acquire);
        if stamp == 0 {
            return Found::Nothing;
        }
        let words: [u64; KEY_WORDS] = std::array::from_fn(|i| self.key[i].load(Ordering::Relaxed));
        let key_len = self.key_len.load(Ordering::Relaxed);
        let sum = self.sum.load(Ordering::Relaxed);
        let short_len = self.short_len.load(Ordering::Relaxed);
        if key_len == 0
            || key_len > MAX_KEY_LEN as u64
            || self.check.load(Ordering::Relaxed)
                != check_of(&words, key_len, sum, stamp, short_len)
        {
            return Found::Damaged(stamp);
        }
        let mut key: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        key.truncate(key_len as usize);
        Found::Block(Held {
            key,
            used: self.used.load(Ordering::Relaxed),
            stamp,
        })
    }

    /// The commit stamp of the block of `key` this record holds, if it
    /// holds one. A store may be rewriting the record meanwhile: then the
    /// stamp read first no longer matches and [`Record::withdraw`] fails.
    pub(super) fn holding(&self, key: &[u8]) -> Option<u64> {
        let stamp = self.commit.load(Ordering::Acquire);
        let words = key_words(key);
        let same = stamp != 0
            && self.key_len.load(Ordering::Relaxed) == key.len() as u64
            && self
                .key
                .iter()
                .zip(&words)
                .all(|(slot, &w)| slot.load(Ordering::Relaxed) == w);
        same.then_some(stamp)
    }

    /// Withdraws the block committed at `stamp`, unless a store has begun
    /// since (stamps are never reused, so a new block never matches).
    pub(super) fn withdraw(&self, stamp: u64) -> bool {
        self.commit
            .compare_exchange(stamp, 0, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    }

    /// The commit word as it is now (0: no block).
    pub(super) fn stamp(&self) -> u64 {
        self.commit.load(Ordering::Acquire)
    }

    pub(super) fn sum(&self) -> u64 {
        self.sum.load(Ordering::Relaxed)
    }

    /// The payload's length, for a block of `block_bytes`.
    pub(super) fn payload_len(&self, block_bytes: usize) -> usize {
        match self.short_len.load(Ordering::Relaxed) {
            0 => block_bytes,
            n => n as usize,
        }
    }

    /// A use of the block: recency for the next open.
    pub(super) fn touch(&self, stamp: u64) {
        self.used.store(stamp, Ordering::Relaxed);
    }

    pub(super) fn allocated(&self) -> bool {
        self.allocated.load(Ordering::Relaxed) != 0
    }

    pub(super) fn set_allocated(&self) {
        self.allocated.store(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> Box<Record> {
        // SAFETY: every field is an atomic integer, for which zero is valid.
        Box::new(unsafe { std::mem::zeroed() })
    }

    #[test]
    fn a_published_block_reads_back_and_a_begun_one_is_no_block() {
        let r = record();
        assert!(matches!(r.read(), Found::Nothing));
        r.publish(b"some key", 42, 7, 0);
        match r.read() {
            Found::Block(held) => {
                assert_eq!(
                    (&held.key[..], held.used, held.stamp),
                    (&b"some key"[..], 7, 7)
                )
            }
            _ => panic!("no block"),
        }
        assert_eq!(r.holding(b"some key"), Some(7));
        assert_eq!(r.holding(b"some kez"), None);
        assert_eq!(r.holding(b"some ke"), None);
        r.begin();
        assert!(matches!(r.read(), Found::Nothing));
        assert_eq!(r.holding(b"some key"), None);
    }

    #[test]
    fn a_record_whose_words_do_not_belong_together_is_damaged() {
        let r = record();
        r.publish(&[9u8; MAX_KEY_LEN], 42, 7, 0);
        r.sum.store(43, Ordering::Relaxed);
        assert!(matches!(r.read(), Found::Damaged(7)));
        r.publish(b"k", 42, 8, 0);
        r.key[0].fetch_xor(1, Ordering::Relaxed);
        assert!(matches!(r.read(), Found::Damaged(8)));
        // A stamp that is not the one the record was checked with.
        r.publish(b"k", 42, 9, 0);
        r.commit.store(10, Ordering::Relaxed);
        assert!(matches!(r.read(), Found::Damaged(10)));
        // An extent's length is checked too: changed, or cleared (which
        // would make it a whole block), the record is no block.
        r.publish(b"k", 42, 11, 100);
        assert!(matches!(r.read(), Found::Block(_)));
        assert_eq!(r.payload_len(4096), 100);
        r.short_len.store(101, Ordering::Relaxed);
        assert!(matches!(r.read(), Found::Damaged(11)));
        r.short_len.store(0, Ordering::Relaxed);
        assert!(matches!(r.read(), Found::Damaged(11)));
    }

    #[test]
    fn withdrawing_fails_once_a_store_has_begun_or_committed_again() {
        let r = record();
        r.publish(b"k", 1, 5, 0);
        assert!(!r.withdraw(4));
        r.publish(b"k", 1, 6, 0);
        assert!(!r.withdraw(5), "a stale stamp withdraws nothing");
        assert!(r.withdraw(6));
        assert!(matches!(r.read(), Found::Nothing));
    }
}
