//! Fake servers for the unit tests of the client, `direct` and `routed`:
//! a one-connection server that reads `expect` request bytes, then writes
//! `reply` in the given pieces (a pause between them, so the client sees
//! partial reads), then closes or, with `hang`, keeps the socket open and
//! silent; a server answering each command by a function; a pair of
//! cluster nodes, the first redirecting everything to the second.

use super::cluster::Router;
use super::tls::SharedConfig;
use super::transport::RespConn;
use super::url;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

pub(in crate::backend::redis) struct Server {
    /// The request bytes it received.
    pub received: JoinHandle<Vec<u8>>,
}

pub(in crate::backend::redis) fn serve(
    expect: usize,
    reply: Vec<Vec<u8>>,
    hang: bool,
    timeout: Duration,
) -> (RespConn, Server) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let received = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut got = vec![0u8; expect];
        s.read_exact(&mut got).unwrap();
        for piece in reply {
            s.write_all(&piece).unwrap();
            s.flush().unwrap();
            std::thread::sleep(Duration::from_millis(2));
        }
        if hang {
            std::thread::sleep(timeout * 3);
        }
        got
    });
    let stream = TcpStream::connect(addr).unwrap();
    (
        RespConn::over(stream, timeout).unwrap(),
        Server { received },
    )
}

/// A connection to a fake server's `port` (see [`serve_commands`]).
pub(in crate::backend::redis) fn connect_to(port: u16, timeout: Duration) -> RespConn {
    let stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    RespConn::over(stream, timeout).unwrap()
}

/// `bytes` one byte per piece.
pub(in crate::backend::redis) fn bytewise(bytes: &[u8]) -> Vec<Vec<u8>> {
    bytes.iter().map(|&b| vec![b]).collect()
}

impl RespConn {
    pub(in crate::backend::redis) fn is_open_for_tests(&self) -> bool {
        !self.broken
    }
}

/// A fake server for any number of connections, each in a thread of its
/// own: every command (an array of bulk strings) is answered with the bytes
/// `answer(args, previous)` returns, `previous` being the connection's last
/// command (ASKING, say). Returns its port; it serves until the process
/// ends.
pub(in crate::backend::redis) fn serve_commands(
    answer: impl Fn(&[Vec<u8>], Option<&[Vec<u8>]>) -> Vec<u8> + Send + Sync + 'static,
) -> u16 {
    use std::io::BufRead;
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let answer = Arc::new(answer);
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { return };
            let answer = Arc::clone(&answer);
            std::thread::spawn(move || {
                let mut out = stream.try_clone().unwrap();
                let mut r = std::io::BufReader::new(stream);
                let mut previous: Option<Vec<Vec<u8>>> = None;
                let mut line = String::new();
                let mut number = |r: &mut std::io::BufReader<TcpStream>| -> Option<usize> {
                    line.clear();
                    r.read_line(&mut line).ok().filter(|&n| n > 0)?;
                    line[1..].trim_end().parse().ok()
                };
                while let Some(argc) = number(&mut r) {
                    let mut args = Vec::with_capacity(argc);
                    for _ in 0..argc {
                        let len = number(&mut r).unwrap();
                        let mut arg = vec![0u8; len + 2];
                        r.read_exact(&mut arg).unwrap();
                        arg.truncate(len);
                        args.push(arg);
                    }
                    let reply = answer(&args, previous.as_deref());
                    if out.write_all(&reply).is_err() {
                        return;
                    }
                    previous = Some(args);
                }
            });
        }
    });
    port
}

/// `CLUSTER SLOTS` of a one-master cluster at `port`.
pub(in crate::backend::redis) fn all_slots_at(port: u16) -> Vec<u8> {
    format!("*1\r\n*3\r\n:0\r\n:16383\r\n*2\r\n$9\r\n127.0.0.1\r\n:{port}\r\n").into_bytes()
}

/// A cluster router whose map, read from the node at `port`, is what it
/// answers to `CLUSTER SLOTS`.
pub(in crate::backend::redis) fn router_at(port: u16) -> Router {
    let seed = url::parse(&format!("redis://127.0.0.1:{port}")).unwrap();
    Router::open(
        vec![seed],
        true,
        2,
        Duration::from_secs(2),
        SharedConfig::default(),
    )
    .unwrap()
}

/// Whether a command's name is `name`.
pub(in crate::backend::redis) fn is(args: &[Vec<u8>], name: &[u8]) -> bool {
    args.first().is_some_and(|a| a.eq_ignore_ascii_case(name))
}

/// How the first node of [`redirecting_pair`] turns every data command
/// away.
#[derive(Clone, Copy, Debug)]
pub(in crate::backend::redis) enum Turn {
    /// MOVED to the second node, whose slots they are from then on.
    Moved,
    /// ASK: the second node takes the command behind ASKING.
    Ask,
}

/// Two fake nodes: the first serves every slot by the map it gives at
/// first and turns every data command away (`turn`) to the second, which
/// answers with `answer(args)` (after ASKING for `Turn::Ask`; otherwise
/// an error that no pass takes for a redirection). Returns the router
/// (opened on the first) and the count of commands the second answered.
pub(in crate::backend::redis) fn redirecting_pair(
    turn: Turn,
    answer: impl Fn(&[Vec<u8>]) -> Vec<u8> + Send + Sync + 'static,
) -> (Router, Arc<AtomicUsize>) {
    let answered = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&answered);
    let b_port = Arc::new(AtomicUsize::new(0));
    let b_own = Arc::clone(&b_port);
    let b = serve_commands(move |args, previous| {
        if is(args, b"CLUSTER") {
            return all_slots_at(b_own.load(Ordering::SeqCst) as u16);
        }
        if is(args, b"ASKING") {
            return b"+OK\r\n".to_vec();
        }
        let asked = previous.is_some_and(|p| is(p, b"ASKING"));
        if matches!(turn, Turn::Ask) && !asked {
            return b"-ERR not behind ASKING\r\n".to_vec();
        }
        count.fetch_add(1, Ordering::SeqCst);
        answer(args)
    });
    b_port.store(b as usize, Ordering::SeqCst);
    let moved = Arc::new(AtomicBool::new(false));
    let a_port = Arc::new(AtomicUsize::new(0));
    let own = Arc::clone(&a_port);
    let a = serve_commands(move |args, _| {
        if is(args, b"CLUSTER") {
            let at = if moved.load(Ordering::SeqCst) {
                b
            } else {
                own.load(Ordering::SeqCst) as u16
            };
            return all_slots_at(at);
        }
        let slot = args.get(1).map_or(0, |key| super::routes::slot_of(key));
        match turn {
            Turn::Moved => {
                moved.store(true, Ordering::SeqCst);
                format!("-MOVED {slot} 127.0.0.1:{b}\r\n").into_bytes()
            }
            Turn::Ask => format!("-ASK {slot} 127.0.0.1:{b}\r\n").into_bytes(),
        }
    });
    a_port.store(a as usize, Ordering::SeqCst);
    (router_at(a), answered)
}
