//! `rlvr plot --heatmap`: a histogram key of diagnostics.jsonl over the steps, one panel per run
//! and metric. Rows are the histogram's buckets (for `hist/ratio` and `hist/mismatch` the
//! log-ratio buckets of `rlvr_algo::RATIO_HIST_EDGES`, labelled in log ρ), columns the steps, and a
//! cell's colour the share of that step's tokens in the bucket on a log scale from 1e-4 (dark) to 1
//! (bright), viridis-like so that it reads in grey too; a step without tokens (a null line, e.g.
//! `hist/mismatch` when no row is on-policy) is light grey, a bucket without tokens white.

use std::path::Path;

use anyhow::{bail, Context};
use plotters::coord::Shift;
use plotters::prelude::*;

use super::{labels, register_font, step_label, PlotArgs};

/// One run's histogram per step: (step, bucket counts); `None` where the line holds null.
pub type HistSeries = Vec<(f64, Option<Vec<f64>>)>;

/// Smallest share the colour scale resolves (log10 = −4); smaller non-zero shares get its colour.
pub const MIN_SHARE: f64 = 1e-4;

/// Reads the array-valued `metric` (`diagnostics/KEY` or a metrics.jsonl key) of a run directory
/// (or a JSONL file) per step. Lines without the key are skipped; a null is kept as `None`.
///
/// # Errors
/// Unreadable or malformed file (a last line cut by a kill is left out).
pub fn read_hist(run: &Path, metric: &str) -> anyhow::Result<HistSeries> {
    let (path, key) = super::metric_source(run, metric);
    Ok(super::read_lines(&path)?
        .iter()
        .filter_map(|l| {
            let step = l.get(rlvr_rundir::key::Metric::Step.key())?.as_f64()?;
            let v = l.get(key)?;
            let counts = v
                .as_array()
                .map(|a| a.iter().map(|x| x.as_f64().unwrap_or(0.0)).collect());
            (v.is_null() || counts.is_some()).then_some((step, counts))
        })
        .collect())
}

/// Each bucket's share of the step's total; `None` when the total is 0.
pub fn shares(counts: &[f64]) -> Option<Vec<f64>> {
    let total: f64 = counts.iter().sum();
    (total > 0.0).then(|| counts.iter().map(|c| c / total).collect())
}

/// The colour of a share in (0, 1]: viridis (its five anchor colours, linearly interpolated) at
/// t = (log10 share + 4) / 4, clamped to [0, 1].
pub fn colour(share: f64) -> RGBColor {
    const ANCHORS: [(u8, u8, u8); 5] = [
        (68, 1, 84),
        (59, 82, 139),
        (33, 145, 140),
        (94, 201, 98),
        (253, 231, 37),
    ];
    let t = ((share.max(MIN_SHARE).log10() + 4.0) / 4.0).clamp(0.0, 1.0);
    let x = t * (ANCHORS.len() - 1) as f64;
    let i = (x.floor() as usize).min(ANCHORS.len() - 2);
    let f = x - i as f64;
    let mix = |a: u8, b: u8| (a as f64 + f * (b as f64 - a as f64)).round() as u8;
    let (a, b) = (ANCHORS[i], ANCHORS[i + 1]);
    RGBColor(mix(a.0, b.0), mix(a.1, b.1), mix(a.2, b.2))
}

/// The label of bucket `k` of a histogram of `n` buckets under `metric`.
fn bucket_label(metric: &str, k: usize, n: usize) -> String {
    let ratio = metric.contains("hist/ratio") || metric.contains("hist/mismatch");
    if ratio && n == rlvr_algo::RATIO_BUCKETS {
        rlvr_algo::ratio_bucket_label(k)
    } else {
        format!("bucket {k}")
    }
}

/// The y axis title of `metric`: which ratio its buckets hold.
fn axis_title(metric: &str) -> String {
    if metric.contains("hist/mismatch") {
        "log ρ, ρ = π_trainer / π_sampler (on-policy rows)".into()
    } else if metric.contains("hist/ratio") {
        "log ρ, ρ = π_θ / π_behaviour".into()
    } else {
        metric.to_string()
    }
}

/// One panel: its caption, metric and series, and why it has no data (written in it), if so.
struct Panel {
    caption: String,
    metric: String,
    series: HistSeries,
    note: Option<String>,
}

/// Draws `a.metrics` as heat maps (one panel per run and metric) to `a.out`. Returns the number of
/// cells drawn (steps × buckets).
///
/// # Errors
/// Unreadable runs; a metric that no run holds as an array (with a hint); an unknown extension;
/// drawing errors.
pub fn plot_heatmaps(a: &PlotArgs) -> anyhow::Result<usize> {
    register_font();
    let names = labels(&a.runs, &a.labels)?;
    let mut panels = Vec::new();
    for m in &a.metrics {
        let mut any = false;
        for (run, name) in a.runs.iter().zip(&names) {
            let series = read_hist(run, m)?;
            let has = series.iter().any(|(_, c)| c.is_some());
            any |= has;
            // A run without the histogram gets its panel, saying why it is empty.
            let note = (!has).then(|| super::why_empty(run, m).full());
            if let Some(n) = &note {
                crate::log::say(&format!("note: {name}: the heat map of {m} is empty: {n}"));
            }
            panels.push(Panel {
                caption: format!("{name}: {}", m.trim_start_matches("diagnostics/")),
                metric: m.clone(),
                series,
                note,
            });
        }
        if !any {
            bail!(
                "no run has a histogram (an array per step) for `{m}`: --heatmap takes a \
                 histogram key such as diagnostics/hist/ratio or diagnostics/hist/mismatch"
            );
        }
    }
    let cells = panels
        .iter()
        .map(|p| {
            p.series
                .iter()
                .map(|(_, c)| c.as_ref().map_or(0, Vec::len))
                .sum::<usize>()
        })
        .sum();
    let title_h = if a.title.is_some() { 30 } else { 0 };
    // A heat map needs room for 13 labelled rows: at least 320 px a panel.
    let panel_h = a.panel_height.max(320);
    let size = (a.width.max(560), panel_h * panels.len() as u32 + title_h);
    let ext = a
        .out
        .extension()
        .and_then(|e| e.to_str())
        .unwrap_or("svg")
        .to_ascii_lowercase();
    let title = a.title.as_deref();
    match ext.as_str() {
        "svg" => draw(
            SVGBackend::new(&a.out, size).into_drawing_area(),
            &panels,
            title,
        )
        .with_context(|| format!("writing --out {}", a.out.display()))?,
        "png" => draw(
            BitMapBackend::new(&a.out, size).into_drawing_area(),
            &panels,
            title,
        )
        .with_context(|| format!("writing --out {}", a.out.display()))?,
        e => bail!(
            "--out {}: unknown extension `{e}` (use .svg or .png)",
            a.out.display()
        ),
    }
    Ok(cells)
}

// Each panel: the chart (buckets × steps) on the left, a colour bar with its scale on the right.
fn draw<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    panels: &[Panel],
    title: Option<&str>,
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
    let bar_w = 150;
    for (panel, area) in panels.iter().zip(root.split_evenly((panels.len(), 1))) {
        let (chart_area, bar_area) = area.split_horizontally(width - bar_w);
        // An empty panel takes its buckets and steps from the metric's other panels, so that its
        // axes match theirs (not one "bucket 0" over steps 0 to 1).
        let same = || panels.iter().filter(|p| p.metric == panel.metric);
        let buckets = |p: &Panel| {
            p.series
                .iter()
                .filter_map(|(_, c)| c.as_ref().map(Vec::len))
                .max()
        };
        let n = buckets(panel)
            .or_else(|| same().filter_map(buckets).max())
            .unwrap_or(1);
        let mut steps: Vec<f64> = panel.series.iter().map(|(s, _)| *s).collect();
        if steps.is_empty() {
            steps = same()
                .flat_map(|p| p.series.iter().map(|(s, _)| *s))
                .collect();
            steps.sort_by(f64::total_cmp);
            steps.dedup();
        }
        let (x0, x1) = match (
            steps.iter().cloned().reduce(f64::min),
            steps.iter().cloned().reduce(f64::max),
        ) {
            (Some(a), Some(b)) => (a, b),
            _ => (0.0, 1.0),
        };
        let x_labels = ((x1 - x0).floor() as usize + 1).clamp(1, 10);
        // Each cell spans the median gap between steps (1 for every step logged).
        let gap = {
            let mut d: Vec<f64> = steps.windows(2).map(|w| w[1] - w[0]).collect();
            d.sort_by(f64::total_cmp);
            d.get(d.len() / 2).copied().unwrap_or(1.0).max(1e-9)
        };
        let metric = panel.metric.clone();
        let mut chart = ChartBuilder::on(&chart_area)
            .caption(panel.caption.as_str(), ("sans-serif", 14))
            .margin_top(8)
            .margin_left(8)
            .margin_bottom(8)
            .margin_right(12)
            .x_label_area_size(40)
            .y_label_area_size(150)
            .build_cartesian_2d((x0 - gap / 2.0)..(x1 + gap / 2.0), -0.5..(n as f64 - 0.5))
            .map_err(err)?;
        chart
            .configure_mesh()
            .disable_mesh()
            .x_desc("step")
            .y_desc(axis_title(&metric))
            .x_labels(x_labels)
            .y_labels(n)
            .x_label_formatter(&step_label)
            .y_label_formatter(&|y: &f64| {
                let k = y.round();
                if (y - k).abs() < 1e-6 && k >= 0.0 && (k as usize) < n {
                    bucket_label(&metric, k as usize, n)
                } else {
                    String::new()
                }
            })
            .label_style(("sans-serif", 11))
            .axis_desc_style(("sans-serif", 12))
            .draw()
            .map_err(err)?;
        let grey = RGBColor(225, 225, 225);
        for (step, counts) in &panel.series {
            let (l, r) = (step - gap / 2.0, step + gap / 2.0);
            let cells: Vec<(f64, RGBColor)> = match counts.as_deref().and_then(shares) {
                Some(sh) => sh
                    .iter()
                    .enumerate()
                    .map(|(k, &s)| (k as f64, if s > 0.0 { colour(s) } else { WHITE }))
                    .collect(),
                None => (0..n).map(|k| (k as f64, grey)).collect(),
            };
            chart
                .draw_series(
                    cells
                        .into_iter()
                        .map(|(k, c)| Rectangle::new([(l, k - 0.5), (r, k + 0.5)], c.filled())),
                )
                .map_err(err)?;
        }
        if let Some(note) = &panel.note {
            let (xr, yr) = chart.plotting_area().get_pixel_range();
            let rect = ((xr.start, yr.start), (xr.end - 1, yr.end - 1));
            rlvr_chart::draw_note(&chart_area, rect, note)?;
        }
        colour_bar(&bar_area).map_err(err)?;
    }
    root.present().map_err(err)?;
    Ok(())
}

/// The colour scale: a vertical bar from 1e-4 (bottom) to 1 (top) with decade ticks, a grey swatch
/// for "no tokens" and a white one for "none in the bucket".
fn colour_bar<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let (_, h) = area.dim_in_pixel();
    let style = ("sans-serif", 11).into_font().color(&BLACK);
    let (top, bottom) = (40i32, (h as i32 - 110).max(80));
    let (x0, x1) = (12i32, 30i32);
    area.draw(&Text::new("share of the", (6, 8), style.clone()))?;
    area.draw(&Text::new("step's tokens", (6, 22), style.clone()))?;
    for y in top..bottom {
        let t = (bottom - y) as f64 / (bottom - top) as f64;
        let share = 10f64.powf(4.0 * t - 4.0);
        area.draw(&Rectangle::new(
            [(x0, y), (x1, y + 1)],
            colour(share).filled(),
        ))?;
    }
    area.draw(&Rectangle::new(
        [(x0, top), (x1, bottom)],
        BLACK.stroke_width(1),
    ))?;
    for (d, label) in ["1e-4", "1e-3", "0.01", "0.1", "1"].iter().enumerate() {
        let y = bottom - (d as i32 * (bottom - top)) / 4;
        area.draw(&PathElement::new(vec![(x1, y), (x1 + 4, y)], BLACK))?;
        area.draw(&Text::new(*label, (x1 + 7, y - 6), style.clone()))?;
    }
    let swatch = |y: i32, c: RGBColor, text: &'static str| {
        area.draw(&Rectangle::new([(x0, y), (x1, y + 12)], c.filled()))?;
        area.draw(&Rectangle::new([(x0, y), (x1, y + 12)], BLACK.mix(0.4)))?;
        area.draw(&Text::new(text, (x1 + 7, y), style.clone()))
    };
    swatch(bottom + 20, WHITE, "no token")?;
    swatch(bottom + 40, RGBColor(225, 225, 225), "no data")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_and_colours() {
        assert_eq!(shares(&[0.0, 0.0]), None);
        assert_eq!(shares(&[1.0, 3.0]), Some(vec![0.25, 0.75]));
        // The ends of the scale are viridis' ends; below 1e-4 is the bottom colour.
        assert_eq!(colour(1.0), RGBColor(253, 231, 37));
        assert_eq!(colour(1e-4), RGBColor(68, 1, 84));
        assert_eq!(colour(1e-7), RGBColor(68, 1, 84));
        assert_eq!(colour(0.01), RGBColor(33, 145, 140));
    }
}
