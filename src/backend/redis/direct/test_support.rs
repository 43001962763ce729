//! What the tests of the SET and GET paths share: a layout, blocks and
//! their values, and a server that counts how far the client runs ahead.

use super::Layout;
use crate::backend::redis::format;
use std::time::Duration;

const T: Duration = Duration::from_secs(5);

pub(super) fn layout(block_bytes: usize, ttl_s: u64) -> Layout<'static> {
    Layout {
        name_prefix: "p:00ff:b4:",
        namespace_fp: 0xff,
        block_bytes,
        ttl_s,
        seal: None,
    }
}

pub(super) fn block(seed: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(seed)).collect()
}

pub(super) fn value(l: &Layout, key: &[u8], payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    format::write_value(&mut v, l.namespace_fp, key, payload).unwrap();
    v
}

pub(super) fn bulk(v: &[u8]) -> Vec<u8> {
    let mut out = format!("${}\r\n", v.len()).into_bytes();
    out.extend_from_slice(v);
    out.extend_from_slice(b"\r\n");
    out
}

/// A server that answers `commands` one by one with `replies`; before
/// each answer it reads whatever the client has written meanwhile
/// (until 100 ms pass with nothing new, so neither the kernel's buffers
/// nor a client descheduled on a loaded machine limits what it may write
/// ahead) and counts the whole commands
/// beyond the one being answered. Returns the most it saw.
pub(super) fn serve_counting_ahead(
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
            while quiet_since.elapsed() < Duration::from_millis(100) {
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
