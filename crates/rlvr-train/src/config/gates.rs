//! Knobs read only when another option turns them on ([`GATES`]). Setting such a knob while its
//! option is off is an error naming that option (README: an option that does not apply is an
//! error), since nothing would read the value: `algorithm.tau` without a regulariser,
//! `algorithm.mismatch_cap` with `mismatch_correction = "none"`, a vLLM key with the native engine.
//!
//! Only keys the user wrote count (the file and `--set`; on `--resume`, the `--set` overrides),
//! never values a preset or a default filled in. The loss-specific knobs of `[algorithm]` (which
//! loss reads `clip_low`, ...) are rlvr-algo's check ([`rlvr_algo::AlgorithmConfig::resolve`]).

use std::sync::LazyLock;

use rlvr_algo::config::ALGORITHM_CHOICES;
use rlvr_algo::{Algorithm, Choice, Registered};

use super::sections::{DYNAMIC_SAMPLING_PARTS, LORA_PARTS};
use super::{ResolvedConfig, RolloutBackend, Schedule};

/// A knob and the option that turns it on.
#[derive(Clone, Copy)]
pub struct Gate {
    /// The knob's dotted key (`algorithm.tau`).
    pub key: &'static str,
    /// The dotted key of the option that turns it on (`algorithm.regulariser`).
    pub gate: &'static str,
    /// The values of `gate` that turn the knob on, as the error says them.
    pub when: &'static str,
    /// The choice whose selected part says whether the knob is read, and the knob as it names it.
    by: By,
    knob: &'static str,
}

/// Where a gate's choice is declared.
#[derive(Clone, Copy)]
enum By {
    /// An `[algorithm]` choice of rlvr-algo ([`ALGORITHM_CHOICES`]).
    Algorithm(&'static Choice<Algorithm>),
    /// A choice of the trainer's ([`TRAINER_CHOICES`]).
    Trainer(&'static Choice<ResolvedConfig>),
}

impl Gate {
    /// Whether the resolved config reads the knob.
    pub fn reads(&self, c: &ResolvedConfig) -> bool {
        match self.by {
            By::Algorithm(ch) => ch.reads(&c.algorithm, self.knob),
            By::Trainer(ch) => ch.reads(c, self.knob),
        }
    }
}

impl std::fmt::Debug for Gate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Gate({} by {})", self.key, self.gate)
    }
}

/// The trainer's own choices that gate knobs, checked after the `[algorithm]` ones (dotted keys;
/// a bare knob key is in the choice's table).
pub const TRAINER_CHOICES: &[Choice<ResolvedConfig>] = &[
    Choice {
        key: "train.schedule",
        ..Choice::of::<Schedule>(|c: &ResolvedConfig| c.raw.train.schedule.part())
    },
    Choice {
        key: "algorithm.dynamic_sampling",
        quoted: false,
        parts: DYNAMIC_SAMPLING_PARTS,
        selected: |c| &DYNAMIC_SAMPLING_PARTS[usize::from(!c.algorithm.dynamic_sampling)],
        says: &[],
    },
    Choice {
        key: "model.lora_rank",
        quoted: false,
        parts: LORA_PARTS,
        selected: |c| &LORA_PARTS[usize::from(c.raw.model.lora_rank == 0)],
        says: &[],
    },
    Choice {
        key: "rollout.backend",
        ..Choice::of::<RolloutBackend>(|c: &ResolvedConfig| c.raw.rollout.backend.part())
    },
];

/// `text` kept for the life of the process (the gates are built once).
fn forever(text: String) -> &'static str {
    Box::leak(text.into_boxed_str())
}

/// The gates of one choice whose dotted key is `key`: one per knob some of its parts read and
/// others do not, in the order the parts list them.
fn gates_of<C>(key: &'static str, choice: &Choice<C>, by: By) -> Vec<Gate> {
    let table = key.rsplit_once('.').map_or("", |(t, _)| t);
    choice
        .gated()
        .into_iter()
        .map(|knob| Gate {
            key: match knob.contains('.') {
                true => knob,
                false => forever(format!("{table}.{knob}")),
            },
            gate: key,
            when: forever(choice.when(knob)),
            by,
            knob,
        })
        .collect()
}

/// Every knob that is read only when another option is on, in the order they are checked,
/// following from the registered parts of each choice ([`ALGORITHM_CHOICES`], then
/// [`TRAINER_CHOICES`]). A test walks it, and fails when a documented key says "only
/// read"/"only when"/"vLLM backend" without an entry here.
pub static GATES: LazyLock<Vec<Gate>> = LazyLock::new(|| {
    let mut out = Vec::new();
    for ch in ALGORITHM_CHOICES {
        let key = forever(format!("algorithm.{}", ch.key));
        out.extend(gates_of(key, ch, By::Algorithm(ch)));
    }
    for ch in TRAINER_CHOICES {
        out.extend(gates_of(ch.key, ch, By::Trainer(ch)));
    }
    out
});

/// Refuses a knob of [`GATES`] that the user wrote (`written`: dotted keys with where each was
/// written) while its option is off.
///
/// # Errors
/// The first such knob: its key, where it was written, the option and its value in force, the
/// values that would read it, and the two fixes.
pub fn check(cfg: &ResolvedConfig, written: &[super::Written]) -> anyhow::Result<()> {
    let resolved: Option<toml::Table> = cfg.to_toml().ok().and_then(|t| t.parse().ok());
    for g in GATES.iter() {
        let Some(w) = written
            .iter()
            .find(|w| w.key == g.key || w.key.starts_with(&format!("{}.", g.key)))
        else {
            continue;
        };
        if g.reads(cfg) {
            continue;
        }
        let value = resolved
            .as_ref()
            .and_then(|t| lookup(t, g.gate))
            .map_or_else(|| "unset".to_string(), |v| v.to_string());
        let (table, field) = g.key.rsplit_once('.').unwrap_or(("", g.key));
        anyhow::bail!(
            "{} is set ({}) but nothing reads it: {} = {value}, and {field} is read only when {} \
             is {}; remove `{field}` from [{table}], or set {}",
            g.key,
            w.origin,
            g.gate,
            g.gate,
            g.when,
            g.gate
        );
    }
    Ok(())
}

/// The value at dotted `key` of `t`.
fn lookup<'a>(t: &'a toml::Table, key: &str) -> Option<&'a toml::Value> {
    let mut parts = key.split('.');
    let mut cur = t.get(parts.next()?)?;
    for p in parts {
        cur = cur.as_table()?.get(p)?;
    }
    Some(cur)
}

/// `text` (the resolved config as TOML, `toml::to_string_pretty`'s layout: `[table]` headers,
/// one `key = value` per line, an array over several lines closed by a line `]`) without the
/// knobs of [`GATES`] that `cfg` does not read: what `config.toml` and `--print-config` hold, so
/// that they load again as a `--config`.
///
/// When it leaves knobs out, the text starts with a comment line [`UNREAD_COMMENT`] followed by
/// their dotted keys, comma-separated: `rlvr lab` reads it to tell a knob an older config.toml
/// still holds (written before such knobs were left out) from a change of the sweep.
pub fn drop_unread(cfg: &ResolvedConfig, text: &str) -> String {
    let unread: Vec<&str> = GATES
        .iter()
        .filter(|g| !g.reads(cfg))
        .map(|g| g.key)
        .collect();
    let mut out = String::with_capacity(text.len());
    let mut table = String::new();
    let mut skipping_array = false;
    let mut left_out = Vec::new();
    for line in text.lines() {
        if skipping_array {
            skipping_array = line.trim() != "]";
            continue;
        }
        let l = line.trim();
        if let Some(h) = l.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
            if !l.starts_with("[[") {
                table = h.trim().to_string();
            }
        } else if let Some((k, v)) = l.split_once(" = ") {
            let key = format!("{table}.{}", k.trim().trim_matches('"'));
            if unread.contains(&key.as_str()) {
                let v = v.trim();
                skipping_array = v.starts_with('[') && !v.ends_with(']');
                left_out.push(key);
                continue;
            }
        }
        out.push_str(line);
        out.push('\n');
    }
    match left_out.is_empty() {
        true => out,
        false => format!("{UNREAD_COMMENT}{}\n{out}", left_out.join(", ")),
    }
}

/// The start of the comment line of [`drop_unread`] (rlvr-lab's `runner::UNREAD_COMMENT` is the
/// same text; `crates/rlvr/tests/it/configs.rs` checks it).
pub const UNREAD_COMMENT: &str = "# Not read with these options, so left out: ";
