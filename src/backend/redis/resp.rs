//! kvtier's own connection to one server, over plain TCP or TLS (rustls),
//! speaking RESP2.
//!
//! Why not the crate's connection: its reader parses every reply into an
//! owned `Value` (a 2 MiB GET reply is read into one buffer and copied into a
//! `Vec`, which kvtier then copies into the row), and its writer packs every
//! command, payload included, into one more buffer before the socket write.
//! Measured on loopback, that leaves the crate alone at 0.3–0.4× of
//! redis-benchmark's rate (docs/redis.md, "Why not the crate alone"). This connection
//! gives the data path (`direct`) what it needs to do neither: vectored
//! writes from the caller's slices, reply heads parsed from a small reusable
//! buffer, and bulk payloads read from the socket straight into a caller's
//! slice. It also implements the crate's `ConnectionLike`, so every other
//! command (PING, DEL, EXISTS, TOUCH, single GET/SET) keeps using the crate's
//! command builders and reply conversions over this socket.
//!
//! Deadlines: a request (one command or one pipeline) gets `timeout` from its
//! start; every socket read and write is bounded by the time left, so a
//! server that stops answering costs at most `timeout` (plus an eighth: the
//! socket's timeout is re-armed only when the one set would overrun the
//! deadline by more than that, which spares a system call per read). Any I/O or protocol
//! error leaves the connection unusable (`is_open` false); the pool drops it.
//!
//! TLS (`rediss://`, configured by `tls`): the same requests over rustls's
//! buffered client connection, driven here on the same socket so that the
//! deadlines and the SIGPIPE-free writes stay as they are. Writes hand the
//! caller's slices to rustls in one vectored call, which cuts records of up
//! to 16 KiB across them (a framing slice never becomes a record of its
//! own) and encrypts each into a buffer of its own, sent with one vectored
//! system call. Reads copy the decrypted plaintext once, out of rustls's
//! buffer, into the destination (a row, for payloads). What rustls itself
//! does per record is rustls's (0.23): one buffer allocated for each record
//! encrypted and for each application-data record received, which no public
//! API avoids; kvtier adds nothing per block on top.

use super::tls;
use redis::{ConnectionLike, RedisConnectionInfo, RedisResult, Value};
use rustls::ClientConfig;
use std::io::{self, IoSlice, IoSliceMut, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Read buffer: reply heads, small replies, and whatever part of a payload
/// arrives with them. Payloads beyond it are read straight into their row.
const READ_BUF: usize = 64 << 10;
/// Bytes read into the buffer beyond a payload read straight into its row,
/// in the same call: the payload's CRLF and the next reply's head, and the
/// start of its payload (copied once from the buffer). Small, so that a
/// pipeline of large values is read almost entirely into the rows (64 KiB
/// values: a whole buffer of each value was copied before), and big enough
/// that the next head rarely needs a call of its own.
const READ_AHEAD: usize = 4 << 10;
/// Most bytes a read of a payload waits for before it is woken (see
/// `RespConn::wake_after`). Loading 2 MiB values from one loopback
/// redis-server (`redis_loads ... load 2048 512 5`, two alternating rounds,
/// GB/s): woken per segment 2.37 and 2.42; at 256 KiB 2.47; 512 KiB 2.65;
/// 1 MiB 3.04 and 3.01; 2 MiB 2.94 and 2.93; 4 MiB 2.95 and 2.85.
const WAKE_AFTER_MAX: usize = 1 << 20;
/// Fewer bytes left of a payload than this are read as they come.
const WAKE_AFTER_MIN: usize = 64 << 10;
/// Longest reply line (status, error, length) accepted: a longer one is a
/// protocol error, not a reason to grow without bound.
const MAX_LINE: usize = 16 << 10;
/// Most commands written per `writev` call (the kernel's IOV_MAX is 1024).
const MAX_IOV: usize = 1024;
/// Plaintext rustls encrypts ahead of the socket on a TLS connection (its
/// default is 64 KiB): each vectored call into rustls takes this much, so a
/// write of many slices is a few calls, and encryption of the next part
/// overlaps the server's reading of the last.
const TLS_WRITE_AHEAD: usize = 256 << 10;

/// The bytes a connection carries: plain TCP, or TLS over TCP.
enum Stream {
    Tcp(TcpStream),
    // Boxed: rustls's state is over a kilobyte, and most tiers speak TCP.
    Tls(Box<Tls>),
}

struct Tls {
    conn: rustls::ClientConnection,
    sock: TcpStream,
}

impl Stream {
    /// The socket (its timeouts bound every read and write, TLS or not).
    fn tcp(&self) -> &TcpStream {
        match self {
            Stream::Tcp(s) => s,
            Stream::Tls(t) => &t.sock,
        }
    }
}

/// The socket as rustls's output: `sendmsg` with MSG_NOSIGNAL, like the
/// plain TCP writes (rustls would `writev`, which raises SIGPIPE).
struct NoSigpipe<'a>(&'a TcpStream);

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

/// A TLS failure (a certificate not trusted, a record that does not
/// authenticate) as an I/O error: the connection is done.
fn tls_error(e: rustls::Error) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("TLS: {e}"))
}

/// The first line of a reply.
#[derive(Debug, PartialEq)]
pub(super) enum Head {
    /// `+OK` (told apart so that the data path's many SET replies allocate
    /// nothing).
    Ok,
    /// Any other `+...`.
    Status(String),
    /// `-...`: the server's message (e.g. `OOM command not allowed ...`).
    Error(String),
    Int(i64),
    /// `$n`: n bytes and a CRLF follow.
    Bulk(usize),
    /// `$-1` or `*-1`.
    Nil,
    /// `*n`: n replies follow.
    Array(usize),
}

pub(super) struct RespConn {
    stream: Stream,
    /// Bytes read and not consumed yet: `buf[start..end]`.
    buf: Box<[u8]>,
    start: usize,
    end: usize,
    /// Framing of the commands being sent (reused, so steady state allocates
    /// nothing; it grows to the largest pipeline's framing, payloads excluded).
    pub(super) out: Vec<u8>,
    /// Offsets into `out` where the data path splices payloads (reused).
    pub(super) cuts: Vec<usize>,
    timeout: Duration,
    deadline: Instant,
    /// An end for the next request sooner than `timeout` (see `cap_next`).
    cap: Option<Instant>,
    /// The socket timeouts set last (see `arm`).
    read_armed: Option<Duration>,
    write_armed: Option<Duration>,
    db: i64,
    broken: bool,
    /// The socket's SO_RCVLOWAT as set last (see `wake_after`).
    rcvlowat: usize,
}

fn protocol_error(what: impl Into<String>) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("protocol error: {}", what.into()),
    )
}

fn timed_out() -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, "no answer within io_timeout_ms")
}

fn closed() -> io::Error {
    io::Error::new(
        io::ErrorKind::UnexpectedEof,
        "the server closed the connection",
    )
}

/// A socket error as the caller should see it: the socket's timeout (armed
/// to the request's deadline) expiring is the deadline's error.
fn past_deadline(e: io::Error) -> io::Error {
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => timed_out(),
        _ => e,
    }
}

impl RespConn {
    /// Connects to `host:port` within `timeout` (over TLS with `tls`, the
    /// server's certificate checked against `host`), then authenticates and
    /// selects the database as `settings` (from the URL) say.
    pub(super) fn connect(
        host: &str,
        port: u16,
        tls: Option<&Arc<ClientConfig>>,
        settings: &RedisConnectionInfo,
        timeout: Duration,
    ) -> RedisResult<RespConn> {
        let mut last = None;
        let mut stream = None;
        for addr in (host, port).to_socket_addrs()? {
            match TcpStream::connect_timeout(&addr, timeout) {
                Ok(s) => {
                    stream = Some(s);
                    break;
                }
                Err(e) => last = Some(e),
            }
        }
        let stream = match (stream, last) {
            (Some(s), _) => s,
            (None, Some(e)) => return Err(e.into()),
            (None, None) => {
                return Err(
                    io::Error::new(io::ErrorKind::NotFound, format!("{host}: no address")).into(),
                )
            }
        };
        let mut conn = match tls {
            None => RespConn::over(stream, timeout)?,
            Some(config) => {
                let tls = rustls::ClientConnection::new(config.clone(), tls::server_name(host)?)?;
                let mut conn = RespConn::new(
                    Stream::Tls(Box::new(Tls {
                        conn: tls,
                        sock: stream,
                    })),
                    timeout,
                )?;
                conn.begin();
                conn.handshake().map_err(|e| {
                    io::Error::new(e.kind(), format!("TLS handshake with {host}:{port}: {e}"))
                })?;
                conn
            }
        };
        if let Some(password) = settings.password() {
            let mut auth = redis::cmd("AUTH");
            if let Some(user) = settings.username() {
                auth.arg(user);
            }
            auth.arg(password).query::<()>(&mut conn)?;
        }
        if settings.db() != 0 {
            redis::cmd("SELECT")
                .arg(settings.db())
                .query::<()>(&mut conn)?;
            conn.db = settings.db();
        }
        Ok(conn)
    }

    /// A connection over an established TCP stream (no handshake).
    pub(super) fn over(stream: TcpStream, timeout: Duration) -> io::Result<RespConn> {
        RespConn::new(Stream::Tcp(stream), timeout)
    }

    fn new(mut stream: Stream, timeout: Duration) -> io::Result<RespConn> {
        // A pipeline's last partial segment must not wait for the peer's
        // acknowledgement of the previous ones (Nagle): milliseconds per job.
        stream.tcp().set_nodelay(true)?;
        if let Stream::Tls(tls) = &mut stream {
            tls.conn.set_buffer_limit(Some(TLS_WRITE_AHEAD));
        }
        Ok(RespConn {
            stream,
            buf: vec![0; READ_BUF].into_boxed_slice(),
            start: 0,
            end: 0,
            out: Vec::new(),
            cuts: Vec::new(),
            timeout,
            deadline: Instant::now() + timeout,
            cap: None,
            read_armed: None,
            write_armed: None,
            db: 0,
            broken: false,
            rcvlowat: 1,
        })
    }

    /// Starts a request: its reads and writes share one deadline, `timeout`
    /// from now or the cap set for it, whichever is sooner.
    pub(super) fn begin(&mut self) {
        let own = Instant::now() + self.timeout;
        self.deadline = self.cap.take().map_or(own, |cap| cap.min(own));
    }

    /// Ends the next request at `at` if that is sooner than its own
    /// deadline: the pipelines a cluster job sends to its masters, one after
    /// another, share the job's deadline.
    pub(super) fn cap_next(&mut self, at: Instant) {
        self.cap = Some(at);
    }

    /// Whether the deadline of the request begun last has passed: a
    /// connection broken by then ran out of time (see `conn::Lease`).
    pub(super) fn deadline_passed(&self) -> bool {
        Instant::now() >= self.deadline
    }

    /// Marks the connection broken when `r` is an error (whatever was half
    /// sent or half read, the stream is out of step).
    fn check<T>(&mut self, r: io::Result<T>) -> io::Result<T> {
        if r.is_err() {
            self.broken = true;
        }
        r
    }

    /// Bounds the next read (or write) by the deadline: a timeout error when
    /// it has passed; else the socket's timeout is set to the time left,
    /// unless the one set before is no shorter (no early timeout) and longer
    /// by at most an eighth of `timeout` (a bounded overrun).
    fn arm(&mut self, read: bool) -> io::Result<()> {
        let now = Instant::now();
        let left = self.deadline.saturating_duration_since(now);
        if left.is_zero() {
            return Err(timed_out());
        }
        let armed = if read {
            &mut self.read_armed
        } else {
            &mut self.write_armed
        };
        let slack = self.timeout / 8;
        if armed.is_some_and(|t| left <= t && t <= left + slack) {
            return Ok(());
        }
        if read {
            self.stream.tcp().set_read_timeout(Some(left))?;
        } else {
            self.stream.tcp().set_write_timeout(Some(left))?;
        }
        *armed = Some(left);
        Ok(())
    }

    /// One `read` into `dst` within the deadline; 0 bytes is an error (the
    /// server closed the connection).
    fn read_some(&mut self, dst: &mut [u8]) -> io::Result<usize> {
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
    fn wake_after(&mut self, coming: usize) {
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
    fn fill(&mut self) -> io::Result<()> {
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

    /// Writes all of `slices` within the deadline.
    pub(super) fn write_all_vectored(&mut self, mut slices: &mut [IoSlice<'_>]) -> io::Result<()> {
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
    fn flush_tls(&mut self) -> io::Result<()> {
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

    /// Reads TLS records from the socket and decrypts them, within the
    /// deadline (one socket read; records that need an answer, such as a
    /// key update, are answered).
    fn receive_tls(&mut self) -> io::Result<()> {
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

    /// What a reader must wait on before a reply can be read: None when
    /// something can be read now (bytes read and not consumed yet, plaintext
    /// rustls holds, or an error for the read to report), else the socket.
    /// Lets a cluster job read first the master that answered first.
    pub(super) fn waits_on(&mut self) -> Option<std::os::fd::RawFd> {
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

    /// Completes a TLS handshake (nothing to do over plain TCP).
    fn handshake(&mut self) -> io::Result<()> {
        let r = (|| loop {
            self.flush_tls()?;
            match &self.stream {
                Stream::Tls(tls) if tls.conn.is_handshaking() => self.receive_tls()?,
                _ => return Ok(()),
            }
        })();
        self.check(r)
    }

    /// Writes `out[from..to]` (framed commands) within the deadline.
    pub(super) fn send_out_range(&mut self, from: usize, to: usize) -> io::Result<()> {
        let out = std::mem::take(&mut self.out);
        let r = self.write_all_vectored(&mut [IoSlice::new(&out[from..to])]);
        self.out = out;
        r
    }

    /// Reads the next reply's first line.
    pub(super) fn read_head(&mut self) -> io::Result<Head> {
        let r = self.read_head_inner();
        self.check(r)
    }

    fn read_head_inner(&mut self) -> io::Result<Head> {
        let mut scanned = 0;
        let line_end = loop {
            let pending = &self.buf[self.start..self.end];
            if let Some(at) = pending[scanned..].windows(2).position(|w| w == b"\r\n") {
                break self.start + scanned + at;
            }
            if pending.len() > MAX_LINE {
                return Err(protocol_error("reply line too long"));
            }
            scanned = pending.len().saturating_sub(1);
            self.fill()?;
        };
        let line = &self.buf[self.start..line_end];
        self.start = line_end + 2;
        let Some((&kind, rest)) = line.split_first() else {
            return Err(protocol_error("empty reply line"));
        };
        let number = || -> io::Result<i64> {
            std::str::from_utf8(rest)
                .ok()
                .and_then(|s| s.parse::<i64>().ok())
                .ok_or_else(|| {
                    protocol_error(format!(
                        "bad length {:?}",
                        String::from_utf8_lossy(&rest[..rest.len().min(32)])
                    ))
                })
        };
        Ok(match kind {
            b'+' if rest == b"OK" => Head::Ok,
            b'+' => Head::Status(String::from_utf8_lossy(rest).into_owned()),
            b'-' => Head::Error(String::from_utf8_lossy(rest).into_owned()),
            b':' => Head::Int(number()?),
            b'$' | b'*' => match number()? {
                -1 => Head::Nil,
                n if n < 0 => return Err(protocol_error(format!("length {n}"))),
                n if kind == b'$' => Head::Bulk(n as usize),
                n => Head::Array(n as usize),
            },
            other => {
                return Err(protocol_error(format!(
                    "unexpected reply type {:?}",
                    other as char
                )))
            }
        })
    }

    /// Reads exactly `dst.len()` bytes of a bulk payload into `dst`: what the
    /// buffer holds is copied, the rest is read from the socket straight
    /// into `dst`, with up to READ_AHEAD bytes that follow it into the
    /// buffer by the same call.
    pub(super) fn read_into(&mut self, dst: &mut [u8]) -> io::Result<()> {
        self.read_into_seen(dst, &mut |_| {})
    }

    /// [`RespConn::read_into`], calling `landed` with each stretch of `dst`
    /// as it arrives (in order, covering `dst` once): a checksum fed there
    /// reads bytes still in the CPU's caches, where one pass over a 2 MiB
    /// block after the last read would fetch most of it from memory again.
    pub(super) fn read_into_seen(
        &mut self,
        dst: &mut [u8],
        landed: &mut dyn FnMut(&[u8]),
    ) -> io::Result<()> {
        let buffered = (self.end - self.start).min(dst.len());
        dst[..buffered].copy_from_slice(&self.buf[self.start..self.start + buffered]);
        self.start += buffered;
        landed(&dst[..buffered]);
        let mut at = buffered;
        while at < dst.len() {
            // The buffer is empty here (what it held went into dst).
            self.start = 0;
            self.end = 0;
            let mut buf = std::mem::take(&mut self.buf);
            self.wake_after(dst.len() - at);
            let r = self.read_some_vectored(&mut dst[at..], &mut buf[..READ_AHEAD]);
            self.buf = buf;
            let got = self.check(r)?;
            let into_dst = got.min(dst.len() - at);
            landed(&dst[at..at + into_dst]);
            at += into_dst;
            self.end = got - into_dst;
        }
        // Raised only while a payload is read: a `poll` for the next reply
        // (a cluster job's, on a connection back from the pool) must wake
        // at its first byte.
        self.wake_after(0);
        Ok(())
    }

    /// One `readv` into `first`, then `then`, within the deadline; 0 bytes
    /// is an error (the server closed the connection).
    /// Over TLS: plaintext rustls has decrypted is copied into `first` (or
    /// `then` when `first` is empty), once; with none, records are read.
    fn read_some_vectored(&mut self, first: &mut [u8], then: &mut [u8]) -> io::Result<usize> {
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

    /// Consumes `n` bytes (a payload not wanted).
    pub(super) fn skip(&mut self, mut n: usize) -> io::Result<()> {
        loop {
            let buffered = (self.end - self.start).min(n);
            self.start += buffered;
            n -= buffered;
            if n == 0 {
                return Ok(());
            }
            let r = self.fill();
            self.check(r)?;
        }
    }

    /// Consumes the CRLF that ends a bulk payload.
    pub(super) fn read_crlf(&mut self) -> io::Result<()> {
        let mut crlf = [0u8; 2];
        self.read_into(&mut crlf)?;
        if crlf != *b"\r\n" {
            return self.check(Err(protocol_error("bulk string not ended by CRLF")));
        }
        Ok(())
    }

    /// Reads one whole reply as the crate's `Value`.
    pub(super) fn read_value(&mut self) -> io::Result<Value> {
        Ok(match self.read_head()? {
            Head::Ok => Value::Okay,
            Head::Status(text) => Value::SimpleString(text),
            Head::Error(message) => {
                // The crate's own parser builds its error values (with their
                // codes: MOVED, WRONGPASS, ...) from the reply line.
                let line = format!("-{message}\r\n");
                match redis::parse_redis_value(line.as_bytes()) {
                    Ok(value) => value,
                    Err(e) => return self.check(Err(protocol_error(e.to_string()))),
                }
            }
            Head::Int(n) => Value::Int(n),
            Head::Nil => Value::Nil,
            Head::Bulk(n) => {
                let mut v = vec![0; n];
                self.read_into(&mut v)?;
                self.read_crlf()?;
                Value::BulkString(v)
            }
            Head::Array(n) => {
                let mut items = Vec::with_capacity(n.min(1024));
                for _ in 0..n {
                    items.push(self.read_value()?);
                }
                Value::Array(items)
            }
        })
    }

    /// A reply the caller cannot have asked for: the stream is out of step,
    /// the connection is done.
    pub(super) fn unexpected(&mut self, what: String) -> io::Error {
        self.broken = true;
        protocol_error(what)
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

/// `*<argc>\r\n`: a command's opening.
pub(super) fn frame_command(out: &mut Vec<u8>, argc: usize) {
    write!(out, "*{argc}\r\n").expect("into memory");
}

/// `$<len>\r\n`: a bulk argument's opening (its bytes and a CRLF follow).
pub(super) fn frame_bulk_len(out: &mut Vec<u8>, len: usize) {
    write!(out, "${len}\r\n").expect("into memory");
}

/// A whole bulk argument.
pub(super) fn frame_bulk(out: &mut Vec<u8>, arg: &[u8]) {
    frame_bulk_len(out, arg.len());
    out.extend_from_slice(arg);
    out.extend_from_slice(b"\r\n");
}

impl ConnectionLike for RespConn {
    fn req_packed_command(&mut self, cmd: &[u8]) -> RedisResult<Value> {
        Ok(self
            .req_packed_commands(cmd, 0, 1)?
            .pop()
            .expect("one reply"))
    }

    fn req_packed_commands(
        &mut self,
        cmd: &[u8],
        offset: usize,
        count: usize,
    ) -> RedisResult<Vec<Value>> {
        if self.broken {
            return Err(closed().into());
        }
        self.begin();
        self.write_all_vectored(&mut [IoSlice::new(cmd)])?;
        let mut replies = Vec::with_capacity(count);
        for i in 0..offset + count {
            let reply = self.read_value()?;
            if i >= offset {
                replies.push(reply);
            }
        }
        Ok(replies)
    }

    fn get_db(&self) -> i64 {
        self.db
    }

    fn check_connection(&mut self) -> bool {
        redis::cmd("PING").query::<String>(self).is_ok()
    }

    fn is_open(&self) -> bool {
        !self.broken
    }
}

/// A one-connection fake server for the unit tests of this file and
/// `direct`: it reads `expect` request bytes, then writes `reply` in the
/// given pieces (a pause between them, so the client sees partial reads),
/// then closes or, with `hang`, keeps the socket open and silent.
#[cfg(test)]
pub(super) mod fake {
    use super::RespConn;
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::thread::JoinHandle;
    use std::time::Duration;

    pub(in crate::backend::redis) struct Server {
        /// The request bytes it received.
        pub received: JoinHandle<Vec<u8>>,
    }

    pub(in crate::backend::redis) fn serve(
        expect: usize,
        reply: Vec<Vec<u8>>,
        hang: bool,
        timeout: Duration,
    ) -> (RespConn, Server) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let received = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut got = vec![0u8; expect];
            s.read_exact(&mut got).unwrap();
            for piece in reply {
                s.write_all(&piece).unwrap();
                s.flush().unwrap();
                std::thread::sleep(Duration::from_millis(2));
            }
            if hang {
                std::thread::sleep(timeout * 3);
            }
            got
        });
        let stream = TcpStream::connect(addr).unwrap();
        (
            RespConn::over(stream, timeout).unwrap(),
            Server { received },
        )
    }

    /// `bytes` one byte per piece.
    pub(in crate::backend::redis) fn bytewise(bytes: &[u8]) -> Vec<Vec<u8>> {
        bytes.iter().map(|&b| vec![b]).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::fake::{bytewise, serve};
    use super::*;
    use std::time::Duration;

    const T: Duration = Duration::from_millis(300);

    fn ask(conn: &mut RespConn, cmd: &[u8]) -> io::Result<()> {
        conn.begin();
        conn.write_all_vectored(&mut [IoSlice::new(cmd)])
    }

    #[test]
    fn replies_split_into_single_bytes_parse() {
        let reply =
            b"+OK\r\n+PONG\r\n-ERR no\r\n:-42\r\n$5\r\nhe\r\no\r\n$-1\r\n*2\r\n$0\r\n\r\n*-1\r\n";
        let (mut c, server) = serve(4, bytewise(reply), false, T);
        ask(&mut c, b"ping").unwrap();
        assert_eq!(c.read_head().unwrap(), Head::Ok);
        assert_eq!(c.read_head().unwrap(), Head::Status("PONG".into()));
        assert_eq!(c.read_head().unwrap(), Head::Error("ERR no".into()));
        assert_eq!(c.read_head().unwrap(), Head::Int(-42));
        // A payload holding CRLF is read by its length, not up to a CRLF.
        assert_eq!(
            c.read_value().unwrap(),
            Value::BulkString(b"he\r\no".to_vec())
        );
        assert_eq!(c.read_head().unwrap(), Head::Nil);
        assert_eq!(
            c.read_value().unwrap(),
            Value::Array(vec![Value::BulkString(Vec::new()), Value::Nil])
        );
        assert!(c.is_open());
        assert_eq!(server.received.join().unwrap(), b"ping");
    }

    #[test]
    fn server_errors_keep_their_codes_through_the_crate() {
        let reply = b"-WRONGPASS invalid username-password pair\r\n-MOVED 3999 127.0.0.1:6381\r\n";
        // The server keeps the socket open (hang): closing it with our
        // commands unread would reset the connection, racing the replies.
        let (mut c, _server) = serve(0, vec![reply.to_vec()], true, T);
        let e = redis::cmd("AUTH")
            .arg("pw")
            .query::<()>(&mut c)
            .unwrap_err();
        assert_eq!(e.code(), Some("WRONGPASS"), "{e}");
        // The connection survives a server's error reply.
        assert!(c.is_open());
        let e = redis::cmd("GET")
            .arg("k")
            .query::<Option<Vec<u8>>>(&mut c)
            .unwrap_err();
        assert_eq!(e.code(), Some("MOVED"), "{e}");
    }

    #[test]
    fn bulk_payloads_go_straight_into_the_destination() {
        let payload: Vec<u8> = (0..300_000u32).map(|i| (i * 7) as u8).collect();
        let mut reply = format!("${}\r\n", payload.len()).into_bytes();
        reply.extend_from_slice(&payload);
        reply.extend_from_slice(b"\r\n:1\r\n");
        // Larger than the read buffer, in uneven pieces.
        let pieces = reply.chunks(70_001).map(<[u8]>::to_vec).collect();
        let (mut c, _server) = serve(0, pieces, false, Duration::from_secs(5));
        c.begin();
        assert_eq!(c.read_head().unwrap(), Head::Bulk(payload.len()));
        let mut dst = vec![0u8; payload.len()];
        c.read_into(&mut dst).unwrap();
        c.read_crlf().unwrap();
        assert!(dst == payload);
        assert_eq!(c.read_head().unwrap(), Head::Int(1));
    }

    #[test]
    fn each_stretch_of_a_payload_is_seen_once_in_order_as_it_lands() {
        let payload: Vec<u8> = (0..300_000u32).map(|i| (i * 13 / 5) as u8).collect();
        let mut reply = format!("${}\r\n", payload.len()).into_bytes();
        reply.extend_from_slice(&payload);
        reply.extend_from_slice(b"\r\n");
        // The first piece leaves part of the payload in the read buffer.
        let pieces = reply.chunks(50_003).map(<[u8]>::to_vec).collect();
        let (mut c, _server) = serve(0, pieces, false, Duration::from_secs(5));
        c.begin();
        assert_eq!(c.read_head().unwrap(), Head::Bulk(payload.len()));
        let mut dst = vec![0u8; payload.len()];
        let (mut seen, mut stretches) = (Vec::new(), 0);
        c.read_into_seen(&mut dst, &mut |landed| {
            seen.extend_from_slice(landed);
            stretches += 1;
        })
        .unwrap();
        c.read_crlf().unwrap();
        assert!(dst == payload);
        assert!(seen == payload, "the stretches seen are not the payload");
        assert!(stretches > 1, "{stretches} stretches for 6 pieces");
    }

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

    #[test]
    fn malformed_replies_are_protocol_errors_that_close_the_connection() {
        let cases: [&[u8]; 6] = [
            b"$abc\r\n",
            b"$-5\r\n",
            b"$3\r\nhelloX\r\n",
            b"!3\r\nabc\r\n",
            b"\r\n",
            b"%1\r\n",
        ];
        for reply in cases {
            let (mut c, _server) = serve(0, vec![reply.to_vec()], false, T);
            c.begin();
            let r = c.read_value();
            let e = r.expect_err(&String::from_utf8_lossy(reply));
            assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
            assert!(!c.is_open(), "{}", String::from_utf8_lossy(reply));
        }
    }

    #[test]
    fn a_line_without_end_is_refused_not_buffered_forever() {
        let (mut c, _server) = serve(0, vec![vec![b'+'; MAX_LINE + 10]], true, T);
        c.begin();
        let e = c.read_head().unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
    }

    #[test]
    fn a_server_closing_mid_reply_is_an_error_not_a_hang() {
        let (mut c, _server) = serve(
            0,
            vec![b"$10\r\nhel".to_vec()],
            false,
            Duration::from_secs(10),
        );
        let started = Instant::now();
        let e = redis::cmd("GET")
            .arg("k")
            .query::<Vec<u8>>(&mut c)
            .unwrap_err();
        assert!(e.is_connection_dropped(), "{e}");
        assert!(!c.is_open());
        assert!(started.elapsed() < Duration::from_secs(5));
        // A broken connection refuses further requests at once.
        assert!(redis::cmd("PING").query::<String>(&mut c).is_err());
    }

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
            assert!(!c.is_open(), "{e}");
            println!("child: write failed with {e}");
            return;
        }
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "backend::redis::resp::tests::writes_to_a_closed_peer_fail_without_sigpipe",
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

    #[test]
    fn a_silent_server_costs_a_tls_handshake_the_deadline() {
        // A listener that never answers: the handshake is bounded too.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
        let started = Instant::now();
        let settings = RedisConnectionInfo::default();
        let r = RespConn::connect("127.0.0.1", port, Some(&Arc::new(config)), &settings, T);
        let e = r.err().expect("no handshake with a silent server");
        let took = started.elapsed();
        assert!(e.is_timeout(), "{e}");
        assert!(e.to_string().contains("TLS handshake"), "{e}");
        assert!(took >= T && took < T * 3, "{took:?}");
    }

    #[test]
    fn a_silent_server_costs_the_deadline_once() {
        // Half a reply, then silence: the whole request is bounded, not each read.
        let pieces = vec![b"$1000\r\n".to_vec(), vec![b'x'; 10]];
        let (mut c, _server) = serve(0, pieces, true, T);
        let started = Instant::now();
        let e = redis::cmd("GET")
            .arg("k")
            .query::<Vec<u8>>(&mut c)
            .unwrap_err();
        let took = started.elapsed();
        assert!(e.is_timeout(), "{e}");
        assert!(took >= T && took < T * 3, "{took:?}");
        assert!(!c.is_open());
    }
}

#[cfg(test)]
impl RespConn {
    pub(super) fn is_open_for_tests(&self) -> bool {
        !self.broken
    }
}
