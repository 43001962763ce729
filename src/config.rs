//! Tier configuration: typed fields, plus the string `key = value` form the C API
//! and the bindings use.

use crate::error::{bail, Result};
use crate::events::{DEFAULT_EVENTS_CAPACITY, MAX_EVENTS_CAPACITY};
use crate::seal::{KeyOrigin, SealKey};
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
        }
    }
}

/// The keys [`TierConfig::set`] accepts, for messages and documentation.
pub const CONFIG_KEYS: &[&str] = &[
    "backend",
    "capacity_bytes",
    "io_threads",
    "idle_spin_us",
    "path",
    "namespace",
    "o_direct",
    "block_header",
    "sync",
    "shared",
    "probe_ttl_ms",
    "prepare_dirs",
    "url",
    "cluster",
    "sharing",
    "key_prefix",
    "ttl_s",
    "io_timeout_ms",
    "connections",
    "events",
    "events_capacity",
    "seal_key",
    "seal_key_file",
    "prefault",
];

impl TierConfig {
    /// Sets one option from its string form, as `tier_config_set` does.
    ///
    /// Fails with [`ErrorKind::Config`](crate::ErrorKind::Config) on an unknown key or
    /// a value that does not parse; the configuration is then unchanged.
    pub fn set(&mut self, key: &str, value: &str) -> Result<()> {
        let value = value.trim();
        match key {
            "backend" => {
                self.backend = match value.to_ascii_lowercase().as_str() {
                    "memory" => BackendKind::Memory,
                    "disk" => BackendKind::Disk,
                    "redis" | "valkey" => BackendKind::Redis,
                    _ => bail!(
                        Config,
                        "backend: unknown backend {value:?} (expected \"memory\", \"disk\" or \"redis\")"
                    ),
                }
            }
            "capacity_bytes" => self.capacity_bytes = parse_size(value)?,
            "io_threads" => {
                let n = parse_uint(key, value)?;
                if n == 0 || n > MAX_IO_THREADS as u64 {
                    bail!(Config, "io_threads: {n} is outside 1..={MAX_IO_THREADS}");
                }
                self.io_threads = Some(n as usize);
            }
            "idle_spin_us" => {
                let n = parse_uint(key, value)?;
                if n > 1_000_000 {
                    bail!(Config, "idle_spin_us: {n} is above 1000000 (one second)");
                }
                self.idle_spin_us = n as u32;
            }
            "path" => {
                if value.is_empty() {
                    bail!(Config, "path: empty");
                }
                self.disk.path = Some(PathBuf::from(value));
            }
            "namespace" => {
                if value.len() > 4096 {
                    bail!(Config, "namespace: longer than 4096 bytes");
                }
                self.namespace = value.to_string();
            }
            "o_direct" => {
                self.disk.direct_io = match value.to_ascii_lowercase().as_str() {
                    "auto" => DirectIo::Auto,
                    "on" | "true" | "1" => DirectIo::On,
                    "off" | "false" | "0" => DirectIo::Off,
                    _ => bail!(Config, "o_direct: {value:?} is not auto, on or off"),
                }
            }
            "block_header" => {
                self.disk.block_header = match value.to_ascii_lowercase().as_str() {
                    "auto" => BlockHeader::Auto,
                    "xattr" => BlockHeader::Xattr,
                    "file" => BlockHeader::File,
                    _ => bail!(Config, "block_header: {value:?} is not auto, xattr or file"),
                }
            }
            "sync" => {
                self.disk.sync = match value.to_ascii_lowercase().as_str() {
                    "none" => SyncMode::None,
                    "data" => SyncMode::Data,
                    _ => bail!(Config, "sync: {value:?} is not none or data"),
                }
            }
            "shared" => self.disk.shared = parse_bool(key, value)?,
            "prepare_dirs" => self.disk.prepare_dirs = parse_bool(key, value)?,
            "probe_ttl_ms" => {
                let n = parse_uint(key, value)?;
                if n > 3_600_000 {
                    bail!(Config, "probe_ttl_ms: {n} is above 3600000 (one hour)");
                }
                self.probe_ttl_ms = n as u32;
            }
            "url" => {
                let urls: Vec<String> = value
                    .split(',')
                    .map(|u| u.trim().to_string())
                    .filter(|u| !u.is_empty())
                    .collect();
                if urls.is_empty() {
                    bail!(Config, "url: empty");
                }
                for url in &urls {
                    check_redis_url(url)?;
                }
                self.redis.urls = urls;
            }
            "cluster" => {
                self.redis.cluster = match value.to_ascii_lowercase().as_str() {
                    "auto" => ClusterMode::Auto,
                    "on" | "true" | "1" => ClusterMode::On,
                    "off" | "false" | "0" => ClusterMode::Off,
                    _ => bail!(Config, "cluster: {value:?} is not auto, on or off"),
                }
            }
            "sharing" => {
                self.redis.sharing = match value.to_ascii_lowercase().as_str() {
                    "owned" => Sharing::Owned,
                    "shared" => Sharing::Shared,
                    _ => bail!(Config, "sharing: {value:?} is not owned or shared"),
                }
            }
            "key_prefix" => {
                if value.is_empty() || value.len() > 64 || value.contains(['{', '}']) {
                    bail!(
                        Config,
                        "key_prefix: {value:?} must be 1 to 64 bytes without braces"
                    );
                }
                self.redis.key_prefix = value.to_string();
            }
            "ttl_s" => self.redis.ttl_s = parse_uint(key, value)?,
            "io_timeout_ms" if value.eq_ignore_ascii_case("auto") => self.io_timeout_ms = None,
            "io_timeout_ms" => {
                let Ok(n) = value.parse::<u64>() else {
                    bail!(
                        Config,
                        "io_timeout_ms: {value:?} is not auto or a number of milliseconds"
                    );
                };
                if n > MAX_IO_TIMEOUT_MS as u64 {
                    bail!(
                        Config,
                        "io_timeout_ms: {n} is above {MAX_IO_TIMEOUT_MS} (ten minutes)"
                    );
                }
                self.io_timeout_ms = Some(n as u32);
            }
            "connections" => {
                let n = parse_uint(key, value)?;
                if n == 0 || n > 1024 {
                    bail!(Config, "connections: {n} is outside 1..=1024");
                }
                self.redis.connections = Some(n as usize);
            }
            "events" => self.events = parse_bool(key, value)?,
            "events_capacity" => {
                let n = parse_uint(key, value)?;
                if n == 0 || n > MAX_EVENTS_CAPACITY as u64 {
                    bail!(
                        Config,
                        "events_capacity: {n} is outside 1..={MAX_EVENTS_CAPACITY}"
                    );
                }
                self.events_capacity = n as usize;
            }
            "seal_key" | "seal_key_file" => {
                let origin = if key == "seal_key" {
                    KeyOrigin::Inline
                } else {
                    KeyOrigin::File
                };
                if self.seal.as_ref().is_some_and(|k| k.origin != origin) {
                    bail!(
                        Config,
                        "{key}: seal_key and seal_key_file are both given; give one"
                    );
                }
                self.seal = Some(if origin == KeyOrigin::Inline {
                    SealKey::from_hex(key, value)?
                } else {
                    SealKey::from_file(std::path::Path::new(value))?
                });
            }
            "prefault" => {
                self.prefault = Some(match value.to_ascii_lowercase().as_str() {
                    "off" => Prefault::Off,
                    "background" => Prefault::Background,
                    "full" => Prefault::Full,
                    _ => bail!(
                        Config,
                        "prefault: {value:?} is not off, background or full"
                    ),
                })
            }
            _ => bail!(
                Config,
                "unknown configuration key {key:?} (known keys: {})",
                CONFIG_KEYS.join(", ")
            ),
        }
        Ok(())
    }

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
            // thread count is the device's queue depth. Small blocks need a
            // deep queue (python/bench/bench_disk_vs_fs.py, 64 KiB rows:
            // loads went from 0.67x vLLM's fs tier, which has 32 threads,
            // at 8 threads to 0.91x at 32; 2 MiB rows showed no difference).
            // An idle thread costs a stack and no CPU (one spins at a time).
            BackendKind::Disk => 32,
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

/// A Redis URL as `url` accepts it: a known scheme, a host, a port if any
/// that is a number. The message never repeats the URL (it may hold a
/// password).
fn check_redis_url(url: &str) -> Result<()> {
    let Some((scheme, rest)) = url.split_once("://") else {
        bail!(Config, "url: a seed is not of the form redis://host:port");
    };
    if !matches!(scheme, "redis" | "rediss" | "valkey" | "valkeys") {
        bail!(
            Config,
            "url: unknown scheme {scheme:?} (expected redis:// or rediss://)"
        );
    }
    let authority = rest.split('/').next().unwrap_or("");
    let host_port = authority.rsplit('@').next().unwrap_or("");
    let (host, port) = match host_port.rsplit_once(':') {
        Some((h, p)) => (h, Some(p)),
        None => (host_port, None),
    };
    if host.is_empty() {
        bail!(Config, "url: a seed has no host");
    }
    if let Some(port) = port {
        if port.parse::<u16>().is_err() {
            bail!(Config, "url: port {port:?} is not a number from 0 to 65535");
        }
    }
    Ok(())
}

fn parse_bool(key: &str, value: &str) -> Result<bool> {
    match value.to_ascii_lowercase().as_str() {
        "true" | "1" | "on" | "yes" => Ok(true),
        "false" | "0" | "off" | "no" => Ok(false),
        _ => bail!(Config, "{key}: {value:?} is not true or false"),
    }
}

fn parse_uint(key: &str, value: &str) -> Result<u64> {
    match value.parse::<u64>() {
        Ok(n) => Ok(n),
        Err(_) => bail!(Config, "{key}: {value:?} is not a non-negative integer"),
    }
}

/// Parses a byte size: a plain integer, or an integer (or decimal) followed by
/// `KiB`, `MiB`, `GiB` or `TiB` (case-insensitive, optional space).
pub fn parse_size(value: &str) -> Result<u64> {
    let value = value.trim();
    let split = value
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(value.len());
    let (number, suffix) = value.split_at(split);
    let multiplier: u64 = match suffix.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kib" => 1 << 10,
        "mib" => 1 << 20,
        "gib" => 1 << 30,
        "tib" => 1 << 40,
        _ => bail!(
            Config,
            "capacity_bytes: {value:?} has an unknown unit (use a plain number of bytes or KiB, MiB, GiB, TiB)"
        ),
    };
    if number.is_empty() {
        bail!(Config, "capacity_bytes: {value:?} has no number");
    }
    if let Ok(n) = number.parse::<u64>() {
        return match n.checked_mul(multiplier) {
            Some(bytes) => Ok(bytes),
            None => bail!(Config, "capacity_bytes: {value:?} overflows 64 bits"),
        };
    }
    match number.parse::<f64>() {
        Ok(x) if x.is_finite() && x >= 0.0 && multiplier > 1 => {
            let bytes = x * multiplier as f64;
            if bytes >= u64::MAX as f64 {
                bail!(Config, "capacity_bytes: {value:?} overflows 64 bits");
            }
            Ok(bytes as u64)
        }
        _ => bail!(Config, "capacity_bytes: {value:?} is not a size"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    #[test]
    fn sizes_parse_with_binary_suffixes() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("1KiB").unwrap(), 1024);
        assert_eq!(parse_size("2 MiB").unwrap(), 2 << 20);
        assert_eq!(parse_size("3gib").unwrap(), 3 << 30);
        assert_eq!(parse_size("1TiB").unwrap(), 1 << 40);
        assert_eq!(parse_size("1.5GiB").unwrap(), 3 << 29);
        assert_eq!(parse_size(" 7 ").unwrap(), 7);
    }

    #[test]
    fn bad_sizes_are_config_errors() {
        for bad in [
            "",
            "KiB",
            "12KB",
            "1e9",
            "-1",
            "1.5",
            "abc",
            "99999999999TiB",
            "1 2",
        ] {
            let err = parse_size(bad).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::Config, "{bad:?}");
        }
    }

    #[test]
    fn set_rejects_unknown_keys_and_values_without_changing_anything() {
        let mut cfg = TierConfig::default();
        let before = cfg.clone();
        assert_eq!(cfg.set("nope", "1").unwrap_err().kind(), ErrorKind::Config);
        assert_eq!(
            cfg.set("backend", "tape").unwrap_err().kind(),
            ErrorKind::Config
        );
        assert_eq!(
            cfg.set("io_threads", "0").unwrap_err().kind(),
            ErrorKind::Config
        );
        assert_eq!(
            cfg.set("io_threads", "x").unwrap_err().kind(),
            ErrorKind::Config
        );
        assert_eq!(
            cfg.set("io_threads", "1000").unwrap_err().kind(),
            ErrorKind::Config
        );
        assert_eq!(cfg, before);
        cfg.set("io_threads", "3").unwrap();
        cfg.set("capacity_bytes", "64MiB").unwrap();
        cfg.set("backend", "Memory").unwrap();
        assert_eq!(cfg.io_threads, Some(3));
        assert_eq!(cfg.capacity_bytes, 64 << 20);
    }

    #[test]
    fn event_keys_parse_strictly() {
        let mut cfg = TierConfig::default();
        assert!(!cfg.events, "events are opt-in");
        assert_eq!(cfg.events_capacity, DEFAULT_EVENTS_CAPACITY);
        cfg.set("events", "true").unwrap();
        cfg.set("events_capacity", "1024").unwrap();
        assert!(cfg.events);
        assert_eq!(cfg.events_capacity, 1024);
        let before = cfg.clone();
        for (k, v) in [
            ("events", "enabled"),
            ("events", "2"),
            ("events_capacity", "0"),
            ("events_capacity", "-1"),
            ("events_capacity", "4194305"),
            ("events_capacity", "1KiB"),
        ] {
            let err = cfg.set(k, v).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::Config, "{k}={v}");
            assert!(err.message().starts_with(k), "{k}={v}: {err}");
        }
        assert_eq!(cfg, before, "a rejected value changes nothing");
        cfg.set("events_capacity", &MAX_EVENTS_CAPACITY.to_string())
            .unwrap();
        cfg.set("events", "off").unwrap();
        assert!(!cfg.events);
    }

    #[test]
    fn disk_keys_parse() {
        let mut cfg = TierConfig::default();
        cfg.set("backend", "disk").unwrap();
        cfg.set("path", "/tmp/x").unwrap();
        cfg.set("namespace", "llama-3-8b/bf16").unwrap();
        cfg.set("o_direct", "off").unwrap();
        cfg.set("sync", "data").unwrap();
        cfg.set("shared", "true").unwrap();
        cfg.set("probe_ttl_ms", "250").unwrap();
        cfg.set("prepare_dirs", "yes").unwrap();
        assert!(cfg.disk.prepare_dirs);
        assert_eq!(cfg.disk.block_header, BlockHeader::Auto);
        cfg.set("block_header", "FILE").unwrap();
        assert_eq!(cfg.disk.block_header, BlockHeader::File);
        cfg.set("block_header", "xattr").unwrap();
        assert_eq!(cfg.disk.block_header, BlockHeader::Xattr);
        assert_eq!(cfg.resolved_io_timeout_ms(), DEFAULT_DISK_IO_TIMEOUT_MS);
        cfg.set("io_timeout_ms", "0").unwrap();
        assert_eq!(
            cfg.resolved_io_timeout_ms(),
            0,
            "0 turns the disk's deadline off"
        );
        cfg.set("io_timeout_ms", "1500").unwrap();
        assert_eq!(cfg.resolved_io_timeout_ms(), 1500);
        cfg.set("io_timeout_ms", " Auto ").unwrap();
        assert_eq!(cfg.io_timeout_ms, None, "auto is the default");
        cfg.set("io_timeout_ms", "1500").unwrap();
        assert_eq!(cfg.backend, BackendKind::Disk);
        assert_eq!(
            cfg.disk.path.as_deref(),
            Some(std::path::Path::new("/tmp/x"))
        );
        assert_eq!(cfg.disk.direct_io, DirectIo::Off);
        assert_eq!(cfg.disk.sync, SyncMode::Data);
        assert!(cfg.disk.shared);
        assert_eq!(cfg.probe_ttl_ms, 250);
        for (k, v) in [
            ("o_direct", "maybe"),
            ("block_header", "inode"),
            ("sync", "all"),
            ("shared", "2"),
            ("path", ""),
            ("io_timeout_ms", "600001"),
            ("io_timeout_ms", "-1"),
            ("io_timeout_ms", "automatic"),
        ] {
            assert_eq!(
                cfg.set(k, v).unwrap_err().kind(),
                ErrorKind::Config,
                "{k}={v}"
            );
        }
    }

    #[test]
    fn io_timeout_auto_is_every_backends_default() {
        let mut cfg = TierConfig::default();
        cfg.set("io_timeout_ms", "auto").unwrap();
        assert_eq!(cfg, TierConfig::default());
        assert_eq!(cfg.resolved_io_timeout_ms(), 0, "memory waits on nothing");
        let err = cfg.set("io_timeout_ms", "soon").unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Config);
        assert!(err.message().contains("auto"), "{err}");
    }

    #[test]
    fn prefault_parses_case_insensitively_and_applies_to_memory_only() {
        let mut cfg = TierConfig::default();
        assert_eq!(cfg.resolved_prefault().unwrap(), Prefault::Background);
        for (value, want) in [
            ("off", Prefault::Off),
            ("Background", Prefault::Background),
            (" FULL ", Prefault::Full),
        ] {
            cfg.set("prefault", value).unwrap();
            assert_eq!(cfg.prefault, Some(want), "{value:?}");
            assert_eq!(cfg.resolved_prefault().unwrap(), want);
        }
        let before = cfg.clone();
        for bad in ["", "on", "true", "backgrnd", "2"] {
            let err = cfg.set("prefault", bad).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::Config, "{bad:?}");
            assert!(err.message().starts_with("prefault:"), "{err}");
        }
        assert_eq!(cfg, before, "a rejected value changes nothing");

        // Disk and Redis have no arena: unset or off resolves to off, and
        // asking for more is refused with a message naming both settings.
        cfg.set("backend", "disk").unwrap();
        let err = cfg.resolved_prefault().unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Config);
        assert!(
            err.message().contains("full") && err.message().contains("disk"),
            "{err}"
        );
        cfg.set("prefault", "off").unwrap();
        assert_eq!(cfg.resolved_prefault().unwrap(), Prefault::Off);
        cfg.prefault = None;
        cfg.set("backend", "redis").unwrap();
        assert_eq!(cfg.resolved_prefault().unwrap(), Prefault::Off);
    }

    #[test]
    fn redis_keys_parse_and_bad_values_are_config_errors() {
        let mut cfg = TierConfig::default();
        cfg.set("backend", "redis").unwrap();
        assert_eq!(cfg.resolved_io_timeout_ms(), DEFAULT_REDIS_IO_TIMEOUT_MS);
        cfg.set(
            "url",
            "redis://u:pw@127.0.0.1:6379/0, redis://10.0.0.2:7000",
        )
        .unwrap();
        cfg.set("cluster", "on").unwrap();
        cfg.set("sharing", "shared").unwrap();
        cfg.set("key_prefix", "fleet-a").unwrap();
        cfg.set("ttl_s", "3600").unwrap();
        cfg.set("io_timeout_ms", "auto").unwrap();
        assert_eq!(
            cfg.resolved_io_timeout_ms(),
            DEFAULT_REDIS_IO_TIMEOUT_MS,
            "auto keeps redis's own default"
        );
        cfg.set("io_timeout_ms", "250").unwrap();
        cfg.set("connections", "4").unwrap();
        assert_eq!(cfg.backend, BackendKind::Redis);
        assert_eq!(cfg.redis.urls.len(), 2);
        assert_eq!(cfg.redis.cluster, ClusterMode::On);
        assert_eq!(cfg.redis.sharing, Sharing::Shared);
        assert_eq!(
            (
                cfg.redis.ttl_s,
                cfg.resolved_io_timeout_ms(),
                cfg.redis.connections
            ),
            (3600, 250, Some(4))
        );
        let before = cfg.clone();
        for (k, v) in [
            ("url", "not a url"),
            ("url", "http://127.0.0.1:6379"),
            ("url", "redis://:pw@127.0.0.1:notaport"),
            ("url", "redis://"),
            ("url", ""),
            ("io_timeout_ms", "600001"),
            ("sharing", "shraed"),
            ("cluster", "maybe"),
            ("connections", "0"),
            ("key_prefix", "a{b}"),
            ("ttl_s", "-1"),
        ] {
            let err = cfg.set(k, v).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::Config, "{k}={v}");
            assert!(err.message().starts_with(k), "{k}={v}: {err}");
            assert!(!err.message().contains("pw"), "{err}");
        }
        assert_eq!(cfg, before, "a rejected value changes nothing");
    }
}
