//! `--backend redis`: the Redis backend through the C ABI against two bounds
//! measured in the same run on the same server, into the same report as the
//! other backends. This file resolves the settings, owns the server (started
//! here unless `--url` names one) and runs the phases.
//!
//! Bounds:
//! - server: `redis-benchmark -t set,get` with kvtier's value size, the best
//!   of a few clients x pipeline settings (see `benchmark`);
//! - client crate: the `redis` crate alone sending the same pipelines of the
//!   same values over as many connections as kvtier has jobs in flight (see
//!   `client`);
//! - shared lookups of keys this process does not hold: the server's
//!   `EXISTS` round trip (see `probe`).

mod bandwidth;
mod benchmark;
mod client;
mod latency;
mod lookup;
mod probe;
mod server;
mod steady;

use crate::capi::Config;
use crate::cli::Settings;
use crate::report::{gib, mib, size, Report};
use server::Server;

/// Key namespaces, so the phases' key sets never collide.
const NS_BANDWIDTH: u64 = 21;
const NS_LATENCY: u64 = 23;
const NS_LOOKUP: u64 = 24;
const NS_PROBE: u64 = 25;

/// Block size of the second bandwidth phase.
const SMALL_BLOCK: usize = 64 << 10;

/// The settings with the Redis backend's own defaults applied.
pub struct Params {
    pub io_threads: usize,
    /// The tier's `connections` (None: the library's default, one per I/O
    /// thread).
    pub connections: Option<usize>,
    pub block_bytes: usize,
    pub blocks: usize,
    pub small_blocks: usize,
    pub job_blocks: usize,
    pub window: usize,
    pub repeat: usize,
    pub latency_iters: usize,
    pub lookup_blocks: usize,
    pub lookup_batch: usize,
    pub lookup_runs: usize,
    pub lookup_run_secs: f64,
    pub progress: bool,
    /// Every key name of the run starts with this.
    pub prefix: String,
}

impl Params {
    fn new(s: &Settings) -> Params {
        let default_bytes: u64 = if s.quick { 64 << 20 } else { 1 << 30 };
        let bytes = if s.data_bytes_given {
            s.data_bytes
        } else {
            default_bytes
        };
        Params {
            // The library's default for redis: threads mostly wait on the network.
            io_threads: s.io_threads.unwrap_or(8),
            connections: s.connections,
            block_bytes: s.block_bytes,
            blocks: (bytes as usize).div_ceil(s.block_bytes).max(s.job_blocks),
            small_blocks: if s.quick { 256 } else { 8192 },
            job_blocks: s.job_blocks,
            window: s.window.unwrap_or(4),
            repeat: s.repeat,
            latency_iters: s.latency_iters.min(if s.quick { 500 } else { 5000 }),
            lookup_blocks: if s.quick { 1000 } else { 10_000 },
            lookup_batch: s.lookup_batch,
            lookup_runs: s.lookup_runs,
            lookup_run_secs: s.lookup_run_secs,
            progress: s.progress,
            prefix: format!("kvtier-bench-{}", std::process::id()),
        }
    }

    /// Connections the tier keeps, and the client bound uses as many as
    /// kvtier can use at once (one per job in flight, at most that).
    pub fn client_connections(&self) -> usize {
        self.window.min(self.connections.unwrap_or(self.io_threads))
    }

    /// A Redis tier on `server` whose key names start with `prefix`.
    pub fn config(&self, server: &Server, prefix: &str, capacity: u64) -> Result<Config, String> {
        let mut c = Config::new().map_err(|e| e.to_string())?;
        let mut pairs = vec![
            ("backend", "redis".to_string()),
            ("url", server.url.clone()),
            // The bounds talk to one server; so does the tier.
            ("cluster", "off".to_string()),
            ("sharing", "owned".to_string()),
            ("key_prefix", prefix.to_string()),
            ("namespace", "kvtier-bench".to_string()),
            ("io_threads", self.io_threads.to_string()),
            ("capacity_bytes", capacity.to_string()),
        ];
        if let Some(n) = self.connections {
            pairs.push(("connections", n.to_string()));
        }
        for (k, v) in pairs {
            c.set(k, &v).map_err(|e| e.to_string())?;
        }
        Ok(c)
    }
}

/// Why the run cannot happen here and is skipped (exit 0): no `--url` and no
/// redis-server or redis-benchmark installed, unless KVTIER_REQUIRE_REDIS=1
/// or CI=true asks for a failure instead.
pub fn skip_reason(s: &Settings) -> Option<String> {
    if std::env::var("KVTIER_REQUIRE_REDIS").is_ok_and(|v| v == "1")
        || std::env::var("CI").is_ok_and(|v| v == "true")
    {
        return None;
    }
    let missing: Vec<&str> = [(s.url.is_none(), "redis-server"), (true, "redis-benchmark")]
        .into_iter()
        .filter(|&(needed, program)| needed && server::find_on_path(program).is_none())
        .map(|(_, program)| program)
        .collect();
    (!missing.is_empty()).then(|| {
        format!(
            "{} not found on PATH (set KVTIER_REQUIRE_REDIS=1 to fail instead)",
            missing.join(" and ")
        )
    })
}

pub fn run(s: &Settings) -> Result<Report, String> {
    let p = Params::new(s);
    if !benchmark::available() {
        return Err("redis-benchmark not found on PATH (the server bound needs it)".into());
    }
    let server = Server::open(s.url.as_deref())?;
    let outcome = run_on(s, &p, &server);
    // A server given with --url is left without the run's keys; one started
    // here is stopped (when `server` drops, on every path).
    if server.started_here().is_none() {
        let _ = server.delete_prefix(&p.prefix);
    }
    outcome
}

fn run_on(s: &Settings, p: &Params, server: &Server) -> Result<Report, String> {
    let mut report = Report::start("redis", s.quick);
    // The phases --skip-* leaves out are absent from the table and JSON.
    let big = (!s.skip_bandwidth)
        .then(|| bandwidth::run(p, server, p.block_bytes, p.blocks))
        .transpose()?;
    let small = (!s.skip_small_blocks)
        .then(|| bandwidth::run(p, server, SMALL_BLOCK, p.small_blocks))
        .transpose()?;
    let latency = (!s.skip_latency)
        .then(|| latency::run(p, server))
        .transpose()?;
    let lookup = (!s.skip_lookup)
        .then(|| lookup::run(p, server))
        .transpose()?;
    let probe = (!s.skip_lookup)
        .then(|| probe::run(p, server))
        .transpose()?;
    let source = if s.io_threads.is_some() {
        "--io-threads"
    } else {
        "redis default"
    };
    report.io_threads(p.io_threads, source, source);
    let last_fill = big.as_ref().or(small.as_ref());
    let mut server_line = match server.started_here() {
        Some(dir) => format!(
            "redis {} at {}, started by the bench (redis-server --save \"\" --appendonly no --bind 127.0.0.1) in {}, stopped at the end",
            server.version,
            server.shown(),
            dir.display()
        ),
        None => format!("redis {} at {} (--url)", server.version, server.shown()),
    };
    if let (Some(_), Some(fill)) = (server.started_here(), last_fill) {
        server_line += &format!(
            "; {} used holding the tier's last {} first fill and the steady tier",
            mib(fill.server_memory as f64),
            size(fill.block)
        );
    }
    report.line("server", server_line);
    if let Some(fill) = last_fill {
        report.line("tier", fill.describe.clone());
    }
    report.line(
        "bounds",
        format!(
            "server: redis-benchmark -d <block + {} header bytes>, best requests/s of the clients x pipeline settings, as payload GB/s, doing the tier's work (first fill: a new key per SET; full tier: SETs replacing values of as many keys; loads: GETs over as many keys), and its best case on one key beside them (its value stays in the CPU's caches, which no tier storing distinct blocks gets); client crate: redis {} alone, the same SET/GET pipelines of the same values over {} connections (one per job in flight), GET replies copied into rows; both in the same run, on the same server",
            client::HEADER,
            "1.x",
            p.client_connections()
        ),
    );
    if let Some(big) = &big {
        big.report(p, "", &mut report);
    }
    if let Some(small) = &small {
        small.report(p, "_64k", &mut report);
    }
    if let Some(latency) = &latency {
        latency.report(p, &mut report);
    }
    if let Some(lookup) = &lookup {
        lookup.report(p, &mut report);
    }
    if let Some(probe) = &probe {
        probe.report(&mut report);
    }
    let skipped: Vec<&str> = [
        (s.skip_bandwidth, "bandwidth"),
        (s.skip_small_blocks, "64 KiB bandwidth"),
        (s.skip_latency, "latency"),
        (s.skip_lookup, "lookup"),
    ]
    .into_iter()
    .filter_map(|(skip, name)| skip.then_some(name))
    .collect();
    if !skipped.is_empty() {
        report.line("skipped", format!("{} (--skip-*)", skipped.join(", ")));
    }
    report.field("server_version", &server.version);
    report.field("server_started", server.started_here().is_some());
    report.field("window", p.window);
    report.field("connections", p.connections.unwrap_or(p.io_threads));
    report.field("client_connections", p.client_connections());
    let verified = [&big, &small]
        .iter()
        .filter_map(|r| r.as_ref())
        .map(|r| r.verified_bytes)
        .sum::<u64>()
        + latency.as_ref().map_or(0, |l| l.verified_bytes);
    report.field("verified_bytes", verified);
    report.verified(format!(
        "{} loaded back (every bandwidth repetition, every 4 KiB load; lookups all HIT)",
        gib(verified)
    ));
    report.finish();
    Ok(report)
}
