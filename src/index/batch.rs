//! Batches of lookups and touches as a software pipeline: hash a key and
//! prefetch its bucket, decide a key a few places back (touch adds stages that
//! prefetch the LRU links it will rewrite, then relinks), so the memory reads
//! of successive keys overlap instead of waiting one after another.

use super::table::{tag_of, Bucket};
use super::{Index, Link, LookupCounts, LookupState, NIL};

/// Pipeline distance between hashing a key and deciding it.
const AHEAD: usize = 16;
/// Ring of in-flight lookups (a power of two above AHEAD).
const RING: usize = 64;
/// Pipeline distance between a touch's stages.
const TOUCH_AHEAD: usize = 16;
/// Ring of in-flight touches (a power of two above 3 * TOUCH_AHEAD).
const TOUCH_RING: usize = 128;

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

impl Index {
    /// Prefetches the home bucket of `hash` (both lines if it straddles).
    #[inline(always)]
    pub(super) fn prefetch_home(&self, hash: u64) {
        let b = &self.table.buckets[self.table.home(tag_of(hash))];
        prefetch(b);
        prefetch((b as *const Bucket as *const u8).wrapping_add(11));
    }

    /// Resolves `n` keys (`key_at(j)` is the j-th) by hash as a pipeline: step
    /// i hashes key i and prefetches its bucket, and resolves key i - AHEAD,
    /// calling `f(j, found)` in order of j. The memory reads of successive
    /// keys overlap instead of waiting one after another.
    pub(super) fn resolve_stream<'k>(
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
}
