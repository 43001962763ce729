//! What an operator's tool (`kvtier::admin`, the `kvtier` command) reads of
//! a Redis keyspace without opening a tier, through this backend's own name
//! and value code: what a key name under `key_prefix` is, and whether a
//! value is the block its name says, checked as every tier would check it.
//! The tool brings its own connections; nothing here speaks to a server.

use super::format::{self, read_header, NEWER};
use super::generation::SWEPT_GENERATIONS;
use crate::backend::checksum::generation_fingerprint;
use crate::backend::checksum::xxh64;
use crate::backend::SharedTenant;

/// What a key name under a `key_prefix` is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeyName {
    /// A block: `<prefix>:<fingerprint>:b<block bytes>:{<tag>}`.
    Block {
        /// The header fingerprint its value must carry: the namespace's (an
        /// owned tier's) or a tenant's generation's (a shared tier's).
        fp: u64,
        /// The size of its block.
        block_bytes: usize,
        /// What its braces hold.
        tag: BlockTag,
    },
    /// A tenant's clear generation:
    /// `<prefix>:<namespace fingerprint>:generation[-<tag>]:b<block bytes>`.
    Generation {
        /// The namespace's fingerprint.
        namespace_fp: u64,
        /// The number mixed into the tenant's fingerprints (0: unsealed).
        tenant: u64,
        /// A sealed tenant's (`generation-<tag>`).
        sealed: bool,
        /// The size of the blocks it counts for.
        block_bytes: usize,
    },
    /// Anything else under the prefix: no kvtier tier writes it.
    Other,
}

/// The braces of a block's name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BlockTag {
    /// The key in hex.
    Key(Vec<u8>),
    /// `h` and a 128-bit hash of a key longer than 100 bytes (its value's
    /// header holds the key): the key's XXH64 with seeds 0 and 1.
    Hashed(u64, u64),
    /// `s` and the keyed PRF of a sealed block's key.
    Sealed,
}

impl KeyName {
    /// Reads `name` as a name under `key_prefix` (without the colon).
    pub fn parse(key_prefix: &str, name: &[u8]) -> KeyName {
        Self::parse_known(key_prefix, name).unwrap_or(KeyName::Other)
    }

    fn parse_known(key_prefix: &str, name: &[u8]) -> Option<KeyName> {
        let rest = name
            .strip_prefix(key_prefix.as_bytes())?
            .strip_prefix(b":")?;
        let rest = std::str::from_utf8(rest).ok()?;
        let (fp, rest) = rest.split_at_checked(16)?;
        let fp = u64::from_str_radix(fp, 16).ok().filter(|_| is_hex(fp))?;
        let rest = rest.strip_prefix(':')?;
        if let Some(rest) = rest.strip_prefix("generation") {
            let (mark, bytes) = rest.rsplit_once(":b")?;
            let tenant = SharedTenant::from_mark(mark)?;
            return Some(KeyName::Generation {
                namespace_fp: fp,
                tenant: tenant.number,
                sealed: !mark.is_empty(),
                block_bytes: block_bytes(bytes)?,
            });
        }
        let (bytes, tag) = rest.strip_prefix('b')?.split_once(':')?;
        let block_bytes = block_bytes(bytes)?;
        let inner = tag.strip_prefix('{')?.strip_suffix('}')?;
        let tag = if let Some(hash) = inner.strip_prefix('h') {
            let half = |at: usize| u64::from_str_radix(hash.get(at..at + 16)?, 16).ok();
            (hash.len() == 32 && is_hex(hash)).then_some(BlockTag::Hashed(half(0)?, half(16)?))?
        } else if let Some(prf) = inner.strip_prefix('s') {
            (prf.len() == 32 && is_hex(prf)).then_some(BlockTag::Sealed)?
        } else {
            let prefix = &tag[..0];
            BlockTag::Key(format::key_from_name(prefix, tag.as_bytes())?)
        };
        Some(KeyName::Block {
            fp,
            block_bytes,
            tag,
        })
    }
}

fn is_hex(s: &str) -> bool {
    s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

fn block_bytes(digits: &str) -> Option<usize> {
    digits
        .bytes()
        .all(|b| b.is_ascii_digit())
        .then(|| digits.parse().ok())
        .flatten()
        .filter(|&b| b > 0)
}

/// The name of a tenant's generation key, as tiers name it (`mark`: "" for
/// the unsealed tiers, `-<tag in hex>` for a sealed tenant).
pub fn generation_name(
    key_prefix: &str,
    namespace_fp: u64,
    mark: &str,
    block_bytes: usize,
) -> String {
    format!("{key_prefix}:{namespace_fp:016x}:generation{mark}:b{block_bytes}")
}

/// The fingerprints a tenant's block names carry: in its current generation
/// (and, for the unsealed tenant, an owned tier's, the namespace's own), and
/// in the generations before it that a clear sweeps.
pub fn tenant_fingerprints(
    namespace_fp: u64,
    tenant: u64,
    generation: u64,
) -> (Vec<u64>, Vec<u64>) {
    let of = |g| generation_fingerprint(namespace_fp, tenant, g);
    let mut current = vec![of(generation)];
    if tenant == 0 {
        current.push(namespace_fp);
    }
    let stale = (generation.saturating_sub(SWEPT_GENERATIONS)..generation)
        .map(of)
        .collect();
    (current, stale)
}

/// The length of the value a block's name holds when it is that block, so
/// that sizes need no command that would count as a use of the key (STRLEN
/// does, for the server's LRU): header and payload, or a sealed record and
/// ciphertext. A hashed name's key is over 100 bytes: counted as the longest.
pub fn value_len(block_bytes: usize, tag: &BlockTag) -> u64 {
    let len = match tag {
        BlockTag::Key(key) => format::header_len(key.len()) + block_bytes,
        BlockTag::Hashed(..) => format::header_len(crate::key::MAX_KEY_LEN) + block_bytes,
        BlockTag::Sealed => super::sealed::value_len(block_bytes),
    };
    len as u64
}

/// A value checked against its unsealed block's name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ValueVerdict {
    /// The block its name says, in this format version.
    Good {
        /// 1: XXH64 payload checksum; 2: XXH3-64.
        version: u32,
    },
    /// Not the block its name says (header, length, key, checksum): what an
    /// unsealed tier reading it deletes.
    Damaged(String),
    /// A well-formed block whose header names another namespace or
    /// generation than its name: no tier reads or deletes it.
    Foreign(String),
    /// A block in a format newer than this build reads: left alone.
    Newer,
}

/// Checks `value`, read under an unsealed block's name whose parts are
/// `fp`, `block_bytes` and `tag` (a [`BlockTag::Key`] or a [`BlockTag::Hashed`]).
pub fn check_value(fp: u64, block_bytes: usize, tag: &BlockTag, value: &[u8]) -> ValueVerdict {
    let header = match read_header(value) {
        Ok(header) => header,
        Err(why) if why.starts_with(NEWER) => return ValueVerdict::Newer,
        Err(why) => return ValueVerdict::Damaged(why),
    };
    let version = match header.payload_sum {
        crate::checksum::PayloadSum::Xxh64(_) => 1,
        crate::checksum::PayloadSum::Xxh3(_) => 2,
    };
    let names_key = match *tag {
        BlockTag::Key(ref key) => header.key == &key[..],
        BlockTag::Hashed(a, b) => (xxh64(header.key, 0), xxh64(header.key, 1)) == (a, b),
        BlockTag::Sealed => return ValueVerdict::Damaged("a sealed name".into()),
    };
    if !names_key {
        return ValueVerdict::Damaged("header names another key".into());
    }
    // An extent store's payload is 1 to block_bytes long.
    if header.payload_len == 0
        || header.payload_len > block_bytes as u64
        || value.len() != header.len + header.payload_len as usize
    {
        return ValueVerdict::Damaged(format!(
            "value of {} bytes for a block of {block_bytes}",
            value.len()
        ));
    }
    if header.namespace_fp != fp {
        return ValueVerdict::Foreign(format!(
            "a block of another namespace or generation (fingerprint {:016x})",
            header.namespace_fp
        ));
    }
    if !header.payload_sum.matches(&value[header.len..]) {
        return ValueVerdict::Damaged("payload checksum mismatch".into());
    }
    ValueVerdict::Good { version }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::redis::format::write_value;

    #[test]
    fn names_read_back() {
        let block = format::key_name("kv:x:00000000000000ff:b4096:", &[1, 0xab]);
        assert_eq!(
            KeyName::parse("kv:x", block.as_bytes()),
            KeyName::Block {
                fp: 255,
                block_bytes: 4096,
                tag: BlockTag::Key(vec![1, 0xab])
            }
        );
        let long = format::key_name("kv:00000000000000ff:b4096:", &[7; 120]);
        assert!(matches!(
            KeyName::parse("kv", long.as_bytes()),
            KeyName::Block {
                tag: BlockTag::Hashed(..),
                ..
            }
        ));
        let generation = generation_name("kv", 9, "", 4096);
        assert_eq!(
            KeyName::parse("kv", generation.as_bytes()),
            KeyName::Generation {
                namespace_fp: 9,
                tenant: 0,
                sealed: false,
                block_bytes: 4096
            }
        );
        let sealed = generation_name("kv", 9, &format!("-{}", "01".repeat(16)), 64);
        assert!(matches!(
            KeyName::parse("kv", sealed.as_bytes()),
            KeyName::Generation { sealed: true, tenant, .. } if tenant == 0x0101_0101_0101_0101
        ));
        for other in [
            "kv:zz",
            "kv:00000000000000ff:b0:{00}",
            "kw:00000000000000ff:b1:{00}",
        ] {
            assert_eq!(
                KeyName::parse("kv", other.as_bytes()),
                KeyName::Other,
                "{other}"
            );
        }
    }

    #[test]
    fn values_are_checked_as_tiers_check_them() {
        let payload = vec![5u8; 4096];
        let mut value = Vec::new();
        write_value(&mut value, 7, b"key", &payload).unwrap();
        let tag = BlockTag::Key(b"key".to_vec());
        assert_eq!(
            check_value(7, 4096, &tag, &value),
            ValueVerdict::Good { version: 2 }
        );
        assert!(matches!(
            check_value(8, 4096, &tag, &value),
            ValueVerdict::Foreign(_)
        ));
        assert_eq!(value_len(4096, &tag), value.len() as u64);
        let other = BlockTag::Key(b"kez".to_vec());
        assert!(matches!(
            check_value(7, 4096, &other, &value),
            ValueVerdict::Damaged(_)
        ));
        let mut flipped = value.clone();
        *flipped.last_mut().unwrap() ^= 1;
        assert!(matches!(
            check_value(7, 4096, &tag, &flipped),
            ValueVerdict::Damaged(_)
        ));
        assert!(matches!(
            check_value(7, 4096, &tag, &value[..value.len() - 1]),
            ValueVerdict::Damaged(_)
        ));
    }
}
