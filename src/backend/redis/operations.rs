//! The `Backend` trait's operations on a Redis tier, and those of the
//! capabilities it has (batches, touches, discards, persistence, probes),
//! each choosing its path: kvtier's direct pipelines on a single server (`direct`), a
//! cluster's routed pipelines (`routed`), or the crate (`by_crate`).

use super::by_crate::{is_wrong_type, pipelined, ValueArg};
use super::client::conn::Conn;
use super::routed::KeyCommand;
use super::{direct, server_error, RedisBackend};
use crate::backend::{Backend, Batches, Discards, Persistence, Probes, Touches};
use crate::config::Sharing;
use crate::error::Result;

/// Blocks per task of a store job that evicts nothing (standalone server;
/// see `min_growing_task_bytes`).
const FILLING_TASK_BLOCKS: usize = 2;

impl Batches for RedisBackend {
    /// One pipeline of SETs for the task's blocks (per node in a cluster),
    /// under the blocks' stripe locks. A failed pipeline fails all of them.
    fn store_batch(
        &self,
        blocks: &[(u32, &[u8], &[u8])],
        done: &mut dyn FnMut(usize, Result<u64>),
    ) {
        let _guards = self.stripes.lock_all(blocks.iter().map(|&(_, key, _)| key));
        if let Some(router) = &self.router {
            return self.store_routed(router, blocks, done);
        }
        let sent = self.pool.with_conn("SET pipeline", |conn| {
            if let Conn::Direct(c) = conn {
                let mut replies = Vec::with_capacity(blocks.len());
                direct::set_pipeline(c, &self.layout(), blocks, &mut replies)?;
                return Ok(replies
                    .into_iter()
                    .map(|r| r.map_err(|m| server_error("SET", &m)))
                    .collect::<Vec<_>>());
            }
            self.store_by_crate(conn, blocks)
        });
        for i in 0..blocks.len() {
            done(
                i,
                match &sent {
                    Ok(replies) => match &replies[i] {
                        Ok(()) => Ok(self.block_bytes as u64),
                        Err(e) => Err(e.clone()),
                    },
                    Err(e) => Err(e.clone()),
                },
            );
        }
    }

    /// One pipeline of GETs for the task's blocks (per master in a
    /// cluster), then each value verified (in its row on the direct path,
    /// else copied into it once verified), reported in order until the first
    /// failure.
    fn load_batch(
        &self,
        blocks: &mut [(u32, &[u8], &mut [u8])],
        done: &mut dyn FnMut(usize, Result<()>) -> bool,
    ) {
        if let Some(router) = &self.router {
            return self.load_routed(router, blocks, done);
        }
        let mut fetched = Vec::with_capacity(blocks.len());
        let direct = self.pool.with_conn("GET pipeline", |conn| match conn {
            Conn::Direct(c) => {
                direct::get_pipeline(c, &self.layout(), blocks, &mut fetched)?;
                Ok(true)
            }
            _ => Ok(false),
        });
        match direct {
            Ok(true) => self.report_fetched(blocks, fetched, done),
            Ok(false) => self.load_batch_by_crate(blocks, done),
            Err(e) => {
                done(0, Err(e));
            }
        }
    }
}

impl Touches for RedisBackend {
    /// One pipeline of `TOUCH`es (on a single server up to 256 keys each;
    /// in a cluster one key each, a pipeline per master, so that a dead
    /// master costs only its own keys' touches), so that the server's LRU
    /// follows what the engines use.
    fn touch(&self, keys: &[u8], key_len: usize) {
        let keys: Vec<&[u8]> = keys.chunks_exact(key_len).collect();
        if let Some(router) = &self.router {
            return self.best_effort_routed(router, KeyCommand::Touch, &keys);
        }
        let _ = self.pool.with_conn("TOUCH pipeline", |conn| {
            if let Conn::Direct(c) = conn {
                direct::variadic_pipeline(c, &self.layout(), "TOUCH", &keys)?;
                return Ok(());
            }
            self.keys_by_crate(conn, "TOUCH", &keys)
        });
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
        // Best effort, like a single DEL: a block left behind is found again
        // by the next open's adoption scan or expires with `ttl_s`.
        match &self.router {
            Some(router) => self.best_effort_routed(router, KeyCommand::Del, &dead),
            None => {
                let _ = self.pool.with_conn("DEL pipeline", |conn| {
                    if let Conn::Direct(c) = conn {
                        // A server's refusal of one DEL leaves its keys, as
                        // the crate's pipeline does.
                        direct::variadic_pipeline(c, &self.layout(), "DEL", &dead)?;
                        return Ok(());
                    }
                    self.keys_by_crate(conn, "DEL", &dead)
                });
            }
        }
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
    fn probe(&self, key: &[u8], record: &mut dyn FnMut(bool)) {
        self.probe_many(&[key.to_vec()], &mut |_, found| record(found));
    }

    fn probes_in_batches(&self) -> bool {
        true
    }

    /// One pipeline of `EXISTS`, one per key (in a cluster one per master,
    /// kvtier's own, so that a dead master costs only its own keys).
    fn probe_many(&self, keys: &[Vec<u8>], record: &mut dyn FnMut(usize, bool)) {
        if let Some(router) = &self.router {
            let keys: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
            return self.probe_routed(router, &keys, record);
        }
        let exists = |i: usize| redis::cmd("EXISTS").arg(self.name(&keys[i])).take();
        // Unknown (server unreachable) reads as absent: a MISS, not a wait.
        let counts = self
            .pool
            .with_conn("EXISTS pipeline", |conn| {
                pipelined::<i64>(conn, keys.len(), exists)
            })
            .ok()
            .filter(|counts| counts.len() == keys.len());
        for i in 0..keys.len() {
            let found = counts
                .as_ref()
                .is_some_and(|c| c[i].as_ref().is_ok_and(|&n| n > 0));
            record(i, found);
        }
    }
}

impl Backend for RedisBackend {
    fn store(&self, _slot: u32, key: &[u8], block: &[u8]) -> Result<u64> {
        let value = self.value_arg(key, block)?;
        let cmd = self.set_command(key, &value);
        let _guard = self.stripes.of(key).lock();
        self.pool.with("SET", |c| cmd.query::<()>(c))?;
        if let ValueArg::Sealed(_, nonce) = value {
            self.ledger.record(key, nonce);
        }
        Ok(self.block_bytes as u64)
    }

    fn load(&self, _slot: u32, key: &[u8], dst: &mut [u8]) -> Result<()> {
        let name = self.name(key);
        let value = self.pool.with("GET", |c| {
            match redis::cmd("GET").arg(&name).query::<Option<Vec<u8>>>(c) {
                Err(e) if is_wrong_type(&e) => Ok(Err(e)),
                other => other.map(Ok),
            }
        })?;
        match value {
            Ok(value) => self.check_value(&name, value, key, dst),
            Err(e) => Err(self.get_failed(&name, &e)),
        }
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
        if self.router.is_some() {
            usize::MAX
        } else {
            FILLING_TASK_BLOCKS * self.block_bytes
        }
    }

    fn describe(&self) -> String {
        format!(
            "redis: {} ({}, sharing={}, keys {}*, ttl_s={}, {} connections{})",
            self.shown_seeds,
            match (&self.router, self.pool.is_cluster()) {
                (Some(router), _) => format!("cluster, {}", router.describe()),
                (None, true) => "cluster".to_string(),
                (None, false) => "single server".to_string(),
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
