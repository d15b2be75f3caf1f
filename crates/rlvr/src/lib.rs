//! The `rlvr` command line as a library: its clap definition ([`Cli`], [`Command`]) and the
//! subcommands whose code lives in this crate (`init`, `convert`, `logprobs`, `quickstart`, `bench`,
//! `kernels`). The
//! binary (`main.rs`) parses and dispatches; a library so that tests can walk every subcommand's
//! flags through clap's introspection (`tests/it/extreme_values.rs`).

#![forbid(unsafe_code)]

use clap::{Parser, Subcommand};

pub mod bench;
pub mod convert;
pub mod init;
pub mod kernels;
pub mod logprobs;
pub mod quickstart;

/// The whole command line: `rlvr SUBCOMMAND ...`.
#[derive(Parser)]
#[command(
    name = "rlvr",
    version,
    about = "Reinforcement learning with verifiable rewards for LLMs: on- and off-policy GRPO, the REC family, OPMD, AsymRE."
)]
pub struct Cli {
    /// The subcommand.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands (DESIGN.md section 10); each names the crate that owns it.
#[derive(Subcommand)]
pub enum Command {
    /// Write a randomly initialised checkpoint in HuggingFace format (transformers loads it).
    Init(init::InitArgs),
    /// Convert a GGUF file (llama.cpp's format) into a HuggingFace checkpoint: config, f32/bf16
    /// weights, tokenizer, chat template.
    Convert(convert::ConvertArgs),
    /// Print per-token log-probs of a completion given a prompt: {"tokens", "logprobs"}.
    Logprobs(logprobs::LogprobsArgs),
    /// RL training: explorer samples, verifier scores, trainer updates (every config key:
    /// crates/rlvr-train/README.md; interfaces: docs/DESIGN.md section 10).
    Train(rlvr_train::cli::TrainArgs),
    /// Supervised warm start on {prompt, completion} pairs.
    Sft(rlvr_train::cli::SftArgs),
    /// Evaluate a model on a task's held-out split: {"task", "n", "accuracy", "mean@k", "pass@k"}.
    Eval(rlvr_train::cli::EvalArgs),
    /// Memory estimate of a run config (weights, optimizer, activations, KV cache) and what fits.
    Plan(rlvr_train::cli::PlanArgs),
    /// Fold a checkpoint's LoRA adapter into a full HuggingFace model (W + (alpha/r)·B·A).
    Merge(rlvr_train::lora::MergeArgs),
    /// Plot metrics of one or more run directories against step (SVG or PNG).
    Plot(rlvr_train::plot::PlotArgs),
    /// Sample K completions per prompt with behaviour log-probs (JSON lines; --out experiences).
    Generate(rlvr_rollout::cli::GenerateArgs),
    /// Score completions with a verifier: {"reward", "extracted", "gold"} per line.
    Reward(rlvr_reward::cli::RewardArgs),
    /// List the algorithm presets, each with its paper and every value it sets.
    Algorithms,
    /// The default job: SFT warm start, then on- vs off-policy GRPO on addition; no download, no GPU.
    Quickstart(quickstart::QuickstartArgs),
    /// Reproduce the papers: a sweep of arms x seeds as child runs, then summaries, figures, verdicts.
    Lab(rlvr_lab::LabArgs),
    /// Throughput of sampling or of a training step on random data (bench/gpu.sh; JSON lines).
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// The compiled GPU kernels: list the manifest, or write launch records for
    /// kernels/replay.py and kernels/replay_gpu.py (bench/gpu_check.sh's kernels part).
    #[command(subcommand)]
    Kernels(kernels::KernelsCommand),
}
