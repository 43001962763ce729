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
#[derive(Default)]
pub(crate) struct Condvar(std::sync::Condvar);

impl Condvar {
    pub(crate) const fn new() -> Condvar {
        Condvar(std::sync::Condvar::new())
    }

    pub(crate) fn notify_one(&self) {
        self.0.notify_one();
    }

    pub(crate) fn notify_all(&self) {
        self.0.notify_all();
    }

    /// Releases the lock, sleeps until notified, and takes the lock again.
    pub(crate) fn wait<T>(&self, guard: &mut MutexGuard<'_, T>) {
        let held = guard.0.take().expect("a guard is held outside a wait");
        guard.0 = Some(self.0.wait(held).unwrap_or_else(PoisonError::into_inner));
    }

    /// [`Condvar::wait`] for at most `timeout`.
    pub(crate) fn wait_for<T>(
        &self,
        guard: &mut MutexGuard<'_, T>,
        timeout: Duration,
    ) -> WaitTimeoutResult {
        let held = guard.0.take().expect("a guard is held outside a wait");
        let (held, result) = self
            .0
            .wait_timeout(held, timeout)
            .unwrap_or_else(PoisonError::into_inner);
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
