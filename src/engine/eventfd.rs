//! The completion descriptor: a non-blocking eventfd that the results queue
//! makes readable while results wait (see `Completions`), and the callers'
//! own eventfds the library adds 1 to as jobs of a kind finish. The only
//! system calls of the completion path, when a caller has asked for them.

use crate::error::{bail, Error, ErrorKind, Result};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

pub(crate) struct EventFd(OwnedFd);

impl EventFd {
    /// A new eventfd at 0 (not readable), non-blocking and close-on-exec.
    /// Fails with `Io` for want of descriptors, `Alloc` of kernel memory.
    pub(crate) fn new() -> Result<EventFd> {
        // SAFETY: no pointers; the result is checked before use.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            let err = std::io::Error::last_os_error();
            let kind = match err.raw_os_error() {
                Some(libc::ENOMEM) => ErrorKind::Alloc,
                _ => ErrorKind::Io,
            };
            return Err(Error::new(kind, format!("eventfd: {err}")));
        }
        // SAFETY: `fd` was just created and is owned by nothing else.
        Ok(EventFd(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// The library's own duplicate of a caller's eventfd, so that the caller
    /// may close theirs at any time and a number reused after that is never
    /// written. Fails with `InvalidArg` for a descriptor that is not an
    /// eventfd (writing 8 bytes to a file or socket would corrupt it), `Io`
    /// for want of descriptors.
    pub(crate) fn duplicate(fd: BorrowedFd<'_>) -> Result<EventFd> {
        let raw = fd.as_raw_fd();
        let link = std::fs::read_link(format!("/proc/self/fd/{raw}")).map_err(|e| {
            let kind = match e.kind() {
                std::io::ErrorKind::NotFound => ErrorKind::InvalidArg,
                _ => ErrorKind::Io,
            };
            Error::new(kind, format!("fd {raw} is not an open descriptor: {e}"))
        })?;
        if link.as_os_str() != "anon_inode:[eventfd]" {
            bail!(
                InvalidArg,
                "fd {raw} is {} and not an eventfd: only eventfds are written",
                link.display()
            );
        }
        let owned = fd
            .try_clone_to_owned()
            .map_err(|e| Error::new(ErrorKind::Io, format!("duplicating fd {raw}: {e}")))?;
        Ok(EventFd(owned))
    }

    pub(crate) fn raw(&self) -> RawFd {
        self.0.as_raw_fd()
    }

    /// Adds 1 to the counter, making the descriptor readable. Cannot fail
    /// as used: the completion descriptor is written only from 0 (see
    /// `Completions`), and a caller's notify descriptor, which its owner
    /// resets when it likes, stays out of reach of the limit (2^64 - 2).
    pub(crate) fn signal(&self) {
        let one = 1u64.to_ne_bytes();
        // SAFETY: writes 8 bytes from a live local buffer to our descriptor.
        let _ = unsafe { libc::write(self.raw(), one.as_ptr().cast(), one.len()) };
    }

    /// Makes the descriptor unreadable again (reads the counter back to 0;
    /// at 0 already, the non-blocking read just fails with EAGAIN).
    pub(crate) fn reset(&self) {
        let mut count = [0u8; 8];
        // SAFETY: reads at most 8 bytes into a live local buffer.
        let _ = unsafe { libc::read(self.raw(), count.as_mut_ptr().cast(), count.len()) };
    }

    /// In a forked child, which shares the eventfd with the parent: points
    /// the descriptor at /dev/null (dup3 is atomic), so that nothing in the
    /// child can steal or fake the parent's wake-ups, and the number stays
    /// taken (closing it would let a later open in the child reuse a number
    /// the tier still names). Takes no lock.
    pub(crate) fn detach_in_forked_child(&self) {
        self.point_at_dev_null();
    }

    /// At `tier_free` with threads left stuck on the device (which keep the
    /// tier's state, this descriptor's owner, alive until their calls
    /// return): the caller's eventfd goes now, as `tier_completion_fd`
    /// promises, while the number stays taken until then, so that nothing
    /// could ever write to a descriptor the caller opened since under it.
    pub(crate) fn retire(&self) {
        self.point_at_dev_null();
    }

    fn point_at_dev_null(&self) {
        // SAFETY: plain descriptor calls on a NUL-terminated path and on our
        // own descriptor.
        unsafe {
            let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
            if null >= 0 {
                libc::dup3(null, self.raw(), libc::O_CLOEXEC);
                libc::close(null);
            }
        }
    }
}
