//! The configuration keys: one declaration per key (its name, the backends
//! that read it, the values it accepts, its default, what it means, how it
//! is set and read back). `TierConfig::set` dispatches through this table,
//! `CONFIG_KEYS` and the C `tier_config_keys` list its names, and
//! docs/configuration.md and the header's key list are generated from it
//! (`tests/config_docs.rs` fails when either differs, or when a default
//! stated here is not the library's).

use super::parse::{check_redis_url, parse_bool, parse_size, parse_uint};
use super::*;
use crate::seal::KeyOrigin;
use std::ffi::CStr;

/// One configuration key, as `tier_config_set` accepts it.
pub struct ConfigKey {
    /// The key's name.
    pub name: &'static str,
    /// The name as a C string (what `tier_config_keys` hands out).
    pub c_name: &'static CStr,
    /// The backends that read it.
    pub backends: &'static [BackendKind],
    /// The values it accepts (markdown: values in backquotes).
    pub values: &'static str,
    /// Its default, as documented (checked against [`TierConfig::default`]).
    pub default: &'static str,
    /// What it means, in a sentence.
    pub doc: &'static str,
    set: fn(&mut TierConfig, &str, &str) -> Result<()>,
    get: fn(&TierConfig) -> String,
}

const ALL: &[BackendKind] = &[BackendKind::Memory, BackendKind::Disk, BackendKind::Redis];
const MEMORY: &[BackendKind] = &[BackendKind::Memory];
const DISK: &[BackendKind] = &[BackendKind::Disk];
const REDIS: &[BackendKind] = &[BackendKind::Redis];
const STORAGE: &[BackendKind] = &[BackendKind::Disk, BackendKind::Redis];

/// Declares [`CONFIG_TABLE`] and [`CONFIG_KEYS`] from one list, so that the
/// names, the dispatch and the documentation cannot drift apart. A new key
/// is one more entry.
macro_rules! config_keys {
    ($( $name:ident {
        backends: $backends:expr,
        values: $values:expr,
        default: $default:expr,
        doc: $doc:expr,
        set: $set:expr,
        get: $get:expr $(,)?
    } )*) => {
        /// Every key `tier_config_set` accepts, in documentation order.
        pub const CONFIG_TABLE: &[ConfigKey] = &[$(
            ConfigKey {
                name: stringify!($name),
                c_name: match CStr::from_bytes_with_nul(concat!(stringify!($name), "\0").as_bytes()) {
                    Ok(name) => name,
                    Err(_) => panic!("a key name has no NUL"),
                },
                backends: $backends,
                values: $values,
                default: $default,
                doc: $doc,
                set: $set,
                get: $get,
            },
        )*];

        /// The keys [`TierConfig::set`] accepts, for messages and documentation.
        pub const CONFIG_KEYS: &[&str] = &[$(stringify!($name)),*];
    };
}

fn on_off_auto(key: &str, value: &str) -> Result<Option<bool>> {
    match value.to_ascii_lowercase().as_str() {
        "auto" => Ok(None),
        "on" | "true" | "1" => Ok(Some(true)),
        "off" | "false" | "0" => Ok(Some(false)),
        _ => bail!(Config, "{key}: {value:?} is not auto, on or off"),
    }
}

fn bounded(key: &str, value: &str, low: u64, high: u64) -> Result<u64> {
    let n = parse_uint(key, value)?;
    if n < low || n > high {
        bail!(Config, "{key}: {n} is outside {low}..={high}");
    }
    Ok(n)
}

fn not_empty<'a>(key: &str, value: &'a str) -> Result<&'a str> {
    if value.is_empty() {
        bail!(Config, "{key}: empty");
    }
    Ok(value)
}

fn or_none<T>(value: &Option<T>, show: impl Fn(&T) -> String) -> String {
    value.as_ref().map_or_else(|| "none".to_string(), show)
}

/// A setting left to the library to choose.
fn or_auto<T: ToString>(value: Option<T>) -> String {
    value.map_or_else(|| "auto".to_string(), |v| v.to_string())
}

fn set_seal(cfg: &mut TierConfig, key: &str, value: &str) -> Result<()> {
    let origin = if key == "seal_key" {
        KeyOrigin::Inline
    } else {
        KeyOrigin::File
    };
    if cfg.seal.as_ref().is_some_and(|k| k.origin != origin) {
        bail!(
            Config,
            "{key}: seal_key and seal_key_file are both given; give one"
        );
    }
    cfg.seal = Some(if origin == KeyOrigin::Inline {
        SealKey::from_hex(key, value)?
    } else {
        SealKey::from_file(std::path::Path::new(value))?
    });
    Ok(())
}

/// Whether a seal key is set, never the key itself.
fn seal_state(cfg: &TierConfig, origin: KeyOrigin) -> String {
    let set = cfg.seal.as_ref().is_some_and(|k| k.origin == origin);
    if set { "set" } else { "none" }.to_string()
}

config_keys! {
    backend {
        backends: ALL,
        values: "`memory`, `disk`, `redis` (also `valkey`)",
        default: "`memory`",
        doc: "where blocks live",
        set: |c, _, v| {
            c.backend = match v.to_ascii_lowercase().as_str() {
                "memory" => BackendKind::Memory,
                "disk" => BackendKind::Disk,
                "redis" | "valkey" => BackendKind::Redis,
                _ => bail!(
                    Config,
                    "backend: unknown backend {v:?} (expected \"memory\", \"disk\" or \"redis\")"
                ),
            };
            Ok(())
        },
        get: |c| c.backend.name().to_string(),
    }
    capacity_bytes {
        backends: ALL,
        values: "bytes, or a number with `KiB`/`MiB`/`GiB`/`TiB`",
        default: "`1GiB`",
        doc: "block data the tier may hold, rounded down to whole blocks",
        set: |c, k, v| {
            c.capacity_bytes = parse_size(k, v)?;
            Ok(())
        },
        get: |c| c.capacity_bytes.to_string(),
    }
    io_threads {
        backends: ALL,
        values: "1..=256",
        default: "min(cores, 4) for memory, 64 for disk, 8 for redis",
        doc: "worker threads that copy blocks (for disk and redis, the queue depth)",
        set: |c, k, v| {
            c.io_threads = Some(bounded(k, v, 1, MAX_IO_THREADS as u64)? as usize);
            Ok(())
        },
        get: |c| or_auto(c.io_threads),
    }
    idle_spin_us {
        backends: ALL,
        values: "0..=1000000",
        default: "50",
        doc: "how long one idle worker polls for work before it sleeps, in microseconds",
        set: |c, k, v| {
            c.idle_spin_us = bounded(k, v, 0, 1_000_000)? as u32;
            Ok(())
        },
        get: |c| c.idle_spin_us.to_string(),
    }
    prefault {
        backends: ALL,
        values: "memory: `off`, `background`, `full`; other backends: `off` only (`tier_new` refuses the others)",
        default: "`background` (memory), `off` for disk and redis",
        doc: "when the memory arena becomes resident: `off` when stores write it, `background` a low-priority thread keeps capacity/8 (within 64 MiB..1 GiB) resident ahead of the stored slots, `full` all of it from `tier_new` on",
        set: |c, _, v| {
            c.prefault = Some(match v.to_ascii_lowercase().as_str() {
                "off" => Prefault::Off,
                "background" => Prefault::Background,
                "full" => Prefault::Full,
                _ => bail!(Config, "prefault: {v:?} is not off, background or full"),
            });
            Ok(())
        },
        get: |c| or_auto(c.prefault.map(Prefault::name)),
    }
    persist_path {
        backends: MEMORY,
        values: "a directory on tmpfs or hugetlbfs (created owner-only; its parent must exist)",
        default: "none",
        doc: "where the arena and its index live, a file per namespace mapped shared, so that the next tier over it after a crash or restart finds every block completely stored; one process at a time, not with `shared`; a file of another namespace or format is refused, one of another geometry made anew",
        set: |c, k, v| {
            c.persist_path = Some(PathBuf::from(not_empty(k, v)?));
            Ok(())
        },
        get: |c| or_none(&c.persist_path, |p| p.display().to_string()),
    }
    path {
        backends: DISK,
        values: "a directory (created owner-only; its parent must exist)",
        default: "required",
        doc: "the tier's root directory",
        set: |c, k, v| {
            c.disk.path = Some(PathBuf::from(not_empty(k, v)?));
            Ok(())
        },
        get: |c| or_none(&c.disk.path, |p| p.display().to_string()),
    }
    namespace {
        backends: STORAGE,
        values: "text, up to 4096 bytes",
        default: "empty",
        doc: "what the blocks mean (model and revision, dtype, tokens per block, parallel layout, rank); blocks of another namespace or block size are never served; required on shared storage (`shared=true`, `sharing=shared`), where `tier_new` fails without one",
        set: |c, _, v| {
            if v.len() > 4096 {
                bail!(Config, "namespace: longer than 4096 bytes");
            }
            c.namespace = v.to_string();
            Ok(())
        },
        get: |c| c.namespace.clone(),
    }
    o_direct {
        backends: DISK,
        values: "`auto`, `on`, `off`",
        default: "`auto`",
        doc: "bypass the page cache: `auto` probes the directory and falls back to buffered I/O",
        set: |c, k, v| {
            c.disk.direct_io = match on_off_auto(k, v)? {
                None => DirectIo::Auto,
                Some(true) => DirectIo::On,
                Some(false) => DirectIo::Off,
            };
            Ok(())
        },
        get: |c| match c.disk.direct_io {
            DirectIo::Auto => "auto",
            DirectIo::On => "on",
            DirectIo::Off => "off",
        }
        .to_string(),
    }
    block_header {
        backends: DISK,
        values: "`auto`, `xattr`, `file`",
        default: "`auto`",
        doc: "where each block file's header lives: `auto` in its `user.kvtier` extended attribute where a local file system keeps them (a 64 KiB block is a 64 KiB file), else in the file's first 4 KiB; `xattr` the attribute or `tier_new` fails; `file` in the file; either form is read whatever this says",
        set: |c, _, v| {
            c.disk.block_header = match v.to_ascii_lowercase().as_str() {
                "auto" => BlockHeader::Auto,
                "xattr" => BlockHeader::Xattr,
                "file" => BlockHeader::File,
                _ => bail!(Config, "block_header: {v:?} is not auto, xattr or file"),
            };
            Ok(())
        },
        get: |c| match c.disk.block_header {
            BlockHeader::Auto => "auto",
            BlockHeader::Xattr => "xattr",
            BlockHeader::File => "file",
        }
        .to_string(),
    }
    sync {
        backends: DISK,
        values: "`none`, `data`",
        default: "`none`",
        doc: "`data`: fsync the file and its directory before a block is published, so it survives a power loss",
        set: |c, _, v| {
            c.disk.sync = match v.to_ascii_lowercase().as_str() {
                "none" => SyncMode::None,
                "data" => SyncMode::Data,
                _ => bail!(Config, "sync: {v:?} is not none or data"),
            };
            Ok(())
        },
        get: |c| match c.disk.sync {
            SyncMode::None => "none",
            SyncMode::Data => "data",
        }
        .to_string(),
    }
    shared {
        backends: DISK,
        values: "`true`, `false` (also `1`/`0`, `on`/`off`, `yes`/`no`)",
        default: "`false`",
        doc: "several processes or hosts use the directory at once",
        set: |c, k, v| {
            c.disk.shared = parse_bool(k, v)?;
            Ok(())
        },
        get: |c| c.disk.shared.to_string(),
    }
    probe_ttl_ms {
        backends: STORAGE,
        values: "0..=3600000",
        default: "1000",
        doc: "shared storage: how long a \"not stored\" answer is reused, and how long (at least 250 ms) the namespace's clear generation is trusted before it is read again (a lookup past half of it has it read again; past all of it HITs answer PENDING until that read returns); `tier_clear` returns after twice this",
        set: |c, k, v| {
            c.probe_ttl_ms = bounded(k, v, 0, 3_600_000)? as u32;
            Ok(())
        },
        get: |c| c.probe_ttl_ms.to_string(),
    }
    prepare_dirs {
        backends: DISK,
        values: "`true`, `false`",
        default: "`false`",
        doc: "create all 256 fan-out directories at open, so early stores do not pay for a mkdir",
        set: |c, k, v| {
            c.disk.prepare_dirs = parse_bool(k, v)?;
            Ok(())
        },
        get: |c| c.disk.prepare_dirs.to_string(),
    }
    url {
        backends: REDIS,
        values: "`redis://[user[:password]@]host[:port][/db]` or `rediss://` (TLS); a cluster's seeds comma-separated",
        default: "required",
        doc: "the servers",
        set: |c, k, v| {
            let urls: Vec<String> = v
                .split(',')
                .map(|u| u.trim().to_string())
                .filter(|u| !u.is_empty())
                .collect();
            if urls.is_empty() {
                bail!(Config, "{k}: empty");
            }
            for url in &urls {
                check_redis_url(url)?;
            }
            c.redis.urls = urls;
            Ok(())
        },
        // The URLs may hold passwords: only their count is shown.
        get: |c| match c.redis.urls.len() {
            1 => "1 seed".to_string(),
            n => format!("{n} seeds"),
        },
    }
    cluster {
        backends: REDIS,
        values: "`auto`, `on`, `off`",
        default: "`auto`",
        doc: "a Redis Cluster (keys routed by slot) or one server; `auto` asks the server",
        set: |c, k, v| {
            c.redis.cluster = match on_off_auto(k, v)? {
                None => ClusterMode::Auto,
                Some(true) => ClusterMode::On,
                Some(false) => ClusterMode::Off,
            };
            Ok(())
        },
        get: |c| match c.redis.cluster {
            ClusterMode::Auto => "auto",
            ClusterMode::On => "on",
            ClusterMode::Off => "off",
        }
        .to_string(),
    }
    sharing {
        backends: REDIS,
        values: "`owned`, `shared`",
        default: "`owned`",
        doc: "`owned`: this tier's keys, deleted when evicted; `shared`: one keyspace for a fleet, never deleted by this tier",
        set: |c, _, v| {
            c.redis.sharing = match v.to_ascii_lowercase().as_str() {
                "owned" => Sharing::Owned,
                "shared" => Sharing::Shared,
                _ => bail!(Config, "sharing: {v:?} is not owned or shared"),
            };
            Ok(())
        },
        get: |c| match c.redis.sharing {
            Sharing::Owned => "owned",
            Sharing::Shared => "shared",
        }
        .to_string(),
    }
    key_prefix {
        backends: REDIS,
        values: "1 to 64 bytes without braces",
        default: "`kvtier`",
        doc: "the first part of every key name",
        set: |c, _, v| {
            if v.is_empty() || v.len() > 64 || v.contains(['{', '}']) {
                bail!(
                    Config,
                    "key_prefix: {v:?} must be 1 to 64 bytes without braces"
                );
            }
            c.redis.key_prefix = v.to_string();
            Ok(())
        },
        get: |c| c.redis.key_prefix.clone(),
    }
    ttl_s {
        backends: REDIS,
        values: "seconds (0: none)",
        default: "0",
        doc: "expiry of stored blocks",
        set: |c, k, v| {
            c.redis.ttl_s = parse_uint(k, v)?;
            Ok(())
        },
        get: |c| c.redis.ttl_s.to_string(),
    }
    io_timeout_ms {
        backends: STORAGE,
        values: "`auto`, or 0..=600000 (0: none, disk only)",
        default: "`auto` for disk, 3000 for redis",
        doc: "the deadline of one block's storage call; past it the job fails with TIER_ERR_IO on time; disk `auto`: 10000 on network, cluster, FUSE and unknown file systems, none on local ones (`tier_describe` says which)",
        set: |c, _, v| {
            if v.eq_ignore_ascii_case("auto") {
                c.io_timeout_ms = None;
                return Ok(());
            }
            let Ok(n) = v.parse::<u64>() else {
                bail!(
                    Config,
                    "io_timeout_ms: {v:?} is not auto or a number of milliseconds"
                );
            };
            if n > MAX_IO_TIMEOUT_MS as u64 {
                bail!(
                    Config,
                    "io_timeout_ms: {n} is above {MAX_IO_TIMEOUT_MS} (ten minutes)"
                );
            }
            c.io_timeout_ms = Some(n as u32);
            Ok(())
        },
        get: |c| or_auto(c.io_timeout_ms),
    }
    connections {
        backends: REDIS,
        values: "1..=1024",
        default: "one per I/O thread",
        doc: "connections per server node",
        set: |c, k, v| {
            c.redis.connections = Some(bounded(k, v, 1, 1024)? as usize);
            Ok(())
        },
        get: |c| or_auto(c.redis.connections),
    }
    events {
        backends: ALL,
        values: "`true`, `false`",
        default: "`false`",
        doc: "record block events for `tier_poll_events`",
        set: |c, k, v| {
            c.events = parse_bool(k, v)?;
            Ok(())
        },
        get: |c| c.events.to_string(),
    }
    events_capacity {
        backends: ALL,
        values: "1..=4194304",
        default: "65536",
        doc: "events held until polled (160 bytes each, allocated at `tier_new`); beyond it the oldest are dropped and reported as TIER_EVENT_LOST",
        set: |c, k, v| {
            c.events_capacity = bounded(k, v, 1, MAX_EVENTS_CAPACITY as u64)? as usize;
            Ok(())
        },
        get: |c| c.events_capacity.to_string(),
    }
    seal_key {
        backends: STORAGE,
        values: "64 hex digits",
        default: "none",
        doc: "the tenant's 256-bit seal key: blocks are encrypted and authenticated (AES-256-GCM) and named by HMAC-SHA-256 of their key, so only holders of it can read, find or forge them; never shown, wiped when freed; not with `seal_key_file`",
        set: set_seal,
        get: |c| seal_state(c, KeyOrigin::Inline),
    }
    seal_key_file {
        backends: STORAGE,
        values: "a file holding the 64 hex digits, accessible to its owner only",
        default: "none",
        doc: "the seal key, read from a file; not with `seal_key`",
        set: set_seal,
        get: |c| seal_state(c, KeyOrigin::File),
    }
}

impl ConfigKey {
    /// The key of this name.
    pub fn find(name: &str) -> Option<&'static ConfigKey> {
        CONFIG_TABLE.iter().find(|k| k.name == name)
    }

    /// The key's current value in `cfg`, in its string form (`auto` or
    /// `none` where unset; secrets never shown).
    pub fn value_in(&self, cfg: &TierConfig) -> String {
        (self.get)(cfg)
    }
}

impl TierConfig {
    /// Sets one option from its string form, as `tier_config_set` does.
    ///
    /// Fails with [`ErrorKind::Config`](crate::ErrorKind::Config) on an unknown key or
    /// a value that does not parse; the configuration is then unchanged.
    pub fn set(&mut self, key: &str, value: &str) -> Result<()> {
        match ConfigKey::find(key) {
            Some(entry) => (entry.set)(self, key, value.trim()),
            None => bail!(
                Config,
                "unknown configuration key {key:?} (known keys: {})",
                CONFIG_KEYS.join(", ")
            ),
        }
    }

    /// One option's current value in its string form, as `tier_config_get`
    /// gives it: the canonical spelling of what [`TierConfig::set`] read
    /// (`" Shared"` reads back as `shared`, `valkey` as `redis`).
    pub fn get(&self, key: &str) -> Result<String> {
        match ConfigKey::find(key) {
            Some(entry) => Ok(entry.value_in(self)),
            None => bail!(
                Config,
                "unknown configuration key {key:?} (known keys: {})",
                CONFIG_KEYS.join(", ")
            ),
        }
    }
}
