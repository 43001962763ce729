//! The value parsers of the string form (sizes, integers, booleans, Redis
//! URLs), apart from the key table (`keys`) so each reads on its own.

use crate::error::{bail, Result};

/// A Redis URL as `url` accepts it: a known scheme, a host, a port if any
/// that is a number. The message never repeats the URL (it may hold a
/// password).
pub(super) fn check_redis_url(url: &str) -> Result<()> {
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

pub(super) fn parse_bool(key: &str, value: &str) -> Result<bool> {
    match value.to_ascii_lowercase().as_str() {
        "true" | "1" | "on" | "yes" => Ok(true),
        "false" | "0" | "off" | "no" => Ok(false),
        _ => bail!(Config, "{key}: {value:?} is not true or false"),
    }
}

pub(super) fn parse_uint(key: &str, value: &str) -> Result<u64> {
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
