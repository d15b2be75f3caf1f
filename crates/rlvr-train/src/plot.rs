//! `rlvr plot RUN_DIR... --metric NAME... --out FILE.svg|png` (DESIGN.md section 10): x = step, one
//! panel per metric, one line per run (legend = the run directory's name), nulls skipped. SVG by
//! default; PNG too. Text is laid out with DejaVu Sans, which ships inside this crate
//! (`assets/DejaVuSans.ttf`, Bitstream Vera licence in `assets/DejaVuSans.LICENSE`), so no system
//! font is needed.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use plotters::coord::Shift;
use plotters::prelude::*;

use crate::metrics::read_metrics;

static FONT: &[u8] = include_bytes!("../assets/DejaVuSans.ttf");

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
}

/// One run's series of one metric: (step, value) with nulls skipped.
pub type Series = Vec<(f64, f64)>;

/// Reads `metric` from a run directory's metrics.jsonl (nulls and non-numbers skipped).
///
/// # Errors
/// Unreadable or malformed metrics file.
pub fn read_series(run: &Path, metric: &str) -> anyhow::Result<Series> {
    let path = if run.is_dir() {
        run.join("metrics.jsonl")
    } else {
        run.to_path_buf()
    };
    Ok(read_metrics(&path)?
        .iter()
        .filter_map(|l| Some((l.get("step")?.as_f64()?, l.get(metric)?.as_f64()?)))
        .collect())
}

fn run_name(run: &Path) -> String {
    let p = if run.is_dir() {
        run
    } else {
        run.parent().unwrap_or(run)
    };
    p.file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_else(|| p.display().to_string())
}

fn register_font() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = plotters::style::register_font("sans-serif", FontStyle::Normal, FONT);
    });
}

fn draw<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    metrics: &[String],
    data: &[(String, Vec<Series>)],
) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE).map_err(|e| anyhow::anyhow!("{e}"))?;
    let panels = root.split_evenly((metrics.len(), 1));
    for (k, (panel, metric)) in panels.iter().zip(metrics).enumerate() {
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
        if x1 <= x0 {
            x1 = x0 + 1.0;
        }
        let pad = if y1 > y0 { 0.05 * (y1 - y0) } else { 0.5 };
        let mut chart = ChartBuilder::on(panel)
            .caption(metric, ("sans-serif", 18))
            .margin(8)
            .x_label_area_size(30)
            .y_label_area_size(60)
            .build_cartesian_2d(x0..x1, (y0 - pad)..(y1 + pad))
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        chart
            .configure_mesh()
            .x_desc("step")
            .label_style(("sans-serif", 12))
            .draw()
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        for (r, (name, series)) in data.iter().enumerate() {
            let color = Palette99::pick(r).to_rgba();
            chart
                .draw_series(LineSeries::new(
                    series[k].iter().copied(),
                    color.stroke_width(2),
                ))
                .map_err(|e| anyhow::anyhow!("{e}"))?
                .label(name.clone())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(2))
                });
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .label_font(("sans-serif", 12))
            .draw()
            .map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    root.present().map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(())
}

/// Draws the plot `a` describes. Returns the number of points drawn.
///
/// # Errors
/// Unreadable runs, a metric absent from every run, an unknown extension, drawing errors.
pub fn plot(a: &PlotArgs) -> anyhow::Result<usize> {
    register_font();
    let mut data = Vec::new();
    for run in &a.runs {
        let series = a
            .metrics
            .iter()
            .map(|m| read_series(run, m))
            .collect::<anyhow::Result<Vec<_>>>()
            .with_context(|| format!("reading {}", run.display()))?;
        data.push((run_name(run), series));
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
    let size = (a.width, a.panel_height * a.metrics.len() as u32);
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
        )?,
        "png" => draw(
            BitMapBackend::new(&a.out, size).into_drawing_area(),
            &a.metrics,
            &data,
        )?,
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
