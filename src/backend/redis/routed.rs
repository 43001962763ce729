//! The data path, for a single server and a cluster alike: a job's blocks
//! grouped by the node serving their slot (a single server is a map of one
//! node), one direct pipeline (`direct`) per node on that node's own
//! connections, every node's sent before any reply is read (`fanout`: the
//! masters work at once), redirections and failovers followed over later
//! passes (`job`), the outcomes reported in the job's order. Loads land in
//! the caller's rows with at most one copy beyond the socket read.
//! This file: what a pass of SETs, GETs or one-key commands (DEL, EXISTS,
//! TOUCH) makes of each block's answer (the client keeps redirected blocks
//! for its next pass); whole commands are the client's `call_each`.
//!
//! The caller holds the blocks' stripe locks throughout, later passes
//! included.

use super::client::{run_job, slots_of, unsettled, Pass, RespConn, ServerError};
use super::direct::{self, Fetched, GetsSent, Layout, SetsSent};
use super::{server_error, RedisBackend};
use crate::error::{Error, Result};
use std::ops::Range;
use std::time::Instant;

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
    type Answer = ();

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

    fn take_answers(&mut self, answers: &mut Vec<std::result::Result<(), ServerError>>) {
        answers.extend(self.replies.drain(..).map(|r| r.map_err(ServerError::new)));
    }

    fn settle(&mut self, i: usize, answer: std::result::Result<(), ServerError>) {
        self.outcomes[i] = Some(answer.map_err(|refused| server_error("SET", &refused.message)));
    }

    fn failed(&mut self, order: &[usize], e: &Error) {
        order
            .iter()
            .for_each(|&i| self.outcomes[i] = Some(Err(e.clone())));
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
    type Answer = Fetched;

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

    fn take_answers(&mut self, answers: &mut Vec<std::result::Result<Fetched, ServerError>>) {
        answers.extend(self.fetched.drain(..).map(|fetched| match fetched {
            Fetched::Refused(refused) => Err(refused),
            fetched => Ok(fetched),
        }));
    }

    fn settle(&mut self, i: usize, answer: std::result::Result<Fetched, ServerError>) {
        self.got[i] = Got::Fetched(answer.unwrap_or_else(Fetched::Refused));
    }

    fn failed(&mut self, order: &[usize], e: &Error) {
        order
            .iter()
            .for_each(|&i| self.got[i] = Got::Failed(e.clone()));
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
    /// The node being read: each of its keys' counts, or its refusal.
    counts: Vec<std::result::Result<i64, ServerError>>,
    refused: Vec<(usize, String)>,
}

impl Pass for KeyCommands<'_, '_, '_> {
    /// Commands sent.
    type Sent = usize;
    type Answer = i64;
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
        let counts = &mut self.counts;
        direct::counts_receive(
            c,
            sent,
            self.command.name(),
            &mut |_, n| counts.push(Ok(n)),
            &mut self.refused,
        )?;
        // A variadic command answers once for all its keys: nothing to
        // count, and a single server redirects nothing.
        if !self.variadic {
            for (k, message) in self.refused.drain(..) {
                self.counts.insert(k, Err(ServerError::new(message)));
            }
        } else {
            self.counts.clear();
        }
        Ok(())
    }

    fn take_answers(&mut self, answers: &mut Vec<std::result::Result<i64, ServerError>>) {
        answers.append(&mut self.counts);
    }

    fn settle(&mut self, i: usize, answer: std::result::Result<i64, ServerError>) {
        // Best effort: a refused key goes uncounted.
        if let Ok(n) = answer {
            (self.count)(i, n);
        }
    }

    /// Best effort: a failed node's keys go uncounted (a DEL's key stays,
    /// an EXISTS reads absent).
    fn failed(&mut self, _order: &[usize], _e: &Error) {}
}

#[cfg(test)]
mod tests {
    //! Each pass over two fake nodes, the first turning every command away
    //! to the second: `run_pass` follows the redirection for the pass.
    use super::super::client::{redirecting_pair, Turn};
    use super::*;
    use std::sync::atomic::Ordering;
    use std::time::Duration;

    const TURNS: [Turn; 2] = [Turn::Moved, Turn::Ask];
    const KEYS: [&[u8]; 2] = [b"k1", b"k2"];

    fn layout() -> Layout<'static> {
        Layout {
            name_prefix: "t:",
            namespace_fp: 1,
            block_bytes: 4,
            ttl_s: 0,
            seal: None,
        }
    }

    fn slots(layout: &Layout) -> Vec<u16> {
        slots_of(KEYS.len(), |i, name| layout.write_name(name, KEYS[i]))
    }

    fn deadline() -> Instant {
        Instant::now() + Duration::from_secs(2)
    }

    #[test]
    fn sets_follow_a_redirection() {
        for turn in TURNS {
            let (router, answered) = redirecting_pair(turn, |_| b"+OK\r\n".to_vec());
            let payload = [7u8; 4];
            let blocks: Vec<(u32, &[u8], &[u8])> =
                KEYS.iter().map(|&k| (0, k, &payload[..])).collect();
            let slots = slots(&layout());
            let mut pass = Sets {
                layout: layout(),
                blocks: &blocks,
                sorted: Vec::new(),
                outcomes: vec![None; KEYS.len()],
                replies: Vec::new(),
            };
            run_job(&router, &slots, deadline(), &mut pass);
            for outcome in &pass.outcomes {
                assert!(matches!(outcome, Some(Ok(()))), "{turn:?}: {outcome:?}");
            }
            assert_eq!(answered.load(Ordering::SeqCst), KEYS.len(), "{turn:?}");
        }
    }

    #[test]
    fn gets_follow_a_redirection() {
        for turn in TURNS {
            let (router, answered) = redirecting_pair(turn, |_| b"$-1\r\n".to_vec());
            let mut rows = [[0u8; 4]; KEYS.len()];
            let mut got: Vec<Got> = KEYS.iter().map(|_| Got::Pending).collect();
            let cells: Vec<Option<LoadBlock>> = KEYS
                .iter()
                .zip(rows.iter_mut())
                .map(|(&key, row)| Some((0, key, &mut row[..])))
                .collect();
            let slots = slots(&layout());
            let mut pass = Gets {
                layout: layout(),
                cells,
                placed: Vec::new(),
                sorted: Vec::new(),
                got: &mut got,
                fetched: Vec::new(),
            };
            run_job(&router, &slots, deadline(), &mut pass);
            for g in &got {
                // The second node's answer: no such key.
                assert!(matches!(g, Got::Fetched(Fetched::Missing)), "{turn:?}");
            }
            assert_eq!(answered.load(Ordering::SeqCst), KEYS.len(), "{turn:?}");
        }
    }

    #[test]
    fn key_commands_follow_a_redirection() {
        for turn in TURNS {
            let (router, answered) = redirecting_pair(turn, |_| b":1\r\n".to_vec());
            let mut counted = Vec::new();
            let mut count = |i: usize, n: i64| counted.push((i, n));
            let slots = slots(&layout());
            let mut pass = KeyCommands {
                command: KeyCommand::Exists,
                variadic: false,
                layout: layout(),
                keys: &KEYS,
                sorted: Vec::new(),
                count: &mut count,
                counts: Vec::new(),
                refused: Vec::new(),
            };
            run_job(&router, &slots, deadline(), &mut pass);
            counted.sort();
            assert_eq!(counted, [(0, 1), (1, 1)], "{turn:?}");
            assert_eq!(answered.load(Ordering::SeqCst), KEYS.len(), "{turn:?}");
        }
    }
}
