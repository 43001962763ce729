//! Commands off the data path (PING, AUTH, SELECT, INFO, CLUSTER SLOTS and
//! NODES, SCAN, GETRANGE, a single GET, ASKING), encoded as RESP arrays of
//! bulk strings and answered by whole replies (`reply::Value`). The data
//! path's pipelines frame their own commands (`direct`).

use super::frame::{frame_bulk, frame_command};
use super::reply::Value;
use super::transport::{closed, RespConn};
use std::io::{self, IoSlice};

/// Appends `args` to `out` as one command.
pub(in crate::backend::redis) fn encode(out: &mut Vec<u8>, args: &[&[u8]]) {
    frame_command(out, args.len());
    for arg in args {
        frame_bulk(out, arg);
    }
}

impl RespConn {
    /// Sends `args` as one request and reads its reply (an error reply is
    /// `Value::Error`; the connection stays usable).
    pub(in crate::backend::redis) fn call(&mut self, args: &[&[u8]]) -> io::Result<Value> {
        if self.broken {
            return Err(closed());
        }
        let mut request = Vec::new();
        encode(&mut request, args);
        self.begin();
        self.write_all_vectored(&mut [IoSlice::new(&request)])?;
        self.read_value()
    }

    /// [`RespConn::call`] for a command answered `+OK` (or any status);
    /// a refusal is an error of kind `refused` with the server's words.
    pub(in crate::backend::redis) fn call_ok(
        &mut self,
        args: &[&[u8]],
        refused: io::ErrorKind,
    ) -> io::Result<()> {
        match self.call(args)? {
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
    use super::super::fake::serve;
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

    #[test]
    fn error_replies_keep_the_server_s_words_and_the_connection() {
        let reply = b"-WRONGPASS invalid username-password pair\r\n-MOVED 3999 127.0.0.1:6381\r\n";
        // The server keeps the socket open (hang): closing it with our
        // commands unread would reset the connection, racing the replies.
        let (mut c, _server) = serve(0, vec![reply.to_vec()], true, T);
        let e = c
            .call_ok(&[b"AUTH", b"pw"], io::ErrorKind::PermissionDenied)
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
        assert!(e.to_string().starts_with("WRONGPASS"), "{e}");
        assert!(c.is_open_for_tests());
        assert_eq!(
            c.call(&[b"GET", b"k"]).unwrap(),
            Value::Error("MOVED 3999 127.0.0.1:6381".into())
        );
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
        let e = c.call(&[b"GET", b"k"]).unwrap_err();
        // Closed with the request unread, the server may reset instead.
        let dropped = [io::ErrorKind::UnexpectedEof, io::ErrorKind::ConnectionReset];
        assert!(dropped.contains(&e.kind()), "{e}");
        assert!(!c.is_open_for_tests());
        assert!(started.elapsed() < Duration::from_secs(5));
        // A broken connection refuses further requests at once.
        assert!(c.call(&[b"PING"]).is_err());
    }
}
