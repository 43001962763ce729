//! The data path, for a single server and a cluster alike: a job's blocks
//! grouped by the node serving their slot (a single server is a map of one
//! node), one direct pipeline (`direct`) per node on that node's own
//! connections, every node's sent before any reply is read (`fanout`: the
//! masters work at once), redirections and failovers followed over later
//! passes (`job`), the outcomes reported in the job's order. Loads land in
//! the caller's rows with at most one copy beyond the socket read.
//! This file: what a pass of SETs, GETs, one-key commands (DEL, EXISTS,
//! TOUCH) or whole commands makes of each node's answer.
//!
//! The caller holds the blocks' stripe locks throughout, later passes
//! included.

use super::client::fanout::{Pass, Trouble};
use super::client::job::run_job;
use super::client::reply::Value;
use super::client::routes::slots_of;
use super::client::transport::RespConn;
use super::direct::{self, Fetched, GetsSent, Layout, SetsSent};
use super::{server_error, RedisBackend};
use crate::error::{Error, ErrorKind, Result};
use std::ops::Range;
use std::time::Instant;

/// Blocks not sent, or not answered, because the job's deadline passed
/// (on another master, or waiting for a redirection's turn).
fn out_of_time() -> Error {
    Error::new(
        ErrorKind::Io,
        "redis: no answer within io_timeout_ms (the job's deadline passed on another master)",
    )
    .unsent()
    .late()
}

fn unsettled() -> Error {
    Error::new(ErrorKind::Io, "redis: a block was neither sent nor retried").unsent()
}

/// A block of a load: its slot, key and row.
type LoadBlock<'a> = (u32, &'a [u8], &'a mut [u8]);

/// A block's state in a load.
enum Got {
    /// Not answered yet (or redirected: to send again).
    Pending,
    /// The direct pipeline's outcome (the payload, if any, in its row).
    Fetched(Fetched),
    Failed(Error),
}

impl RedisBackend {
    /// One deadline for a whole job: its pipelines to the nodes (all sent,
    /// then all read, later passes included) share it, and the job is
    /// reported within `io_timeout_ms` even if several masters hang.
    pub(super) fn job_deadline(&self) -> Instant {
        Instant::now() + self.router.timeout()
    }

    /// `store_batch`: a SET pipeline per node; block i's outcome is
    /// `outcomes[i]`.
    pub(super) fn store_routed(&self, blocks: &[(u32, &[u8], &[u8])]) -> Vec<Result<()>> {
        let naming = self.naming();
        let layout = self.layout(&naming);
        let slots = slots_of(blocks.len(), |i, name| layout.write_name(name, blocks[i].1));
        let mut pass = Sets {
            layout,
            blocks,
            sorted: Vec::with_capacity(blocks.len()),
            outcomes: vec![None; blocks.len()],
            replies: Vec::with_capacity(blocks.len()),
        };
        run_job(&self.router, &slots, self.job_deadline(), &mut pass);
        pass.outcomes
            .into_iter()
            .map(|o| o.unwrap_or_else(|| Err(unsettled())))
            .collect()
    }

    /// `load_batch`: a GET pipeline per node, each reply read into its
    /// block's row; then the outcomes in the job's order until `done` says
    /// stop.
    pub(super) fn load_routed(
        &self,
        blocks: &mut [(u32, &[u8], &mut [u8])],
        done: &mut dyn FnMut(usize, Result<()>) -> bool,
    ) {
        let deadline = self.job_deadline();
        let naming = self.naming();
        let layout = self.layout(&naming);
        let slots = slots_of(blocks.len(), |i, name| layout.write_name(name, blocks[i].1));
        let mut got: Vec<Got> = (0..blocks.len()).map(|_| Got::Pending).collect();
        {
            let cells: Vec<Option<LoadBlock>> = blocks
                .iter_mut()
                .map(|(slot, key, dst)| Some((*slot, *key, &mut **dst)))
                .collect();
            let mut pass = Gets {
                layout,
                cells,
                placed: Vec::with_capacity(slots.len()),
                sorted: Vec::with_capacity(slots.len()),
                got: &mut got,
                fetched: Vec::with_capacity(slots.len()),
            };
            run_job(&self.router, &slots, deadline, &mut pass);
        }
        for (i, ((_, key, dst), got)) in blocks.iter_mut().zip(got).enumerate() {
            let outcome = match got {
                // A private re-read, or a bad value's delete, takes what is
                // left of the job's deadline, not a deadline of its own.
                Got::Fetched(fetched) => self.judge(key, dst, fetched, deadline),
                Got::Failed(e) => Err(e),
                Got::Pending => Err(unsettled()),
            };
            if !done(i, outcome) {
                return;
            }
        }
    }

    /// `<command> <name>` for each key (DEL, TOUCH), a pipeline per node
    /// (on a single server, variadic commands). Best effort: a dead or hung
    /// master costs only its own keys.
    pub(super) fn best_effort_routed(&self, command: KeyCommand, keys: &[&[u8]]) {
        self.keys_routed(command, keys, &mut |_, _| {});
    }

    /// `probe_many`: an EXISTS pipeline per node, each node's verdicts
    /// recorded as it answers, so that a dead or hung master costs only its
    /// own keys (they read absent at its failure or the deadline: a MISS,
    /// never a wait).
    pub(super) fn probe_routed(&self, keys: &[&[u8]], record: &mut dyn FnMut(usize, bool)) {
        let mut told = vec![false; keys.len()];
        self.keys_routed(KeyCommand::Exists, keys, &mut |i, n| {
            told[i] = true;
            record(i, n > 0);
        });
        for i in (0..keys.len()).filter(|&i| !told[i]) {
            record(i, false);
        }
    }

    /// `<command> <name>` for each key, a pipeline per node, best effort:
    /// `count(i, n)` for each key a node answered.
    fn keys_routed(&self, command: KeyCommand, keys: &[&[u8]], count: &mut dyn FnMut(usize, i64)) {
        let naming = self.naming();
        let layout = self.layout(&naming);
        let slots = slots_of(keys.len(), |i, name| layout.write_name(name, keys[i]));
        // A cluster refuses keys of several slots in one command.
        let variadic = !self.router.is_cluster() && !matches!(command, KeyCommand::Exists);
        let mut pass = KeyCommands {
            command,
            variadic,
            layout,
            keys,
            sorted: Vec::with_capacity(keys.len()),
            count,
            counts: Vec::new(),
            refused: Vec::new(),
        };
        run_job(&self.router, &slots, self.job_deadline(), &mut pass);
    }

    /// Whole commands, one per key name in `names` (`args(name)` makes
    /// it), a pipeline per node, by `deadline` (the job's): each one's
    /// reply of at most `ceiling` bytes, or why there is none (`what` names
    /// the command in errors).
    pub(super) fn calls_routed<'a>(
        &self,
        what: &'static str,
        names: &[&'a [u8]],
        ceiling: usize,
        deadline: Instant,
        args: impl Fn(&'a [u8]) -> Vec<&'a [u8]>,
    ) -> Vec<Result<Value>> {
        let slots: Vec<u16> = names
            .iter()
            .map(|n| super::client::routes::slot_of(n))
            .collect();
        let commands: Vec<Vec<u8>> = names
            .iter()
            .map(|&name| {
                let mut out = Vec::new();
                super::client::command::encode(&mut out, &args(name));
                out
            })
            .collect();
        let mut pass = Calls {
            commands: &commands,
            sorted: Vec::new(),
            read: Vec::new(),
            what,
            ceiling,
            replies: (0..names.len()).map(|_| None).collect(),
        };
        run_job(&self.router, &slots, deadline, &mut pass);
        pass.replies
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(unsettled())))
            .collect()
    }
}

/// A pass of SETs: `outcomes[i]` None while block i is to send (again).
struct Sets<'a, 'b> {
    layout: Layout<'a>,
    blocks: &'b [(u32, &'b [u8], &'b [u8])],
    sorted: Vec<(u32, &'b [u8], &'b [u8])>,
    outcomes: Vec<Option<Result<()>>>,
    replies: Vec<std::result::Result<(), String>>,
}

impl Pass for Sets<'_, '_> {
    type Sent = SetsSent;

    fn arrange(&mut self, order: &[usize]) {
        self.sorted.clear();
        self.sorted.extend(order.iter().map(|&i| self.blocks[i]));
        order.iter().for_each(|&i| self.outcomes[i] = None);
    }

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
                Err(message) if trouble.redirected_by(i, &message) => None,
                Err(message) => Some(Err(server_error("SET", &message))),
            };
        }
    }
}

/// A pass of GETs, each payload read into its row. The rows live in
/// `cells` (by block) or `sorted` (in the pass's order, `placed[k]` the
/// block of `sorted[k]`).
struct Gets<'a, 'r, 'g> {
    layout: Layout<'a>,
    cells: Vec<Option<LoadBlock<'r>>>,
    placed: Vec<usize>,
    sorted: Vec<LoadBlock<'r>>,
    got: &'g mut [Got],
    fetched: Vec<Fetched>,
}

impl Pass for Gets<'_, '_, '_> {
    type Sent = GetsSent;

    fn arrange(&mut self, order: &[usize]) {
        for (&i, row) in self.placed.iter().zip(self.sorted.drain(..)) {
            self.cells[i] = Some(row);
        }
        self.placed.clear();
        self.placed.extend_from_slice(order);
        let cells = &mut self.cells;
        self.sorted
            .extend(order.iter().filter_map(|&i| cells[i].take()));
        order.iter().for_each(|&i| self.got[i] = Got::Pending);
    }

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
                Fetched::Refused(message) if trouble.redirected_by(i, &message) => Got::Pending,
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
    fn name(self) -> &'static str {
        match self {
            KeyCommand::Del => "DEL",
            KeyCommand::Exists => "EXISTS",
            KeyCommand::Touch => "TOUCH",
        }
    }

    /// What a failure names.
    fn what(self) -> &'static str {
        match self {
            KeyCommand::Del => "DEL pipeline",
            KeyCommand::Exists => "EXISTS pipeline",
            KeyCommand::Touch => "TOUCH pipeline",
        }
    }
}

/// A pass of one-key commands (DEL, EXISTS, TOUCH), best effort: past the
/// deadline, the rest go unanswered (a DEL's key stays, an EXISTS reads
/// absent).
struct KeyCommands<'a, 'k, 'r> {
    command: KeyCommand,
    /// Many keys per command (DEL, TOUCH on a single server); their counts
    /// are not told.
    variadic: bool,
    layout: Layout<'a>,
    keys: &'k [&'k [u8]],
    /// The keys in the routes' order: a node's keys are one slice.
    sorted: Vec<&'k [u8]>,
    /// Told each answered key's count, by its index in the job.
    count: &'r mut dyn FnMut(usize, i64),
    /// The node being read: each of its keys' counts (None: refused).
    counts: Vec<Option<i64>>,
    refused: Vec<(usize, String)>,
}

impl Pass for KeyCommands<'_, '_, '_> {
    /// Commands sent.
    type Sent = usize;
    const STOP_WHEN_LATE: bool = true;

    fn arrange(&mut self, order: &[usize]) {
        self.sorted.clear();
        self.sorted.extend(order.iter().map(|&i| self.keys[i]));
    }

    fn what(&self) -> &'static str {
        self.command.what()
    }

    fn send(&mut self, range: Range<usize>, c: &mut RespConn) -> std::io::Result<usize> {
        let name = self.command.name().as_bytes();
        let keys = &self.sorted[range];
        if self.variadic {
            return direct::variadic_send(c, &self.layout, name, keys);
        }
        direct::keys_send(c, &self.layout, name, keys)?;
        Ok(keys.len())
    }

    fn receive(&mut self, _: Range<usize>, c: &mut RespConn, sent: usize) -> std::io::Result<()> {
        self.refused.clear();
        self.counts.clear();
        self.counts.resize(sent, None);
        let counts = &mut self.counts;
        direct::counts_receive(
            c,
            sent,
            self.command.name(),
            &mut |k, n| counts[k] = Some(n),
            &mut self.refused,
        )
    }

    fn late(&mut self, _order: &[usize]) {}

    fn failed(&mut self, _order: &[usize], _e: &Error) {}

    fn answered(&mut self, order: &[usize], trouble: &mut Trouble) {
        if self.variadic {
            // A single server: nothing to count, nothing redirected.
            return;
        }
        for (k, n) in self.counts.drain(..).enumerate() {
            if let Some(n) = n {
                (self.count)(order[k], n);
            }
        }
        for (k, message) in self.refused.drain(..) {
            trouble.redirected_by(order[k], &message);
        }
    }
}

/// A pass of whole commands (each naming one key), each reply read whole.
struct Calls<'c> {
    commands: &'c [Vec<u8>],
    sorted: Vec<&'c [u8]>,
    read: Vec<Value>,
    what: &'static str,
    /// Most bytes of each reply (see `client::reply`).
    ceiling: usize,
    /// Each command's reply; None while it is to send (again).
    replies: Vec<Option<Result<Value>>>,
}

impl Pass for Calls<'_> {
    type Sent = ();

    fn arrange(&mut self, order: &[usize]) {
        self.sorted.clear();
        self.sorted
            .extend(order.iter().map(|&i| self.commands[i].as_slice()));
        order.iter().for_each(|&i| self.replies[i] = None);
    }

    fn what(&self) -> &'static str {
        self.what
    }

    fn send(&mut self, range: Range<usize>, c: &mut RespConn) -> std::io::Result<()> {
        c.out.clear();
        self.sorted[range]
            .iter()
            .for_each(|command| c.out.extend_from_slice(command));
        c.begin();
        let len = c.out.len();
        c.send_out_range(0, len)
    }

    fn receive(&mut self, range: Range<usize>, c: &mut RespConn, (): ()) -> std::io::Result<()> {
        self.read.clear();
        for _ in range {
            self.read.push(c.read_value(self.ceiling)?);
        }
        Ok(())
    }

    fn late(&mut self, order: &[usize]) {
        order
            .iter()
            .for_each(|&i| self.replies[i] = Some(Err(out_of_time())));
    }

    fn failed(&mut self, order: &[usize], e: &Error) {
        order
            .iter()
            .for_each(|&i| self.replies[i] = Some(Err(e.clone())));
    }

    fn answered(&mut self, order: &[usize], trouble: &mut Trouble) {
        for (&i, value) in order.iter().zip(self.read.drain(..)) {
            self.replies[i] = match value {
                Value::Error(message) if trouble.redirected_by(i, &message) => None,
                value => Some(Ok(value)),
            };
        }
    }
}
