//! Striped locks: a fixed table of mutexes, one picked per key by its hash,
//! so operations on different keys rarely wait on each other while those on
//! one key are serialized. The backends' publish/delete locks and the seal
//! ledger's maps are tables of this one type.

use crate::checksum::xxh64;
use crate::sync::{Mutex, MutexGuard};

/// `n` mutexes over values of `T`; a key's stripe is XXH64 of it with `seed`,
/// modulo `n`.
pub(crate) struct Striped<T> {
    stripes: Box<[Mutex<T>]>,
    seed: u64,
}

impl<T> Striped<T> {
    /// A table of `n` stripes (at least one), each holding `make()`.
    pub(crate) fn new(n: usize, seed: u64, mut make: impl FnMut() -> T) -> Striped<T> {
        Striped {
            stripes: (0..n.max(1)).map(|_| Mutex::new(make())).collect(),
            seed,
        }
    }

    fn index(&self, key: &[u8]) -> usize {
        xxh64(key, self.seed) as usize % self.stripes.len()
    }

    /// The stripe of `key`.
    pub(crate) fn of(&self, key: &[u8]) -> &Mutex<T> {
        &self.stripes[self.index(key)]
    }

    /// The stripes of every key, each locked once, in ascending order, so
    /// two callers locking overlapping sets never wait on each other in a
    /// circle.
    #[cfg_attr(not(feature = "redis-backend"), allow(dead_code))] // only Redis locks batches
    pub(crate) fn lock_all<'k>(
        &self,
        keys: impl Iterator<Item = &'k [u8]>,
    ) -> Vec<MutexGuard<'_, T>> {
        let mut picked: Vec<usize> = keys.map(|key| self.index(key)).collect();
        picked.sort_unstable();
        picked.dedup();
        picked.iter().map(|&i| self.stripes[i].lock()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_always_gets_its_own_stripe() {
        let table = Striped::new(16, 2, || 0u32);
        *table.of(b"a").lock() += 1;
        *table.of(b"a").lock() += 1;
        assert_eq!(*table.of(b"a").lock(), 2);
        assert_eq!(table.index(b"a"), xxh64(b"a", 2) as usize % 16);
    }

    #[test]
    fn lock_all_takes_each_stripe_once() {
        let table = Striped::new(1, 0, || ());
        // Two keys on the one stripe: a second lock of it would deadlock.
        let guards = table.lock_all([&b"a"[..], b"b", b"a"].into_iter());
        assert_eq!(guards.len(), 1);
        drop(guards);
        let table = Striped::new(65_536, 2, || ());
        let keys: Vec<[u8; 2]> = (0u16..100).map(u16::to_le_bytes).collect();
        let guards = table.lock_all(keys.iter().map(|k| &k[..]));
        let distinct: std::collections::BTreeSet<usize> =
            keys.iter().map(|k| table.index(k)).collect();
        assert_eq!(guards.len(), distinct.len());
    }
}
