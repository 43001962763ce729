//! Command-line flags (hand-parsed: no dependencies).

pub const HELP: &str = "\
kvtier-bench: benchmarks kvtier through its C ABI (memory backend by default).

Measures store/load bandwidth of large jobs against a memcpy baseline with the
same thread count (verifying every byte), 4 KiB job round-trip latency, lookup
and touch cost per key at 1K and 1M resident blocks, and memory per resident
block. Prints a table on stdout (or JSON with --json) and progress on stderr.
Exits non-zero if any job fails or any byte differs; missed speed targets are
reported, not fatal.

USAGE: kvtier-bench [OPTIONS]

OPTIONS:
  --backend memory|disk
                       memory (default): against memcpy. disk: against raw
                       O_DIRECT file I/O on the same directory (bandwidth,
                       4 KiB round trips, 64 KiB blocks/s, lookup, restart
                       recovery of 100,000 blocks); page cache bypassed
  --dir PATH           disk: scratch directory (default: a new one under the
                       system temp dir); its contents are deleted
  --recovery-blocks N  disk: blocks stored before the timed reopen (default 100000)
  --io-threads N       tier worker threads, and memcpy / raw I/O baseline threads
                       (default: the library default, min(cores, 4) for
                       memory, 8 for disk)
  --gib X              data moved per direction per repetition, in GiB (default 2)
  --block-bytes SIZE   bandwidth block size: bytes or KiB/MiB/GiB (default 2MiB)
  --job-blocks N       blocks per bandwidth job (default 16)
  --window N           bandwidth jobs kept in flight (default 2 x io_threads)
  --repeat N           bandwidth repetitions, reported as median/min/max (default 3)
  --latency-iters N    timed 4 KiB jobs per direction (default 20000, after
                       a warm-up of a tenth as many)
  --lookup-blocks N    resident blocks of the large lookup and memory
                       measurement (default 1000000; the small one is 1000)
  --lookup-batch N     keys per tier_lookup / tier_touch call (default 64)
  --quick              tiny sizes, a few seconds in all (CI smoke test); every
                       byte is still verified. Explicit flags override it.
  --json               print one JSON object on stdout instead of the table
  --skip-bandwidth     skip the bandwidth phase
  --skip-latency       skip the 4 KiB latency phase
  --skip-lookup        skip the lookup, touch and memory phase
  --no-progress        no progress output on stderr
  -h, --help           this text
";

#[derive(Debug, Default)]
struct Given {
    io_threads: Option<usize>,
    gib: Option<f64>,
    block_bytes: Option<usize>,
    job_blocks: Option<usize>,
    window: Option<usize>,
    repeat: Option<usize>,
    latency_iters: Option<usize>,
    lookup_blocks: Option<usize>,
    lookup_batch: Option<usize>,
    recovery_blocks: Option<usize>,
}

/// Every setting, with --quick and the defaults applied.
#[derive(Debug)]
pub struct Settings {
    pub disk: bool,
    pub dir: Option<std::path::PathBuf>,
    pub recovery_blocks: usize,
    pub help: bool,
    pub quick: bool,
    pub json: bool,
    pub progress: bool,
    pub skip_bandwidth: bool,
    pub skip_latency: bool,
    pub skip_lookup: bool,
    pub io_threads: Option<usize>,
    pub data_bytes: u64,
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

fn count(flag: &str, value: &str, min: usize) -> Result<usize, String> {
    match value.replace('_', "").parse::<usize>() {
        Ok(n) if n >= min => Ok(n),
        _ => Err(format!(
            "{flag}: expected an integer >= {min}, got {value:?}"
        )),
    }
}

impl Settings {
    pub fn parse(args: impl IntoIterator<Item = String>) -> Result<Settings, String> {
        let mut given = Given::default();
        let (mut help, mut quick, mut json, mut progress) = (false, false, false, true);
        let (mut skip_bandwidth, mut skip_latency, mut skip_lookup) = (false, false, false);
        let (mut disk, mut dir) = (false, None);
        let mut args = args.into_iter();
        while let Some(arg) = args.next() {
            let (flag, inline) = match arg.split_once('=') {
                Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
                _ => (arg.clone(), None),
            };
            let mut value = |flag: &str| -> Result<String, String> {
                inline
                    .clone()
                    .or_else(|| args.next())
                    .ok_or_else(|| format!("{flag} needs a value"))
            };
            match flag.as_str() {
                "-h" | "--help" => help = true,
                "--quick" => quick = true,
                "--json" => json = true,
                "--no-progress" => progress = false,
                "--skip-bandwidth" => skip_bandwidth = true,
                "--skip-latency" => skip_latency = true,
                "--skip-lookup" => skip_lookup = true,
                "--backend" => {
                    disk = match value(&flag)?.as_str() {
                        "memory" => false,
                        "disk" => true,
                        other => return Err(format!("{flag}: {other:?} is not memory or disk")),
                    }
                }
                "--dir" => dir = Some(std::path::PathBuf::from(value(&flag)?)),
                "--recovery-blocks" => {
                    given.recovery_blocks = Some(count(&flag, &value(&flag)?, 1)?)
                }
                "--io-threads" => {
                    let n = count(&flag, &value(&flag)?, 1)?;
                    if n > kvtier::MAX_IO_THREADS {
                        return Err(format!("{flag}: at most {}", kvtier::MAX_IO_THREADS));
                    }
                    given.io_threads = Some(n);
                }
                "--gib" => {
                    let v = value(&flag)?;
                    match v.parse::<f64>() {
                        Ok(x) if x > 0.0 && x.is_finite() => given.gib = Some(x),
                        _ => return Err(format!("{flag}: expected a positive number, got {v:?}")),
                    }
                }
                "--block-bytes" => {
                    let v = value(&flag)?;
                    let bytes =
                        kvtier::parse_size(&v).map_err(|e| format!("{flag}: {}", e.message()))?;
                    if bytes == 0 || bytes > 1 << 30 {
                        return Err(format!("{flag}: {v:?} is outside 1 byte ..= 1 GiB"));
                    }
                    given.block_bytes = Some(bytes as usize);
                }
                "--job-blocks" => given.job_blocks = Some(count(&flag, &value(&flag)?, 1)?),
                "--window" => given.window = Some(count(&flag, &value(&flag)?, 1)?),
                "--repeat" => given.repeat = Some(count(&flag, &value(&flag)?, 1)?),
                "--latency-iters" => given.latency_iters = Some(count(&flag, &value(&flag)?, 1)?),
                "--lookup-blocks" => {
                    given.lookup_blocks = Some(count(&flag, &value(&flag)?, 1000)?)
                }
                "--lookup-batch" => given.lookup_batch = Some(count(&flag, &value(&flag)?, 1)?),
                _ => return Err(format!("unknown argument {arg:?}")),
            }
        }
        let latency_iters = given
            .latency_iters
            .unwrap_or(if quick { 2_000 } else { 20_000 });
        Ok(Settings {
            disk,
            dir,
            recovery_blocks: given
                .recovery_blocks
                .unwrap_or(if quick { 2_000 } else { 100_000 }),
            help,
            quick,
            json,
            progress,
            skip_bandwidth,
            skip_latency,
            skip_lookup,
            io_threads: given.io_threads,
            data_bytes: (given.gib.unwrap_or(if quick { 0.125 } else { 2.0 }) * (1u64 << 30) as f64)
                as u64,
            block_bytes: given.block_bytes.unwrap_or(2 << 20),
            job_blocks: given.job_blocks.unwrap_or(16),
            window: given.window,
            repeat: given.repeat.unwrap_or(if quick { 2 } else { 3 }),
            latency_iters,
            latency_warmup: (latency_iters / 10).max(100),
            lookup_small: 1_000,
            lookup_large: given
                .lookup_blocks
                .unwrap_or(if quick { 100_000 } else { 1_000_000 }),
            lookup_batch: given.lookup_batch.unwrap_or(64),
            lookup_pool_keys: if quick { 1 << 16 } else { 1 << 20 },
            lookup_runs: if quick { 3 } else { 10 },
            lookup_run_secs: if quick { 0.02 } else { 0.06 },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Settings, String> {
        Settings::parse(args.iter().map(|s| s.to_string()))
    }

    #[test]
    fn defaults_quick_and_overrides() {
        let d = parse(&[]).unwrap();
        assert_eq!(d.data_bytes, 2 << 30);
        assert_eq!((d.block_bytes, d.job_blocks, d.repeat), (2 << 20, 16, 3));
        assert_eq!((d.lookup_large, d.lookup_batch), (1_000_000, 64));
        let q = parse(&["--quick", "--repeat=5", "--block-bytes", "1MiB"]).unwrap();
        assert!(q.quick);
        assert_eq!(
            (q.repeat, q.block_bytes, q.data_bytes),
            (5, 1 << 20, 128 << 20)
        );
        assert_eq!(parse(&["--io-threads", "3"]).unwrap().io_threads, Some(3));
    }

    #[test]
    fn bad_flags_are_errors() {
        for bad in [
            &["--nope"][..],
            &["--io-threads"],
            &["--io-threads", "0"],
            &["--gib", "-1"],
            &["--block-bytes", "2MB"],
            &["--repeat", "x"],
            &["--lookup-blocks", "10"],
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }
}
