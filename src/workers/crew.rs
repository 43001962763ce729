//! Who is working and who is stuck: the worker threads' accounting, and the
//! deadlines of the storage calls they make.
//!
//! A worker announces each storage call it makes ([`Worker::watch`]); the
//! watchdog (see `pool`) marks a call past the deadline as expired, counts its
//! thread as stuck and has the engine report the job on time. A stuck thread
//! cannot be interrupted (a `pread` on a hung mount sleeps in the kernel), so
//! a replacement takes its place, up to a bound; when the call returns, the
//! thread finishes its task and leaves if the crew has enough threads again.
//!
//! At `tier_free` ([`Crew::stop`]) the threads that serve are waited for; the
//! ones stuck past their deadline are left behind, detached: each owns an
//! `Arc` of the engine, so what it still touches lives until its call
//! returns, and it then leaves like any other.

use crate::aligned::AlignedBuf;
use crate::sync::MutexGuard;
use crate::sync::{Condvar, Mutex};
use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A storage call in progress on one worker.
pub(crate) struct Watch<J> {
    /// The job it copies for (None: background work, a probe or a discard).
    pub job: Option<Arc<J>>,
    /// The index of the item it copies, in the job's items.
    pub item: usize,
    since: Instant,
    expired: bool,
}

#[derive(Default)]
struct Headcount {
    /// Threads running (serving or stuck).
    alive: usize,
    /// Threads in a storage call past its deadline.
    stuck: usize,
    /// Worker ids free for a new thread.
    free_ids: Vec<usize>,
}

/// The worker threads of one tier: how many, which are stuck, their handles.
/// `J` is what a storage call copies for (the engine's job), which the
/// watchdog hands back to the executor when the call is past its deadline.
pub(crate) struct Crew<J> {
    /// Threads that serve the queue when nothing is stuck.
    target: usize,
    /// Most threads alive at once: `target` plus as many replacements.
    limit: usize,
    timeout: Option<Duration>,
    /// Indexed by worker id.
    watches: Vec<Mutex<Option<Watch<J>>>>,
    heads: Mutex<Headcount>,
    /// Signalled when a thread leaves or is counted stuck (for [`Crew::stop`]).
    heads_changed: Condvar,
    /// Held by the watchdog for each of its rounds (marking calls expired,
    /// then reporting their jobs): [`Crew::stop`] looks at the headcount
    /// under it, so every thread it counts stuck has had its job reported.
    round: Mutex<()>,
    /// The worker threads' handles.
    handles: Mutex<Vec<JoinHandle<()>>>,
    watchdog: Mutex<Option<JoinHandle<()>>>,
    /// The watchdog's sleep, on std's futex-based primitives: parking_lot
    /// parks sleepers in a process-wide table, and a thread waking there
    /// several times a second could hold one of its locks at a `fork()`,
    /// which the child (whose tiers use that table too) would then wait on
    /// forever.
    stopping: std::sync::Mutex<bool>,
    stop: std::sync::Condvar,
    expired_total: AtomicU64,
}

impl<J> Crew<J> {
    /// A crew of `target` threads; `timeout` is the deadline of one storage
    /// call (None: no deadline, no watchdog, no replacements).
    pub(crate) fn new(target: usize, timeout: Option<Duration>) -> Crew<J> {
        let limit = if timeout.is_some() {
            2 * target
        } else {
            target
        };
        Crew {
            target,
            limit,
            timeout,
            watches: (0..limit).map(|_| Mutex::new(None)).collect(),
            heads: Mutex::new(Headcount {
                free_ids: (0..limit).rev().collect(),
                ..Headcount::default()
            }),
            heads_changed: Condvar::new(),
            round: Mutex::new(()),
            handles: Mutex::new(Vec::new()),
            watchdog: Mutex::new(None),
            stopping: std::sync::Mutex::new(false),
            stop: std::sync::Condvar::new(),
            expired_total: AtomicU64::new(0),
        }
    }

    pub(crate) fn timeout(&self) -> Option<Duration> {
        self.timeout
    }

    /// Most threads that may be alive at once (the bound on replacements).
    pub(crate) fn limit(&self) -> usize {
        self.limit
    }

    /// Threads stuck in a storage call past its deadline right now.
    pub(crate) fn stuck(&self) -> usize {
        self.heads.lock().stuck
    }

    /// Threads alive (serving or stuck).
    #[cfg(feature = "test-hooks")]
    pub(crate) fn alive(&self) -> usize {
        self.heads.lock().alive
    }

    /// Storage calls that missed their deadline since the tier opened.
    pub(crate) fn expired_total(&self) -> u64 {
        self.expired_total.load(Ordering::Relaxed)
    }

    /// True when threads were started and every one of them is stuck, with
    /// no replacement left to start: work queued now would wait for the
    /// device to recover.
    pub(crate) fn all_stuck(&self) -> bool {
        let h = self.heads.lock();
        h.alive > 0 && h.alive == h.stuck && h.alive >= self.limit
    }

    /// Claims a worker id for a new thread, if fewer than `target` threads
    /// serve and the bound allows one more.
    pub(crate) fn enlist(&self) -> Option<usize> {
        let mut h = self.heads.lock();
        if h.alive >= self.limit || h.alive - h.stuck >= self.target {
            return None;
        }
        let id = h.free_ids.pop()?;
        h.alive += 1;
        Some(id)
    }

    /// Gives back an id whose thread could not be started.
    pub(crate) fn discharge(&self, id: usize) {
        let mut h = self.heads.lock();
        h.alive -= 1;
        h.free_ids.push(id);
    }

    pub(crate) fn add_handle(&self, handle: JoinHandle<()>) {
        let mut handles = self.handles.lock();
        // Threads that left after a stuck call are gone: forget their handles
        // so that repeated hangs do not grow this list.
        handles.retain(|h| !h.is_finished());
        handles.push(handle);
    }

    pub(crate) fn set_watchdog(&self, handle: JoinHandle<()>) {
        *self.watchdog.lock() = Some(handle);
    }

    /// After a task: a thread that came back from a stuck call leaves if the
    /// crew has enough serving threads without it. True if it must leave.
    pub(crate) fn retire_if_surplus(&self, id: usize) -> bool {
        let mut h = self.heads.lock();
        if h.alive - h.stuck > self.target {
            h.alive -= 1;
            h.free_ids.push(id);
            return true;
        }
        false
    }

    /// A thread leaves because the queue shut down (or it panicked).
    pub(crate) fn leave(&self, id: usize) {
        let mut h = self.heads.lock();
        h.alive -= 1;
        h.free_ids.push(id);
        self.heads_changed.notify_all();
    }

    /// Marks the calls past their deadline as expired (each once) and counts
    /// their threads as stuck; returns them for the engine to report.
    pub(crate) fn collect_expired(&self) -> Vec<(Option<Arc<J>>, usize)> {
        let Some(timeout) = self.timeout else {
            return Vec::new();
        };
        let mut expired = Vec::new();
        for watch in &self.watches {
            let mut watch = watch.lock();
            let Some(w) = watch.as_mut() else { continue };
            if w.expired || w.since.elapsed() < timeout {
                continue;
            }
            w.expired = true;
            // Counted under the watch's lock: the worker, taking its watch
            // back under the same lock, sees `expired` only once its thread
            // is counted stuck, so it can never uncount it first.
            self.heads.lock().stuck += 1;
            self.heads_changed.notify_all();
            self.expired_total.fetch_add(1, Ordering::Relaxed);
            expired.push((w.job.clone(), w.item));
        }
        expired
    }

    /// Sleeps up to `tick`; true once the crew is stopping.
    pub(crate) fn wait_stop(&self, tick: Duration) -> bool {
        // Poisoning cannot happen (nothing panics under this lock); if it
        // did, the flag is still right.
        let stopping = self.stopping.lock().unwrap_or_else(|e| e.into_inner());
        if *stopping {
            return true;
        }
        let (stopping, _) = self
            .stop
            .wait_timeout(stopping, tick)
            .unwrap_or_else(|e| e.into_inner());
        *stopping
    }

    /// Holds off [`Crew::stop`] while the watchdog reports the calls it
    /// found expired (see `round`). None once the crew is stopping: the
    /// watchdog must end.
    pub(crate) fn begin_round(&self) -> Option<MutexGuard<'_, ()>> {
        let round = self.round.lock();
        if *self.stopping.lock().unwrap_or_else(|e| e.into_inner()) {
            return None;
        }
        Some(round)
    }

    /// Ends the crew (the queue must be shut down first, so no thread takes
    /// new work): waits until every thread has left or is stuck in a storage
    /// call past its deadline, ends the watchdog, joins the threads that left
    /// and detaches the stuck ones. Returns how many were left behind.
    ///
    /// The wait is the drain of healthy work: a call still within its
    /// deadline is waited for (at worst until the deadline, when the watchdog,
    /// which runs until then, declares it stuck); a call past it is not.
    ///
    /// Why a stuck thread may be left running once the tier is freed: its
    /// job was reported before this returns (each thread is counted stuck
    /// here only under the watchdog's `round`, which reports the job of every
    /// call it marks expired before it lets go), and a worker touches the
    /// caller's rows only under its job's report lock while the job is not
    /// reported (`Job::deliver` for loads, the store guard for stores). The
    /// thread owns an `Arc` of everything else it may touch (backend, index,
    /// results), which is dropped on that thread when the last call returns.
    pub(crate) fn stop(&self) -> usize {
        loop {
            let round = self.round.lock();
            let mut h = self.heads.lock();
            if h.alive == h.stuck {
                // Still under `round`: no new round can mark a call expired
                // (and count it stuck) between this look and the stop.
                *self.stopping.lock().unwrap_or_else(|e| e.into_inner()) = true;
                self.stop.notify_all();
                break;
            }
            drop(round);
            // Woken when a thread leaves or is counted stuck; the timeout only
            // guards against a missed notification.
            self.heads_changed
                .wait_for(&mut h, Duration::from_millis(50));
        }
        if let Some(watchdog) = self.watchdog.lock().take() {
            let _ = watchdog.join();
        }
        let left = self.heads.lock().alive;
        let handles = std::mem::take(&mut *self.handles.lock());
        for handle in handles {
            if left == 0 || handle.is_finished() {
                let _ = handle.join();
            }
            // Else dropped: a stuck thread (or one on its way out) detaches.
        }
        left
    }

    /// True if no thread was ever started (a tier stepped by hand in tests).
    #[cfg(feature = "test-hooks")]
    pub(crate) fn is_empty(&self) -> bool {
        self.handles.lock().is_empty()
    }
}

/// One worker thread's view of its crew, handed to the executor with each
/// piece of work.
pub(crate) struct Worker<'a, J> {
    crew: &'a Crew<J>,
    id: usize,
    /// Where a load's block lands before it is copied to the caller's row
    /// (see [`Worker::bounce`]).
    bounce: RefCell<Option<AlignedBuf>>,
}

impl<'a, J> Worker<'a, J> {
    pub(crate) fn new(crew: &'a Crew<J>, id: usize) -> Worker<'a, J> {
        Worker {
            crew,
            id,
            bounce: RefCell::new(None),
        }
    }

    /// Whether this worker's storage calls have a deadline.
    pub(crate) fn has_deadline(&self) -> bool {
        self.crew.timeout.is_some()
    }

    /// Runs the storage call `call` under the crew's deadline: if it takes
    /// longer, the watchdog reports `job` failed on time and starts a
    /// replacement; this thread resumes here when the call returns.
    pub(crate) fn watch<R>(
        &self,
        job: Option<&Arc<J>>,
        item: usize,
        call: impl FnOnce() -> R,
    ) -> R {
        if self.crew.timeout.is_none() {
            return call();
        }
        *self.crew.watches[self.id].lock() = Some(Watch {
            job: job.cloned(),
            item,
            since: Instant::now(),
            expired: false,
        });
        let outcome = call();
        let watch = self.crew.watches[self.id].lock().take();
        if watch.is_some_and(|w| w.expired) {
            self.crew.heads.lock().stuck -= 1;
        }
        outcome
    }

    /// Runs `f` on this worker's bounce buffer of `len` bytes, page-aligned
    /// (so that O_DIRECT reads into it in place) and, from 256 KiB, in huge
    /// pages where the kernel grants them (see `crate::aligned`), or returns
    /// None if there is no memory for it.
    pub(crate) fn bounce<R>(&self, len: usize, f: impl FnOnce(&mut [u8]) -> R) -> Option<R> {
        let mut buf = self.bounce.borrow_mut();
        AlignedBuf::reuse(&mut buf, len).ok().map(f)
    }
}
