//! Registered parts: each value of a choice knob (a policy loss, a baseline, a regulariser, a
//! mismatch correction, ...) declares beside its type, once, the knobs it reads with their
//! defaults and the metrics it emits (the anchor is Trinity-RFT's registry of policy-loss
//! functions, where each registered class names its default arguments and returns its metrics:
//! `trinity/algorithm/policy_loss_fn/`).
//!
//! Everything that says which knob applies under which choice follows from these declarations:
//! the loss-specific keys ([`crate::config::LOSS_OPTIONS`], [`crate::PolicyLoss::options`]), and
//! the trainer's "read only when" gates (rlvr-train's `config::gates`), built from
//! [`crate::config::ALGORITHM_CHOICES`] and the trainer's own choices.
//!
//! A knob is *gated* by a choice when some of the choice's parts read it and others do not; it is
//! read exactly when the selected part lists it.

use serde::{Deserialize, Serialize};

/// One knob a part reads: its key and its default as the resolved config writes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Knob {
    /// The key: bare within the choice's own table (`clip_low` in `[algorithm]`), dotted when it
    /// lives in another table (`model.reference`).
    pub key: &'static str,
    /// The default, as TOML writes it (`0.2`, `"k3"`, `false`); `unset` for an optional knob that
    /// is off unless set.
    pub default: &'static str,
}

/// One value of a choice knob, registered with what it reads and what it reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Part {
    /// The value as the config writes it, without quotes (`ppo`, `log-mean-exp`, `true`, `≠ 0`).
    pub name: &'static str,
    /// The knobs this value reads beyond those every value of the choice reads.
    pub knobs: &'static [Knob],
    /// The metric keys (metrics.jsonl or diagnostics.jsonl) only this value's runs fill in (not
    /// null): the values of the choice that do not list a key leave it null, and a key every
    /// value fills in is no value's (rlvr-train's part-metrics test runs each value to hold it).
    pub metrics: &'static [&'static str],
}

impl Part {
    /// Whether this part reads `key`.
    pub fn reads(&self, key: &str) -> bool {
        self.knobs.iter().any(|k| k.key == key)
    }
}

/// A choice knob whose values are an enum: its key and one registered [`Part`] per variant.
pub trait Registered: Serialize + Copy + 'static {
    /// The key of the choice in its table (`loss`).
    const KEY: &'static str;
    /// One part per variant (a test checks the names are exactly the variants'), in the order
    /// an error lists them.
    const PARTS: &'static [Part];

    /// The registered part of this value.
    ///
    /// # Panics
    /// When the value has no part (a registration test keeps every variant registered).
    fn part(self) -> &'static Part {
        let value = serde_json::to_value(self).expect("a choice serialises");
        let name = value.as_str().expect("a choice serialises as a string");
        Self::PARTS
            .iter()
            .find(|p| p.name == name)
            .unwrap_or_else(|| panic!("{} = \"{name}\" is not registered", Self::KEY))
    }
}

/// A choice as the gates see it: its key, its parts and which one a resolved config `C` selects.
pub struct Choice<C: 'static> {
    /// The key of the choice (bare within `[algorithm]`, or dotted).
    pub key: &'static str,
    /// Whether an error quotes the part names (string values) or not (`true`, `≠ 0`).
    pub quoted: bool,
    /// Every value's part.
    pub parts: &'static [Part],
    /// The part `C` selects.
    pub selected: fn(&C) -> &'static Part,
    /// How an error says the values that read a knob, where that is shorter than listing them
    /// (`("mismatch_cap", "a truncation, a mask or \"icepop\"")`).
    pub says: &'static [(&'static str, &'static str)],
}

impl<C> Choice<C> {
    /// The choice of an enum's registered parts.
    pub const fn of<T: Registered>(selected: fn(&C) -> &'static Part) -> Self {
        Choice {
            key: T::KEY,
            quoted: true,
            parts: T::PARTS,
            selected,
            says: &[],
        }
    }

    /// With `says` as its phrases for the values that read a knob.
    pub const fn saying(self, says: &'static [(&'static str, &'static str)]) -> Self {
        Choice { says, ..self }
    }

    /// The knobs some parts read and others do not, in the order the parts first list them.
    pub fn gated(&self) -> Vec<&'static str> {
        let mut out: Vec<&'static str> = Vec::new();
        for k in self.parts.iter().flat_map(|p| p.knobs) {
            let everywhere = self.parts.iter().all(|p| p.reads(k.key));
            if !everywhere && !out.contains(&k.key) {
                out.push(k.key);
            }
        }
        out
    }

    /// Whether the part `c` selects reads `key`.
    pub fn reads(&self, c: &C, key: &str) -> bool {
        (self.selected)(c).reads(key)
    }

    /// The values of the choice that read `key`, as an error says them: the phrase of
    /// [`Choice::says`], else the part names (quoted for string values) as `a`, `a or b`,
    /// `a, b or c`.
    pub fn when(&self, key: &str) -> String {
        if let Some((_, phrase)) = self.says.iter().find(|(k, _)| *k == key) {
            return phrase.to_string();
        }
        let names: Vec<String> = self
            .parts
            .iter()
            .filter(|p| p.reads(key))
            .map(|p| match self.quoted {
                true => format!("\"{}\"", p.name),
                false => p.name.to_string(),
            })
            .collect();
        match names.split_last() {
            Some((last, [])) => last.clone(),
            Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
            None => String::new(),
        }
    }
}

/// The keys of a struct's table, in declaration order, as its `Deserialize` derive names them
/// (renames applied): read from the list the derive hands to the deserialiser, so they are the
/// type's own.
pub fn table_keys<T: for<'de> Deserialize<'de>>() -> &'static [&'static str] {
    let mut probe = Probe::default();
    let _ = T::deserialize(&mut probe);
    probe.names.unwrap_or(&[])
}

/// The values of a unit-variant enum, in declaration order, as its `Deserialize` derive names
/// them (renames applied).
pub fn enum_values<T: for<'de> Deserialize<'de>>() -> &'static [&'static str] {
    table_keys::<T>()
}

/// A deserialiser that records the field or variant names a derived `Deserialize` passes it,
/// then stops.
#[derive(Default)]
struct Probe {
    names: Option<&'static [&'static str]>,
}

impl<'de> serde::Deserializer<'de> for &mut Probe {
    type Error = serde::de::value::Error;

    fn deserialize_any<V: serde::de::Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
        Err(serde::de::Error::custom("probe"))
    }

    fn deserialize_struct<V: serde::de::Visitor<'de>>(
        self,
        _: &'static str,
        fields: &'static [&'static str],
        _: V,
    ) -> Result<V::Value, Self::Error> {
        self.names = Some(fields);
        Err(serde::de::Error::custom("probe"))
    }

    fn deserialize_enum<V: serde::de::Visitor<'de>>(
        self,
        _: &'static str,
        variants: &'static [&'static str],
        _: V,
    ) -> Result<V::Value, Self::Error> {
        self.names = Some(variants);
        Err(serde::de::Error::custom("probe"))
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct seq tuple tuple_struct map identifier ignored_any
    }
}
