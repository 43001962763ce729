//! The one results type of a run, whichever backend: header lines, metric rows
//! (some carrying a target), JSON fields and what was verified; and its two
//! renderings, the human table and the `--json` object. The phases fill it in;
//! nothing else prints results.

use crate::machine::Machine;
use serde::Serialize;
use serde_json::{Map, Value};
use std::time::Instant;

#[derive(Clone, Copy)]
pub enum Cmp {
    Below,
    AtMost,
    AtLeast,
}

impl Cmp {
    fn symbol(self) -> &'static str {
        match self {
            Cmp::Below => "<",
            Cmp::AtMost => "<=",
            Cmp::AtLeast => ">=",
        }
    }
}

/// A project target: `value` compared with `bound`. Its value need not be the
/// row's (a bandwidth row shows GB/s; its target is the ratio to the bound).
pub struct Target {
    name: String,
    value: f64,
    bound: f64,
    cmp: Cmp,
}

impl Target {
    fn met(&self) -> bool {
        match self.cmp {
            Cmp::Below => self.value < self.bound,
            Cmp::AtMost => self.value <= self.bound,
            Cmp::AtLeast => self.value >= self.bound,
        }
    }
}

pub struct Row {
    metric: String,
    value: f64,
    unit: &'static str,
    detail: String,
    target: Option<Target>,
}

impl Row {
    pub fn target(&mut self, name: impl Into<String>, value: f64, cmp: Cmp, bound: f64) {
        self.target = Some(Target {
            name: name.into(),
            value,
            bound,
            cmp,
        });
    }
}

pub struct Report {
    backend: &'static str,
    quick: bool,
    kvtier_version: String,
    machine: Machine,
    io_threads: usize,
    /// How the thread count was chosen: short for JSON, explained in the table.
    io_threads_source: &'static str,
    io_threads_note: &'static str,
    header: Vec<(&'static str, String)>,
    rows: Vec<Row>,
    /// The backend's own JSON keys, in order, between the common ones.
    fields: Map<String, Value>,
    verified: Vec<String>,
    start: Instant,
    elapsed_secs: f64,
}

impl Report {
    /// Starts the run's clock and its CPU-noise measurement.
    pub fn start(backend: &'static str, quick: bool) -> Report {
        Report {
            backend,
            quick,
            kvtier_version: crate::capi::version(),
            machine: Machine::probe(),
            io_threads: 0,
            io_threads_source: "",
            io_threads_note: "",
            header: Vec::new(),
            rows: Vec::new(),
            fields: Map::new(),
            verified: Vec::new(),
            start: Instant::now(),
            elapsed_secs: f64::NAN,
        }
    }

    /// Helper threads (fills, verification) are sized to the machine.
    pub fn cores(&self) -> usize {
        self.machine.cores
    }

    pub fn io_threads(&mut self, n: usize, source: &'static str, note: &'static str) {
        self.io_threads = n;
        self.io_threads_source = source;
        self.io_threads_note = note;
    }

    /// A line above the table describing how a phase ran.
    pub fn line(&mut self, label: &'static str, text: String) {
        self.header.push((label, text));
    }

    pub fn row(
        &mut self,
        metric: impl Into<String>,
        value: f64,
        unit: &'static str,
        detail: String,
    ) -> &mut Row {
        self.rows.push(Row {
            metric: metric.into(),
            value,
            unit,
            detail,
            target: None,
        });
        self.rows.last_mut().expect("just pushed")
    }

    /// A key of the JSON object (not shown in the table).
    pub fn field(&mut self, key: &str, value: impl Serialize) {
        let value = serde_json::to_value(value).expect("plain data serialises");
        self.fields.insert(key.to_string(), value);
    }

    /// What a phase loaded back and compared byte for byte.
    pub fn verified(&mut self, what: String) {
        self.verified.push(what);
    }

    /// Stops the clock and the noise measurement.
    pub fn finish(&mut self) {
        self.elapsed_secs = self.start.elapsed().as_secs_f64();
        self.machine.finish();
    }

    fn targets(&self) -> impl Iterator<Item = &Target> {
        self.rows.iter().filter_map(|r| r.target.as_ref())
    }

    fn verification(&self) -> String {
        if self.verified.is_empty() {
            "nothing (every phase skipped)".into()
        } else {
            format!("{}: every byte equal", self.verified.join(", "))
        }
    }

    pub fn table(&self) -> String {
        let m = &self.machine;
        let mut out = format!(
            "kvtier-bench: kvtier {} through its C ABI, {} backend{}\n",
            self.kvtier_version,
            self.backend,
            if self.quick {
                " (--quick: smoke-test sizes, numbers not meaningful)"
            } else {
                ""
            }
        );
        let machine = format!(
            "{} cores ({}), {} RAM, THP {}; load average {} before the run",
            m.cores,
            m.cpu,
            gib(m.mem_total),
            m.thp,
            m.load_start,
        );
        let threads = format!("{} io_threads ({})", self.io_threads, self.io_threads_note);
        let fixed = [
            ("machine", machine),
            ("noise", m.noise()),
            ("threads", threads),
        ];
        let verified = [("verified", self.verification())];
        for (label, text) in fixed.iter().chain(&self.header).chain(&verified) {
            out.push_str(&format!("{:<10} {text}\n", format!("{label}:")));
        }
        out.push('\n');
        let head = ["metric", "value", "unit", "ratio / detail", "target", ""].map(String::from);
        let cells: Vec<[String; 6]> = std::iter::once(head)
            .chain(self.rows.iter().map(|row| {
                let (bound, met) = row.target.as_ref().map_or_else(Default::default, |t| {
                    (
                        format!("{} {}", t.cmp.symbol(), num(t.bound)),
                        if t.met() { "met" } else { "MISSED" }.to_string(),
                    )
                });
                [
                    row.metric.clone(),
                    num(row.value),
                    row.unit.to_string(),
                    row.detail.clone(),
                    bound,
                    met,
                ]
            }))
            .collect();
        let mut width = [0usize; 6];
        for c in &cells {
            for (w, cell) in width.iter_mut().zip(c) {
                *w = (*w).max(cell.chars().count());
            }
        }
        for c in &cells {
            let line = format!(
                "{:<w0$}  {:>w1$}  {:<w2$}  {:<w3$}  {:<w4$}  {}",
                c[0],
                c[1],
                c[2],
                c[3],
                c[4],
                c[5],
                w0 = width[0],
                w1 = width[1],
                w2 = width[2],
                w3 = width[3],
                w4 = width[4],
            );
            out.push_str(line.trim_end());
            out.push('\n');
        }
        let targets = self.targets().count();
        let missed: Vec<&str> = self
            .targets()
            .filter(|t| !t.met())
            .map(|t| t.name.as_str())
            .collect();
        out.push_str(&format!(
            "\ntargets: {} of {targets} met{}\n",
            targets - missed.len(),
            if missed.is_empty() {
                String::new()
            } else {
                format!("; missed: {}", missed.join("; "))
            }
        ));
        if m.busy {
            out.push_str(
                "(the machine was busy during the run: these results are not conclusive)\n",
            );
        }
        out.push_str(&format!("total time {:.1} s\n", self.elapsed_secs));
        out
    }

    pub fn json(&self) -> String {
        #[derive(Serialize)]
        struct JsonTarget<'a> {
            name: &'a str,
            value: f64,
            bound: f64,
            comparison: &'static str,
            met: bool,
        }
        #[derive(Serialize)]
        struct Json<'a> {
            tool: &'static str,
            kvtier_version: &'a str,
            api: &'static str,
            backend: &'static str,
            quick: bool,
            machine: &'a Machine,
            io_threads: usize,
            io_threads_source: &'static str,
            #[serde(flatten)]
            fields: &'a Map<String, Value>,
            targets: Vec<JsonTarget<'a>>,
            all_targets_met: bool,
            verified: bool,
            verification: String,
            elapsed_seconds: f64,
        }
        let json = Json {
            tool: "kvtier-bench",
            kvtier_version: &self.kvtier_version,
            api: "C ABI (kvtier::ffi)",
            backend: self.backend,
            quick: self.quick,
            machine: &self.machine,
            io_threads: self.io_threads,
            io_threads_source: self.io_threads_source,
            fields: &self.fields,
            targets: self
                .targets()
                .map(|t| JsonTarget {
                    name: &t.name,
                    value: t.value,
                    bound: t.bound,
                    comparison: t.cmp.symbol(),
                    met: t.met(),
                })
                .collect(),
            all_targets_met: self.targets().all(Target::met),
            // A byte that differed would have failed the run before this.
            verified: true,
            verification: self.verification(),
            elapsed_seconds: self.elapsed_secs,
        };
        let mut value = serde_json::to_value(json).expect("plain data serialises");
        round(&mut value);
        let mut out = value.to_string();
        out.push('\n');
        out
    }
}

/// Four decimals are plenty for benchmark numbers and keep the JSON readable;
/// a whole number prints as one (`10`, not `10.0`), as it always has.
fn round(v: &mut Value) {
    match v {
        Value::Number(n) if n.is_f64() => {
            let x = (n.as_f64().expect("an f64") * 1e4).round() / 1e4;
            *v = if x.fract() == 0.0 && x.abs() < 1e15 {
                Value::from(x as i64)
            } else {
                Value::from(x)
            };
        }
        Value::Array(items) => items.iter_mut().for_each(round),
        Value::Object(fields) => fields.values_mut().for_each(round),
        _ => {}
    }
}

/// A table value: three significant figures or so, `n/a` when undefined.
pub fn num(x: f64) -> String {
    if !x.is_finite() {
        "n/a".into()
    } else if x.abs() >= 100.0 {
        format!("{x:.0}")
    } else if x.abs() >= 10.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.2}")
    }
}

pub fn gib(bytes: u64) -> String {
    format!("{:.2} GiB", bytes as f64 / (1u64 << 30) as f64)
}

pub fn mib(bytes: f64) -> String {
    format!("{:.1} MiB", bytes / (1u64 << 20) as f64)
}

/// A block size as people write it: `2 MiB`, `4 KiB`, `100 B`.
pub fn size(bytes: usize) -> String {
    match bytes {
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_report_renders_table_and_json() {
        let mut r = Report::start("memory", true);
        r.io_threads(2, "library default", "library default, min(cores, 4)");
        r.line("phase", "how it ran".into());
        r.row("speed", 1.23456, "GB/s", "detail".into()).target(
            "speed >= 1",
            1.23456,
            Cmp::AtLeast,
            1.0,
        );
        r.row("slowness", f64::NAN, "s", String::new()).target(
            "slowness < 1",
            2.0,
            Cmp::Below,
            1.0,
        );
        r.field(
            "section",
            serde_json::json!({"a": 1, "b": 0.123456, "c": [f64::NAN]}),
        );
        r.verified("everything".into());
        r.finish();

        let table = r.table();
        assert!(table.contains("phase:     how it ran\n"), "{table}");
        let words = |l: &str| l.split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(
            table
                .lines()
                .any(|l| words(l) == "speed 1.23 GB/s detail >= 1.00 met"),
            "{table}"
        );
        assert!(table.contains("n/a"), "{table}");
        assert!(
            table.contains("targets: 1 of 2 met; missed: slowness < 1"),
            "{table}"
        );

        let json: Value = serde_json::from_str(&r.json()).unwrap();
        assert_eq!(json["backend"], "memory");
        assert_eq!(json["section"]["b"], 0.1235);
        assert_eq!(json["section"]["c"][0], Value::Null);
        assert_eq!(json["targets"][0]["value"], 1.2346);
        assert_eq!(json["targets"][1]["met"], false);
        assert_eq!(json["all_targets_met"], false);
        assert_eq!(json["verification"], "everything: every byte equal");
        let keys: Vec<&str> = json
            .as_object()
            .unwrap()
            .keys()
            .map(|k| k.as_str())
            .collect();
        assert_eq!(keys[..4], ["tool", "kvtier_version", "api", "backend"]);
        assert_eq!(
            keys[8], "section",
            "backend fields sit between the common ones"
        );
    }
}
