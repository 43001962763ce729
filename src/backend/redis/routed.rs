//! A Redis Cluster tier's data path over TCP or TLS: a job's blocks grouped
//! by the master serving their slot (`cluster`), one direct pipeline
//! (`direct`) per master on that master's own connections, every master's
//! sent before any reply is read (the masters work at once), the outcomes
//! reported in the job's order. Loads land in the caller's rows with at
//! most one copy beyond the socket read, as on a single server.
//!
//! A node that fails (connection refused, broken, past the deadline) gets
//! the map refreshed; its blocks whose slots the new map gives to another
//! node (a replica promoted) are sent again, directly, once. A master that
//! failed and still owns its slots fails only its own blocks. Blocks a node
//! redirected (MOVED, ASK, TRYAGAIN: a resharding), and blocks of slots no
//! master is known to serve, go once through the crate's cluster
//! connection, which follows MOVED and ASK itself.
//!
//! The caller holds the blocks' stripe locks throughout, retries included,
//! as on a single server.

use super::cluster::{redirection, Node, Redirection, Router, Routes, SlotMap};
use super::conn::{io_error, Conn, Lease};
use super::direct::{self, Fetched};
use super::resp::RespConn;
use super::{server_error, RedisBackend};
use crate::error::{Error, ErrorKind, Result};
use std::sync::Arc;
use std::time::Instant;

/// How the first half of a node's pipeline went (see [`send_on`]).
enum Sending<'n, S> {
    /// Sent; the connection is held for [`receive_on`].
    Sent(Lease<'n>, S),
    /// No connection to be had without waiting while the job holds
    /// another node's: the node is served in a later round.
    Busy,
    /// The job's deadline had passed: nothing was sent.
    Late,
    Failed(Error),
}

/// The first half of a node's pipeline: one of `node`'s connections
/// (kvtier's own: a node's address is plain TCP or TLS) leased, waiting for
/// one only if `wait`, its request ending by the job's `deadline`, and
/// `send` run on it.
fn send_on<'n, S>(
    node: &'n Node,
    what: &str,
    deadline: Instant,
    wait: bool,
    send: impl FnOnce(&mut RespConn) -> std::io::Result<S>,
) -> Sending<'n, S> {
    if past(deadline) {
        return Sending::Late;
    }
    let sent = node.pool.lease(wait).and_then(|lease| {
        let Some(mut lease) = lease else {
            return Ok(Sending::Busy);
        };
        let Conn::Direct(c) = lease.conn() else {
            return Err(Error::new(
                ErrorKind::Io,
                format!("redis: {what}: a cluster node's connection is not kvtier's own"),
            ));
        };
        c.cap_next(deadline);
        let state = send(c).map_err(|e| io_error(what, &e.into()))?;
        Ok(Sending::Sent(lease, state))
    });
    sent.unwrap_or_else(|e| {
        node.answered(false);
        Sending::Failed(e)
    })
}

/// The groups (indices into `Routes::groups`) of one round of a pass: all
/// of them at first, then those that were `Busy` (see `Sending`), served
/// when the job holds no other connection. A job never waits for a node's
/// connection while it holds another's, so two jobs (with fewer
/// `connections` than I/O threads) never wait on each other.
enum Round {
    All(std::ops::Range<usize>),
    Busy(std::vec::IntoIter<usize>),
}

impl Iterator for Round {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        match self {
            Round::All(groups) => groups.next(),
            Round::Busy(groups) => groups.next(),
        }
    }
}

/// The second half: `receive` on the connection [`send_on`] leased, and
/// how the node answered recorded (see `Node::answered`). None: the
/// deadline passed before this node's turn (its replies are left unread
/// and its connection closed; the node is not blamed).
fn receive_on(
    node: &Node,
    mut lease: Lease<'_>,
    what: &str,
    deadline: Instant,
    receive: impl FnOnce(&mut RespConn) -> std::io::Result<()>,
) -> Option<Result<()>> {
    if past(deadline) {
        lease.close();
        return None;
    }
    let Conn::Direct(c) = lease.conn() else {
        unreachable!("send_on leases kvtier's own connections only")
    };
    let read = receive(c).map_err(|e| io_error(what, &e.into()));
    node.answered(read.is_ok());
    Some(read)
}

/// Which of the pipelines `sent` (their leased connections: `conn_of`)
/// to read next: the first whose node has begun to answer, waiting for one
/// until the deadline; the first in order (suspect nodes last) if none
/// has by then, or if the sockets cannot be polled. A hung master then
/// costs the job its own blocks only, whatever its place in the order.
fn next_to_read<T>(
    sent: &mut [T],
    conn_of: impl Fn(&mut T) -> &mut Conn,
    deadline: Instant,
) -> usize {
    if sent.len() < 2 {
        return 0;
    }
    // On the stack for a job's usual few masters: steady-state jobs
    // allocate per job, and this runs once per master.
    const ON_STACK: usize = 32;
    let unset = libc::pollfd {
        fd: -1,
        events: libc::POLLIN,
        revents: 0,
    };
    let mut stack = [unset; ON_STACK];
    let mut heap = Vec::new();
    let fds: &mut [libc::pollfd] = if sent.len() <= ON_STACK {
        &mut stack[..sent.len()]
    } else {
        heap.resize(sent.len(), unset);
        &mut heap
    };
    for (k, item) in sent.iter_mut().enumerate() {
        let waits_on = match conn_of(item) {
            Conn::Direct(c) => c.waits_on(),
            _ => None,
        };
        match waits_on {
            None => return k,
            Some(fd) => fds[k].fd = fd,
        }
    }
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let ms = left.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: `fds` is a valid array of `fds.len()` pollfd structs.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
        if n > 0 {
            return fds.iter().position(|p| p.revents != 0).unwrap_or(0);
        }
        if n == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return 0;
        }
    }
}

/// One deadline for a whole job: its pipelines to the masters (all sent,
/// then all read) share it, and the job is reported within `io_timeout_ms`
/// even if several masters hang.
fn job_deadline(backend: &RedisBackend) -> Instant {
    Instant::now() + backend.pool.timeout()
}

fn past(deadline: Instant) -> bool {
    Instant::now() >= deadline
}

/// Blocks not sent because the job's deadline passed on other masters.
fn out_of_time() -> Error {
    Error::new(
        ErrorKind::Io,
        "redis: no answer within io_timeout_ms (the job's deadline passed on another master)",
    )
}

fn unsettled() -> Error {
    Error::new(ErrorKind::Io, "redis: a block was neither sent nor retried")
}

/// What a pass over a job's masters met besides answers.
#[derive(Default)]
struct Trouble {
    /// A node answered MOVED: the map is stale.
    moved: bool,
    /// Groups (indices into `Routes::groups`) whose node failed.
    failed: Vec<usize>,
}

impl Trouble {
    fn redirected(&mut self, how: Redirection) {
        self.moved |= how == Redirection::Moved;
    }

    /// After a first pass: refreshes the map when a node redirected or
    /// failed. Returns the new map and, marked, the blocks of a failed node
    /// that it gives to another node, if there are any (to send again).
    fn settle(
        &self,
        router: &Router,
        map: &SlotMap,
        routes: &Routes,
        n: usize,
        deadline: Instant,
    ) -> Option<(Arc<SlotMap>, Vec<bool>)> {
        if !self.moved && self.failed.is_empty() {
            return None;
        }
        let avoid: Vec<Arc<Node>> = self
            .failed
            .iter()
            .filter_map(|&g| routes.groups[g].0.map(|node| Arc::clone(map.node(node))))
            .collect();
        router.refresh(&avoid, deadline);
        let now = router.map();
        let mut again = vec![false; n];
        let mut any = false;
        for &g in &self.failed {
            for &i in &routes.order[routes.groups[g].1.clone()] {
                if now.moved_since(map, routes.slots[i]) {
                    again[i] = true;
                    any = true;
                }
            }
        }
        any.then_some((now, again))
    }
}

/// A block of a load: its slot, key and row.
type LoadBlock<'a> = (u32, &'a [u8], &'a mut [u8]);

/// A block's state in a routed load.
enum Got {
    /// To fetch through the crate's connection.
    Retry,
    /// The direct pipeline's outcome (the payload, if any, in its row).
    Fetched(Fetched),
    /// The crate's reply, not checked yet.
    Value(redis::RedisResult<Option<Vec<u8>>>),
    Failed(Error),
}

impl RedisBackend {
    /// `store_batch` on a cluster: a direct SET pipeline per master.
    pub(super) fn store_routed(
        &self,
        router: &Router,
        blocks: &[(u32, &[u8], &[u8])],
        done: &mut dyn FnMut(usize, Result<u64>),
    ) {
        let deadline = job_deadline(self);
        let map = router.map();
        let mut outcomes: Vec<Option<Result<()>>> = vec![None; blocks.len()];
        let (routes, trouble) = self.set_pass(&map, blocks, |_| true, deadline, &mut outcomes);
        if let Some((now, again)) = trouble.settle(router, &map, &routes, blocks.len(), deadline) {
            self.set_pass(&now, blocks, |i| again[i], deadline, &mut outcomes);
        }
        let retry: Vec<usize> = (0..blocks.len())
            .filter(|&i| outcomes[i].is_none())
            .collect();
        if !retry.is_empty() && past(deadline) {
            retry
                .iter()
                .for_each(|&i| outcomes[i] = Some(Err(out_of_time())));
        } else if !retry.is_empty() {
            router.note_rerouted(retry.len());
            let subset: Vec<(u32, &[u8], &[u8])> = retry.iter().map(|&i| blocks[i]).collect();
            let sent = self
                .pool
                .with_conn("SET pipeline", |conn| self.store_by_crate(conn, &subset));
            for (k, &i) in retry.iter().enumerate() {
                outcomes[i] = Some(match &sent {
                    Ok(replies) => replies[k].clone(),
                    Err(e) => Err(e.clone()),
                });
            }
        }
        for (i, outcome) in outcomes.into_iter().enumerate() {
            let outcome = outcome.unwrap_or_else(|| Err(unsettled()));
            done(i, outcome.map(|()| self.block_bytes as u64));
        }
    }

    /// The SETs of the blocks `include` selects, one direct pipeline per
    /// master of `map`; `outcomes[i]` None: to send through the crate.
    fn set_pass(
        &self,
        map: &SlotMap,
        blocks: &[(u32, &[u8], &[u8])],
        include: impl Fn(usize) -> bool,
        deadline: Instant,
        outcomes: &mut [Option<Result<()>>],
    ) -> (Routes, Trouble) {
        let layout = self.layout();
        let routes = Routes::new(map, blocks.len(), include, |i, name| {
            layout.write_name(name, blocks[i].1)
        });
        // The blocks in the routes' order: a node's blocks are one slice.
        let mut sorted = Vec::with_capacity(routes.order.len());
        sorted.extend(routes.order.iter().map(|&i| blocks[i]));
        let mut trouble = Trouble::default();
        // Every master's SETs are written before any reply is read, so that
        // the masters work at once; suspect masters come last either way.
        let mut round = Round::All(0..routes.groups.len());
        loop {
            let mut busy = Vec::new();
            let mut sent = Vec::with_capacity(routes.groups.len());
            for g in round {
                let (node, range) = &routes.groups[g];
                let order = &routes.order[range.clone()];
                let Some(node) = node else {
                    order.iter().for_each(|&i| outcomes[i] = None);
                    continue;
                };
                let node = map.node(*node);
                let part = &sorted[range.clone()];
                match send_on(node, "SET pipeline", deadline, sent.is_empty(), |c| {
                    direct::set_send(c, &layout, part)
                }) {
                    Sending::Busy => busy.push(g),
                    Sending::Late => order
                        .iter()
                        .for_each(|&i| outcomes[i] = Some(Err(out_of_time()))),
                    Sending::Failed(e) => {
                        trouble.failed.push(g);
                        order
                            .iter()
                            .for_each(|&i| outcomes[i] = Some(Err(e.clone())));
                    }
                    Sending::Sent(lease, nonces) => sent.push((g, node, lease, nonces)),
                }
            }
            let mut replies = Vec::with_capacity(routes.largest());
            while !sent.is_empty() {
                let next = next_to_read(&mut sent, |s| s.2.conn(), deadline);
                let (g, node, lease, nonces) = sent.remove(next);
                let range = routes.groups[g].1.clone();
                let order = &routes.order[range.clone()];
                let part = &sorted[range];
                let read = receive_on(node, lease, "SET pipeline", deadline, |c| {
                    direct::set_receive(c, &layout, part, &nonces, &mut replies)
                });
                match read {
                    None => order
                        .iter()
                        .for_each(|&i| outcomes[i] = Some(Err(out_of_time()))),
                    Some(Ok(())) => {
                        for (&i, reply) in order.iter().zip(replies.drain(..)) {
                            outcomes[i] = match reply {
                                Ok(()) => Some(Ok(())),
                                Err(message) => match redirection(&message) {
                                    Some(how) => {
                                        trouble.redirected(how);
                                        None
                                    }
                                    None => Some(Err(server_error("SET", &message))),
                                },
                            };
                        }
                    }
                    Some(Err(e)) => {
                        trouble.failed.push(g);
                        for &i in order {
                            outcomes[i] = Some(Err(e.clone()));
                        }
                    }
                }
            }
            if busy.is_empty() {
                break;
            }
            round = Round::Busy(busy.into_iter());
        }
        (routes, trouble)
    }

    /// `load_batch` on a cluster: a direct GET pipeline per master, each
    /// reply read into its block's row; then the outcomes in the job's
    /// order until `done` says stop.
    pub(super) fn load_routed(
        &self,
        router: &Router,
        blocks: &mut [(u32, &[u8], &mut [u8])],
        done: &mut dyn FnMut(usize, Result<()>) -> bool,
    ) {
        let deadline = job_deadline(self);
        let map = router.map();
        let mut got: Vec<Got> = (0..blocks.len()).map(|_| Got::Retry).collect();
        let (routes, trouble) = self.get_pass(&map, blocks, |_| true, deadline, &mut got);
        if let Some((now, again)) = trouble.settle(router, &map, &routes, blocks.len(), deadline) {
            self.get_pass(&now, blocks, |i| again[i], deadline, &mut got);
        }
        let retry: Vec<usize> = (0..blocks.len())
            .filter(|&i| matches!(got[i], Got::Retry))
            .collect();
        if !retry.is_empty() && past(deadline) {
            retry
                .iter()
                .for_each(|&i| got[i] = Got::Failed(out_of_time()));
        } else if !retry.is_empty() {
            router.note_rerouted(retry.len());
            let names: Vec<String> = retry.iter().map(|&i| self.name(blocks[i].1)).collect();
            match self.get_by_crate(&names) {
                Ok(values) => {
                    for (&i, value) in retry.iter().zip(values) {
                        got[i] = Got::Value(value);
                    }
                }
                Err(e) => {
                    for &i in &retry {
                        got[i] = Got::Failed(e.clone());
                    }
                }
            }
        }
        for (i, ((slot, key, dst), got)) in blocks.iter_mut().zip(got).enumerate() {
            let outcome = match got {
                Got::Fetched(fetched) => self.judge(*slot, key, dst, fetched),
                Got::Value(Ok(value)) => self.check_value(&self.name(key), value, key, dst),
                Got::Value(Err(e)) => Err(io_error("GET", &e)),
                Got::Failed(e) => Err(e),
                Got::Retry => Err(unsettled()),
            };
            if !done(i, outcome) {
                return;
            }
        }
    }

    /// The GETs of the blocks `include` selects, one direct pipeline per
    /// master of `map`, each payload read into its row.
    fn get_pass(
        &self,
        map: &SlotMap,
        blocks: &mut [(u32, &[u8], &mut [u8])],
        include: impl Fn(usize) -> bool,
        deadline: Instant,
        got: &mut [Got],
    ) -> (Routes, Trouble) {
        let layout = self.layout();
        let routes = Routes::new(map, blocks.len(), include, |i, name| {
            layout.write_name(name, blocks[i].1)
        });
        // The rows in the routes' order: a node's blocks are one slice.
        let mut cells: Vec<Option<LoadBlock>> = blocks
            .iter_mut()
            .map(|(slot, key, dst)| Some((*slot, *key, &mut **dst)))
            .collect();
        let mut sorted: Vec<LoadBlock> = Vec::with_capacity(routes.order.len());
        sorted.extend(routes.order.iter().filter_map(|&i| cells[i].take()));
        let mut trouble = Trouble::default();
        // Every master's first GETs are sent before any reply is read, so
        // that the masters work at once; suspect masters come last.
        let mut round = Round::All(0..routes.groups.len());
        loop {
            let mut busy = Vec::new();
            let mut sent = Vec::with_capacity(routes.groups.len());
            for g in round {
                let (node, range) = &routes.groups[g];
                let order = &routes.order[range.clone()];
                let Some(node) = node else {
                    order.iter().for_each(|&i| got[i] = Got::Retry);
                    continue;
                };
                let node = map.node(*node);
                let rows = &sorted[range.clone()];
                match send_on(node, "GET pipeline", deadline, sent.is_empty(), |c| {
                    direct::get_send(c, &layout, rows)
                }) {
                    Sending::Busy => busy.push(g),
                    Sending::Late => order
                        .iter()
                        .for_each(|&i| got[i] = Got::Failed(out_of_time())),
                    Sending::Failed(e) => {
                        trouble.failed.push(g);
                        order.iter().for_each(|&i| got[i] = Got::Failed(e.clone()));
                    }
                    Sending::Sent(lease, started) => sent.push((g, node, lease, started)),
                }
            }
            let mut fetched = Vec::with_capacity(routes.largest());
            while !sent.is_empty() {
                let next = next_to_read(&mut sent, |s| s.2.conn(), deadline);
                let (g, node, lease, started) = sent.remove(next);
                let range = routes.groups[g].1.clone();
                let order = &routes.order[range.clone()];
                let rows = &mut sorted[range];
                let read = receive_on(node, lease, "GET pipeline", deadline, |c| {
                    direct::get_receive(c, &layout, rows, started, &mut fetched)
                });
                match read {
                    None => order
                        .iter()
                        .for_each(|&i| got[i] = Got::Failed(out_of_time())),
                    Some(Ok(())) => {
                        for (&i, outcome) in order.iter().zip(fetched.drain(..)) {
                            got[i] = match outcome {
                                Fetched::Refused(message) => match redirection(&message) {
                                    Some(how) => {
                                        trouble.redirected(how);
                                        Got::Retry
                                    }
                                    None => Got::Fetched(Fetched::Refused(message)),
                                },
                                outcome => Got::Fetched(outcome),
                            };
                        }
                    }
                    Some(Err(e)) => {
                        trouble.failed.push(g);
                        for &i in order {
                            got[i] = Got::Failed(e.clone());
                        }
                    }
                }
            }
            if busy.is_empty() {
                break;
            }
            round = Round::Busy(busy.into_iter());
        }
        (routes, trouble)
    }

    /// `discard` on a cluster: a direct DEL pipeline per master; keys a
    /// node redirected go through the crate's connection. Best effort, as
    /// on a single server.
    pub(super) fn discard_routed(&self, router: &Router, dead: &[&[u8]]) {
        let deadline = job_deadline(self);
        let map = router.map();
        let mut retry = vec![false; dead.len()];
        let (routes, trouble) = self.del_pass(&map, dead, |_| true, deadline, &mut retry);
        if let Some((now, again)) = trouble.settle(router, &map, &routes, dead.len(), deadline) {
            self.del_pass(&now, dead, |i| again[i], deadline, &mut retry);
        }
        let keys: Vec<&[u8]> = (0..dead.len())
            .filter(|&i| retry[i])
            .map(|i| dead[i])
            .collect();
        // Best effort: past the deadline, what is left stays (see `discard`).
        if !keys.is_empty() && !past(deadline) {
            router.note_rerouted(keys.len());
            let _ = self
                .pool
                .with_conn("DEL pipeline", |conn| self.del_by_crate(conn, &keys));
        }
    }

    /// The DELs of the keys `include` selects, one direct pipeline per
    /// master of `map`; `retry[i]`: to send through the crate.
    fn del_pass(
        &self,
        map: &SlotMap,
        dead: &[&[u8]],
        include: impl Fn(usize) -> bool,
        deadline: Instant,
        retry: &mut [bool],
    ) -> (Routes, Trouble) {
        let layout = self.layout();
        let routes = Routes::new(map, dead.len(), include, |i, name| {
            layout.write_name(name, dead[i])
        });
        let mut sorted = Vec::with_capacity(routes.order.len());
        sorted.extend(routes.order.iter().map(|&i| dead[i]));
        let mut trouble = Trouble::default();
        // Every master's DELs are written before any reply is read.
        let mut round = Round::All(0..routes.groups.len());
        loop {
            let mut busy = Vec::new();
            let mut sent = Vec::with_capacity(routes.groups.len());
            for g in round {
                let (node, range) = &routes.groups[g];
                let order = &routes.order[range.clone()];
                let Some(node) = node else {
                    order.iter().for_each(|&i| retry[i] = true);
                    continue;
                };
                let node = map.node(*node);
                let part = &sorted[range.clone()];
                match send_on(node, "DEL pipeline", deadline, sent.is_empty(), |c| {
                    direct::del_send(c, &layout, part)
                }) {
                    // Best effort: past the deadline, the rest stay (see `discard`).
                    Sending::Busy => busy.push(g),
                    Sending::Late => break,
                    Sending::Failed(_) => trouble.failed.push(g),
                    Sending::Sent(lease, ()) => sent.push((g, node, lease)),
                }
            }
            let mut refused = Vec::new();
            while !sent.is_empty() {
                let next = next_to_read(&mut sent, |s| s.2.conn(), deadline);
                let (g, node, lease) = sent.remove(next);
                let range = routes.groups[g].1.clone();
                let order = &routes.order[range.clone()];
                refused.clear();
                match receive_on(node, lease, "DEL pipeline", deadline, |c| {
                    direct::del_receive(c, range.len(), &mut refused)
                }) {
                    None => {}
                    Some(Ok(())) => {
                        for (k, message) in refused.drain(..) {
                            if let Some(how) = redirection(&message) {
                                trouble.redirected(how);
                                retry[order[k]] = true;
                            }
                        }
                    }
                    Some(Err(_)) => trouble.failed.push(g),
                }
            }
            if busy.is_empty() {
                break;
            }
            round = Round::Busy(busy.into_iter());
        }
        (routes, trouble)
    }
}
