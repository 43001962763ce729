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

/// `bytes` one byte per piece.
pub(in crate::backend::redis) fn bytewise(bytes: &[u8]) -> Vec<Vec<u8>> {
    bytes.iter().map(|&b| vec![b]).collect()
}

impl RespConn {
    pub(in crate::backend::redis) fn is_open_for_tests(&self) -> bool {
        !self.broken
    }
}
