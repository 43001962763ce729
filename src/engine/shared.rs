//! The state every stage of a job reads: the index and the loads waiting
//! on stores (`State`, under one lock), and everything else a tier's
//! threads share (`Shared`). The public API is in `mod.rs`; each stage file
//! adds the methods of its stage to `Shared`.

use super::completion::Completions;
use super::jobs::{Crew, Job, WorkQueue};
use crate::backend::Backend;
use crate::index::Index;
use crate::metrics::JobMetrics;
use crate::primary::PrimaryBuffer;
use crate::stats::Counters;
use crate::sync::Mutex;
use hashlink::LruCache;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A load waiting for stores in flight of some of its keys.
pub(super) struct WaitingLoad {
    pub(super) job: Arc<Job>,
    /// Storing slots it still waits for (with multiplicity).
    pub(super) deps: usize,
}

pub(super) struct State {
    pub(super) index: Index,
    pub(super) waiting: HashMap<u64, WaitingLoad>,
    /// Storing slot → waiting loads (wait id, key position in that load).
    pub(super) waiters: HashMap<u32, Vec<(u64, u32)>>,
    pub(super) next_wait_id: u64,
    /// Shared disk tiers: keys being or recently probed, the least recently
    /// asked forgotten first.
    pub(super) probes: LruCache<Vec<u8>, Probe>,
    /// Keys whose latest loads failed transiently, and how many times in a
    /// row (almost always empty).
    pub(super) load_failures: HashMap<Vec<u8>, u32>,
    pub(super) victims: Vec<u32>,
    /// Keys pinned by `Tier::pin`, each with the slot of every pin not yet
    /// dropped (a key stored again after a clear may hold pins on two).
    pub(super) user_pins: HashMap<Vec<u8>, Vec<u32>>,
}

pub(super) struct Shared {
    pub(super) primary: PrimaryBuffer,
    pub(super) backend: Box<dyn Backend>,
    pub(super) state: Mutex<State>,
    pub(super) queue: WorkQueue,
    /// The worker threads' accounting and the deadline of storage calls.
    pub(super) crew: Crew,
    pub(super) done: Completions,
    pub(super) counters: Counters,
    pub(super) metrics: JobMetrics,
    /// The `backend` and `namespace` labels of the tier's metrics.
    pub(super) backend_name: &'static str,
    pub(super) namespace: String,
    pub(super) io_threads: usize,
    /// Why `io_timeout_ms=auto` chose the deadline it did, for `describe`.
    pub(super) io_timeout_auto: Option<String>,
    pub(super) probe_ttl: Duration,
    /// Shared storage: how long the clear generation this tier knows is
    /// trusted (see `generation`).
    pub(super) lease: Lease,
    /// A key was dropped after transient load failures while its block may
    /// still be in storage: storage holds a block the index does not list.
    pub(super) dropped_unreadable: AtomicBool,
}

impl Shared {
    /// At a clean close (every thread joined, discards run): lets the
    /// backend record the index for the next open (see
    /// `Persistence::save_on_close`), unless storage may hold something the
    /// index does not say: a job left unfinished, a storage call that
    /// missed its deadline (its outcome was set aside; a hung device is not
    /// trusted either), a block dropped but kept in storage.
    pub(super) fn save_on_close(&self) {
        if self.done.running() > 0
            || self.crew.expired_total() > 0
            || self.crew.stuck() > 0
            || self.dropped_unreadable.load(Ordering::Relaxed)
        {
            return;
        }
        let st = self.state.lock();
        // Nothing being stored, nothing unlinked but still held.
        if st.index.allocated() != st.index.ready() {
            return;
        }
        if let Some(storage) = self.backend.persistence() {
            storage.save_on_close(&mut |f| st.index.for_each_lru(f));
        }
    }
}

/// What is known about a key absent from the index but maybe in storage.
pub(super) enum Probe {
    /// A worker is asking storage.
    InFlight,
    /// Storage did not have it; ask again after this instant.
    Missing(Instant),
}

/// The shortest lease: a caller that asks again some milliseconds after a
/// PENDING (the contract's "ask again") must find the generation read for
/// it still trusted, or a `probe_ttl_ms` of 0 would hold its HITs forever.
const MIN_LEASE: Duration = Duration::from_millis(250);

/// How long the generation a tier knows is trusted.
pub(super) struct Lease {
    pub(super) epoch: Instant,
    /// Nanoseconds after `epoch` until which the generation is trusted.
    pub(super) until_ns: AtomicU64,
    /// A read of the generation is queued or running.
    pub(super) checking: AtomicBool,
    pub(super) length: Duration,
}

impl Lease {
    pub(super) fn new(probe_ttl: Duration) -> Lease {
        Lease {
            epoch: Instant::now(),
            until_ns: AtomicU64::new(0),
            checking: AtomicBool::new(false),
            length: probe_ttl.max(MIN_LEASE),
        }
    }

    fn ns(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.epoch).as_nanos() as u64
    }

    pub(super) fn valid(&self) -> bool {
        self.ns(Instant::now()) < self.until_ns.load(Ordering::Acquire)
    }

    /// Whether less than half the lease is left (or none): a lookup then
    /// asks for the generation to be read again ahead of the end, so a
    /// tier in steady use never has to hold its HITs.
    pub(super) fn ending(&self) -> bool {
        let left = self
            .until_ns
            .load(Ordering::Acquire)
            .saturating_sub(self.ns(Instant::now()));
        left < self.length.as_nanos() as u64 / 2
    }

    /// The generation read by a request sent at `asked` is trusted for one
    /// lease from then (not from the answer: it may have changed meanwhile).
    pub(super) fn renew(&self, asked: Instant) {
        let until = self.ns(asked + self.length);
        self.until_ns.fetch_max(until, Ordering::AcqRel);
    }

    pub(super) fn end(&self) {
        self.until_ns.store(0, Ordering::Release);
    }
}
