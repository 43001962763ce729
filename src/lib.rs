//! kvtier: a native secondary tier for LLM KV-cache offloading.
//!
//! An engine keeps fixed-size KV blocks in a CPU "primary" buffer of rows. A
//! [`Tier`] copies rows out of that buffer into its own storage (store), keeps
//! them under LRU eviction, and copies them back into given rows (load). Copies
//! run on the tier's worker threads; the engine submits jobs and polls for
//! results, each reported exactly once.
//!
//! The C API (`include/kvtier.h`) is a thin shell over this crate, in [`ffi`].
//!
//! ```
//! use kvtier::{PrimaryBuffer, Tier, TierConfig, LookupState};
//! let mut rows = vec![0u8; 4 * 4096];
//! rows[..4096].fill(7);
//! let primary = unsafe { PrimaryBuffer::new(rows.as_mut_ptr(), rows.len(), 4096) }.unwrap();
//! let mut config = TierConfig::default();
//! config.set("capacity_bytes", "1MiB").unwrap();
//! let tier = Tier::new(&config, primary).unwrap();
//! let key = [42u8; 36];
//! tier.submit_store(1, &key, 36, &[0]).unwrap();
//! tier.drain();
//! assert!(tier.poll(16)[0].is_ok());
//! assert_eq!(tier.lookup(&key, 36).unwrap(), vec![LookupState::Hit]);
//! tier.submit_load(2, &key, 36, &[3]).unwrap();
//! tier.drain();
//! assert!(tier.poll(16)[0].is_ok());
//! drop(tier);
//! assert_eq!(&rows[3 * 4096..], &[7u8; 4096][..]);
//! ```

#![warn(missing_docs)]

pub mod admin;
mod aligned;
mod backend;
mod checksum;
mod checksum_copy;
mod codes;
mod config;
mod engine;
mod error;
mod events;
pub mod ffi;
mod fork;
mod index;
mod job_kind;
mod key;
mod metrics;
mod primary;
mod seal;
mod stats;
mod status;
mod striped;
mod sync;
mod thread;
mod workers;

pub use config::{
    parse_size, BackendKind, ClusterMode, ConfigKey, Prefault, RedisConfig, Sharing, TierConfig,
    CONFIG_KEYS, CONFIG_TABLE, DEFAULT_CAPACITY_BYTES, DEFAULT_DISK_IO_TIMEOUT_MS,
    DEFAULT_REDIS_IO_TIMEOUT_MS, MAX_IO_THREADS, MAX_IO_TIMEOUT_MS,
};
pub use engine::jobs::{
    FailReason, ItemResult, ItemResults, ItemSink, ItemStatus, JobKind, JobResult,
};
#[cfg(feature = "test-hooks")]
pub use engine::{DiskIoSeam, HangPoint};
pub use engine::{Feature, Tier, MAX_TRANSIENT_LOAD_FAILURES};
pub use error::{Error, ErrorKind, Result};
pub use events::{
    Event, EventCode, EventKind, RemovedReason, StoredReason, DEFAULT_EVENTS_CAPACITY,
    MAX_EVENTS_CAPACITY,
};
pub use index::LookupState;
pub use key::MAX_KEY_LEN;
pub use primary::{Extent, PrimaryBuffer};
pub use seal::SealKey;
pub use stats::Stats;

/// The library version (the crate version).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
