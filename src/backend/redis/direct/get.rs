//! The GET path: a job's GETs sent a window at a time, each reply's header
//! checked and its payload read into its row (checksummed as it lands; a
//! sealed value opened there).

use super::super::client::{frame_bulk, frame_bulk_len, frame_command};
use super::super::client::{Head, RespConn, ServerError};
use super::{get_ceiling, Fetched, Layout};
use crate::backend::redis::format;
use crate::backend::redis::sealed::{self, SealedLayout};
use crate::seal::RECORD_LEN;
use std::io;

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
#[cfg(test)]
pub(in crate::backend::redis) fn get_pipeline(
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
pub(in crate::backend::redis) struct GetsSent {
    window: usize,
    sent: usize,
}

/// The first half of a pipeline (`get_pipeline` in the tests): starts a request on `conn`, frames
/// the GETs and sends the first window of them. A cluster job sends to all
/// its masters before reading any reply, so that they work at once.
pub(in crate::backend::redis) fn get_send(
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

/// The second half of a pipeline (`get_pipeline` in the tests): reads the replies of the GETs
/// [`get_send`] started on `conn` for `blocks`, keeping the window full.
pub(in crate::backend::redis) fn get_receive(
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
            Head::Error(message) => Fetched::Refused(ServerError::new(message)),
            Head::Bulk(len) if len > get_ceiling(layout.value_len(key)) => {
                return Err(conn.unexpected(format!(
                    "a GET reply of {len} bytes for a value of {}",
                    layout.value_len(key)
                )))
            }
            Head::Bulk(len) => read_block(conn, layout, key, dst, len)?,
            other => return Err(conn.unexpected(format!("{other:?} in reply to GET"))),
        });
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
    use crate::backend::redis::client::{serve, Problem};
    use crate::backend::redis::direct::test_support::*;
    use std::time::Duration;

    const T: Duration = Duration::from_secs(5);

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
        assert!(matches!(&fetched[2], Fetched::Refused(e) if e.problem == Problem::WrongType));
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
