//! The paths through the redis crate: its command builders and pipelines
//! (with values packed into the command) over a pooled connection, for
//! blocks a cluster redirected, a cluster without kvtier's router, a Unix
//! socket, and single commands off the data path.

use super::client::conn::{io_error, Conn};
use super::client::pipe::Pipe;
use super::{client, format, sealed, RedisBackend};
use crate::error::{Error, ErrorKind, Result};
use redis::{RedisWrite, ToRedisArgs};

/// A block's value as one command argument, written straight into the
/// command buffer (no intermediate copy of the payload).
pub(super) struct Value<'a> {
    namespace_fp: u64,
    key: &'a [u8],
    payload: &'a [u8],
}

impl ToRedisArgs for Value<'_> {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        // Room first: a 2 MiB value written into a growing buffer would be
        // copied again at every doubling.
        out.reserve_space_for_args([format::header_len(self.key.len()) + self.payload.len()]);
        let mut arg = out.writer_for_next_arg();
        // Writing into the command's own buffer cannot fail.
        format::write_value(&mut arg, self.namespace_fp, self.key, self.payload)
            .expect("writing into memory");
    }
}

/// A block's value as a command argument.
pub(super) enum ValueArg<'a> {
    Plain(Value<'a>),
    /// Record and ciphertext, and the nonce it was sealed with.
    Sealed(Vec<u8>, crate::seal::Nonce),
}

impl RedisBackend {
    /// `SET <name> <value> [EX ttl_s]` for one block.
    pub(super) fn set_command(&self, key: &[u8], value: &ValueArg) -> redis::Cmd {
        let mut cmd = redis::cmd("SET");
        cmd.arg(self.name(key));
        match value {
            ValueArg::Plain(value) => cmd.arg(value),
            ValueArg::Sealed(value, _) => cmd.arg(value.as_slice()),
        };
        if self.ttl_s > 0 {
            cmd.arg("EX").arg(self.ttl_s);
        }
        cmd
    }

    /// A block's value as stored: sealed into a buffer of its own, or
    /// header and payload written straight into the command.
    pub(super) fn value_arg<'a>(&self, key: &'a [u8], block: &'a [u8]) -> Result<ValueArg<'a>> {
        let Some(seal) = self.sealed() else {
            return Ok(ValueArg::Plain(Value {
                namespace_fp: self.namespace_fp,
                key,
                payload: block,
            }));
        };
        let mut value = vec![0u8; sealed::value_len(block.len())];
        let nonce = seal.seal_into(self.namespace_fp, key, block, &mut value)?;
        Ok(ValueArg::Sealed(value, nonce))
    }

    /// The crate's SET pipeline (redirected blocks, a cluster without a
    /// router) for `blocks`, each value packed into the command; block i's
    /// outcome is `replies[i]`.
    pub(super) fn store_by_crate(
        &self,
        conn: &mut Conn,
        blocks: &[(u32, &[u8], &[u8])],
    ) -> std::result::Result<Vec<Result<()>>, redis::RedisError> {
        let values = blocks
            .iter()
            .map(|&(_, key, block)| self.value_arg(key, block))
            .collect::<Result<Vec<_>>>();
        let values = match values {
            Ok(values) => values,
            Err(e) => return Ok(vec![Err(e); blocks.len()]),
        };
        let set = |i: usize| self.set_command(blocks[i].1, &values[i]);
        let replies: Vec<Result<()>> = pipelined::<redis::Value>(conn, blocks.len(), set)?
            .into_iter()
            .map(|r| r.map(drop).map_err(|e| io_error("SET", &e)))
            .collect();
        for ((reply, value), &(_, key, _)) in replies.iter().zip(&values).zip(blocks) {
            if let (Ok(()), ValueArg::Sealed(_, nonce)) = (reply, value) {
                self.ledger.record(key, *nonce);
            }
        }
        Ok(replies)
    }

    /// `<command> <name>` for each key (DEL, TOUCH) through the crate, as
    /// one pipeline whose replies are dropped (redirected keys, a server
    /// behind a Unix socket, a cluster without a router).
    pub(super) fn keys_by_crate(
        &self,
        conn: &mut Conn,
        command: &str,
        keys: &[&[u8]],
    ) -> std::result::Result<(), redis::RedisError> {
        let make = |i: usize| redis::cmd(command).arg(self.name(keys[i])).take();
        pipelined::<redis::Value>(conn, keys.len(), make).map(drop)
    }

    /// The crate's GET pipeline (redirected blocks, a cluster without a
    /// router) for the blocks named `names`: one reply per name (judge it with `check_value`), or the
    /// pipeline's failure.
    pub(super) fn get_by_crate(
        &self,
        names: &[String],
    ) -> Result<Vec<redis::RedisResult<Option<Vec<u8>>>>> {
        let get = |i: usize| redis::cmd("GET").arg(&names[i]).take();
        let values = self.pool.with_conn("GET pipeline", |conn| {
            pipelined::<Option<Vec<u8>>>(conn, names.len(), get)
        })?;
        if values.len() != names.len() {
            return Err(Error::new(
                ErrorKind::Io,
                format!("redis: {} replies to {} GETs", values.len(), names.len()),
            ));
        }
        Ok(values)
    }

    /// The crate's GET pipeline (a cluster without a router, a Unix
    /// socket): each value
    /// copied into its row once verified.
    pub(super) fn load_batch_by_crate(
        &self,
        blocks: &mut [(u32, &[u8], &mut [u8])],
        done: &mut dyn FnMut(usize, Result<()>) -> bool,
    ) {
        let names: Vec<String> = blocks.iter().map(|(_, key, _)| self.name(key)).collect();
        let values = match self.get_by_crate(&names) {
            Ok(values) => values,
            Err(e) => {
                done(0, Err(e));
                return;
            }
        };
        for (i, ((_, key, dst), value)) in blocks.iter_mut().zip(values).enumerate() {
            let outcome = match value {
                Ok(value) => self.check_value(&names[i], value, key, dst),
                Err(e) => Err(self.get_failed(&names[i], &e)),
            };
            if !done(i, outcome) {
                return;
            }
        }
    }
}

/// Sends commands `make(0..n)` as one pipeline and returns each reply. In a
/// cluster whose slots are moving, the crate's pipeline does not follow
/// MOVED/ASK: then the commands are made again and sent one by one, which
/// the cluster connection redirects. A failure of the connection itself (a
/// dead node) fails the whole pipeline at once, without retrying command by
/// command.
pub(super) fn pipelined<T: redis::FromRedisValue>(
    conn: &mut client::conn::Conn,
    n: usize,
    make: impl Fn(usize) -> redis::Cmd,
) -> std::result::Result<Vec<redis::RedisResult<T>>, redis::RedisError> {
    let mut pipe = Pipe::new(conn);
    for i in 0..n {
        pipe.add(make(i));
    }
    match pipe.query::<Vec<T>>(conn) {
        Ok(replies) => Ok(replies.into_iter().map(Ok).collect()),
        // One command's refusal fails the crate's whole pipeline: one by
        // one, each gets its own answer.
        Err(e) if redirected(&e) || is_wrong_type(&e) || wrong_type_within(&e) => {
            Ok((0..n).map(|i| make(i).query(conn.like())).collect())
        }
        Err(e) => Err(e),
    }
}

/// Whether the server refused a command on a value of another type.
pub(super) fn is_wrong_type(e: &redis::RedisError) -> bool {
    e.code() == Some("WRONGTYPE")
}

/// Whether a pipeline failed because the server refused a command on a
/// value of another type.
fn wrong_type_within(e: &redis::RedisError) -> bool {
    e.clone()
        .into_server_errors()
        .is_some_and(|errors| errors.iter().any(|(_, err)| err.code() == "WRONGTYPE"))
}

/// Whether a pipeline failed because slots are moving (MOVED, ASK, TRYAGAIN).
fn redirected(e: &redis::RedisError) -> bool {
    use redis::ServerErrorKind::{Ask, Moved, TryAgain};
    e.clone().into_server_errors().is_some_and(|errors| {
        errors
            .iter()
            .any(|(_, err)| matches!(err.kind(), Some(Moved | Ask | TryAgain)))
    })
}
