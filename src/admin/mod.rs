//! The operator's view of a store, for the `kvtier` command (`cli/`): what a
//! disk directory or a Redis keyspace holds, read and checked with the
//! backends' own format code, so that the command never keeps a copy of a
//! format that could drift from the library's.
//!
//! A narrow, safe API that stores nothing of its own:
//! - [`disk`]: a namespace directory's name, identity (`.namespace`),
//!   generation files, manifest and journals, who holds its lock; a block
//!   file checked as a tier checks it ([`disk::Checker`]), read without
//!   touching its access time; and [`disk::remove_if_same`], which removes a
//!   file only while its name still holds the file that was examined.
//! - [`redis`]: what a key name under a `key_prefix` is, and a value checked
//!   against its name ([`redis::check_value`]). The command brings its own
//!   connections.
//! - [`clear_namespace`]: a namespace cleared in shared storage through a
//!   tier's own `clear()`, so that every live tier sees it.
//!
//! What it may delete is what `docs/reliability-rules.md` lets a tier delete;
//! the command's `docs/cli.md` says which verdict leads to what.

use crate::aligned::AlignedBuf;
use crate::error::{Error, ErrorKind, Result};
use crate::{PrimaryBuffer, Tier, TierConfig};

/// Disk stores: see the module's documentation.
pub mod disk {
    pub use crate::backend::disk::examine::{
        holder, lock_if_idle, raise_generation, read_generations, read_identity, read_order_files,
        remove_if_same, Checked, Checker, DirLock, FanEntry, FileStamp, Fingerprints, Generation,
        Holder, ManifestState, NamespaceDir, NsEntry, OrderFiles, Removal, Verdict,
    };
}

/// Redis keyspaces: see the module's documentation.
#[cfg(feature = "redis-backend")]
pub mod redis {
    pub use crate::backend::redis::examine::{
        check_value, generation_name, tenant_fingerprints, value_len, BlockTag, KeyName,
        ValueVerdict,
    };
}

/// The fingerprint a namespace's blocks and directory names carry.
pub fn namespace_fingerprint(namespace: &str) -> u64 {
    crate::checksum::namespace_fingerprint(namespace)
}

/// The fingerprint the blocks of `tenant` (0: unsealed) of a namespace carry
/// in shared storage during clear generation `generation`.
pub fn generation_fingerprint(namespace_fp: u64, tenant: u64, generation: u64) -> u64 {
    crate::checksum::generation_fingerprint(namespace_fp, tenant, generation)
}

/// Clears the namespace of `config` (shared storage: disk `shared=true` or
/// Redis `sharing=shared`; its seal key, if any, names the tenant) for its
/// blocks of `block_bytes`, as a tier's [`Tier::clear`] does: the clear
/// generation is raised for every process, the old generation's blocks are
/// deleted, and it returns two `probe_ttl_ms` later (give the fleet's
/// largest), when no tier of the namespace answers HIT for, or loads, a block
/// stored before. It opens a tier of one block to do so; a disk tier's open
/// scans the directory first, as any shared tier's does.
pub fn clear_namespace(config: &TierConfig, block_bytes: usize) -> Result<()> {
    let shared = match config.backend {
        crate::BackendKind::Disk => config.disk.shared,
        crate::BackendKind::Redis => config.redis.sharing == crate::Sharing::Shared,
        crate::BackendKind::Memory => false,
    };
    if !shared {
        return Err(Error::new(
            ErrorKind::Config,
            "clear_namespace: only shared storage (shared=true, sharing=shared) has a \
             namespace to clear for other processes",
        ));
    }
    let mut config = config.clone();
    config.capacity_bytes = block_bytes as u64;
    config.io_threads = Some(1);
    let mut row = AlignedBuf::new(block_bytes).map_err(|e| {
        Error::new(
            ErrorKind::Alloc,
            format!("clear_namespace: a row of {block_bytes} bytes: {e}"),
        )
    })?;
    let rows = &mut row.as_mut_slice()[..block_bytes];
    // SAFETY: `row` is this function's own buffer of at least `block_bytes`,
    // and it outlives the tier, which is dropped below before it.
    let primary = unsafe { PrimaryBuffer::new(rows.as_mut_ptr(), block_bytes, block_bytes)? };
    let tier = Tier::new(&config, primary)?;
    let cleared = tier.clear();
    drop(tier);
    drop(row);
    cleared
}
