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
//! the start-up is done (or has already aborted inside `tier_new`'s caller's
//! own call, where the memory ran out).

use std::thread::{Builder, JoinHandle};

/// Spawns `f` on a thread made by `builder` and waits until that thread has
/// started running it. Costs one rendezvous (tens of microseconds), paid at
/// `tier_new` and when the watchdog replaces a stuck worker.
pub(crate) fn spawn_running<F, T>(builder: Builder, f: F) -> std::io::Result<JoinHandle<T>>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    let (started, running) = std::sync::mpsc::sync_channel::<()>(1);
    let handle = builder.spawn(move || {
        let _ = started.send(());
        f()
    })?;
    // Err only if the thread ended without sending, which its start-up
    // failing would have turned into an abort: nothing to wait for then.
    let _ = running.recv();
    Ok(handle)
}
