//! How much CPU other processes (and the hypervisor) took while the benchmark
//! ran: on a shared machine that, more than anything, decides how much the
//! numbers can be trusted.

use std::time::Instant;

pub struct Snapshot {
    at: Instant,
    /// All CPUs' busy and stolen time from /proc/stat, in clock ticks.
    busy_ticks: u64,
    steal_ticks: u64,
    /// This process's CPU time (all its threads, the tier's workers included).
    own_secs: f64,
}

/// Average cores used by others over an interval.
pub struct Contention {
    pub other_cores: f64,
    pub steal_cores: f64,
}

impl Snapshot {
    pub fn take() -> Option<Snapshot> {
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        let ticks: Vec<u64> = stat
            .lines()
            .next()?
            .strip_prefix("cpu ")?
            .split_whitespace()
            .map(|v| v.parse().unwrap_or(0))
            .collect();
        // user nice system idle iowait irq softirq steal ...
        let field = |i: usize| ticks.get(i).copied().unwrap_or(0);
        let busy_ticks = field(0) + field(1) + field(2) + field(5) + field(6);
        // SAFETY: getrusage writes the struct it is given.
        let own_secs = unsafe {
            let mut usage: libc::rusage = std::mem::zeroed();
            if libc::getrusage(libc::RUSAGE_SELF, &mut usage) != 0 {
                return None;
            }
            let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
            secs(usage.ru_utime) + secs(usage.ru_stime)
        };
        Some(Snapshot {
            at: Instant::now(),
            busy_ticks,
            steal_ticks: field(7),
            own_secs,
        })
    }

    pub fn since(start: &Snapshot) -> Option<Contention> {
        let end = Snapshot::take()?;
        // SAFETY: sysconf has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        let wall = (end.at - start.at).as_secs_f64();
        if hz <= 0 || wall <= 0.0 {
            return None;
        }
        let secs = |ticks: u64| ticks as f64 / hz as f64;
        let busy = secs(end.busy_ticks.saturating_sub(start.busy_ticks));
        let own = end.own_secs - start.own_secs;
        Some(Contention {
            other_cores: ((busy - own) / wall).max(0.0),
            steal_cores: secs(end.steal_ticks.saturating_sub(start.steal_ticks)) / wall,
        })
    }
}
