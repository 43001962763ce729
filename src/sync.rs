//! The crate's locks and condition variables: std's, behind the small API the
//! code was written against (`lock()` returns the guard, a wait takes
//! `&mut guard`).
//!
//! Why not parking_lot: it keeps one process-wide table of parked threads,
//! whose queues link nodes living in each parked thread's stack. After
//! `fork()` the child still lists the parent's parked workers, threads that do
//! not exist there; glibc gives their stacks to the child's new threads, whose
//! nodes overwrite the listed ones, and a lock or condition variable of a tier
//! the child creates that hashes to such a bucket loses wake-ups (`drain`
//! hung; `tests/fork_new_tier.rs`). std's primitives are futexes whose whole
//! state lives in the object: nothing global to inherit.
//!
//! Poisoning is ignored, as parking_lot did. A worker's copy, the code most
//! exposed to the outside (caller rows, backend I/O), runs under
//! `catch_unwind` without the index, queue or results lock; what it may hold
//! is a backend's stripe lock, `Mutex<()>`, which guards no data. Elsewhere a
//! panic under a lock is a bug (the FFI boundary reports it as
//! `TIER_ERR_PANIC`); poisoning would turn it into a panic on every later
//! call, and end any worker thread that took the lock next.

use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::PoisonError;
use std::time::{Duration, Instant};

/// A mutual exclusion lock; `lock` ignores poisoning.
#[derive(Default)]
pub(crate) struct Mutex<T>(std::sync::Mutex<T>);

impl<T> Mutex<T> {
    pub(crate) const fn new(value: T) -> Mutex<T> {
        Mutex(std::sync::Mutex::new(value))
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
        MutexGuard(Some(self.0.lock().unwrap_or_else(PoisonError::into_inner)))
    }
}

/// A reader-writer lock; `read` and `write` ignore poisoning.
#[derive(Default)]
pub(crate) struct RwLock<T>(std::sync::RwLock<T>);

impl<T> RwLock<T> {
    pub(crate) const fn new(value: T) -> RwLock<T> {
        RwLock(std::sync::RwLock::new(value))
    }

    pub(crate) fn read(&self) -> std::sync::RwLockReadGuard<'_, T> {
        self.0.read().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn write(&self) -> std::sync::RwLockWriteGuard<'_, T> {
        self.0.write().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A held [`Mutex`]. The `Option` lets a wait hand std's guard to std's
/// condition variable and take it back through `&mut`; it is `None` only
/// inside a wait.
pub(crate) struct MutexGuard<'a, T>(Option<std::sync::MutexGuard<'a, T>>);

impl<T> Deref for MutexGuard<'_, T> {
    type Target = T;
    #[inline]
    fn deref(&self) -> &T {
        self.0.as_deref().expect("a guard is held outside a wait")
    }
}

impl<T> DerefMut for MutexGuard<'_, T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut T {
        self.0
            .as_deref_mut()
            .expect("a guard is held outside a wait")
    }
}

/// Whether a timed wait ended because its time ran out.
pub(crate) struct WaitTimeoutResult(bool);

impl WaitTimeoutResult {
    pub(crate) fn timed_out(&self) -> bool {
        self.0
    }
}

/// A condition variable; like any, it may wake spuriously, so callers wait in
/// a loop on their condition.
///
/// std's `notify_*` always makes a system call (`FUTEX_WAKE`), even with no
/// one waiting, which is the common case here (a job completes, nobody is in
/// `drain`). So it counts its waiters, as parking_lot did in its table, and a
/// notify with none costs one load. That loses no wake-up as long as wakers
/// change the condition under the mutex the waiter holds, as every one here
/// does: a waiter counts itself before that mutex is released inside the
/// wait, so a waker that took the mutex after sees the count.
#[derive(Default)]
pub(crate) struct Condvar {
    inner: std::sync::Condvar,
    waiters: AtomicUsize,
}

impl Condvar {
    pub(crate) const fn new() -> Condvar {
        Condvar {
            inner: std::sync::Condvar::new(),
            waiters: AtomicUsize::new(0),
        }
    }

    pub(crate) fn notify_one(&self) {
        if self.waiters.load(Ordering::SeqCst) > 0 {
            self.inner.notify_one();
        }
    }

    pub(crate) fn notify_all(&self) {
        if self.waiters.load(Ordering::SeqCst) > 0 {
            self.inner.notify_all();
        }
    }

    /// Releases the lock, sleeps until notified, and takes the lock again.
    pub(crate) fn wait<T>(&self, guard: &mut MutexGuard<'_, T>) {
        let held = guard.0.take().expect("a guard is held outside a wait");
        self.waiters.fetch_add(1, Ordering::SeqCst);
        let held = self.inner.wait(held);
        self.waiters.fetch_sub(1, Ordering::SeqCst);
        guard.0 = Some(held.unwrap_or_else(PoisonError::into_inner));
    }

    /// [`Condvar::wait`] for at most `timeout`.
    pub(crate) fn wait_for<T>(
        &self,
        guard: &mut MutexGuard<'_, T>,
        timeout: Duration,
    ) -> WaitTimeoutResult {
        let held = guard.0.take().expect("a guard is held outside a wait");
        self.waiters.fetch_add(1, Ordering::SeqCst);
        let waited = self.inner.wait_timeout(held, timeout);
        self.waiters.fetch_sub(1, Ordering::SeqCst);
        let (held, result) = waited.unwrap_or_else(PoisonError::into_inner);
        guard.0 = Some(held);
        WaitTimeoutResult(result.timed_out())
    }

    /// [`Condvar::wait`] until `deadline` (timed out at once if it has passed).
    pub(crate) fn wait_until<T>(
        &self,
        guard: &mut MutexGuard<'_, T>,
        deadline: Instant,
    ) -> WaitTimeoutResult {
        self.wait_for(guard, deadline.saturating_duration_since(Instant::now()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_wait_gives_the_lock_away_and_takes_it_back() {
        let shared = Arc::new((Mutex::new(0u32), Condvar::new()));
        let other = Arc::clone(&shared);
        let setter = std::thread::spawn(move || {
            let (lock, changed) = &*other;
            *lock.lock() = 7;
            changed.notify_all();
        });
        let (lock, changed) = &*shared;
        let mut value = lock.lock();
        while *value != 7 {
            changed.wait(&mut value); // the setter could not lock otherwise
        }
        *value += 1;
        drop(value);
        setter.join().unwrap();
        assert_eq!(*lock.lock(), 8);
    }

    /// Two threads hand a turn back and forth, each sleeping until it is
    /// its own: a notify skipped while the other was about to wait would
    /// stall both (then the test fails after 30 s instead of hanging).
    #[test]
    fn counted_waiters_lose_no_wake_up_in_a_ping_pong() {
        const TURNS: u32 = 20_000;
        let shared = Arc::new((Mutex::new(0u32), Condvar::new()));
        let play = |parity: u32, shared: Arc<(Mutex<u32>, Condvar)>| {
            move || {
                let (turn, changed) = &*shared;
                let mut turn = turn.lock();
                while *turn < TURNS {
                    if *turn % 2 == parity {
                        *turn += 1;
                        changed.notify_all();
                    } else {
                        changed.wait(&mut turn);
                    }
                }
            }
        };
        let (done, finished) = std::sync::mpsc::channel();
        for parity in [0, 1] {
            let player = play(parity, Arc::clone(&shared));
            let done = done.clone();
            std::thread::spawn(move || {
                player();
                done.send(()).unwrap();
            });
        }
        for _ in 0..2 {
            finished
                .recv_timeout(Duration::from_secs(30))
                .expect("a wake-up was lost");
        }
        assert_eq!(*shared.0.lock(), TURNS);
    }

    #[test]
    fn timed_waits_report_a_timeout_and_keep_the_lock() {
        let lock = Mutex::new(1u32);
        let changed = Condvar::new();
        let mut value = lock.lock();
        assert!(changed
            .wait_for(&mut value, Duration::from_millis(5))
            .timed_out());
        let past = Instant::now();
        assert!(changed.wait_until(&mut value, past).timed_out());
        *value += 1;
        assert_eq!(*value, 2);
    }

    #[test]
    fn a_poisoned_lock_still_locks() {
        let lock = Arc::new(Mutex::new(1u32));
        let other = Arc::clone(&lock);
        let panicked = std::thread::spawn(move || {
            let _held = other.lock();
            panic!("poisons the lock");
        })
        .join();
        assert!(panicked.is_err());
        assert!(lock.0.is_poisoned());
        assert_eq!(*lock.lock(), 1);
    }
}
