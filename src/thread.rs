//! Starting the tier's long-lived threads so that they cannot abort the
//! process later.
//!
//! `std::thread::Builder::spawn` returns once the thread exists, before the
//! new thread has run the standard library's start-up, which maps its signal
//! stack. If memory (or address space under `RLIMIT_AS`) runs out in that
//! window, the start-up fails inside the new thread, where nothing can report
//! it, and std aborts the process ("failed to allocate an alternative stack").
//! A tier started its threads and returned from `tier_new`; an engine that
//! then used its memory up could be killed by a kvtier thread still starting.
//! [`spawn_running`] returns only once the thread runs the caller's code, so
//! its start-up is done before `tier_new` returns (a failure aborts during
//! that call, not at some later moment of the engine's).

use crate::sync::{Condvar, Mutex};
use std::sync::Arc;
use std::thread::{Builder, JoinHandle};

/// Spawns `f` on a thread made by `builder` and waits until that thread has
/// started running it: one rendezvous, paid at `tier_new` and when the
/// watchdog replaces a stuck worker.
///
/// The crate's futex-backed mutex and condition variable, not a channel: a channel's
/// `recv` registers the calling thread with std (`thread::current`), which on
/// an engine's own thread leaves a handle that lives until that thread ends
/// (valgrind reports it as possibly lost at exit).
pub(crate) fn spawn_running<F, T>(builder: Builder, f: F) -> std::io::Result<JoinHandle<T>>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    let running = Arc::new((Mutex::new(false), Condvar::new()));
    let told = Arc::clone(&running);
    let handle = builder.spawn(move || {
        let (started, wake) = &*told;
        *started.lock() = true;
        wake.notify_one();
        drop(told);
        f()
    })?;
    let (started, wake) = &*running;
    // The thread sets the flag before anything else it does; had its
    // start-up failed, std would have aborted the process.
    let mut started = started.lock();
    while !*started {
        wake.wait(&mut started);
    }
    Ok(handle)
}
