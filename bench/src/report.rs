//! The final report: machine basics, a table of metrics with the project's
//! targets, or the same as one JSON object.

use crate::args::Settings;
use crate::contention::Contention;
use crate::json::Json;
use crate::stats::{max, median, min, paired_ratio, percentile};
use crate::{bandwidth, latency, lookup};

pub struct Machine {
    pub cores: usize,
    pub cpu: String,
    pub mem_total: u64,
    pub thp: String,
    pub load_start: String,
    /// Filled in at the end of the run.
    pub contention: Option<Contention>,
    pub kvtier_version: String,
}

impl Machine {
    pub fn probe(kvtier_version: String) -> Machine {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu = cpuinfo
            .lines()
            .find_map(|l| l.strip_prefix("model name")?.split_once(':'))
            .map_or("unknown".into(), |(_, v)| v.trim().to_string());
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let mem_total = meminfo
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map_or(0, |kb| kb * 1024);
        let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
            .ok()
            .and_then(|s| Some(s.split_once('[')?.1.split_once(']')?.0.to_string()))
            .unwrap_or_else(|| "unknown".into());
        Machine {
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            cpu,
            mem_total,
            thp,
            load_start: load_average(),
            contention: None,
            kvtier_version,
        }
    }
}

/// The 1-minute load average.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "?".into())
}

pub struct Results {
    pub machine: Machine,
    pub io_threads: usize,
    pub bandwidth: Option<bandwidth::Report>,
    pub latency: Option<latency::Report>,
    pub lookup: Option<lookup::Report>,
    pub elapsed_secs: f64,
}

#[derive(Clone, Copy)]
enum Cmp {
    Below,
    AtMost,
    AtLeast,
}

impl Cmp {
    fn symbol(self) -> &'static str {
        match self {
            Cmp::Below => "<",
            Cmp::AtMost => "<=",
            Cmp::AtLeast => ">=",
        }
    }
}

/// One target: `value` compared with `bound`.
struct Target {
    name: String,
    value: f64,
    bound: f64,
    cmp: Cmp,
}

impl Target {
    fn met(&self) -> bool {
        match self.cmp {
            Cmp::Below => self.value < self.bound,
            Cmp::AtMost => self.value <= self.bound,
            Cmp::AtLeast => self.value >= self.bound,
        }
    }
}

fn target(targets: &mut Vec<Target>, name: String, value: f64, bound: f64, cmp: Cmp) -> usize {
    targets.push(Target {
        name,
        value,
        bound,
        cmp,
    });
    targets.len() - 1
}

struct Row {
    metric: String,
    value: String,
    unit: &'static str,
    detail: String,
    target: Option<usize>,
}

fn num(x: f64) -> String {
    if !x.is_finite() {
        "n/a".into()
    } else if x.abs() >= 100.0 {
        format!("{x:.0}")
    } else if x.abs() >= 10.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.2}")
    }
}

fn gib(bytes: u64) -> String {
    format!("{:.2} GiB", bytes as f64 / (1u64 << 30) as f64)
}

fn mib(bytes: f64) -> String {
    format!("{:.1} MiB", bytes / (1u64 << 20) as f64)
}

fn size(bytes: usize) -> String {
    match bytes {
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}

fn blocks_label(n: u64) -> String {
    match n {
        n if n >= 1_000_000 && n % 1_000_000 == 0 => format!("{}M", n / 1_000_000),
        n if n >= 1_000 && n % 1_000 == 0 => format!("{}K", n / 1_000),
        n => n.to_string(),
    }
}

/// Builds the table rows and the targets.
fn rows(s: &Settings, r: &Results) -> (Vec<Row>, Vec<Target>) {
    let mut rows = Vec::new();
    let mut targets: Vec<Target> = Vec::new();
    if let Some(b) = &r.bandwidth {
        let memcpy = median(&b.memcpy);
        let reps = b.memcpy.len();
        rows.push(Row {
            metric: format!("memcpy, {} threads (baseline)", b.io_threads),
            value: num(memcpy),
            unit: "GB/s",
            detail: format!(
                "median of {reps}; min {} max {}",
                num(min(&b.memcpy)),
                num(max(&b.memcpy))
            ),
            target: None,
        });
        rows.push(Row {
            metric: "store, first pass (cold arena)".into(),
            value: num(b.store_cold),
            unit: "GB/s",
            detail: format!(
                "{}x memcpy; faults in {} of arena ({} as huge pages)",
                num(b.store_cold / memcpy),
                mib(b.cold_rss_added as f64),
                mib(b.cold_huge_added as f64)
            ),
            target: None,
        });
        for (name, v) in [("store", &b.store), ("load", &b.load)] {
            let m = median(v);
            let t = target(
                &mut targets,
                format!("{name} >= 0.85x memcpy (same thread count)"),
                m / memcpy,
                0.85,
                Cmp::AtLeast,
            );
            rows.push(Row {
                metric: format!("{name}, steady state"),
                value: num(m),
                unit: "GB/s",
                detail: format!(
                    "{}x memcpy; median of {reps}; min {} max {}",
                    num(m / memcpy),
                    num(min(v)),
                    num(max(v))
                ),
                target: Some(t),
            });
        }
        for (name, v) in [("store", &b.store_job_ns), ("load", &b.load_job_ns)] {
            rows.push(Row {
                metric: format!(
                    "{name} job latency, {} x {}",
                    s.job_blocks,
                    size(s.block_bytes)
                ),
                value: num(percentile(v, 0.5) as f64 / 1e6),
                unit: "ms",
                detail: format!(
                    "median; p99 {} ms; {} jobs in flight",
                    num(percentile(v, 0.99) as f64 / 1e6),
                    b.window
                ),
                target: None,
            });
        }
    }
    if let Some(l) = &r.latency {
        for (name, rt, job) in [
            ("store", &l.store_round_trip_ns, &l.store_job_ns),
            ("load", &l.load_round_trip_ns, &l.load_job_ns),
        ] {
            let m = percentile(rt, 0.5) as f64 / 1e3;
            let t = (name == "store").then(|| {
                target(
                    &mut targets,
                    "4 KiB store round trip median < 10 us".into(),
                    m,
                    10.0,
                    Cmp::Below,
                )
            });
            rows.push(Row {
                metric: format!("4 KiB {name} round trip"),
                value: num(m),
                unit: "us",
                detail: format!(
                    "median; p99 {} us; library elapsed_ns median {} us",
                    num(percentile(rt, 0.99) as f64 / 1e3),
                    num(percentile(job, 0.5) as f64 / 1e3)
                ),
                target: t,
            });
        }
        for (name, v) in [
            ("tier_submit_store", &l.submit_store_ns),
            ("tier_submit_load", &l.submit_load_ns),
        ] {
            rows.push(Row {
                metric: format!("{name} call (1 x 4 KiB)"),
                value: num(percentile(v, 0.5) as f64),
                unit: "ns",
                detail: format!(
                    "median; p99 {} ns; caller's thread",
                    num(percentile(v, 0.99) as f64)
                ),
                target: None,
            });
        }
    }
    if let Some(k) = &r.lookup {
        let small = blocks_label(k.small.resident);
        let large = blocks_label(k.large.resident);
        for (name, a, b, limited) in [
            ("lookup, all hits", &k.small.hit, &k.large.hit, true),
            ("lookup, all misses", &k.small.miss, &k.large.miss, false),
            ("touch", &k.small.touch, &k.large.touch, true),
        ] {
            let (ma, mb) = (median(a), median(b));
            for (label, m) in [(&small, ma), (&large, mb)] {
                let t = limited.then(|| {
                    target(
                        &mut targets,
                        format!("{name} at {label} blocks < 150 ns/key"),
                        m,
                        150.0,
                        Cmp::Below,
                    )
                });
                rows.push(Row {
                    metric: format!("{name}, {label} blocks"),
                    value: num(m),
                    unit: "ns/key",
                    detail: format!("batches of {}; median of {} runs", s.lookup_batch, a.len()),
                    target: t,
                });
            }
            let ratio = paired_ratio(a, b);
            let t = limited.then(|| {
                target(
                    &mut targets,
                    format!("{name}: {large} cost <= 1.5x {small} cost"),
                    ratio,
                    1.5,
                    Cmp::AtMost,
                )
            });
            rows.push(Row {
                metric: format!("{name}, {large}/{small} ratio"),
                value: num(ratio),
                unit: "x",
                detail: format!("median of {} runs alternating the two tiers", a.len()),
                target: t,
            });
        }
        let m = &k.memory;
        let per_block = m.metadata_bytes as f64 / m.resident_blocks as f64;
        let t = target(
            &mut targets,
            format!("metadata < 100 bytes per block at {large} blocks"),
            per_block,
            100.0,
            Cmp::Below,
        );
        rows.push(Row {
            metric: format!("metadata per block, {large} blocks"),
            value: num(per_block),
            unit: "bytes",
            detail: format!(
                "tier_stats().metadata_bytes = {}",
                mib(m.metadata_bytes as f64)
            ),
            target: Some(t),
        });
        let rss_delta = m.rss_after as f64 - m.rss_before as f64;
        rows.push(Row {
            metric: format!("RSS per block, {large} blocks"),
            value: num((rss_delta - m.arena_touched as f64) / m.resident_blocks as f64),
            unit: "bytes",
            detail: format!(
                "RSS +{} minus {} of arena data ({}-byte blocks)",
                mib(rss_delta),
                mib(m.arena_touched as f64),
                lookup::BLOCK_BYTES
            ),
            target: None,
        });
    }
    (rows, targets)
}

/// Other processes using this much of the machine make timings unreliable.
const BUSY_CORES: f64 = 0.25;

fn busy(m: &Machine) -> bool {
    m.contention
        .as_ref()
        .is_some_and(|c| c.other_cores + c.steal_cores >= BUSY_CORES)
}

fn noise(m: &Machine) -> String {
    match &m.contention {
        None => "unknown (/proc/stat unreadable)".into(),
        Some(c) => format!(
            "other processes used {:.2} of {} cores on average during the run, steal {:.2}{}",
            c.other_cores,
            m.cores,
            c.steal_cores,
            if busy(m) {
                " -- BUSY MACHINE: timings are unreliable, run again when it is quiet"
            } else {
                ""
            }
        ),
    }
}

fn header(s: &Settings, r: &Results) -> Vec<String> {
    let m = &r.machine;
    let threads_from = if s.io_threads.is_some() {
        "--io-threads"
    } else {
        "library default, min(cores, 4)"
    };
    let mut lines = vec![
        format!(
            "kvtier-bench: kvtier {} through its C ABI, memory backend{}",
            m.kvtier_version,
            if s.quick {
                " (--quick: smoke-test sizes, numbers not meaningful)"
            } else {
                ""
            }
        ),
        format!(
            "machine:   {} cores ({}), {} RAM, THP {}; load average {} before the run",
            m.cores,
            m.cpu,
            gib(m.mem_total),
            m.thp,
            m.load_start,
        ),
        format!("noise:     {}", noise(m)),
        format!("threads:   {} io_threads ({threads_from})", r.io_threads),
    ];
    if let Some(b) = &r.bandwidth {
        lines.push(format!(
            "bandwidth: {} blocks, {}-block jobs, {} jobs in flight, {} per direction per repetition, {} repetitions; GB = 10^9 bytes",
            size(s.block_bytes),
            s.job_blocks,
            b.window,
            gib(b.bytes_per_pass),
            b.store.len()
        ));
    }
    if let Some(l) = &r.latency {
        lines.push(format!(
            "latency:   4 KiB blocks, 1 job at a time, spin-polled; {} timed jobs per direction after {} warm-up",
            l.store_round_trip_ns.len(),
            s.latency_warmup
        ));
    }
    if let Some(k) = &r.lookup {
        lines.push(format!(
            "lookup:    {}-byte keys, {}-byte blocks, {} and {} resident blocks; filling {} keys took {:.2} s",
            crate::data::KEY_LEN,
            lookup::BLOCK_BYTES,
            k.small.resident,
            k.large.resident,
            k.large.resident,
            k.fill_secs
        ));
    }
    lines.push(format!("verified:  {}", verified(r)));
    lines
}

fn verified(r: &Results) -> String {
    let mut parts = Vec::new();
    if let Some(b) = &r.bandwidth {
        parts.push(format!(
            "{} in {} load-and-compare passes",
            gib(b.verified_bytes),
            b.verify_passes
        ));
    }
    if let Some(l) = &r.latency {
        parts.push(format!(
            "every 4 KiB load ({})",
            mib(l.verified_bytes as f64)
        ));
    }
    if let Some(k) = &r.lookup {
        parts.push(format!(
            "all {} blocks of the lookup tiers",
            k.verified_bytes / lookup::BLOCK_BYTES as u64
        ));
    }
    if parts.is_empty() {
        "nothing (every phase skipped)".into()
    } else {
        format!("{}: every byte equal", parts.join(", "))
    }
}

pub fn table(s: &Settings, r: &Results) -> String {
    let (rows, targets) = rows(s, r);
    let mut out = header(s, r).join("\n");
    out.push_str("\n\n");
    let status = |t: Option<usize>| {
        t.map(|i| {
            let t = &targets[i];
            (
                format!("{} {}", t.cmp.symbol(), num(t.bound)),
                if t.met() { "met" } else { "MISSED" },
            )
        })
        .unwrap_or_default()
    };
    let head = ["metric", "value", "unit", "ratio / detail", "target", ""];
    let cells: Vec<[String; 6]> = std::iter::once(head.map(String::from))
        .chain(rows.iter().map(|row| {
            let (bound, met) = status(row.target);
            [
                row.metric.clone(),
                row.value.clone(),
                row.unit.to_string(),
                row.detail.clone(),
                bound,
                met.to_string(),
            ]
        }))
        .collect();
    let mut width = [0usize; 6];
    for c in &cells {
        for (w, cell) in width.iter_mut().zip(c) {
            *w = (*w).max(cell.chars().count());
        }
    }
    for c in &cells {
        let line = format!(
            "{:<w0$}  {:>w1$}  {:<w2$}  {:<w3$}  {:<w4$}  {}",
            c[0],
            c[1],
            c[2],
            c[3],
            c[4],
            c[5],
            w0 = width[0],
            w1 = width[1],
            w2 = width[2],
            w3 = width[3],
            w4 = width[4],
        );
        out.push_str(line.trim_end());
        out.push('\n');
    }
    let missed: Vec<&str> = targets
        .iter()
        .filter(|t| !t.met())
        .map(|t| t.name.as_str())
        .collect();
    out.push_str(&format!(
        "\ntargets: {} of {} met{}\n",
        targets.len() - missed.len(),
        targets.len(),
        if missed.is_empty() {
            String::new()
        } else {
            format!("; missed: {}", missed.join("; "))
        }
    ));
    if busy(&r.machine) {
        out.push_str("(the machine was busy during the run: these results are not conclusive)\n");
    }
    out.push_str(&format!("total time {:.1} s\n", r.elapsed_secs));
    out
}

fn dist(v: &[f64]) -> Json {
    Json::obj(vec![
        ("median", Json::Num(median(v))),
        ("min", Json::Num(min(v))),
        ("max", Json::Num(max(v))),
        ("runs", Json::nums(v)),
    ])
}

fn pct(v: &[u64]) -> Json {
    Json::obj(vec![
        ("median", Json::Int(percentile(v, 0.5))),
        ("p99", Json::Int(percentile(v, 0.99))),
        ("count", Json::Int(v.len() as u64)),
    ])
}

fn sizes(small: &[f64], large: &[f64]) -> Json {
    Json::obj(vec![
        ("small", dist(small)),
        ("large", dist(large)),
        (
            "ratio_large_to_small",
            Json::Num(paired_ratio(small, large)),
        ),
    ])
}

pub fn json(s: &Settings, r: &Results) -> String {
    let (_, targets) = rows(s, r);
    let m = &r.machine;
    let mut fields = vec![
        ("tool", Json::str("kvtier-bench")),
        ("kvtier_version", Json::str(&m.kvtier_version)),
        ("api", Json::str("C ABI (kvtier::ffi)")),
        ("backend", Json::str("memory")),
        ("quick", Json::Bool(s.quick)),
        (
            "machine",
            Json::obj(vec![
                ("cores", Json::Int(m.cores as u64)),
                ("cpu", Json::str(&m.cpu)),
                ("mem_total_bytes", Json::Int(m.mem_total)),
                ("transparent_hugepages", Json::str(&m.thp)),
                ("loadavg_before", Json::str(&m.load_start)),
                (
                    "other_processes_cores",
                    m.contention
                        .as_ref()
                        .map_or(Json::Num(f64::NAN), |c| Json::Num(c.other_cores)),
                ),
                (
                    "steal_cores",
                    m.contention
                        .as_ref()
                        .map_or(Json::Num(f64::NAN), |c| Json::Num(c.steal_cores)),
                ),
                ("busy", Json::Bool(busy(m))),
            ]),
        ),
        ("io_threads", Json::Int(r.io_threads as u64)),
        (
            "io_threads_source",
            Json::str(if s.io_threads.is_some() {
                "--io-threads"
            } else {
                "library default"
            }),
        ),
    ];
    if let Some(b) = &r.bandwidth {
        let memcpy = median(&b.memcpy);
        let ratios =
            |v: &[f64]| -> Vec<f64> { v.iter().zip(&b.memcpy).map(|(x, m)| x / m).collect() };
        fields.push((
            "bandwidth",
            Json::obj(vec![
                ("unit", Json::str("GB/s (10^9 bytes per second)")),
                ("block_bytes", Json::Int(s.block_bytes as u64)),
                ("job_blocks", Json::Int(s.job_blocks as u64)),
                ("jobs_in_flight", Json::Int(b.window as u64)),
                ("bytes_per_direction", Json::Int(b.bytes_per_pass)),
                ("blocks_per_direction", Json::Int(b.rows as u64)),
                ("repetitions", Json::Int(b.store.len() as u64)),
                ("tier_capacity_bytes", Json::Int(b.capacity_bytes)),
                ("memcpy_threads", Json::Int(b.io_threads as u64)),
                ("memcpy", dist(&b.memcpy)),
                ("store_cold_first_pass", Json::Num(b.store_cold)),
                ("store_cold_ratio", Json::Num(b.store_cold / memcpy)),
                ("store_cold_rss_added_bytes", Json::Int(b.cold_rss_added)),
                (
                    "store_cold_huge_pages_added_bytes",
                    Json::Int(b.cold_huge_added),
                ),
                ("store", dist(&b.store)),
                ("load", dist(&b.load)),
                ("store_ratio", Json::Num(median(&b.store) / memcpy)),
                ("load_ratio", Json::Num(median(&b.load) / memcpy)),
                ("store_ratio_per_repetition", Json::nums(&ratios(&b.store))),
                ("load_ratio_per_repetition", Json::nums(&ratios(&b.load))),
                ("store_job_latency_ns", pct(&b.store_job_ns)),
                ("load_job_latency_ns", pct(&b.load_job_ns)),
                ("verified_bytes", Json::Int(b.verified_bytes)),
            ]),
        ));
    }
    if let Some(l) = &r.latency {
        fields.push((
            "latency_4k",
            Json::obj(vec![
                ("block_bytes", Json::Int(latency::BLOCK_BYTES as u64)),
                ("warmup", Json::Int(s.latency_warmup as u64)),
                ("store_round_trip_ns", pct(&l.store_round_trip_ns)),
                ("load_round_trip_ns", pct(&l.load_round_trip_ns)),
                ("store_elapsed_ns", pct(&l.store_job_ns)),
                ("load_elapsed_ns", pct(&l.load_job_ns)),
                ("submit_store_call_ns", pct(&l.submit_store_ns)),
                ("submit_load_call_ns", pct(&l.submit_load_ns)),
                ("verified_bytes", Json::Int(l.verified_bytes)),
            ]),
        ));
    }
    if let Some(k) = &r.lookup {
        let mem = &k.memory;
        let rss_delta = mem.rss_after as f64 - mem.rss_before as f64;
        fields.push((
            "lookup",
            Json::obj(vec![
                ("unit", Json::str("ns per key")),
                ("key_len", Json::Int(crate::data::KEY_LEN as u64)),
                ("batch", Json::Int(s.lookup_batch as u64)),
                ("small_blocks", Json::Int(k.small.resident)),
                ("large_blocks", Json::Int(k.large.resident)),
                ("hit", sizes(&k.small.hit, &k.large.hit)),
                ("miss", sizes(&k.small.miss, &k.large.miss)),
                ("touch", sizes(&k.small.touch, &k.large.touch)),
                ("fill_seconds", Json::Num(k.fill_secs)),
            ]),
        ));
        fields.push((
            "memory",
            Json::obj(vec![
                ("resident_blocks", Json::Int(mem.resident_blocks)),
                ("block_bytes", Json::Int(lookup::BLOCK_BYTES as u64)),
                ("metadata_bytes", Json::Int(mem.metadata_bytes)),
                (
                    "metadata_bytes_per_block",
                    Json::Num(mem.metadata_bytes as f64 / mem.resident_blocks as f64),
                ),
                ("rss_before_bytes", Json::Int(mem.rss_before)),
                ("rss_after_bytes", Json::Int(mem.rss_after)),
                ("arena_bytes_touched", Json::Int(mem.arena_touched)),
                (
                    "rss_bytes_per_block_minus_arena",
                    Json::Num((rss_delta - mem.arena_touched as f64) / mem.resident_blocks as f64),
                ),
            ]),
        ));
    }
    fields.push((
        "targets",
        Json::Arr(
            targets
                .iter()
                .map(|t| {
                    Json::obj(vec![
                        ("name", Json::str(&t.name)),
                        ("value", Json::Num(t.value)),
                        ("bound", Json::Num(t.bound)),
                        ("comparison", Json::str(t.cmp.symbol())),
                        ("met", Json::Bool(t.met())),
                    ])
                })
                .collect(),
        ),
    ));
    fields.push((
        "all_targets_met",
        Json::Bool(targets.iter().all(Target::met)),
    ));
    fields.push(("verified", Json::Bool(true)));
    fields.push(("verification", Json::str(verified(r))));
    fields.push(("elapsed_seconds", Json::Num(r.elapsed_secs)));
    let mut out = Json::obj(fields).render();
    out.push('\n');
    out
}
