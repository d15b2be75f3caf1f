//! `rlvr plot RUN_DIR... --metric NAME... --out FILE.svg|png` (DESIGN.md section 10): x = step, one
//! panel per metric, one line per run (legend = `--label`, else the run directory's name, made
//! unique with its parent's), a null or a missing step left as a gap, `--smooth` an exponential
//! moving average over the faint raw series, one `--title`, y axes labelled with the metric and
//! its unit. A metric is a metrics.jsonl key, or `diagnostics/KEY` for a diagnostics.jsonl key.
//! With `--heatmap` a metric is a histogram key of diagnostics.jsonl (`diagnostics/hist/ratio`,
//! `diagnostics/hist/mismatch`) and each run gets a heat map of it over the steps ([`heatmap`]).
//! SVG by default; PNG too. Text is laid out with DejaVu Sans, which the rlvr-fonts crate ships (with its
//! Bitstream Vera licence) for this crate and the lab alike, so no system font is needed.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use plotters::coord::cartesian::Cartesian2d;
use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::prelude::*;

use crate::store::metrics::read_metrics;

pub mod heatmap;

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
    /// Exponential moving average with this weight on the past, in [0, 1) (TensorBoard's
    /// smoothing; 0.6 is its default): the smoothed line drawn over the faint raw one.
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
}

/// One run's series of one metric: (step, value) with nulls skipped.
pub type Series = Vec<(f64, f64)>;

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
        Some(k) => (dir.join("diagnostics.jsonl"), k),
        None if run.is_dir() => (run.join("metrics.jsonl"), metric),
        None => (run.to_path_buf(), metric),
    }
}

/// Reads `metric` from a run directory's metrics.jsonl (nulls and non-numbers skipped).
///
/// # Errors
/// Unreadable or malformed metrics file.
pub fn read_series(run: &Path, metric: &str) -> anyhow::Result<Series> {
    let (path, key) = metric_source(run, metric);
    Ok(read_metrics(&path)?
        .iter()
        .filter_map(|l| Some((l.get("step")?.as_f64()?, l.get(key)?.as_f64()?)))
        .collect())
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

/// The series cut at its gaps: where consecutive steps are more than 1.5 × the median spacing
/// apart (a null, a missing step, an evaluation not made), so no line bridges them.
pub fn segments(s: &[(f64, f64)]) -> Vec<&[(f64, f64)]> {
    if s.len() < 2 {
        return vec![s];
    }
    let mut dx: Vec<f64> = s.windows(2).map(|w| w[1].0 - w[0].0).collect();
    dx.sort_by(f64::total_cmp);
    let median = dx[dx.len() / 2];
    let mut out = Vec::new();
    let mut start = 0;
    for i in 1..s.len() {
        if s[i].0 - s[i - 1].0 > 1.5 * median {
            out.push(&s[start..i]);
            start = i;
        }
    }
    out.push(&s[start..]);
    out
}

/// The widest `--width` and tallest `--panel-height`, in pixels (a PNG of 16384² is 1 GiB).
pub const MAX_PIXELS: u32 = 16384;

/// TensorBoard's smoothing: y′₀ = y₀, y′ᵢ = w·y′ᵢ₋₁ + (1 − w)·yᵢ, over one segment.
pub fn ema(s: &[(f64, f64)], w: f64) -> Series {
    let mut last = None;
    s.iter()
        .map(|&(x, y)| {
            let v = last.map_or(y, |l: f64| w * l + (1.0 - w) * y);
            last = Some(v);
            (x, v)
        })
        .collect()
}

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

pub(crate) fn register_font() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = plotters::style::register_font(
            "sans-serif",
            FontStyle::Normal,
            rlvr_fonts::DEJAVU_SANS,
        );
    });
}

/// The line colours, in run order: the Okabe-Ito colour-blind-safe set without its yellow, orange and
/// sky blue (too pale on white), then darker extras. Each has a contrast ratio of at least 3:1
/// against white (WCAG 2 for graphics).
pub const PALETTE: [(u8, u8, u8); 8] = [
    (0, 114, 178),   // blue
    (213, 94, 0),    // vermillion
    (0, 158, 115),   // bluish green
    (204, 121, 167), // reddish purple
    (0, 0, 0),       // black
    (140, 86, 75),   // brown
    (117, 112, 179), // violet
    (102, 102, 102), // grey
];

/// Dash pattern of run r (dash length, gap) in pixels; `None` = solid. Combined with the marker
/// shape, runs whose curves coincide stay distinguishable.
fn dash(r: usize) -> Option<(u32, u32)> {
    [None, Some((8, 4)), Some((3, 3)), Some((12, 4))][(r / PALETTE.len() + r) % 4]
}

/// Draws run r's marker (circle, triangle, square, cross, in turn) at each of `points` of `chart`.
fn markers<DB>(
    chart: &mut ChartContext<'_, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>,
    r: usize,
    points: &[(f64, f64)],
    color: RGBAColor,
) -> anyhow::Result<()>
where
    DB: DrawingBackend,
    DB::ErrorType: 'static,
{
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow::anyhow!("{e}");
    let st = color.filled();
    let at = |p: &(f64, f64)| EmptyElement::<(f64, f64), DB>::at(*p);
    match r % 4 {
        0 => chart
            .draw_series(points.iter().map(|p| at(p) + Circle::new((0, 0), 4, st)))
            .map(|_| ()),
        1 => chart
            .draw_series(
                points
                    .iter()
                    .map(|p| at(p) + TriangleMarker::new((0, 0), 5, st)),
            )
            .map(|_| ()),
        2 => chart
            .draw_series(
                points
                    .iter()
                    .map(|p| at(p) + Rectangle::new([(-4, -4), (4, 4)], st)),
            )
            .map(|_| ()),
        _ => chart
            .draw_series(
                points
                    .iter()
                    .map(|p| at(p) + Cross::new((0, 0), 4, color.stroke_width(2))),
            )
            .map(|_| ()),
    }
    .map_err(err)
}

fn run_color(r: usize) -> RGBAColor {
    let (red, g, b) = PALETTE[r % PALETTE.len()];
    RGBColor(red, g, b).to_rgba()
}

/// Integer step labels only: a fractional tick gets no label.
pub(crate) fn step_label(x: &f64) -> String {
    if x.fract() == 0.0 {
        format!("{x:.0}")
    } else {
        String::new()
    }
}

/// Short y tick labels: up to 4 significant digits, scientific beyond 1e5 or under 1e-3. `span`
/// is the axis range: a tick within 1e-9 of the span from 0 is 0 (plotters computes ticks by
/// adding steps, so the tick at 0 of the axis -0.5..0.5 comes out as -5.6e-17).
fn value_label(y: f64, span: f64) -> String {
    let a = y.abs();
    if y == 0.0 || a <= 1e-9 * span {
        "0".into()
    } else if !(1e-3..1e5).contains(&a) {
        format!("{y:.1e}")
    } else {
        let s = format!("{y:.4}");
        let s = s.trim_end_matches('0').trim_end_matches('.');
        s.to_string()
    }
}

// One panel per metric: the chart (caption, "step" and metric axis labels, integer step ticks, one
// line per run with markers) on the left, the legend in its own column on the right so that it
// never covers a curve.
fn draw<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    metrics: &[String],
    data: &[(String, Vec<Series>)],
    smooth: Option<f64>,
    title: Option<&str>,
    facet: bool,
) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow::anyhow!("{e}");
    root.fill(&WHITE).map_err(err)?;
    let root = match title {
        Some(t) => root.titled(t, ("sans-serif", 20)).map_err(err)?,
        None => root,
    };
    let (width, _) = root.dim_in_pixel();
    // Legend column: the longest name at ~7 px a character (12 px DejaVu Sans) plus the line sample.
    let longest = data
        .iter()
        .map(|(n, _)| n.chars().count())
        .max()
        .unwrap_or(0);
    // (Not clamp: a narrow --width makes width / 3 smaller than 80.)
    let legend_w = if facet {
        0
    } else {
        (longest as u32 * 7 + 50).max(80).min(width / 3)
    };
    let panels = root.split_evenly((metrics.len(), 1));
    for (k, (panel, metric)) in panels.iter().zip(metrics).enumerate() {
        let (plot_area, legend_area) = panel.split_horizontally(width - legend_w);
        let pts: Vec<&(f64, f64)> = data.iter().flat_map(|(_, s)| s[k].iter()).collect();
        let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
        for &&(x, y) in &pts {
            x0 = x0.min(x);
            x1 = x1.max(x);
            y0 = y0.min(y);
            y1 = y1.max(y);
        }
        if pts.is_empty() {
            (x0, x1, y0, y1) = (0.0, 1.0, 0.0, 1.0);
        }
        // Half a step (or 2% of the span) on each side, so end markers are not cut.
        let xpad = (0.02 * (x1 - x0)).max(0.5);
        let ypad = if y1 > y0 {
            0.06 * (y1 - y0)
        } else {
            0.5_f64.max(0.1 * y0.abs())
        };
        // At most one label per step and ten in all: key points then fall on integers.
        let x_labels = ((x1 - x0).floor() as usize + 1).clamp(1, 10);
        // One chart, or with --facet one per run side by side on the same axes.
        let cells: Vec<Option<usize>> = if facet {
            (0..data.len()).map(Some).collect()
        } else {
            vec![None]
        };
        let areas = plot_area.split_evenly((1, cells.len()));
        for (cell, cell_area) in cells.iter().copied().zip(&areas) {
            let mut builder = ChartBuilder::on(cell_area);
            if let Some(c) = cell {
                builder.caption(data[c].0.as_str(), ("sans-serif", 14));
            }
            let mut chart = builder
                .margin_top(12)
                .margin_left(8)
                .margin_bottom(8)
                .margin_right(24)
                .x_label_area_size(40)
                .y_label_area_size(72)
                .build_cartesian_2d((x0 - xpad)..(x1 + xpad), (y0 - ypad)..(y1 + ypad))
                .map_err(err)?;
            chart
                .configure_mesh()
                .x_desc("step")
                .y_desc(axis_label(metric))
                .x_labels(x_labels)
                .y_labels(6)
                .x_label_formatter(&step_label)
                .y_label_formatter(&|y: &f64| value_label(*y, y1 - y0 + 2.0 * ypad))
                .label_style(("sans-serif", 12))
                .axis_desc_style(("sans-serif", 13))
                .light_line_style(WHITE.mix(0.0))
                .bold_line_style(BLACK.mix(0.12))
                .draw()
                .map_err(err)?;
            for (r, (_, series)) in data.iter().enumerate() {
                if cell.is_some_and(|c| c != r) {
                    continue;
                }
                let color = run_color(r);
                let line = color.stroke_width(2);
                let raw = &series[k];
                let mut smoothed = Vec::new();
                for seg in segments(raw) {
                    if let Some(w) = smooth {
                        // The raw series faint, without markers, under the smoothed one.
                        let faint = color.mix(0.25).stroke_width(1);
                        chart
                            .draw_series(LineSeries::new(seg.iter().copied(), faint))
                            .map_err(err)?;
                        smoothed.push(ema(seg, w));
                    } else {
                        smoothed.push(seg.to_vec());
                    }
                }
                for seg in &smoothed {
                    match dash(r) {
                        None => chart
                            .draw_series(LineSeries::new(seg.iter().copied(), line))
                            .map(|_| ()),
                        Some((d, g)) => chart
                            .draw_series(DashedLineSeries::new(seg.iter().copied(), d, g, line))
                            .map(|_| ()),
                    }
                    .map_err(err)?;
                }
                let s: Series = smoothed.concat();
                // Markers: every point of a short series (so a one-point series shows), about 25 of
                // a long one.
                let stride = s.len().div_ceil(25).max(1);
                let at: Vec<(f64, f64)> = s.iter().step_by(stride).copied().collect();
                markers(&mut chart, r, &at, color)?;
            }
        }
        if facet {
            continue;
        }
        // Legend: a line sample with the run's marker and dash, then its name.
        let style = ("sans-serif", 12).into_font().color(&BLACK);
        for (r, (name, _)) in data.iter().enumerate() {
            let y = 40 + 20 * r as i32;
            let color = run_color(r);
            let (x_a, x_b) = (6, 34);
            let segs: Vec<(i32, i32)> = match dash(r) {
                None => vec![(x_a, x_b)],
                Some((d, g)) => (x_a..x_b)
                    .step_by((d + g) as usize)
                    .map(|s| (s, (s + d as i32).min(x_b)))
                    .collect(),
            };
            for (a, b) in segs {
                legend_area
                    .draw(&PathElement::new(
                        vec![(a, y), (b, y)],
                        color.stroke_width(2),
                    ))
                    .map_err(err)?;
            }
            let (c, st) = ((20, y), color.filled());
            match r % 4 {
                0 => legend_area.draw(&Circle::new(c, 4, st)),
                1 => legend_area.draw(&TriangleMarker::new(c, 5, st)),
                2 => legend_area.draw(&Rectangle::new([(16, y - 4), (24, y + 4)], st)),
                _ => legend_area.draw(&Cross::new(c, 4, color.stroke_width(2))),
            }
            .map_err(err)?;
            legend_area
                .draw(&Text::new(name.clone(), (40, y - 7), style.clone()))
                .map_err(err)?;
        }
    }
    root.present().map_err(err)?;
    Ok(())
}

/// Draws the plot `a` describes. Returns the number of points drawn (with `--heatmap`, the number
/// of cells: steps × buckets, summed over runs and metrics).
///
/// # Errors
/// `--width` or `--panel-height` of 0 or above [`MAX_PIXELS`], unreadable runs, a metric absent
/// from every run (with `--heatmap`: no run has it as an array), an unknown extension, drawing
/// errors.
pub fn plot(a: &PlotArgs) -> anyhow::Result<usize> {
    for (flag, v) in [("--width", a.width), ("--panel-height", a.panel_height)] {
        if !(1..=MAX_PIXELS).contains(&v) {
            bail!("{flag} {v} is out of range: expected 1 to {MAX_PIXELS} pixels");
        }
    }
    register_font();
    if a.heatmap {
        return heatmap::plot_heatmaps(a);
    }
    if let Some(w) = a.smooth {
        if !(0.0..1.0).contains(&w) {
            bail!("--smooth {w}: the weight on the past must be in [0, 1)");
        }
    }
    let names = labels(&a.runs, &a.labels)?;
    let mut data = Vec::new();
    for (run, name) in a.runs.iter().zip(names) {
        let series = a
            .metrics
            .iter()
            .map(|m| read_series(run, m))
            .collect::<anyhow::Result<Vec<_>>>()
            .with_context(|| format!("reading {}", run.display()))?;
        data.push((name, series));
    }
    for (k, m) in a.metrics.iter().enumerate() {
        if data.iter().all(|(_, s)| s[k].is_empty()) {
            bail!("no run has a value for metric `{m}` (check the name against metrics.jsonl)");
        }
    }
    let points = data
        .iter()
        .map(|(_, s)| s.iter().map(Vec::len).sum::<usize>())
        .sum();
    let title_h = if a.title.is_some() { 30 } else { 0 };
    let size = (a.width, a.panel_height * a.metrics.len() as u32 + title_h);
    let ext = a
        .out
        .extension()
        .and_then(|e| e.to_str())
        .unwrap_or("svg")
        .to_ascii_lowercase();
    match ext.as_str() {
        "svg" => draw(
            SVGBackend::new(&a.out, size).into_drawing_area(),
            &a.metrics,
            &data,
            a.smooth,
            a.title.as_deref(),
            a.facet,
        )
        .with_context(|| format!("writing --out {}", a.out.display()))?,
        "png" => draw(
            BitMapBackend::new(&a.out, size).into_drawing_area(),
            &a.metrics,
            &data,
            a.smooth,
            a.title.as_deref(),
            a.facet,
        )
        .with_context(|| format!("writing --out {}", a.out.display()))?,
        e => bail!(
            "--out {}: unknown extension `{e}` (use .svg or .png)",
            a.out.display()
        ),
    }
    Ok(points)
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

#[cfg(test)]
mod tests {
    use super::value_label;

    #[test]
    fn tick_labels_round_float_noise_at_zero_only() {
        // plotters' tick at 0 of the axis -0.5..0.5 (seen in a PNG of a flat zero series).
        assert_eq!(value_label(-5.551115123125783e-17, 1.0), "0");
        assert_eq!(value_label(0.0, 1.0), "0");
        assert_eq!(value_label(0.2, 1.0), "0.2");
        assert_eq!(value_label(-0.4, 1.0), "-0.4");
        // A genuinely small value on a small axis keeps its value.
        assert_eq!(value_label(2e-4, 1e-3), "2.0e-4");
        assert_eq!(value_label(123456.0, 1e6), "1.2e5");
    }
}
