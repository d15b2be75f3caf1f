//! Every key the config accepts, found by asking the deserialiser itself rather than read from
//! a list that could drift: each table is given a key it refuses (`\u{1}`), and the error lists
//! the keys it takes. Tables inside arrays (`[[reward.components]]`), tables tagged by a key
//! (`data.verifier`'s `kind`, a judge's `parse.rule`) and each tag's own keys are followed too.
//! The config reference test checks every such key has a row, and the docs test that the docs
//! name no other.

use super::help::{expected_words, quoted_after};
use super::RawConfig;

/// The key no table accepts.
const PROBE: &str = "\u{1}";

/// One accepted key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcceptedKey {
    /// Dotted, with `[]` for the element of an array of tables: `train.lr`,
    /// `data.verifier.command`, `reward.components[].weight`.
    pub key: String,
    /// For a tag key (`data.verifier.kind`), the values it takes; else empty.
    pub tags: Vec<String>,
    /// For a key of one tagged variant, that variant (`kind = "external"` for
    /// `data.verifier.command`; several when kinds share the key).
    pub within: Vec<String>,
}

/// Puts `v` where the probe of one place goes (inside the tables above it).
type Wrap<'a> = &'a dyn Fn(toml::Value) -> toml::Table;

/// The deserialiser's error for `root` as a [`RawConfig`], if any, without toml's last line
/// (`in `table``, which would read as one more expected key).
fn error_of(root: toml::Table) -> Option<String> {
    let e = serde_path_to_error::deserialize::<_, RawConfig>(toml::Value::Table(root)).err()?;
    let msg = e.into_inner().to_string();
    let msg = msg.trim_end();
    Some(match msg.rsplit_once('\n') {
        Some((head, tail)) if tail.starts_with("in `") => head.trim_end().to_string(),
        _ => msg.to_string(),
    })
}

/// `base` plus the refused key.
fn probed(base: &toml::Table) -> toml::Value {
    let mut t = base.clone();
    t.insert(PROBE.into(), toml::Value::Integer(0));
    toml::Value::Table(t)
}

/// The keys of the table at `wrap` (with `base`'s keys beside the probe, e.g. its tag), when
/// it is a table that refuses unknown keys.
fn table_keys(wrap: Wrap<'_>, base: &toml::Table) -> Option<Vec<String>> {
    let msg = error_of(wrap(probed(base)))?;
    (quoted_after(&msg, "unknown field") == Some(PROBE))
        .then(|| expected_words(&msg).into_iter().map(String::from).collect())
}

/// The tag key and its values, when the value at `wrap` is a table tagged by a key.
fn tag_values(wrap: Wrap<'_>, base: &toml::Table) -> Option<(String, Vec<String>)> {
    let msg = error_of(wrap(probed(base)))?;
    let tag = quoted_after(&msg, "missing field")?.to_string();
    let mut t = base.clone();
    t.insert(tag.clone(), toml::Value::String(PROBE.into()));
    let msg = error_of(wrap(toml::Value::Table(t)))?;
    (quoted_after(&msg, "unknown variant") == Some(PROBE)).then(|| {
        let values = expected_words(&msg).into_iter().map(String::from).collect();
        (tag, values)
    })
}

/// Adds `key` (once; a key shared by several variants collects them in `within`).
fn add(out: &mut Vec<AcceptedKey>, key: String, tags: Vec<String>, within: Option<&str>) {
    match out.iter_mut().find(|k| k.key == key) {
        Some(k) => k.within.extend(within.map(String::from)),
        None => out.push(AcceptedKey {
            key,
            tags,
            within: within.map(String::from).into_iter().collect(),
        }),
    }
}

/// The keys of the table at `wrap` named `prefix`, `base` beside them (a tag), recursively;
/// `within` names the tagged variant they belong to.
fn walk(
    prefix: &str,
    wrap: Wrap<'_>,
    base: &toml::Table,
    keys: &[String],
    within: Option<&str>,
    out: &mut Vec<AcceptedKey>,
) {
    for k in keys {
        let key = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        let place = |v: toml::Value| {
            let mut t = base.clone();
            t.insert(k.clone(), v);
            wrap(toml::Value::Table(t))
        };
        let empty = toml::Table::new();
        if let Some(inner) = table_keys(&place, &empty) {
            add(out, key.clone(), Vec::new(), within);
            walk(&key, &place, &empty, &inner, within, out);
            continue;
        }
        let element = |v: toml::Value| place(toml::Value::Array(vec![v]));
        if let Some(inner) = table_keys(&element, &empty) {
            add(out, key.clone(), Vec::new(), within);
            walk(&format!("{key}[]"), &element, &empty, &inner, within, out);
            continue;
        }
        if let Some((tag, values)) = tag_values(&place, &empty) {
            add(out, key.clone(), Vec::new(), within);
            add(out, format!("{key}.{tag}"), values.clone(), within);
            for v in &values {
                // `reward-model` is an alias of `reward_model`, with its keys.
                if v.contains('-') && values.contains(&v.replace('-', "_")) {
                    continue;
                }
                let mut tagged = toml::Table::new();
                tagged.insert(tag.clone(), toml::Value::String(v.clone()));
                // A variant without keys (`kind = "math"`) refuses nothing by name.
                let inner = table_keys(&place, &tagged).unwrap_or_default();
                let name = format!("{tag} = \"{v}\"");
                let within = match within {
                    Some(w) => format!("{w}, {name}"),
                    None => name,
                };
                walk(&key, &place, &tagged, &inner, Some(within.as_str()), out);
            }
            continue;
        }
        add(out, key, Vec::new(), within);
    }
}

/// Every key of the config (file or `--set`), as the deserialiser accepts them, in its order.
pub fn accepted_keys() -> Vec<AcceptedKey> {
    let root = |v: toml::Value| match v {
        toml::Value::Table(t) => t,
        _ => unreachable!("the root is a table"),
    };
    let empty = toml::Table::new();
    let sections = table_keys(&root, &empty).expect("the config's top level refuses unknown keys");
    let mut out = Vec::new();
    walk("", &root, &empty, &sections, None, &mut out);
    out
}
