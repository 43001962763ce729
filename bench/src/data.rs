//! Deterministic test data: row contents that can be regenerated for
//! verification, and vLLM-style 36-byte keys (32-byte hash + 4-byte group).

/// vLLM's key: a 32-byte block hash followed by a 4-byte KV-cache group index.
pub const KEY_LEN: usize = 36;

/// Key namespaces, so the phases' key sets never collide.
pub const NS_BANDWIDTH: u64 = 1;
pub const NS_LATENCY_PREFAULT: u64 = 2;
pub const NS_LATENCY: u64 = 3;
pub const NS_LOOKUP: u64 = 4;
pub const NS_LOOKUP_MISS: u64 = 5;
pub const NS_REOPEN: u64 = 6;

const ROW_SEED: u64 = 0x6b76_7469_6572_2d62;

#[inline(always)]
fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// wyrand: one multiply per 8 bytes, so 2 GiB fill in a fraction of a second.
#[derive(Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(splitmix64(seed))
    }

    #[inline(always)]
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0xa076_1d64_78bd_642f);
        let t = (self.0 as u128).wrapping_mul((self.0 ^ 0xe703_7ed1_a0b4_28db) as u128);
        (t as u64) ^ ((t >> 64) as u64)
    }

    /// Uniform in `0..n` (n > 0), by multiply-shift.
    #[inline]
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }
}

fn row_rng(row: u64) -> Rng {
    Rng::new(ROW_SEED ^ splitmix64(row))
}

/// Fills `out` with the deterministic contents of row `row`.
pub fn fill_row(row: u64, out: &mut [u8]) {
    let mut rng = row_rng(row);
    let mut words = out.chunks_exact_mut(8);
    for w in &mut words {
        w.copy_from_slice(&rng.next_u64().to_le_bytes());
    }
    let rest = words.into_remainder();
    let n = rest.len();
    rest.copy_from_slice(&rng.next_u64().to_le_bytes()[..n]);
}

/// The offset of the first byte of `data` that differs from row `row`'s
/// contents, or None if all match.
pub fn check_row(row: u64, data: &[u8]) -> Option<usize> {
    let mut rng = row_rng(row);
    let mut words = data.chunks_exact(8);
    let mut offset = 0;
    for w in &mut words {
        let want = rng.next_u64().to_le_bytes();
        if w != want {
            return Some(offset + w.iter().zip(want).position(|(a, b)| *a != b).unwrap());
        }
        offset += 8;
    }
    let rest = words.remainder();
    let want = rng.next_u64().to_le_bytes();
    rest.iter()
        .zip(want)
        .position(|(a, b)| *a != b)
        .map(|p| offset + p)
}

/// Writes key `i` of namespace `ns` into `out` (KEY_LEN bytes): a 32-byte
/// pseudo-random "hash", distinct for distinct (ns, i), and a group index.
#[inline]
pub fn write_key(ns: u64, i: u64, out: &mut [u8]) {
    // splitmix64 is a bijection, so the first word already differs for every i.
    let mut rng = Rng(splitmix64(splitmix64(ns) ^ i));
    for k in 0..4 {
        out[k * 8..k * 8 + 8].copy_from_slice(&rng.next_u64().to_le_bytes());
    }
    out[32..36].copy_from_slice(&((i % 4) as u32).to_le_bytes());
}

/// Keys `first..first + n` of namespace `ns`, packed.
pub fn keys(ns: u64, first: u64, n: usize) -> Vec<u8> {
    let mut out = vec![0u8; n * KEY_LEN];
    for (j, k) in out.chunks_exact_mut(KEY_LEN).enumerate() {
        write_key(ns, first + j as u64, k);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_regenerate_and_detect_changes() {
        let mut row = vec![0u8; 4099];
        fill_row(7, &mut row);
        assert_eq!(check_row(7, &row), None);
        assert_eq!(check_row(8, &row), Some(0));
        row[4098] ^= 1;
        assert_eq!(check_row(7, &row), Some(4098));
        row[4098] ^= 1;
        row[100] ^= 0x80;
        assert_eq!(check_row(7, &row), Some(100));
    }

    #[test]
    fn keys_are_distinct() {
        let ks = keys(NS_LOOKUP, 0, 10_000);
        let mut set: Vec<&[u8]> = ks.chunks_exact(KEY_LEN).collect();
        set.sort();
        set.dedup();
        assert_eq!(set.len(), 10_000);
        assert_ne!(keys(NS_LOOKUP, 0, 1), keys(NS_LOOKUP_MISS, 0, 1));
    }
}
