//! `rlvr plot`: SVG and PNG from metrics.jsonl files, nulls skipped, legend = run directory name
//! (once per figure), means over seeds, smoothing of the noisy metrics only.

use clap::Parser;
use rlvr_train::cli::{run_plot, PlotArgs};

#[derive(Parser)]
struct W {
    #[command(flatten)]
    a: PlotArgs,
}

fn write_run(dir: &std::path::Path, offset: f64) {
    std::fs::create_dir_all(dir).unwrap();
    let lines: Vec<String> = (0..5)
        .map(|s| {
            let r = if s == 2 {
                serde_json::Value::Null
            } else {
                (s as f64 * 0.1 + offset).into()
            };
            serde_json::json!({"step": s, "reward/mean": r, "loss": 1.0 / (s as f64 + 1.0)})
                .to_string()
        })
        .collect();
    std::fs::write(dir.join("metrics.jsonl"), lines.join("\n") + "\n").unwrap();
}

#[test]
fn plots_svg_and_png() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, b) = (
        tmp.path().join("on-policy"),
        tmp.path().join("off-policy-v4"),
    );
    write_run(&a, 0.0);
    write_run(&b, 0.2);
    for ext in ["svg", "png"] {
        let out = tmp.path().join(format!("p.{ext}"));
        let args = W::parse_from([
            "x",
            a.to_str().unwrap(),
            b.to_str().unwrap(),
            "--metric",
            "reward/mean",
            "--metric",
            "loss",
            "--out",
            out.to_str().unwrap(),
        ])
        .a;
        let mut buf = Vec::new();
        run_plot(&args, &mut buf).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&buf).unwrap();
        assert_eq!(v["points"], 2 * (4 + 5), "nulls are skipped");
        let bytes = std::fs::read(&out).unwrap();
        if ext == "svg" {
            let s = String::from_utf8(bytes).unwrap();
            assert!(
                s.contains("off-policy-v4") && s.contains("on-policy") && s.contains("reward/mean")
            );
        } else {
            assert_eq!(&bytes[1..4], b"PNG");
        }
    }
    let bad = W::parse_from([
        "x",
        a.to_str().unwrap(),
        "--metric",
        "nope",
        "--out",
        "/tmp/x.svg",
    ])
    .a;
    let err = run_plot(&bad, &mut Vec::new()).unwrap_err().to_string();
    assert!(err.contains("nope"), "{err}");
}

/// One `<text>` element of an SVG: position, anchor, font size, rotation, content.
#[derive(Debug)]
struct SvgText {
    x: f64,
    y: f64,
    anchor: String,
    size: f64,
    rotated: bool,
    text: String,
}

fn attr(tag: &str, name: &str) -> Option<String> {
    let key = format!(" {name}=\"");
    let i = tag.find(&key)? + key.len();
    Some(tag[i..i + tag[i..].find('"')?].to_string())
}

fn svg_texts(svg: &str) -> Vec<SvgText> {
    let mut out = Vec::new();
    let mut rest = svg;
    while let Some(i) = rest.find("<text") {
        let tag_end = i + rest[i..].find('>').unwrap();
        let tag = &rest[i..tag_end];
        let close = tag_end + rest[tag_end..].find("</text>").unwrap();
        out.push(SvgText {
            x: attr(tag, "x").unwrap().parse().unwrap(),
            y: attr(tag, "y").unwrap().parse().unwrap(),
            anchor: attr(tag, "text-anchor").unwrap_or_else(|| "start".into()),
            size: attr(tag, "font-size").unwrap().parse().unwrap(),
            rotated: attr(tag, "transform").is_some(),
            text: rest[tag_end + 1..close].trim().to_string(),
        });
        rest = &rest[close..];
    }
    out
}

fn plot_svg(dir: &std::path::Path, runs: &[&std::path::Path], metrics: &[&str]) -> String {
    let out = dir.join("p.svg");
    let mut v = vec!["x".to_string()];
    v.extend(runs.iter().map(|r| r.display().to_string()));
    for m in metrics {
        v.push("--metric".into());
        v.push(m.to_string());
    }
    v.push("--out".into());
    v.push(out.display().to_string());
    run_plot(&W::parse_from(v).a, &mut Vec::new()).unwrap();
    std::fs::read_to_string(out).unwrap()
}

fn write_steps(dir: &std::path::Path, points: &[(u64, f64)]) {
    std::fs::create_dir_all(dir).unwrap();
    let lines: Vec<String> = points
        .iter()
        .map(|(s, v)| serde_json::json!({"step": s, "reward/mean": v}).to_string())
        .collect();
    std::fs::write(dir.join("metrics.jsonl"), lines.join("\n") + "\n").unwrap();
}

/// WCAG relative luminance of an sRGB colour.
fn luminance((r, g, b): (u8, u8, u8)) -> f64 {
    let lin = |c: u8| {
        let c = c as f64 / 255.0;
        if c <= 0.04045 {
            c / 12.92
        } else {
            ((c + 0.055) / 1.055).powf(2.4)
        }
    };
    0.2126 * lin(r) + 0.7152 * lin(g) + 0.0722 * lin(b)
}

#[test]
fn ticks_are_whole_steps_and_every_label_is_inside_the_canvas() {
    let tmp = tempfile::tempdir().unwrap();
    // Three steps (a span where fractional ticks 0.5, 1.5 used to appear) and a long run name.
    let a = tmp.path().join("a-rather-long-run-directory-name");
    let b = tmp.path().join("b");
    write_steps(&a, &[(1, 0.25), (2, 0.5), (3, 0.125)]);
    write_steps(&b, &[(1, 0.3), (2, 0.1), (3, 0.7)]);
    let svg = plot_svg(tmp.path(), &[&a, &b], &["reward/mean"]);
    let (w, h) = (800.0, 300.0);
    let texts = svg_texts(&svg);
    let mut x_ticks = Vec::new();
    for t in &texts {
        // DejaVu Sans averages about 0.6 em a character.
        let tw = 0.6 * t.size * t.text.chars().count() as f64;
        let (left, right) = match t.anchor.as_str() {
            "middle" => (t.x - tw / 2.0, t.x + tw / 2.0),
            "end" => (t.x - tw, t.x),
            _ => (t.x, t.x + tw),
        };
        assert!(t.x >= 0.0 && t.x <= w && t.y >= 0.0 && t.y <= h, "{t:?}");
        if !t.rotated {
            assert!(left >= 0.0 && right <= w, "label leaves the canvas: {t:?}");
        }
        if t.anchor == "middle" && !t.rotated && t.text.parse::<f64>().is_ok() {
            x_ticks.push(t.text.clone());
        }
    }
    assert_eq!(x_ticks, ["1", "2", "3"], "{texts:?}");
    // A y-axis label (rotated) naming the metric, and the x-axis label.
    assert!(
        texts.iter().any(|t| t.rotated && t.text == "reward/mean"),
        "{texts:?}"
    );
    assert!(texts.iter().any(|t| !t.rotated && t.text == "step"));
    // The legend names both runs, to the right of every curve (the plot area ends before it).
    let legend_x = texts
        .iter()
        .filter(|t| t.text == "b" || t.text.starts_with("a-rather"))
        .map(|t| t.x)
        .collect::<Vec<_>>();
    let last_tick_x = texts.iter().find(|t| t.text == "3").unwrap().x;
    assert_eq!(legend_x.len(), 2);
    assert!(
        legend_x.iter().all(|&x| x > last_tick_x + 10.0),
        "{legend_x:?}"
    );
}

#[test]
fn a_one_point_series_gets_a_marker_and_identical_series_differ() {
    let tmp = tempfile::tempdir().unwrap();
    let one = tmp.path().join("one");
    write_steps(&one, &[(0, 0.5)]);
    let svg = plot_svg(tmp.path(), &[&one], &["reward/mean"]);
    // Its marker (run 0: a circle) is drawn, once in the plot and once in the legend.
    assert_eq!(svg.matches("<circle").count(), 2, "{svg}");
    let texts = svg_texts(&svg);
    let ticks: Vec<&str> = texts
        .iter()
        .filter(|t| t.anchor == "middle" && !t.rotated && t.text.parse::<f64>().is_ok())
        .map(|t| t.text.as_str())
        .collect();
    assert_eq!(ticks, ["0"]);

    // Two runs with the same values: different marker shapes and one dashed line.
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    let pts: Vec<(u64, f64)> = (0..6).map(|s| (s, 0.1 * s as f64)).collect();
    write_steps(&a, &pts);
    write_steps(&b, &pts);
    let svg = plot_svg(tmp.path(), &[&a, &b], &["reward/mean"]);
    // Run a: 6 circles + legend; run b: 6 triangles (polygons) + legend.
    assert_eq!(svg.matches("<circle").count(), 7);
    assert_eq!(svg.matches("<polygon").count(), 7);
    // Run b's line is dashed: many short segments rather than one polyline of 6 points.
    let (r, g, bl) = rlvr_train::plot::PALETTE[1];
    let stroke = format!("stroke=\"#{r:02X}{g:02X}{bl:02X}\"");
    assert!(svg.matches(&stroke).count() > 10, "{svg}");
}

#[test]
fn the_palette_has_no_low_contrast_colours() {
    for c in rlvr_train::plot::PALETTE {
        let contrast = (1.0 + 0.05) / (luminance(c) + 0.05);
        assert!(
            contrast >= 3.0,
            "{c:?}: contrast {contrast:.2} against white"
        );
        // Not yellow: red and green both high with little blue.
        assert!(!(c.0 > 180 && c.1 > 160 && c.2 < 100), "{c:?} is yellow");
    }
}

#[test]
fn labels_are_unique_gaps_stay_gaps_and_smoothing_is_tensorboards() {
    use rlvr_train::plot::{axis_label, ema, labels, segments};
    use std::path::PathBuf;
    let tmp = tempfile::tempdir().unwrap();
    let runs: Vec<PathBuf> = ["a/seed-0", "b/seed-0", "b/seed-1"]
        .iter()
        .map(|r| tmp.path().join(r))
        .collect();
    for r in &runs {
        write_steps(r, &[(1, 0.5)]);
    }
    assert_eq!(
        labels(&runs, &[]).unwrap(),
        ["a/seed-0", "b/seed-0", "seed-1"]
    );
    let same = vec![runs[0].clone(), runs[0].clone()];
    assert_eq!(labels(&same, &[]).unwrap(), ["a/seed-0", "a/seed-0 #2"]);
    let err = labels(&runs, &["x".into()]).unwrap_err().to_string();
    assert!(err.contains("1 --label value for 3 runs"), "{err}");
    // Steps 1, 2, 3 then 6, 7: a gap; evaluations every 2 with the last at 5: none.
    let s = [(1.0, 1.0), (2.0, 2.0), (3.0, 3.0), (6.0, 6.0), (7.0, 7.0)];
    let seg = segments(&s);
    assert_eq!(seg.len(), 2);
    assert_eq!(seg[0], &s[..3]);
    let e = [(0.0, 0.1), (2.0, 0.2), (4.0, 0.3), (5.0, 0.3)];
    assert_eq!(segments(&e).len(), 1);
    // w = 0.5: 1, then 0.5·1 + 0.5·3 = 2, then 0.5·2 + 0.5·0 = 1.
    assert_eq!(
        ema(&[(1.0, 1.0), (2.0, 3.0), (3.0, 0.0)], 0.5),
        [(1.0, 1.0), (2.0, 2.0), (3.0, 1.0)]
    );
    assert_eq!(axis_label("time/train_s"), "time/train_s (s)");
    assert_eq!(axis_label("eval/accuracy"), "eval/accuracy (fraction)");
    assert_eq!(axis_label("loss"), "loss");
    assert_eq!(axis_label("tokens_per_s"), "tokens_per_s (tokens/s)");
}

#[test]
fn a_diagnostics_series_with_labels_title_and_smoothing_draws() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    write_steps(&run, &[(1, 0.0), (2, 1.0), (3, 0.0)]);
    let diag: Vec<String> = (1..=3)
        .map(|s| serde_json::json!({"step": s, "rows": 8 * s}).to_string())
        .collect();
    std::fs::write(run.join("diagnostics.jsonl"), diag.join("\n") + "\n").unwrap();
    let out = tmp.path().join("d.svg");
    let a = W::parse_from([
        "x",
        run.to_str().unwrap(),
        "--metric",
        "diagnostics/rows",
        "--metric",
        "reward/mean",
        "--label",
        "my run",
        "--smooth",
        "0.6",
        "--title",
        "One title",
        "--out",
        out.to_str().unwrap(),
    ])
    .a;
    let mut buf = Vec::new();
    run_plot(&a, &mut buf).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&buf).unwrap();
    assert_eq!(v["points"], 6);
    let svg = std::fs::read_to_string(&out).unwrap();
    let texts: Vec<String> = svg_texts(&svg).into_iter().map(|t| t.text).collect();
    assert_eq!(
        texts.iter().filter(|t| *t == "One title").count(),
        1,
        "{texts:?}"
    );
    assert!(texts.iter().any(|t| t == "diagnostics/rows"), "{texts:?}");
    // One legend for the two rows.
    assert_eq!(texts.iter().filter(|t| *t == "my run").count(), 1);
    // The faint raw line (opacity 0.25) under the smoothed reward; `diagnostics/rows`, a count,
    // is drawn as it is.
    assert_eq!(svg.matches("opacity=\"0.25\"").count(), 1, "{svg}");
    let bad = W::parse_from([
        "x",
        run.to_str().unwrap(),
        "--metric",
        "loss",
        "--smooth",
        "1",
    ])
    .a;
    let err = run_plot(&bad, &mut Vec::new()).unwrap_err().to_string();
    assert!(err.contains("--smooth 1"), "{err}");
}

#[test]
fn facet_draws_one_captioned_panel_per_run_without_a_legend() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, b) = (tmp.path().join("v1"), tmp.path().join("v16"));
    write_steps(&a, &[(1, 0.1), (2, 0.2), (3, 0.3)]);
    write_steps(&b, &[(1, 0.3), (2, 0.2), (3, 0.1)]);
    let out = tmp.path().join("f.svg");
    let args = W::parse_from([
        "x",
        a.to_str().unwrap(),
        b.to_str().unwrap(),
        "--metric",
        "reward/mean",
        "--facet",
        "--width",
        "900",
        "--out",
        out.to_str().unwrap(),
    ])
    .a;
    run_plot(&args, &mut Vec::new()).unwrap();
    let svg = std::fs::read_to_string(&out).unwrap();
    let texts = svg_texts(&svg);
    for name in ["v1", "v16"] {
        let t: Vec<&SvgText> = texts.iter().filter(|t| t.text == name).collect();
        assert_eq!(t.len(), 1, "{name} once, as its panel's caption");
        // 14 px: larger than the axis descriptions (13 px), however the SVG scales font sizes.
        let desc = texts.iter().find(|t| t.text == "step").unwrap().size;
        assert!(t[0].size > desc, "{} vs {desc}", t[0].size);
    }
    // Side by side: v16's caption right of v1's, both inside the canvas.
    let x = |n: &str| texts.iter().find(|t| t.text == n).unwrap().x;
    assert!(x("v1") < 450.0 && x("v16") > 450.0 && x("v16") < 900.0);
    // Two y axes labelled with the metric, one per panel.
    assert_eq!(texts.iter().filter(|t| t.text == "reward/mean").count(), 2);
}

/// An `--out` that cannot be written is an error naming the flag and the path (it used to say
/// only "Drawing backend error: No such file or directory"), for SVG and PNG.
#[test]
fn an_unwritable_out_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    write_run(&run, 0.0);
    for ext in ["svg", "png"] {
        let out = tmp.path().join(format!("no-such-dir/p.{ext}"));
        let args = W::parse_from([
            "x",
            run.to_str().unwrap(),
            "--metric",
            "loss",
            "--out",
            out.to_str().unwrap(),
        ])
        .a;
        let err = format!("{:#}", run_plot(&args, &mut Vec::new()).unwrap_err());
        assert!(
            err.starts_with(&format!("writing --out {}: ", out.display())),
            "{err}"
        );
    }
}

/// A metrics.jsonl whose last line a kill cut short plots every line before it (the warning on
/// stderr names the file and line: `rlvr_rundir::jsonl::read_metrics_but_a_cut_end`, tested
/// there); a cut line with lines after it is still an error naming the file and line, and so is
/// a bad last line that is whole (not JSON, newline-terminated). `--heatmap` reads the same way.
#[test]
fn a_cut_last_line_is_left_out_and_a_cut_middle_line_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("killed");
    write_steps(&run, &[(1, 0.5), (2, 0.25), (3, 0.75)]);
    let m = run.join("metrics.jsonl");
    let whole = std::fs::read_to_string(&m).unwrap();
    let plot = |metric: &str, heat: bool| {
        let out = tmp.path().join("p.svg");
        let mut v = vec![
            "x".to_string(),
            run.display().to_string(),
            "--metric".into(),
            metric.into(),
            "--out".into(),
            out.display().to_string(),
        ];
        if heat {
            v.push("--heatmap".into());
        }
        let mut buf = Vec::new();
        run_plot(&W::parse_from(v).a, &mut buf).map(|()| {
            serde_json::from_slice::<serde_json::Value>(&buf).unwrap()["points"]
                .as_u64()
                .unwrap()
        })
    };
    // Cut inside the 4th line: the file ends without a newline.
    std::fs::write(&m, format!("{whole}{{\"step\": 4, \"reward/me")).unwrap();
    assert_eq!(plot("reward/mean", false).unwrap(), 3);
    // Cut after a number, and cut with its newline still there: still the end of the JSON.
    std::fs::write(&m, format!("{whole}{{\"step\": 4, \"reward/mean\": 0.5\n")).unwrap();
    assert_eq!(plot("reward/mean", false).unwrap(), 3);
    // The same cut line in the middle: an error naming file and line 2.
    let lines: Vec<&str> = whole.lines().collect();
    std::fs::write(
        &m,
        format!("{}\n{{\"step\": 2, \"rew\n{}\n", lines[0], lines[2]),
    )
    .unwrap();
    let e = format!("{:#}", plot("reward/mean", false).unwrap_err());
    assert!(e.contains(&format!("{}:2", m.display())), "{e}");
    // A whole last line that is not JSON is no cut: an error naming it.
    std::fs::write(&m, format!("{whole}not json\n")).unwrap();
    let e = format!("{:#}", plot("reward/mean", false).unwrap_err());
    assert!(e.contains(&format!("{}:4", m.display())), "{e}");
    // --heatmap: a histogram series with a cut last line.
    let hist: Vec<String> = (1..=3)
        .map(|s| serde_json::json!({"step": s, "hist/ratio": [1, 2, 3]}).to_string())
        .collect();
    std::fs::write(
        &m,
        format!("{}\n{{\"step\": 4, \"hist/ratio\": [1, ", hist.join("\n")),
    )
    .unwrap();
    assert_eq!(plot("hist/ratio", true).unwrap(), 9);
}

/// A run directory with a config.toml (`train.seed`, `data.seed` = `seed`, `train.lr`,
/// `model.path`, `output.dir`) and `reward/mean` and `lr` at the given steps.
fn seeded_run(dir: &std::path::Path, seed: u64, lr: f64, model: &str, points: &[(u64, f64)]) {
    std::fs::create_dir_all(dir).unwrap();
    let config = format!(
        "[model]\npath = \"{model}\"\n[data]\nseed = {seed}\n[train]\nseed = {seed}\nlr = {lr}\n\
         [output]\ndir = \"{}\"\n",
        dir.display()
    );
    std::fs::write(dir.join("config.toml"), config).unwrap();
    let lines: Vec<String> = points
        .iter()
        .map(|(s, v)| serde_json::json!({"step": s, "reward/mean": v, "lr": lr}).to_string())
        .collect();
    std::fs::write(dir.join("metrics.jsonl"), lines.join("\n") + "\n").unwrap();
}

fn args(v: &[&str]) -> PlotArgs {
    let mut all = vec!["x"];
    all.extend_from_slice(v);
    W::parse_from(all).a
}

/// Three seeds of one config are one line: the mean at the steps all three have, a band of ±1
/// standard error, "(mean ± SE of 3 seeds)" in the legend; a run with another `train.lr` is its
/// own line; the legend is drawn beside the first row only.
#[test]
fn mean_over_seeds_draws_one_line_per_config_with_a_standard_error_band() {
    let tmp = tempfile::tempdir().unwrap();
    let d = |p: &str| tmp.path().join(p);
    // reward/mean = 0.1·t + 0.1·seed; seed 2 stops at step 2.
    for seed in 0..3u64 {
        let last = if seed == 2 { 2 } else { 3 };
        let pts: Vec<(u64, f64)> = (1..=last)
            .map(|t| (t, 0.1 * t as f64 + 0.1 * seed as f64))
            .collect();
        seeded_run(&d(&format!("grpo/seed-{seed}")), seed, 1e-4, "m", &pts);
    }
    seeded_run(
        &d("other/seed-0"),
        0,
        2e-4,
        "m",
        &[(1, 0.9), (2, 0.9), (3, 0.9)],
    );
    let runs: Vec<String> = ["grpo/seed-0", "grpo/seed-1", "grpo/seed-2", "other/seed-0"]
        .iter()
        .map(|r| d(r).display().to_string())
        .collect();
    let mut v: Vec<&str> = runs.iter().map(String::as_str).collect();
    v.extend([
        "--metric",
        "reward/mean",
        "--metric",
        "lr",
        "--mean-over-seeds",
    ]);
    let b = rlvr_train::plot::build(&args(&v)).unwrap();
    let rows = &b.figure.rows;
    let legend: Vec<&str> = rows[0].legend.iter().map(|l| l.0.as_str()).collect();
    assert_eq!(legend, ["grpo (mean ± SE of 3 seeds)", "other/seed-0"]);
    assert!(b.notes.is_empty(), "{:?}", b.notes);
    assert!(rows[1].legend.is_empty(), "one legend per figure");
    let grpo = &rows[0].panels[0].lines[0];
    // Step 3 is left out (seed 2 has none). Step 1: 0.1, 0.2, 0.3: mean 0.2, sd 0.1, SE 0.1/√3.
    assert_eq!(grpo.points.len(), 2);
    let close = |a: f64, b: f64| assert!((a - b).abs() < 1e-12, "{a} vs {b}");
    close(grpo.points[0].1, 0.2);
    close(grpo.points[1].1, 0.3);
    let se = 0.1 / 3f64.sqrt();
    assert_eq!(grpo.band.len(), 2);
    close(grpo.band[0].1, 0.2 - se);
    close(grpo.band[0].2, 0.2 + se);
    // The single run: its own series, no band.
    let other = &rows[0].panels[0].lines[1];
    assert_eq!(other.points, [(1.0, 0.9), (2.0, 0.9), (3.0, 0.9)]);
    assert!(other.band.is_empty());
    // The lr row: the same groups (every seed at 1e-4: a band of width 0).
    close(rows[1].panels[0].lines[0].points[0].1, 1e-4);
    assert_eq!(b.points, 2 * (3 + 3 + 2 + 3));

    // One label per group replaces the names; one per run names each group by its first run.
    let mut w = v.clone();
    w.extend(["--label", "GRPO", "--label", "more lr"]);
    let b = rlvr_train::plot::build(&args(&w)).unwrap();
    let legend: Vec<&str> = b.figure.rows[0]
        .legend
        .iter()
        .map(|l| l.0.as_str())
        .collect();
    assert_eq!(legend, ["GRPO (mean ± SE of 3 seeds)", "more lr"]);
    let mut w = v.clone();
    w.extend(["--label", "a"]);
    let e = rlvr_train::plot::build(&args(&w)).unwrap_err().to_string();
    assert!(e.contains("one per group of seeds (2)"), "{e}");

    // Without the flag: one line per run.
    let b = rlvr_train::plot::build(&args(&v[..v.len() - 1])).unwrap();
    assert_eq!(b.figure.rows[0].panels[0].lines.len(), 4);
    assert!(b.figure.rows[0].panels[0]
        .lines
        .iter()
        .all(|l| l.band.is_empty()));

    // Seeds that start from their own checkpoints differ in model.path. A path named after the
    // seed (a lab's `warm_start/seed-S/sft`, and its `seed-S/data/...`) is read as one path:
    // one line without any --ignore-key (the lab's quickstart runs also differ in data.train and
    // data.test, which `--ignore-key model.path` alone left apart).
    for seed in 0..2u64 {
        let pts = [(1, 0.5 + seed as f64)];
        seeded_run(
            &d(&format!("lab/seed-{seed}")),
            seed,
            1e-4,
            &format!("warm/seed-{seed}"),
            &pts,
        );
    }
    let lab: Vec<String> = (0..2)
        .map(|s| d(&format!("lab/seed-{s}")).display().to_string())
        .collect();
    let mut v: Vec<&str> = lab.iter().map(String::as_str).collect();
    v.extend(["--metric", "reward/mean", "--mean-over-seeds"]);
    let b = rlvr_train::plot::build(&args(&v)).unwrap();
    let line = &b.figure.rows[0].panels[0].lines[0];
    assert_eq!(b.figure.rows[0].panels[0].lines.len(), 1);
    assert_eq!(line.points, [(1.0, 1.0)]);
    // Two seeds at 0.5 and 1.5: sd 1/√2, SE 0.5.
    assert_eq!(line.band, [(1.0, 0.5, 1.5)]);
    assert_eq!(b.figure.rows[0].legend[0].0, "lab (mean ± SE of 2 seeds)");
    assert!(b.notes.is_empty(), "{:?}", b.notes);
    // Checkpoints not named after the seed: apart, with a note naming the flag (nothing used to
    // say why), and one line with it.
    for (seed, m) in [(0u64, "warm/first"), (1, "warm/second")] {
        seeded_run(&d(&format!("own/seed-{seed}")), seed, 1e-4, m, &[(1, 0.5)]);
    }
    let own: Vec<String> = (0..2)
        .map(|s| d(&format!("own/seed-{s}")).display().to_string())
        .collect();
    let mut v: Vec<&str> = own.iter().map(String::as_str).collect();
    v.extend(["--metric", "reward/mean", "--mean-over-seeds"]);
    let b = rlvr_train::plot::build(&args(&v)).unwrap();
    assert_eq!(b.figure.rows[0].panels[0].lines.len(), 2);
    assert_eq!(b.notes.len(), 1, "{:?}", b.notes);
    assert!(
        b.notes[0].contains("differ in model.path besides their seeds")
            && b.notes[0].contains("add --ignore-key model.path"),
        "{}",
        b.notes[0]
    );
    v.extend(["--ignore-key", "model.path"]);
    let b = rlvr_train::plot::build(&args(&v)).unwrap();
    assert_eq!(b.figure.rows[0].panels[0].lines.len(), 1);
    assert!(b.notes.is_empty(), "{:?}", b.notes);
    // Runs that differ in a hyperparameter are never suggested as seeds of one config.
    let mut v: Vec<&str> = vec![&runs[0], &runs[3]];
    v.extend(["--metric", "reward/mean", "--mean-over-seeds"]);
    let b = rlvr_train::plot::build(&args(&v)).unwrap();
    assert!(b.notes.is_empty(), "{:?}", b.notes);

    // A run without its config.toml is named.
    write_steps(&d("bare"), &[(1, 0.1)]);
    let bare = d("bare").display().to_string();
    let e = format!(
        "{:#}",
        rlvr_train::plot::build(&args(&[
            &bare,
            "--metric",
            "reward/mean",
            "--mean-over-seeds"
        ]))
        .unwrap_err()
    );
    assert!(e.contains("config.toml"), "{e}");
    // And the whole command draws it.
    let out = d("mean.png").display().to_string();
    let mut v: Vec<&str> = runs.iter().map(String::as_str).collect();
    v.extend([
        "--metric",
        "reward/mean",
        "--mean-over-seeds",
        "--smooth",
        "0.5",
        "--out",
        &out,
    ]);
    run_plot(&args(&v), &mut Vec::new()).unwrap();
    assert_eq!(&std::fs::read(d("mean.png")).unwrap()[1..4], b"PNG");
}

/// `--smooth` smooths the noisy statistics and leaves schedules and counts as they are.
#[test]
fn smoothing_leaves_schedules_and_counts_alone() {
    use rlvr_train::plot::smoothable;
    for k in [
        "reward/mean",
        "loss",
        "eval/accuracy",
        "clip_frac",
        "diagnostics/time/score_s",
    ] {
        assert!(smoothable(k), "{k}");
    }
    for k in [
        "lr",
        "staleness/mean",
        "staleness/max",
        "eval/n",
        "diagnostics/updates",
        "diagnostics/rows",
        "diagnostics/staleness/unknown",
        "diagnostics/memory/rss_mib",
        "explorer_version",
    ] {
        assert!(!smoothable(k), "{k}");
    }
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    seeded_run(&run, 0, 1e-4, "m", &[(1, 0.0), (2, 1.0), (3, 1.0)]);
    let r = run.display().to_string();
    let b = rlvr_train::plot::build(&args(&[
        &r,
        "--metric",
        "reward/mean",
        "--metric",
        "lr",
        "--smooth",
        "0.5",
    ]))
    .unwrap();
    let reward = &b.figure.rows[0].panels[0].lines[0];
    assert_eq!(reward.points, [(1.0, 0.0), (2.0, 0.5), (3.0, 0.75)]);
    assert_eq!(reward.faint, [(1.0, 0.0), (2.0, 1.0), (3.0, 1.0)]);
    let lr = &b.figure.rows[1].panels[0].lines[0];
    assert_eq!(lr.points, [(1.0, 1e-4), (2.0, 1e-4), (3.0, 1e-4)]);
    assert!(lr.faint.is_empty());
}

/// A metric no run has is named with the closest key the runs have: one it begins
/// (`reward/me` → `reward/mean`) or one a typo away (`rewrd/mean`); nothing close, no guess.
/// It used to say only "check the name against metrics.jsonl".
#[test]
fn an_unknown_metric_gets_the_closest_key() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("r");
    seeded_run(&run, 0, 1e-4, "m", &[(1, 0.5), (2, 0.6)]);
    let r = run.display().to_string();
    for (m, want) in [
        ("reward/me", Some("reward/mean")),
        ("rewrd/mean", Some("reward/mean")),
        ("entropy_of_everything", None),
    ] {
        let e = rlvr_train::plot::build(&args(&[&r, "--metric", m]))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(&format!("no run has a value for metric `{m}`")),
            "{e}"
        );
        match want {
            Some(w) => assert!(e.contains(&format!("did you mean `{w}`?")), "{e}"),
            None => assert!(!e.contains("did you mean"), "{e}"),
        }
    }
}

/// Writes `lines` (JSON objects) as `dir/name`, one a line.
fn write_jsonl(dir: &std::path::Path, name: &str, lines: &[serde_json::Value]) {
    std::fs::create_dir_all(dir).unwrap();
    let text: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
    std::fs::write(dir.join(name), text.join("\n") + "\n").unwrap();
}

/// A panel with no data says why in its data area instead of staying blank axes: `--facet` (the
/// multi-turn run has `env/turns/mean`, the single-turn one holds null at every step, as rlvr
/// writes it), an overlaid panel (a caption naming the run without a line) and `--heatmap` (a run
/// without `hist/mismatch`); each also said on stderr in `Built::notes`. They used to be empty
/// axes with nothing to tell a missing metric from a plotting bug.
#[test]
fn an_empty_panel_says_why_it_is_empty() {
    let tmp = tempfile::tempdir().unwrap();
    let (multi, single) = (tmp.path().join("multi"), tmp.path().join("single"));
    let line = |s: u64, turns: serde_json::Value| serde_json::json!({"step": s, "reward/mean": 0.1 * s as f64, "env/turns/mean": turns});
    write_jsonl(
        &multi,
        "metrics.jsonl",
        &[line(1, 2.0.into()), line(2, 3.0.into())],
    );
    write_jsonl(
        &single,
        "metrics.jsonl",
        &[
            line(1, serde_json::Value::Null),
            line(2, serde_json::Value::Null),
        ],
    );
    let why =
        "`env/turns/mean` is null at every step: logged only by multi-turn runs (an [env] table)";
    let run = |extra: &[&str], out: &str| {
        let out = tmp.path().join(out);
        let mut v = vec![
            "x".to_string(),
            multi.display().to_string(),
            single.display().to_string(),
            "--width".into(),
            "900".into(),
            "--out".into(),
            out.display().to_string(),
        ];
        v.extend(extra.iter().map(|s| s.to_string()));
        run_plot(&W::parse_from(v).a, &mut Vec::new()).unwrap();
        out
    };
    let facet = run(
        &[
            "--metric",
            "env/turns/mean",
            "--metric",
            "reward/mean",
            "--facet",
        ],
        "facet.svg",
    );
    let texts = svg_texts(&std::fs::read_to_string(&facet).unwrap());
    // The note's lines, wrapped to the panel: grey text right of the middle (single's panel).
    let note: Vec<&SvgText> = texts
        .iter()
        .filter(|t| t.anchor == "middle" && !t.rotated && t.x > 450.0 && t.y > 40.0 && t.y < 250.0)
        .filter(|t| t.text != "step" && !t.text.chars().all(|c| c.is_ascii_digit() || c == '.'))
        .collect();
    let joined: Vec<&str> = note.iter().map(|t| t.text.as_str()).collect();
    assert_eq!(joined.join(" "), why, "{texts:?}");
    assert!(note.len() > 1, "wrapped to the panel's width: {joined:?}");
    // Only the empty panel has a note (reward/mean is in both runs).
    assert!(!texts
        .iter()
        .any(|t| t.text.contains("null at every step") && t.y > 300.0));
    // Overlaid: single has no line; the caption says so.
    let overlay = run(&["--metric", "env/turns/mean"], "overlay.svg");
    let svg = std::fs::read_to_string(&overlay).unwrap();
    assert!(
        svg_texts(&svg)
            .iter()
            .any(|t| t.text == "no line for single: `env/turns/mean` is null at every step"),
        "{svg}"
    );
    let b = rlvr_train::plot::build(
        &W::parse_from([
            "x",
            multi.to_str().unwrap(),
            single.to_str().unwrap(),
            "--metric",
            "env/turns/mean",
        ])
        .a,
    )
    .unwrap();
    assert_eq!(
        b.notes,
        [format!(
            "note: single: no line in the panel of env/turns/mean: {why}"
        )]
    );
    // A heat map of a histogram one run lacks.
    write_jsonl(
        &multi,
        "diagnostics.jsonl",
        &[serde_json::json!({"step": 1, "hist/mismatch": [1, 2, 3]})],
    );
    write_jsonl(
        &single,
        "diagnostics.jsonl",
        &[serde_json::json!({"step": 1, "hist/ratio": [1, 2, 3]})],
    );
    let heat = run(
        &["--metric", "diagnostics/hist/mismatch", "--heatmap"],
        "heat.svg",
    );
    let texts = svg_texts(&std::fs::read_to_string(&heat).unwrap());
    let words: Vec<&str> = texts
        .iter()
        .filter(|t| t.anchor == "middle" && !t.rotated)
        .map(|t| t.text.as_str())
        .collect();
    assert!(
        words.join(" ").contains(
            "no `hist/mismatch` in diagnostics.jsonl: null on the steps without on-policy \
             (staleness 0) rows"
        ),
        "{words:?}"
    );
    // The empty panel's axes are the other run's: its three buckets (it once had one "bucket 0"
    // over steps 0 to 1).
    let rows = texts.iter().filter(|t| t.text == "bucket 2").count();
    assert_eq!(rows, 2, "{texts:?}");
    // PNG too (a figure to look at).
    run(
        &[
            "--metric",
            "env/turns/mean",
            "--metric",
            "reward/mean",
            "--facet",
        ],
        "facet.png",
    );
}
