//! Building a tier: validates the geometry, opens the backend, rebuilds the
//! index from what storage already holds (disk), and starts the workers.

use super::completion::Completions;
use super::jobs::{Crew, WorkQueue};
use super::probes::MAX_PROBE_MEMORY;
use super::shared::Lease;
use super::shared::{Shared, State};
use super::Tier;
use crate::backend::{disk::DiskBackend, memory::MemoryBackend, persist::PersistentArena, Backend};
use crate::config::{BackendKind, TierConfig};
use crate::error::{bail, ErrorKind, Result};
use crate::events::StoredReason;
use crate::fork;
use crate::index::{Admitted, Index};
use crate::key::KeyHasher;
use crate::metrics::JobMetrics;
use crate::primary::PrimaryBuffer;
use crate::seal::Sealer;
use crate::stats::Counters;
use crate::sync::Mutex;
use crate::workers::Pool;
use hashlink::LruCache;
use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

impl Tier {
    pub(super) fn build(config: &TierConfig, primary: PrimaryBuffer, spawn: bool) -> Result<Tier> {
        let fork_generation = fork::register()?;
        let block_bytes = primary.block_bytes();
        let blocks = config.capacity_bytes / block_bytes as u64;
        if blocks == 0 {
            bail!(
                Config,
                "capacity_bytes: {} holds no whole block of {block_bytes} bytes",
                config.capacity_bytes
            );
        }
        if blocks >= u32::MAX as u64 {
            bail!(
                Config,
                "capacity_bytes: {blocks} blocks exceed the limit of {}",
                u32::MAX - 1
            );
        }
        check_shared_identity(config)?;
        check_persist_path(config)?;
        let sealer = config.seal.as_ref().map(Sealer::new);
        let prefault = config.resolved_prefault()?;
        let backend: Box<dyn Backend> = match config.backend {
            // An arena inside this process is out of other tenants' reach.
            BackendKind::Memory if sealer.is_some() => bail!(
                Config,
                "seal_key: the memory backend keeps blocks inside this process; \
                 sealing is for shared storage (disk, redis)"
            ),
            BackendKind::Memory => match &config.persist_path {
                Some(dir) => Box::new(PersistentArena::open(
                    dir,
                    &config.namespace,
                    block_bytes,
                    blocks as usize,
                    prefault,
                )?),
                None => Box::new(MemoryBackend::new(block_bytes, blocks as usize, prefault)?),
            },
            BackendKind::Disk => Box::new(DiskBackend::open(
                &config.disk,
                &config.namespace,
                block_bytes,
                blocks as usize,
                sealer,
            )?),
            #[cfg(feature = "redis-backend")]
            BackendKind::Redis => Box::new(crate::backend::redis::RedisBackend::open(
                &config.redis,
                &config.namespace,
                block_bytes,
                config.resolved_io_threads(),
                sealer,
                config.resolved_io_timeout_ms(),
                blocks as usize,
            )?),
            #[cfg(not(feature = "redis-backend"))]
            BackendKind::Redis => bail!(
                Config,
                "backend: this build of kvtier has no redis backend (feature redis-backend)"
            ),
        };
        let io_threads = if spawn {
            config.resolved_io_threads()
        } else {
            1
        };
        let mut index = Index::new(blocks as u32, KeyHasher::random());
        if backend.discards().is_some() {
            index.track_releases();
        }
        if config.events {
            // Before recovery: the blocks storage already holds are announced
            // like any other.
            index.enable_events(config.events_capacity)?;
        }
        let lease = Lease::new(Duration::from_millis(config.probe_ttl_ms as u64));
        if let Some(probes) = backend.probes() {
            // Storage's clear generation now: a tier that cannot read it
            // would name and check blocks by a guess. A Redis server out of
            // reach (a cluster's master down, holding the generation's slot)
            // does not stop the open: the lease starts ended, so the tier
            // answers no HIT and copies no block until a worker has read it.
            let asked = std::time::Instant::now();
            match probes.read_generation() {
                Ok(generation) => {
                    probes.use_generation(generation);
                    lease.renew(asked);
                }
                Err(e) if e.kind() == ErrorKind::Io && config.backend == BackendKind::Redis => {}
                Err(e) => return Err(e),
            }
        }
        let mut evicted_at_open = 0;
        let mut victims = Vec::new();
        let recovered = match backend.persistence() {
            Some(storage) => storage.recover()?,
            None => Vec::new(),
        };
        for (i, key) in recovered.iter().enumerate() {
            // Oldest first, so when storage holds more than the capacity the
            // oldest blocks are the ones evicted again.
            if let Admitted::Added { evicted, slot } =
                index.admit_found(key, &mut victims, StoredReason::Recovered)
            {
                evicted_at_open += u64::from(evicted);
                if let Some(storage) = backend.persistence() {
                    storage.recovered_at(i, slot);
                }
            }
        }
        let released_at_open = index.take_released();
        // An explicit value always wins over the backend's own choice.
        let auto = config
            .io_timeout_ms
            .is_none()
            .then(|| backend.watched_io()?.auto_io_timeout())
            .flatten();
        let timeout_ms = auto
            .as_ref()
            .map_or_else(|| config.resolved_io_timeout_ms(), |&(ms, _)| ms);
        let deadline = (spawn && timeout_ms > 0 && backend.watched_io().is_some())
            .then(|| Duration::from_millis(timeout_ms as u64));
        let shared = Arc::new(Shared {
            primary,
            backend,
            state: Mutex::new(State {
                index,
                waiting: HashMap::new(),
                waiters: HashMap::new(),
                next_wait_id: 0,
                probes: LruCache::new(MAX_PROBE_MEMORY),
                load_failures: HashMap::new(),
                victims: Vec::new(),
                user_pins: HashMap::new(),
            }),
            queue: WorkQueue::new(),
            crew: Crew::new(if spawn { io_threads } else { 0 }, deadline),
            done: Completions::default(),
            counters: Counters::default(),
            metrics: JobMetrics::default(),
            backend_name: config.backend.name(),
            namespace: config.namespace.clone(),
            io_threads,
            io_timeout_auto: auto.map(|(_, why)| why),
            probe_ttl: Duration::from_millis(config.probe_ttl_ms as u64),
            lease,
            dropped_unreadable: AtomicBool::new(false),
        });
        Counters::add(&shared.counters.evictions, evicted_at_open);
        shared.discard(released_at_open);
        let tier = Tier {
            shared,
            fork_generation,
            owner_pid: fork::pid(),
        };
        if spawn {
            let spin = Duration::from_micros(config.idle_spin_us as u64);
            // On failure, dropping `tier` joins the threads started so far.
            Pool::start(&tier.shared, spin)?;
        }
        Ok(tier)
    }
}

/// `persist_path` is the memory backend's, and keeps one process's arena:
/// its slots are handed out by that process's index, so a second writer
/// would overwrite blocks the first one's index still lists.
fn check_persist_path(config: &TierConfig) -> Result<()> {
    if config.persist_path.is_none() {
        return Ok(());
    }
    if config.backend != BackendKind::Memory {
        bail!(
            Config,
            "persist_path: keeps the memory backend's arena in a file; backend {} keeps \
             its blocks elsewhere (disk: \"path\")",
            config.backend.name()
        );
    }
    if config.disk.shared {
        bail!(
            Config,
            "shared: a persistent memory arena is written by one process at a time (its \
             slots are handed out by that process's index); to share blocks between \
             processes use backend=disk with shared=true on a tmpfs directory"
        );
    }
    Ok(())
}

/// Shared storage serves blocks to whoever names their keys, so it must know
/// what they mean: a namespace naming the model and its layout, which blocks
/// of another never match (`docs/sharing.md`).
fn check_shared_identity(config: &TierConfig) -> Result<()> {
    let shared = match config.backend {
        BackendKind::Disk => config.disk.shared.then_some("shared=true"),
        BackendKind::Redis => {
            (config.redis.sharing == crate::config::Sharing::Shared).then_some("sharing=shared")
        }
        BackendKind::Memory => None,
    };
    match shared {
        Some(mode) if config.namespace.trim().is_empty() => bail!(
            Config,
            "namespace: {mode} storage needs a namespace naming what its blocks mean (model, \
             dtype, tokens per block, parallel layout; e.g. \"llama-3-8b/bf16/t16/tp1\"), so \
             that engines of another model never load them; the vLLM and SGLang adapters \
             derive one from the engine's config (docs/sharing.md)"
        ),
        _ => Ok(()),
    }
}
