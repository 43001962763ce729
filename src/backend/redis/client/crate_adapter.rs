//! What bridges kvtier's connection to the redis crate: a reply read whole
//! as the crate's `Value`, and the crate's `ConnectionLike`, so that every
//! command off the data path (PING, DEL, EXISTS, TOUCH, single GET/SET,
//! AUTH and SELECT at connect) uses the crate's command builders and reply
//! conversions over this socket.

use super::reply::{protocol_error, Head};
use super::transport::{closed, RespConn};
use redis::{ConnectionLike, RedisResult, Value};
use std::io::{self, IoSlice};

impl RespConn {
    /// Reads one whole reply as the crate's `Value`.
    pub(in crate::backend::redis) fn read_value(&mut self) -> io::Result<Value> {
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

#[cfg(test)]
mod tests {
    use super::super::fake::serve;
    use redis::ConnectionLike;
    use std::time::{Duration, Instant};

    const T: Duration = Duration::from_millis(300);

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
}
