//! What a command hands back: one JSON object (`--json`), the same facts as
//! lines for people, and the exit status; plus the age histogram and the
//! byte counts every command reports alike.

use serde_json::{json, Value};
use std::fmt::Write;

/// Exit status: the store is clean, or the command did what it was asked.
pub const DONE: u8 = 0;
/// Exit status: `verify` found problems (that `--repair` did not remove),
/// or the command could not do what it was asked.
pub const PROBLEMS: u8 = 1;
/// Exit status: bad usage (clap's own, for a malformed command line).
pub const USAGE: u8 = 2;

/// A command's result.
pub struct Outcome {
    pub json: Value,
    pub text: String,
    pub status: u8,
}

/// Upper bounds of the age buckets, in seconds, and their names.
const AGE_BUCKETS: [(i64, &str); 7] = [
    (60, "<1m"),
    (600, "1m-10m"),
    (3600, "10m-1h"),
    (6 * 3600, "1h-6h"),
    (86400, "6h-1d"),
    (7 * 86400, "1d-7d"),
    (i64::MAX, ">7d"),
];

/// Blocks by time since last use (disk: the later of access and
/// modification time; Redis: `OBJECT IDLETIME`).
#[derive(Clone, Copy, Default, Debug)]
pub struct Ages([u64; AGE_BUCKETS.len()]);

impl Ages {
    pub fn add(&mut self, age_s: i64) {
        let at = AGE_BUCKETS
            .iter()
            .position(|&(below, _)| age_s < below)
            .unwrap_or(AGE_BUCKETS.len() - 1);
        self.0[at] += 1;
    }

    pub fn merge(&mut self, other: &Ages) {
        for (a, b) in self.0.iter_mut().zip(other.0) {
            *a += b;
        }
    }

    pub fn json(&self) -> Value {
        let mut map = serde_json::Map::new();
        for ((_, name), n) in AGE_BUCKETS.iter().zip(self.0) {
            map.insert(name.to_string(), json!(n));
        }
        Value::Object(map)
    }

    pub fn line(&self) -> String {
        let mut out = String::new();
        for ((_, name), n) in AGE_BUCKETS.iter().zip(self.0) {
            if n > 0 {
                let _ = write!(out, " {name}:{n}");
            }
        }
        if out.is_empty() {
            " none".into()
        } else {
            out
        }
    }
}

/// Bytes for people: 1.5 GiB.
pub fn size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// Seconds since the epoch now.
pub fn now_s() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// A fingerprint as tiers print it: 16 hex digits.
pub fn fp(fingerprint: u64) -> String {
    format!("{fingerprint:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_land_in_their_buckets() {
        let mut ages = Ages::default();
        for age in [0, 59, 60, 3599, 86400 * 30, -5] {
            ages.add(age);
        }
        let json = ages.json();
        assert_eq!(json["<1m"], 3);
        assert_eq!(json["1m-10m"], 1);
        assert_eq!(json["10m-1h"], 1);
        assert_eq!(json[">7d"], 1);
        assert_eq!(size(1536), "1.5 KiB");
    }
}
