//! Keys: their length limits, the checks every entry point applies to packed
//! keys, and the seeded hash the index places them by.
//!
//! The hash: keys are usually cryptographic digests, but engines also use
//! small integers, so it must mix well and resist crafted collisions: each
//! tier draws a random seed. The mixing is the folded 128-bit multiply of
//! wyhash, which hashes a 36-byte key in a few nanoseconds.

use crate::error::{bail, Result};
use std::hash::BuildHasher;

/// Longest accepted key, in bytes.
pub const MAX_KEY_LEN: usize = 128;

/// Checks a key length: 1..=MAX_KEY_LEN.
pub(crate) fn check_key_len(key_len: usize) -> Result<()> {
    if key_len == 0 || key_len > MAX_KEY_LEN {
        bail!(
            InvalidArg,
            "key_len: {key_len} is outside 1..={MAX_KEY_LEN}"
        );
    }
    Ok(())
}

/// Checks `keys` holds exactly `n` packed keys of a valid `key_len`, and that
/// `n` fits a job (its positions are u32).
pub(crate) fn check_keys(keys: &[u8], key_len: usize, n: usize) -> Result<()> {
    check_key_len(key_len)?;
    if n > u32::MAX as usize {
        bail!(
            InvalidArg,
            "n: {n} keys exceed the per-call limit of {}",
            u32::MAX
        );
    }
    if Some(keys.len()) != n.checked_mul(key_len) {
        bail!(
            InvalidArg,
            "keys: {} bytes is not {n} keys of {key_len} bytes",
            keys.len()
        );
    }
    Ok(())
}

/// Keys packed back to back, `key_len` bytes each (checked by the caller).
#[derive(Clone, Copy, Debug)]
pub(crate) struct PackedKeys<'a> {
    bytes: &'a [u8],
    key_len: usize,
}

impl<'a> PackedKeys<'a> {
    pub(crate) fn new(bytes: &'a [u8], key_len: usize) -> PackedKeys<'a> {
        debug_assert!(key_len > 0 && bytes.len() % key_len == 0);
        PackedKeys { bytes, key_len }
    }

    /// How many keys (at most u32::MAX, see [`check_keys`]).
    pub(crate) fn len(&self) -> u32 {
        (self.bytes.len() / self.key_len) as u32
    }

    pub(crate) fn key_len(&self) -> usize {
        self.key_len
    }

    /// The key at position `pos`.
    pub(crate) fn get(&self, pos: u32) -> &'a [u8] {
        &self.bytes[pos as usize * self.key_len..][..self.key_len]
    }
}

/// How many keys of `key_len` bytes `keys` packs, checked (whole keys only).
pub(crate) fn count_keys(keys: &[u8], key_len: usize) -> Result<usize> {
    check_key_len(key_len)?;
    let n = keys.len() / key_len;
    check_keys(keys, key_len, n)?;
    Ok(n)
}

const P0: u64 = 0xa076_1d64_78bd_642f;
const P1: u64 = 0xe703_7ed1_a0b4_28db;
const P2: u64 = 0x8ebc_6af0_9c88_c6e3;

#[inline(always)]
fn fold_mul(a: u64, b: u64) -> u64 {
    let r = (a as u128).wrapping_mul(b as u128);
    (r as u64) ^ ((r >> 64) as u64)
}

#[inline(always)]
fn read_u64(b: &[u8]) -> u64 {
    u64::from_le_bytes(b[..8].try_into().expect("8 bytes"))
}

/// Hashes keys with a per-instance random seed.
#[derive(Clone, Copy, Debug)]
pub(crate) struct KeyHasher {
    seed: u64,
}

impl KeyHasher {
    /// A hasher with a fresh random seed.
    pub(crate) fn random() -> KeyHasher {
        let seed = std::collections::hash_map::RandomState::new().hash_one(0x6b76_7469_6572_u64);
        KeyHasher { seed }
    }

    #[cfg(test)]
    pub(crate) fn with_seed(seed: u64) -> KeyHasher {
        KeyHasher { seed }
    }

    /// The hash of `key`.
    #[inline]
    pub(crate) fn hash(&self, key: &[u8]) -> u64 {
        let mut h = self.seed ^ fold_mul(key.len() as u64 ^ P0, P1);
        let mut chunks = key.chunks_exact(16);
        for c in &mut chunks {
            h = fold_mul(read_u64(c) ^ P1, read_u64(&c[8..]) ^ h);
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut tail = [0u8; 16];
            tail[..rest.len()].copy_from_slice(rest);
            h = fold_mul(read_u64(&tail) ^ P2, read_u64(&tail[8..]) ^ h);
        }
        fold_mul(h ^ P0, P2 ^ key.len() as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn distinct_small_keys_spread_over_high_and_low_bits() {
        let h = KeyHasher::with_seed(1);
        let mut high = HashSet::new();
        let mut low = HashSet::new();
        for i in 0u64..100_000 {
            let v = h.hash(&i.to_le_bytes());
            high.insert(v >> 44);
            low.insert(v & 0xfffff);
        }
        // 100k keys into 2^20 buckets: a good hash leaves ~95k distinct buckets.
        assert!(high.len() > 90_000, "{}", high.len());
        assert!(low.len() > 90_000, "{}", low.len());
    }

    #[test]
    fn length_and_seed_matter() {
        let a = KeyHasher::with_seed(1);
        let b = KeyHasher::with_seed(2);
        assert_ne!(a.hash(b"abc"), a.hash(b"abc\0"));
        assert_ne!(a.hash(b""), a.hash(b"\0"));
        assert_ne!(a.hash(b"abc"), b.hash(b"abc"));
        assert_eq!(a.hash(&[7u8; 36]), a.hash(&[7u8; 36]));
    }
}
