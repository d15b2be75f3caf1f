//! The lab's figures and `rlvr lab --redraw`: a synthetic lab (run directories with metrics.jsonl,
//! no training) is analysed; lab_data.json alone, copied elsewhere, redraws the same figures' data
//! and the same summary and verdicts; every figure is small multiples whose legend covers no data
//! and whose labels stay inside the canvas.

use std::path::Path;

use rlvr_lab::data::{LabData, FILE};
use rlvr_lab::figures::{figures, Drawn};
use rlvr_lab::sweep::Sweep;

use crate::common::read;

const SWEEP: &str = r#"
[lab]
seeds = [0, 1, 2]
steps = 40
eval_every = 10

[[arm]]
name = "grpo_v1"
label = "GRPO"
preset = "grpo"
interval = 1

[[arm]]
name = "grpo_v16"
label = "GRPO"
preset = "off_policy_grpo"
interval = 16

[[arm]]
name = "reinforce_v1"
label = "REINFORCE"
preset = "reinforce"
interval = 1

[[arm]]
name = "reinforce_v16"
label = "REINFORCE"
preset = "reinforce"
interval = 16

[[arm]]
name = "rec_oneside_is_v16"
label = "REC-OneSide-IS"
preset = "rec_oneside_is"
interval = 16

[[arm]]
name = "rec_oneside_nois_v16"
label = "REC-OneSide-NoIS"
preset = "rec_oneside_nois"
interval = 16

[[arm]]
name = "opmd_v16"
label = "OPMD"
preset = "opmd"
interval = 16

[[arm]]
name = "red_drop_v16"
label = "RED-Drop"
preset = "red_drop"
interval = 16
"#;

/// A run's metrics.jsonl: evaluations every 10 steps (step 0 included), training lines with the
/// diagnostics at steps 1..=40, values varying with the arm `k` and the seed (the ratio's
/// extremes at steps 5 and 7).
fn write_run(dir: &Path, k: usize, seed: u64) {
    std::fs::create_dir_all(dir).unwrap();
    let mut lines = Vec::new();
    for step in 0..=40u64 {
        if step > 0 {
            let t = step as f64;
            lines.push(serde_json::json!({
                "step": step, "loss": 0.1,
                "reward/mean": 0.3 + 0.01 * k as f64 + 0.001 * seed as f64 * t,
                "clip_frac": 0.01 * (k as f64) * (1.0 + (t / 7.0).sin()) / 3.0,
                // A dip at step 5 and a spike at step 7: the run's extremes, not the last step's.
                "ratio/min": 0.9 - 0.01 * k as f64 - 0.001 * seed as f64 * t
                    - if step == 5 { 0.5 } else { 0.0 },
                "ratio/max": 1.1 + 0.1 * k as f64 + 0.013 * t + 0.0123456 * seed as f64
                    + if step == 7 { 3.0 } else { 0.0 },
                "entropy": 0.8 - 0.01 * t / (1.0 + k as f64) + 0.01 * seed as f64,
                "kl_behaviour": 1e-3 * (1.0 + k as f64) * (1.0 + (t / 5.0).cos()),
            }));
        }
        if step % 10 == 0 {
            lines.push(serde_json::json!({
                "step": step,
                "eval/accuracy": 0.2 + 0.002 * (step as f64) * (k as f64 + 1.0) / 4.0
                    + 0.01 * seed as f64,
                "eval/n": 500,
            }));
        }
    }
    let text: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
    std::fs::write(dir.join("metrics.jsonl"), text.join("\n") + "\n").unwrap();
}

fn lab(out: &Path) -> Sweep {
    let sweep = Sweep::parse(SWEEP).unwrap();
    for r in sweep.runs() {
        write_run(&sweep.run_dir(out, &r), r.arm, r.seed);
    }
    sweep
}

#[test]
fn redraw_from_lab_data_alone_gives_the_same_figures_summary_and_verdicts() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("lab");
    let sweep = lab(&out);
    let vs = rlvr_lab::analyse(&sweep, &out, 3).unwrap();
    let data = LabData::read(&out).unwrap();
    assert_eq!(data.runs.len(), 24);
    assert_eq!(data.smooth, 3);
    // Per run: arm, seed, steps, the evaluations exact, the diagnostics at every step.
    let r = &data.runs[0];
    assert_eq!((r.summary.arm.as_str(), r.summary.seed), ("grpo_v1", 0));
    assert_eq!(r.summary.steps, 40);
    assert_eq!(r.accuracy.len(), 5);
    assert_eq!(r.accuracy[4], (40, 0.2 + 0.002 * 40.0 / 4.0));
    for k in [
        "reward/mean",
        "clip_frac",
        "ratio/min",
        "ratio/max",
        "entropy",
        "kl_behaviour",
    ] {
        assert_eq!(r.points(k).len(), 40, "{k}");
    }

    // The clip fraction over the whole run: each run's mean over its steps (from the stored
    // series), then the mean over seeds; arm k's clip_frac is 0.01 k (1 + sin(t/7))/3, the same
    // for every seed, so the arm's value is that series' mean, and not the last step's value.
    let runs = data.summaries();
    let arm = |name: &str| {
        rlvr_lab::summary::arm_stats(&runs)
            .into_iter()
            .find(|a| a.arm == name)
            .unwrap()
    };
    let k = 1.0; // grpo_v16 is arm 1
    let want: f64 = (1..=40)
        .map(|t| rlvr_lab::data::round(0.01 * k * (1.0 + (t as f64 / 7.0).sin()) / 3.0, 3))
        .sum::<f64>()
        / 40.0;
    let g = arm("grpo_v16");
    assert!((g.clip_frac_mean.unwrap() - want).abs() < 1e-12, "{g:?}");
    let last = 0.01 * k * (1.0 + (40.0f64 / 7.0).sin()) / 3.0;
    assert!((g.clip_frac.unwrap() - last).abs() < 1e-12);
    assert!((want - last).abs() > 1e-3);
    assert_eq!(arm("grpo_v1").clip_frac_mean, Some(0.0));
    assert!(read(&out.join("summary.md")).contains("| clip frac (run) | clip frac (last) |"));
    // The ratio range over the whole run (the dip at step 5, the spike at step 7, seed 2 the
    // farthest), not the last step's: min 0.9 − 0.01 − 0.002·5 − 0.5 = 0.38, max 1.1 + 0.1 +
    // 0.013·7 + 0.0246912 + 3 = 4.3156912, stored to 3 significant digits (4.32).
    assert_eq!(g.ratio_min_run, Some(0.38));
    assert_eq!(g.ratio_max_run, Some(4.32));
    assert!(
        (g.ratio_min.unwrap() - 0.81).abs() < 1e-12,
        "last step: {g:?}"
    );
    assert!(
        (g.ratio_max.unwrap() - 1.7446912).abs() < 1e-12,
        "last step: {g:?}"
    );
    let md = read(&out.join("summary.md"));
    assert!(md.contains("| ratio min (run) | ratio max (run) |"), "{md}");
    let row = md.lines().find(|l| l.starts_with("| grpo_v16 |")).unwrap();
    assert!(row.contains("| 0.380 | 4.320 |"), "{row}");
    // Not stored in lab_data.json (derived from its series on reading).
    assert!(!read(&out.join(FILE)).contains("clip_frac_mean"));
    assert!(!read(&out.join(FILE)).contains("ratio_min_run"));
    assert!(read(&out.join("summary.json")).contains("clip_frac_mean"));

    // Only the data file, somewhere else: the same everything.
    let elsewhere = tmp.path().join("docs");
    std::fs::create_dir_all(&elsewhere).unwrap();
    std::fs::copy(out.join(FILE), elsewhere.join(FILE)).unwrap();
    let again = rlvr_lab::redraw(&elsewhere, None, None).unwrap();
    assert_eq!(
        serde_json::to_value(&vs).unwrap(),
        serde_json::to_value(&again).unwrap()
    );
    for f in [
        "summary.json",
        "summary.md",
        "verdicts.json",
        "verdicts.md",
        FILE,
    ] {
        assert!(
            read(&out.join(f)) == read(&elsewhere.join(f)),
            "{f} differs"
        );
    }
    let redrawn = LabData::read(&elsewhere).unwrap();
    assert_eq!(redrawn, data);
    assert_eq!(figures(&data, 3), figures(&redrawn, 3));
    let stems: Vec<String> = figures(&data, 3).into_iter().map(|d| d.stem).collect();
    assert_eq!(
        stems,
        [
            "accuracy_v1",
            "diagnostics_v1",
            "accuracy_v16",
            "diagnostics_v16",
            "intervals"
        ]
    );
    for s in &stems {
        for dir in [&out, &elsewhere] {
            assert!(read(&dir.join(format!("{s}.svg"))).contains("<svg"), "{s}");
            let png = std::fs::read(dir.join(format!("{s}.png"))).unwrap();
            assert_eq!(&png[1..4], b"PNG", "{s}");
        }
    }
    // Into another directory with --out, and with another smoothing: the figures change, the
    // summary does not.
    let third = tmp.path().join("third");
    rlvr_lab::redraw(&elsewhere, Some(&third), Some(1)).unwrap();
    assert!(read(&third.join("summary.md")) == read(&out.join("summary.md")));
    assert!(read(&third.join(FILE)) == read(&out.join(FILE)));
    assert_ne!(figures(&data, 1), figures(&data, 3));

    // A directory without the data file is an error naming it.
    let e = rlvr_lab::redraw(&tmp.path().join("none"), None, None)
        .unwrap_err()
        .to_string();
    assert!(e.contains(FILE), "{e}");
}

/// The figure of `stem`.
fn fig<'a>(all: &'a [Drawn], stem: &str) -> &'a Drawn {
    all.iter().find(|d| d.stem == stem).unwrap()
}

#[test]
fn accuracy_is_one_panel_per_family_and_intervals_one_per_algorithm() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("lab");
    let sweep = lab(&out);
    rlvr_lab::analyse(&sweep, &out, 1).unwrap();
    let all = figures(&LabData::read(&out).unwrap(), 1);
    let captions = |d: &Drawn| -> Vec<String> {
        d.figure.rows[0]
            .panels
            .iter()
            .map(|p| p.caption.clone().unwrap())
            .collect()
    };
    let v16 = fig(&all, "accuracy_v16");
    assert_eq!(captions(v16), ["GRPO", "REINFORCE", "REC", "OPMD", "RED"]);
    // REC's panel has both REC arms; every arm has its own style; the legend lists all six.
    assert_eq!(v16.figure.rows[0].panels[2].lines.len(), 2);
    let mut styles: Vec<usize> = v16.figure.rows[0]
        .panels
        .iter()
        .flat_map(|p| p.lines.iter().map(|l| l.style))
        .collect();
    styles.dedup();
    assert_eq!(styles, [0, 1, 2, 3, 4, 5]);
    assert_eq!(v16.figure.rows[0].legend.len(), 6);
    // Mean over 3 seeds with a band of ±1 standard error, in percent: the seeds are 0, 1 and 2
    // points apart (sample sd 1, SE 1/√3).
    let grpo = &v16.figure.rows[0].panels[0].lines[0];
    let mean40 = grpo.points.last().unwrap();
    assert_eq!(mean40.0, 40.0);
    assert!((mean40.1 - 100.0 * (0.2 + 0.002 * 40.0 * 2.0 / 4.0 + 0.01)).abs() < 1e-9);
    let b = grpo.band.last().unwrap();
    let se = 1.0 / 3f64.sqrt();
    assert!((b.1 - (mean40.1 - se)).abs() < 1e-9, "{b:?}");
    assert!((b.2 - (mean40.1 + se)).abs() < 1e-9, "{b:?}");
    // The title says what the figure holds (no arm of this sweep has a sync offset, so it names
    // none; `offsets_text`'s unit test has the titles with offsets) and what the band is.
    assert_eq!(
        v16.figure.title.as_deref(),
        Some("Held-out accuracy at sync interval 16 (mean of 3 seeds; band: ±1 standard error)")
    );
    // Diagnostics: five rows (training reward, clip, ratio, entropy, drift) of the same family
    // panels, one legend, beside the first row, whose panels alone carry the families' captions.
    let d16 = fig(&all, "diagnostics_v16");
    let descs: Vec<&str> = d16.figure.rows.iter().map(|r| r.y_desc.as_str()).collect();
    assert_eq!(
        descs,
        [
            "training reward (mean)",
            "clip fraction",
            "log10 ratio: max, min",
            "entropy (nats/token)",
            "log10 KL(old||new), nats/token"
        ]
    );
    assert_eq!(d16.figure.rows[0].legend.len(), 6);
    assert_eq!(
        d16.figure.rows[0].panels[0].caption.as_deref(),
        Some("GRPO")
    );
    assert!(d16.figure.rows[1..]
        .iter()
        .all(|r| r.panels.iter().all(|p| p.caption.is_none())));
    // The training reward: the mean over the seeds of reward/mean, 0.3 + 0.01 k + 0.001 · seed · t,
    // at step 20 of the interval-16 GRPO arm (k = 1): 0.3 + 0.01 + 0.001 · 20 · (0 + 1 + 2)/3.
    let reward = &d16.figure.rows[0].panels[0].lines[0];
    let at20 = reward.points.iter().find(|p| p.0 == 20.0).unwrap();
    assert!((at20.1 - 0.33).abs() < 1e-9, "{at20:?}");
    // Seeds at 0.31, 0.33, 0.35: sample sd 0.02, SE 0.02/√3.
    let b = reward.band.iter().find(|p| p.0 == 20.0).unwrap();
    let se = 0.02 / 3f64.sqrt();
    assert!(
        (b.1 - (0.33 - se)).abs() < 1e-9 && (b.2 - (0.33 + se)).abs() < 1e-9,
        "{b:?}"
    );
    // The drift row: log10 of kl_behaviour, one line per arm (REC's panel: two arms); at step 1
    // of the interval-16 GRPO arm (arm k = 1, no smoothing): 1e-3 · 2 · (1 + cos 0.2), every seed.
    let drift = &d16.figure.rows[4];
    assert_eq!(drift.panels[2].lines.len(), 2);
    let first = drift.panels[0].lines[0].points[0];
    assert_eq!(first.0, 1.0);
    assert!(
        (first.1 - (2e-3 * (1.0 + (0.2f64).cos())).log10()).abs() < 1e-3,
        "{first:?}"
    );
    assert!(d16.figure.rows.iter().all(|r| r.panels.len() == 5));
    assert_eq!(
        d16.figure
            .rows
            .iter()
            .filter(|r| !r.legend.is_empty())
            .count(),
        1
    );
    // The ratio row: max and min per arm.
    assert_eq!(d16.figure.rows[2].panels[2].lines.len(), 4);

    // A lab_data.json from before the training reward was kept: four rows, the legend and the
    // captions on the clip fraction's.
    let mut old = LabData::read(&out).unwrap();
    for r in &mut old.runs {
        assert!(r.series.remove("reward/mean").is_some());
    }
    let old16 = figures(&old, 1)
        .into_iter()
        .find(|d| d.stem == "diagnostics_v16")
        .unwrap();
    assert_eq!(old16.figure.rows.len(), 4);
    assert_eq!(old16.figure.rows[0].y_desc, "clip fraction");
    assert_eq!(old16.figure.rows[0].legend.len(), 6);
    assert_eq!(
        old16.figure.rows[0].panels[0].caption.as_deref(),
        Some("GRPO")
    );
    assert!(old16.size.1 < d16.size.1);
    let iv = fig(&all, "intervals");
    assert_eq!(captions(iv), ["GRPO", "REINFORCE"]);
    assert_eq!(iv.figure.rows[0].legend.len(), 2);
    assert!(all.iter().all(|d| d.figure.title.is_some()));
}

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

/// Every figure: the legend column overlaps no data area, no two data areas overlap, all inside
/// the canvas; every text inside the canvas, the legend's names right of every data area, step
/// ticks whole numbers.
#[test]
fn legends_cover_no_data_and_labels_stay_inside_the_canvas() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("lab");
    let sweep = lab(&out);
    rlvr_lab::analyse(&sweep, &out, 3).unwrap();
    type Rect = ((i32, i32), (i32, i32));
    let disjoint = |a: &Rect, b: &Rect| {
        a.1 .0 < b.0 .0 || b.1 .0 < a.0 .0 || a.1 .1 < b.0 .1 || b.1 .1 < a.0 .1
    };
    for d in figures(&LabData::read(&out).unwrap(), 3) {
        let (w, h) = d.size;
        let (svg, layout) = rlvr_chart::svg_string(d.size, &d.figure).unwrap();
        let n: usize = d.figure.rows.iter().map(|r| r.panels.len()).sum();
        assert_eq!(layout.data.len(), n, "{}", d.stem);
        assert_eq!(layout.legends.len(), 1, "{}", d.stem);
        let all: Vec<&Rect> = layout.data.iter().chain(&layout.legends).collect();
        for (i, a) in all.iter().enumerate() {
            assert!(
                a.0 .0 >= 0 && a.0 .1 >= 0 && a.1 .0 < w as i32 && a.1 .1 < h as i32,
                "{}: {a:?} outside {w}x{h}",
                d.stem
            );
            for b in &all[i + 1..] {
                assert!(disjoint(a, b), "{}: {a:?} overlaps {b:?}", d.stem);
            }
        }
        let data_right = layout.data.iter().map(|r| r.1 .0).max().unwrap() as f64;
        let texts = svg_texts(&svg);
        let legend: Vec<&str> = d
            .figure
            .rows
            .iter()
            .flat_map(|r| r.legend.iter().map(|l| l.0.as_str()))
            .collect();
        for t in &texts {
            // DejaVu Sans averages about 0.6 em a character.
            let tw = 0.6 * t.size * t.text.chars().count() as f64;
            let (left, right) = match t.anchor.as_str() {
                "middle" => (t.x - tw / 2.0, t.x + tw / 2.0),
                "end" => (t.x - tw, t.x),
                _ => (t.x, t.x + tw),
            };
            assert!(
                t.x >= 0.0 && t.x <= w as f64 && t.y >= 0.0 && t.y <= h as f64,
                "{}: {}",
                d.stem,
                t.text
            );
            if !t.rotated {
                assert!(
                    left >= 0.0 && right <= w as f64,
                    "{}: `{}` leaves the canvas ({left:.0}..{right:.0} of {w})",
                    d.stem,
                    t.text
                );
            }
            // (A panel caption may say the same word, centred and larger.)
            if legend.contains(&t.text.as_str()) && t.anchor == "start" {
                assert!(
                    t.x > data_right,
                    "{}: legend `{}` over data",
                    d.stem,
                    t.text
                );
            }
            if t.anchor == "middle" && !t.rotated {
                if let Ok(x) = t.text.parse::<f64>() {
                    assert_eq!(x.fract(), 0.0, "{}: step tick {}", d.stem, t.text);
                }
            }
        }
        // One title, once.
        let title = d.figure.title.clone().unwrap();
        assert_eq!(
            texts.iter().filter(|t| t.text == title).count(),
            1,
            "{}",
            d.stem
        );
    }
}
