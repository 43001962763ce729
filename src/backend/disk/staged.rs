//! Loads of blocks larger than a piece without a deadline: through a
//! per-thread huge-page staging piece where the row cannot take O_DIRECT,
//! straight into the row (`read.rs`'s verified read) where it can.

use super::format::{padded, Form};
use super::{DiskBackend, PIECE, STAGE_PIECE};
use crate::aligned::AlignedBuf;
use crate::backend::LoadJob;
use crate::checksum_copy::copy_checked;
use crate::error::{Error, ErrorKind, Result};
use std::cell::RefCell;
use std::path::Path;

thread_local! {
    /// Per-worker staging piece for loads of blocks larger than one piece
    /// (see [`DiskBackend::stages_blocks`]); apart from the scratch, which the
    /// streamed read uses for an in-file header meanwhile.
    static STAGE: RefCell<Option<AlignedBuf>> = const { RefCell::new(None) };
}

/// A load without a deadline, whose row is written straight, piece by piece.
struct IntoRow<'a>(RefCell<&'a mut [u8]>);

impl LoadJob for IntoRow<'_> {
    fn write_row(&self, offset: usize, piece: &[u8]) -> bool {
        self.0.borrow_mut()[offset..offset + piece.len()].copy_from_slice(piece);
        true
    }

    fn row_len(&self) -> usize {
        self.0.borrow().len()
    }
}

impl DiskBackend {
    /// Blocks larger than a piece are written through a huge-page staging
    /// buffer, and read through one where the row cannot take O_DIRECT
    /// ([`DiskBackend::stages_load`]).
    pub(super) fn stages_blocks(&self) -> bool {
        self.direct && padded(self.block_bytes) > PIECE
    }

    /// Whether a load of a large block into `row` goes through the staging
    /// piece: only where O_DIRECT cannot read into the row itself, since
    /// read straight into an aligned row it costs the device as many
    /// requests as staged and saves the copy.
    pub(super) fn stages_load(&self, row: &[u8]) -> bool {
        self.stages_blocks() && !self.in_place(row)
    }

    /// Loads a block into `row` through this thread's staging piece.
    pub(super) fn read_staged(&self, path: &Path, key: &[u8], row: &mut [u8]) -> Result<()> {
        let into = IntoRow(RefCell::new(row));
        STAGE.with(|cell| {
            let mut cell = cell.borrow_mut();
            let len = STAGE_PIECE.min(padded(self.block_bytes));
            let piece = AlignedBuf::reuse(&mut cell, len).map_err(|e| {
                Error::new(
                    ErrorKind::Alloc,
                    format!("no memory for a {len}-byte staging piece: {e}"),
                )
            })?;
            if padded(self.block_bytes) <= piece.len() {
                let row = into.0.into_inner();
                return self.read_whole_staged(path, key, piece, row);
            }
            self.read_streamed(path, key, piece, &into).map(|_| ())
        })
    }

    /// Loads a block whose stored payload fits `piece` with one read into
    /// it, then one pass that copies it to `row` and checksums it (the
    /// piece is read once, not once for the checksum and again for the
    /// copy). The checksum is of the private piece, so a mismatch proves
    /// the file bad; the row then holds bytes the failed load never reports.
    fn read_whole_staged(
        &self,
        path: &Path,
        key: &[u8],
        piece: &mut [u8],
        row: &mut [u8],
    ) -> Result<()> {
        let (fd, id, form) = self.open_block(key, path, &[Form::Attr, Form::InFile])?;
        let stored = padded(self.block_bytes);
        let want = row.len();
        let sum = self.read_first((&fd, &id, form), key, path, &mut piece[..stored], want)?;
        if !copy_checked(sum, &piece[..want], row) {
            let problem = "payload checksum mismatch".to_string();
            return Err(self.condemn(key, path, id, problem));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::backend::disk::{format, DiskBackend, STAGED_NOTE};
    use crate::backend::Backend;
    use crate::config::DiskConfig;
    use crate::ErrorKind;

    /// A block larger than a piece round-trips straight through an aligned
    /// row and staged through a plain one (no deadline), and damage in any
    /// piece, the last short one included, is corrupt either way.
    #[test]
    fn a_block_larger_than_a_piece_loads_direct_or_staged_and_verified() {
        // A whole 2 MiB staging piece and a short second one.
        const BIG: usize = (2 << 20) + 12 * 1024;
        load_round_trips_and_damage_is_corrupt(BIG, &[(1 << 20) + 5, BIG - 1]);
    }

    /// A block of one staging piece: read straight into an aligned row and
    /// checksummed there, or read once into the piece and checksummed in
    /// the copy to a plain row. Damage at either end or in the middle is
    /// corrupt on both paths (the aligned row's bytes are never reported),
    /// and the file is removed.
    #[test]
    fn a_block_of_one_staging_piece_loads_direct_or_staged_and_verified() {
        const WHOLE: usize = 2 << 20;
        load_round_trips_and_damage_is_corrupt(WHOLE, &[0, WHOLE / 2 + 3, WHOLE - 1]);
    }

    fn load_round_trips_and_damage_is_corrupt(big: usize, damage_at: &[usize]) {
        let root = std::env::temp_dir().join(format!("kvtier-staged-{}-{big}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let cfg = DiskConfig {
            path: Some(root.clone()),
            ..DiskConfig::default()
        };
        let disk = DiskBackend::open(&cfg, "", big, 8, None).unwrap();
        assert!(
            disk.stages_blocks() && disk.describe().contains(STAGED_NOTE),
            "{} (the temporary directory must allow O_DIRECT)",
            disk.describe()
        );
        let payload: Vec<u8> = (0..big)
            .map(|i| (i % 251) as u8 ^ (i >> 20) as u8)
            .collect();
        let mut aligned = crate::aligned::AlignedBuf::new(big).unwrap();
        let mut plain = vec![0u8; big + 1];
        aligned.as_mut_slice()[..big].copy_from_slice(&payload);
        plain[1..].copy_from_slice(&payload);
        // Stored from the aligned row in place and from the plain one staged.
        disk.store(0, b"direct", &aligned.as_slice()[..big])
            .unwrap();
        disk.store(0, b"staged", &plain[1..]).unwrap();
        for key in [&b"direct"[..], b"staged"] {
            for row in [&mut aligned.as_mut_slice()[..big], &mut plain[1..]] {
                row.fill(0xee);
                disk.load(0, key, row).unwrap();
                assert!(row == &payload[..], "a load returned other bytes");
            }
        }
        assert!(!disk.stages_load(&aligned.as_slice()[..big]) && disk.stages_load(&plain[1..]));
        let stored = format::padded(big);
        for (n, &at) in damage_at.iter().enumerate() {
            let rows = [&mut aligned.as_mut_slice()[..big], &mut plain[1..]];
            for (row, kind) in rows.into_iter().zip(["direct", "staged"]) {
                let key = format!("damaged{n}-{kind}");
                disk.store(0, key.as_bytes(), &payload).unwrap();
                let path = disk.path_of(key.as_bytes());
                let mut bytes = std::fs::read(&path).unwrap();
                // The payload ends the file (after an in-file header, if any).
                let payload_at = bytes.len() - stored;
                bytes[payload_at + at] ^= 1;
                std::fs::write(&path, &bytes).unwrap();
                let err = disk.load(0, key.as_bytes(), row).unwrap_err();
                assert_eq!(err.kind(), ErrorKind::Corrupt, "{key}, byte {at}: {err}");
                assert!(
                    !path.exists(),
                    "{key}, byte {at}: the damaged file is removed"
                );
            }
        }
        drop(disk);
        std::fs::remove_dir_all(&root).unwrap();
    }
}
