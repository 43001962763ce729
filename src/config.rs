//! Tier configuration: typed fields, plus the string `key = value` form the C API
//! and the bindings use.

use crate::error::{bail, Result};
use std::path::PathBuf;

/// Where blocks live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendKind {
    /// An in-process arena of fixed-size slots (the default).
    Memory,
    /// One file per block under a directory: persistent, shareable.
    Disk,
}

impl BackendKind {
    /// The value accepted by the `backend` key.
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Memory => "memory",
            BackendKind::Disk => "disk",
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

/// What the disk backend makes durable before a block becomes visible.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyncMode {
    /// Nothing: a block survives a process crash, not a power loss.
    None,
    /// The file's data (and then its directory entry) is synced before the
    /// block is published: it survives a power loss.
    Data,
}

/// Disk backend options (used when `backend` is `disk`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiskConfig {
    /// Root directory; created (owner-only) if missing, but not its parents.
    pub path: Option<PathBuf>,
    /// Names the block layout (model, dtype, geometry…): blocks of different
    /// namespaces or block sizes are never mixed.
    pub namespace: String,
    /// O_DIRECT policy.
    pub direct_io: DirectIo,
    /// Durability before publishing.
    pub sync: SyncMode,
    /// Several processes (or hosts) use the directory at once.
    pub shared: bool,
    /// Shared mode: how long a "not on disk" answer for a key is reused before
    /// the file system is asked again, in milliseconds.
    pub probe_ttl_ms: u32,
    /// Create all fan-out directories when the tier opens (once per
    /// directory), instead of each on the first store that needs it.
    pub prepare_dirs: bool,
}

impl Default for DiskConfig {
    fn default() -> DiskConfig {
        DiskConfig {
            path: None,
            namespace: String::new(),
            direct_io: DirectIo::Auto,
            sync: SyncMode::None,
            shared: false,
            probe_ttl_ms: 1000,
            prepare_dirs: false,
        }
    }
}

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
    /// Disk backend options.
    pub disk: DiskConfig,
}

impl Default for TierConfig {
    fn default() -> TierConfig {
        TierConfig {
            backend: BackendKind::Memory,
            capacity_bytes: DEFAULT_CAPACITY_BYTES,
            io_threads: None,
            idle_spin_us: 50,
            disk: DiskConfig::default(),
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
    "sync",
    "shared",
    "probe_ttl_ms",
    "prepare_dirs",
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
                    _ => bail!(
                        Config,
                        "backend: unknown backend {value:?} (expected \"memory\" or \"disk\")"
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
                self.disk.namespace = value.to_string();
            }
            "o_direct" => {
                self.disk.direct_io = match value.to_ascii_lowercase().as_str() {
                    "auto" => DirectIo::Auto,
                    "on" | "true" | "1" => DirectIo::On,
                    "off" | "false" | "0" => DirectIo::Off,
                    _ => bail!(Config, "o_direct: {value:?} is not auto, on or off"),
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
                self.disk.probe_ttl_ms = n as u32;
            }
            _ => bail!(
                Config,
                "unknown configuration key {key:?} (known keys: {})",
                CONFIG_KEYS.join(", ")
            ),
        }
        Ok(())
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
            // Threads mostly wait on the device; SSDs need queue depth.
            BackendKind::Disk => 8,
        })
    }
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
        assert_eq!(cfg.backend, BackendKind::Disk);
        assert_eq!(
            cfg.disk.path.as_deref(),
            Some(std::path::Path::new("/tmp/x"))
        );
        assert_eq!(cfg.disk.direct_io, DirectIo::Off);
        assert_eq!(cfg.disk.sync, SyncMode::Data);
        assert!(cfg.disk.shared);
        assert_eq!(cfg.disk.probe_ttl_ms, 250);
        for (k, v) in [
            ("o_direct", "maybe"),
            ("sync", "all"),
            ("shared", "2"),
            ("path", ""),
        ] {
            assert_eq!(
                cfg.set(k, v).unwrap_err().kind(),
                ErrorKind::Config,
                "{k}={v}"
            );
        }
    }
}
