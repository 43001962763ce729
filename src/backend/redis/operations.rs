//! The `Backend` trait's operations on a Redis tier, and those of the
//! capabilities it has (batches, touches, discards, persistence, probes):
//! each has one path, the router's passes over the nodes (`routed`), for a
//! single server and a cluster alike.

use super::client::{call_each, Value};
use super::direct::get_ceiling;
use super::routed::KeyCommand;
use super::RedisBackend;
use crate::backend::{Backend, Batches, Discards, Persistence, Probes, Touches};
use crate::config::Sharing;
use crate::error::{Error, ErrorKind, Result};
use std::time::Instant;

/// Blocks per task of a store job that evicts nothing (standalone server;
/// see `min_growing_task_bytes`).
const FILLING_TASK_BLOCKS: usize = 2;

impl Batches for RedisBackend {
    /// One pipeline of SETs for the task's blocks (per node in a cluster),
    /// under the blocks' stripe locks.
    fn store_batch(
        &self,
        blocks: &[(u32, &[u8], &[u8])],
        done: &mut dyn FnMut(usize, Result<u64>),
    ) {
        let _guards = self.stripes.lock_all(blocks.iter().map(|&(_, key, _)| key));
        for (i, outcome) in self.store_routed(blocks).into_iter().enumerate() {
            done(i, outcome.map(|()| blocks[i].2.len() as u64));
        }
    }

    /// One pipeline of GETs for the task's blocks (per master in a
    /// cluster), each value verified in its row, reported in order until
    /// the first failure.
    fn load_batch(
        &self,
        blocks: &mut [(u32, &[u8], &mut [u8])],
        done: &mut dyn FnMut(usize, Result<()>) -> bool,
    ) {
        self.load_routed(blocks, done)
    }
}

impl Touches for RedisBackend {
    /// One pipeline of `TOUCH`es (on a single server up to 256 keys each;
    /// in a cluster one key each, a pipeline per master, so that a dead
    /// master costs only its own keys' touches), so that the server's LRU
    /// follows what the engines use.
    fn touch(&self, keys: &[u8], key_len: usize) {
        let keys: Vec<&[u8]> = keys.chunks_exact(key_len).collect();
        self.best_effort_routed(KeyCommand::Touch, &keys);
    }
}

impl Discards for RedisBackend {
    /// One pipeline of `DEL`s (on a single server up to 256 keys each; in a
    /// cluster one key each, a pipeline per node) for the released keys not
    /// stored again meanwhile, under their stripe locks, so that no store of
    /// the same key runs between the liveness check and the delete.
    fn discard(&self, released: &[(u32, Vec<u8>)], is_live: &dyn Fn(&[u8]) -> bool) {
        let _guards = self
            .stripes
            .lock_all(released.iter().map(|(_, key)| key.as_slice()));
        let dead: Vec<&[u8]> = released
            .iter()
            .map(|(_, key)| key.as_slice())
            .filter(|key| !is_live(key))
            .collect();
        if dead.is_empty() {
            return;
        }
        // Best effort: a block left behind is found again by the next
        // open's adoption scan or expires with `ttl_s`.
        self.best_effort_routed(KeyCommand::Del, &dead);
        for key in dead {
            self.ledger.forget(key);
        }
    }
}

impl Persistence for RedisBackend {
    fn recover(&self) -> Result<Vec<Vec<u8>>> {
        match self.sharing {
            Sharing::Owned => self.scan_keys(),
            // A shared keyspace is learnt key by key, by probes.
            Sharing::Shared => Ok(Vec::new()),
        }
    }
}

impl Probes for RedisBackend {
    fn read_generation(&self) -> Result<u64> {
        self.read_generation_key()
    }

    fn generation(&self) -> u64 {
        self.generation.load(std::sync::atomic::Ordering::Acquire)
    }

    fn use_generation(&self, generation: u64) {
        self.set_naming(self.naming_of(generation));
    }

    fn advance_generation(&self) -> Result<u64> {
        self.advance_generation_key()
    }

    fn sweep_before(
        &self,
        generation: u64,
        _began: std::time::SystemTime,
        deadline: std::time::Instant,
    ) -> Result<u64> {
        self.sweep_generations(generation, deadline)
    }

    fn probe(&self, key: &[u8], record: &mut dyn FnMut(bool)) {
        self.probe_many(&[key.to_vec()], &mut |_, found| record(found));
    }

    fn probes_in_batches(&self) -> bool {
        true
    }

    /// One pipeline of `EXISTS`, one per key (in a cluster one per master,
    /// so that a dead master costs only its own keys). Unknown (server
    /// unreachable) reads as absent: a MISS, not a wait.
    fn probe_many(&self, keys: &[Vec<u8>], record: &mut dyn FnMut(usize, bool)) {
        let keys: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
        self.probe_routed(&keys, record)
    }
}

impl RedisBackend {
    /// A GET into a private buffer by `deadline`, verified there before it
    /// is copied into `dst`: a value the direct path could not accept is
    /// read again this way before it is judged, within its job's deadline.
    /// Its reply may declare at most `direct::get_ceiling` bytes.
    pub(super) fn load_by(&self, key: &[u8], dst: &mut [u8], deadline: Instant) -> Result<()> {
        let name = self.name(key);
        let ceiling = get_ceiling(self.layout(&self.naming()).value_len(key));
        let reply = call_each(
            &self.router,
            "GET",
            &[name.as_bytes()],
            ceiling,
            deadline,
            |name| vec![b"GET", name],
        )
        .pop()
        .expect("one command, one reply")?;
        match reply {
            Value::BulkString(value) => self.check_value(&name, Some(value), key, dst, deadline),
            Value::Nil => self.check_value(&name, None, key, dst, deadline),
            Value::Error(message) => Err(self.get_refused(&name, &message, deadline)),
            other => Err(Error::new(
                ErrorKind::Io,
                format!("redis: GET {name}: answered {other:?}"),
            )),
        }
    }
}

impl Backend for RedisBackend {
    fn store(&self, slot: u32, key: &[u8], block: &[u8]) -> Result<u64> {
        let _guard = self.stripes.of(key).lock();
        let outcome = self.store_routed(&[(slot, key, block)]).pop();
        outcome.expect("one block, one outcome")?;
        Ok(block.len() as u64)
    }

    fn stores_extents(&self) -> bool {
        // A sealed record's layout is fixed to the block size.
        self.seal.is_none()
    }

    fn seals(&self) -> bool {
        self.seal.is_some()
    }

    /// A GET into a private buffer, verified there before it is copied
    /// into `dst` (see `load_by`).
    fn load(&self, _slot: u32, key: &[u8], dst: &mut [u8]) -> Result<()> {
        self.load_by(key, dst, self.job_deadline())
    }

    fn batches(&self) -> Option<&dyn Batches> {
        Some(self)
    }

    fn touches(&self) -> Option<&dyn Touches> {
        Some(self)
    }

    fn discards(&self) -> Option<&dyn Discards> {
        (self.sharing == Sharing::Owned).then_some(self)
    }

    fn persistence(&self) -> Option<&dyn Persistence> {
        Some(self)
    }

    fn probes(&self) -> Option<&dyn Probes> {
        (self.sharing == Sharing::Shared).then_some(self)
    }

    fn min_task_bytes(&self) -> usize {
        // A job is one task: its blocks travel in one pipeline.
        usize::MAX
    }

    /// Tasks of two blocks, each its own pipeline on its own connection,
    /// while the tier fills up. Every value is then new memory the server
    /// faults in, and it takes such values faster from several connections
    /// a value or two deep than from one deep pipeline. Once every store
    /// evicts, the server reuses the memory its DELs free, per-request costs
    /// dominate, and one pipeline per job costs it less (`kvtier-bench
    /// --backend redis --repeat 3`; docs/runs/redis.md, "The bound's
    /// shape"). A cluster job is spread over its masters already.
    fn min_growing_task_bytes(&self) -> usize {
        if self.router.is_cluster() {
            usize::MAX
        } else {
            FILLING_TASK_BLOCKS * self.block_bytes
        }
    }

    fn counters(&self) -> Vec<(&'static str, &'static str, u64)> {
        let c = self.router.counts();
        vec![
            (
                "kvtier_redis_reconnects_total",
                "Connections to a Redis node opened in place of ones dropped broken.",
                c.reconnects,
            ),
            (
                "kvtier_redis_connections_dropped_total",
                "Connections to a Redis node dropped broken (a failed request, closed by the server, out of step).",
                c.dropped,
            ),
            (
                "kvtier_redis_connect_failures_total",
                "Attempts to connect to a Redis node that failed (reconnection backs off 25 ms to 1 s).",
                c.connect_failures,
            ),
            (
                "kvtier_redis_moved_total",
                "Blocks a cluster node answered with MOVED (sent again to the node named, the slot map read again).",
                c.moved,
            ),
            (
                "kvtier_redis_ask_total",
                "Blocks a cluster node answered with ASK (sent again behind ASKING to the node named).",
                c.asked,
            ),
            (
                "kvtier_redis_rerouted_blocks_total",
                "Blocks sent again after a redirection (MOVED, ASK, TRYAGAIN, CLUSTERDOWN) or for want of a known master.",
                c.rerouted,
            ),
            (
                "kvtier_redis_slot_map_reads_total",
                "Times the cluster's slot map was read again (after MOVED or a failed node, at most every 250 ms).",
                c.slot_map_reads,
            ),
        ]
    }

    fn describe(&self) -> String {
        let adoption = match &*self.adoption_stopped.lock() {
            Some(why) => format!("; adoption at open stopped early: {why}"),
            None => String::new(),
        };
        format!(
            "redis: {} ({}, sharing={}, keys {}*, ttl_s={}, {} connections{}{adoption})",
            self.shown_seeds,
            match self.router.is_cluster() {
                true => format!("cluster, {}", self.router.describe()),
                false => "single server".to_string(),
            },
            match self.sharing {
                Sharing::Owned => "owned",
                Sharing::Shared => "shared",
            },
            self.name_prefix,
            self.ttl_s,
            self.connections,
            if self.seal.is_some() { ", sealed" } else { "" }
        )
    }
}
