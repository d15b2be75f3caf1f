//! The `rlvr reward` command (DESIGN.md section 10).
//!
//! Prints `{"reward": float, "extracted": str|null, "gold": str|null}` per scored completion. A single
//! completion comes from `--completion` and `--reference` (a full solution, whose gold is its last
//! `####` value or last `\boxed{}`, or a bare answer); countdown takes `--numbers 1,2,3 --target N`
//! instead of a reference. With `--input FILE.jsonl`, each line is an object
//! `{"completion": str, "reference": str?, "numbers": [int]?, "target": int?}` (missing keys fall back
//! to the flags; other keys are ignored; `text` is an alias of `completion`), and one output line is
//! written per input line, in order.

use crate::countdown::{CountdownProblem, CountdownVerifier};
use crate::gsm8k::{Gsm8kMode, Gsm8kVerifier};
use crate::math::MathVerifier;
use crate::{arithmetic::ArithmeticVerifier, Sample, Verifier};
use anyhow::{bail, Context};
use serde::Deserialize;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;

/// The task whose verifier scores the completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RewardTask {
    /// GSM8K numeric answers.
    Gsm8k,
    /// MATH / MATH-500 boxed answers.
    #[value(alias = "math500")]
    Math,
    /// Countdown expressions.
    Countdown,
    /// Exact arithmetic answers.
    Arithmetic,
}

/// Arguments of `rlvr reward`.
#[derive(Debug, Clone, clap::Args)]
pub struct RewardArgs {
    /// The completion text to score.
    #[arg(long, conflicts_with = "input")]
    pub completion: Option<String>,
    /// The reference: a full solution (gold = last `####` value or last `\boxed{}`) or a bare answer.
    #[arg(long)]
    pub reference: Option<String>,
    /// Task verifier.
    #[arg(long, value_enum, default_value = "gsm8k")]
    pub task: RewardTask,
    /// Extraction mode for gsm8k and arithmetic: strict (`#### N` only) or flexible.
    #[arg(long, value_enum, default_value = "flexible")]
    pub mode: Gsm8kMode,
    /// Countdown: the numbers to use, each exactly once (comma-separated).
    #[arg(long, value_delimiter = ',', allow_hyphen_values = true)]
    pub numbers: Option<Vec<i64>>,
    /// Countdown: the target value.
    #[arg(long, allow_hyphen_values = true)]
    pub target: Option<i64>,
    /// Score every line of this JSONL file instead of `--completion`. Each line is a JSON object
    /// `{"completion": str, "reference": str, "numbers": [int], "target": int}`: `completion` is
    /// required (`text` is accepted for it, so `rlvr generate` output can be scored once references
    /// are added); the others fall back to `--reference`, `--numbers`, `--target`; other keys are
    /// ignored. One output line per input line, in order; a malformed line is an error naming it.
    #[arg(long, value_name = "FILE.jsonl")]
    pub input: Option<PathBuf>,
    /// Print to stderr how the gold and the answer were read and normalised and why they were judged
    /// equal or not (MATH: parsed forms and the deciding steps; other tasks: the extracted values).
    /// Stdout is unchanged.
    #[arg(long)]
    pub explain: bool,
}

/// One `--input` line. Other keys are ignored, and `text` is accepted for `completion`, so the output of
/// `rlvr generate` can be scored once references are added.
#[derive(Deserialize)]
struct InputLine {
    #[serde(alias = "text")]
    completion: String,
    #[serde(default)]
    prompt: Option<String>,
    #[serde(default)]
    reference: Option<String>,
    #[serde(default)]
    numbers: Option<Vec<i64>>,
    #[serde(default)]
    target: Option<i64>,
}

/// Scores one sample, writing an explanation to `log` when `--explain` is on.
fn score_one(
    args: &RewardArgs,
    v: &dyn Verifier,
    sample: &Sample<'_>,
    log: &mut dyn Write,
    label: &str,
) -> anyhow::Result<crate::Score> {
    if !args.explain {
        return Ok(v.score(sample)?);
    }
    let (s, text) = if args.task == RewardTask::Math {
        MathVerifier.explain(sample)
    } else {
        let s = v.score(sample)?;
        let t = format!(
            "extracted: {:?}\ngold:      {:?}\nverdict:   {}\n",
            s.extracted,
            s.gold,
            if s.correct { "equal" } else { "not equal" }
        );
        (s, t)
    };
    writeln!(log, "== {label}\n{text}").context("writing the explanation")?;
    Ok(s)
}

fn verifier(args: &RewardArgs) -> Box<dyn Verifier> {
    match args.task {
        RewardTask::Gsm8k => Box::new(Gsm8kVerifier { mode: args.mode }),
        RewardTask::Math => Box::new(MathVerifier),
        RewardTask::Countdown => Box::new(CountdownVerifier),
        RewardTask::Arithmetic => Box::new(ArithmeticVerifier { mode: args.mode }),
    }
}

/// The reference string for one completion, or an error saying which input is missing.
fn reference_for(
    task: RewardTask,
    reference: Option<&str>,
    numbers: Option<&Vec<i64>>,
    target: Option<i64>,
) -> anyhow::Result<String> {
    if task == RewardTask::Countdown {
        return match (numbers, target, reference) {
            (Some(n), Some(t), _) => Ok(CountdownProblem {
                numbers: n.clone(),
                target: t,
            }
            .to_reference()),
            (_, _, Some(r)) => Ok(r.to_string()),
            _ => bail!("countdown needs `numbers` and `target` (--numbers 1,2,3 --target N)"),
        };
    }
    match reference {
        Some(r) => Ok(r.to_string()),
        None => bail!("`reference` is required (--reference TEXT)"),
    }
}

fn write_score(out: &mut dyn Write, s: &crate::Score) -> anyhow::Result<()> {
    let line = serde_json::json!({"reward": s.reward, "extracted": s.extracted, "gold": s.gold});
    writeln!(out, "{line}").context("writing to stdout")?;
    Ok(())
}

/// Runs `rlvr reward`, writing one JSON line per scored completion to `out` (and, with `--explain`, the
/// explanations to stderr).
///
/// # Errors
/// A missing `--completion`/`--input`, a missing reference (or countdown numbers/target), an unreadable
/// input file, or a malformed input line (the error names the file, the 1-based line and the field).
pub fn run(args: &RewardArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    run_with_log(args, out, &mut std::io::stderr())
}

/// [`run`] with the `--explain` text written to `log` instead of stderr (one block per completion,
/// headed `== completion` or `== line N`).
///
/// # Errors
/// As [`run`].
pub fn run_with_log(
    args: &RewardArgs,
    out: &mut dyn Write,
    log: &mut dyn Write,
) -> anyhow::Result<()> {
    let v = verifier(args);
    let Some(path) = &args.input else {
        let Some(completion) = &args.completion else {
            bail!("give --completion TEXT (with --reference) or --input FILE.jsonl");
        };
        let reference = reference_for(
            args.task,
            args.reference.as_deref(),
            args.numbers.as_ref(),
            args.target,
        )?;
        let s = score_one(
            args,
            v.as_ref(),
            &Sample::new(completion, &reference),
            log,
            "completion",
        )?;
        return write_score(out, &s);
    };
    let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut reader = BufReader::new(file);
    let mut buf = Vec::new();
    let mut lineno = 0usize;
    loop {
        buf.clear();
        // Split on `\n` only: U+2028 inside a JSON string is not a line break.
        let n = reader
            .read_until(b'\n', &mut buf)
            .with_context(|| format!("reading {}", path.display()))?;
        if n == 0 {
            break;
        }
        lineno += 1;
        let text = std::str::from_utf8(&buf)
            .with_context(|| format!("{}:{lineno}: not UTF-8", path.display()))?;
        if text.trim().is_empty() {
            continue;
        }
        let row: InputLine = serde_json::from_str(text).with_context(|| {
            format!(
                "{}:{lineno}: expected {{\"completion\": str, \"reference\": str}} (countdown: \"numbers\", \"target\")",
                path.display()
            )
        })?;
        let reference = reference_for(
            args.task,
            row.reference.as_deref().or(args.reference.as_deref()),
            row.numbers.as_ref().or(args.numbers.as_ref()),
            row.target.or(args.target),
        )
        .with_context(|| format!("{}:{lineno}: field missing", path.display()))?;
        let sample = Sample {
            prompt: row.prompt.as_deref().unwrap_or(""),
            completion: &row.completion,
            reference: &reference,
            ..Default::default()
        };
        let s = score_one(args, v.as_ref(), &sample, log, &format!("line {lineno}"))
            .with_context(|| format!("{}:{lineno}", path.display()))?;
        write_score(out, &s)?;
    }
    Ok(())
}
