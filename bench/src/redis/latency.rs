//! Redis backend, 4 KiB round trips: one block per job, one job at a time,
//! spin-polled, against the client crate's single SET / GET on its own
//! connection (interleaved in batches, so both see the same machine) and
//! redis-benchmark's p50 with 1 client and no pipelining; and how those
//! figures are reported.

use super::benchmark::{self, Bound};
use super::client::{self, HEADER};
use super::server::Server;
use super::{Params, NS_LATENCY};
use crate::capi::Tier;
use crate::data::{check_row, write_key, KEY_LEN};
use crate::jobs::{JobIds, Kind};
use crate::primary::{one_result, Primary};
use crate::progress::Progress;
use crate::report::{num, Cmp, Report};
use crate::stats::percentile;
use serde_json::json;
use std::time::Instant;

const B: usize = 4096;
/// Source rows 0..ROWS, destination rows ROWS..2*ROWS.
const ROWS: usize = 128;
/// Client and tier alternate in batches of this many round trips.
const BATCH: usize = 50;

#[derive(Default)]
pub struct Results {
    pub store_ns: Vec<u64>,
    pub load_ns: Vec<u64>,
    pub submit_store_ns: Vec<u64>,
    pub submit_load_ns: Vec<u64>,
    pub client_set_ns: Vec<u64>,
    pub client_get_ns: Vec<u64>,
    pub server: Option<Bound>,
    pub verified_bytes: u64,
}

pub fn run(p: &Params, server: &Server) -> Result<Results, String> {
    let mut r = Results {
        server: Some(benchmark::run(
            server,
            B + HEADER,
            (p.latency_iters * 2).max(1000),
            &[(1, 1)],
        )?),
        ..Results::default()
    };
    let primary = Primary::new(ROWS, B)?;
    let prefix = format!("{}-lat", p.prefix);
    let tier =
        primary.tier(&p.config(server, &prefix, ((p.latency_iters * 2 + 64) * B) as u64)?)?;
    let client_prefix = format!("{}-client-lat", p.prefix);
    let names = client::names(&client_prefix, p.latency_iters + p.latency_iters / 5);
    let mut conn = server.connect()?;
    let warmup = p.latency_iters / 5;
    let total = warmup + p.latency_iters;
    let mut progress = Progress::new(p.progress, "redis 4 KiB latency", 2 * total as u64);
    let mut ids = JobIds::default();
    let timed = |i: usize, samples: &mut Vec<u64>, t: Instant| {
        if i >= warmup {
            samples.push(t.elapsed().as_nanos() as u64);
        }
    };
    for kind in [Kind::Store, Kind::Load] {
        for batch in (0..total).step_by(BATCH) {
            let range = batch..(batch + BATCH).min(total);
            for i in range.clone() {
                let src = i % ROWS;
                let t = Instant::now();
                match kind {
                    Kind::Store => client::set_one(&mut conn, &names[i], primary.row(src))?,
                    Kind::Load => {
                        client::get_one(&mut conn, &names[i], primary.row(ROWS + src))?;
                    }
                }
                let samples = match kind {
                    Kind::Store => &mut r.client_set_ns,
                    Kind::Load => &mut r.client_get_ns,
                };
                timed(i, samples, t);
            }
            for i in range {
                let src = i % ROWS;
                let mut key = [0u8; KEY_LEN];
                write_key(NS_LATENCY, i as u64, &mut key);
                let row = match kind {
                    Kind::Store => src,
                    Kind::Load => {
                        // Poisoned, so a load that copies nothing fails the check.
                        primary.row(ROWS + src).fill(0xA5);
                        ROWS + src
                    }
                };
                let t = Instant::now();
                let submit = round_trip(&tier, ids.next(), &key, kind, row as i64)?;
                let (rt, sub) = match kind {
                    Kind::Store => (&mut r.store_ns, &mut r.submit_store_ns),
                    Kind::Load => (&mut r.load_ns, &mut r.submit_load_ns),
                };
                timed(i, rt, t);
                if i >= warmup {
                    sub.push(submit);
                }
                if kind == Kind::Load {
                    if let Some(at) = check_row(src as u64, primary.row(row)) {
                        return Err(format!("4 KiB load of key {i} differs at byte {at}"));
                    }
                    r.verified_bytes += B as u64;
                }
            }
            progress.add((BATCH as u64).min(total as u64));
        }
    }
    progress.finish();
    drop(tier);
    server.delete_prefix(&prefix)?;
    server.delete_prefix(&client_prefix)?;
    Ok(r)
}

/// Submits one job for `key` and spins until its result; returns the
/// submit call's own nanoseconds.
fn round_trip(tier: &Tier, id: u64, key: &[u8], kind: Kind, row: i64) -> Result<u64, String> {
    let t = Instant::now();
    tier.submit(kind, id, key, KEY_LEN, &[row])
        .map_err(|e| e.to_string())?;
    let submit = t.elapsed().as_nanos() as u64;
    let res = one_result(tier, true)?;
    if res.status != 0 || res.num_done != 1 {
        return Err(format!(
            "4 KiB {} job {id} failed: status {}",
            kind.name(),
            res.status
        ));
    }
    Ok(submit)
}

impl Results {
    pub fn report(&self, p: &Params, out: &mut Report) {
        let us = |v: &[u64], q: f64| percentile(v, q) as f64 / 1e3;
        let server = self.server.as_ref().expect("measured");
        let run = &server.runs[0];
        out.line(
            "latency",
            format!(
                "4 KiB blocks ({} B values), 1 job at a time, spin-polled; {} timed per direction after {} warm-up, client crate and tier alternating in batches of {BATCH}; server: redis-benchmark -c 1 -P 1 p50 over {} requests",
                B + HEADER,
                self.store_ns.len(),
                p.latency_iters / 5,
                server.requests
            ),
        );
        let mut fields = serde_json::Map::new();
        for (cmd, name, server_ms, client, tier) in [
            (
                "SET",
                "store",
                run.set_p50_ms,
                &self.client_set_ns,
                &self.store_ns,
            ),
            (
                "GET",
                "load",
                run.get_p50_ms,
                &self.client_get_ns,
                &self.load_ns,
            ),
        ] {
            let server_us = server_ms * 1e3;
            let (client_us, tier_us) = (us(client, 0.5), us(tier, 0.5));
            out.row(
                format!("4 KiB server bound {cmd}"),
                server_us,
                "us",
                "redis-benchmark 1 client, no pipeline, p50 (1 us resolution)".into(),
            );
            out.row(
                format!("4 KiB client crate {cmd}"),
                client_us,
                "us",
                format!(
                    "{}x server; median, p99 {} us",
                    num(client_us / server_us),
                    num(us(client, 0.99))
                ),
            );
            out.row(
                format!("4 KiB tier {name} round trip"),
                tier_us,
                "us",
                format!(
                    "{}x server, {}x client; median, p99 {} us",
                    num(tier_us / server_us),
                    num(tier_us / client_us),
                    num(us(tier, 0.99))
                ),
            )
            .target(
                format!("4 KiB {name} round trip <= 1.5x server p50"),
                tier_us / server_us,
                Cmp::AtMost,
                1.5,
            );
            let q = |v: &[u64], x| json!(percentile(v, x));
            fields.insert(
                format!("server_{}_4k_ns_p50", cmd.to_lowercase()),
                json!((server_ms * 1e6).round()),
            );
            fields.insert(format!("client_{name}_4k_ns_p50"), q(client, 0.5));
            fields.insert(format!("client_{name}_4k_ns_p99"), q(client, 0.99));
            fields.insert(format!("{name}_4k_ns_p50"), q(tier, 0.5));
            fields.insert(format!("{name}_4k_ns_p99"), q(tier, 0.99));
            fields.insert(format!("{name}_4k_over_server"), json!(tier_us / server_us));
            fields.insert(format!("{name}_4k_over_client"), json!(tier_us / client_us));
        }
        for (name, v) in [
            ("tier_submit_store", &self.submit_store_ns),
            ("tier_submit_load", &self.submit_load_ns),
        ] {
            out.row(
                format!("{name} call (1 x 4 KiB)"),
                percentile(v, 0.5) as f64,
                "ns",
                format!("median; p99 {} ns; caller's thread", percentile(v, 0.99)),
            );
            fields.insert(format!("{name}_call_ns_p50"), json!(percentile(v, 0.5)));
            fields.insert(format!("{name}_call_ns_p99"), json!(percentile(v, 0.99)));
        }
        for (k, v) in fields {
            out.field(&k, v);
        }
    }
}
