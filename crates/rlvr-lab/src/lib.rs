//! `rlvr lab [SWEEP.toml] [--jobs N] [--fast] [--out DIR] [--dry-run] [--only ARM]` (DESIGN.md
//! section 12): runs a grid of arms (an algorithm preset plus overrides at a sync interval
//! and offset) × seeds from one warm start per seed, as child processes of the `rlvr` binary, then
//! analyses it.
//!
//! Output in DIR (default `runs/lab`, `runs/lab-fast` with `--fast`):
//! - `ARM/seed-S/`: ordinary run directories (`rlvr plot`, `rlvr eval` and `rlvr train --resume`
//!   accept them), plus the lab's `lab.json` and `lab.log`;
//! - `warm_start/seed-S/`: the quickstart's warm start of seed S (`rlvr quickstart --warm-start-only`);
//! - `summary.json`, `summary.md` ([`summary`]), `verdicts.json`, `verdicts.md` ([`verdict`]), the
//!   figures as `.svg` and `.png` ([`figures`]) and `lab.json` (the sweep, wall time, load);
//! - `lab_data.json` ([`data`]): the small per-run data all of those are made from;
//!   `rlvr lab --redraw DIR` remakes them from it alone, without the run directories.
//!
//! Process handling and resume: see [`runner`].

#![deny(unsafe_code)] // three audited exceptions in runner.rs: installing a signal handler, prctl in pre_exec, kill(2) of a child

pub mod data;
pub mod figures;
pub mod regimes;
pub mod runner;
pub mod summary;
pub mod sweep;
pub mod verdict;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use serde_json::json;

use crate::sweep::Sweep;

/// Arguments of `rlvr lab`.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct LabArgs {
    /// Sweep file (default: the built-in `configs/lab.toml`).
    pub sweep: Option<PathBuf>,
    /// Runs at once (default: the sweep's `[lab].jobs`). Each run has the sweep's pinned thread
    /// count, so results do not depend on this.
    #[arg(long)]
    pub jobs: Option<usize>,
    /// The sweep's `[fast]` selection: one seed, fewer steps, only the arms the claims need.
    #[arg(long)]
    pub fast: bool,
    /// Lab directory (default `runs/lab`, or `runs/lab-fast` with `--fast`). Rerunning on the same
    /// directory resumes: finished runs are kept, unfinished ones continue.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// List the runs and the estimated wall time; run nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Only these arms (name or preset; repeatable).
    #[arg(long)]
    pub only: Vec<String>,
    /// Moving-average window of the diagnostics figures (default: the sweep's `[lab].smooth`;
    /// with --redraw, the window the lab drew with).
    #[arg(long)]
    pub smooth: Option<usize>,
    /// Run nothing: remake the summaries, verdicts and figures of the lab directory DIR from its
    /// lab_data.json alone (no run directories or sweep file needed), into DIR, or into --out.
    #[arg(
        long,
        value_name = "DIR",
        conflicts_with_all = ["sweep", "jobs", "fast", "dry_run", "only"]
    )]
    pub redraw: Option<PathBuf>,
    /// Run nothing: compare lab directories that judged the claims in different regimes
    /// (`NAME=DIR`, repeatable, two or more; each read from its lab_data.json): writes
    /// regimes.md/json into --out (default: the current directory) saying, per claim, whether
    /// its verdict depends on the regime, with each arm's drift and accuracy per regime.
    #[arg(
        long,
        value_name = "NAME=DIR",
        conflicts_with_all = ["sweep", "jobs", "fast", "dry_run", "only", "redraw"]
    )]
    pub regimes: Vec<String>,
}

fn load_avg() -> Option<String> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
}

/// `n` and `noun`, pluralised with an `s` unless `n` is 1: `1 step`, `2 steps`, `0 runs`.
pub fn counted(n: u64, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

/// The most runs at once (`--jobs`): each is a process with its own threads.
pub const MAX_JOBS: usize = 1024;

/// The widest moving average of the figures (`--smooth`), in steps.
pub const MAX_SMOOTH: usize = 100_000;

/// `12 min 05 s`; from two hours on, `144 h 00 min`.
fn fmt_min(s: f64) -> String {
    if s >= 7200.0 {
        let m = (s / 60.0).round();
        return format!("{:.0} h {:02.0} min", (m / 60.0).floor(), m % 60.0);
    }
    format!("{:.0} min {:02.0} s", (s / 60.0).floor(), s % 60.0)
}

/// Reads the runs under `out`, writes lab_data.json ([`data`]) and then, from that file alone, summary.json/md,
/// the figures and verdicts.json/md ([`analyse_data`]); returns the verdicts.
///
/// # Errors
/// I/O and drawing errors.
pub fn analyse(
    sweep: &Sweep,
    out: &std::path::Path,
    smooth: usize,
) -> anyhow::Result<Vec<verdict::Verdict>> {
    let runs: Vec<summary::RunSummary> = sweep
        .runs()
        .iter()
        .filter(|r| rlvr_rundir::files::metrics(&sweep.run_dir(out, r)).exists())
        .map(|r| summary::summarise(sweep, out, r))
        .collect();
    data::LabData::collect(&runs, smooth, sweep.lab.paper_claims, &sweep.claims).write(out)?;
    // Drawn from the file as written (JSON's decimal numbers), as a redraw from it is.
    analyse_data(&data::LabData::read(out)?, out, smooth)
}

/// Writes summary.json/md, the figures and verdicts.json/md of `d` into `out`; returns the
/// verdicts. `rlvr lab` and `rlvr lab --redraw` both end here.
///
/// # Errors
/// I/O and drawing errors.
pub fn analyse_data(
    d: &data::LabData,
    out: &Path,
    smooth: usize,
) -> anyhow::Result<Vec<verdict::Verdict>> {
    let runs = d.summaries();
    let stats = summary::arm_stats(&runs);
    summary::write(out, &runs, &stats)?;
    if !runs.is_empty() {
        figures::write_all(out, d, smooth)?;
    }
    let vs = verdict::all_verdicts(&stats, d.paper_claims, &d.claims);
    let p = out.join("verdicts.json");
    let j = json!({"margin": verdict::MARGIN, "verdicts": vs});
    std::fs::write(&p, serde_json::to_string_pretty(&j)? + "\n")
        .with_context(|| format!("writing {}", p.display()))?;
    std::fs::write(
        out.join("verdicts.md"),
        verdict::markdown(&vs, verdict::MARGIN),
    )?;
    Ok(vs)
}

/// `rlvr lab --redraw DIR [--out OUT] [--smooth W]`: reads DIR/lab_data.json and writes the
/// summaries, verdicts and figures (and, into another OUT, the data file too); returns the
/// verdicts.
///
/// # Errors
/// A missing or malformed lab_data.json, I/O and drawing errors.
pub fn redraw(
    dir: &Path,
    out: Option<&Path>,
    smooth: Option<usize>,
) -> anyhow::Result<Vec<verdict::Verdict>> {
    let d = data::LabData::read(dir)?;
    let out = out.unwrap_or(dir);
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    if out.canonicalize().ok() != dir.canonicalize().ok() {
        // The file itself (re-serialising parsed floats need not give the same digits).
        let (from, to) = (dir.join(data::FILE), out.join(data::FILE));
        std::fs::copy(&from, &to)
            .with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
    }
    analyse_data(&d, out, smooth.unwrap_or(d.smooth))
}

/// The verdict table on the terminal: per claim its status, the paired one and the statement, and
/// under it why it is inconclusive when verdicts.md's note says so (an arm missing from the sweep,
/// too few seeds, arms pinned at 0% or 100%); when the papers' claims miss arms, how to judge only
/// the sweep's own.
fn print_verdicts(vs: &[verdict::Verdict], out: &mut dyn Write) -> anyhow::Result<()> {
    writeln!(
        out,
        "\n{:<4} {:<14} {:<15} claim",
        "", "status", "paired by seed"
    )?;
    for v in vs {
        writeln!(
            out,
            "{:<4} {:<14} {:<15} {}",
            v.claim,
            v.status.name(),
            v.paired_status.map_or("–", |p| p.name()),
            v.statement
        )?;
        if !v.note.is_empty() {
            writeln!(out, "{:<35}({})", "", v.note)?;
        }
    }
    let paper = ["A1", "B1", "B2", "B3", "B4a", "B4b"];
    if vs
        .iter()
        .any(|v| paper.contains(&v.claim.as_str()) && v.note.contains("missing from the data"))
    {
        writeln!(
            out,
            "(the papers' claims need the default sweep's arms; a sweep of its own judges only its \
             [[claim]]s with [lab].paper_claims = false)"
        )?;
    }
    Ok(())
}

/// Runs `rlvr lab`: the sweep (resuming what a previous lab on the same directory left), then the
/// analysis; prints the verdict table.
///
/// # Errors
/// A bad sweep, I/O, an interruption (rerun to resume), and failed runs (listed; the analysis of
/// the others is written first).
// The command top to bottom (dry run, sweep, analysis, verdict table); each stage is one call and
// most lines are the printing.
pub fn run(a: &LabArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let t0 = Instant::now();
    if !a.regimes.is_empty() {
        anyhow::ensure!(
            a.regimes.len() >= 2,
            "--regimes needs two or more lab directories (NAME=DIR each), got {}",
            a.regimes.len()
        );
        let to = a.out.clone().unwrap_or_else(|| PathBuf::from("."));
        let claims = regimes::write(&a.regimes, &to)?;
        for c in &claims {
            writeln!(
                out,
                "{:<6} {}",
                c.claim,
                if c.depends {
                    "depends on the regime"
                } else if c.paired_depends {
                    "same verdict (paired by seed differs)"
                } else {
                    "same verdict in every regime"
                }
            )?;
        }
        writeln!(out, "lab: {}", to.join("regimes.md").display())?;
        return Ok(());
    }
    if let Some(dir) = &a.redraw {
        let vs = redraw(dir, a.out.as_deref(), a.smooth)?;
        print_verdicts(&vs, out)?;
        let to = a.out.as_deref().unwrap_or(dir);
        writeln!(
            out,
            "lab: redrawn from {} in {}: {}, {}, {}",
            dir.join(data::FILE).display(),
            fmt_min(t0.elapsed().as_secs_f64()),
            to.join("summary.md").display(),
            to.join("verdicts.md").display(),
            to.join("accuracy_v*.png").display(),
        )?;
        return Ok(());
    }
    let text = match &a.sweep {
        Some(p) => {
            std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?
        }
        None => sweep::DEFAULT_SWEEP.to_string(),
    };
    let parsed = match &a.sweep {
        Some(p) => Sweep::parse_file(&text, p),
        None => Sweep::parse(&text),
    };
    let sweep = parsed
        .and_then(|s| s.select(a.fast, &a.only))
        .with_context(|| match &a.sweep {
            Some(p) => format!("in the sweep file {}", p.display()),
            None => "in the built-in sweep (configs/lab.toml)".into(),
        })?;
    let dir = a
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from(if a.fast { "runs/lab-fast" } else { "runs/lab" }));
    if let Some(j) = a.jobs {
        anyhow::ensure!(
            (1..=MAX_JOBS).contains(&j),
            "--jobs {j} is out of range: expected 1 to {MAX_JOBS} runs at once"
        );
    }
    if let Some(w) = a.smooth {
        anyhow::ensure!(
            w <= MAX_SMOOTH,
            "--smooth {w} is out of range: at most {MAX_SMOOTH} steps (0 and 1: no smoothing)"
        );
    }
    let jobs = a.jobs.unwrap_or(sweep.lab.jobs).max(1);
    let smooth = a.smooth.unwrap_or(sweep.lab.smooth);
    let runs = sweep.runs();
    let exe = std::env::current_exe().context("locating the rlvr binary")?;
    check_arms(&sweep, &dir, &exe)?;
    if a.dry_run {
        writeln!(
            out,
            "{:<24} {:<18} {:>8} {:>6} {:>5}  {:<9} run directory",
            "arm", "preset", "interval", "offset", "seed", "state"
        )?;
        for r in &runs {
            let arm = &sweep.arms[r.arm];
            let d = sweep.run_dir(&dir, r);
            let rec = runner::RunRecord::read(&d);
            let busy = d.is_dir() && runner::try_hold(&d)?.is_err();
            let state = if busy {
                "in use"
            } else if runner::stale(&sweep, &dir, &exe, r)?.is_some() {
                "stale"
            } else if rec.done {
                "done"
            } else if d.join(rlvr_rundir::files::CONFIG).exists() {
                "resume"
            } else {
                "new"
            };
            writeln!(
                out,
                "{:<24} {:<18} {:>8} {:>6} {:>5}  {:<9} {}",
                arm.name,
                arm.preset,
                arm.interval,
                arm.offset,
                r.seed,
                state,
                d.display()
            )?;
        }
        if let Some(plan) = &sweep.plan {
            write_plan(&sweep, plan, &dir, &exe, out)?;
        }
        let warm = if sweep.uses_quickstart() {
            sweep.lab.seeds.len()
        } else {
            0
        };
        writeln!(
            out,
            "{} of {}, {}, {jobs} at once ({} each): about {} \
             ({} s/step, {:.0} s per warm start; from the sweep's [lab].seconds_per_step)",
            counted(runs.len() as u64, "run"),
            counted(sweep.lab.steps, "step"),
            counted(warm as u64, "warm start"),
            counted(sweep.lab.threads as u64, "thread"),
            fmt_min(sweep.estimate_s(jobs)),
            sweep.lab.seconds_per_step,
            sweep.warm_start.seconds,
        )?;
        return Ok(());
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let load_start = load_avg();
    let outcome = runner::run_sweep(&sweep, &dir, &exe, jobs)?;
    let vs = analyse(&sweep, &dir, smooth)?;
    let wall = t0.elapsed().as_secs_f64();
    let total = write_lab_json(
        &dir,
        &text,
        json!({
            "fast": a.fast, "only": a.only, "jobs": jobs, "threads": sweep.lab.threads,
            "runs": runs.len(), "kept": outcome.kept, "started": outcome.started,
            "stale": outcome.stale,
            "busy": outcome.busy,
            "wall_s": wall, "loadavg": {"start": load_start, "end": load_avg()},
            "failures": outcome.failures,
        }),
    )?;
    print_verdicts(&vs, out)?;
    writeln!(
        out,
        "lab: {} ({} kept, {} children started) in {} (all invocations on this directory: \
         {}); {}, {}, {}",
        counted(runs.len() as u64, "run"),
        outcome.kept,
        outcome.started,
        fmt_min(wall),
        fmt_min(total),
        dir.join("summary.md").display(),
        dir.join("verdicts.md").display(),
        dir.join("accuracy_v*.png").display(),
    )?;
    if !outcome.failures.is_empty() {
        anyhow::bail!(
            "{} task(s) failed:\n  {}",
            outcome.failures.len(),
            outcome.failures.join("\n  ")
        );
    }
    Ok(())
}

/// The quickstart's config, the base config of every run whose warm start is the quickstart's
/// (each warm start writes its own copy, `DIR/warm_start/seed-S/quickstart.toml`): what
/// [`check_arms`] resolves an arm against before that copy exists.
const QUICKSTART_CONFIG: &str = include_str!("../../../configs/quickstart.toml");

/// Before anything runs, and in `--dry-run`: each arm's `rlvr train` command for the first seed,
/// resolved with `--print-config` (no model is loaded), so that an unknown preset, a `--set` of
/// an unknown key or an out-of-range value (a sync offset beyond the steps) is named at once
/// instead of failing when the arm's turn comes, after the warm starts and the arms before it.
/// A base config that a quickstart warm start has not written yet is the quickstart's built-in
/// one ([`QUICKSTART_CONFIG`]).
///
/// # Errors
/// Every arm whose command does not resolve, each with `rlvr train`'s message; the binary cannot
/// be started.
fn check_arms(sweep: &Sweep, dir: &Path, exe: &Path) -> anyhow::Result<()> {
    let Some(&seed) = sweep.lab.seeds.first() else {
        return Ok(());
    };
    let builtin =
        std::env::temp_dir().join(format!("rlvr-lab-quickstart-{}.toml", std::process::id()));
    let mut bad = Vec::new();
    for (i, arm) in sweep.arms.iter().enumerate() {
        let mut args = sweep.train_args(dir, &sweep::RunSpec { arm: i, seed });
        if let Some(k) = args.iter().position(|a| a == "--config") {
            if args.get(k + 1).is_some_and(|c| !Path::new(c).exists()) && sweep.uses_quickstart() {
                if !builtin.exists() {
                    std::fs::write(&builtin, QUICKSTART_CONFIG)
                        .with_context(|| format!("writing {}", builtin.display()))?;
                }
                args[k + 1] = builtin.display().to_string();
            }
        }
        args.push("--print-config".into());
        let out = std::process::Command::new(exe)
            .args(&args)
            .stdin(std::process::Stdio::null())
            .output()
            .with_context(|| format!("starting {}", exe.display()))?;
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr);
            let msg = err.trim().trim_start_matches("error: ");
            bad.push(format!("arm {}: {msg}", arm.name));
        }
    }
    let _ = std::fs::remove_file(&builtin);
    if !bad.is_empty() {
        anyhow::bail!(
            "{} of the sweep's {} cannot start (nothing was run):\n  {}",
            counted(bad.len() as u64, "arm"),
            counted(sweep.arms.len() as u64, "arm"),
            bad.join("\n  ")
        );
    }
    Ok(())
}

/// `--dry-run`'s memory plan (`[plan]`): for each arm, `rlvr plan --json` on the arm's resolved
/// config (first seed; the model replaced by `[plan].shape` when it has no config.json here), one
/// line each with the training and sampling peaks and whether they fit `[plan].gpu_memory`.
///
/// # Errors
/// `rlvr plan` failing on an arm (its message), or unreadable output.
fn write_plan(
    sweep: &Sweep,
    plan: &sweep::PlanSection,
    dir: &Path,
    exe: &Path,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let gib =
        |j: &serde_json::Value, k: &str| j[k].as_f64().unwrap_or(f64::NAN) / (1u64 << 30) as f64;
    writeln!(
        out,
        "\nMemory per run (`rlvr plan`, in {}):\n{:<24} {:>12} {:>13} {:>11}  fits",
        plan.gpu_memory, "arm", "train GiB", "sampling GiB", "micro-batch"
    )?;
    let Some(&seed) = sweep.lab.seeds.first() else {
        return Ok(());
    };
    for (i, arm) in sweep.arms.iter().enumerate() {
        let args = sweep.train_args(dir, &sweep::RunSpec { arm: i, seed });
        // train --no-progress --config C --set K=V ... -> plan --config C --set K=V ...
        let mut pargs: Vec<String> = vec!["plan".into()];
        let mut it = args.into_iter().skip(2);
        while let Some(a) = it.next() {
            if a == "--set" {
                let Some(v) = it.next() else { break };
                if let (Some(m), Some(shape)) = (v.strip_prefix("model.path="), &plan.shape) {
                    if !Path::new(m).join("config.json").exists() {
                        pargs.extend(["--set".into(), format!("model.path={shape}")]);
                        continue;
                    }
                }
                pargs.extend(["--set".into(), v]);
            } else {
                pargs.push(a);
            }
        }
        pargs.extend([
            "--gpu-memory".into(),
            plan.gpu_memory.clone(),
            "--json".into(),
        ]);
        let o = std::process::Command::new(exe)
            .args(&pargs)
            .output()
            .with_context(|| format!("running {} plan", exe.display()))?;
        anyhow::ensure!(
            o.status.success(),
            "[plan]: `rlvr plan` failed on arm `{}`: {}",
            arm.name,
            String::from_utf8_lossy(&o.stderr).trim()
        );
        let text = String::from_utf8_lossy(&o.stdout);
        let j: serde_json::Value = text
            .lines()
            .last()
            .and_then(|l| serde_json::from_str(l).ok())
            .with_context(|| {
                format!(
                    "[plan]: unreadable `rlvr plan --json` output for arm `{}`",
                    arm.name
                )
            })?;
        writeln!(
            out,
            "{:<24} {:>12.1} {:>13.1} {:>11}  {}",
            arm.name,
            gib(&j, "train_peak"),
            gib(&j, "rollout_peak"),
            j["micro_batch_rows"]
                .as_u64()
                .map_or("?".into(), |n| n.to_string()),
            if j["fits"].as_bool() == Some(true) {
                "yes"
            } else {
                "no"
            }
        )?;
    }
    Ok(())
}

/// Writes OUT/lab.json: this invocation's record `v` (options, runs kept and started, wall time,
/// load) with the sweep's text, plus `invocations`, every invocation's record on this directory in
/// order (a killed and resumed lab, or a rerun that only re-analyses, adds one), and `wall_s_total`,
/// their wall times summed. Returns that total.
///
/// # Errors
/// I/O.
fn write_lab_json(out: &Path, sweep_text: &str, v: serde_json::Value) -> anyhow::Result<f64> {
    let path = out.join("lab.json");
    let old: Option<serde_json::Value> = std::fs::read_to_string(&path)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok());
    let mut history: Vec<serde_json::Value> = match old {
        Some(o) => match o.get("invocations").and_then(|h| h.as_array()) {
            Some(h) => h.clone(),
            // A lab.json from before `invocations` existed: its own record is the first one.
            None => {
                let mut first = o.clone();
                if let Some(m) = first.as_object_mut() {
                    m.remove("sweep");
                }
                vec![first]
            }
        },
        None => Vec::new(),
    };
    history.push(v.clone());
    let total: f64 = history.iter().filter_map(|h| h["wall_s"].as_f64()).sum();
    let mut v = v;
    v["sweep"] = json!(sweep_text);
    v["invocations"] = json!(history);
    v["wall_s_total"] = json!(total);
    let tmp = out.join(".lab.json.tmp");
    std::fs::write(&tmp, serde_json::to_string_pretty(&v)? + "\n")
        .with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, &path).with_context(|| format!("writing {}", path.display()))?;
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Under each claim its note, when it has one; the hint about `paper_claims` when a paper's
    /// claim misses arms. The table used to say "inconclusive" with nothing about why.
    #[test]
    fn the_verdict_table_says_why_a_claim_is_inconclusive() {
        let v = |claim: &str, note: &str| verdict::Verdict {
            claim: claim.into(),
            statement: format!("{claim} holds"),
            status: verdict::Status::Inconclusive,
            comparisons: Vec::new(),
            note: note.into(),
            paired_status: None,
        };
        let mut out = Vec::new();
        print_verdicts(
            &[
                v("B1", "missing from the data: REINFORCE at interval 1"),
                v("C1", ""),
            ],
            &mut out,
        )
        .unwrap();
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[2].starts_with("B1") && lines[2].ends_with("B1 holds"),
            "{text}"
        );
        assert_eq!(
            lines[3].trim(),
            "(missing from the data: REINFORCE at interval 1)",
            "{text}"
        );
        assert!(lines[4].starts_with("C1"), "{text}");
        assert!(text.contains("[lab].paper_claims = false"), "{text}");
        let mut out = Vec::new();
        print_verdicts(&[v("C1", "")], &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert_eq!(text.lines().count(), 3, "{text}");
    }
}
