//! The block file formats. All integers are little-endian.
//!
//! Two forms, told apart by the file's length:
//!
//! - **In-file header** (format versions 1 and 2; written for keys too long to
//!   be a file name, for sealed tiers' own header, and where `block_header`
//!   is `file`): a 4096-byte header followed by the payload, zero-padded to a
//!   multiple of 4096 bytes, so that O_DIRECT reads and writes of both parts
//!   stay aligned. File length 4096 + the padded payload.
//! - **Attribute header** (format version 3, written where the file system
//!   keeps extended attributes): the file holds only the padded payload, and
//!   a 56-byte header is the extended attribute `user.kvtier`. A 64 KiB block
//!   is then a 16-block file instead of 17: a cold load of such blocks ran
//!   8-20% faster, as fast as a raw read of the payload alone (the attribute
//!   lives in the inode, which the open reads anyway). File length: the
//!   padded payload. The file name spells the key (see `layout`), so the
//!   attribute carries only the key's length and hash.
//!
//! In-file header:
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
//!
//! Attribute header (`user.kvtier`):
//!
//! ```text
//! offset  size  field
//!      0     4  magic "KVTX"
//!      4     4  format version (3)
//!      8     8  namespace fingerprint
//!     16     8  payload length in bytes
//!     24     4  key length
//!     28     4  flags (0)
//!     32     8  xxh64 of the key, seed 3
//!     40     8  XXH3-64 of the payload (unpadded)
//!     48     8  xxh64 of bytes 0..48
//! ```

use crate::backend::checksum::{xxh64, PayloadSum};
use crate::key::MAX_KEY_LEN;

pub(crate) const HEADER_LEN: usize = 4096;
pub(crate) const ALIGN: usize = 4096;
const MAGIC: [u8; 8] = *b"KVTIERB\0";
/// The version written; [`PayloadSum::read`] says which ones are read.
pub(crate) const FORMAT_VERSION: u32 = PayloadSum::CURRENT_VERSION;
const HEADER_SUM_AT: usize = HEADER_LEN - 8;

/// The extended attribute that holds an attribute header.
pub(crate) const ATTR_NAME: &std::ffi::CStr = c"user.kvtier";
pub(crate) const ATTR_LEN: usize = 56;
const ATTR_MAGIC: [u8; 4] = *b"KVTX";
const ATTR_VERSION: u32 = 3;
const ATTR_SUM_AT: usize = ATTR_LEN - 8;
const KEY_HASH_SEED: u64 = 3;

/// The payload length rounded up to the alignment unit.
pub(crate) fn padded(payload_len: usize) -> usize {
    payload_len.div_ceil(ALIGN) * ALIGN
}

/// Total file length for a payload, with the header in the file.
pub(crate) fn file_len(payload_len: usize) -> usize {
    HEADER_LEN + padded(payload_len)
}

/// Where a block file keeps its header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Form {
    /// The first 4096 bytes ([`Header`], versions 1 and 2).
    InFile,
    /// The extended attribute [`ATTR_NAME`] ([`AttrHeader`], version 3).
    Attr,
}

impl Form {
    /// The length of a block file of this form.
    pub(crate) fn file_len(self, payload_len: usize) -> usize {
        match self {
            Form::InFile => file_len(payload_len),
            Form::Attr => padded(payload_len),
        }
    }

    /// The form of a block file of `len` bytes, if it is either.
    pub(crate) fn of_len(len: u64, payload_len: usize) -> Option<Form> {
        [Form::Attr, Form::InFile]
            .into_iter()
            .find(|form| form.file_len(payload_len) as u64 == len)
    }
}

/// What a load compares with what it expects: the fields both header forms
/// carry, decoded.
pub(crate) struct Claims {
    pub namespace_fp: u64,
    pub payload_len: u64,
    /// Whether the header names the key that was asked for.
    pub names_key: bool,
    pub payload_sum: PayloadSum,
}

/// The decoded fields of an attribute header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct AttrHeader {
    pub namespace_fp: u64,
    pub payload_len: u64,
    pub key_len: u32,
    pub key_hash: u64,
    /// XXH3-64 of the payload.
    pub payload_sum: u64,
}

impl AttrHeader {
    /// The header of `payload` stored under `key`.
    pub(crate) fn of(namespace_fp: u64, key: &[u8], payload: &[u8]) -> AttrHeader {
        AttrHeader {
            namespace_fp,
            payload_len: payload.len() as u64,
            key_len: key.len() as u32,
            key_hash: xxh64(key, KEY_HASH_SEED),
            payload_sum: PayloadSum::of(payload).value(),
        }
    }

    pub(crate) fn encode(&self) -> [u8; ATTR_LEN] {
        let mut out = [0u8; ATTR_LEN];
        out[0..4].copy_from_slice(&ATTR_MAGIC);
        out[4..8].copy_from_slice(&ATTR_VERSION.to_le_bytes());
        out[8..16].copy_from_slice(&self.namespace_fp.to_le_bytes());
        out[16..24].copy_from_slice(&self.payload_len.to_le_bytes());
        out[24..28].copy_from_slice(&self.key_len.to_le_bytes());
        out[32..40].copy_from_slice(&self.key_hash.to_le_bytes());
        out[40..48].copy_from_slice(&self.payload_sum.to_le_bytes());
        let sum = xxh64(&out[..ATTR_SUM_AT], 0);
        out[ATTR_SUM_AT..].copy_from_slice(&sum.to_le_bytes());
        out
    }

    /// As [`Header::is_newer`], for a header attribute.
    pub(crate) fn is_newer(buf: &[u8]) -> bool {
        buf.len() == ATTR_LEN
            && buf[0..4] == ATTR_MAGIC
            && buf[ATTR_SUM_AT..] == xxh64(&buf[..ATTR_SUM_AT], 0).to_le_bytes()
            && u32::from_le_bytes(buf[4..8].try_into().expect("4 bytes")) > ATTR_VERSION
    }

    /// Parses an attribute's value; the error says what is wrong with it.
    pub(crate) fn decode(buf: &[u8]) -> Result<AttrHeader, String> {
        if buf.len() != ATTR_LEN {
            return Err(format!(
                "header attribute is {} bytes, expected {ATTR_LEN}",
                buf.len()
            ));
        }
        if buf[0..4] != ATTR_MAGIC {
            return Err("bad magic in the header attribute".into());
        }
        let u32_at = |at: usize| u32::from_le_bytes(buf[at..at + 4].try_into().expect("4 bytes"));
        let u64_at = |at: usize| u64::from_le_bytes(buf[at..at + 8].try_into().expect("8 bytes"));
        if u64_at(ATTR_SUM_AT) != xxh64(&buf[..ATTR_SUM_AT], 0) {
            return Err("header attribute checksum mismatch".into());
        }
        if u32_at(4) != ATTR_VERSION {
            return Err(format!(
                "header attribute of format version {}, expected {ATTR_VERSION}",
                u32_at(4)
            ));
        }
        Ok(AttrHeader {
            namespace_fp: u64_at(8),
            payload_len: u64_at(16),
            key_len: u32_at(24),
            key_hash: u64_at(32),
            payload_sum: u64_at(40),
        })
    }

    pub(crate) fn claims(&self, key: &[u8]) -> Claims {
        Claims {
            namespace_fp: self.namespace_fp,
            payload_len: self.payload_len,
            names_key: self.key_len as usize == key.len()
                && self.key_hash == xxh64(key, KEY_HASH_SEED),
            payload_sum: PayloadSum::Xxh3(self.payload_sum),
        }
    }
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
    pub(crate) fn claims(&self, key: &[u8]) -> Claims {
        Claims {
            namespace_fp: self.namespace_fp,
            payload_len: self.payload_len,
            names_key: self.key == key,
            payload_sum: self.payload_sum,
        }
    }

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

    /// Whether `buf` starts with an intact kvtier block header of a format
    /// newer than this build reads (magic, header checksum, version above
    /// FORMAT_VERSION): another version's block, to be left alone, never
    /// condemned. Later formats keep those three where they are.
    pub(crate) fn is_newer(buf: &[u8]) -> bool {
        buf.len() >= HEADER_LEN
            && buf[0..8] == MAGIC
            && buf[HEADER_SUM_AT..HEADER_LEN] == xxh64(&buf[..HEADER_SUM_AT], 0).to_le_bytes()
            && u32::from_le_bytes(buf[8..12].try_into().expect("4 bytes")) > FORMAT_VERSION
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

    #[test]
    fn the_two_forms_are_told_apart_by_length() {
        for payload in [1, 4095, 4096, 65536, 65537, 2 << 20] {
            assert_eq!(Form::Attr.file_len(payload) % ALIGN, 0);
            for form in [Form::Attr, Form::InFile] {
                let len = form.file_len(payload) as u64;
                assert_eq!(Form::of_len(len, payload), Some(form));
            }
            assert_eq!(
                Form::of_len(Form::Attr.file_len(payload) as u64 + 1, payload),
                None
            );
        }
        assert_eq!(Form::Attr.file_len(65536), 65536);
    }

    #[test]
    fn attribute_header_round_trips_and_detects_damage() {
        let payload = vec![5u8; 1000];
        let h = AttrHeader::of(42, b"key-1", &payload);
        let buf = h.encode();
        assert_eq!(buf[4..8], 3u32.to_le_bytes());
        let back = AttrHeader::decode(&buf).unwrap();
        assert_eq!(back, h);
        let claims = back.claims(b"key-1");
        assert!(claims.names_key && claims.payload_sum.matches(&payload));
        assert_eq!((claims.namespace_fp, claims.payload_len), (42, 1000));
        assert!(!back.claims(b"key-2").names_key);
        assert!(!back.claims(b"key-1\0").names_key);
        for at in 0..ATTR_LEN {
            let mut bad = buf;
            bad[at] ^= 1;
            assert!(
                AttrHeader::decode(&bad).is_err(),
                "flip at {at} not detected"
            );
        }
        assert!(AttrHeader::decode(&buf[..40])
            .unwrap_err()
            .contains("40 bytes"));
        // A version this build does not know is refused, by name.
        let mut future = buf;
        future[4..8].copy_from_slice(&4u32.to_le_bytes());
        let sum = xxh64(&future[..ATTR_SUM_AT], 0);
        future[ATTR_SUM_AT..].copy_from_slice(&sum.to_le_bytes());
        assert!(AttrHeader::decode(&future)
            .unwrap_err()
            .contains("version 4"));
    }
}
