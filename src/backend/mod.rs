//! Where block bytes live. The engine (index, jobs, workers) is the same for
//! every backend; a backend only moves one block between a byte slice (the
//! engine hands it a primary row) and its storage, on a worker thread, outside
//! the index lock. It knows nothing of rows or of the primary buffer, so it can
//! be tested with plain buffers.

pub(crate) mod disk;
pub(crate) mod memory;
mod prefault;
#[cfg(feature = "redis-backend")]
pub(crate) mod redis;

/// The checksums live below the backends (`crate::checksum`, shared with
/// sealing); the backends name them by this path.
pub(crate) use crate::checksum;
use crate::error::Result;
pub(crate) use crate::primary::Row;

/// What a store under a deadline ([`Backend::store_unless`]) may ask of its
/// job.
pub(crate) trait StoreJob {
    /// True once the job was reported (failed at a deadline).
    fn abandoned(&self) -> bool;
    /// Runs `read` over the bytes of `row` (the job's row) unless the job was
    /// reported; false if it was. The job cannot be reported while `read`
    /// runs, so it must be short and must not wait for storage.
    fn read_row(&self, row: Row, read: &mut dyn FnMut(&[u8])) -> bool;
}

/// A store whose row outlives the call (no deadline, so `tier_free` waits
/// for it; or a test's buffer): never abandoned, the row always readable.
pub(crate) struct Unwatched;

impl StoreJob for Unwatched {
    fn abandoned(&self) -> bool {
        false
    }
    fn read_row(&self, row: Row, read: &mut dyn FnMut(&[u8])) -> bool {
        // SAFETY: by this type's contract, the row outlives the call.
        read(unsafe { row.bytes() });
        true
    }
}

/// A load job as its backend sees it under a deadline, when the backend
/// reads a block in pieces ([`Backend::load_streamed`]): after the job is
/// reported its rows are the caller's again, so a piece reaches the row only
/// through [`LoadJob::write_row`], which refuses once the job is reported and
/// holds the report off while it copies.
pub(crate) trait LoadJob {
    /// Copies `piece` to byte `offset` of the job's row unless the job was
    /// reported; false if it was. Short, and never waits for storage.
    fn write_row(&self, offset: usize, piece: &[u8]) -> bool;
}

/// Walks a tier's readable keys, least recently used first, calling its
/// argument with each (see [`Backend::save_on_close`]).
pub(crate) type EachBlock<'a> = dyn FnMut(&mut dyn FnMut(&[u8])) + 'a;

/// One block's storage operations. `slot` is the block's slot number in the
/// index (unique among live blocks, reused after release); `key` is its key.
pub(crate) trait Backend: Send + Sync {
    /// Copies `block` (one block's bytes) into the block's storage; returns
    /// the bytes written (0 if the storage already held the block).
    fn store(&self, slot: u32, key: &[u8], block: &[u8]) -> Result<u64>;

    /// [`Backend::store`] under a deadline: once `job.abandoned()` says true
    /// (the job was reported failed because a storage call missed its
    /// deadline), the block must never become readable. A backend that
    /// publishes blocks (disk) checks before publishing and withdraws a
    /// publication that raced with the report.
    ///
    /// `block` is the caller's row, not borrowed: once the job is reported
    /// the caller may reuse it, and once the tier is freed unmap it, while
    /// this call still runs (a thread stuck on a hung device is left behind).
    /// So the backend reads it (a copy, a checksum) only inside
    /// [`StoreJob::read_row`], which refuses once the job is reported and
    /// holds the report off while it runs. (The default does the whole store
    /// there: right for a backend whose calls cannot hang.)
    fn store_unless(&self, slot: u32, key: &[u8], block: Row, job: &dyn StoreJob) -> Result<u64> {
        let mut stored = None;
        if !job.read_row(block, &mut |row| stored = Some(self.store(slot, key, row))) {
            return Err(crate::error::Error::new(
                crate::error::ErrorKind::Io,
                "not stored: the job was reported failed at its I/O deadline",
            ));
        }
        stored.expect("read_row ran it")
    }

    /// Whether storage calls may hang (a device, a network file system), so
    /// the engine watches them against `io_timeout_ms`. A backend that
    /// enforces its own deadlines (Redis) or never waits (memory) says no.
    fn needs_watchdog(&self) -> bool {
        false
    }

    /// `io_timeout_ms=auto` (the option unset): the deadline this backend's
    /// storage calls get (0: none) and why, for a backend that chooses by
    /// what its storage is (disk, by file system); None takes the
    /// configuration's default for the backend.
    fn auto_io_timeout(&self) -> Option<(u32, String)> {
        None
    }

    /// Copies the block's stored bytes into `dst` (one block). A `Corrupt` or
    /// `NotFound` error means the stored block is gone: the tier forgets the key.
    /// Other errors are transient and keep it, up to
    /// `MAX_TRANSIENT_LOAD_FAILURES` in a row, not counting those marked
    /// [`Error::unsent`](crate::error::Error::unsent) (failed at once, storage
    /// not asked). A backend never condemns
    /// stored data on what it observed in `dst` alone: the engine may be
    /// writing it (see `tier_submit_load`).
    fn load(&self, slot: u32, key: &[u8], dst: &mut [u8]) -> Result<()>;

    /// Under a deadline a load must not read storage straight into the
    /// caller's row (a read that returns late would write a row whose job was
    /// reported), so the engine reads into a worker's private buffer first.
    /// A backend that can read a block in pieces says how large a piece is
    /// (a multiple of 4096) and serves such loads with
    /// [`Backend::load_streamed`], so that buffer is smaller than a block and
    /// stays in the CPU's caches between the read and the copy. None (the
    /// default): a buffer of a whole block and [`Backend::load`].
    fn load_piece_bytes(&self) -> Option<usize> {
        None
    }

    /// [`Backend::load`] a piece at a time, for a backend whose
    /// [`Backend::load_piece_bytes`] is Some: reads the block through `piece`
    /// (private; its length is that piece size, or less for a smaller block),
    /// hands what each read brought to `job.write_row` in order, and verifies
    /// the whole block. `Ok(true)`: every piece is in the row and the block
    /// verified; `Ok(false)`: the job was reported meanwhile. A block that
    /// fails verification fails as with `load` (the row may then hold part
    /// of it, as after any failed load).
    fn load_streamed(
        &self,
        _slot: u32,
        _key: &[u8],
        _piece: &mut [u8],
        _job: &dyn LoadJob,
    ) -> Result<bool> {
        Err(crate::error::Error::new(
            crate::error::ErrorKind::Io,
            "this backend does not read blocks in pieces",
        ))
    }

    /// Whether the engine should hand this backend a task's blocks together
    /// ([`Backend::store_batch`], [`Backend::load_batch`]) rather than one by
    /// one: for a network backend, one pipeline instead of a round trip per
    /// block.
    fn batches(&self) -> bool {
        false
    }

    /// Stores a run of one job's blocks, `(slot, key, bytes)`; `done(i, result)`
    /// is called once per block.
    fn store_batch(
        &self,
        blocks: &[(u32, &[u8], &[u8])],
        done: &mut dyn FnMut(usize, Result<u64>),
    ) {
        for (i, &(slot, key, block)) in blocks.iter().enumerate() {
            done(i, self.store(slot, key, block));
        }
    }

    /// Loads a run of one job's blocks, `(slot, key, destination)`, in order;
    /// `done(i, result)` is called per block until it returns false (the
    /// job's first failure ends its copies).
    fn load_batch(
        &self,
        blocks: &mut [(u32, &[u8], &mut [u8])],
        done: &mut dyn FnMut(usize, Result<()>) -> bool,
    ) {
        for (i, (slot, key, dst)) in blocks.iter_mut().enumerate() {
            if !done(i, self.load(*slot, key, dst)) {
                break;
            }
        }
    }

    /// Whether storage keeps a recency of its own that `tier_touch` should
    /// reach (a shared server's LRU).
    fn forwards_touches(&self) -> bool {
        false
    }

    /// Tells storage that the `key_len`-byte keys packed in `keys` were used
    /// (worker thread, in the background; best effort).
    fn touch(&self, _keys: &[u8], _key_len: usize) {}

    /// Whether released blocks must be handed to [`Backend::discard`].
    fn wants_discards(&self) -> bool {
        false
    }

    /// Releases the storage of evicted or cleared blocks (a bounded batch:
    /// a job's evictions), on a worker thread, under one deadline watch; a
    /// backend with a round trip per call (Redis) sends them together. A key
    /// may have been stored again meanwhile: `is_live` tells whether it is in
    /// the index now, in which case its storage must be kept.
    fn discard(&self, _released: &[(u32, Vec<u8>)], _is_live: &dyn Fn(&[u8]) -> bool) {}

    /// Keys of blocks already in storage when the tier opens, oldest first.
    fn recover(&self) -> Result<Vec<Vec<u8>>> {
        Ok(Vec::new())
    }

    /// The tier is being freed cleanly: every worker joined, no job left
    /// unfinished, no storage call past its deadline, and the index lists
    /// exactly the blocks this tier stored or found. `each_block(f)` calls
    /// `f` with every readable key, least recently used first. A backend
    /// that can record them for [`Backend::recover`] does so (disk: the
    /// manifest); a failure is not reported.
    fn save_on_close(&self, _each_block: &mut EachBlock<'_>) {}

    /// Whether keys absent from the index may exist in storage (written by
    /// another process) and must be probed.
    fn probes_absent_keys(&self) -> bool {
        false
    }

    /// Asks storage whether it holds a complete block for `key` (worker
    /// thread) and hands the answer to `record`, which enters it in the index.
    /// A backend that deletes blocks calls `record` while deletion of `key` is
    /// held off, so that the answer cannot be stale by the time the index
    /// holds it (see [`Backend::discard`], which checks the index under the
    /// same exclusion).
    fn probe(&self, _key: &[u8], record: &mut dyn FnMut(bool)) {
        record(false)
    }

    /// Whether [`Backend::probe_many`] asks for many keys at once (one
    /// round trip), so that a lookup's keys are probed together rather than
    /// one per worker.
    fn probes_in_batches(&self) -> bool {
        false
    }

    /// [`Backend::probe`] for each of `keys`, `record(i, found)` once for
    /// key `i`, under the same exclusion.
    fn probe_many(&self, keys: &[Vec<u8>], record: &mut dyn FnMut(usize, bool)) {
        for (i, key) in keys.iter().enumerate() {
            self.probe(key, &mut |found| record(i, found));
        }
    }

    /// Bytes of storage this backend holds resident in the process's memory
    /// (the memory arena's populated pages; 0 for storage elsewhere).
    fn resident_bytes(&self) -> u64 {
        0
    }

    /// One line for logs and `tier_describe`.
    fn describe(&self) -> String;

    /// Below this many bytes per task a job is not split across workers: for
    /// memory copies, splitting costs more than it saves; for files, every
    /// block has a latency of its own worth overlapping.
    fn min_task_bytes(&self) -> usize {
        4 << 20
    }

    /// [`Backend::min_task_bytes`] for a store job that evicts nothing: all
    /// its blocks add to what storage holds, as while a tier fills up.
    fn min_growing_task_bytes(&self) -> usize {
        self.min_task_bytes()
    }

    /// The tier was freed while `calls` storage calls were stuck past their
    /// deadline: this backend lives on (in those threads) until they return.
    /// A backend holding a lock others can see says so when they ask (the
    /// disk directory's lock).
    fn left_behind(&self, _calls: usize) {}

    /// Test seam: while set, writes fail as if the device were full.
    #[cfg(feature = "test-hooks")]
    fn simulate_full_device(&self, _full: bool) {}

    /// Test seam: where the block of `key` is stored (disk only).
    #[cfg(feature = "test-hooks")]
    fn block_path(&self, _key: &[u8]) -> Option<std::path::PathBuf> {
        None
    }

    /// Test seam: storage calls that hang where a test says (disk only).
    #[cfg(feature = "test-hooks")]
    fn hang_seam(&self) -> Option<&std::sync::Arc<disk::hang::HangSeam>> {
        None
    }

    /// The tier is being freed in a forked child, where it is never used
    /// again and is not dropped (see `Tier::abandon_in_forked_child`). Lets go
    /// of the child's share of resources where that is safe: no lock may be
    /// taken, and nothing may be left dangling (a pointer into unmapped
    /// memory, a descriptor number that a later `open` could reuse).
    fn release_in_forked_child(&self) {}
}

/// Backends are tested on plain byte buffers, without an engine or a primary
/// buffer: the seam is a slice.
#[cfg(test)]
mod tests {
    use super::disk::DiskBackend;
    use super::memory::MemoryBackend;
    use super::Backend;
    use crate::config::DiskConfig;
    use crate::ErrorKind;

    const BB: usize = 4096;

    fn block(seed: u8) -> Vec<u8> {
        (0..BB).map(|i| (i as u8).wrapping_mul(31) ^ seed).collect()
    }

    fn round_trip(backend: &dyn Backend) {
        for (slot, key, seed) in [(0, &b"alpha"[..], 1), (3, &[0xffu8; 120][..], 2)] {
            backend.store(slot, key, &block(seed)).unwrap();
            let mut out = vec![0u8; BB];
            backend.load(slot, key, &mut out).unwrap();
            assert_eq!(out, block(seed));
        }
    }

    #[test]
    fn memory_backend_round_trips_plain_buffers() {
        round_trip(&MemoryBackend::new(BB, 4, crate::config::Prefault::Off).unwrap());
    }

    #[test]
    fn disk_backend_round_trips_plain_buffers_and_verifies() {
        let root = std::env::temp_dir().join(format!("kvtier-backend-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let cfg = DiskConfig {
            path: Some(root.clone()),
            ..DiskConfig::default()
        };
        let disk = DiskBackend::open(&cfg, "", BB, 64, None).unwrap();
        round_trip(&disk);
        // A load under another key finds no file; a damaged file is corrupt.
        let mut out = vec![0u8; BB];
        let err = disk.load(0, b"other", &mut out).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NotFound);
        let recovered = disk.recover().unwrap();
        assert_eq!(recovered.len(), 2);
        let file = std::fs::read_dir(&root)
            .unwrap()
            .flatten()
            .flat_map(|ns| std::fs::read_dir(ns.path()).unwrap().flatten())
            .filter(|e| e.path().is_dir())
            .flat_map(|fan| std::fs::read_dir(fan.path()).unwrap().flatten())
            .map(|e| e.path())
            .find(|p| {
                p.to_string_lossy()
                    .ends_with(&format!("{}.kvb", "616c706861"))
            })
            .expect("the block file of \"alpha\"");
        let mut bytes = std::fs::read(&file).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        std::fs::write(&file, &bytes).unwrap();
        let err = disk.load(0, b"alpha", &mut out).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Corrupt, "{err}");
        drop(disk);
        std::fs::remove_dir_all(&root).unwrap();
    }
}
