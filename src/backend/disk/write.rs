//! The store path of a disk tier: a temporary file written (in the file or
//! with its header in an attribute) and published by rename under the key's
//! stripe lock; the mirror of `read.rs`.

use super::format::{file_len, AttrHeader, Form, ATTR_NAME, HEADER_LEN};
#[cfg(feature = "test-hooks")]
use super::hang;
use super::io;
use super::{layout, with_scratch, DiskBackend};
use crate::backend::{Row, StoreJob};
use crate::config::SyncMode;
use crate::error::{bail, Result};
use crate::seal::Nonce;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::atomic::Ordering;

impl DiskBackend {
    /// Writes the block file; for a sealed tier, returns the nonce it sealed
    /// with. `None` means the job was reported before its row was read:
    /// nothing is to be published. Also returns the file's identity, taken
    /// by `fstat` once it is created (cheaper than an
    /// `lstat` of its path), so that a rename withdrawn later can tell
    /// whether the path still names this file. The file is closed here,
    /// before it is published: on NFS, `close` is where written data
    /// reaches the server, so another client must not find the name first.
    ///
    /// The row is the caller's and this call may outlive the tier (see
    /// `WatchedIo::store_unless`), so it is read from user space (checksum,
    /// copy, sealing) only inside `job.read_row`, after the file is created
    /// (an `open` on a hung mount is where a store waits longest) and into
    /// this thread's scratch. Only an aligned row of at most 1 MiB under
    /// O_DIRECT is written from where it is, by the kernel, and only if the
    /// job was not reported by the time the file was created: a write left
    /// behind by `tier_free` gets EFAULT if the caller unmapped the row
    /// (never a fault here), and its file is never published and is removed
    /// when the call returns.
    fn write_tmp(
        &self,
        tmp: &Path,
        key: &[u8],
        row: Row,
        job: &dyn StoreJob,
    ) -> std::io::Result<(io::FileId, Option<Option<Nonce>>)> {
        let fd = match io::create_exclusive(tmp, self.direct) {
            Err(e) if io::is_missing(&e) => {
                let dir = tmp.parent().expect("fan-out dir");
                match io::mkdir(dir) {
                    Err(e) if e.raw_os_error() != Some(libc::EEXIST) => return Err(e),
                    _ => io::create_exclusive(tmp, self.direct)?,
                }
            }
            other => other?,
        };
        let ours = io::fstat(&fd)?;
        #[cfg(feature = "test-hooks")]
        self.seam.pause(hang::HangPoint::Create);
        #[cfg(feature = "test-hooks")]
        if self.simulate_full.load(Ordering::Relaxed) {
            return Err(std::io::Error::from_raw_os_error(libc::ENOSPC));
        }
        // A block over a piece is staged whole in huge pages (one request,
        // one page to pin) rather than written from a row of 4 KiB pages
        // (split at the device's segment limit): unlike a load's copy, this
        // one measured cheaper than the split write it saves
        // (docs/disk-deadlines.md).
        // A block shorter than the block size (an extent) is staged too: the
        // file keeps the block size's length, zero-padded.
        let in_place = self.seal.is_none()
            && row.len() == self.block_bytes
            && self.aligned(row.as_ptr(), row.len())
            && !self.stages_blocks();
        if self.form_for(key) == Form::Attr {
            let written = self.write_attr_form(&fd, key, row, job, in_place)?;
            return Ok((ours, written));
        }
        let staged_len = if in_place {
            HEADER_LEN
        } else {
            file_len(self.block_bytes)
        };
        let nonce = with_scratch(staged_len, |buf| {
            let mut staged = Ok(None);
            let read = job.read_row(row, &mut |row| {
                staged = match &self.seal {
                    Some(seal) => self.seal_into(seal, buf, key, row).map(Some),
                    None => {
                        let (h, payload) = buf.split_at_mut(HEADER_LEN);
                        // Staged, the checksum reads the copy while in cache.
                        let written = if in_place {
                            row
                        } else {
                            payload[..row.len()].copy_from_slice(row);
                            payload[row.len()..].fill(0);
                            &payload[..row.len()]
                        };
                        self.header(key, written).encode(h);
                        Ok(None)
                    }
                };
            });
            if !read {
                return Ok(None);
            }
            let nonce = staged?;
            if in_place {
                io::write_header_and_row(&fd, buf, row.as_ptr(), row.len(), 0)?;
            } else {
                io::write_all_at(&fd, &[buf], 0)?;
            }
            Ok(Some(nonce))
        })?;
        if nonce.is_some() && self.sync == SyncMode::Data {
            io::fdatasync(&fd)?;
        }
        Ok((ours, nonce))
    }

    /// `write_tmp` for a block whose header is the file's attribute: the
    /// file holds the padded payload alone, written from the row in place
    /// when O_DIRECT allows, else from this thread's scratch. The header's
    /// checksum is taken inside `job.read_row`: in place, after the write,
    /// as the header is written last anyway, so the device starts on the
    /// payload a hash earlier (python/bench/bench_disk_vs_fs.py on a loop
    /// device; docs/runs/disk.md). A row changed while its store is in
    /// flight (which the contract forbids) fails its checksum on load, in
    /// either order.
    fn write_attr_form(
        &self,
        fd: &OwnedFd,
        key: &[u8],
        row: Row,
        job: &dyn StoreJob,
        in_place: bool,
    ) -> std::io::Result<Option<Option<Nonce>>> {
        // `staged`: the scratch the payload is copied into, or None to
        // write the row in place.
        let write = |mut staged: Option<&mut [u8]>| -> std::io::Result<bool> {
            if staged.is_none() {
                // A job reported while the file was created (a hung open)
                // has its row back with the caller: the kernel must not read
                // it either.
                if job.abandoned() {
                    return Ok(false);
                }
                io::write_row(fd, row.as_ptr(), row.len(), 0)?;
            }
            let mut header = None;
            let read = job.read_row(row, &mut |row| {
                // Staged, the checksum reads the copy while in cache.
                let written = match staged.as_deref_mut() {
                    Some(buf) => {
                        buf[..row.len()].copy_from_slice(row);
                        buf[row.len()..].fill(0);
                        &buf[..row.len()]
                    }
                    None => row,
                };
                header = Some(AttrHeader::of(self.block_fp(), key, written).encode());
            });
            let Some(header) = header.filter(|_| read) else {
                return Ok(false);
            };
            if let Some(buf) = staged {
                io::write_all_at(fd, &[buf], 0)?;
            }
            io::set_attr(fd, ATTR_NAME, &header)?;
            Ok(true)
        };
        let written = if in_place {
            write(None)?
        } else {
            with_scratch(Form::Attr.file_len(self.block_bytes), |buf| {
                write(Some(buf))
            })?
        };
        // The header is metadata: fsync, where fdatasync might leave it out.
        if written && self.sync == SyncMode::Data {
            io::fsync(fd)?;
        }
        Ok(written.then_some(None))
    }

    /// Stores a block: writes a temporary file and publishes it by rename,
    /// unless `job.abandoned()` says the job was reported failed meanwhile (a
    /// storage call missed its deadline). The check and the rename are under
    /// the key's stripe lock; a rename that was already under way when the
    /// job was reported is withdrawn when it returns (the file removed if the
    /// path still names it, never a file published since), so the index
    /// never lists it and no later store is overwritten. The row is read
    /// only as `write_tmp` says; a call that returns after `tier_free` reads
    /// nothing of it, publishes nothing and removes its temporary file (or
    /// the next open does, if the call never returns).
    pub(super) fn store_checked(&self, key: &[u8], block: Row, job: &dyn StoreJob) -> Result<u64> {
        let path = self.path_of(key);
        // Another process may have published this key already.
        if self.shared && self.published(&path, key) {
            return Ok(0);
        }
        let n = self.tmp_counter.fetch_add(1, Ordering::Relaxed);
        let tmp = layout::tmp_path(&path, self.pid, n);
        self.changed(&path);
        let written = self.write_tmp(&tmp, key, block, job);
        #[cfg(feature = "test-hooks")]
        self.seam.pause(hang::HangPoint::Write);
        let mut withdrawn = false;
        let published = written.and_then(|(ours, nonce)| {
            let _guard = self.stripes.of(key).lock();
            // `None`: reported before its row was read, nothing written.
            let Some(nonce) = nonce.filter(|_| !job.abandoned()) else {
                withdrawn = true;
                return Err(std::io::Error::from(std::io::ErrorKind::TimedOut));
            };
            std::fs::rename(&tmp, &path)?;
            #[cfg(feature = "test-hooks")]
            self.seam.pause(hang::HangPoint::Publish);
            if job.abandoned() {
                withdrawn = true;
                if io::lstat(&path).is_ok_and(|now| now.same_file(&ours))
                    && std::fs::remove_file(&path).is_err()
                {
                    self.left_unindexed();
                }
                return Err(std::io::Error::from(std::io::ErrorKind::TimedOut));
            }
            if let Some(nonce) = nonce {
                self.ledger.record(key, nonce);
            }
            Ok(())
        });
        if let Err(e) = published {
            if let Err(e) = std::fs::remove_file(&tmp) {
                if !io::is_missing(&e) {
                    self.left_unindexed();
                }
            }
            if withdrawn || job.abandoned() {
                bail!(
                    Io,
                    "{}: not published: the job was reported failed at its I/O deadline",
                    path.display()
                );
            }
            if e.kind() == std::io::ErrorKind::OutOfMemory {
                bail!(Alloc, "cannot store {}: {e}", path.display());
            }
            let what = if io::is_full(&e) {
                "no space to store"
            } else {
                "cannot store"
            };
            bail!(Io, "{what} {}: {e}", path.display());
        }
        if let Some(journal) = self.journal.get() {
            journal.record(key);
        }
        if self.sync == SyncMode::Data {
            if let Err(e) = io::sync_dir(path.parent().expect("fan-out dir")) {
                bail!(Io, "cannot sync directory of {}: {e}", path.display());
            }
        }
        Ok(self.block_bytes as u64)
    }
}
