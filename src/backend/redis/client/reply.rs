//! The replies read off a connection (RESP2): a reply's first line parsed
//! from the read buffer (`parse_head`, over a byte slice), bulk payloads
//! read straight into the caller's slice, and the CRLF after them; whole
//! replies read within a ceiling the command sets (bytes and nesting), and
//! the check that a request's replies end where they should.
//!
//! Whatever a server sends is hostile until read: a declared length is
//! never allocated up front (a whole reply grows as its bytes arrive, and a
//! length past the command's ceiling closes the connection at once), and
//! nesting is bounded, so a reply can neither exhaust memory nor the stack.

use super::transport::{protocol_error, RespConn};
use std::io;

/// Bytes read into the buffer beyond a payload read straight into its row,
/// in the same call: the payload's CRLF and the next reply's head, and the
/// start of its payload (copied once from the buffer). Small, so that a
/// pipeline of large values is read almost entirely into the rows (64 KiB
/// values: a whole buffer of each value was copied before), and big enough
/// that the next head rarely needs a call of its own.
const READ_AHEAD: usize = 4 << 10;

/// Longest reply line (status, error, length) accepted: a longer one is a
/// protocol error, not a reason to grow without bound.
const MAX_LINE: usize = 16 << 10;

/// Ceiling of a whole reply to a command answered by a status, an integer
/// or a short string (PING, AUTH, SELECT, ASKING, DEL, GETRANGE of a header).
pub(in crate::backend::redis) const SMALL_REPLY: usize = 64 << 10;

/// Ceiling of a whole reply to a command answered by a map or a list (CLUSTER
/// SLOTS and NODES, INFO, a SCAN step): a cluster's map with every slot
/// range apart and a replica each is about 5 MiB.
pub(in crate::backend::redis) const MAP_REPLY: usize = 8 << 20;

/// What each element of a whole reply counts against its ceiling besides its
/// bytes, so that a reply of many empty elements is bounded too (a `Value`
/// takes 32 bytes: memory stays within a few times the ceiling).
const ELEMENT_COST: usize = 16;

/// Deepest nesting of arrays in a whole reply: kvtier's deepest (CLUSTER
/// SLOTS) has 3 levels. Beyond it a reply is a protocol error, never a
/// recursion that overflows a thread's stack.
const MAX_DEPTH: usize = 8;

/// First step of a bulk string's buffer: it grows as the bytes arrive
/// (doubling at most), never to a declared length up front.
const FIRST_GROWTH: usize = 64 << 10;

/// The first line of a reply.
#[derive(Debug, PartialEq)]
pub(in crate::backend::redis) enum Head {
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

/// A whole reply, read by [`RespConn::read_value`] (commands off the data
/// path: PING, AUTH, CLUSTER SLOTS, SCAN, a single GET).
#[derive(Clone, Debug, PartialEq)]
pub(in crate::backend::redis) enum Value {
    /// `+...` (`+OK` included).
    Status(String),
    /// `-...`: the server refused this command; the connection stays usable.
    Error(String),
    Int(i64),
    BulkString(Vec<u8>),
    Nil,
    Array(Vec<Value>),
}

/// A reply's first line (without its CRLF) parsed: a protocol error for
/// anything RESP2 does not start a reply with.
pub(super) fn parse_head(line: &[u8]) -> io::Result<Head> {
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

impl RespConn {
    /// Reads the next reply's first line.
    pub(in crate::backend::redis) fn read_head(&mut self) -> io::Result<Head> {
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
        parse_head(line)
    }

    /// Reads one whole reply of at most `ceiling` bytes (its bulk strings'
    /// lengths, and [`ELEMENT_COST`] per element) and [`MAX_DEPTH`] levels
    /// of arrays; past either, the connection is closed and the call fails.
    pub(in crate::backend::redis) fn read_value(&mut self, ceiling: usize) -> io::Result<Value> {
        let mut left = ceiling;
        self.read_value_within(ceiling, &mut left, 0)
    }

    fn read_value_within(
        &mut self,
        ceiling: usize,
        left: &mut usize,
        depth: usize,
    ) -> io::Result<Value> {
        let head = self.read_head()?;
        let cost = match head {
            Head::Bulk(n) => n.saturating_add(ELEMENT_COST),
            Head::Array(n) => n.saturating_add(1).saturating_mul(ELEMENT_COST),
            _ => ELEMENT_COST,
        };
        if cost > *left {
            return Err(self.unexpected(format!(
                "a reply larger than the {ceiling} bytes this command may bring ({head:?})"
            )));
        }
        // An array's elements are charged as they are read (each at least
        // ELEMENT_COST): only its own element is taken now.
        *left -= match head {
            Head::Array(_) => ELEMENT_COST,
            _ => cost,
        };
        Ok(match head {
            Head::Ok => Value::Status("OK".into()),
            Head::Status(text) => Value::Status(text),
            Head::Error(message) => Value::Error(message),
            Head::Int(n) => Value::Int(n),
            Head::Nil => Value::Nil,
            Head::Bulk(n) => {
                let v = self.read_growing(n)?;
                self.read_crlf()?;
                Value::BulkString(v)
            }
            Head::Array(n) => {
                if depth >= MAX_DEPTH {
                    return Err(
                        self.unexpected(format!("a reply nested deeper than {MAX_DEPTH} levels"))
                    );
                }
                let mut items = Vec::with_capacity(n.min(1024));
                for _ in 0..n {
                    items.push(self.read_value_within(ceiling, left, depth + 1)?);
                }
                Value::Array(items)
            }
        })
    }

    /// A bulk payload of `n` bytes (within its reply's ceiling) into a
    /// buffer that grows as the bytes arrive: a length declared and never
    /// sent costs the deadline, not memory.
    fn read_growing(&mut self, n: usize) -> io::Result<Vec<u8>> {
        let mut v = Vec::new();
        while v.len() < n {
            let have = v.len();
            let step = (n - have).min(have.max(FIRST_GROWTH));
            v.resize(have + step, 0);
            self.read_into(&mut v[have..])?;
        }
        Ok(v)
    }

    /// Reads exactly `dst.len()` bytes of a bulk payload into `dst`: what the
    /// buffer holds is copied, the rest is read from the socket straight
    /// into `dst`, with up to READ_AHEAD bytes that follow it into the
    /// buffer by the same call.
    pub(in crate::backend::redis) fn read_into(&mut self, dst: &mut [u8]) -> io::Result<()> {
        self.read_into_seen(dst, &mut |_| {})
    }

    /// [`RespConn::read_into`], calling `landed` with each stretch of `dst`
    /// as it arrives (in order, covering `dst` once): a checksum fed there
    /// reads bytes still in the CPU's caches, where one pass over a 2 MiB
    /// block after the last read would fetch most of it from memory again.
    pub(in crate::backend::redis) fn read_into_seen(
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

    /// Consumes `n` bytes (a payload not wanted).
    pub(in crate::backend::redis) fn skip(&mut self, mut n: usize) -> io::Result<()> {
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
    pub(in crate::backend::redis) fn read_crlf(&mut self) -> io::Result<()> {
        let mut crlf = [0u8; 2];
        self.read_into(&mut crlf)?;
        if crlf != *b"\r\n" {
            return self.check(Err(protocol_error("bulk string not ended by CRLF")));
        }
        Ok(())
    }

    /// Ends a request whose last expected reply was read: bytes already
    /// received beyond it are a reply nobody asked for (a server or proxy
    /// answering once too often), so the stream is out of step and the
    /// connection is closed; what the request read must not be trusted.
    pub(in crate::backend::redis) fn finish(&mut self) -> io::Result<()> {
        let surplus = self.end - self.start + self.tls_plaintext_pending();
        if surplus > 0 {
            return Err(self.unexpected(format!(
                "{surplus} bytes after the last reply expected (the connection is out of step)"
            )));
        }
        Ok(())
    }

    /// A reply the caller cannot have asked for: the stream is out of step,
    /// the connection is done.
    pub(in crate::backend::redis) fn unexpected(&mut self, what: String) -> io::Error {
        self.broken = true;
        protocol_error(what)
    }
}

#[cfg(test)]
mod tests {
    use super::super::fake::{bytewise, serve};
    use super::*;
    use std::io::IoSlice;
    use std::time::Duration;

    const T: Duration = Duration::from_millis(300);

    /// The heads of every reply kind, from byte slices (no socket).
    #[test]
    fn heads_parse_from_byte_slices() {
        let cases: [(&[u8], Head); 9] = [
            (b"+OK", Head::Ok),
            (b"+PONG", Head::Status("PONG".into())),
            (b"-ERR no", Head::Error("ERR no".into())),
            (b":-42", Head::Int(-42)),
            (b"$5", Head::Bulk(5)),
            (b"$0", Head::Bulk(0)),
            (b"$-1", Head::Nil),
            (b"*-1", Head::Nil),
            (b"*2", Head::Array(2)),
        ];
        for (line, head) in cases {
            assert_eq!(parse_head(line).unwrap(), head, "{line:?}");
        }
    }

    #[test]
    fn malformed_heads_are_protocol_errors_from_byte_slices() {
        let cases: [(&[u8], &str); 5] = [
            (b"$abc", "protocol error: bad length \"abc\""),
            (b"$-5", "protocol error: length -5"),
            (b"!3", "protocol error: unexpected reply type '!'"),
            (b"", "protocol error: empty reply line"),
            (b"%1", "protocol error: unexpected reply type '%'"),
        ];
        for (line, message) in cases {
            let e = parse_head(line).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
            assert_eq!(e.to_string(), message);
        }
    }

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
            c.read_value(SMALL_REPLY).unwrap(),
            Value::BulkString(b"he\r\no".to_vec())
        );
        assert_eq!(c.read_head().unwrap(), Head::Nil);
        assert_eq!(
            c.read_value(SMALL_REPLY).unwrap(),
            Value::Array(vec![Value::BulkString(Vec::new()), Value::Nil])
        );
        assert!(c.is_open_for_tests());
        assert_eq!(server.received.join().unwrap(), b"ping");
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
            let r = c.read_value(SMALL_REPLY);
            let e = r.expect_err(&String::from_utf8_lossy(reply));
            assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
            assert!(!c.is_open_for_tests(), "{}", String::from_utf8_lossy(reply));
        }
    }

    /// Reads one whole reply of at most `ceiling` bytes from a server
    /// that sends `pieces` and then stays silent: the outcome, how long it
    /// took, and whether the connection stayed open.
    fn read_whole(pieces: Vec<Vec<u8>>, ceiling: usize) -> (io::Result<Value>, Duration, bool) {
        let (mut c, _server) = serve(0, pieces, true, T);
        let started = std::time::Instant::now();
        c.begin();
        let r = c.read_value(ceiling);
        (r, started.elapsed(), c.is_open_for_tests())
    }

    /// Declared lengths and counts past a command's ceiling fail at the
    /// reply's first line, before anything is allocated or read; the
    /// process lives (these once aborted it allocating the length).
    #[test]
    fn replies_past_their_ceiling_are_refused_unread() {
        let three_gib = {
            // Declared, then streamed: refused at the head, not read.
            let mut pieces = vec![b"$3221225472\r\n".to_vec()];
            pieces.extend((0..64).map(|_| vec![b'x'; 1 << 20]));
            pieces
        };
        let cases: [(&str, Vec<Vec<u8>>); 5] = [
            ("$99999999999", vec![b"$99999999999\r\n".to_vec()]),
            ("$i64::MAX", vec![b"$9223372036854775807\r\n".to_vec()]),
            ("*i64::MAX", vec![b"*9223372036854775807\r\n".to_vec()]),
            ("3 GiB streamed", three_gib),
            (
                "a bulk in an array",
                vec![b"*2\r\n:1\r\n$99999999\r\n".to_vec()],
            ),
        ];
        for (what, pieces) in cases {
            let (r, took, open) = read_whole(pieces, MAP_REPLY);
            let e = r.expect_err(what);
            assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{what}: {e}");
            assert!(
                e.to_string().contains("larger than the 8388608 bytes"),
                "{what}: {e}"
            );
            assert!(!open, "{what}: the connection stays open");
            assert!(took < T, "{what}: refused after {took:?}");
        }
        // The ceiling counts bulk bytes and elements: a bulk that fits
        // passes, one byte more does not; so do many small elements.
        let bulk = |n: usize| {
            let mut r = format!("${n}\r\n").into_bytes();
            r.extend(std::iter::repeat_n(b'y', n));
            r.extend_from_slice(b"\r\n");
            vec![r]
        };
        let fits = 1000 - ELEMENT_COST;
        let (r, _, open) = read_whole(bulk(fits), 1000);
        assert_eq!(r.unwrap(), Value::BulkString(vec![b'y'; fits]));
        assert!(open);
        assert!(read_whole(bulk(fits + 1), 1000).0.is_err());
        let mut many = b"*10000\r\n".to_vec();
        many.extend(b":1\r\n".repeat(10_000));
        assert!(read_whole(vec![many.clone()], SMALL_REPLY).0.is_err());
        assert!(read_whole(vec![many], MAP_REPLY).0.is_ok());
    }

    /// Nesting deeper than MAX_DEPTH is a protocol error, never one
    /// recursion per level (100,000 levels once overflowed an I/O thread's
    /// stack and killed the process without a word).
    #[test]
    fn deep_nesting_is_refused_not_recursed() {
        let nested = |levels: usize| {
            let mut r = b"*1\r\n".repeat(levels);
            r.extend_from_slice(b":7\r\n");
            vec![r]
        };
        let (r, _, open) = read_whole(nested(MAX_DEPTH), SMALL_REPLY);
        assert!(r.is_ok() && open, "{r:?}");
        for levels in [MAX_DEPTH + 1, 100_000] {
            let (r, took, open) = read_whole(nested(levels), MAP_REPLY);
            let e = r.expect_err("too deep");
            assert!(e.to_string().contains("nested deeper than 8"), "{e}");
            assert!(!open && took < T, "{levels} levels: {took:?}");
        }
    }

    #[test]
    fn a_line_without_end_is_refused_not_buffered_forever() {
        let (mut c, _server) = serve(0, vec![vec![b'+'; MAX_LINE + 10]], true, T);
        c.begin();
        let e = c.read_head().unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
    }
}
