//! The run configuration (DESIGN.md section 10): one TOML file, precedence
//! **defaults < preset < file < `--set key=value`**, unknown keys rejected by name, and the resolved
//! config written to `RUN_DIR/config.toml`.
//!
//! - [`RawConfig`] is what the user wrote (file + overrides), deserialised with `deny_unknown_fields`
//!   everywhere, so a misspelt key fails at load with its dotted path.
//! - [`RawConfig::resolve`] is the one resolve step: it expands the algorithm preset
//!   ([`rlvr_algo::AlgorithmConfig::resolve`]), checks values the types cannot, and works out the
//!   staleness warning. Its result ([`ResolvedConfig`]) is what the loop reads and what
//!   `config.toml` holds (the algorithm table fully set, so a resume re-resolves to the same values).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use rlvr_algo::{Algorithm, AlgorithmConfig};
use rlvr_data::config::DataConfig;
use rlvr_reward::combine::RewardConfig;
use serde::{Deserialize, Serialize};

/// `[model]`: the policy checkpoint and where it computes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ModelSection {
    /// Policy checkpoint directory (HF layout: config.json, *.safetensors, tokenizer.json). Required.
    pub path: PathBuf,
    /// Compute dtype of the weights: `f32` or `bf16`. Default `f32`.
    pub dtype: String,
    /// Device: `cpu` or `cuda:N`. Default `cpu`.
    pub device: String,
    /// Frozen reference policy for the KL term; default: `model.path` (the initial policy). Loaded only
    /// when `algorithm.kl_coef` ≠ 0.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reference: Option<PathBuf>,
}

impl Default for ModelSection {
    fn default() -> Self {
        ModelSection {
            path: PathBuf::new(),
            dtype: "f32".into(),
            device: "cpu".into(),
            reference: None,
        }
    }
}

/// `[rollout]`: sampling (DESIGN.md section 3).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RolloutSection {
    /// K: completions per prompt. Default 8.
    pub group_size: usize,
    /// Most generated tokens per completion (the EOS included); also the constant normaliser's L.
    /// Default 256.
    pub max_new_tokens: usize,
    /// Fewest new tokens before EOS or a stop string may end a completion (transformers'
    /// `min_new_tokens`, vLLM's `min_tokens`); the EOS probability is removed from the draw until
    /// then, while ℓ_old stays the full-distribution log-prob. Equal to `max_new_tokens` it gives
    /// fixed-length completions (benchmarks). Default 0.
    pub min_new_tokens: usize,
    /// Sampling temperature T (> 0); the trainer scores with the same T. Default 1.
    pub temperature: f64,
    /// Nucleus mass in (0, 1]; 1 = off. Default 1. Below 1 even staleness-0 data is slightly
    /// off-policy (ℓ_old is the untruncated log-prob).
    pub top_p: f64,
    /// Top-k; 0 = off. Default 0.
    pub top_k: usize,
    /// Extra stop strings (the tokenizer's EOS ids always stop). Default none.
    pub stop: Vec<String>,
    /// Most rows decoded together (KV-cache memory bound). Default 64.
    pub max_batch_rows: usize,
}

impl Default for RolloutSection {
    fn default() -> Self {
        RolloutSection {
            group_size: 8,
            max_new_tokens: 256,
            min_new_tokens: 0,
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            stop: Vec::new(),
            max_batch_rows: 64,
        }
    }
}

/// `[sync]`: staleness regime (DESIGN.md section 3).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SyncSection {
    /// v: the explorer loads the trainer's weights when the completed step count is a multiple of v.
    /// v = 1 is on-policy (with o = 0). Default 1.
    pub interval: u64,
    /// o: the explorer runs o steps ahead on its own thread (staleness o..o+v−1). Default 0.
    pub offset: u64,
    /// Drop experiences older than this many steps (staleness > max). Unset: keep all. Experiences
    /// without a version (offline files) are never dropped.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_staleness: Option<u64>,
}

impl Default for SyncSection {
    fn default() -> Self {
        SyncSection {
            interval: 1,
            offset: 0,
            max_staleness: None,
        }
    }
}

/// Learning-rate schedule over trainer steps (all start with `train.warmup_steps` of linear warm-up
/// from 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Schedule {
    /// lr after the warm-up.
    Constant,
    /// Linear decay from lr to `train.min_lr` at the last step.
    Linear,
    /// Cosine decay from lr to `train.min_lr` at the last step.
    Cosine,
}

/// `[train]`: the trainer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TrainSection {
    /// Trainer steps (each: B prompts × K completions, possibly several optimizer updates). Default 100.
    pub steps: u64,
    /// Peak learning rate. Default 1e-6.
    pub lr: f64,
    /// Lowest learning rate of the `linear` and `cosine` schedules. Default 0.
    pub min_lr: f64,
    /// Steps of linear warm-up from 0 to `lr`. Default 0.
    pub warmup_steps: u64,
    /// `constant`, `linear` or `cosine`. Default `constant`.
    pub schedule: Schedule,
    /// AdamW decoupled weight decay λ. Default 0.01.
    pub weight_decay: f64,
    /// AdamW β₁. Default 0.9.
    pub beta1: f64,
    /// AdamW β₂. Default 0.999.
    pub beta2: f64,
    /// AdamW ε. Default 1e-8.
    pub adam_eps: f64,
    /// Clip the global gradient L2 norm to this value; 0 = off. Default 1.
    pub grad_clip: f64,
    /// Rows (completions) per micro-batch. Default 8.
    pub micro_batch_size: usize,
    /// Token budget per micro-batch (rows × padded length); when set it replaces
    /// `micro_batch_size` (a single longer row still gets its own micro-batch). Default unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub micro_batch_tokens: Option<usize>,
    /// Leave out of forward and backward the rows whose gradient is exactly zero: rows outside the
    /// normaliser (zero-variance groups under `exclude_zero_std`, masked truncations) and, when the
    /// loss has no KL, entropy or regulariser term, rows with advantage 0. The update is unchanged;
    /// the step's ratio, clip, entropy and KL diagnostics then cover the trained rows only. TRL and
    /// verl compute these rows; set false to match their work (benchmarks). Default true.
    pub skip_zero_gradient_rows: bool,
    /// Optimizer updates per epoch: the step's groups are split into this many mini-batches. Default 1.
    pub mini_batches: usize,
    /// μ: passes over the step's batch. Default 1.
    pub epochs: usize,
    /// Seed of sampling and of the trainer's random choices (RED-Drop). Default 0.
    pub seed: u64,
    /// Held-out evaluation every this many steps (and at step 0); 0 = never. Default 0.
    pub eval_every: u64,
    /// Checkpoint every this many steps (and at the end); 0 = only at the end. Default 0.
    pub save_every: u64,
    /// Keep this many newest checkpoints (the best one is kept too); 0 = keep all. Default 2.
    pub keep_last: usize,
    /// Recompute behaviour log-probs with the trainer's forward at the behaviour version (train/sampler
    /// mismatch correction, DESIGN.md section 3). Default false.
    pub recompute_behaviour: bool,
    /// DAPO dynamic sampling: most extra sampling rounds per step to refill dropped groups. Default 4.
    pub dynamic_sampling_max_rounds: usize,
    /// Abort after this many skipped (non-finite) steps in a row. Default 3.
    pub max_skipped_in_row: u32,
    /// Completions per step written to rollouts.jsonl (0 = none). Default 4.
    pub log_rollouts: usize,
}

impl Default for TrainSection {
    fn default() -> Self {
        TrainSection {
            steps: 100,
            lr: 1e-6,
            min_lr: 0.0,
            warmup_steps: 0,
            schedule: Schedule::Constant,
            weight_decay: 0.01,
            beta1: 0.9,
            beta2: 0.999,
            adam_eps: 1e-8,
            grad_clip: 1.0,
            micro_batch_size: 8,
            micro_batch_tokens: None,
            skip_zero_gradient_rows: true,
            mini_batches: 1,
            epochs: 1,
            seed: 0,
            eval_every: 0,
            save_every: 0,
            keep_last: 2,
            recompute_behaviour: false,
            dynamic_sampling_max_rounds: 4,
            max_skipped_in_row: 3,
            log_rollouts: 4,
        }
    }
}

/// `[eval]`: held-out evaluation during training and in `rlvr eval`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EvalSection {
    /// Samples per problem; 1 = greedy, > 1 = temperature 1 (mean@k, pass@k). Default 1.
    pub samples: usize,
    /// First N problems of the test split; unset = all. Default unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit: Option<usize>,
    /// Most new tokens; default `rollout.max_new_tokens`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_new_tokens: Option<usize>,
}

impl Default for EvalSection {
    fn default() -> Self {
        EvalSection {
            samples: 1,
            limit: None,
            max_new_tokens: None,
        }
    }
}

/// `[output]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OutputSection {
    /// RUN_DIR. Default `runs/run`.
    pub dir: PathBuf,
}

impl Default for OutputSection {
    fn default() -> Self {
        OutputSection {
            dir: PathBuf::from("runs/run"),
        }
    }
}

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
}

/// The resolved configuration: what the loop reads. `raw.algorithm` is the fully-set table of
/// `algorithm` (so it round-trips).
#[derive(Debug, Clone)]
pub struct ResolvedConfig {
    /// Every section, with `algorithm` fully set.
    pub raw: RawConfig,
    /// The resolved algorithm.
    pub algorithm: Algorithm,
    /// Start-up warnings (e.g. `max_staleness` below o+v−1); printed and kept.
    pub warnings: Vec<String>,
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
    let value = toml::Value::Table(table);
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if path.is_empty() || path == "." {
            anyhow::anyhow!("config: {inner}")
        } else {
            anyhow::anyhow!("config key `{path}`: {inner}")
        }
    })
}

impl RawConfig {
    /// Loads `file` (if any) and applies `overrides` (`key=value`, in order): file < `--set`.
    ///
    /// # Errors
    /// Unreadable or malformed TOML (naming the file), malformed overrides, unknown keys (named by
    /// their dotted path) and ill-typed values.
    pub fn load(file: Option<&Path>, overrides: &[String]) -> anyhow::Result<RawConfig> {
        let mut table = match file {
            Some(p) => {
                let text = std::fs::read_to_string(p)
                    .with_context(|| format!("reading config {}", p.display()))?;
                text.parse::<toml::Table>()
                    .with_context(|| format!("parsing config {}", p.display()))?
            }
            None => toml::Table::new(),
        };
        for o in overrides {
            apply_override(&mut table, o)?;
        }
        let what = file
            .map(|p| p.display().to_string())
            .unwrap_or_else(|| "--set overrides".into());
        from_table(table).with_context(|| format!("in {what}"))
    }

    /// The one resolve step: preset expansion, value checks, staleness warning.
    ///
    /// # Errors
    /// Invalid values, each naming its key.
    pub fn resolve(mut self) -> anyhow::Result<ResolvedConfig> {
        let algorithm = self.algorithm.resolve().context("resolving [algorithm]")?;
        self.algorithm = algorithm.to_config();
        let mut warnings = Vec::new();
        let (r, t, s) = (&self.rollout, &self.train, &self.sync);
        if rlvr_model::parse_dtype(&self.model.dtype).is_none() {
            bail!("model.dtype = {:?}: expected f32 or bf16", self.model.dtype);
        }
        if r.group_size == 0 {
            bail!("rollout.group_size must be at least 1");
        }
        if r.max_new_tokens == 0 {
            bail!("rollout.max_new_tokens must be at least 1");
        }
        if r.min_new_tokens > r.max_new_tokens {
            bail!(
                "rollout.min_new_tokens ({}) exceeds rollout.max_new_tokens ({})",
                r.min_new_tokens,
                r.max_new_tokens
            );
        }
        if !(r.temperature.is_finite() && r.temperature > 0.0) {
            bail!(
                "rollout.temperature = {} must be > 0 (the trainer divides logits by it)",
                r.temperature
            );
        }
        if !(r.top_p > 0.0 && r.top_p <= 1.0) {
            bail!("rollout.top_p = {} must be in (0, 1]", r.top_p);
        }
        if s.interval == 0 {
            bail!("sync.interval must be at least 1 (1 = on-policy)");
        }
        if t.micro_batch_size == 0 || t.mini_batches == 0 || t.epochs == 0 {
            bail!("train.micro_batch_size, train.mini_batches and train.epochs must be at least 1");
        }
        if t.micro_batch_tokens == Some(0) {
            bail!("train.micro_batch_tokens must be at least 1 (or unset)");
        }
        if !(t.lr.is_finite() && t.lr >= 0.0 && t.min_lr.is_finite() && t.min_lr >= 0.0) {
            bail!("train.lr and train.min_lr must be finite and >= 0");
        }
        if !(t.grad_clip.is_finite() && t.grad_clip >= 0.0) {
            bail!("train.grad_clip must be finite and >= 0 (0 = off)");
        }
        if t.max_skipped_in_row == 0 {
            bail!("train.max_skipped_in_row must be at least 1");
        }
        if self.eval.samples == 0 {
            bail!("eval.samples must be at least 1");
        }
        if let Some(m) = s.max_staleness {
            let worst = s.offset + s.interval - 1;
            if m < worst {
                warnings.push(format!(
                    "sync.max_staleness = {m} is below offset + interval - 1 = {worst}: part of every \
                     sync cycle's data will be discarded"
                ));
            }
        }
        if self.data.experiences.is_some() && t.eval_every > 0 {
            warnings.push(
                "train.eval_every is set but data.experiences (offline mode) has no task to evaluate: \
                 no held-out evaluation will run; use `rlvr eval` on the checkpoints"
                    .into(),
            );
        }
        if self.data.experiences.is_none() {
            self.data
                .validate()
                .map_err(|e| anyhow::anyhow!("[data]: {e}"))?;
        } else if self.data.prompts_per_step == 0 {
            bail!("data.prompts_per_step must be at least 1");
        }
        Ok(ResolvedConfig {
            raw: self,
            algorithm,
            warnings,
        })
    }
}

impl ResolvedConfig {
    /// The resolved config as TOML (what `RUN_DIR/config.toml` holds).
    ///
    /// # Errors
    /// Serialisation errors (a bug).
    pub fn to_toml(&self) -> anyhow::Result<String> {
        toml::to_string_pretty(&self.raw).context("serialising the resolved config")
    }

    /// Reads `RUN_DIR/config.toml` back (for `--resume`), with `overrides` applied on top.
    ///
    /// # Errors
    /// As [`RawConfig::load`] and [`RawConfig::resolve`].
    pub fn from_run_dir(run_dir: &Path, overrides: &[String]) -> anyhow::Result<ResolvedConfig> {
        let path = run_dir.join("config.toml");
        if !path.exists() {
            bail!(
                "{} does not exist: --resume needs a run directory written by `rlvr train`",
                path.display()
            );
        }
        RawConfig::load(Some(&path), overrides)?.resolve()
    }

    /// The learning rate of trainer step `step` (1-based).
    pub fn lr_at(&self, step: u64) -> f64 {
        lr_at(&self.raw.train, step)
    }
}

/// The learning rate of trainer step `step` (1-based) under `t`'s schedule: linear warm-up
/// lr·step/warmup for step ≤ warmup, then constant, linear or cosine decay to `min_lr` at `t.steps`.
pub fn lr_at(t: &TrainSection, step: u64) -> f64 {
    if t.warmup_steps > 0 && step <= t.warmup_steps {
        return t.lr * step as f64 / t.warmup_steps as f64;
    }
    let span = t.steps.saturating_sub(t.warmup_steps).max(1) as f64;
    let progress = (step.saturating_sub(t.warmup_steps) as f64 / span).clamp(0.0, 1.0);
    match t.schedule {
        Schedule::Constant => t.lr,
        Schedule::Linear => t.min_lr + (t.lr - t.min_lr) * (1.0 - progress),
        Schedule::Cosine => {
            t.min_lr + (t.lr - t.min_lr) * 0.5 * (1.0 + (std::f64::consts::PI * progress).cos())
        }
    }
}

/// The config reference of the sections this crate defines, as a Markdown table generated from the
/// `///` comments of their fields (the README embeds it; a test keeps it in sync).
pub fn reference_markdown() -> String {
    let src = include_str!("config.rs");
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
        "| `[data]` | rlvr-data's `DataConfig`: `data.task`, `data.train`, `data.test`, `data.experiences`, `data.prompts_per_step` (B), `data.seed`, template and generator keys |\n\
         | `[algorithm]` | rlvr-algo's `AlgorithmConfig`: `algorithm.preset` and every knob (`rlvr algorithms` lists the presets) |\n\
         | `[reward]` | rlvr-reward's `RewardConfig`: weighted components and an optional format reward |\n",
    );
    out
}
