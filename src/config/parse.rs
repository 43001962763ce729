//! The string form of a configuration: `TierConfig::set`'s match over the
//! keys and the value parsers (sizes, integers, booleans, Redis URLs), apart
//! from the types so each reads on its own.

use super::*;

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
            "capacity_bytes" => self.capacity_bytes = parse_size(key, value)?,
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
            "persist_path" => {
                if value.is_empty() {
                    bail!(Config, "persist_path: empty");
                }
                self.persist_path = Some(PathBuf::from(value));
            }
            _ => bail!(
                Config,
                "unknown configuration key {key:?} (known keys: {})",
                CONFIG_KEYS.join(", ")
            ),
        }
        Ok(())
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
/// `KiB`, `MiB`, `GiB` or `TiB` (case-insensitive, optional space). `key` is
/// the setting or flag the value was given for, which an error names.
pub fn parse_size(key: &str, value: &str) -> Result<u64> {
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
            "{key}: {value:?} has an unknown unit (use a plain number of bytes or KiB, MiB, GiB, TiB)"
        ),
    };
    if number.is_empty() {
        bail!(Config, "{key}: {value:?} has no number");
    }
    if let Ok(n) = number.parse::<u64>() {
        return match n.checked_mul(multiplier) {
            Some(bytes) => Ok(bytes),
            None => bail!(Config, "{key}: {value:?} overflows 64 bits"),
        };
    }
    match number.parse::<f64>() {
        Ok(x) if x.is_finite() && x >= 0.0 && multiplier > 1 => {
            let bytes = x * multiplier as f64;
            if bytes >= u64::MAX as f64 {
                bail!(Config, "{key}: {value:?} overflows 64 bits");
            }
            Ok(bytes as u64)
        }
        _ => bail!(Config, "{key}: {value:?} is not a size"),
    }
}
