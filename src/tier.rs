//! The tier engine: validates and plans jobs under the index lock, hands the
//! copies to workers, and completes jobs (index update, unpin, result).
//!
//! Locks: `state` (index and load dependencies) and the completion queue are
//! never held together, and no byte is copied under either.

use crate::backend::{disk::DiskBackend, memory::MemoryBackend, Backend};
use crate::completion::Completions;
use crate::config::{BackendKind, TierConfig};
use crate::error::{alloc_error, bail, try_reserve, try_vec, Error, ErrorKind, Result};
use crate::fork;
use crate::index::{try_long_tail, Index, LookupState, SlotState, INLINE_KEY};
use crate::jobs::{Item, Job, JobKind, JobResult, Task};
use crate::key::{check_keys, count_keys, KeyHasher};
use crate::primary::PrimaryBuffer;
use crate::stats::{Counters, Stats};
use crate::workers::{Lane, Work, WorkQueue};
use hashlink::LruCache;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How many keys' probe answers (in flight, or "not in storage") are
/// remembered; beyond it the least recently asked are forgotten.
const MAX_PROBE_MEMORY: usize = 65_536;

/// A key whose loads fail this many times in a row with a transient error
/// (`Io`: descriptors, permissions, device errors) is dropped, so an engine
/// that retries a failing block does not retry it forever.
pub const MAX_TRANSIENT_LOAD_FAILURES: u32 = 3;

/// What is known about a key absent from the index but maybe in storage.
enum Probe {
    /// A worker is asking storage.
    InFlight,
    /// Storage did not have it; ask again after this instant.
    Missing(Instant),
}

/// A load waiting for stores in flight of some of its keys.
struct WaitingLoad {
    job: Arc<Job>,
    /// Storing slots it still waits for (with multiplicity).
    deps: usize,
}

struct State {
    index: Index,
    waiting: HashMap<u64, WaitingLoad>,
    /// Storing slot → waiting loads (wait id, key position in that load).
    waiters: HashMap<u32, Vec<(u64, u32)>>,
    next_wait_id: u64,
    /// Shared disk tiers: keys being or recently probed, the least recently
    /// asked forgotten first.
    probes: LruCache<Vec<u8>, Probe>,
    /// Keys whose latest loads failed transiently, and how many times in a
    /// row (almost always empty).
    load_failures: HashMap<Vec<u8>, u32>,
    victims: Vec<u32>,
}

struct Shared {
    primary: PrimaryBuffer,
    backend: Box<dyn Backend>,
    state: Mutex<State>,
    queue: WorkQueue,
    done: Completions,
    counters: Counters,
    io_threads: usize,
    probe_ttl: Duration,
}

/// A secondary tier over a caller's primary buffer.
///
/// Every method may be called from any thread, concurrently. Dropping the tier
/// stops the workers after their current block copy; jobs still queued are
/// abandoned, and the primary buffer is never touched again once `drop` returns.
///
/// A tier belongs to the process that built it. In a child made by `fork()`
/// (which has none of its worker threads) it is inert: fallible methods fail
/// with [`ErrorKind::Shutdown`], [`Tier::poll`], [`Tier::wait`],
/// [`Tier::drain`] and [`Tier::clear`] return at once having done nothing, and
/// dropping it releases only what is safe (see `Drop`). Build a new tier in
/// the child; the parent's tier is unaffected. [`Tier::check_process`] tells.
pub struct Tier {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    /// `fork::generation()` when the tier was built: a different value now
    /// means this is a forked child.
    fork_generation: u64,
    /// The process that built the tier (for the message in a child).
    owner_pid: u32,
}

impl std::fmt::Debug for Tier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tier")
            .field("block_bytes", &self.shared.primary.block_bytes())
            .field("rows", &self.shared.primary.rows())
            .field("io_threads", &self.shared.io_threads)
            .finish_non_exhaustive()
    }
}

/// A load job writes each of its rows once: naming a row twice would make
/// the job's own copies race in that row. Small jobs (the common case) are
/// checked pairwise without allocating; larger ones mark rows in a bitmap
/// (one bit per row of the primary buffer) when that is smaller than a
/// sorted copy of the ids, so the check never needs more memory than the job.
fn check_distinct_rows(block_ids: &[i64], rows: usize) -> Result<()> {
    const PAIRWISE_UP_TO: usize = 32;
    let what = "checking the job's rows for repeats";
    let repeated = if block_ids.len() <= PAIRWISE_UP_TO {
        block_ids
            .iter()
            .enumerate()
            .find_map(|(i, id)| block_ids[..i].contains(id).then_some(*id))
    } else if rows.div_ceil(64) <= block_ids.len() {
        let words = rows.div_ceil(64);
        let mut seen = try_vec::<u64>(words, what)?;
        seen.resize(words, 0);
        // Ids were checked against the row count: every one indexes `seen`.
        block_ids.iter().copied().find(|&id| {
            let (word, bit) = (id as usize / 64, 1u64 << (id as usize % 64));
            let repeat = seen[word] & bit != 0;
            seen[word] |= bit;
            repeat
        })
    } else {
        let mut sorted = try_vec::<i64>(block_ids.len(), what)?;
        sorted.extend_from_slice(block_ids);
        sorted.sort_unstable();
        sorted.windows(2).find(|w| w[0] == w[1]).map(|w| w[0])
    };
    if let Some(row) = repeated {
        bail!(
            InvalidArg,
            "block_ids: row {row} appears twice; a load writes each row once"
        );
    }
    Ok(())
}

impl Tier {
    /// Creates a tier over `primary` with `config`.
    ///
    /// Fails with `Config` if the capacity holds no whole block, `Alloc` if the
    /// backend's storage or the worker threads cannot be created.
    pub fn new(config: &TierConfig, primary: PrimaryBuffer) -> Result<Tier> {
        Self::build(config, primary, true)
    }

    /// A tier whose jobs run only when [`Tier::run_queued_job`] is called: for
    /// deterministic tests of the job state machine.
    #[doc(hidden)]
    pub fn new_manual(config: &TierConfig, primary: PrimaryBuffer) -> Result<Tier> {
        Self::build(config, primary, false)
    }

    fn build(config: &TierConfig, primary: PrimaryBuffer, spawn: bool) -> Result<Tier> {
        let fork_generation = fork::register()?;
        let block_bytes = primary.block_bytes();
        let blocks = config.capacity_bytes / block_bytes as u64;
        if blocks == 0 {
            bail!(
                Config,
                "capacity_bytes: {} holds no whole block of {block_bytes} bytes",
                config.capacity_bytes
            );
        }
        if blocks >= u32::MAX as u64 {
            bail!(
                Config,
                "capacity_bytes: {blocks} blocks exceed the limit of {}",
                u32::MAX - 1
            );
        }
        let backend: Box<dyn Backend> = match config.backend {
            BackendKind::Memory => Box::new(MemoryBackend::new(block_bytes, blocks as usize)?),
            BackendKind::Disk => Box::new(DiskBackend::open(&config.disk, block_bytes)?),
        };
        let io_threads = if spawn {
            config.resolved_io_threads()
        } else {
            1
        };
        let mut index = Index::new(blocks as u32, KeyHasher::random());
        if backend.wants_discards() {
            index.track_releases();
        }
        let mut evicted_at_open = 0;
        for key in backend.recover()? {
            // Oldest first, so when storage holds more than the capacity the
            // oldest blocks are the ones evicted again.
            let mut victims = Vec::new();
            if index.free_slots() == 0 && index.pick_victims(1, &mut victims) {
                index.evict(victims[0]);
                evicted_at_open += 1;
            }
            let hash = index.hash(&key);
            if index.free_slots() > 0 && index.find(&key, hash).is_none() {
                index.insert_ready(&key, hash);
            }
        }
        let released_at_open = index.take_released();
        let shared = Arc::new(Shared {
            primary,
            backend,
            state: Mutex::new(State {
                index,
                waiting: HashMap::new(),
                waiters: HashMap::new(),
                next_wait_id: 0,
                probes: LruCache::new(MAX_PROBE_MEMORY),
                load_failures: HashMap::new(),
                victims: Vec::new(),
            }),
            queue: WorkQueue::new(),
            done: Completions::default(),
            counters: Counters::default(),
            io_threads,
            probe_ttl: Duration::from_millis(config.disk.probe_ttl_ms as u64),
        });
        Counters::add(&shared.counters.evictions, evicted_at_open);
        shared.discard(released_at_open);
        let mut tier = Tier {
            shared,
            workers: Vec::new(),
            fork_generation,
            owner_pid: fork::pid(),
        };
        if spawn {
            let spin = Duration::from_micros(config.idle_spin_us as u64);
            for i in 0..io_threads {
                let shared = Arc::clone(&tier.shared);
                let worker = std::thread::Builder::new()
                    .name(format!("kvtier-io-{i}"))
                    .spawn(move || {
                        while let Some(work) = shared.queue.next(spin) {
                            shared.run(work);
                        }
                    });
                match worker {
                    Ok(handle) => tier.workers.push(handle),
                    // Dropping `tier` joins the workers started so far.
                    Err(e) => bail!(Alloc, "could not start I/O thread {i}: {e}"),
                }
            }
        }
        Ok(tier)
    }

    /// Fails with [`ErrorKind::Shutdown`] if this process is a child forked
    /// after the tier was built (the tier's threads live in the parent only).
    ///
    /// One relaxed atomic load and a compare: every call checks it.
    #[inline]
    pub fn check_process(&self) -> Result<()> {
        if self.inherited() {
            return Err(self.inherited_error());
        }
        Ok(())
    }

    #[inline]
    fn inherited(&self) -> bool {
        fork::generation() != self.fork_generation
    }

    #[cold]
    fn inherited_error(&self) -> Error {
        Error::new(
            ErrorKind::Shutdown,
            format!(
                "the tier belongs to process {}; this is a forked child (pid {}), \
                 where its I/O threads do not exist: create a new tier after fork",
                self.owner_pid,
                fork::pid()
            ),
        )
    }

    /// Bytes per block (the primary row size).
    pub fn block_bytes(&self) -> usize {
        self.shared.primary.block_bytes()
    }

    /// Rows in the primary buffer.
    pub fn rows(&self) -> usize {
        self.shared.primary.rows()
    }

    /// Writes the state of each of the `out.len()` keys packed in `keys` into
    /// `out` as a [`LookupState`] byte, without blocking on any copy.
    ///
    /// A shared disk tier answers PENDING for a key it has not seen and asks
    /// storage on a worker; a later lookup gets HIT or MISS. (Short of memory
    /// to ask, it answers MISS, or PENDING without asking yet: a later lookup
    /// asks again.)
    ///
    /// Fails only for invalid arguments; `out` is written only on success.
    pub fn lookup_into(&self, keys: &[u8], key_len: usize, out: &mut [u8]) -> Result<()> {
        self.check_process()?;
        check_keys(keys, key_len, out.len())?;
        if out.is_empty() {
            return Ok(());
        }
        let mut to_probe = Vec::new();
        let counts = {
            let mut st = self.shared.state.lock();
            let mut counts = st.index.lookup_batch(keys, key_len, out);
            if self.shared.backend.probes_absent_keys() && counts.misses > 0 {
                let now = Instant::now();
                for (i, state) in out.iter_mut().enumerate() {
                    if *state != LookupState::Miss as u8 {
                        continue;
                    }
                    let key = &keys[i * key_len..][..key_len];
                    // `get` makes the answer most recent: a key looked up
                    // often keeps its cached MISS however many others pass.
                    let cached = st.probes.get(key).map(|p| match p {
                        Probe::InFlight => None,
                        Probe::Missing(until) => Some(*until),
                    });
                    match cached {
                        Some(Some(until)) if now < until => continue,
                        Some(None) => {}
                        _ => {
                            if !Shared::note_probe(&mut st.probes, &mut to_probe, key) {
                                // Out of memory: no more probes this time.
                                break;
                            }
                        }
                    }
                    *state = LookupState::Pending as u8;
                    counts.misses -= 1;
                    counts.pending += 1;
                }
            }
            counts
        };
        if !to_probe.is_empty() {
            let probes = to_probe.into_iter().map(Work::Probe);
            if let Err(unqueued) = self.shared.queue.push_all(Lane::Probes, probes) {
                // No memory to queue them: forget them, so that the keys
                // (answered PENDING) are asked for again by a later lookup.
                let mut st = self.shared.state.lock();
                for work in unqueued {
                    if let Work::Probe(key) = work {
                        st.probes.remove(&key);
                    }
                }
            }
        }
        let c = &self.shared.counters;
        Counters::add(&c.lookups, out.len() as u64);
        Counters::add(&c.hits, counts.hits);
        Counters::add(&c.misses, counts.misses);
        Counters::add(&c.pending, counts.pending);
        Ok(())
    }

    /// The state of each key packed in `keys`, in order.
    ///
    /// Fails for invalid arguments, or with `Alloc` if there is no memory for
    /// the answer (see [`Tier::lookup_into`], which needs none).
    pub fn lookup(&self, keys: &[u8], key_len: usize) -> Result<Vec<LookupState>> {
        let n = count_keys(keys, key_len)?;
        let mut out = try_vec(n, "the lookup's answer")?;
        out.resize(n, 0u8);
        self.lookup_into(keys, key_len, &mut out)?;
        // Collected in place: LookupState is one byte, like the u8 it maps.
        Ok(out.into_iter().map(LookupState::from_byte).collect())
    }

    /// Makes the stored keys among `keys` the most recently used; the first key
    /// ends most recent, so the head of a prefix outlives its tail. Unknown keys
    /// and keys still being stored are ignored. Allocates nothing.
    pub fn touch(&self, keys: &[u8], key_len: usize) -> Result<()> {
        self.check_process()?;
        count_keys(keys, key_len)?;
        if keys.is_empty() {
            return Ok(());
        }
        self.shared.state.lock().index.touch_batch(keys, key_len);
        Ok(())
    }

    fn check_rows(&self, block_ids: &[i64]) -> Result<()> {
        let rows = self.rows();
        if let Some((i, &id)) = block_ids
            .iter()
            .enumerate()
            .find(|&(_, &id)| id < 0 || id as u64 >= rows as u64)
        {
            bail!(
                OutOfRange,
                "block_ids[{i}]: {id} is not a row of the primary buffer (rows are 0 to {}, {rows} in all)",
                rows - 1
            );
        }
        Ok(())
    }

    /// Submits a store of `block_ids.len()` keys from the given primary rows.
    ///
    /// Returns an error, and produces no result, only for invalid arguments, a
    /// job id in flight, or `Alloc`: no memory for the job's copy of its keys
    /// and its planning (the tier is then unchanged and the job id free).
    /// Otherwise the job's result (success or failure) comes from
    /// [`Tier::poll`] exactly once.
    pub fn submit_store(
        &self,
        job_id: u64,
        keys: &[u8],
        key_len: usize,
        block_ids: &[i64],
    ) -> Result<()> {
        self.submit(JobKind::Store, job_id, keys, key_len, block_ids)
    }

    /// Submits a load of `block_ids.len()` keys into the given primary rows.
    /// Same reporting rule as [`Tier::submit_store`]: `Alloc` (no memory for
    /// the job's keys, blocks or waits) rejects it and leaves the tier
    /// unchanged. A job naming a row twice is rejected with `InvalidArg`. Two
    /// loads in flight into one row leave its bytes undefined but fail neither
    /// job and harm no stored block.
    pub fn submit_load(
        &self,
        job_id: u64,
        keys: &[u8],
        key_len: usize,
        block_ids: &[i64],
    ) -> Result<()> {
        self.submit(JobKind::Load, job_id, keys, key_len, block_ids)
    }

    fn submit(
        &self,
        kind: JobKind,
        job_id: u64,
        keys: &[u8],
        key_len: usize,
        block_ids: &[i64],
    ) -> Result<()> {
        self.check_process()?;
        let n = block_ids.len();
        check_keys(keys, key_len, n)?;
        self.check_rows(block_ids)?;
        if kind == JobKind::Load {
            check_distinct_rows(block_ids, self.rows())?;
        }
        // Memory the caller's job size decides is reserved before the tier
        // changes: a job without it is rejected, and leaves no trace.
        let mut job = Job::new(job_id, kind, n as u32, keys, key_len)?;
        self.shared.done.register(job_id)?;
        if n == 0 {
            self.shared.finish(Arc::new(job));
            return Ok(());
        }
        let planned = {
            let mut st = self.shared.state.lock();
            let ready = match kind {
                JobKind::Store => self
                    .shared
                    .plan_store(&mut st, &mut job, block_ids)
                    .map(|()| Some(Arc::new(job))),
                JobKind::Load => self.shared.plan_load(&mut st, job, block_ids),
            };
            ready.map(|ready| (ready, st.index.take_released()))
        };
        let (ready, released) = match planned {
            Ok(planned) => planned,
            Err(e) => {
                self.shared.done.unregister(job_id);
                return Err(e);
            }
        };
        self.shared.discard(released);
        if let Some(job) = ready {
            self.shared.dispatch(job);
        }
        Ok(())
    }

    /// Hands up to `max` finished results to `f`, oldest first; returns how
    /// many. Allocates nothing (room for each result is made at submit). In a
    /// forked child: 0 at once (see [`Tier::check_process`]).
    pub fn poll_with(&self, max: usize, f: impl FnMut(JobResult)) -> usize {
        // In a forked child the results lock may be held by a parent thread
        // that does not exist here: do not touch it.
        if self.inherited() {
            return 0;
        }
        self.shared.done.poll(max, f)
    }

    /// Takes up to `max` finished results, oldest first.
    pub fn poll(&self, max: usize) -> Vec<JobResult> {
        let mut out = Vec::new();
        self.poll_with(max, |r| out.push(r));
        out
    }

    /// Waits up to `timeout` for a result to be ready to poll; false on timeout.
    /// In a forked child: false at once, as no result can ever come.
    pub fn wait(&self, timeout: Duration) -> bool {
        if self.inherited() {
            return false;
        }
        self.shared.done.wait(timeout)
    }

    /// Blocks until every accepted job has completed and its result is queued.
    /// In a forked child: returns at once (no job can complete there; waiting
    /// would be forever).
    pub fn drain(&self) {
        if self.inherited() {
            return;
        }
        self.shared.done.drain()
    }

    /// Drops every stored block. Blocks in use by jobs in flight look up as MISS
    /// at once and are released when their jobs finish; those jobs still
    /// complete and are reported normally. In a forked child: does nothing.
    pub fn clear(&self) {
        if self.inherited() {
            return;
        }
        let released = {
            let mut st = self.shared.state.lock();
            st.index.clear();
            st.load_failures.clear();
            st.index.take_released()
        };
        self.shared.discard(released);
    }

    /// One line describing the backend and its storage choices (for logs). In
    /// a forked child it ends with a note that the tier is unusable there.
    pub fn describe(&self) -> String {
        // Takes no lock: the backend's description is built from fields set
        // at open, so this is safe in a forked child too.
        let mut line = format!(
            "kvtier {}: {}, {} I/O threads",
            crate::VERSION,
            self.shared.backend.describe(),
            self.shared.io_threads
        );
        if self.inherited() {
            line.push_str(&format!(
                " (inherited across fork from process {}: unusable here)",
                self.owner_pid
            ));
        }
        line
    }

    /// A snapshot of the counters. In a forked child: all zeros (the index
    /// lock may be held by a parent thread that does not exist there).
    pub fn stats(&self) -> Stats {
        if self.inherited() {
            return Stats::default();
        }
        let s = &self.shared;
        let (allocated, ready, capacity, metadata) = {
            let st = s.state.lock();
            (
                st.index.allocated() as u64,
                st.index.ready() as u64,
                st.index.capacity() as u64,
                st.index.metadata_bytes() as u64,
            )
        };
        let block_bytes = s.primary.block_bytes() as u64;
        let c = &s.counters;
        Stats {
            capacity_bytes: capacity * block_bytes,
            used_bytes: allocated * block_bytes,
            num_blocks: ready,
            lookups: Counters::get(&c.lookups),
            hits: Counters::get(&c.hits),
            misses: Counters::get(&c.misses),
            evictions: Counters::get(&c.evictions),
            stores_ok: Counters::get(&c.stores_ok),
            stores_failed: Counters::get(&c.stores_failed),
            loads_ok: Counters::get(&c.loads_ok),
            loads_failed: Counters::get(&c.loads_failed),
            bytes_stored: Counters::get(&c.bytes_stored),
            bytes_loaded: Counters::get(&c.bytes_loaded),
            jobs_in_flight: s.done.running() as u64,
            lookups_pending: Counters::get(&c.pending),
            block_bytes,
            capacity_blocks: capacity,
            metadata_bytes: metadata,
            results_queued: s.done.queued() as u64,
            io_threads: s.io_threads as u64,
        }
    }

    /// Test seam: makes backend writes fail as if the device were full.
    #[doc(hidden)]
    pub fn simulate_full_device(&self, full: bool) {
        self.shared.backend.simulate_full_device(full);
    }

    /// Runs all queued background work (probes, discards) on this thread
    /// (manual tiers only); returns how many items ran.
    #[doc(hidden)]
    pub fn run_background(&self) -> usize {
        if self.inherited() {
            return 0;
        }
        assert!(
            self.workers.is_empty(),
            "run_background is for manual tiers"
        );
        let work = self.shared.queue.take_background();
        let n = work.len();
        work.into_iter().for_each(|w| self.shared.run(w));
        n
    }

    /// Runs the queued task of job `job_id` on this thread (manual tiers only).
    /// False if that job has no queued task (finished, or waiting on a store).
    #[doc(hidden)]
    pub fn run_queued_job(&self, job_id: u64) -> bool {
        if self.inherited() {
            return false;
        }
        assert!(
            self.workers.is_empty(),
            "run_queued_job is for manual tiers"
        );
        match self.shared.queue.take_job(job_id) {
            Some(task) => {
                self.shared.run_task(task);
                true
            }
            None => false,
        }
    }
}

impl Drop for Tier {
    fn drop(&mut self) {
        if self.inherited() {
            self.abandon_in_forked_child();
            return;
        }
        let discards = self.shared.queue.shut_down();
        for worker in self.workers.drain(..) {
            let _ = worker.join();
        }
        // Evicted blocks' storage is still released: otherwise a disk tier
        // would find them again on its next open.
        for work in discards {
            self.shared.run(work);
        }
    }
}

impl Tier {
    /// `drop` in a forked child: releases what is safe to release and leaks
    /// the rest, on purpose.
    ///
    /// - The worker threads do not exist here, so they are not joined, and
    ///   their `JoinHandle`s are forgotten rather than dropped: dropping one
    ///   calls `pthread_detach` on a `pthread_t` of the parent, whose memory
    ///   glibc has already recycled in the child (its stack cache), possibly
    ///   for a thread the child started since.
    /// - No lock is taken (so the queue is not shut down, the index is not
    ///   touched, queued discards are not run): a lock a parent thread held at
    ///   the fork stays locked forever here, and what it protects may be half
    ///   updated.
    /// - `Shared` is never dropped: each worker's closure owns an `Arc` of it
    ///   and those closures will never end, so the count cannot reach zero. An
    ///   extra reference is leaked too, so that a tier without workers (a
    ///   manual tier, or one whose thread spawning failed midway) does not run
    ///   `Shared`'s destructors here either (they would take those locks).
    ///   What leaks is the child's copy-on-write view of the index, the queue
    ///   and the results; pages it never writes cost no new memory.
    /// - The backend lets go of what it can without locks and without leaving
    ///   a dangling pointer or descriptor (see `Backend::release_in_forked_child`):
    ///   the memory arena's pages, the disk directory lock's descriptor.
    ///
    /// The primary buffer is not touched (nothing here runs a copy), so the
    /// promise of `tier_free` holds in the child too.
    fn abandon_in_forked_child(&mut self) {
        std::mem::forget(std::mem::take(&mut self.workers));
        std::mem::forget(Arc::clone(&self.shared));
        self.shared.backend.release_in_forked_child();
    }
}

impl Shared {
    /// Remembers that `key` is being probed and queues it in `to_probe`;
    /// false (changing nothing) if there is no memory for that.
    fn note_probe(
        probes: &mut LruCache<Vec<u8>, Probe>,
        to_probe: &mut Vec<Vec<u8>>,
        key: &[u8],
    ) -> bool {
        let copy = || {
            let mut v = Vec::new();
            v.try_reserve_exact(key.len()).ok()?;
            v.extend_from_slice(key);
            Some(v)
        };
        // The cache's own node is allocated infallibly: it holds at most
        // MAX_PROBE_MEMORY small entries, a bound the caller does not move.
        if to_probe.try_reserve(1).is_err() {
            return false;
        }
        let (Some(a), Some(b)) = (copy(), copy()) else {
            return false;
        };
        probes.insert(a, Probe::InFlight);
        to_probe.push(b);
        true
    }

    /// Plans a store under the index lock: skips keys present or in flight and
    /// duplicates, makes room by evicting LRU blocks that are not pinned, in
    /// flight, or part of this job, and claims slots. If there is not enough
    /// room, records NO_SPACE and changes nothing.
    ///
    /// Every allocation comes first: if one fails, returns `Alloc` and the
    /// tier is unchanged.
    fn plan_store(&self, st: &mut State, job: &mut Job, block_ids: &[i64]) -> Result<()> {
        let State { index, victims, .. } = st;
        let mut new: Vec<(u32, u64)> = try_vec(job.num_blocks as usize, "the store's new keys")?;
        let mut pinned = Vec::new();
        for pos in 0..job.num_blocks {
            let key = job.key(pos);
            let hash = index.hash(key);
            match index.find(key, hash) {
                Some(slot) => {
                    try_reserve(&mut pinned, 1, "the store's present keys")?;
                    pinned.push(slot);
                }
                None => new.push((pos, hash)),
            }
        }
        if new.len() > 1 {
            // Unstable sorts do not allocate; the order is total (the position
            // breaks ties), so it is the one a stable sort would give.
            new.sort_unstable_by(|a, b| {
                a.1.cmp(&b.1)
                    .then_with(|| job.key(a.0).cmp(job.key(b.0)))
                    .then(a.0.cmp(&b.0))
            });
            new.dedup_by(|later, first| later.1 == first.1 && job.key(later.0) == job.key(first.0));
            new.sort_unstable_by_key(|e| e.0);
        }
        let free = index.free_slots() as usize;
        let need = new.len().saturating_sub(free);
        let mut items = try_vec(new.len(), "the store's blocks")?;
        let mut tails = Vec::new();
        if job.key_len > INLINE_KEY {
            tails = try_vec(new.len(), "the store's long keys")?;
            for &(pos, _) in &new {
                tails.push(try_long_tail(job.key(pos))?);
            }
        }
        victims.clear();
        try_reserve(victims, need, "eviction victims")?;
        index.reserve(new.len(), need, job.key_len)?;

        // Nothing below allocates.
        // Keys of the job are not evicted while it runs, by its own evictions
        // or anyone else's.
        for &slot in &pinned {
            index.pin(slot);
        }
        let enough = need == 0 || index.pick_victims(need, victims);
        if !enough {
            for &slot in &pinned {
                index.unpin(slot);
            }
            job.fail(0, ErrorKind::NoSpace);
            return Ok(());
        }
        Counters::add(&self.counters.evictions, need as u64);
        for &v in &victims[..need] {
            index.evict(v);
        }
        job.pinned = pinned;
        let mut tails = tails.into_iter();
        items.extend(new.into_iter().map(|(pos, hash)| Item {
            pos,
            row: block_ids[pos as usize] as usize,
            slot: index.insert_storing_with(job.key(pos), hash, tails.next().flatten()),
        }));
        job.items = items;
        Ok(())
    }

    /// Plans a load under the index lock: pins each key's block up to the first
    /// missing key. Returns the job if it can run now; a job waiting for stores
    /// in flight is parked and dispatched when they finish.
    ///
    /// Every allocation comes first (`Job::new` made room for the items): if
    /// one fails, returns `Alloc` and the tier is unchanged.
    fn plan_load(
        &self,
        st: &mut State,
        mut job: Job,
        block_ids: &[i64],
    ) -> Result<Option<Arc<Job>>> {
        debug_assert!(job.items.capacity() >= job.num_blocks as usize);
        let mut storing = Vec::new();
        for pos in 0..job.num_blocks {
            let key = job.key(pos);
            let slot = st.index.find(key, st.index.hash(key));
            let Some(slot) = slot.filter(|&s| st.index.state(s) != SlotState::Dead) else {
                job.fail(pos, ErrorKind::NotFound);
                break;
            };
            if st.index.state(slot) == SlotState::Storing {
                try_reserve(&mut storing, 1, "the load's keys in flight")?;
                storing.push((slot, pos));
            }
            job.items.push(Item {
                pos,
                row: block_ids[pos as usize] as usize,
                slot,
            });
        }
        let wait_id = st.next_wait_id;
        if !storing.is_empty() {
            let no_room = |n: usize| alloc_error::<(u64, u32)>(n, "the load's waits");
            if st.waiting.try_reserve(1).is_err() || st.waiters.try_reserve(storing.len()).is_err()
            {
                return Err(no_room(storing.len()));
            }
            for (i, &(slot, pos)) in storing.iter().enumerate() {
                let waiters = st.waiters.entry(slot).or_default();
                if waiters.try_reserve(1).is_err() {
                    // Take back the waits registered so far.
                    for &(slot, _) in &storing[..=i] {
                        if let Some(waiters) = st.waiters.get_mut(&slot) {
                            waiters.retain(|&(w, _)| w != wait_id);
                            if waiters.is_empty() {
                                st.waiters.remove(&slot);
                            }
                        }
                    }
                    return Err(no_room(storing.len()));
                }
                waiters.push((wait_id, pos));
            }
        }

        // Nothing below allocates.
        for item in &job.items {
            st.index.pin(item.slot);
        }
        let job = Arc::new(job);
        if storing.is_empty() {
            return Ok(Some(job));
        }
        st.next_wait_id += 1;
        st.waiting.insert(
            wait_id,
            WaitingLoad {
                job,
                deps: storing.len(),
            },
        );
        Ok(None)
    }

    /// Hands released blocks to a worker, which lets the backend release their
    /// storage.
    fn discard(&self, released: Vec<(u32, Vec<u8>)>) {
        if !released.is_empty() {
            if let Err(unqueued) = self
                .queue
                .push_all(Lane::Discards, [Work::Discard(released)].into_iter())
            {
                // No memory to queue it: release the storage here instead.
                unqueued.for_each(|work| self.run(work));
            }
        }
    }

    /// Whether a block of `key` is in use: stored, being stored, or cleared
    /// but still pinned by a load.
    fn is_live(&self, key: &[u8]) -> bool {
        self.state.lock().index.holds_key(key)
    }

    fn run(&self, work: Work) {
        match work {
            Work::Copy(task) => self.run_task(task),
            Work::Discard(keys) => {
                for (_, key) in keys {
                    self.backend.discard(&key, &|k| self.is_live(k));
                }
            }
            Work::Probe(key) => self.run_probe(key),
        }
    }

    /// Asks storage for a key another process may have stored; a block found
    /// joins the index (making room like a store would). The index is updated
    /// inside the backend's answer, while the backend holds off deleting the
    /// key.
    fn run_probe(&self, key: Vec<u8>) {
        let mut released = Vec::new();
        self.backend.probe(&key, &mut |found| {
            let mut st = self.state.lock();
            let State {
                index,
                probes,
                victims,
                ..
            } = &mut *st;
            probes.remove(&key);
            let hash = index.hash(&key);
            if index.find(&key, hash).is_none() {
                let room = index.free_slots() > 0 || index.pick_victims(1, victims);
                if found && room {
                    if index.free_slots() == 0 {
                        index.evict(victims[0]);
                        Counters::add(&self.counters.evictions, 1);
                    }
                    index.insert_ready(&key, hash);
                } else {
                    probes.insert(key.clone(), Probe::Missing(Instant::now() + self.probe_ttl));
                }
            }
            released = index.take_released();
        });
        self.discard(released);
    }

    /// Queues a planned job's copies, or completes it at once if there are none.
    fn dispatch(&self, job: Arc<Job>) {
        if job.items.is_empty() {
            self.finish(job);
            return;
        }
        let job_bytes = job.items.len() * self.primary.block_bytes();
        let max_tasks = self
            .io_threads
            .min(job_bytes / self.backend.min_task_bytes())
            .max(1);
        let min_items = job.items.len().div_ceil(max_tasks);
        let lane = match job.kind {
            JobKind::Load => Lane::Loads,
            JobKind::Store => Lane::Stores,
        };
        let tasks = Arc::clone(&job).into_tasks(max_tasks, min_items);
        if self.queue.push_all(lane, tasks.map(Work::Copy)).is_err() {
            // No memory to queue the copies: the job fails as a whole, and is
            // reported like any failure.
            job.fail_all(ErrorKind::Alloc);
            self.finish(job);
        }
    }

    /// A worker runs one task: copies its blocks, then, if it is the job's last
    /// task, completes the job.
    fn run_task(&self, task: Task) {
        let job = &task.job;
        let block_bytes = self.primary.block_bytes() as u64;
        let copied = catch_unwind(AssertUnwindSafe(|| {
            for i in task.range.clone() {
                if self.queue.is_shut_down() {
                    return false;
                }
                let item = job.items[i];
                let outcome = match job.kind {
                    JobKind::Store => {
                        self.backend
                            .store(&self.primary, item.row, item.slot, job.key(item.pos))
                    }
                    JobKind::Load => {
                        if item.pos >= job.copy_limit() {
                            break;
                        }
                        self.backend
                            .load(&self.primary, item.row, item.slot, job.key(item.pos))
                            .map(|()| block_bytes)
                    }
                };
                match outcome {
                    Ok(bytes) => job.add_bytes(bytes),
                    Err(e) => {
                        job.item_failed(i, e.kind());
                        if job.kind == JobKind::Load {
                            break;
                        }
                    }
                }
            }
            true
        }));
        match copied {
            Ok(false) => return, // shutting down: the job is abandoned with the tier
            Ok(true) => {}
            Err(_) => match job.kind {
                // None of this task's blocks may be published as stored.
                JobKind::Store => task
                    .range
                    .clone()
                    .for_each(|i| job.item_failed(i, ErrorKind::Panic)),
                JobKind::Load => job.fail(job.items[task.range.start].pos, ErrorKind::Panic),
            },
        }
        if job.task_done() {
            self.finish(Arc::clone(job));
        }
    }

    /// Completes a job whose copies are done: publishes or releases its blocks,
    /// wakes loads that waited on them, then queues the result.
    fn finish(&self, job: Arc<Job>) {
        let mut unblocked = Vec::new();
        let mut released = Vec::new();
        if job.num_blocks > 0 && (job.kind == JobKind::Store || !job.items.is_empty()) {
            let mut st = self.state.lock();
            match job.kind {
                JobKind::Store => {
                    let failed = job.failed_items();
                    // Reverse order: the job's first key ends most recent.
                    for (i, item) in job.items.iter().enumerate().rev() {
                        let ok = failed.of(i).is_none();
                        st.index.finish_store(item.slot, ok);
                        if ok && !st.load_failures.is_empty() {
                            // A new block: earlier failures were another one's.
                            st.load_failures.remove(job.key(item.pos));
                        }
                        Self::wake_waiters(&mut st, item.slot, ok, &mut unblocked);
                    }
                    // What the job leaves behind, whatever happened meanwhile
                    // (a clear, evictions of keys it found present).
                    let present = (0..job.num_blocks)
                        .filter(|&p| {
                            st.index
                                .find(job.key(p), st.index.hash(job.key(p)))
                                .is_some()
                        })
                        .count();
                    job.set_present_after(present as u32);
                    for &slot in &job.pinned {
                        st.index.unpin(slot);
                    }
                }
                JobKind::Load => {
                    let State {
                        index,
                        load_failures,
                        ..
                    } = &mut *st;
                    for &(i, kind) in job.failed_items().listed() {
                        let item = job.items[i];
                        let key = job.key(item.pos);
                        // The key must MISS once its block is gone or bad, or
                        // after repeated transient failures: either way the
                        // engine must not retry it forever.
                        let give_up = match kind {
                            ErrorKind::Corrupt | ErrorKind::NotFound => true,
                            _ => {
                                let n = load_failures.entry(key.to_vec()).or_insert(0);
                                *n += 1;
                                *n >= MAX_TRANSIENT_LOAD_FAILURES
                            }
                        };
                        if give_up {
                            load_failures.remove(key);
                            index.forget(item.slot);
                        }
                    }
                    if !load_failures.is_empty() {
                        // Failures count only when consecutive.
                        let copied = job.copy_limit().min(job.num_blocks);
                        for item in job.items.iter().filter(|it| it.pos < copied) {
                            load_failures.remove(job.key(item.pos));
                        }
                    }
                    for item in &job.items {
                        st.index.unpin(item.slot);
                    }
                }
            }
            released = st.index.take_released();
        }
        self.discard(released);
        for waiting in unblocked {
            self.dispatch(waiting);
        }
        let result = job.result();
        let c = &self.counters;
        match (job.kind, result.is_ok()) {
            (JobKind::Store, true) => Counters::add(&c.stores_ok, 1),
            (JobKind::Store, false) => Counters::add(&c.stores_failed, 1),
            (JobKind::Load, true) => Counters::add(&c.loads_ok, 1),
            (JobKind::Load, false) => Counters::add(&c.loads_failed, 1),
        }
        match job.kind {
            JobKind::Store => Counters::add(&c.bytes_stored, result.bytes),
            JobKind::Load => Counters::add(&c.bytes_loaded, result.bytes),
        }
        self.done.complete(result);
    }

    /// A store of `slot` finished: loads waiting on it lose a dependency (and
    /// fail at that key if the store failed); those with none left run.
    fn wake_waiters(st: &mut State, slot: u32, ok: bool, unblocked: &mut Vec<Arc<Job>>) {
        let Some(waiters) = st.waiters.remove(&slot) else {
            return;
        };
        for (wait_id, pos) in waiters {
            let waiting = st.waiting.get_mut(&wait_id).expect("waiting load");
            if !ok {
                waiting.job.fail(pos, ErrorKind::NotFound);
            }
            waiting.deps -= 1;
            if waiting.deps == 0 {
                let waiting = st.waiting.remove(&wait_id).expect("waiting load");
                unblocked.push(waiting.job);
            }
        }
    }
}
