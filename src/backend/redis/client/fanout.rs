//! One pass of a cluster job over its masters: every master's pipeline
//! sent on a connection of its own (suspect masters last), then the
//! replies read from the master that has begun to answer first, all by the
//! job's deadline. A job never waits for one master's connection while it
//! holds another's: a master whose connections are all in use is served in
//! a later round, when the job holds none. What a pipeline carries (SETs,
//! GETs, DELs, EXISTS, TOUCH) and what becomes of its blocks is a
//! [`Pass`] (see `routed` and `calls`); the passes of one job are `job`'s. A single
//! server is a map of one node: the same pass, one group.

use super::conn::{io_error, Lease};
use super::refusal::{Problem, ServerError};
use super::routes::{Node, Redirection, Routes};
use super::transport::RespConn;
use crate::error::{Error, ErrorKind, Result};
use std::ops::Range;
use std::time::Instant;

pub(in crate::backend::redis) fn past(deadline: Instant) -> bool {
    Instant::now() >= deadline
}

/// Blocks not sent, or not answered, because the job's deadline passed
/// (on another master, or waiting for a redirection's turn).
pub(in crate::backend::redis) fn out_of_time() -> Error {
    Error::new(
        ErrorKind::Io,
        "redis: no answer within io_timeout_ms (the job's deadline passed on another master)",
    )
    .unsent()
    .late()
}

/// A block a job left without an outcome (none should be).
pub(in crate::backend::redis) fn unsettled() -> Error {
    Error::new(ErrorKind::Io, "redis: a block was neither sent nor retried").unsent()
}

/// What a pass over a job's masters met besides answers.
#[derive(Default)]
pub(super) struct Trouble {
    /// Blocks (indices into the job) a node redirected, and how.
    pub(super) redirected: Vec<(usize, Redirection)>,
    /// Groups (indices into `Routes::groups`) whose node failed.
    pub(super) failed: Vec<usize>,
    /// Groups no master is known to serve.
    pub(super) unrouted: Vec<usize>,
}

impl Trouble {
    pub(super) fn is_clear(&self) -> bool {
        self.redirected.is_empty() && self.failed.is_empty() && self.unrouted.is_empty()
    }
}

/// Blocks of slots no master is known to serve.
fn unserved() -> Error {
    Error::new(
        ErrorKind::Io,
        "redis: no master is known to serve this block's slot",
    )
    .unsent()
}

/// One kind of pipeline a pass sends each master (SETs, GETs, DELs...),
/// and what becomes of its blocks. `range` is a group's place in the
/// routes' order, `order` its blocks (indices into the job). A pass never
/// sees a redirection: `run_pass` takes each block's answer from it
/// (`take_answers`) and keeps the redirected ones for `job`'s next pass,
/// settling only the others (`settle`).
pub(in crate::backend::redis) trait Pass {
    /// What the send half hands the receive half.
    type Sent;
    /// One block's answer when the server did not refuse the command.
    type Answer;
    /// Puts the pass's blocks in `order` (the routes' order: a node's
    /// blocks are one slice), before the pass is run.
    fn arrange(&mut self, order: &[usize]);
    /// What a failure names ("SET pipeline").
    fn what(&self) -> &'static str;
    /// Whether a group found past the deadline ends the sending (a best
    /// effort pass) instead of failing its blocks and going on.
    const STOP_WHEN_LATE: bool = false;
    fn send(&mut self, range: Range<usize>, c: &mut RespConn) -> std::io::Result<Self::Sent>;
    fn receive(
        &mut self,
        range: Range<usize>,
        c: &mut RespConn,
        sent: Self::Sent,
    ) -> std::io::Result<()>;
    /// Moves what `receive` kept into `answers`: the group's answers in
    /// its order, one per block (none when the command does not answer
    /// per block, as a variadic DEL).
    fn take_answers(&mut self, answers: &mut Vec<std::result::Result<Self::Answer, ServerError>>);
    /// Block `i`'s outcome: its answer, or the server's refusal (never a
    /// redirection).
    fn settle(&mut self, i: usize, answer: std::result::Result<Self::Answer, ServerError>);
    /// These blocks' node failed, or they could not be sent at all.
    fn failed(&mut self, order: &[usize], e: &Error);
    /// The job's deadline passed before these blocks were sent or read:
    /// they fail as out of time.
    fn late(&mut self, order: &[usize]) {
        self.failed(order, &out_of_time());
    }
}

/// Runs a pass over the masters of `routes`: every master's pipeline sent
/// (suspect masters last), then the replies read from the master that
/// answers first, all by the job's `deadline`; masters whose connections
/// were all in use while the job held another's come in a later round.
pub(super) fn run_pass<P: Pass>(routes: &Routes, deadline: Instant, pass: &mut P) -> Trouble {
    let mut trouble = Trouble::default();
    // Room for the largest master's answers at once: one allocation per
    // pass, not a growth step per block.
    let largest = routes.groups.iter().map(|g| g.range.len()).max();
    let mut answers = Vec::with_capacity(largest.unwrap_or(0));
    let mut round = Round::All(0..routes.groups.len());
    loop {
        let mut busy = Vec::new();
        let mut sent: Vec<Pending<P::Sent>> = Vec::with_capacity(routes.groups.len());
        for g in round {
            let group = &routes.groups[g];
            let (range, asking) = (group.range.clone(), group.asking);
            let order = &routes.order[range.clone()];
            let Some(node) = &group.node else {
                trouble.unrouted.push(g);
                pass.failed(order, &unserved());
                continue;
            };
            match send_on(node, pass.what(), deadline, sent.is_empty(), asking, |c| {
                pass.send(range.clone(), c)
            }) {
                Sending::Busy => busy.push(g),
                Sending::Late if P::STOP_WHEN_LATE => break,
                Sending::Late => pass.late(order),
                Sending::Failed(e) => {
                    trouble.failed.push(g);
                    pass.failed(order, &e);
                }
                Sending::Sent(lease, state) => sent.push(Pending {
                    group: g,
                    node,
                    lease,
                    state,
                }),
            }
        }
        while !sent.is_empty() {
            let next = next_to_read(&mut sent, deadline);
            let Pending {
                group: g,
                node,
                lease,
                state,
            } = sent.remove(next);
            let range = routes.groups[g].range.clone();
            let order = &routes.order[range.clone()];
            match receive_on(node, lease, pass.what(), deadline, |c| {
                pass.receive(range, c, state)
            }) {
                None => pass.late(order),
                Some(Ok(())) => {
                    answers.clear();
                    pass.take_answers(&mut answers);
                    for (&i, answer) in order.iter().zip(answers.drain(..)) {
                        match answer {
                            Err(ServerError {
                                problem: Problem::Redirected(how),
                                ..
                            }) => trouble.redirected.push((i, how)),
                            answer => pass.settle(i, answer),
                        }
                    }
                }
                Some(Err(e)) => {
                    trouble.failed.push(g);
                    pass.failed(order, &e);
                }
            }
        }
        if busy.is_empty() {
            return trouble;
        }
        round = Round::Busy(busy.into_iter());
    }
}

/// A group whose pipeline was sent and whose replies are still to read.
struct Pending<'n, S> {
    group: usize,
    node: &'n Node,
    lease: Lease<'n>,
    /// What the send half handed the receive half.
    state: S,
}

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
/// leased, waiting for one only if `wait`, its request ending by the job's
/// `deadline`, `ASKING` first if `asking` (the group is one command), and
/// `send` run on it.
fn send_on<'n, S>(
    node: &'n Node,
    what: &str,
    deadline: Instant,
    wait: bool,
    asking: bool,
    send: impl FnOnce(&mut RespConn) -> std::io::Result<S>,
) -> Sending<'n, S> {
    if past(deadline) {
        return Sending::Late;
    }
    let sent = node.pool.lease(wait, deadline).and_then(|lease| {
        let Some(mut lease) = lease else {
            return Ok(Sending::Busy);
        };
        let c = lease.conn();
        if asking {
            c.cap_next(deadline);
            c.call_ok(&[b"ASKING"], std::io::ErrorKind::Other)
                .map_err(|e| io_error("ASKING", &e))?;
        }
        c.cap_next(deadline);
        let state = send(c).map_err(|e| io_error(what, &e))?;
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
    // Replies read on a connection found out of step afterwards are not
    // the node's answer: its blocks fail, nothing is judged from them.
    let read = receive(lease.conn())
        .and_then(|()| lease.conn().finish())
        .map_err(|e| io_error(what, &e));
    node.answered(read.is_ok());
    Some(read)
}

/// Which of the pipelines `sent` to read next: the first whose node has begun to answer, waiting for one
/// until the deadline; the first in order (suspect nodes last) if none
/// has by then, or if the sockets cannot be polled. A hung master then
/// costs the job its own blocks only, whatever its place in the order.
fn next_to_read<S>(sent: &mut [Pending<'_, S>], deadline: Instant) -> usize {
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
    for (k, pending) in sent.iter_mut().enumerate() {
        match pending.lease.conn().waits_on() {
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
