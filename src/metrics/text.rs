//! The Prometheus text exposition format (version 0.0.4), written by hand: a
//! `# HELP` and a `# TYPE` line per family, then one line per sample, every
//! sample carrying the writer's constant labels first.

use super::histogram::{HistogramSnapshot, BOUNDS_NS};
use std::fmt::Write;

/// Builds one exposition. Writing to a `String` cannot fail, so the
/// `fmt::Result`s are dropped.
pub(crate) struct Exposition {
    out: String,
    /// `name="value",...` of the labels every sample carries (escaped).
    constant: String,
}

/// Nanoseconds as seconds in exact decimal ("0.0000025", "100"): no float
/// rounding, so bucket bounds read back as the same numbers.
pub(crate) fn seconds(ns: u64) -> String {
    let (whole, frac) = (ns / 1_000_000_000, ns % 1_000_000_000);
    if frac == 0 {
        return whole.to_string();
    }
    let digits = format!("{frac:09}");
    format!("{whole}.{}", digits.trim_end_matches('0'))
}

fn escape_label_value(value: &str, out: &mut String) {
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

impl Exposition {
    /// An exposition whose samples all carry `labels` (names must be valid
    /// Prometheus label names; values are escaped here).
    pub(crate) fn new(labels: &[(&str, &str)]) -> Exposition {
        let mut constant = String::new();
        for (i, (name, value)) in labels.iter().enumerate() {
            if i > 0 {
                constant.push(',');
            }
            constant.push_str(name);
            constant.push_str("=\"");
            escape_label_value(value, &mut constant);
            constant.push('"');
        }
        Exposition {
            out: String::with_capacity(16 << 10),
            constant,
        }
    }

    pub(crate) fn finish(self) -> String {
        self.out
    }

    fn header(&mut self, name: &str, kind: &str, help: &str) {
        // HELP text escapes backslashes and newlines; ours has neither.
        debug_assert!(!help.contains(['\\', '\n']));
        let _ = writeln!(self.out, "# HELP {name} {help}");
        let _ = writeln!(self.out, "# TYPE {name} {kind}");
    }

    /// One sample: `name{constant,extra} value`.
    fn sample(&mut self, name: &str, extra: &[(&str, &str)], value: &str) {
        self.out.push_str(name);
        self.out.push('{');
        self.out.push_str(&self.constant);
        for (name, value) in extra {
            if !self.out.ends_with('{') {
                self.out.push(',');
            }
            self.out.push_str(name);
            self.out.push_str("=\"");
            escape_label_value(value, &mut self.out);
            self.out.push('"');
        }
        self.out.push_str("} ");
        self.out.push_str(value);
        self.out.push('\n');
    }

    /// A counter family (`name` ends in `_total`) of one sample per label set.
    pub(crate) fn counter(&mut self, name: &str, help: &str, samples: &[(&[(&str, &str)], u64)]) {
        self.family(name, "counter", help, samples)
    }

    /// A gauge family of one sample per label set.
    pub(crate) fn gauge(&mut self, name: &str, help: &str, samples: &[(&[(&str, &str)], u64)]) {
        self.family(name, "gauge", help, samples)
    }

    fn family(&mut self, name: &str, kind: &str, help: &str, samples: &[(&[(&str, &str)], u64)]) {
        self.header(name, kind, help);
        for (labels, value) in samples {
            self.sample(name, labels, &value.to_string());
        }
    }

    /// A histogram family in seconds: per label set, its `_bucket` lines
    /// (cumulative, `le` in seconds, then `+Inf`), `_sum` and `_count`.
    pub(crate) fn histogram(
        &mut self,
        name: &str,
        help: &str,
        series: &[(&[(&str, &str)], HistogramSnapshot)],
    ) {
        self.header(name, "histogram", help);
        let bucket = format!("{name}_bucket");
        let bounds: Vec<String> = BOUNDS_NS.iter().map(|&ns| seconds(ns)).collect();
        let mut labels: Vec<(&str, &str)> = Vec::new();
        for (extra, snap) in series {
            let cumulative = snap.cumulative.iter().chain([&snap.count]);
            for (le, count) in bounds
                .iter()
                .map(String::as_str)
                .chain(["+Inf"])
                .zip(cumulative)
            {
                labels.clear();
                labels.extend_from_slice(extra);
                labels.push(("le", le));
                self.sample(&bucket, &labels, &count.to_string());
            }
            self.sample(&format!("{name}_sum"), extra, &seconds(snap.sum_ns));
            self.sample(&format!("{name}_count"), extra, &snap.count.to_string());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_are_exact_decimals() {
        assert_eq!(seconds(0), "0");
        assert_eq!(seconds(100), "0.0000001");
        assert_eq!(seconds(2_500), "0.0000025");
        assert_eq!(seconds(1_500_000_000), "1.5");
        assert_eq!(seconds(100_000_000_000), "100");
    }

    #[test]
    fn families_have_help_type_and_labelled_samples() {
        let mut e = Exposition::new(&[("backend", "disk"), ("namespace", "a\"b\\c\nd")]);
        e.counter(
            "kvtier_jobs_total",
            "Jobs completed.",
            &[(&[("kind", "store")], 3), (&[("kind", "load")], 4)],
        );
        e.gauge("kvtier_io_threads", "I/O threads.", &[(&[], 8)]);
        let text = e.finish();
        let labels = r#"backend="disk",namespace="a\"b\\c\nd""#;
        assert_eq!(
            text,
            format!(
                "# HELP kvtier_jobs_total Jobs completed.\n\
                 # TYPE kvtier_jobs_total counter\n\
                 kvtier_jobs_total{{{labels},kind=\"store\"}} 3\n\
                 kvtier_jobs_total{{{labels},kind=\"load\"}} 4\n\
                 # HELP kvtier_io_threads I/O threads.\n\
                 # TYPE kvtier_io_threads gauge\n\
                 kvtier_io_threads{{{labels}}} 8\n"
            )
        );
    }

    #[test]
    fn a_histogram_has_cumulative_buckets_ending_in_inf_then_sum_and_count() {
        let h = super::super::histogram::Histogram::default();
        h.observe(150); // le 0.00000025
        h.observe(2_000_000_000_000); // above 100 s
        let mut e = Exposition::new(&[("backend", "memory")]);
        e.histogram(
            "kvtier_x_seconds",
            "X.",
            &[(&[("kind", "load")], h.snapshot())],
        );
        let text = e.finish();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "# HELP kvtier_x_seconds X.");
        assert_eq!(lines[1], "# TYPE kvtier_x_seconds histogram");
        let p = r#"kvtier_x_seconds_bucket{backend="memory",kind="load",le="#;
        assert_eq!(lines[2], format!("{p}\"0.0000001\"}} 0"));
        assert_eq!(lines[3], format!("{p}\"0.00000025\"}} 1"));
        assert_eq!(lines[2 + 27], format!("{p}\"100\"}} 1"));
        assert_eq!(lines[2 + 28], format!("{p}\"+Inf\"}} 2"));
        assert_eq!(
            lines[31],
            r#"kvtier_x_seconds_sum{backend="memory",kind="load"} 2000.00000015"#
        );
        assert_eq!(
            lines[32],
            r#"kvtier_x_seconds_count{backend="memory",kind="load"} 2"#
        );
        assert_eq!(lines.len(), 33);
    }
}
