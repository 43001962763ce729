//! How much CPU other processes (and the hypervisor) took while the benchmark
//! ran: on a shared machine that, more than anything, decides how much the
//! numbers can be trusted.

use std::sync::Mutex;
use std::time::Instant;

/// Processes the run started and keeps running (a local redis-server): their
/// CPU time is the run's own, not other processes' noise.
static HELPERS: Mutex<Vec<u32>> = Mutex::new(Vec::new());

/// Counts process `pid`'s CPU time as the run's own from now on.
pub fn count_as_own(pid: u32) {
    HELPERS.lock().expect("not poisoned").push(pid);
}

/// CPU seconds of the helper processes still alive, from /proc/PID/stat.
fn helpers_secs() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if hz <= 0 {
        return 0.0;
    }
    let pids = HELPERS.lock().expect("not poisoned").clone();
    pids.iter()
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            // After "pid (comm) ": state is field 0, utime 11, stime 12.
            let rest = stat.rsplit_once(") ")?.1;
            let f: Vec<&str> = rest.split_whitespace().collect();
            let ticks = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
            Some(ticks as f64 / hz as f64)
        })
        .sum()
}

pub struct Snapshot {
    at: Instant,
    /// All CPUs' busy and stolen time from /proc/stat, in clock ticks.
    busy_ticks: u64,
    steal_ticks: u64,
    /// This process's CPU time (all its threads, the tier's workers included),
    /// its waited-for children's (redis-benchmark) and its helpers'.
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
        let usage = |who| unsafe {
            let mut usage: libc::rusage = std::mem::zeroed();
            if libc::getrusage(who, &mut usage) != 0 {
                return None;
            }
            let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
            Some(secs(usage.ru_utime) + secs(usage.ru_stime))
        };
        let own_secs = usage(libc::RUSAGE_SELF)? + usage(libc::RUSAGE_CHILDREN)? + helpers_secs();
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
