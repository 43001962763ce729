//! The work queue and the I/O worker threads that drain it.
//!
//! Order of service: loads (a request waits for them), probes (a lookup waits
//! for them), then stores (background) and discards (housekeeping) taking
//! turns while both wait. While background work waits, it gets one turn
//! after every [`FOREGROUND_BURST`] loads and probes, so that no kind of work
//! waits for another to run dry. One idle worker polls briefly before
//! sleeping, so a stream of small jobs does not pay a thread wake-up per
//! job; the others sleep at once, so idle workers do not compete with the
//! engine's threads for cores.

use crate::job_kind::JobKind;
use crate::sync::{Condvar, Mutex};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// What the queue asks of a copy task: its kind, which decides its lane.
/// The engine's tasks implement it; the queue knows nothing else of them.
pub(crate) trait CopyTask: Send + 'static {
    /// Store or load: loads are served first.
    fn kind(&self) -> JobKind;
    /// The caller's id of the job it copies for (tests that step jobs by
    /// hand take a job's task out of the queue).
    #[cfg(feature = "test-hooks")]
    fn job_id(&self) -> u64;
}

/// One unit of work for a worker; `T` is the engine's copy task.
pub(crate) enum Work<T> {
    /// Copy a run of one job's blocks.
    Copy(T),
    /// Does storage hold these keys (shared tiers)? One key each for a
    /// backend that asks per key, the keys of one lookup for one that asks
    /// for many at once (`Probes::probes_in_batches`).
    Probe(Vec<Vec<u8>>),
    /// Release the storage of evicted or cleared blocks (slot, key).
    Discard(Vec<(u32, Vec<u8>)>),
    /// Tell storage these keys were used (packed, `key_len` bytes each).
    Touch(Vec<u8>, usize),
    /// Read shared storage's clear generation (a lookup's HITs wait for it).
    Generation,
}

/// Which queue a piece of work waits in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Lane {
    Loads,
    Probes,
    Stores,
    Discards,
}

impl<T: CopyTask> Work<T> {
    fn lane(&self) -> Lane {
        match self {
            Work::Copy(t) if t.kind() == JobKind::Load => Lane::Loads,
            Work::Copy(_) => Lane::Stores,
            // Background work a lookup or touch asked for, dropped when the
            // tier shuts down.
            Work::Probe(_) | Work::Touch(..) | Work::Generation => Lane::Probes,
            Work::Discard(_) => Lane::Discards,
        }
    }
}

/// Loads and probes served in a row while background work (stores,
/// discards) waits, before one piece of it goes. Strict priority let a
/// stream of loads with more jobs in flight than workers hold every store
/// back for as long as it lasted (and the engine's rows with them); vLLM's
/// own tiers give reads and writes separate thread pools. A load then waits
/// at most one background task per eight on a worker, and only when every
/// worker is busy.
const FOREGROUND_BURST: u32 = 8;

struct Queues<T> {
    loads: VecDeque<Work<T>>,
    probes: VecDeque<Work<T>>,
    stores: VecDeque<Work<T>>,
    discards: VecDeque<Work<T>>,
    /// The last of the two background lanes served was stores: a discard
    /// goes next if one waits.
    discard_next: bool,
    /// Loads and probes served in a row while background work waited.
    foreground_streak: u32,
}

impl<T> Default for Queues<T> {
    fn default() -> Self {
        Queues {
            loads: VecDeque::new(),
            probes: VecDeque::new(),
            stores: VecDeque::new(),
            discards: VecDeque::new(),
            discard_next: false,
            foreground_streak: 0,
        }
    }
}

impl<T> Queues<T> {
    fn pop(&mut self) -> Option<Work<T>> {
        let background_waits = !self.stores.is_empty() || !self.discards.is_empty();
        if !background_waits || self.foreground_streak < FOREGROUND_BURST {
            if let Some(work) = self.loads.pop_front().or_else(|| self.probes.pop_front()) {
                if background_waits {
                    self.foreground_streak += 1;
                }
                return Some(work);
            }
        }
        self.foreground_streak = 0;
        // Stores and discards take turns. Served only when no store waits,
        // discards starved for as long as the engine kept more store jobs
        // in flight than there are workers: the evicted blocks stayed in
        // storage, and a Redis tier of 2,048 blocks held 55,000 keys after
        // six seconds (disk: files past the capacity). A discard is at most
        // one per store job (its evictions), so taking turns keeps storage
        // within the capacity plus the evictions of the jobs in flight; a
        // clear's many batches still leave stores every other turn.
        let discard = !self.discards.is_empty() && (self.discard_next || self.stores.is_empty());
        let work = if discard {
            self.discards.pop_front()
        } else {
            self.stores.pop_front()
        }?;
        self.discard_next = !discard;
        Some(work)
    }

    fn is_empty(&self) -> bool {
        self.loads.is_empty()
            && self.probes.is_empty()
            && self.stores.is_empty()
            && self.discards.is_empty()
    }

    fn lane(&mut self, lane: Lane) -> &mut VecDeque<Work<T>> {
        match lane {
            Lane::Loads => &mut self.loads,
            Lane::Probes => &mut self.probes,
            Lane::Stores => &mut self.stores,
            Lane::Discards => &mut self.discards,
        }
    }
}

pub(crate) struct WorkQueue<T> {
    queues: Mutex<Queues<T>>,
    available: Condvar,
    queued: AtomicUsize,
    /// Of `queued`, discards (changed under the `queues` lock).
    queued_discards: AtomicUsize,
    /// Workers waiting on `available` (changed under the `queues` lock).
    sleepers: AtomicUsize,
    /// 1 while a worker polls for work (at most one does).
    spinning: AtomicUsize,
    shutdown: AtomicBool,
}

impl<T: CopyTask> WorkQueue<T> {
    pub(crate) fn new() -> WorkQueue<T> {
        WorkQueue {
            queues: Mutex::new(Queues::default()),
            available: Condvar::new(),
            queued: AtomicUsize::new(0),
            queued_discards: AtomicUsize::new(0),
            sleepers: AtomicUsize::new(0),
            spinning: AtomicUsize::new(0),
            shutdown: AtomicBool::new(false),
        }
    }

    /// Queues `work`, all of it for `lane`. If the queue cannot grow (out of
    /// memory), queues nothing and hands `work` back.
    pub(crate) fn push_all<I: ExactSizeIterator<Item = Work<T>>>(
        &self,
        lane: Lane,
        work: I,
    ) -> Result<(), I> {
        let mut q = self.queues.lock();
        let queue = q.lane(lane);
        if queue.try_reserve(work.len()).is_err() {
            return Err(work);
        }
        let mut added = 0;
        for w in work {
            debug_assert_eq!(w.lane(), lane);
            queue.push_back(w);
            added += 1;
        }
        let queued = self.queued.fetch_add(added, Ordering::SeqCst) + added;
        let spinning = self.spinning.load(Ordering::SeqCst);
        // A polling worker takes one piece of all that is queued without
        // being woken; every other piece wakes a sleeper, up to this push's
        // own. (Counting the poller against each push instead left all but
        // one piece of a burst queued while it polled to the poller alone.)
        // The poller gives up its claim before it takes its piece or goes
        // to sleep, so either it takes a piece or a push sees it gone.
        //
        // Discards are housekeeping that no caller waits for: one queued
        // while a worker polls wakes nobody (that worker, or the next one
        // free, runs it), and queued discards are not counted when a later
        // push decides whom to wake. In a full tier every store job queues
        // its evictions' discard beside its copy; counted like a copy, the
        // pair woke a second worker per job, and a stream of stores paid a
        // thread wake-up per job (15-20% more context switches).
        let wake = if lane == Lane::Discards {
            self.queued_discards.fetch_add(added, Ordering::SeqCst);
            if spinning > 0 {
                0
            } else {
                added
            }
        } else {
            let copies = queued.saturating_sub(self.queued_discards.load(Ordering::SeqCst));
            added.min(copies.saturating_sub(spinning))
        };
        for _ in 0..wake.min(self.sleepers.load(Ordering::SeqCst)) {
            self.available.notify_one();
        }
        Ok(())
    }

    fn try_pop(&self) -> Option<Work<T>> {
        let mut q = self.queues.lock();
        let work = q.pop()?;
        if work.lane() == Lane::Discards {
            self.queued_discards.fetch_sub(1, Ordering::SeqCst);
        }
        self.queued.fetch_sub(1, Ordering::SeqCst);
        Some(work)
    }

    fn poll(&self) -> Option<Work<T>> {
        if self.queued.load(Ordering::SeqCst) > 0 {
            self.try_pop()
        } else {
            None
        }
    }

    /// Next work for a worker; None once shut down. If no other worker is
    /// polling, polls for `spin` before sleeping.
    pub(crate) fn next(&self, spin: Duration) -> Option<Work<T>> {
        loop {
            if self.shutdown.load(Ordering::Acquire) {
                return None;
            }
            if let Some(work) = self.poll() {
                return Some(work);
            }
            let polling = !spin.is_zero()
                && self
                    .spinning
                    .compare_exchange(0, 1, Ordering::SeqCst, Ordering::SeqCst)
                    .is_ok();
            if polling {
                let deadline = Instant::now() + spin;
                while !self.shutdown.load(Ordering::Acquire) && Instant::now() < deadline {
                    for _ in 0..64 {
                        std::hint::spin_loop();
                    }
                    if self.queued.load(Ordering::SeqCst) > 0 {
                        break;
                    }
                    // Give the core away if anything else is runnable (a
                    // worker whose I/O just completed, the engine): on a
                    // small machine a spinning thread would delay them.
                    std::thread::yield_now();
                }
                // The claim goes before the piece is taken (see `push_all`).
                self.spinning.store(0, Ordering::SeqCst);
                if let Some(work) = self.poll() {
                    return Some(work);
                }
            }
            let mut q = self.queues.lock();
            self.sleepers.fetch_add(1, Ordering::SeqCst);
            while q.is_empty() && !self.shutdown.load(Ordering::Acquire) {
                self.available.wait(&mut q);
            }
            self.sleepers.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// A worker leaves for good: wakes another if work is queued. A push
    /// that saw this worker polling woke nobody, trusting it to come back
    /// for the work.
    pub(crate) fn hand_over(&self) {
        let q = self.queues.lock();
        if !q.is_empty() {
            self.available.notify_one();
        }
    }

    /// Removes every queued copy task (no thread is left to run them).
    pub(crate) fn take_copies(&self) -> Vec<Work<T>> {
        let mut q = self.queues.lock();
        let Queues { loads, stores, .. } = &mut *q;
        let work: Vec<Work<T>> = loads.drain(..).chain(stores.drain(..)).collect();
        self.queued.fetch_sub(work.len(), Ordering::SeqCst);
        work
    }

    /// Removes the queued copy task of job `job_id` (manual stepping in tests).
    #[cfg(feature = "test-hooks")]
    pub(crate) fn take_job(&self, job_id: u64) -> Option<T> {
        let mut q = self.queues.lock();
        let Queues { loads, stores, .. } = &mut *q;
        for list in [loads, stores] {
            let found = list
                .iter()
                .position(|w| matches!(w, Work::Copy(t) if t.job_id() == job_id));
            if let Some(i) = found {
                self.queued.fetch_sub(1, Ordering::SeqCst);
                if let Some(Work::Copy(task)) = list.remove(i) {
                    return Some(task);
                }
            }
        }
        None
    }

    /// Removes all queued background work (probes and discards).
    #[cfg(feature = "test-hooks")]
    pub(crate) fn take_background(&self) -> Vec<Work<T>> {
        let mut q = self.queues.lock();
        let Queues {
            probes, discards, ..
        } = &mut *q;
        self.queued_discards
            .fetch_sub(discards.len(), Ordering::SeqCst);
        let work: Vec<Work<T>> = probes.drain(..).chain(discards.drain(..)).collect();
        self.queued.fetch_sub(work.len(), Ordering::SeqCst);
        work
    }

    pub(crate) fn is_shut_down(&self) -> bool {
        self.shutdown.load(Ordering::Acquire)
    }

    /// Stops the workers: queued copies and probes are dropped, running copies
    /// stop after their current block. Returns queued discards, which the
    /// caller still runs so that evicted storage is released.
    pub(crate) fn shut_down(&self) -> Vec<Work<T>> {
        let mut q = self.queues.lock();
        self.shutdown.store(true, Ordering::Release);
        let discards = q.discards.drain(..).collect();
        *q = Queues::default();
        self.queued.store(0, Ordering::SeqCst);
        self.queued_discards.store(0, Ordering::SeqCst);
        self.available.notify_all();
        discards
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The queue's tests fill it with markers only; a copy task never runs.
    struct NoTask;

    impl CopyTask for NoTask {
        fn kind(&self) -> JobKind {
            JobKind::Store
        }
        #[cfg(feature = "test-hooks")]
        fn job_id(&self) -> u64 {
            0
        }
    }

    type Work = super::Work<NoTask>;
    type WorkQueue = super::WorkQueue<NoTask>;
    type Queues = super::Queues<NoTask>;

    /// A marker work item (the lanes are filled directly; `pop` serves by
    /// lane, whatever the item).
    fn marker(n: u8) -> Work {
        Work::Touch(vec![n], 1)
    }

    fn served(q: &mut Queues) -> Vec<u8> {
        std::iter::from_fn(|| q.pop())
            .map(|w| match w {
                Work::Touch(keys, _) => keys[0],
                _ => unreachable!("only markers queued"),
            })
            .collect()
    }

    #[test]
    fn stores_and_discards_take_turns_after_loads_and_probes() {
        let mut q = Queues::default();
        for n in [10, 11, 12, 13] {
            q.stores.push_back(marker(n));
        }
        for n in [20, 21] {
            q.discards.push_back(marker(n));
        }
        q.probes.push_back(marker(2));
        q.loads.push_back(marker(1));
        assert_eq!(served(&mut q), [1, 2, 10, 20, 11, 21, 12, 13]);
    }

    #[test]
    fn a_stream_of_stores_never_starves_a_discard() {
        let mut q = Queues::default();
        q.stores.push_back(marker(10));
        let mut discards_served = 0;
        for round in 0..100u8 {
            // Each store popped is replaced by another and queues a discard,
            // as a store job of a full tier does.
            q.discards.push_back(marker(20));
            for _ in 0..2 {
                match q.pop() {
                    Some(Work::Touch(keys, _)) if keys[0] == 20 => discards_served += 1,
                    Some(_) => q.stores.push_back(marker(10 + round % 2)),
                    None => unreachable!("work queued"),
                }
            }
            assert!(
                q.discards.len() <= 1,
                "discards pile up: {}",
                q.discards.len()
            );
        }
        assert!(discards_served >= 99, "{discards_served}");
    }

    #[test]
    fn a_stream_of_loads_lets_background_work_through() {
        let mut q = Queues::default();
        q.stores.push_back(marker(10));
        q.discards.push_back(marker(20));
        let mut order = Vec::new();
        for _ in 0..(2 * (FOREGROUND_BURST as usize + 1)) {
            // Each load popped is replaced by another: loads never run dry.
            q.loads.push_back(marker(1));
            q.probes.push_back(marker(2));
            let Some(Work::Touch(keys, _)) = q.pop() else {
                unreachable!("markers queued")
            };
            order.push(keys[0]);
            q.loads.clear();
            q.probes.clear();
        }
        let burst = FOREGROUND_BURST as usize;
        assert!(order[..burst].iter().all(|&n| n == 1), "{order:?}");
        assert_eq!(order[burst], 10, "{order:?}");
        assert!(
            order[burst + 1..2 * burst + 1].iter().all(|&n| n == 1),
            "{order:?}"
        );
        assert_eq!(order[2 * burst + 1], 20, "{order:?}");
    }

    #[test]
    fn without_background_work_loads_go_on_without_a_break() {
        let mut q = Queues::default();
        for _ in 0..100 {
            q.loads.push_back(marker(1));
        }
        q.probes.push_back(marker(2));
        let served = served(&mut q);
        assert_eq!(served.len(), 101);
        assert_eq!(served[100], 2);
    }

    #[test]
    fn either_lane_alone_is_drained() {
        let mut q = Queues::default();
        for n in [20, 21, 22] {
            q.discards.push_back(marker(n));
        }
        assert_eq!(served(&mut q), [20, 21, 22]);
        for n in [10, 11] {
            q.stores.push_back(marker(n));
        }
        assert_eq!(served(&mut q), [10, 11]);
    }

    /// Starts `n` workers on `queue` and waits until one polls and the
    /// others sleep. Each worker reports each piece it takes on the
    /// channel, then holds it (as a slow storage call would) until `release`
    /// is set or the queue shuts down.
    fn settled_workers(
        queue: &std::sync::Arc<WorkQueue>,
        n: usize,
        release: &std::sync::Arc<AtomicBool>,
    ) -> (
        Vec<std::thread::JoinHandle<()>>,
        std::sync::mpsc::Receiver<()>,
    ) {
        let (tx, rx) = std::sync::mpsc::channel();
        let workers = (0..n)
            .map(|_| {
                let (queue, tx, release) = (queue.clone(), tx.clone(), release.clone());
                std::thread::spawn(move || {
                    while queue.next(Duration::from_secs(5)).is_some() {
                        tx.send(()).unwrap();
                        while !queue.shutdown.load(Ordering::Acquire)
                            && !release.load(Ordering::Acquire)
                        {
                            std::thread::sleep(Duration::from_millis(1));
                        }
                    }
                })
            })
            .collect();
        let deadline = Instant::now() + Duration::from_secs(5);
        while queue.sleepers.load(Ordering::SeqCst) < n - 1
            || queue.spinning.load(Ordering::SeqCst) < 1
        {
            assert!(Instant::now() < deadline, "workers never settled");
            std::thread::yield_now();
        }
        (workers, rx)
    }

    fn stop(queue: &WorkQueue, workers: Vec<std::thread::JoinHandle<()>>) {
        queue.shutdown.store(true, Ordering::Release);
        queue.available.notify_all();
        for w in workers {
            w.join().unwrap();
        }
    }

    /// Work queued one piece at a time while a worker polls: the poller
    /// takes one piece, and each of the others wakes a sleeping worker. A
    /// push used to count the poller against every piece queued while it
    /// polled, so a burst of one-block jobs submitted at once all ran on
    /// the poller, one after another, with the other workers asleep.
    #[test]
    fn a_burst_queued_while_one_worker_polls_wakes_the_sleepers() {
        let queue = std::sync::Arc::new(WorkQueue::new());
        let release = std::sync::Arc::new(AtomicBool::new(false));
        // One worker polls, two sleep.
        let (workers, rx) = settled_workers(&queue, 3, &release);
        for n in 0..3 {
            queue
                .push_all(Lane::Probes, std::iter::once(marker(n)))
                .ok()
                .unwrap();
        }
        let busy = (0..3)
            .filter(|_| rx.recv_timeout(Duration::from_secs(2)).is_ok())
            .count();
        stop(&queue, workers);
        assert_eq!(
            busy, 3,
            "pieces of work queued while a worker polled were left waiting"
        );
    }

    /// A store job's discard queued beside its copy while a worker polls
    /// wakes no sleeper: the poller takes one, then the other. The poller
    /// can take the discard before the copy is queued (a preempted test
    /// thread on a loaded machine), and then waking the sleeper is right; so
    /// the pair is tried a few times and must go unwoken at least once.
    #[test]
    fn a_discard_beside_a_copy_wakes_no_sleeper_while_a_worker_polls() {
        let mut woken_every_time = true;
        for _ in 0..5 {
            let queue = std::sync::Arc::new(WorkQueue::new());
            let release = std::sync::Arc::new(AtomicBool::new(false));
            let (workers, rx) = settled_workers(&queue, 2, &release);
            queue
                .push_all(Lane::Discards, std::iter::once(Work::Discard(Vec::new())))
                .ok()
                .unwrap();
            queue
                .push_all(Lane::Probes, std::iter::once(marker(1)))
                .ok()
                .unwrap();
            let first = rx.recv_timeout(Duration::from_secs(2)).is_ok();
            let woken = rx.recv_timeout(Duration::from_millis(300)).is_ok();
            // The poller, done with its piece, takes the other.
            release.store(true, Ordering::Release);
            let second = woken || rx.recv_timeout(Duration::from_secs(2)).is_ok();
            stop(&queue, workers);
            assert!(first, "the poller took nothing");
            assert!(second, "the second piece was never taken");
            if !woken {
                woken_every_time = false;
                break;
            }
        }
        assert!(
            !woken_every_time,
            "the sleeper was woken for the pair, five times out of five"
        );
    }
}
