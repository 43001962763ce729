//! The block file format.
//!
//! A block file is a 4096-byte header followed by the payload, zero-padded to a
//! multiple of 4096 bytes, so that O_DIRECT reads and writes of both parts stay
//! aligned. All integers are little-endian.
//!
//! ```text
//! offset  size  field
//!      0     8  magic "KVTIERB\0"
//!      8     4  format version (2; 1 is still read)
//!     12     4  header length (4096)
//!     16     8  namespace fingerprint (xxh64 of the namespace string)
//!     24     8  payload length in bytes (the tier's block_bytes)
//!     32     4  key length (1..=128)
//!     36     4  flags (0)
//!     40     8  checksum of the payload (unpadded): XXH3-64 in version 2,
//!               XXH64 in version 1
//!     48   128  key, zero-padded
//!    176  3912  zero
//!   4088     8  xxh64 of bytes 0..4088 (the header itself)
//! ```

use crate::backend::checksum::{xxh64, PayloadSum};
use crate::key::MAX_KEY_LEN;

pub(crate) const HEADER_LEN: usize = 4096;
pub(crate) const ALIGN: usize = 4096;
const MAGIC: [u8; 8] = *b"KVTIERB\0";
/// The version written; [`PayloadSum::read`] says which ones are read.
pub(crate) const FORMAT_VERSION: u32 = PayloadSum::CURRENT_VERSION;
const HEADER_SUM_AT: usize = HEADER_LEN - 8;

/// The payload length rounded up to the alignment unit.
pub(crate) fn padded(payload_len: usize) -> usize {
    payload_len.div_ceil(ALIGN) * ALIGN
}

/// Total file length for a payload.
pub(crate) fn file_len(payload_len: usize) -> usize {
    HEADER_LEN + padded(payload_len)
}

/// The decoded fields of a block header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Header {
    pub namespace_fp: u64,
    pub payload_len: u64,
    pub key: Vec<u8>,
    pub payload_sum: PayloadSum,
}

impl Header {
    /// Writes the header into `out` (exactly HEADER_LEN bytes), as format
    /// version [`FORMAT_VERSION`]: `payload_sum` must be that version's.
    pub(crate) fn encode(&self, out: &mut [u8]) {
        let version = match self.payload_sum {
            PayloadSum::Xxh3(_) => FORMAT_VERSION,
            // Only tests write the older version (to prove it is still read).
            PayloadSum::Xxh64(_) => 1,
        };
        assert_eq!(out.len(), HEADER_LEN);
        assert!(!self.key.is_empty() && self.key.len() <= MAX_KEY_LEN);
        out.fill(0);
        out[0..8].copy_from_slice(&MAGIC);
        out[8..12].copy_from_slice(&version.to_le_bytes());
        out[12..16].copy_from_slice(&(HEADER_LEN as u32).to_le_bytes());
        out[16..24].copy_from_slice(&self.namespace_fp.to_le_bytes());
        out[24..32].copy_from_slice(&self.payload_len.to_le_bytes());
        out[32..36].copy_from_slice(&(self.key.len() as u32).to_le_bytes());
        out[40..48].copy_from_slice(&self.payload_sum.value().to_le_bytes());
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
        let u64_at = |at: usize| u64::from_le_bytes(buf[at..at + 8].try_into().expect("8 bytes"));
        if u64_at(HEADER_SUM_AT) != xxh64(&buf[..HEADER_SUM_AT], 0) {
            return Err("header checksum mismatch (torn or corrupted header)".into());
        }
        let version = u32_at(8);
        let Some(payload_sum) = PayloadSum::read(version, u64_at(40)) else {
            return Err(format!(
                "format version {version}, this build reads 1..={FORMAT_VERSION}"
            ));
        };
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
            payload_sum,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips_and_detects_damage() {
        let h = Header {
            namespace_fp: 42,
            payload_len: 8192,
            key: vec![9; 36],
            payload_sum: PayloadSum::Xxh3(0x1234),
        };
        let mut buf = vec![0u8; HEADER_LEN];
        h.encode(&mut buf);
        assert_eq!(Header::decode(&buf).unwrap(), h);
        assert_eq!(buf[8..12], FORMAT_VERSION.to_le_bytes());
        // Version 1 headers (XXH64 payload checksums) are still read as such.
        let old = Header {
            payload_sum: PayloadSum::Xxh64(0x1234),
            ..h.clone()
        };
        let mut old_buf = vec![0u8; HEADER_LEN];
        old.encode(&mut old_buf);
        assert_eq!(old_buf[8..12], 1u32.to_le_bytes());
        assert_eq!(Header::decode(&old_buf).unwrap(), old);
        // A version this build does not know is refused, by name.
        let mut future = buf.clone();
        future[8..12].copy_from_slice(&3u32.to_le_bytes());
        let sum = xxh64(&future[..HEADER_SUM_AT], 0);
        future[HEADER_SUM_AT..].copy_from_slice(&sum.to_le_bytes());
        assert!(Header::decode(&future).unwrap_err().contains("version 3"));
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
