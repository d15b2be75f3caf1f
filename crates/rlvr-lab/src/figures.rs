//! The lab's figures, each as SVG and PNG, drawn from [`LabData`] (the lab's `lab_data.json`) with
//! rlvr-chart, the small-multiples code `rlvr plot --facet` draws with: panels on shared axes, one
//! title, the legend in its own column right of the data, integer steps, a band of ±1 standard
//! error of the mean over seeds under each mean curve ([`rlvr_chart::mean_se`], the aggregate
//! `rlvr plot --mean-over-seeds` draws too; before 2026-12-07 the band ran from the lowest to the
//! highest seed).
//! - `accuracy_vV`: held-out accuracy against step at sync interval V, one panel per algorithm
//!   family (the label's first word: GRPO, REINFORCE, REC, OPMD, AsymRE, RED), one curve per arm
//!   (arms with a sync offset o > 0 at that interval too, labelled `(o=…)`, and named in the
//!   title);
//! - `intervals`: one panel per algorithm run at several intervals, one curve per interval;
//! - `diagnostics_vV`: rows training reward (`reward/mean`, the mean reward of the step's
//!   completions, when lab_data.json has it), clip fraction, log10 of the importance ratio's max
//!   and min, entropy and log10 of `kl_behaviour` (the drift, KL(behaviour ‖ current) in nats per
//!   token), by the same family panels as `accuracy_vV` (moving average over `smooth` steps when
//!   > 1).
//!
//! [`figures`] builds them as data ([`Drawn`]); [`write_all`] draws them. A redraw from
//! lab_data.json builds the same data, which a test compares.

use std::path::{Path, PathBuf};

use rlvr_chart::{Figure, Line, Panel, Row};
use rlvr_rundir::key::{Eval, Metric};

use crate::data::{LabData, RunData};

/// The floor of the drift row's KL before its log10 (an on-policy step's k3 is ~0 up to rounding).
const KL_FLOOR: f64 = 1e-9;

/// Trailing moving average over `w` points (w ≤ 1: unchanged).
pub fn smooth(pts: &[(f64, f64)], w: usize) -> Vec<(f64, f64)> {
    if w <= 1 {
        return pts.to_vec();
    }
    let mut out = Vec::with_capacity(pts.len());
    let mut sum = 0.0;
    for i in 0..pts.len() {
        sum += pts[i].1;
        if i >= w {
            sum -= pts[i - w].1;
        }
        out.push((pts[i].0, sum / (i + 1).min(w) as f64));
    }
    out
}

/// A curve: (step, value) points.
type Series = Vec<(f64, f64)>;
/// A band over seeds: (step, mean − SE, mean + SE).
type Band = Vec<(f64, f64, f64)>;

/// Mean over seeds per step and the ±1 standard error band (steps present in every series only;
/// no band for one series): [`rlvr_chart::mean_se`].
fn aggregate(runs: &[Series]) -> (Series, Band) {
    let m = rlvr_chart::mean_se(runs);
    (m.mean, m.band)
}

/// One figure to draw: file stem, size in pixels, the figure.
#[derive(Debug, Clone, PartialEq)]
pub struct Drawn {
    /// File name without extension (`accuracy_v16`).
    pub stem: String,
    /// Width and height in pixels.
    pub size: (u32, u32),
    /// What is drawn.
    pub figure: Figure,
}

/// An algorithm's family: its label's first word (`REC-OneSide-IS` → `REC`, `GRPO (paper B)` →
/// `GRPO`, `GRPO, 2 turns` → `GRPO`: a comma or semicolon ends the word too).
pub fn family(label: &str) -> &str {
    label
        .split(['-', ' ', ',', ';'])
        .find(|w| !w.is_empty())
        .unwrap_or(label)
}

/// What a title says of the seeds: "mean of 3 seeds; band: ±1 standard error", "1 seed".
fn seeds_text(n: usize) -> String {
    if n == 1 {
        "1 seed".into()
    } else {
        format!("mean of {n} seeds; band: ±1 standard error")
    }
}

/// What a title says of the sync offsets of its arms: nothing when every arm has offset 0,
/// ", offset 0 and 1" when they differ, ", offset 1" when all share one o > 0.
fn offsets_text(offsets: &[u64]) -> String {
    let mut o: Vec<u64> = offsets.to_vec();
    o.sort_unstable();
    o.dedup();
    match o.as_slice() {
        [] | [0] => String::new(),
        [x] => format!(", offset {x}"),
        [init @ .., last] => format!(
            ", offset {} and {last}",
            init.iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// Columns of panels per line.
const COLS: usize = 3;
/// Height of one line of panels, pixels.
const PANEL_H: u32 = 290;
/// Width of one panel, pixels.
const PANEL_W: u32 = 380;

/// A width that holds `title` (20 px DejaVu Sans, about 12 px a character) and at least `w`.
fn fit_title(title: &str, w: u32) -> u32 {
    w.max(title.chars().count() as u32 * 12 + 40)
}

/// The lab's figures as data (see the module docs). `smooth_w` is the moving-average window of
/// the training diagnostics (1 = raw).
// One block per figure of the module docs' list, in that order; the runs are grouped by arm (the
// sweep's order), arms by interval and family.
pub fn figures(data: &LabData, smooth_w: usize) -> Vec<Drawn> {
    let runs = &data.runs;
    let mut arms: Vec<&str> = Vec::new();
    let mut labels: Vec<&str> = Vec::new();
    let mut intervals: Vec<u64> = Vec::new();
    for r in runs {
        let s = &r.summary;
        if !arms.contains(&s.arm.as_str()) {
            arms.push(&s.arm);
        }
        if !labels.contains(&s.label.as_str()) {
            labels.push(&s.label);
        }
        if !intervals.contains(&s.interval) {
            intervals.push(s.interval);
        }
    }
    intervals.sort_unstable();
    let of_arm =
        |arm: &str| -> Vec<&RunData> { runs.iter().filter(|r| r.summary.arm == arm).collect() };
    let first = |arm: &str| &of_arm(arm)[0].summary;
    // Per-run series of `key` mapped by `f` and smoothed over `w` steps, then mean and band.
    let line = |arm: &str, style: usize, key: &str, w: usize, f: &dyn Fn(f64) -> f64| {
        let per_run: Vec<Series> = of_arm(arm)
            .iter()
            .map(|r| {
                let s: Series = r
                    .points(key)
                    .into_iter()
                    .map(|(x, y)| (x, f(y)))
                    .filter(|p| p.1.is_finite())
                    .collect();
                smooth(&s, w)
            })
            .filter(|s| !s.is_empty())
            .collect();
        let (points, band) = aggregate(&per_run);
        Line {
            style,
            points,
            band,
            faint: Vec::new(),
        }
    };
    let pct = |y: f64| 100.0 * y;
    let mut out = Vec::new();

    for &v in &intervals {
        let here: Vec<&str> = arms
            .iter()
            .copied()
            .filter(|a| first(a).interval == v)
            .collect();
        let mut families: Vec<&str> = Vec::new();
        for a in &here {
            let f = family(&first(a).label);
            if !families.contains(&f) {
                families.push(f);
            }
        }
        // Styles in legend order: arms grouped by family.
        let ordered: Vec<&str> = families
            .iter()
            .flat_map(|f| {
                here.iter()
                    .copied()
                    .filter(move |a| family(&first(a).label) == *f)
            })
            .collect();
        let style = |a: &str| ordered.iter().position(|x| *x == a).unwrap_or(0);
        let legend: Vec<(String, usize)> = ordered
            .iter()
            .map(|a| {
                let s = first(a);
                let name = if s.offset > 0 {
                    format!("{} (o={})", s.label, s.offset)
                } else {
                    s.label.clone()
                };
                (name, style(a))
            })
            .collect();
        let seeds = of_arm(here[0]).len();
        let panels = |key: &str, w: usize, f: &dyn Fn(f64) -> f64| -> Vec<Panel> {
            families
                .iter()
                .map(|fam| Panel {
                    caption: Some(fam.to_string()),
                    lines: ordered
                        .iter()
                        .filter(|a| family(&first(a).label) == *fam)
                        .map(|a| line(a, style(a), key, w, f))
                        .collect(),
                    note: None,
                })
                .collect()
        };
        let cols = families.len().min(COLS);
        let lines = families.len().div_ceil(COLS) as u32;
        let legend_w = legend
            .iter()
            .map(|l| l.0.len() as u32 * 7 + 50)
            .max()
            .unwrap_or(0);
        let title = format!(
            "Held-out accuracy at sync interval {v}{} ({})",
            offsets_text(&here.iter().map(|a| first(a).offset).collect::<Vec<_>>()),
            seeds_text(seeds)
        );
        out.push(Drawn {
            stem: format!("accuracy_v{v}"),
            size: (
                fit_title(&title, PANEL_W * cols as u32 + legend_w),
                PANEL_H * lines + 40,
            ),
            figure: Figure {
                title: Some(title),
                rows: vec![Row {
                    y_desc: "held-out accuracy (%)".into(),
                    panels: panels(Eval::Accuracy.key(), 1, &pct),
                    legend: legend.clone(),
                }],
                cols: COLS,
                markers: true,
                solid: false,
                outer_labels: true,
            },
        });

        // Diagnostics: one row per quantity, the families side by side.
        let mut ratio = panels(Metric::RatioMax.key(), smooth_w, &f64::log10);
        for (p, lower) in
            ratio
                .iter_mut()
                .zip(panels(Metric::RatioMin.key(), smooth_w, &f64::log10))
        {
            p.lines.extend(lower.lines);
        }
        // The training reward first, where the data has it (a lab_data.json from before
        // 2026-12-07 does not): the curve the papers' figures open with.
        let has_reward = here.iter().any(|a| {
            of_arm(a)
                .iter()
                .any(|r| !r.points(Metric::RewardMean.key()).is_empty())
        });
        let mut rows = Vec::new();
        if has_reward {
            rows.push(Row {
                y_desc: "training reward (mean)".into(),
                panels: panels(Metric::RewardMean.key(), smooth_w, &|y| y),
                legend: Vec::new(),
            });
        }
        rows.extend([
            Row {
                y_desc: "clip fraction".into(),
                panels: panels(Metric::ClipFrac.key(), smooth_w, &|y| y),
                legend: Vec::new(),
            },
            Row {
                y_desc: "log10 ratio: max, min".into(),
                panels: ratio,
                legend: Vec::new(),
            },
            Row {
                y_desc: "entropy (nats/token)".into(),
                panels: panels(Metric::Entropy.key(), smooth_w, &|y| y),
                legend: Vec::new(),
            },
            Row {
                // The drift, KL(behaviour ‖ current) per token (summary.md's column is its mean
                // at the windows' last steps; "old" and "new" keep the label within the row's
                // height): floored at 1e-9, the k3 estimate's rounding level, so on-policy steps
                // stay on the axis.
                y_desc: "log10 KL(old||new), nats/token".into(),
                panels: panels(Metric::KlBehaviour.key(), smooth_w, &|y| {
                    y.max(KL_FLOOR).log10()
                }),
                legend: Vec::new(),
            },
        ]);
        // The legend beside the first row, the captions (the families) over it only: the
        // columns are the same below.
        rows[0].legend = legend.clone();
        for r in rows.iter_mut().skip(1) {
            for p in &mut r.panels {
                p.caption = None;
            }
        }
        let avg = if smooth_w > 1 {
            format!("; moving average over {smooth_w} steps")
        } else {
            String::new()
        };
        let title = format!(
            "Training diagnostics at sync interval {v}{} ({}{avg})",
            offsets_text(&here.iter().map(|a| first(a).offset).collect::<Vec<_>>()),
            seeds_text(seeds)
        );
        out.push(Drawn {
            stem: format!("diagnostics_v{v}"),
            size: (
                fit_title(&title, (PANEL_W - 60) * families.len() as u32 + legend_w),
                rows.len() as u32 * (PANEL_H - 30) + 40,
            ),
            figure: Figure {
                title: Some(title),
                rows,
                cols: 0,
                markers: false,
                solid: true,
                outer_labels: true,
            },
        });
    }

    // Each algorithm across intervals (offset-0 arms).
    let multi: Vec<&str> = labels
        .iter()
        .copied()
        .filter(|l| {
            let mut vs: Vec<u64> = runs
                .iter()
                .filter(|r| r.summary.label == *l && r.summary.offset == 0)
                .map(|r| r.summary.interval)
                .collect();
            vs.sort_unstable();
            vs.dedup();
            vs.len() > 1
        })
        .collect();
    if !multi.is_empty() {
        let istyle = |v: u64| intervals.iter().position(|x| *x == v).unwrap_or(0);
        let legend: Vec<(String, usize)> = intervals
            .iter()
            .map(|&v| (format!("interval {v}"), istyle(v)))
            .collect();
        let panels: Vec<Panel> = multi
            .iter()
            .map(|l| Panel {
                caption: Some(l.to_string()),
                lines: intervals
                    .iter()
                    .filter_map(|&v| {
                        arms.iter()
                            .copied()
                            .find(|a| {
                                let s = first(a);
                                s.label == *l && s.offset == 0 && s.interval == v
                            })
                            .map(|a| line(a, istyle(v), Eval::Accuracy.key(), 1, &pct))
                    })
                    .collect(),
                note: None,
            })
            .collect();
        let seeds = runs
            .iter()
            .map(|r| r.summary.seed)
            .collect::<std::collections::BTreeSet<_>>()
            .len();
        let cols = panels.len().min(COLS);
        let lines = panels.len().div_ceil(COLS) as u32;
        let title = format!(
            "Held-out accuracy across sync intervals ({})",
            seeds_text(seeds)
        );
        out.push(Drawn {
            stem: "intervals".into(),
            size: (
                fit_title(&title, PANEL_W * cols as u32 + 150),
                PANEL_H * lines + 40,
            ),
            figure: Figure {
                title: Some(title),
                rows: vec![Row {
                    y_desc: "held-out accuracy (%)".into(),
                    panels,
                    legend,
                }],
                cols: COLS,
                markers: true,
                solid: false,
                outer_labels: true,
            },
        });
    }
    out
}

/// Draws every figure of the lab from `data` into `out`, as `.svg` and `.png`; returns the files
/// written. `smooth_w` is the moving-average window of the training diagnostics (1 = raw).
///
/// # Errors
/// I/O and drawing errors.
pub fn write_all(out: &Path, data: &LabData, smooth_w: usize) -> anyhow::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for d in figures(data, smooth_w) {
        for ext in ["svg", "png"] {
            let p = out.join(format!("{}.{ext}", d.stem));
            rlvr_chart::save(&p, d.size, &d.figure)?;
            files.push(p);
        }
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    #[test]
    fn titles_name_the_offsets_their_arms_have() {
        assert_eq!(super::offsets_text(&[0, 0]), "");
        assert_eq!(super::offsets_text(&[0, 1, 0]), ", offset 0 and 1");
        assert_eq!(super::offsets_text(&[2, 0, 1]), ", offset 0, 1 and 2");
        assert_eq!(super::offsets_text(&[1]), ", offset 1");
    }

    #[test]
    fn families_are_the_labels_first_word() {
        assert_eq!(super::family("REC-OneSide-IS"), "REC");
        assert_eq!(super::family("GRPO (paper B)"), "GRPO");
        // configs/lab_multi_turn.toml's labels: its figures' panels were captioned "GRPO,".
        assert_eq!(super::family("GRPO, 2 turns"), "GRPO");
        assert_eq!(super::family("REC-OneSide-NoIS, 2 turns"), "REC");
        assert_eq!(super::family("AsymRE"), "AsymRE");
        assert_eq!(super::family("off_policy_grpo"), "off_policy_grpo");
    }
}
