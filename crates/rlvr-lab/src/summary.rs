//! summary.json (one entry per run) and summary.md (mean ± std over seeds per arm), read from each
//! run directory's metrics.jsonl (DESIGN.md section 10) and the lab's RUN/lab.json.

use std::path::Path;

use anyhow::Context;
use rlvr_rundir::jsonl::{number, Line};
use rlvr_rundir::key::{Eval, Metric};
use serde::{Deserialize, Serialize};

pub use rlvr_rundir::jsonl::{read_lines, series};
pub use rlvr_rundir::schedule::window_end;

use crate::runner::RunRecord;
use crate::sweep::{RunSpec, Sweep};

/// One run's numbers. Accuracies are fractions in [0, 1]; `None` where the run has no value.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RunSummary {
    /// Arm name.
    pub arm: String,
    /// Algorithm name (the arm's label).
    pub label: String,
    /// `algorithm.preset`.
    pub preset: String,
    /// `sync.interval` v.
    pub interval: u64,
    /// `sync.offset` o.
    pub offset: u64,
    /// Seed.
    pub seed: u64,
    /// The run directory.
    pub run_dir: String,
    /// The run finished (RUN/lab.json).
    pub done: bool,
    /// Last step in metrics.jsonl.
    pub steps: u64,
    /// Held-out accuracy at the last evaluation.
    pub final_accuracy: Option<f64>,
    /// Step of the last evaluation.
    pub final_step: Option<u64>,
    /// Best held-out accuracy over the evaluations (step 0 included).
    pub best_accuracy: Option<f64>,
    /// Area under the held-out accuracy curve (trapezoid over the evaluation steps) divided by the
    /// steps it spans: the run's mean held-out accuracy, in [0, 1].
    pub auc: Option<f64>,
    /// Held-out accuracy at step 0 (the warm start).
    pub warm_accuracy: Option<f64>,
    /// Problems in the held-out evaluation (`eval/n`).
    pub eval_n: Option<u64>,
    /// Wall seconds of the run over all its attempts.
    pub wall_s: f64,
    /// `clip_frac` at the last step (where in its sync window the run ends decides much of it).
    pub clip_frac: Option<f64>,
    /// `clip_frac` averaged over every training step of the run (every phase of the sync
    /// windows), from lab_data.json's series (3 significant digits); filled by
    /// [`crate::data::LabData::summaries`], never stored in lab_data.json.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clip_frac_mean: Option<f64>,
    /// `ratio/min` at the last step.
    pub ratio_min: Option<f64>,
    /// `ratio/max` at the last step.
    pub ratio_max: Option<f64>,
    /// The smallest `ratio/min` over every training step of the run, from lab_data.json's series
    /// (3 significant digits); filled by [`crate::data::LabData::summaries`], never stored in
    /// lab_data.json.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ratio_min_run: Option<f64>,
    /// The largest `ratio/max` over every training step of the run, as [`Self::ratio_min_run`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ratio_max_run: Option<f64>,
    /// `entropy` at the last step.
    pub entropy: Option<f64>,
    /// Drift per sync window: the mean, over the last step of every sync window, of that step's
    /// `kl_behaviour` (the k3 estimate of KL(π_behaviour ‖ π_θ) per trained token, nats), see
    /// [`window_drift`]. `None` without such steps (or in a lab_data.json from before it existed).
    #[serde(default)]
    pub drift: Option<f64>,
}

/// Trapezoid area under `pts` divided by the x span (a single point: its value).
pub fn mean_area(pts: &[(f64, f64)]) -> Option<f64> {
    match pts {
        [] => None,
        [(_, y)] => Some(*y),
        _ => {
            let span = pts[pts.len() - 1].0 - pts[0].0;
            let area: f64 = pts
                .windows(2)
                .map(|w| 0.5 * (w[0].1 + w[1].1) * (w[1].0 - w[0].0))
                .sum();
            (span > 0.0).then(|| area / span)
        }
    }
}

/// The drift of a run per sync window: the mean of `kl_behaviour` over the steps that end a sync
/// window ([`window_end`]) and have a value. `kl_behaviour` is the mean over the step's trained
/// tokens of the k3 estimate ρ − 1 − log ρ, ρ = π_θ/π_behaviour, with π_θ the training forward
/// (the weights at the step's start for the first update), so at a window's last step it measures
/// how far v − 1 updates (plus o) moved the policy from the one that sampled the batch: the
/// quantity paper A's staleness argument is about (arXiv 2505.22257 section 3), measured instead of
/// assumed. Nats per token; `None` without a value at a window end.
pub fn window_drift(lines: &[Line], v: u64, o: u64) -> Option<f64> {
    let ends: Vec<f64> = series(lines, Metric::KlBehaviour)
        .into_iter()
        .filter(|&(t, k)| t >= 1.0 && k.is_finite() && window_end(t as u64, v, o))
        .map(|p| p.1)
        .collect();
    (!ends.is_empty()).then(|| ends.iter().sum::<f64>() / ends.len() as f64)
}

/// Summarises one run of the sweep.
pub fn summarise(sweep: &Sweep, out: &Path, r: &RunSpec) -> RunSummary {
    let arm = &sweep.arms[r.arm];
    let dir = sweep.run_dir(out, r);
    let lines = read_lines(&dir);
    let acc = series(&lines, Eval::Accuracy);
    let last_train = lines
        .iter()
        .rev()
        .find(|l| l.get(Metric::Loss.key()).is_some());
    let at_end = |k: Metric| last_train.and_then(|l| number(l, k));
    let rec = RunRecord::read(&dir);
    RunSummary {
        arm: arm.name.clone(),
        label: arm.label().to_string(),
        preset: arm.preset.clone(),
        interval: arm.interval,
        offset: arm.offset,
        seed: r.seed,
        run_dir: dir.display().to_string(),
        done: rec.done,
        steps: lines
            .iter()
            .filter_map(|l| l.get(Metric::Step.key())?.as_u64())
            .max()
            .unwrap_or(0),
        final_accuracy: acc.last().map(|p| p.1),
        final_step: acc.last().map(|p| p.0 as u64),
        best_accuracy: acc.iter().map(|p| p.1).reduce(f64::max),
        auc: mean_area(&acc),
        warm_accuracy: acc.iter().find(|p| p.0 == 0.0).map(|p| p.1),
        eval_n: lines
            .iter()
            .rev()
            .find_map(|l| number(l, Eval::N))
            .map(|n| n as u64),
        wall_s: rec.wall_s,
        clip_frac: at_end(Metric::ClipFrac),
        clip_frac_mean: None,
        ratio_min: at_end(Metric::RatioMin),
        ratio_max: at_end(Metric::RatioMax),
        ratio_min_run: None,
        ratio_max_run: None,
        entropy: at_end(Metric::Entropy),
        drift: window_drift(&lines, arm.interval, arm.offset),
    }
}

/// Mean, sample standard deviation (0 for one value) and count of the present values.
pub fn mean_std(xs: impl IntoIterator<Item = Option<f64>>) -> Option<(f64, f64, usize)> {
    let v: Vec<f64> = xs.into_iter().flatten().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    let n = v.len() as f64;
    let m = v.iter().sum::<f64>() / n;
    let var = if v.len() > 1 {
        v.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / (n - 1.0)
    } else {
        0.0
    };
    Some((m, var.sqrt(), v.len()))
}

/// Held-out problems assumed when a run does not say (`eval/n`).
pub const DEFAULT_EVAL_N: u64 = 500;

/// A mean over seeds and its standard error: std/√n over n ≥ 2 seeds; with one seed, the binomial
/// standard error √(p(1−p)/N) of an N-problem evaluation (N = 500: at most 2.2 points).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
pub struct Estimate {
    /// Mean over seeds.
    pub mean: f64,
    /// Sample standard deviation over seeds (0 with one seed).
    pub std: f64,
    /// Standard error of the mean.
    pub se: f64,
    /// Seeds.
    pub n: usize,
}

impl Estimate {
    /// The estimate of `values` (fractions) from evaluations of `eval_n` problems.
    pub fn of(values: impl IntoIterator<Item = Option<f64>>, eval_n: u64) -> Option<Estimate> {
        let (mean, std, n) = mean_std(values)?;
        let se = if n >= 2 {
            std / (n as f64).sqrt()
        } else {
            (mean * (1.0 - mean) / eval_n.max(1) as f64).sqrt()
        };
        Some(Estimate { mean, std, se, n })
    }
}

/// One arm over its seeds.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ArmStats {
    /// Arm name.
    pub arm: String,
    /// Algorithm name.
    pub label: String,
    /// `algorithm.preset`.
    pub preset: String,
    /// `sync.interval`.
    pub interval: u64,
    /// `sync.offset`.
    pub offset: u64,
    /// Final held-out accuracy.
    pub final_accuracy: Option<Estimate>,
    /// Best held-out accuracy.
    pub best_accuracy: Option<Estimate>,
    /// Mean held-out accuracy over the run (area under the curve / steps).
    pub auc: Option<Estimate>,
    /// Warm-start (step 0) held-out accuracy of the same seeds.
    pub warm_accuracy: Option<Estimate>,
    /// Mean wall seconds per run.
    pub wall_s: f64,
    /// Mean clip fraction at the end.
    pub clip_frac: Option<f64>,
    /// Mean over seeds of each run's mean clip fraction over its steps
    /// ([`RunSummary::clip_frac_mean`]).
    #[serde(default)]
    pub clip_frac_mean: Option<f64>,
    /// Smallest `ratio/min` at the end over seeds.
    pub ratio_min: Option<f64>,
    /// Largest `ratio/max` at the end over seeds.
    pub ratio_max: Option<f64>,
    /// Smallest `ratio/min` over the whole run, over seeds ([`RunSummary::ratio_min_run`]).
    #[serde(default)]
    pub ratio_min_run: Option<f64>,
    /// Largest `ratio/max` over the whole run, over seeds ([`RunSummary::ratio_max_run`]).
    #[serde(default)]
    pub ratio_max_run: Option<f64>,
    /// Final held-out accuracy per seed, `(seed, fraction)`: for comparisons paired by seed.
    pub final_by_seed: Vec<(u64, f64)>,
    /// Warm-start held-out accuracy per seed, `(seed, fraction)`.
    pub warm_by_seed: Vec<(u64, f64)>,
    /// Drift per sync window ([`RunSummary::drift`], nats per token): mean ± std over seeds.
    #[serde(default)]
    pub drift: Option<Estimate>,
}

/// Groups `runs` by arm (first-appearance order) into [`ArmStats`].
pub fn arm_stats(runs: &[RunSummary]) -> Vec<ArmStats> {
    let mut names: Vec<&str> = Vec::new();
    for r in runs {
        if !names.contains(&r.arm.as_str()) {
            names.push(&r.arm);
        }
    }
    names
        .into_iter()
        .map(|name| {
            let rs: Vec<&RunSummary> = runs.iter().filter(|r| r.arm == name).collect();
            let n = rs.iter().find_map(|r| r.eval_n).unwrap_or(DEFAULT_EVAL_N);
            let est =
                |f: &dyn Fn(&RunSummary) -> Option<f64>| Estimate::of(rs.iter().map(|r| f(r)), n);
            let fin = |x: Option<f64>| x.filter(|v| v.is_finite());
            ArmStats {
                arm: name.to_string(),
                label: rs[0].label.clone(),
                preset: rs[0].preset.clone(),
                interval: rs[0].interval,
                offset: rs[0].offset,
                final_accuracy: est(&|r| r.final_accuracy),
                best_accuracy: est(&|r| r.best_accuracy),
                auc: est(&|r| r.auc),
                warm_accuracy: est(&|r| r.warm_accuracy),
                wall_s: rs.iter().map(|r| r.wall_s).sum::<f64>() / rs.len() as f64,
                clip_frac: mean_std(rs.iter().map(|r| r.clip_frac)).map(|m| m.0),
                clip_frac_mean: mean_std(rs.iter().map(|r| r.clip_frac_mean)).map(|m| m.0),
                ratio_min: rs.iter().filter_map(|r| fin(r.ratio_min)).reduce(f64::min),
                ratio_max: rs.iter().filter_map(|r| fin(r.ratio_max)).reduce(f64::max),
                ratio_min_run: rs
                    .iter()
                    .filter_map(|r| fin(r.ratio_min_run))
                    .reduce(f64::min),
                ratio_max_run: rs
                    .iter()
                    .filter_map(|r| fin(r.ratio_max_run))
                    .reduce(f64::max),
                final_by_seed: rs
                    .iter()
                    .filter_map(|r| fin(r.final_accuracy).map(|v| (r.seed, v)))
                    .collect(),
                warm_by_seed: rs
                    .iter()
                    .filter_map(|r| fin(r.warm_accuracy).map(|v| (r.seed, v)))
                    .collect(),
                drift: Estimate::of(rs.iter().map(|r| r.drift), n),
            }
        })
        .collect()
}

/// An accuracy estimate in percent, `mean ± std` over seeds (the mean alone for one seed).
pub(crate) fn pct(e: &Option<Estimate>) -> String {
    match e {
        Some(e) if e.n > 1 => format!("{:.1} ± {:.1}", 100.0 * e.mean, 100.0 * e.std),
        Some(e) => format!("{:.1}", 100.0 * e.mean),
        None => "–".into(),
    }
}

/// A drift estimate as `mean ± std` in the [`num`] style.
fn drift(e: &Option<Estimate>) -> String {
    match e {
        Some(e) if e.n > 1 => format!("{} ± {}", num(Some(e.mean)), num(Some(e.std))),
        Some(e) => num(Some(e.mean)),
        None => "–".into(),
    }
}

fn num(x: Option<f64>) -> String {
    match x {
        Some(v) if v != 0.0 && (v.abs() < 1e-2 || v.abs() >= 1e3) => format!("{v:.1e}"),
        Some(v) => format!("{v:.3}"),
        None => "–".into(),
    }
}

/// summary.md: one row per arm, accuracies in percent as mean ± std over seeds.
pub fn markdown(stats: &[ArmStats], runs: &[RunSummary]) -> String {
    let seeds: std::collections::BTreeSet<u64> = runs.iter().map(|r| r.seed).collect();
    let mut s = format!(
        "# Lab summary\n\n{}, seeds {:?}. Held-out accuracy in percent (greedy), mean ± std over \
         seeds; AUC = mean held-out accuracy over the run; clip fraction over the whole run (mean over \
         its steps, then over seeds) and at the last step (which depends on where in its sync window \
         the run ends); ratio min and max over the run: the smallest `ratio/min` and the largest \
         `ratio/max` of any training step of any seed; drift = KL(behaviour ‖ current) per token at the last step of each \
         sync window (`kl_behaviour`, nats), mean over the windows, mean ± std over seeds.\n\n",
        crate::counted(runs.len() as u64, "run"),
        seeds
    );
    s.push_str(
        "| arm | algorithm | interval | offset | seeds | final | best | AUC | warm start | clip frac (run) | clip frac (last) | ratio min (run) | ratio max (run) | drift | wall s |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for a in stats {
        s.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.0} |\n",
            a.arm,
            a.label,
            a.interval,
            a.offset,
            a.final_accuracy.map(|e| e.n).unwrap_or(0),
            pct(&a.final_accuracy),
            pct(&a.best_accuracy),
            pct(&a.auc),
            pct(&a.warm_accuracy),
            num(a.clip_frac_mean),
            num(a.clip_frac),
            num(a.ratio_min_run),
            num(a.ratio_max_run),
            drift(&a.drift),
            a.wall_s
        ));
    }
    s
}

/// Writes OUT/summary.json (`{"runs": [...], "arms": [...]}`) and OUT/summary.md.
///
/// # Errors
/// I/O.
pub fn write(out: &Path, runs: &[RunSummary], stats: &[ArmStats]) -> anyhow::Result<()> {
    let j = serde_json::json!({"runs": runs, "arms": stats});
    let p = out.join("summary.json");
    std::fs::write(&p, serde_json::to_string_pretty(&j)? + "\n")
        .with_context(|| format!("writing {}", p.display()))?;
    let p = out.join("summary.md");
    std::fs::write(&p, markdown(stats, runs)).with_context(|| format!("writing {}", p.display()))
}
