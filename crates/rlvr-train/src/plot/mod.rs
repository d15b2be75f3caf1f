//! `rlvr plot RUN_DIR... --metric NAME... --out FILE.svg|png` (DESIGN.md section 10): x = step, one
//! panel per metric, one line per run (legend = `--label`, else the run directory's name, made
//! unique with its parent's), a null or a missing step left as a gap, `--smooth` an exponential
//! moving average over the faint raw series (of the noisy metrics only, [`smoothable`]), one
//! `--title`, y axes labelled with the metric and its unit, the legend once, beside the first
//! row. `--mean-over-seeds` draws runs whose configs differ only in their seeds as one line, the
//! mean over the seeds with a band of ±1 standard error ([`seed_groups`], [`rlvr_chart::mean_se`]).
//! A metric is a metrics.jsonl key, or `diagnostics/KEY` for a diagnostics.jsonl key.
//! With `--heatmap` a metric is a histogram key of diagnostics.jsonl (`diagnostics/hist/ratio`,
//! `diagnostics/hist/mismatch`) and each run gets a heat map of it over the steps ([`heatmap`]).
//! SVG by default; PNG too. Text is laid out with DejaVu Sans, which the rlvr-fonts crate ships (with its
//! Bitstream Vera licence) for this crate and the lab alike, so no system font is needed.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
pub use rlvr_chart::{ema, mean_se, register_font, segments, step_label, Series, PALETTE};
use rlvr_chart::{Figure, Line, Panel, Row};

mod empty;
pub mod heatmap;
pub mod seeds;

use empty::{why_empty, Empty};

pub use seeds::{group_labels, seed_groups};

/// `rlvr plot`.
#[derive(clap::Args, Debug, Clone)]
pub struct PlotArgs {
    /// Run directories (each with a metrics.jsonl), or metrics.jsonl files.
    #[arg(required = true)]
    pub runs: Vec<PathBuf>,
    /// Metric to plot (repeatable; one panel each), e.g. `reward/mean`, `eval/accuracy`.
    #[arg(long = "metric", required = true)]
    pub metrics: Vec<String>,
    /// Output file: `.svg` (default format) or `.png`.
    #[arg(long, default_value = "plot.svg")]
    pub out: PathBuf,
    /// Width in pixels.
    #[arg(long, default_value_t = 800)]
    pub width: u32,
    /// Height of one panel in pixels.
    #[arg(long, default_value_t = 300)]
    pub panel_height: u32,
    /// Legend label of each run, in the order of the runs (repeatable; all or none). Default: the
    /// run directory's name, with its parent's prepended where two runs share a name.
    #[arg(long = "label")]
    pub labels: Vec<String>,
    /// Exponential moving average with this weight on the past per step, in [0, 1) (TensorBoard's
    /// smoothing; 0.6 is its default), by step distance: a point k steps after the last weighs
    /// it by weight^k, so a sparse eval series does not lag. The smoothed line is drawn over the
    /// faint raw one. Only noisy statistics are smoothed: schedules and counts (`lr`,
    /// `staleness/*`, versions, `diagnostics/updates`, `rows`, `stale_dropped`, `memory/*`,
    /// `eval/n`) are drawn as they are.
    #[arg(long)]
    pub smooth: Option<f64>,
    /// One title over the figure (none by default).
    #[arg(long)]
    pub title: Option<String>,
    /// Small multiples: one panel per run (captioned with its label) in each metric's row, all on
    /// the row's axes, instead of every run in one panel.
    #[arg(long)]
    pub facet: bool,
    /// Heat maps instead of lines: each metric is a histogram of diagnostics.jsonl (an array of
    /// counts per step, e.g. `diagnostics/hist/ratio`), drawn per run as buckets × steps coloured
    /// by the share of the step's tokens in each bucket (log scale).
    #[arg(long)]
    pub heatmap: bool,
    /// One line per group of runs whose config.toml files differ only in their seeds
    /// (`train.seed`, `data.seed`, any key named `seed`) and `output.dir`: the mean over the
    /// group's runs at the steps all of them have, with a band of ±1 standard error (as the lab's
    /// figures); the legend says how many seeds. Each run needs its config.toml.
    #[arg(long)]
    pub mean_over_seeds: bool,
    /// With `--mean-over-seeds`: a config key also ignored when grouping (repeatable), e.g.
    /// `model.path` where each seed starts from its own checkpoint (the lab's warm starts).
    #[arg(long = "ignore-key", requires = "mean_over_seeds")]
    pub ignore_keys: Vec<String>,
}

/// The file and key a `metric` of `run` is read from: `diagnostics/KEY` from diagnostics.jsonl
/// beside it, any other key from a run directory's metrics.jsonl, or from `run` itself when it is
/// a JSONL file.
pub(crate) fn metric_source<'a>(run: &Path, metric: &'a str) -> (PathBuf, &'a str) {
    let dir = if run.is_dir() {
        run
    } else {
        run.parent().unwrap_or(run)
    };
    match metric.strip_prefix("diagnostics/") {
        Some(k) => (rlvr_rundir::files::diagnostics(dir), k),
        None if run.is_dir() => (rlvr_rundir::files::metrics(run), metric),
        None => (run.to_path_buf(), metric),
    }
}

/// Reads `metric` from a run directory's metrics.jsonl (nulls and non-numbers skipped).
///
/// # Errors
/// Unreadable or malformed metrics file (a last line cut by a kill is left out, see
/// [`read_lines`]).
pub fn read_series(run: &Path, metric: &str) -> anyhow::Result<Series> {
    let (path, key) = metric_source(run, metric);
    Ok(rlvr_rundir::jsonl::series(&read_lines(&path)?, key))
}

/// The key of the runs' files closest to `metric` (its source file's keys, as
/// [`metric_source`] picks it, with the `diagnostics/` prefix kept): one that `metric` begins
/// (`eval/acc` → `eval/accuracy`), else the nearest within a third of its length in edits
/// (`diagnostics/kl_behavior` → `diagnostics/kl_behaviour`). `None` when nothing is close or the
/// files cannot be read.
fn nearest_key(runs: &[PathBuf], metric: &str) -> Option<String> {
    let (prefix, key) = match metric.strip_prefix("diagnostics/") {
        Some(k) => ("diagnostics/", k),
        None => ("", metric),
    };
    let mut keys: Vec<String> = Vec::new();
    for run in runs {
        let (path, _) = metric_source(run, metric);
        let Ok(lines) = read_lines(&path) else {
            continue;
        };
        for l in &lines {
            for (k, v) in l {
                if v.is_number() && !keys.contains(k) {
                    keys.push(k.clone());
                }
            }
        }
    }
    keys.sort();
    let near = keys
        .iter()
        .find(|k| k.starts_with(key))
        .map(String::as_str)
        .or_else(|| {
            let limit = (key.chars().count() / 3).max(1);
            keys.iter()
                .map(|k| (strsim::damerau_levenshtein(key, k), k.as_str()))
                .filter(|(d, _)| *d <= limit)
                .min_by_key(|(d, _)| *d)
                .map(|(_, k)| k)
        })?;
    Some(format!("{prefix}{near}"))
}

/// The lines of a JSONL file to plot: every line, but a last line cut short (a run killed while
/// writing it) is left out with a warning on stderr naming the file and the line, once per file.
///
/// # Errors
/// Unreadable file; a line that is not JSON anywhere else, named with file and line.
pub(crate) fn read_lines(path: &Path) -> anyhow::Result<Vec<rlvr_rundir::jsonl::Line>> {
    static WARNED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let (lines, cut) = rlvr_rundir::jsonl::read_metrics_but_a_cut_end(path)?;
    if let Some(w) = cut {
        let mut warned = WARNED.lock().unwrap_or_else(|e| e.into_inner());
        if !warned.contains(&w) {
            crate::log::say(&format!("warning: {w}"));
            warned.push(w);
        }
    }
    Ok(lines)
}

/// The runs' legend labels: `labels` when given (one per run), else each run directory's name,
/// with its parent's name prepended (`arm/seed-0`) where two runs share a name, then `#2`, `#3`
/// where they still do.
///
/// # Errors
/// A `--label` count other than the number of runs.
pub fn labels(runs: &[PathBuf], labels: &[String]) -> anyhow::Result<Vec<String>> {
    if !labels.is_empty() {
        if labels.len() != runs.len() {
            bail!(
                "{} for {}: give one per run, in the order of the runs",
                crate::log::counted(labels.len() as u64, "--label value"),
                crate::log::counted(runs.len() as u64, "run")
            );
        }
        return Ok(labels.to_vec());
    }
    let names: Vec<String> = runs.iter().map(|r| run_name(r)).collect();
    let mut out: Vec<String> = names
        .iter()
        .zip(runs)
        .map(|(n, r)| {
            if names.iter().filter(|m| *m == n).count() < 2 {
                return n.clone();
            }
            let dir = if r.is_dir() {
                r.as_path()
            } else {
                r.parent().unwrap_or(r)
            };
            match dir.parent().and_then(|p| p.file_name()) {
                Some(p) => format!("{}/{n}", p.to_string_lossy()),
                None => n.clone(),
            }
        })
        .collect();
    for i in 0..out.len() {
        let same = out[..i].iter().filter(|m| **m == out[i]).count();
        if same > 0 {
            out[i] = format!("{} #{}", out[i], same + 1);
        }
    }
    Ok(out)
}

/// The widest `--width` and tallest `--panel-height`, in pixels (a PNG of 16384² is 1 GiB).
pub const MAX_PIXELS: u32 = 16384;

/// The y axis label of a metric: its name and unit (`time/train_s (s)`, `tokens_per_s
/// (tokens/s)`, accuracies and fractions as `(fraction)`).
pub fn axis_label(metric: &str) -> String {
    let unit = if metric.contains("tokens_per_s") {
        Some("tokens/s")
    } else if metric.ends_with("_s") {
        Some("s")
    } else if metric.contains("completion_len") {
        Some("tokens")
    } else if metric.contains("accuracy")
        || metric.contains("frac")
        || metric.contains("@k")
        || metric.ends_with("/share")
    {
        Some("fraction")
    } else if metric.starts_with("kl") || metric == "entropy" || metric.contains("logprob") {
        Some("nats")
    } else if metric.starts_with("staleness") {
        Some("steps")
    } else {
        None
    };
    match unit {
        Some(u) => format!("{metric} ({u})"),
        None => metric.to_string(),
    }
}

pub(crate) fn run_name(run: &Path) -> String {
    let p = if run.is_dir() {
        run
    } else {
        run.parent().unwrap_or(run)
    };
    p.file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_else(|| p.display().to_string())
}

/// Whether `--smooth` smooths `metric`: true for the noisy per-step statistics of sampled data
/// (rewards, accuracies, losses, clip fractions, ratios, KL, entropy, lengths, advantages, norms,
/// timings), false for series that are schedules or counts, whose exact values are the point:
/// `lr`, `staleness/*` (the sync schedule's sawtooth), any `version` key, `eval/n`,
/// `diagnostics/updates`, `diagnostics/rows`, `diagnostics/stale_dropped`,
/// `diagnostics/staleness/*` and `diagnostics/memory/*` (a peak is what one reads there).
pub fn smoothable(metric: &str) -> bool {
    let key = metric.strip_prefix("diagnostics/").unwrap_or(metric);
    let exact = ["lr", "eval/n", "updates", "rows", "stale_dropped", "step"];
    !(exact.contains(&key)
        || key.starts_with("staleness/")
        || key.starts_with("memory/")
        || key.contains("version"))
}

/// `s` smoothed with [`ema`] weight `w` segment by segment ([`segments`]: no smoothing across a
/// gap).
pub fn smooth_series(s: &[(f64, f64)], w: f64) -> Series {
    segments(s)
        .into_iter()
        .flat_map(|seg| ema(seg, w))
        .collect()
}

/// One line of the figure: a run, or with `--mean-over-seeds` a group of runs.
pub(crate) struct Entry {
    /// Legend label.
    pub label: String,
    /// Per metric, the series of each run of the entry (one run: one series).
    pub series: Vec<Vec<Series>>,
    /// Per metric, why the entry has no value of it ([`why_empty`] of its first run); `None`
    /// where it has one.
    pub empty: Vec<Option<Empty>>,
}

/// The figure's line of `runs` (one entry's series of one metric): one run's series, smoothed
/// with its raw series faint under it when `smooth` is given; several runs' mean with its ±1
/// SE band ([`mean_se`]), each run smoothed first when `smooth` is given (the mean of the
/// smoothed runs, the raw runs' mean faint under it). Returns the line and the steps the mean
/// left out (some runs lack them).
pub(crate) fn entry_line(style: usize, runs: &[Series], smooth: Option<f64>) -> (Line, usize) {
    let raw = mean_se(runs);
    let Some(w) = smooth else {
        return (
            Line {
                style,
                points: raw.mean,
                band: raw.band,
                faint: Vec::new(),
            },
            raw.dropped,
        );
    };
    let smoothed: Vec<Series> = runs.iter().map(|s| smooth_series(s, w)).collect();
    let m = mean_se(&smoothed);
    let line = Line {
        style,
        points: m.mean,
        band: m.band,
        faint: raw.mean,
    };
    (line, raw.dropped)
}

/// The figure of `rlvr plot`: one row per metric (y axis: the metric and its unit), in it one
/// panel with a line per entry (run or group of seeds) and the legend beside the first row only
/// (the rows share it), or with `facet` one captioned panel per entry on the row's axes and no
/// legend (the captions name the runs). `smooth` applies to the [`smoothable`] metrics. Returns
/// the figure and, per (entry, metric), the steps a mean over seeds left out.
pub(crate) fn figure(
    metrics: &[String],
    data: &[Entry],
    smooth: Option<f64>,
    title: Option<&str>,
    facet: bool,
) -> (Figure, Vec<(usize, usize, usize)>) {
    let mut dropped = Vec::new();
    let mut lines: Vec<Vec<Line>> = Vec::new();
    for (k, metric) in metrics.iter().enumerate() {
        let w = smooth.filter(|_| smoothable(metric));
        let mut row = Vec::new();
        for (r, e) in data.iter().enumerate() {
            let (line, d) = entry_line(r, &e.series[k], w);
            if d > 0 && e.series[k].len() > 1 {
                dropped.push((r, k, d));
            }
            row.push(line);
        }
        lines.push(row);
    }
    let rows = lines
        .into_iter()
        .enumerate()
        .map(|(k, row)| Row {
            y_desc: axis_label(&metrics[k]),
            panels: if facet {
                row.into_iter()
                    .enumerate()
                    .map(|(r, l)| Panel {
                        caption: Some(data[r].label.clone()),
                        lines: vec![l],
                        note: data[r].empty[k].as_ref().map(Empty::full),
                    })
                    .collect()
            } else {
                vec![Panel {
                    caption: overlay_note(data, k),
                    lines: row,
                    note: None,
                }]
            },
            // One legend, beside the first row: every row has the same lines.
            legend: if facet || k > 0 {
                Vec::new()
            } else {
                data.iter()
                    .enumerate()
                    .map(|(r, e)| (e.label.clone(), r))
                    .collect()
            },
        })
        .collect();
    let fig = Figure {
        title: title.map(str::to_string),
        rows,
        cols: 0,
        markers: true,
        solid: false,
        outer_labels: false,
    };
    (fig, dropped)
}

/// The caption of an overlaid panel (metric `k`) where some entries have no value, over the
/// lines the others have: `no line for LABEL, ...: why` (the why when they share it; [`build`]
/// says each one's in full on stderr). Every entry lacking a value is an error of [`build`].
fn overlay_note(data: &[Entry], k: usize) -> Option<String> {
    let missing: Vec<(&str, &Empty)> = data
        .iter()
        .filter_map(|e| e.empty[k].as_ref().map(|w| (e.label.as_str(), w)))
        .collect();
    let (_, first) = missing.first()?;
    let names: Vec<&str> = missing.iter().map(|m| m.0).collect();
    Some(match missing.iter().all(|m| m.1.why == first.why) {
        true => format!("no line for {}: {}", names.join(", "), first.why),
        false => format!("no line for {}", names.join(", ")),
    })
}

/// What [`build`] makes of a [`PlotArgs`] (without `--heatmap`): the figure as data, its size
/// in pixels and the number of points read.
#[derive(Debug, Clone)]
pub struct Built {
    /// The figure ([`rlvr_chart::Figure`]): rows, panels, lines with their bands.
    pub figure: Figure,
    /// Width and height, pixels.
    pub size: (u32, u32),
    /// Points read, summed over runs and metrics (nulls and missing steps not counted).
    pub points: usize,
    /// Notes said on stderr while building: a run without a line in a panel and why
    /// ([`why_empty`]); with `--mean-over-seeds`, runs drawn apart only by one or two keys
    /// ([`seeds::apart_notes`]).
    pub notes: Vec<String>,
}

/// The figure `a` describes, as data (no file written; `--heatmap` is [`heatmap`]'s).
///
/// # Errors
/// `--smooth` outside [0, 1), unreadable runs, a metric absent from every run; with
/// `--mean-over-seeds`, a run without its config.toml, a `--label` count that is neither the
/// runs' nor the groups'.
pub fn build(a: &PlotArgs) -> anyhow::Result<Built> {
    if let Some(w) = a.smooth {
        if !(0.0..1.0).contains(&w) {
            bail!("--smooth {w}: the weight on the past must be in [0, 1)");
        }
    }
    let mut series = Vec::new();
    for run in &a.runs {
        let s = a
            .metrics
            .iter()
            .map(|m| read_series(run, m))
            .collect::<anyhow::Result<Vec<_>>>()
            .with_context(|| format!("run {}", run.display()))?;
        series.push(s);
    }
    for (k, m) in a.metrics.iter().enumerate() {
        if series.iter().all(|s| s[k].is_empty()) {
            let hint = match nearest_key(&a.runs, m) {
                Some(near) => format!("; did you mean `{near}`?"),
                None => String::new(),
            };
            bail!(
                "no run has a value for metric `{m}` (check the name against metrics.jsonl, or \
                 diagnostics.jsonl for diagnostics/KEY){hint}"
            );
        }
    }
    let points = series
        .iter()
        .map(|s| s.iter().map(Vec::len).sum::<usize>())
        .sum();
    let mut notes = Vec::new();
    let (groups, names) = if a.mean_over_seeds {
        let g = seed_groups(&a.runs, &a.ignore_keys)?;
        let n = group_labels(&a.runs, &g, &a.labels)?;
        notes = seeds::apart_notes(&a.runs, &g, &a.ignore_keys)?;
        for n in &notes {
            crate::log::say(n);
        }
        (g, n)
    } else {
        let n = labels(&a.runs, &a.labels)?;
        ((0..a.runs.len()).map(|i| vec![i]).collect(), n)
    };
    let data: Vec<Entry> = groups
        .iter()
        .zip(names)
        .map(|(g, label)| Entry {
            label,
            series: (0..a.metrics.len())
                .map(|k| g.iter().map(|&i| series[i][k].clone()).collect())
                .collect(),
            empty: (0..a.metrics.len())
                .map(|k| {
                    g.iter()
                        .all(|&i| series[i][k].is_empty())
                        .then(|| why_empty(&a.runs[g[0]], &a.metrics[k]))
                })
                .collect(),
        })
        .collect();
    let title_h = if a.title.is_some() { 30 } else { 0 };
    let size = (a.width, a.panel_height * a.metrics.len() as u32 + title_h);
    let (figure, dropped) = figure(&a.metrics, &data, a.smooth, a.title.as_deref(), a.facet);
    // Why a run has no line in a panel, in full.
    for e in &data {
        for (k, w) in e.empty.iter().enumerate() {
            if let Some(w) = w {
                let n = format!(
                    "note: {}: no line in the panel of {}: {}",
                    e.label,
                    a.metrics[k],
                    w.full()
                );
                crate::log::say(&n);
                notes.push(n);
            }
        }
    }
    // One note per line that left steps out, naming the metrics.
    for (r, e) in data.iter().enumerate() {
        let what: Vec<String> = dropped
            .iter()
            .filter(|x| x.0 == r)
            .map(|&(_, k, d)| format!("{} of {}", d, a.metrics[k]))
            .collect();
        if !what.is_empty() {
            crate::log::say(&format!(
                "note: {}: steps that not every seed has are left out of the mean ({})",
                e.label,
                what.join(", ")
            ));
        }
    }
    Ok(Built {
        figure,
        size,
        points,
        notes,
    })
}

/// Draws the plot `a` describes. Returns the number of points read (with `--heatmap`, the number
/// of cells: steps × buckets, summed over runs and metrics).
///
/// # Errors
/// `--width` or `--panel-height` of 0 or above [`MAX_PIXELS`], an unknown extension, drawing
/// errors, and those of [`build`] (with `--heatmap`: no run has the metric as an array).
pub fn plot(a: &PlotArgs) -> anyhow::Result<usize> {
    for (flag, v) in [("--width", a.width), ("--panel-height", a.panel_height)] {
        if !(1..=MAX_PIXELS).contains(&v) {
            bail!("{flag} {v} is out of range: expected 1 to {MAX_PIXELS} pixels");
        }
    }
    register_font();
    if a.heatmap {
        if a.mean_over_seeds {
            bail!("--heatmap draws each run apart: leave out --mean-over-seeds");
        }
        return heatmap::plot_heatmaps(a);
    }
    let b = build(a)?;
    let ext = a
        .out
        .extension()
        .and_then(|e| e.to_str())
        .unwrap_or("svg")
        .to_ascii_lowercase();
    if !matches!(ext.as_str(), "svg" | "png") {
        bail!(
            "--out {}: unknown extension `{ext}` (use .svg or .png)",
            a.out.display()
        );
    }
    rlvr_chart::save(&a.out, b.size, &b.figure)
        .with_context(|| format!("writing --out {}", a.out.display()))?;
    Ok(b.points)
}

/// Runs `rlvr plot`. Prints `{"out", "points"}`.
///
/// # Errors
/// As [`plot`].
pub fn run_plot(a: &PlotArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let points = plot(a)?;
    writeln!(
        out,
        "{}",
        serde_json::json!({"out": a.out, "points": points})
    )?;
    Ok(())
}
