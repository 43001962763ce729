//! A shared keyspace's clear generation: the value of the key
//! `<prefix>:<namespace fingerprint>:generation:b<block_bytes>` (a sealed
//! tenant's: `generation-<tag>`), which every tier of the namespace (and
//! tenant) reads (see `Probes` in `backend::capabilities`). Block names and
//! headers carry the fingerprint of the tenant's generation they were
//! stored in, so after a clear a block of an older one is never even asked
//! for; the clearing tier deletes those it finds (SCAN, every master).

use super::client::{call_each, Endpoint, Problem, Value, MAP_REPLY, SMALL_REPLY};
use super::{Naming, RedisBackend};
use crate::backend::checksum::generation_fingerprint;
use crate::error::{Error, ErrorKind, Result};
use std::sync::Arc;
use std::time::Instant;

/// Older generations a sweep looks for: each clear sweeps the one before
/// it, so older ones hold only what a clear could not reach in its time.
pub(super) const SWEPT_GENERATIONS: u64 = 16;

/// Names asked for per SCAN step of a sweep.
const SCAN_COUNT: &[u8] = b"1000";

/// Most SCAN steps a sweep takes on one server, however the server answers.
const MAX_SCAN_STEPS: usize = 1 << 20;

impl RedisBackend {
    /// The key names and fingerprint of `generation`.
    pub(super) fn naming_of(&self, generation: u64) -> Naming {
        let fp = generation_fingerprint(self.namespace_fp, self.tenant.number, generation);
        Naming {
            prefix: Arc::from(format!(
                "{}:{fp:016x}:b{}:",
                self.key_prefix, self.block_bytes
            )),
            fp,
            generation,
        }
    }

    fn generation_name(&self) -> String {
        format!(
            "{}:{:016x}:generation{}:b{}",
            self.key_prefix, self.namespace_fp, self.tenant.mark, self.block_bytes
        )
    }

    /// One command on the generation's key, through the router (MOVED and
    /// ASK followed, within one deadline); a refusal is `Value::Error`.
    fn generation_reply(&self, command: &'static str) -> Result<Value> {
        let name = self.generation_name();
        call_each(
            &self.router,
            command,
            &[name.as_bytes()],
            SMALL_REPLY,
            self.job_deadline(),
            |name| vec![command.as_bytes(), name],
        )
        .pop()
        .expect("one command, one reply")
    }

    /// [`Self::generation_reply`], a refusal an error.
    fn generation_call(&self, command: &'static str) -> Result<Value> {
        match self.generation_reply(command)? {
            Value::Error(message) => Err(self.generation_refused(command, &message)),
            value => Ok(value),
        }
    }

    fn generation_refused(&self, command: &str, message: &str) -> Error {
        let name = self.generation_name();
        Error::new(ErrorKind::Io, format!("redis: {command} {name}: {message}"))
    }

    pub(super) fn read_generation_key(&self) -> Result<u64> {
        let corrupt = |what: &str| {
            Error::new(
                ErrorKind::Corrupt,
                format!(
                    "redis: {} holds {what}, not a generation (the next clear() replaces it)",
                    self.generation_name()
                ),
            )
        };
        match self.generation_call("GET")? {
            Value::Nil => Ok(0),
            Value::BulkString(text) => std::str::from_utf8(&text)
                .ok()
                .and_then(|t| t.parse().ok())
                .ok_or_else(|| corrupt("other bytes")),
            other => Err(corrupt(&format!("{other:?}"))),
        }
    }

    /// INCR is atomic on the server: two tiers clearing at once each get a
    /// generation of their own. A value INCR cannot raise (damaged) is
    /// replaced by one past this tier's.
    pub(super) fn advance_generation_key(&self) -> Result<u64> {
        let raised = match self.generation_reply("INCR")? {
            Value::Int(n) if n > 0 => Some(n as u64),
            Value::Error(message) => match Problem::of(&message) {
                Problem::NotAnInteger | Problem::WrongType => None,
                _ => return Err(self.generation_refused("INCR", &message)),
            },
            _ => None,
        };
        let current = self.naming().generation;
        let next = match raised {
            Some(n) if n > current => n,
            _ => {
                let next = current + 1;
                let name = self.generation_name();
                let text = next.to_string();
                call_each(
                    &self.router,
                    "SET",
                    &[name.as_bytes()],
                    SMALL_REPLY,
                    self.job_deadline(),
                    |name| vec![b"SET", name, text.as_bytes()],
                )
                .pop()
                .expect("one command, one reply")?;
                next
            }
        };
        self.set_naming(self.naming_of(next));
        Ok(next)
    }

    /// Deletes the blocks of the generations before `generation` (up to
    /// [`SWEPT_GENERATIONS`] of them) on every server holding keys, until
    /// `deadline`; how many.
    pub(super) fn sweep_generations(&self, generation: u64, deadline: Instant) -> Result<u64> {
        let patterns: Vec<String> = (generation.saturating_sub(SWEPT_GENERATIONS)..generation)
            .map(|g| format!("{}*", self.naming_of(g).prefix))
            .collect();
        let mut removed = 0;
        let mut failed = Vec::new();
        for holder in self.key_holders(deadline)? {
            for pattern in &patterns {
                match self.sweep_holder(&holder, pattern, deadline) {
                    Ok(n) => removed += n,
                    Err(e) => failed.push(format!("{}:{}: {e}", holder.host, holder.port)),
                }
            }
        }
        if failed.is_empty() {
            Ok(removed)
        } else {
            Err(Error::new(
                ErrorKind::Io,
                format!(
                    "redis: clear deleted {removed} blocks of earlier generations, not all: {}",
                    failed.join("; ")
                ),
            ))
        }
    }

    /// SCAN and UNLINK on one server; a cluster node's names are unlinked
    /// one per command (they may be in different slots).
    fn sweep_holder(
        &self,
        holder: &Endpoint,
        pattern: &str,
        deadline: Instant,
    ) -> std::io::Result<u64> {
        let mut c = self.router.connect(holder, deadline)?;
        let mut cursor = b"0".to_vec();
        let mut removed = 0;
        for _ in 0..MAX_SCAN_STEPS {
            if Instant::now() >= deadline {
                return Ok(removed);
            }
            let args: [&[u8]; 6] = [
                b"SCAN",
                &cursor,
                b"MATCH",
                pattern.as_bytes(),
                b"COUNT",
                SCAN_COUNT,
            ];
            let (next, names) = match c.call(&args, MAP_REPLY)? {
                Value::Array(mut parts) if parts.len() == 2 => {
                    match (parts.remove(0), parts.remove(0)) {
                        (Value::BulkString(next), Value::Array(names)) => (next, names),
                        _ => return Err(std::io::Error::other("SCAN answered another shape")),
                    }
                }
                Value::Error(message) => return Err(std::io::Error::other(message)),
                other => return Err(std::io::Error::other(format!("SCAN answered {other:?}"))),
            };
            let names: Vec<Vec<u8>> = names
                .into_iter()
                .filter_map(|n| match n {
                    // Only names this sweep asked for: a server's answer
                    // decides nothing else's fate.
                    Value::BulkString(n)
                        if n.starts_with(&pattern.as_bytes()[..pattern.len() - 1]) =>
                    {
                        Some(n)
                    }
                    _ => None,
                })
                .collect();
            if !names.is_empty() {
                // One UNLINK per name in a cluster (the names may be in
                // different slots), one for them all on a single server.
                let each: Vec<[&[u8]; 2]> = names.iter().map(|n| [&b"UNLINK"[..], n]).collect();
                let mut all: Vec<&[u8]> = vec![b"UNLINK"];
                all.extend(names.iter().map(Vec::as_slice));
                let commands: Vec<&[&[u8]]> = match self.router.is_cluster() {
                    true => each.iter().map(|c| &c[..]).collect(),
                    false => vec![&all[..]],
                };
                for reply in c.call_many(&commands, SMALL_REPLY)? {
                    if let Value::Int(n) = reply {
                        removed += n.max(0) as u64;
                    }
                }
            }
            if next == b"0" {
                return Ok(removed);
            }
            if next.is_empty() || next.len() > 20 || !next.iter().all(u8::is_ascii_digit) {
                return Err(std::io::Error::other(
                    "SCAN answered a cursor that is no number",
                ));
            }
            cursor = next;
        }
        Ok(removed)
    }
}

/// The block names of a generation never match the generation key's
/// pattern, nor the reverse (an owned tier's adoption scan skips it).
#[cfg(test)]
mod tests {
    #[test]
    fn the_generation_key_is_no_block_name() {
        let blocks = "kvtier:00000000000000ff:b4096:";
        let generation = "kvtier:00000000000000ff:generation:b4096";
        assert!(!generation.starts_with(blocks));
        assert!(
            crate::backend::redis::format::key_from_name(blocks, generation.as_bytes()).is_none()
        );
    }
}
