//! What some backends can do beyond the core [`Backend`](super::Backend)
//! trait: each capability is a trait of its own, and a backend that has it
//! implements the trait and returns itself from the core trait's accessor
//! (`Backend::batches`, ...). The engine asks the accessor where it needs
//! the capability; a backend's answers are fixed when it opens.

use crate::error::{Error, ErrorKind, Result};
use crate::primary::Row;
use crate::seal::Sealer;

/// Blocks handed over a task at a time: for a network backend, one
/// pipeline instead of a round trip per block (Redis). The engine then
/// never calls `store` or `load` one block at a time.
pub(crate) trait Batches {
    /// Stores a run of one job's blocks, `(slot, key, bytes)`; `done(i, result)`
    /// is called once per block.
    fn store_batch(&self, blocks: &[(u32, &[u8], &[u8])], done: &mut dyn FnMut(usize, Result<u64>));

    /// Loads a run of one job's blocks, `(slot, key, destination)`, in order;
    /// `done(i, result)` is called per block until it returns false (the
    /// job's first failure ends its copies).
    fn load_batch(
        &self,
        blocks: &mut [(u32, &[u8], &mut [u8])],
        done: &mut dyn FnMut(usize, Result<()>) -> bool,
    );
}

/// Shared storage: keys absent from the index may exist in storage (written
/// by another process), so a lookup's unknown keys are probed (a shared disk
/// directory, a shared Redis keyspace).
///
/// Shared storage also keeps its namespace's clear generation, which every
/// process reads: `clear()` raises it, and blocks are named and checked
/// with the generation's fingerprint, so a block stored before a clear is
/// never read by a tier that knows the generation after it.
pub(crate) trait Probes {
    /// The namespace's generation as storage holds it now (0 before any
    /// clear); worker thread or `tier_new`.
    fn read_generation(&self) -> Result<u64>;

    /// The generation this tier names and checks blocks with.
    fn generation(&self) -> u64;

    /// Names and checks blocks of `generation` from now on.
    fn use_generation(&self, generation: u64);

    /// Raises the generation in storage past both its value there and this
    /// tier's, uses it, and returns it.
    fn advance_generation(&self) -> Result<u64>;

    /// Deletes, best effort and for every process, the blocks storage holds
    /// of generations before `generation` (which began at `began`: storage
    /// whose names do not tell generations apart keeps what was written
    /// since), stopping at `deadline`; how many it deleted.
    fn sweep_before(
        &self,
        generation: u64,
        began: std::time::SystemTime,
        deadline: std::time::Instant,
    ) -> Result<u64>;

    /// Asks storage whether it holds a complete block for `key` (worker
    /// thread) and hands the answer to `record`, which enters it in the index.
    /// A backend that deletes blocks calls `record` while deletion of `key` is
    /// held off, so that the answer cannot be stale by the time the index
    /// holds it (see [`Discards::discard`], which checks the index under the
    /// same exclusion).
    fn probe(&self, key: &[u8], record: &mut dyn FnMut(bool));

    /// Whether [`Probes::probe_many`] asks for many keys at once (one
    /// round trip), so that a lookup's keys are probed together rather than
    /// one per worker.
    fn probes_in_batches(&self) -> bool {
        false
    }

    /// [`Probes::probe`] for each of `keys`, `record(i, found)` once for
    /// key `i`, under the same exclusion.
    fn probe_many(&self, keys: &[Vec<u8>], record: &mut dyn FnMut(usize, bool)) {
        for (i, key) in keys.iter().enumerate() {
            self.probe(key, &mut |found| record(i, found));
        }
    }
}

/// The tiers of a namespace in shared storage that keep one clear
/// generation: every unsealed tier, or the tiers of one seal key (tenants
/// never clear each other's blocks).
pub(crate) struct SharedTenant {
    /// Mixed into the generation's fingerprint (0: unsealed).
    pub number: u64,
    /// Appended to the name of the generation's record ("" unsealed,
    /// `-<tag in hex>` sealed).
    pub mark: String,
}

impl SharedTenant {
    /// The tenant a generation record's name ends with (`mark`): the
    /// unsealed tiers' for "", a sealed tenant's for `-<tag in hex>`; None
    /// for anything else. The number is the one [`SharedTenant::of`] gives
    /// that tenant's tiers, so a tool without the seal key names its blocks'
    /// generations as they do.
    pub(crate) fn from_mark(mark: &str) -> Option<SharedTenant> {
        if mark.is_empty() {
            return Some(SharedTenant {
                number: 0,
                mark: String::new(),
            });
        }
        let hex = mark.strip_prefix('-')?;
        if hex.len() != 2 * std::mem::size_of::<crate::seal::NameTag>() {
            return None;
        }
        let mut number = [0u8; 8];
        for (at, byte) in number.iter_mut().enumerate() {
            *byte = u8::from_str_radix(hex.get(2 * at..2 * at + 2)?, 16).ok()?;
        }
        hex.bytes()
            .all(|b| b.is_ascii_hexdigit())
            .then(|| SharedTenant {
                number: u64::from_le_bytes(number),
                mark: mark.to_string(),
            })
    }

    pub(crate) fn of(seal: Option<&Sealer>, namespace_fp: u64, block_bytes: usize) -> SharedTenant {
        match seal {
            None => SharedTenant {
                number: 0,
                mark: String::new(),
            },
            Some(seal) => {
                let tag = seal.tenant_tag(namespace_fp, block_bytes);
                let mut number = [0u8; 8];
                number.copy_from_slice(&tag[..8]);
                SharedTenant {
                    number: u64::from_le_bytes(number),
                    mark: tag.iter().fold(String::from("-"), |mut s, b| {
                        s.push_str(&format!("{b:02x}"));
                        s
                    }),
                }
            }
        }
    }
}

/// Storage that keeps a recency of its own that `tier_touch` should reach
/// (a shared server's LRU).
pub(crate) trait Touches {
    /// Tells storage that the `key_len`-byte keys packed in `keys` were used
    /// (worker thread, in the background; best effort).
    fn touch(&self, keys: &[u8], key_len: usize);
}

/// Storage whose released blocks must be deleted (the index tracks the
/// blocks it evicts or clears only for such a backend).
pub(crate) trait Discards {
    /// Releases the storage of evicted or cleared blocks (a bounded batch:
    /// a job's evictions), on a worker thread, under one deadline watch; a
    /// backend with a round trip per call (Redis) sends them together. A key
    /// may have been stored again meanwhile: `is_live` tells whether it is in
    /// the index now, in which case its storage must be kept.
    fn discard(&self, released: &[(u32, Vec<u8>)], is_live: &dyn Fn(&[u8]) -> bool);
}

/// Walks a tier's readable blocks, least recently used first, calling its
/// argument with each one's slot and key (see [`Persistence::save_on_close`]).
pub(crate) type EachBlock<'a> = dyn FnMut(&mut dyn FnMut(u32, &[u8])) + 'a;

/// Storage that outlives the tier: a new tier over it starts with the
/// blocks it holds (disk, an owned Redis keyspace).
pub(crate) trait Persistence {
    /// Keys of blocks already in storage when the tier opens, oldest first.
    fn recover(&self) -> Result<Vec<Vec<u8>>>;

    /// The block of the `i`-th key [`Persistence::recover`] returned is in
    /// the index now, in `slot`: a backend that keeps blocks by slot (the
    /// persistent memory arena) serves that slot from where the block is.
    /// Called at open, before any store or load, for each key admitted.
    fn recovered_at(&self, _i: usize, _slot: u32) {}

    /// The tier is being freed cleanly: every worker joined, no job left
    /// unfinished, no storage call past its deadline, and the index lists
    /// exactly the blocks this tier stored or found. `each_block(f)` calls
    /// `f` with every readable block's slot and key, least recently used
    /// first. A backend
    /// that can record them for [`Persistence::recover`] does so (disk: the
    /// manifest); a failure is not reported.
    fn save_on_close(&self, _each_block: &mut EachBlock<'_>) {}
}

/// What a store under a deadline ([`WatchedIo::store_unless`]) may ask of
/// its job.
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
/// reads a block in pieces ([`WatchedIo::load_streamed`]): after the job is
/// reported its rows are the caller's again, so a piece reaches the row only
/// through [`LoadJob::write_row`], which refuses once the job is reported and
/// holds the report off while it copies.
pub(crate) trait LoadJob {
    /// Copies `piece` to byte `offset` of the job's row unless the job was
    /// reported; false if it was. Short, and never waits for storage.
    fn write_row(&self, offset: usize, piece: &[u8]) -> bool;

    /// The row's length: the block size, or an extent's length, which must
    /// be the stored one.
    fn row_len(&self) -> usize;
}

/// Storage calls that may hang (a device, a network file system), so the
/// engine watches them against `io_timeout_ms` (a watchdog thread reports a
/// call past it as failed and replaces its thread). A backend that enforces
/// its own deadlines (Redis) or never waits (memory) lacks it. Under a
/// deadline a call may outlive its job's report, and even the tier, so the
/// engine calls these instead of `store` and `load`.
pub(crate) trait WatchedIo {
    /// `io_timeout_ms=auto` (the option unset): the deadline this backend's
    /// storage calls get (0: none) and why, for a backend that chooses by
    /// what its storage is (disk, by file system); None takes the
    /// configuration's default for the backend.
    fn auto_io_timeout(&self) -> Option<(u32, String)> {
        None
    }

    /// `Backend::store` under a deadline: once `job.abandoned()` says true
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
    /// holds the report off while it runs.
    fn store_unless(&self, slot: u32, key: &[u8], block: Row, job: &dyn StoreJob) -> Result<u64>;

    /// Under a deadline a load must not read storage straight into the
    /// caller's row (a read that returns late would write a row whose job was
    /// reported), so the engine reads into a worker's private buffer first.
    /// A backend that can read a block in pieces says how large a piece is
    /// (a multiple of 4096) and serves such loads with
    /// [`WatchedIo::load_streamed`], so that buffer is smaller than a block
    /// and stays in the CPU's caches between the read and the copy. None
    /// (the default): a buffer of a whole block and `Backend::load`.
    fn load_piece_bytes(&self) -> Option<usize> {
        None
    }

    /// `Backend::load` a piece at a time, for a backend whose
    /// [`WatchedIo::load_piece_bytes`] is Some: reads the block through
    /// `piece` (private; its length is that piece size, or less for a
    /// smaller block), hands what each read brought to `job.write_row` in
    /// order, and verifies the whole block. `Ok(true)`: every piece is in the
    /// row and the block verified; `Ok(false)`: the job was reported
    /// meanwhile. A block that fails verification fails as with `load` (the
    /// row may then hold part of it, as after any failed load).
    fn load_streamed(
        &self,
        _slot: u32,
        _key: &[u8],
        _piece: &mut [u8],
        _job: &dyn LoadJob,
    ) -> Result<bool> {
        Err(Error::new(
            ErrorKind::Io,
            "this backend does not read blocks in pieces",
        ))
    }

    /// The tier was freed while `calls` storage calls were stuck past their
    /// deadline: this backend lives on (in those threads) until they return.
    /// A backend holding a lock others can see says so when they ask (the
    /// disk directory's lock).
    fn left_behind(&self, _calls: usize) {}
}

/// Test seams (feature `test-hooks`, off in the shipped library): faults
/// and inspection a test drives through `Tier`'s hooks.
#[cfg(feature = "test-hooks")]
pub(crate) trait TestSeams {
    /// While set, writes fail as if the device were full.
    fn simulate_full_device(&self, full: bool);

    /// Where the block of `key` is stored (a backend of files).
    fn block_path(&self, _key: &[u8]) -> Option<std::path::PathBuf> {
        None
    }

    /// Storage calls that hang where a test says (disk only).
    fn hang_seam(&self) -> Option<&std::sync::Arc<super::disk::hang::HangSeam>> {
        None
    }
}
