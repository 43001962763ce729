//! Connections to the server (or cluster): a bounded pool shared by the
//! worker threads, every operation under the I/O deadline, and reconnection
//! with backoff after a failure, so a server that is down costs each job one
//! fast failure instead of a connect timeout per block. A server that
//! accepts connections but stops answering (hung, paused, stuck in a long
//! command) is found by its requests running out of time; until it answers
//! again, one request at a time goes to it and the others fail at once (see
//! `Stall`), so the jobs queued behind the workers it holds are reported
//! within about one deadline, not one deadline per worker's turn.

use super::tls::SharedConfig;
use super::transport::RespConn;
use super::url::Endpoint;
use crate::error::{Error, ErrorKind, Result};
use crate::sync::{Condvar, Mutex};
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

type Conn = RespConn;

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
    stall: Stall,
    /// Connections dropped broken and not yet replaced: the next ones
    /// opened are reconnections.
    lost: usize,
}

/// Whether the server has stopped answering: without this, each worker's
/// next job against a frozen server connects (the kernel still accepts),
/// sends, and waits out a deadline of its own; with it, one job per deadline
/// is let through to find out whether the server is back, and the others
/// fail when they reach a worker (tests/redis_faults.rs freezes one;
/// figures in docs/runs/redis.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stall {
    /// Its last request that ended was answered (or none has ended yet).
    Answering,
    /// A request ran out of time and none has been answered since; no
    /// request is on its way to find out whether it answers again.
    Silent,
    /// As `Silent`, with one request (the trial) on its way.
    Trying,
}

impl Stall {
    /// The state once a request ended so (`trial`: it was the trial).
    fn after(self, outcome: Outcome, trial: bool) -> Stall {
        match (outcome, self) {
            (Outcome::Answered, _) => Stall::Answering,
            // A request sent before the trial: the trial goes on.
            (Outcome::TimedOut, Stall::Trying) if !trial => Stall::Trying,
            (Outcome::TimedOut, _) => Stall::Silent,
            (Outcome::Other, Stall::Trying) if trial => Stall::Silent,
            (Outcome::Other, stall) => stall,
        }
    }
}

/// How a request on one of the pool's connections ended, as far as the
/// server's answering goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    /// The server answered (a reply, an error reply included).
    Answered,
    /// It ran past its deadline unanswered.
    TimedOut,
    /// Anything else (a closed connection, a deadline passed while the job
    /// read another node's replies): says nothing of a stall.
    Other,
}

pub(in crate::backend::redis) struct Pool {
    target: Endpoint,
    max: usize,
    timeout: Duration,
    state: Mutex<PoolState>,
    returned: Condvar,
    /// The TLS client configuration of a `rediss://` server, built by the
    /// first connection and shared by the others, and by the tier's other
    /// pools (see `tls`).
    tls: SharedConfig,
    counts: PoolCounts,
}

/// What a pool counts for the tier's metrics.
#[derive(Default)]
struct PoolCounts {
    /// Connections opened in place of ones dropped broken.
    reconnects: AtomicU64,
    /// Connections dropped broken (a failed request, closed by the server,
    /// out of step).
    dropped: AtomicU64,
    /// Attempts to connect that failed.
    connect_failures: AtomicU64,
}

/// A pool's counts, read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(in crate::backend::redis) struct ConnCounts {
    pub reconnects: u64,
    pub dropped: u64,
    pub connect_failures: u64,
}

/// A Redis failure as a kvtier error: the server's or the network's words,
/// never the URL (it may hold a password). A request that ran out of time
/// is the deadline's failure (`TIER_FAIL_DEADLINE`).
pub(in crate::backend::redis) fn io_error(what: &str, e: &io::Error) -> Error {
    let error = Error::new(ErrorKind::Io, format!("redis: {what}: {e}"));
    if e.kind() == io::ErrorKind::TimedOut {
        error.late()
    } else {
        error
    }
}

impl Pool {
    /// A pool of at most `max` connections to `target`; its TLS
    /// connections (if any) use the tier's configuration `tls`.
    pub(in crate::backend::redis) fn new(
        target: Endpoint,
        max: usize,
        timeout: Duration,
        tls: SharedConfig,
    ) -> Pool {
        Pool {
            target,
            max: max.max(1),
            timeout,
            state: Mutex::new(PoolState {
                idle: Vec::new(),
                open: 0,
                retry_at: None,
                backoff: MIN_BACKOFF,
                stall: Stall::Answering,
                lost: 0,
            }),
            returned: Condvar::new(),
            tls,
            counts: PoolCounts::default(),
        }
    }

    /// What this pool counted so far.
    pub(in crate::backend::redis) fn counts(&self) -> ConnCounts {
        let c = &self.counts;
        ConnCounts {
            reconnects: c.reconnects.load(Ordering::Relaxed),
            dropped: c.dropped.load(Ordering::Relaxed),
            connect_failures: c.connect_failures.load(Ordering::Relaxed),
        }
    }

    /// `n` connections dropped broken (the pool's lock held).
    fn note_dropped(&self, st: &mut PoolState, n: usize) {
        st.lost += n;
        self.counts.dropped.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// A new connection, opened by `deadline`.
    fn connect(&self, deadline: Instant) -> io::Result<Conn> {
        let tls = match self.target.tls {
            true => Some(self.tls.get()?),
            false => None,
        };
        RespConn::connect(&self.target, tls.as_ref(), self.timeout, deadline)
    }

    /// Opens the first connection and PINGs through it, keeping it in the
    /// pool; the failure as it happened (a refused password is of kind
    /// `PermissionDenied`, see `connect`).
    pub(in crate::backend::redis) fn ping(&self) -> io::Result<()> {
        let deadline = Instant::now() + self.timeout;
        let mut conn = self.connect(deadline)?;
        conn.cap_next(deadline);
        conn.call_ok(&[b"PING"], io::ErrorKind::Other)?;
        let mut st = self.state.lock();
        st.open += 1;
        st.idle.push(conn);
        Ok(())
    }

    /// Takes an idle connection, opens one (within `max`), or waits for one
    /// to come back, all by `deadline` (the job's; None at once instead of
    /// waiting when `wait` is false and every connection the pool may open
    /// is in use); and whether the request it is taken for is the trial of
    /// a silent server: while the server is silent, the first taker is its
    /// trial and the others fail at once (see [`Stall`]).
    fn take_or_wait(&self, wait: bool, deadline: Instant) -> Result<Option<(Conn, bool)>> {
        let trial = {
            let mut st = self.state.lock();
            match st.stall {
                Stall::Answering => false,
                Stall::Trying => return Err(silent_server()),
                Stall::Silent => {
                    st.stall = Stall::Trying;
                    true
                }
            }
        };
        let taken = self.take_conn(wait, deadline);
        if trial && !matches!(taken, Ok(Some(_))) {
            // No request goes: the next taker is the trial.
            let mut st = self.state.lock();
            if st.stall == Stall::Trying {
                st.stall = Stall::Silent;
            }
        }
        Ok(taken?.map(|conn| (conn, trial)))
    }

    /// An idle connection in step (see `RespConn::in_step`), a new one, or
    /// (if `wait`) one given back, by `deadline` (the job's) and within
    /// `timeout`: a job's later pass (a redirection's node) connects or
    /// waits only for what is left of the job's time.
    fn take_conn(&self, wait: bool, deadline: Instant) -> Result<Option<Conn>> {
        let deadline = deadline.min(Instant::now() + self.timeout);
        let mut st = self.state.lock();
        loop {
            if let Some(mut conn) = st.idle.pop() {
                drop(st);
                if conn.in_step().is_ok() {
                    return Ok(Some(conn));
                }
                // Unasked bytes, or closed by the server: dropped unused.
                st = self.state.lock();
                st.open -= 1;
                self.note_dropped(&mut st, 1);
                continue;
            }
            if Instant::now() >= deadline {
                return Err(out_of_time());
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
                        )
                        .unsent());
                    }
                }
                st.open += 1;
                drop(st);
                let made = self.connect(deadline);
                let mut st = self.state.lock();
                return match made {
                    Ok(conn) => {
                        st.retry_at = None;
                        st.backoff = MIN_BACKOFF;
                        if st.lost > 0 {
                            st.lost -= 1;
                            self.counts.reconnects.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(Some(conn))
                    }
                    Err(e) => {
                        self.counts.connect_failures.fetch_add(1, Ordering::Relaxed);
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
                )
                .unsent());
            }
        }
    }

    /// Takes back a connection after a request (None: it broke), noting how
    /// the request ended for the stall breaker; `trial`: it was the trial
    /// of a silent server.
    fn give_back(&self, conn: Option<Conn>, outcome: Outcome, trial: bool) {
        let mut st = self.state.lock();
        st.stall = st.stall.after(outcome, trial);
        match conn {
            Some(conn) => st.idle.push(conn),
            None => {
                // A broken connection says the server (or a cluster node) went
                // away: the idle ones share that fate, so they go too, rather
                // than fail the next jobs one after another.
                st.open -= 1 + st.idle.len();
                let n = 1 + st.idle.len();
                self.note_dropped(&mut st, n);
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
    pub(in crate::backend::redis) fn lease(
        &self,
        wait: bool,
        deadline: Instant,
    ) -> Result<Option<Lease<'_>>> {
        Ok(self
            .take_or_wait(wait, deadline)?
            .map(|(conn, trial)| Lease {
                pool: self,
                conn: Some(conn),
                trial,
                ended: None,
            }))
    }

    /// Runs `f` on a pooled connection (one request), taken by `deadline`.
    /// A connection that failed at the socket level is dropped (the next
    /// use reconnects).
    pub(in crate::backend::redis) fn with<T>(
        &self,
        what: &str,
        deadline: Instant,
        f: impl FnOnce(&mut Conn) -> io::Result<T>,
    ) -> Result<T> {
        let mut lease = self
            .lease(true, deadline)?
            .expect("a connection, having waited for one");
        let result = f(lease.conn());
        lease.ended = Some(match &result {
            Ok(_) => Outcome::Answered,
            Err(e) if e.kind() == io::ErrorKind::TimedOut => Outcome::TimedOut,
            Err(_) => Outcome::Other,
        });
        result.map_err(|e| io_error(what, &e))
    }
}

/// A pooled connection in use (see `Pool::lease`): given back when dropped,
/// or dropped with the pool's idle ones if it broke (as `Pool::with_conn`
/// does after a failure at the socket level). Dropped even by a panic, so
/// neither the pool's count nor a silent server's trial is lost.
pub(in crate::backend::redis) struct Lease<'a> {
    pool: &'a Pool,
    conn: Option<Conn>,
    /// Taken for the trial of a silent server (see [`Stall`]).
    trial: bool,
    /// How its request ended, when the user knows (see `Drop`).
    ended: Option<Outcome>,
}

impl Lease<'_> {
    pub(in crate::backend::redis) fn conn(&mut self) -> &mut Conn {
        self.conn
            .as_mut()
            .expect("a lease holds its connection until dropped")
    }

    /// Closes this connection alone (replies it was sent are left unread,
    /// so its stream is out of step), leaving the pool's others be. The
    /// server is not blamed: the job's deadline passed while it read
    /// another node's replies.
    pub(in crate::backend::redis) fn close(mut self) {
        if self.conn.take().is_some() {
            let mut st = self.pool.state.lock();
            st.open -= 1;
            st.stall = st.stall.after(Outcome::Other, self.trial);
            drop(st);
            self.pool.returned.notify_all();
        }
    }
}

impl Drop for Lease<'_> {
    /// Gives the connection back if its request was answered and it is
    /// still open. How the request ended is `ended`, else read from the
    /// connection: still open, answered; broken past its request's
    /// deadline, timed out; a panic says nothing of the server.
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            let open = !conn.broken;
            let outcome = self.ended.unwrap_or(match &conn {
                _ if std::thread::panicking() => Outcome::Other,
                _ if open => Outcome::Answered,
                c if c.deadline_passed() => Outcome::TimedOut,
                _ => Outcome::Other,
            });
            let keep = open && outcome == Outcome::Answered;
            self.pool
                .give_back(keep.then_some(conn), outcome, self.trial);
        }
    }
}

/// What a request meets when its job's deadline passed before a connection
/// was had (on an earlier pass, another node, or waiting).
fn out_of_time() -> Error {
    Error::new(
        ErrorKind::Io,
        "redis: no connection within the job's io_timeout_ms (spent on earlier passes)",
    )
    .unsent()
    .late()
}

/// What a request meets while its server is silent and another request
/// is finding out whether it answers again.
fn silent_server() -> Error {
    Error::new(
        ErrorKind::Io,
        "redis: the server has not answered within io_timeout_ms since its last request timed out; \
         failing at once until it answers (one request at a time goes to find out)",
    )
    .unsent()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn far() -> Instant {
        Instant::now() + Duration::from_secs(60)
    }

    /// A refused connection was an attempt; the failures at once during the
    /// backoff after it, and while a silent server's trial is out, asked
    /// nothing (`Error::unsent`: a load meeting them does not count against
    /// its block).
    #[test]
    fn failures_at_once_are_marked_unsent() {
        // A loopback port nothing listens on: bound, then closed.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .unwrap()
            .port();
        let at = super::super::url::parse(&format!("redis://127.0.0.1:{port}")).unwrap();
        let pool = Pool::new(at, 1, Duration::from_secs(1), SharedConfig::default());
        let refused = pool
            .take_or_wait(true, far())
            .err()
            .expect("nothing listens");
        assert!(refused.reached_storage(), "{refused}");
        let backoff = pool.take_or_wait(true, far()).err().expect("in backoff");
        assert!(backoff.message().contains("next attempt"), "{backoff}");
        assert!(!backoff.reached_storage(), "{backoff}");
        pool.state.lock().stall = Stall::Trying;
        let silent = pool
            .take_or_wait(true, far())
            .err()
            .expect("a trial is out");
        assert!(!silent.reached_storage(), "{silent}");
    }

    #[test]
    fn a_silent_server_gets_one_trial_at_a_time_until_it_answers() {
        use Outcome::*;
        use Stall::*;
        // The first timeout makes the server silent; an answer, from any
        // request, ends that.
        assert_eq!(Answering.after(TimedOut, false), Silent);
        assert_eq!(Answering.after(Other, false), Answering);
        assert_eq!(Silent.after(Answered, false), Answering);
        assert_eq!(Trying.after(Answered, false), Answering);
        assert_eq!(Trying.after(Answered, true), Answering);
        // Requests sent before the trial leave it on its way.
        assert_eq!(Trying.after(TimedOut, false), Trying);
        assert_eq!(Trying.after(Other, false), Trying);
        // A trial that ends unanswered makes room for the next one.
        assert_eq!(Trying.after(TimedOut, true), Silent);
        assert_eq!(Trying.after(Other, true), Silent);
        assert_eq!(Silent.after(TimedOut, false), Silent);
    }
}
