//! The run configuration (DESIGN.md section 10): one TOML file, precedence
//! **defaults < preset < file < `--set key=value`**, unknown keys rejected by name, and the resolved
//! config written to `RUN_DIR/config.toml`.
//!
//! - [`RawConfig`] is what the user wrote (file + overrides), deserialised with `deny_unknown_fields`
//!   everywhere, so a misspelt key fails at load with its dotted path; an error is blamed on the layer
//!   that introduced it (the file, or the `--set` that did). `model.dtype` and `model.device` are
//!   parsed there, once, into [`rlvr_model::ComputeDtype`] and [`rlvr_model::DeviceSpec`].
//! - [`RawConfig::resolve`] (in `checks.rs`) is the one resolve step: it expands the algorithm
//!   preset ([`rlvr_algo::AlgorithmConfig::resolve`], which rejects a loss-specific knob set for
//!   another loss), checks values the types cannot, and works out the staleness warning. Its result
//!   ([`ResolvedConfig`]) is what the loop reads and what `config.toml` holds (every `[algorithm]`
//!   knob that applies to the chosen loss, so a resume re-resolves to the same values).
//! - [`ResolvedConfig::from_run_dir`] reads a run's `config.toml` back for `--resume`, also one
//!   written before the loss options were grouped (it held every knob), and refuses a `train.steps`
//!   below the step the run has reached.
//! - The sections rlvr-train defines are in `sections.rs`; their doc comments are the README's
//!   config reference ([`reference_markdown`]).

mod checks;
pub mod gates;
pub mod help;
pub mod keys;
pub mod paths;
pub use checks::{
    ResumeChange, MAX_EPOCHS, MAX_EVAL_SAMPLES, MAX_GROUP_SIZE, MAX_LORA_RANK, MAX_NEW_TOKENS,
    MAX_ROWS_PER_STEP, MAX_TEMPERATURE,
};
pub mod plan;
pub mod prompt_scan;
mod sections;
pub mod settings;

use std::path::Path;

use anyhow::{bail, Context};
use rlvr_algo::{Algorithm, AlgorithmConfig};
use rlvr_data::config::DataConfig;
use rlvr_model::{ComputeDtype, DeviceSpec};
use rlvr_reward::combine::RewardConfig;
use serde::{Deserialize, Serialize};

pub use sections::{
    CacheSalt, DistBackend, DistributedSection, EnvSection, EvalSection, ModelSection,
    OutputSection, RolloutBackend, RolloutSection, Schedule, ShortBatch, SyncSection, TrainSection,
};

/// The whole file as the user wrote it (after `--set`), before resolution.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawConfig {
    /// `[model]`.
    pub model: ModelSection,
    /// `[data]` (rlvr-data).
    pub data: DataConfig,
    /// `[rollout]`.
    pub rollout: RolloutSection,
    /// `[algorithm]` (rlvr-algo; preset applied in [`RawConfig::resolve`]).
    pub algorithm: AlgorithmConfig,
    /// `[reward]` (rlvr-reward).
    pub reward: RewardConfig,
    /// `[sync]`.
    pub sync: SyncSection,
    /// `[train]`.
    pub train: TrainSection,
    /// `[eval]`.
    pub eval: EvalSection,
    /// `[output]`.
    pub output: OutputSection,
    /// `[distributed]`.
    pub distributed: DistributedSection,
    /// `[kernels]` (rlvr-model's `KernelSwitches`): one switch per fused GPU kernel.
    pub kernels: rlvr_model::KernelSwitches,
    /// `[env]`: multi-turn episodes (docs/DESIGN.md section 14); left out of config.toml when
    /// every key is at its default.
    #[serde(skip_serializing_if = "EnvSection::is_default")]
    pub env: EnvSection,
    /// The keys the user wrote (file and `--set`; on `--resume`, the `--set` overrides) and
    /// where: a knob of [`gates::GATES`] among them whose option is off is an error. Not part of
    /// the TOML.
    #[serde(skip)]
    pub written: WrittenKeys,
    /// Lines about how the file's values were read (a preset changed by `--set` over a file that
    /// holds the old preset's resolved values, [`checks`]): start-up warnings of the resolved
    /// config, so they reach train.log. Not part of the TOML nor of the config's value.
    #[serde(skip)]
    pub notes: Notes,
}

/// The keys the user wrote ([`RawConfig::written`]): where a value came from, not part of the
/// config's value, so two configs with the same values are equal whatever wrote them.
#[derive(Debug, Clone, Default)]
pub struct WrittenKeys(pub Vec<Written>);

impl PartialEq for WrittenKeys {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl std::ops::Deref for WrittenKeys {
    type Target = Vec<Written>;
    fn deref(&self) -> &Vec<Written> {
        &self.0
    }
}

impl std::ops::DerefMut for WrittenKeys {
    fn deref_mut(&mut self) -> &mut Vec<Written> {
        &mut self.0
    }
}

/// Lines about how a config was read ([`RawConfig::notes`]); like [`WrittenKeys`], not part of
/// the config's value.
#[derive(Debug, Clone, Default)]
pub struct Notes(pub Vec<String>);

impl PartialEq for Notes {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

/// The resolved configuration: what the loop reads. `raw.algorithm` is the fully-set table of
/// `algorithm` (every knob that applies to the chosen loss, so it round-trips).
#[derive(Debug, Clone)]
pub struct ResolvedConfig {
    /// Every section, with `algorithm` set for every knob of the chosen loss.
    pub raw: RawConfig,
    /// The resolved algorithm.
    pub algorithm: Algorithm,
    /// Start-up warnings (e.g. `max_staleness` below o+v−1); printed and kept.
    pub warnings: Vec<String>,
    /// What `model.device`/`model.dtype = "auto"` became ([`ModelSection::resolve_auto`]),
    /// printed once at start; `None` when neither was `auto`.
    pub auto: Option<String>,
    /// On `--resume`: the keys the `--set`s changed that change what the run means (each also a
    /// warning), recorded in run.json's `resume_changes`; empty otherwise.
    pub resume_changes: Vec<ResumeChange>,
}

/// Parses a `--set` value: a TOML literal (`1e-6`, `true`, `"x"`, `[1, 2]`, `{ kind = "math" }`),
/// falling back to a plain string (`--set model.path=/models/q`).
pub fn parse_value(text: &str) -> toml::Value {
    let doc = format!("v = {text}");
    match doc.parse::<toml::Table>() {
        Ok(mut t) => t
            .remove("v")
            .unwrap_or_else(|| toml::Value::String(text.into())),
        Err(_) => toml::Value::String(text.to_string()),
    }
}

/// Applies one `key=value` override (dotted key) to `table`, creating intermediate tables.
///
/// # Errors
/// A malformed override (no `=`, empty key part) or a key that walks through a non-table value.
pub fn apply_override(table: &mut toml::Table, spec: &str) -> anyhow::Result<()> {
    let (key, value) = spec
        .split_once('=')
        .with_context(|| format!("--set {spec:?}: expected key=value, e.g. train.lr=1e-6"))?;
    let key = key.trim();
    let parts: Vec<&str> = key.split('.').collect();
    if parts.iter().any(|p| p.is_empty()) {
        bail!("--set {spec:?}: empty part in key `{key}`");
    }
    let mut cur = table;
    for p in &parts[..parts.len() - 1] {
        let entry = cur
            .entry(p.to_string())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        cur = match entry {
            toml::Value::Table(t) => t,
            _ => bail!("--set {spec:?}: `{p}` in `{key}` is not a table"),
        };
    }
    cur.insert(
        parts[parts.len() - 1].to_string(),
        parse_value(value.trim()),
    );
    Ok(())
}

/// Deserialises a table into `T`, naming the dotted path of the offending key on error
/// (e.g. `unknown key in [train]: unknown field `lr_max`, expected one of ...`).
pub fn from_table<T: serde::de::DeserializeOwned>(table: toml::Table) -> anyhow::Result<T> {
    from_table_keyed(table).map_err(|e| anyhow::anyhow!("{e}"))
}

/// A deserialisation error with the dotted key it is about.
struct KeyError {
    /// The dotted key (empty: the whole file).
    key: String,
    /// The message, naming the key.
    message: String,
}

impl std::fmt::Display for KeyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// [`from_table`] with the key kept apart, and the help of `help.rs` for an unknown key (the
/// peer's name it is, or the nearest key) and an unknown value (the nearest accepted value).
fn from_table_keyed<T: serde::de::DeserializeOwned>(table: toml::Table) -> Result<T, KeyError> {
    let original = table.clone();
    let value = toml::Value::Table(table);
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let path = if path == "." { String::new() } else { path };
        let inner = e.into_inner().to_string();
        let inner = inner.trim_end();
        // toml's own "in `table`" line repeats the key the message names.
        let inner = match inner.rsplit_once('\n') {
            Some((head, tail)) if tail.starts_with("in `") => head.trim_end(),
            _ => inner,
        };
        if let Some(field) = help::quoted_after(inner, "unknown field") {
            let key = match path.as_str() {
                "" => field.to_string(),
                p if p == field || p.ends_with(&format!(".{field}")) => p.to_string(),
                p => format!("{p}.{field}"),
            };
            // An unknown table (`actor_rollout_ref`): a peer's name among its leaves is the help.
            let key = match paths::get(&original, &key) {
                Some(toml::Value::Table(t)) => {
                    let mut leaves = Vec::new();
                    leaf_keys(t, &key, &mut leaves);
                    let known = known_keys();
                    let ours_nested = |k: &str| help::nested_key(k, &known).is_some();
                    let alias = leaves.iter().find(|k| help::alias_for(k).is_some());
                    let nested = leaves.iter().find(|k| ours_nested(k));
                    alias.or(nested).cloned().unwrap_or(key)
                }
                _ => key,
            };
            let expected = help::expected_words(inner);
            let message = match help::unknown_key_help(&key, &expected, &known_keys()) {
                Some(h) if help::alias_for(&key).is_some() => format!("unknown key: {h}"),
                Some(h) => format!("unknown key `{key}`: {h} ({inner})"),
                None => format!("unknown key `{key}` ({inner})"),
            };
            return KeyError { key, message };
        }
        // An internally tagged table (`data.verifier`) reports its fields' errors at the table.
        let path = match value_at(&original, &path) {
            Some(toml::Value::Table(_)) if help::quoted_after(inner, "missing field").is_none() => {
                blame_leaf::<T>(&original, &path).unwrap_or(path)
            }
            _ => path,
        };
        let mut message = if path.is_empty() {
            format!("config: {inner}")
        } else {
            format!("config key `{path}`: {inner}")
        };
        if let Some(v) = help::quoted_after(inner, "unknown variant") {
            if let Some(note) = help::peer_value(&path, v) {
                message.push_str(&format!("; {note}"));
            } else if let Some(n) = help::nearest(v, help::expected_words(inner)) {
                message.push_str(&format!("; did you mean \"{n}\"?"));
            }
        }
        if let Some(note) = quoted_scalar_note(inner) {
            message.push_str(&format!("; {note}"));
        }
        KeyError { key: path, message }
    })
}

/// For serde's `invalid type: string "1e-5", expected f64` (a number or boolean written in
/// quotes, so TOML reads a string): the note that says to drop the quotes.
fn quoted_scalar_note(inner: &str) -> Option<String> {
    let rest = &inner[inner.find("invalid type: string \"")? + "invalid type: string \"".len()..];
    let (v, rest) = rest.split_once('"')?;
    let expected = rest.split_once("expected ")?.1;
    let number = [
        "f32", "f64", "u8", "u16", "u32", "u64", "usize", "i32", "i64",
    ]
    .iter()
    .any(|t| expected.starts_with(t))
        && v.trim().parse::<f64>().is_ok();
    let boolean = expected.starts_with("a boolean") && matches!(v, "true" | "false");
    (number || boolean)
        .then(|| format!("\"{v}\" is in quotes, so TOML reads a string: write {v} without quotes"))
}

/// The parts of a path as serde_path_to_error writes it (`reward.components[0].verifier`): a
/// table key, or an array index.
fn path_parts(path: &str) -> Vec<Result<&str, usize>> {
    let mut out = Vec::new();
    for part in path.split('.') {
        let (name, mut rest) = part.split_once('[').map_or((part, ""), |(n, r)| (n, r));
        out.push(Ok(name));
        while let Some((i, after)) = rest.split_once(']') {
            out.extend(i.parse().ok().map(Err));
            rest = after.strip_prefix('[').unwrap_or("");
        }
    }
    out
}

/// The value at `path` (as [`path_parts`] reads it) in `table`.
fn value_at<'a>(table: &'a toml::Table, path: &str) -> Option<&'a toml::Value> {
    let mut parts = path_parts(path).into_iter();
    let mut cur = table.get(parts.next()?.ok()?)?;
    for p in parts {
        cur = match p {
            Ok(k) => cur.as_table()?.get(k)?,
            Err(i) => cur.as_array()?.get(i)?,
        };
    }
    Some(cur)
}

/// `table` without the leaf `key` of the table at `path` (`None` if there is none).
fn without(table: &toml::Table, path: &str, key: &str) -> Option<toml::Table> {
    let mut t = table.clone();
    let mut parts = path_parts(path).into_iter();
    let mut cur = t.get_mut(parts.next()?.ok()?)?;
    for p in parts {
        cur = match p {
            Ok(k) => cur.as_table_mut()?.get_mut(k)?,
            Err(i) => cur.as_array_mut()?.get_mut(i)?,
        };
    }
    cur.as_table_mut()?.remove(key)?;
    Some(t)
}

/// The key under the table at `path` that makes `original` fail to deserialise as `T`, when
/// serde names only the table (an internally tagged one, such as `data.verifier`: its fields'
/// errors carry no field name). Each key of the table is removed in turn: the culprit is the first
/// whose removal leaves `original` valid or changes its error to another (the removed key's error
/// hid it), else the first whose removal only leaves that very key missing, keys holding a string
/// last (a tag such as `kind`, whose removal is also "missing").
fn blame_leaf<T: serde::de::DeserializeOwned>(
    original: &toml::Table,
    path: &str,
) -> Option<String> {
    let Some(toml::Value::Table(t)) = value_at(original, path) else {
        return None;
    };
    let message = |table: toml::Table| {
        serde_path_to_error::deserialize::<_, T>(toml::Value::Table(table))
            .err()
            .map(|e| e.into_inner().to_string())
    };
    let before = message(original.clone());
    let mut missing = Vec::new();
    let mut found = None;
    for (key, value) in t {
        let after = message(without(original, path, key)?);
        match after {
            None => found = Some(key),
            Some(m) if help::quoted_after(&m, "missing field") == Some(key.as_str()) => {
                missing.push((value.is_str(), key));
            }
            Some(m) if Some(&m) != before.as_ref() => found = Some(key),
            Some(_) => {}
        }
        if found.is_some() {
            break;
        }
    }
    missing.sort_by_key(|(is_str, _)| *is_str);
    let key = format!("{path}.{}", found.or(missing.first().map(|(_, k)| *k))?);
    // A tagged table inside a tagged table (a judge's `parse`): its own key.
    match value_at(original, &key) {
        Some(toml::Value::Table(_)) => Some(blame_leaf::<T>(original, &key).unwrap_or(key)),
        _ => Some(key),
    }
}

/// A key the user wrote, and where: the file and line, or the `--set` (the gate check names it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    /// Dotted key of a leaf value (`algorithm.tau`; a table's keys are listed one by one).
    pub key: String,
    /// Where: `configs/x.toml line 12`, or `--set algorithm.tau=0.1`.
    pub origin: String,
}

/// The dotted keys of `t`'s leaf values (arrays of tables count as leaves).
fn leaf_keys(t: &toml::Table, prefix: &str, out: &mut Vec<String>) {
    for (k, v) in t {
        let key = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        match v {
            toml::Value::Table(sub) => leaf_keys(sub, &key, out),
            _ => out.push(key),
        }
    }
}

/// Every key of the config's tables (`section.key`, as the deserialiser accepts them: asked by
/// giving each table a key it refuses, whose error lists the accepted ones) and the documented
/// keys of the README's config reference: the candidates of "did you mean".
pub fn known_keys() -> Vec<String> {
    let accepted = |table: toml::Table| -> Vec<String> {
        match serde_path_to_error::deserialize::<_, RawConfig>(toml::Value::Table(table)) {
            Err(e) => help::expected_words(&e.into_inner().to_string())
                .into_iter()
                .map(str::to_string)
                .collect(),
            Ok(_) => Vec::new(),
        }
    };
    let probe = "\u{1}";
    let mut top = toml::Table::new();
    top.insert(probe.into(), toml::Value::Integer(0));
    let mut keys = Vec::new();
    for section in accepted(top) {
        let mut inner = toml::Table::new();
        inner.insert(probe.into(), toml::Value::Integer(0));
        let mut t = toml::Table::new();
        t.insert(section.clone(), toml::Value::Table(inner));
        keys.extend(accepted(t).into_iter().map(|k| format!("{section}.{k}")));
    }
    let documented = reference_markdown()
        .lines()
        .filter_map(|l| l.strip_prefix("| `")?.split_once('`'))
        .map(|(k, _)| k.to_string())
        .filter(|k| k.contains('.') && !k.contains(' '))
        .collect::<Vec<_>>();
    for k in documented {
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    keys
}

/// One config file: its path, text and table, input paths resolved against its directory.
struct FileLayer {
    /// The path as given.
    path: std::path::PathBuf,
    /// Its text (for the line of an error).
    text: String,
}

impl RawConfig {
    /// Loads `file` (if any) and applies `overrides` (`key=value`, in order): file < `--set`.
    ///
    /// Input paths written in the file (`model.path`, `data.train`, an external verifier's
    /// program, ...: `paths.rs`) are relative to the file's directory; those given by `--set` to
    /// the working directory; after loading every one is absolute.
    ///
    /// # Errors
    /// Unreadable or malformed TOML (naming the file), malformed overrides, unknown keys (named by
    /// their dotted path, with the peer's name it is or the nearest key, and the file's line) and
    /// ill-typed values (e.g. a `model.dtype` that is no dtype, listing the accepted ones), each
    /// said to come from the file or from the `--set` that introduced it.
    pub fn load(file: Option<&Path>, overrides: &[String]) -> anyhow::Result<RawConfig> {
        let (mut table, layer) = match file {
            Some(p) => {
                let text = std::fs::read_to_string(p)
                    .with_context(|| format!("reading config {}", p.display()))?;
                let mut table = text
                    .parse::<toml::Table>()
                    .with_context(|| format!("parsing config {}", p.display()))?;
                paths::resolve_in_table(&mut table, &paths::config_dir(p)?);
                let layer = FileLayer {
                    path: p.to_path_buf(),
                    text,
                };
                (table, Some(layer))
            }
            None => (toml::Table::new(), None),
        };
        let note = match &layer {
            Some(f) => checks::follow_preset_change(&mut table, overrides, &f.path)?,
            None => None,
        };
        let mut raw = load_layers(table, layer.as_ref(), overrides)?;
        raw.notes.0.extend(note);
        let cwd = std::env::current_dir().context("reading the current directory")?;
        paths::absolutize(&mut raw, &cwd);
        Ok(raw)
    }
}

/// Deserialises `base` (read from `file`, or the defaults) with `overrides` applied in order, and
/// records the keys each layer wrote ([`RawConfig::written`]). An error is said to come from the
/// layer that introduced it: the last layer (the base, then each override) after which every
/// partial table fails with the final error; an error of the file names its line.
fn load_layers(
    base: toml::Table,
    file: Option<&FileLayer>,
    overrides: &[String],
) -> anyhow::Result<RawConfig> {
    let origin = file.map_or_else(
        || "the defaults".to_string(),
        |f| f.path.display().to_string(),
    );
    let mut written = Vec::new();
    let mut keys = Vec::new();
    leaf_keys(&base, "", &mut keys);
    for key in keys {
        let line = file.and_then(|f| help::locate(&f.text, &key));
        let origin = match line {
            Some(n) => format!("{origin} line {n}"),
            None => origin.clone(),
        };
        written.push(Written { key, origin });
    }
    let mut table = base.clone();
    for o in overrides {
        apply_override(&mut table, o)?;
        let mut set = toml::Table::new();
        apply_override(&mut set, o)?;
        let mut keys = Vec::new();
        leaf_keys(&set, "", &mut keys);
        written.extend(keys.into_iter().map(|key| Written {
            key,
            origin: format!("--set {o}"),
        }));
    }
    let err = match from_table_keyed::<RawConfig>(table) {
        Ok(mut c) => {
            c.written = WrittenKeys(written);
            return Ok(c);
        }
        Err(e) => e,
    };
    let describe = |t: &toml::Table| {
        from_table_keyed::<RawConfig>(t.clone())
            .err()
            .map(|e| e.message)
    };
    let mut layer = base;
    let mut errors = vec![describe(&layer)];
    for o in overrides {
        apply_override(&mut layer, o)?;
        errors.push(describe(&layer));
    }
    let last = errors.last().cloned().flatten();
    let blamed = errors.iter().rposition(|e| *e != last).map_or(0, |i| i + 1);
    let line = file.and_then(|f| help::locate(&f.text, &err.key));
    Err(match (blamed, line) {
        (0, Some(n)) => anyhow::anyhow!("{err}").context(format!("in {origin} line {n}")),
        (0, None) => anyhow::anyhow!("{err}").context(format!("in {origin}")),
        (k, _) => anyhow::anyhow!("{err}").context(format!("in --set {}", overrides[k - 1])),
    })
}

impl ModelSection {
    /// Resolves `model.device = "auto"` ([`auto_device`]) and then `model.dtype = "auto"` (bf16
    /// on a GPU, f32 on the CPU: [`rlvr_model::ComputeDtype::for_device`]).
    ///
    /// Returns what `auto` became, to print once at start (`None` when neither was `auto`).
    ///
    /// # Errors
    /// A launcher environment that contradicts itself (as [`rlvr_dist::env::from_process_env`]).
    pub fn resolve_auto(&mut self) -> anyhow::Result<Option<String>> {
        let mut said = Vec::new();
        if self.device == DeviceSpec::Auto {
            let (device, why) = auto_device()?;
            self.device = device;
            said.push(format!("model.device = \"auto\" is {why}"));
        }
        if self.dtype == ComputeDtype::Auto {
            self.dtype = self.dtype.for_device(self.device);
            said.push(match self.dtype {
                ComputeDtype::Bf16 => {
                    "model.dtype = \"auto\" is bf16 on the GPU (f32 master weights and AdamW \
                     moments)"
                        .to_string()
                }
                d => format!("model.dtype = \"auto\" is {d} on the CPU"),
            });
        }
        Ok((!said.is_empty()).then(|| said.join("; ")))
    }

    /// Resolves `auto` for a GPU whatever this machine has (`rlvr plan` estimates a GPU run):
    /// the device `cuda`, the dtype bf16.
    pub fn assume_gpu(&mut self) {
        if self.device == DeviceSpec::Auto {
            self.device = DeviceSpec::CudaLocal;
        }
        self.dtype = self.dtype.for_device(self.device);
    }

    /// Opens `model.device`.
    ///
    /// # Errors
    /// As [`rlvr_model::DeviceSpec::open`] (a `cuda:N` device on a binary without CUDA names the
    /// `--set model.device="cpu"` override), prefixed with the key.
    pub fn open_device(&self) -> anyhow::Result<candle_core::Device> {
        self.device
            .open()
            .with_context(|| format!("model.device = \"{}\"", self.device))
    }
}

/// What `model.device = "auto"` is in this process, and why: `cuda` (the local rank's GPU, as
/// `rlvr_dist::env::device_for` picks it) when the binary has CUDA and that GPU opens, else `cpu`
/// (also when `CUDA_VISIBLE_DEVICES` lists no GPU).
///
/// # Errors
/// A launcher environment that contradicts itself, or one that leaves the GPU of a rank unknown
/// (several ranks and no local rank, more ranks on a node than visible GPUs): falling back to
/// the CPU there would hide the mistake.
pub fn auto_device() -> anyhow::Result<(DeviceSpec, String)> {
    if !candle_core::utils::cuda_is_available() {
        return Ok((
            DeviceSpec::Cpu,
            "cpu (this rlvr was built without CUDA)".to_string(),
        ));
    }
    let launch = rlvr_dist::env::from_process_env()?;
    let visible = std::env::var("CUDA_VISIBLE_DEVICES").ok();
    let gpu = match rlvr_dist::env::device_for("cuda", &launch, visible.as_deref()) {
        Ok(g) => g,
        Err(e @ rlvr_dist::env::EnvError::NoVisibleGpu(_)) => {
            return Ok((DeviceSpec::Cpu, format!("cpu ({e})")))
        }
        Err(e) => return Err(anyhow::anyhow!("model.device = \"auto\": {e}")),
    };
    let ordinal = gpu
        .strip_prefix("cuda:")
        .and_then(|n| n.parse::<usize>().ok())
        .unwrap_or(0);
    Ok(match DeviceSpec::open_gpu(ordinal) {
        Some(_) => (
            DeviceSpec::CudaLocal,
            format!("cuda ({gpu}: a CUDA build and a visible GPU)"),
        ),
        None => (
            DeviceSpec::Cpu,
            format!("cpu (a CUDA build, but {gpu} does not open: no GPU visible)"),
        ),
    })
}

impl ResolvedConfig {
    /// The resolved config as TOML (what `RUN_DIR/config.toml` holds and `--print-config`
    /// prints): every key that is read, without the knobs of [`gates::GATES`] whose option is off
    /// (so the file loads again as a `--config`, where such a knob is an error).
    ///
    /// # Errors
    /// Serialisation errors (a bug).
    pub fn to_toml(&self) -> anyhow::Result<String> {
        let text = toml::to_string_pretty(&self.raw).context("serialising the resolved config")?;
        Ok(gates::drop_unread(self, &text))
    }

    /// The learning rate of trainer step `step` (1-based).
    pub fn lr_at(&self, step: u64) -> f64 {
        lr_at(&self.raw.train, step)
    }
}

/// The learning rate of trainer step `step` (1-based) under `t`'s schedule: linear warm-up
/// lr·step/warmup for step ≤ warmup, then constant, linear or cosine decay to `min_lr` at `t.steps`
/// ([`crate::update::LrSchedule::at`]).
pub fn lr_at(t: &TrainSection, step: u64) -> f64 {
    crate::update::LrSchedule::from(t).at(step)
}

/// The config reference of the sections this crate defines, as a Markdown table generated from the
/// `///` comments of their fields (the README embeds it; a test keeps it in sync).
pub fn reference_markdown() -> String {
    let src = include_str!("sections.rs");
    let mut out = String::from("| key | meaning |\n|---|---|\n");
    let mut table: Option<&str> = None;
    let mut doc: Vec<&str> = Vec::new();
    for line in src.lines() {
        let l = line.trim();
        if let Some(rest) = l.strip_prefix("pub struct ") {
            table = rest
                .split_once("Section")
                .map(|(name, _)| name)
                .filter(|n| !n.is_empty() && n.chars().all(char::is_alphanumeric));
            doc.clear();
        } else if let Some(d) = l.strip_prefix("///") {
            doc.push(d.trim());
        } else if let (Some(t), Some(rest)) = (table, l.strip_prefix("pub ")) {
            if let Some((field, _)) = rest.split_once(':') {
                if !doc.is_empty() && !field.contains('(') {
                    out.push_str(&format!(
                        "| `{}.{}` | {} |\n",
                        t.to_lowercase(),
                        field.trim(),
                        doc.join(" ").replace('|', "\\|")
                    ));
                }
            }
            doc.clear();
        } else if l == "}" {
            table = None;
            doc.clear();
        } else if !l.starts_with("#[") {
            doc.clear();
        }
    }
    out.push_str(
        "| `[data]` | rlvr-data's `DataConfig`: `data.task`, `data.train`, `data.test`, `data.experiences`, `data.prompts_per_step` (B, at most 2²⁰), `data.seed`, template, few-shot, verifier and generator keys (docs/data.md shows each data layout); an external verifier's `timeout_s` in (0, 1e6] seconds |\n\
         | `[algorithm]` | rlvr-algo's `AlgorithmConfig`: `algorithm.preset` and every knob (`rlvr algorithms` lists the presets); a loss-specific knob (`clip_low`, `clip_high`, `clip_low_prime`, `clip_high_prime`, `dual_clip`, `keep_mask`, `rec_weight`, `adv_temperature`, `is_cap`) set for a loss that does not read it is an error |\n\
         | `[reward]` | rlvr-reward's `RewardConfig`: reward = Σ weight · component + format term; weights and the format reward's `bonus` and `penalty` are checked at start-up, and a verifier reward that is not finite or exceeds 1e6 in magnitude is warned about on stderr once per run, naming the verifier |\n",
    );
    // Every `[data]` key, from rlvr-data's doc comments (the verifier's, from rlvr-reward's).
    out.push_str(&rlvr_data::config::reference_rows());
    // Every `[algorithm]` key, from rlvr-algo's doc comments (docs/corrections.md explains the
    // off-policy corrections among them).
    out.push_str(&rlvr_algo::reference_rows());
    // Every `[reward]` key, from rlvr-reward's doc comments.
    out.push_str(&rlvr_reward::reference::reward_rows());
    // Every `[kernels]` key, from rlvr-model's doc comments.
    out.push_str(&rlvr_model::kernels::reference_rows());
    out
}
