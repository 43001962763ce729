//! What the run happened on: cores, CPU, RAM, huge pages, load, and how much
//! CPU other processes took meanwhile -- the context every figure needs on a
//! shared machine, the same for both backends.

use crate::contention::{Contention, Snapshot};
use serde::Serialize;

/// Other processes using this much of the machine make timings unreliable.
const BUSY_CORES: f64 = 0.25;

/// Serialises as the `machine` object of `--json`.
#[derive(Serialize)]
pub struct Machine {
    pub cores: usize,
    pub cpu: String,
    #[serde(rename = "mem_total_bytes")]
    pub mem_total: u64,
    #[serde(rename = "transparent_hugepages")]
    pub thp: String,
    #[serde(rename = "loadavg_before")]
    pub load_start: String,
    /// NaN (null in JSON) until `finish`, or when /proc/stat is unreadable.
    #[serde(rename = "other_processes_cores")]
    pub other_cores: f64,
    pub steal_cores: f64,
    pub busy: bool,
    #[serde(skip)]
    start: Option<Snapshot>,
    #[serde(skip)]
    contention: Option<Contention>,
}

impl Machine {
    /// Reads the machine's basics and starts the CPU-noise measurement.
    pub fn probe() -> Machine {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu = cpuinfo
            .lines()
            .find_map(|l| l.strip_prefix("model name")?.split_once(':'))
            .map_or("unknown".into(), |(_, v)| v.trim().to_string());
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let mem_total = meminfo
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map_or(0, |kb| kb * 1024);
        let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
            .ok()
            .and_then(|s| Some(s.split_once('[')?.1.split_once(']')?.0.to_string()))
            .unwrap_or_else(|| "unknown".into());
        Machine {
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            cpu,
            mem_total,
            thp,
            load_start: load_average(),
            other_cores: f64::NAN,
            steal_cores: f64::NAN,
            busy: false,
            start: Snapshot::take(),
            contention: None,
        }
    }

    /// Ends the CPU-noise measurement started by `probe`.
    pub fn finish(&mut self) {
        self.contention = self.start.as_ref().and_then(Snapshot::since);
        if let Some(c) = &self.contention {
            self.other_cores = c.other_cores;
            self.steal_cores = c.steal_cores;
            self.busy = c.other_cores + c.steal_cores >= BUSY_CORES;
        }
    }

    /// One line for the table's header.
    pub fn noise(&self) -> String {
        match &self.contention {
            None => "unknown (/proc/stat unreadable)".into(),
            Some(c) => format!(
                "other processes used {:.2} of {} cores on average during the run, steal {:.2}{}",
                c.other_cores,
                self.cores,
                c.steal_cores,
                if self.busy {
                    " -- BUSY MACHINE: timings are unreliable, run again when it is quiet"
                } else {
                    ""
                }
            ),
        }
    }
}

/// The 1-minute load average.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "?".into())
}
