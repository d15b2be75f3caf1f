//! The one translation of the resolved config into each stage's settings and parts: the trainer's,
//! the explorer's (with its sampling parameters), the evaluator's, the rollout backend's, the
//! learning-rate schedule, and the reward function. `rlvr train`, `rlvr eval`, `rlvr sft` and the
//! quickstart all build their stages through these functions, so a key means the same thing in
//! every command.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use rlvr_data::config::{DataConfig, PromptStyle, Scoring};
use rlvr_data::generate::Split;
use rlvr_model::TokenizerBundle;
use rlvr_reward::combine::{RewardFunction, VerifierConfig};
use rlvr_rollout::SamplingParams;

use super::{RawConfig, ResolvedConfig, RolloutBackend, RolloutSection, TrainSection};
use crate::eval::{EvalSettings, Evaluator};
use crate::feed::backend::{BackendSettings, VllmSettings};
use crate::feed::explorer::ExplorerSettings;
use crate::feed::prompts::{model_positions, prepare_prompts};
use crate::update::{LrSchedule, TrainerSettings, UpdateSettings};

impl From<&TrainSection> for UpdateSettings {
    fn from(t: &TrainSection) -> Self {
        UpdateSettings {
            lr: t.lr,
            weight_decay: t.weight_decay,
            beta1: t.beta1,
            beta2: t.beta2,
            adam_eps: t.adam_eps,
            grad_clip: t.grad_clip,
            micro_batch_size: t.micro_batch_size,
            micro_batch_tokens: t.micro_batch_tokens,
            share_prompt: t.share_prompt,
            skip_zero_gradient_rows: t.skip_zero_gradient_rows,
            gradient_checkpointing: t.gradient_checkpointing,
            mini_batches: t.mini_batches,
            epochs: t.epochs,
        }
    }
}

impl From<&TrainSection> for LrSchedule {
    fn from(t: &TrainSection) -> Self {
        LrSchedule {
            lr: t.lr,
            min_lr: t.min_lr,
            warmup_steps: t.warmup_steps,
            schedule: t.schedule,
            steps: t.steps,
        }
    }
}

/// Whether prompts of `data` are encoded with the tokenizer's added special tokens: plain prompts
/// are; chat prompts are rendered by the template, which writes them itself.
pub fn add_special_tokens(data: &DataConfig) -> bool {
    data.style == PromptStyle::Plain
}

/// The trainer's settings; `pad_id` fills its right-padded micro-batches.
pub fn trainer_settings(cfg: &ResolvedConfig, pad_id: u32) -> TrainerSettings {
    let c = &cfg.raw;
    TrainerSettings {
        algorithm: cfg.algorithm.clone(),
        train: (&c.train).into(),
        temperature: c.rollout.temperature,
        max_new_tokens: c.rollout.max_new_tokens,
        pad_id,
    }
}

/// The sampling parameters of `[rollout]`; the ids in `eos_ids` stop a completion (sorted and
/// deduplicated here).
pub fn sampling_params(r: &RolloutSection, eos_ids: &[u32]) -> SamplingParams {
    let mut stop_ids = eos_ids.to_vec();
    stop_ids.sort_unstable();
    stop_ids.dedup();
    SamplingParams {
        group_size: r.group_size,
        temperature: r.temperature,
        top_p: r.top_p,
        top_k: (r.top_k > 0).then_some(r.top_k),
        max_new_tokens: r.max_new_tokens,
        min_new_tokens: r.min_new_tokens,
        stop_ids,
        stop_strings: r.stop.clone(),
        max_batch_rows: r.max_batch_rows,
    }
}

/// The online explorer's settings (`eos_ids`: the policy tokenizer's EOS ids).
pub fn explorer_settings(cfg: &ResolvedConfig, eos_ids: &[u32]) -> ExplorerSettings {
    let c = &cfg.raw;
    ExplorerSettings {
        params: sampling_params(&c.rollout, eos_ids),
        prompts_per_step: c.data.prompts_per_step,
        seed: c.train.seed,
        dynamic_sampling: cfg.algorithm.dynamic_sampling,
        max_rounds: c.train.dynamic_sampling_max_rounds,
        short_batch: c.train.dynamic_sampling_short_batch,
        recompute_behaviour: c.train.recompute_behaviour,
        micro_batch_size: c.train.micro_batch_size,
        share_prompt: c.train.share_prompt,
        log_rollouts: c.train.log_rollouts,
    }
}

/// The evaluator's sampling settings: `[eval]`, with max new tokens defaulting to
/// `rollout.max_new_tokens` and the seed `train.seed`.
pub fn eval_settings(raw: &RawConfig) -> EvalSettings {
    EvalSettings {
        samples: raw.eval.samples,
        max_new_tokens: raw
            .eval
            .max_new_tokens
            .unwrap_or(raw.rollout.max_new_tokens),
        seed: raw.train.seed,
        max_batch_rows: raw.rollout.max_batch_rows,
        stop: raw.rollout.stop.clone(),
        add_special_tokens: add_special_tokens(&raw.data),
    }
}

/// What gives the rewards of `raw`'s completions: a program environment (`env.command`, or
/// `env.verifiers`' adapter), whose
/// `jsonl` rows then need no verifier ([`rlvr_data::config::DataConfig::scored_by_environment`]),
/// else the `[[reward.components]]` when there are any (no `data.verifier` needed either), else
/// the task's verifier; [`Scoring::Programs`] when those are all `external` or `python`
/// programs (which read the row's columns, so a `jsonl` row needs no answer field).
pub fn scoring(raw: &RawConfig) -> Scoring {
    let program = |v: &VerifierConfig| {
        matches!(
            v,
            VerifierConfig::External { .. } | VerifierConfig::Python { .. }
        )
    };
    let components = &raw.reward.components;
    match (!raw.env.is_program(), components.is_empty()) {
        (false, _) => Scoring::Environment,
        (true, false) if components.iter().all(|c| program(&c.verifier)) => Scoring::Programs,
        (true, false) => Scoring::Components,
        (true, true) if raw.data.verifier.as_ref().is_some_and(program) => Scoring::Programs,
        (true, true) => Scoring::Verifier,
    }
}

/// Whether `raw`'s rewards come from its program environment alone: `env.command` (or
/// `env.verifiers`) with a `jsonl` task that names no verifier (docs/environments.md, "Data without a verifier"). Nothing then
/// scores a single-turn completion: `train.eval_every` and `[reward]` are refused
/// ([`RawConfig::resolve`]) and `rlvr eval` needs `--env`.
pub fn env_gives_reward(raw: &RawConfig) -> bool {
    raw.data.scored_by_environment(scoring(raw))
}

/// The reward function of `[reward]`, over the task's verifier (`data.verifier`) when it lists
/// no component. A run builds it once and shares it between its explorer and its evaluator.
/// When the environment gives the rewards ([`env_gives_reward`]) it holds [`NoVerifier`], which
/// nothing calls (the explorer and `rlvr eval --env` take the episodes' rewards) and which
/// refuses, naming why, if anything does.
///
/// # Errors
/// Verifier configuration errors.
pub fn reward_function(raw: &RawConfig) -> anyhow::Result<RewardFunction> {
    if env_gives_reward(raw) {
        return Ok(RewardFunction::new(
            vec![("environment".into(), 1.0, Box::new(NoVerifier))],
            None,
        ));
    }
    // With components, the task's verifier is not part of the reward (a `jsonl` task need not
    // name one): the first component stands in for the default, which then goes unused.
    let mut default = match raw.reward.components.first() {
        Some(c) => c.verifier.clone(),
        None => raw.data.verifier()?,
    };
    // A verl function's `data_source` for rows without that column: the task's name.
    let task = raw.data.task.name();
    let mut reward = raw.reward.clone();
    for v in reward
        .components
        .iter_mut()
        .map(|c| &mut c.verifier)
        .chain(std::iter::once(&mut default))
    {
        v.default_data_source(task);
    }
    Ok(RewardFunction::from_config(&reward, &default)?)
}

/// The verifier of a run whose program environment gives every reward ([`env_gives_reward`]):
/// it has no answer to compare with, so scoring a single-turn completion is an error that says
/// so (the config checks keep every such path off: `train.eval_every`, `rlvr eval` without
/// `--env`).
pub struct NoVerifier;

impl rlvr_reward::Verifier for NoVerifier {
    fn score(
        &self,
        _: &rlvr_reward::Sample<'_>,
    ) -> Result<rlvr_reward::Score, rlvr_reward::RewardError> {
        Err(rlvr_reward::RewardError::Config(
            "no verifier to score a single-turn completion: this data.task = \"jsonl\" config \
             has no data.verifier, and its rewards come from the environment (env.command); \
             evaluate episodes (rlvr eval --env) or set data.verifier"
                .into(),
        ))
    }
}

/// The held-out evaluator: the `[data]` test split rendered with `tok` (its first `eval.limit`
/// problems), scored by `reward`, sampled as [`eval_settings`] says.
///
/// # Errors
/// Data and template errors; a prompt whose tokens plus the evaluation's max new tokens exceed
/// the model's positions (the config.json beside `tok`), naming its source and the key.
pub fn evaluator(
    raw: &RawConfig,
    tok: &TokenizerBundle,
    reward: Arc<RewardFunction>,
) -> anyhow::Result<Evaluator> {
    let mut p = prepare_prompts(&raw.data, Split::Test, tok, scoring(raw))?;
    if let Some(n) = raw.eval.limit {
        p.truncate(n);
    }
    check_gold_answers(raw, "Test", &p)?;
    let settings = eval_settings(raw);
    if let Some(positions) = model_positions(tok)? {
        let key = match raw.eval.max_new_tokens {
            Some(_) => "eval.max_new_tokens",
            None => "rollout.max_new_tokens",
        };
        let ids = p.encode(tok, settings.add_special_tokens)?;
        p.check_room(&ids, positions, settings.max_new_tokens, key)
            .map_err(|e| anyhow::anyhow!("[data] Test split: {e:#}"))?;
    }
    Ok(Evaluator {
        texts: p.texts,
        references: p.references,
        rows: p.rows,
        columns: p.columns,
        reward,
        settings,
        task: raw.data.task.name(),
    })
}

/// Every row of a split (`split`: `"Train"` or `"Test"`) scored by a built-in verifier that reads
/// its gold answer from the row's reference (`data.verifier`, the task's own, or a reward
/// component) has a usable one: a number for `gsm8k` and `arithmetic` (what
/// `rlvr_reward::gsm8k::gold_number` finds), a non-blank answer for `math`. Without it every
/// completion of the prompt would score 0, silently. (A `gsm8k` task file's `#### N` is checked
/// as it loads.) A split scored by a program environment alone has no verifier: nothing to check.
///
/// # Errors
/// The first row without a usable gold answer, naming its file, line and field and the verifier.
pub fn check_gold_answers(
    raw: &RawConfig,
    split: &str,
    p: &crate::feed::prompts::PreparedPrompts,
) -> anyhow::Result<()> {
    let verifiers: Vec<VerifierConfig> = if raw.reward.components.is_empty() {
        raw.data.verifier().ok().into_iter().collect()
    } else {
        raw.reward
            .components
            .iter()
            .map(|k| k.verifier.clone())
            .collect()
    };
    let (_, field) = raw.data.fields();
    for v in &verifiers {
        let unusable = |r: &str| match v {
            VerifierConfig::Gsm8k { .. } | VerifierConfig::Arithmetic { .. } => {
                r.trim().is_empty().then_some("is empty").or_else(|| {
                    rlvr_reward::gsm8k::gold_number(r)
                        .is_none()
                        .then_some("holds no number")
                })
            }
            VerifierConfig::Math {} => r.trim().is_empty().then_some("is empty"),
            _ => None,
        };
        let bad = p
            .references
            .iter()
            .enumerate()
            .find_map(|(i, r)| unusable(r).map(|why| (i, why, r)));
        if let Some((i, why, r)) = bad {
            let shown: String = r.chars().take(60).collect();
            anyhow::bail!(
                "[data] {split} split: {}: field `{field}` {why}{}: the {} verifier reads the gold \
                 answer from it, so every completion of this prompt would score 0; fill it in or \
                 drop the row",
                p.sources[i],
                if why == "is empty" { String::new() } else { format!(" ({shown:?})") },
                v.name()
            );
        }
    }
    Ok(())
}

/// The rollout backend `rollout.backend` names; vLLM versions go to `rollout.weights_dir`,
/// defaulting to `run_dir/vllm-weights`.
pub fn backend_settings(r: &RolloutSection, run_dir: &Path) -> BackendSettings {
    match r.backend {
        RolloutBackend::Native => BackendSettings::Native,
        RolloutBackend::Vllm => BackendSettings::Vllm(VllmSettings {
            servers: r.servers.clone(),
            served_model_name: r.served_model_name.clone(),
            weights_dir: r
                .weights_dir
                .clone()
                .unwrap_or_else(|| run_dir.join("vllm-weights")),
            api_key_env: r.api_key_env.clone(),
            request_timeout_s: r.request_timeout_s,
            retries: r.retries,
            in_flight: r.in_flight,
            accept_renormalised_logprobs: r.accept_renormalised_logprobs,
            refresh_tolerance: r.refresh_tolerance,
            cache_salt: r.cache_salt == super::CacheSalt::Version,
            follower: false,
            served_base: None,
        }),
    }
}

/// Loads the tokenizer of the model directory `dir` (the explorer and the offline source keep
/// their own copy: a tokenizer bundle is not `Clone`).
///
/// # Errors
/// Missing or malformed tokenizer files, naming `dir`.
pub fn load_tokenizer(dir: &Path) -> anyhow::Result<TokenizerBundle> {
    TokenizerBundle::load(dir)
        .with_context(|| format!("loading the tokenizer of {}", dir.display()))
}

/// The explorer's episode runner of a multi-turn run (`[env]`, docs/DESIGN.md section 14): the
/// environment (the program of `env.command`, started here and answering `hello`, or the
/// built-in `retry` over `reward`), the chat template of the bridges (`env.chat_template`, else
/// the model's) and the settings, with the end-of-turn token checked to be one token and a stop
/// id. `stderr_log`: a file the program's stderr is also written to (a training run's
/// `env.stderr`), else only its tail is kept for error messages.
///
/// # Errors
/// No chat template, an end-of-turn token that is not one token or not a stop id, `env.tools`
/// that do not parse, a program that does not start or answer `hello`, a log that cannot be
/// opened.
pub fn episode_runner(
    cfg: &RawConfig,
    tok: &TokenizerBundle,
    reward: &Arc<RewardFunction>,
    stderr_log: Option<PathBuf>,
) -> anyhow::Result<crate::feed::episodes::EpisodeRunner> {
    use crate::feed::episodes::{end_of_turn, parse_tools, EpisodeRunner, EpisodeSettings};
    use rlvr_env::json::Json;
    let e = &cfg.env;
    let to_json =
        |t: &toml::Table| -> anyhow::Result<Json> { Ok(Json::parse(&serde_json::to_string(t)?)?) };
    let source = match &e.chat_template {
        Some(p) => std::fs::read_to_string(p)
            .with_context(|| format!("reading env.chat_template {}", p.display()))?,
        None => tok.chat_template.clone().context(
            "[env] needs a chat template to render the environment's replies: the model has \
             none; set env.chat_template to a Jinja file (data/chat_templates/ has Qwen's and \
             Llama's)",
        )?,
    };
    let vars: Vec<(String, Json)> = match to_json(&e.template_kwargs)? {
        Json::Object(kv) => kv,
        _ => Vec::new(),
    };
    let template = rlvr_env::template::ChatTemplate::new(&source, vars)
        .context("env.chat_template (or the model's chat template)")?;
    if (e.tools.is_some() || e.tool_format != "none") && !template.reads_tools() {
        crate::log::say(
            "warning: the chat template (env.chat_template, or the model's) never reads `tools`, \
             so the model will not see the tool schemas; set env.chat_template to one that \
             prints them (data/chat_templates/qwen2_5.jinja for a ChatML tokenizer)",
        );
    }
    let eot = end_of_turn(tok, &source, e.end_of_turn.as_deref())?;
    anyhow::ensure!(
        tok.eos_ids.contains(&eot.1),
        "the end-of-turn token {:?} (id {}) is not one of the tokenizer's EOS ids {:?}, so a turn \
         would never end on it; set env.end_of_turn to one of them",
        eot.0,
        eot.1,
        tok.eos_ids
    );
    let mut specials: Vec<String> = if e.allow_special_tokens {
        Vec::new()
    } else {
        tok.tokenizer
            .get_added_tokens_decoder()
            .values()
            .map(|t| t.content.clone())
            .collect()
    };
    specials.sort();
    let settings = EpisodeSettings {
        max_turns: e.max_turns,
        episode_tokens: e.episode_tokens(cfg.rollout.max_new_tokens),
        max_observation_tokens: e.max_observation_tokens,
        truncation: e.observation_truncation.truncation(),
        tool_format: rlvr_env::tools::ToolFormat::parse(&e.tool_format)
            .map_err(anyhow::Error::msg)?,
        tools: e
            .tools
            .as_deref()
            .map(parse_tools)
            .transpose()
            .map_err(|m| anyhow::anyhow!("env.tools: {m}"))?,
        reward: rlvr_env::reward::RewardMode::parse(&e.reward).map_err(anyhow::Error::msg)?,
        max_error_frac: e.max_error_frac,
        end_of_turn: eot,
        specials: specials.clone(),
        turn_cache_bytes: usize::try_from(e.kv_cache_mib << 20).unwrap_or(usize::MAX),
        max_token_bytes: crate::feed::episodes::max_token_bytes(tok),
        max_prompt_tokens: model_positions(tok)?.unwrap_or(usize::MAX),
    };
    let env: Box<dyn rlvr_env::Environment> = match e.builtin.as_deref() {
        Some(_) => Box::new(rlvr_env::retry::RetryEnvironment::new(
            crate::feed::episodes::RetryVerifier {
                reward: reward.clone(),
            },
            e.max_turns,
            e.turn_discount,
        )?),
        None => {
            let (command, options) = e
                .program()?
                .context("[env] is on but names no environment program")?;
            let mut p = rlvr_env::client::ProcessSettings::new(command);
            p.dir = e.dir.clone();
            p.env = e.env.clone();
            p.timeout = std::time::Duration::from_secs_f64(e.timeout_s);
            p.restarts = e.restarts;
            p.options = options;
            // A reply line may hold each episode's largest acceptable observation, JSON-escaped
            // (× 2) with room for its keys: a batch of many large tool outputs is not refused
            // by the fixed 16 MiB, and a flood stays bounded by the batch.
            p.episode_reply_bytes = crate::feed::episodes::observation_byte_cap(
                e.max_observation_tokens,
                settings.max_token_bytes,
            )
            .saturating_mul(2)
            .saturating_add(4096);
            p.special_tokens = specials;
            p.max_turns = Some(e.max_turns);
            p.stderr_log = stderr_log;
            Box::new(
                rlvr_env::client::ProcessEnvironment::start(p).with_context(|| {
                    match &e.verifiers {
                        Some(id) => format!(
                            "starting the verifiers environment {id:?} (env.verifiers, with \
                             rlvr's adapter under {}; verifiers {} and {} are supported)",
                            e.python.as_deref().unwrap_or("python3"),
                            rlvr_env::verifiers::SUPPORTED_VERSION,
                            rlvr_env::verifiers::SUPPORTED_V1_VERSION
                        ),
                        None => "starting the environment (env.command)".to_string(),
                    }
                })?,
            )
        }
    };
    Ok(EpisodeRunner::new(env, template, settings))
}
