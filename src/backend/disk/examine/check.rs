//! A block file checked as a tier of its directory checks it, and a file
//! removed only while its name still holds the file that was examined.

use super::Fingerprints;
use crate::aligned::AlignedBuf;
use crate::backend::checksum::PayloadSum;
use crate::backend::disk::format::{
    file_len, padded, AttrHeader, Form, Header, ATTR_LEN, ATTR_NAME, HEADER_LEN,
};
use crate::backend::disk::{io, layout};
use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

/// A file's identity, taken when it was examined.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileStamp {
    /// The device.
    pub dev: u64,
    /// The inode.
    pub ino: u64,
}

/// A block file checked as a tier of its directory would check it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// A good block of this namespace, in the format version given.
    Good {
        /// 1 and 2: header in the file (XXH64, XXH3-64); 3: in an attribute.
        version: u32,
    },
    /// A good block of a generation a clear left behind: no tier reads it.
    Stale,
    /// At a block's name and not a good block (size, place, header,
    /// checksum): what a tier that reads it deletes.
    Damaged(String),
    /// Not this namespace's: no tier reads or deletes it.
    Foreign(String),
    /// A block in a format newer than this build reads: left alone.
    Newer,
    /// Gone before it could be read (deleted or replaced meanwhile).
    Vanished,
    /// Could not be read (permissions, descriptors, I/O): proves nothing.
    Unreadable(String),
}

/// What [`Checker::check`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Checked {
    /// What the file is.
    pub verdict: Verdict,
    /// Its identity, when it was opened (for [`remove_if_same`]).
    pub stamp: Option<FileStamp>,
    /// Its length, when it was opened.
    pub len: u64,
}

/// Checks block files of one block size, reusing one aligned buffer.
pub struct Checker {
    buf: AlignedBuf,
    block_bytes: usize,
    direct: bool,
    noatime: bool,
}

impl Checker {
    /// A checker of blocks of `block_bytes`, reading with O_DIRECT where the
    /// file system allows it (as tiers read).
    pub fn new(block_bytes: usize) -> std::io::Result<Checker> {
        Ok(Checker {
            buf: AlignedBuf::new(file_len(block_bytes))?,
            block_bytes,
            direct: true,
            noatime: true,
        })
    }

    fn open(&mut self, path: &Path) -> std::io::Result<OwnedFd> {
        loop {
            let mut flags = libc::O_RDONLY | libc::O_NONBLOCK;
            if self.direct {
                flags |= libc::O_DIRECT;
            }
            if self.noatime {
                flags |= libc::O_NOATIME;
            }
            match io::open(path, flags, 0) {
                // O_NOATIME: only for the files' owner.
                Err(e) if e.raw_os_error() == Some(libc::EPERM) && self.noatime => {
                    self.noatime = false
                }
                // O_DIRECT: not on every file system (tmpfs, some FUSE).
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) && self.direct => {
                    self.direct = false
                }
                other => return other,
            }
        }
    }

    /// Reads a whole file into the buffer as a check would, checking
    /// nothing: the raw rate a check is measured against. The bytes read.
    pub fn read_raw(&mut self, path: &Path) -> std::io::Result<usize> {
        let fd = self.open(path)?;
        let len = (io::fstat(&fd)?.len as usize).min(self.buf.len());
        let want = padded(len.max(1));
        io::read_at(&fd, &mut [&mut self.buf.as_mut_slice()[..want]], 0)
    }

    /// Checks the unsealed block file `name` (a [`FanEntry::Block`]) in the
    /// fan-out directory `fan` of `ns_dir` against `fps`.
    pub fn check(&mut self, ns_dir: &Path, fan: &str, name: &str, fps: &Fingerprints) -> Checked {
        let path = ns_dir.join(fan).join(name);
        let unopened = |verdict| Checked {
            verdict,
            stamp: None,
            len: 0,
        };
        let fd = match self.open(&path) {
            Ok(fd) => fd,
            Err(e) if io::is_missing(&e) => return unopened(Verdict::Vanished),
            Err(e) => {
                return unopened(match io::lstat(&path) {
                    Ok(entry) if !entry.is_regular() => {
                        Verdict::Foreign(format!("{} at a block's name", entry.kind_name()))
                    }
                    _ => Verdict::Unreadable(e.to_string()),
                })
            }
        };
        let id = match io::fstat(&fd) {
            Ok(id) => id,
            Err(e) => return unopened(Verdict::Unreadable(e.to_string())),
        };
        let stamp = Some(FileStamp {
            dev: id.dev,
            ino: id.ino,
        });
        let verdict = if id.is_regular() {
            self.judge(&fd, id.len, ns_dir, fan, name, fps)
        } else {
            Verdict::Foreign(format!("{} at a block's name", id.kind_name()))
        };
        Checked {
            verdict,
            stamp,
            len: id.len,
        }
    }

    fn judge(
        &mut self,
        fd: &OwnedFd,
        len: u64,
        ns_dir: &Path,
        fan: &str,
        name: &str,
        fps: &Fingerprints,
    ) -> Verdict {
        let bb = self.block_bytes;
        let hashed = layout::is_hashed_name(name);
        let named = match layout::key_from_name(name) {
            Some(key) if !hashed && key.len() <= layout::LONG_KEY => Some(key),
            _ if hashed => None,
            _ => return Verdict::Damaged("not a block file's name".into()),
        };
        let form = match Form::of_len(len, bb) {
            Some(Form::Attr) if hashed => {
                return Verdict::Damaged("a hashed name's block without its header".into())
            }
            Some(form) => form,
            None => {
                return Verdict::Damaged(format!(
                    "file of {len} bytes, expected {} or {}",
                    Form::Attr.file_len(bb),
                    Form::InFile.file_len(bb)
                ))
            }
        };
        let want = form.file_len(bb);
        let read = match io::read_at(fd, &mut [&mut self.buf.as_mut_slice()[..want]], 0) {
            Ok(n) => n,
            Err(e) => return Verdict::Unreadable(e.to_string()),
        };
        if read < want {
            return Verdict::Damaged(format!("short file ({read} of {want} bytes)"));
        }
        let buf = &self.buf.as_slice()[..want];
        let (claims, version, payload) = match form {
            Form::Attr => {
                let key = named.as_deref().expect("a hex name");
                let mut value = [0u8; ATTR_LEN + 1];
                let header = match io::get_attr(fd, ATTR_NAME, &mut value) {
                    Ok(n) if AttrHeader::is_newer(&value[..n]) => return Verdict::Newer,
                    Ok(n) => match AttrHeader::decode(&value[..n]) {
                        Ok(header) => header,
                        Err(why) => return Verdict::Damaged(why),
                    },
                    Err(e) if io::is_attr_missing_or_foreign(&e) => {
                        return Verdict::Damaged("no header attribute".into())
                    }
                    Err(e) => return Verdict::Unreadable(e.to_string()),
                };
                (header.claims(key), 3, &buf[..bb])
            }
            Form::InFile => {
                if Header::is_newer(buf) {
                    return Verdict::Newer;
                }
                let header = match Header::decode(buf) {
                    Ok(header) => header,
                    Err(why) => return Verdict::Damaged(why),
                };
                let version = match header.payload_sum {
                    PayloadSum::Xxh64(_) => 1,
                    PayloadSum::Xxh3(_) => 2,
                };
                let key = match &named {
                    Some(key) => key.clone(),
                    None if layout::block_path(ns_dir, &header.key)
                        == ns_dir.join(fan).join(name) =>
                    {
                        header.key.clone()
                    }
                    None => return Verdict::Damaged("header names a key named otherwise".into()),
                };
                (
                    header.claims(&key),
                    version,
                    &buf[HEADER_LEN..HEADER_LEN + bb],
                )
            }
        };
        if let Some(key) = &named {
            if !layout::is_hex_block_path(fan, name, key) {
                return Verdict::Damaged("not in its key's fan-out directory".into());
            }
        }
        if !claims.names_key {
            return Verdict::Damaged("header names another key".into());
        }
        // An extent store's block is shorter than the block size.
        if claims.payload_len == 0 || claims.payload_len > bb as u64 {
            return Verdict::Damaged(format!("header says {} bytes", claims.payload_len));
        }
        let payload = &payload[..claims.payload_len as usize];
        if fps.stale.contains(&claims.namespace_fp) {
            return Verdict::Stale;
        }
        if !fps.current.contains(&claims.namespace_fp) {
            return Verdict::Foreign(format!(
                "a block of another namespace (fingerprint {:016x})",
                claims.namespace_fp
            ));
        }
        if !claims.payload_sum.matches(payload) {
            return Verdict::Damaged("payload checksum mismatch".into());
        }
        Verdict::Good { version }
    }
}

/// What [`remove_if_same`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Removal {
    /// The file examined is gone.
    Removed,
    /// Another file was at the name by then (a newer store): it is kept.
    Replaced,
    /// Nothing was at the name any more.
    Vanished,
}

/// Removes the file at `path` only if it is still the file `examined`: it is
/// first renamed aside (atomic), then compared, and a file that is not the
/// one examined (a block another process published there since) goes back
/// unless a newer one took the name again. Meanwhile the name is empty: a
/// load racing the removal is a miss, never another block's bytes.
pub fn remove_if_same(path: &Path, examined: FileStamp) -> std::io::Result<Removal> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let aside = layout::tmp_path(path, std::process::id(), n);
    match std::fs::rename(path, &aside) {
        Ok(()) => {}
        Err(e) if io::is_missing(&e) => return Ok(Removal::Vanished),
        Err(e) => return Err(e),
    }
    let taken = io::lstat(&aside)?;
    if taken.dev == examined.dev && taken.ino == examined.ino {
        std::fs::remove_file(&aside)?;
        return Ok(Removal::Removed);
    }
    match io::rename_noreplace(&aside, path) {
        Ok(()) => Ok(Removal::Replaced),
        Err(e) => {
            let _ = std::fs::remove_file(&aside);
            match e.raw_os_error() {
                Some(libc::EEXIST) => Ok(Removal::Replaced),
                _ => Err(e),
            }
        }
    }
}
