//! Fail fast (issue 48, item 4): everything `rlvr train` can check without the model's weights,
//! checked before they load. A bad data file, a prompt over the model's positions, a chat
//! template that does not render, a reward program that crashes or an environment that does not
//! answer `hello` is then reported in the time it takes to read the data and the tokenizer, not
//! after the weights loaded (seconds to minutes for a real model) and sampling began.
//!
//! What it reads: the tokenizer files and config.json of the policy's directory (the model's
//! `max_position_embeddings` and `vocab_size`; no weights), every data file of the run. What it
//! starts: each external reward program (`kind = "external"`, `"python"` and `"verl"`), sent
//! one probe item, and the environment of `env.command`, sent `hello` (DESIGN.md section 14;
//! never `reset`, which would change a stateful environment). Each error names what it names when found later (file,
//! line, field, key). The parts it builds are handed to the set-up, which would otherwise build
//! them after the weights: nothing is read, rendered, encoded or started twice.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use rlvr_data::generate::Split;
use rlvr_model::{ModelConfig, TokenizerBundle};
use rlvr_reward::combine::{RewardFunction, VerifierConfig};
use rlvr_reward::Sample;

use crate::config::settings;
use crate::config::ResolvedConfig;
use crate::eval::Evaluator;
use crate::feed::episodes::EpisodeRunner;
use crate::feed::prompts::{prepare_prompts, PreparedPrompts};
use crate::store::experience::{
    check_against_model, check_lengths, read_experience_lines, Experience,
};

/// What the checks built, for the set-up to use instead of building it again.
pub(super) enum Preflight {
    /// An online run.
    Online(Box<Online>),
    /// An offline run (`data.experiences`): the file's rows (line number, experience), already
    /// checked against config.json when `checked`.
    Offline {
        /// The rows.
        rows: Vec<(usize, Experience)>,
        /// Whether the lengths and token ids were checked against config.json (false when the
        /// policy directory has none, e.g. a PEFT adapter: checked after the model loads).
        checked: bool,
    },
}

/// An online run's parts, checked.
pub(super) struct Online {
    /// The explorer's tokenizer (the policy directory's).
    pub tokenizer: TokenizerBundle,
    /// The train split, rendered.
    pub train: PreparedPrompts,
    /// The train prompts' token ids.
    pub ids: Vec<Vec<u32>>,
    /// The reward function, its external programs probed.
    pub reward: Arc<RewardFunction>,
    /// The held-out evaluator (`train.eval_every` > 0), its test split rendered and checked.
    pub evaluator: Option<Evaluator>,
    /// The episode runner of `[env]`, its environment started and answering `hello`.
    pub runner: Option<EpisodeRunner>,
}

/// config.json of the policy directory `dir`, when it has one (a PEFT adapter directory has
/// none; its base's is read when the model loads).
///
/// # Errors
/// A config.json that does not parse or normalise, naming it.
fn model_config(dir: &Path) -> anyhow::Result<Option<(ModelConfig, PathBuf)>> {
    let p = dir.join("config.json");
    if !p.is_file() {
        return Ok(None);
    }
    let c = ModelConfig::from_file(&p).with_context(|| format!("reading {}", p.display()))?;
    Ok(Some((c, p)))
}

/// The verifiers of the reward function in its component order: `reward.components`' or, when
/// there are none, `data.verifier`'s; none when the environment gives the rewards
/// ([`settings::env_gives_reward`]).
fn verifiers(cfg: &ResolvedConfig) -> anyhow::Result<Vec<VerifierConfig>> {
    let c = &cfg.raw;
    Ok(if settings::env_gives_reward(c) {
        Vec::new()
    } else if c.reward.components.is_empty() {
        vec![c.data.verifier()?]
    } else {
        c.reward
            .components
            .iter()
            .map(|k| k.verifier.clone())
            .collect()
    })
}

/// Runs the checks of this module for the run `cfg` whose policy is in `policy_dir`, before the
/// model loads.
///
/// # Errors
/// The first problem, named as the later check would name it: `[data] Train split: FILE:LINE:
/// ...`, a prompt over config.json's `max_position_embeddings` with the key to lower, the external
/// program's failure with its component and the probe item's source, the environment's start-up
/// failure.
///
/// `env_log`: where the environment program's stderr is written in full (`RUN_DIR/env.stderr`).
pub(super) fn check(
    cfg: &ResolvedConfig,
    policy_dir: &Path,
    env_log: Option<PathBuf>,
) -> anyhow::Result<Preflight> {
    let c = &cfg.raw;
    check_input_paths(cfg, policy_dir)?;
    let model = model_config(policy_dir)?;
    if let Some(path) = &c.data.experiences {
        let rows = read_experience_lines(path)?;
        let checked = match &model {
            Some((mc, _)) => {
                check_lengths(&rows, path, mc.max_position_embeddings)?;
                if let Some(w) = check_against_model(&rows, path, mc.vocab_size)? {
                    crate::log::say(&format!("warning: {w}"));
                }
                true
            }
            None => false,
        };
        return Ok(Preflight::Offline { rows, checked });
    }
    let tokenizer = settings::load_tokenizer(policy_dir)?;
    let train = prepare_prompts(&c.data, Split::Train, &tokenizer, settings::scoring(c))?;
    settings::check_gold_answers(c, "Train", &train)?;
    let ids = train
        .encode(&tokenizer, settings::add_special_tokens(&c.data))
        .context("encoding train prompts")?;
    if let Some((mc, _)) = &model {
        let (room, key) = room(cfg);
        train
            .check_room(&ids, mc.max_position_embeddings, room, key)
            .map_err(|e| anyhow::anyhow!("[data] Train split: {e:#}"))?;
    }
    let reward = Arc::new(settings::reward_function(c)?);
    probe_external(cfg, &reward, &train)?;
    let evaluator = if c.train.eval_every > 0 {
        Some(settings::evaluator(c, &tokenizer, reward.clone())?)
    } else {
        None
    };
    let runner = if c.env.is_on() {
        Some(settings::episode_runner(c, &tokenizer, &reward, env_log)?)
    } else {
        None
    };
    Ok(Preflight::Online(Box::new(Online {
        tokenizer,
        train,
        ids,
        reward,
        evaluator,
        runner,
    })))
}

/// Every input path the run will read exists: `model.path` (when the policy is loaded from it,
/// not from a checkpoint), `model.reference` (when the KL term loads it), `data.experiences`, else `data.train`, and
/// `data.test` when the run evaluates.
///
/// # Errors
/// The first missing one, naming its key, the path it resolved to and where the key was written
/// (the file's line or the `--set`), with the rule that resolved it: a config file's input paths
/// are relative to the file's directory (a config copied elsewhere without its data names files
/// beside the copy), `--set` values to the working directory.
fn check_input_paths(cfg: &ResolvedConfig, policy_dir: &Path) -> anyhow::Result<()> {
    let c = &cfg.raw;
    let mut inputs: Vec<(&str, &Path)> = Vec::new();
    if policy_dir == c.model.path.as_path() {
        inputs.push(("model.path", &c.model.path));
    }
    if let (Some(p), true) = (&c.model.reference, cfg.algorithm.needs_reference()) {
        inputs.push(("model.reference", p));
    }
    match &c.data.experiences {
        Some(p) => inputs.push(("data.experiences", p)),
        None => {
            if let Some(p) = &c.data.train {
                inputs.push(("data.train", p));
            }
            if let (Some(p), true) = (&c.data.test, c.train.eval_every > 0) {
                inputs.push(("data.test", p));
            }
        }
    }
    if c.env.is_on() {
        let (e, program) = (&c.env, c.env.is_program());
        let keys = [("env.chat_template", &e.chat_template), ("env.dir", &e.dir)];
        for (key, p) in keys {
            // env.dir: the program's working directory (the retry environment has none).
            if let (Some(p), true) = (p, key != "env.dir" || program) {
                inputs.push((key, p));
            }
        }
    }
    let origin = |key: &str| {
        c.written
            .iter()
            .rev()
            .find(|w| w.key == key)
            .map_or_else(String::new, |w| format!(" (written in {})", w.origin))
    };
    let program_key = match c.env.verifiers {
        Some(_) => "env.python",
        None => "env.command",
    };
    check_env_program(c, program_key, &origin(program_key))?;
    for (key, path) in inputs {
        if path.as_os_str().is_empty() || path.exists() {
            continue;
        }
        let at = origin(key);
        // A model path written like a Hub id: rlvr downloads nothing, and how to get it.
        let hub = match key.starts_with("model.") {
            true => crate::store::hub::missing_model_hint(path).map(|h| format!("; {h}")),
            false => None,
        };
        anyhow::bail!(
            "{key} = {}: no such file or directory{at}; input paths in a config file are \
             relative to that file's directory (a config copied elsewhere names files beside \
             the copy), `--set` values to the working directory{}",
            path.display(),
            hub.unwrap_or_default()
        );
    }
    Ok(())
}

/// `env.command`'s program (`key`; for `env.verifiers` the interpreter `env.python`, default
/// `python3`) can be started: a path (a word with a `/`, made absolute against the config file's
/// directory) names an existing file, and a bare name is found on `PATH`. A bare name that is
/// not on `PATH` but is a file in the program's directory (`env.dir`) is the usual slip
/// (`["my_env.py"]`): the error gives the two fixes. `origin`: where `key` was written
/// (` (written in FILE line N)`), or empty.
///
/// # Errors
/// The program that cannot be found, naming `key`, the path and where it was written.
fn check_env_program(c: &crate::config::RawConfig, key: &str, origin: &str) -> anyhow::Result<()> {
    let program = match &c.env.verifiers {
        Some(_) => c.env.python.as_deref().unwrap_or("python3"),
        None => c.env.command.first().map_or("", String::as_str),
    };
    if program.is_empty() {
        return Ok(());
    }
    let path = Path::new(program);
    if program.contains('/') {
        if !path.exists() {
            anyhow::bail!(
                "{key}: the program {}: no such file or directory{origin}; input paths \
                 in a config file are relative to that file's directory, `--set` values to the \
                 working directory",
                path.display()
            );
        }
        return Ok(());
    }
    let on_path = std::env::var_os("PATH")
        .is_some_and(|v| std::env::split_paths(&v).any(|d| d.join(path).is_file()));
    if on_path {
        return Ok(());
    }
    let beside = c.env.dir.as_deref().map(|d| d.join(path));
    match beside.filter(|b| b.is_file()) {
        Some(b) => anyhow::bail!(
            "{key}: the program `{program}` is not on PATH{origin}; a bare name is looked \
             up on PATH, not in the config file's directory, where {} is: write \
             [\"./{program}\", ...] for an executable file there (with a #! line), or name its \
             interpreter first ([\"python3\", \"{program}\", ...])",
            b.display()
        ),
        None => anyhow::bail!(
            "{key}: the program `{program}` is not on PATH{origin}; name an installed \
             program (`python3`, `node`) or a file by its path (`./my_env.py`, relative to the \
             config file's directory)"
        ),
    }
}

/// The room each train prompt needs after it, and the key it comes from: a whole episode's
/// tokens in a multi-turn run, else `rollout.max_new_tokens`.
pub(super) fn room(cfg: &ResolvedConfig) -> (usize, &'static str) {
    let c = &cfg.raw;
    if c.env.is_on() {
        (
            c.env.episode_tokens(c.rollout.max_new_tokens),
            "env.max_episode_tokens",
        )
    } else {
        (c.rollout.max_new_tokens, "rollout.max_new_tokens")
    }
}

/// Sends the first train prompt, with an empty completion, through each external reward program
/// (`kind = "external"`, `"python"` and `"verl"`), one item alone.
///
/// # Errors
/// The program's failure, naming the component and its config key and the probe item's source.
fn probe_external(
    cfg: &ResolvedConfig,
    reward: &RewardFunction,
    train: &PreparedPrompts,
) -> anyhow::Result<()> {
    let external: Vec<bool> = verifiers(cfg)?
        .iter()
        .map(|v| v.command().is_some())
        .collect();
    if !external.contains(&true) || train.texts.is_empty() {
        return Ok(());
    }
    let sample = Sample {
        prompt: &train.texts[0],
        completion: "",
        reference: &train.references[0],
        columns: &train.columns[0],
        index: Some(train.rows[0]),
    };
    // One component at a time, so that the error names the failing one's key.
    for (i, _) in external.iter().enumerate().filter(|(_, e)| **e) {
        let key = if cfg.raw.reward.components.is_empty() {
            "data.verifier".to_string()
        } else {
            format!("reward.components[{i}].verifier")
        };
        reward.probe(&sample, |k| k == i).with_context(|| {
            format!(
                "{key}: the external reward program failed the start-up probe (the first train \
                 prompt, {}, with an empty completion), before the model loaded",
                train.sources[0]
            )
        })?;
    }
    Ok(())
}
