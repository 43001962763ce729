//! The data path over kvtier's own connection (`client::transport`): a job's SETs written
//! from the caller's rows, and its GET replies read into the caller's rows,
//! one pipeline per job. Framing, key names and value headers go into the
//! connection's reusable buffer; a payload is never copied on the way out
//! (vectored writes splice it from the row) and at most once on the way in
//! (the part of it that arrived in the reply buffer with the reply's head;
//! the rest is read from the socket straight into the row).

use super::client::frame::{frame_bulk, frame_bulk_len, frame_command};
use super::client::reply::Head;
use super::client::transport::RespConn;
use super::format;
use super::sealed::{self, SealedLayout};
use crate::seal::{Nonce, RECORD_LEN};
use std::cell::RefCell;
use std::io::{self, IoSlice};

thread_local! {
    /// Per-worker buffer for the sealed values of one write (a sealed value
    /// cannot be spliced from the row: it is the row encrypted). Grown, never
    /// shrunk, so a store allocates nothing once the worker has warmed up.
    static SEALED_VALUES: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Payload bytes framed before a vectored write: the server starts reading
/// the first blocks while the next ones are checksummed, and a write moves
/// enough bytes that its system call costs nothing in comparison.
const WRITE_CHUNK: usize = 512 << 10;
/// Most blocks per vectored write (small blocks): its slices then fit an
/// array on the stack, so a write allocates nothing (a cluster tier writes
/// one pipeline per master, and every job's allocations count).
const WRITE_BLOCKS: usize = 64;

/// How this tier names and lays out blocks.
pub(super) struct Layout<'a> {
    pub name_prefix: &'a str,
    pub namespace_fp: u64,
    pub block_bytes: usize,
    pub ttl_s: u64,
    /// Set for a sealed tier.
    pub seal: Option<SealedLayout<'a>>,
}

impl Layout<'_> {
    fn name_len(&self, key: &[u8]) -> usize {
        match self.seal {
            Some(_) => sealed::name_len(self.name_prefix),
            None => format::key_name_len(self.name_prefix, key),
        }
    }

    pub(super) fn write_name(&self, out: &mut Vec<u8>, key: &[u8]) {
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
pub(super) enum Fetched {
    /// The block, verified, is in its row.
    Good,
    /// No such key.
    Missing,
    /// The server's error for this command.
    Refused(String),
    /// A value that is not this block (header, length): condemned.
    Bad(String),
    /// The header is right but the payload's checksum, computed over the row,
    /// is not: the row may have been written by someone else meanwhile (two
    /// loads into one row), so only a private read may condemn the value.
    Recheck,
}

/// The end of a SET after its value: CRLF, and `EX <ttl>` when set.
fn set_tail(out: &mut Vec<u8>, ttl_s: u64) {
    out.extend_from_slice(b"\r\n");
    if ttl_s > 0 {
        frame_bulk(out, b"EX");
        frame_bulk(out, itoa_u64(ttl_s).as_slice());
    }
}

/// Decimal digits of `n` without allocating.
struct Digits {
    bytes: [u8; 20],
    len: usize,
}

impl Digits {
    fn as_slice(&self) -> &[u8] {
        &self.bytes[20 - self.len..]
    }
}

fn itoa_u64(mut n: u64) -> Digits {
    let mut d = Digits {
        bytes: [0; 20],
        len: 0,
    };
    loop {
        d.len += 1;
        d.bytes[20 - d.len] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return d;
        }
    }
}

/// `SET <name> <header + payload> [EX ttl]` for each block, as one pipeline
/// with at most [`set_window`] SETs unanswered; `replies[i]` is block i's
/// outcome (`Err`: the server's message). An `Err` return is the
/// connection's failure: nothing is known of any block.
pub(super) fn set_pipeline(
    conn: &mut RespConn,
    layout: &Layout,
    blocks: &[(u32, &[u8], &[u8])],
    replies: &mut Vec<Result<(), String>>,
) -> io::Result<()> {
    let started = set_send(conn, layout, blocks)?;
    set_receive(conn, layout, blocks, started, replies)
}

/// Payload bytes of SETs one connection keeps unanswered: a job's whole
/// pipeline of large SETs written at once made Redis serve them more
/// slowly, the server waiting for bytes rather than busier (`redis_loads
/// ... store 2048 512 4`; the runs are in docs/runs/redis.md). Small blocks
/// keep a whole job in flight (64 KiB: 64).
const SET_WINDOW_BYTES: usize = 4 << 20;

/// Blocks of this size and more are SET one at a time per connection: the
/// next SET is written once the last is answered, so the server reads
/// each value alone and keeps the buffer it read as the value (Redis's
/// path for a large argument at the end of its query buffer) instead of
/// copying it out of one that already holds the next SET's start
/// (`redis_loads ... store 2048 512 5`; the runs are in docs/runs/redis.md).
const SET_ALONE_BYTES: usize = 1 << 20;

/// How many SETs of `payload_len`-byte blocks one connection keeps
/// unanswered: one for a large block ([`SET_ALONE_BYTES`]), else as many as
/// fit in [`SET_WINDOW_BYTES`].
fn set_window(payload_len: usize) -> usize {
    match payload_len {
        n if n >= SET_ALONE_BYTES => 1,
        n => (SET_WINDOW_BYTES / n.max(1)).max(1),
    }
}

/// SETs of a pipeline written and not all answered yet (see [`set_send`]),
/// with the versions a sealed tier's values carry.
pub(super) struct SetsSent {
    window: usize,
    sent: usize,
    nonces: Vec<Nonce>,
}

/// The first half of [`set_pipeline`]: starts a request on `conn` and
/// writes the first window of SETs. A cluster job sends to all its masters
/// before reading any reply, so that they work at once.
pub(super) fn set_send(
    conn: &mut RespConn,
    layout: &Layout,
    blocks: &[(u32, &[u8], &[u8])],
) -> io::Result<SetsSent> {
    let mut started = SetsSent {
        window: set_window(layout.block_bytes),
        sent: 0,
        nonces: Vec::new(),
    };
    conn.begin();
    let first_window = started.window.min(blocks.len());
    send_sets(conn, layout, blocks, &mut started, first_window)?;
    Ok(started)
}

/// Writes SETs `started.sent..upto` of `blocks`, each whole (its tail
/// included: the server answers it without waiting for the next), in
/// vectored writes of up to [`WRITE_CHUNK`] payload bytes.
fn send_sets(
    conn: &mut RespConn,
    layout: &Layout,
    blocks: &[(u32, &[u8], &[u8])],
    started: &mut SetsSent,
    upto: usize,
) -> io::Result<()> {
    let argc = if layout.ttl_s > 0 { 5 } else { 3 };
    let mut sealed_values = SEALED_VALUES.with(|buf| buf.take());
    while started.sent < upto {
        let first = started.sent;
        let mut last = first;
        let mut bytes = 0;
        while last < upto && (last == first || (bytes < WRITE_CHUNK && last - first < WRITE_BLOCKS))
        {
            bytes += blocks[last].2.len();
            last += 1;
        }
        // Framing of blocks first..last, the payloads spliced in at `cuts`.
        let mut out = std::mem::take(&mut conn.out);
        let mut cuts = std::mem::take(&mut conn.cuts);
        out.clear();
        cuts.clear();
        for (i, &(_, key, payload)) in blocks.iter().enumerate().take(last).skip(first) {
            if i > first {
                set_tail(&mut out, layout.ttl_s);
            }
            frame_command(&mut out, argc);
            frame_bulk(&mut out, b"SET");
            frame_bulk_len(&mut out, layout.name_len(key));
            layout.write_name(&mut out, key);
            out.extend_from_slice(b"\r\n");
            if layout.seal.is_some() {
                frame_bulk_len(&mut out, sealed::value_len(payload.len()));
            } else {
                let header = format::encode_header(layout.namespace_fp, key, payload);
                frame_bulk_len(&mut out, header.len + payload.len());
                out.extend_from_slice(header.as_slice());
            }
            cuts.push(out.len());
        }
        // A sealed tier sends each block's record and ciphertext from the
        // worker's buffer instead of the row.
        let value_len = sealed::value_len(layout.block_bytes);
        if let Some(seal) = layout.seal {
            let need = value_len * (last - first);
            if sealed_values.len() < need {
                sealed_values.resize(need, 0);
            }
            for (&(_, key, payload), value) in blocks[first..last]
                .iter()
                .zip(sealed_values.chunks_exact_mut(value_len))
            {
                let nonce = seal
                    .seal_into(layout.namespace_fp, key, payload, value)
                    .map_err(|e| io::Error::other(e.message().to_string()))?;
                started.nonces.push(nonce);
            }
        }
        set_tail(&mut out, layout.ttl_s);
        let mut slices = [IoSlice::new(&[]); 2 * WRITE_BLOCKS + 1];
        let mut used = 0;
        let mut from = 0;
        for (k, &cut) in cuts.iter().enumerate() {
            let payload = match layout.seal {
                Some(_) => &sealed_values[k * value_len..][..value_len],
                None => blocks[first + k].2,
            };
            slices[used] = IoSlice::new(&out[from..cut]);
            slices[used + 1] = IoSlice::new(payload);
            used += 2;
            from = cut;
        }
        slices[used] = IoSlice::new(&out[from..]);
        let written = conn.write_all_vectored(&mut slices[..used + 1]);
        conn.out = out;
        conn.cuts = cuts;
        written?;
        started.sent = last;
    }
    SEALED_VALUES.with(|buf| *buf.borrow_mut() = sealed_values);
    Ok(())
}

/// The second half of [`set_pipeline`]: reads the replies of the SETs
/// [`set_send`] started on `conn` for `blocks`, keeping the window full.
pub(super) fn set_receive(
    conn: &mut RespConn,
    layout: &Layout,
    blocks: &[(u32, &[u8], &[u8])],
    mut started: SetsSent,
    replies: &mut Vec<Result<(), String>>,
) -> io::Result<()> {
    replies.clear();
    for (i, &(_, key, _)) in blocks.iter().enumerate() {
        // Replies i.. are outstanding: top them up to the window.
        let upto = (i + started.window).min(blocks.len());
        if upto > started.sent {
            send_sets(conn, layout, blocks, &mut started, upto)?;
        }
        replies.push(match conn.read_head()? {
            Head::Ok => {
                if let Some(seal) = layout.seal {
                    seal.ledger.record(key, started.nonces[i]);
                }
                Ok(())
            }
            Head::Error(message) => Err(message),
            other => return Err(conn.unexpected(format!("{other:?} in reply to SET"))),
        });
    }
    Ok(())
}

/// The GETs of a pipeline whose replies are not read yet, per connection:
/// never more than fit in this many value bytes, and at least 2 (one reply
/// being read while the server writes the next). The server copies each
/// GET's value into a reply buffer of its own before writing it, and deep
/// pipelines of large values made it fault fresh memory for those buffers
/// (`redis_loads ... load` with `RL_PERF_SERVER=1`; docs/runs/redis.md).
const GET_WINDOW_BYTES: usize = 8 << 20;

/// Below that, the value bytes one connection keeps in flight, and at
/// least [`GET_WINDOW_MIN`] GETs: 64 KiB loads 4 deep ran faster than a
/// whole 16-block job in flight (`kvtier-bench --backend redis --repeat 3`;
/// docs/runs/redis.md). Not profiled: the server builds every reply of what
/// it has read before it writes, and 4 replies of 64 KiB stay in its CPU's
/// caches where 16 do not.
const GET_WINDOW_SMALL_BYTES: usize = 256 << 10;
const GET_WINDOW_MIN: usize = 4;

/// How many GETs of `value_len`-byte values one connection keeps in flight.
fn get_window(value_len: usize) -> usize {
    let len = value_len.max(1);
    let small = (GET_WINDOW_SMALL_BYTES / len).max(GET_WINDOW_MIN);
    small.min(GET_WINDOW_BYTES / len).max(2)
}

/// `GET <name>` for each block, pipelined on one connection with at most
/// [`get_window`] replies outstanding; each value's header is read into a
/// private buffer and its payload into the block's row, then verified there.
/// `fetched[i]` is block i's outcome; an `Err` return is the connection's
/// failure (rows may hold anything).
pub(super) fn get_pipeline(
    conn: &mut RespConn,
    layout: &Layout,
    blocks: &mut [(u32, &[u8], &mut [u8])],
    fetched: &mut Vec<Fetched>,
) -> io::Result<()> {
    let started = get_send(conn, layout, blocks)?;
    get_receive(conn, layout, blocks, started, fetched)
}

/// GETs of a pipeline sent and not all answered yet (see [`get_send`]).
#[derive(Clone, Copy)]
pub(super) struct GetsSent {
    window: usize,
    sent: usize,
}

/// The first half of [`get_pipeline`]: starts a request on `conn`, frames
/// the GETs and sends the first window of them. A cluster job sends to all
/// its masters before reading any reply, so that they work at once.
pub(super) fn get_send(
    conn: &mut RespConn,
    layout: &Layout,
    blocks: &[(u32, &[u8], &mut [u8])],
) -> io::Result<GetsSent> {
    conn.out.clear();
    conn.cuts.clear();
    let mut value_len = 0;
    for (_, key, dst) in blocks.iter() {
        frame_command(&mut conn.out, 2);
        frame_bulk(&mut conn.out, b"GET");
        frame_bulk_len(&mut conn.out, layout.name_len(key));
        layout.write_name(&mut conn.out, key);
        conn.out.extend_from_slice(b"\r\n");
        // Where each command ends: the window sends up to a cut.
        conn.cuts.push(conn.out.len());
        value_len = value_len.max(match layout.seal {
            Some(_) => sealed::value_len(dst.len()),
            None => format::header_len(key.len()) + dst.len(),
        });
    }
    let window = get_window(value_len);
    conn.begin();
    let sent = window.min(conn.cuts.len());
    if sent > 0 {
        conn.send_out_range(0, conn.cuts[sent - 1])?;
    }
    Ok(GetsSent { window, sent })
}

/// The second half of [`get_pipeline`]: reads the replies of the GETs
/// [`get_send`] started on `conn` for `blocks`, keeping the window full.
pub(super) fn get_receive(
    conn: &mut RespConn,
    layout: &Layout,
    blocks: &mut [(u32, &[u8], &mut [u8])],
    started: GetsSent,
    fetched: &mut Vec<Fetched>,
) -> io::Result<()> {
    let GetsSent { window, mut sent } = started;
    fetched.clear();
    for (i, (_, key, dst)) in blocks.iter_mut().enumerate() {
        // Replies i.. are outstanding: top them up to the window.
        let upto = (i + window).min(conn.cuts.len());
        if upto > sent {
            let from = if sent == 0 { 0 } else { conn.cuts[sent - 1] };
            conn.send_out_range(from, conn.cuts[upto - 1])?;
            sent = upto;
        }
        fetched.push(match conn.read_head()? {
            Head::Nil => Fetched::Missing,
            Head::Error(message) => Fetched::Refused(message),
            Head::Bulk(len) => read_block(conn, layout, key, dst, len)?,
            other => return Err(conn.unexpected(format!("{other:?} in reply to GET"))),
        });
    }
    Ok(())
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
/// command); the counts are dropped and a refusal ends nothing (a delete or
/// touch is best effort). An `Err` is the connection's failure.
pub(super) fn variadic_pipeline(
    conn: &mut RespConn,
    layout: &Layout,
    command: &str,
    keys: &[&[u8]],
) -> io::Result<()> {
    conn.out.clear();
    let commands = keys.chunks(KEYS_PER_COMMAND);
    let sent = commands.len();
    for names in commands {
        frame_command(&mut conn.out, 1 + names.len());
        frame_bulk(&mut conn.out, command.as_bytes());
        for key in names {
            frame_bulk_len(&mut conn.out, layout.name_len(key));
            layout.write_name(&mut conn.out, key);
            conn.out.extend_from_slice(b"\r\n");
        }
    }
    conn.begin();
    let len = conn.out.len();
    conn.send_out_range(0, len)?;
    counts_receive(conn, sent, command, &mut |_, _| {}, &mut Vec::new())
}

/// The first half of a pipeline of one-key commands answered by an
/// integer (`DEL`, `EXISTS`, `TOUCH`): starts a request on `conn` and writes
/// `<command> <name>` for each key, in the connection's reusable buffer
/// (nothing allocated per key).
pub(super) fn keys_send(
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
pub(super) fn counts_receive(
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

/// A GET's bulk reply of `len` bytes for `key`: into `dst` when its length
/// is a block's, else read and judged by its first bytes.
fn read_block(
    conn: &mut RespConn,
    layout: &Layout,
    key: &[u8],
    dst: &mut [u8],
    len: usize,
) -> io::Result<Fetched> {
    if let Some(seal) = layout.seal {
        return read_sealed_block(conn, layout, seal, key, dst, len);
    }
    let mut head = [0u8; format::MAX_HEADER];
    let header_len = format::header_len(key.len());
    let check =
        |head: &[u8]| format::check_header(head, len, layout.namespace_fp, key, layout.block_bytes);
    if len != header_len + dst.len() {
        let got = len.min(head.len());
        conn.read_into(&mut head[..got])?;
        conn.skip(len - got)?;
        conn.read_crlf()?;
        return Ok(Fetched::Bad(match check(&head[..got]) {
            Err(problem) => problem,
            Ok(_) => format!("value of {len} bytes for a block of {}", dst.len()),
        }));
    }
    conn.read_into(&mut head[..header_len])?;
    let fetched = match check(&head[..header_len]) {
        Ok(sum) => {
            // Checksummed as it lands (see `read_into_seen`).
            let mut payload_sum = sum.hasher();
            conn.read_into_seen(dst, &mut |landed| payload_sum.write(landed))?;
            match payload_sum.matches() {
                true => Fetched::Good,
                false => Fetched::Recheck,
            }
        }
        Err(problem) => {
            conn.read_into(dst)?;
            Fetched::Bad(problem)
        }
    };
    conn.read_crlf()?;
    Ok(fetched)
}

/// A sealed tier's GET reply: the ciphertext is read into `dst` and
/// decrypted there. Any failure is rechecked by a private read, which alone
/// may judge the value (the row may have been written meanwhile).
fn read_sealed_block(
    conn: &mut RespConn,
    layout: &Layout,
    seal: SealedLayout,
    key: &[u8],
    dst: &mut [u8],
    len: usize,
) -> io::Result<Fetched> {
    let mut record = [0u8; RECORD_LEN];
    if len != sealed::value_len(dst.len()) {
        let got = len.min(RECORD_LEN);
        conn.read_into(&mut record[..got])?;
        conn.skip(len - got)?;
        conn.read_crlf()?;
        return Ok(Fetched::Recheck);
    }
    conn.read_into(&mut record)?;
    conn.read_into(dst)?;
    conn.read_crlf()?;
    Ok(
        match seal.unseal(layout.namespace_fp, layout.block_bytes, key, &record, dst) {
            Ok(()) => Fetched::Good,
            Err(_) => Fetched::Recheck,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::redis::client::fake::serve;
    use std::time::Duration;

    const T: Duration = Duration::from_secs(5);

    fn layout(block_bytes: usize, ttl_s: u64) -> Layout<'static> {
        Layout {
            name_prefix: "p:00ff:b4:",
            namespace_fp: 0xff,
            block_bytes,
            ttl_s,
            seal: None,
        }
    }

    fn block(seed: u8, len: usize) -> Vec<u8> {
        (0..len).map(|i| (i as u8).wrapping_mul(seed)).collect()
    }

    fn value(l: &Layout, key: &[u8], payload: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        format::write_value(&mut v, l.namespace_fp, key, payload).unwrap();
        v
    }

    fn bulk(v: &[u8]) -> Vec<u8> {
        let mut out = format!("${}\r\n", v.len()).into_bytes();
        out.extend_from_slice(v);
        out.extend_from_slice(b"\r\n");
        out
    }

    #[test]
    fn sets_are_sent_as_the_crate_would_frame_them() {
        // Blocks over WRITE_CHUNK: the pipeline goes out in several writes.
        let l = layout(300_000, 60);
        let payloads = [
            block(3, l.block_bytes),
            block(5, l.block_bytes),
            block(7, l.block_bytes),
        ];
        let keys: [&[u8]; 3] = [b"k1", b"key two", &[0xab; 120]];
        let mut expected = Vec::new();
        for (key, payload) in keys.iter().zip(&payloads) {
            let name = format::key_name(l.name_prefix, key);
            let cmd = redis::cmd("SET")
                .arg(name)
                .arg(value(&l, key, payload))
                .arg("EX")
                .arg(60)
                .get_packed_command();
            expected.extend_from_slice(&cmd);
        }
        let reply = b"+OK\r\n-OOM command not allowed\r\n+OK\r\n".to_vec();
        let (mut conn, server) = serve(expected.len(), vec![reply], false, T);
        let blocks: Vec<(u32, &[u8], &[u8])> = keys
            .iter()
            .zip(&payloads)
            .map(|(k, p)| (0, *k, p.as_slice()))
            .collect();
        let mut replies = Vec::new();
        set_pipeline(&mut conn, &l, &blocks, &mut replies).unwrap();
        assert_eq!(
            replies,
            vec![Ok(()), Err("OOM command not allowed".into()), Ok(())]
        );
        assert!(server.received.join().unwrap() == expected);
    }

    #[test]
    fn gets_land_in_rows_and_each_reply_is_judged() {
        let l = layout(4096, 0);
        let keys: [&[u8]; 7] = [
            b"good", b"nil", b"err", b"short", b"damaged", b"other", b"long",
        ];
        let good = block(9, 4096);
        let mut damaged = value(&l, b"damaged", &good);
        *damaged.last_mut().unwrap() ^= 1;
        let mut long = value(&l, b"long", &good);
        long.push(0);
        let replies = [
            bulk(&value(&l, b"good", &good)),
            b"$-1\r\n".to_vec(),
            b"-WRONGTYPE Operation against a key holding the wrong kind of value\r\n".to_vec(),
            bulk(b"garbage"),
            bulk(&damaged),
            bulk(&value(&l, b"not-me", &good)),
            bulk(&long),
        ]
        .concat();
        let request_len: usize = keys
            .iter()
            .map(|k| {
                redis::cmd("GET")
                    .arg(format::key_name(l.name_prefix, k))
                    .get_packed_command()
                    .len()
            })
            .sum();
        let pieces = replies.chunks(1000).map(<[u8]>::to_vec).collect();
        let (mut conn, _server) = serve(request_len, pieces, false, T);
        let mut rows = vec![vec![0u8; 4096]; keys.len()];
        let mut blocks: Vec<(u32, &[u8], &mut [u8])> = keys
            .iter()
            .zip(rows.iter_mut())
            .map(|(k, r)| (0, *k, r.as_mut_slice()))
            .collect();
        let mut fetched = Vec::new();
        get_pipeline(&mut conn, &l, &mut blocks, &mut fetched).unwrap();
        assert_eq!(fetched[0], Fetched::Good);
        assert_eq!(fetched[1], Fetched::Missing);
        assert!(matches!(&fetched[2], Fetched::Refused(m) if m.starts_with("WRONGTYPE")));
        assert_eq!(
            fetched[3],
            Fetched::Bad("value of 7 bytes is too short".into())
        );
        assert_eq!(fetched[4], Fetched::Recheck);
        assert_eq!(fetched[5], Fetched::Bad("header names another key".into()));
        let wrong_length = format!("value of {} bytes for a block of 4096", long.len());
        assert_eq!(fetched[6], Fetched::Bad(wrong_length));
        assert!(rows[0] == good);
        assert!(conn.is_open_for_tests());
    }

    /// A server that answers `commands` one by one with `replies`; before
    /// each answer it reads whatever the client has written meanwhile
    /// (until 20 ms pass with nothing new, so the kernel's buffers never
    /// limit what the client may write ahead) and counts the whole commands
    /// beyond the one being answered. Returns the most it saw.
    fn serve_counting_ahead(
        commands: Vec<Vec<u8>>,
        replies: Vec<Vec<u8>>,
    ) -> (std::net::SocketAddr, std::thread::JoinHandle<usize>) {
        use std::io::{ErrorKind, Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            s.set_read_timeout(Some(T)).unwrap();
            let ends: Vec<usize> = commands
                .iter()
                .scan(0, |end, c| {
                    *end += c.len();
                    Some(*end)
                })
                .collect();
            let (mut received, mut chunk) = (Vec::new(), vec![0u8; 1 << 16]);
            let mut most_ahead = 0;
            for (i, reply) in replies.iter().enumerate() {
                while received.len() < ends[i] {
                    let n = s.read(&mut chunk).unwrap();
                    assert!(n > 0, "closed before command {i}");
                    received.extend_from_slice(&chunk[..n]);
                }
                s.set_nonblocking(true).unwrap();
                let mut quiet_since = std::time::Instant::now();
                while quiet_since.elapsed() < Duration::from_millis(20) {
                    match s.read(&mut chunk) {
                        Ok(0) => break,
                        Ok(n) => {
                            received.extend_from_slice(&chunk[..n]);
                            quiet_since = std::time::Instant::now();
                        }
                        Err(e) if e.kind() == ErrorKind::WouldBlock => {
                            std::thread::sleep(Duration::from_millis(1))
                        }
                        Err(e) => panic!("{e}"),
                    }
                }
                s.set_nonblocking(false).unwrap();
                let ahead = ends[i + 1..]
                    .iter()
                    .take_while(|&&end| end <= received.len());
                most_ahead = most_ahead.max(ahead.count());
                s.write_all(reply).unwrap();
            }
            assert!(received == commands.concat(), "the commands, in order");
            most_ahead
        });
        (addr, server)
    }

    #[test]
    fn get_windows_follow_the_value_size() {
        let value = |block: usize| format::header_len(2) + block;
        assert_eq!(get_window(value(4 << 10)), 63);
        assert_eq!(get_window(value(64 << 10)), 4);
        assert_eq!(get_window(value(1 << 20)), 4);
        assert_eq!(get_window(value(2 << 20)), 3);
        assert_eq!(get_window(value(3 << 20)), 2);
        assert_eq!(get_window(value(64 << 20)), 2);
    }

    #[test]
    fn large_gets_keep_only_the_window_outstanding() {
        // 3 MiB blocks: a window of 2 GETs (GET_WINDOW_BYTES is 8 MiB).
        let l = layout(3 << 20, 0);
        let window = get_window(format::header_len(2) + l.block_bytes);
        assert_eq!(window, 2);
        let keys: Vec<Vec<u8>> = (0..5u8).map(|i| vec![b'k', i]).collect();
        let payloads: Vec<Vec<u8>> = (0..5u8).map(|i| block(i + 3, l.block_bytes)).collect();
        let commands: Vec<Vec<u8>> = keys
            .iter()
            .map(|k| {
                redis::cmd("GET")
                    .arg(format::key_name(l.name_prefix, k))
                    .get_packed_command()
            })
            .collect();
        let replies: Vec<Vec<u8>> = keys
            .iter()
            .zip(&payloads)
            .map(|(k, p)| bulk(&value(&l, k, p)))
            .collect();
        let (addr, server) = serve_counting_ahead(commands, replies);
        let stream = std::net::TcpStream::connect(addr).unwrap();
        let mut conn = RespConn::over(stream, T).unwrap();
        let mut rows = vec![vec![0u8; l.block_bytes]; keys.len()];
        let mut blocks: Vec<(u32, &[u8], &mut [u8])> = keys
            .iter()
            .zip(rows.iter_mut())
            .map(|(k, r)| (0, k.as_slice(), r.as_mut_slice()))
            .collect();
        let mut fetched = Vec::new();
        get_pipeline(&mut conn, &l, &mut blocks, &mut fetched).unwrap();
        assert!(fetched.iter().all(|f| *f == Fetched::Good), "{fetched:?}");
        assert!(rows == payloads);
        // Never more than the window: the one being answered and one more.
        assert_eq!(server.join().unwrap(), window - 1);
    }

    #[test]
    fn large_sets_keep_only_the_window_unanswered() {
        // 512 KiB blocks: a window of 8 SETs (SET_WINDOW_BYTES is 4 MiB);
        // 1 MiB and up: one at a time (SET_ALONE_BYTES).
        assert_eq!(set_window(2 << 20), 1);
        assert_eq!(set_window(64 << 10), 64);
        for (block_bytes, expected_window) in [(512 << 10, 8), (1 << 20, 1)] {
            let l = layout(block_bytes, 0);
            let window = set_window(l.block_bytes);
            assert_eq!(window, expected_window);
            let keys: Vec<Vec<u8>> = (0..9u8).map(|i| vec![b'k', i]).collect();
            let payloads: Vec<Vec<u8>> = (0..9u8).map(|i| block(i + 3, l.block_bytes)).collect();
            let commands: Vec<Vec<u8>> = keys
                .iter()
                .zip(&payloads)
                .map(|(k, p)| {
                    redis::cmd("SET")
                        .arg(format::key_name(l.name_prefix, k))
                        .arg(value(&l, k, p))
                        .get_packed_command()
                })
                .collect();
            let replies = vec![b"+OK\r\n".to_vec(); commands.len()];
            let (addr, server) = serve_counting_ahead(commands, replies);
            let stream = std::net::TcpStream::connect(addr).unwrap();
            let mut conn = RespConn::over(stream, T).unwrap();
            let blocks: Vec<(u32, &[u8], &[u8])> = keys
                .iter()
                .zip(&payloads)
                .map(|(k, p)| (0, k.as_slice(), p.as_slice()))
                .collect();
            let mut replies = Vec::new();
            set_pipeline(&mut conn, &l, &blocks, &mut replies).unwrap();
            assert_eq!(replies, vec![Ok(()); keys.len()]);
            // Never more than the window: the one being answered and at
            // most window - 1 more; pipelined when the window allows.
            let most_ahead = server.join().unwrap();
            let allowed = if window == 1 { 0..1 } else { 1..window };
            assert!(
                allowed.contains(&most_ahead),
                "{most_ahead} SETs written ahead of an unanswered one (window {window})"
            );
        }
    }

    #[test]
    fn a_reply_cut_mid_payload_fails_the_pipeline_and_the_connection() {
        let l = layout(100_000, 0);
        let payload = block(3, l.block_bytes);
        let whole = bulk(&value(&l, b"k", &payload));
        let request_len = redis::cmd("GET")
            .arg(format::key_name(l.name_prefix, b"k"))
            .get_packed_command()
            .len();
        let (mut conn, _server) = serve(request_len, vec![whole[..50_000].to_vec()], false, T);
        let mut row = vec![0u8; l.block_bytes];
        let mut blocks = [(0u32, &b"k"[..], row.as_mut_slice())];
        let mut fetched = Vec::new();
        let e = get_pipeline(&mut conn, &l, &mut blocks, &mut fetched).unwrap_err();
        assert!(
            matches!(
                e.kind(),
                io::ErrorKind::UnexpectedEof | io::ErrorKind::ConnectionReset
            ),
            "{e}"
        );
        assert!(!conn.is_open_for_tests());
    }
}
