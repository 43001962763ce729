//! A Redis Cluster tier's data path over TCP or TLS: a job's blocks grouped
//! by the master serving their slot (`cluster`), one direct pipeline
//! (`direct`) per master on that master's own connections, every master's
//! sent before any reply is read (`fanout`: the masters work at once), the
//! outcomes reported in the job's order. Loads land in the caller's rows
//! with at most one copy beyond the socket read, as on a single server.
//! This file: what a pass of SETs, GETs or one-key commands (DEL, EXISTS,
//! TOUCH) makes of each master's answer, and the retries.
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

use super::client::cluster::{redirection, Router, Routes, SlotMap};
use super::client::fanout::{past, run_pass, Pass, Trouble};
use super::client::transport::RespConn;
use super::direct::{self, Fetched, GetsSent, Layout, SetsSent};
use super::{server_error, RedisBackend};
use crate::error::{Error, ErrorKind, Result};
use std::ops::Range;
use std::time::Instant;

/// One deadline for a whole job: its pipelines to the masters (all sent,
/// then all read) share it, and the job is reported within `io_timeout_ms`
/// even if several masters hang.
fn job_deadline(backend: &RedisBackend) -> Instant {
    Instant::now() + backend.pool.timeout()
}

/// Blocks not sent because the job's deadline passed on other masters.
fn out_of_time() -> Error {
    Error::new(
        ErrorKind::Io,
        "redis: no answer within io_timeout_ms (the job's deadline passed on another master)",
    )
    .unsent()
}

fn unsettled() -> Error {
    Error::new(ErrorKind::Io, "redis: a block was neither sent nor retried").unsent()
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
        let mut pass = Sets {
            layout,
            sorted,
            outcomes,
            replies: Vec::with_capacity(routes.largest()),
        };
        let trouble = run_pass(&routes, map, deadline, &mut pass);
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
                Got::Value(Err(e)) => Err(self.get_failed(&self.name(key), &e)),
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
        let mut pass = Gets {
            layout,
            sorted,
            got,
            fetched: Vec::with_capacity(routes.largest()),
        };
        let trouble = run_pass(&routes, map, deadline, &mut pass);
        (routes, trouble)
    }

    /// `discard` (DEL) or `touch` (TOUCH) on a cluster: a direct pipeline
    /// per master; keys a node redirected go through the crate's
    /// connection. Best effort, as on a single server: a dead or hung
    /// master costs only its own keys.
    pub(super) fn best_effort_routed(&self, router: &Router, command: KeyCommand, keys: &[&[u8]]) {
        let (retry, deadline) = self.keys_routed(router, command, keys, &mut |_, _| {});
        // Past the deadline, what is left stays (see `discard`).
        if !retry.is_empty() && !past(deadline) {
            router.note_rerouted(retry.len());
            let keys: Vec<&[u8]> = retry.iter().map(|&i| keys[i]).collect();
            let _ = self.pool.with_conn(command.what(), |conn| {
                self.keys_by_crate(conn, command.name(), &keys)
            });
        }
    }

    /// `probe_many` on a cluster: a direct EXISTS pipeline per master, each
    /// master's verdicts recorded as it answers, so that a dead or hung
    /// master costs only its own keys (they read absent at its failure or
    /// the deadline: a MISS, never a wait); keys a node redirected go
    /// through the crate's connection.
    pub(super) fn probe_routed(
        &self,
        router: &Router,
        keys: &[&[u8]],
        record: &mut dyn FnMut(usize, bool),
    ) {
        let mut told = vec![false; keys.len()];
        let (retry, deadline) = self.keys_routed(router, KeyCommand::Exists, keys, &mut |i, n| {
            told[i] = true;
            record(i, n > 0);
        });
        if !retry.is_empty() && !past(deadline) {
            router.note_rerouted(retry.len());
            let exists = |k: usize| redis::cmd("EXISTS").arg(self.name(keys[retry[k]])).take();
            if let Ok(counts) = self.pool.with_conn("EXISTS pipeline", |conn| {
                super::by_crate::pipelined::<i64>(conn, retry.len(), exists)
            }) {
                for (&i, count) in retry.iter().zip(counts) {
                    told[i] = true;
                    record(i, count.is_ok_and(|n| n > 0));
                }
            }
        }
        for i in (0..keys.len()).filter(|&i| !told[i]) {
            record(i, false);
        }
    }

    /// `<command> <name>` for each key, one direct pipeline per master,
    /// best effort: `count(i, n)` for each key a node answered; a failed
    /// node's keys that the refreshed map gives to another node are sent
    /// again, once. Returns the keys (indices) to send through the crate
    /// (redirected, or no master known for their slot), and the deadline
    /// they share.
    fn keys_routed(
        &self,
        router: &Router,
        command: KeyCommand,
        keys: &[&[u8]],
        count: &mut dyn FnMut(usize, i64),
    ) -> (Vec<usize>, Instant) {
        let deadline = job_deadline(self);
        let map = router.map();
        let mut retry = vec![false; keys.len()];
        let mut pass = KeyCommands {
            command,
            layout: self.layout(),
            keys,
            sorted: Vec::with_capacity(keys.len()),
            retry: &mut retry,
            count,
            counts: Vec::new(),
            refused: Vec::new(),
        };
        let (routes, trouble) = pass.run(&map, |_| true, deadline);
        if let Some((now, again)) = trouble.settle(router, &map, &routes, keys.len(), deadline) {
            pass.run(&now, |i| again[i], deadline);
        }
        ((0..keys.len()).filter(|&i| retry[i]).collect(), deadline)
    }
}

/// A pass of SETs: `outcomes[i]` None means to send through the crate.
struct Sets<'a, 'o> {
    layout: Layout<'a>,
    sorted: Vec<(u32, &'a [u8], &'a [u8])>,
    outcomes: &'o mut [Option<Result<()>>],
    replies: Vec<std::result::Result<(), String>>,
}

impl Pass for Sets<'_, '_> {
    type Sent = SetsSent;

    fn what(&self) -> &'static str {
        "SET pipeline"
    }

    fn send(&mut self, range: Range<usize>, c: &mut RespConn) -> std::io::Result<SetsSent> {
        direct::set_send(c, &self.layout, &self.sorted[range])
    }

    fn receive(
        &mut self,
        range: Range<usize>,
        c: &mut RespConn,
        started: SetsSent,
    ) -> std::io::Result<()> {
        direct::set_receive(
            c,
            &self.layout,
            &self.sorted[range],
            started,
            &mut self.replies,
        )
    }

    fn unrouted(&mut self, order: &[usize]) {
        order.iter().for_each(|&i| self.outcomes[i] = None);
    }

    fn late(&mut self, order: &[usize]) {
        order
            .iter()
            .for_each(|&i| self.outcomes[i] = Some(Err(out_of_time())));
    }

    fn failed(&mut self, order: &[usize], e: &Error) {
        order
            .iter()
            .for_each(|&i| self.outcomes[i] = Some(Err(e.clone())));
    }

    fn answered(&mut self, order: &[usize], trouble: &mut Trouble) {
        for (&i, reply) in order.iter().zip(self.replies.drain(..)) {
            self.outcomes[i] = match reply {
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
}

/// A pass of GETs, each payload read into its row.
struct Gets<'a, 'r, 'g> {
    layout: Layout<'a>,
    sorted: Vec<LoadBlock<'r>>,
    got: &'g mut [Got],
    fetched: Vec<Fetched>,
}

impl Pass for Gets<'_, '_, '_> {
    type Sent = GetsSent;

    fn what(&self) -> &'static str {
        "GET pipeline"
    }

    fn send(&mut self, range: Range<usize>, c: &mut RespConn) -> std::io::Result<GetsSent> {
        direct::get_send(c, &self.layout, &self.sorted[range])
    }

    fn receive(
        &mut self,
        range: Range<usize>,
        c: &mut RespConn,
        started: GetsSent,
    ) -> std::io::Result<()> {
        direct::get_receive(
            c,
            &self.layout,
            &mut self.sorted[range],
            started,
            &mut self.fetched,
        )
    }

    fn unrouted(&mut self, order: &[usize]) {
        order.iter().for_each(|&i| self.got[i] = Got::Retry);
    }

    fn late(&mut self, order: &[usize]) {
        order
            .iter()
            .for_each(|&i| self.got[i] = Got::Failed(out_of_time()));
    }

    fn failed(&mut self, order: &[usize], e: &Error) {
        order
            .iter()
            .for_each(|&i| self.got[i] = Got::Failed(e.clone()));
    }

    fn answered(&mut self, order: &[usize], trouble: &mut Trouble) {
        for (&i, outcome) in order.iter().zip(self.fetched.drain(..)) {
            self.got[i] = match outcome {
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
}

/// A one-key command answered by an integer, sent in a [`KeyCommands`] pass.
#[derive(Clone, Copy)]
pub(super) enum KeyCommand {
    Del,
    Exists,
    Touch,
}

impl KeyCommand {
    pub(super) fn name(self) -> &'static str {
        match self {
            KeyCommand::Del => "DEL",
            KeyCommand::Exists => "EXISTS",
            KeyCommand::Touch => "TOUCH",
        }
    }

    /// What a failure names.
    pub(super) fn what(self) -> &'static str {
        match self {
            KeyCommand::Del => "DEL pipeline",
            KeyCommand::Exists => "EXISTS pipeline",
            KeyCommand::Touch => "TOUCH pipeline",
        }
    }
}

/// A pass of one-key commands (DEL, EXISTS, TOUCH), best effort: `retry[i]`
/// means to send through the crate; past the deadline, the rest go
/// unanswered (a DEL's key stays, an EXISTS reads absent).
struct KeyCommands<'a, 'k, 'r> {
    command: KeyCommand,
    layout: Layout<'a>,
    keys: &'k [&'k [u8]],
    /// The keys in the routes' order: a node's keys are one slice.
    sorted: Vec<&'k [u8]>,
    retry: &'r mut [bool],
    /// Told each answered key's count, by its index in the job.
    count: &'r mut dyn FnMut(usize, i64),
    /// The node being read: each of its keys' counts (None: refused).
    counts: Vec<Option<i64>>,
    refused: Vec<(usize, String)>,
}

impl KeyCommands<'_, '_, '_> {
    /// One pass over the masters of `map`, for the keys `include` selects.
    fn run(
        &mut self,
        map: &SlotMap,
        include: impl Fn(usize) -> bool,
        deadline: Instant,
    ) -> (Routes, Trouble) {
        let (layout, keys) = (&self.layout, self.keys);
        let routes = Routes::new(map, keys.len(), include, |i, name| {
            layout.write_name(name, keys[i])
        });
        self.sorted.clear();
        self.sorted.extend(routes.order.iter().map(|&i| keys[i]));
        let trouble = run_pass(&routes, map, deadline, self);
        (routes, trouble)
    }
}

impl Pass for KeyCommands<'_, '_, '_> {
    type Sent = ();
    const STOP_WHEN_LATE: bool = true;

    fn what(&self) -> &'static str {
        self.command.what()
    }

    fn send(&mut self, range: Range<usize>, c: &mut RespConn) -> std::io::Result<()> {
        let name = self.command.name().as_bytes();
        direct::keys_send(c, &self.layout, name, &self.sorted[range])
    }

    fn receive(&mut self, range: Range<usize>, c: &mut RespConn, (): ()) -> std::io::Result<()> {
        self.refused.clear();
        self.counts.clear();
        self.counts.resize(range.len(), None);
        let counts = &mut self.counts;
        direct::counts_receive(
            c,
            range.len(),
            self.command.name(),
            &mut |k, n| counts[k] = Some(n),
            &mut self.refused,
        )
    }

    fn unrouted(&mut self, order: &[usize]) {
        order.iter().for_each(|&i| self.retry[i] = true);
    }

    fn late(&mut self, _order: &[usize]) {}

    fn failed(&mut self, _order: &[usize], _e: &Error) {}

    fn answered(&mut self, order: &[usize], trouble: &mut Trouble) {
        for (k, n) in self.counts.drain(..).enumerate() {
            if let Some(n) = n {
                (self.count)(order[k], n);
            }
        }
        for (k, message) in self.refused.drain(..) {
            if let Some(how) = redirection(&message) {
                trouble.redirected(how);
                self.retry[order[k]] = true;
            }
        }
    }
}
