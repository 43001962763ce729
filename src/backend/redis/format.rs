//! How a block is stored in Redis: its key name, and the value (a small
//! header, then the payload) verified on every load.
//!
//! Key name: `<prefix>:<namespace fingerprint>:b<block_bytes>:{<tag>}`. The
//! tag is the block key in hex (or, for keys over 100 bytes, `h` and a 128-bit
//! hash); braces make it the cluster hash tag, so blocks spread over all nodes
//! by key, and anything stored beside a block lands on its slot. Raw key bytes
//! never appear in a name.
//!
//! Value (integers little-endian):
//!
//! ```text
//! offset  size  field
//!      0     8  magic "KVTIERR\0"
//!      8     4  format version (2; 1 is still read)
//!     12     4  header length (56 + key length)
//!     16     8  namespace fingerprint
//!     24     8  payload length (the tier's block_bytes)
//!     32     4  key length (1..=128)
//!     36     4  flags (0)
//!     40     8  checksum of the payload: XXH3-64 (version 2), XXH64 (1)
//!     48     k  key
//!   48+k     8  xxh64 of bytes 0..48+k (the header itself)
//!   56+k     n  payload
//! ```

use crate::backend::checksum::{xxh64, PayloadSum};
use crate::key::MAX_KEY_LEN;
use std::io::Write;

const MAGIC: [u8; 8] = *b"KVTIERR\0";
/// The version written; [`PayloadSum::read`] says which ones are read.
const FORMAT_VERSION: u32 = PayloadSum::CURRENT_VERSION;
const FIXED: usize = 48;
/// Longest key kept readable (hex) in a key name.
const LONG_KEY: usize = 100;

/// The header length for a key of `key_len` bytes.
pub(super) fn header_len(key_len: usize) -> usize {
    FIXED + key_len + 8
}

/// The length of a block's key name.
pub(super) fn key_name_len(prefix_part: &str, key: &[u8]) -> usize {
    prefix_part.len()
        + 2
        + if key.len() <= LONG_KEY {
            2 * key.len()
        } else {
            33
        }
}

/// The Redis key name of a block.
pub(super) fn key_name(prefix_part: &str, key: &[u8]) -> String {
    let mut name = Vec::with_capacity(prefix_part.len() + 2 * key.len() + 3);
    write_key_name(&mut name, prefix_part, key);
    String::from_utf8(name).expect("prefix, hex digits and braces")
}

/// Appends a block's key name to `out` (the data path reuses one buffer for
/// every name, so naming a block allocates nothing).
pub(super) fn write_key_name(out: &mut Vec<u8>, prefix_part: &str, key: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.extend_from_slice(prefix_part.as_bytes());
    out.push(b'{');
    if key.len() <= LONG_KEY {
        for &b in key {
            out.extend_from_slice(&[HEX[(b >> 4) as usize], HEX[(b & 15) as usize]]);
        }
    } else {
        write!(out, "h{:016x}{:016x}", xxh64(key, 0), xxh64(key, 1)).expect("into memory");
    }
    out.push(b'}');
}

/// The key a name encodes, or None for hashed names (read the header) and
/// names of something else.
pub(super) fn key_from_name(prefix_part: &str, name: &[u8]) -> Option<Vec<u8>> {
    let tag = name.strip_prefix(prefix_part.as_bytes())?;
    let hex = tag.strip_prefix(b"{")?.strip_suffix(b"}")?;
    if hex.is_empty() || hex.len() % 2 != 0 {
        return None;
    }
    hex.chunks(2)
        .map(|pair| u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok())
        .collect()
}

/// Whether `name` is a hashed name of this prefix (`{h` and 32 hex digits):
/// a name whose key only its value's header tells.
pub(super) fn is_hashed_name(prefix_part: &str, name: &[u8]) -> bool {
    name.strip_prefix(prefix_part.as_bytes())
        .and_then(|tag| tag.strip_prefix(b"{h"))
        .and_then(|tag| tag.strip_suffix(b"}"))
        .is_some_and(|hex| hex.len() == 32 && hex.iter().all(u8::is_ascii_hexdigit))
}

/// Longest header (a key of MAX_KEY_LEN bytes).
pub(super) const MAX_HEADER: usize = FIXED + MAX_KEY_LEN + 8;

/// A value's header, encoded: `bytes[..len]`.
pub(super) struct EncodedHeader {
    pub bytes: [u8; MAX_HEADER],
    pub len: usize,
}

impl EncodedHeader {
    pub(super) fn as_slice(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

/// The header of a block's value (checksums the payload).
pub(super) fn encode_header(namespace_fp: u64, key: &[u8], payload: &[u8]) -> EncodedHeader {
    encode_header_with(namespace_fp, key, payload.len(), PayloadSum::of(payload))
}

/// The header of a value whose payload of `payload_len` bytes has `sum`, in
/// the format version of that checksum's kind (tests write version 1).
fn encode_header_with(
    namespace_fp: u64,
    key: &[u8],
    payload_len: usize,
    sum: PayloadSum,
) -> EncodedHeader {
    let version = match sum {
        PayloadSum::Xxh3(_) => FORMAT_VERSION,
        PayloadSum::Xxh64(_) => 1,
    };
    let mut header = [0u8; MAX_HEADER];
    let len = header_len(key.len());
    header[0..8].copy_from_slice(&MAGIC);
    header[8..12].copy_from_slice(&version.to_le_bytes());
    header[12..16].copy_from_slice(&(len as u32).to_le_bytes());
    header[16..24].copy_from_slice(&namespace_fp.to_le_bytes());
    header[24..32].copy_from_slice(&(payload_len as u64).to_le_bytes());
    header[32..36].copy_from_slice(&(key.len() as u32).to_le_bytes());
    header[40..48].copy_from_slice(&sum.value().to_le_bytes());
    header[FIXED..FIXED + key.len()].copy_from_slice(key);
    let sum = xxh64(&header[..FIXED + key.len()], 0);
    header[FIXED + key.len()..len].copy_from_slice(&sum.to_le_bytes());
    EncodedHeader { bytes: header, len }
}

/// Writes a block's value (header, then payload) to `out` (the tests'
/// values; the data path splices header and payload, `direct::set`).
#[cfg(test)]
pub(super) fn write_value(
    out: &mut impl Write,
    namespace_fp: u64,
    key: &[u8],
    payload: &[u8],
) -> std::io::Result<()> {
    out.write_all(encode_header(namespace_fp, key, payload).as_slice())?;
    out.write_all(payload)
}

/// The fields a stored value's header names.
#[derive(Debug)]
pub(super) struct Header<'a> {
    pub namespace_fp: u64,
    pub payload_len: u64,
    pub key: &'a [u8],
    pub payload_sum: PayloadSum,
    pub len: usize,
}

/// How a header error starts when the value is a kvtier block of a format
/// newer than this build reads: another version's block, a miss here, never
/// deleted. A later format keeps the magic, the version, the header length
/// (bytes 12..16) and the header's own xxh64 as its last 8 bytes where they
/// are, so a reader proves a header intact before it believes its version:
/// a damaged version byte is damage, not a newer block kept forever. A
/// sealed record's error starts with the same words (`crate::seal::NEWER`).
pub(super) const NEWER: &str = crate::seal::NEWER;

/// Parses a value's header; the error says what is wrong with it. The
/// header's checksum is checked before its version is believed.
pub(super) fn read_header(value: &[u8]) -> Result<Header<'_>, String> {
    if value.len() < FIXED + 9 {
        return Err(format!("value of {} bytes is too short", value.len()));
    }
    if value[0..8] != MAGIC {
        return Err("bad magic (not a kvtier block)".into());
    }
    let u32_at = |at: usize| u32::from_le_bytes(value[at..at + 4].try_into().expect("4"));
    let u64_at = |at: usize| u64::from_le_bytes(value[at..at + 8].try_into().expect("8"));
    let len = u32_at(12) as usize;
    if !(FIXED + 9..=value.len()).contains(&len) {
        return Err("damaged header lengths".into());
    }
    if u64_at(len - 8) != xxh64(&value[..len - 8], 0) {
        return Err("header checksum mismatch".into());
    }
    let Some(payload_sum) = PayloadSum::read(u32_at(8), u64_at(40)) else {
        let newer = if u32_at(8) > FORMAT_VERSION {
            NEWER
        } else {
            ""
        };
        return Err(format!(
            "{newer}format version {}, this build reads 1..={FORMAT_VERSION}",
            u32_at(8)
        ));
    };
    let key_len = u32_at(32) as usize;
    if key_len == 0 || key_len > MAX_KEY_LEN || len != header_len(key_len) {
        return Err("damaged header lengths".into());
    }
    Ok(Header {
        namespace_fp: u64_at(16),
        payload_len: u64_at(24),
        key: &value[FIXED..FIXED + key_len],
        payload_sum,
        len,
    })
}

/// What this tier expects of a stored value, checked against its first
/// bytes `head` (the whole header, when the value is long enough) and its
/// length: the payload's checksum from the header, or what is wrong.
pub(super) fn check_header(
    head: &[u8],
    value_len: usize,
    namespace_fp: u64,
    key: &[u8],
    block_bytes: usize,
) -> Result<PayloadSum, String> {
    let h = read_header(head)?;
    if h.namespace_fp != namespace_fp {
        return Err("block of another namespace".into());
    }
    // An extent store's payload is 1 to block_bytes long.
    if h.payload_len == 0
        || h.payload_len > block_bytes as u64
        || value_len != h.len + h.payload_len as usize
    {
        return Err(format!(
            "value of {value_len} bytes for a block of {block_bytes}"
        ));
    }
    if h.key != key {
        return Err("header names another key".into());
    }
    Ok(h.payload_sum)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_round_trip_and_detect_damage() {
        let payload: Vec<u8> = (0..4096u32).map(|i| i as u8).collect();
        let mut value = Vec::new();
        write_value(&mut value, 7, b"key", &payload).unwrap();
        let h = read_header(&value).unwrap();
        assert_eq!(
            (h.namespace_fp, h.payload_len, h.key),
            (7, 4096, &b"key"[..])
        );
        assert_eq!(&value[h.len..], &payload[..]);
        assert_eq!(h.payload_sum, PayloadSum::of(&payload));
        assert_eq!(value[8..12], FORMAT_VERSION.to_le_bytes());
        for at in [0, 9, 13, 20, 33, 50] {
            let mut bad = value.clone();
            bad[at] ^= 1;
            let h = read_header(&bad);
            assert!(h.is_err() || h.unwrap().namespace_fp != 7, "byte {at}");
        }
        assert!(read_header(&value[..20]).is_err());
    }

    #[test]
    fn version_1_values_are_still_read_with_their_xxh64_sums() {
        let payload: Vec<u8> = (0..4096u32).map(|i| (i * 3) as u8).collect();
        let sum = PayloadSum::Xxh64(xxh64(&payload, 0));
        let header = encode_header_with(7, b"key", payload.len(), sum);
        assert_eq!(header.as_slice()[8..12], 1u32.to_le_bytes());
        let mut value = header.as_slice().to_vec();
        value.extend_from_slice(&payload);
        let got = check_header(&value, value.len(), 7, b"key", 4096).unwrap();
        assert_eq!(got, sum);
        assert!(got.matches(&payload));
        // A version this build does not know is refused, by name.
        let mut future = value.clone();
        future[8..12].copy_from_slice(&3u32.to_le_bytes());
        let at = FIXED + 3;
        let head_sum = xxh64(&future[..at], 0);
        future[at..at + 8].copy_from_slice(&head_sum.to_le_bytes());
        let err = read_header(&future).unwrap_err();
        assert!(err.starts_with(NEWER) && err.contains("version 3"), "{err}");
        future[8..12].copy_from_slice(&0u32.to_le_bytes());
        assert!(!read_header(&future).unwrap_err().starts_with(NEWER));
    }

    /// A version byte is believed only in a header whose checksum holds: a
    /// higher version in a damaged header is damage (the tier may delete
    /// it), never a newer block it must keep forever.
    #[test]
    fn a_damaged_version_byte_is_damage_not_a_newer_format() {
        let mut value = Vec::new();
        write_value(&mut value, 7, b"key", &[9u8; 4096]).unwrap();
        for version in [3u32, 0x7f, 0x0100_0002] {
            let mut damaged = value.clone();
            damaged[8..12].copy_from_slice(&version.to_le_bytes());
            let err = read_header(&damaged).unwrap_err();
            assert_eq!(err, "header checksum mismatch", "version {version}");
        }
        // A newer format with a longer header is proved by the checksum at
        // the end of the length it declares.
        let mut newer = value[..FIXED + 3].to_vec();
        newer[8..12].copy_from_slice(&3u32.to_le_bytes());
        newer.extend_from_slice(&[5u8; 40]);
        let len = newer.len() + 8;
        newer[12..16].copy_from_slice(&(len as u32).to_le_bytes());
        let sum = xxh64(&newer, 0);
        newer.extend_from_slice(&sum.to_le_bytes());
        newer.extend_from_slice(&[1u8; 100]);
        let err = read_header(&newer).unwrap_err();
        assert!(err.starts_with(NEWER) && err.contains("version 3"), "{err}");
        // Its declared length past the bytes there proves nothing.
        assert!(!read_header(&newer[..len - 1])
            .unwrap_err()
            .starts_with(NEWER));
    }

    #[test]
    fn names_hash_tag_the_key_and_round_trip() {
        let name = key_name("kvtier:00ff:b4096:", b"\x01\xab");
        assert_eq!(name, "kvtier:00ff:b4096:{01ab}");
        assert_eq!(
            key_from_name("kvtier:00ff:b4096:", name.as_bytes()),
            Some(vec![1, 0xab])
        );
        let long = key_name("p:", &[7u8; 120]);
        assert!(long.starts_with("p:{h") && long.len() < 40);
        assert_eq!(key_from_name("p:", long.as_bytes()), None);
        assert!(is_hashed_name("p:", long.as_bytes()));
        assert!(!is_hashed_name("p:", b"p:{h0a}"));
        assert!(!is_hashed_name("q:", long.as_bytes()));
        assert!(!is_hashed_name("kvtier:00ff:b4096:", name.as_bytes()));
        assert_eq!(key_from_name("q:", name.as_bytes()), None);
    }
}
