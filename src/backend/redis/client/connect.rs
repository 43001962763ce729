//! Opening a connection: the server's addresses tried in turn within the
//! deadline, the TLS handshake (the server's certificate checked against
//! the host), then AUTH and SELECT as the URL says (`command`).

use super::tls;
use super::transport::{timed_out, tls_error, RespConn, Stream, Tls};
use super::url::Endpoint;
use rustls::ClientConfig;
use std::io;
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::{Duration, Instant};

impl RespConn {
    /// Connects to `at` by `deadline` and each step within `timeout`,
    /// every address tried and the handshake included (over TLS with
    /// `tls`, the server's certificate checked against its host), then
    /// authenticates and selects the database as its URL says; its later
    /// requests each get `timeout`. A refused password is an error of kind
    /// `PermissionDenied`.
    pub(in crate::backend::redis) fn connect(
        at: &Endpoint,
        tls: Option<&Arc<ClientConfig>>,
        timeout: Duration,
        deadline: Instant,
    ) -> io::Result<RespConn> {
        let (host, port) = (at.host.as_str(), at.port);
        let mut last = None;
        let mut stream = None;
        for addr in (host, port).to_socket_addrs()? {
            let left = deadline
                .saturating_duration_since(Instant::now())
                .min(timeout);
            if left.is_zero() {
                last = Some(timed_out());
                break;
            }
            match TcpStream::connect_timeout(&addr, left) {
                Ok(s) => {
                    stream = Some(s);
                    break;
                }
                Err(e) => last = Some(e),
            }
        }
        let stream = match (stream, last) {
            (Some(s), _) => s,
            (None, Some(e)) => return Err(e),
            (None, None) => {
                return Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("{host}: no address"),
                ))
            }
        };
        let mut conn = match tls {
            None => RespConn::over(stream, timeout)?,
            Some(config) => {
                let tls = rustls::ClientConnection::new(config.clone(), tls::server_name(host)?)
                    .map_err(tls_error)?;
                let mut conn = RespConn::new(
                    Stream::Tls(Box::new(Tls {
                        conn: tls,
                        sock: stream,
                    })),
                    timeout,
                )?;
                conn.cap_next(deadline);
                conn.begin();
                conn.handshake().map_err(|e| {
                    io::Error::new(e.kind(), format!("TLS handshake with {host}:{port}: {e}"))
                })?;
                conn
            }
        };
        if let Some(password) = &at.password {
            let denied = io::ErrorKind::PermissionDenied;
            conn.cap_next(deadline);
            match &at.user {
                Some(user) => {
                    conn.call_ok(&[b"AUTH", user.as_bytes(), password.as_bytes()], denied)?
                }
                None => conn.call_ok(&[b"AUTH", password.as_bytes()], denied)?,
            }
        }
        if at.db != 0 {
            let db = at.db.to_string();
            conn.cap_next(deadline);
            conn.call_ok(&[b"SELECT", db.as_bytes()], io::ErrorKind::InvalidInput)?;
        }
        Ok(conn)
    }

    /// Completes a TLS handshake (nothing to do over plain TCP).
    fn handshake(&mut self) -> io::Result<()> {
        let r = (|| loop {
            self.flush_tls()?;
            match &self.stream {
                Stream::Tls(tls) if tls.conn.is_handshaking() => self.receive_tls()?,
                _ => return Ok(()),
            }
        })();
        self.check(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Duration = Duration::from_millis(300);

    #[test]
    fn a_silent_server_costs_a_tls_handshake_the_deadline() {
        // A listener that never answers: the handshake is bounded too.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
        let started = Instant::now();
        let at = super::super::url::parse(&format!("rediss://127.0.0.1:{port}")).unwrap();
        let r = RespConn::connect(&at, Some(&Arc::new(config)), T, started + T);
        let e = r.err().expect("no handshake with a silent server");
        let took = started.elapsed();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut, "{e}");
        assert!(e.to_string().contains("TLS handshake"), "{e}");
        assert!(took >= T && took < T * 3, "{took:?}");
    }
}
