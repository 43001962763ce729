//! One read in flight beside the worker's own work, by Linux native AIO: a
//! streamed load reads a block's next piece while it copies the current one
//! into the row (see `read::read_streamed`). Only O_DIRECT reads are
//! asynchronous there; where AIO is unavailable the caller reads
//! synchronously.

use super::io::Fd;
use std::cell::Cell;
use std::io;

/// `struct iocb` (linux/aio_abi.h).
#[repr(C)]
#[derive(Default)]
struct Iocb {
    aio_data: u64,
    #[cfg(target_endian = "little")]
    aio_key: u32,
    aio_rw_flags: i32,
    #[cfg(target_endian = "big")]
    aio_key: u32,
    aio_lio_opcode: u16,
    aio_reqprio: i16,
    aio_fildes: u32,
    aio_buf: u64,
    aio_nbytes: u64,
    aio_offset: i64,
    aio_reserved2: u64,
    aio_flags: u32,
    aio_resfd: u32,
}

/// `struct io_event`.
#[repr(C)]
#[derive(Default)]
struct IoEvent {
    data: u64,
    obj: u64,
    res: i64,
    res2: i64,
}

const IOCB_CMD_PREAD: u16 = 0;

/// This thread's AIO context, made on first use and destroyed when the
/// thread ends; 0 while there is none (or it could not be made).
struct Context(Cell<libc::c_ulong>, Cell<bool>);

impl Drop for Context {
    fn drop(&mut self) {
        if self.0.get() != 0 {
            // SAFETY: a context this thread made; no read is in flight (a
            // `Pending` reaps its read before it is dropped).
            unsafe { libc::syscall(libc::SYS_io_destroy, self.0.get()) };
        }
    }
}

thread_local! {
    static CONTEXT: Context = const { Context(Cell::new(0), Cell::new(false)) };
}

fn context() -> Option<libc::c_ulong> {
    CONTEXT.with(|c| {
        if c.0.get() == 0 && !c.1.get() {
            c.1.set(true);
            let mut ctx: libc::c_ulong = 0;
            // SAFETY: io_setup writes the new context into `ctx`.
            if unsafe { libc::syscall(libc::SYS_io_setup, 1, &mut ctx) } == 0 {
                c.0.set(ctx);
            }
        }
        (c.0.get() != 0).then(|| c.0.get())
    })
}

/// A read submitted and not yet reaped. It is reaped (waited for) when
/// dropped, so the buffer it reads into is never reused or freed while the
/// kernel may still write it.
pub(crate) struct Pending {
    ctx: libc::c_ulong,
    reaped: bool,
}

/// Starts reading `len` bytes at `offset` of `fd` into `buf`; None if this
/// thread cannot (no AIO here): the caller reads synchronously.
///
/// # Safety
/// `buf..buf + len` must stay valid and untouched by the caller until the
/// returned `Pending` is waited for or dropped.
pub(crate) unsafe fn read(fd: &Fd, buf: *mut u8, len: usize, offset: u64) -> Option<Pending> {
    let ctx = context()?;
    let mut cb = Iocb {
        aio_lio_opcode: IOCB_CMD_PREAD,
        aio_fildes: fd.raw() as u32,
        aio_buf: buf as u64,
        aio_nbytes: len as u64,
        aio_offset: offset as i64,
        ..Iocb::default()
    };
    let mut list = [&mut cb as *mut Iocb];
    loop {
        // SAFETY: one iocb describing memory the caller keeps valid; the
        // kernel copies the iocb itself during the call.
        let n = unsafe { libc::syscall(libc::SYS_io_submit, ctx, 1, list.as_mut_ptr()) };
        if n == 1 {
            return Some(Pending { ctx, reaped: false });
        }
        if n < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
            continue;
        }
        return None;
    }
}

impl Pending {
    /// Waits for the read; returns the bytes read (fewer only at the end of
    /// the file, or the caller reads the rest).
    pub(crate) fn wait(mut self) -> io::Result<usize> {
        self.reap()
    }

    fn reap(&mut self) -> io::Result<usize> {
        self.reaped = true;
        let mut event = IoEvent::default();
        loop {
            // SAFETY: one event slot to fill; no timeout (the engine's
            // watchdog, not this call, bounds how long a job waits).
            let n = unsafe {
                libc::syscall(
                    libc::SYS_io_getevents,
                    self.ctx,
                    1,
                    1,
                    &mut event,
                    std::ptr::null_mut::<libc::timespec>(),
                )
            };
            if n == 1 {
                return match event.res {
                    res if res < 0 => Err(io::Error::from_raw_os_error(-res as i32)),
                    res => Ok(res as usize),
                };
            }
            let err = io::Error::last_os_error();
            if n < 0 && err.raw_os_error() != Some(libc::EINTR) {
                return Err(err);
            }
        }
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if !self.reaped {
            let _ = self.reap();
        }
    }
}
