//! The data path over kvtier's own connection (`client::transport`): a
//! job's SETs written from the caller's rows, and its GET replies read into
//! the caller's rows, one pipeline per job. Framing, key names and value headers go into the
//! connection's reusable buffer; a payload is never copied on the way out
//! (vectored writes splice it from the row) and at most once on the way in
//! (the part of it that arrived in the reply buffer with the reply's head;
//! the rest is read from the socket straight into the row).
//!
//! This file: how a tier names and lays out blocks (`Layout`), what a GET
//! brought (`Fetched`), and pipelines of key commands (DEL, EXISTS, TOUCH);
//! the SET path is `set`, the GET path `get`.

mod get;
mod set;
#[cfg(test)]
mod test_support;

pub(super) use self::get::{get_receive, get_send, GetsSent};
pub(super) use self::set::{set_receive, set_send, SetsSent};

use super::client::{frame_bulk, frame_bulk_len, frame_command};
use super::client::{Head, RespConn, ServerError};
use super::format;
use super::sealed::{self, SealedLayout};
use std::io;

/// How this tier names and lays out blocks.
pub(in crate::backend::redis) struct Layout<'a> {
    pub name_prefix: &'a str,
    pub namespace_fp: u64,
    pub block_bytes: usize,
    pub ttl_s: u64,
    /// Set for a sealed tier.
    pub seal: Option<SealedLayout<'a>>,
}

/// Bytes a GET reply may declare beyond the value it should bring, before
/// it is refused unread (the connection closed, the load failed, nothing
/// judged): room for a garbage value somewhat longer than a block, which a
/// private read then condemns, never for a length that would take the
/// deadline to stream or the memory to hold.
const GET_MARGIN: usize = 64 << 10;

/// The most a GET reply of a `value_len`-byte block may declare: twice the
/// value, plus [`GET_MARGIN`].
pub(in crate::backend::redis) fn get_ceiling(value_len: usize) -> usize {
    value_len.saturating_mul(2).saturating_add(GET_MARGIN)
}

impl Layout<'_> {
    /// The length of `key`'s value (header or sealed record, then the
    /// block).
    pub(in crate::backend::redis) fn value_len(&self, key: &[u8]) -> usize {
        match self.seal {
            Some(_) => sealed::value_len(self.block_bytes),
            None => format::header_len(key.len()) + self.block_bytes,
        }
    }

    fn name_len(&self, key: &[u8]) -> usize {
        match self.seal {
            Some(_) => sealed::name_len(self.name_prefix),
            None => format::key_name_len(self.name_prefix, key),
        }
    }

    pub(in crate::backend::redis) fn write_name(&self, out: &mut Vec<u8>, key: &[u8]) {
        match self.seal {
            Some(seal) => {
                let tag = seal
                    .sealer
                    .name_tag(self.namespace_fp, self.block_bytes, key);
                sealed::write_name(out, self.name_prefix, &tag)
            }
            None => format::write_key_name(out, self.name_prefix, key),
        }
    }
}

/// What one GET brought.
#[derive(Debug, PartialEq)]
pub(in crate::backend::redis) enum Fetched {
    /// The block, verified, is in its row.
    Good,
    /// No such key.
    Missing,
    /// The server's error for this command.
    Refused(ServerError),
    /// A value that is not this block (header, length), as far as this
    /// read can tell: read again privately, which alone may condemn it (the
    /// connection may have been out of step).
    Bad(String),
    /// The header is right but the payload's checksum, computed over the row,
    /// is not: the row may have been written by someone else meanwhile (two
    /// loads into one row), so only a private read may condemn the value.
    Recheck,
}

/// Keys named by one variadic command (`DEL`, `TOUCH`) on a single server:
/// a pipeline of such commands replaces one command per key. redis-server
/// 7.0 spent 1.5 us of its CPU per one-key DEL against 0.8 us per key in
/// DELs of 16 keys (redis-benchmark, missing keys, so that only the
/// command's own cost counts), and the server is what a full tier's stores
/// wait on. Bounded so that one command never holds the server for long
/// (a DEL frees its values before it answers).
const KEYS_PER_COMMAND: usize = 256;

/// `<command> <name> <name> ...` (a variadic one: `DEL`, `TOUCH`) for
/// `keys`, at most [`KEYS_PER_COMMAND`] names per command, as one pipeline
/// on a single server (a cluster refuses keys of several slots in one
/// command). Returns how many commands were sent (their replies are read
/// by [`counts_receive`]). An `Err` is the connection's failure.
pub(in crate::backend::redis) fn variadic_send(
    conn: &mut RespConn,
    layout: &Layout,
    command: &[u8],
    keys: &[&[u8]],
) -> io::Result<usize> {
    conn.out.clear();
    let commands = keys.chunks(KEYS_PER_COMMAND);
    let sent = commands.len();
    for names in commands {
        frame_command(&mut conn.out, 1 + names.len());
        frame_bulk(&mut conn.out, command);
        for key in names {
            frame_bulk_len(&mut conn.out, layout.name_len(key));
            layout.write_name(&mut conn.out, key);
            conn.out.extend_from_slice(b"\r\n");
        }
    }
    conn.begin();
    let len = conn.out.len();
    conn.send_out_range(0, len)?;
    Ok(sent)
}

/// The first half of a pipeline of one-key commands answered by an
/// integer (`DEL`, `EXISTS`, `TOUCH`): starts a request on `conn` and writes
/// `<command> <name>` for each key, in the connection's reusable buffer
/// (nothing allocated per key).
pub(in crate::backend::redis) fn keys_send(
    conn: &mut RespConn,
    layout: &Layout,
    command: &[u8],
    keys: &[&[u8]],
) -> io::Result<()> {
    conn.out.clear();
    for key in keys {
        frame_command(&mut conn.out, 2);
        frame_bulk(&mut conn.out, command);
        frame_bulk_len(&mut conn.out, layout.name_len(key));
        layout.write_name(&mut conn.out, key);
        conn.out.extend_from_slice(b"\r\n");
    }
    conn.begin();
    let len = conn.out.len();
    conn.send_out_range(0, len)
}

/// The second half: reads the integer replies of the `n` commands
/// [`keys_send`] wrote on `conn`, `count(i, n)` for key i's; a server's
/// refusal of key i is pushed to `refused` with its message.
pub(in crate::backend::redis) fn counts_receive(
    conn: &mut RespConn,
    n: usize,
    command: &str,
    count: &mut dyn FnMut(usize, i64),
    refused: &mut Vec<(usize, String)>,
) -> io::Result<()> {
    for i in 0..n {
        match conn.read_head()? {
            Head::Int(n) => count(i, n),
            Head::Error(message) => refused.push((i, message)),
            other => return Err(conn.unexpected(format!("{other:?} in reply to {command}"))),
        }
    }
    Ok(())
}
