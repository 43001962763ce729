//! Where block bytes live. The engine (index, jobs, workers) is the same for
//! every backend; a backend only moves one block between a byte slice (the
//! engine hands it a primary row) and its storage, on a worker thread, outside
//! the index lock. It knows nothing of rows or of the primary buffer, so it can
//! be tested with plain buffers.
//!
//! The core trait, [`Backend`], is what every backend does; what only some
//! do is a capability trait of its own (`capabilities`), which the engine
//! reaches through the core trait's accessors.

mod capabilities;
pub(crate) mod disk;
pub(crate) mod memory;
pub(crate) mod persist;
mod prefault;
#[cfg(feature = "redis-backend")]
pub(crate) mod redis;

#[cfg(feature = "test-hooks")]
pub(crate) use self::capabilities::TestSeams;
pub(crate) use self::capabilities::{
    Batches, Discards, EachBlock, LoadJob, Persistence, Probes, SharedTenant, StoreJob, Touches,
    Unwatched, WatchedIo,
};
/// The checksums live below the backends (`crate::checksum`, shared with
/// sealing); the backends name them by this path.
pub(crate) use crate::checksum;
use crate::error::Result;
pub(crate) use crate::primary::Row;

/// One block's storage operations, and the way to the capabilities a backend
/// has beyond them. `slot` is the block's slot number in the index (unique
/// among live blocks, reused after release); `key` is its key.
///
/// A capability accessor returns `Some(self)` in a backend that implements
/// that capability's trait, and its answer never changes once the backend
/// is open: the engine may ask at open (to track releases, to start a
/// watchdog) and again at each use, and must get the same answer.
pub(crate) trait Backend: Send + Sync {
    /// Copies `block` (one block's bytes) into the block's storage; returns
    /// the bytes written (0 if the storage already held the block).
    fn store(&self, slot: u32, key: &[u8], block: &[u8]) -> Result<u64>;

    /// Copies the block's stored bytes into `dst` (one block). A `Corrupt` or
    /// `NotFound` error means the stored block is gone: the tier forgets the key.
    /// Other errors are transient and keep it, up to
    /// `MAX_TRANSIENT_LOAD_FAILURES` in a row, not counting those marked
    /// [`Error::unsent`](crate::error::Error::unsent) (failed at once, storage
    /// not asked). A backend never condemns
    /// stored data on what it observed in `dst` alone: the engine may be
    /// writing it (see `tier_submit_load`).
    fn load(&self, slot: u32, key: &[u8], dst: &mut [u8]) -> Result<()>;

    /// Whether blocks may be shorter than the tier's block size (extent
    /// jobs): `store` is then given 1 to `block_bytes` bytes and keeps their
    /// length with the block, and `load` fails with
    /// [`Error::wrong_length`](crate::error::Error::wrong_length), copying
    /// nothing, when `dst` is not that length.
    fn stores_extents(&self) -> bool {
        false
    }

    /// Whether blocks are sealed with a seal key (disk and Redis with
    /// `seal_key`).
    fn seals(&self) -> bool {
        false
    }

    /// One line for logs and `tier_describe`.
    fn describe(&self) -> String;

    /// The storage client's own counters for the tier's metrics, as (name,
    /// help, value): the Redis client's reconnections, redirections and
    /// slot-map reads; none where no client stands between (memory, disk).
    fn counters(&self) -> Vec<(&'static str, &'static str, u64)> {
        Vec::new()
    }

    /// Bytes of storage this backend holds resident in the process's memory
    /// (the memory arena's populated pages; 0 for storage elsewhere), kept
    /// here because every tier reports it (`tier_stats_t.resident_bytes`).
    fn resident_bytes(&self) -> u64 {
        0
    }

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

    /// The tier is being freed in a forked child, where it is never used
    /// again and is not dropped (see `Tier::abandon_in_forked_child`): this
    /// is `Drop` there, asked of every backend. Lets go of the child's share
    /// of resources where that is safe: no lock may be taken, and nothing may
    /// be left dangling (a pointer into unmapped memory, a descriptor number
    /// that a later `open` could reuse).
    fn release_in_forked_child(&self) {}

    /// Stores and loads a task's blocks together ([`Batches`]) rather than
    /// one by one.
    fn batches(&self) -> Option<&dyn Batches> {
        None
    }

    /// Keys absent from the index may be in storage and are probed
    /// ([`Probes`]).
    fn probes(&self) -> Option<&dyn Probes> {
        None
    }

    /// Storage keeps a recency of its own that touches reach ([`Touches`]).
    fn touches(&self) -> Option<&dyn Touches> {
        None
    }

    /// Released blocks are handed over for deletion ([`Discards`]).
    fn discards(&self) -> Option<&dyn Discards> {
        None
    }

    /// Storage outlives the tier ([`Persistence`]).
    fn persistence(&self) -> Option<&dyn Persistence> {
        None
    }

    /// Storage calls may hang and are watched against a deadline
    /// ([`WatchedIo`]).
    fn watched_io(&self) -> Option<&dyn WatchedIo> {
        None
    }

    /// Test seams ([`TestSeams`]).
    #[cfg(feature = "test-hooks")]
    fn test_seams(&self) -> Option<&dyn TestSeams> {
        None
    }
}

/// Backends are tested on plain byte buffers, without an engine or a primary
/// buffer: the seam is a slice.
#[cfg(test)]
mod tests {
    use super::disk::DiskBackend;
    use super::memory::MemoryBackend;
    use super::{Backend, Persistence};
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

    /// Which capabilities each backend offers: the engine's choices (a
    /// watchdog, release tracking, probes, batches) follow from these.
    fn capabilities(backend: &dyn Backend) -> [bool; 6] {
        [
            backend.batches().is_some(),
            backend.probes().is_some(),
            backend.touches().is_some(),
            backend.discards().is_some(),
            backend.persistence().is_some(),
            backend.watched_io().is_some(),
        ]
    }

    #[test]
    fn memory_backend_has_no_capability_beyond_the_core() {
        let memory = MemoryBackend::new(BB, 4, crate::config::Prefault::Off).unwrap();
        assert_eq!(capabilities(&memory), [false; 6]);
        #[cfg(feature = "test-hooks")]
        assert!(memory.test_seams().is_none());
    }

    #[test]
    fn persistent_arena_round_trips_and_finds_its_blocks_again() {
        use super::persist::PersistentArena;
        let dir = std::path::Path::new("/dev/shm")
            .join(format!("kvtier-backend-persist-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let open =
            || PersistentArena::open(&dir, "ns", BB, 4, crate::config::Prefault::Off).unwrap();
        let arena = open();
        assert_eq!(
            capabilities(&arena),
            [false, false, false, true, true, false]
        );
        assert!(arena.recover().unwrap().is_empty());
        round_trip(&arena);
        drop(arena);
        let arena = open();
        let mut found = arena.recover().unwrap();
        found.sort();
        assert_eq!(found, [b"alpha".to_vec(), vec![0xffu8; 120]]);
        drop(arena);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn disk_backend_probes_only_when_shared() {
        for shared in [false, true] {
            let root = std::env::temp_dir().join(format!(
                "kvtier-backend-caps-{shared}-{}",
                std::process::id()
            ));
            let _ = std::fs::remove_dir_all(&root);
            let cfg = DiskConfig {
                path: Some(root.clone()),
                shared,
                ..DiskConfig::default()
            };
            let disk = DiskBackend::open(&cfg, "", BB, 64, None).unwrap();
            assert_eq!(
                capabilities(&disk),
                [false, shared, false, true, true, true],
                "shared={shared}"
            );
            #[cfg(feature = "test-hooks")]
            {
                let seams = disk.test_seams().expect("the disk's test seams");
                assert!(seams.block_path(b"k").is_some() && seams.hang_seam().is_some());
            }
            drop(disk);
            std::fs::remove_dir_all(&root).unwrap();
        }
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
