//! The `rlvr` command-line tool. Each subcommand lives in the crate that owns its concept; this
//! file only parses arguments and dispatches (interfaces: DESIGN.md section 10).

#![forbid(unsafe_code)]

use std::io::Write;

use clap::{Parser, Subcommand};

mod bench;
mod init;
mod logprobs;
mod quickstart;

#[derive(Parser)]
#[command(
    name = "rlvr",
    version,
    about = "Reinforcement learning with verifiable rewards for LLMs: on- and off-policy GRPO, the REC family, OPMD, AsymRE."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Write a randomly initialised checkpoint in HuggingFace format (transformers loads it).
    Init(init::InitArgs),
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
}

/// `--model RUN` and `--model RUN/checkpoints/latest` of `eval`, `generate` and `logprobs`: the
/// checkpoint `latest` names (`rlvr_train::store::checkpoint::resolve_model_dir`).
fn resolve_model(c: &mut Command) -> anyhow::Result<()> {
    use rlvr_train::store::checkpoint::resolve_model_dir;
    let model = match c {
        Command::Eval(a) => &mut a.model,
        Command::Generate(a) => &mut a.model,
        Command::Logprobs(a) => &mut a.model,
        _ => return Ok(()),
    };
    *model = resolve_model_dir(model)?;
    Ok(())
}

/// Runs of more digits than this in an error message are shortened ([`shorten_long_numbers`]).
const MAX_DIGITS_SHOWN: usize = 24;

/// `msg` with every run of more than [`MAX_DIGITS_SHOWN`] ASCII digits cut to its first 12, an
/// ellipsis and its length (`100000000000… (300 digits)`), so an error about a 300-digit value
/// does not echo it in full. u64's largest value (20 digits) stays whole.
fn shorten_long_numbers(msg: &str) -> String {
    let mut out = String::with_capacity(msg.len());
    let mut digits = String::new();
    let flush = |digits: &mut String, out: &mut String| {
        if digits.len() > MAX_DIGITS_SHOWN {
            out.push_str(&digits[..12]);
            out.push_str(&format!("… ({} digits)", digits.len()));
        } else {
            out.push_str(digits);
        }
        digits.clear();
    };
    for c in msg.chars() {
        if c.is_ascii_digit() {
            digits.push(c);
        } else {
            flush(&mut digits, &mut out);
            out.push(c);
        }
    }
    flush(&mut digits, &mut out);
    out
}

fn main() {
    rlvr_model::keep_freed_memory();
    // `rlvr help --help` (clap would call `--help` an unknown subcommand): the top-level help.
    let args: Vec<String> = std::env::args().skip(1).take(3).collect();
    if args.len() == 2 && args[0] == "help" && (args[1] == "--help" || args[1] == "-h") {
        let _ = <Cli as clap::CommandFactory>::command().print_long_help();
        return;
    }
    let mut cli = Cli::parse();
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let res = resolve_model(&mut cli.command).and_then(|()| match &cli.command {
        Command::Init(a) => init::run(a, &mut out),
        Command::Logprobs(a) => logprobs::run(a, &mut out),
        Command::Train(a) => rlvr_train::cli::run_train(a, &mut out),
        Command::Sft(a) => rlvr_train::cli::run_sft(a, &mut out),
        Command::Eval(a) => rlvr_train::cli::run_eval(a, &mut out),
        Command::Plan(a) => rlvr_train::cli::run_plan(a, &mut out),
        Command::Merge(a) => rlvr_train::lora::run_merge(a, &mut out),
        Command::Plot(a) => rlvr_train::plot::run_plot(a, &mut out),
        Command::Generate(a) => rlvr_train::cli::run_generate(a, &mut out),
        Command::Reward(a) => rlvr_reward::cli::run(a, &mut out),
        Command::Algorithms => rlvr_algo::print_algorithms(&mut out).map_err(Into::into),
        Command::Quickstart(a) => quickstart::run(a, &mut out),
        Command::Lab(a) => rlvr_lab::run(a, &mut out),
        Command::Bench(c) => bench::run(c, &mut out),
    });
    let _ = out.flush();
    if let Err(e) = res {
        // A closed pipe (`rlvr algorithms | head`) is not an error of ours.
        if e.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
        {
            return;
        }
        eprintln!("error: {}", shorten_long_numbers(&format!("{e:#}")));
        // Verifier programs whose owner did not end them (nothing should be left by now).
        rlvr_reward::external::kill_all_groups();
        std::process::exit(1);
    }
}
