//! The store journal: the keys of the blocks this run published, in the
//! order it published them, appended to `.order-journal` one write per
//! store. It is an order hint like `.order-hint` (see `manifest`), for the
//! scan after a crash: a block file the journal names is placed by its last
//! entry and its inode is not read, so a crash of a tier that never opened
//! from a manifest (a first fill, a crash loop) reopens as fast as one that
//! did. It proves nothing about what is on disk: a name with no file is
//! nothing, and a file cut short is found out by its first load.
//!
//! ```text
//! offset  size  field
//!      0     8  magic "KVTIERJ\0"
//!      8     4  journal version (1)
//!     12     4  flags (0)
//!     16     8  namespace fingerprint
//!     24     8  block size in bytes
//!     32     …  entries, oldest first: key length (1 byte, 1..=128), key
//! ```
//!
//! Rules:
//! - Kept only by non-shared, unsealed tiers (as the manifest): one process
//!   writes it, under the directory lock, and a sealed tier's keys are
//!   written nowhere.
//! - One `write` per published block, under a mutex: a process that dies
//!   loses no entry the kernel accepted, and entries never interleave. A
//!   machine that loses power may lose the tail or leave zeros there; the
//!   reader stops at the first entry that is not whole.
//! - Bounded: when the journal holds as many entries as the tier has
//!   blocks, it becomes `.order-journal.old` (replacing the older one) and
//!   a new one starts. The two hold at least the last capacity's worth of
//!   stores; a block still on disk that neither names was stored before
//!   them and stayed resident since, so it was in use: the scan stats it and
//!   places it among the newest, which is where its use put it.
//! - Older than any manifest: an open that finds a manifest deletes both
//!   journals (they describe the run before that clean close); a clean close
//!   that writes a manifest deletes them after it. Without a manifest, the
//!   next run appends to the journal it found.
//! - Records stores only: the LRU effect of loads and touches since the
//!   last clean close is lost in a crash (the manifest's order, and the
//!   hint kept from it, include them).

use super::io;
use crate::key::MAX_KEY_LEN;
use crate::sync::Mutex;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

pub(super) const JOURNAL: &str = ".order-journal";
/// The previous generation (see the module's doc).
pub(super) const JOURNAL_OLD: &str = ".order-journal.old";
const MAGIC: [u8; 8] = *b"KVTIERJ\0";
const VERSION: u32 = 1;
const HEAD_LEN: usize = 32;

/// The head of this tier's journals: files with another head (another
/// namespace, block size or version) are not read, and are replaced.
pub(super) fn head(ns_fp: u64, block_bytes: usize) -> [u8; HEAD_LEN] {
    let mut head = [0u8; HEAD_LEN];
    head[0..8].copy_from_slice(&MAGIC);
    head[8..12].copy_from_slice(&VERSION.to_le_bytes());
    head[16..24].copy_from_slice(&ns_fp.to_le_bytes());
    head[24..32].copy_from_slice(&(block_bytes as u64).to_le_bytes());
    head
}

/// The entries of a journal's bytes, oldest first, up to the first one
/// that is not whole; None if the head is not `head`.
fn parse(bytes: &[u8], head: &[u8; HEAD_LEN]) -> Option<Vec<Vec<u8>>> {
    let entries = bytes.strip_prefix(&head[..])?;
    let mut keys = Vec::new();
    let mut at = 0;
    while let Some(&len) = entries.get(at) {
        let len = len as usize;
        let Some(key) = entries.get(at + 1..at + 1 + len) else {
            break;
        };
        if len == 0 || len > MAX_KEY_LEN {
            break;
        }
        keys.push(key.to_vec());
        at += 1 + len;
    }
    Some(keys)
}

/// What the journals in a directory say.
#[derive(Default)]
pub(super) struct Journaled {
    /// Keys oldest first: the older generation's, then the current one's
    /// (a key stored twice appears twice; its last entry counts).
    pub keys: Vec<Vec<u8>>,
    /// Entries of the current generation, which a new run continues.
    pub current: usize,
    /// Its length up to the end of its last whole entry (where a new run
    /// appends, a torn tail cut off); 0 if there is none to continue.
    pub current_len: u64,
}

/// Reads both generations of the journal in `dir` (missing or foreign
/// files read as empty).
pub(super) fn read(dir: &Path, head: &[u8; HEAD_LEN]) -> Journaled {
    let entries = |name: &str| {
        io::read_regular(&dir.join(name))
            .ok()
            .and_then(|bytes| parse(&bytes, head))
            .unwrap_or_default()
    };
    let mut keys = entries(JOURNAL_OLD);
    let current = entries(JOURNAL);
    let n = current.len();
    let current_len = match n {
        0 => 0,
        _ => (HEAD_LEN + current.iter().map(|k| 1 + k.len()).sum::<usize>()) as u64,
    };
    keys.extend(current);
    Journaled {
        keys,
        current: n,
        current_len,
    }
}

/// Deletes both generations (an open found a manifest, or a close wrote
/// one): errors are ignored, as a journal left behind is only read after a
/// crash, and only for order.
pub(super) fn remove(dir: &Path) {
    for name in [JOURNAL, JOURNAL_OLD] {
        let _ = std::fs::remove_file(dir.join(name));
    }
}

/// The journal a running tier appends to.
pub(super) struct Journal {
    dir: PathBuf,
    head: [u8; HEAD_LEN],
    /// Entries per generation: the tier's capacity in blocks.
    generation: usize,
    state: Mutex<State>,
    /// Set in a forked child, where the mutex may be held by a parent
    /// thread that does not exist: the child never takes it.
    stopped: AtomicBool,
}

struct State {
    /// None: journaling stopped (a write failed; the scan after a crash
    /// stats what the journal misses).
    file: Option<std::fs::File>,
    /// Entries in the current generation.
    entries: usize,
}

impl Journal {
    /// Continues the current generation `found` (as `read` found it), else
    /// starts a new one. None if no journal can be written (the tier works
    /// without).
    pub(super) fn open(
        dir: &Path,
        head: [u8; HEAD_LEN],
        generation: usize,
        found: &Journaled,
    ) -> Option<Journal> {
        let path = dir.join(JOURNAL);
        let continued = (found.current > 0)
            .then(|| Self::continue_at(&path, found.current_len))
            .flatten();
        let (file, entries) = match continued {
            Some(file) => (file, found.current),
            None => (Self::start(&path, &head).ok()?, 0),
        };
        Some(Journal {
            dir: dir.to_path_buf(),
            head,
            generation: generation.max(1),
            state: Mutex::new(State {
                file: Some(file),
                entries,
            }),
            stopped: AtomicBool::new(false),
        })
    }

    /// The journal at `path` opened for appending after its last whole
    /// entry, which ends at `whole` (a torn tail is cut off, so new entries
    /// are readable).
    fn continue_at(path: &Path, whole: u64) -> Option<std::fs::File> {
        // O_NONBLOCK: something other than the file `read` read, put there
        // since (a FIFO), must not block the open; on a regular file it
        // changes nothing.
        let fd = io::open(path, libc::O_WRONLY | libc::O_APPEND | libc::O_NONBLOCK, 0).ok()?;
        let now = io::fstat(&fd).ok()?;
        if !now.is_regular() || now.len < whole {
            return None;
        }
        let file = std::fs::File::from(fd);
        file.set_len(whole).ok()?;
        Some(file)
    }

    /// A new, empty generation at `path` (replacing what is there).
    fn start(path: &Path, head: &[u8; HEAD_LEN]) -> std::io::Result<std::fs::File> {
        let _ = std::fs::remove_file(path);
        let file = std::fs::File::from(io::open(
            path,
            libc::O_WRONLY | libc::O_APPEND | libc::O_CREAT | libc::O_EXCL,
            0o600,
        )?);
        std::io::Write::write_all(&mut &file, head)?;
        Ok(file)
    }

    /// Appends `key` (a block just published). A failure stops the journal.
    pub(super) fn record(&self, key: &[u8]) {
        if self.stopped.load(Ordering::Relaxed) || key.is_empty() || key.len() > MAX_KEY_LEN {
            return;
        }
        let mut entry = [0u8; 1 + MAX_KEY_LEN];
        entry[0] = key.len() as u8;
        entry[1..1 + key.len()].copy_from_slice(key);
        let mut state = self.state.lock();
        if state.entries >= self.generation {
            state.file = self.rotate();
            state.entries = 0;
        }
        let Some(file) = &state.file else { return };
        // One write: an entry is in the kernel whole or not at all (a
        // regular file's write is not cut short but by a full device).
        match std::io::Write::write(&mut &*file, &entry[..1 + key.len()]) {
            Ok(n) if n == 1 + key.len() => state.entries += 1,
            _ => state.file = None,
        }
    }

    /// The current generation becomes the old one, and a new one starts.
    fn rotate(&self) -> Option<std::fs::File> {
        std::fs::rename(self.dir.join(JOURNAL), self.dir.join(JOURNAL_OLD)).ok()?;
        Self::start(&self.dir.join(JOURNAL), &self.head).ok()
    }

    /// Never touches the journal again (a forked child's copy).
    pub(super) fn stop(&self) {
        self.stopped.store(true, Ordering::Relaxed);
    }

    /// Stops the journal and deletes both generations (a clean close wrote
    /// a manifest, which has a newer order).
    pub(super) fn remove(&self) {
        self.stop();
        self.state.lock().file = None;
        remove(&self.dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_stops_at_the_first_entry_that_is_not_whole() {
        let head = head(7, 4096);
        let mut bytes = head.to_vec();
        for key in [&b"a"[..], b"bc", b"def"] {
            bytes.push(key.len() as u8);
            bytes.extend_from_slice(key);
        }
        let whole = bytes.len();
        assert_eq!(
            parse(&bytes, &head).unwrap(),
            vec![b"a".to_vec(), b"bc".to_vec(), b"def".to_vec()]
        );
        // A torn tail: a length with too few bytes after it.
        bytes.extend_from_slice(&[5, b'x']);
        assert_eq!(parse(&bytes, &head).unwrap().len(), 3);
        // Zeros (a power loss): a zero length ends it.
        bytes.truncate(whole);
        bytes.extend_from_slice(&[0, 0, 0, 1, b'z']);
        assert_eq!(parse(&bytes, &head).unwrap().len(), 3);
        // Another namespace's journal is not read.
        assert!(parse(&bytes, &super::head(8, 4096)).is_none());
    }

    #[test]
    fn a_journal_rotates_at_its_generation_and_continues_across_runs() {
        let dir = std::env::temp_dir().join(format!("kvtier-journal-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).unwrap();
        let head = head(1, 4096);
        let j = Journal::open(&dir, head, 3, &Journaled::default()).unwrap();
        for k in 0..5u8 {
            j.record(&[b'k', k]);
        }
        drop(j);
        let r = read(&dir, &head);
        let names: Vec<u8> = r.keys.iter().map(|k| k[1]).collect();
        assert_eq!(names, vec![0, 1, 2, 3, 4]);
        assert_eq!(r.current, 2);
        // A torn tail left by a power loss is cut before new entries.
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(dir.join(JOURNAL))
            .unwrap();
        std::io::Write::write_all(&mut file, &[9, b'x']).unwrap();
        drop(file);
        let j = Journal::open(&dir, head, 3, &read(&dir, &head)).unwrap();
        j.record(b"k\x05");
        j.record(b"k\x06");
        drop(j);
        let r = read(&dir, &head);
        let names: Vec<u8> = r.keys.iter().map(|k| k[1]).collect();
        // Generation of 3: [3, 4, 5] became old, [6] is current.
        assert_eq!(names, vec![3, 4, 5, 6]);
        assert_eq!(r.current, 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_fifo_or_directory_in_the_journals_place_never_blocks_the_open() {
        let dir = std::env::temp_dir().join(format!("kvtier-journal-odd-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).unwrap();
        let head = head(1, 4096);
        let fifo = std::ffi::CString::new(dir.join(JOURNAL).to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        assert!(read(&dir, &head).keys.is_empty());
        // Told it has entries to continue (as if read before the swap): the
        // FIFO is neither waited on nor written; a new journal replaces it.
        let as_if_read = Journaled {
            keys: Vec::new(),
            current: 5,
            current_len: 100,
        };
        let j = Journal::open(&dir, head, 8, &as_if_read).expect("a new journal");
        j.record(b"k");
        drop(j);
        assert_eq!(read(&dir, &head).keys, vec![b"k".to_vec()]);
        // A directory there: no journal (the tier works without one).
        std::fs::remove_file(dir.join(JOURNAL)).unwrap();
        std::fs::create_dir(dir.join(JOURNAL)).unwrap();
        assert!(Journal::open(&dir, head, 8, &Journaled::default()).is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
