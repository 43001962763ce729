//! Commands off the data path (PING, AUTH, SELECT, INFO, CLUSTER SLOTS and
//! NODES, SCAN, GETRANGE, a single GET, ASKING), encoded as RESP arrays of
//! bulk strings and answered by whole replies (`reply::Value`). The data
//! path's pipelines frame their own commands (`direct`).

use super::frame::{frame_bulk, frame_command};
use super::reply::{Value, SMALL_REPLY};
use super::transport::RespConn;
use std::io::{self, IoSlice};

/// Appends `args` to `out` as one command.
pub(in crate::backend::redis) fn encode(out: &mut Vec<u8>, args: &[&[u8]]) {
    frame_command(out, args.len());
    for arg in args {
        frame_bulk(out, arg);
    }
}

impl RespConn {
    /// Sends `args` as one request and reads its reply, of at most
    /// `ceiling` bytes (see `reply`); an error reply is `Value::Error` and
    /// the connection stays usable. A connection out of step (bytes there
    /// before the request, or after its reply) is closed and the call fails.
    pub(in crate::backend::redis) fn call(
        &mut self,
        args: &[&[u8]],
        ceiling: usize,
    ) -> io::Result<Value> {
        let mut replies = self.call_many(&[args], ceiling)?;
        Ok(replies.pop().expect("one command, one reply"))
    }

    /// Sends `commands` as one pipeline and reads their replies, each of at
    /// most `ceiling` bytes, as [`RespConn::call`] does one.
    pub(in crate::backend::redis) fn call_many(
        &mut self,
        commands: &[&[&[u8]]],
        ceiling: usize,
    ) -> io::Result<Vec<Value>> {
        self.in_step()?;
        let mut request = Vec::new();
        for args in commands {
            encode(&mut request, args);
        }
        self.begin();
        self.write_all_vectored(&mut [IoSlice::new(&request)])?;
        let mut replies = Vec::with_capacity(commands.len());
        for _ in commands {
            replies.push(self.read_value(ceiling)?);
        }
        self.finish()?;
        Ok(replies)
    }

    /// [`RespConn::call`] for a command answered `+OK` (or any status);
    /// a refusal is an error of kind `refused` with the server's words.
    pub(in crate::backend::redis) fn call_ok(
        &mut self,
        args: &[&[u8]],
        refused: io::ErrorKind,
    ) -> io::Result<()> {
        match self.call(args, SMALL_REPLY)? {
            Value::Status(_) => Ok(()),
            Value::Error(message) => Err(io::Error::new(refused, message)),
            other => Err(self.unexpected(format!("{other:?} in reply to {}", name(args)))),
        }
    }
}

fn name(args: &[&[u8]]) -> String {
    String::from_utf8_lossy(args.first().copied().unwrap_or_default()).into_owned()
}

#[cfg(test)]
mod tests {
    use super::super::fake::{connect_to, serve, serve_commands};
    use super::*;
    use std::time::{Duration, Instant};

    const T: Duration = Duration::from_millis(300);

    #[test]
    fn commands_are_what_the_redis_crate_would_send() {
        let mut out = Vec::new();
        encode(&mut out, &[b"SET", b"k\r\n", b"", b"EX", b"60"]);
        let expected = redis::cmd("SET")
            .arg("k\r\n")
            .arg("")
            .arg("EX")
            .arg(60)
            .get_packed_command();
        assert_eq!(out, expected);
    }

    /// The bytes of `args` as one command.
    fn request(args: &[&[u8]]) -> Vec<u8> {
        let mut out = Vec::new();
        encode(&mut out, args);
        out
    }

    #[test]
    fn error_replies_keep_the_server_s_words_and_the_connection() {
        // Each reply comes once its command is read, as a server sends it.
        let port = serve_commands(|args, _| match args[0].as_slice() {
            b"AUTH" => b"-WRONGPASS invalid username-password pair\r\n".to_vec(),
            _ => b"-MOVED 3999 127.0.0.1:6381\r\n".to_vec(),
        });
        let mut c = connect_to(port, T);
        let e = c
            .call_ok(&[b"AUTH", b"pw"], io::ErrorKind::PermissionDenied)
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
        assert!(e.to_string().starts_with("WRONGPASS"), "{e}");
        assert!(c.is_open_for_tests());
        assert_eq!(
            c.call(&[b"GET", b"k"], SMALL_REPLY).unwrap(),
            Value::Error("MOVED 3999 127.0.0.1:6381".into())
        );
    }

    #[test]
    fn a_server_closing_mid_reply_is_an_error_not_a_hang() {
        let get = request(&[b"GET", b"k"]);
        let (mut c, _server) = serve(
            get.len(),
            vec![b"$10\r\nhel".to_vec()],
            false,
            Duration::from_secs(10),
        );
        let started = Instant::now();
        let e = c.call(&[b"GET", b"k"], SMALL_REPLY).unwrap_err();
        // Closed with the request unread, the server may reset instead.
        let dropped = [io::ErrorKind::UnexpectedEof, io::ErrorKind::ConnectionReset];
        assert!(dropped.contains(&e.kind()), "{e}");
        assert!(!c.is_open_for_tests());
        assert!(started.elapsed() < Duration::from_secs(5));
        // A broken connection refuses further requests at once.
        assert!(c.call(&[b"PING"], SMALL_REPLY).is_err());
    }

    /// A server (or proxy) that answers once too often: the surplus reply,
    /// whether it came with the answer or after it, is never taken for the
    /// next request's; the connection is closed and the next request is
    /// never sent on it.
    #[test]
    fn a_reply_nobody_asked_for_closes_the_connection() {
        let ping = request(&[b"PING"]);
        // With the answer: the call itself fails (its reply is not trusted).
        let (mut c, server) = serve(ping.len(), vec![b"+PONG\r\n+PONG\r\n".to_vec()], true, T);
        let e = c.call(&[b"PING"], SMALL_REPLY).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
        assert!(e.to_string().contains("out of step"), "{e}");
        assert!(!c.is_open_for_tests());
        drop(server);
        // After it, before the next request: that request is not sent.
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let expect = ping.len();
        let server = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut got = vec![0u8; expect];
            s.read_exact(&mut got).unwrap();
            s.write_all(b"$1\r\na\r\n").unwrap();
            std::thread::sleep(Duration::from_millis(50));
            s.write_all(b"$1\r\nb\r\n").unwrap();
            // Whatever else comes, until the client closes.
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let _ = s.read_to_end(&mut got);
            got
        });
        let mut c = RespConn::over(std::net::TcpStream::connect(addr).unwrap(), T).unwrap();
        assert_eq!(
            c.call(&[b"PING"], SMALL_REPLY).unwrap(),
            Value::BulkString(b"a".to_vec())
        );
        std::thread::sleep(Duration::from_millis(150));
        let e = c.call(&[b"GET", b"k"], SMALL_REPLY).unwrap_err();
        assert!(e.to_string().contains("before a request was sent"), "{e}");
        assert!(!c.is_open_for_tests());
        drop(c);
        // The server read the PING alone: the GET never left.
        assert_eq!(server.join().unwrap(), ping);
    }

    /// A connection the server closed while it was idle is found before a
    /// request is sent on it.
    #[test]
    fn a_connection_closed_by_the_server_is_found_before_a_request() {
        let ping = request(&[b"PING"]);
        let (mut c, server) = serve(ping.len(), vec![b"+PONG\r\n".to_vec()], false, T);
        c.call_ok(&[b"PING"], io::ErrorKind::Other).unwrap();
        server.received.join().unwrap();
        std::thread::sleep(Duration::from_millis(20));
        let e = c.in_step().unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof, "{e}");
        assert!(!c.is_open_for_tests());
    }
}
