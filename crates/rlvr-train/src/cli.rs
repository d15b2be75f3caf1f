//! Command-line front ends: `rlvr train`, `rlvr sft`, `rlvr eval`, `rlvr generate`, `rlvr plan`
//! and `rlvr plot` (DESIGN.md section 10). Each has a clap `Args` struct and a `run` function; the
//! `rlvr` binary dispatches to them. A front end loads the config, builds its stages through
//! [`crate::config::settings`] and hands them over; none holds logic of its own beyond its flags.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use anyhow::{bail, Context};
use rlvr_data::config::{PromptStyle, TaskKind};
use rlvr_model::checkpoint::Policy;
use rlvr_model::optim::AdamWConfig;
use rlvr_model::{ComputeDtype, DeviceSpec};

use crate::config::plan::{parse_size, plan_ranks, suggestions, with_data_prompt_len, write_table};
use crate::config::{settings, RawConfig, ResolvedConfig, RolloutSection, Schedule};
use crate::eval::{EvalItem, EvalResult, Evaluator};
use crate::feed::backend::{
    self, BackendSettings, NativeWeights, ServerUse, VllmSettings, Workload,
};
use crate::feed::episodes::EpisodeRunner;
use crate::job::Job;
use crate::run::{signals, train, RunOptions};
use crate::sft::{pairs_from_config, read_pairs, train_sft_on, SftSettings, StopRule};
use crate::update::LrSchedule;

/// `rlvr train`.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct TrainArgs {
    /// TOML config file (optional: defaults plus `--set` overrides also work).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Override one key, e.g. `--set train.lr=1e-6` (value parsed as TOML, else a string). Repeatable.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// Continue the run in RUN_DIR from its latest checkpoint (reads RUN_DIR/config.toml; `--set`
    /// still applies on top).
    #[arg(long, value_name = "RUN_DIR", conflicts_with = "config")]
    pub resume: Option<PathBuf>,
    /// Never draw the progress bar.
    #[arg(long)]
    pub no_progress: bool,
    /// Print the resolved config (what `RUN_DIR/config.toml` would hold) and exit without
    /// training. `rlvr lab` uses it to tell whether a finished run still matches its sweep.
    #[arg(long)]
    pub print_config: bool,
}

/// Runs `rlvr train`. Prints one JSON summary line to `out`; a run interrupted by SIGINT/SIGTERM/SIGHUP
/// then exits the process with 130/143/129.
///
/// # Errors
/// Config, data, model and I/O errors.
pub fn run_train(a: &TrainArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let cfg = match &a.resume {
        Some(dir) => {
            let mut c = ResolvedConfig::from_run_dir(dir, &a.set)?;
            c.raw.output.dir = dir.clone();
            c
        }
        None => RawConfig::load(a.config.as_deref(), &a.set)?.resolve()?,
    };
    if a.print_config {
        write!(out, "{}", cfg.to_toml()?)?;
        return Ok(());
    }
    cfg.check_runnable()?;
    let stop = Arc::new(AtomicBool::new(false));
    // SIGINT/SIGTERM/SIGHUP: save after the current step and stop.
    signals::install(stop.clone());
    let s = train(
        &cfg,
        &RunOptions {
            resume: a.resume.is_some(),
            progress: !a.no_progress,
            stop,
            hang_after_step: None,
            fail_update_at_step: None,
            fail_eval_at: None,
        },
    );
    // A run asked to stop by a signal that then ended with an error (an environment or a
    // verifier that failed while the last step finished) still exits with the signal's code, so
    // that `rlvr train ... && rlvr eval ...` does not go on; the error is said first.
    let s = match s {
        Err(e) if signals::received().is_some() => {
            let _ = out.flush();
            eprintln!("error: {e:#}");
            signals::exit_if_interrupted(true, out);
            return Err(e);
        }
        s => s?,
    };
    // Data parallel, rank 0 prints the summary.
    if rlvr_dist::env::from_process_env()?.rank != 0 {
        return Ok(());
    }
    writeln!(
        out,
        "{}",
        serde_json::json!({
            "run_dir": s.run_dir,
            "steps": s.steps,
            "interrupted": s.interrupted,
            "checkpoint": s.last_checkpoint,
        })
    )?;
    // An interrupted run exits 128 + the signal (130 for SIGINT, 143 for SIGTERM, 129 for SIGHUP).
    signals::exit_if_interrupted(s.interrupted, out);
    Ok(())
}

/// `rlvr eval`.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct EvalArgs {
    /// Model directory (e.g. RUN_DIR/checkpoints/step-N).
    #[arg(long)]
    pub model: PathBuf,
    /// Training config whose `[data]` (task, test file, template) and `[reward]` are used.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Config overrides (`--set data.test=...`).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// Task (without `--config`): gsm8k, math500, countdown, arithmetic, jsonl.
    #[arg(long)]
    pub task: Option<String>,
    /// Held-out data file (sets `data.test`).
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Samples per problem: 1 = greedy, > 1 = temperature 1 (mean@k, pass@k). Default: the
    /// config's eval.samples (1).
    #[arg(long)]
    pub n: Option<usize>,
    /// First N problems only. Default: the config's eval.limit (all).
    #[arg(long)]
    pub limit: Option<usize>,
    /// Most new tokens. Default: the config's eval.max_new_tokens, else its
    /// rollout.max_new_tokens.
    #[arg(long)]
    pub max_new_tokens: Option<usize>,
    /// Sampling seed (n > 1).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Per-item results (JSONL).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Compute dtype: auto, f32, bf16, f16 or f64 (default: the config's model.dtype, else auto:
    /// bf16 on a GPU, f32 on the CPU).
    #[arg(long)]
    pub dtype: Option<String>,
    /// Device: auto, cpu, cuda or cuda:N (default: the config's model.device, else auto: the GPU
    /// when this build has CUDA and one is visible, else the CPU).
    #[arg(long)]
    pub device: Option<String>,
    /// With `rollout.backend = "vllm"`: use servers leased to another process (a training run)
    /// anyway. The evaluated model is pushed over that run's weights, and the run stops at its
    /// next weight check. Without it such servers are refused, naming the run.
    #[arg(long)]
    pub share_server: bool,
    /// Evaluate multi-turn episodes of the config's `[env]` (docs/environments.md): each
    /// sample is an episode (turn 1 as a single-turn sample, later turns after the environment's
    /// replies); correct when the episode's reward is above 0 (a failed episode scores 0; more
    /// than `env.max_error_frac` failed in a batch stop the evaluation, as in training); `--out`
    /// items carry `episode` (turns, turn rewards, finish, transcript). A program environment's
    /// rewards need no verifier (a `jsonl` task without `data.verifier`). Without it a config's
    /// `[env]` is ignored and one turn is evaluated, as during training.
    #[arg(long)]
    pub env: bool,
    /// With `--env` and a program environment (`env.command`): the file its whole stderr is
    /// written to (replaced at start, at most 64 MiB; named in the error when the environment
    /// fails). Default: `OUT.env.stderr` beside `--out OUT`, else `rlvr-eval.env.stderr` in the
    /// working directory.
    #[arg(long, value_name = "FILE", requires = "env")]
    pub env_log: Option<PathBuf>,
}

/// Runs `rlvr eval`: prints `{"task", "n", "accuracy", "mean@k", "pass@k"}`.
///
/// # Errors
/// Model, data and verifier errors.
pub fn run_eval(a: &EvalArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    remove_killed_commands_leftovers(a.out.as_deref());
    if let Some(p) = &a.out {
        probe_writable(p, "--out")?;
    }
    for (flag, v) in [
        ("--n", a.n),
        ("--limit", a.limit),
        ("--max-new-tokens", a.max_new_tokens),
    ] {
        anyhow::ensure!(v != Some(0), "{flag} 0: must be at least 1");
    }
    let max = crate::config::MAX_EVAL_SAMPLES;
    if let Some(n) = a.n {
        anyhow::ensure!(
            n <= max,
            "--n {n} is out of range: at most {max} samples per problem"
        );
    }
    if let Some(n) = a.max_new_tokens {
        let max = crate::config::MAX_NEW_TOKENS;
        anyhow::ensure!(
            n <= max,
            "--max-new-tokens {n} is out of range: at most {max}"
        );
    }
    let mut sets = a.set.clone();
    if let Some(t) = &a.task {
        sets.push(format!("data.task=\"{t}\""));
    }
    let mut raw = RawConfig::load(a.config.as_deref(), &sets)?;
    // --dtype/--device win; else the config's [model] (defaults f32 on the CPU).
    let dtype = match &a.dtype {
        Some(s) => s.parse::<ComputeDtype>().context("--dtype")?,
        None => raw.model.dtype,
    };
    let device = match &a.device {
        Some(s) => s.parse::<DeviceSpec>().context("--device")?,
        None => raw.model.device,
    };
    let device = match device {
        DeviceSpec::Auto => crate::config::auto_device()?.0,
        d => d,
    };
    let dtype = dtype.for_device(device);
    let device = device
        .open()
        .with_context(|| format!("device {device} (--device, else model.device)"))?;
    let dtype = dtype.dtype();
    // A checkpoint with a manifest: every file as it was written (sizes, CRC-32C).
    let model_dir = crate::store::checkpoint::resolve_model_dir(&a.model)?;
    crate::store::manifest::check_model_dir(&model_dir, "evaluate")?;
    let policy = Policy::load(&a.model, dtype, &device)
        .with_context(|| format!("loading {}", a.model.display()))?;
    if a.config.is_none() {
        // No training config: the model's chat template when it has one.
        raw.data.style = if policy.tokenizer.chat_template.is_some() {
            PromptStyle::Chat
        } else {
            PromptStyle::Plain
        };
    }
    if let Some(d) = &a.data {
        raw.data.test = Some(d.clone());
    }
    no_test_data_help(&raw, a, &model_dir)?;
    if raw.data.task == TaskKind::Jsonl
        && raw.data.verifier.is_none()
        && raw.reward.components.is_empty()
    {
        // A program environment gives the rewards of its episodes: no verifier needed.
        match (a.env, !raw.env.is_program(), raw.env.builtin.is_some()) {
            (true, false, _) => {}
            (false, false, _) => anyhow::bail!(
                "this data.task = \"jsonl\" config has no data.verifier: its rewards come from \
                 the environment (env.command), so only episodes can be evaluated: add --env (or \
                 set data.verifier to score single turns)"
            ),
            (true, true, true) => anyhow::bail!(
                "--env with env.builtin = \"retry\": the retry environment scores each turn \
                 with the task's verifier, and this data.task = \"jsonl\" names none (--set \
                 'data.verifier={{ kind = \"math\" }}')"
            ),
            _ => anyhow::bail!(
                "--task jsonl needs data.verifier (--set 'data.verifier={{ kind = \"math\" }}')"
            ),
        }
    }
    // A flag given replaces the config's [eval] key; one left out keeps the config's value (a
    // run's config.toml evaluates as the run did); the seed is --seed's.
    if let Some(n) = a.n {
        raw.eval.samples = n;
    }
    raw.eval.samples = raw.eval.samples.max(1);
    if a.limit.is_some() {
        raw.eval.limit = a.limit;
    }
    if a.max_new_tokens.is_some() {
        raw.eval.max_new_tokens = a.max_new_tokens;
    }
    let reward = Arc::new(settings::reward_function(&raw)?);
    let mut evaluator = settings::evaluator(&raw, &policy.tokenizer, reward)?;
    evaluator.settings.seed = a.seed;
    if evaluator.texts.is_empty() {
        anyhow::bail!(
            "the {} test split has no problem (check data.test / --data and data.max_prompt_len)",
            raw.data.task.name()
        );
    }
    let use_ = ServerUse::Fixed {
        command: "rlvr eval",
        share: a.share_server,
    };
    anyhow::ensure!(
        !a.env || raw.env.is_on(),
        "--env: no environment to evaluate in: set env.command or env.builtin (in --config or \
         with --set 'env.builtin=\"retry\"')"
    );
    let env_log = env_log_path(
        &raw,
        a.env,
        a.env_log.as_deref(),
        a.out.as_deref(),
        "rlvr-eval.env.stderr",
    )?;
    // The per-turn limit is the evaluation's, and so is the default episode budget.
    raw.rollout.max_new_tokens = evaluator.settings.max_new_tokens;
    let mut runner = match a.env {
        true => Some(
            settings::episode_runner(&raw, &policy.tokenizer, &evaluator.reward, env_log.clone())
                .map_err(|e| name_env_log(e, env_log.as_deref()))?,
        ),
        false => None,
    };
    let episode_tokens = raw.env.episode_tokens(evaluator.settings.max_new_tokens);
    let mut items = Vec::new();
    let mut env_stats = crate::feed::episodes::EnvStats::default();
    let result = eval_on_backend(
        &raw.rollout,
        &evaluator,
        (&policy, &a.model),
        &use_,
        runner
            .as_mut()
            .map(|r| (r, raw.env.builtin.is_some(), episode_tokens)),
        (&mut items, &mut env_stats),
    )
    .map_err(|e| name_env_log(e, env_log.as_deref()));
    let r = match (result, &a.out) {
        (Ok(r), _) => r,
        // What was evaluated before the failure is kept: the evaluation runs in chunks of
        // problems (`rollout.max_batch_rows` rows), so a verifier or an environment that fails
        // at the last one loses no finished item. Each kept line says `"partial": true`.
        (Err(e), Some(path)) if !items.is_empty() => {
            let problems = items.iter().map(|it| it.index + 1).max().unwrap_or(0);
            return Err(match write_items(path, &items, true) {
                Ok(()) => e.context(format!(
                    "the evaluation failed after {} of {} problems: their {} items are in {}, \
                     each marked \"partial\": true (no summary: the evaluation is incomplete)",
                    problems,
                    evaluator.texts.len(),
                    items.len(),
                    path.display()
                )),
                Err(we) => e.context(format!(
                    "the evaluation failed after {problems} problems, and writing their items \
                     failed too: {we:#}"
                )),
            });
        }
        (Err(e), _) => return Err(e),
    };
    if let Some(path) = &a.out {
        write_items(path, &items, false)?;
    }
    let mut summary = serde_json::json!({
        "task": r.task,
        "n": r.n,
        "accuracy": r.accuracy,
        "mean@k": r.mean_at_k,
        "pass@k": r.pass_at_k,
    });
    if let Some(m) = summary.as_object_mut() {
        m.extend(crate::eval::reward_summary(&items));
        if a.env {
            m.extend(episode_summary(&items, &env_stats, raw.env.max_turns));
        }
    }
    writeln!(out, "{summary}")?;
    Ok(())
}

/// What `rlvr eval --env`'s episodes did, under the names training's metrics.jsonl gives them
/// (docs/environments.md), after [`crate::eval::reward_summary`]'s `reward/mean` (the episodes'
/// reward, over those the environment did not fail; null when it failed all): every `env/*`
/// metric of a training step, computed by the same code ([`crate::run::report::env_metrics`]) over the evaluation's
/// episodes (`items`) and what the environment did while they ran (`env`, summed over the
/// evaluation's batches): `env/turns/{mean,min,max}`, `env/episode_len/mean`,
/// `env/error_frac`, `env/finish/<end>`, `env/tool_calls`, `env/tool_call_errors`,
/// `env/restarts`, `env/replayed`, `env/obs_truncated`, `env/closed`, `env/metrics/<name>/mean`
/// (over the episodes the environment did not fail that carry the metric) and per turn index k up to
/// `max_turns`
/// (`env.max_turns`) `env/turn_k/{reached,tokens/mean,reward/mean}`. Not `time/env_s` (a
/// duration: the summary depends only on the model, the data, the seed and the environment).
/// `accuracy` alone says only how many earned a reward above 0.
pub fn episode_summary(
    items: &[EvalItem],
    env: &crate::feed::episodes::EnvStats,
    max_turns: u32,
) -> Vec<(String, serde_json::Value)> {
    use crate::feed::turns::EpisodeTurns;
    let eps: Vec<(&EvalItem, &crate::eval::EpisodeRecord)> = items
        .iter()
        .filter_map(|it| it.episode.as_ref().map(|e| (it, e)))
        .collect();
    let masks: Vec<Vec<u8>> = eps.iter().map(|(_, e)| e.completion_mask()).collect();
    let turn_eps: Vec<EpisodeTurns<'_>> = eps
        .iter()
        .zip(&masks)
        .map(|((_, e), mask)| EpisodeTurns {
            mask,
            turns: e.turns,
            turn_rewards: &e.turn_rewards,
            scorable: e.error.is_none(),
        })
        .collect();
    let turns: Vec<f64> = eps.iter().map(|(_, e)| f64::from(e.turns)).collect();
    let lens: Vec<f64> = eps.iter().map(|(_, e)| e.completion_len() as f64).collect();
    let metrics: Vec<&rlvr_env::protocol::Metrics> = eps
        .iter()
        .filter(|(_, e)| e.error.is_none())
        .map(|(_, e)| &e.metrics)
        .collect();
    let mut out = Vec::new();
    for (k, v) in
        crate::run::report::env_metrics(&turn_eps, (&turns, &lens), env, &metrics, max_turns)
    {
        // As metrics.jsonl writes it: a value that is not finite is null.
        out.push((k, serde_json::json!(v.filter(|x| x.is_finite()))));
    }
    out
}

/// `rlvr eval` with nothing to evaluate on: a task read from a file (every one but the generated
/// `arithmetic` and `countdown`) and no `data.test`, e.g. `rlvr eval --model RUN` alone, whose
/// task is the default `gsm8k`. The error says which flag gives the problems, naming the run's
/// config.toml when `model_dir` is one of its checkpoints (a run directory's config is not read
/// unless given as `--config`).
///
/// # Errors
/// No test split, as above.
fn no_test_data_help(
    raw: &RawConfig,
    a: &EvalArgs,
    model_dir: &std::path::Path,
) -> anyhow::Result<()> {
    let generated = matches!(raw.data.task, TaskKind::Arithmetic | TaskKind::Countdown);
    if raw.data.test.is_some() || generated {
        return Ok(());
    }
    let task = raw.data.task.name();
    let whose = match (&a.task, &a.config) {
        (None, None) => format!("data.task = \"{task}\" (the default: no --task or --config)"),
        (Some(_), _) => format!("--task {task}"),
        (None, Some(c)) => format!("data.task = \"{task}\" of {}", c.display()),
    };
    let shipped = match raw.data.task {
        TaskKind::Gsm8k => " (the repository's: data/gsm8k/test.jsonl)",
        TaskKind::Math500 => " (the repository's: data/math500/test.jsonl)",
        _ => "",
    };
    // A checkpoint of a run (RUN/checkpoints/step-N): that run's config names its data.
    let run_config = model_dir
        .parent()
        .filter(|p| p.file_name().is_some_and(|n| n == "checkpoints"))
        .and_then(|p| p.parent())
        .map(|run| run.join("config.toml"))
        .filter(|c| c.is_file() && a.config.is_none());
    let config_hint = match run_config {
        Some(c) => format!(
            "--config {} (the run's own config, its data.test)",
            c.display()
        ),
        None => "--config FILE whose data.test names one".to_string(),
    };
    anyhow::bail!(
        "no held-out problems to evaluate on: {whose} reads them from a file and none is given; \
         add --data FILE (JSONL or Parquet){shipped}, or {config_hint}, or --task arithmetic or \
         --task countdown (generated problems)"
    )
}

/// Writes `rlvr eval --out`'s items, one JSON object a line, atomically (a reader or a kill sees
/// the old file or the whole new one). `partial`: the evaluation failed after these items, so
/// every line gets `"partial": true` (a complete evaluation's lines have no such key).
///
/// # Errors
/// Serialisation and I/O errors, naming the file.
fn write_items(path: &std::path::Path, items: &[EvalItem], partial: bool) -> anyhow::Result<()> {
    let mut s = String::new();
    for it in items {
        let line = serde_json::to_string(it)?;
        match (partial, line.strip_suffix('}')) {
            // The key after the item's own, which keep their order.
            (true, Some(open)) => {
                s.push_str(open);
                s.push_str(",\"partial\":true}");
            }
            _ => s.push_str(&line),
        }
        s.push('\n');
    }
    rlvr_rundir::fs::atomic_write(path, s.as_bytes())
        .with_context(|| format!("writing {}", path.display()))
}

/// The file `rlvr eval --env` or `rlvr generate --env` (`env`) writes a program environment's
/// whole stderr to, created empty here: `flag` (`--env-log`), else `out` + `.env.stderr` (beside
/// the output file), else `default` in the working directory. `None` without `--env` or for the
/// built-in `retry` environment (no program).
///
/// # Errors
/// `--env-log` with `env.builtin`; the file cannot be created, naming it.
fn env_log_path(
    raw: &RawConfig,
    env: bool,
    flag: Option<&std::path::Path>,
    out: Option<&std::path::Path>,
    default: &str,
) -> anyhow::Result<Option<PathBuf>> {
    if !env || !raw.env.is_program() {
        anyhow::ensure!(
            flag.is_none() || !env,
            "--env-log: env.builtin runs no program, so there is no stderr to log; remove it"
        );
        return Ok(None);
    }
    let path = match (flag, out) {
        (Some(p), _) => p.to_path_buf(),
        (None, Some(o)) => {
            let mut s = o.as_os_str().to_owned();
            s.push(".env.stderr");
            PathBuf::from(s)
        }
        (None, None) => PathBuf::from(default),
    };
    std::fs::File::create(&path).with_context(|| {
        format!(
            "{}: cannot be written for the environment's stderr (--env-log names another file)",
            path.display()
        )
    })?;
    Ok(Some(path))
}

/// `e` with the file holding the environment's whole stderr named, unless it already names it.
fn name_env_log(e: anyhow::Error, log: Option<&std::path::Path>) -> anyhow::Error {
    match log {
        Some(p) if !format!("{e:#}").contains(&p.display().to_string()) => {
            e.context(format!("the environment's stderr is in {}", p.display()))
        }
        _ => e,
    }
}

/// Checks, before any work, that the file `p` (given as `flag`) can be written: opened for
/// appending (created if missing, then removed again), so an unwritable path fails at once instead
/// of after an evaluation.
///
/// # Errors
/// The file cannot be opened for writing, naming the flag, the path and the reason.
fn probe_writable(p: &std::path::Path, flag: &str) -> anyhow::Result<()> {
    let existed = p.exists();
    std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(p)
        .with_context(|| {
            format!(
                "{flag} {}: cannot be written (checked before the evaluation); choose a path in \
                 an existing, writable directory",
                p.display()
            )
        })?;
    if !existed {
        let _ = std::fs::remove_file(p);
    }
    Ok(())
}

/// Samples `rlvr eval`'s completions with the engine `rollout.backend` names: the native engine
/// over the loaded model, or vLLM servers after the start-up checks and a push of the evaluated
/// model as version 0 (written under `rollout.weights_dir`, default a temporary directory removed
/// afterwards).
///
/// With `episodes` (`rlvr eval --env`: the runner, whether it is the built-in `retry`, and the
/// episode's token budget) each sample is a multi-turn episode ([`evaluate_episodes`]) and what
/// the environment did is summed into `env`. The items go to `items`: on an error, those of the
/// problems evaluated before it.
fn eval_on_backend(
    rollout: &RolloutSection,
    evaluator: &Evaluator,
    (policy, model_dir): (&Policy, &Path),
    server_use: &ServerUse,
    episodes: Option<(&mut EpisodeRunner, bool, usize)>,
    (items, env): (&mut Vec<EvalItem>, &mut crate::feed::episodes::EnvStats),
) -> anyhow::Result<EvalResult> {
    // A private directory with an unpredictable name (0700), removed when `dir` drops: a fixed
    // name under a shared /tmp could be planted by another user (issue 49 item 6).
    let dir = private_tmp_dir("rlvr-eval-vllm-")?;
    let tmp = dir.path().to_path_buf();
    let mut r = rollout.clone();
    r.weights_dir.get_or_insert_with(|| tmp.clone());
    let mut s = settings::backend_settings(&r, &tmp);
    if let BackendSettings::Vllm(v) = &mut s {
        // The servers run the evaluated model (its layout: rlvr_vllm::ServedLayout).
        v.served_base = Some(model_dir.to_path_buf());
    }
    let result = (|| {
        let ids = policy_prompt_ids(evaluator, policy)?;
        let work = Workload {
            longest_prompt: ids.iter().map(Vec::len).max().unwrap_or(0),
            max_new_tokens: match &episodes {
                Some((_, _, budget)) => *budget,
                None => evaluator.settings.max_new_tokens,
            },
            room_key: match &episodes {
                Some(_) => "env.max_episode_tokens",
                None => "eval.max_new_tokens (or --max-new-tokens)",
            },
        };
        let mut engine = fixed_model_engine(&s, policy, work, server_use)?;
        match episodes {
            Some((runner, retry, _)) => evaluate_episodes(
                engine.as_mut(),
                &policy.tokenizer,
                evaluator,
                (runner, retry),
                &ids,
                (items, env),
            ),
            None => evaluator.run_into(engine.as_mut(), &policy.tokenizer, items),
        }
    })();
    drop(dir);
    result
}

/// `rlvr eval --env`: each of the evaluator's problems as `samples` episodes of `runner`'s
/// environment (docs/environments.md), sampled as the evaluation samples (greedy for one sample,
/// else temperature 1 with the evaluation seed; draw index = the problem's place, so turn 1 is
/// the single-turn evaluation's sample). An item is correct when its episode's reward is above 0;
/// an episode the environment failed scores 0. `ids`: the problems' prompt ids. `retry`: the
/// built-in `retry` environment (its reset rows carry the verifier's fields), else a program's
/// (the row's columns and `reference`). The items are appended to `items` chunk by chunk of
/// problems (`rollout.max_batch_rows` episodes), so an error leaves there those of the chunks
/// before it; what the environment did in each chunk (restarts, replays, cut observations, tool
/// calls, ends) is summed into `env`, whose `episodes` then counts the items.
///
/// # Errors
/// As the explorer's episodes: environment faults, sampling, more than `env.max_error_frac`
/// failed.
fn evaluate_episodes(
    rollout: &mut dyn rlvr_rollout::Rollout,
    tok: &rlvr_model::TokenizerBundle,
    ev: &Evaluator,
    (runner, retry): (&mut EpisodeRunner, bool),
    ids: &[Vec<u32>],
    (items, env): (&mut Vec<EvalItem>, &mut crate::feed::episodes::EnvStats),
) -> anyhow::Result<EvalResult> {
    use crate::feed::episodes::{program_row, segments, EpisodePrompt, RetryVerifier};
    let s = &ev.settings;
    let params = s.sampling(&tok.eos_ids);
    let chunk = (s.max_batch_rows / s.samples).max(1);
    items.clear();
    items.reserve(ids.len() * s.samples);
    for start in (0..ids.len()).step_by(chunk) {
        let end = (start + chunk).min(ids.len());
        let prompts: Vec<EpisodePrompt<'_>> = (start..end)
            .map(|i| EpisodePrompt {
                draw: i,
                ids: &ids[i],
                row: match retry {
                    true => RetryVerifier::row(
                        &ev.texts[i],
                        &ev.references[i],
                        &ev.columns[i],
                        ev.rows[i],
                    ),
                    false => program_row(&ev.references[i], &ev.columns[i]),
                },
            })
            .collect();
        let (eps, stats) = runner
            .run(rollout, tok, &prompts, &params, s.seed)
            .with_context(|| format!("evaluating the episodes of problems {start}..{end}"))?;
        let mut chunk_items = Vec::with_capacity(eps.len());
        for e in eps {
            let reward = e.reward.unwrap_or(0.0);
            // The prompt the episode started from: the dataset's, or the environment's
            // replacement (its `reset` messages) rendered.
            let prompt = match e.prompt_ids == ids[e.draw] {
                true => ev.texts[e.draw].clone(),
                false => tok.decode(&e.prompt_ids, false)?,
            };
            chunk_items.push(EvalItem {
                index: e.draw,
                sample_index: e.sample,
                prompt,
                completion: tok.decode(&e.completion_ids, false)?,
                reward,
                correct: reward > 0.0,
                extracted: None,
                gold: None,
                components: Vec::new(),
                extra: Vec::new(),
                episode: Some(crate::eval::EpisodeRecord {
                    turns: e.turns,
                    segments: segments(&e.completion_mask),
                    turn_rewards: e.turn_rewards,
                    finish: e.finish.to_string(),
                    error: e.error,
                    metrics: e.metrics,
                    transcript: e
                        .transcript
                        .into_iter()
                        .map(
                            |(role, content)| serde_json::json!({"role": role, "content": content}),
                        )
                        .collect(),
                }),
            });
        }
        // Whole chunks only: a decode error halfway leaves the chunks before it.
        items.append(&mut chunk_items);
        env.merge(&stats);
    }
    let per = crate::eval::correct_per_problem(items, ids.len());
    Ok(crate::eval::summarise(ev.task, &per, s.samples))
}

/// A new private temporary directory (mode 0700, `prefix`, this process's id and a random part:
/// `rlvr-eval-vllm-PID-XXXXXX`), removed when the returned guard drops. Those of the same prefix
/// whose process is gone (a killed `rlvr eval` or `generate`: a whole model's weights each) are
/// removed first ([`stale_tmp_dirs`]).
///
/// # Errors
/// The temporary directory cannot be created (naming it).
fn private_tmp_dir(prefix: &str) -> anyhow::Result<tempfile::TempDir> {
    for p in stale_tmp_dirs(&std::env::temp_dir(), prefix) {
        eprintln!("removed {}, left by a killed rlvr process", p.display());
    }
    tempfile::Builder::new()
        .prefix(&format!("{prefix}{}-", std::process::id()))
        .tempdir()
        .with_context(|| {
            format!(
                "creating a private directory {prefix}* under {}",
                std::env::temp_dir().display()
            )
        })
}

/// The prefixes of [`private_tmp_dir`]'s directories (`rlvr eval`'s, `rlvr generate`'s).
const PRIVATE_TMP_PREFIXES: [&str; 2] = ["rlvr-eval-vllm-", "rlvr-generate-vllm-"];

/// At every `rlvr eval` and `rlvr generate` start, whatever the backend: removes what killed ones
/// left, as far as their writers are gone ([`rlvr_rundir::fs::remove_stale_entries`]'s rule): the
/// private directories of [`PRIVATE_TMP_PREFIXES`] (a model's weights each) and, with `out`
/// (`rlvr eval --out FILE`, `rlvr generate --out FILE`), `FILE`'s own atomic-write temporaries
/// (`.FILE.tmp-PID`). Each removal
/// is said on stderr. (They used to go only at the next start that used the vLLM backend, and
/// only for the same command's prefix.)
fn remove_killed_commands_leftovers(out: Option<&std::path::Path>) {
    let mut gone: Vec<PathBuf> = PRIVATE_TMP_PREFIXES
        .iter()
        .flat_map(|prefix| stale_tmp_dirs(&std::env::temp_dir(), prefix))
        .collect();
    if let Some(out) = out {
        gone.extend(rlvr_rundir::fs::remove_stale_temporaries_of(out));
    }
    for p in gone {
        eprintln!("removed {}, left by a killed rlvr process", p.display());
    }
}

/// Removes from `tmp` the directories [`private_tmp_dir`] made with `prefix` for processes that
/// are gone (`PREFIX` + PID + `-` + random part; [`rlvr_rundir::fs::remove_stale_entries`]'s
/// rule), and returns them.
fn stale_tmp_dirs(tmp: &std::path::Path, prefix: &str) -> Vec<PathBuf> {
    let pid_of = |name: &str| {
        let (pid, rest) = name.strip_prefix(prefix)?.split_once('-')?;
        let digits = !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit());
        (digits && !rest.is_empty()).then(|| pid.parse().ok())?
    };
    rlvr_rundir::fs::remove_stale_entries(tmp, pid_of)
        .into_iter()
        .map(|(p, _)| p)
        .collect()
}

/// The engine `s` names over a fixed model (`rlvr eval`, `rlvr generate`), as version 0: the
/// native engine shares the model's weights; vLLM servers get them pushed first.
///
/// # Errors
/// A vLLM start-up check or push failing, naming the server.
fn fixed_model_engine(
    s: &BackendSettings,
    policy: &Policy,
    work: Workload,
    server_use: &ServerUse,
) -> anyhow::Result<Box<dyn rlvr_rollout::Rollout>> {
    let mut engine = backend::build(
        s,
        &policy.model,
        &policy.tokenizer,
        0,
        work,
        NativeWeights::Share,
        server_use,
    )?;
    if *s != BackendSettings::Native {
        engine
            .load_weights(0, &rlvr_rollout::named_tensors(&policy.model))
            .context("pushing the model to the vLLM servers")?;
    }
    Ok(engine)
}

/// The token ids of the evaluator's prompts under the policy's tokenizer.
fn policy_prompt_ids(evaluator: &Evaluator, policy: &Policy) -> anyhow::Result<Vec<Vec<u32>>> {
    evaluator
        .texts
        .iter()
        .map(|t| {
            policy
                .tokenizer
                .encode(t, evaluator.settings.add_special_tokens)
                .map_err(anyhow::Error::from)
        })
        .collect()
}

pub use crate::plot::{run_plot, PlotArgs};

/// `rlvr sft`.
#[derive(clap::Args, Debug, Clone, serde::Serialize)]
pub struct SftArgs {
    /// Model directory to start from.
    #[arg(long)]
    pub model: PathBuf,
    /// Training pairs: JSONL with `{"prompt": TEXT, "completion": TEXT}` per line, or TRL's
    /// conversational rows (`{"prompt": [messages], "completion": [messages]}`, `{"messages":
    /// [...]}` whose last, assistant message is the completion), rendered by the chat template.
    /// Without it, the pairs are the `[data]` train split of `--config`/`--set` (rendered prompt,
    /// reference as the completion: e.g. arithmetic's answer, GSM8K's worked solution).
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// A training config: its `[data]` (task, template, train/test split), `[reward]` and `[eval]` are
    /// used for pairs without `--data` and for `--eval-every`.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Config overrides (`--set data.task=arithmetic`). Repeatable.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// Evaluate on the held-out split every this many steps (0 = never); `eval/*` keys go to
    /// metrics.jsonl and a line to eval.jsonl in `--out`. The last step is evaluated too.
    #[arg(long, default_value_t = 0)]
    pub eval_every: u64,
    /// Off a terminal (or with `--no-progress`): a line on stderr every this many steps (and at
    /// the last step); evaluations always get a line.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    pub log_every: u64,
    /// Never draw the progress bar: step lines on stderr instead.
    #[arg(long)]
    pub no_progress: bool,
    /// Stop (and save) at the first evaluation whose accuracy reaches this value.
    #[arg(long)]
    pub stop_at_accuracy: Option<f64>,
    /// Output model directory (written at the end and every `--save-every` steps). An existing
    /// non-empty directory is refused unless `--force`; the `--model` directory always is.
    #[arg(long)]
    pub out: PathBuf,
    /// Write into a non-empty `--out` (its `*.safetensors` files are removed first).
    #[arg(long)]
    pub force: bool,
    /// Render the prompt as a user message with the model's chat template.
    #[arg(long)]
    pub chat: bool,
    /// Pairs per optimizer step.
    #[arg(long, default_value_t = 16)]
    pub batch_size: usize,
    /// Rows per forward/backward (does not change the gradient).
    #[arg(long, default_value_t = 16)]
    pub micro_batch_size: usize,
    /// Passes over the data (ignored when `--steps` is given).
    #[arg(long, default_value_t = 1)]
    pub epochs: u64,
    /// Optimizer steps (default: epochs × ⌈pairs / batch size⌉).
    #[arg(long)]
    pub steps: Option<u64>,
    /// Peak learning rate.
    #[arg(long, default_value_t = 1e-5)]
    pub lr: f64,
    /// Linear warm-up steps.
    #[arg(long, default_value_t = 0)]
    pub warmup_steps: u64,
    /// Schedule: constant, linear or cosine.
    #[arg(long, default_value = "constant")]
    pub schedule: String,
    /// AdamW weight decay.
    #[arg(long, default_value_t = 0.0)]
    pub weight_decay: f64,
    /// Global gradient-norm clip (0 = off).
    #[arg(long, default_value_t = 1.0)]
    pub grad_clip: f64,
    /// Shuffling seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Drop completion tokens beyond this many (the EOS included).
    #[arg(long)]
    pub max_completion_len: Option<usize>,
    /// Save the model every this many steps (0 = only at the end).
    #[arg(long, default_value_t = 0)]
    pub save_every: u64,
    /// Weights dtype: f32 or bf16.
    #[arg(long, default_value = "f32")]
    pub dtype: String,
    /// Device: cpu or cuda:N.
    #[arg(long, default_value = "cpu")]
    pub device: String,
}

/// The most epochs of `rlvr sft --epochs`.
pub const MAX_SFT_EPOCHS: u64 = 1_000_000;

/// Refuses `rlvr sft`'s step, epoch, accuracy and length flags out of range, naming the flag.
fn check_sft_flags(a: &SftArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        (1..=MAX_SFT_EPOCHS).contains(&a.epochs),
        "--epochs {} is out of range: expected 1 to {MAX_SFT_EPOCHS}",
        a.epochs
    );
    anyhow::ensure!(
        a.steps != Some(0),
        "--steps 0: must be at least 1 (or unset)"
    );
    if let Some(acc) = a.stop_at_accuracy {
        anyhow::ensure!(
            (0.0..=1.0).contains(&acc),
            "--stop-at-accuracy {acc:e} is out of range: expected an accuracy in [0, 1] (0: stop \
             at the first evaluation)"
        );
    }
    anyhow::ensure!(
        a.max_completion_len != Some(0),
        "--max-completion-len 0: must be at least 1 (or unset)"
    );
    Ok(())
}

/// Runs `rlvr sft` ([`crate::sft::train_sft`]). Prints `{"out", "steps", "loss"}`.
///
/// # Errors
/// Data, model and I/O errors; a non-finite loss aborts (nothing is saved for that step).
pub fn run_sft(a: &SftArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    // Under mpirun/srun/torchrun every process is one rank of a data-parallel run; rank 0 alone
    // prepares and writes --out.
    let raw = RawConfig::load(a.config.as_deref(), &a.set)?;
    let (job, _) = Job::launch(&a.device, raw.distributed.backend.into(), || {
        raw.distributed.timeout()
    })?;
    let res = run_sft_on(a, out, &raw, job.clone());
    job.leave_on_error(res)
}

/// What every rank of a data-parallel `rlvr sft` must share with rank 0: its flags (as `--name`
/// keys; `--device`, rewritten per rank, and `--no-progress` left out), the config `raw` (after
/// `--set`), and its inputs (the `--data` file's size and CRC-32C, the model directory's files).
///
/// # Errors
/// An input that cannot be read (named); a value that has no TOML form.
fn sft_fingerprint(a: &SftArgs, raw: &RawConfig) -> anyhow::Result<toml::Table> {
    use crate::run::same_config::{file_print, model_print};
    let mut flags = a.clone();
    flags.device = String::new();
    flags.no_progress = false;
    let mut t = toml::Table::new();
    if let toml::Value::Table(f) = toml::Value::try_from(&flags).context("the sft flags")? {
        for (k, v) in f {
            t.insert(format!("--{}", k.replace('_', "-")), v);
        }
    }
    t.insert(
        "config".into(),
        toml::Value::try_from(raw).context("the sft config")?,
    );
    let mut inputs = toml::Table::new();
    if let Some(d) = a.data.as_deref().filter(|p| p.is_file()) {
        inputs.insert("--data".into(), file_print(d)?.into());
    }
    model_print(&a.model, &mut inputs)?;
    t.insert("inputs".into(), toml::Value::Table(inputs));
    Ok(t)
}

/// [`run_sft`] as one rank of `job` (launched by [`run_sft`]; a test's [`Job::over`] of a
/// thread communicator): every rank first checks that it runs rank 0's flags, config and inputs.
///
/// # Errors
/// As [`run_sft`]; a rank whose flags, config or inputs differ from rank 0's (the first key that
/// differs named, with both values).
pub fn run_sft_on(
    a: &SftArgs,
    out: &mut dyn Write,
    raw: &RawConfig,
    mut job: Job,
) -> anyhow::Result<()> {
    // Issue 49 item 6a: ranks launched with other flags would train another problem silently.
    if job.is_parallel() {
        crate::run::same_config::check_fingerprint(
            sft_fingerprint(a, raw)?,
            &mut job,
            "sft flags, config and inputs",
        )?;
    }
    if a.batch_size == 0 || a.micro_batch_size == 0 {
        bail!("--batch-size and --micro-batch-size must be at least 1");
    }
    check_sft_flags(a)?;
    let max = crate::config::MAX_ROWS_PER_STEP;
    for (flag, v) in [
        ("--batch-size", a.batch_size),
        ("--micro-batch-size", a.micro_batch_size),
    ] {
        anyhow::ensure!(v <= max, "{flag} {v} is out of range: at most {max} pairs");
    }
    crate::update::optimizer::check_optimizer(&crate::update::optimizer::OptimizerValues {
        lr: ("--lr", a.lr),
        beta1: None,
        beta2: None,
        eps: None,
        weight_decay: ("--weight-decay", a.weight_decay),
        grad_clip: ("--grad-clip", a.grad_clip),
    })?;
    // --out: never the input model; non-empty only with --force, and then written into a staging
    // sibling that replaces it only once the run has succeeded.
    crate::store::lock::refuse_same_dir(&a.model, &a.out)?;
    let staged = job.rank0_tries(&format!("prepare --out {}", a.out.display()), || {
        crate::store::lock::StagedOutput::prepare(&a.out, a.force, "--out")
    })?;
    let write_to = staged
        .as_ref()
        .map_or(a.out.as_path(), |s| s.path())
        .to_path_buf();
    let done = sft_run(a, raw, job, &write_to);
    let done = match (done, staged.as_ref().and_then(|s| s.staging())) {
        (Err(e), Some(staging)) => {
            return Err(e.context(format!(
                "--out {} is unchanged (--force writes into {} and replaces --out only when the \
                 run succeeds)",
                a.out.display(),
                staging.display()
            )))
        }
        (done, _) => done?,
    };
    let Some(staged) = staged else {
        return Ok(());
    };
    staged.commit()?;
    writeln!(
        out,
        "{}",
        serde_json::json!({"out": a.out, "steps": done.steps, "loss": done.loss})
    )?;
    Ok(())
}

/// The part of `rlvr sft` after `--out` is prepared: device, model, pairs, evaluator, settings,
/// then training into `write_to` (the staging directory under `--force`).
fn sft_run(
    a: &SftArgs,
    raw: &RawConfig,
    job: Job,
    write_to: &std::path::Path,
) -> anyhow::Result<crate::sft::SftOutcome> {
    let writer = job.writer();
    let device = rlvr_model::parse_device(&job.device(&a.device)?)?;
    let dtype = rlvr_model::parse_dtype(&a.dtype)
        .with_context(|| format!("--dtype {}: expected f32 or bf16", a.dtype))?;
    let schedule = match a.schedule.as_str() {
        "constant" => Schedule::Constant,
        "linear" => Schedule::Linear,
        "cosine" => Schedule::Cosine,
        s => bail!("--schedule {s}: expected constant, linear or cosine"),
    };
    let policy = crate::store::manifest::load_policy(&a.model, dtype, &device)?;
    let pairs = match &a.data {
        Some(d) => read_pairs(d, &policy.tokenizer, a.chat, a.max_completion_len)?,
        None if a.config.is_some() || !a.set.is_empty() => {
            pairs_from_config(&raw.data, &policy.tokenizer, a.max_completion_len)?
        }
        None => bail!(
            "give --data PAIRS.jsonl, or --config/--set naming a task whose train split to use"
        ),
    };
    let evaluator = if a.eval_every > 0 {
        let reward = Arc::new(settings::reward_function(raw)?);
        Some(settings::evaluator(raw, &policy.tokenizer, reward)?)
    } else {
        None
    };
    let per_epoch = pairs.len().div_ceil(a.batch_size) as u64;
    let settings = SftSettings {
        batch_size: a.batch_size,
        micro_batch_size: a.micro_batch_size,
        schedule: LrSchedule {
            steps: a.steps.unwrap_or(per_epoch * a.epochs.max(1)),
            lr: a.lr,
            warmup_steps: a.warmup_steps,
            schedule,
            min_lr: 0.0,
        },
        adamw: AdamWConfig {
            lr: a.lr,
            weight_decay: a.weight_decay,
            ..AdamWConfig::default()
        },
        grad_clip: a.grad_clip,
        seed: a.seed,
        eval_every: a.eval_every,
        stop: a
            .stop_at_accuracy
            .map_or(StopRule::Never, StopRule::AccuracyAtLeast),
        save_every: a.save_every,
        save_dtype: dtype,
    };
    let bar = crate::log::progress_bar(!a.no_progress && writer, 0, settings.schedule.steps);
    let t0 = std::time::Instant::now();
    let done = train_sft_on(
        &policy.model,
        &policy.tokenizer,
        &pairs,
        &settings,
        evaluator.as_ref(),
        write_to,
        &mut |st| sft_progress(st, bar.as_ref(), a.log_every, t0),
        job,
    )?;
    if let Some(b) = &bar {
        b.finish();
    }
    Ok(done)
}

/// One SFT step on the bar (on a terminal) or as a line on stderr (every `log_every` steps, at
/// the last, and at each evaluation): `sft step T/N loss L lr R tokens/s X elapsed E eta A`, the
/// values of its metrics.jsonl line.
fn sft_progress(
    st: &crate::sft::SftStep,
    bar: Option<&indicatif::ProgressBar>,
    log_every: u64,
    t0: std::time::Instant,
) {
    let f = |k: &str| st.metrics.get(k).and_then(|v| v.as_f64());
    if let Some(b) = bar {
        b.set_position(st.step);
        b.set_message(format!("loss {:.4}", st.loss));
        return;
    }
    let elapsed = t0.elapsed().as_secs_f64();
    let eta = elapsed / st.step as f64 * (st.steps - st.step) as f64;
    if st.step.is_multiple_of(log_every) || st.step == st.steps {
        eprintln!(
            "sft step {}/{} {} elapsed {} eta {}",
            st.step,
            st.steps,
            crate::log::fields(&[
                ("loss", f("loss"), 4),
                ("lr", f("lr"), 8),
                ("grad_norm", f("grad_norm"), 4),
                ("tokens/s", f("tokens_per_s"), 1),
            ]),
            crate::log::clock(elapsed),
            crate::log::clock(eta),
        );
    }
    if st.eval.is_some() {
        if let Some(acc) = f("eval/accuracy") {
            eprintln!(
                "sft eval step {} {}",
                st.step,
                crate::log::fields(&[
                    ("accuracy", Some(acc), 4),
                    ("mean@k", f("eval/mean@k"), 4),
                    ("pass@k", f("eval/pass@k"), 4),
                    ("n", f("eval/n"), 0),
                ])
            );
        }
    }
}

/// `rlvr generate`: the native engine, or with `--server URL` vLLM servers (the `rollout.*` keys
/// of training as flags: `--served-model-name`, `--weights-dir`, `--accept-renormalised-logprobs`),
/// to which the model's weights (its adapter, for a model with LoRA adapters) are pushed first as
/// version 0 and checked. With `--env CONFIG.toml`, episodes of that config's environment
/// ([`generate_episodes`]).
///
/// # Errors
/// As [`rlvr_rollout::cli::run`]; a vLLM start-up check, push or request failure naming the server;
/// with LoRA adapters, a server started without `--enable-lora` (rlvr-vllm's `lora` module).
pub fn run_generate(
    a: &rlvr_rollout::cli::GenerateArgs,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    remove_killed_commands_leftovers(a.out.as_deref());
    // rlvr-rollout loads the model; an rlvr checkpoint is verified against its manifest first.
    crate::store::manifest::check_model_dir(&a.model, "load")?;
    // vLLM's weights go to a private temporary directory unless --weights-dir names one.
    let mut dir = None;
    let s = if a.servers.is_empty() {
        BackendSettings::Native
    } else {
        let weights_dir = match &a.weights_dir {
            Some(d) => d.clone(),
            None => dir
                .insert(private_tmp_dir("rlvr-generate-vllm-")?)
                .path()
                .to_path_buf(),
        };
        let d = RolloutSection::default();
        BackendSettings::Vllm(VllmSettings {
            servers: a.servers.clone(),
            served_model_name: a.served_model_name.clone(),
            weights_dir,
            api_key_env: d.api_key_env,
            request_timeout_s: d.request_timeout_s,
            retries: d.retries,
            in_flight: d.in_flight,
            accept_renormalised_logprobs: a.accept_renormalised_logprobs,
            refresh_tolerance: d.refresh_tolerance,
            cache_salt: d.cache_salt == crate::config::CacheSalt::Version,
            follower: false,
            served_base: Some(a.model.clone()),
        })
    };
    if let Some(config) = &a.env {
        let result = generate_episodes(a, config, &s, out);
        drop(dir);
        return result;
    }
    let make = |policy: &Policy,
                params: &rlvr_rollout::SamplingParams,
                longest: usize|
     -> anyhow::Result<Box<dyn rlvr_rollout::Rollout>> {
        let work = Workload {
            longest_prompt: longest,
            max_new_tokens: params.max_new_tokens,
            room_key: "--max-new-tokens",
        };
        let use_ = ServerUse::Fixed {
            command: "rlvr generate",
            share: a.share_server,
        };
        fixed_model_engine(&s, policy, work, &use_)
    };
    let result = rlvr_rollout::cli::run_with(a, out, &make);
    drop(dir);
    result
}

/// One line of `rlvr generate --env`: an episode (docs/DESIGN.md section 14).
#[derive(Debug, serde::Serialize)]
struct EpisodeLine {
    prompt_index: usize,
    sample_index: usize,
    turns: u32,
    /// `done`, `max_turns`, `length`, `budget`, `eos` or `error`.
    finish: &'static str,
    reward: Option<f64>,
    turn_rewards: Vec<Option<f64>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
    /// The environment's metrics for the episode (its last reply's `metrics`); absent when none.
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    metrics: rlvr_env::protocol::Metrics,
    /// `{"role", "content"}` per assistant turn and environment message.
    transcript: Vec<serde_json::Value>,
    prompt_ids: Vec<u32>,
    completion_ids: Vec<u32>,
    completion_mask: Vec<u8>,
    behaviour_logprobs: Vec<f32>,
    /// The token accounting: each assistant turn and bridge of `completion_ids` in order.
    segments: Vec<crate::feed::episodes::Segment>,
    /// Ids sampled (mask 1) and ids of bridges (mask 0).
    sampled_tokens: usize,
    bridge_tokens: usize,
}

/// `rlvr generate --env CONFIG.toml`: each of a prompt's K samples is a multi-turn episode of the
/// config's environment, run as training runs them ([`EpisodeRunner`]) on the native engine or
/// the `--server`s; prints one [`EpisodeLine`] per episode, in (prompt, sample) order. Turn 1 of
/// episode (i, j) is `rlvr generate`'s completion (i, j) with the same flags. A `--prompts` line's
/// other keys are the row the environment's `reset` gets (`reference` the built-in `retry`
/// environment's answer); `--max-new-tokens` is the per-turn limit.
///
/// # Errors
/// Flags out of range; `--out` (not written for episodes); a config without `[env]`; the
/// environment's, the template's and the engine's errors as in training.
pub fn generate_episodes(
    a: &rlvr_rollout::cli::GenerateArgs,
    config: &std::path::Path,
    s: &BackendSettings,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    use crate::feed::episodes::{program_row, segments, EpisodePrompt, RetryVerifier};
    rlvr_rollout::cli::check_flags(a)?;
    anyhow::ensure!(
        a.out.is_none(),
        "--out with --env: episodes are not written as experiences by rlvr generate (each printed \
         line holds the episode's ids, mask and behaviour log-probs)"
    );
    let mut raw = RawConfig::load(Some(config), &a.set)?;
    anyhow::ensure!(
        raw.env.is_on(),
        "--env {}: the config has no environment: set env.command or env.builtin (or --set \
         'env.builtin=\"retry\"')",
        config.display()
    );
    // The per-turn limit: the flag's, else the config's rollout.max_new_tokens, as in training;
    // the default episode budget follows it.
    let mut a = a.clone();
    let per_turn = *a.max_new_tokens.get_or_insert(raw.rollout.max_new_tokens);
    rlvr_rollout::cli::check_flags(&a)?;
    let a = &a;
    if let Some(b) = raw.env.max_episode_tokens.filter(|&b| b < per_turn) {
        anyhow::bail!(
            "--max-new-tokens {per_turn} is above env.max_episode_tokens = {b} of {}: an \
             episode's first turn is sampled whole: pass --max-new-tokens {b} or less",
            config.display(),
        );
    }
    raw.rollout.max_new_tokens = per_turn;
    let rows = rlvr_rollout::cli::prompt_rows(a)?;
    let policy = rlvr_rollout::cli::load_policy(a)?;
    let tok = &policy.tokenizer;
    let texts: Vec<String> = rows.iter().map(|(t, _)| t.clone()).collect();
    let ids = rlvr_rollout::cli::encode_prompts(tok, &texts, a.chat)?;
    let reward = Arc::new(settings::reward_function(&raw)?);
    let env_log = env_log_path(
        &raw,
        true,
        a.env_log.as_deref(),
        None,
        "rlvr-generate.env.stderr",
    )?;
    let mut runner = settings::episode_runner(&raw, tok, &reward, env_log.clone())
        .map_err(|e| name_env_log(e, env_log.as_deref()))?;
    let budget = raw.env.episode_tokens(per_turn);
    let work = Workload {
        longest_prompt: ids.iter().map(Vec::len).max().unwrap_or(0),
        max_new_tokens: budget,
        room_key: "env.max_episode_tokens",
    };
    let use_ = ServerUse::Fixed {
        command: "rlvr generate",
        share: a.share_server,
    };
    let mut engine = fixed_model_engine(s, &policy, work, &use_)?;
    let params = rlvr_rollout::cli::sampling_params(a, tok);
    let retry = raw.env.builtin.is_some();
    let text = |v: &serde_json::Value| match v {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let chunk = (a.max_batch_rows / a.n).max(1);
    for start in (0..ids.len()).step_by(chunk) {
        let end = (start + chunk).min(ids.len());
        let prompts: Vec<EpisodePrompt<'_>> = (start..end)
            .map(|i| {
                let (prompt, fields) = &rows[i];
                let reference = fields.get("reference").map(text).unwrap_or_default();
                let columns: Vec<(String, String)> = fields
                    .iter()
                    .filter(|(k, _)| k.as_str() != "reference")
                    .map(|(k, v)| (k.clone(), text(v)))
                    .collect();
                EpisodePrompt {
                    draw: i,
                    ids: &ids[i],
                    row: match retry {
                        true => RetryVerifier::row(prompt, &reference, &columns, i),
                        // The line's `prompt` too, as a training row holds its data file's
                        // prompt field (an environment may read the question from it).
                        false => {
                            let mut all = vec![("prompt".to_string(), prompt.clone())];
                            all.extend(columns.iter().cloned());
                            program_row(&reference, &all)
                        }
                    },
                }
            })
            .collect();
        let (eps, _) = runner
            .run(engine.as_mut(), tok, &prompts, &params, a.seed)
            .with_context(|| format!("sampling the episodes of prompts {start}..{end}"))
            .map_err(|e| name_env_log(e, env_log.as_deref()))?;
        for e in eps {
            let sampled = e.completion_mask.iter().filter(|&&m| m == 1).count();
            let line = EpisodeLine {
                prompt_index: e.draw,
                sample_index: e.sample,
                turns: e.turns,
                finish: e.finish,
                reward: e.reward,
                turn_rewards: e.turn_rewards,
                error: e.error,
                metrics: e.metrics,
                transcript: e
                    .transcript
                    .into_iter()
                    .map(|(role, content)| serde_json::json!({"role": role, "content": content}))
                    .collect(),
                segments: segments(&e.completion_mask),
                sampled_tokens: sampled,
                bridge_tokens: e.completion_mask.len() - sampled,
                prompt_ids: e.prompt_ids,
                completion_ids: e.completion_ids,
                completion_mask: e.completion_mask,
                behaviour_logprobs: e.behaviour_logprobs,
            };
            serde_json::to_writer(&mut *out, &line)?;
            out.write_all(b"\n")?;
        }
    }
    out.flush()?;
    Ok(())
}

/// `rlvr plan` arguments.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct PlanArgs {
    /// Run config (TOML); its `model.path` must hold a config.json.
    #[arg(long)]
    pub config: PathBuf,
    /// Override a config key (`--set train.micro_batch_size=4`); repeatable.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// Memory to fit (e.g. 80GB, 24GiB, 16000MiB; GB and GiB both mean 2^30 bytes).
    #[arg(long)]
    pub gpu_memory: Option<String>,
    /// One JSON object on the last line of stdout instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Plan per rank of this many data-parallel ranks (`mpirun -np N`).
    #[arg(long, default_value_t = 1)]
    pub world_size: u64,
    /// ZeRO stage per rank: 0 (every rank holds the optimizer state), 1 (sharded) or 2 (the
    /// gradient sum sharded too); default: the config's `distributed.zero`.
    #[arg(long)]
    pub zero: Option<u8>,
}

/// The most ranks `rlvr plan --world-size` plans for (2^20: beyond every cluster).
pub const MAX_PLAN_RANKS: u64 = 1 << 20;

/// What `rlvr plan` says first when this binary cannot run the GPU run it plans: a build
/// without the `cuda` feature (`cuda_built` false) and a `model.device` other than `cpu`. The
/// plan stays a GPU plan (it is often made for another machine), and the note names the flag
/// and the CPU alternative. `None` on a CUDA build or for `device = "cpu"`.
pub fn cpu_build_note(device: &rlvr_model::DeviceSpec, cuda_built: bool) -> Option<String> {
    if cuda_built || *device == rlvr_model::DeviceSpec::Cpu {
        return None;
    }
    let here = match device {
        rlvr_model::DeviceSpec::Auto => "would run it on the CPU (model.device = \"auto\")",
        _ => "would refuse it (model.device names a GPU)",
    };
    Some(format!(
        "this rlvr was built without CUDA: the plan below is for a GPU run on a binary built \
         with `--features cuda`; this binary {here}. `--set model.device=\"cpu\"` plans the \
         CPU run."
    ))
}

/// `rlvr plan`: loads the config (with overrides), takes the prompt length (`data.max_prompt_len`,
/// else the train split's longest prompt, else 256 tokens with the reason:
/// [`crate::config::plan::with_data_prompt_len`]), estimates, prints the table or one JSON line
/// (a note first, or `"note"` in the JSON, when this build has no CUDA: [`cpu_build_note`]).
///
/// # Errors
/// Config errors, a missing model config.json, a malformed `--gpu-memory`.
pub fn run_plan(a: &PlanArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let most = MAX_PLAN_RANKS;
    anyhow::ensure!(
        (1..=most).contains(&a.world_size),
        "--world-size {} is out of range: expected 1 to {most} ranks",
        a.world_size
    );
    let mut raw = RawConfig::load(Some(a.config.as_path()), &a.set)?;
    let note = cpu_build_note(&raw.model.device, cfg!(feature = "cuda"));
    // A plan is for a GPU: `auto` is cuda and bf16 whatever this machine has.
    raw.model.assume_gpu();
    let resolved = raw.resolve()?;
    let memory = a.gpu_memory.as_deref().map(parse_size).transpose()?;
    let zero = a.zero.unwrap_or(resolved.raw.distributed.zero);
    let needs_ref = resolved.algorithm.needs_reference();
    // Without data.max_prompt_len, the train split's longest prompt (else 256 tokens, said so).
    let (planned, prompt_source) = with_data_prompt_len(&resolved.raw);
    let mut p = plan_ranks(&planned, needs_ref, memory, a.world_size, zero)?;
    p.prompt_source = prompt_source;
    // What to change when it does not fit.
    let to_fit = match (memory, p.fits) {
        (Some(m), Some(false)) => suggestions(&planned, needs_ref, m, a.world_size, zero)?,
        _ => Vec::new(),
    };
    if a.json {
        let mut v = serde_json::to_value(&p)?;
        v["to_fit"] = serde_json::json!(to_fit);
        v["note"] = serde_json::json!(note);
        writeln!(out, "{v}")?;
    } else {
        if let Some(n) = &note {
            writeln!(out, "note: {n}")?;
        }
        write_table(&p, out)?;
        if p.fits == Some(false) {
            match to_fit.is_empty() {
                true => writeln!(
                    out,
                    "none of ZeRO-1 or 2, activation checkpointing, one row per micro-batch or LoRA \
                     rank 16 makes it fit: more ranks, a smaller model or more memory"
                )?,
                false => {
                    writeln!(out, "to fit, set one of:")?;
                    for s in &to_fit {
                        writeln!(out, "  --set {}", s.replace(' ', " --set "))?;
                    }
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `rlvr eval`/`generate`'s private directories for vLLM's weights carry their process's id,
    /// so the next start removes those of killed processes (a model's weights each; they used to
    /// stay in $TMPDIR): only that prefix's, only of processes that are gone.
    #[cfg(target_os = "linux")]
    #[test]
    fn private_tmp_dirs_of_killed_processes_are_removed_at_the_next_start() {
        let tmp = tempfile::tempdir().unwrap();
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        let me = std::process::id();
        let names = [
            format!("rlvr-eval-vllm-{dead}-a1b2c3"),
            format!("rlvr-eval-vllm-{me}-a1b2c3"),
            format!("rlvr-generate-vllm-{dead}-a1b2c3"),
            "rlvr-eval-vllm-a1b2c3".to_string(),
            format!("rlvr-eval-vllm-{dead}x-a1b2c3"),
        ];
        for n in &names {
            std::fs::create_dir_all(tmp.path().join(n).join("version-00000000")).unwrap();
        }
        let removed = stale_tmp_dirs(tmp.path(), "rlvr-eval-vllm-");
        assert_eq!(removed, vec![tmp.path().join(&names[0])]);
        for n in &names[1..] {
            assert!(tmp.path().join(n).is_dir(), "{n}");
        }
        // A new one is named after this process.
        let d = private_tmp_dir("rlvr-test-private-").unwrap();
        let name = d.path().file_name().unwrap().to_string_lossy().into_owned();
        assert!(
            name.starts_with(&format!("rlvr-test-private-{me}-")),
            "{name}"
        );
    }
}
