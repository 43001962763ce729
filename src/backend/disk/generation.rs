//! A shared directory's clear generation: the file `generation` in the
//! namespace directory (a sealed tenant's: `generation-<tag>`) holds it as
//! a decimal number, which every tier of the namespace (and tenant) reads
//! (see `Probes` in `backend::capabilities`). A block file's header
//! (sealed: its record and name) carries the fingerprint of the generation
//! it was stored in, so a block stored before a clear fails the header
//! check of every tier that knows the generation after it.

use super::format::{AttrHeader, Form, Header, ATTR_LEN, ATTR_NAME, HEADER_LEN};
use super::{io, layout, DiskBackend};
use crate::backend::checksum::generation_fingerprint;
use crate::error::{Error, ErrorKind, Result};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::{Instant, SystemTime};

pub(super) const GENERATION_FILE: &str = "generation";

/// Longest text a generation file may hold: a u64 in decimal and a newline.
const MAX_GENERATION_TEXT: usize = 21;

/// Older generations a sweep looks for: each clear sweeps the ones before
/// it, so older ones hold only what a clear could not reach in its time.
pub(super) const SWEPT_GENERATIONS: u64 = 16;

impl DiskBackend {
    /// The fingerprint this tier's block headers (and sealed names) carry.
    pub(super) fn block_fp(&self) -> u64 {
        self.generation_fp.load(Ordering::Acquire)
    }

    /// Whether `fp` is the block fingerprint of a later generation of this
    /// shared tier's namespace (Some(true)) or an earlier one (Some(false))
    /// within [`SWEPT_GENERATIONS`] of this tier's; None otherwise (and
    /// always for a tier that does not share its directory).
    pub(super) fn other_generation(&self, fp: u64) -> Option<bool> {
        if !self.shared {
            return None;
        }
        let current = self.current_generation();
        let is_of = |g: u64| self.fingerprint_of(g) == fp;
        if (current.saturating_add(1)..=current.saturating_add(SWEPT_GENERATIONS)).any(is_of) {
            Some(true)
        } else if (current.saturating_sub(SWEPT_GENERATIONS)..current).any(is_of) {
            Some(false)
        } else {
            None
        }
    }

    fn generation_path(&self) -> PathBuf {
        self.ns_dir
            .join(format!("{GENERATION_FILE}{}", self.tenant.mark))
    }

    fn fingerprint_of(&self, generation: u64) -> u64 {
        generation_fingerprint(self.ns_fp, self.tenant.number, generation)
    }

    pub(super) fn current_generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    pub(super) fn set_generation(&self, generation: u64) {
        // The fingerprint first: a reader that sees the new generation never
        // checks a header against the old one's.
        self.generation_fp
            .store(self.fingerprint_of(generation), Ordering::Release);
        self.generation.store(generation, Ordering::Release);
    }

    /// The generation the file holds; 0 when there is none yet.
    pub(super) fn read_generation_file(&self) -> Result<u64> {
        let path = self.generation_path();
        let text = match io::read_regular(&path) {
            Ok(text) => text,
            Err(e) if io::is_missing(&e) => return Ok(0),
            Err(e) => return Err(super::io_error("reading", &path, e)),
        };
        parse_generation(&text).ok_or_else(|| {
            Error::new(
                ErrorKind::Corrupt,
                format!(
                    "{}: not a generation number (the next clear() rewrites it)",
                    path.display()
                ),
            )
        })
    }

    /// Raises the file's generation past its value and this tier's. Two
    /// tiers clearing at once may both write the same number: each clear
    /// still leaves every block stored before it behind the new generation.
    pub(super) fn advance_generation_file(&self) -> Result<u64> {
        let on_disk = self.read_generation_file().unwrap_or(0);
        let next = on_disk.max(self.current_generation()) + 1;
        let path = self.generation_path();
        write_generation(&self.ns_dir, &self.tenant.mark, next)
            .map_err(|e| super::io_error("writing", &path, e))?;
        self.set_generation(next);
        Ok(next)
    }

    /// Deletes this tenant's block files of generations before
    /// `generation` written before `since` (later ones are the new
    /// generation's), until `deadline`; how many. Unsealed files are all
    /// the unsealed tiers'; a sealed one is this tenant's if its record
    /// opens under one of the older generations' fingerprints.
    pub(super) fn sweep_blocks(
        &self,
        generation: u64,
        since: SystemTime,
        deadline: Instant,
    ) -> Result<u64> {
        let older: Vec<u64> = (generation.saturating_sub(SWEPT_GENERATIONS)..generation)
            .map(|g| self.fingerprint_of(g))
            .collect();
        let ext = match self.seal {
            Some(_) => layout::SEALED_EXT,
            None => layout::BLOCK_EXT,
        };
        let fans = std::fs::read_dir(&self.ns_dir)
            .map_err(|e| super::io_error("listing", &self.ns_dir, e))?;
        let mut removed = 0;
        for fan in fans.flatten() {
            if !is_fan_dir(&fan.path()) {
                continue;
            }
            let Ok(files) = std::fs::read_dir(fan.path()) else {
                continue;
            };
            for file in files.flatten() {
                if Instant::now() >= deadline {
                    return Ok(removed);
                }
                if !file.file_name().to_string_lossy().ends_with(ext) {
                    continue;
                }
                let path = file.path();
                let old = file.metadata().is_ok_and(|m| {
                    m.is_file() && m.modified().is_ok_and(|written| written < since)
                });
                if old && self.sealed_in(&path, &older) && std::fs::remove_file(&path).is_ok() {
                    removed += 1;
                    self.changed(&path);
                }
            }
        }
        Ok(removed)
    }

    /// Whether `path` holds a complete unsealed block whose header carries
    /// this tier's generation: a shared tier's probe, so that a block stored
    /// before a clear (or of another namespace under a colliding name) is a
    /// MISS, never a HIT whose load then fails. A header attribute costs one
    /// getxattr; an in-file header one read of its 4 KiB.
    pub(super) fn unsealed_present(&self, path: &Path) -> bool {
        let Ok(fd) = io::open_read(path, false) else {
            return false;
        };
        let Ok(id) = io::fstat(&fd) else {
            return false;
        };
        if !id.is_regular() {
            return false;
        }
        let fp = match Form::of_len(id.len, self.block_bytes) {
            Some(Form::Attr) => {
                let mut value = [0u8; ATTR_LEN + 1];
                match io::get_attr(&fd, ATTR_NAME, &mut value) {
                    Ok(n) => AttrHeader::decode(&value[..n]).map(|h| h.namespace_fp),
                    Err(e) => Err(e.to_string()),
                }
            }
            Some(Form::InFile) => {
                let mut header = vec![0u8; HEADER_LEN];
                match io::read_at(&fd, &mut [&mut header], 0) {
                    Ok(_) => Header::decode(&header).map(|h| h.namespace_fp),
                    Err(e) => Err(e.to_string()),
                }
            }
            None => return false,
        };
        fp == Ok(self.block_fp())
    }

    /// Whether a sealed file's record opens under one of `fingerprints`
    /// (always true for an unsealed tier, whose files are all its kind's).
    fn sealed_in(&self, path: &Path, fingerprints: &[u64]) -> bool {
        let Some(seal) = &self.seal else {
            return true;
        };
        let mut header = vec![0u8; HEADER_LEN];
        let read = std::fs::File::open(path)
            .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut header));
        read.is_ok()
            && fingerprints
                .iter()
                .any(|&fp| seal.open_record(fp, self.block_bytes, &header).is_ok())
    }
}

/// Writes `generation` into the generation file of the tenant `mark` in
/// `ns_dir` (a temporary file renamed into place: a reader sees the old
/// number or the new one, never part of one).
pub(super) fn write_generation(ns_dir: &Path, mark: &str, generation: u64) -> std::io::Result<()> {
    let path = ns_dir.join(format!("{GENERATION_FILE}{mark}"));
    let tmp = ns_dir.join(format!(
        "{GENERATION_FILE}{mark}.{}{}",
        std::process::id(),
        layout::TMP_EXT
    ));
    let written =
        std::fs::write(&tmp, format!("{generation}\n")).and_then(|()| std::fs::rename(&tmp, &path));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

fn is_fan_dir(path: &Path) -> bool {
    path.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.len() == 2 && n.bytes().all(|b| b.is_ascii_hexdigit()))
        && path.is_dir()
}

pub(super) fn parse_generation(text: &[u8]) -> Option<u64> {
    if text.len() > MAX_GENERATION_TEXT {
        return None;
    }
    std::str::from_utf8(text).ok()?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::parse_generation;

    #[test]
    fn a_generation_file_is_a_decimal_number_or_nothing() {
        assert_eq!(parse_generation(b"7\n"), Some(7));
        assert_eq!(parse_generation(b"18446744073709551615\n"), Some(u64::MAX));
        assert_eq!(parse_generation(b""), None);
        assert_eq!(parse_generation(b"-1"), None);
        assert_eq!(parse_generation(b"x"), None);
        assert_eq!(parse_generation(&[b'1'; 40]), None);
    }
}
