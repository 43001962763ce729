//! Tier configuration: typed fields, plus the string `key = value` form the C API
//! and the bindings use; this file holds the types and what they resolve to,
//! `keys` the key table behind the string form, `parse` its value parsers.

mod keys;
mod parse;
#[cfg(test)]
mod tests;

pub use self::keys::{ConfigKey, CONFIG_KEYS, CONFIG_TABLE};
pub use self::parse::parse_size;

use crate::error::{bail, Result};
use crate::events::{DEFAULT_EVENTS_CAPACITY, MAX_EVENTS_CAPACITY};
use crate::seal::SealKey;
use std::path::PathBuf;

/// Where blocks live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendKind {
    /// An in-process arena of fixed-size slots (the default).
    Memory,
    /// One file per block under a directory: persistent, shareable.
    Disk,
    /// A Redis or Valkey server, or a Redis Cluster: one keyspace a fleet of
    /// engines can share.
    Redis,
}

impl BackendKind {
    /// The value accepted by the `backend` key.
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Memory => "memory",
            BackendKind::Disk => "disk",
            BackendKind::Redis => "redis",
        }
    }
}

/// Whether the disk backend bypasses the page cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DirectIo {
    /// Probe the directory; use O_DIRECT if it works, else buffered I/O.
    Auto,
    /// Require O_DIRECT (`tier_new` fails if the file system refuses it).
    On,
    /// Buffered I/O through the page cache.
    Off,
}

/// Where the disk backend keeps each block file's header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockHeader {
    /// In an extended attribute where the file system keeps them and is
    /// local; in the file otherwise.
    Auto,
    /// In an extended attribute (`tier_new` fails if the file system
    /// refuses them).
    Xattr,
    /// In the file's first 4096 bytes.
    File,
}

/// What the disk backend makes durable before a block becomes visible.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyncMode {
    /// Nothing: a block survives a process crash, not a power loss.
    None,
    /// The file's data (and then its directory entry) is synced before the
    /// block is published: it survives a power loss.
    Data,
}

/// When the memory backend's arena becomes resident (see
/// `src/backend/prefault.rs` for the rule and the measurements behind it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Prefault {
    /// No resident memory until a store writes it: the first stores pay the
    /// page faults on the copy path.
    Off,
    /// A low-priority thread keeps a bounded window of arena ahead of the
    /// slots stored so far resident, from `tier_new` on, so stores find
    /// their pages ready; an idle tier holds at most that window.
    Background,
    /// A low-priority thread makes the whole capacity resident from
    /// `tier_new` on, as engines that preallocate pinned memory expect.
    Full,
}

impl Prefault {
    /// The value accepted by the `prefault` key.
    pub fn name(self) -> &'static str {
        match self {
            Prefault::Off => "off",
            Prefault::Background => "background",
            Prefault::Full => "full",
        }
    }
}

/// Whether the Redis backend talks to a Redis Cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClusterMode {
    /// Ask the first reachable seed (`INFO cluster`).
    Auto,
    /// A Redis Cluster: keys are routed by slot, redirections followed.
    On,
    /// One server.
    Off,
}

/// Who owns the blocks in the Redis keyspace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sharing {
    /// This tier owns its keys: its LRU evicts by deleting them and its
    /// capacity bounds them, as with memory and disk.
    Owned,
    /// Many tiers read and write one keyspace: keys absent from this tier's
    /// index are probed on the server; eviction here never deletes a block
    /// another writer may use (the server's own policy and `ttl_s` bound the
    /// total).
    Shared,
}

/// Redis backend options (used when `backend` is `redis`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RedisConfig {
    /// Seed URLs: `redis://[user[:password]@]host:port[/db]` (or `rediss://`).
    pub urls: Vec<String>,
    /// Cluster or single server.
    pub cluster: ClusterMode,
    /// Who owns the keys.
    pub sharing: Sharing,
    /// First part of every key name.
    pub key_prefix: String,
    /// Expiry of stored blocks in seconds (0: none).
    pub ttl_s: u64,
    /// Connections per server node (`None`: one per I/O thread).
    pub connections: Option<usize>,
}

impl Default for RedisConfig {
    fn default() -> RedisConfig {
        RedisConfig {
            urls: Vec::new(),
            cluster: ClusterMode::Auto,
            sharing: Sharing::Owned,
            key_prefix: "kvtier".into(),
            ttl_s: 0,
            connections: None,
        }
    }
}

/// Disk backend options (used when `backend` is `disk`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiskConfig {
    /// Root directory; created (owner-only) if missing, but not its parents.
    pub path: Option<PathBuf>,
    /// O_DIRECT policy.
    pub direct_io: DirectIo,
    /// Where block headers live.
    pub block_header: BlockHeader,
    /// Durability before publishing.
    pub sync: SyncMode,
    /// Several processes (or hosts) use the directory at once.
    pub shared: bool,
    /// Create all fan-out directories when the tier opens (once per
    /// directory), instead of each on the first store that needs it.
    pub prepare_dirs: bool,
}

impl Default for DiskConfig {
    fn default() -> DiskConfig {
        DiskConfig {
            path: None,
            direct_io: DirectIo::Auto,
            block_header: BlockHeader::Auto,
            sync: SyncMode::None,
            shared: false,
            prepare_dirs: false,
        }
    }
}

/// Largest accepted `io_timeout_ms`.
pub const MAX_IO_TIMEOUT_MS: u32 = 600_000;

/// I/O deadline of the disk backend on a file system that may hang
/// (`io_timeout_ms=auto` on network, cluster, FUSE or unknown file systems):
/// far above any healthy device's latency for one block (an HDD seeking
/// under load, an NFS server failing over), far below what an engine can
/// wait for a request.
pub const DEFAULT_DISK_IO_TIMEOUT_MS: u32 = 10_000;

/// Default I/O deadline of the Redis backend: a server round trip.
pub const DEFAULT_REDIS_IO_TIMEOUT_MS: u32 = 3_000;

/// Largest accepted worker count; more threads than this only add contention.
pub const MAX_IO_THREADS: usize = 256;

/// Default capacity when none is configured.
pub const DEFAULT_CAPACITY_BYTES: u64 = 1 << 30;

/// Configuration of a tier. Build it with [`TierConfig::default`] and
/// [`TierConfig::set`] (string form) or by assigning the fields.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TierConfig {
    /// Which backend stores the blocks.
    pub backend: BackendKind,
    /// Bytes of block data the tier may hold; rounded down to whole blocks.
    pub capacity_bytes: u64,
    /// Worker threads that copy blocks; `None` picks a default for the backend.
    pub io_threads: Option<usize>,
    /// How long an idle worker keeps polling for new work before it sleeps, in
    /// microseconds. Spinning hides the cost of waking a sleeping thread (several
    /// microseconds) from back-to-back small jobs; 0 sleeps at once.
    pub idle_spin_us: u32,
    /// Names the block layout (model, dtype, geometry…) in storage (disk,
    /// Redis): blocks of different namespaces or block sizes never mix.
    pub namespace: String,
    /// Shared storage (disk `shared=true`, Redis `sharing=shared`): how long a
    /// "not stored" answer for a key is reused before storage is asked
    /// again, in milliseconds.
    pub probe_ttl_ms: u32,
    /// Storage backends (disk, Redis): the deadline of one block's I/O, in
    /// milliseconds; past it the job fails with `Io` on time, whatever the
    /// device does. `None` (`auto`) takes the backend's default: for disk,
    /// chosen at open by the directory's file system (network, cluster,
    /// FUSE or unknown: [`DEFAULT_DISK_IO_TIMEOUT_MS`]; local or memory:
    /// none), for Redis [`DEFAULT_REDIS_IO_TIMEOUT_MS`]. 0 turns the
    /// disk's deadline off (Redis needs one).
    pub io_timeout_ms: Option<u32>,
    /// Disk backend options.
    pub disk: DiskConfig,
    /// Redis backend options.
    pub redis: RedisConfig,
    /// Record block events (STORED, REMOVED) for
    /// [`Tier::poll_events`](crate::Tier::poll_events).
    pub events: bool,
    /// Events held until polled; beyond it the oldest are dropped (and
    /// reported as lost). 1..=[`MAX_EVENTS_CAPACITY`].
    pub events_capacity: usize,
    /// Tenant seal key (disk, Redis): blocks are encrypted, authenticated and
    /// named by a keyed hash, so that only holders of this key can read, find
    /// or forge them. Never shown: its `Debug` is redacted.
    pub seal: Option<SealKey>,
    /// Memory backend: when its arena becomes resident; `None` picks the
    /// default ([`TierConfig::resolved_prefault`]).
    pub prefault: Option<Prefault>,
    /// Memory backend: a directory on tmpfs or hugetlbfs where the arena and
    /// its index live in a file per namespace, so that the next tier over the
    /// same directory and namespace (after a crash or a restart) finds the
    /// blocks; `None`: an anonymous arena that dies with the process.
    pub persist_path: Option<PathBuf>,
}

impl Default for TierConfig {
    fn default() -> TierConfig {
        TierConfig {
            backend: BackendKind::Memory,
            capacity_bytes: DEFAULT_CAPACITY_BYTES,
            io_threads: None,
            idle_spin_us: 50,
            namespace: String::new(),
            probe_ttl_ms: 1000,
            io_timeout_ms: None,
            disk: DiskConfig::default(),
            redis: RedisConfig::default(),
            events: false,
            events_capacity: DEFAULT_EVENTS_CAPACITY,
            seal: None,
            prefault: None,
            persist_path: None,
        }
    }
}

impl TierConfig {
    /// The I/O deadline this configuration resolves to, in milliseconds (0:
    /// none). The memory backend has none: it never waits on a device. For
    /// the disk backend with `auto` (unset) this is the deadline of a file
    /// system that may hang; the tier drops it at open on a local or memory
    /// file system ([`Tier::describe`](crate::Tier::describe) says which).
    pub fn resolved_io_timeout_ms(&self) -> u32 {
        match self.backend {
            BackendKind::Memory => 0,
            BackendKind::Disk => self.io_timeout_ms.unwrap_or(DEFAULT_DISK_IO_TIMEOUT_MS),
            BackendKind::Redis => self.io_timeout_ms.unwrap_or(DEFAULT_REDIS_IO_TIMEOUT_MS),
        }
    }

    /// The worker count this configuration resolves to.
    pub fn resolved_io_threads(&self) -> usize {
        self.io_threads.unwrap_or_else(|| match self.backend {
            BackendKind::Memory => {
                let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
                // Memory copies saturate the memory bus with few threads; more
                // only steal cores from the engine.
                cores.clamp(1, 4)
            }
            // Threads mostly wait on the device, one request each: the
            // thread count is the device's queue depth. Each also verifies
            // the row it read before taking the next, so more threads than
            // the device needs keep its queue full meanwhile
            // (python/bench/bench_disk_vs_fs.py; docs/performance.md, "The
            // disk tier through vLLM").
            // An idle thread costs a stack and no CPU (one spins at a time).
            BackendKind::Disk => 64,
            // Threads mostly wait on the network.
            BackendKind::Redis => 8,
        })
    }

    /// The arena policy this configuration resolves to: `background` for the
    /// memory backend unless set, `off` for the others (they have no arena).
    ///
    /// Fails with `Config` if `prefault` was set to anything but `off` for a
    /// backend without an arena: a setting that cannot take effect is a
    /// mistake worth hearing about, not a silent no-op.
    pub fn resolved_prefault(&self) -> Result<Prefault> {
        match (self.backend, self.prefault) {
            (BackendKind::Memory, p) => Ok(p.unwrap_or(Prefault::Background)),
            (_, None | Some(Prefault::Off)) => Ok(Prefault::Off),
            (backend, Some(p)) => bail!(
                Config,
                "prefault: {:?} applies to the memory backend only (backend is {:?}, which keeps no arena in memory)",
                p.name(),
                backend.name()
            ),
        }
    }
}
