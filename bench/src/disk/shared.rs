//! What the disk phases share: the tier configuration they open (the
//! primary buffer and waiting for one job are in `crate::primary`, shared
//! with the Redis phases).

use crate::capi::Config;
use std::path::Path;

pub use crate::primary::{one_result, Primary};

/// A disk tier configuration; `prepared` creates the fan-out directories at
/// open, so timed stores see a tier in steady state. `o_direct=on` makes a
/// file system without O_DIRECT fail the run instead of silently measuring
/// the page cache.
pub fn config(
    dir: &Path,
    io_threads: usize,
    capacity: u64,
    prepared: bool,
    io_timeout_ms: Option<u32>,
) -> Result<Config, String> {
    let mut c = Config::new().map_err(|e| e.to_string())?;
    for (k, v) in [
        ("prepare_dirs", prepared.to_string()),
        ("backend", "disk".to_string()),
        ("path", dir.display().to_string()),
        ("namespace", "kvtier-bench".to_string()),
        ("o_direct", "on".to_string()),
        ("io_threads", io_threads.to_string()),
        ("capacity_bytes", capacity.to_string()),
    ] {
        c.set(k, &v).map_err(|e| e.to_string())?;
    }
    if let Some(ms) = io_timeout_ms {
        c.set("io_timeout_ms", &ms.to_string())
            .map_err(|e| e.to_string())?;
    }
    Ok(c)
}
