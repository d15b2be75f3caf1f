//! The checks of a configuration: [`RawConfig::resolve`] (values the types cannot check), what
//! starting a run needs ([`ResolvedConfig::check_runnable`]) and what a resume needs
//! ([`ResolvedConfig::from_run_dir`]). Every error names the key and the fix.

use std::path::Path;

use anyhow::{bail, Context};
use rlvr_algo::config::LOSS_OPTIONS;
use rlvr_algo::AlgorithmConfig;
use rlvr_model::DeviceSpec;

use super::{apply_override, from_table, load_layers, FileLayer, RawConfig, ResolvedConfig};
use crate::store::checkpoint::TrainerState;

/// The most completions per prompt, `rollout.group_size` (GRPO uses 8 to 64; DAPO 16): the
/// sampler's own bound.
pub const MAX_GROUP_SIZE: usize = rlvr_rollout::params::MAX_GROUP_SIZE;

/// The most rows (completions) one step may sample: `data.prompts_per_step` ×
/// `rollout.group_size` (and `data.prompts_per_step` alone, offline); also the most pairs of an
/// `rlvr sft` batch. 2²⁰ rows of even one token each hold more than any step can train.
pub const MAX_ROWS_PER_STEP: usize = 1 << 20;

/// The most samples per problem of an evaluation (`eval.samples`, `rlvr eval --n`): the
/// sampler's bound on a group.
pub const MAX_EVAL_SAMPLES: usize = rlvr_rollout::params::MAX_GROUP_SIZE;

/// The largest `model.lora_rank` accepted before the model is loaded; once it is, the rank must
/// also not exceed the model's hidden size.
pub const MAX_LORA_RANK: usize = 65536;

/// The most new tokens of one completion (`rollout.max_new_tokens`, `eval.max_new_tokens`)
/// accepted before the model is loaded (2^24, beyond every model's context); once it is, prompt +
/// new tokens must also fit the model's `max_position_embeddings`.
pub const MAX_NEW_TOKENS: usize = rlvr_rollout::params::MAX_NEW_TOKENS;

/// The most passes over one step's batch (`train.epochs`): PPO-style runs use 1 to 4.
pub const MAX_EPOCHS: usize = 1024;

/// The highest sampling temperature (`rollout.temperature`): at 1000 every logit of a real model
/// is within a few hundredths of the others, so sampling is already uniform.
pub const MAX_TEMPERATURE: f64 = rlvr_rollout::params::MAX_TEMPERATURE;

/// Refuses `value` of `key` above `max`, naming both.
fn at_most(key: &str, value: usize, max: usize) -> anyhow::Result<()> {
    if value > max {
        bail!("{key} = {value} is out of range: at most {max}");
    }
    Ok(())
}

/// The most assistant turns of one episode (`env.max_turns`).
pub const MAX_TURNS: u32 = 1024;

/// Largest `env.kv_cache_mib`: 1 TiB (the budget in bytes fits a 64-bit `usize`).
pub const MAX_KV_CACHE_MIB: u64 = 1 << 20;

impl RawConfig {
    /// Checks the `[env]` keys (docs/DESIGN.md section 14): each value's range, and that no key is
    /// set when neither `env.command` nor `env.builtin` makes the run multi-turn.
    ///
    /// # Errors
    /// An invalid value or combination, naming its key.
    fn check_env(&self) -> anyhow::Result<()> {
        let e = &self.env;
        if !e.is_on() {
            let mut off = e.clone();
            off.dir = None;
            if !off.is_default() {
                let table = |e: &super::EnvSection| match toml::Value::try_from(e) {
                    Ok(toml::Value::Table(t)) => t,
                    _ => toml::Table::new(),
                };
                let (set, default) = (table(&off), table(&super::EnvSection::default()));
                let keys: Vec<String> = set
                    .iter()
                    .filter(|(k, v)| default.get(*k) != Some(*v))
                    .map(|(k, _)| format!("env.{k}"))
                    .collect();
                bail!(
                    "{} set but neither env.command nor env.builtin (nor env.verifiers): set one \
                     of them to run multi-turn episodes (docs/environments.md), or remove the \
                     [env] keys",
                    keys.join(", ")
                );
            }
            return Ok(());
        }
        if !e.command.is_empty() && e.builtin.is_some() {
            bail!("env.command and env.builtin are both set: an episode has one environment");
        }
        if let Some(id) = &e.verifiers {
            if let Some(other) = [
                (!e.command.is_empty()).then_some("env.command"),
                e.builtin.is_some().then_some("env.builtin"),
            ]
            .into_iter()
            .flatten()
            .next()
            {
                bail!(
                    "env.verifiers and {other} are both set: an episode has one environment \
                     (env.verifiers runs the verifiers environment with rlvr's adapter)"
                );
            }
            if id.trim().is_empty() {
                bail!(
                    "env.verifiers is empty: give the environment's id (prime-rl's \
                     [[orchestrator.env]] id, e.g. \"reverse-text\")"
                );
            }
            for key in ["env_id", "env_args"] {
                if e.options.contains_key(key) {
                    bail!(
                        "env.options.{key} is set by rlvr for env.verifiers: write the id as \
                         env.verifiers and load_environment's arguments as env.env_args"
                    );
                }
            }
            if e.python.as_deref().is_some_and(str::is_empty) {
                bail!("env.python is empty: name the Python interpreter (python3)");
            }
        } else {
            for (key, set) in [
                ("env.env_args", !e.env_args.is_empty()),
                ("env.python", e.python.is_some()),
            ] {
                if set {
                    bail!(
                        "{key} is read with env.verifiers only (the verifiers environment's \
                         load_environment arguments and interpreter); a program of env.command \
                         gets env.options in hello: remove it, or set env.verifiers"
                    );
                }
            }
        }
        if e.command.first().is_some_and(String::is_empty) {
            bail!("env.command: the program (its first word) is empty");
        }
        if let Some(b) = &e.builtin {
            if b != "retry" {
                bail!("env.builtin = {b:?}: the built-in environments are \"retry\"");
            }
        }
        if !(1..=MAX_TURNS).contains(&e.max_turns) {
            bail!(
                "env.max_turns = {} is out of range: 1 to {MAX_TURNS}",
                e.max_turns
            );
        }
        let n = self.rollout.max_new_tokens;
        let budget = e.episode_tokens(n);
        if budget < n {
            bail!(
                "env.max_episode_tokens = {budget} is below rollout.max_new_tokens = {n}: an \
                 episode's first turn is sampled as a single-turn completion; raise it to at \
                 least {n}"
            );
        }
        at_most("env.max_episode_tokens", budget, MAX_NEW_TOKENS)?;
        if e.max_observation_tokens == 0 {
            bail!("env.max_observation_tokens must be at least 1");
        }
        at_most(
            "env.max_observation_tokens",
            e.max_observation_tokens,
            MAX_NEW_TOKENS,
        )?;
        if e.kv_cache_mib > MAX_KV_CACHE_MIB {
            bail!(
                "env.kv_cache_mib = {} is out of range: 0 to {MAX_KV_CACHE_MIB} (1 TiB)",
                e.kv_cache_mib
            );
        }
        if self.rollout.backend == super::RolloutBackend::Vllm
            && e.kv_cache_mib != super::EnvSection::default().kv_cache_mib
        {
            bail!(
                "env.kv_cache_mib is read by the native engine only; with rollout.backend = \
                 \"vllm\" the servers keep their own cache: remove it"
            );
        }
        rlvr_env::tools::ToolFormat::parse(&e.tool_format).map_err(anyhow::Error::msg)?;
        rlvr_env::reward::RewardMode::parse(&e.reward).map_err(anyhow::Error::msg)?;
        if let Some(t) = &e.tools {
            crate::feed::episodes::parse_tools(t).map_err(|m| anyhow::anyhow!("env.tools: {m}"))?;
        }
        if !(e.timeout_s > 0.0 && e.timeout_s <= 86400.0) {
            bail!(
                "env.timeout_s = {} is out of range: (0, 86400] seconds",
                e.timeout_s
            );
        }
        if e.restarts > rlvr_env::client::MOST_RESTARTS {
            bail!(
                "env.restarts = {} is out of range: at most {} (a larger number would hold a \
                 broken environment forever)",
                e.restarts,
                rlvr_env::client::MOST_RESTARTS
            );
        }
        if !(0.0..=1.0).contains(&e.max_error_frac) {
            bail!(
                "env.max_error_frac = {} is out of range: [0, 1]",
                e.max_error_frac
            );
        }
        if !(e.turn_discount > 0.0 && e.turn_discount <= 1.0) {
            bail!(
                "env.turn_discount = {} is out of range: (0, 1]",
                e.turn_discount
            );
        }
        if e.is_program() && e.turn_discount != 1.0 {
            bail!(
                "env.turn_discount is read by the built-in retry environment only \
                 (env.builtin = \"retry\"); a program environment (env.command, env.verifiers) \
                 gives its own rewards: remove it"
            );
        }
        if self.data.experiences.is_some() {
            bail!(
                "[env] with data.experiences: an offline run trains on stored rows and runs no \
                 episodes; remove one of them"
            );
        }
        Ok(())
    }

    /// Checks the `model.lora_*` keys and records the default α (2 × rank) in the config.
    ///
    /// # Errors
    /// An invalid value, naming its key.
    fn check_lora(&mut self) -> anyhow::Result<()> {
        let m = &mut self.model;
        at_most("model.lora_rank", m.lora_rank, MAX_LORA_RANK)?;
        if m.lora_rank == 0 {
            // A LoRA knob written while LoRA is off is the gate check's (gates.rs).
            return Ok(());
        }
        let alpha = m.lora_alpha.unwrap_or(2.0 * m.lora_rank as f64);
        if !(alpha.is_finite() && alpha > 0.0) {
            bail!("model.lora_alpha = {alpha} must be positive");
        }
        m.lora_alpha = Some(alpha);
        if m.lora_targets.is_empty() {
            bail!(
                "model.lora_targets is empty; use [\"all-linear\"] or list some of q, k, v, o, \
                 gate, up, down (phi3: qkv, o, gate_up, down)"
            );
        }
        if m.lora_targets.len() > 1 && m.lora_targets.contains(&rlvr_model::LoraTarget::AllLinear) {
            bail!("model.lora_targets: all-linear stands alone (it is every projection)");
        }
        for (i, t) in m.lora_targets.iter().enumerate() {
            if m.lora_targets[..i].contains(t) {
                bail!("model.lora_targets lists `{}` twice", String::from(*t));
            }
        }
        if !(0.0..1.0).contains(&m.lora_dropout) {
            bail!("model.lora_dropout = {} must be in [0, 1)", m.lora_dropout);
        }
        Ok(())
    }

    /// `model.dtype` must be one that trains (not f16).
    ///
    /// # Errors
    /// `model.dtype = "f16"`, naming the dtypes that train.
    fn check_dtype(&self) -> anyhow::Result<()> {
        if !self.model.dtype.trainable() {
            bail!(
                "model.dtype = \"{}\" cannot train: without loss scaling f16 gradients underflow to 0 \
                 (and sums overflow its 65504 range); use \"bf16\" (same memory, f32's range) or \
                 \"f32\". f16 is for inference: `rlvr eval --dtype f16`, `rlvr logprobs --dtype f16`",
                self.model.dtype
            );
        }
        Ok(())
    }

    /// `rollout.group_size` and the rows per step (`data.prompts_per_step` × group size) are in
    /// range, and a group of one only with `rollout.allow_group_size_one` (online).
    ///
    /// # Errors
    /// An out-of-range value or a group of one, naming its key.
    fn check_group(&self) -> anyhow::Result<()> {
        let r = &self.rollout;
        if r.group_size == 0 {
            bail!("rollout.group_size must be at least 1");
        }
        at_most("rollout.group_size", r.group_size, MAX_GROUP_SIZE)?;
        at_most(
            "data.prompts_per_step",
            self.data.prompts_per_step,
            MAX_ROWS_PER_STEP,
        )?;
        if self.data.experiences.is_none() {
            match self.data.prompts_per_step.checked_mul(r.group_size) {
                Some(rows) if rows <= MAX_ROWS_PER_STEP => {}
                rows => bail!(
                    "data.prompts_per_step × rollout.group_size = {} × {} = {} rows per step is out \
                     of range: at most {MAX_ROWS_PER_STEP}",
                    self.data.prompts_per_step,
                    r.group_size,
                    rows.map_or("more than 2^64".to_string(), |n| n.to_string())
                ),
            }
        }
        if r.group_size == 1 && self.data.experiences.is_none() && !r.allow_group_size_one {
            bail!(
                "rollout.group_size = 1: every baseline (algorithm.baseline = mean, leave-one-out, \
                 log-mean-exp) is taken within the group, so a one-completion group's advantage is 0 \
                 and the policy never learns from its rewards; set rollout.group_size to 2 or more \
                 (GRPO uses 8 to 64), or rollout.allow_group_size_one = true to run it anyway"
            );
        }
        Ok(())
    }

    /// The completion lengths: `rollout.max_new_tokens`, `eval.max_new_tokens` and
    /// `rollout.min_new_tokens`.
    ///
    /// # Errors
    /// An out-of-range length, naming its key.
    fn check_lengths(&self) -> anyhow::Result<()> {
        let r = &self.rollout;
        if r.max_new_tokens == 0 {
            bail!("rollout.max_new_tokens must be at least 1");
        }
        at_most("rollout.max_new_tokens", r.max_new_tokens, MAX_NEW_TOKENS)?;
        if let Some(n) = self.eval.max_new_tokens {
            if n == 0 {
                bail!(
                    "eval.max_new_tokens must be at least 1 (or unset for rollout.max_new_tokens)"
                );
            }
            at_most("eval.max_new_tokens", n, MAX_NEW_TOKENS)?;
        }
        if r.min_new_tokens > r.max_new_tokens {
            bail!(
                "rollout.min_new_tokens ({}) exceeds rollout.max_new_tokens ({})",
                r.min_new_tokens,
                r.max_new_tokens
            );
        }
        Ok(())
    }

    /// The sampling keys: `rollout.temperature`, `rollout.top_p` and the vLLM backend's keys.
    ///
    /// # Errors
    /// An out-of-range value, naming its key.
    fn check_sampling(&self) -> anyhow::Result<()> {
        let r = &self.rollout;
        if !(r.temperature.is_finite() && r.temperature > 0.0) {
            bail!(
                "rollout.temperature = {} must be > 0 (the trainer divides logits by it)",
                r.temperature
            );
        }
        if r.temperature > MAX_TEMPERATURE {
            bail!(
                "rollout.temperature = {:e} is out of range: at most {MAX_TEMPERATURE} (sampling is \
                 already uniform there)",
                r.temperature
            );
        }
        if !(r.top_p > 0.0 && r.top_p <= 1.0) {
            bail!("rollout.top_p = {} must be in (0, 1]", r.top_p);
        }
        if r.backend == super::RolloutBackend::Vllm {
            check_vllm_keys(r)?;
        }
        Ok(())
    }

    /// `sync.interval` and `sync.offset` (at most `train.steps`).
    ///
    /// # Errors
    /// An out-of-range value, naming its key.
    fn check_sync(&self) -> anyhow::Result<()> {
        let (t, s) = (&self.train, &self.sync);
        if s.interval == 0 {
            bail!("sync.interval must be at least 1 (1 = on-policy)");
        }
        if s.offset > t.steps {
            bail!(
                "sync.offset = {} is out of range: at most train.steps = {} (the explorer runs o \
                 steps ahead; with o ≥ train.steps every batch is already sampled by the initial \
                 weights)",
                s.offset,
                t.steps
            );
        }
        Ok(())
    }

    /// `distributed.zero` and `distributed.timeout_s`.
    ///
    /// # Errors
    /// An out-of-range value, naming its key.
    fn check_distributed(&self) -> anyhow::Result<()> {
        // distributed.zero and distributed.timeout_s (the environment variable is read at launch).
        if self.distributed.zero > 2 {
            bail!(
                "distributed.zero = {}: expected 0 (no sharding), 1 (optimizer state sharded) or \
                 2 (gradients sharded too)",
                self.distributed.zero
            );
        }
        if self.distributed.timeout_s.is_some() {
            self.distributed.timeout()?;
        }
        Ok(())
    }

    /// The `train.*` keys: batch splitting, steps, epochs, the optimizer's values and
    /// `train.max_skipped_in_row`.
    ///
    /// # Errors
    /// An out-of-range value, naming its key.
    fn check_train(&self) -> anyhow::Result<()> {
        let t = &self.train;
        if t.micro_batch_size == 0 || t.mini_batches == 0 || t.epochs == 0 {
            bail!("train.micro_batch_size, train.mini_batches and train.epochs must be at least 1");
        }
        if t.steps == 0 {
            bail!("train.steps must be at least 1 (the number of optimizer steps of the run)");
        }
        at_most("train.epochs", t.epochs, MAX_EPOCHS)?;
        // More mini-batches than rows would leave some empty.
        at_most("train.mini_batches", t.mini_batches, MAX_ROWS_PER_STEP)?;
        if t.micro_batch_tokens == Some(0) {
            bail!("train.micro_batch_tokens must be at least 1 (or unset)");
        }
        crate::update::optimizer::check_optimizer(&crate::update::optimizer::OptimizerValues {
            lr: ("train.lr", t.lr),
            beta1: Some(("train.beta1", t.beta1)),
            beta2: Some(("train.beta2", t.beta2)),
            eps: Some(("train.adam_eps", t.adam_eps)),
            weight_decay: ("train.weight_decay", t.weight_decay),
            grad_clip: ("train.grad_clip", t.grad_clip),
        })?;
        if !(t.min_lr.is_finite() && t.min_lr >= 0.0 && t.min_lr <= t.lr) {
            bail!(
                "train.min_lr = {} is out of range: expected a finite number in [0, train.lr = {}]",
                t.min_lr,
                t.lr
            );
        }
        if t.max_skipped_in_row == 0 {
            bail!("train.max_skipped_in_row must be at least 1");
        }
        Ok(())
    }

    /// `eval.samples` and `eval.limit`.
    ///
    /// # Errors
    /// An out-of-range value, naming its key.
    fn check_eval(&self) -> anyhow::Result<()> {
        if self.eval.samples == 0 {
            bail!("eval.samples must be at least 1");
        }
        at_most("eval.samples", self.eval.samples, MAX_EVAL_SAMPLES)?;
        if self.eval.limit == Some(0) {
            bail!(
                "eval.limit = 0 would evaluate no problem (an accuracy of 0/0); give a number of \
                 problems ≥ 1, or leave eval.limit unset for the whole test split"
            );
        }
        Ok(())
    }

    /// The warnings a valid `[env]` may still deserve: a name of `env.env` that is not set in
    /// rlvr's own environment (the program would run without it, e.g. an API key it needs).
    fn env_warnings(&self) -> Vec<String> {
        if !self.env.is_program() {
            return Vec::new();
        }
        self.env
            .env
            .iter()
            .filter(|name| std::env::var_os(name).is_none())
            .map(|name| {
                format!(
                    "warning: env.env names {name}, which is not set here: the environment \
                     program runs without it (export {name} before rlvr starts, or remove it)"
                )
            })
            .collect()
    }

    /// The warnings a valid config may still deserve: `sync.max_staleness` discarding part of
    /// every sync cycle's data, `train.eval_every` in an offline run.
    fn staleness_warnings(&self) -> Vec<String> {
        let (t, s) = (&self.train, &self.sync);
        let mut warnings = Vec::new();
        if let Some(m) = s.max_staleness {
            let worst = s.offset.saturating_add(s.interval - 1);
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
        warnings
    }

    /// The `[data]` section: the task's own checks online ([`super::DataSection::validate`]),
    /// `data.prompts_per_step` offline.
    ///
    /// # Errors
    /// An invalid value, naming its key.
    fn check_data(&self) -> anyhow::Result<()> {
        use rlvr_data::config::TaskKind;
        if self.data.experiences.is_none() {
            // Only `retry` itself (another name is check_env's error, naming the typo).
            if self.env.builtin.as_deref() == Some("retry")
                && self.data.task == TaskKind::Jsonl
                && self.data.verifier.is_none()
            {
                bail!(
                    "env.builtin = \"retry\" scores each turn with the task's verifier, and this \
                     data.task = \"jsonl\" names none: set data.verifier (e.g. {{ kind = \"math\" \
                     }}), or use a program environment (env.command) that gives the rewards"
                );
            }
            self.data
                .validate_for(super::settings::scoring(self))
                .map_err(|e| anyhow::anyhow!("[data]: {e}"))?;
            if super::settings::env_gives_reward(self) {
                self.check_env_scored()?;
            }
        } else if self.data.prompts_per_step == 0 {
            bail!("data.prompts_per_step must be at least 1");
        }
        Ok(())
    }

    /// A run whose program environment gives every reward (`env.command` with a `jsonl` task
    /// and no `data.verifier`): nothing can score one turn, so the keys that would are refused.
    ///
    /// # Errors
    /// `train.eval_every` above 0 (the held-out evaluation scores one turn with the verifier),
    /// `reward.components` or `reward.format` (nothing reads `[reward]`), naming the fix.
    fn check_env_scored(&self) -> anyhow::Result<()> {
        let why = "this data.task = \"jsonl\" run has no data.verifier: its rewards come from \
                   the environment (env.command)";
        if self.train.eval_every > 0 {
            bail!(
                "train.eval_every = {}: the held-out evaluation during training scores one turn \
                 with the task's verifier, and {why}; set train.eval_every = 0 and evaluate \
                 episodes with `rlvr eval --env` on the checkpoints, or set data.verifier",
                self.train.eval_every
            );
        }
        if !self.reward.components.is_empty() {
            bail!(
                "reward.components: {why}, which nothing in [reward] adds to (env.reward says \
                 how an episode's rewards are combined); remove them, or set data.verifier"
            );
        }
        if self.reward.format.is_some() {
            bail!(
                "reward.format.bonus and reward.format.penalty (the format reward): {why}, which \
                 nothing in [reward] adds to (env.reward says how an episode's rewards are \
                 combined); remove [reward.format], or set data.verifier"
            );
        }
        Ok(())
    }

    /// The one resolve step: preset expansion, value checks (section by section, in a fixed
    /// order: the first error is reported), staleness warning.
    ///
    /// # Errors
    /// Invalid values, each naming its key and the fix: out-of-range values, a loss-specific
    /// `[algorithm]` knob the chosen loss does not read, `model.dtype = "f16"` (inference only),
    /// `rollout.group_size = 1` (never learns) unless `rollout.allow_group_size_one`. An error
    /// that names a key the user wrote says where it was written (the file and line, or the
    /// `--set`): [`name_origin`].
    pub fn resolve(self) -> anyhow::Result<ResolvedConfig> {
        let written = self.written.0.clone();
        self.resolve_values().map_err(|e| name_origin(e, &written))
    }

    /// [`RawConfig::resolve`] without naming where a key was written.
    fn resolve_values(mut self) -> anyhow::Result<ResolvedConfig> {
        let auto = self.model.resolve_auto()?;
        let algorithm = self.algorithm.resolve().context("resolving [algorithm]")?;
        self.algorithm = algorithm.to_config();
        let mut warnings = std::mem::take(&mut self.notes.0);
        self.check_lora()?;
        self.check_dtype()?;
        self.check_group()?;
        self.check_lengths()?;
        self.check_sampling()?;
        self.check_sync()?;
        self.check_distributed()?;
        self.check_train()?;
        self.check_eval()?;
        self.reward.check()?;
        if let Some(v) = &self.data.verifier {
            v.check("data.verifier")?;
        }
        if self.output.log_every == 0 {
            bail!("output.log_every must be at least 1 (a console line every this many steps)");
        }
        warnings.extend(self.staleness_warnings());
        warnings.extend(self.env_warnings());
        // [env] first: a misspelt env.builtin is named as such, not as the data it would need.
        self.check_env()?;
        self.check_data()?;
        let written = std::mem::take(&mut self.written);
        let cfg = ResolvedConfig {
            raw: self,
            algorithm,
            warnings,
            auto,
            resume_changes: Vec::new(),
        };
        super::gates::check(&cfg, &written)?;
        let mut cfg = cfg;
        cfg.raw.written = written;
        Ok(cfg)
    }
}

/// The `rollout.*` keys of the vLLM backend: servers given, positive limits, `rollout.retries` at
/// most [`rlvr_reward::reward_model::MOST_RETRIES`], and
/// truncated sampling only with `rollout.accept_renormalised_logprobs` (vLLM renormalises its
/// behaviour log-probs over the kept tokens; the EOS ids are stop ids, so `min_new_tokens > 0`
/// truncates too).
fn check_vllm_keys(r: &super::RolloutSection) -> anyhow::Result<()> {
    if r.servers.is_empty() {
        bail!(
            "rollout.backend = \"vllm\" needs rollout.servers, e.g. [\"http://127.0.0.1:8000\"] \
             (README \"Scaling out with vLLM\" says how to start one)"
        );
    }
    if r.served_model_name.is_empty() {
        bail!("rollout.served_model_name is empty: give the --served-model-name the servers run");
    }
    rlvr_reward::combine::timeout_duration("rollout.request_timeout_s", r.request_timeout_s)?;
    if r.in_flight == 0 {
        bail!("rollout.in_flight must be at least 1");
    }
    let most = rlvr_reward::reward_model::MOST_RETRIES;
    if r.retries > most as usize {
        bail!(
            "rollout.retries = {} is out of range: at most {most}",
            r.retries
        );
    }
    if !(r.refresh_tolerance.is_finite() && r.refresh_tolerance > 0.0) {
        bail!(
            "rollout.refresh_tolerance = {} must be > 0",
            r.refresh_tolerance
        );
    }
    let truncated = r.top_p < 1.0 || r.top_k > 0 || r.min_new_tokens > 0;
    if truncated && !r.accept_renormalised_logprobs {
        bail!(
            "rollout.top_p = {}, rollout.top_k = {}, rollout.min_new_tokens = {} with rollout.backend = \
             \"vllm\": vLLM's behaviour log-probs are then renormalised over the kept tokens, while the \
             native engine's ℓ_old is over the full vocabulary (DESIGN.md section 3), so the same config \
             would train differently; set rollout.accept_renormalised_logprobs = true to accept that, or \
             use top_p = 1, top_k = 0, min_new_tokens = 0",
            r.top_p,
            r.top_k,
            r.min_new_tokens
        );
    }
    Ok(())
}

impl ResolvedConfig {
    /// Checks what starting a run needs beyond [`RawConfig::resolve`] (which tests and `rlvr plan`
    /// use without a model): `model.path` is set, and a CUDA `model.device` is one this binary
    /// can open at all (checked before the run directory is touched or anything is printed, so
    /// the error comes first and alone).
    ///
    /// # Errors
    /// `model.path` unset, saying how to set it; `model.device = "cuda"` (or `cuda:N`) on a binary
    /// built without CUDA, naming the CPU override ([`super::ModelSection::open_device`]'s error).
    pub fn check_runnable(&self) -> anyhow::Result<()> {
        let device = self.raw.model.device;
        let cuda = matches!(device, DeviceSpec::Cuda(_) | DeviceSpec::CudaLocal);
        if cuda && !candle_core::utils::cuda_is_available() {
            self.raw.model.open_device()?;
        }
        if self.raw.model.path.as_os_str().is_empty() {
            bail!(
                "model.path is required: the policy checkpoint directory (config.json, \
                 *.safetensors, tokenizer.json); set `path` in the config file's [model] table or \
                 pass --set model.path=DIR"
            );
        }
        Ok(())
    }

    /// Reads `RUN_DIR/config.toml` back (for `--resume`), with `overrides` applied on top.
    ///
    /// A `config.toml` written before the loss options were grouped holds every `[algorithm]`
    /// knob; the loss-specific ones the run's loss does not read are dropped from it (they were the
    /// resolver's, not the user's), while an override setting one is still an error.
    ///
    /// # Errors
    /// As [`RawConfig::load`] and [`RawConfig::resolve`]; a `train.steps` below the step of the
    /// run's latest checkpoint (a resume continues a run and cannot shorten it), naming that step.
    pub fn from_run_dir(run_dir: &Path, overrides: &[String]) -> anyhow::Result<ResolvedConfig> {
        let path = run_dir.join("config.toml");
        if !path.exists() {
            bail!(
                "{} does not exist: --resume needs a run directory written by `rlvr train`",
                path.display()
            );
        }
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        let mut table = text
            .parse::<toml::Table>()
            .with_context(|| format!("parsing {}", path.display()))?;
        let note = follow_preset_change(&mut table, overrides, &path)?;
        drop_unread_loss_options(&mut table, overrides)?;
        let layer = FileLayer {
            path: path.clone(),
            text,
        };
        let saved = layer
            .text
            .parse::<toml::Table>()
            .with_context(|| format!("parsing {}", path.display()))?;
        let mut raw = load_layers(table, Some(&layer), overrides)?;
        raw.notes.0.extend(note);
        // config.toml holds every key; only what the overrides write is the user's now.
        raw.written.retain(|w| w.origin.starts_with("--set"));
        // Paths of a config.toml written before they were recorded absolute: the working
        // directory, as then.
        let cwd = std::env::current_dir().context("reading the current directory")?;
        super::paths::absolutize(&mut raw, &cwd);
        let mut cfg = raw.resolve()?;
        cfg.resume_changes = resume_changes(&saved, &cfg, &path)?;
        for c in &cfg.resume_changes {
            cfg.warnings.push(format!(
                "--resume changes {} from {} ({}) to {} ({}): the run's steps after the \
                 checkpoint follow the new value, those before it the old one (run.json's \
                 `resume_changes` keeps this)",
                c.key,
                c.was,
                path.display(),
                c.now,
                c.origin
            ));
        }
        cfg.warnings
            .extend(check_model_on_resume(run_dir, &saved, &cfg, &path, &cwd)?);
        cfg.warnings
            .extend(check_reference_on_resume(run_dir, &cfg, &path)?);
        if let Some(dir) = crate::store::checkpoint::latest(run_dir)? {
            let p = dir.join("trainer_state/state.json");
            let st: TrainerState = serde_json::from_str(
                &std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?,
            )
            .with_context(|| format!("parsing {}", p.display()))?;
            let steps = cfg.raw.train.steps;
            if steps < st.step {
                bail!(
                    "train.steps = {steps} is fewer than the {} the run in {} has already \
                     trained (its checkpoint to resume from, {}, holds step {}): --resume \
                     continues a run and cannot shorten it; set train.steps to {} or more, or \
                     evaluate an earlier checkpoint with `rlvr eval --model`",
                    crate::log::counted(st.step, "step"),
                    run_dir.display(),
                    dir.display(),
                    st.step,
                    st.step
                );
            }
            if steps == st.step {
                // A `--set` here would change the run's config.toml (and run.json's record)
                // without any step following it.
                let changed = changed_by_sets(&saved, &cfg)?;
                if !changed.is_empty() {
                    bail!(
                        "the run in {} has already trained all its train.steps = {steps} (its \
                         checkpoint {} holds step {steps}), so {} would apply to no step; to \
                         train on with {}, add --set train.steps=N with N > {steps}",
                        run_dir.display(),
                        dir.display(),
                        changed.join(", "),
                        if changed.len() == 1 { "it" } else { "them" }
                    );
                }
                cfg.warnings.push(format!(
                    "the run in {} has already trained all its train.steps = {steps} (its \
                     checkpoint {} holds step {steps}): nothing to train; to train on, resume \
                     with --set train.steps=N, N > {steps}",
                    run_dir.display(),
                    dir.display(),
                ));
            }
        }
        Ok(cfg)
    }
}

/// A `--resume`'s `model.path` (set by `--set` or in the run's edited config.toml, `file`)
/// checked against the model `run_dir`'s run.json records
/// ([`crate::store::model_identity::check_on_resume`]): the warning it gives, if any.
///
/// # Errors
/// Another model than the run's, naming both paths and what differs.
fn check_model_on_resume(
    run_dir: &Path,
    saved: &toml::Table,
    cfg: &ResolvedConfig,
    file: &Path,
    cwd: &Path,
) -> anyhow::Result<Option<String>> {
    let now = &cfg.raw.model.path;
    let from_config = lookup(saved, "model.path")
        .and_then(|v| v.as_str().map(|s| cwd.join(s)))
        .unwrap_or_else(|| now.clone());
    let origin = cfg
        .raw
        .written
        .0
        .iter()
        .rev()
        .find(|w| w.key == "model.path")
        .map_or_else(|| file.display().to_string(), |w| w.origin.clone());
    let recorded = crate::store::run_json::recorded_model(run_dir);
    crate::store::model_identity::check_on_resume(
        run_dir,
        recorded.as_ref().map(|(p, id)| (p.as_path(), id)),
        (&from_config, now, &origin),
    )
}

/// A `--resume`'s `model.reference` (in the run's config.toml, `file`, perhaps edited, or a
/// `--set` that keeps its value) checked against the reference `run_dir`'s run.json records
/// ([`crate::store::model_identity::check_reference_on_resume`]), when the algorithm loads one
/// (`algorithm.kl_coef` ≠ 0) and no `--set` changes it (that change is warned about and recorded
/// in `resume_changes`, see [`resume_changes`]): the warning it gives, if any.
///
/// # Errors
/// Another reference than the run's, named with what differs.
fn check_reference_on_resume(
    run_dir: &Path,
    cfg: &ResolvedConfig,
    file: &Path,
) -> anyhow::Result<Option<String>> {
    let set = cfg
        .resume_changes
        .iter()
        .any(|c| c.key == "model.reference");
    if set || !cfg.algorithm.needs_reference() {
        return Ok(None);
    }
    let origin = cfg
        .raw
        .written
        .0
        .iter()
        .rev()
        .find(|w| w.key == "model.reference")
        .map_or_else(|| file.display().to_string(), |w| w.origin.clone());
    let recorded = crate::store::run_json::recorded_reference(run_dir);
    let recorded = recorded
        .as_ref()
        .map(|r| r.as_ref().map(|(p, id)| (p.as_path(), id)));
    crate::store::model_identity::check_reference_on_resume(
        run_dir,
        recorded,
        cfg.raw.model.reference.as_deref(),
        &origin,
    )
}

/// `cfg` written out and read back as a table (what config.toml would hold now).
///
/// # Errors
/// The resolved config cannot be re-read.
fn resolved_table(cfg: &ResolvedConfig) -> anyhow::Result<toml::Table> {
    cfg.to_toml()?
        .parse()
        .context("re-reading the resolved config")
}

/// The value of dotted `key` (`train.lr`) in `t`, if set.
fn lookup(t: &toml::Table, key: &str) -> Option<toml::Value> {
    let mut parts = key.split('.');
    let mut v = t.get(parts.next()?)?;
    for p in parts {
        v = v.as_table()?.get(p)?;
    }
    Some(v.clone())
}

/// The `--set`s of a resume (origin and key) whose value differs from the run's config.toml
/// (`saved`), `train.steps` aside: each as `--set KEY=VALUE`.
///
/// # Errors
/// The resolved config cannot be re-read.
fn changed_by_sets(saved: &toml::Table, cfg: &ResolvedConfig) -> anyhow::Result<Vec<String>> {
    let now = resolved_table(cfg)?;
    let mut out: Vec<String> = Vec::new();
    for w in &cfg.raw.written.0 {
        if w.key == "train.steps" || lookup(saved, &w.key) == lookup(&now, &w.key) {
            continue;
        }
        let o = w.origin.clone();
        if !out.contains(&o) {
            out.push(o);
        }
    }
    Ok(out)
}

/// A key whose value a `--resume`'s `--set` changed, among those that change what the run
/// means: `algorithm.*`, `rollout.group_size`, `rollout.temperature` (the behaviour policy's),
/// `data.*`, `train.seed`, the learning-rate schedule (`train.lr`, `train.min_lr`,
/// `train.warmup_steps`, `train.schedule`), `sync.max_staleness`, `model.reference` (the KL
/// term's reference policy; `model.path` has its own check, `check_model_on_resume`)
/// (`sync.interval`, `sync.offset` and `data.seed` are refused, see [`resume_changes`]).
#[derive(Debug, Clone, PartialEq)]
pub struct ResumeChange {
    /// The dotted key.
    pub key: String,
    /// Its value in the run's config.toml (TOML), or `unset`.
    pub was: String,
    /// Its value now (TOML).
    pub now: String,
    /// The `--set` that wrote it.
    pub origin: String,
}

/// Keys a `--resume` may not change, each with why: the checkpoint was written for their value.
const FIXED_ON_RESUME: [(&str, &str); 3] = [
    (
        "sync.interval",
        "the checkpoint's in-flight batches and explorer weights follow the saved sync schedule; \
         under another one the resumed explorer can wait for weights no step sends",
    ),
    (
        "sync.offset",
        "the checkpoint's in-flight batches and explorer weights follow the saved sync schedule; \
         under another one the resumed explorer can wait for weights no step sends",
    ),
    (
        "data.seed",
        "the checkpoint's prompt order continues with the saved seed (its data cursor carries \
         it), so the new value would change nothing",
    ),
];

/// Prefixes of the keys whose change by a `--resume` is warned about and recorded.
const MEANING_ON_RESUME: [&str; 11] = [
    "algorithm.",
    "rollout.group_size",
    "rollout.temperature",
    "data.",
    "train.seed",
    "train.lr",
    "train.min_lr",
    "train.warmup_steps",
    "train.schedule",
    "sync.max_staleness",
    "model.reference",
];

/// The changes a `--resume`'s `--set`s (`cfg.raw.written`) make to the run's `saved` config.toml
/// (`file`) among the keys that change what the run means ([`ResumeChange`]).
///
/// # Errors
/// A change of a key the checkpoint was written for (`sync.interval`, `sync.offset`,
/// `data.seed`), naming the key, the saved value, the `--set` and what to do instead.
fn resume_changes(
    saved: &toml::Table,
    cfg: &ResolvedConfig,
    file: &Path,
) -> anyhow::Result<Vec<ResumeChange>> {
    let now = resolved_table(cfg)?;
    let show = |v: &Option<toml::Value>| v.as_ref().map_or("unset".to_string(), |v| v.to_string());
    let mut out: Vec<ResumeChange> = Vec::new();
    for w in &cfg.raw.written.0 {
        let fixed = FIXED_ON_RESUME.iter().find(|(k, _)| *k == w.key);
        let meaning = MEANING_ON_RESUME.iter().any(|p| w.key.starts_with(p));
        if (fixed.is_none() && !meaning) || out.iter().any(|c| c.key == w.key) {
            continue;
        }
        let (was, new) = (lookup(saved, &w.key), lookup(&now, &w.key));
        if was == new {
            continue;
        }
        if let Some((key, why)) = fixed {
            bail!(
                "{key} = {} cannot change on --resume ({}): {} has {key} = {}; {why}. Resume \
                 without it, or start a new run from a checkpoint's weights (--set \
                 model.path=RUN_DIR/checkpoints/step-N)",
                show(&new),
                w.origin,
                file.display(),
                show(&was)
            );
        }
        out.push(ResumeChange {
            key: w.key.clone(),
            was: show(&was),
            now: show(&new),
            origin: w.origin.clone(),
        });
    }
    Ok(out)
}

/// When `overrides` set `algorithm.preset` to another preset than the one `table` (read from
/// `file`) names, removes from `table`'s `[algorithm]` each knob whose value is the one the old
/// preset resolves to and that no override sets: those values are the old preset's, not the
/// user's (a run's config.toml holds every resolved knob), so the new preset's apply. Knobs with
/// other values were written by hand and stay. Returns the line that says so (for train.log), or
/// `None` when the preset does not change. Without this, `--resume RUN --set
/// algorithm.preset="reinforce"` recorded the new preset while the run went on with GRPO's
/// values (issue 49 item 4).
///
/// # Errors
/// An override that does not parse; the old preset unknown (the file's error, left to
/// [`load_layers`], is not raised here: `None` is returned).
pub(super) fn follow_preset_change(
    table: &mut toml::Table,
    overrides: &[String],
    file: &Path,
) -> anyhow::Result<Option<String>> {
    let mut set = toml::Table::new();
    for o in overrides {
        apply_override(&mut set, o)?;
    }
    let set_alg = set.get("algorithm").and_then(|a| a.as_table());
    let Some(new) = set_alg
        .and_then(|a| a.get("preset"))
        .and_then(|v| v.as_str())
    else {
        return Ok(None);
    };
    let Some(alg) = table.get_mut("algorithm").and_then(|a| a.as_table_mut()) else {
        return Ok(None);
    };
    let old = match alg.get("preset") {
        Some(toml::Value::String(p)) => p.clone(),
        Some(_) => return Ok(None),
        None => AlgorithmConfig::default().preset,
    };
    if old == new {
        return Ok(None);
    }
    let Ok(resolved) = AlgorithmConfig::empty(&old).resolve() else {
        return Ok(None);
    };
    let Ok(toml::Value::Table(by_old)) = toml::Value::try_from(resolved.to_config()) else {
        return Ok(None);
    };
    let (mut from_old, mut kept) = (Vec::new(), Vec::new());
    let keys: Vec<String> = alg.keys().filter(|k| *k != "preset").cloned().collect();
    for k in keys {
        if set_alg.is_some_and(|a| a.contains_key(&k)) {
            continue;
        }
        if by_old.get(&k) == alg.get(&k) {
            alg.remove(&k);
            from_old.push(k);
        } else {
            kept.push(k);
        }
    }
    let mut line = format!(
        "algorithm.preset changes from \"{old}\" ({}) to \"{new}\" (--set): the knobs that held \
         {old}'s values are now {new}'s",
        file.display()
    );
    if !from_old.is_empty() {
        line.push_str(&format!(" ({})", from_old.join(", ")));
    }
    if !kept.is_empty() {
        line.push_str(&format!(
            "; kept as written, as they differ from {old}'s: {}",
            kept.join(", ")
        ));
    }
    Ok(Some(line))
}

/// Removes from `table`'s `[algorithm]` the loss-specific knobs that the loss in force after
/// `overrides` does not read and that no override sets (see [`ResolvedConfig::from_run_dir`]).
/// A table that does not parse is left for [`load_layers`] to report.
fn drop_unread_loss_options(table: &mut toml::Table, overrides: &[String]) -> anyhow::Result<()> {
    let mut merged = table.clone();
    let mut set = toml::Table::new();
    for o in overrides {
        apply_override(&mut merged, o)?;
        apply_override(&mut set, o)?;
    }
    let Some(toml::Value::Table(alg)) = merged.remove("algorithm") else {
        return Ok(());
    };
    let Ok(loss) = from_table::<AlgorithmConfig>(alg).and_then(|a| Ok(a.effective_loss()?)) else {
        return Ok(());
    };
    let set_here = |key: &str| {
        set.get("algorithm")
            .and_then(|a| a.as_table())
            .is_some_and(|a| a.contains_key(key))
    };
    if let Some(toml::Value::Table(alg)) = table.get_mut("algorithm") {
        for key in LOSS_OPTIONS {
            if !loss.reads(key) && !set_here(key) {
                alg.remove(key);
            }
        }
    }
    Ok(())
}

/// `err` with where the key it names was written: the first written key (of `written`, dotted)
/// that the message names as a whole key (not as part of a longer one), earliest in the message,
/// the longest at one place; of a key written by several layers (the file, then `--set`s in
/// order), the last, whose value is the one in force. Unchanged when it names none, or already
/// says where ([`super::gates::check`]'s errors do).
///
/// The message becomes `MESSAGE (in configs/x.toml line 12)` or `MESSAGE (in --set KEY=VALUE)`,
/// one line, its causes kept in it.
pub(crate) fn name_origin(err: anyhow::Error, written: &[super::Written]) -> anyhow::Error {
    let msg = format!("{err:#}");
    let is_key_char = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '.';
    let mut best: Option<(usize, usize, &super::Written)> = None;
    for w in written {
        let mut from = 0;
        while let Some(i) = msg[from..].find(w.key.as_str()).map(|i| i + from) {
            let end = i + w.key.len();
            let before = msg[..i].chars().next_back();
            let after = msg[end..].chars().next();
            // A longer key goes on with a word character, or a dot and one (a sentence's full
            // stop does not).
            let longer = match after {
                Some('.') => msg[end + 1..].starts_with(|c: char| c.is_ascii_alphanumeric()),
                Some(c) => c.is_ascii_alphanumeric() || c == '_',
                None => false,
            };
            let whole = !before.is_some_and(is_key_char) && !longer;
            if whole {
                let better = match best {
                    None => true,
                    // `>=`: a later layer that wrote the same key wins.
                    Some((j, len, _)) => i < j || i == j && w.key.len() >= len,
                };
                if better {
                    best = Some((i, w.key.len(), w));
                }
                break;
            }
            from = i + 1;
        }
    }
    match best {
        Some((_, _, w)) if !msg.contains(&w.origin) => {
            anyhow::anyhow!("{msg} (in {})", w.origin)
        }
        _ => err,
    }
}
