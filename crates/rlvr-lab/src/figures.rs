//! The lab's figures, each as SVG and PNG (plotters; DejaVu Sans from rlvr-fonts, built in, so no
//! system font is needed):
//! - `accuracy_vV`: held-out accuracy against step at sync interval V, one curve per algorithm (mean
//!   over seeds) with a band from the lowest to the highest seed;
//! - `intervals`: one panel per algorithm run at several intervals, one curve per interval;
//! - `diagnostics_vV`: clip fraction, log10 of the importance ratio's min and max, and entropy
//!   against step at interval V (moving average over `smooth` steps when `smooth` > 1).
//!
//! Legends sit in their own column right of the data; the palette has no pale colours.

use std::path::{Path, PathBuf};

use anyhow::Context;
use plotters::coord::Shift;
use plotters::prelude::*;

use crate::summary::{read_lines, series, RunSummary};

/// Twelve dark, distinct colours (Tableau/ColorBrewer-derived; no yellow or pale tints).
pub const PALETTE: [RGBColor; 12] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(230, 97, 0),
    RGBColor(0, 0, 0),
    RGBColor(140, 81, 10),
    RGBColor(197, 27, 125),
    RGBColor(1, 102, 94),
    RGBColor(102, 102, 102),
    RGBColor(37, 52, 148),
    RGBColor(122, 122, 0),
];

/// One curve: mean points and an optional (x, low, high) band.
struct Curve {
    color: RGBColor,
    mean: Vec<(f64, f64)>,
    band: Vec<(f64, f64, f64)>,
}

struct Panel {
    title: String,
    y_desc: String,
    curves: Vec<Curve>,
}

fn register_font() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = plotters::style::register_font(
            "sans-serif",
            FontStyle::Normal,
            rlvr_fonts::DEJAVU_SANS,
        );
    });
}

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
/// A band over seeds: (step, lowest, highest).
type Band = Vec<(f64, f64, f64)>;

/// Mean over seeds per step, and the band from the lowest to the highest seed (steps present in
/// every series only).
fn aggregate(runs: &[Series]) -> (Series, Band) {
    let Some(first) = runs.first() else {
        return (Vec::new(), Vec::new());
    };
    let (mut mean, mut band) = (Vec::new(), Vec::new());
    for &(x, _) in first {
        let ys: Vec<f64> = runs
            .iter()
            .filter_map(|s| s.iter().find(|p| p.0 == x).map(|p| p.1))
            .filter(|y| y.is_finite())
            .collect();
        if ys.len() != runs.len() {
            continue;
        }
        let m = ys.iter().sum::<f64>() / ys.len() as f64;
        mean.push((x, m));
        let lo = ys.iter().cloned().fold(f64::MAX, f64::min);
        let hi = ys.iter().cloned().fold(f64::MIN, f64::max);
        band.push((x, lo, hi));
    }
    if runs.len() < 2 {
        band.clear();
    }
    (mean, band)
}

fn err<E: std::fmt::Display>(e: E) -> anyhow::Error {
    anyhow::anyhow!("drawing: {e}")
}

fn draw<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    panels: &[Panel],
    cols: usize,
    legend: &[(String, RGBColor)],
) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE).map_err(err)?;
    let (w, _) = root.dim_in_pixel();
    let (plots, key) = root.split_horizontally(w.saturating_sub(230));
    // The legend column, outside every data area.
    for (i, (name, c)) in legend.iter().enumerate() {
        let y = 40 + 22 * i as i32;
        key.draw(&PathElement::new(vec![(8, y), (36, y)], c.stroke_width(3)))
            .map_err(err)?;
        key.draw(&Text::new(name.clone(), (44, y - 7), ("sans-serif", 14)))
            .map_err(err)?;
    }
    let rows = panels.len().div_ceil(cols.max(1));
    let areas = plots.split_evenly((rows.max(1), cols.max(1)));
    for (panel, area) in panels.iter().zip(areas.iter()) {
        let pts = panel.curves.iter().flat_map(|c| {
            c.mean
                .iter()
                .map(|p| (p.0, p.1, p.1))
                .chain(c.band.iter().copied())
        });
        let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
        for (x, lo, hi) in pts {
            if !(lo.is_finite() && hi.is_finite()) {
                continue;
            }
            x0 = x0.min(x);
            x1 = x1.max(x);
            y0 = y0.min(lo);
            y1 = y1.max(hi);
        }
        if x0 > x1 {
            (x0, x1, y0, y1) = (0.0, 1.0, 0.0, 1.0);
        }
        if x1 <= x0 {
            x1 = x0 + 1.0;
        }
        let pad = if y1 > y0 { 0.05 * (y1 - y0) } else { 0.5 };
        let mut chart = ChartBuilder::on(area)
            .caption(&panel.title, ("sans-serif", 17))
            .margin(10)
            .x_label_area_size(36)
            .y_label_area_size(56)
            .build_cartesian_2d(x0..x1, (y0 - pad)..(y1 + pad))
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc("step")
            .x_label_formatter(&step_label)
            .y_desc(&panel.y_desc)
            .label_style(("sans-serif", 13))
            .light_line_style(RGBColor(235, 235, 235))
            .draw()
            .map_err(err)?;
        for c in &panel.curves {
            if c.band.len() > 1 {
                let mut poly: Vec<(f64, f64)> = c.band.iter().map(|b| (b.0, b.2)).collect();
                poly.extend(c.band.iter().rev().map(|b| (b.0, b.1)));
                chart
                    .draw_series(std::iter::once(Polygon::new(
                        poly,
                        c.color.mix(0.18).filled(),
                    )))
                    .map_err(err)?;
            }
            chart
                .draw_series(LineSeries::new(
                    c.mean.iter().copied(),
                    c.color.stroke_width(2),
                ))
                .map_err(err)?;
        }
    }
    root.present().map_err(err)?;
    Ok(())
}

/// Writes STEM.svg and STEM.png; returns both paths.
fn save(
    stem: &Path,
    size: (u32, u32),
    panels: &[Panel],
    cols: usize,
    legend: &[(String, RGBColor)],
) -> anyhow::Result<Vec<PathBuf>> {
    let svg = stem.with_extension("svg");
    let png = stem.with_extension("png");
    draw(
        SVGBackend::new(&svg, size).into_drawing_area(),
        panels,
        cols,
        legend,
    )
    .with_context(|| format!("{}", svg.display()))?;
    draw(
        BitMapBackend::new(&png, size).into_drawing_area(),
        panels,
        cols,
        legend,
    )
    .with_context(|| format!("{}", png.display()))?;
    Ok(vec![svg, png])
}

/// Per-run series of `key` mapped by `f`, smoothed over `w` steps.
fn run_series(
    runs: &[&RunSummary],
    key: &str,
    w: usize,
    f: impl Fn(f64) -> f64,
) -> Vec<Vec<(f64, f64)>> {
    runs.iter()
        .map(|r| {
            let s: Vec<(f64, f64)> = series(&read_lines(Path::new(&r.run_dir)), key)
                .into_iter()
                .map(|(x, y)| (x, f(y)))
                .filter(|p| p.1.is_finite())
                .collect();
            smooth(&s, w)
        })
        .filter(|s| !s.is_empty())
        .collect()
}

fn curve(color: RGBColor, runs: &[Vec<(f64, f64)>]) -> Curve {
    let (mean, band) = aggregate(runs);
    Curve { color, mean, band }
}

/// Draws every figure of the lab from `runs` into `out`; returns the files written. `smooth` is
/// the moving-average window of the training diagnostics (1 = raw).
///
/// # Errors
/// I/O and drawing errors.
// One block per figure of the module docs' list, in that order, each choosing its runs and series
// and calling the shared drawing code, so the figures are found in one place.
pub fn write_all(out: &Path, runs: &[RunSummary], smooth_w: usize) -> anyhow::Result<Vec<PathBuf>> {
    register_font();
    let mut labels: Vec<&str> = Vec::new();
    let mut intervals: Vec<u64> = Vec::new();
    let mut arms: Vec<&str> = Vec::new();
    for r in runs {
        if !labels.contains(&r.label.as_str()) {
            labels.push(&r.label);
        }
        if !intervals.contains(&r.interval) {
            intervals.push(r.interval);
        }
        if !arms.contains(&r.arm.as_str()) {
            arms.push(&r.arm);
        }
    }
    intervals.sort_unstable();
    let color_of =
        |label: &str| PALETTE[labels.iter().position(|l| *l == label).unwrap_or(0) % PALETTE.len()];
    let of_arm = |arm: &str| -> Vec<&RunSummary> { runs.iter().filter(|r| r.arm == arm).collect() };
    let mut files = Vec::new();

    for &v in &intervals {
        let here: Vec<&str> = arms
            .iter()
            .copied()
            .filter(|a| of_arm(a)[0].interval == v)
            .collect();
        let legend: Vec<(String, RGBColor)> = here
            .iter()
            .map(|a| {
                let r = of_arm(a)[0];
                let name = if r.offset > 0 {
                    format!("{} (o={})", r.label, r.offset)
                } else {
                    r.label.clone()
                };
                (name, color_of(&r.label))
            })
            .collect();
        let seeds = of_arm(here[0]).len();
        let acc = Panel {
            title: format!(
                "held-out accuracy, sync interval {v} (mean, band: min-max over {seeds} seed(s))"
            ),
            y_desc: "accuracy %".into(),
            curves: here
                .iter()
                .map(|a| {
                    curve(
                        color_of(&of_arm(a)[0].label),
                        &run_series(&of_arm(a), "eval/accuracy", 1, |y| 100.0 * y),
                    )
                })
                .collect(),
        };
        files.extend(save(
            &out.join(format!("accuracy_v{v}")),
            (1000, 450),
            &[acc],
            1,
            &legend,
        )?);
        let diag = |key: &str, title: &str, y: &str, f: fn(f64) -> f64| Panel {
            title: format!(
                "{title}, interval {v}{}",
                if smooth_w > 1 {
                    format!(" (moving average {smooth_w})")
                } else {
                    String::new()
                }
            ),
            y_desc: y.into(),
            curves: here
                .iter()
                .map(|a| {
                    curve(
                        color_of(&of_arm(a)[0].label),
                        &run_series(&of_arm(a), key, smooth_w, f),
                    )
                })
                .collect(),
        };
        let mut ratio = diag(
            "ratio/max",
            "log10 importance ratio: max (upper) and min (lower)",
            "log10 ratio",
            f64::log10,
        );
        ratio
            .curves
            .extend(diag("ratio/min", "", "", f64::log10).curves);
        let panels = [
            diag("clip_frac", "clip fraction", "fraction", |y| y),
            ratio,
            diag("entropy", "entropy", "nats/token", |y| y),
        ];
        files.extend(save(
            &out.join(format!("diagnostics_v{v}")),
            (1000, 900),
            &panels,
            1,
            &legend,
        )?);
    }

    // Each algorithm across intervals.
    let multi: Vec<&str> = labels
        .iter()
        .copied()
        .filter(|l| {
            let mut vs: Vec<u64> = runs
                .iter()
                .filter(|r| r.label == *l)
                .map(|r| r.interval)
                .collect();
            vs.sort_unstable();
            vs.dedup();
            vs.len() > 1
        })
        .collect();
    if !multi.is_empty() {
        let icolor =
            |v: u64| PALETTE[intervals.iter().position(|x| *x == v).unwrap_or(0) % PALETTE.len()];
        let legend: Vec<(String, RGBColor)> = intervals
            .iter()
            .map(|&v| (format!("interval {v}"), icolor(v)))
            .collect();
        let panels: Vec<Panel> = multi
            .iter()
            .map(|l| Panel {
                title: format!("{l}: held-out accuracy"),
                y_desc: "accuracy %".into(),
                curves: arms
                    .iter()
                    .filter(|a| of_arm(a)[0].label == *l && of_arm(a)[0].offset == 0)
                    .map(|a| {
                        curve(
                            icolor(of_arm(a)[0].interval),
                            &run_series(&of_arm(a), "eval/accuracy", 1, |y| 100.0 * y),
                        )
                    })
                    .collect(),
            })
            .collect();
        let cols = if panels.len() > 1 { 2 } else { 1 };
        let rows = panels.len().div_ceil(cols) as u32;
        files.extend(save(
            &out.join("intervals"),
            (1100, 340 * rows),
            &panels,
            cols,
            &legend,
        )?);
    }
    Ok(files)
}

/// Step ticks as integers ("20", not "20.0"); a fractional tick gets no label (as `rlvr plot`'s).
fn step_label(x: &f64) -> String {
    if x.fract() == 0.0 {
        format!("{x:.0}")
    } else {
        String::new()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn step_ticks_are_integers() {
        assert_eq!(super::step_label(&20.0), "20");
        assert_eq!(super::step_label(&0.0), "0");
        assert_eq!(super::step_label(&12.5), "");
    }
}
