//! Progress on stderr. On a terminal, an indicatif bar; otherwise (CI logs,
//! where indicatif draws nothing) a line when a phase starts, every 10 s
//! during it, and when it ends. Nothing at all with `--no-progress`.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::time::{Duration, Instant};

/// Long phases still show signs of life in a log, without flooding it.
const LOG_INTERVAL: Duration = Duration::from_secs(10);

pub struct Progress {
    bar: ProgressBar,
    label: String,
    /// Print log lines: progress is wanted but stderr is not a terminal.
    log: bool,
    last_log: Instant,
}

impl Progress {
    pub fn new(enabled: bool, label: impl Into<String>, total: u64) -> Progress {
        let label = label.into();
        let target = if enabled {
            // 10 redraws a second: the bar costs nothing next to the I/O.
            ProgressDrawTarget::stderr_with_hz(10)
        } else {
            ProgressDrawTarget::hidden()
        };
        let style = ProgressStyle::with_template("{msg:<34} [{bar:30}] {percent:>3}% {elapsed:>4}")
            .expect("a valid template")
            .progress_chars("#.");
        let bar = ProgressBar::with_draw_target(Some(total.max(1)), target)
            .with_style(style)
            .with_message(label.clone());
        // indicatif hides a stderr target that is not a terminal.
        let log = enabled && bar.is_hidden();
        if log {
            eprintln!("kvtier-bench: {label} ...");
        }
        Progress {
            bar,
            label,
            log,
            last_log: Instant::now(),
        }
    }

    /// Records `n` more units of work done.
    pub fn add(&mut self, n: u64) {
        self.bar.inc(n);
        if self.log && self.last_log.elapsed() >= LOG_INTERVAL {
            self.last_log = Instant::now();
            let total = self.bar.length().unwrap_or(1);
            let pct = self.bar.position().min(total) * 100 / total;
            eprintln!(
                "kvtier-bench: {} {pct}% ({:.1} s)",
                self.label,
                self.bar.elapsed().as_secs_f64()
            );
        }
    }

    pub fn finish(self) {
        let secs = self.bar.elapsed().as_secs_f64();
        if self.log {
            eprintln!("kvtier-bench: {} done in {secs:.1} s", self.label);
        } else if !self.bar.is_hidden() {
            // The finished bar gives way to one line saying how long it took.
            self.bar
                .set_style(ProgressStyle::with_template("{msg}").expect("a valid template"));
            self.bar
                .finish_with_message(format!("{:<34} done in {secs:.1} s", self.label));
        }
    }
}
