//! The `rlvr` command-line tool. Each subcommand lives in the crate that owns its concept; this
//! file only parses arguments and dispatches (interfaces: DESIGN.md section 10).

#![forbid(unsafe_code)]

use std::io::Write;

use clap::Parser;
use rlvr::{bench, convert, init, kernels, logprobs, quickstart, Cli, Command};

/// `--model RUN` and `--model RUN/checkpoints/latest` of `eval`, `generate` and `logprobs`: the
/// checkpoint `latest` names (`rlvr_train::store::checkpoint::resolve_model_dir`); `--model
/// ORG/NAME` that is no directory here: the Hugging Face cache's snapshot, or an error saying how
/// to download it (`rlvr_train::store::hub`). A checkpoint of a run is held by a shared lock for
/// as long as the returned guard lives, so that the run's checkpoint rotation leaves it in place.
fn resolve_model(
    c: &mut Command,
) -> anyhow::Result<Option<rlvr_train::store::checkpoint::CheckpointReadLock>> {
    use rlvr_train::store::checkpoint::resolve_and_hold;
    let model = match c {
        Command::Eval(a) => &mut a.model,
        Command::Generate(a) => &mut a.model,
        Command::Logprobs(a) => &mut a.model,
        _ => return Ok(None),
    };
    // `--model ORG/NAME`: the local Hugging Face cache's snapshot, or advice (rlvr downloads
    // nothing).
    let written = model.display().to_string();
    let cache = rlvr_train::store::hub::cache_dir();
    let path =
        rlvr_train::store::hub::resolve_model_path(&written, model.clone(), cache.as_deref());
    if let Some(hint) = rlvr_train::store::hub::missing_model_hint(&path) {
        anyhow::bail!("--model {hint}");
    }
    let (dir, hold) = resolve_and_hold(&path)?;
    *model = dir;
    Ok(hold)
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

/// The template worker's kind for rlvr-env's tool-calling chat templates.
#[cfg(target_os = "linux")]
const ENV_TEMPLATE: &str = "env";

/// The template worker's renderers besides chat templates (`rlvr_model::template_sandbox::Extra`).
#[cfg(target_os = "linux")]
fn render_extra(kind: &str, payload: &str) -> Result<String, String> {
    match kind {
        ENV_TEMPLATE => rlvr_env::template::render_payload(payload),
        other => Err(format!("the template worker renders no `{other}`")),
    }
}

fn main() {
    // `rlvr __rlvr-guard ...`: this process is the guard of a program rlvr starts (verifiers,
    // environments), before anything else is set up; otherwise every program started from here
    // on is started through such a guard, so that its whole process tree dies with rlvr.
    // `rlvr __rlvr-render ...`: the worker that renders chat templates with bounded memory.
    #[cfg(target_os = "linux")]
    {
        let mut args = std::env::args_os().skip(1);
        let first = args.next();
        let rest = || args.collect::<Vec<_>>();
        match first.as_ref().and_then(|a| a.to_str()) {
            Some(rlvr_reward::guard::GUARD_ARG) => rlvr_reward::guard::main(&rest()),
            // The chat-template worker (rlvr_model::template_sandbox).
            Some(rlvr_model::template_sandbox::RENDER_ARG) => {
                rlvr_model::template_sandbox::main(&rest(), Some(render_extra))
            }
            _ => {}
        }
        // This executable as the child sees it after the fork, even if the file was replaced.
        rlvr_reward::guard::enable("/proc/self/exe".into());
        rlvr_model::template_sandbox::enable("/proc/self/exe".into());
        // Environments' tool-calling templates (rlvr-env) render in the same bounded worker.
        let _ = rlvr_env::template::RENDERER
            .set(|payload| rlvr_model::template_sandbox::call(ENV_TEMPLATE, payload));
    }
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
    // `_hold`: the checkpoint being read stays until this command ends.
    let (_hold, res) = match resolve_model(&mut cli.command) {
        Ok(hold) => (hold, Ok(())),
        Err(e) => (None, Err(e)),
    };
    let res = res.and_then(|()| match &cli.command {
        Command::Init(a) => init::run(a, &mut out),
        Command::Convert(a) => convert::run(a, &mut out),
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
        Command::Kernels(c) => kernels::run(c, &mut out),
    });
    let _ = out.flush();
    if let Err(e) = res {
        // A closed pipe (`rlvr algorithms | head`) is not an error of ours.
        if e.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
        {
            return;
        }
        // `rlvr lab` stopped by a signal after its runs saved: the shell's code for it.
        if let Some(i) = e.downcast_ref::<rlvr_lab::runner::Interrupted>() {
            eprintln!("{i}");
            rlvr_reward::external::kill_all_groups();
            std::process::exit(128 + i.signal);
        }
        eprintln!("error: {}", shorten_long_numbers(&format!("{e:#}")));
        // Verifier programs whose owner did not end them (nothing should be left by now).
        rlvr_reward::external::kill_all_groups();
        std::process::exit(1);
    }
}
