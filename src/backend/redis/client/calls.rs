//! Whole commands, each naming one key, sent as a job (`job`): a pipeline
//! per node, each reply read whole. The backend's off-the-data-path
//! commands (a private GET, a condemned value's DEL, the generation
//! counter) go this way, so they follow redirections as the data path does.

use super::cluster::Router;
use super::command;
use super::fanout::{unsettled, Pass};
use super::job::run_job;
use super::refusal::ServerError;
use super::reply::Value;
use super::routes::slot_of;
use super::transport::RespConn;
use crate::error::{Error, Result};
use std::ops::Range;
use std::time::Instant;

/// Whole commands, one per key name in `names` (`args(name)` makes it), a
/// pipeline per node, by `deadline`: each one's reply of at most `ceiling`
/// bytes (a refusal other than a redirection is `Value::Error`), or why
/// there is none (`what` names the command in errors).
pub(in crate::backend::redis) fn call_each<'a>(
    router: &Router,
    what: &'static str,
    names: &[&'a [u8]],
    ceiling: usize,
    deadline: Instant,
    args: impl Fn(&'a [u8]) -> Vec<&'a [u8]>,
) -> Vec<Result<Value>> {
    let slots: Vec<u16> = names.iter().map(|n| slot_of(n)).collect();
    let commands: Vec<Vec<u8>> = names
        .iter()
        .map(|&name| {
            let mut out = Vec::new();
            command::encode(&mut out, &args(name));
            out
        })
        .collect();
    let mut pass = Calls::new(what, &commands, ceiling);
    run_job(router, &slots, deadline, &mut pass);
    pass.into_replies()
}

/// A pass of whole commands (each naming one key), each reply read whole.
pub(super) struct Calls<'c> {
    commands: &'c [Vec<u8>],
    sorted: Vec<&'c [u8]>,
    read: Vec<Value>,
    what: &'static str,
    /// Most bytes of each reply (see `reply`).
    ceiling: usize,
    /// Each command's reply; None while it is to send (again).
    replies: Vec<Option<Result<Value>>>,
}

impl<'c> Calls<'c> {
    pub(super) fn new(what: &'static str, commands: &'c [Vec<u8>], ceiling: usize) -> Calls<'c> {
        Calls {
            commands,
            sorted: Vec::new(),
            read: Vec::new(),
            what,
            ceiling,
            replies: (0..commands.len()).map(|_| None).collect(),
        }
    }

    pub(super) fn into_replies(self) -> Vec<Result<Value>> {
        self.replies
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(unsettled())))
            .collect()
    }
}

impl Pass for Calls<'_> {
    type Sent = ();
    type Answer = Value;

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

    fn take_answers(&mut self, answers: &mut Vec<std::result::Result<Value, ServerError>>) {
        answers.extend(self.read.drain(..).map(|value| match value {
            Value::Error(message) => Err(ServerError::new(message)),
            value => Ok(value),
        }));
    }

    fn settle(&mut self, i: usize, answer: std::result::Result<Value, ServerError>) {
        let value = answer.unwrap_or_else(|refused| Value::Error(refused.message));
        self.replies[i] = Some(Ok(value));
    }

    fn failed(&mut self, order: &[usize], e: &Error) {
        order
            .iter()
            .for_each(|&i| self.replies[i] = Some(Err(e.clone())));
    }
}

#[cfg(test)]
mod tests {
    use super::super::fake::{redirecting_pair, Turn};
    use super::super::reply::SMALL_REPLY;
    use super::*;
    use std::sync::atomic::Ordering;
    use std::time::Duration;

    #[test]
    fn calls_follow_a_redirection() {
        for turn in [Turn::Moved, Turn::Ask] {
            let (router, answered) = redirecting_pair(turn, |_| b"$1\r\nv\r\n".to_vec());
            let names: [&[u8]; 2] = [b"k1", b"k2"];
            let deadline = Instant::now() + Duration::from_secs(2);
            let replies = call_each(&router, "GET", &names, SMALL_REPLY, deadline, |name| {
                vec![b"GET", name]
            });
            for reply in replies {
                assert_eq!(reply, Ok(Value::BulkString(b"v".to_vec())), "{turn:?}");
            }
            assert_eq!(answered.load(Ordering::SeqCst), names.len(), "{turn:?}");
        }
    }

    #[test]
    fn a_refusal_other_than_a_redirection_is_the_reply() {
        let (router, _) = redirecting_pair(Turn::Moved, |_| b"-WRONGTYPE nope\r\n".to_vec());
        let deadline = Instant::now() + Duration::from_secs(2);
        let replies = call_each(&router, "GET", &[b"k"], SMALL_REPLY, deadline, |name| {
            vec![b"GET", name]
        });
        assert_eq!(replies, [Ok(Value::Error("WRONGTYPE nope".into()))]);
    }
}
