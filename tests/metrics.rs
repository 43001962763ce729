//! `Tier::metrics` (`tier_metrics`) after a known workload: the histograms
//! count what the stats count, and every sample names the backend.
//! (python/tests/test_metrics.py reads the same text with Prometheus' own
//! parser.)

mod common;

use common::*;

const BB: usize = 4096;

/// The value of the sample whose name and labels are exactly `series`.
fn sample(text: &str, series: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no sample {series} in\n{text}"))
        .parse()
        .unwrap()
}

#[test]
fn histogram_counts_match_the_stats_after_a_known_workload() {
    let h = Harness::new(&memory_config(4, BB), 8, BB);
    let t = h.tier();
    h.store_all(1, &[1, 2, 3]); // 3 blocks copied
    assert!(h
        .store(2, &[4, 5, 6, 7, 8], &[0, 1, 2, 3, 4])
        .error
        .is_some()); // NO_SPACE: nothing copied
    assert!(h.load(3, &[1, 2], &[5, 6]).is_ok()); // 2 blocks copied
    assert!(h.load(4, &[9], &[7]).error.is_some()); // NOT_FOUND at planning: nothing copied
    t.lookup(&keys(&[1, 9]), KEY_LEN).unwrap();

    let stats = t.stats();
    assert_eq!((stats.stores_ok, stats.stores_failed), (1, 1));
    assert_eq!((stats.loads_ok, stats.loads_failed), (1, 1));
    let text = t.metrics();
    let m = |series: &str| sample(&text, &format!("kvtier_{series}"));
    let b = r#"backend="memory""#;
    assert_eq!(
        m(&format!(r#"job_latency_seconds_count{{{b},kind="store"}}"#)),
        2
    );
    assert_eq!(
        m(&format!(r#"job_latency_seconds_count{{{b},kind="load"}}"#)),
        2
    );
    assert_eq!(
        m(&format!(r#"block_io_seconds_count{{{b},kind="store"}}"#)),
        3
    );
    assert_eq!(
        m(&format!(r#"block_io_seconds_count{{{b},kind="load"}}"#)),
        2
    );
    assert_eq!(
        m(&format!(
            r#"job_latency_seconds_bucket{{{b},kind="load",le="+Inf"}}"#
        )),
        2
    );
    assert_eq!(
        m(&format!(
            r#"jobs_total{{{b},kind="store",outcome="failed"}}"#
        )),
        1
    );
    assert_eq!(
        m(&format!(r#"transferred_bytes_total{{{b},kind="store"}}"#)),
        stats.bytes_stored
    );
    assert_eq!(m(&format!("lookups_total{{{b}}}")), stats.lookups);
    assert_eq!(m(&format!("lookup_hits_total{{{b}}}")), 1);
    assert_eq!(m(&format!("stored_blocks{{{b}}}")), 3);
    assert_eq!(m(&format!("io_threads{{{b}}}")), 2);
}

#[test]
fn a_disk_tier_labels_its_backend_and_namespace() {
    let h = Harness::new(&disk_config(4, BB), 4, BB);
    h.store_all(1, &[1]);
    let text = h.tier().metrics();
    let b = r#"backend="disk",namespace="contract""#;
    assert_eq!(
        sample(
            &text,
            &format!(r#"kvtier_block_io_seconds_count{{{b},kind="store"}}"#)
        ),
        1
    );
    assert!(text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .all(|l| l.contains(&format!("{{{b}"))));
}

/// A Redis tier's metrics carry its client's counts: connections the server
/// closed are dropped and opened again (reconnections), and the families
/// of redirections and slot-map reads are there, at 0, on a single server.
#[test]
fn a_redis_tier_counts_its_clients_reconnections() {
    let server = redis_or_skip!(common::redis::shared_server());
    let h = Harness::new(
        &common::redis::redis_config_at(&server.url(), 16, BB),
        4,
        BB,
    );
    h.store_all(1, &[1, 2]);
    let b = r#"backend="redis""#;
    let text = h.tier().metrics();
    for family in [
        "moved",
        "ask",
        "rerouted_blocks",
        "slot_map_reads",
        "reconnects",
    ] {
        assert_eq!(
            sample(&text, &format!("kvtier_redis_{family}_total{{{b}}}")),
            0,
            "{text}"
        );
    }
    // The server closes every client's connection (not redis-cli's own).
    server.cli(&["CLIENT", "KILL", "TYPE", "normal"]);
    h.store_all(2, &[3, 4]);
    let text = h.tier().metrics();
    assert!(
        sample(
            &text,
            &format!("kvtier_redis_connections_dropped_total{{{b}}}")
        ) >= 1,
        "{text}"
    );
    assert!(
        sample(&text, &format!("kvtier_redis_reconnects_total{{{b}}}")) >= 1,
        "{text}"
    );
}
