//! Connections to the server (or cluster): a bounded pool shared by the
//! worker threads, every operation under the I/O deadline, and reconnection
//! with backoff after a failure, so a server that is down costs each job one
//! fast failure instead of a connect timeout per block.

use super::resp::RespConn;
use super::tls::SharedConfig;
use crate::error::{Error, ErrorKind, Result};
use crate::sync::{Condvar, Mutex};
use redis::cluster::{ClusterClient, ClusterConnection};
use redis::{Client, Connection, ConnectionAddr, ConnectionLike, RedisError};
use std::time::{Duration, Instant};

/// What the pool connects to.
pub(super) enum Target {
    Single(Client),
    Cluster(ClusterClient),
}

/// One connection: kvtier's own to a server over TCP or TLS (see `resp`),
/// the crate's to a server over a Unix socket, or the crate's to a cluster
/// (routing by slot and following MOVED/ASK redirections itself).
pub(super) enum Conn {
    Direct(RespConn),
    Single(Connection),
    // Boxed: a cluster connection is four times a single one, and the pool
    // holds many of either.
    Cluster(Box<ClusterConnection>),
}

impl Conn {
    pub(super) fn like(&mut self) -> &mut dyn ConnectionLike {
        match self {
            Conn::Direct(c) => c,
            Conn::Single(c) => c,
            Conn::Cluster(c) => c.as_mut(),
        }
    }
}

/// Longest wait between reconnection attempts to a server that is down.
const MAX_BACKOFF: Duration = Duration::from_secs(1);
const MIN_BACKOFF: Duration = Duration::from_millis(25);

struct PoolState {
    idle: Vec<Conn>,
    /// Connections open (idle or in use).
    open: usize,
    /// After a failed connection: no new attempt before this instant.
    retry_at: Option<Instant>,
    backoff: Duration,
}

pub(super) struct Pool {
    target: Target,
    max: usize,
    timeout: Duration,
    state: Mutex<PoolState>,
    returned: Condvar,
    /// The TLS client configuration of a `rediss://` server, built by the
    /// first connection and shared by the others, and by the tier's other
    /// pools (see `tls`).
    tls: SharedConfig,
}

/// A Redis failure as a kvtier error: the server's or the network's words,
/// never the URL (it may hold a password).
pub(super) fn io_error(what: &str, e: &RedisError) -> Error {
    Error::new(ErrorKind::Io, format!("redis: {what}: {e}"))
}

/// Whether the connection is still usable after this error (a server reply
/// such as WRONGTYPE is; a broken socket or a timeout is not).
fn connection_survives(e: &RedisError) -> bool {
    !(e.is_io_error() || e.is_timeout() || e.is_connection_dropped() || e.is_connection_refusal())
}

impl Pool {
    /// A pool of at most `max` connections to `target`; its TLS
    /// connections (if any) use the tier's configuration `tls`.
    pub(super) fn new(target: Target, max: usize, timeout: Duration, tls: SharedConfig) -> Pool {
        Pool {
            target,
            max: max.max(1),
            timeout,
            state: Mutex::new(PoolState {
                idle: Vec::new(),
                open: 0,
                retry_at: None,
                backoff: MIN_BACKOFF,
            }),
            returned: Condvar::new(),
            tls,
        }
    }

    /// The deadline of every server operation (`io_timeout_ms`).
    pub(super) fn timeout(&self) -> Duration {
        self.timeout
    }

    pub(super) fn is_cluster(&self) -> bool {
        matches!(self.target, Target::Cluster(_))
    }

    fn connect(&self) -> std::result::Result<Conn, RedisError> {
        match &self.target {
            Target::Single(client) => {
                let info = client.get_connection_info();
                let direct = match info.addr() {
                    ConnectionAddr::Tcp(host, port) => Some((host, *port, None)),
                    // A URL has no TLS parameters (certificates in memory):
                    // those stay the crate's.
                    ConnectionAddr::TcpTls {
                        host,
                        port,
                        insecure,
                        tls_params: None,
                    } => Some((host, *port, Some(self.tls.get(*insecure)?))),
                    _ => None,
                };
                if let Some((host, port, tls)) = direct {
                    return Ok(Conn::Direct(RespConn::connect(
                        host,
                        port,
                        tls.as_ref(),
                        info.redis_settings(),
                        self.timeout,
                    )?));
                }
                let c = client.get_connection_with_timeout(self.timeout)?;
                c.set_read_timeout(Some(self.timeout))?;
                c.set_write_timeout(Some(self.timeout))?;
                Ok(Conn::Single(c))
            }
            Target::Cluster(client) => Ok(Conn::Cluster(Box::new(client.get_connection()?))),
        }
    }

    /// Opens the first connection and PINGs through it, keeping it in the
    /// pool; the server's own error on failure (so that a refused password
    /// can be told from an unreachable server).
    pub(super) fn ping(&self) -> std::result::Result<(), RedisError> {
        let mut conn = self.connect()?;
        redis::cmd("PING").query::<String>(conn.like())?;
        let mut st = self.state.lock();
        st.open += 1;
        st.idle.push(conn);
        Ok(())
    }

    /// Takes an idle connection, opens one (within `max`), or waits for one
    /// to come back, all within the deadline.
    fn take(&self) -> Result<Conn> {
        self.take_or_wait(true)
            .map(|conn| conn.expect("a connection, having waited for one"))
    }

    /// `take`, or None at once instead of waiting when `wait` is false and
    /// every connection the pool may open is in use.
    fn take_or_wait(&self, wait: bool) -> Result<Option<Conn>> {
        let deadline = Instant::now() + self.timeout;
        let mut st = self.state.lock();
        loop {
            if let Some(conn) = st.idle.pop() {
                return Ok(Some(conn));
            }
            if st.open < self.max {
                if let Some(at) = st.retry_at {
                    if Instant::now() < at {
                        return Err(Error::new(
                            ErrorKind::Io,
                            format!(
                                "redis: server unreachable; next attempt in {} ms",
                                at.saturating_duration_since(Instant::now()).as_millis()
                            ),
                        ));
                    }
                }
                st.open += 1;
                drop(st);
                let made = self.connect();
                let mut st = self.state.lock();
                return match made {
                    Ok(conn) => {
                        st.retry_at = None;
                        st.backoff = MIN_BACKOFF;
                        Ok(Some(conn))
                    }
                    Err(e) => {
                        st.open -= 1;
                        st.retry_at = Some(Instant::now() + st.backoff);
                        st.backoff = (st.backoff * 2).min(MAX_BACKOFF);
                        Err(io_error("cannot connect", &e))
                    }
                };
            }
            if !wait {
                return Ok(None);
            }
            if self.returned.wait_until(&mut st, deadline).timed_out() {
                return Err(Error::new(
                    ErrorKind::Io,
                    "redis: no connection free within io_timeout_ms",
                ));
            }
        }
    }

    fn give_back(&self, conn: Option<Conn>) {
        let mut st = self.state.lock();
        match conn {
            Some(conn) => st.idle.push(conn),
            None => {
                // A broken connection says the server (or a cluster node) went
                // away: the idle ones share that fate, so they go too, rather
                // than fail the next jobs one after another.
                st.open -= 1 + st.idle.len();
                st.idle.clear();
            }
        }
        drop(st);
        self.returned.notify_all();
    }

    /// A connection of this pool held until the lease drops: for a job that
    /// keeps several nodes' connections at once (see `routed`). Without
    /// `wait`, None at once when every connection the pool may open is in
    /// use: a job that holds another node's connection must not wait for
    /// this one (two jobs could then wait on each other).
    pub(super) fn lease(&self, wait: bool) -> Result<Option<Lease<'_>>> {
        Ok(self.take_or_wait(wait)?.map(|conn| Lease {
            pool: self,
            conn: Some(conn),
        }))
    }

    /// Runs `f` on a pooled connection. A connection that failed at the
    /// socket level is dropped (the next use reconnects).
    pub(super) fn with<T>(
        &self,
        what: &str,
        f: impl FnOnce(&mut dyn ConnectionLike) -> std::result::Result<T, RedisError>,
    ) -> Result<T> {
        self.with_conn(what, |conn| f(conn.like()))
    }

    /// [`Pool::with`] on the connection itself (a pipeline needs to know
    /// whether it talks to a cluster).
    pub(super) fn with_conn<T>(
        &self,
        what: &str,
        f: impl FnOnce(&mut Conn) -> std::result::Result<T, RedisError>,
    ) -> Result<T> {
        let mut conn = self.take()?;
        match f(&mut conn) {
            Ok(v) => {
                self.give_back(Some(conn));
                Ok(v)
            }
            Err(e) => {
                let keep = connection_survives(&e) && conn.like().is_open();
                self.give_back(keep.then_some(conn));
                Err(io_error(what, &e))
            }
        }
    }
}

/// A pooled connection in use (see `Pool::lease`): given back when dropped,
/// or dropped with the pool's idle ones if it broke (as `Pool::with_conn`
/// does after a failure at the socket level).
pub(super) struct Lease<'a> {
    pool: &'a Pool,
    conn: Option<Conn>,
}

impl Lease<'_> {
    pub(super) fn conn(&mut self) -> &mut Conn {
        self.conn
            .as_mut()
            .expect("a lease holds its connection until dropped")
    }

    /// Closes this connection alone (replies it was sent are left unread,
    /// so its stream is out of step), leaving the pool's others be.
    pub(super) fn close(mut self) {
        if self.conn.take().is_some() {
            self.pool.state.lock().open -= 1;
            self.pool.returned.notify_all();
        }
    }
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        if let Some(mut conn) = self.conn.take() {
            let open = conn.like().is_open();
            self.pool.give_back(open.then_some(conn));
        }
    }
}
