//! The verified read of a block file: open without blocking, check it is a
//! regular file of the block's size, check header and checksum, and condemn a
//! file only for what a private read of it proved.

use super::format::{padded, AttrHeader, Claims, Form, Header, ATTR_LEN, ATTR_NAME, HEADER_LEN};
use super::io::{self, FileId};
use super::{io_error, with_scratch, DiskBackend};
use crate::backend::checksum::PayloadSum;
use crate::backend::LoadJob;
use crate::error::{Error, ErrorKind, Result};
use crate::seal::Sealer;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::atomic::Ordering;

/// How stale a block file's access time may be before a load stamps it
/// again: the recency `kvtier gc` sees is this fine. Measured cost:
/// docs/cli.md ("Recency").
const USE_STAMP_EVERY_S: i64 = 60;

/// A load of `want` bytes of a block stored with `stored`: fails that load
/// (`TIER_FAIL_LENGTH_MISMATCH`), keeps the file.
pub(super) fn wrong_length(path: &Path, stored: u64, want: usize) -> Error {
    Error::new(
        ErrorKind::InvalidArg,
        format!(
            "{}: the block was stored with {stored} bytes; the load asked for {want}",
            path.display()
        ),
    )
    .wrong_length()
}

impl DiskBackend {
    /// The first read of a block file opened as `form`: its header (from
    /// the attribute, or in-file into the scratch) and the payload's first
    /// `piece.len()` bytes into `piece`. Returns the checksum the payload
    /// must have; a short read or a header that is not this block's
    /// condemns the file, and a block stored with another length than the
    /// load's `want` fails the load and stays.
    pub(super) fn read_first(
        &self,
        (fd, id, form): (&OwnedFd, &FileId, Form),
        key: &[u8],
        path: &Path,
        piece: &mut [u8],
        want: usize,
    ) -> Result<PayloadSum> {
        let read_error = |e| io_error("read", path, e);
        let (claims, header_len, read) = match form {
            Form::Attr => {
                let attr = self.read_attr_header(fd, key, path, id)?;
                let n = io::read_at(fd, &mut [piece], 0).map_err(read_error)?;
                (Ok(attr.claims(key)), 0, n)
            }
            Form::InFile => with_scratch(HEADER_LEN, |h| {
                let n = io::read_at(fd, &mut [h, piece], 0)?;
                Ok((Header::decode(h).map(|h| h.claims(key)), HEADER_LEN, n))
            })
            .map_err(read_error)?,
        };
        self.read_returned();
        if let Some(stored) = self.other_length(&claims, want) {
            return Err(wrong_length(path, stored, want));
        }
        self.header_problem(claims, read, header_len + piece.len())
            .map_err(|why| self.refuse(key, path, *id, why))
    }

    /// Opens a block file and checks that it is a regular file of the block
    /// size in one of `forms` before a byte is read; returns which form. A missing file is `NotFound`; something
    /// else at the path (a FIFO, a directory, a symlink, which is never
    /// followed) can never heal and is condemned; other failures (descriptors,
    /// permissions, I/O) are transient `Io`.
    pub(super) fn open_block(
        &self,
        key: &[u8],
        path: &Path,
        forms: &[Form],
    ) -> Result<(OwnedFd, FileId, Form)> {
        let fd = match io::open_read(path, self.direct) {
            Ok(fd) => fd,
            Err(e) if io::is_missing(&e) => return Err(io_error("open", path, e)),
            // ELOOP, ENXIO, EINVAL (O_DIRECT on a directory) and friends mean
            // "not a regular file" only if the path's own entry says so.
            Err(e) => {
                return Err(match io::lstat(path) {
                    Ok(entry) if !entry.is_regular() => self.condemn(
                        key,
                        path,
                        entry,
                        format!("{} where a block file should be", entry.kind_name()),
                    ),
                    _ => io_error("open", path, e),
                })
            }
        };
        let id = io::fstat(&fd).map_err(|e| io_error("stat", path, e))?;
        if !id.is_regular() {
            let problem = format!("{} where a block file should be", id.kind_name());
            return Err(self.condemn(key, path, id, problem));
        }
        match Form::of_len(id.len, self.block_bytes).filter(|form| forms.contains(form)) {
            Some(form) => {
                self.stamp_use(&fd, &id);
                Ok((fd, id, form))
            }
            None => {
                let lens: Vec<String> = forms
                    .iter()
                    .map(|form| form.file_len(self.block_bytes).to_string())
                    .collect();
                let problem = format!("file of {} bytes, expected {}", id.len, lens.join(" or "));
                Err(self.condemn(key, path, id, problem))
            }
        }
    }

    /// A load is a use: the file's access time becomes now when it is more
    /// than [`USE_STAMP_EVERY_S`] old, so a `kvtier gc` over shared storage
    /// removes the least recently used blocks first, whichever process used
    /// them. One `futimens` per block per interval at most (the stat it
    /// reads was taken anyway); relatime would update atime only once a day.
    /// A tier that may not stamp (another user's files) stops trying.
    fn stamp_use(&self, fd: &OwnedFd, id: &FileId) {
        if !self.stamps_use.load(Ordering::Relaxed) {
            return;
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        if now - id.atime_s < USE_STAMP_EVERY_S {
            return;
        }
        if let Err(e) = io::stamp_access(fd) {
            if e.raw_os_error() == Some(libc::EPERM) {
                self.stamps_use.store(false, Ordering::Relaxed);
            }
        }
    }

    /// What is wrong with a block read from a file, if anything.
    pub(super) fn problem(
        &self,
        header: std::result::Result<Claims, String>,
        read: usize,
        expected_read: usize,
        payload: &[u8],
    ) -> Option<Unusable> {
        match self.header_problem(header, read, expected_read) {
            Err(why) => Some(why),
            Ok(sum) if !sum.matches(payload) => {
                Some(Unusable::Bad("payload checksum mismatch".into()))
            }
            Ok(_) => None,
        }
    }

    /// The length an intact-looking header of this key says its block was
    /// stored with, if that is not `want` (an extent load of another
    /// length): the load fails and the file stays.
    fn other_length(
        &self,
        header: &std::result::Result<Claims, String>,
        want: usize,
    ) -> Option<u64> {
        let h = header.as_ref().ok()?;
        let plausible = h.namespace_fp == self.block_fp()
            && h.names_key
            && (1..=self.block_bytes as u64).contains(&h.payload_len);
        (plausible && h.payload_len != want as u64).then_some(h.payload_len)
    }

    /// What is wrong with a block's header and the length read, if
    /// anything; else the payload's checksum, still to be checked.
    fn header_problem(
        &self,
        header: std::result::Result<Claims, String>,
        read: usize,
        expected_read: usize,
    ) -> std::result::Result<PayloadSum, Unusable> {
        let bad = |why: String| Err(Unusable::Bad(why));
        match header {
            _ if read < expected_read => {
                bad(format!("short file ({read} of {expected_read} bytes)"))
            }
            Err(why) => bad(why),
            Ok(h) if h.namespace_fp != self.block_fp() => {
                match self.other_generation(h.namespace_fp) {
                    Some(newer) if h.names_key => Err(Unusable::OtherGeneration { newer }),
                    _ => bad("block of another namespace".into()),
                }
            }
            Ok(h) if h.payload_len == 0 || h.payload_len > self.block_bytes as u64 => bad(format!(
                "block of {} bytes, beyond the block size {}",
                h.payload_len, self.block_bytes
            )),
            Ok(h) if !h.names_key => bad("header names another key".into()),
            Ok(h) => Ok(h.payload_sum),
        }
    }

    /// Loads a block a piece at a time through `piece` (see
    /// `WatchedIo::load_streamed`): each read fills the private buffer, whose
    /// bytes feed the checksum and then go to the row through `job`. The
    /// checksum is taken over the private reads, so a mismatch proves the
    /// file bad, as in [`DiskBackend::read_verified`]'s private read.
    pub(super) fn read_streamed(
        &self,
        path: &Path,
        key: &[u8],
        piece: &mut [u8],
        job: &dyn LoadJob,
    ) -> Result<bool> {
        let (fd, id, form) = self.open_block(key, path, &[Form::Attr, Form::InFile])?;
        let read_error = |e| io_error("read", path, e);
        // The payload as stored: padded to the alignment O_DIRECT reads in.
        let stored = padded(self.block_bytes);
        let first = piece.len().min(stored);
        let header_len = match form {
            Form::Attr => 0,
            Form::InFile => HEADER_LEN,
        };
        let want = job.row_len();
        let mut sum = self
            .read_first((&fd, &id, form), key, path, &mut piece[..first], want)?
            .hasher();
        let (mut offset, mut got) = (0, first);
        loop {
            let bytes = &piece[..got.min(want - offset)];
            sum.write(bytes);
            if !job.write_row(offset, bytes) {
                return Ok(false);
            }
            offset += got;
            if offset >= want {
                break;
            }
            let want = piece.len().min(stored - offset);
            let at = (header_len + offset) as u64;
            let n = io::read_at(&fd, &mut [&mut piece[..want]], at).map_err(read_error)?;
            self.read_returned();
            if n < want {
                let (n, expected) = (header_len + offset + n, header_len + stored);
                let problem = format!("short file ({n} of {expected} bytes)");
                return Err(self.condemn(key, path, id, problem));
            }
            got = want;
        }
        if !sum.matches() {
            let problem = "payload checksum mismatch".to_string();
            return Err(self.condemn(key, path, id, problem));
        }
        Ok(true)
    }

    /// Loads a block into `row`, verified. A file is condemned only on what a
    /// private read of it shows: a checksum computed over the engine's row can
    /// fail because something else wrote that row meanwhile (two loads in
    /// flight into one row), which says nothing about the file.
    pub(super) fn read_verified(&self, path: &Path, key: &[u8], row: &mut [u8]) -> Result<()> {
        let (fd, id, form) = self.open_block(key, path, &[Form::Attr, Form::InFile])?;
        let read_error = |e| io_error("read", path, e);
        // The attribute header is read once: a private read below checks
        // the payload against the same one.
        let attr = match form {
            Form::Attr => Some(self.read_attr_header(&fd, key, path, &id)?),
            Form::InFile => None,
        };
        let header_len = match form {
            Form::Attr => 0,
            Form::InFile => HEADER_LEN,
        };
        if let Some(stored) = attr
            .as_ref()
            .and_then(|attr| self.other_length(&Ok(attr.claims(key)), row.len()))
        {
            return Err(wrong_length(path, stored, row.len()));
        }
        // An in-file header is read with the payload: a row shorter than the
        // block size (an extent) is read privately, so that its length is
        // checked before a byte reaches it.
        if self.in_place(row) && (attr.is_some() || row.len() == self.block_bytes) {
            let (header, read) = match &attr {
                Some(attr) => {
                    let n = io::read_at(&fd, &mut [row], 0).map_err(read_error)?;
                    (Ok(attr.claims(key)), n)
                }
                None => with_scratch(HEADER_LEN, |h| {
                    let n = io::read_at(&fd, &mut [h, row], 0)?;
                    Ok((Header::decode(h).map(|h| h.claims(key)), n))
                })
                .map_err(read_error)?,
            };
            if self
                .problem(header, read, header_len + row.len(), row)
                .is_none()
            {
                return Ok(());
            }
        }
        let want = form.file_len(self.block_bytes);
        let problem = with_scratch(want, |buf| {
            let n = io::read_at(&fd, &mut [buf], 0)?;
            let (header, payload) = buf.split_at(header_len);
            let payload = &payload[..row.len()];
            let claims = match &attr {
                Some(attr) => Ok(attr.claims(key)),
                None => Header::decode(header).map(|h| h.claims(key)),
            };
            if let Some(stored) = self.other_length(&claims, row.len()) {
                return Ok(Err(stored));
            }
            let problem = self.problem(claims, n, want, payload);
            if problem.is_none() {
                row.copy_from_slice(payload);
            }
            Ok(Ok(problem))
        })
        .map_err(read_error)?;
        match problem {
            Err(stored) => Err(wrong_length(path, stored, row.len())),
            Ok(None) => Ok(()),
            Ok(Some(why)) => Err(self.refuse(key, path, id, why)),
        }
    }

    /// A read of a block's bytes returned: where the test seam makes a load
    /// hang, as a `pread` that completes late would.
    pub(super) fn read_returned(&self) {
        #[cfg(feature = "test-hooks")]
        self.seam.pause(super::hang::HangPoint::Read);
    }

    /// The attribute header of an open block file of that form. A file
    /// without one, or with one that is not a kvtier header, is proved bad
    /// and condemned; a read that failed otherwise proves nothing (`Io`).
    fn read_attr_header(
        &self,
        fd: &OwnedFd,
        key: &[u8],
        path: &Path,
        id: &FileId,
    ) -> Result<AttrHeader> {
        let mut value = [0u8; ATTR_LEN + 1];
        let problem = match io::get_attr(fd, ATTR_NAME, &mut value) {
            Ok(n) => match AttrHeader::decode(&value[..n]) {
                Ok(header) => return Ok(header),
                Err(why) => why,
            },
            Err(e) if io::is_attr_missing_or_foreign(&e) => {
                format!("file of the payload's length without a header attribute ({e})")
            }
            Err(e) => return Err(io_error("read the header attribute of", path, e)),
        };
        Err(self.condemn(key, path, *id, problem))
    }

    /// Removes a block file proved bad (its type, size, header or checksum)
    /// so no later load trips on it, and returns the load's `Corrupt` error.
    /// Under the key's stripe lock and only if the path still names the file
    /// that was examined: a good block published there since (by a process
    /// sharing the directory) is never removed in its place. Directories are
    /// left alone: kvtier never made them. A sealed tier in a shared
    /// directory deletes nothing: the file is a miss, left in place (see
    /// docs/reliability-rules.md).
    pub(super) fn condemn(
        &self,
        key: &[u8],
        path: &Path,
        examined: FileId,
        problem: String,
    ) -> Error {
        self.condemn_as(ErrorKind::Corrupt, key, path, examined, problem)
    }

    /// The load's error for a block that cannot be served: one proved bad
    /// is condemned; one of this namespace's other generation is a miss,
    /// removed only if it is of an older one (a clear's leftover, as its
    /// sweep would), never if newer (another tier has read a clear this one
    /// has not yet: the block is good, and its peer's).
    fn refuse(&self, key: &[u8], path: &Path, examined: FileId, why: Unusable) -> Error {
        match why {
            Unusable::Bad(problem) => self.condemn(key, path, examined, problem),
            Unusable::OtherGeneration { newer: false } => self.condemn_as(
                ErrorKind::NotFound,
                key,
                path,
                examined,
                "a block of this namespace from before a clear".into(),
            ),
            Unusable::OtherGeneration { newer: true } => Error::new(
                ErrorKind::NotFound,
                format!(
                    "{}: a block of a later generation of this namespace (another tier has \
                     seen a clear this one has not yet); a miss, left in place",
                    path.display()
                ),
            ),
        }
    }

    fn condemn_as(
        &self,
        kind: ErrorKind,
        key: &[u8],
        path: &Path,
        examined: FileId,
        problem: String,
    ) -> Error {
        if in_newer_format(path, self.seal.as_ref()) {
            // Another version's block: a miss here, and never deleted.
            return Error::new(
                ErrorKind::NotFound,
                format!(
                    "{}: a block in a format newer than this build reads ({problem}); left in place",
                    path.display()
                ),
            );
        }
        if self.shared && self.seal.is_some() {
            return Error::new(
                ErrorKind::NotFound,
                format!(
                    "{}: {problem}; a miss, left in place (shared)",
                    path.display()
                ),
            );
        }
        let outcome = {
            let _guard = self.stripes.of(key).lock();
            match io::lstat(path) {
                Ok(now) if now.same_file(&examined) && !now.is_dir() => {
                    self.changed(path);
                    match std::fs::remove_file(path) {
                        Ok(()) => "removed".to_string(),
                        Err(e) => {
                            self.left_unindexed();
                            format!("could not remove it: {e}")
                        }
                    }
                }
                Ok(now) if now.is_dir() => "left in place".to_string(),
                _ => "replaced meanwhile, kept".to_string(),
            }
        };
        Error::new(kind, format!("{}: {problem}; {outcome}", path.display()))
    }
}

/// Why a block file is not served.
pub(super) enum Unusable {
    /// Proved bad, or another namespace's under a colliding name.
    Bad(String),
    /// Intact and this namespace's, but of another clear generation than
    /// this tier's: `newer`, or older.
    OtherGeneration { newer: bool },
}

/// Whether the block file at `path` carries an intact header, in the file or
/// in its attribute, of a format newer than this build reads, or (for a
/// sealed tier, `seal`) a sealed record of a newer format whose key field
/// opens under the tenant's key (`Sealer::newer_problem`): a version byte
/// is believed only once the header around it is proved intact.
fn in_newer_format(path: &Path, seal: Option<&Sealer>) -> bool {
    let Ok(fd) = io::open_read(path, false) else {
        return false;
    };
    let mut attr = [0u8; ATTR_LEN + 1];
    if let Ok(n) = io::get_attr(&fd, ATTR_NAME, &mut attr) {
        if AttrHeader::is_newer(&attr[..n]) {
            return true;
        }
    }
    let mut header = vec![0u8; HEADER_LEN];
    let Ok(n) = io::read_at(&fd, &mut [&mut header], 0) else {
        return false;
    };
    Header::is_newer(&header[..n])
        || seal.is_some_and(|seal| seal.newer_problem(&header[..n]).is_some())
}
