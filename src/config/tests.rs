//! The configuration's unit tests: parsing, defaults, resolution.

use super::*;
use crate::ErrorKind;

#[test]
fn sizes_parse_with_binary_suffixes() {
    assert_eq!(parse_size("capacity_bytes", "4096").unwrap(), 4096);
    assert_eq!(parse_size("capacity_bytes", "1KiB").unwrap(), 1024);
    assert_eq!(parse_size("capacity_bytes", "2 MiB").unwrap(), 2 << 20);
    assert_eq!(parse_size("capacity_bytes", "3gib").unwrap(), 3 << 30);
    assert_eq!(parse_size("capacity_bytes", "1TiB").unwrap(), 1 << 40);
    assert_eq!(parse_size("capacity_bytes", "1.5GiB").unwrap(), 3 << 29);
    assert_eq!(parse_size("capacity_bytes", " 7 ").unwrap(), 7);
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
        let err = parse_size("capacity_bytes", bad).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Config, "{bad:?}");
    }
}

#[test]
fn size_errors_name_the_key_they_were_given_for() {
    for key in ["capacity_bytes", "--block-bytes"] {
        for bad in ["12KB", "KiB", "99999999999TiB", "1.5"] {
            let message = parse_size(key, bad).unwrap_err().message().to_string();
            assert!(message.starts_with(&format!("{key}: ")), "{message}");
        }
    }
    let message = parse_size("--block-bytes", "2MB")
        .unwrap_err()
        .message()
        .to_string();
    assert!(!message.contains("capacity_bytes"), "{message}");
    let mut cfg = TierConfig::default();
    let e = cfg.set("capacity_bytes", "2MB").unwrap_err();
    assert!(e.message().starts_with("capacity_bytes: "), "{e:?}");
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
