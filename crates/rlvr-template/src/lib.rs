//! Chat templates rendered as transformers renders them, in one place: the prompt rendering of
//! rlvr-model (`tokenizer::render_chat_template`, plain messages) and the environments' templates
//! with tools in rlvr-env (`template::ChatTemplate`) both compile their template in
//! [`environment`], so a template means the same bytes wherever rlvr renders it.
//!
//! The environment is the one transformers compiles in `utils/chat_template_utils.py` (read at
//! 5.25.0; `_compile_jinja_template`): `trim_blocks` and `lstrip_blocks`, Python string methods
//! (minijinja-contrib's pycompat layer stands in for Jinja2's Python objects),
//! `raise_exception(msg)`, `strftime_now(fmt)` (a fixed date here, so that a prompt's tokens do
//! not depend on the day: pass `date_string` where a template prints one), and a `tojson` filter
//! that is Python's `json.dumps` with transformers' defaults ([`json::dumps`]: key order kept,
//! `", "`/`": "` separators, no HTML escaping, non-ASCII kept) and its keyword arguments `indent`,
//! `separators`, `sort_keys`, `ensure_ascii`. minijinja's built-in `tojson` sorts keys, writes
//! compact separators and escapes `<>&'`, which would change every tool schema's bytes.
//! Instructions are bounded (minijinja's fuel), so a template that loops without end stops with
//! an error.
//!
//! No tensor library, no process: the sandboxing of hostile templates (bounded memory and
//! stack) is rlvr-model's `template_sandbox`, around whichever renderer runs.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod json;

use json::{dumps, DumpOptions, Json};
use minijinja::value::{Enumerator, Kwargs, Object, ObjectRepr, Value};
use std::sync::Arc;

/// The date `strftime_now` renders, whatever its format: rlvr renders a fixed date so that a
/// prompt's tokens do not depend on the day it was rendered.
pub const FIXED_DATE: &str = "26 Jul 2024";

/// A minijinja environment configured as transformers compiles chat templates (see the crate
/// docs), running at most `fuel` template instructions per rendering, its errors without
/// minijinja's debug info (the same message in debug and release builds). Add the template with
/// `add_template`/`add_template_owned`.
pub fn environment(fuel: u64) -> minijinja::Environment<'static> {
    let mut env = minijinja::Environment::new();
    // No debug info in errors, in debug builds too (minijinja's default there): an error's
    // message would print every variable the template touched, and a template that built a
    // value 100,000 levels deep before failing would spend minutes printing it.
    env.set_debug(false);
    env.set_fuel(Some(fuel));
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function(
        "raise_exception",
        |msg: String| -> Result<String, minijinja::Error> {
            Err(minijinja::Error::new(
                minijinja::ErrorKind::InvalidOperation,
                msg,
            ))
        },
    );
    env.add_function("strftime_now", |_fmt: String| -> String {
        FIXED_DATE.to_string()
    });
    env.add_filter("tojson", tojson);
    env
}

/// A JSON object as a minijinja map that enumerates its keys in their order.
#[derive(Debug)]
struct OrderedMap(Vec<(String, Value)>);

impl Object for OrderedMap {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Map
    }
    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        let k = key.as_str()?;
        self.0.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone())
    }
    fn enumerate(self: &Arc<Self>) -> Enumerator {
        Enumerator::Values(
            self.0
                .iter()
                .map(|(k, _)| Value::from(k.as_str()))
                .collect(),
        )
    }
}

/// `j` as a template value (objects keep their key order, as Python dicts do).
pub fn to_value(j: &Json) -> Value {
    match j {
        Json::Null => Value::from(()),
        Json::Bool(b) => Value::from(*b),
        Json::Int(i) => Value::from(*i),
        Json::UInt(u) => Value::from(*u),
        Json::Float(f) => Value::from(*f),
        Json::Str(s) => Value::from(s.as_str()),
        Json::Array(a) => Value::from(a.iter().map(to_value).collect::<Vec<_>>()),
        Json::Object(kv) => Value::from_object(OrderedMap(
            kv.iter().map(|(k, v)| (k.clone(), to_value(v))).collect(),
        )),
    }
}

/// A template value back as JSON, for `tojson`: maps in their enumeration order (the
/// conversation's own order; maps the template built itself, or serde structs, come in
/// minijinja's order).
///
/// # Errors
/// A value nested deeper than 128, or one that cannot be iterated.
fn from_value(v: &Value, depth: usize) -> Result<Json, minijinja::Error> {
    use minijinja::value::ValueKind;
    if depth > 128 {
        return Err(minijinja::Error::new(
            minijinja::ErrorKind::InvalidOperation,
            "tojson: value nested deeper than 128",
        ));
    }
    Ok(match v.kind() {
        ValueKind::Undefined | ValueKind::None => Json::Null,
        ValueKind::Bool => Json::Bool(v.is_true()),
        ValueKind::Number if v.is_integer() => match i64::try_from(v.clone()) {
            Ok(i) => Json::Int(i),
            Err(_) => match u64::try_from(v.clone()) {
                Ok(u) => Json::UInt(u),
                Err(_) => Json::Float(f64::try_from(v.clone()).unwrap_or(f64::NAN)),
            },
        },
        ValueKind::Number => Json::Float(f64::try_from(v.clone()).unwrap_or(f64::NAN)),
        ValueKind::String => Json::Str(v.as_str().unwrap_or_default().to_string()),
        ValueKind::Seq | ValueKind::Iterable => {
            let mut out = Vec::new();
            for item in v.try_iter()? {
                out.push(from_value(&item, depth + 1)?);
            }
            Json::Array(out)
        }
        ValueKind::Map => {
            let mut out = Vec::new();
            for k in v.try_iter()? {
                let val = v.get_item(&k)?;
                let key = match k.as_str() {
                    Some(s) => s.to_string(),
                    None => k.to_string(),
                };
                out.push((key, from_value(&val, depth + 1)?));
            }
            Json::Object(out)
        }
        _ => Json::Str(v.to_string()),
    })
}

/// transformers' `tojson`: `json.dumps(x, ensure_ascii=False, indent=None, separators=None,
/// sort_keys=False)` with those keyword arguments accepted.
///
/// # Errors
/// An unknown keyword argument, `separators` that are not two strings, or [`from_value`]'s.
fn tojson(v: &Value, kwargs: Kwargs) -> Result<Value, minijinja::Error> {
    let mut o = DumpOptions::python();
    if let Some(b) = kwargs.get::<Option<bool>>("ensure_ascii")? {
        o.ensure_ascii = b;
    }
    if let Some(b) = kwargs.get::<Option<bool>>("sort_keys")? {
        o.sort_keys = b;
    }
    let indent: Option<Value> = kwargs.get("indent")?;
    if let Some(ind) = indent.filter(|i| !i.is_none() && !i.is_undefined()) {
        o.indent = Some(match ind.as_str() {
            Some(s) => s.to_string(),
            None => " ".repeat(usize::try_from(ind.as_i64().unwrap_or(0)).unwrap_or(0)),
        });
        o.separators.0 = ",".into();
    }
    let seps: Option<Value> = kwargs.get("separators")?;
    if let Some(s) = seps.filter(|s| !s.is_none() && !s.is_undefined()) {
        let parts: Vec<String> = s
            .try_iter()?
            .map(|p| p.as_str().unwrap_or_default().to_string())
            .collect();
        if let [a, b] = parts.as_slice() {
            o.separators = (a.clone(), b.clone());
        } else {
            return Err(minijinja::Error::new(
                minijinja::ErrorKind::InvalidOperation,
                "tojson: separators must be two strings",
            ));
        }
    }
    kwargs.assert_all_used()?;
    Ok(Value::from(dumps(&from_value(v, 0)?, &o)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(src: &str, ctx: Value) -> String {
        let mut env = environment(10_000);
        env.add_template_owned("t".to_string(), src.to_string())
            .unwrap();
        env.get_template("t").unwrap().render(ctx).unwrap()
    }

    #[test]
    fn tojson_keeps_key_order_and_python_separators() {
        let tool = Json::parse(r#"{"name": "calc", "b": [1, 2.5, "<&>"], "a": null}"#).unwrap();
        let ctx = minijinja::context! { t => to_value(&tool) };
        // json.dumps({"name": "calc", "b": [1, 2.5, "<&>"], "a": None}) in Python.
        assert_eq!(
            render("{{ t | tojson }}", ctx.clone()),
            r#"{"name": "calc", "b": [1, 2.5, "<&>"], "a": null}"#
        );
        assert_eq!(
            render("{{ t | tojson(indent=2) }}", ctx.clone()),
            "{\n  \"name\": \"calc\",\n  \"b\": [\n    1,\n    2.5,\n    \"<&>\"\n  ],\n  \"a\": null\n}"
        );
        assert_eq!(
            render("{{ t | tojson(sort_keys=true) }}", ctx),
            r#"{"a": null, "b": [1, 2.5, "<&>"], "name": "calc"}"#
        );
    }

    #[test]
    fn the_environment_is_transformers_s() {
        // trim_blocks + lstrip_blocks: the block lines leave no whitespace behind.
        let src = "{% for m in ms %}\n  {% if m %}\n{{ m.upper() }}\n  {% endif %}\n{% endfor %}";
        let ctx = minijinja::context! { ms => vec!["a", "", "b"] };
        assert_eq!(render(src, ctx), "A\nB\n");
        assert_eq!(
            render("{{ strftime_now('%d %b %Y') }}", Value::from(())),
            FIXED_DATE
        );
        let mut env = environment(10_000);
        env.add_template("r", "{{ raise_exception('no system role') }}")
            .unwrap();
        let err = env.get_template("r").unwrap().render(()).unwrap_err();
        assert!(err.to_string().contains("no system role"), "{err}");
    }

    #[test]
    fn tojson_refuses_a_value_nested_deeper_than_128_and_says_so_briefly() {
        let mut env = environment(10_000_000);
        env.add_template(
            "d",
            "{% set ns = namespace(v=[]) %}{% for i in range(1000) %}{% set ns.v = [ns.v] %}\
             {% endfor %}{{ ns.v|tojson }}",
        )
        .unwrap();
        let err = env.get_template("d").unwrap().render(()).unwrap_err();
        let msg = format!("{err:#}");
        assert!(msg.contains("nested deeper than 128"), "{msg}");
        // No debug info: the 1,000-deep value is not printed with the error (with it, the
        // message would be megabytes; 100,000 levels, as rlvr's hostile-template test builds in
        // the sandboxed worker, would take minutes).
        assert!(msg.len() < 1000, "{} bytes", msg.len());
    }

    #[test]
    fn fuel_stops_a_template_that_does_not_end() {
        let mut env = environment(1_000);
        env.add_template("l", "{% for i in range(100000) %}x{% endfor %}")
            .unwrap();
        let err = env.get_template("l").unwrap().render(()).unwrap_err();
        assert_eq!(err.kind(), minijinja::ErrorKind::OutOfFuel);
    }
}
