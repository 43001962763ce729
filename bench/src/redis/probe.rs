//! Redis backend, `sharing=shared` lookups of keys this process does not
//! hold: the lookup answers PENDING at once and a worker asks the server;
//! measured is the time from that first lookup to the verdict (HIT for a
//! key another tier stored, MISS for one nobody did), against the server's
//! round trip for the same question (`EXISTS` on one connection of the
//! redis crate), the two alternating in one run. Then the same for lookups
//! of 32 keys at once (half stored), against a pipeline of 32 `EXISTS`.
//!
//! Between lookups the caller sleeps (2 us, with a timer slack of 1 ns), as
//! an engine's scheduler loop does something else, rather than spinning: a
//! caller spinning on its core sees its own round trips answered faster than
//! a worker waiting on an idle core does, so the bound would be unfair
//! (docs/runs/redis.md). A sleep lasts what the machine gives it, though,
//! so each verdict is reported with the last lookup that still answered
//! PENDING: the verdict landed between the two.

use super::server::Server;
use super::{Params, NS_PROBE};
use crate::capi::{Tier, TIER_HIT, TIER_MISS, TIER_PENDING};
use crate::data::{keys, KEY_LEN};
use crate::jobs::{JobIds, Kind};
use crate::primary::Primary;
use crate::report::{num, Cmp, Report};
use crate::stats::percentile;
use std::time::{Duration, Instant};

const B: usize = 4096;
/// One-key lookups of stored keys (HIT verdicts), and as many of keys never
/// stored (MISS).
const SINGLES: usize = 2048;
/// Keys per batched lookup (half stored, half not), and how many lookups.
const BATCH: usize = 32;
const BATCHES: usize = 128;
/// Keys the writer stores, and as many never stored.
const KEYS: usize = SINGLES + BATCHES * BATCH / 2;
/// A verdict later than this is a failure of the run.
const VERDICT_LIMIT: Duration = Duration::from_secs(5);

/// Nanoseconds per sample.
pub struct Results {
    pub hit_ns: Vec<u64>,
    pub miss_ns: Vec<u64>,
    /// For each of `hit_ns` and `miss_ns`: when the last lookup that still
    /// answered PENDING began, so the verdict landed between the two.
    pub hit_pending_ns: Vec<u64>,
    pub miss_pending_ns: Vec<u64>,
    /// How long the caller's sleeps between lookups lasted.
    pub nap_ns: Vec<u64>,
    pub exists_ns: Vec<u64>,
    /// A batched lookup's last verdict, and the crate's pipeline of as many
    /// EXISTS.
    pub batch_ns: Vec<u64>,
    pub exists_pipeline_ns: Vec<u64>,
}

pub fn run(p: &Params, server: &Server) -> Result<Results, String> {
    let primary = Primary::new(64, B)?;
    let prefix = format!("{}-probe", p.prefix);
    let capacity = ((2 * KEYS + 64) * B) as u64;
    let shared = |prefix: &str| -> Result<_, String> {
        let mut c = p.config(server, prefix, capacity)?;
        c.set("sharing", "shared").map_err(|e| e.to_string())?;
        c.set("namespace", "kvtier-bench")
            .map_err(|e| e.to_string())?;
        Ok(c)
    };
    // The writer stores the keys; the reader, another tier on the same
    // keyspace, has never seen them.
    let writer = primary.tier(&shared(&prefix)?)?;
    let stored = keys(NS_PROBE, 0, KEYS);
    let absent = keys(NS_PROBE, KEYS as u64, KEYS);
    let mut ids = JobIds::default();
    primary
        .stream(Kind::Store, &stored, &primary.sources(KEYS), 16, 4)
        .run(&writer, &mut ids, |_| {})?;
    drop(writer);
    let reader = primary.tier(&shared(&prefix)?)?;
    let _slack = FineTimerSlack::new();
    let mut conn = server.connect()?;
    let mut r = Results {
        hit_ns: Vec::with_capacity(SINGLES),
        miss_ns: Vec::with_capacity(SINGLES),
        hit_pending_ns: Vec::with_capacity(SINGLES),
        miss_pending_ns: Vec::with_capacity(SINGLES),
        nap_ns: Vec::new(),
        exists_ns: Vec::with_capacity(SINGLES),
        batch_ns: Vec::with_capacity(BATCHES),
        exists_pipeline_ns: Vec::with_capacity(BATCHES),
    };
    let key = |set: &[u8], i: usize| set[i * KEY_LEN..(i + 1) * KEY_LEN].to_vec();
    for i in 0..SINGLES {
        // Alternating which goes first: the first probe after the EXISTS may
        // find every worker asleep and pay its wake-up.
        let (hit_first, hit, miss) = (i % 2 == 0, key(&stored, i), key(&absent, i));
        let hit_verdict = |r: &mut Results| -> Result<(), String> {
            let v = verdicts_ns(&reader, &hit, &[TIER_HIT], &mut r.nap_ns)?;
            r.hit_ns.push(v.verdict_ns);
            r.hit_pending_ns.push(v.pending_ns);
            Ok(())
        };
        if hit_first {
            hit_verdict(&mut r)?;
        }
        let v = verdicts_ns(&reader, &miss, &[TIER_MISS], &mut r.nap_ns)?;
        r.miss_ns.push(v.verdict_ns);
        r.miss_pending_ns.push(v.pending_ns);
        if !hit_first {
            hit_verdict(&mut r)?;
        }
        let name = format!("{prefix}:exists-probe:{i}");
        let start = Instant::now();
        let _: i64 = redis::cmd("EXISTS")
            .arg(&name)
            .query(&mut conn)
            .map_err(|e| format!("EXISTS: {e}"))?;
        r.exists_ns.push(start.elapsed().as_nanos() as u64);
    }
    for b in 0..BATCHES {
        // Stored and absent keys alternating, as a prefix the tier holds
        // only in part might be.
        let (mut batch, mut want) = (Vec::new(), Vec::new());
        for j in 0..BATCH / 2 {
            let i = SINGLES + b * BATCH / 2 + j;
            batch.extend(key(&stored, i));
            batch.extend(key(&absent, i));
            want.extend([TIER_HIT, TIER_MISS]);
        }
        r.batch_ns
            .push(verdicts_ns(&reader, &batch, &want, &mut r.nap_ns)?.verdict_ns);
        let mut pipe = redis::pipe();
        for j in 0..BATCH {
            pipe.cmd("EXISTS")
                .arg(format!("{prefix}:exists-probe:{b}:{j}"));
        }
        let start = Instant::now();
        let _: Vec<i64> = pipe
            .query(&mut conn)
            .map_err(|e| format!("EXISTS pipeline: {e}"))?;
        r.exists_pipeline_ns.push(start.elapsed().as_nanos() as u64);
    }
    drop(reader);
    server.delete_prefix(&prefix)?;
    Ok(r)
}

/// This thread's timer slack at 1 ns while it lives (sleeps of 2 us then
/// last about that long, not the default 50 us), the default after.
struct FineTimerSlack;

impl FineTimerSlack {
    fn new() -> FineTimerSlack {
        // SAFETY: PR_SET_TIMERSLACK takes a value and changes only this
        // thread's timer slack.
        unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong) };
        FineTimerSlack
    }
}

impl Drop for FineTimerSlack {
    fn drop(&mut self) {
        // SAFETY: as above; 0 restores the thread's default slack.
        unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 0 as libc::c_ulong) };
    }
}

/// When a verdict was seen, from the first lookup (nanoseconds).
struct Verdict {
    /// The lookup that answered it returned.
    verdict_ns: u64,
    /// The last lookup that still answered PENDING began.
    pending_ns: u64,
}

/// From a lookup of `keys` that must answer PENDING for every key to the
/// one that answers `want`, looking up again after sleeping 2 us (each
/// sleep's length added to `naps`).
fn verdicts_ns(
    tier: &Tier,
    keys: &[u8],
    want: &[u8],
    naps: &mut Vec<u64>,
) -> Result<Verdict, String> {
    let mut states = vec![0u8; want.len()];
    let start = Instant::now();
    let mut pending_ns = 0;
    tier.lookup(keys, KEY_LEN, &mut states)
        .map_err(|e| e.to_string())?;
    if let Some(s) = states.iter().find(|&&s| s != TIER_PENDING) {
        return Err(format!(
            "a key this tier never held was answered {s} without a probe"
        ));
    }
    loop {
        let nap = Instant::now();
        std::thread::sleep(Duration::from_micros(2));
        naps.push(nap.elapsed().as_nanos() as u64);
        let asked_ns = start.elapsed().as_nanos() as u64;
        tier.lookup(keys, KEY_LEN, &mut states)
            .map_err(|e| e.to_string())?;
        if states == want {
            return Ok(Verdict {
                verdict_ns: start.elapsed().as_nanos() as u64,
                pending_ns,
            });
        }
        pending_ns = asked_ns;
        if let Some((s, w)) = states
            .iter()
            .zip(want)
            .find(|&(s, w)| s != w && *s != TIER_PENDING)
        {
            return Err(format!("a probe answered {s} where {w} was due"));
        }
        if start.elapsed() > VERDICT_LIMIT {
            return Err("a probe's verdict did not arrive within 5 s".into());
        }
    }
}

impl Results {
    pub fn report(&self, out: &mut Report) {
        let us = |v: &[u64], q: f64| percentile(v, q) as f64 / 1e3;
        let exists = us(&self.exists_ns, 0.5);
        out.row(
            "shared lookup: EXISTS round trip",
            exists,
            "us",
            format!(
                "the server's answer to the same question: the redis crate alone, one connection, median of {}; p99 {} us",
                self.exists_ns.len(),
                num(us(&self.exists_ns, 0.99))
            ),
        );
        let nap = us(&self.nap_ns, 0.5);
        for (what, ns, pending, key) in [
            ("HIT", &self.hit_ns, &self.hit_pending_ns, "probe_hit"),
            ("MISS", &self.miss_ns, &self.miss_pending_ns, "probe_miss"),
        ] {
            let ratio = us(ns, 0.5) / exists;
            out.row(
                format!("shared lookup: PENDING to {what}"),
                us(ns, 0.5),
                "us",
                format!(
                    "{}x the EXISTS round trip; first lookup PENDING, then looked up until the verdict; median of {}, p99 {} us; still PENDING at {} us (the verdict landed between; a 2 us sleep between lookups lasted {} us)",
                    num(ratio),
                    ns.len(),
                    num(us(ns, 0.99)),
                    num(us(pending, 0.5)),
                    num(nap)
                ),
            )
            .target(
                format!("shared lookup verdict ({what}) <= 2x one server round trip"),
                ratio,
                Cmp::AtMost,
                2.0,
            );
            out.field(&format!("{key}_us"), us(ns, 0.5));
            out.field(&format!("{key}_over_exists"), ratio);
            out.field(&format!("{key}_pending_us"), us(pending, 0.5));
        }
        out.field("exists_us", exists);
        out.field("lookup_nap_us", nap);
        let pipeline = us(&self.exists_pipeline_ns, 0.5);
        out.row(
            format!("shared lookup: {BATCH} EXISTS pipelined"),
            pipeline,
            "us",
            format!(
                "the redis crate alone, one connection, median of {}; p99 {} us",
                self.exists_pipeline_ns.len(),
                num(us(&self.exists_pipeline_ns, 0.99))
            ),
        );
        let batch = us(&self.batch_ns, 0.5);
        out.row(
            format!("shared lookup of {BATCH} keys: PENDING to all verdicts"),
            batch,
            "us",
            format!(
                "{}x the pipeline; half HIT, half MISS; median of {}, p99 {} us",
                num(batch / pipeline),
                self.batch_ns.len(),
                num(us(&self.batch_ns, 0.99))
            ),
        );
        out.field("probe_batch_us", batch);
        out.field("exists_pipeline_us", pipeline);
    }
}
