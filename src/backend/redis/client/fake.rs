//! A one-connection fake server for the unit tests of the client and of
//! `direct`: it reads `expect` request bytes, then writes `reply` in the
//! given pieces (a pause between them, so the client sees partial reads),
//! then closes or, with `hang`, keeps the socket open and silent.

use super::transport::RespConn;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
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
    use std::sync::Arc;
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
