//! The block file format.
//!
//! A block file is a 4096-byte header followed by the payload, zero-padded to a
//! multiple of 4096 bytes, so that O_DIRECT reads and writes of both parts stay
//! aligned. All integers are little-endian.
//!
//! ```text
//! offset  size  field
//!      0     8  magic "KVTIERB\0"
//!      8     4  format version (1)
//!     12     4  header length (4096)
//!     16     8  namespace fingerprint (xxh64 of the namespace string)
//!     24     8  payload length in bytes (the tier's block_bytes)
//!     32     4  key length (1..=128)
//!     36     4  flags (0)
//!     40     8  xxh64 of the payload (unpadded)
//!     48   128  key, zero-padded
//!    176  3912  zero
//!   4088     8  xxh64 of bytes 0..4088 (the header itself)
//! ```

use crate::key::MAX_KEY_LEN;

pub(crate) const HEADER_LEN: usize = 4096;
pub(crate) const ALIGN: usize = 4096;
const MAGIC: [u8; 8] = *b"KVTIERB\0";
pub(crate) const FORMAT_VERSION: u32 = 1;
const HEADER_SUM_AT: usize = HEADER_LEN - 8;

/// The payload length rounded up to the alignment unit.
pub(crate) fn padded(payload_len: usize) -> usize {
    payload_len.div_ceil(ALIGN) * ALIGN
}

/// Total file length for a payload.
pub(crate) fn file_len(payload_len: usize) -> usize {
    HEADER_LEN + padded(payload_len)
}

const P1: u64 = 0x9E37_79B1_85EB_CA87;
const P2: u64 = 0xC2B2_AE3D_27D4_EB4F;
const P3: u64 = 0x1656_67B1_9E37_79F9;
const P4: u64 = 0x85EB_CA77_C2B2_AE63;
const P5: u64 = 0x27D4_EB2F_1656_67C5;

#[inline(always)]
fn read64(b: &[u8]) -> u64 {
    u64::from_le_bytes(b[..8].try_into().expect("8 bytes"))
}

#[inline(always)]
fn round(acc: u64, input: u64) -> u64 {
    acc.wrapping_add(input.wrapping_mul(P2))
        .rotate_left(31)
        .wrapping_mul(P1)
}

#[inline(always)]
fn merge(acc: u64, v: u64) -> u64 {
    (acc ^ round(0, v)).wrapping_mul(P1).wrapping_add(P4)
}

/// XXH64, the checksum of payloads and headers: fast (several GB/s per core,
/// so it never limits a disk), well-known, and reproducible by any tool.
pub(crate) fn xxh64(data: &[u8], seed: u64) -> u64 {
    let len = data.len();
    let mut rest = data;
    let mut h = if len >= 32 {
        let mut v = [
            seed.wrapping_add(P1).wrapping_add(P2),
            seed.wrapping_add(P2),
            seed,
            seed.wrapping_sub(P1),
        ];
        let mut stripes = data.chunks_exact(32);
        for s in &mut stripes {
            v[0] = round(v[0], read64(s));
            v[1] = round(v[1], read64(&s[8..]));
            v[2] = round(v[2], read64(&s[16..]));
            v[3] = round(v[3], read64(&s[24..]));
        }
        rest = stripes.remainder();
        let mut h = v[0]
            .rotate_left(1)
            .wrapping_add(v[1].rotate_left(7))
            .wrapping_add(v[2].rotate_left(12))
            .wrapping_add(v[3].rotate_left(18));
        for x in v {
            h = merge(h, x);
        }
        h
    } else {
        seed.wrapping_add(P5)
    };
    h = h.wrapping_add(len as u64);
    let mut words = rest.chunks_exact(8);
    for w in &mut words {
        h = (h ^ round(0, read64(w)))
            .rotate_left(27)
            .wrapping_mul(P1)
            .wrapping_add(P4);
    }
    let mut rest = words.remainder();
    if rest.len() >= 4 {
        let w = u32::from_le_bytes(rest[..4].try_into().expect("4 bytes")) as u64;
        h = (h ^ w.wrapping_mul(P1))
            .rotate_left(23)
            .wrapping_mul(P2)
            .wrapping_add(P3);
        rest = &rest[4..];
    }
    for &b in rest {
        h = (h ^ (b as u64).wrapping_mul(P5))
            .rotate_left(11)
            .wrapping_mul(P1);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(P2);
    h ^= h >> 29;
    h = h.wrapping_mul(P3);
    h ^ (h >> 32)
}

/// The decoded fields of a block header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Header {
    pub namespace_fp: u64,
    pub payload_len: u64,
    pub key: Vec<u8>,
    pub payload_sum: u64,
}

impl Header {
    /// Writes the header into `out` (exactly HEADER_LEN bytes).
    pub(crate) fn encode(&self, out: &mut [u8]) {
        assert_eq!(out.len(), HEADER_LEN);
        assert!(!self.key.is_empty() && self.key.len() <= MAX_KEY_LEN);
        out.fill(0);
        out[0..8].copy_from_slice(&MAGIC);
        out[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        out[12..16].copy_from_slice(&(HEADER_LEN as u32).to_le_bytes());
        out[16..24].copy_from_slice(&self.namespace_fp.to_le_bytes());
        out[24..32].copy_from_slice(&self.payload_len.to_le_bytes());
        out[32..36].copy_from_slice(&(self.key.len() as u32).to_le_bytes());
        out[40..48].copy_from_slice(&self.payload_sum.to_le_bytes());
        out[48..48 + self.key.len()].copy_from_slice(&self.key);
        let sum = xxh64(&out[..HEADER_SUM_AT], 0);
        out[HEADER_SUM_AT..].copy_from_slice(&sum.to_le_bytes());
    }

    /// Parses a header; the error says what is wrong with it.
    pub(crate) fn decode(buf: &[u8]) -> Result<Header, String> {
        if buf.len() < HEADER_LEN {
            return Err(format!(
                "header is {} bytes, expected {HEADER_LEN}",
                buf.len()
            ));
        }
        let buf = &buf[..HEADER_LEN];
        if buf[0..8] != MAGIC {
            return Err("bad magic (not a kvtier block file)".into());
        }
        let u32_at = |at: usize| u32::from_le_bytes(buf[at..at + 4].try_into().expect("4 bytes"));
        let u64_at = |at: usize| read64(&buf[at..]);
        if u64_at(HEADER_SUM_AT) != xxh64(&buf[..HEADER_SUM_AT], 0) {
            return Err("header checksum mismatch (torn or corrupted header)".into());
        }
        let version = u32_at(8);
        if version != FORMAT_VERSION {
            return Err(format!(
                "format version {version}, this build reads {FORMAT_VERSION}"
            ));
        }
        if u32_at(12) as usize != HEADER_LEN {
            return Err(format!(
                "header length {}, expected {HEADER_LEN}",
                u32_at(12)
            ));
        }
        let key_len = u32_at(32) as usize;
        if key_len == 0 || key_len > MAX_KEY_LEN {
            return Err(format!("key length {key_len} out of range"));
        }
        Ok(Header {
            namespace_fp: u64_at(16),
            payload_len: u64_at(24),
            key: buf[48..48 + key_len].to_vec(),
            payload_sum: u64_at(40),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn header_round_trips_and_detects_damage() {
        let h = Header {
            namespace_fp: 42,
            payload_len: 8192,
            key: vec![9; 36],
            payload_sum: 0x1234,
        };
        let mut buf = vec![0u8; HEADER_LEN];
        h.encode(&mut buf);
        assert_eq!(Header::decode(&buf).unwrap(), h);
        for at in [0, 9, 17, 25, 33, 41, 50, 3000, 4090] {
            let mut bad = buf.clone();
            bad[at] ^= 1;
            assert!(Header::decode(&bad).is_err(), "flip at {at} not detected");
        }
        assert!(Header::decode(&buf[..100]).is_err());
    }

    #[test]
    fn sizes_are_aligned() {
        assert_eq!(file_len(4096), 8192);
        assert_eq!(file_len(1), 8192);
        assert_eq!(file_len(2 << 20), 4096 + (2 << 20));
    }
}
