//! The sealed record: the header of a sealed block, the same on disk (the
//! start of the 4096-byte file header) and in Redis (the start of the value).
//! All integers little-endian.
//!
//! ```text
//! offset  size  field
//!      0     8  magic "KVTIERS\0"
//!      8     4  format version (1)
//!     12     4  record length (205)
//!     16     8  namespace fingerprint
//!     24     8  payload length (the tier's block_bytes)
//!     32    12  nonce (random, fresh for every write)
//!     44    16  payload tag
//!     60   129  key field, encrypted: key length (1 byte), key zero-padded to 128
//!    189    16  key field tag
//! ```
//!
//! Bytes 0..44 are the *binding*: the additional data of both seals. The
//! payload's additional data is the binding followed by the key length and
//! the key, so a sealed payload opens only under its own key, size,
//! namespace, format version and nonce. The key itself is stored only
//! encrypted (a restart recovers it from the key field, under a subkey of its
//! own); the payload tag replaces the unsealed formats' checksum.
//!
//! A later format keeps the magic, the version, the nonce and the key field
//! with its tag where they are, the key field sealed as now (under the
//! key-field subkey, the record's first 44 bytes as its additional data): a
//! record with this magic and a higher version whose key field opens under
//! the tenant's key is another version's block, which a reader treats as a
//! miss and never deletes (`Sealer::newer_problem`, [`NEWER`]). One whose key
//! field does not open is damage (a flipped version byte), judged as any.

use crate::key::MAX_KEY_LEN;

pub(crate) const MAGIC: [u8; 8] = *b"KVTIERS\0";
pub(crate) const FORMAT_VERSION: u32 = 1;
pub(crate) const NONCE_LEN: usize = 12;
pub(crate) const TAG_LEN: usize = 16;
pub(crate) const BINDING_LEN: usize = 44;
pub(crate) const PAYLOAD_TAG_AT: usize = BINDING_LEN;
pub(crate) const KEY_FIELD_AT: usize = PAYLOAD_TAG_AT + TAG_LEN;
pub(crate) const KEY_FIELD_LEN: usize = 1 + MAX_KEY_LEN;
pub(crate) const KEY_TAG_AT: usize = KEY_FIELD_AT + KEY_FIELD_LEN;
/// Bytes in a sealed record.
pub(crate) const RECORD_LEN: usize = KEY_TAG_AT + TAG_LEN;
/// The payload's additional data: the binding, the key length, the key.
pub(crate) const MAX_PAYLOAD_AAD: usize = BINDING_LEN + 1 + MAX_KEY_LEN;

pub(crate) type Nonce = [u8; NONCE_LEN];

/// How a sealed record's error starts when the record is a sealed kvtier
/// block in a format newer than this build reads, proved so by its key
/// field: another version's block, a miss here, never deleted. The same
/// words as the unsealed Redis format's marker, so that one check finds
/// both.
pub(crate) const NEWER: &str = "a newer format: ";

/// The version `record` claims if it starts as a sealed kvtier record of a
/// newer format than this build reads (this magic, a higher version): a
/// claim only, until its key field opens (`Sealer::newer_problem`).
pub(crate) fn claims_newer(record: &[u8]) -> Option<u32> {
    let version = u32::from_le_bytes(record.get(8..12)?.try_into().expect("4 bytes"));
    (record[0..8] == MAGIC && version > FORMAT_VERSION).then_some(version)
}

/// Writes the binding of a new record into `record[..BINDING_LEN]`.
pub(crate) fn write_binding(
    record: &mut [u8],
    namespace_fp: u64,
    block_bytes: usize,
    nonce: &Nonce,
) {
    record[0..8].copy_from_slice(&MAGIC);
    record[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    record[12..16].copy_from_slice(&(RECORD_LEN as u32).to_le_bytes());
    record[16..24].copy_from_slice(&namespace_fp.to_le_bytes());
    record[24..32].copy_from_slice(&(block_bytes as u64).to_le_bytes());
    record[32..44].copy_from_slice(nonce);
}

/// Checks a record's plain fields against what this tier writes; the error
/// says what differs (never a secret: these fields are public).
pub(crate) fn check_binding(
    record: &[u8],
    namespace_fp: u64,
    block_bytes: usize,
) -> Result<Nonce, String> {
    if record.len() < RECORD_LEN {
        return Err(format!(
            "sealed record of {} bytes, expected {RECORD_LEN}",
            record.len()
        ));
    }
    if record[0..8] != MAGIC {
        return Err("bad magic (not a sealed kvtier block)".into());
    }
    let u32_at = |at: usize| u32::from_le_bytes(record[at..at + 4].try_into().expect("4 bytes"));
    let u64_at = |at: usize| u64::from_le_bytes(record[at..at + 8].try_into().expect("8 bytes"));
    if u32_at(8) != FORMAT_VERSION {
        return Err(format!(
            "sealed format version {}, this build reads {FORMAT_VERSION}",
            u32_at(8)
        ));
    }
    if u32_at(12) as usize != RECORD_LEN {
        return Err(format!(
            "sealed record length {}, expected {RECORD_LEN}",
            u32_at(12)
        ));
    }
    if u64_at(16) != namespace_fp {
        return Err("block of another namespace".into());
    }
    if u64_at(24) != block_bytes as u64 {
        return Err(format!(
            "block of {} bytes, expected {block_bytes}",
            u64_at(24)
        ));
    }
    Ok(record[32..44].try_into().expect("12 bytes"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_higher_version_is_only_a_claim_of_a_newer_format() {
        let mut record = vec![0u8; RECORD_LEN];
        write_binding(&mut record, 7, 4096, &[3; NONCE_LEN]);
        assert_eq!(claims_newer(&record), None);
        assert_eq!(check_binding(&record, 7, 4096), Ok([3; NONCE_LEN]));
        record[8..12].copy_from_slice(&(FORMAT_VERSION + 1).to_le_bytes());
        assert_eq!(claims_newer(&record), Some(2));
        assert_eq!(claims_newer(&record[..12]), Some(2));
        // The binding's check alone never calls it newer: only an opened
        // key field proves that (sealer.rs).
        for r in [&record[..], &record[..12]] {
            let err = check_binding(r, 7, 4096).unwrap_err();
            assert!(!err.starts_with(NEWER), "{err}");
        }
        // A lower version, or another magic, claims nothing.
        let mut older = record.clone();
        older[8..12].copy_from_slice(&0u32.to_le_bytes());
        let mut foreign = record.clone();
        foreign[0] ^= 1;
        for bad in [&older, &foreign] {
            assert_eq!(claims_newer(bad), None);
            assert!(!check_binding(bad, 7, 4096).unwrap_err().starts_with(NEWER));
        }
        assert_eq!(claims_newer(&record[..11]), None);
    }
}
