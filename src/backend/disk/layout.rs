//! Where a block's file lives, and the scan that finds them again.
//!
//! ```text
//! <path>/<namespace>-<fingerprint>-b<block_bytes>-v3/<fan>/<name>.kvb
//! ```
//!
//! `<fan>` is 2 hex digits of the xxh64 of the key: 256 directories, about
//! 39,000 files each at 10 million blocks, whatever the key distribution (a
//! two-level htree on ext4, as 2,400 files are). Fewer directories than
//! the 4096 of the layout before (`-v3` names this one) because each one a
//! cold load meets costs a directory and an inode-table read of its own
//! (measured with raw cold O_DIRECT loads; docs/runs/disk.md).
//! The older layout's directory (no `-v3`: 4096 fan-out directories, headers
//! in the files) is not read; `tier_describe` says when one is beside it.
//! `<name>` is the key in hex, or for keys longer than 100 bytes (whose hex would
//! approach the 255-byte name limit) `h` and a 128-bit hash; the header holds the
//! full key either way. Raw key bytes never become a path. Temporary files are
//! `<name>.kvb.<pid>-<n>.tmp` beside their final name.
//!
//! A sealed tier (`seal_key`) names a block `<tag>.kvs`, where `<tag>` is the
//! 128-bit keyed PRF of the key in hex and `<fan>` its first 2 hex digits:
//! neither says anything about the key to whoever lacks the seal key. The
//! other extension keeps sealed and unsealed tiers from ever taking each
//! other's files for their own (or for debris).

use crate::backend::checksum::xxh64;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

pub(crate) const LONG_KEY: usize = 100;
pub(crate) const BLOCK_EXT: &str = ".kvb";
pub(crate) const SEALED_EXT: &str = ".kvs";
pub(crate) const TMP_EXT: &str = ".tmp";
/// The file in a namespace directory that holds the namespace's name.
pub(crate) const IDENTITY_FILE: &str = ".namespace";

/// The namespace directory name: a readable part, a fingerprint, the block
/// size and the layout version.
pub(crate) fn namespace_dir(namespace: &str, block_bytes: usize) -> String {
    format!("{}-v3", legacy_namespace_dir(namespace, block_bytes))
}

/// The name the layout before `-v3` gave the namespace directory.
pub(crate) fn legacy_namespace_dir(namespace: &str, block_bytes: usize) -> String {
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

pub(crate) use crate::backend::checksum::namespace_fingerprint;

/// The reference forms [`block_path`] and [`sealed_block_path`] are tested against.
#[cfg(test)]
fn hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(2 * bytes.len());
    for b in bytes {
        s.push(HEX[(b >> 4) as usize] as char);
        s.push(HEX[(b & 15) as usize] as char);
    }
    s
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

/// Hex digits in a fan-out directory's name.
const FAN_DIGITS: usize = 2;
/// Number of fan-out directories.
pub(crate) const FAN_DIRS: usize = 1 << (4 * FAN_DIGITS);

/// The fan-out directory of a key, relative to the namespace directory.
#[cfg(test)]
pub(crate) fn fan_dir(key: &[u8]) -> String {
    fan_name(fan_of(key))
}

/// Which fan-out directory (0..FAN_DIRS) holds a key's block.
fn fan_of(key: &[u8]) -> usize {
    fan_of_hash(xxh64(key, 0))
}

/// [`fan_of`] from the key's XXH64 (seed 0), for callers that have it.
pub(crate) fn fan_of_hash(hash: u64) -> usize {
    (hash >> (64 - 4 * FAN_DIGITS)) as usize
}

/// Fan-out directory `i`'s name: [`FAN_DIGITS`] lowercase hex digits.
fn fan_digits(i: usize) -> [u8; FAN_DIGITS] {
    std::array::from_fn(|at| HEX[(i >> (4 * (FAN_DIGITS - 1 - at))) & 15])
}

/// The name of fan-out directory `i` (0..FAN_DIRS).
pub(crate) fn fan_name(i: usize) -> String {
    String::from_utf8(fan_digits(i).to_vec()).expect("hex digits")
}

/// The file name of a key's block.
#[cfg(test)]
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

/// [`key_from_name`] into `out` (no allocation): the key's length, or None.
/// Recovery decodes every file name it lists.
pub(crate) fn key_from_name_into(name: &str, out: &mut [u8; LONG_KEY]) -> Option<usize> {
    let stem = name.strip_suffix(BLOCK_EXT)?.as_bytes();
    if stem.is_empty() || stem.len() % 2 != 0 || stem.len() > 2 * LONG_KEY {
        return None;
    }
    let digit = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    for (byte, pair) in out.iter_mut().zip(stem.chunks_exact(2)) {
        *byte = digit(pair[0])? << 4 | digit(pair[1])?;
    }
    Some(stem.len() / 2)
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
    key.len() <= LONG_KEY
        && stem.len() == 2 * key.len()
        && stem
            .bytes()
            .zip(key.iter().flat_map(|b| [b >> 4, b & 15]))
            .all(|(c, d)| c == HEX[d as usize])
        && fan.as_bytes() == fan_digits(fan_of(key))
}

/// A block file's path under the namespace directory.
/// Every block I/O builds one, so it is one allocation: the same path as
/// `ns_dir.join(fan_dir(key)).join(file_name(key))`.
pub(crate) fn block_path(ns_dir: &Path, key: &[u8]) -> PathBuf {
    let mut p = PathBytes::new(ns_dir, FAN_DIGITS + 1 + 2 * LONG_KEY + BLOCK_EXT.len());
    p.fan(fan_of(key));
    if key.len() <= LONG_KEY {
        p.hex(key);
    } else {
        p.0.push(b'h');
        p.hex(&xxh64(key, 0).to_be_bytes());
        p.hex(&xxh64(key, 1).to_be_bytes());
    }
    p.0.extend_from_slice(BLOCK_EXT.as_bytes());
    p.finish()
}

/// A sealed block file's path under the namespace directory (one allocation,
/// as [`block_path`]): `<first 2 hex digits>/<hex tag>.kvs`.
pub(crate) fn sealed_block_path(ns_dir: &Path, tag: &crate::seal::NameTag) -> PathBuf {
    let mut p = PathBytes::new(ns_dir, FAN_DIGITS + 1 + 2 * tag.len() + SEALED_EXT.len());
    p.fan(tag[0] as usize);
    p.hex(tag);
    p.0.extend_from_slice(SEALED_EXT.as_bytes());
    p.finish()
}

/// The temporary file a store writes before renaming it to `path`:
/// `<path>.<pid>-<n>.tmp`, in one allocation.
pub(crate) fn tmp_path(path: &Path, pid: u32, n: u64) -> PathBuf {
    use std::io::Write;
    let path = path.as_os_str().as_bytes();
    let mut v = Vec::with_capacity(path.len() + 1 + 10 + 1 + 20 + TMP_EXT.len());
    v.extend_from_slice(path);
    let _ = write!(v, ".{pid}-{n}{TMP_EXT}");
    PathBuf::from(std::ffi::OsString::from_vec(v))
}

/// A path under a namespace directory, built in one buffer sized up front.
struct PathBytes(Vec<u8>);

impl PathBytes {
    fn new(dir: &Path, rest: usize) -> PathBytes {
        let dir = dir.as_os_str().as_bytes();
        let mut v = Vec::with_capacity(dir.len() + 1 + rest);
        v.extend_from_slice(dir);
        v.push(b'/');
        PathBytes(v)
    }

    /// Fan-out directory `i` (as [`fan_name`]) and a slash.
    fn fan(&mut self, i: usize) {
        self.0.extend(fan_digits(i));
        self.0.push(b'/');
    }

    fn hex(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0.push(HEX[(b >> 4) as usize]);
            self.0.push(HEX[(b & 15) as usize]);
        }
    }

    fn finish(self) -> PathBuf {
        PathBuf::from(std::ffi::OsString::from_vec(self.0))
    }
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
        // The allocation-free decoder agrees with the other on every name.
        let mut buf = [0u8; LONG_KEY];
        for name in [
            file_name(&key),
            file_name(&[7u8; LONG_KEY]),
            file_name(&[9u8; LONG_KEY + 1]),
            "zz.kvb".into(),
            "abc.kvb".into(),
            "00ff.tmp".into(),
            ".kvb".into(),
            "0g.kvb".into(),
            format!("{}.kvb", "ab".repeat(LONG_KEY + 1)),
        ] {
            let into = key_from_name_into(&name, &mut buf).map(|len| buf[..len].to_vec());
            let want = key_from_name(&name).filter(|k| k.len() <= LONG_KEY);
            assert_eq!(into, want, "{name}");
        }
    }

    #[test]
    fn paths_are_fan_dir_then_file_name() {
        let ns = Path::new("/data/ns-1");
        for key in [
            vec![0u8],
            (0..36).collect::<Vec<u8>>(),
            vec![0xff; LONG_KEY],
            vec![0xcd; LONG_KEY + 1],
            b"../../etc/passwd".to_vec(),
        ] {
            assert_eq!(
                block_path(ns, &key),
                ns.join(fan_dir(&key)).join(file_name(&key)),
                "{key:?}"
            );
        }
        assert_eq!(
            tmp_path(Path::new("/d/abc/00ff.kvb"), 42, 7),
            Path::new(&format!("/d/abc/00ff.kvb.42-7{TMP_EXT}"))
        );
        let tag: crate::seal::NameTag = std::array::from_fn(|i| (i * 37 + 11) as u8);
        let name = hex(&tag);
        assert_eq!(
            sealed_block_path(ns, &tag),
            ns.join(&name[..2]).join(format!("{name}{SEALED_EXT}"))
        );
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
            assert!(!is_hex_block_path("ff", name, &key) || fan == "ff");
            assert!(!is_hex_block_path(&format!("0{fan}"), name, &key));
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
        assert_eq!(dirs.len(), FAN_DIRS);
        assert!(dirs.iter().all(|d| d.len() == 2));
        assert_eq!(
            (fan_name(0), fan_name(171), fan_name(255)),
            ("00".into(), "ab".into(), "ff".into())
        );
    }

    #[test]
    fn namespace_dirs_separate_layouts() {
        let a = namespace_dir("llama/bf16", 2 << 20);
        assert!(a.starts_with("llama_bf16-") && a.ends_with("-b2097152-v3"));
        assert_eq!(
            a,
            format!("{}-v3", legacy_namespace_dir("llama/bf16", 2 << 20))
        );
        assert_ne!(a, namespace_dir("llama/bf16", 4096));
        assert_ne!(
            a,
            namespace_dir("llama_bf16", 2 << 20),
            "fingerprint tells them apart"
        );
        assert!(namespace_dir("", 1).starts_with("default-"));
    }
}
