//! Redis backend, bandwidth at one block size: repetitions, each of which
//! measures the server's bound (redis-benchmark) and then alternates the
//! client crate's passes and the tier's (ABBA) on the same server, both
//! storing new keys, every byte the tier loads verified after each
//! repetition; and how those figures are
//! reported. The ratios to the server are paired per repetition: on a shared
//! machine the bound drifts as much as the tier does.

use super::benchmark::{self, Bound};
use super::client::{self, HEADER};
use super::server::Server;
use super::steady::{self, Steady};
use super::{Params, NS_BANDWIDTH};
use crate::data::keys;
use crate::jobs::{JobIds, Kind};
use crate::primary::{verify_all, Primary};
use crate::progress::Progress;
use crate::report::{num, size, Cmp, Report};
use crate::stats::{max, median, min, paired_ratio};
use serde_json::json;

pub struct Results {
    pub describe: String,
    pub steady_describe: String,
    pub block: usize,
    pub blocks: usize,
    /// The server's bound, one per repetition.
    pub servers: Vec<Bound>,
    /// SET GB/s on fresh keys at the tier's shape, one per repetition (only
    /// on a server started here: it leaves keys of redis-benchmark's naming).
    pub fresh_set_gbps: Vec<f64>,
    /// GET GB/s over as many existing keys as the tier loads, at the
    /// repetition's best GET setting (only on a server started here).
    pub many_get_gbps: Vec<f64>,
    /// SET GB/s replacing values of as many existing keys as the tier
    /// stores, at the repetition's best SET setting (server started here).
    pub many_set_gbps: Vec<f64>,
    /// GB/s per repetition; client and tier entries of one index ran side by side.
    pub client_store_gbps: Vec<f64>,
    pub client_load_gbps: Vec<f64>,
    pub store_gbps: Vec<f64>,
    pub load_gbps: Vec<f64>,
    /// Minor faults of the server per block in the tier's first-fill store
    /// passes (empty when the server does not run here).
    pub fill_faults_per_store: Vec<f64>,
    /// The steady-state store passes, one per repetition (see `steady`).
    pub steady: Vec<steady::Pass>,
    pub steady_capacity_blocks: usize,
    pub server_memory: u64,
    pub verified_bytes: u64,
}

/// The redis-benchmark settings (clients, pipeline): the three, and
/// the tier's own shape (jobs in flight x blocks per job).
fn settings(p: &Params) -> Vec<(usize, usize)> {
    let mut v = vec![(1, 16), (16, 1), (8, 2), (p.window, p.job_blocks)];
    v.dedup();
    v
}

pub fn run(p: &Params, server: &Server, block: usize, n: usize) -> Result<Results, String> {
    let label = size(block);
    let shapes = settings(p);
    let requests = shapes
        .iter()
        .map(|&(c, pl)| 2 * c * pl)
        .max()
        .unwrap_or(1)
        .max(n);
    // Every job in flight and every client thread has rows of its own.
    let rows = n.min(256).max(p.window * p.job_blocks);
    let primary = Primary::new(rows, block)?;
    let src = primary.sources(n);
    let dst = primary.destinations(n);
    let key_bytes = keys(NS_BANDWIDTH ^ block as u64, 0, n);
    let client_prefix = format!("{}-client-b{block}", p.prefix);
    let capacity = (n as u64 + 64) * block as u64;
    let mut ids = JobIds::default();
    let mut progress = Progress::new(
        p.progress,
        format!("redis {label} bandwidth"),
        (p.repeat * (6 * n + shapes.len())) as u64,
    );
    let mut r = Results {
        describe: String::new(),
        steady_describe: String::new(),
        block,
        blocks: n,
        servers: Vec::new(),
        fresh_set_gbps: Vec::new(),
        many_get_gbps: Vec::new(),
        many_set_gbps: Vec::new(),
        client_store_gbps: Vec::new(),
        client_load_gbps: Vec::new(),
        store_gbps: Vec::new(),
        load_gbps: Vec::new(),
        fill_faults_per_store: Vec::new(),
        steady: Vec::new(),
        steady_capacity_blocks: 0,
        server_memory: 0,
        verified_bytes: 0,
    };
    let gbps = |secs: f64| (n * block) as f64 / secs / 1e9;
    let conns = p.client_connections();
    let server_pid = server.started_here().and_then(|_| server.pid());
    // Filled to its plateau once, before the repetitions.
    let mut steady = Steady::open(p, server, &primary, &src, &mut ids)?;
    if let Some(s) = &steady {
        r.steady_capacity_blocks = s.capacity_blocks;
        r.steady_describe = s.describe.clone();
    }
    for rep in 0..p.repeat {
        r.servers
            .push(benchmark::run(server, block + HEADER, requests, &shapes)?);
        if server.started_here().is_some() {
            let rps = benchmark::fresh_set_rps(server, block + HEADER, n, p.window, p.job_blocks)?;
            r.fresh_set_gbps.push(rps * block as f64 / 1e9);
            let keys = server.delete_prefix("key:")?;
            if keys < (n as u64 * 9).div_ceil(10) {
                return Err(format!(
                    "redis-benchmark -r left {keys} keys after {n} SETs: not a new key per SET"
                ));
            }
            let best = r.servers.last().expect("measured above");
            let setting = |rps: fn(&benchmark::Run) -> f64| {
                let run = best
                    .runs
                    .iter()
                    .max_by(|a, b| rps(a).total_cmp(&rps(b)))
                    .expect("at least one setting");
                (run.clients, run.pipeline)
            };
            let (set_rps, get_rps) = benchmark::many_keys_rps(
                server,
                block + HEADER,
                n,
                setting(|r| r.set_rps),
                setting(|r| r.get_rps),
            )?;
            r.many_set_gbps.push(set_rps * block as f64 / 1e9);
            r.many_get_gbps.push(get_rps * block as f64 / 1e9);
            server.delete_prefix("key:")?;
        }
        progress.add(shapes.len() as u64);
        if let Some(steady) = steady.as_mut() {
            r.steady
                .push(steady.pass(p, server, &primary, &src, &mut ids)?);
            r.verified_bytes += steady.verify(p, &primary, &mut ids)?;
        }
        progress.add(n as u64);
        // A new tier (and key prefix) per repetition: a tier skips stores of
        // keys it holds, so each repetition stores into an empty keyspace.
        let prefix = format!("{}-b{block}-r{rep}", p.prefix);
        let tier = primary.tier(&p.config(server, &prefix, capacity)?)?;
        r.describe = tier.describe();
        let client_first = rep % 2 == 0;
        // The client's keys are new each repetition too: SETs that overwrite
        // keys let the server reuse the old values' memory, while new keys
        // make it fault fresh memory in (at 64 KiB, most of its time), so a
        // client overwriting while the tier stores new keys is no pairing.
        let rep_client_prefix = format!("{client_prefix}-r{rep}");
        let names = client::names(&rep_client_prefix, n);
        let directions = [
            (
                Kind::Store,
                &src,
                &mut r.store_gbps,
                &mut r.client_store_gbps,
            ),
            (Kind::Load, &dst, &mut r.load_gbps, &mut r.client_load_gbps),
        ];
        for (kind, tier_rows, tier_gbps, client_gbps) in directions {
            for tier_turn in [!client_first, client_first] {
                if tier_turn {
                    let faults = server.minor_faults(server_pid);
                    let pass = primary
                        .stream(kind, &key_bytes, tier_rows, p.job_blocks, p.window)
                        .run(&tier, &mut ids, |_| {})?;
                    tier_gbps.push(pass.gbps());
                    let faults_after = server.minor_faults(server_pid);
                    if let (Kind::Store, Some(a), Some(b)) = (kind, faults, faults_after) {
                        r.fill_faults_per_store.push((b - a) as f64 / n as f64);
                    }
                } else {
                    let secs = client::pass(server, &primary, kind, &names, p.job_blocks, conns)?;
                    client_gbps.push(gbps(secs));
                }
                progress.add(n as u64);
            }
        }
        r.verified_bytes +=
            verify_all(&tier, &primary, &key_bytes, p.job_blocks, &mut ids, "redis")?;
        progress.add(n as u64);
        if rep + 1 == p.repeat {
            r.server_memory = server.used_memory();
        }
        drop(tier);
        // Untimed: the repetition's keys go, so the server holds one
        // repetition's data at a time.
        server.delete_prefix(&prefix)?;
        server.delete_prefix(&rep_client_prefix)?;
    }
    server.delete_prefix(&client_prefix)?;
    if let Some(steady) = steady {
        steady.close(server)?;
    }
    progress.finish();
    Ok(r)
}

impl Results {
    /// Rows for the server bound, the client bound and the tier, per
    /// direction; targets on the ratios to the server's bound; JSON keys with
    /// `suffix` ("" for the main block size, "_64k" for 64 KiB).
    pub fn report(&self, p: &Params, suffix: &str, out: &mut Report) {
        let label = size(self.block);
        // The targets: 2 MiB >= 0.9x / 0.95x, 64 KiB >= 0.8x.
        let (store_target, load_target) = if self.block >= 1 << 20 {
            (0.9, 0.95)
        } else {
            (0.8, 0.8)
        };
        out.line(
            "bandwidth",
            format!(
                "{} blocks of {label} ({} values), {}-block jobs, {} in flight, {} repetitions, each: redis-benchmark, then client and tier passes alternating; redis-benchmark: {} requests per setting, settings {}",
                self.blocks,
                size(self.block + HEADER),
                p.job_blocks,
                p.window,
                p.repeat,
                self.servers[0].requests,
                self.servers[0]
                    .runs
                    .iter()
                    .map(|r| format!("{}x{}", r.clients, r.pipeline))
                    .collect::<Vec<_>>()
                    .join(" ")
            ),
        );
        let server_sets: Vec<f64> = self
            .servers
            .iter()
            .map(|b| b.set_gbps(self.block))
            .collect();
        let server_gets: Vec<f64> = self
            .servers
            .iter()
            .map(|b| b.get_gbps(self.block))
            .collect();
        let (server_set, server_get) = (median(&server_sets), median(&server_gets));
        let best = |pick: fn(&Bound) -> &String| {
            self.servers
                .iter()
                .map(|b| pick(b).as_str())
                .collect::<Vec<_>>()
                .join(" ")
        };
        let (set_best, get_best) = (best(|b| &b.set_best), best(|b| &b.get_best));
        let store_client = paired_ratio(&self.client_store_gbps, &self.store_gbps);
        let load_client = paired_ratio(&self.client_load_gbps, &self.load_gbps);
        let store_server = paired_ratio(&server_sets, &self.store_gbps);
        let load_server = paired_ratio(&server_gets, &self.load_gbps);
        let dirs = [
            (
                "SET",
                "store",
                server_set,
                &server_sets,
                &set_best,
                &self.client_store_gbps,
                &self.store_gbps,
                store_server,
                store_client,
                store_target,
            ),
            (
                "GET",
                "load",
                server_get,
                &server_gets,
                &get_best,
                &self.client_load_gbps,
                &self.load_gbps,
                load_server,
                load_client,
                load_target,
            ),
        ];
        for (cmd, name, server, servers, best, client, tier, over_server, over_client, target) in
            dirs
        {
            out.row(
                format!("{label} server bound {cmd}"),
                server,
                "GB/s",
                format!(
                    "redis-benchmark, median of the repetitions' best settings ({best}, clients x pipeline); min {} max {}",
                    num(min(servers)),
                    num(max(servers))
                ),
            );
            out.row(
                format!("{label} client crate {cmd}"),
                median(client),
                "GB/s",
                format!(
                    "{}x server (paired); median, min {} max {}",
                    num(paired_ratio(servers, client)),
                    num(min(client)),
                    num(max(client))
                ),
            );
            out.row(
                format!("{label} tier {name}"),
                median(tier),
                "GB/s",
                format!(
                    "{}x server, {}x client (both paired); min {} max {}",
                    num(over_server),
                    num(over_client),
                    num(min(tier)),
                    num(max(tier))
                ),
            )
            .target(
                format!("{label} {name} >= {target}x server bound"),
                over_server,
                Cmp::AtLeast,
                target,
            );
        }
        if !self.fresh_set_gbps.is_empty() {
            out.row(
                format!("{label} server SET, fresh keys"),
                median(&self.fresh_set_gbps),
                "GB/s",
                format!(
                    "redis-benchmark -r (a new key per SET) at {}x{}: tier store {}x of it (paired); min {} max {}",
                    p.window,
                    p.job_blocks,
                    num(paired_ratio(&self.fresh_set_gbps, &self.store_gbps)),
                    num(min(&self.fresh_set_gbps)),
                    num(max(&self.fresh_set_gbps))
                ),
            );
        }
        let k = |key: &str| format!("{key}{suffix}");
        if !self.many_set_gbps.is_empty() {
            let steady: Vec<f64> = self.steady.iter().map(|s| s.gbps).collect();
            out.row(
                format!("{label} server SET, many keys"),
                median(&self.many_set_gbps),
                "GB/s",
                format!(
                    "redis-benchmark -r over {} existing keys (values replaced, as a full tier's stores), the repetition's best SET setting: tier steady store {}x of it (paired); min {} max {}",
                    self.blocks,
                    if steady.is_empty() {
                        "-".to_string()
                    } else {
                        num(paired_ratio(&self.many_set_gbps, &steady))
                    },
                    num(min(&self.many_set_gbps)),
                    num(max(&self.many_set_gbps))
                ),
            );
            out.field(&k("server_many_keys_set_gbps"), median(&self.many_set_gbps));
            if !steady.is_empty() {
                out.field(
                    &k("steady_store_over_many_keys_set"),
                    paired_ratio(&self.many_set_gbps, &steady),
                );
            }
        }
        if !self.many_get_gbps.is_empty() {
            out.row(
                format!("{label} server GET, many keys"),
                median(&self.many_get_gbps),
                "GB/s",
                format!(
                    "redis-benchmark -r over {} existing keys (as many as the tier loads), the repetition's best GET setting: tier load {}x of it (paired); min {} max {}",
                    self.blocks,
                    num(paired_ratio(&self.many_get_gbps, &self.load_gbps)),
                    num(min(&self.many_get_gbps)),
                    num(max(&self.many_get_gbps))
                ),
            );
            out.field(&k("server_many_keys_get_gbps"), median(&self.many_get_gbps));
            out.field(
                &k("load_over_many_keys_get"),
                paired_ratio(&self.many_get_gbps, &self.load_gbps),
            );
        }
        self.report_steady(&server_sets, store_target, out);
        out.field(&k("block_bytes"), self.block);
        out.field(&k("blocks"), self.blocks);
        out.field(&k("server_set_gbps"), server_set);
        out.field(&k("server_get_gbps"), server_get);
        if !self.fresh_set_gbps.is_empty() {
            out.field(&k("server_fresh_set_gbps"), median(&self.fresh_set_gbps));
            out.field(
                &k("store_over_fresh_set"),
                paired_ratio(&self.fresh_set_gbps, &self.store_gbps),
            );
        }
        out.field(&k("client_store_gbps"), median(&self.client_store_gbps));
        out.field(&k("client_load_gbps"), median(&self.client_load_gbps));
        out.field(&k("store_gbps"), median(&self.store_gbps));
        out.field(&k("load_gbps"), median(&self.load_gbps));
        out.field(&k("store_over_server"), store_server);
        out.field(&k("load_over_server"), load_server);
        out.field(&k("store_over_client"), store_client);
        out.field(&k("load_over_client"), load_client);
        let steady_gbps: Vec<f64> = self.steady.iter().map(|s| s.gbps).collect();
        out.field(&k("steady_store_gbps"), median(&steady_gbps));
        out.field(
            &k("steady_store_over_server"),
            paired_ratio(&server_sets, &steady_gbps),
        );
        out.field(&k("steady_capacity_blocks"), self.steady_capacity_blocks);
        out.field(
            &k("steady"),
            json!({
                "gbps": steady_gbps,
                "server_faults_per_store": self.steady.iter().map(|s| s.faults_per_store).collect::<Vec<_>>(),
                "server_memory_before": self.steady.iter().map(|s| s.memory_before).collect::<Vec<_>>(),
                "server_memory_after": self.steady.iter().map(|s| s.memory_after).collect::<Vec<_>>(),
                "evictions": self.steady.iter().map(|s| s.evictions).collect::<Vec<_>>(),
                "first_fill_server_faults_per_store": self.fill_faults_per_store,
            }),
        );
        out.field(
            &k("runs"),
            json!({
                "store_gbps": self.store_gbps,
                "load_gbps": self.load_gbps,
                "client_store_gbps": self.client_store_gbps,
                "client_load_gbps": self.client_load_gbps,
                "server_bounds": self.servers,
                "server_fresh_set_gbps": self.fresh_set_gbps,
                "server_many_keys_get_gbps": self.many_get_gbps,
                "server_many_keys_set_gbps": self.many_set_gbps,
            }),
        );
        if suffix.is_empty() {
            out.field("steady_describe", &self.steady_describe);
            out.field("describe", &self.describe);
            out.field("job_blocks", p.job_blocks);
            out.field("repeat", p.repeat);
        }
    }
}

impl Results {
    /// The steady-state store row: GB/s, paired ratio to the server's bound
    /// (the same target as the first fill's), and what the server did.
    fn report_steady(&self, server_sets: &[f64], target: f64, out: &mut Report) {
        let label = size(self.block);
        if self.steady.is_empty() {
            out.line(
                "steady",
                format!("{label}: skipped, half a pass ({} blocks) holds less than twice the blocks in flight", self.blocks / 2),
            );
            return;
        }
        let gbps: Vec<f64> = self.steady.iter().map(|s| s.gbps).collect();
        let over_server = paired_ratio(server_sets, &gbps);
        let over_many = if self.many_set_gbps.is_empty() {
            String::new()
        } else {
            format!(
                ", {}x many-keys SET",
                num(paired_ratio(&self.many_set_gbps, &gbps))
            )
        };
        let faults: Vec<f64> = self
            .steady
            .iter()
            .filter_map(|s| s.faults_per_store)
            .collect();
        let server = if faults.is_empty() {
            "server faults not measured (not started here)".to_string()
        } else {
            format!(
                "server faults/store {} (first fill {})",
                num(median(&faults)),
                if self.fill_faults_per_store.is_empty() {
                    "-".to_string()
                } else {
                    num(median(&self.fill_faults_per_store))
                }
            )
        };
        let mib = |b: u64| format!("{:.0}", b as f64 / (1u64 << 20) as f64);
        let memory = self
            .steady
            .iter()
            .map(|s| format!("{}->{}", mib(s.memory_before), mib(s.memory_after)))
            .collect::<Vec<_>>()
            .join(" ");
        let evictions: u64 = self.steady.iter().map(|s| s.evictions).sum();
        out.row(
            format!("{label} tier store, steady"),
            median(&gbps),
            "GB/s",
            format!(
                "{}x server{over_many} (paired); capacity {} blocks, {} of {} stores evicted (DELs timed); {server}; used_memory MiB {memory}; min {} max {}",
                num(over_server),
                self.steady_capacity_blocks,
                evictions,
                self.steady.len() * self.blocks,
                num(min(&gbps)),
                num(max(&gbps))
            ),
        )
        .target(
            format!("{label} steady store >= {target}x server bound"),
            over_server,
            Cmp::AtLeast,
            target,
        );
    }
}
