//! Redis backend, bandwidth at one block size: repetitions, each of which
//! measures the server's bounds (redis-benchmark, best of several settings:
//! doing the tier's work on many keys, and its one-key best case), runs the
//! steady-state pass, and then gives the client crate and the tier a turn
//! each (their order alternating between repetitions) on the same server:
//! a store pass of new keys, a load pass, their keys deleted, every byte
//! the tier loads verified; and how those figures are reported. The ratios
//! to the server are paired per repetition: on a shared machine the bound
//! drifts as much as the tier does.
use super::benchmark::{self, Best, Bound};
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
    /// The server's best case (one key), one per repetition.
    pub servers: Vec<Bound>,
    /// The server doing the tier's work, each the best of the settings, one
    /// per repetition (only on a server started here: they make keys of
    /// redis-benchmark's naming). SETs of a new key each: the bound of a
    /// first fill.
    pub fresh_set: Vec<Best>,
    /// SETs replacing values of as many existing keys as the tier stores:
    /// the bound of a full tier's stores.
    pub many_set: Vec<Best>,
    /// GETs over as many existing keys as the tier loads: the bound of loads.
    pub many_get: Vec<Best>,
    /// GB/s per repetition; client and tier entries of one index ran side by side.
    pub client_store_gbps: Vec<f64>,
    pub client_load_gbps: Vec<f64>,
    pub store_gbps: Vec<f64>,
    pub load_gbps: Vec<f64>,
    /// Minor faults of the server per block in the tier's first-fill store
    /// passes (empty when the server does not run here).
    pub fill_faults_per_store: Vec<f64>,
    /// The steady-state store passes, one set per repetition (see `steady`).
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
        (p.repeat
            * ((5 + steady::SETTLING_PASSES + steady::PASSES_PER_REPETITION) * n + shapes.len()))
            as u64,
    );
    let mut r = Results {
        describe: String::new(),
        steady_describe: String::new(),
        block,
        blocks: n,
        servers: Vec::new(),
        fresh_set: Vec::new(),
        many_set: Vec::new(),
        many_get: Vec::new(),
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
            let (set, get) = benchmark::many_keys_best(server, block + HEADER, n, &shapes)?;
            r.many_set.push(set);
            r.many_get.push(get);
        }
        progress.add(shapes.len() as u64);
        if let Some(steady) = steady.as_mut() {
            r.steady
                .push(steady.pass(p, server, &primary, &src, &mut ids)?);
            r.verified_bytes += steady.verify(p, &primary, &mut ids)?;
        }
        progress.add(((steady::SETTLING_PASSES + steady::PASSES_PER_REPETITION) * n) as u64);
        // The first-fill passes run last and back to back, each contender's
        // store, load and delete before the next one's store: every first
        // fill (each fresh-keys setting, the client's and the tier's) then
        // faults in memory the pass before it freed a moment ago. On a VM
        // whose balloon reports free memory to its host (about 2 s after it
        // is freed), memory freed longer ago, or never used, costs the host's
        // fault too on first touch (docs/runs/redis.md): when both
        // contenders stored before either deleted, the second store pass of
        // a repetition met such memory and ran at a third of the first's,
        // whichever contender it was.
        if server.started_here().is_some() {
            r.fresh_set.push(benchmark::fresh_set_best(
                server,
                block + HEADER,
                n,
                &shapes,
            )?);
        }
        // A new tier (and key prefix) per repetition: a tier skips stores of
        // keys it holds, so each repetition stores into an empty keyspace.
        let prefix = format!("{}-b{block}-r{rep}", p.prefix);
        let tier = primary.tier(&p.config(server, &prefix, capacity)?)?;
        r.describe = tier.describe();
        // The client's keys are new each repetition too: SETs that overwrite
        // keys let the server reuse the old values' memory, while new keys
        // make it fault fresh memory in (at 64 KiB, most of its time), so a
        // client overwriting while the tier stores new keys is no pairing.
        let rep_client_prefix = format!("{client_prefix}-r{rep}");
        let names = client::names(&rep_client_prefix, n);
        let client_first = rep % 2 == 0;
        for tier_turn in [!client_first, client_first] {
            // A first fill faults fresh memory in, as the fresh-keys bound
            // does: not memory the server's allocator kept from the last
            // pass's deletes.
            server.release_free_memory()?;
            if tier_turn {
                let faults = server.minor_faults(server_pid);
                let stored = primary
                    .stream(Kind::Store, &key_bytes, &src, p.job_blocks, p.window)
                    .run(&tier, &mut ids, |_| {})?;
                r.store_gbps.push(stored.gbps());
                if let (Some(a), Some(b)) = (faults, server.minor_faults(server_pid)) {
                    r.fill_faults_per_store.push((b - a) as f64 / n as f64);
                }
                progress.add(n as u64);
                let loaded = primary
                    .stream(Kind::Load, &key_bytes, &dst, p.job_blocks, p.window)
                    .run(&tier, &mut ids, |_| {})?;
                r.load_gbps.push(loaded.gbps());
                progress.add(n as u64);
                r.verified_bytes +=
                    verify_all(&tier, &primary, &key_bytes, p.job_blocks, &mut ids, "redis")?;
                progress.add(n as u64);
                if rep + 1 == p.repeat {
                    r.server_memory = server.used_memory();
                }
                // Untimed: the repetition's keys go, so the server holds one
                // pass's data at a time.
                server.delete_prefix(&prefix)?;
            } else {
                for (kind, gbps_of) in [
                    (Kind::Store, &mut r.client_store_gbps),
                    (Kind::Load, &mut r.client_load_gbps),
                ] {
                    let secs = client::pass(server, &primary, kind, &names, p.job_blocks, conns)?;
                    gbps_of.push(gbps(secs));
                    progress.add(n as u64);
                }
                server.delete_prefix(&rep_client_prefix)?;
            }
        }
        drop(tier);
    }
    server.delete_prefix(&client_prefix)?;
    if let Some(steady) = steady {
        steady.close(server)?;
    }
    progress.finish();
    Ok(r)
}

/// The bound a target is judged against: the server doing the tier's work
/// (`same`, named `name`) where it was measured; on a server not started
/// here (--url) only the one-key best case is known, and the target takes it.
fn bound_of<'a>(
    same: &'a [f64],
    one_key: &'a [f64],
    name: &'static str,
) -> (&'a [f64], &'static str) {
    if same.is_empty() {
        (one_key, "one-key")
    } else {
        (same, name)
    }
}

impl Results {
    /// Rows for the server's bounds, the client crate and the tier, per
    /// direction; targets on the ratios to the server doing the same work
    /// (best of the settings), the best case beside them; JSON keys with
    /// `suffix` ("" for the main block size, "_64k" for 64 KiB).
    pub fn report(&self, p: &Params, suffix: &str, out: &mut Report) {
        let label = size(self.block);
        let block = self.block;
        // The targets: 2 MiB >= 0.9x / 0.95x, 64 KiB >= 0.8x.
        let (store_target, load_target) = if block >= 1 << 20 {
            (0.9, 0.95)
        } else {
            (0.8, 0.8)
        };
        out.line(
            "bandwidth",
            format!(
                "{} blocks of {label} ({} values), {}-block jobs, {} in flight, {} repetitions, each: redis-benchmark, then client and tier passes alternating; redis-benchmark: settings {} (clients x pipeline), each bound the best of them",
                self.blocks,
                size(block + HEADER),
                p.job_blocks,
                p.window,
                p.repeat,
                self.servers[0]
                    .runs
                    .iter()
                    .map(|r| format!("{}x{}", r.clients, r.pipeline))
                    .collect::<Vec<_>>()
                    .join(" ")
            ),
        );
        let one_key_sets: Vec<f64> = self.servers.iter().map(|b| b.set_gbps(block)).collect();
        let one_key_gets: Vec<f64> = self.servers.iter().map(|b| b.get_gbps(block)).collect();
        let best_of = |pick: fn(&Bound) -> &String| {
            self.servers
                .iter()
                .map(|b| pick(b).as_str())
                .collect::<Vec<_>>()
                .join(" ")
        };
        for (cmd, gbps, best) in [
            ("SET", &one_key_sets, best_of(|b| &b.set_best)),
            ("GET", &one_key_gets, best_of(|b| &b.get_best)),
        ] {
            out.row(
                format!("{label} server {cmd}, one key"),
                median(gbps),
                "GB/s",
                format!(
                    "best case, not the tier's work: redis-benchmark on one key, its value in the CPU's caches; best settings {best}; min {} max {}",
                    num(min(gbps)),
                    num(max(gbps))
                ),
            );
        }
        let gbps_of = |bests: &[Best]| bests.iter().map(|b| b.gbps(block)).collect::<Vec<f64>>();
        let (fresh, many_set, many_get) = (
            gbps_of(&self.fresh_set),
            gbps_of(&self.many_set),
            gbps_of(&self.many_get),
        );
        let same_work = [
            (
                "SET, fresh keys",
                &self.fresh_set,
                &fresh,
                "a new key per SET (-r 10^9): the bound of first-fill stores",
            ),
            (
                "SET, many keys",
                &self.many_set,
                &many_set,
                "values of existing keys replaced (-r over as many keys as the tier stores): the bound of a full tier's stores",
            ),
            (
                "GET, many keys",
                &self.many_get,
                &many_get,
                "existing keys read (-r over as many keys as the tier loads): the bound of loads",
            ),
        ];
        for (what, bests, gbps, why) in same_work {
            if bests.is_empty() {
                continue;
            }
            let settings: Vec<&str> = bests.iter().map(|b| b.setting.as_str()).collect();
            let faults: Vec<String> = bests
                .iter()
                .filter_map(|b| b.faults_per_request)
                .map(|f| format!("{f:.1}"))
                .collect();
            let faults = if faults.is_empty() {
                String::new()
            } else {
                format!("; server faults/SET {}", faults.join(" "))
            };
            out.row(
                format!("{label} server {what}"),
                median(gbps),
                "GB/s",
                format!(
                    "{why}; best settings {}{faults}; min {} max {}",
                    settings.join(" "),
                    num(min(gbps)),
                    num(max(gbps))
                ),
            );
        }
        let (store_bound, store_bound_name) = bound_of(&fresh, &one_key_sets, "fresh-keys");
        let (load_bound, load_bound_name) = bound_of(&many_get, &one_key_gets, "many-keys");
        let directions = [
            (
                "SET",
                "store",
                &self.client_store_gbps,
                &self.store_gbps,
                &one_key_sets,
                (store_bound, store_bound_name),
                store_target,
            ),
            (
                "GET",
                "load",
                &self.client_load_gbps,
                &self.load_gbps,
                &one_key_gets,
                (load_bound, load_bound_name),
                load_target,
            ),
        ];
        for (cmd, name, client, tier, one_key, (bound, bound_name), target) in directions {
            out.row(
                format!("{label} client crate {cmd}"),
                median(client),
                "GB/s",
                format!(
                    "{}x {bound_name} bound (paired); median, min {} max {}",
                    num(paired_ratio(bound, client)),
                    num(min(client)),
                    num(max(client))
                ),
            );
            let over_bound = paired_ratio(bound, tier);
            out.row(
                format!("{label} tier {name}"),
                median(tier),
                "GB/s",
                format!(
                    "{}x {bound_name} bound, {}x one key, {}x client (all paired); min {} max {}",
                    num(over_bound),
                    num(paired_ratio(one_key, tier)),
                    num(paired_ratio(client, tier)),
                    num(min(tier)),
                    num(max(tier))
                ),
            )
            .target(
                format!("{label} {name} >= {target}x {bound_name} bound"),
                over_bound,
                Cmp::AtLeast,
                target,
            );
        }
        let (steady_bound, steady_bound_name) = bound_of(&many_set, &one_key_sets, "many-keys");
        self.report_steady(
            steady_bound,
            steady_bound_name,
            &one_key_sets,
            store_target,
            out,
        );
        let k = |key: &str| format!("{key}{suffix}");
        let steady_gbps: Vec<f64> = self.steady.iter().map(|s| s.gbps()).collect();
        out.field(&k("block_bytes"), block);
        out.field(&k("blocks"), self.blocks);
        out.field(&k("server_set_gbps"), median(&one_key_sets));
        out.field(&k("server_get_gbps"), median(&one_key_gets));
        out.field(
            &k("store_over_server"),
            paired_ratio(&one_key_sets, &self.store_gbps),
        );
        out.field(
            &k("load_over_server"),
            paired_ratio(&one_key_gets, &self.load_gbps),
        );
        out.field(
            &k("steady_store_over_server"),
            paired_ratio(&one_key_sets, &steady_gbps),
        );
        if !fresh.is_empty() {
            out.field(&k("server_fresh_set_gbps"), median(&fresh));
            out.field(
                &k("store_over_fresh_set"),
                paired_ratio(&fresh, &self.store_gbps),
            );
        }
        if !many_set.is_empty() {
            out.field(&k("server_many_keys_set_gbps"), median(&many_set));
            out.field(&k("server_many_keys_get_gbps"), median(&many_get));
            out.field(
                &k("load_over_many_keys_get"),
                paired_ratio(&many_get, &self.load_gbps),
            );
            if !steady_gbps.is_empty() {
                out.field(
                    &k("steady_store_over_many_keys_set"),
                    paired_ratio(&many_set, &steady_gbps),
                );
            }
        }
        out.field(&k("client_store_gbps"), median(&self.client_store_gbps));
        out.field(&k("client_load_gbps"), median(&self.client_load_gbps));
        out.field(&k("store_gbps"), median(&self.store_gbps));
        out.field(&k("load_gbps"), median(&self.load_gbps));
        out.field(
            &k("store_over_client"),
            paired_ratio(&self.client_store_gbps, &self.store_gbps),
        );
        out.field(
            &k("load_over_client"),
            paired_ratio(&self.client_load_gbps, &self.load_gbps),
        );
        out.field(&k("steady_store_gbps"), median(&steady_gbps));
        out.field(&k("steady_capacity_blocks"), self.steady_capacity_blocks);
        out.field(
            &k("steady"),
            json!({
                "gbps": steady_gbps,
                "pass_gbps": self.steady.iter().map(|s| &s.pass_gbps).collect::<Vec<_>>(),
                "settling_pass_gbps": self.steady.iter().map(|s| &s.settling_gbps).collect::<Vec<_>>(),
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
                "server_fresh_set": self.fresh_set,
                "server_many_keys_set": self.many_set,
                "server_many_keys_get": self.many_get,
            }),
        );
        if suffix.is_empty() {
            out.field("steady_describe", &self.steady_describe);
            out.field("describe", &self.describe);
            out.field("job_blocks", p.job_blocks);
            out.field("repeat", p.repeat);
        }
    }

    /// The steady-state store row: GB/s, paired ratio to `bound` (the
    /// server replacing values of many keys, where measured) with the first
    /// fill's target, and what the server did.
    fn report_steady(
        &self,
        bound: &[f64],
        bound_name: &str,
        one_key: &[f64],
        target: f64,
        out: &mut Report,
    ) {
        let label = size(self.block);
        if self.steady.is_empty() {
            out.line(
                "steady",
                format!("{label}: skipped, half a pass ({} blocks) holds less than twice the blocks in flight", self.blocks / 2),
            );
            return;
        }
        let gbps: Vec<f64> = self.steady.iter().map(|s| s.gbps()).collect();
        let over_bound = paired_ratio(bound, &gbps);
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
        let settling: Vec<f64> = self
            .steady
            .iter()
            .flat_map(|s| s.settling_gbps.iter().copied())
            .collect();
        out.row(
            format!("{label} tier store, steady"),
            median(&gbps),
            "GB/s",
            format!(
                "{}x {bound_name} bound, {}x one key (paired; each repetition the median of {} passes after {} untimed settling passes, which ran at {} GB/s median); capacity {} blocks, {} of {} timed stores evicted (DELs timed); {server}; used_memory MiB {memory}; min {} max {}",
                num(over_bound),
                num(paired_ratio(one_key, &gbps)),
                steady::PASSES_PER_REPETITION,
                steady::SETTLING_PASSES,
                num(median(&settling)),
                self.steady_capacity_blocks,
                evictions,
                self.steady.len() * steady::PASSES_PER_REPETITION * self.blocks,
                num(min(&gbps)),
                num(max(&gbps))
            ),
        )
        .target(
            format!("{label} steady store >= {target}x {bound_name} bound"),
            over_bound,
            Cmp::AtLeast,
            target,
        );
    }
}
