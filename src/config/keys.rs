//! The configuration keys, one list for messages and documentation
//! (`tests/config_docs.rs` checks docs/configuration.md against it).

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
    "persist_path",
];
