//! Adopting an owned tier's keys at open: the keys of its namespace and
//! block size already on the server, or on every cluster master that
//! answers (a master down at open keeps its keys unadopted; see
//! docs/reliability-rules.md).
//!
//! Bounded, whatever the servers answer: one deadline for the whole
//! adoption ([`ADOPT_TIMEOUTS`] times `io_timeout_ms`) and a key budget
//! ([`ADOPT_BUDGET_PER_BLOCK`] times the capacity in blocks). Past either,
//! the tier opens with the keys adopted so far: the others stay on the
//! servers, unindexed, as a down master's do, and `tier_describe` says
//! why adoption stopped. A SCAN cursor that never returns to 0, or a flood
//! of names, costs `tier_new` at most the deadline and the budget's memory.

use super::client::{io_error, Endpoint, RespConn, Value, MAP_REPLY, SMALL_REPLY};
use super::{format, sealed, RedisBackend};
use crate::error::{Error, ErrorKind, Result};
use crate::seal::RECORD_LEN;
use std::io;
use std::time::Instant;

/// Keys asked for per SCAN step when adopting a keyspace.
const SCAN_COUNT: &[u8] = b"1000";

/// The whole adoption's deadline, in `io_timeout_ms`: a million keys of
/// short names take about 2 s on loopback, sealed or hashed names (one
/// GETRANGE each, pipelined per SCAN step) a few more.
const ADOPT_TIMEOUTS: u32 = 10;

/// Keys adopted at most per block of capacity: beyond the capacity they
/// are evicted (deleted) again at open, which tidies a keyspace a tier
/// reopened smaller left behind; beyond twice that, nothing legitimate.
pub(super) const ADOPT_BUDGET_PER_BLOCK: usize = 2;

/// GETRANGEs sent in one pipeline (hashed or sealed names' headers).
const GETRANGE_PIPELINE: usize = 256;

/// A reply that is not what the command answers.
fn unexpected(what: &str, value: &Value) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("{what} answered {value:?}"),
    )
}

/// A bulk reply's bytes (an error reply is an error).
fn bulk_of(what: &str, value: Value) -> io::Result<Vec<u8>> {
    match value {
        Value::BulkString(bytes) => Ok(bytes),
        Value::Error(message) => Err(io::Error::other(message)),
        other => Err(unexpected(what, &other)),
    }
}

/// The masters in a `CLUSTER NODES` reply that are not failing, as
/// `host:port` pairs.
fn masters_of(nodes: &str) -> Vec<(String, u16)> {
    let mut masters = Vec::new();
    for line in nodes.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (Some(addr), Some(flags)) = (fields.get(1), fields.get(2)) else {
            continue;
        };
        if !flags.split(',').any(|f| f == "master") || flags.contains("fail") {
            continue;
        }
        let hostport = addr.split('@').next().unwrap_or("");
        let Some((host, port)) = hostport.rsplit_once(':') else {
            continue;
        };
        let Ok(port) = port.parse::<u16>() else {
            continue;
        };
        masters.push((host.to_string(), port));
    }
    masters
}

/// What is left of an adoption: its keys so far, its deadline and budget.
struct Adoption {
    found: Vec<Vec<u8>>,
    deadline: Instant,
    budget: usize,
}

impl Adoption {
    /// Why the adoption must stop now, if it must.
    fn stop(&self) -> Option<String> {
        if self.found.len() >= self.budget {
            return Some(format!(
                "key budget reached ({} keys, {ADOPT_BUDGET_PER_BLOCK} per block of capacity)",
                self.budget
            ));
        }
        if Instant::now() >= self.deadline {
            return Some(format!(
                "deadline reached ({ADOPT_TIMEOUTS} x io_timeout_ms) after {} keys",
                self.found.len()
            ));
        }
        None
    }
}

impl RedisBackend {
    /// The servers holding keys: the one server, or every cluster master
    /// (from `CLUSTER NODES` of the first seed that answers by `deadline`;
    /// a TLS cluster's nodes announce their TLS ports).
    pub(super) fn key_holders(&self, deadline: Instant) -> Result<Vec<Endpoint>> {
        let seeds = self.router.seeds();
        if !self.router.is_cluster() {
            return Ok(seeds.to_vec());
        }
        let mut last = None;
        for seed in seeds {
            let nodes = self.router.connect(seed, deadline).and_then(|mut c| {
                c.cap_next(deadline);
                bulk_of("CLUSTER NODES", c.call(&[b"CLUSTER", b"NODES"], MAP_REPLY)?)
            });
            match nodes {
                Ok(nodes) => {
                    let nodes = String::from_utf8_lossy(&nodes);
                    return Ok(masters_of(&nodes)
                        .into_iter()
                        .map(|(host, port)| seed.at(&host, port))
                        .collect());
                }
                Err(e) => last = Some(e),
            }
        }
        Err(io_error("CLUSTER NODES", &last.expect("at least one seed")))
    }

    /// Keys of this namespace and block size already on the server(s),
    /// within the adoption's deadline and key budget (see the file's
    /// comment).
    pub(super) fn scan_keys(&self) -> Result<Vec<Vec<u8>>> {
        let deadline = Instant::now() + self.router.timeout() * ADOPT_TIMEOUTS;
        let pattern = format!("{}*", self.name_prefix);
        let mut adoption = Adoption {
            found: Vec::new(),
            deadline,
            budget: self.adopt_budget,
        };
        let holders = self.key_holders(deadline)?;
        let mut failed = Vec::new();
        let mut stopped = None;
        for holder in &holders {
            stopped = adoption.stop();
            if stopped.is_some() {
                break;
            }
            match self.scan_holder(holder, &pattern, &mut adoption) {
                Ok(()) => {}
                // A request cut short by the adoption's own deadline.
                Err(_) if Instant::now() >= deadline => {}
                Err(e) => failed.push(format!("{}:{}: {}", holder.host, holder.port, e.message())),
            }
        }
        stopped = stopped.or_else(|| adoption.stop());
        // A master down at open (its slots fail on their own deadline) keeps
        // its keys unadopted; a cluster none of whose masters answer fails.
        if !holders.is_empty() && failed.len() == holders.len() {
            return Err(Error::new(
                ErrorKind::Io,
                format!("redis: adopting keys: {}", failed.join("; ")),
            ));
        }
        *self.adoption_stopped.lock() = stopped;
        Ok(adoption.found)
    }

    /// Adds the keys of this tier one server holds to `adoption`, walking
    /// them with SCAN (a key added or removed meanwhile may be seen or
    /// not, as SCAN promises) until the cursor returns to 0 or the
    /// adoption must stop.
    fn scan_holder(&self, holder: &Endpoint, pattern: &str, adoption: &mut Adoption) -> Result<()> {
        let mut walk = || -> io::Result<()> {
            let mut c = self.router.connect(holder, adoption.deadline)?;
            let mut cursor = b"0".to_vec();
            while adoption.stop().is_none() {
                let args: [&[u8]; 6] = [
                    b"SCAN",
                    &cursor,
                    b"MATCH",
                    pattern.as_bytes(),
                    b"COUNT",
                    SCAN_COUNT,
                ];
                c.cap_next(adoption.deadline);
                let reply = c.call(&args, MAP_REPLY)?;
                let (next, names) = match reply {
                    Value::Array(mut parts) if parts.len() == 2 => {
                        match (parts.remove(0), parts.remove(0)) {
                            (Value::BulkString(next), Value::Array(names)) if is_cursor(&next) => {
                                (next, names)
                            }
                            _ => return Err(unexpected("SCAN", &Value::Nil)),
                        }
                    }
                    Value::Error(message) => return Err(io::Error::other(message)),
                    other => return Err(unexpected("SCAN", &other)),
                };
                let names = names.into_iter().filter_map(|name| match name {
                    Value::BulkString(name) => Some(name),
                    _ => None,
                });
                self.adopt_names(&mut c, names, adoption)?;
                if next == b"0" {
                    return Ok(());
                }
                cursor = next;
            }
            Ok(())
        };
        walk().map_err(|e| io_error("adopting keys", &e))
    }

    /// Adds the keys the names of one SCAN step stand for to `adoption`,
    /// for the names this tier writes: a short key's name spells it; a
    /// sealed or hashed name's record or header (read with GETRANGE, a
    /// pipeline of them at a time) says which key. Other names are passed
    /// over unread.
    fn adopt_names(
        &self,
        c: &mut RespConn,
        names: impl Iterator<Item = Vec<u8>>,
        adoption: &mut Adoption,
    ) -> io::Result<()> {
        let mut to_read: Vec<Vec<u8>> = Vec::new();
        for name in names {
            if adoption.found.len() + to_read.len() >= adoption.budget {
                break;
            }
            if self.sealed().is_some() {
                if sealed::is_sealed_name(&self.name_prefix, &name) {
                    to_read.push(name);
                }
            } else if let Some(key) = format::key_from_name(&self.name_prefix, &name) {
                adoption.found.push(key);
            } else if format::is_hashed_name(&self.name_prefix, &name) {
                to_read.push(name);
            }
            if to_read.len() == GETRANGE_PIPELINE {
                self.adopt_read(c, &to_read, adoption)?;
                to_read.clear();
            }
        }
        self.adopt_read(c, &to_read, adoption)
    }

    /// Reads the record or header of each of `names` (one pipeline of
    /// GETRANGEs) and adopts the key it holds, if it is this tier's block
    /// under its own name.
    fn adopt_read(
        &self,
        c: &mut RespConn,
        names: &[Vec<u8>],
        adoption: &mut Adoption,
    ) -> io::Result<()> {
        if names.is_empty() {
            return Ok(());
        }
        let last = match self.sealed() {
            Some(_) => RECORD_LEN - 1,
            None => format::header_len(crate::MAX_KEY_LEN) - 1,
        }
        .to_string();
        let commands: Vec<[&[u8]; 4]> = names
            .iter()
            .map(|name| [b"GETRANGE", name.as_slice(), b"0", last.as_bytes()])
            .collect();
        let commands: Vec<&[&[u8]]> = commands.iter().map(|c| c.as_slice()).collect();
        c.cap_next(adoption.deadline);
        let replies = c.call_many(&commands, SMALL_REPLY)?;
        for (name, reply) in names.iter().zip(replies) {
            // Another type under the name, or gone since the SCAN: not a
            // block to adopt.
            let Value::BulkString(head) = reply else {
                continue;
            };
            let (key, nonce) = match self.sealed() {
                Some(seal) => match seal.open_key(self.namespace_fp, self.block_bytes, &head) {
                    Some((key, nonce)) => (key, Some(nonce)),
                    None => continue,
                },
                None => match format::read_header(&head) {
                    Ok(h) => (h.key.to_vec(), None),
                    Err(_) => continue,
                },
            };
            if self.name(&key).as_bytes() != name.as_slice() {
                continue;
            }
            if let Some(nonce) = nonce {
                self.ledger.record(&key, nonce);
            }
            adoption.found.push(key);
        }
        Ok(())
    }
}

/// Whether a SCAN reply's cursor is one: decimal digits, a u64's worth.
fn is_cursor(cursor: &[u8]) -> bool {
    (1..=20).contains(&cursor.len()) && cursor.iter().all(u8::is_ascii_digit)
}

#[cfg(test)]
mod tests {
    use super::masters_of;

    #[test]
    fn live_masters_are_read_from_cluster_nodes() {
        let nodes = "\
a1 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-5460
b2 127.0.0.1:7001@17001 master,fail - 0 0 2 disconnected
c3 127.0.0.1:7002@17002 slave a1 0 0 1 connected
d4 10.0.0.5:7003@17003,host.example master - 0 0 3 connected 5461-16383
";
        assert_eq!(
            masters_of(nodes),
            vec![("127.0.0.1".into(), 7000), ("10.0.0.5".into(), 7003)]
        );
    }
}
