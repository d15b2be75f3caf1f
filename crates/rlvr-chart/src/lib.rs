//! Small multiples of line charts, the one drawing code behind `rlvr plot` (rlvr-train) and the
//! lab's figures (rlvr-lab): a [`Figure`] is an optional title over [`Row`]s; a row is one quantity
//! (its y axis description) drawn in one or more [`Panel`]s that share the row's axes (wrapped
//! `cols` to a line); a panel has a caption and [`Line`]s, each a series with an optional band
//! (e.g. the lowest to the highest seed), and may carry a note written in its data area (why it
//! has no line, [`draw_note`]). Each row's legend sits in its own column right of every
//! panel, so it never covers data. Steps are labelled as integers; a series is cut at its gaps (no
//! line bridges a missing step); a line may carry a faint series drawn under it (its raw values
//! when the line is smoothed, e.g. by [`ema`]). [`mean_se`] gives the mean over seeds with a
//! ±1 standard error band, the one aggregate of `rlvr plot --mean-over-seeds` and the lab's
//! figures. Line `style` r picks the colour ([`PALETTE`]), dash and marker, so that
//! coinciding curves stay distinguishable. Text is DejaVu Sans from rlvr-fonts (no system font).
//!
//! [`draw`] returns the [`Layout`] it drew (the pixel rectangles of the data areas and of the
//! legend), so that tests can check that legend and data do not overlap.
#![warn(missing_docs)]
#![forbid(unsafe_code)]

use std::path::Path;

use anyhow::{bail, Context};
use plotters::coord::cartesian::Cartesian2d;
use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::prelude::*;

/// A series: (step, value) points.
pub type Series = Vec<(f64, f64)>;

/// One line of a panel.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Line {
    /// Colour, dash and marker index (see [`PALETTE`]).
    pub style: usize,
    /// The points, in step order.
    pub points: Series,
    /// A band (step, low, high) drawn faint under the line; empty for none.
    pub band: Vec<(f64, f64, f64)>,
    /// A series drawn faint (thin, 25% opacity, no markers) under the line, cut at its gaps:
    /// the raw values of a smoothed line; empty for none.
    pub faint: Series,
}

/// One chart of a row.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Panel {
    /// Caption over the panel (none: no caption).
    pub caption: Option<String>,
    /// The lines.
    pub lines: Vec<Line>,
    /// Text written in the middle of the panel's data area (wrapped to its width), in grey: why
    /// the panel has no line, e.g. "`env/turns/mean` is null at every step". None: no text.
    pub note: Option<String>,
}

/// One quantity: panels on shared axes, and its legend.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Row {
    /// The y axis description (name and unit).
    pub y_desc: String,
    /// The panels, left to right, wrapped every [`Figure::cols`].
    pub panels: Vec<Panel>,
    /// Legend entries (name, style), in the legend column right of this row; empty for none.
    pub legend: Vec<(String, usize)>,
}

/// A figure: a title over rows of panels.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Figure {
    /// One title over the figure.
    pub title: Option<String>,
    /// The rows, top to bottom.
    pub rows: Vec<Row>,
    /// Panels per line within a row (0: all on one line).
    pub cols: usize,
    /// Markers on the lines (every point of a short series, about 25 of a long one).
    pub markers: bool,
    /// Lines solid while their colour is unique (no dashes: for long noisy series, where dashes
    /// blur); styles past [`PALETTE`]'s length, whose colours repeat, keep their dashes.
    pub solid: bool,
    /// Axis descriptions on the outer panels only: the y description left of a row's first
    /// column, "step" under the panels with none below them.
    pub outer_labels: bool,
}

/// Pixel rectangle `((x0, y0), (x1, y1))`, corners included.
pub type Rect = ((i32, i32), (i32, i32));

/// Where [`draw`] put things, in pixels of the canvas.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Layout {
    /// The data area of every panel drawn, row by row.
    pub data: Vec<Rect>,
    /// Each row's legend column (rows without a legend: none).
    pub legends: Vec<Rect>,
}

/// The line colours, in style order: the Okabe-Ito colour-blind-safe set without its yellow,
/// orange and sky blue (too pale on white), then darker extras. Each has a contrast ratio of at
/// least 3:1 against white (WCAG 2 for graphics).
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

/// Registers DejaVu Sans as plotters' `sans-serif` (once per process).
pub fn register_font() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = plotters::style::register_font(
            "sans-serif",
            FontStyle::Normal,
            rlvr_fonts::DEJAVU_SANS,
        );
    });
}

/// Colour of style r.
pub fn color(r: usize) -> RGBAColor {
    let (red, g, b) = PALETTE[r % PALETTE.len()];
    RGBColor(red, g, b).to_rgba()
}

/// Dash pattern of style r (dash length, gap) in pixels; `None` = solid. Combined with the marker
/// shape, lines whose curves coincide stay distinguishable.
pub fn dash(r: usize) -> Option<(u32, u32)> {
    [None, Some((8, 4)), Some((3, 3)), Some((12, 4))][(r / PALETTE.len() + r) % 4]
}

/// Marker shape of style r: 0 circle, 1 triangle, 2 square, 3 cross. It advances by one with
/// each pass through [`PALETTE`], so styles r and r + 8, which share a colour, differ in marker
/// (and dash): the first 32 styles are distinct (colour, marker) pairs, which a legend shared by
/// several panels needs (the lab's 13-arm legends used to show REINFORCE and RED-Drop with one
/// colour and one marker).
pub fn marker(r: usize) -> usize {
    (r / PALETTE.len() + r) % 4
}

/// Integer step labels only: a fractional tick gets no label.
pub fn step_label(x: &f64) -> String {
    if x.fract() == 0.0 {
        format!("{x:.0}")
    } else {
        String::new()
    }
}

/// Short y tick labels: up to 4 significant digits, scientific beyond 1e5 or under 1e-3. `span`
/// is the axis range: a tick within 1e-9 of the span from 0 is 0 (plotters computes ticks by
/// adding steps, so the tick at 0 of the axis -0.5..0.5 comes out as -5.6e-17).
pub fn value_label(y: f64, span: f64) -> String {
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

/// TensorBoard's smoothing by step distance, over one segment: y′₀ = y₀,
/// y′ᵢ = wᵢ·y′ᵢ₋₁ + (1 − wᵢ)·yᵢ with wᵢ = w^(xᵢ − xᵢ₋₁), so a series logged every step is
/// TensorBoard's EMA with weight w, and a sparse one (an evaluation every 10 steps) is smoothed
/// over the same number of steps, not of points, instead of lagging 10 times as far. A step
/// distance that is not positive and finite counts as 1.
pub fn ema(s: &[(f64, f64)], w: f64) -> Series {
    let mut last: Option<(f64, f64)> = None;
    s.iter()
        .map(|&(x, y)| {
            let v = last.map_or(y, |(lx, l)| {
                let d = x - lx;
                let wi = w.powf(if d.is_finite() && d > 0.0 { d } else { 1.0 });
                wi * l + (1.0 - wi) * y
            });
            last = Some((x, v));
            (x, v)
        })
        .collect()
}

/// The mean over runs (seeds) of each step and its band of ±1 standard error of the mean
/// (sample standard deviation / √n), from the steps every run has with a finite value: a step
/// that some runs lack (a shorter run, a null) is left out of both, and counted in
/// [`MeanSe::dropped`]. One run: its series and no band.
pub fn mean_se(runs: &[Series]) -> MeanSe {
    let mut steps: Vec<f64> = runs.iter().flatten().map(|p| p.0).collect();
    steps.sort_by(f64::total_cmp);
    steps.dedup();
    // Each run's finite value per step (the last where a step repeats).
    let by_step: Vec<std::collections::HashMap<u64, f64>> = runs
        .iter()
        .map(|s| {
            s.iter()
                .filter(|p| p.1.is_finite())
                .map(|p| (p.0.to_bits(), p.1))
                .collect()
        })
        .collect();
    let mut out = MeanSe::default();
    for x in steps {
        let ys: Vec<f64> = by_step
            .iter()
            .filter_map(|m| m.get(&x.to_bits()).copied())
            .collect();
        if ys.len() != runs.len() || ys.is_empty() {
            out.dropped += 1;
            continue;
        }
        let n = ys.len() as f64;
        let m = ys.iter().sum::<f64>() / n;
        out.mean.push((x, m));
        if ys.len() > 1 {
            let var = ys.iter().map(|y| (y - m) * (y - m)).sum::<f64>() / (n - 1.0);
            let se = (var / n).sqrt();
            out.band.push((x, m - se, m + se));
        }
    }
    out
}

/// What [`mean_se`] returns.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MeanSe {
    /// (step, mean over the runs).
    pub mean: Series,
    /// (step, mean − SE, mean + SE); empty for one run.
    pub band: Vec<(f64, f64, f64)>,
    /// Steps some but not all runs have (left out).
    pub dropped: usize,
}

/// Draws style r's marker ([`marker`]: circle, triangle, square, cross) at each of `points`.
fn markers<DB>(
    chart: &mut ChartContext<'_, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>,
    r: usize,
    points: &[(f64, f64)],
) -> anyhow::Result<()>
where
    DB: DrawingBackend,
    DB::ErrorType: 'static,
{
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow::anyhow!("{e}");
    let c = color(r);
    let st = c.filled();
    let at = |p: &(f64, f64)| EmptyElement::<(f64, f64), DB>::at(*p);
    match marker(r) {
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
                    .map(|p| at(p) + Cross::new((0, 0), 4, c.stroke_width(2))),
            )
            .map(|_| ()),
    }
    .map_err(err)
}

/// The data range of a row over its lines, faint series and bands: (x0, x1, y0, y1).
fn range(row: &Row) -> (f64, f64, f64, f64) {
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    let lines = row.panels.iter().flat_map(|p| p.lines.iter());
    for l in lines {
        let pts = l
            .points
            .iter()
            .chain(&l.faint)
            .map(|p| (p.0, p.1, p.1))
            .chain(l.band.iter().copied());
        for (x, lo, hi) in pts {
            if !(x.is_finite() && lo.is_finite() && hi.is_finite()) {
                continue;
            }
            x0 = x0.min(x);
            x1 = x1.max(x);
            y0 = y0.min(lo);
            y1 = y1.max(hi);
        }
    }
    if x0 > x1 {
        (0.0, 1.0, 0.0, 1.0)
    } else {
        (x0, x1, y0, y1)
    }
}

/// The y axis of a row whose data span `y0..=y1`: 6% of the span beyond each end; a flat row
/// (`y0 == y1`) gets ±max(0.5, 10% of |y0|) around its value, except that a flat row at or above
/// 0 whose lower end would fall below 0 starts just under 0 instead (6% of the upper end below
/// it, room for the markers), so a zero accuracy or a count of 0 is not drawn on an axis of
/// negative values no such quantity takes.
pub fn y_axis(y0: f64, y1: f64) -> (f64, f64) {
    if y1 > y0 {
        let pad = 0.06 * (y1 - y0);
        return (y0 - pad, y1 + pad);
    }
    let pad = 0.5_f64.max(0.1 * y0.abs());
    let hi = y0 + pad;
    if y0 >= 0.0 && y0 - pad < 0.0 {
        (-0.06 * hi, hi)
    } else {
        (y0 - pad, hi)
    }
}

/// Width of the legend column: the longest name at ~7 px a character (12 px DejaVu Sans) plus the
/// line sample, at most a third of the width; 0 without a legend.
fn legend_width(fig: &Figure, width: u32) -> u32 {
    let longest = fig
        .rows
        .iter()
        .flat_map(|r| r.legend.iter())
        .map(|(n, _)| n.chars().count())
        .max();
    match longest {
        // (Not clamp: a narrow width makes width / 3 smaller than 80.)
        Some(n) => (n as u32 * 7 + 50).max(80).min(width / 3),
        None => 0,
    }
}

/// Draws `fig` on `root`; returns where the data areas and legends went.
///
/// # Errors
/// Drawing errors.
// Top to bottom: title, then per row its split into panel cells and legend column, the axes
// (shared by the row), bands, lines (cut at gaps, optionally smoothed), markers, the legend.
pub fn draw<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    fig: &Figure,
) -> anyhow::Result<Layout>
where
    DB::ErrorType: 'static,
{
    register_font();
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow::anyhow!("{e}");
    root.fill(&WHITE).map_err(err)?;
    let root = match &fig.title {
        Some(t) => root.titled(t, ("sans-serif", 20)).map_err(err)?,
        None => root,
    };
    let (width, height) = root.dim_in_pixel();
    let legend_w = legend_width(fig, width);
    // Each row gets a height proportional to its lines of panels.
    let lines_of = |r: &Row| match fig.cols {
        0 => 1,
        c => r.panels.len().div_ceil(c).max(1),
    };
    let total: usize = fig.rows.iter().map(lines_of).sum::<usize>().max(1);
    let mut rest = root;
    let mut areas = Vec::new();
    for (i, row) in fig.rows.iter().enumerate() {
        if i + 1 == fig.rows.len() {
            areas.push(rest.clone());
        } else {
            let h = (height as usize * lines_of(row) / total).max(1) as i32;
            let (a, b) = rest.split_vertically(h);
            areas.push(a);
            rest = b;
        }
    }
    let mut layout = Layout::default();
    for (row, area) in fig.rows.iter().zip(&areas) {
        let (row_w, _) = area.dim_in_pixel();
        let (plot_area, legend_area) = area.split_horizontally(row_w - legend_w);
        let (x0, x1, y0, y1) = range(row);
        // Half a step (or 2% of the span) on each side, so end markers are not cut.
        let xpad = (0.02 * (x1 - x0)).max(0.5);
        let (ylo, yhi) = y_axis(y0, y1);
        // At most one label per step and ten in all: key points then fall on integers.
        let x_labels = ((x1 - x0).floor() as usize + 1).clamp(1, 10);
        let cols = match fig.cols {
            0 => row.panels.len().max(1),
            c => c.min(row.panels.len().max(1)),
        };
        let cells = plot_area.split_evenly((lines_of(row), cols));
        for (j, (panel, cell)) in row.panels.iter().zip(&cells).enumerate() {
            let show_y = !fig.outer_labels || j % cols == 0;
            let show_x = !fig.outer_labels || j + cols >= row.panels.len();
            let mut builder = ChartBuilder::on(cell);
            if let Some(c) = &panel.caption {
                builder.caption(c.as_str(), ("sans-serif", 14));
            }
            let mut chart = builder
                .margin_top(12)
                .margin_left(8)
                .margin_bottom(8)
                .margin_right(24)
                .x_label_area_size(40)
                .y_label_area_size(72)
                .build_cartesian_2d((x0 - xpad)..(x1 + xpad), ylo..yhi)
                .map_err(err)?;
            chart
                .configure_mesh()
                .x_desc(if show_x { "step" } else { "" })
                .y_desc(if show_y { row.y_desc.as_str() } else { "" })
                .x_labels(x_labels)
                .y_labels(6)
                .x_label_formatter(&step_label)
                .y_label_formatter(&|y: &f64| value_label(*y, yhi - ylo))
                .label_style(("sans-serif", 12))
                .axis_desc_style(("sans-serif", 13))
                .light_line_style(WHITE.mix(0.0))
                .bold_line_style(BLACK.mix(0.12))
                .draw()
                .map_err(err)?;
            let (xr, yr) = chart.plotting_area().get_pixel_range();
            layout
                .data
                .push(((xr.start, yr.start), (xr.end - 1, yr.end - 1)));
            // Bands first, under every line.
            for l in &panel.lines {
                for seg in band_segments(&l.band) {
                    if seg.len() < 2 {
                        continue;
                    }
                    let mut poly: Vec<(f64, f64)> = seg.iter().map(|b| (b.0, b.2)).collect();
                    poly.extend(seg.iter().rev().map(|b| (b.0, b.1)));
                    chart
                        .draw_series(std::iter::once(Polygon::new(
                            poly,
                            color(l.style).mix(0.15).filled(),
                        )))
                        .map_err(err)?;
                }
            }
            for l in &panel.lines {
                let r = l.style;
                let c = color(r);
                let stroke = c.stroke_width(2);
                // The faint series (a smoothed line's raw values), without markers, under it.
                for seg in segments(&l.faint) {
                    let faint = c.mix(0.25).stroke_width(1);
                    chart
                        .draw_series(LineSeries::new(seg.iter().copied(), faint))
                        .map_err(err)?;
                }
                let drawn = segments(&l.points);
                let dashes = if fig.solid && r < PALETTE.len() {
                    None
                } else {
                    dash(r)
                };
                for seg in &drawn {
                    let seg = seg.iter();
                    match dashes {
                        None => chart
                            .draw_series(LineSeries::new(seg.copied(), stroke))
                            .map(|_| ()),
                        Some((d, g)) => chart
                            .draw_series(DashedLineSeries::new(seg.copied(), d, g, stroke))
                            .map(|_| ()),
                    }
                    .map_err(err)?;
                }
                if fig.markers {
                    let s: Series = drawn.concat();
                    let stride = s.len().div_ceil(25).max(1);
                    let at: Vec<(f64, f64)> = s.iter().step_by(stride).copied().collect();
                    markers(&mut chart, r, &at)?;
                }
            }
            if let Some(note) = &panel.note {
                let rect = ((xr.start, yr.start), (xr.end - 1, yr.end - 1));
                draw_note(cell, rect, note)?;
            }
        }
        if row.legend.is_empty() {
            continue;
        }
        let (lx, ly) = legend_area.get_base_pixel();
        let (lw, lh) = legend_area.dim_in_pixel();
        layout
            .legends
            .push(((lx, ly), (lx + lw as i32 - 1, ly + lh as i32 - 1)));
        // A line sample with the style's marker and dash, then the name.
        let style = ("sans-serif", 12).into_font().color(&BLACK);
        for (i, (name, r)) in row.legend.iter().enumerate() {
            let r = *r;
            let y = 40 + 20 * i as i32;
            let c = color(r);
            let (x_a, x_b) = (6, 34);
            let dashes = if fig.solid && r < PALETTE.len() {
                None
            } else {
                dash(r)
            };
            let segs: Vec<(i32, i32)> = match dashes {
                None => vec![(x_a, x_b)],
                Some((d, g)) => (x_a..x_b)
                    .step_by((d + g) as usize)
                    .map(|s| (s, (s + d as i32).min(x_b)))
                    .collect(),
            };
            for (a, b) in segs {
                legend_area
                    .draw(&PathElement::new(vec![(a, y), (b, y)], c.stroke_width(2)))
                    .map_err(err)?;
            }
            if fig.markers {
                let (m, st) = ((20, y), c.filled());
                match marker(r) {
                    0 => legend_area.draw(&Circle::new(m, 4, st)),
                    1 => legend_area.draw(&TriangleMarker::new(m, 5, st)),
                    2 => legend_area.draw(&Rectangle::new([(16, y - 4), (24, y + 4)], st)),
                    _ => legend_area.draw(&Cross::new(m, 4, c.stroke_width(2))),
                }
                .map_err(err)?;
            }
            legend_area
                .draw(&Text::new(name.clone(), (40, y - 7), style.clone()))
                .map_err(err)?;
        }
    }
    Ok(layout)
}

/// `text` wrapped at word boundaries into lines of at most `width` characters (a longer word is a
/// line of its own).
pub fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut cur = String::new();
    for w in text.split_whitespace() {
        if !cur.is_empty() && cur.chars().count() + 1 + w.chars().count() > width {
            out.push(std::mem::take(&mut cur));
        }
        if !cur.is_empty() {
            cur.push(' ');
        }
        cur.push_str(w);
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// Writes `note` centred in `rect` (pixels of the canvas, as [`Layout::data`] holds them) of
/// `area`, in grey 13 px text wrapped to the rectangle's width: the words a panel without data
/// shows instead of blank axes ([`Panel::note`]).
///
/// # Errors
/// Drawing errors.
pub fn draw_note<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    rect: Rect,
    note: &str,
) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    let (bx, by) = area.get_base_pixel();
    let ((x0, y0), (x1, y1)) = rect;
    // DejaVu Sans at 13 px: about 7 px a character.
    let chars = (((x1 - x0) as usize).saturating_sub(16) / 7).max(12);
    let lines = wrap(note, chars);
    let (cx, cy) = ((x0 + x1) / 2 - bx, (y0 + y1) / 2 - by);
    let step = 17;
    let top = cy - step * (lines.len() as i32 - 1) / 2;
    let style = ("sans-serif", 13)
        .into_font()
        .color(&RGBColor(90, 90, 90))
        .pos(plotters::style::text_anchor::Pos::new(
            plotters::style::text_anchor::HPos::Center,
            plotters::style::text_anchor::VPos::Center,
        ));
    for (i, l) in lines.iter().enumerate() {
        area.draw(&Text::new(
            l.clone(),
            (cx, top + step * i as i32),
            style.clone(),
        ))
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    Ok(())
}

/// A band cut at its gaps, as [`segments`] cuts a series.
fn band_segments(b: &[(f64, f64, f64)]) -> Vec<&[(f64, f64, f64)]> {
    let xs: Vec<(f64, f64)> = b.iter().map(|p| (p.0, 0.0)).collect();
    let mut out = Vec::new();
    let mut start = 0;
    for s in segments(&xs) {
        out.push(&b[start..start + s.len()]);
        start += s.len();
    }
    out
}

/// Draws `fig` into `out` (`.svg` or `.png`, by extension) at `size` pixels.
///
/// # Errors
/// An unknown extension, an unwritable file, drawing errors.
pub fn save(out: &Path, size: (u32, u32), fig: &Figure) -> anyhow::Result<Layout> {
    let ext = out
        .extension()
        .and_then(|e| e.to_str())
        .unwrap_or("svg")
        .to_ascii_lowercase();
    let layout = match ext.as_str() {
        "svg" => {
            let root = SVGBackend::new(out, size).into_drawing_area();
            let l = draw(root.clone(), fig)?;
            root.present()
                .map_err(|e| anyhow::anyhow!("{e}"))
                .with_context(|| format!("writing {}", out.display()))?;
            l
        }
        "png" => {
            let root = BitMapBackend::new(out, size).into_drawing_area();
            let l = draw(root.clone(), fig)?;
            root.present()
                .map_err(|e| anyhow::anyhow!("{e}"))
                .with_context(|| format!("writing {}", out.display()))?;
            l
        }
        e => bail!(
            "{}: unknown extension `{e}` (use .svg or .png)",
            out.display()
        ),
    };
    Ok(layout)
}

/// Draws `fig` as an SVG document in memory (for tests of the look); returns it and the layout.
///
/// # Errors
/// Drawing errors.
pub fn svg_string(size: (u32, u32), fig: &Figure) -> anyhow::Result<(String, Layout)> {
    let mut s = String::new();
    let layout = {
        let root = SVGBackend::with_string(&mut s, size).into_drawing_area();
        let l = draw(root.clone(), fig)?;
        root.present().map_err(|e| anyhow::anyhow!("{e}"))?;
        l
    };
    Ok((s, layout))
}

#[cfg(test)]
mod tests {
    #[test]
    fn ema_smooths_by_step_distance() {
        // Every step: TensorBoard's EMA.
        let dense = super::ema(&[(0.0, 0.0), (1.0, 1.0), (2.0, 1.0)], 0.5);
        assert_eq!(dense, [(0.0, 0.0), (1.0, 0.5), (2.0, 0.75)]);
        // Every 10 steps: weight 0.5^10 on the past, so the step to 1 is followed at once
        // (within 0.1%), not lagging as a per-point EMA (0.5) would.
        let sparse = super::ema(&[(0.0, 0.0), (10.0, 1.0)], 0.5);
        assert!(
            (sparse[1].1 - (1.0 - 0.5f64.powi(10))).abs() < 1e-15,
            "{sparse:?}"
        );
        assert!(sparse[1].1 > 0.999);
        // A repeated or backward step counts as one step.
        assert_eq!(super::ema(&[(3.0, 0.0), (3.0, 1.0)], 0.5)[1].1, 0.5);
    }

    use super::*;

    #[test]
    fn a_flat_row_at_zero_has_no_negative_half() {
        let near = |(lo, hi): (f64, f64), want: (f64, f64)| {
            assert!(
                (lo - want.0).abs() < 1e-12 && (hi - want.1).abs() < 1e-12,
                "{lo}..{hi}, expected {want:?}"
            )
        };
        // A held-out accuracy of 0 at every evaluation: 0 just above the bottom, no -0.4 tick.
        near(y_axis(0.0, 0.0), (-0.03, 0.5));
        // Flat at 0.3: the lower end would be -0.2; it starts just under 0 instead.
        near(y_axis(0.3, 0.3), (-0.048, 0.8));
        // Flat far from 0, and flat below 0: ±max(0.5, 10%) as before.
        near(y_axis(10.0, 10.0), (9.0, 11.0));
        near(y_axis(-0.2, -0.2), (-0.7, 0.3));
        // A row that varies: 6% beyond each end, below 0 included (its data start at 0).
        near(y_axis(0.0, 0.5), (-0.03, 0.53));
    }

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

    /// Styles sharing a colour (r and r + 8) differ in marker and dash, so a legend shared by
    /// panels names each line once: the first 32 styles are 32 distinct (colour, marker) pairs.
    #[test]
    fn styles_with_one_colour_differ_in_marker_and_dash() {
        let mut seen = std::collections::BTreeSet::new();
        for r in 0..4 * PALETTE.len() {
            assert!(
                seen.insert((PALETTE[r % PALETTE.len()], marker(r))),
                "style {r}"
            );
        }
        for r in 0..3 * PALETTE.len() {
            let s = r + PALETTE.len();
            assert_ne!(marker(r), marker(s), "styles {r} and {s}");
            assert_ne!(dash(r), dash(s), "styles {r} and {s}");
        }
        // The first pass is unchanged: circle, triangle, square, cross in turn.
        assert_eq!(
            (0..8).map(marker).collect::<Vec<_>>(),
            [0, 1, 2, 3, 0, 1, 2, 3]
        );
    }

    /// A note is wrapped at spaces; a word longer than a line is a line of its own.
    #[test]
    fn notes_wrap_at_word_boundaries() {
        assert_eq!(wrap("a bb ccc dddd", 6), ["a bb", "ccc", "dddd"]);
        assert_eq!(wrap("abcdefghij x", 4), ["abcdefghij", "x"]);
        assert!(wrap("  ", 4).is_empty());
    }

    /// Three seeds at steps 1 and 2, one of them also at step 3: the mean and ±1 SE at the shared
    /// steps (by hand: values 1, 2, 6 have mean 3, sample sd √7, SE √(7/3)), step 3 dropped.
    #[test]
    fn mean_se_is_the_mean_and_one_standard_error_at_shared_steps() {
        let r = mean_se(&[
            vec![(1.0, 1.0), (2.0, 0.0)],
            vec![(1.0, 2.0), (2.0, 0.0), (3.0, 9.0)],
            vec![(1.0, 6.0), (2.0, f64::NAN)],
        ]);
        assert_eq!(r.mean, [(1.0, 3.0)]);
        let se = (7.0f64 / 3.0).sqrt();
        assert_eq!(r.band.len(), 1);
        assert!((r.band[0].1 - (3.0 - se)).abs() < 1e-12, "{:?}", r.band);
        assert!((r.band[0].2 - (3.0 + se)).abs() < 1e-12, "{:?}", r.band);
        // Step 2 (a NaN in one seed) and step 3 (one seed only).
        assert_eq!(r.dropped, 2);
        // Two seeds 0 and 2: mean 1, sd √2, SE 1.
        let two = mean_se(&[vec![(0.0, 0.0)], vec![(0.0, 2.0)]]);
        assert_eq!(two.band, [(0.0, 0.0, 2.0)]);
        // One run: itself, no band.
        let one = mean_se(&[vec![(0.0, 0.5), (1.0, 0.25)]]);
        assert_eq!(one.mean, [(0.0, 0.5), (1.0, 0.25)]);
        assert!(one.band.is_empty());
        assert_eq!(one.dropped, 0);
    }

    #[test]
    fn step_ticks_are_integers() {
        assert_eq!(step_label(&20.0), "20");
        assert_eq!(step_label(&0.0), "0");
        assert_eq!(step_label(&12.5), "");
    }

    #[test]
    fn bands_are_cut_where_the_series_is() {
        let b = [
            (0.0, 0.0, 1.0),
            (1.0, 0.0, 1.0),
            (5.0, 0.0, 1.0),
            (6.0, 0.0, 1.0),
        ];
        let s = band_segments(&b);
        assert_eq!(s.len(), 2);
        assert_eq!(s[1][0].0, 5.0);
    }

    /// Four rows of wrapped panels with a legend: every data area inside the canvas, none
    /// overlapping another or the legend column.
    #[test]
    fn panels_and_legend_do_not_overlap() {
        let line = |r: usize| Line {
            style: r,
            points: (0..10).map(|i| (i as f64, (i * r) as f64)).collect(),
            band: (0..10)
                .map(|i| (i as f64, (i * r) as f64 - 1.0, (i * r) as f64 + 1.0))
                .collect(),
            faint: Vec::new(),
        };
        let row = |n: usize| Row {
            y_desc: "y".into(),
            panels: (0..n)
                .map(|p| Panel {
                    caption: Some(format!("p{p}")),
                    lines: vec![line(p), line(p + 1)],
                    note: None,
                })
                .collect(),
            legend: vec![("a long legend entry".into(), 0), ("b".into(), 1)],
        };
        let fig = Figure {
            title: Some("t".into()),
            rows: vec![row(5), row(2), row(1)],
            cols: 3,
            markers: true,
            solid: false,
            outer_labels: true,
        };
        let (w, h) = (1200, 900);
        let (_, l) = svg_string((w, h), &fig).unwrap();
        assert_eq!(l.data.len(), 8);
        assert_eq!(l.legends.len(), 3);
        let inside =
            |r: &Rect| r.0 .0 >= 0 && r.0 .1 >= 0 && r.1 .0 < w as i32 && r.1 .1 < h as i32;
        let disjoint = |a: &Rect, b: &Rect| {
            a.1 .0 < b.0 .0 || b.1 .0 < a.0 .0 || a.1 .1 < b.0 .1 || b.1 .1 < a.0 .1
        };
        for (i, a) in l.data.iter().chain(&l.legends).enumerate() {
            assert!(inside(a), "{a:?}");
            for b in l.data.iter().chain(&l.legends).skip(i + 1) {
                assert!(disjoint(a, b), "{a:?} {b:?}");
            }
        }
    }
}
