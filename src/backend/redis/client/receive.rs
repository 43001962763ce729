//! Reads from a connection's socket, within the request's deadline: into
//! the read buffer, or a payload's stretch straight into its row (`readv`),
//! TLS records decrypted by rustls, and the socket's wake-up mark
//! (SO_RCVLOWAT) while a large payload is on its way.

use super::send::NoSigpipe;
use super::transport::{
    closed, past_deadline, protocol_error, timed_out, tls_error, RespConn, Stream, Tls,
};
use std::io::{self, IoSliceMut, Read};
use std::os::fd::AsRawFd;
use std::time::Instant;

/// Most bytes a read of a payload waits for before it is woken (see
/// `RespConn::wake_after`): fewer wake-ups per large value; at 1 MiB, 2 MiB
/// values loaded fastest (`redis_loads ... load 2048 512 5`; figures in
/// docs/runs/redis.md).
pub(super) const WAKE_AFTER_MAX: usize = 1 << 20;

/// Fewer bytes left of a payload than this are read as they come.
pub(super) const WAKE_AFTER_MIN: usize = 64 << 10;

/// Most TLS reads [`RespConn::in_step`] makes of records that carry no
/// application data (session tickets, key updates) before it gives up on
/// a connection that keeps receiving them between requests.
const MAX_IDLE_RECORDS: usize = 16;

impl RespConn {
    /// What a reader must wait on before a reply can be read: None when
    /// something can be read now (bytes read and not consumed yet, plaintext
    /// rustls holds, or an error for the read to report), else the socket.
    /// Lets a cluster job read first the master that answered first.
    pub(in crate::backend::redis) fn waits_on(&mut self) -> Option<std::os::fd::RawFd> {
        if self.end > self.start {
            return None;
        }
        match &mut self.stream {
            Stream::Tcp(sock) => Some(sock.as_raw_fd()),
            Stream::Tls(tls) => match tls.conn.process_new_packets() {
                Ok(state) if state.plaintext_bytes_to_read() == 0 => Some(tls.sock.as_raw_fd()),
                _ => None,
            },
        }
    }

    /// Plaintext rustls holds decrypted and not read yet (0 over TCP; a
    /// connection whose records do not decrypt counts as holding some).
    pub(super) fn tls_plaintext_pending(&mut self) -> usize {
        match &mut self.stream {
            Stream::Tcp(_) => 0,
            Stream::Tls(tls) => match tls.conn.process_new_packets() {
                Ok(state) => state.plaintext_bytes_to_read(),
                Err(_) => 1,
            },
        }
    }

    /// Checks, before a request is sent, that nothing is there to read:
    /// bytes that arrive unasked are a reply to no request of this one (a
    /// server or proxy answering once too often), which the request would
    /// take for its own; and a server that closed the connection has left
    /// it. Either way the connection is closed (an error here). Over TLS,
    /// records without application data (session tickets) are taken in.
    pub(in crate::backend::redis) fn in_step(&mut self) -> io::Result<()> {
        if self.broken {
            return Err(closed());
        }
        let r = self.in_step_inner();
        self.check(r)
    }

    fn in_step_inner(&mut self) -> io::Result<()> {
        for _ in 0..MAX_IDLE_RECORDS {
            let surplus = self.end - self.start + self.tls_plaintext_pending();
            if surplus > 0 {
                return Err(unasked(surplus));
            }
            let fd = self.stream.tcp().as_raw_fd();
            let mut byte = 0u8;
            // SAFETY: a valid socket and a one-byte buffer of our own.
            let n = unsafe {
                libc::recv(
                    fd,
                    (&mut byte as *mut u8).cast(),
                    1,
                    libc::MSG_PEEK | libc::MSG_DONTWAIT,
                )
            };
            if n == 0 {
                return Err(closed());
            }
            if n < 0 {
                let e = io::Error::last_os_error();
                match e.kind() {
                    io::ErrorKind::WouldBlock => return Ok(()),
                    io::ErrorKind::Interrupted => continue,
                    _ => return Err(e),
                }
            }
            if matches!(self.stream, Stream::Tcp(_)) {
                return Err(unasked(n as usize));
            }
            // Bytes are there: the record read cannot block for long, but a
            // read must not meet the last request's deadline long passed.
            self.deadline = Instant::now() + self.timeout;
            self.receive_tls()?;
        }
        Err(protocol_error(
            "TLS records keep arriving between requests (the connection is out of step)",
        ))
    }

    /// One `read` into `dst` within the deadline; 0 bytes is an error (the
    /// server closed the connection).
    pub(super) fn read_some(&mut self, dst: &mut [u8]) -> io::Result<usize> {
        self.read_some_vectored(dst, &mut [])
    }

    /// Has the kernel wake this connection's read only once
    /// `coming` bytes, at most [`WAKE_AFTER_MAX`], are there (SO_RCVLOWAT),
    /// when that many are certainly on their way (what is left of a bulk
    /// payload; else 1, the default). Each wake-up of a reader sleeping in
    /// `read` costs the sender's CPU, and the sender is the server, which
    /// bounds large loads: loading 2 MiB values with a wake-up per 64 KiB
    /// loopback segment, redis-server 7.0 spent 7% of its CPU waking
    /// readers (`sock_def_readable`), against 1.4% under redis-benchmark's
    /// single reading thread. Best effort: a refusal leaves the wake-ups as
    /// they were. Plain TCP only (TLS reads records of its own).
    pub(super) fn wake_after(&mut self, coming: usize) {
        let want = match coming {
            n if n >= WAKE_AFTER_MAX => WAKE_AFTER_MAX,
            n if n >= WAKE_AFTER_MIN => n,
            _ => 1,
        };
        if want == self.rcvlowat {
            return;
        }
        let Stream::Tcp(tcp) = &self.stream else {
            return;
        };
        let value = want as libc::c_int;
        // SAFETY: a valid socket and an int option value of its size.
        let r = unsafe {
            libc::setsockopt(
                std::os::fd::AsRawFd::as_raw_fd(tcp),
                libc::SOL_SOCKET,
                libc::SO_RCVLOWAT,
                (&value as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if r == 0 {
            self.rcvlowat = want;
        }
    }

    /// Reads more into the buffer (compacting it first when needed).
    pub(super) fn fill(&mut self) -> io::Result<()> {
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        } else if self.end == self.buf.len() {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        let mut buf = std::mem::take(&mut self.buf);
        let got = self.read_some(&mut buf[self.end..]);
        self.buf = buf;
        self.end += got?;
        Ok(())
    }

    /// Reads TLS records from the socket and decrypts them, within the
    /// deadline (one socket read; records that need an answer, such as a
    /// key update, are answered).
    pub(super) fn receive_tls(&mut self) -> io::Result<()> {
        self.arm(true)?;
        let Stream::Tls(tls) = &mut self.stream else {
            unreachable!("a TLS connection")
        };
        let Tls { conn, sock } = &mut **tls;
        match conn.read_tls(&mut &*sock) {
            Ok(0) => return Err(closed()),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => return Ok(()),
            Err(e) => return Err(past_deadline(e)),
        }
        if let Err(e) = conn.process_new_packets() {
            // The alert rustls queued tells the server why (best effort).
            let _ = conn.write_tls(&mut NoSigpipe(sock));
            return Err(tls_error(e));
        }
        self.flush_tls()
    }

    /// One `readv` into `first`, then `then`, within the deadline; 0 bytes
    /// is an error (the server closed the connection).
    /// Over TLS: plaintext rustls has decrypted is copied into `first` (or
    /// `then` when `first` is empty), once; with none, records are read.
    pub(super) fn read_some_vectored(
        &mut self,
        first: &mut [u8],
        then: &mut [u8],
    ) -> io::Result<usize> {
        loop {
            if let Stream::Tls(tls) = &mut self.stream {
                let dst = if first.is_empty() {
                    &mut *then
                } else {
                    &mut *first
                };
                match tls.conn.reader().read(dst) {
                    // The server's close_notify.
                    Ok(0) if !dst.is_empty() => return Err(closed()),
                    Ok(n) => return Ok(n),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.receive_tls()?,
                    Err(e) => return Err(e),
                }
                continue;
            }
            if self.rcvlowat > 1 {
                match self.read_at_mark(first, then)? {
                    Some(n) => return Ok(n),
                    None => continue,
                }
            }
            self.arm(true)?;
            let mut slices = [IoSliceMut::new(first), IoSliceMut::new(then)];
            match self.stream.tcp().read_vectored(&mut slices) {
                Ok(0) => return Err(closed()),
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(past_deadline(e)),
            }
        }
    }

    /// A TCP read under a raised SO_RCVLOWAT (see `wake_after`): waits in
    /// `poll`, which wakes once the mark's bytes are there, then takes what
    /// is there without blocking; None if there was nothing after all
    /// (interrupted, spurious). Not a blocking read: one that copies some
    /// bytes and then sleeps is woken only by as many more, so it could
    /// sleep to the deadline with the payload's last bytes already queued.
    fn read_at_mark(&mut self, first: &mut [u8], then: &mut [u8]) -> io::Result<Option<usize>> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(timed_out());
        }
        let fd = std::os::fd::AsRawFd::as_raw_fd(self.stream.tcp());
        let mut ready = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // Rounded up: poll must not return before the deadline.
        let ms = left.as_micros().div_ceil(1000).min(i32::MAX as u128) as libc::c_int;
        // SAFETY: one valid pollfd.
        match unsafe { libc::poll(&mut ready, 1, ms) } {
            0 => return Err(timed_out()),
            n if n < 0 => {
                let e = io::Error::last_os_error();
                return match e.kind() {
                    io::ErrorKind::Interrupted => Ok(None),
                    _ => Err(e),
                };
            }
            _ => {}
        }
        let mut iov = [
            libc::iovec {
                iov_base: first.as_mut_ptr().cast(),
                iov_len: first.len(),
            },
            libc::iovec {
                iov_base: then.as_mut_ptr().cast(),
                iov_len: then.len(),
            },
        ];
        // SAFETY: zeroed is a valid empty msghdr; the iovecs describe
        // slices exclusively borrowed for this call.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = iov.as_mut_ptr();
        msg.msg_iovlen = iov.len() as _;
        // SAFETY: as above.
        let n = unsafe { libc::recvmsg(fd, &mut msg, libc::MSG_DONTWAIT) };
        if n < 0 {
            let e = io::Error::last_os_error();
            return match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(None),
                _ => Err(e),
            };
        }
        if n == 0 {
            return Err(closed());
        }
        Ok(Some(n as usize))
    }
}

/// Bytes found before a request was sent.
fn unasked(n: usize) -> io::Error {
    protocol_error(format!(
        "{n}+ bytes arrived before a request was sent (a reply nobody asked for: \
         the connection is out of step)"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::redis::client::reply::Head;
    use std::time::Duration;

    #[test]
    fn a_payload_trickling_in_is_read_as_it_comes_not_at_the_deadline() {
        // Under a raised SO_RCVLOWAT a blocking read that copied what was
        // queued would sleep until the mark's bytes more were queued, which
        // never happens for a payload of at most the mark: it would return
        // at the deadline. Each payload here is at most the mark. The
        // receive buffer is set large, as autotuning leaves it on a busy
        // connection (a small one wakes the reader by memory pressure).
        use std::io::Write;
        for len in [WAKE_AFTER_MIN, 600 << 10, WAKE_AFTER_MAX] {
            let payload: Vec<u8> = (0..len).map(|i| (i * 11 / 3) as u8).collect();
            let mut reply = format!("${len}\r\n").into_bytes();
            reply.extend_from_slice(&payload);
            reply.extend_from_slice(b"\r\n:7\r\n");
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = listener.local_addr().unwrap();
            let server = std::thread::spawn(move || {
                let (mut s, _) = listener.accept().unwrap();
                // Half at once, so that a read finds some queued; the rest
                // in pieces.
                let (first, rest) = reply.split_at(reply.len() / 2);
                s.write_all(first).unwrap();
                std::thread::sleep(Duration::from_millis(20));
                for piece in rest.chunks(20_000) {
                    s.write_all(piece).unwrap();
                    std::thread::sleep(Duration::from_millis(2));
                }
                std::thread::sleep(Duration::from_secs(6));
            });
            let stream = std::net::TcpStream::connect(addr).unwrap();
            let rcvbuf: libc::c_int = 8 << 20;
            // SAFETY: a valid socket and an int option value of its size.
            let r = unsafe {
                libc::setsockopt(
                    std::os::fd::AsRawFd::as_raw_fd(&stream),
                    libc::SOL_SOCKET,
                    libc::SO_RCVBUF,
                    (&rcvbuf as *const libc::c_int).cast(),
                    std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                )
            };
            assert_eq!(r, 0);
            let mut c = RespConn::over(stream, Duration::from_secs(5)).unwrap();
            let start = std::time::Instant::now();
            c.begin();
            assert_eq!(c.read_head().unwrap(), Head::Bulk(len));
            let mut dst = vec![0u8; len];
            c.read_into(&mut dst).unwrap();
            assert_eq!(c.rcvlowat, 1, "the mark outlived the payload");
            c.read_crlf().unwrap();
            assert_eq!(c.read_head().unwrap(), Head::Int(7));
            assert!(dst == payload, "{len} bytes");
            // 2 ms between pieces: 0.1 s for 1 MiB; the deadline is 5 s.
            let took = start.elapsed();
            assert!(took < Duration::from_secs(3), "{len} bytes took {took:?}");
            drop(c);
            drop(server); // detached: it sleeps out its 6 s
        }
    }
}
