//! Every key the config accepts, read from the config's types rather than from a list that could
//! drift. serde's derive keeps each table's field list and each tagged enum's variant list in the
//! type (`FIELDS`, `VARIANTS`) and hands them, as those lists, to the error type's constructors
//! (`unknown_field(field, FIELDS)`, `unknown_variant(variant, VARIANTS)`, `missing_field(tag)`).
//! The walk deserialises [`RawConfig`] from small documents of its own ([`Doc`]) with an error
//! type of its own ([`Said`]) that keeps those arguments: a table given a key it refuses
//! (`\u{1}`) says the keys it takes; a table tagged by a key (`data.verifier`'s `kind`, a judge's
//! `parse.rule`) says its tag when the tag is missing and the tag's values when given one it
//! refuses. Tables inside arrays (`[[reward.components]]`) and each tag's own keys are followed
//! too. No message text is read.
//!
//! The config reference test checks every such key has a row, and the docs test that the docs
//! name no other.

use serde::de::value::{MapDeserializer, SeqDeserializer, StringDeserializer};
use serde::de::{self, IntoDeserializer, Visitor};
use serde::Deserialize;

use super::RawConfig;

/// The key no table accepts, and the tag value no tagged table accepts.
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

/// A TOML-like document the walk deserialises the config from: only the shapes it places.
#[derive(Debug, Clone)]
enum Doc {
    /// A table, its keys in order.
    Table(Vec<(String, Doc)>),
    /// An array.
    Array(Vec<Doc>),
    /// A string.
    Str(String),
    /// An integer.
    Int(i64),
}

/// What the derive said when it refused a document: the arguments of serde's error constructors.
#[derive(Debug)]
enum Said {
    /// A table refused `field`; it takes `expected` (its derive's `FIELDS`).
    UnknownField {
        field: String,
        expected: &'static [&'static str],
    },
    /// A tag (or enum) refused `variant`; it takes `expected` (its derive's `VARIANTS`).
    UnknownVariant {
        variant: String,
        expected: &'static [&'static str],
    },
    /// A required key is missing (an internally tagged enum's tag, when no tag was given).
    MissingField(&'static str),
    /// Anything else (a wrong type, a value out of range): not a question the walk asks.
    Other,
}

impl std::fmt::Display for Said {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self:?}")
    }
}

impl std::error::Error for Said {}

impl de::Error for Said {
    fn custom<T: std::fmt::Display>(_: T) -> Self {
        Said::Other
    }

    fn unknown_field(field: &str, expected: &'static [&'static str]) -> Self {
        Said::UnknownField {
            field: field.into(),
            expected,
        }
    }

    fn unknown_variant(variant: &str, expected: &'static [&'static str]) -> Self {
        Said::UnknownVariant {
            variant: variant.into(),
            expected,
        }
    }

    fn missing_field(field: &'static str) -> Self {
        Said::MissingField(field)
    }
}

impl<'de> de::Deserializer<'de> for Doc {
    type Error = Said;

    fn deserialize_any<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Said> {
        match self {
            Doc::Table(t) => v.visit_map(MapDeserializer::new(t.into_iter())),
            Doc::Array(a) => v.visit_seq(SeqDeserializer::new(a.into_iter())),
            Doc::Str(s) => v.visit_string(s),
            Doc::Int(i) => v.visit_i64(i),
        }
    }

    /// A value that is there is `Some` (as in TOML, which has no null).
    fn deserialize_option<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Said> {
        v.visit_some(self)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        v: V,
    ) -> Result<V::Value, Said> {
        v.visit_newtype_struct(self)
    }

    /// A string names a unit variant (`mode = "strict"`).
    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _: &'static str,
        _: &'static [&'static str],
        v: V,
    ) -> Result<V::Value, Said> {
        match self {
            Doc::Str(s) => v.visit_enum(StringDeserializer::<Said>::new(s)),
            other => other.deserialize_any(v),
        }
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        unit unit_struct seq tuple tuple_struct map struct identifier ignored_any
    }
}

impl IntoDeserializer<'_, Said> for Doc {
    type Deserializer = Doc;

    fn into_deserializer(self) -> Doc {
        self
    }
}

/// Puts `v` where the probe of one place goes (inside the tables above it).
type Wrap<'a> = &'a dyn Fn(Doc) -> Doc;

/// What the derive says when the config is read from `root`; `None` when it reads.
fn said(root: Doc) -> Option<Said> {
    RawConfig::deserialize(root).err()
}

/// `base` and then `key = value`, as a table.
fn with(base: &[(String, Doc)], key: &str, value: Doc) -> Doc {
    let mut t = base.to_vec();
    t.push((key.into(), value));
    Doc::Table(t)
}

/// The keys of the table at `wrap` (with `base`'s keys beside the probe, e.g. its tag), when
/// it is a table that refuses unknown keys.
fn table_keys(wrap: Wrap<'_>, base: &[(String, Doc)]) -> Option<&'static [&'static str]> {
    match said(wrap(with(base, PROBE, Doc::Int(0))))? {
        Said::UnknownField { field, expected } if field == PROBE => Some(expected),
        _ => None,
    }
}

/// The tag key and its values, when the value at `wrap` is a table tagged by a key.
fn tag_values(wrap: Wrap<'_>) -> Option<(&'static str, &'static [&'static str])> {
    let Said::MissingField(tag) = said(wrap(with(&[], PROBE, Doc::Int(0))))? else {
        return None;
    };
    match said(wrap(with(&[], tag, Doc::Str(PROBE.into()))))? {
        Said::UnknownVariant { variant, expected } if variant == PROBE => Some((tag, expected)),
        _ => None,
    }
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

/// The keys `keys` of the table at `wrap` named `prefix`, `base` beside them (a tag),
/// recursively; `within` names the tagged variant they belong to.
fn walk(
    prefix: &str,
    wrap: Wrap<'_>,
    base: &[(String, Doc)],
    keys: &[&str],
    within: Option<&str>,
    out: &mut Vec<AcceptedKey>,
) {
    for &k in keys {
        let key = match prefix.is_empty() {
            true => k.to_string(),
            false => format!("{prefix}.{k}"),
        };
        let place = |v: Doc| wrap(with(base, k, v));
        if let Some(inner) = table_keys(&place, &[]) {
            add(out, key.clone(), Vec::new(), within);
            walk(&key, &place, &[], inner, within, out);
            continue;
        }
        let element = |v: Doc| place(Doc::Array(vec![v]));
        if let Some(inner) = table_keys(&element, &[]) {
            add(out, key.clone(), Vec::new(), within);
            walk(&format!("{key}[]"), &element, &[], inner, within, out);
            continue;
        }
        if let Some((tag, values)) = tag_values(&place) {
            add(out, key.clone(), Vec::new(), within);
            let tags = values.iter().map(|v| v.to_string()).collect();
            add(out, format!("{key}.{tag}"), tags, within);
            for &v in values {
                // `reward-model` is an alias of `reward_model`, with its keys.
                if v.contains('-') && values.contains(&v.replace('-', "_").as_str()) {
                    continue;
                }
                let tagged = [(tag.to_string(), Doc::Str(v.into()))];
                // A variant without keys (`kind = "math"`) refuses nothing by name.
                let inner = table_keys(&place, &tagged).unwrap_or_default();
                let name = format!("{tag} = \"{v}\"");
                let within = match within {
                    Some(w) => format!("{w}, {name}"),
                    None => name,
                };
                walk(&key, &place, &tagged, inner, Some(within.as_str()), out);
            }
            continue;
        }
        add(out, key, Vec::new(), within);
    }
}

/// Every key of the config (file or `--set`), as its types accept them, in their order.
///
/// # Panics
/// When the config's top level does not refuse unknown keys (a test holds it).
pub fn accepted_keys() -> Vec<AcceptedKey> {
    let root = |v: Doc| v;
    let sections = table_keys(&root, &[]).expect("the config's top level refuses unknown keys");
    let mut out = Vec::new();
    walk("", &root, &[], sections, None, &mut out);
    out
}
