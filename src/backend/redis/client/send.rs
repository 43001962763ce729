//! Writing to a connection within the request's deadline: the caller's
//! slices in vectored `sendmsg` calls (MSG_NOSIGNAL: never a SIGPIPE), or,
//! over TLS, handed to rustls, which encrypts them into records sent the
//! same way.

use super::transport::{closed, past_deadline, RespConn, Stream, Tls};
use std::io::{self, IoSlice, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;

/// Most commands written per `writev` call (the kernel's IOV_MAX is 1024).
pub(super) const MAX_IOV: usize = 1024;

/// The socket as rustls's output: `sendmsg` with MSG_NOSIGNAL, like the
/// plain TCP writes (rustls would `writev`, which raises SIGPIPE).
pub(super) struct NoSigpipe<'a>(pub(super) &'a TcpStream);

impl Write for NoSigpipe<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        send_vectored(self.0, &[IoSlice::new(buf)])
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        send_vectored(self.0, &bufs[..bufs.len().min(MAX_IOV)])
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl RespConn {
    /// Writes all of `slices` within the deadline.
    pub(in crate::backend::redis) fn write_all_vectored(
        &mut self,
        mut slices: &mut [IoSlice<'_>],
    ) -> io::Result<()> {
        let r = (|| {
            // Empty slices would make a zero-length write look like progress.
            while !slices.is_empty() {
                let upto = slices.len().min(MAX_IOV);
                if let Stream::Tls(tls) = &mut self.stream {
                    let took = tls.conn.writer().write_vectored(&slices[..upto])?;
                    let stuck = took == 0 && !tls.conn.wants_write();
                    IoSlice::advance_slices(&mut slices, took);
                    if stuck && slices.iter().any(|s| !s.is_empty()) {
                        return Err(io::Error::other("TLS: rustls took no plaintext"));
                    }
                    self.flush_tls()?;
                    continue;
                }
                self.arm(false)?;
                match send_vectored(self.stream.tcp(), &slices[..upto]) {
                    Ok(0) => return Err(closed()),
                    Ok(n) => IoSlice::advance_slices(&mut slices, n),
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(past_deadline(e)),
                }
            }
            Ok(())
        })();
        self.check(r)
    }

    /// Sends the TLS records rustls holds, within the deadline (nothing to
    /// do over plain TCP).
    pub(super) fn flush_tls(&mut self) -> io::Result<()> {
        loop {
            match &self.stream {
                Stream::Tls(tls) if tls.conn.wants_write() => {}
                _ => return Ok(()),
            }
            self.arm(false)?;
            let Stream::Tls(tls) = &mut self.stream else {
                unreachable!("checked above")
            };
            let Tls { conn, sock } = &mut **tls;
            match conn.write_tls(&mut NoSigpipe(sock)) {
                Ok(0) => return Err(closed()),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(past_deadline(e)),
            }
        }
    }

    /// Writes `out[from..to]` (framed commands) within the deadline.
    pub(in crate::backend::redis) fn send_out_range(
        &mut self,
        from: usize,
        to: usize,
    ) -> io::Result<()> {
        let out = std::mem::take(&mut self.out);
        let r = self.write_all_vectored(&mut [IoSlice::new(&out[from..to])]);
        self.out = out;
        r
    }
}

/// `sendmsg` with MSG_NOSIGNAL: a peer that closed the connection is an
/// EPIPE error here, never a SIGPIPE (`TcpStream::write_vectored` is a plain
/// `writev`, and SIGPIPE's default action would kill a C host process that
/// does not ignore it).
fn send_vectored(stream: &TcpStream, slices: &[IoSlice<'_>]) -> io::Result<usize> {
    // SAFETY: an all-zero msghdr is valid; IoSlice is ABI-compatible with
    // iovec, and the slices outlive the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = slices.as_ptr() as *mut libc::iovec;
    msg.msg_iovlen = slices.len() as _;
    let sent = unsafe { libc::sendmsg(stream.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
    if sent < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(sent as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::super::fake::serve;
    use super::*;
    use std::time::Duration;

    const T: Duration = Duration::from_millis(300);

    /// Writing to a peer that closed is an error, not a SIGPIPE: checked in
    /// a child process (this test binary again) with SIGPIPE's default
    /// action restored, as in a C host that never ignored it.
    #[test]
    fn writes_to_a_closed_peer_fail_without_sigpipe() {
        const CHILD: &str = "KVTIER_SIGPIPE_CHILD";
        if std::env::var_os(CHILD).is_some() {
            // SAFETY: restoring a signal's default action.
            unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
            let (mut c, server) = serve(0, Vec::new(), false, T);
            server.received.join().unwrap();
            let big = vec![7u8; 1 << 20];
            let mut failed = None;
            for _ in 0..20 {
                c.begin();
                if let Err(e) = c.write_all_vectored(&mut [IoSlice::new(&big)]) {
                    failed = Some(e);
                    break;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            let e = failed.expect("writes to a closed peer should fail");
            assert!(!c.is_open_for_tests(), "{e}");
            println!("child: write failed with {e}");
            return;
        }
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "backend::redis::client::send::tests::writes_to_a_closed_peer_fail_without_sigpipe",
                "--nocapture",
            ])
            .env(CHILD, "1")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("child: write failed"),
            "{:?}\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
