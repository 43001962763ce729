//! The command line: every flag (parsed by clap, which also writes `--help`
//! and the usage errors) and the settings they resolve to once `--quick` and
//! the defaults are applied.

use clap::{Parser, ValueEnum};
use std::path::PathBuf;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Backend {
    /// against memcpy
    Memory,
    /// against raw O_DIRECT file I/O on the same directory
    Disk,
    /// against the redis crate alone and redis-benchmark, on the same server
    Redis,
}

/// Benchmarks kvtier through its C ABI (memory backend by default).
///
/// Measures store/load bandwidth of large jobs against a memcpy baseline with
/// the same thread count (verifying every byte), 4 KiB job round-trip latency,
/// lookup and touch cost per key at 1K and 1M resident blocks, and memory per
/// resident block. Prints a table on stdout (or JSON with --json) and progress
/// on stderr. Exits non-zero if any job fails or any byte differs; missed speed
/// targets are reported, not fatal.
#[derive(Parser, Debug)]
#[command(name = "kvtier-bench")]
struct Cli {
    /// the backend measured; disk covers bandwidth, a full tier's stores, 4
    /// KiB round trips, 64 KiB blocks/s, lookup and restart recovery of
    /// 100,000 blocks, with the page cache bypassed; redis covers 2 MiB and
    /// 64 KiB bandwidth, 4 KiB round trips, lookup and shared lookups'
    /// verdicts against the redis crate alone and redis-benchmark (skipped,
    /// exit 0, if redis-server is missing, unless KVTIER_REQUIRE_REDIS=1)
    #[arg(long, value_enum, default_value_t = Backend::Memory)]
    backend: Backend,
    /// disk: scratch directory (default: a new one under the system temp
    /// dir); its contents are deleted
    #[arg(long, value_name = "PATH")]
    dir: Option<PathBuf>,
    /// memory: run the bandwidth phase on a persistent arena (the tier's
    /// persist_path) in a new directory under DIR (tmpfs or hugetlbfs), then
    /// the reopen phase; the first-fill phase (anonymous memory's page
    /// policies) is skipped. The directory is deleted at the end.
    #[arg(long, value_name = "DIR")]
    persist_path: Option<PathBuf>,
    /// memory with --persist-path: the reopen phase's arena, filled, freed
    /// and reopened --repeat times, in GiB [default: 4; --quick 0.25]
    #[arg(long, value_name = "X", value_parser = positive)]
    reopen_gib: Option<f64>,
    /// redis: a single server to use, redis://127.0.0.1:PORT (default: start
    /// redis-server on a free loopback port in a temp dir, stopped at the end)
    #[arg(long, value_name = "URL")]
    url: Option<String>,
    /// redis: the tier's `connections` [default: one per I/O thread]
    #[arg(long, value_name = "N", value_parser = at_least::<1>)]
    connections: Option<usize>,
    /// disk: the tier's io_timeout_ms, 0 for none (to measure what the
    /// deadline costs) [default: the library's, auto]
    #[arg(long, value_name = "MS")]
    io_timeout_ms: Option<u32>,
    /// disk: blocks stored before the timed reopen [default: 100000]
    #[arg(long, value_name = "N", value_parser = at_least::<1>)]
    recovery_blocks: Option<usize>,
    /// disk: keep the recovery phase's blocks in this directory and reuse them
    /// in later runs with the same --recovery-blocks (filling 1,000,000 blocks
    /// takes minutes; deleting them too); it is never deleted
    #[arg(long, value_name = "PATH")]
    recovery_dir: Option<PathBuf>,
    /// disk: run only the restart recovery phase
    #[arg(long)]
    recovery_only: bool,
    /// tier worker threads, and memcpy / raw I/O baseline threads [default:
    /// the library default, min(cores, 4), for memory; 64 for disk; 8 for redis]
    #[arg(long, value_name = "N", value_parser = io_threads)]
    io_threads: Option<usize>,
    /// data moved per direction per repetition, in GiB [default: 2]
    #[arg(long, value_name = "X", value_parser = positive)]
    gib: Option<f64>,
    /// bandwidth block size: bytes or KiB/MiB/GiB [default: 2MiB]
    #[arg(long, value_name = "SIZE", value_parser = block_size)]
    block_bytes: Option<usize>,
    /// blocks per bandwidth job [default: 16]
    #[arg(long, value_name = "N", value_parser = at_least::<1>)]
    job_blocks: Option<usize>,
    /// bandwidth jobs kept in flight [default: 2 x io_threads; 4 for disk
    /// and redis]
    #[arg(long, value_name = "N", value_parser = at_least::<1>)]
    window: Option<usize>,
    /// bandwidth repetitions, reported as median/min/max [default: 3]
    #[arg(long, value_name = "N", value_parser = at_least::<1>)]
    repeat: Option<usize>,
    /// timed 4 KiB jobs per direction, after a warm-up of a tenth as many
    /// [default: 20000]
    #[arg(long, value_name = "N", value_parser = at_least::<1>)]
    latency_iters: Option<usize>,
    /// resident blocks of the large lookup and memory measurement; the small
    /// one is 1000 [default: 1000000]
    #[arg(long, value_name = "N", value_parser = at_least::<1000>)]
    lookup_blocks: Option<usize>,
    /// keys per tier_lookup / tier_touch call [default: 64]
    #[arg(long, value_name = "N", value_parser = at_least::<1>)]
    lookup_batch: Option<usize>,
    /// tiny sizes, a few seconds in all (CI smoke test); every byte is still
    /// verified. Explicit flags override it.
    #[arg(long)]
    quick: bool,
    /// print one JSON object on stdout instead of the table
    #[arg(long)]
    json: bool,
    /// skip the bandwidth phase (memory and redis backends: redis's at
    /// --block-bytes; refused with disk)
    #[arg(long)]
    skip_bandwidth: bool,
    /// skip the 64 KiB bandwidth phase (redis backend; refused with another)
    #[arg(long)]
    skip_small_blocks: bool,
    /// skip the first-fill phase (memory backend; refused with another): cold
    /// stores against the page-population bound, prefault=full and
    /// background, page policies
    #[arg(long)]
    skip_first_fill: bool,
    /// skip the 4 KiB latency phase (memory and redis backends; refused
    /// with disk)
    #[arg(long)]
    skip_latency: bool,
    /// skip the lookup, touch and memory phase (memory backend), or the
    /// lookup and shared lookups' verdicts (redis); refused with disk
    #[arg(long)]
    skip_lookup: bool,
    /// no progress output on stderr
    #[arg(long)]
    no_progress: bool,
}

/// Counts accept `_` separators (`1_000_000`), as the hand-written parser did.
fn at_least<const MIN: usize>(value: &str) -> Result<usize, String> {
    match value.replace('_', "").parse::<usize>() {
        Ok(n) if n >= MIN => Ok(n),
        _ => Err(format!("expected an integer >= {MIN}")),
    }
}

fn io_threads(value: &str) -> Result<usize, String> {
    let n = at_least::<1>(value)?;
    if n > kvtier::MAX_IO_THREADS {
        return Err(format!("at most {}", kvtier::MAX_IO_THREADS));
    }
    Ok(n)
}

fn positive(value: &str) -> Result<f64, String> {
    match value.parse::<f64>() {
        Ok(x) if x > 0.0 && x.is_finite() => Ok(x),
        _ => Err("expected a positive number".into()),
    }
}

/// The library's own size syntax, so `--block-bytes` reads like its config.
fn block_size(value: &str) -> Result<usize, String> {
    let bytes = kvtier::parse_size("--block-bytes", value).map_err(|e| e.message().to_string())?;
    if bytes == 0 || bytes > 1 << 30 {
        return Err("outside 1 byte ..= 1 GiB".into());
    }
    Ok(bytes as usize)
}

/// Every setting, with --quick and the defaults applied.
#[derive(Debug)]
pub struct Settings {
    pub backend: Backend,
    pub dir: Option<PathBuf>,
    pub persist_path: Option<PathBuf>,
    pub reopen_bytes: u64,
    /// Whether --reopen-gib was given.
    pub reopen_given: bool,
    pub url: Option<String>,
    pub connections: Option<usize>,
    pub recovery_blocks: usize,
    pub recovery_dir: Option<PathBuf>,
    pub recovery_only: bool,
    pub io_timeout_ms: Option<u32>,
    pub quick: bool,
    pub json: bool,
    pub progress: bool,
    pub skip_bandwidth: bool,
    pub skip_small_blocks: bool,
    pub skip_first_fill: bool,
    pub skip_latency: bool,
    pub skip_lookup: bool,
    pub io_threads: Option<usize>,
    pub data_bytes: u64,
    /// Whether --gib was given (a backend may then pick its own default).
    pub data_bytes_given: bool,
    pub block_bytes: usize,
    pub job_blocks: usize,
    pub window: Option<usize>,
    pub repeat: usize,
    pub latency_iters: usize,
    pub latency_warmup: usize,
    pub lookup_small: usize,
    pub lookup_large: usize,
    pub lookup_batch: usize,
    pub lookup_pool_keys: usize,
    pub lookup_runs: usize,
    pub lookup_run_secs: f64,
}

impl Settings {
    /// Parses the process's arguments; on a usage error or `--help`, clap
    /// prints and exits (status 2 and 0).
    pub fn from_args(args: impl IntoIterator<Item = std::ffi::OsString>) -> Settings {
        let settings = Settings::from(Cli::parse_from(args));
        if let Err(e) = settings.check() {
            e.exit();
        }
        settings
    }

    #[cfg(test)]
    fn try_parse(args: &[&str]) -> Result<Settings, clap::Error> {
        let argv = std::iter::once("kvtier-bench").chain(args.iter().copied());
        let settings = Cli::try_parse_from(argv).map(Settings::from)?;
        settings.check().map(|()| settings)
    }

    /// Refuses flags the chosen backend would ignore: each phase flag names
    /// the backends that have that phase (the disk run always measures every
    /// phase), and a run that silently did what it was told not to would be
    /// read as something it is not.
    fn check(&self) -> Result<(), clap::Error> {
        use clap::CommandFactory;
        use Backend::{Memory, Redis};
        let skips: [(&str, bool, &[Backend]); 5] = [
            ("--skip-bandwidth", self.skip_bandwidth, &[Memory, Redis]),
            ("--skip-small-blocks", self.skip_small_blocks, &[Redis]),
            ("--skip-first-fill", self.skip_first_fill, &[Memory]),
            ("--skip-latency", self.skip_latency, &[Memory, Redis]),
            ("--skip-lookup", self.skip_lookup, &[Memory, Redis]),
        ];
        let name = |b: Backend| {
            b.to_possible_value()
                .map_or_else(String::new, |v| v.get_name().to_owned())
        };
        if self.persist_path.is_some() && self.backend != Memory {
            return Err(Cli::command().error(
                clap::error::ErrorKind::ArgumentConflict,
                "--persist-path applies to --backend memory only",
            ));
        }
        if self.reopen_given && self.persist_path.is_none() {
            return Err(Cli::command().error(
                clap::error::ErrorKind::ArgumentConflict,
                "--reopen-gib needs --persist-path",
            ));
        }
        match skips
            .iter()
            .find(|(_, given, backends)| *given && !backends.contains(&self.backend))
        {
            Some((flag, _, backends)) => Err(Cli::command().error(
                clap::error::ErrorKind::ArgumentConflict,
                format!(
                    "{flag} applies to --backend {} only, not {}",
                    backends
                        .iter()
                        .map(|&b| name(b))
                        .collect::<Vec<_>>()
                        .join(" or "),
                    name(self.backend)
                ),
            )),
            None => Ok(()),
        }
    }
}

impl From<Cli> for Settings {
    fn from(c: Cli) -> Settings {
        let quick = c.quick;
        let pick = |given: Option<usize>, quick_value: usize, full_value: usize| {
            given.unwrap_or(if quick { quick_value } else { full_value })
        };
        let latency_iters = pick(c.latency_iters, 2_000, 20_000);
        let gib = c.gib.unwrap_or(if quick { 0.125 } else { 2.0 });
        Settings {
            backend: c.backend,
            dir: c.dir,
            persist_path: c.persist_path,
            reopen_bytes: (c.reopen_gib.unwrap_or(if quick { 0.25 } else { 4.0 })
                * (1u64 << 30) as f64) as u64,
            reopen_given: c.reopen_gib.is_some(),
            url: c.url,
            connections: c.connections,
            recovery_blocks: pick(c.recovery_blocks, 2_000, 100_000),
            recovery_dir: c.recovery_dir,
            recovery_only: c.recovery_only,
            io_timeout_ms: c.io_timeout_ms,
            quick,
            json: c.json,
            progress: !c.no_progress,
            skip_bandwidth: c.skip_bandwidth,
            skip_small_blocks: c.skip_small_blocks,
            skip_first_fill: c.skip_first_fill,
            skip_latency: c.skip_latency,
            skip_lookup: c.skip_lookup,
            io_threads: c.io_threads,
            data_bytes: (gib * (1u64 << 30) as f64) as u64,
            data_bytes_given: c.gib.is_some(),
            block_bytes: c.block_bytes.unwrap_or(2 << 20),
            job_blocks: c.job_blocks.unwrap_or(16),
            window: c.window,
            repeat: pick(c.repeat, 2, 3),
            latency_iters,
            latency_warmup: (latency_iters / 10).max(100),
            lookup_small: 1_000,
            lookup_large: pick(c.lookup_blocks, 100_000, 1_000_000),
            lookup_batch: c.lookup_batch.unwrap_or(64),
            lookup_pool_keys: if quick { 1 << 16 } else { 1 << 20 },
            lookup_runs: if quick { 3 } else { 10 },
            lookup_run_secs: if quick { 0.02 } else { 0.06 },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clap_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    #[test]
    fn defaults_quick_and_overrides() {
        let d = Settings::try_parse(&[]).unwrap();
        assert_eq!(d.backend, Backend::Memory);
        assert_eq!(d.data_bytes, 2 << 30);
        assert_eq!((d.block_bytes, d.job_blocks, d.repeat), (2 << 20, 16, 3));
        assert_eq!((d.lookup_large, d.lookup_batch), (1_000_000, 64));
        assert!(d.progress);
        let q = Settings::try_parse(&["--quick", "--repeat=5", "--block-bytes", "1MiB"]).unwrap();
        assert!(q.quick);
        assert_eq!(
            (q.repeat, q.block_bytes, q.data_bytes),
            (5, 1 << 20, 128 << 20)
        );
        let t = Settings::try_parse(&["--io-threads", "3", "--lookup-blocks", "2_000"]).unwrap();
        assert_eq!((t.io_threads, t.lookup_large), (Some(3), 2_000));
        let disk = Settings::try_parse(&[
            "--backend",
            "disk",
            "--quick",
            "--no-progress",
            "--dir",
            "/x",
        ])
        .unwrap();
        assert_eq!(disk.backend, Backend::Disk);
        assert!(!disk.progress);
        assert_eq!(disk.dir.as_deref(), Some(std::path::Path::new("/x")));
        let redis = Settings::try_parse(&[
            "--backend",
            "redis",
            "--url",
            "redis://127.0.0.1:7000",
            "--connections",
            "2",
        ])
        .unwrap();
        assert_eq!(redis.backend, Backend::Redis);
        assert_eq!(redis.url.as_deref(), Some("redis://127.0.0.1:7000"));
        assert_eq!(redis.connections, Some(2));
        assert!(!redis.data_bytes_given);
    }

    #[test]
    fn bad_flags_are_errors() {
        for bad in [
            &["--nope"][..],
            &["--io-threads"],
            &["--io-threads", "0"],
            &["--io-threads", "100000"],
            &["--gib", "-1"],
            &["--block-bytes", "2MB"],
            &["--repeat", "x"],
            &["--lookup-blocks", "10"],
            &["--backend", "tape"],
            &["--backend", "redis", "--skip-first-fill"],
            &["--skip-small-blocks"],
            &["--backend", "disk", "--skip-bandwidth"],
            &["--backend", "disk", "--skip-small-blocks"],
            &["--backend", "disk", "--persist-path", "/dev/shm"],
            &["--reopen-gib", "1"],
        ] {
            assert!(Settings::try_parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_bad_size_names_its_flag() {
        let e = Settings::try_parse(&["--block-bytes", "2MB"]).unwrap_err();
        let text = e.to_string();
        assert!(text.contains("--block-bytes: \"2MB\""), "{text}");
        assert!(!text.contains("capacity_bytes"), "{text}");
    }

    #[test]
    fn phase_flags_go_with_the_backends_that_have_the_phase() {
        let redis = Settings::try_parse(&[
            "--backend",
            "redis",
            "--skip-bandwidth",
            "--skip-small-blocks",
            "--skip-latency",
            "--skip-lookup",
        ])
        .unwrap();
        assert!(redis.skip_bandwidth && redis.skip_small_blocks);
        assert!(redis.skip_latency && redis.skip_lookup);
        let persist =
            Settings::try_parse(&["--persist-path", "/dev/shm", "--reopen-gib", "0.5"]).unwrap();
        assert_eq!(persist.reopen_bytes, 512 << 20);
        let memory = Settings::try_parse(&["--skip-first-fill", "--skip-lookup"]).unwrap();
        assert!(memory.skip_first_fill && memory.skip_lookup);
        let e = Settings::try_parse(&["--backend", "disk", "--skip-latency"]).unwrap_err();
        assert!(e.to_string().contains("memory or redis"), "{e}");
    }
}
