//! Telling a forked child from the process that built a tier.
//!
//! `fork()` copies the calling thread only. A tier inherited by a child still
//! has its index, queue and results, but none of its I/O threads: a submit
//! would be accepted and never reported, `drain` would block forever, and any
//! lock a parent thread held at the fork stays locked in the child. So a tier
//! remembers the fork generation it was built in, and every call compares it
//! with the current one: one relaxed load and a compare on the hot path, where
//! `getpid()` would be a system call (glibc stopped caching it in 2.25).
//!
//! The generation is bumped by a `pthread_atfork` child handler, which runs in
//! the child before `fork()` returns there. Relaxed ordering is enough: the
//! handler runs on the child's only thread, so that thread's later calls see
//! the bump in program order, and threads the child starts later are ordered
//! after it by thread creation. A child of a child bumps it again, so a tier
//! built in the child is refused in the grandchild, as it should be.
//!
//! Not seen: children made without the atfork handlers (glibc's `_Fork`, a raw
//! `clone` or `syscall(SYS_fork)`). Those are documented as unsupported. A child
//! that only `exec`s (`posix_spawn`, `subprocess`) never calls the library.

use crate::error::{bail, Result};
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::Once;

/// How many forks lie between this process and the first one that loaded the
/// library (counted only once a tier has been built, which is all that matters:
/// a tier records the value at build).
static GENERATION: AtomicU64 = AtomicU64::new(0);

static REGISTER: Once = Once::new();
/// The `pthread_atfork` result (0 on success), set once by `REGISTER`.
static REGISTER_ERROR: AtomicI32 = AtomicI32::new(0);

/// Runs in the child of every `fork()` of this process. Async-signal-safe: one
/// atomic add, no allocation, no lock.
extern "C" fn in_child() {
    GENERATION.fetch_add(1, Ordering::Relaxed);
}

/// Registers the child handler (once per process; a child inherits it) and
/// returns the current generation. Fails only if `pthread_atfork` cannot
/// allocate, in which case no tier can be trusted after a fork and none is
/// built.
///
/// Registered from inside the library, so glibc ties the handler to this
/// shared object and drops it if the library is ever unloaded.
pub(crate) fn register() -> Result<u64> {
    REGISTER.call_once(|| {
        // SAFETY: `in_child` is a plain extern "C" fn that is async-signal-safe.
        let rc = unsafe { libc::pthread_atfork(None, None, Some(in_child)) };
        REGISTER_ERROR.store(rc, Ordering::Relaxed);
    });
    let rc = REGISTER_ERROR.load(Ordering::Relaxed);
    if rc != 0 {
        let err = std::io::Error::from_raw_os_error(rc);
        bail!(Alloc, "could not register the fork handler: {err}");
    }
    Ok(generation())
}

/// The current fork generation.
#[inline]
pub(crate) fn generation() -> u64 {
    GENERATION.load(Ordering::Relaxed)
}

/// This process's id.
pub(crate) fn pid() -> u32 {
    std::process::id()
}
