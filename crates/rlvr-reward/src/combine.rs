//! Reward functions: weighted sums of verifier components plus an optional format reward.
//!
//! reward = Σ_c weight_c · reward_c + format, where `format` is the [`FormatReward`] bonus or penalty
//! (0 when off). Each component's raw reward is kept in [`RewardBreakdown::components`] so the trainer
//! can log it as `reward/<name>` ([`component_means`]); correctness (`accuracy`) comes from the first
//! component alone and never includes the format term.

use crate::arithmetic::ArithmeticVerifier;
use crate::bounds::show;
pub use crate::bounds::{timeout_duration, MAX_TIMEOUT_S};
use crate::countdown::CountdownVerifier;
use crate::external::{ExternalVerifier, MAX_STDOUT_BYTES};
use crate::format::FormatReward;
use crate::gsm8k::{Gsm8kMode, Gsm8kVerifier};
use crate::judge::JudgeConfig;
use crate::math::MathVerifier;
use crate::persistent::PersistentVerifier;
use crate::reward_model::RewardModelConfig;
use crate::{RewardError, Sample, Verifier};
use serde::{Deserialize, Serialize};

/// Which verifier a component uses (a TOML inline table tagged by `kind`). The `///` comments of
/// the variants and their fields are the config reference's `data.verifier.*` rows
/// ([`crate::reference`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum VerifierConfig {
    /// GSM8K (`Gsm8kVerifier`): the number after the reference's last `####` against the
    /// completion's answer, compared exactly.
    Gsm8k {
        /// Which answer forms count: `strict` (`#### N` only) or `flexible` (`#### N`, then
        /// `\boxed{}`, then an "answer is" phrase, then the last number). Default `flexible`.
        #[serde(default)]
        mode: Gsm8kMode,
    },
    /// MATH (`MathVerifier`): the completion's last `\boxed{}` against the reference's (or the bare
    /// reference), with Math-Verify's answer forms (crates/rlvr-reward/src/math.rs).
    // `{}`, not a unit variant: serde ignores every other key of an internally tagged unit
    // variant, so `{ kind = "math", mode = "strict" }` would pass with `mode` unread.
    Math {},
    /// Countdown (`CountdownVerifier`): the completion's equation must use each given number once
    /// and reach the target; the reference is `{"numbers": [..], "target": N}`.
    // As `Math {}`.
    Countdown {},
    /// Arithmetic (`ArithmeticVerifier`): the completion's number (its last `<answer>…</answer>`,
    /// else the whole completion) equals the reference exactly.
    Arithmetic {
        /// `strict` (the answer text must be exactly one number) or `flexible` (GSM8K's
        /// extraction). Default `flexible`.
        #[serde(default)]
        mode: Gsm8kMode,
    },
    /// Your own program (`ExternalVerifier`, `PersistentVerifier`): JSON lines over stdin and
    /// stdout (docs/external-verifier.md).
    External {
        /// Program and arguments, e.g. `["python3", "score.py"]` (required, not empty). In a
        /// config file, a program written as a path (`./score.py`) and an argument naming a file
        /// that exists beside the config (`score.py`) are relative to the file's directory; a bare
        /// program name (`python3`) is looked up on `PATH`.
        command: Vec<String>,
        /// Seconds allowed per batch, in (0, 1e6]. Default 60.
        #[serde(default = "default_timeout_s")]
        timeout_s: f64,
        /// When the program runs: `per_batch` (started for every batch) or `persistent` (started
        /// once per run). Default `per_batch`.
        #[serde(default)]
        mode: ExternalMode,
        /// Persistent mode: how many times a program that dies is started again in one run before
        /// the run stops, at most 1000. Default 3.
        #[serde(default = "default_restarts")]
        restarts: u32,
        /// Names of environment variables the program gets from rlvr's environment besides
        /// `PATH`, `HOME`, `LANG` and `TMPDIR` (e.g. `["OPENAI_API_KEY"]`); every other variable,
        /// API keys included, is withheld. Default empty.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        env: Vec<String>,
    },
    /// A reward function written for TRL's GRPOTrainer (`fn(prompts, completions, **columns)`),
    /// run unchanged in one persistent Python process by the adapter `examples/trl_rewards.py`,
    /// which rlvr carries: the shorthand of `kind = "external"` with `command = [python,
    /// "examples/trl_rewards.py", function]` and `mode = "persistent"`. Several functions: one
    /// component each, TRL's `reward_weights` as their `weight`s.
    Python {
        /// The function as `FILE.py:NAME`, e.g. `"my_rewards.py:accuracy_reward"` (required); in
        /// a config file, a relative FILE is relative to the file's directory.
        function: String,
        /// The Python interpreter: a name looked up on `PATH`, or a path (a relative one in a
        /// config file is relative to the file's directory). Default `python3`.
        #[serde(default = "default_python")]
        python: String,
        /// Seconds allowed per batch, in (0, 1e6]. Default 60.
        #[serde(default = "default_timeout_s")]
        timeout_s: f64,
        /// How many times a process that dies is started again in one run before the run stops,
        /// at most 1000. Default 3.
        #[serde(default = "default_restarts")]
        restarts: u32,
        /// Names of environment variables the process gets from rlvr's environment besides
        /// `PATH`, `HOME`, `LANG` and `TMPDIR`; every other variable is withheld. Default empty.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        env: Vec<String>,
    },
    /// A reward function written for verl's `custom_reward_function` (`compute_score(data_source,
    /// solution_str, ground_truth, extra_info=None)` returning a number or a dict with `score`),
    /// run unchanged in one persistent Python process by the adapter `examples/verl_rewards.py`,
    /// which rlvr carries: one call per completion, with the row's `data_source` (else
    /// `data_source` below), the completion text, the row's `reward_model.ground_truth` (else its
    /// reference) and its `extra_info` column (else None), plus `kwargs`.
    Verl {
        /// The function as `FILE.py:NAME` or `FILE.py` (NAME `compute_score`, as verl's
        /// `custom_reward_function.path` and `.name`), e.g. `"my_reward.py:compute_score"`
        /// (required); in a config file, a relative FILE is relative to the file's directory.
        function: String,
        /// The `data_source` passed for a row without a `data_source` column. Default: the
        /// task's name (`data.task`, e.g. `jsonl`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        data_source: Option<String>,
        /// Keyword arguments passed to the function on every call besides verl's four (verl's
        /// `custom_reward_function.reward_kwargs`), a table of TOML values that reach Python as
        /// the same values (strings, integers, floats, booleans, arrays as lists, tables as
        /// dicts), e.g. `{ format_score = 0.1, strict = true }`. A date, a NaN or an infinity,
        /// and the names `data_source`, `solution_str`, `ground_truth` and `extra_info`, are
        /// refused. Default empty.
        #[serde(default, skip_serializing_if = "serde_json::Map::is_empty")]
        kwargs: serde_json::Map<String, serde_json::Value>,
        /// The Python interpreter: a name looked up on `PATH`, or a path (a relative one in a
        /// config file is relative to the file's directory). Default `python3`.
        #[serde(default = "default_python")]
        python: String,
        /// Seconds allowed per batch, in (0, 1e6]. Default 60.
        #[serde(default = "default_timeout_s")]
        timeout_s: f64,
        /// How many times a process that dies is started again in one run before the run stops,
        /// at most 1000. Default 3.
        #[serde(default = "default_restarts")]
        restarts: u32,
        /// Names of environment variables the process gets from rlvr's environment besides
        /// `PATH`, `HOME`, `LANG` and `TMPDIR`; every other variable is withheld. Default empty.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        env: Vec<String>,
    },
    /// An LLM judge over HTTP (`JudgeVerifier`): an OpenAI-compatible server scores each
    /// completion by a prompt (docs/external-verifier.md).
    Judge(JudgeConfig),
    /// A reward model on vLLM's pooling API (`RewardModelVerifier`; docs/external-verifier.md);
    /// also written `reward-model`.
    #[serde(rename = "reward_model", alias = "reward-model")]
    RewardModel(RewardModelConfig),
}

/// When an external verifier's program runs (`mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum ExternalMode {
    /// Started once per batch: JSON lines in, one per completion, stdin closed, one line out per
    /// completion.
    #[default]
    #[serde(rename = "per_batch", alias = "per-batch")]
    PerBatch,
    /// Started once per run: one `{"items": [...]}` line in and one `{"rewards": [...]}` line out
    /// per batch.
    #[serde(rename = "persistent")]
    Persistent,
}

fn default_restarts() -> u32 {
    3
}

fn default_python() -> String {
    "python3".into()
}

fn default_timeout_s() -> f64 {
    60.0
}

fn default_weight() -> f64 {
    1.0
}

/// The most `restarts` a persistent external verifier accepts (1,000 in one run): more is a wish
/// for "forever", which would hide a program that dies on every batch.
pub const MOST_RESTARTS: u32 = 1000;

/// The largest |value| of a reward component's `weight` and of the format reward's `bonus` and
/// `penalty`: rewards beyond it overflow the squares of the reward statistics and swamp every
/// other component.
pub const MAX_REWARD_WEIGHT: f64 = 1e6;

/// Refuses a reward weight (`key` = `value`) that is not finite or exceeds
/// [`MAX_REWARD_WEIGHT`] in magnitude.
fn check_weight(key: &str, value: f64) -> Result<(), RewardError> {
    if value.is_finite() && value.abs() <= MAX_REWARD_WEIGHT {
        return Ok(());
    }
    Err(RewardError::Config(format!(
        "{key} = {} is out of range: expected a finite number in [-{MAX_REWARD_WEIGHT:e}, \
         {MAX_REWARD_WEIGHT:e}]",
        show(value)
    )))
}

/// Checks the settings a `python` and a `verl` verifier share, at `key`.
fn check_python(
    key: &str,
    python: &str,
    timeout_s: f64,
    restarts: u32,
    env: &[String],
) -> Result<(), RewardError> {
    if python.is_empty() {
        return Err(RewardError::Config(format!(
            "{key}.python is empty: name the Python interpreter (python3)"
        )));
    }
    if restarts > MOST_RESTARTS {
        return Err(RewardError::Config(format!(
            "{key}.restarts = {restarts} is out of range: at most {MOST_RESTARTS}"
        )));
    }
    crate::external::check_env_names(&format!("{key}.env"), env)?;
    timeout_duration(&format!("{key}.timeout_s"), timeout_s).map(|_| ())
}

impl VerifierConfig {
    /// Checks what [`VerifierConfig::build`] would refuse, without building or starting anything
    /// (for a config check at start-up); `key` names where the verifier was given, e.g.
    /// `data.verifier` or `reward.components[0].verifier`.
    ///
    /// # Errors
    /// [`RewardError::Config`] naming the key: an empty external `command`, a `timeout_s` outside
    /// (0, [`MAX_TIMEOUT_S`]], `restarts` above [`MOST_RESTARTS`]; a judge's or a reward model's invalid settings.
    pub fn check(&self, key: &str) -> Result<(), RewardError> {
        match self {
            VerifierConfig::External {
                command,
                timeout_s,
                env,
                restarts,
                ..
            } => {
                if command.is_empty() {
                    return Err(RewardError::Config(format!(
                        "{key}.command is empty: an external verifier needs a program to run"
                    )));
                }
                if *restarts > MOST_RESTARTS {
                    return Err(RewardError::Config(format!(
                        "{key}.restarts = {restarts} is out of range: at most {MOST_RESTARTS}"
                    )));
                }
                crate::external::check_env_names(&format!("{key}.env"), env)?;
                timeout_duration(&format!("{key}.timeout_s"), *timeout_s).map(|_| ())
            }
            VerifierConfig::Python {
                function,
                python,
                timeout_s,
                env,
                restarts,
            } => {
                let (file, name) = function.rsplit_once(':').unwrap_or(("", ""));
                if file.is_empty() || name.is_empty() {
                    return Err(RewardError::Config(format!(
                        "{key}.function = {function:?} is not FILE.py:NAME (e.g. \
                         \"my_rewards.py:accuracy_reward\")"
                    )));
                }
                check_python(key, python, *timeout_s, *restarts, env)
            }
            VerifierConfig::Verl {
                function,
                data_source: _,
                kwargs,
                python,
                timeout_s,
                env,
                restarts,
            } => {
                if crate::verl::split_function(function).is_none() {
                    return Err(RewardError::Config(format!(
                        "{key}.function = {function:?} is not FILE.py or FILE.py:NAME (e.g. \
                         \"my_reward.py:compute_score\", verl's custom_reward_function.path \
                         and .name)"
                    )));
                }
                crate::verl::check_kwargs(&format!("{key}.kwargs"), kwargs)?;
                check_python(key, python, *timeout_s, *restarts, env)
            }
            VerifierConfig::Judge(j) => j
                .check()
                .map_err(|e| RewardError::Config(format!("{key}: {e}"))),
            VerifierConfig::RewardModel(r) => r
                .check()
                .map_err(|e| RewardError::Config(format!("{key}: {e}"))),
            _ => Ok(()),
        }
    }

    /// Builds the verifier.
    ///
    /// # Errors
    /// [`RewardError::Config`] for an empty external command or a timeout that is not positive.
    pub fn build(&self) -> Result<Box<dyn Verifier>, RewardError> {
        Ok(match self {
            VerifierConfig::Gsm8k { mode } => Box::new(Gsm8kVerifier { mode: *mode }),
            VerifierConfig::Math {} => Box::new(MathVerifier),
            VerifierConfig::Countdown {} => Box::new(CountdownVerifier),
            VerifierConfig::Arithmetic { mode } => Box::new(ArithmeticVerifier { mode: *mode }),
            VerifierConfig::Judge(j) => Box::new(j.build()?),
            VerifierConfig::RewardModel(r) => Box::new(r.build()?),
            VerifierConfig::External {
                command,
                timeout_s,
                mode,
                restarts,
                env,
            } => {
                self.check("verifier")?;
                let timeout = timeout_duration("verifier.timeout_s", *timeout_s)?;
                match mode {
                    ExternalMode::PerBatch => Box::new(ExternalVerifier {
                        command: command.clone(),
                        timeout,
                        env: env.clone(),
                        max_stdout: MAX_STDOUT_BYTES,
                    }),
                    ExternalMode::Persistent => Box::new(
                        PersistentVerifier::new(command.clone(), timeout, *restarts)
                            .with_env(env.clone()),
                    ),
                }
            }
            VerifierConfig::Python {
                timeout_s,
                restarts,
                env,
                ..
            } => {
                self.check("verifier")?;
                let timeout = timeout_duration("verifier.timeout_s", *timeout_s)?;
                let mut command = self.command().expect("a python verifier has a command");
                command[1] = crate::trl::adapter_path()?.display().to_string();
                Box::new(PersistentVerifier::new(command, timeout, *restarts).with_env(env.clone()))
            }
            VerifierConfig::Verl {
                timeout_s,
                restarts,
                env,
                ..
            } => {
                self.check("verifier")?;
                let timeout = timeout_duration("verifier.timeout_s", *timeout_s)?;
                let mut command = self.command().expect("a verl verifier has a command");
                command[1] = crate::verl::adapter_path()?.display().to_string();
                Box::new(PersistentVerifier::new(command, timeout, *restarts).with_env(env.clone()))
            }
        })
    }

    /// The program an external, python or verl verifier runs, as it would be written by hand
    /// (the adapter as `examples/trl_rewards.py` or `examples/verl_rewards.py`, the file rlvr
    /// writes out at build time; a verl verifier's `--data-source` when `data_source` is set and
    /// `--kwargs JSON` when `kwargs` is not empty);
    /// `None` for the built-in, judge and reward-model kinds.
    pub fn command(&self) -> Option<Vec<String>> {
        match self {
            VerifierConfig::External { command, .. } => Some(command.clone()),
            VerifierConfig::Python {
                function, python, ..
            } => Some(vec![
                python.clone(),
                "examples/trl_rewards.py".into(),
                function.clone(),
            ]),
            VerifierConfig::Verl {
                function,
                python,
                data_source,
                kwargs,
                ..
            } => {
                let mut c = vec![
                    python.clone(),
                    "examples/verl_rewards.py".into(),
                    function.clone(),
                ];
                if let Some(d) = data_source {
                    c.extend(["--data-source".into(), d.clone()]);
                }
                if !kwargs.is_empty() {
                    let json = serde_json::Value::Object(kwargs.clone()).to_string();
                    c.extend(["--kwargs".into(), json]);
                }
                Some(c)
            }
            _ => None,
        }
    }

    /// Sets a verl verifier's `data_source` to `name` (the task's name) when the config leaves it
    /// unset; other kinds are left as they are.
    pub fn default_data_source(&mut self, name: &str) {
        if let VerifierConfig::Verl { data_source, .. } = self {
            data_source.get_or_insert_with(|| name.to_string());
        }
    }

    /// A short name for logs (`gsm8k`, `math`, ...).
    pub fn name(&self) -> &'static str {
        match self {
            VerifierConfig::Gsm8k { .. } => "gsm8k",
            VerifierConfig::Math {} => "math",
            VerifierConfig::Countdown {} => "countdown",
            VerifierConfig::Arithmetic { .. } => "arithmetic",
            VerifierConfig::External { .. } => "external",
            VerifierConfig::Python { .. } => "python",
            VerifierConfig::Verl { .. } => "verl",
            VerifierConfig::Judge(_) => "judge",
            VerifierConfig::RewardModel(_) => "reward_model",
        }
    }
}

/// One weighted component (`[[reward.components]]`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ComponentConfig {
    /// Name in the metrics (`reward/<name>/mean`, `reward/<name>/share`), distinct per component.
    /// Default: a `python` verifier's function name (`accuracy_reward` for
    /// `my_rewards.py:accuracy_reward`, as TRL names its reward columns), else the verifier's kind
    /// (`verl` for a verl verifier).
    #[serde(default)]
    pub name: Option<String>,
    /// Weight in the sum, finite with |weight| ≤ 1e6. Default 1.
    #[serde(default = "default_weight")]
    pub weight: f64,
    /// The verifier, an inline table with the keys of `data.verifier` (its `kind` and that kind's
    /// keys). Required.
    pub verifier: VerifierConfig,
}

impl ComponentConfig {
    /// The component's name: `name`, else a `python` verifier's function name (the part of
    /// `FILE.py:NAME` after the last `:`), else the verifier's kind ([`VerifierConfig::name`]).
    pub fn resolved_name(&self) -> String {
        if let Some(n) = &self.name {
            return n.clone();
        }
        match &self.verifier {
            VerifierConfig::Python { function, .. } => match function.rsplit_once(':') {
                Some((_, f)) if !f.is_empty() => f.to_string(),
                _ => "python".into(),
            },
            v => v.name().to_string(),
        }
    }
}

/// `e` for two components named `name`, saying where a default name came from.
fn duplicate_name(name: &str, c: &ComponentConfig) -> RewardError {
    let why = match (&c.name, &c.verifier) {
        (Some(_), _) => String::new(),
        (None, VerifierConfig::Python { .. }) => " (by default, its function's name)".into(),
        (None, _) => " (by default, the verifier's kind)".into(),
    };
    RewardError::Config(format!(
        "two components are named `{name}`{why}: give each a distinct `name`"
    ))
}

/// The `[reward]` config table.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RewardConfig {
    /// Components of the reward, one `[[reward.components]]` table each: reward = Σ weight ·
    /// the component's reward, plus the format term; `accuracy` is the first component's
    /// correctness. Empty: the task's verifier (`data.verifier`) with weight 1. Default empty.
    pub components: Vec<ComponentConfig>,
    /// The format reward (`[reward.format]`): `bonus` when the completion is exactly
    /// `<think>…</think><answer>…</answer>`, else `penalty`; logged apart and never part of
    /// `accuracy`. Off when the table is absent.
    pub format: Option<FormatReward>,
}

impl RewardConfig {
    /// Checks the table without building a verifier: every component's weight finite with
    /// |weight| ≤ [`MAX_REWARD_WEIGHT`], distinct names, each verifier's settings
    /// ([`VerifierConfig::check`]), the format reward's `bonus` and `penalty` finite within the
    /// same bound.
    ///
    /// # Errors
    /// [`RewardError::Config`] naming the key (`reward.components[1].weight`,
    /// `reward.format.bonus`), the value and the allowed range.
    pub fn check(&self) -> Result<(), RewardError> {
        let mut names: Vec<String> = Vec::new();
        for (i, c) in self.components.iter().enumerate() {
            let key = format!("reward.components[{i}]");
            check_weight(&format!("{key}.weight"), c.weight)?;
            c.verifier.check(&format!("{key}.verifier"))?;
            let name = c.resolved_name();
            if names.contains(&name) {
                return Err(duplicate_name(&name, c));
            }
            names.push(name);
        }
        if let Some(f) = &self.format {
            check_weight("reward.format.bonus", f.bonus)?;
            check_weight("reward.format.penalty", f.penalty)?;
        }
        Ok(())
    }
}

/// A built reward function.
pub struct RewardFunction {
    components: Vec<(String, f64, Box<dyn Verifier>)>,
    format: Option<FormatReward>,
    /// Per component, the warning about its first reward that is not finite or exceeds
    /// [`MAX_REWARD_WEIGHT`] in magnitude (set, and printed on stderr, once per function).
    warned: Vec<std::sync::OnceLock<String>>,
}

/// The reward of one completion with its parts.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RewardBreakdown {
    /// Total: weighted component sum plus the format term.
    pub reward: f64,
    /// Correctness as judged by the first component (format excluded).
    pub correct: bool,
    /// The format term, `None` when the format reward is off.
    pub format: Option<f64>,
    /// Each component's name and raw (unweighted) reward, in config order.
    pub components: Vec<(String, f64)>,
    /// The first component's extracted answer.
    pub extracted: Option<String>,
    /// The first component's gold answer.
    pub gold: Option<String>,
    /// Each component's extra numbers ([`crate::Score::extra`]: an external program's `extra`,
    /// a verl function's numeric keys besides `score`), in config order as `components` (empty
    /// for the built-in verifiers); logged as `reward/<component>/<key>/mean`.
    pub extra: Vec<std::collections::BTreeMap<String, f64>>,
}

impl RewardFunction {
    /// Builds from config; with no components, `default` (the task's verifier) is used with weight 1.
    ///
    /// # Errors
    /// [`RewardError::Config`] for a non-finite weight, a duplicate name or a bad verifier config.
    pub fn from_config(
        config: &RewardConfig,
        default: &VerifierConfig,
    ) -> Result<Self, RewardError> {
        let fallback = [ComponentConfig {
            name: None,
            weight: 1.0,
            verifier: default.clone(),
        }];
        let list = if config.components.is_empty() {
            &fallback[..]
        } else {
            &config.components[..]
        };
        let mut components: Vec<(String, f64, Box<dyn Verifier>)> = Vec::new();
        for c in list {
            let name = c.resolved_name();
            check_weight(&format!("reward component `{name}`: weight"), c.weight)?;
            if components.iter().any(|(n, _, _)| *n == name) {
                return Err(duplicate_name(&name, c));
            }
            components.push((name, c.weight, c.verifier.build()?));
        }
        if let Some(f) = &config.format {
            check_weight("reward.format.bonus", f.bonus)?;
            check_weight("reward.format.penalty", f.penalty)?;
        }
        Ok(RewardFunction::new(components, config.format))
    }

    /// A reward function from already built parts.
    pub fn new(
        components: Vec<(String, f64, Box<dyn Verifier>)>,
        format: Option<FormatReward>,
    ) -> Self {
        let warned = components
            .iter()
            .map(|_| std::sync::OnceLock::new())
            .collect();
        RewardFunction {
            components,
            format,
            warned,
        }
    }

    /// The warnings given so far, one per component at most: a verifier returned a reward that is
    /// not finite or whose magnitude exceeds [`MAX_REWARD_WEIGHT`] (each was printed on stderr
    /// when it first happened; the reward is kept as it is: a non-finite one makes the step's
    /// update skipped).
    pub fn warnings(&self) -> Vec<String> {
        self.warned
            .iter()
            .filter_map(|w| w.get().cloned())
            .collect()
    }

    /// Warns once per component about a reward that is not finite or exceeds
    /// [`MAX_REWARD_WEIGHT`] in magnitude.
    fn check_reward(&self, k: usize, reward: f64) {
        if reward.is_finite() && reward.abs() <= MAX_REWARD_WEIGHT {
            return;
        }
        let name = &self.components[k].0;
        let mut first = false;
        let msg = self.warned[k].get_or_init(|| {
            first = true;
            format!(
                "warning: verifier `{name}` returned a reward of {}, which is not a finite \
                 number of magnitude ≤ {MAX_REWARD_WEIGHT:e}: the statistics and advantages of its \
                 batch are not meaningful (a non-finite reward skips the update); warned once per \
                 run",
                show(reward)
            )
        });
        if first {
            eprintln!("{msg}");
        }
    }

    /// Each component's name and weight, in config order (the order of
    /// [`RewardBreakdown::components`]).
    pub fn component_weights(&self) -> Vec<(String, f64)> {
        self.components
            .iter()
            .map(|(n, w, _)| (n.clone(), *w))
            .collect()
    }

    /// Sends `sample` alone through each component that `pick` accepts (by its index in config
    /// order), discarding the scores: a start-up probe of external programs before the model
    /// loads, so that a program that does not start, crashes or answers out of protocol is
    /// found at once. A persistent program stays up for the run.
    ///
    /// # Errors
    /// The first failing component's error, prefixed with its name and index.
    pub fn probe(
        &self,
        sample: &Sample<'_>,
        pick: impl Fn(usize) -> bool,
    ) -> Result<(), RewardError> {
        for (k, (name, _, verifier)) in self.components.iter().enumerate() {
            if !pick(k) {
                continue;
            }
            verifier
                .score_batch(std::slice::from_ref(sample))
                .map_err(|e| {
                    RewardError::Config(format!("reward component `{name}` (#{k}): {e}"))
                })?;
        }
        Ok(())
    }

    /// Scores a batch (each component sees the whole batch: one process per batch for external ones).
    ///
    /// # Errors
    /// The first component error.
    pub fn score_batch(&self, samples: &[Sample<'_>]) -> Result<Vec<RewardBreakdown>, RewardError> {
        let mut out: Vec<RewardBreakdown> = samples
            .iter()
            .map(|s| {
                let format = self.format.map(|f| f.score(s.completion));
                RewardBreakdown {
                    reward: format.unwrap_or(0.0),
                    correct: false,
                    format,
                    components: Vec::with_capacity(self.components.len()),
                    extracted: None,
                    gold: None,
                    extra: Vec::with_capacity(self.components.len()),
                }
            })
            .collect();
        for (k, (name, weight, verifier)) in self.components.iter().enumerate() {
            let scores = verifier.score_batch(samples)?;
            for s in &scores {
                self.check_reward(k, s.reward);
            }
            for (b, s) in out.iter_mut().zip(scores) {
                b.reward += weight * s.reward;
                b.components.push((name.clone(), s.reward));
                b.extra.push(s.extra);
                if k == 0 {
                    b.correct = s.correct;
                    b.extracted = s.extracted;
                    b.gold = s.gold;
                }
            }
        }
        Ok(out)
    }
}

/// Batch means for logging: `("reward/<name>", mean raw reward)` per component, plus
/// `("reward/format", mean)` when the format reward is on. Empty input gives an empty list.
pub fn component_means(batch: &[RewardBreakdown]) -> Vec<(String, f64)> {
    let Some(first) = batch.first() else {
        return Vec::new();
    };
    let n = batch.len() as f64;
    let mut out: Vec<(String, f64)> = first
        .components
        .iter()
        .enumerate()
        .map(|(k, (name, _))| {
            let sum: f64 = batch.iter().map(|b| b.components[k].1).sum();
            (format!("reward/{name}"), sum / n)
        })
        .collect();
    if first.format.is_some() {
        let sum: f64 = batch.iter().filter_map(|b| b.format).sum();
        out.push(("reward/format".into(), sum / n));
    }
    out
}
