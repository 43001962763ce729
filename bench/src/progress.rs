//! Progress on stderr: a `\r`-updated bar when stderr is a terminal, otherwise
//! a line when a phase starts, now and then during it, and when it ends.

use std::io::Write;
use std::time::{Duration, Instant};

const TTY_INTERVAL: Duration = Duration::from_millis(100);
const LOG_INTERVAL: Duration = Duration::from_secs(10);
const BAR: usize = 30;

pub struct Progress {
    enabled: bool,
    tty: bool,
    label: String,
    total: u64,
    done: u64,
    start: Instant,
    last: Instant,
}

impl Progress {
    pub fn new(enabled: bool, label: impl Into<String>, total: u64) -> Progress {
        // SAFETY: isatty has no preconditions.
        let tty = unsafe { libc::isatty(libc::STDERR_FILENO) } == 1;
        let now = Instant::now();
        let p = Progress {
            enabled,
            tty,
            label: label.into(),
            total: total.max(1),
            done: 0,
            start: now,
            last: now,
        };
        if enabled && !tty {
            eprintln!("kvtier-bench: {} ...", p.label);
        }
        p
    }

    /// Records `n` more units of work done.
    pub fn add(&mut self, n: u64) {
        self.done += n;
        if !self.enabled {
            return;
        }
        let now = Instant::now();
        let interval = if self.tty { TTY_INTERVAL } else { LOG_INTERVAL };
        if now.duration_since(self.last) < interval {
            return;
        }
        self.last = now;
        let done = self.done.min(self.total);
        let pct = done * 100 / self.total;
        let secs = now.duration_since(self.start).as_secs_f64();
        if self.tty {
            let filled = (done as usize * BAR) / self.total as usize;
            eprint!(
                "\r{:<34} [{}{}] {:>3}% {:>6.1}s\x1b[K",
                self.label,
                "#".repeat(filled),
                ".".repeat(BAR - filled),
                pct,
                secs
            );
            let _ = std::io::stderr().flush();
        } else {
            eprintln!("kvtier-bench: {} {pct}% ({secs:.1} s)", self.label);
        }
    }

    pub fn finish(self) {
        if !self.enabled {
            return;
        }
        let secs = self.start.elapsed().as_secs_f64();
        if self.tty {
            eprintln!("\r{:<34} done in {secs:.1} s\x1b[K", self.label);
        } else {
            eprintln!("kvtier-bench: {} done in {secs:.1} s", self.label);
        }
    }
}
