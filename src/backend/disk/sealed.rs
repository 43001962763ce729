//! Sealed block files (`seal_key`): the 4096-byte header holds the sealed
//! record (`crate::seal::record`) and zeros; the payload is the ciphertext,
//! zero-padded like an unsealed one, so that sizes and alignment stay those
//! of the unsealed format.
//!
//! A file at this key's name that is not this key's block (a header or
//! payload that does not open, another key's block under this name, an
//! older version than the one this process last wrote or saw, a wrong
//! length) is:
//! - in shared mode, a miss (NotFound) and left in place: nothing is
//!   deleted for being bad there, and the next store of the key replaces it;
//! - otherwise corrupt, and removed, as an unsealed file that fails its
//!   checksum.
//!
//! A scan deletes only this tenant's own blocks at their own names (see
//! `recover`): another tenant's files are never touched, in any mode.

use super::format::{file_len, Form, HEADER_LEN};
use super::io;
use super::{io_error, with_scratch, DiskBackend};
use crate::error::Result;
use crate::seal::{Nonce, OpenedRecord, Sealer, Seen, RECORD_LEN};
use std::path::Path;

impl DiskBackend {
    /// Seals `row` into `buf` (a whole file: header and ciphertext; the row
    /// itself is never written), ready to be written from there.
    pub(super) fn seal_into(
        &self,
        seal: &Sealer,
        buf: &mut [u8],
        key: &[u8],
        row: &[u8],
    ) -> std::io::Result<Nonce> {
        let (header, payload) = buf.split_at_mut(HEADER_LEN);
        header.fill(0);
        let (body, padding) = payload.split_at_mut(row.len());
        body.copy_from_slice(row);
        padding.fill(0);
        seal.seal(self.block_fp(), key, body, header)
            .map_err(|e| std::io::Error::other(e.message().to_string()))
    }

    /// The sealed record of a file header, opened: the key and nonce it
    /// holds, or what is wrong.
    fn open_header(
        &self,
        seal: &Sealer,
        header: &[u8],
    ) -> std::result::Result<OpenedRecord, String> {
        let opened = seal.open_record(self.block_fp(), self.block_bytes, header)?;
        if header[RECORD_LEN..HEADER_LEN].iter().any(|&b| b != 0) {
            return Err("sealed header has bytes past its record".into());
        }
        Ok(opened)
    }

    /// Checks a sealed file's header and payload (read `read` bytes of
    /// `expected`) as `key`'s current block and decrypts the payload in place.
    fn unseal(
        &self,
        seal: &Sealer,
        header: &[u8],
        read: usize,
        expected: usize,
        key: &[u8],
        payload: &mut [u8],
    ) -> std::result::Result<(), String> {
        if read < expected {
            return Err(format!("short file ({read} of {expected} bytes)"));
        }
        let opened = self.open_header(seal, header)?;
        if opened.key() != key {
            return Err("sealed block of another key under this name".into());
        }
        if self.ledger.check(key, opened.nonce) == Seen::Replaced {
            return Err("an older or other version than this tier last wrote or saw".into());
        }
        seal.open_payload(header, &opened, payload)
    }

    /// Loads a sealed block into `row`, authenticated. With O_DIRECT and an
    /// aligned row the ciphertext is read into the row and decrypted there;
    /// if that fails (perhaps only because another load wrote the row), a
    /// private read into scratch decides.
    pub(super) fn read_sealed(
        &self,
        seal: &Sealer,
        path: &Path,
        key: &[u8],
        row: &mut [u8],
    ) -> Result<()> {
        let (fd, id, _) = self.open_block(key, path, &[Form::InFile])?;
        let read_error = |e| io_error("read", path, e);
        if self.in_place(row) {
            let problem = with_scratch(HEADER_LEN, |h| {
                let n = io::read_at(&fd, &mut [h, row], 0)?;
                Ok(self.unseal(seal, h, n, HEADER_LEN + row.len(), key, row))
            })
            .map_err(read_error)?;
            if problem.is_ok() {
                return Ok(());
            }
        }
        let want = file_len(self.block_bytes);
        let outcome = with_scratch(want, |buf| {
            let n = io::read_at(&fd, &mut [buf], 0)?;
            let (header, payload) = buf.split_at_mut(HEADER_LEN);
            let payload = &mut payload[..row.len()];
            let outcome = self.unseal(seal, header, n, want, key, payload);
            if outcome.is_ok() {
                row.copy_from_slice(payload);
            }
            Ok(outcome)
        })
        .map_err(read_error)?;
        outcome.map_err(|problem| self.condemn(key, path, id, problem))
    }

    /// Whether `path` holds a complete block whose header authenticates as
    /// `key`'s; its nonce becomes the version this tier expects.
    pub(super) fn sealed_present(&self, seal: &Sealer, path: &Path, key: &[u8]) -> bool {
        if !self.exists_complete(path) {
            return false;
        }
        match self.read_sealed_header(seal, path) {
            Ok(Ok(opened)) if opened.key() == key => {
                self.ledger.record(key, opened.nonce);
                true
            }
            _ => false,
        }
    }

    /// A sealed file's header, opened: `Err` when it could not be read
    /// (which proves nothing), `Ok(Err)` when it was read and is not a block
    /// of this tier's tenant.
    pub(super) fn read_sealed_header(
        &self,
        seal: &Sealer,
        path: &Path,
    ) -> std::io::Result<std::result::Result<OpenedRecord, String>> {
        let fd = io::open_read(path, false)?;
        if !io::fstat(&fd)?.is_regular() {
            return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
        }
        let mut h = [0u8; HEADER_LEN];
        let n = io::read_at(&fd, &mut [&mut h], 0)?;
        if n < HEADER_LEN {
            return Ok(Err("short header".into()));
        }
        Ok(self.open_header(seal, &h))
    }
}
