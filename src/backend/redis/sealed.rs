//! Sealed Redis values (`seal_key`): the sealed record (`crate::seal`), then
//! the ciphertext; the key name's hash tag is `{s<PRF of the key>}`, which
//! an unsealed tier never takes for one of its own (it reads as a hashed
//! name whose value header is not its format) and which tells nobody without
//! the seal key anything about the block key.

use crate::seal::{NameTag, Nonce, NonceLedger, Sealer, Seen, RECORD_LEN};

/// A sealed tier's keys and what it knows of its blocks' versions.
#[derive(Clone, Copy)]
pub(super) struct SealedLayout<'a> {
    pub sealer: &'a Sealer,
    pub ledger: &'a NonceLedger,
}

/// Hex digits of a sealed name's tag, after its `s`.
const TAG_HEX: usize = 2 * crate::seal::NAME_TAG_LEN;

/// The length of a sealed key name.
pub(super) fn name_len(prefix_part: &str) -> usize {
    prefix_part.len() + 3 + TAG_HEX
}

/// Appends the sealed key name of a block whose PRF is `tag`.
pub(super) fn write_name(out: &mut Vec<u8>, prefix_part: &str, tag: &NameTag) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.extend_from_slice(prefix_part.as_bytes());
    out.extend_from_slice(b"{s");
    for &b in tag {
        out.extend_from_slice(&[HEX[(b >> 4) as usize], HEX[(b & 15) as usize]]);
    }
    out.push(b'}');
}

/// Whether a key name is a sealed one.
pub(super) fn is_sealed_name(prefix_part: &str, name: &[u8]) -> bool {
    name.strip_prefix(prefix_part.as_bytes())
        .is_some_and(|tag| tag.starts_with(b"{s") && tag.len() == TAG_HEX + 3)
}

/// The length of a sealed value for a block of `block_bytes`.
pub(super) fn value_len(block_bytes: usize) -> usize {
    RECORD_LEN + block_bytes
}

impl SealedLayout<'_> {
    /// Seals `block` into `out` (exactly `value_len` bytes): record, then
    /// ciphertext.
    pub(super) fn seal_into(
        &self,
        namespace_fp: u64,
        key: &[u8],
        block: &[u8],
        out: &mut [u8],
    ) -> crate::error::Result<Nonce> {
        let (record, payload) = out.split_at_mut(RECORD_LEN);
        payload.copy_from_slice(block);
        self.sealer.seal(namespace_fp, key, payload, record)
    }

    /// Checks `record` as `key`'s current block and decrypts `payload` in
    /// place; on failure, what is wrong (and `payload` holds anything).
    pub(super) fn unseal(
        &self,
        namespace_fp: u64,
        block_bytes: usize,
        key: &[u8],
        record: &[u8],
        payload: &mut [u8],
    ) -> Result<(), String> {
        let opened = self.sealer.open_record(namespace_fp, block_bytes, record)?;
        if opened.key() != key {
            return Err("sealed block of another key under this name".into());
        }
        if self.ledger.check(key, opened.nonce) == Seen::Replaced {
            return Err("an older or other version than this tier last wrote or saw".into());
        }
        self.sealer.open_payload(record, &opened, payload)
    }

    /// The key and nonce a sealed value's record holds, if it opens under
    /// this tier's key.
    pub(super) fn open_key(
        &self,
        namespace_fp: u64,
        block_bytes: usize,
        record: &[u8],
    ) -> Option<(Vec<u8>, Nonce)> {
        let opened = self
            .sealer
            .open_record(namespace_fp, block_bytes, record)
            .ok()?;
        Some((opened.key().to_vec(), opened.nonce))
    }
}
