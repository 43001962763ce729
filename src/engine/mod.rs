//! The tier engine, behind the public [`Tier`] API: validates and plans jobs
//! under the index lock, hands the copies to the worker pool, and completes
//! jobs (index update, unpin, result).
//!
//! A job's data flows one way: `submit` (this file) → `plan` (index, evict,
//! pin, under the lock) → `execute` (a worker copies rows through the
//! backend, no lock held) → `complete` (index update, unpin, waiting loads
//! woken) → `completion` (results queued, polled exactly once).
//!
//! Files: this one (the public API), `shared` (the state every stage reads),
//! `open` (building a tier: validation, backend, recovery, threads),
//! `plan`, `execute`, `complete`, `probes` (shared storage: keys another
//! process may have stored), `generation` (shared storage's clear
//! generation), `inherited` (a tier seen from a forked child), `jobs` and
//! `completion` (job records and the results queue), `hooks` (test-only
//! stepping, behind the `test-hooks` feature).
//!
//! Locks: `state` (index and load dependencies) and the completion queue are
//! never held together, and no byte is copied under either.

mod complete;
pub(crate) mod completion;
mod eventfd;
mod execute;
mod features;
mod generation;
#[cfg(feature = "test-hooks")]
mod hooks;
pub use self::features::Feature;
#[cfg(feature = "test-hooks")]
pub use self::hooks::{DiskIoSeam, HangPoint};
mod inherited;
mod items;
mod job_items;
pub(crate) mod jobs;
mod open;
mod plan;
mod probes;
mod results;
mod shared;

use self::jobs::{Job, JobKind, JobResult};
use self::plan::check_distinct_rows;
use self::shared::Shared;
use crate::config::TierConfig;
use crate::error::{bail, try_vec, Result};
use crate::events::Event;
use crate::index::LookupState;
use crate::key::{check_keys, count_keys};
use crate::primary::PrimaryBuffer;
use crate::stats::{Counters, Stats};
use std::os::fd::BorrowedFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// A key whose loads fail this many times in a row with a transient error
/// (`Io`: descriptors, permissions, device errors, a request past its
/// deadline) is dropped, so an engine that retries a failing block does not
/// retry it forever. Only failures whose request went to storage count: a
/// load failed at once because storage is known to be unavailable (every
/// I/O thread stuck, a Redis server that is silent or in reconnect backoff,
/// no connection free) proves nothing about the block, and an engine that
/// retries through an outage keeps its keys.
pub const MAX_TRANSIENT_LOAD_FAILURES: u32 = 3;

/// A secondary tier over a caller's primary buffer.
///
/// Every method may be called from any thread, concurrently. Dropping the tier
/// stops the workers after their current block copy; jobs still queued are
/// abandoned, and the primary buffer is never touched again once `drop` returns.
/// A worker stuck in a storage call past `io_timeout_ms` is not waited for: it
/// is left behind and cleans up when its call returns (see `Crew::stop`).
///
/// A tier belongs to the process that built it. In a child made by `fork()`
/// (which has none of its worker threads) it is inert: fallible methods fail
/// with [`ErrorKind::Shutdown`], [`Tier::poll`], [`Tier::wait`],
/// [`Tier::drain`] and [`Tier::clear`] return at once having done nothing, and
/// dropping it releases only what is safe (see `Drop`). Build a new tier in
/// the child; the parent's tier is unaffected. [`Tier::check_process`] tells.
pub struct Tier {
    shared: Arc<Shared>,
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

impl Tier {
    /// Creates a tier over `primary` with `config`.
    ///
    /// Fails with `Config` if the capacity holds no whole block, `Alloc` if the
    /// backend's storage or the worker threads cannot be created.
    pub fn new(config: &TierConfig, primary: PrimaryBuffer) -> Result<Tier> {
        Self::build(config, primary, true)
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
        let mut read_generation = false;
        let (counts, to_probe) = {
            let mut st = self.shared.state.lock();
            let mut counts = st.index.lookup_batch(keys, key_len, out);
            if counts.hits > 0 && self.shared.lease_ending() {
                read_generation = true;
                if self.shared.lease_ended() {
                    let held = generation::hold_hits(out, counts.hits);
                    counts.hits -= held;
                    counts.pending += held;
                }
            }
            let to_probe = if self.shared.backend.probes().is_some() && counts.misses > 0 {
                Shared::probe_misses(&mut st, keys, key_len, out, &mut counts)
            } else {
                Vec::new()
            };
            (counts, to_probe)
        };
        if read_generation {
            self.shared.queue_generation_check();
        }
        self.shared.queue_probes(to_probe);
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
        if self.shared.backend.touches().is_some() {
            self.shared.forward_touch(keys, key_len);
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
    /// A read is a use: when the job completes, the blocks it copied become
    /// the most recently used, the first key most recent of all.
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

    /// Submits a job of either kind (see [`Tier::submit_store`] and
    /// [`Tier::submit_load`]), for callers that carry the kind as a value.
    pub(crate) fn submit(
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
        let job = Job::new(job_id, kind, n as u32, keys, key_len)?;
        self.enqueue(job, block_ids)
    }

    /// Registers a validated job and plans it; `block_ids` are its rows (for
    /// an extent job, the positions that index its extents).
    fn enqueue(&self, mut job: Job, block_ids: &[i64]) -> Result<()> {
        let (kind, job_id, n) = (job.kind, job.id, block_ids.len());
        self.shared.done.register(job_id)?;
        if n == 0 {
            self.shared.finish(Arc::new(job));
            return Ok(());
        }
        let planned = {
            let mut st = self.shared.state.lock();
            let ready = if kind == JobKind::Load {
                self.shared.plan_load(&mut st, job, block_ids)
            } else {
                self.shared
                    .plan_store(&mut st, &mut job, block_ids)
                    .map(|()| Some(Arc::new(job)))
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

    /// A descriptor that is readable exactly while finished results wait to
    /// be polled: wait on it with `poll`/`epoll`/`select` (readable: call
    /// [`Tier::poll`]), never read, write or close it. Made on the first call
    /// (an eventfd, non-blocking, close-on-exec), the same one afterwards,
    /// closed when the tier is dropped. See `tier_completion_fd` for the
    /// exact rule.
    ///
    /// Fails with `Io` (no descriptor left), `Alloc`, or `Shutdown` in a
    /// forked child.
    pub fn completion_fd(&self) -> Result<BorrowedFd<'_>> {
        self.check_process()?;
        let raw = self.shared.done.fd()?;
        // SAFETY: the descriptor lives in `shared.done` until the tier drops,
        // and the borrow cannot outlive the tier.
        Ok(unsafe { BorrowedFd::borrow_raw(raw) })
    }

    /// Adds 1 to the eventfd `fd` each time a job of `kind` completes (after
    /// its result is queued for [`Tier::poll`]), until the tier is dropped.
    /// The tier writes a duplicate of its own, so the caller may read, wait
    /// on or close `fd` whenever it likes. See `tier_add_notify_fd`.
    ///
    /// Fails with `InvalidArg` when `fd` is not an eventfd or the tier has
    /// its most notify descriptors already, `Io` (no descriptor left),
    /// `Alloc`, or `Shutdown` in a forked child.
    pub fn add_notify_fd(&self, kind: JobKind, fd: BorrowedFd<'_>) -> Result<()> {
        self.check_process()?;
        self.shared.done.add_notify(kind, fd)
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
    ///
    /// On shared storage (disk `shared=true`, Redis `sharing=shared`) it
    /// clears the namespace for every process: storage's clear generation is
    /// raised, the blocks of the old one deleted (best effort), and the call
    /// returns two `probe_ttl_ms` after the raise, when no tier of the
    /// namespace anywhere answers HIT for, or loads, a block stored before.
    /// Fails with `Io` when storage could not be reached (this tier's blocks
    /// are dropped all the same).
    pub fn clear(&self) -> Result<()> {
        if self.inherited() {
            return Ok(());
        }
        if self.shared.backend.probes().is_some() {
            return self.shared.clear_shared();
        }
        let released = {
            let mut st = self.shared.state.lock();
            st.index.clear();
            st.load_failures.clear();
            st.index.take_released()
        };
        self.shared.discard(released);
        Ok(())
    }

    /// Hands up to `max` block events to `f`, oldest first; returns how many.
    ///
    /// Each event is handed out once (concurrent pollers get distinct
    /// events; within one poller's stream a key's events keep their order,
    /// and [`Event::seq`] orders events across pollers). See
    /// [`crate::EventKind`] for what is reported. Allocates nothing, and holds
    /// the index lock only for a few dozen events at a time, never while `f`
    /// runs.
    ///
    /// Fails with `Config` if the tier was built without `events=true`, and
    /// with `Shutdown` in a forked child.
    pub fn poll_events_with(&self, max: usize, mut f: impl FnMut(&Event)) -> Result<usize> {
        /// Events moved per hold of the index lock: short enough that a
        /// poller never stalls lookups for long (about 10 KiB copied).
        const BATCH: usize = 64;
        self.check_process()?;
        let mut handed = 0;
        let mut batch = [None; BATCH];
        while handed < max {
            let want = (max - handed).min(BATCH);
            let taken = {
                let mut st = self.shared.state.lock();
                if !st.index.events_enabled() {
                    bail!(
                        Config,
                        "events are off: build the tier with events=true to poll them"
                    );
                }
                let mut taken = 0;
                while taken < want {
                    let Some(event) = st.index.take_event() else {
                        break;
                    };
                    batch[taken] = Some(event);
                    taken += 1;
                }
                taken
            };
            for event in batch[..taken].iter().flatten() {
                f(event);
            }
            handed += taken;
            if taken < want {
                break;
            }
        }
        Ok(handed)
    }

    /// Takes up to `max` block events, oldest first (see
    /// [`Tier::poll_events_with`]).
    pub fn poll_events(&self, max: usize) -> Result<Vec<Event>> {
        let mut out = Vec::new();
        self.poll_events_with(max, |e| out.push(*e))?;
        Ok(out)
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
        if !self.shared.namespace.is_empty() {
            line.push_str(&format!(", namespace {:?}", self.shared.namespace));
        }
        if let Some(probes) = self.shared.backend.probes() {
            line.push_str(&format!(", clear generation {}", probes.generation()));
        }
        let watched =
            (self.shared.crew.timeout()).map(|t| (t.as_millis(), self.shared.crew.limit()));
        match (&self.shared.io_timeout_auto, watched) {
            (Some(why), None) => line.push_str(&format!(", io_timeout_ms=auto ({why})")),
            (Some(why), Some((_, limit))) => line.push_str(&format!(
                ", io_timeout_ms=auto ({why}; up to {limit} threads while some are stuck)"
            )),
            (None, Some((ms, limit))) => line.push_str(&format!(
                ", io_timeout_ms={ms} (up to {limit} threads while some are stuck)"
            )),
            (None, None) => {}
        }
        if self.inherited() {
            line.push_str(&format!(
                " (inherited across fork from process {}: unusable here)",
                self.owner_pid
            ));
        }
        line
    }

    /// The Prometheus text exposition (format 0.0.4) of the tier's counters,
    /// gauges and histograms (job latency and per-block I/O time by job
    /// kind), every sample labelled `backend="memory|disk|redis"` and, when
    /// the tier has one, `namespace="..."`. In a forked child the stats part
    /// is all zeros, as for [`Tier::stats`].
    pub fn metrics(&self) -> String {
        let (s, stats) = (&self.shared, self.stats());
        let counters = match self.inherited() {
            true => Vec::new(), // a parent thread may hold the client's locks
            false => s.backend.counters(),
        };
        crate::metrics::render(&stats, &s.metrics, s.backend_name, &s.namespace, &counters)
    }

    /// A snapshot of the counters. In a forked child: all zeros (the index
    /// lock may be held by a parent thread that does not exist there).
    pub fn stats(&self) -> Stats {
        if self.inherited() {
            return Stats::default();
        }
        let s = &self.shared;
        let (allocated, ready, capacity, metadata, events_dropped) = {
            let st = s.state.lock();
            (
                st.index.allocated() as u64,
                st.index.ready() as u64,
                st.index.capacity() as u64,
                st.index.metadata_bytes() as u64,
                st.index.events_dropped(),
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
            events_dropped,
            resident_bytes: s.backend.resident_bytes(),
            io_deadlines_missed: s.crew.expired_total(),
            io_threads_stuck: s.crew.stuck() as u64,
            // Acquire: pairs with the Release of a finished probe, whose
            // index changes a reader that sees 0 must find.
            probes_in_flight: c.probes_in_flight.load(Ordering::Acquire),
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
        let left_behind = self.shared.crew.stop();
        if left_behind == 0 {
            // Evicted blocks' storage is still released: otherwise a disk tier
            // would find them again on its next open.
            for work in discards {
                self.shared.run(work, None);
            }
            // Storage now holds exactly the index: a disk tier may write its
            // manifest (see `Shared::save_on_close` for when it may not).
            self.shared.save_on_close();
            return;
        }
        // Threads are stuck in storage calls past their deadline (a hung
        // device): they were detached, and each keeps `shared` alive until
        // its call returns. The caller's descriptor goes now (nothing signals
        // it any more: every job of a stuck call was reported); the backend
        // keeps its storage (the disk directory's lock) until the last of
        // them returns, since they may still write there.
        self.shared.done.retire_fd();
        if let Some(io) = self.shared.backend.watched_io() {
            io.left_behind(left_behind);
        }
        Shared::discard_detached(&self.shared, discards);
    }
}
