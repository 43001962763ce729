//! A progress bar on stderr for people watching a long scan: drawn only when
//! stderr is a terminal and `--no-progress` was not given, and cleared when
//! the phase ends, so that stdout (JSON or the report) is never mixed with it
//! and a log gets nothing.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;

/// One phase's bar; counts are atomic, so worker threads share it.
pub struct Progress(ProgressBar);

impl Progress {
    /// A bar labelled `label` over `total` units (0: unknown, a spinner).
    pub fn new(enabled: bool, label: &str, total: u64) -> Progress {
        let target = if enabled && std::io::stderr().is_terminal() {
            ProgressDrawTarget::stderr_with_hz(10)
        } else {
            ProgressDrawTarget::hidden()
        };
        let template = if total == 0 {
            "{msg:<24} {spinner} {pos} {elapsed:>4}"
        } else {
            "{msg:<24} [{bar:30}] {pos}/{len} {elapsed:>4}"
        };
        let style = ProgressStyle::with_template(template)
            .expect("a valid template")
            .progress_chars("#.");
        let bar = ProgressBar::with_draw_target((total > 0).then_some(total), target)
            .with_style(style)
            .with_message(label.to_string());
        Progress(bar)
    }

    /// `n` more units done.
    pub fn add(&self, n: u64) {
        self.0.inc(n);
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.0.finish_and_clear();
    }
}
