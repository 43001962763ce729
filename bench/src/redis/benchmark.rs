//! The server's own bound: `redis-benchmark -t set,get` with the value size
//! kvtier writes (block + header), for a few connection x pipeline settings;
//! the best requests/s of each command, as payload GB/s.

use super::server::{find_on_path, Server};
use serde::Serialize;
use std::process::Command;

/// One setting's answer.
#[derive(Clone, Serialize)]
pub struct Run {
    pub clients: usize,
    pub pipeline: usize,
    pub set_rps: f64,
    pub get_rps: f64,
    pub set_p50_ms: f64,
    pub get_p50_ms: f64,
}

/// The best of the settings for one value size.
#[derive(Clone, Serialize)]
pub struct Bound {
    pub value_bytes: usize,
    pub requests: usize,
    pub runs: Vec<Run>,
    pub set_rps: f64,
    pub get_rps: f64,
    /// "clients x pipeline" of the best SET and GET runs.
    pub set_best: String,
    pub get_best: String,
}

impl Bound {
    /// Payload GB/s of `rps` requests of `block` bytes each.
    pub fn set_gbps(&self, block: usize) -> f64 {
        self.set_rps * block as f64 / 1e9
    }

    pub fn get_gbps(&self, block: usize) -> f64 {
        self.get_rps * block as f64 / 1e9
    }
}

pub fn available() -> bool {
    find_on_path("redis-benchmark").is_some()
}

/// Runs `redis-benchmark -t set,get -d value_bytes -n requests -P p -c c
/// -q --csv` for each `(c, p)` and keeps the best requests/s per command.
pub fn run(
    server: &Server,
    value_bytes: usize,
    requests: usize,
    settings: &[(usize, usize)],
) -> Result<Bound, String> {
    let mut runs = Vec::new();
    for &(clients, pipeline) in settings {
        let text = redis_benchmark(
            server,
            "set,get",
            None,
            value_bytes,
            requests,
            clients,
            pipeline,
        )?;
        let (set_rps, set_p50_ms) = parse_csv(&text, "SET")?;
        let (get_rps, get_p50_ms) = parse_csv(&text, "GET")?;
        runs.push(Run {
            clients,
            pipeline,
            set_rps,
            get_rps,
            set_p50_ms,
            get_p50_ms,
        });
    }
    let best = |rps: fn(&Run) -> f64| {
        runs.iter()
            .max_by(|a, b| rps(a).total_cmp(&rps(b)))
            .expect("at least one setting")
            .clone()
    };
    let (set, get) = (best(|r| r.set_rps), best(|r| r.get_rps));
    Ok(Bound {
        value_bytes,
        requests,
        set_rps: set.set_rps,
        get_rps: get.get_rps,
        set_best: format!("{}x{}", set.clients, set.pipeline),
        get_best: format!("{}x{}", get.clients, get.pipeline),
        runs,
    })
}

/// Keys `fresh_set_rps` draws from. redis-benchmark parses `-r` with `atoi`
/// into an `int`: the 10^12 used before wrapped negative, which it reads as
/// "no random keys", so every SET overwrote one key (the best case this
/// bound exists to avoid). 10^9 fits; n keys drawn from it rarely collide.
pub const FRESH_KEYSPACE: u64 = 1_000_000_000;

/// The best of several settings' requests/s for one command, and which
/// setting it was.
#[derive(Clone, Serialize)]
pub struct Best {
    pub rps: f64,
    /// "clients x pipeline".
    pub setting: String,
    /// The server's minor page faults per request in the best setting,
    /// where counted.
    pub faults_per_request: Option<f64>,
}

impl Best {
    fn of(runs: impl IntoIterator<Item = ((usize, usize), f64)>) -> Best {
        Best::of_counted(runs.into_iter().map(|(setting, rps)| (setting, rps, None)))
    }

    fn of_counted(runs: impl IntoIterator<Item = ((usize, usize), f64, Option<f64>)>) -> Best {
        let ((clients, pipeline), rps, faults_per_request) = runs
            .into_iter()
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .expect("at least one setting");
        Best {
            rps,
            setting: format!("{clients}x{pipeline}"),
            faults_per_request,
        }
    }

    /// Payload GB/s of `block`-byte blocks at this rate.
    pub fn gbps(&self, block: usize) -> f64 {
        self.rps * block as f64 / 1e9
    }
}

/// SET requests/s with every request on its own key (`-r`: keys drawn from
/// 10^9, so practically never repeated), the best of `settings`: what
/// storing new blocks costs the server (fresh memory), which the best-case
/// bound above (one key overwritten) never pays. The keys of each setting
/// are deleted before the next (untimed), after checking that there were
/// about `requests` of them, and the server's free memory is released
/// before each, so that every setting faults its memory in, as the tier's
/// first fill does (the server's faults per SET are recorded).
pub fn fresh_set_best(
    server: &Server,
    value_bytes: usize,
    requests: usize,
    settings: &[(usize, usize)],
) -> Result<Best, String> {
    let mut runs = Vec::new();
    let pid = server.started_here().and_then(|_| server.pid());
    for &(clients, pipeline) in settings {
        // Each setting into fresh memory, not the previous one's freed.
        server.release_free_memory()?;
        let faults_before = server.minor_faults(pid);
        let text = redis_benchmark(
            server,
            "set",
            Some(FRESH_KEYSPACE),
            value_bytes,
            requests,
            clients,
            pipeline,
        )?;
        let faults = match (faults_before, server.minor_faults(pid)) {
            (Some(a), Some(b)) => Some((b - a) as f64 / requests as f64),
            _ => None,
        };
        runs.push(((clients, pipeline), parse_csv(&text, "SET")?.0, faults));
        let keys = server.delete_prefix("key:")?;
        if keys < (requests as u64 * 9).div_ceil(10) {
            return Err(format!(
                "redis-benchmark -r left {keys} keys after {requests} SETs: not a new key per SET"
            ));
        }
    }
    Ok(Best::of_counted(runs))
}

/// SET and GET requests/s over `keys` existing keys (`-r keys`, each
/// request on a key drawn at random), each the best of `settings`: the
/// server reading and replacing values all over as much memory as the
/// tier's passes use, where the best-case bound works on one value that
/// stays in the CPU's caches. A SET here replaces a value, as a full tier's
/// stores do (one DEL each), so the server reuses memory instead of
/// faulting it in. Creates the keys first (`key:<12 digits>`, as
/// redis-benchmark names them; untimed) and deletes them at the end.
pub fn many_keys_best(
    server: &Server,
    value_bytes: usize,
    keys: usize,
    settings: &[(usize, usize)],
) -> Result<(Best, Best), String> {
    let mut c = server.connect()?;
    let value = vec![0x5au8; value_bytes];
    for first in (0..keys).step_by(16) {
        let mut pipe = redis::pipe();
        for i in first..(first + 16).min(keys) {
            pipe.cmd("SET").arg(format!("key:{i:012}")).arg(&value);
        }
        pipe.query::<()>(&mut c)
            .map_err(|e| format!("creating redis-benchmark's keys: {e}"))?;
    }
    let (mut sets, mut gets) = (Vec::new(), Vec::new());
    for &(clients, pipeline) in settings {
        let text = redis_benchmark(
            server,
            "set,get",
            Some(keys as u64),
            value_bytes,
            keys,
            clients,
            pipeline,
        )?;
        sets.push(((clients, pipeline), parse_csv(&text, "SET")?.0));
        gets.push(((clients, pipeline), parse_csv(&text, "GET")?.0));
    }
    server.delete_prefix("key:")?;
    Ok((Best::of(sets), Best::of(gets)))
}

/// Runs `redis-benchmark -t tests -d value_bytes [-r keyspace] -n requests
/// -P pipeline -c clients -q --csv` against `server`; its CSV output.
fn redis_benchmark(
    server: &Server,
    tests: &str,
    keyspace: Option<u64>,
    value_bytes: usize,
    requests: usize,
    clients: usize,
    pipeline: usize,
) -> Result<String, String> {
    let mut cmd = Command::new("redis-benchmark");
    if server.url.contains('@') {
        // A password: redis-benchmark takes the URI as is.
        cmd.args(["-u", &server.url]);
    } else {
        cmd.args(["-h", &server.host, "-p", &server.port.to_string()]);
    }
    cmd.args(["-t", tests, "-d", &value_bytes.to_string()]);
    if let Some(keyspace) = keyspace {
        cmd.args(["-r", &keyspace.to_string()]);
    }
    let out = cmd
        .args(["-n", &requests.to_string()])
        .args(["-P", &pipeline.to_string()])
        .args(["-c", &clients.to_string()])
        .args(["-q", "--csv"])
        .output()
        .map_err(|e| format!("cannot run redis-benchmark: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        return Err(format!(
            "redis-benchmark -t {tests} -c {clients} -P {pipeline} -d {value_bytes} failed ({}): {}{}",
            out.status,
            text.trim(),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(text)
}

/// Requests/s and p50 latency (ms) of `test` in redis-benchmark's CSV
/// (`"test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms",...`).
/// A run too short to time ("inf") counts as 0 requests/s.
fn parse_csv(text: &str, test: &str) -> Result<(f64, f64), String> {
    let quoted = format!("\"{test}\"");
    let line = text
        .lines()
        .find(|l| l.split(',').next() == Some(quoted.as_str()))
        .ok_or_else(|| format!("redis-benchmark printed no {test} line: {}", text.trim()))?;
    let field = |i: usize| {
        line.split(',')
            .nth(i)
            .map(|f| f.trim_matches('"'))
            .and_then(|f| f.parse::<f64>().ok())
            .filter(|x| x.is_finite())
    };
    Ok((field(1).unwrap_or(0.0), field(4).unwrap_or(f64::NAN)))
}

#[cfg(test)]
mod tests {
    use super::parse_csv;

    #[test]
    fn csv_lines_parse() {
        let text = "\"test\",\"rps\",\"avg_latency_ms\",\"min_latency_ms\",\"p50_latency_ms\",\"p95_latency_ms\",\"p99_latency_ms\",\"max_latency_ms\"\n\"SET\",\"18726.59\",\"0.049\",\"0.016\",\"0.047\",\"0.071\",\"0.135\",\"3.623\"\n\"GET\",\"inf\",\"0.056\",\"0.016\",\"0.055\",\"0.103\",\"0.159\",\"0.903\"\n";
        assert_eq!(parse_csv(text, "SET").unwrap(), (18726.59, 0.047));
        assert_eq!(parse_csv(text, "GET").unwrap(), (0.0, 0.055));
        assert!(parse_csv(text, "PING").is_err());
    }
}
