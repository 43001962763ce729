//! A copy that checksums what it copies: XXH3-64 (the payload checksum
//! written today, `crate::checksum`) folded into the copy loop, so each byte
//! is read once, from memory, into the registers that both store it and feed
//! the checksum. A copy followed by a separate checksum pass over the same
//! bytes costs a second read and the hash's arithmetic on top of the copy;
//! folded, the arithmetic hides behind the memory traffic (`docs/memory.md`).
//!
//! With AVX2 (chosen at run time) and blocks over 240 bytes this is XXH3-64's
//! long-input algorithm with the default secret, stripe by stripe, equal to
//! `twox_hash::XxHash3_64::oneshot` of the bytes copied (the tests check it).
//! Elsewhere it checksums and copies 64 KiB pieces in turn, each piece
//! checksummed from the source and then copied while it is in cache.

use crate::checksum::{PayloadSum, Xxh3Pieces};

/// Bytes checksummed then copied at a time without AVX2: small enough to
/// stay in the L2 cache between the two, large enough that a call's cost is
/// noise.
const PIECE: usize = 64 << 10;

/// Copies `len` bytes from `src` to `dst`; returns the XXH3-64 of the bytes
/// as read from `src` (so a checksum that fails to match stored bytes is
/// never the fault of what `dst`'s owner did to `dst`).
///
/// # Safety
/// `src` is readable and `dst` writable for `len` bytes, and they do not
/// overlap. Nothing else writes `dst` meanwhile; a concurrent writer of
/// `src` can only make the checksum disagree with the bytes copied.
pub(crate) unsafe fn copy_with_xxh3(src: *const u8, dst: *mut u8, len: usize) -> u64 {
    #[cfg(target_arch = "x86_64")]
    if len > avx2::SHORT_INPUT && std::is_x86_feature_detected!("avx2") {
        return avx2::copy_with_xxh3(src, dst, len);
    }
    in_pieces(src, dst, len)
}

/// Copies `src` into `dst` (of the same length) and says whether `src` has
/// the checksum `sum`, reading each byte once where the algorithm allows
/// (XXH3-64; a format version 1 payload is checked, then copied). On a
/// mismatch `dst` holds the bytes that failed.
pub(crate) fn copy_checked(sum: PayloadSum, src: &[u8], dst: &mut [u8]) -> bool {
    assert_eq!(src.len(), dst.len(), "copy_checked: lengths differ");
    match sum {
        // SAFETY: both slices hold len bytes, and a `&mut` cannot overlap
        // a `&`; nothing else writes `dst` while it is borrowed.
        PayloadSum::Xxh3(v) => {
            let copied = unsafe { copy_with_xxh3(src.as_ptr(), dst.as_mut_ptr(), src.len()) };
            copied == v
        }
        PayloadSum::Xxh64(_) => {
            dst.copy_from_slice(src);
            sum.matches(src)
        }
    }
}

/// [`copy_with_xxh3`] without AVX2: a piece checksummed, then copied.
///
/// # Safety
/// As [`copy_with_xxh3`].
unsafe fn in_pieces(src: *const u8, dst: *mut u8, len: usize) -> u64 {
    let mut sum = Xxh3Pieces::new();
    let mut at = 0;
    while at < len {
        let n = PIECE.min(len - at);
        sum.write(std::slice::from_raw_parts(src.add(at), n));
        std::ptr::copy_nonoverlapping(src.add(at), dst.add(at), n);
        at += n;
    }
    sum.finish()
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    /// XXH3-64 hashes inputs up to this long with other algorithms.
    pub(super) const SHORT_INPUT: usize = 240;

    const PRIME32_1: u64 = 0x9E37_79B1;
    const PRIME32_2: u64 = 0x85EB_CA77;
    const PRIME32_3: u64 = 0xC2B2_AE3D;
    const PRIME64_1: u64 = 0x9E37_79B1_85EB_CA87;
    const PRIME64_2: u64 = 0xC2B2_AE3D_27D4_EB4F;
    const PRIME64_3: u64 = 0x1656_67B1_9E37_79F9;
    const PRIME64_4: u64 = 0x85EB_CA77_C2B2_AE63;
    const PRIME64_5: u64 = 0x27D4_EB2F_1656_67C5;
    const PRIME_MX1: u64 = 0x1656_6791_9E37_79F9;

    const INITIAL: [u64; 8] = [
        PRIME32_3, PRIME64_1, PRIME64_2, PRIME64_3, PRIME64_4, PRIME32_2, PRIME64_5, PRIME32_1,
    ];

    /// XXH3's default secret (the reference's `kSecret`).
    const SECRET: [u8; 192] = [
        0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad,
        0x1c, 0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3,
        0x67, 0x1f, 0xcb, 0x79, 0xe6, 0x4e, 0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc,
        0xff, 0x72, 0x21, 0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6,
        0x81, 0x3a, 0x26, 0x4c, 0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb, 0x88, 0xd0, 0x65,
        0x8b, 0x1b, 0x53, 0x2e, 0xa3, 0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19,
        0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8, 0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9,
        0xdc, 0xbb, 0xc7, 0xc7, 0x0b, 0x4f, 0x1d, 0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31,
        0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64, 0xea, 0xc5, 0xac, 0x83, 0x34, 0xd3, 0xeb,
        0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb, 0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0,
        0xda, 0x49, 0xd3, 0x16, 0x55, 0x26, 0x29, 0xd4, 0x68, 0x9e, 0x2b, 0x16, 0xbe, 0x58, 0x7d,
        0x47, 0xa1, 0xfc, 0x8f, 0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce, 0x45, 0xcb, 0x3a, 0x8f,
        0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b, 0x40, 0x7e,
    ];

    const STRIPE: usize = 64;
    /// Stripes per block: (secret length - 64) / 8.
    const STRIPES: usize = 16;
    const BLOCK: usize = STRIPE * STRIPES;
    /// Where the secrets of the scramble, the last stripe and the final
    /// merge start.
    const SCRAMBLE_SECRET: usize = 192 - 64;
    const LAST_STRIPE_SECRET: usize = 192 - 64 - 7;
    const MERGE_SECRET: usize = 11;

    /// One stripe's accumulation (XXH3's `accumulate_512`): for each 64-bit
    /// lane, `acc[i ^ 1] += data` and `acc[i] += lo32(data ^ key) *
    /// hi32(data ^ key)`.
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn accumulate(acc: &mut [__m256i; 2], data: [__m256i; 2], key: *const u8) {
        for i in 0..2 {
            let k = _mm256_loadu_si256(key.add(32 * i) as *const __m256i);
            let dk = _mm256_xor_si256(data[i], k);
            let dk_hi = _mm256_shuffle_epi32::<0x31>(dk);
            let product = _mm256_mul_epu32(dk, dk_hi);
            let swapped = _mm256_shuffle_epi32::<0x4e>(data[i]);
            acc[i] = _mm256_add_epi64(acc[i], _mm256_add_epi64(product, swapped));
        }
    }

    /// After each full block (XXH3's `scrambleAcc`): `acc ^= acc >> 47;
    /// acc ^= key; acc *= PRIME32_1`.
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn scramble(acc: &mut [__m256i; 2]) {
        let prime = _mm256_set1_epi32(PRIME32_1 as i32);
        for (i, a) in acc.iter_mut().enumerate() {
            let k =
                _mm256_loadu_si256(SECRET.as_ptr().add(SCRAMBLE_SECRET + 32 * i) as *const __m256i);
            let mixed = _mm256_xor_si256(*a, _mm256_srli_epi64::<47>(*a));
            let dk = _mm256_xor_si256(mixed, k);
            let lo = _mm256_mul_epu32(dk, prime);
            let hi = _mm256_mul_epu32(_mm256_shuffle_epi32::<0x31>(dk), prime);
            *a = _mm256_add_epi64(lo, _mm256_slli_epi64::<32>(hi));
        }
    }

    /// Copies one stripe and accumulates it.
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn copy_stripe(acc: &mut [__m256i; 2], src: *const u8, dst: *mut u8, key: *const u8) {
        let d0 = _mm256_loadu_si256(src as *const __m256i);
        let d1 = _mm256_loadu_si256(src.add(32) as *const __m256i);
        _mm256_storeu_si256(dst as *mut __m256i, d0);
        _mm256_storeu_si256(dst.add(32) as *mut __m256i, d1);
        accumulate(acc, [d0, d1], key);
    }

    /// See [`super::copy_with_xxh3`]; `len > SHORT_INPUT`.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn copy_with_xxh3(src: *const u8, dst: *mut u8, len: usize) -> u64 {
        debug_assert!(len > SHORT_INPUT);
        let mut acc = [
            _mm256_loadu_si256(INITIAL.as_ptr() as *const __m256i),
            _mm256_loadu_si256(INITIAL.as_ptr().add(4) as *const __m256i),
        ];
        let secret = SECRET.as_ptr();
        // Every block but the last is scrambled; the last one (full or not)
        // is accumulated up to, not including, its last stripe.
        let blocks = (len - 1) / BLOCK;
        for b in 0..blocks {
            for s in 0..STRIPES {
                let at = b * BLOCK + s * STRIPE;
                copy_stripe(&mut acc, src.add(at), dst.add(at), secret.add(8 * s));
            }
            scramble(&mut acc);
        }
        let stripes = (len - 1 - blocks * BLOCK) / STRIPE;
        for s in 0..stripes {
            let at = blocks * BLOCK + s * STRIPE;
            copy_stripe(&mut acc, src.add(at), dst.add(at), secret.add(8 * s));
        }
        let copied = blocks * BLOCK + stripes * STRIPE;
        std::ptr::copy_nonoverlapping(src.add(copied), dst.add(copied), len - copied);
        // The last 64 bytes, again from the source (they may overlap the
        // stripes above).
        let last = src.add(len - STRIPE);
        let data = [
            _mm256_loadu_si256(last as *const __m256i),
            _mm256_loadu_si256(last.add(32) as *const __m256i),
        ];
        accumulate(&mut acc, data, secret.add(LAST_STRIPE_SECRET));
        let mut lanes = [0u64; 8];
        _mm256_storeu_si256(lanes.as_mut_ptr() as *mut __m256i, acc[0]);
        _mm256_storeu_si256(lanes.as_mut_ptr().add(4) as *mut __m256i, acc[1]);
        merge(&lanes, (len as u64).wrapping_mul(PRIME64_1))
    }

    /// XXH3's final merge of the accumulators, and its avalanche.
    fn merge(acc: &[u64; 8], start: u64) -> u64 {
        let word = |at: usize| u64::from_le_bytes(SECRET[at..at + 8].try_into().unwrap());
        let mut result = start;
        for i in 0..4 {
            let a = (acc[2 * i] ^ word(MERGE_SECRET + 16 * i)) as u128;
            let b = (acc[2 * i + 1] ^ word(MERGE_SECRET + 16 * i + 8)) as u128;
            let product = a.wrapping_mul(b);
            result = result.wrapping_add((product as u64) ^ ((product >> 64) as u64));
        }
        result ^= result >> 37;
        result = result.wrapping_mul(PRIME_MX1);
        result ^ (result >> 32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(len: usize, seed: u64) -> Vec<u8> {
        let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    fn avx2() -> bool {
        #[cfg(target_arch = "x86_64")]
        return std::is_x86_feature_detected!("avx2");
        #[cfg(not(target_arch = "x86_64"))]
        false
    }

    #[test]
    fn copy_checked_copies_and_matches_only_the_sum_of_the_source() {
        for len in [0, 100, 4096, 65536 + 7, 2 << 20] {
            let src = bytes(len, len as u64);
            for sum in [
                PayloadSum::of(&src),
                PayloadSum::Xxh64(crate::checksum::xxh64(&src, 0)),
            ] {
                let mut dst = vec![0u8; len];
                assert!(copy_checked(sum, &src, &mut dst), "length {len}, {sum:?}");
                assert_eq!(dst, src, "length {len}, {sum:?}");
            }
            if len > 0 {
                let mut other = src.clone();
                other[len / 2] ^= 1;
                let mut dst = vec![0u8; len];
                assert!(
                    !copy_checked(PayloadSum::of(&src), &other, &mut dst),
                    "length {len}"
                );
                assert!(!copy_checked(
                    PayloadSum::Xxh64(crate::checksum::xxh64(&src, 0)),
                    &other,
                    &mut dst
                ));
            }
        }
    }

    #[test]
    fn the_copy_is_exact_and_its_checksum_is_xxh3_64_at_every_length() {
        let mut lengths: Vec<usize> = (0..=300).collect();
        for around in [1024, 2048, 4096, 65536, 1 << 20, 2 << 20] {
            lengths.extend(around - 65..=around + 65);
        }
        lengths.extend([1_000_003, 3 * 1024 * 1024 + 17]);
        for (i, &len) in lengths.iter().enumerate() {
            // Unaligned source and destination too.
            let shift = i % 7;
            let src = bytes(len + shift, i as u64);
            let src = &src[shift..];
            let mut dst = vec![0u8; len + 3];
            for (copy, name) in [
                (
                    copy_with_xxh3 as unsafe fn(*const u8, *mut u8, usize) -> u64,
                    "as chosen",
                ),
                (in_pieces, "in pieces"),
            ] {
                dst.fill(0);
                // SAFETY: src holds len bytes, dst len + 3; distinct vectors.
                let sum = unsafe { copy(src.as_ptr(), dst.as_mut_ptr().add(3), len) };
                assert_eq!(
                    sum,
                    twox_hash::XxHash3_64::oneshot(src),
                    "length {len}, {name} (avx2: {})",
                    avx2()
                );
                assert_eq!(&dst[3..], src, "length {len}, {name}");
                assert_eq!(dst[..3], [0, 0, 0]);
            }
        }
    }
}
