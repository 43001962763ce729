//! What a tier exposes to a metrics scraper: job latency and per-block I/O
//! time histograms (recorded here, on the workers' completion path), and the
//! Prometheus text rendering of them with the stats counters and gauges.

mod histogram;
mod text;

pub(crate) use self::histogram::Histogram;
use self::histogram::HistogramSnapshot;
use self::text::Exposition;
use crate::job_kind::JobKind;
use crate::stats::Stats;

/// Histograms per job kind, indexed by [`kind_index`].
#[derive(Default)]
pub(crate) struct JobMetrics {
    /// Submit to completion, one observation per job.
    latency: [Histogram; 2],
    /// Time a worker spent on each block, one observation per block whose
    /// copy ran (succeeded or failed).
    block_io: [Histogram; 2],
}

/// The histograms of jobs that move data; a delete moves none.
fn kind_index(kind: JobKind) -> Option<usize> {
    match kind {
        JobKind::Store => Some(0),
        JobKind::Load => Some(1),
        JobKind::Delete => None,
    }
}

impl JobMetrics {
    /// A job completed `elapsed_ns` after it was submitted.
    pub(crate) fn job_completed(&self, kind: JobKind, elapsed_ns: u64) {
        if let Some(i) = kind_index(kind) {
            self.latency[i].observe(elapsed_ns);
        }
    }

    /// A worker moved `blocks` blocks of one job back to back in `total_ns`.
    pub(crate) fn blocks_moved(&self, kind: JobKind, blocks: u64, total_ns: u64) {
        if let Some(i) = kind_index(kind) {
            self.block_io[i].observe_spread(total_ns, blocks);
        }
    }

    fn snapshots(histograms: &[Histogram; 2]) -> [HistogramSnapshot; 2] {
        [histograms[0].snapshot(), histograms[1].snapshot()]
    }
}

/// The Prometheus text exposition of a tier: `stats` and `jobs`, then the
/// backend's own counters (`counters`: name, help, value), every sample
/// labelled with `backend` (and `namespace`, when the tier has one).
pub(crate) fn render(
    stats: &Stats,
    jobs: &JobMetrics,
    backend: &str,
    namespace: &str,
    counters: &[(&str, &str, u64)],
) -> String {
    let mut labels = vec![("backend", backend)];
    if !namespace.is_empty() {
        labels.push(("namespace", namespace));
    }
    let mut e = Exposition::new(&labels);
    let one = |v: u64| [(&[][..], v)];
    let store: &[(&str, &str)] = &[("kind", "store")];
    let load: &[(&str, &str)] = &[("kind", "load")];

    e.counter(
        "kvtier_lookups_total",
        "Keys looked up.",
        &one(stats.lookups),
    );
    e.counter(
        "kvtier_lookup_hits_total",
        "Keys looked up and answered HIT (stored and readable).",
        &one(stats.hits),
    );
    e.counter(
        "kvtier_lookup_misses_total",
        "Keys looked up and answered MISS.",
        &one(stats.misses),
    );
    e.counter(
        "kvtier_lookup_pending_total",
        "Keys looked up and answered PENDING (being stored, or being probed in shared storage).",
        &one(stats.lookups_pending),
    );
    e.counter(
        "kvtier_evictions_total",
        "Blocks evicted to make room.",
        &one(stats.evictions),
    );
    e.counter(
        "kvtier_events_dropped_total",
        "Block events dropped because the event buffer was full (0 unless events=true).",
        &one(stats.events_dropped),
    );
    e.counter(
        "kvtier_io_deadlines_missed_total",
        "Storage calls that missed their deadline (io_timeout_ms); each failed its job with TIER_ERR_IO on time.",
        &one(stats.io_deadlines_missed),
    );
    e.counter(
        "kvtier_jobs_total",
        "Jobs completed (each reported once by tier_poll_finished), by kind and outcome.",
        &[
            (&[("kind", "store"), ("outcome", "ok")], stats.stores_ok),
            (
                &[("kind", "store"), ("outcome", "failed")],
                stats.stores_failed,
            ),
            (&[("kind", "load"), ("outcome", "ok")], stats.loads_ok),
            (
                &[("kind", "load"), ("outcome", "failed")],
                stats.loads_failed,
            ),
        ],
    );
    e.counter(
        "kvtier_transferred_bytes_total",
        "Bytes copied by jobs: into the tier (store) or out of it (load).",
        &[(store, stats.bytes_stored), (load, stats.bytes_loaded)],
    );

    e.gauge(
        "kvtier_capacity_bytes",
        "Capacity in bytes (whole blocks).",
        &one(stats.capacity_bytes),
    );
    e.gauge(
        "kvtier_used_bytes",
        "Bytes held by blocks, including blocks being stored.",
        &one(stats.used_bytes),
    );
    e.gauge(
        "kvtier_stored_blocks",
        "Readable blocks.",
        &one(stats.num_blocks),
    );
    e.gauge(
        "kvtier_capacity_blocks",
        "Capacity in blocks.",
        &one(stats.capacity_blocks),
    );
    e.gauge(
        "kvtier_block_size_bytes",
        "Bytes per block (the primary row size).",
        &one(stats.block_bytes),
    );
    e.gauge(
        "kvtier_index_metadata_bytes",
        "Heap bytes used by the index (keys, LRU links, hash table).",
        &one(stats.metadata_bytes),
    );
    e.gauge(
        "kvtier_jobs_in_flight",
        "Jobs accepted and not yet completed.",
        &one(stats.jobs_in_flight),
    );
    e.gauge(
        "kvtier_results_queued",
        "Finished results waiting for tier_poll_finished.",
        &one(stats.results_queued),
    );
    e.gauge(
        "kvtier_io_threads",
        "I/O worker threads.",
        &one(stats.io_threads),
    );
    e.gauge(
        "kvtier_io_threads_stuck",
        "Threads in a storage call past its deadline right now (each replaced while it is).",
        &one(stats.io_threads_stuck),
    );
    e.gauge(
        "kvtier_probes_in_flight",
        "Keys of a shared tier's lookups whose probe of storage is queued or running.",
        &one(stats.probes_in_flight),
    );
    e.gauge(
        "kvtier_resident_bytes",
        "Bytes of the memory backend's arena that are resident (0 for disk and Redis).",
        &one(stats.resident_bytes),
    );

    let [store_latency, load_latency] = JobMetrics::snapshots(&jobs.latency);
    e.histogram(
        "kvtier_job_latency_seconds",
        "Jobs from submit to completion (result queued), by kind.",
        &[(store, store_latency), (load, load_latency)],
    );
    let [store_io, load_io] = JobMetrics::snapshots(&jobs.block_io);
    e.histogram(
        "kvtier_block_io_seconds",
        "Worker time per block moved through the backend, by job kind; blocks a worker moves \
         back to back or in one batch each count the batch's mean.",
        &[(store, store_io), (load, load_io)],
    );
    for &(name, help, value) in counters {
        e.counter(name, help, &one(value));
    }
    e.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value_of(text: &str, series: &str) -> Option<String> {
        text.lines().find_map(|l| {
            l.strip_prefix(series)?
                .strip_prefix(' ')
                .map(str::to_string)
        })
    }

    #[test]
    fn every_stat_is_a_labelled_sample_under_its_help_and_type() {
        let stats = Stats {
            capacity_bytes: 1 << 30,
            lookups: 11,
            hits: 5,
            misses: 4,
            lookups_pending: 2,
            stores_ok: 3,
            stores_failed: 1,
            loads_ok: 7,
            loads_failed: 2,
            bytes_stored: 12288,
            bytes_loaded: 28672,
            io_threads: 4,
            probes_in_flight: 6,
            ..Stats::default()
        };
        let jobs = JobMetrics::default();
        for _ in 0..4 {
            jobs.job_completed(JobKind::Store, 3_000);
        }
        jobs.blocks_moved(JobKind::Load, 7, 7_000_000);
        let counters = [("kvtier_redis_moved_total", "Blocks answered MOVED.", 3)];
        let text = render(&stats, &jobs, "redis", "", &counters);
        let b = r#"backend="redis""#;
        let v = |series: &str| value_of(&text, series);
        assert_eq!(
            v(&format!("kvtier_redis_moved_total{{{b}}}")).as_deref(),
            Some("3")
        );
        assert_eq!(
            v(&format!("kvtier_lookups_total{{{b}}}")).as_deref(),
            Some("11")
        );
        assert_eq!(
            v(&format!("kvtier_lookup_pending_total{{{b}}}")).as_deref(),
            Some("2")
        );
        assert_eq!(
            v(&format!(
                r#"kvtier_jobs_total{{{b},kind="load",outcome="failed"}}"#
            ))
            .as_deref(),
            Some("2")
        );
        assert_eq!(
            v(&format!(
                r#"kvtier_transferred_bytes_total{{{b},kind="load"}}"#
            ))
            .as_deref(),
            Some("28672")
        );
        assert_eq!(
            v(&format!("kvtier_capacity_bytes{{{b}}}")).as_deref(),
            Some("1073741824")
        );
        assert_eq!(
            v(&format!("kvtier_probes_in_flight{{{b}}}")).as_deref(),
            Some("6")
        );
        assert_eq!(
            v(&format!(
                r#"kvtier_job_latency_seconds_count{{{b},kind="store"}}"#
            ))
            .as_deref(),
            Some("4")
        );
        assert_eq!(
            v(&format!(
                r#"kvtier_job_latency_seconds_bucket{{{b},kind="store",le="0.0000025"}}"#
            ))
            .as_deref(),
            Some("0")
        );
        assert_eq!(
            v(&format!(
                r#"kvtier_job_latency_seconds_bucket{{{b},kind="store",le="0.000005"}}"#
            ))
            .as_deref(),
            Some("4")
        );
        assert_eq!(
            v(&format!(
                r#"kvtier_block_io_seconds_count{{{b},kind="load"}}"#
            ))
            .as_deref(),
            Some("7")
        );
        assert_eq!(
            v(&format!(
                r#"kvtier_block_io_seconds_sum{{{b},kind="load"}}"#
            ))
            .as_deref(),
            Some("0.007")
        );

        // Every sample follows the HELP and TYPE of its family, and every
        // family is declared once.
        let mut declared = std::collections::HashSet::new();
        let mut current = String::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                current = rest.split(' ').next().unwrap().to_string();
                assert!(declared.insert(current.clone()), "{current} declared twice");
            } else if !line.starts_with("# HELP ") {
                let name = line.split('{').next().unwrap();
                let family = name
                    .strip_suffix("_bucket")
                    .or_else(|| name.strip_suffix("_sum"))
                    .or_else(|| name.strip_suffix("_count"))
                    .filter(|f| *f == current)
                    .unwrap_or(name);
                assert_eq!(family, current, "{line}");
                assert!(line.starts_with(&format!("{name}{{{b}")), "{line}");
            }
        }
        assert_eq!(declared.len(), 23 + counters.len());
    }

    #[test]
    fn a_namespace_is_a_second_constant_label() {
        let text = render(
            &Stats::default(),
            &JobMetrics::default(),
            "disk",
            "llama/bf16",
            &[],
        );
        assert!(text.contains(r#"kvtier_io_threads{backend="disk",namespace="llama/bf16"} 0"#));
    }
}
