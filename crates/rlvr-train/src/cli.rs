//! Command-line front ends: `rlvr train`, `rlvr sft`, `rlvr eval`, `rlvr plot` (DESIGN.md section 10).
//! Each has a clap `Args` struct and a `run` function; the `rlvr` binary dispatches to them.

use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::Context;
use rlvr_data::config::{PromptStyle, TaskKind};
use rlvr_data::generate::Split;
use rlvr_model::checkpoint::Policy;
use rlvr_model::{ComputeDtype, DeviceSpec};
use rlvr_reward::combine::RewardFunction;

use crate::config::{RawConfig, ResolvedConfig};
use crate::eval::{evaluate, EvalSettings};
use crate::run::{prepare_prompts, train, RunOptions};

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
}

/// Installs a Ctrl-C handler that sets `flag` (the loop saves a checkpoint and exits). A second
/// Ctrl-C exits at once with status 130.
fn install_ctrlc(flag: Arc<AtomicBool>) {
    let _ = ctrlc::set_handler(move || {
        if flag.swap(true, Ordering::SeqCst) {
            std::process::exit(130);
        }
        eprintln!(
            "\ninterrupted: saving a checkpoint after the current step (Ctrl-C again to quit now)"
        );
    });
}

/// Runs `rlvr train`. Prints one JSON summary line to `out`.
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
    cfg.check_runnable()?;
    let stop = Arc::new(AtomicBool::new(false));
    install_ctrlc(stop.clone());
    let s = train(
        &cfg,
        &RunOptions {
            resume: a.resume.is_some(),
            progress: !a.no_progress,
            stop,
            hang_after_step: None,
        },
    )?;
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
    /// Samples per problem: 1 = greedy, > 1 = temperature 1 (mean@k, pass@k).
    #[arg(long, default_value_t = 1)]
    pub n: usize,
    /// First N problems only.
    #[arg(long)]
    pub limit: Option<usize>,
    /// Most new tokens (default: the config's rollout.max_new_tokens).
    #[arg(long)]
    pub max_new_tokens: Option<usize>,
    /// Sampling seed (n > 1).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Per-item results (JSONL).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Compute dtype: f32, bf16, f16 or f64 (default: the config's model.dtype, else f32).
    #[arg(long)]
    pub dtype: Option<String>,
    /// Device: cpu or cuda:N (default: the config's model.device, else cpu).
    #[arg(long)]
    pub device: Option<String>,
}

/// Runs `rlvr eval`: prints `{"task", "n", "accuracy", "mean@k", "pass@k"}`.
///
/// # Errors
/// Model, data and verifier errors.
pub fn run_eval(a: &EvalArgs, out: &mut dyn Write) -> anyhow::Result<()> {
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
    let device = device
        .open()
        .with_context(|| format!("device {device} (--device, else model.device)"))?;
    let dtype = dtype.dtype();
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
    if raw.data.task == TaskKind::Jsonl && raw.data.verifier.is_none() {
        anyhow::bail!(
            "--task jsonl needs data.verifier (--set 'data.verifier={{ kind = \"math\" }}')"
        );
    }
    let mut p = prepare_prompts(&raw.data, Split::Test, &policy.tokenizer)?;
    if let Some(n) = a.limit {
        p.texts.truncate(n);
        p.references.truncate(n);
    }
    if p.texts.is_empty() {
        anyhow::bail!(
            "the {} test split has no problem (check data.test / --data and data.max_prompt_len)",
            raw.data.task.name()
        );
    }
    let reward = RewardFunction::from_config(&raw.reward, &raw.data.verifier()?)?;
    let settings = EvalSettings {
        samples: a.n.max(1),
        max_new_tokens: a.max_new_tokens.unwrap_or(raw.rollout.max_new_tokens),
        seed: a.seed,
        max_batch_rows: raw.rollout.max_batch_rows,
        stop: raw.rollout.stop.clone(),
        add_special_tokens: raw.data.style == PromptStyle::Plain,
    };
    let (r, items) = evaluate(
        &policy.model,
        &policy.tokenizer,
        raw.data.task.name(),
        &p.texts,
        &p.references,
        &reward,
        &settings,
    )?;
    if let Some(path) = &a.out {
        let mut s = String::new();
        for it in &items {
            s.push_str(&serde_json::to_string(it)?);
            s.push('\n');
        }
        std::fs::write(path, s).with_context(|| format!("writing {}", path.display()))?;
    }
    writeln!(
        out,
        "{}",
        serde_json::json!({
            "task": r.task,
            "n": r.n,
            "accuracy": r.accuracy,
            "mean@k": r.mean_at_k,
            "pass@k": r.pass_at_k,
        })
    )?;
    Ok(())
}

pub use crate::plot::{run_plot, PlotArgs};
pub use crate::sft::{run_sft, SftArgs};
