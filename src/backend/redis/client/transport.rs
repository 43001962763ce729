//! kvtier's own connection to one server, over plain TCP or TLS (rustls),
//! speaking RESP2. This file: the connection (`RespConn`), its stream and
//! its deadlines; opening it is `connect`, writing `send`, reading from the
//! socket `receive`, the replies `reply`, whole commands `command`.
//!
//! Why not the crate's connection: its reader parses every reply into an
//! owned `Value` (a 2 MiB GET reply is read into one buffer and copied into a
//! `Vec`, which kvtier then copies into the row), and its writer packs every
//! command, payload included, into one more buffer before the socket write.
//! Measured on loopback, that leaves the crate alone at 0.3–0.4× of
//! redis-benchmark's rate (docs/redis.md, "Why not the crate"). This connection
//! gives the data path (`direct`) what it needs to do neither: vectored
//! writes from the caller's slices, reply heads parsed from a small reusable
//! buffer, and bulk payloads read from the socket straight into a caller's
//! slice. Every other command (PING, AUTH, CLUSTER SLOTS, SCAN, a single GET)
//! is encoded and read whole by `command` on the same socket.
//!
//! Deadlines: a request (one command or one pipeline) gets `timeout` from its
//! start; every socket read and write is bounded by the time left, so a
//! server that stops answering costs at most `timeout` (plus an eighth: the
//! socket's timeout is re-armed only when the one set would overrun the
//! deadline by more than that, which spares a system call per read). Any I/O or protocol
//! error leaves the connection unusable (`broken`); the pool drops it.
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

use std::io;
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// Read buffer: reply heads, small replies, and whatever part of a payload
/// arrives with them. Payloads beyond it are read straight into their row.
const READ_BUF: usize = 64 << 10;

/// Plaintext rustls encrypts ahead of the socket on a TLS connection (its
/// default is 64 KiB): each vectored call into rustls takes this much, so a
/// write of many slices is a few calls, and encryption of the next part
/// overlaps the server's reading of the last.
const TLS_WRITE_AHEAD: usize = 256 << 10;

/// The bytes a connection carries: plain TCP, or TLS over TCP.
pub(super) enum Stream {
    Tcp(TcpStream),
    // Boxed: rustls's state is over a kilobyte, and most tiers speak TCP.
    Tls(Box<Tls>),
}

pub(super) struct Tls {
    pub(super) conn: rustls::ClientConnection,
    pub(super) sock: TcpStream,
}

impl Stream {
    /// The socket (its timeouts bound every read and write, TLS or not).
    pub(super) fn tcp(&self) -> &TcpStream {
        match self {
            Stream::Tcp(s) => s,
            Stream::Tls(t) => &t.sock,
        }
    }
}

/// A TLS failure (a certificate not trusted, a record that does not
/// authenticate) as an I/O error: the connection is done.
pub(super) fn tls_error(e: rustls::Error) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("TLS: {e}"))
}

pub(in crate::backend::redis) struct RespConn {
    pub(super) stream: Stream,
    /// Bytes read and not consumed yet: `buf[start..end]`.
    pub(super) buf: Box<[u8]>,
    pub(super) start: usize,
    pub(super) end: usize,
    /// Framing of the commands being sent (reused, so steady state allocates
    /// nothing; it grows to the largest pipeline's framing, payloads excluded).
    pub(in crate::backend::redis) out: Vec<u8>,
    /// Offsets into `out` where the data path splices payloads (reused).
    pub(in crate::backend::redis) cuts: Vec<usize>,
    pub(super) timeout: Duration,
    pub(super) deadline: Instant,
    /// An end for the next request sooner than `timeout` (see `cap_next`).
    pub(super) cap: Option<Instant>,
    /// The socket timeouts set last (see `arm`).
    pub(super) read_armed: Option<Duration>,
    pub(super) write_armed: Option<Duration>,
    pub(super) broken: bool,
    /// The socket's SO_RCVLOWAT as set last (see `wake_after`).
    pub(super) rcvlowat: usize,
}

pub(super) fn closed() -> io::Error {
    io::Error::new(
        io::ErrorKind::UnexpectedEof,
        "the server closed the connection",
    )
}

/// A reply that breaks RESP or the request's expectations: the stream is
/// out of step, the connection is done.
pub(super) fn protocol_error(what: impl Into<String>) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("protocol error: {}", what.into()),
    )
}

pub(super) fn timed_out() -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, "no answer within io_timeout_ms")
}

/// A socket error as the caller should see it: the socket's timeout (armed
/// to the request's deadline) expiring is the deadline's error.
pub(super) fn past_deadline(e: io::Error) -> io::Error {
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => timed_out(),
        _ => e,
    }
}

impl RespConn {
    /// A connection over an established TCP stream (no handshake).
    pub(in crate::backend::redis) fn over(
        stream: TcpStream,
        timeout: Duration,
    ) -> io::Result<RespConn> {
        RespConn::new(Stream::Tcp(stream), timeout)
    }

    pub(super) fn new(mut stream: Stream, timeout: Duration) -> io::Result<RespConn> {
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
            broken: false,
            rcvlowat: 1,
        })
    }

    /// Starts a request: its reads and writes share one deadline, `timeout`
    /// from now or the cap set for it, whichever is sooner.
    pub(in crate::backend::redis) fn begin(&mut self) {
        let own = Instant::now() + self.timeout;
        self.deadline = self.cap.take().map_or(own, |cap| cap.min(own));
    }

    /// Ends the next request at `at` if that is sooner than its own
    /// deadline: the pipelines a cluster job sends to its masters, one after
    /// another, share the job's deadline.
    pub(in crate::backend::redis) fn cap_next(&mut self, at: Instant) {
        self.cap = Some(at);
    }

    /// Whether the deadline of the request begun last has passed: a
    /// connection broken by then ran out of time (see `conn::Lease`).
    pub(in crate::backend::redis) fn deadline_passed(&self) -> bool {
        Instant::now() >= self.deadline
    }

    /// Marks the connection broken when `r` is an error (whatever was half
    /// sent or half read, the stream is out of step).
    pub(super) fn check<T>(&mut self, r: io::Result<T>) -> io::Result<T> {
        if r.is_err() {
            self.broken = true;
        }
        r
    }

    /// Bounds the next read (or write) by the deadline: a timeout error when
    /// it has passed; else the socket's timeout is set to the time left,
    /// unless the one set before is no shorter (no early timeout) and longer
    /// by at most an eighth of `timeout` (a bounded overrun).
    pub(super) fn arm(&mut self, read: bool) -> io::Result<()> {
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
}

#[cfg(test)]
mod tests {
    use super::super::fake::serve;
    use std::time::{Duration, Instant};

    const T: Duration = Duration::from_millis(300);

    #[test]
    fn a_silent_server_costs_the_deadline_once() {
        // Half a reply, then silence: the whole request is bounded, not each read.
        let pieces = vec![b"$1000\r\n".to_vec(), vec![b'x'; 10]];
        let mut get = Vec::new();
        super::super::command::encode(&mut get, &[b"GET", b"k"]);
        let (mut c, _server) = serve(get.len(), pieces, true, T);
        let started = Instant::now();
        let e = c
            .call(&[b"GET", b"k"], super::super::reply::SMALL_REPLY)
            .unwrap_err();
        let took = started.elapsed();
        assert_eq!(e.kind(), std::io::ErrorKind::TimedOut, "{e}");
        assert!(took >= T && took < T * 3, "{took:?}");
        assert!(!c.is_open_for_tests());
    }
}
