//! The SET path: a job's SETs written from the caller's rows (sealed
//! values from a per-worker buffer), a window of them unanswered at a time,
//! then their replies read.

use super::super::client::{frame_bulk, frame_bulk_len, frame_command};
use super::super::client::{Head, RespConn};
use super::Layout;
use crate::backend::redis::format;
use crate::backend::redis::sealed;
use crate::seal::Nonce;
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
#[cfg(test)]
pub(in crate::backend::redis) fn set_pipeline(
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
pub(in crate::backend::redis) struct SetsSent {
    window: usize,
    sent: usize,
    nonces: Vec<Nonce>,
}

/// The first half of a pipeline (`set_pipeline` in the tests): starts a request on `conn` and
/// writes the first window of SETs. A cluster job sends to all its masters
/// before reading any reply, so that they work at once.
pub(in crate::backend::redis) fn set_send(
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

/// The second half of a pipeline (`set_pipeline` in the tests): reads the replies of the SETs
/// [`set_send`] started on `conn` for `blocks`, keeping the window full.
pub(in crate::backend::redis) fn set_receive(
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::redis::client::serve;
    use crate::backend::redis::direct::test_support::*;
    use std::time::Duration;

    const T: Duration = Duration::from_secs(5);

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
}
