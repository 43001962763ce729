//! A tier seen from a child made by `fork()`: the handle was copied but none
//! of its worker threads exist there, so every call fails at once and `drop`
//! releases only what is safe.

use super::Tier;
use crate::error::{Error, ErrorKind, Result};
use crate::fork;
use std::sync::Arc;

impl Tier {
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
    pub(super) fn inherited(&self) -> bool {
        fork::generation() != self.fork_generation
    }

    #[cold]
    pub(super) fn inherited_error(&self) -> Error {
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

    /// `drop` in a forked child: releases what is safe to release and leaks
    /// the rest, on purpose.
    ///
    /// - The worker threads do not exist here, so they are not joined, and
    ///   their `JoinHandle`s (kept by `Shared`'s crew, which is leaked, see
    ///   below) are never dropped: dropping one calls `pthread_detach` on a
    ///   `pthread_t` of the parent, whose memory glibc has already recycled
    ///   in the child (its stack cache), possibly for a thread the child
    ///   started since.
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
    ///   Likewise the completion eventfd, which the child shares with the
    ///   parent: its number is pointed at /dev/null.
    ///
    /// The primary buffer is not touched (nothing here runs a copy), so the
    /// promise of `tier_free` holds in the child too.
    pub(super) fn abandon_in_forked_child(&mut self) {
        std::mem::forget(Arc::clone(&self.shared));
        self.shared.backend.release_in_forked_child();
        self.shared.done.release_fd_in_forked_child();
    }
}
