//! JSON values that keep their key order, and Python's `json.dumps` output.
//!
//! Chat templates receive tool schemas and tool-call arguments as Python dicts, whose keys keep the
//! order they were written in, and print them with transformers' `tojson` filter, which is
//! `json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`
//! (transformers `utils/chat_template_utils.py`, read at 5.25.0). serde_json (as this workspace
//! builds it) sorts object keys, and minijinja's built-in `tojson` sorts keys, writes compact
//! separators and HTML-escapes `<>&'`, so neither gives transformers' bytes. [`Json`] keeps the
//! order of the text it was parsed from, and [`dumps`] writes it as `json.dumps` does: items
//! separated by `", "` and keys by `": "` (`","` between items when indenting), strings escaped
//! only where JSON requires (`ensure_ascii=False`) or also beyond ASCII as `\uXXXX` with
//! surrogate pairs (`ensure_ascii=True`), integers as integers, floats as Python's `repr`
//! (`1.0`, `1e-05`, `1e+16`).
//!
//! Numbers are read by serde_json, which this workspace builds without `float_roundtrip`: a
//! decimal of 17 significant digits may be read 1 ulp off Python's value, so a tool call's float
//! argument can print differently in its last digit when rlvr hands it back to a template. Sampled
//! turns never pass through this (their ids enter the row as sampled).

use serde::de::{MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt::Write as _;

/// A JSON value whose objects keep their key order.
#[derive(Debug, Clone, PartialEq)]
pub enum Json {
    /// `null`.
    Null,
    /// `true` / `false`.
    Bool(bool),
    /// An integer that fits `i64` (larger ones are [`Json::UInt`], then [`Json::Float`]).
    Int(i64),
    /// An integer above `i64::MAX` that fits `u64`.
    UInt(u64),
    /// A number with a fraction or exponent (always finite when parsed from JSON).
    Float(f64),
    /// A string.
    Str(String),
    /// An array.
    Array(Vec<Json>),
    /// An object: keys in the order first written (a repeated key keeps its first place and
    /// takes its last value, as Python's `json.loads` does).
    Object(Vec<(String, Json)>),
}

impl Json {
    /// Parses one JSON text.
    ///
    /// # Errors
    /// serde_json's message (line and column) for text that is not JSON.
    pub fn parse(text: &str) -> Result<Json, serde_json::Error> {
        serde_json::from_str(text)
    }

    /// The value of `key` when this is an object that has it.
    pub fn get(&self, key: &str) -> Option<&Json> {
        match self {
            Json::Object(kv) => kv.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    /// The string, when this is one.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Json::Str(s) => Some(s),
            _ => None,
        }
    }

    /// The number as `f64`, when this is one.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Json::Int(i) => Some(i as f64),
            Json::UInt(u) => Some(u as f64),
            Json::Float(f) => Some(f),
            _ => None,
        }
    }

    /// The JSON type's name, for error messages (`"object"`, `"string"`, ...).
    pub fn kind(&self) -> &'static str {
        match self {
            Json::Null => "null",
            Json::Bool(_) => "boolean",
            Json::Int(_) | Json::UInt(_) | Json::Float(_) => "number",
            Json::Str(_) => "string",
            Json::Array(_) => "array",
            Json::Object(_) => "object",
        }
    }

    /// An object from `(key, value)` pairs, in that order.
    pub fn object<K: Into<String>>(pairs: impl IntoIterator<Item = (K, Json)>) -> Json {
        Json::Object(pairs.into_iter().map(|(k, v)| (k.into(), v)).collect())
    }

    /// Compact text (`","`, `":"`), for the protocol's lines; non-ASCII kept as is.
    pub fn to_compact(&self) -> String {
        let mut out = String::new();
        write_value(&mut out, self, &DumpOptions::compact(), 0);
        out
    }
}

impl From<&str> for Json {
    fn from(s: &str) -> Self {
        Json::Str(s.to_string())
    }
}

impl From<String> for Json {
    fn from(s: String) -> Self {
        Json::Str(s)
    }
}

impl std::fmt::Display for Json {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.to_compact())
    }
}

impl<'de> Deserialize<'de> for Json {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(JsonVisitor)
    }
}

struct JsonVisitor;

impl<'de> Visitor<'de> for JsonVisitor {
    type Value = Json;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_unit<E>(self) -> Result<Json, E> {
        Ok(Json::Null)
    }
    fn visit_none<E>(self) -> Result<Json, E> {
        Ok(Json::Null)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Json, D::Error> {
        Json::deserialize(d)
    }
    fn visit_bool<E>(self, v: bool) -> Result<Json, E> {
        Ok(Json::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Json, E> {
        Ok(Json::Int(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Json, E> {
        Ok(i64::try_from(v).map_or(Json::UInt(v), Json::Int))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Json, E> {
        Ok(Json::Float(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<Json, E> {
        Ok(Json::Str(v.to_string()))
    }
    fn visit_string<E>(self, v: String) -> Result<Json, E> {
        Ok(Json::Str(v))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<Json, A::Error> {
        let mut out = Vec::new();
        while let Some(v) = a.next_element()? {
            out.push(v);
        }
        Ok(Json::Array(out))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> Result<Json, A::Error> {
        let mut out: Vec<(String, Json)> = Vec::new();
        while let Some((k, v)) = a.next_entry::<String, Json>()? {
            match out.iter_mut().find(|(old, _)| *old == k) {
                Some(slot) => slot.1 = v,
                None => out.push((k, v)),
            }
        }
        Ok(Json::Object(out))
    }
}

impl Serialize for Json {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::{SerializeMap, SerializeSeq};
        match self {
            Json::Null => s.serialize_unit(),
            Json::Bool(b) => s.serialize_bool(*b),
            Json::Int(i) => s.serialize_i64(*i),
            Json::UInt(u) => s.serialize_u64(*u),
            Json::Float(f) => s.serialize_f64(*f),
            Json::Str(v) => s.serialize_str(v),
            Json::Array(a) => {
                let mut seq = s.serialize_seq(Some(a.len()))?;
                for v in a {
                    seq.serialize_element(v)?;
                }
                seq.end()
            }
            Json::Object(kv) => {
                let mut m = s.serialize_map(Some(kv.len()))?;
                for (k, v) in kv {
                    m.serialize_entry(k, v)?;
                }
                m.end()
            }
        }
    }
}

/// The options of Python's `json.dumps` that transformers' `tojson` exposes.
#[derive(Debug, Clone, PartialEq)]
pub struct DumpOptions {
    /// `ensure_ascii`: write every non-ASCII character as `\uXXXX` (transformers' default: false).
    pub ensure_ascii: bool,
    /// `indent`: `None` for one line; `Some(text)` puts each item on its own line, indented by
    /// `text` per level (an integer `n` in Python is `n` spaces).
    pub indent: Option<String>,
    /// `separators`: (between items, between key and value). Python's default is `(", ", ": ")`
    /// without indent and `(",", ": ")` with one.
    pub separators: (String, String),
    /// `sort_keys`: objects written in key order rather than as given.
    pub sort_keys: bool,
}

impl DumpOptions {
    /// `json.dumps(x)` with transformers' `tojson` defaults.
    pub fn python() -> Self {
        DumpOptions {
            ensure_ascii: false,
            indent: None,
            separators: (", ".into(), ": ".into()),
            sort_keys: false,
        }
    }

    fn compact() -> Self {
        DumpOptions {
            separators: (",".into(), ":".into()),
            ..Self::python()
        }
    }
}

/// `value` as Python's `json.dumps(value, **options)` writes it (see the module docs).
pub fn dumps(value: &Json, options: &DumpOptions) -> String {
    let mut out = String::new();
    write_value(&mut out, value, options, 0);
    out
}

fn newline_indent(out: &mut String, indent: &str, level: usize) {
    out.push('\n');
    for _ in 0..level {
        out.push_str(indent);
    }
}

fn write_value(out: &mut String, v: &Json, o: &DumpOptions, level: usize) {
    match v {
        Json::Null => out.push_str("null"),
        Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Json::Int(i) => {
            let _ = write!(out, "{i}");
        }
        Json::UInt(u) => {
            let _ = write!(out, "{u}");
        }
        Json::Float(f) => out.push_str(&python_float_repr(*f)),
        Json::Str(s) => write_string(out, s, o.ensure_ascii),
        Json::Array(items) => {
            write_container(out, o, level, '[', ']', items.len(), |out, i| {
                write_value(out, &items[i], o, level + 1)
            });
        }
        Json::Object(kv) => {
            let mut order: Vec<usize> = (0..kv.len()).collect();
            if o.sort_keys {
                order.sort_by(|&a, &b| kv[a].0.cmp(&kv[b].0));
            }
            write_container(out, o, level, '{', '}', kv.len(), |out, i| {
                let (k, v) = &kv[order[i]];
                write_string(out, k, o.ensure_ascii);
                out.push_str(&o.separators.1);
                write_value(out, v, o, level + 1);
            });
        }
    }
}

fn write_container(
    out: &mut String,
    o: &DumpOptions,
    level: usize,
    open: char,
    close: char,
    n: usize,
    mut item: impl FnMut(&mut String, usize),
) {
    out.push(open);
    if n == 0 {
        out.push(close);
        return;
    }
    for i in 0..n {
        if i > 0 {
            out.push_str(&o.separators.0);
        }
        if let Some(ind) = &o.indent {
            newline_indent(out, ind, level + 1);
        }
        item(out, i);
    }
    if let Some(ind) = &o.indent {
        newline_indent(out, ind, level);
    }
    out.push(close);
}

/// A JSON string literal as Python's `json` module writes it.
pub fn write_string(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c if ensure_ascii && (c as u32) > 0x7e => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Python's `repr(float)`: the shortest digits that round-trip, in positional notation for
/// exponents −4 ≤ e < 16 (with `.0` when integral), else `d.ddde±XX`; `NaN`, `Infinity` and
/// `-Infinity` as `json.dumps` writes them.
pub fn python_float_repr(x: f64) -> String {
    if x.is_nan() {
        return "NaN".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    let sign = if x.is_sign_negative() { "-" } else { "" };
    // Rust's `{:e}` gives the shortest round-trip digits, as Python's repr does.
    let sci = format!("{:e}", x.abs());
    let (mantissa, exp) = sci.split_once('e').expect("`{:e}` always has an exponent");
    let exp: i32 = exp.parse().expect("`{:e}` writes an integer exponent");
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    if (-4..16).contains(&exp) {
        if exp >= 0 {
            let int_len = exp as usize + 1;
            let (int, frac) = if digits.len() > int_len {
                (digits[..int_len].to_string(), digits[int_len..].to_string())
            } else {
                (
                    format!("{digits}{}", "0".repeat(int_len - digits.len())),
                    "0".to_string(),
                )
            };
            format!("{sign}{int}.{frac}")
        } else {
            format!("{sign}0.{}{digits}", "0".repeat((-exp - 1) as usize))
        }
    } else {
        let rest = &digits[1..];
        let mant = if rest.is_empty() {
            digits[..1].to_string()
        } else {
            format!("{}.{rest}", &digits[..1])
        };
        let esign = if exp < 0 { '-' } else { '+' };
        format!("{sign}{mant}e{esign}{:02}", exp.abs())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_print_as_python_repr() {
        for (x, want) in [
            (1.0, "1.0"),
            (-0.0, "-0.0"),
            (0.1, "0.1"),
            (1.5e-5, "1.5e-05"),
            (0.0001, "0.0001"),
            (1e16, "1e+16"),
            (123456789012345678.0, "1.2345678901234568e+17"),
            (1234.5, "1234.5"),
            (1e15, "1000000000000000.0"),
            (2.5e-300, "2.5e-300"),
        ] {
            assert_eq!(python_float_repr(x), want, "{x}");
        }
    }

    #[test]
    fn dumps_keeps_order_and_python_separators() {
        let v =
            Json::parse(r#"{"z": 1, "a": [1, 2.0, "é<&>'\n\u0001"], "e": {}, "b": [], "z": 3}"#)
                .unwrap();
        assert_eq!(
            dumps(&v, &DumpOptions::python()),
            r#"{"z": 3, "a": [1, 2.0, "é<&>'\n\u0001"], "e": {}, "b": []}"#
        );
        let o = DumpOptions {
            ensure_ascii: true,
            indent: Some("  ".into()),
            separators: (",".into(), ": ".into()),
            sort_keys: true,
        };
        assert_eq!(
            dumps(
                &Json::parse(r#"{"b": ["😀"], "a": {"c": null}}"#).unwrap(),
                &o
            ),
            "{\n  \"a\": {\n    \"c\": null\n  },\n  \"b\": [\n    \"\\ud83d\\ude00\"\n  ]\n}"
        );
        assert_eq!(
            v.to_compact(),
            r#"{"z":3,"a":[1,2.0,"é<&>'\n\u0001"],"e":{},"b":[]}"#
        );
    }
}
