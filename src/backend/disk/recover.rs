//! Reopening a directory: the blocks earlier runs left, oldest first, with
//! temporary debris and files proved bad deleted, and nothing deleted that
//! could not be read.

use super::format::{file_len, Header, HEADER_LEN};
use super::{io, layout, DiskBackend, SHARED_TMP_GRACE};
use crate::error::{bail, Result};
use std::path::Path;
use std::time::SystemTime;

/// A block found on disk when the tier opens.
pub(crate) struct Recovered {
    pub key: Vec<u8>,
    pub modified: SystemTime,
}

impl DiskBackend {
    /// Blocks on disk from earlier runs, oldest first, deleting temporary files
    /// (in shared mode only stale ones) and files of the wrong size.
    pub(crate) fn scan(&self) -> Result<Vec<Recovered>> {
        let mut found = Vec::new();
        let fans = match std::fs::read_dir(&self.ns_dir) {
            Ok(d) => d,
            Err(e) => bail!(Io, "cannot scan {}: {e}", self.ns_dir.display()),
        };
        let want_len = file_len(self.block_bytes) as u64;
        let now = SystemTime::now();
        for fan in fans.flatten() {
            if !fan.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            let Ok(files) = std::fs::read_dir(fan.path()) else {
                continue;
            };
            for file in files.flatten() {
                let name = file.file_name();
                let Some(name) = name.to_str() else { continue };
                let Ok(meta) = file.metadata() else { continue };
                let modified = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
                if name.ends_with(layout::TMP_EXT) {
                    let stale = now.duration_since(modified).unwrap_or_default() > SHARED_TMP_GRACE;
                    if !self.shared || stale {
                        let _ = std::fs::remove_file(file.path());
                    }
                    continue;
                }
                // Sealed and unsealed tiers leave each other's files alone.
                let own_ext = if self.seal.is_some() {
                    layout::SEALED_EXT
                } else {
                    layout::BLOCK_EXT
                };
                if !name.ends_with(own_ext) || !meta.is_file() {
                    continue;
                }
                if meta.len() != want_len {
                    let _ = std::fs::remove_file(file.path());
                    continue;
                }
                let mut sealed_nonce = None;
                let key = if let Some(seal) = &self.seal {
                    match self.read_sealed_header(seal, &file.path()) {
                        Ok(Ok(opened)) => {
                            sealed_nonce = Some(opened.nonce);
                            Some(opened.key().to_vec())
                        }
                        // Another tenant's block, perhaps: not ours to delete.
                        Ok(Err(_)) if self.shared => continue,
                        Ok(Err(_)) => None,
                        Err(_) => continue,
                    }
                } else if layout::is_hashed_name(name) {
                    match self.read_key(&file.path()) {
                        Ok(key) => key,
                        // Not read (descriptors, permissions, I/O): nothing is
                        // proved about the block, so it stays on disk,
                        // unindexed until an open that can read it.
                        Err(_) => continue,
                    }
                } else {
                    layout::key_from_name(name)
                };
                match key {
                    Some(key)
                        if !key.is_empty()
                            && key.len() <= crate::MAX_KEY_LEN
                            && self.path_of(&key) == file.path() =>
                    {
                        if let Some(nonce) = sealed_nonce {
                            self.ledger.record(&key, nonce);
                        }
                        found.push(Recovered { key, modified })
                    }
                    // Read and found misplaced or not a block header: no
                    // lookup would ever find it.
                    _ => {
                        let _ = std::fs::remove_file(file.path());
                    }
                }
            }
        }
        found.sort_by_key(|r| r.modified);
        Ok(found)
    }

    /// The key in a block file's header: `Ok(None)` when the header was read
    /// and is not one of this layout (proved bad), `Err` when it could not be
    /// read at all (which proves nothing).
    pub(super) fn read_key(&self, path: &Path) -> std::io::Result<Option<Vec<u8>>> {
        let fd = io::open_read(path, false)?;
        if !io::fstat(&fd)?.is_regular() {
            return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
        }
        let mut h = vec![0u8; HEADER_LEN];
        let n = io::read_at(&fd, &mut [&mut h], 0)?;
        Ok((n == HEADER_LEN)
            .then(|| Header::decode(&h).ok().map(|h| h.key))
            .flatten())
    }
}
