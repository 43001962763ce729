//! Just enough JSON to print one object.

use std::fmt::Write;

pub enum Json {
    Bool(bool),
    Int(u64),
    Num(f64),
    Str(String),
    Arr(Vec<Json>),
    Obj(Vec<(&'static str, Json)>),
}

impl Json {
    pub fn obj(fields: Vec<(&'static str, Json)>) -> Json {
        Json::Obj(fields)
    }

    pub fn str(s: impl Into<String>) -> Json {
        Json::Str(s.into())
    }

    pub fn nums(v: &[f64]) -> Json {
        Json::Arr(v.iter().map(|&x| Json::Num(x)).collect())
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        self.write(&mut out);
        out
    }

    fn write(&self, out: &mut String) {
        match self {
            Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Json::Int(n) => write!(out, "{n}").unwrap(),
            Json::Num(x) if x.is_finite() => {
                // Four significant decimals are plenty for benchmark numbers.
                let s = format!("{x:.4}");
                let s = s.trim_end_matches('0').trim_end_matches('.');
                out.push_str(if s.is_empty() || s == "-" { "0" } else { s });
            }
            Json::Num(_) => out.push_str("null"),
            Json::Str(s) => {
                out.push('"');
                for c in s.chars() {
                    match c {
                        '"' => out.push_str("\\\""),
                        '\\' => out.push_str("\\\\"),
                        '\n' => out.push_str("\\n"),
                        c if (c as u32) < 0x20 => write!(out, "\\u{:04x}", c as u32).unwrap(),
                        c => out.push(c),
                    }
                }
                out.push('"');
            }
            Json::Arr(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    item.write(out);
                }
                out.push(']');
            }
            Json::Obj(fields) => {
                out.push('{');
                for (i, (k, v)) in fields.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    Json::Str((*k).to_string()).write(out);
                    out.push(':');
                    v.write(out);
                }
                out.push('}');
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_compact_valid_json() {
        let j = Json::obj(vec![
            ("a", Json::Int(3)),
            ("b", Json::Num(1.5)),
            ("c", Json::Num(2.0)),
            ("d", Json::Num(f64::NAN)),
            ("e", Json::str("q\"\\\n\u{1}")),
            ("f", Json::Arr(vec![Json::Bool(true), Json::Int(0)])),
            ("g", Json::Num(0.00001)),
        ]);
        assert_eq!(
            j.render(),
            r#"{"a":3,"b":1.5,"c":2,"d":null,"e":"q\"\\\n\u0001","f":[true,0],"g":0}"#
        );
    }
}
