//! Checksums and hashes of stored blocks, from the `twox-hash` crate: a leaf
//! utility, shared by the backends and by sealing.
//!
//! - XXH3-64 checks payloads (format version 2 of disk files and Redis
//!   values). Every store and load checksums every byte it moves, and this
//!   is often the first read of a row: with AVX2 (chosen at run time)
//!   XXH3-64 is faster than XXH64 both in cache and from memory
//!   (`cargo run --release -p kvtier-bench --example checksums`; figures in
//!   docs/dependencies.md).
//! - XXH64 checks headers, names disk files, picks stripes and fingerprints
//!   namespaces, as it always has (those values are on disk and servers), and
//!   checks the payloads of blocks written by format version 1.
//!
//! Both are well known and reproducible by any tool (python-xxhash).

/// XXH64 of `data` with `seed`.
pub(crate) fn xxh64(data: &[u8], seed: u64) -> u64 {
    twox_hash::XxHash64::oneshot(seed, data)
}

/// A payload's checksum as a stored header carries it: the algorithm is the
/// one of the format version that wrote the header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PayloadSum {
    /// Format version 1.
    Xxh64(u64),
    /// Format version 2 (written today).
    Xxh3(u64),
}

impl PayloadSum {
    /// The format version written today.
    pub(crate) const CURRENT_VERSION: u32 = 2;

    /// The checksum this build writes for `payload`.
    pub(crate) fn of(payload: &[u8]) -> PayloadSum {
        PayloadSum::Xxh3(twox_hash::XxHash3_64::oneshot(payload))
    }

    /// The checksum a header of format `version` carries as `value`, or
    /// None for a version this build does not read.
    pub(crate) fn read(version: u32, value: u64) -> Option<PayloadSum> {
        match version {
            1 => Some(PayloadSum::Xxh64(value)),
            2 => Some(PayloadSum::Xxh3(value)),
            _ => None,
        }
    }

    /// The value written into the header.
    pub(crate) fn value(self) -> u64 {
        match self {
            PayloadSum::Xxh64(v) | PayloadSum::Xxh3(v) => v,
        }
    }

    /// Whether `payload` has this checksum, computed with this algorithm.
    pub(crate) fn matches(self, payload: &[u8]) -> bool {
        match self {
            PayloadSum::Xxh64(v) => xxh64(payload, 0) == v,
            PayloadSum::Xxh3(v) => twox_hash::XxHash3_64::oneshot(payload) == v,
        }
    }

    /// A checksum of this one's algorithm fed piece by piece, for a payload
    /// read in pieces: [`PayloadHasher::matches`] then says what
    /// [`PayloadSum::matches`] says of the whole payload.
    pub(crate) fn hasher(self) -> PayloadHasher {
        match self {
            PayloadSum::Xxh64(v) => PayloadHasher::Xxh64(twox_hash::XxHash64::with_seed(0), v),
            PayloadSum::Xxh3(v) => PayloadHasher::Xxh3(
                twox_hash::xxhash3_64::RawHasher::new(
                    twox_hash::xxhash3_64::SecretBuffer::default(),
                ),
                v,
            ),
        }
    }
}

type Xxh3Streaming =
    twox_hash::xxhash3_64::RawHasher<&'static [u8; twox_hash::xxhash3_64::DEFAULT_SECRET_LENGTH]>;

/// A payload checksum being computed, with the value it must reach.
// One per load, on the stack; boxing XXH3's state would allocate per load.
#[allow(clippy::large_enum_variant)]
pub(crate) enum PayloadHasher {
    Xxh64(twox_hash::XxHash64, u64),
    /// The default secret, not a copy: no allocation per load.
    Xxh3(Xxh3Streaming, u64),
}

impl PayloadHasher {
    /// Feeds the next bytes of the payload.
    pub(crate) fn write(&mut self, piece: &[u8]) {
        use std::hash::Hasher;
        match self {
            PayloadHasher::Xxh64(h, _) => h.write(piece),
            PayloadHasher::Xxh3(h, _) => h.write(piece),
        }
    }

    /// Whether the bytes fed have the expected checksum.
    pub(crate) fn matches(&self) -> bool {
        use std::hash::Hasher;
        match self {
            PayloadHasher::Xxh64(h, v) => h.finish() == *v,
            PayloadHasher::Xxh3(h, v) => h.finish() == *v,
        }
    }
}

/// The fingerprint of a namespace name, written into every stored block so
/// that blocks of different namespaces never mix.
pub(crate) fn namespace_fingerprint(namespace: &str) -> u64 {
    xxh64(namespace.as_bytes(), 0x6b76_7469_6572)
}

/// The fingerprint the blocks of one tenant (0: unsealed) of a namespace
/// carry in shared storage during its clear `generation` (each `clear()`
/// starts a new one): no block of another namespace, tenant or generation
/// carries it.
pub(crate) fn generation_fingerprint(namespace_fp: u64, tenant: u64, generation: u64) -> u64 {
    let mut all = [0u8; 24];
    all[..8].copy_from_slice(&namespace_fp.to_le_bytes());
    all[8..16].copy_from_slice(&tenant.to_le_bytes());
    all[16..].copy_from_slice(&generation.to_le_bytes());
    xxh64(&all, 0x006b_7667_656e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_checksum_fed_in_pieces_matches_the_one_of_the_whole() {
        let payload: Vec<u8> = (0..300_000u32).map(|i| (i * 31 / 7) as u8).collect();
        let xxh64_sum = PayloadSum::Xxh64(xxh64(&payload, 0));
        for sum in [PayloadSum::of(&payload), xxh64_sum] {
            for piece in [1, 4096, 65536, 299_999, 300_000] {
                let mut h = sum.hasher();
                payload.chunks(piece).for_each(|p| h.write(p));
                assert!(h.matches(), "{sum:?} in pieces of {piece}");
            }
            let mut h = sum.hasher();
            h.write(&payload[1..]);
            assert!(!h.matches(), "{sum:?} of other bytes");
        }
    }

    #[test]
    fn xxh64_matches_the_reference_vectors() {
        // Values from the reference implementation (python-xxhash 3.5).
        assert_eq!(xxh64(b"", 0), 0xef46_db37_51d8_e999);
        assert_eq!(xxh64(b"a", 0), 0xd24e_c4f1_a98c_6e5b);
        assert_eq!(xxh64(b"abc", 0), 0x44bc_2cf5_ad77_0999);
        assert_eq!(
            xxh64(b"Nobody inspects the spammish repetition", 0),
            0xfbce_a83c_8a37_8bf1
        );
        assert_eq!(xxh64(b"abc", 7), 0x9e75_5206_1566_76d7);
        let data: Vec<u8> = (0..1280).map(|i| (i % 256) as u8).collect();
        assert_eq!(xxh64(&data, 0), 0xafc1_84ad_7938_a354);
        assert_eq!(xxh64(&data, 7), 0x133c_f6ca_9d1c_1256);
    }

    #[test]
    fn payload_sums_are_xxh3_today_and_both_kinds_verify() {
        // XXH3-64 reference values (python-xxhash 4.1, xxh3_64_intdigest).
        assert_eq!(PayloadSum::of(b""), PayloadSum::Xxh3(0x2d06_8005_38d3_94c2));
        assert_eq!(
            PayloadSum::of(b"abc"),
            PayloadSum::Xxh3(0x78af_5f94_892f_3950)
        );
        let data: Vec<u8> = (0..1280).map(|i| (i % 256) as u8).collect();
        let now = PayloadSum::of(&data);
        assert!(now.matches(&data));
        let v1 = PayloadSum::read(1, xxh64(&data, 0)).unwrap();
        assert!(v1.matches(&data));
        let mut bad = data.clone();
        bad[700] ^= 1;
        assert!(!now.matches(&bad) && !v1.matches(&bad));
        // The same value read as the other version's checksum fails.
        assert!(!PayloadSum::read(1, now.value()).unwrap().matches(&data));
        assert_eq!(
            PayloadSum::read(PayloadSum::CURRENT_VERSION, now.value()),
            Some(now)
        );
        assert_eq!(PayloadSum::read(3, 0), None);
    }
}
