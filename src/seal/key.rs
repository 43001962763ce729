//! The seal key: 32 bytes given as 64 hex digits, inline or in a file only
//! its owner can read. It never appears in a formatted string (its `Debug`
//! is redacted, no message quotes it) and is wiped when dropped.

use crate::error::{bail, Result};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// Bytes in a seal key.
pub const SEAL_KEY_LEN: usize = 32;

/// Where a key came from; `seal_key` and `seal_key_file` exclude each other.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum KeyOrigin {
    Inline,
    File,
}

/// A tenant's 256-bit seal key.
#[derive(Clone)]
pub struct SealKey {
    bytes: [u8; SEAL_KEY_LEN],
    pub(crate) origin: KeyOrigin,
}

/// Keys are equal by their bytes, wherever they came from.
impl PartialEq for SealKey {
    fn eq(&self, other: &SealKey) -> bool {
        self.bytes == other.bytes
    }
}

impl Eq for SealKey {}

impl std::fmt::Debug for SealKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SealKey(<redacted>)")
    }
}

impl Drop for SealKey {
    fn drop(&mut self) {
        wipe(&mut self.bytes);
    }
}

/// Overwrites `bytes` with zeros in a way the optimizer cannot drop (the
/// memory is about to be freed, so plain stores would be dead).
pub(crate) fn wipe(bytes: &mut [u8]) {
    for b in bytes.iter_mut() {
        // SAFETY: a valid, exclusively borrowed byte.
        unsafe { std::ptr::write_volatile(b, 0) };
    }
    std::sync::atomic::compiler_fence(std::sync::atomic::Ordering::SeqCst);
}

impl SealKey {
    /// A key from 64 hex digits (surrounding whitespace ignored). The error
    /// names the config key `what`, never the value.
    pub fn from_hex(what: &str, text: &str) -> Result<SealKey> {
        let digits = text.trim().as_bytes();
        if digits.len() != 2 * SEAL_KEY_LEN {
            bail!(
                Config,
                "{what}: a seal key is 64 hex digits (32 bytes); the value given is not"
            );
        }
        let mut key = SealKey {
            bytes: [0; SEAL_KEY_LEN],
            origin: KeyOrigin::Inline,
        };
        for (i, pair) in digits.chunks_exact(2).enumerate() {
            match (hex_digit(pair[0]), hex_digit(pair[1])) {
                (Some(hi), Some(lo)) => key.bytes[i] = hi << 4 | lo,
                // `key` is dropped (wiped) on the way out.
                _ => bail!(
                    Config,
                    "{what}: a seal key is 64 hex digits (32 bytes); the value given has other characters"
                ),
            }
        }
        Ok(key)
    }

    /// A key from a file holding 64 hex digits, which must be a regular file
    /// that neither group nor others can read or write.
    pub fn from_file(path: &Path) -> Result<SealKey> {
        let shown = path.display();
        let meta = match std::fs::metadata(path) {
            Ok(m) => m,
            Err(e) => bail!(Config, "seal_key_file: cannot use {shown}: {e}"),
        };
        if !meta.is_file() {
            bail!(Config, "seal_key_file: {shown} is not a regular file");
        }
        if meta.mode() & 0o077 != 0 {
            bail!(
                Config,
                "seal_key_file: {shown} is accessible to group or others (mode {:o}); \
                 allow its owner only (chmod 600)",
                meta.mode() & 0o777
            );
        }
        let mut text = match std::fs::read(path) {
            Ok(t) => t,
            Err(e) => bail!(Config, "seal_key_file: cannot read {shown}: {e}"),
        };
        let parsed = std::str::from_utf8(&text)
            .ok()
            .map(|t| SealKey::from_hex("seal_key_file", t));
        wipe(&mut text);
        match parsed {
            Some(key) => {
                let mut key = key?;
                key.origin = KeyOrigin::File;
                Ok(key)
            }
            None => bail!(
                Config,
                "seal_key_file: {shown} does not hold 64 hex digits (32 bytes)"
            ),
        }
    }

    pub(crate) fn bytes(&self) -> &[u8; SEAL_KEY_LEN] {
        &self.bytes
    }
}

fn hex_digit(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    const HEX: &str = "00112233445566778899aabbccddeeff00112233445566778899AABBCCDDEEFF";

    #[test]
    fn parses_64_hex_digits_and_refuses_the_rest_without_echoing() {
        let key = SealKey::from_hex("seal_key", HEX).unwrap();
        assert_eq!(key.bytes()[1], 0x11);
        assert_eq!(key.bytes()[31], 0xff);
        assert_eq!(format!("{key:?}"), "SealKey(<redacted>)");
        for bad in [&HEX[..62], "zz", &format!("{}g", &HEX[..63]), ""] {
            let err = SealKey::from_hex("seal_key", bad).unwrap_err();
            assert_eq!(err.kind(), crate::ErrorKind::Config);
            assert!(err.message().starts_with("seal_key: "), "{err}");
            if bad.len() > 8 {
                assert!(!err.message().contains(&bad[..8]), "{err}");
            }
        }
    }

    #[test]
    fn key_files_must_be_private() {
        let path = std::env::temp_dir().join(format!("kvtier-sealkey-{}", std::process::id()));
        std::fs::write(&path, format!("{HEX}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        let err = SealKey::from_file(&path).unwrap_err();
        assert!(err.message().contains("group or others"), "{err}");
        assert!(!err.message().contains(&HEX[..16]), "{err}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let key = SealKey::from_file(&path).unwrap();
        assert_eq!(key, SealKey::from_hex("x", HEX).unwrap());
        std::fs::write(&path, "not a key").unwrap();
        let err = SealKey::from_file(&path).unwrap_err();
        assert!(err.message().contains("64 hex digits"), "{err}");
        std::fs::remove_file(&path).unwrap();
    }
}
