//! Where a block's file lives, and the scan that finds them again.
//!
//! ```text
//! <path>/<namespace>-<fingerprint>-b<block_bytes>/<fan>/<name>.kvb
//! ```
//!
//! `<fan>` is 3 hex digits of the xxh64 of the key (4096 directories: at 10
//! million blocks about 2,400 files each, whatever the key distribution).
//! `<name>` is the key in hex, or for keys longer than 100 bytes (whose hex would
//! approach the 255-byte name limit) `h` and a 128-bit hash; the header holds the
//! full key either way. Raw key bytes never become a path. Temporary files are
//! `<name>.kvb.<pid>-<n>.tmp` beside their final name.
//!
//! A sealed tier (`seal_key`) names a block `<tag>.kvs`, where `<tag>` is the
//! 128-bit keyed PRF of the key in hex and `<fan>` its first 3 hex digits:
//! neither says anything about the key to whoever lacks the seal key. The
//! other extension keeps sealed and unsealed tiers from ever taking each
//! other's files for their own (or for debris).

use crate::backend::xxh64::xxh64;
use std::path::{Path, PathBuf};

const LONG_KEY: usize = 100;
pub(crate) const BLOCK_EXT: &str = ".kvb";
pub(crate) const SEALED_EXT: &str = ".kvs";
pub(crate) const TMP_EXT: &str = ".tmp";

/// The namespace directory name: a readable part and a fingerprint.
pub(crate) fn namespace_dir(namespace: &str, block_bytes: usize) -> String {
    let readable: String = namespace
        .chars()
        .take(40)
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    let readable = if readable.is_empty() {
        "default".to_string()
    } else {
        readable
    };
    format!(
        "{readable}-{:016x}-b{block_bytes}",
        namespace_fingerprint(namespace)
    )
}

pub(crate) use crate::backend::xxh64::namespace_fingerprint;

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 || s.is_empty() {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// Number of fan-out directories.
pub(crate) const FAN_DIRS: usize = 4096;

/// The fan-out directory of a key, relative to the namespace directory.
pub(crate) fn fan_dir(key: &[u8]) -> String {
    fan_name((xxh64(key, 0) >> 52) as usize)
}

/// The name of fan-out directory `i` (0..FAN_DIRS).
pub(crate) fn fan_name(i: usize) -> String {
    format!("{i:03x}")
}

/// The file name of a key's block.
pub(crate) fn file_name(key: &[u8]) -> String {
    if key.len() <= LONG_KEY {
        format!("{}{BLOCK_EXT}", hex(key))
    } else {
        format!("h{:016x}{:016x}{BLOCK_EXT}", xxh64(key, 0), xxh64(key, 1))
    }
}

/// The key a block file name encodes, or None for hashed names (read the
/// header) and names that are not block files.
pub(crate) fn key_from_name(name: &str) -> Option<Vec<u8>> {
    unhex(name.strip_suffix(BLOCK_EXT)?)
}

pub(crate) fn is_hashed_name(name: &str) -> bool {
    name.starts_with('h') && name.ends_with(BLOCK_EXT)
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// Whether `<fan>/<name>` is where [`block_path`] puts `key`'s block, for a
/// key with a hex name; the same answer as comparing with `block_path` but
/// without formatting a path, since recovery asks it of every file.
pub(crate) fn is_hex_block_path(fan: &str, name: &str, key: &[u8]) -> bool {
    let Some(stem) = name.strip_suffix(BLOCK_EXT) else {
        return false;
    };
    let fan_index = (xxh64(key, 0) >> 52) as usize;
    let fan_digits = [fan_index >> 8, (fan_index >> 4) & 15, fan_index & 15].map(|d| HEX[d]);
    key.len() <= LONG_KEY
        && stem.len() == 2 * key.len()
        && stem
            .bytes()
            .zip(key.iter().flat_map(|b| [b >> 4, b & 15]))
            .all(|(c, d)| c == HEX[d as usize])
        && fan.as_bytes() == fan_digits
}

/// A block file's path under the namespace directory.
pub(crate) fn block_path(ns_dir: &Path, key: &[u8]) -> PathBuf {
    let mut p = ns_dir.join(fan_dir(key));
    p.push(file_name(key));
    p
}

/// A sealed block file's path under the namespace directory.
pub(crate) fn sealed_block_path(ns_dir: &Path, tag: &crate::seal::NameTag) -> PathBuf {
    let name = hex(tag);
    let mut p = ns_dir.join(&name[..3]);
    p.push(format!("{name}{SEALED_EXT}"));
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_stay_short() {
        let key: Vec<u8> = (0..36).collect();
        let name = file_name(&key);
        assert_eq!(key_from_name(&name), Some(key.clone()));
        assert!(!is_hashed_name(&name));
        let long = vec![0xabu8; 128];
        let name = file_name(&long);
        assert!(is_hashed_name(&name) && name.len() < 64);
        assert_eq!(key_from_name("zz.kvb"), None);
        assert_eq!(key_from_name("abc.kvb"), None);
        assert_eq!(key_from_name("00ff.tmp"), None);
        // Slashes and dots in a key never reach the path.
        let evil = b"../../etc/passwd".to_vec();
        assert!(!file_name(&evil).contains('/'));
    }

    #[test]
    fn hex_block_path_agrees_with_block_path() {
        let ns = Path::new("/ns");
        for key in [
            vec![0u8],
            (0..36).collect::<Vec<u8>>(),
            vec![0xab; LONG_KEY],
            vec![0xcd; LONG_KEY + 1],
            b"key".to_vec(),
        ] {
            let path = block_path(ns, &key);
            let fan = path
                .parent()
                .unwrap()
                .file_name()
                .unwrap()
                .to_str()
                .unwrap();
            let name = path.file_name().unwrap().to_str().unwrap();
            assert_eq!(is_hex_block_path(fan, name, &key), key.len() <= LONG_KEY);
            // Another fan-out directory, case or extension is not the place.
            assert!(!is_hex_block_path("fff", name, &key) || fan == "fff");
            assert!(!is_hex_block_path(fan, &name.to_uppercase(), &key));
            assert!(
                !is_hex_block_path(&fan.to_uppercase(), name, &key)
                    || !fan.bytes().any(|c| c.is_ascii_alphabetic())
            );
            assert!(!is_hex_block_path(fan, &format!("{name}.tmp"), &key));
        }
        // Uppercase hex decodes to the key but is not where its block lives.
        let key = key_from_name("ABCD.kvb").unwrap();
        assert!(!is_hex_block_path(&fan_dir(&key), "ABCD.kvb", &key));
        assert!(is_hex_block_path(&fan_dir(&key), "abcd.kvb", &key));
    }

    #[test]
    fn fan_out_spreads_sequential_keys() {
        let mut dirs = std::collections::HashSet::new();
        for i in 0u64..20_000 {
            dirs.insert(fan_dir(&i.to_le_bytes()));
        }
        assert!(dirs.len() > 3900, "{}", dirs.len());
    }

    #[test]
    fn namespace_dirs_separate_layouts() {
        let a = namespace_dir("llama/bf16", 2 << 20);
        assert!(a.starts_with("llama_bf16-") && a.ends_with("-b2097152"));
        assert_ne!(a, namespace_dir("llama/bf16", 4096));
        assert_ne!(
            a,
            namespace_dir("llama_bf16", 2 << 20),
            "fingerprint tells them apart"
        );
        assert!(namespace_dir("", 1).starts_with("default-"));
    }
}
