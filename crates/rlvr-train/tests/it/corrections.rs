//! Runs of `rlvr train` with each off-policy correction on (tiny random model, two steps at sync
//! interval 2, so that step 1 is on-policy and step 2 one step stale): diagnostics.jsonl holds the
//! ratio histograms, what each correction masked or truncated, RED-Drop's dropped share and the
//! staleness counts, and `rlvr plot --heatmap` draws the ratio histogram over the steps.

use crate::common;

use std::path::Path;

use rlvr_train::config::RawConfig;
use rlvr_train::run::{train, RunOptions};
use rlvr_train::store::metrics::read_metrics;
use serde_json::{Map, Value};

type Line = Map<String, Value>;

/// Two steps of the arithmetic task with `extra` overrides; the diagnostics lines.
fn run(tmp: &Path, name: &str, extra: &[&str]) -> Vec<Line> {
    let model = common::tiny_model(&tmp.join("m"), 3);
    let rd = tmp.join(name);
    let mut sets = common::arithmetic_sets(&model, &rd);
    sets.extend(
        [
            "train.steps=2",
            "sync.interval=2",
            // Every row trained, so that the corrections see every row.
            "train.skip_zero_gradient_rows=false",
            "algorithm.exclude_zero_std=false",
            // A random model scores 0 everywhere (A = 0): the entropy bonus moves the weights, so
            // that step 2's rows are off-policy.
            "algorithm.entropy_coef=0.05",
            "output.tensorboard=false",
        ]
        .iter()
        .chain(extra)
        .map(|s| s.to_string()),
    );
    let cfg = RawConfig::load(None, &sets).unwrap().resolve().unwrap();
    train(&cfg, &RunOptions::default()).unwrap();
    read_metrics(&rd.join("diagnostics.jsonl")).unwrap()
}

fn hist(l: &Line, key: &str) -> Option<Vec<f64>> {
    let v = l.get(key)?.as_array()?;
    Some(v.iter().map(|x| x.as_f64().unwrap()).collect())
}

fn frac(l: &Line, key: &str) -> Option<f64> {
    let v = l
        .get(key)
        .unwrap_or_else(|| panic!("{key} missing in {l:?}"));
    let f = v.as_f64()?;
    assert!((0.0..=1.0).contains(&f), "{key} = {f}");
    Some(f)
}

/// The keys every run writes, whatever is on.
fn check_common(d: &[Line]) {
    assert_eq!(d.len(), 2);
    for l in d {
        let h = hist(l, "hist/ratio").expect("hist/ratio");
        assert_eq!(h.len(), rlvr_algo::RATIO_BUCKETS);
        assert!(h.iter().sum::<f64>() > 0.0);
    }
    // Step 1 is on-policy: every token's ratio is 1 within float error (the centre buckets), and
    // the sampler/trainer histogram has its tokens; step 2's rows are one step stale.
    let h1 = hist(&d[0], "hist/ratio").unwrap();
    let near_one: f64 = h1[5..8].iter().sum();
    assert_eq!(near_one, h1.iter().sum::<f64>(), "{h1:?}");
    let m1 = hist(&d[0], "hist/mismatch").expect("hist/mismatch at step 1");
    assert!(m1[5..8].iter().sum::<f64>() == m1.iter().sum::<f64>() && m1[6] > 0.0);
    assert!(d[1]["hist/mismatch"].is_null());
    assert_eq!(d[0]["staleness/counts"], serde_json::json!([16]));
    assert_eq!(d[1]["staleness/counts"], serde_json::json!([0, 16]));
    assert_eq!(d[1]["staleness/unknown"], serde_json::json!(0));
}

#[test]
fn each_correction_writes_its_histograms_and_masked_fractions() {
    let tmp = tempfile::tempdir().unwrap();
    // Nothing on: every correction key is null.
    let d = run(tmp.path(), "plain", &[]);
    check_common(&d);
    for k in [
        "mismatch/masked_frac",
        "mismatch/truncated_frac",
        "opsm/masked_frac",
        "red_drop/dropped_frac",
    ] {
        assert!(d[1][k].is_null(), "{k}");
    }
    // Each mismatch correction: its shares at both steps. The k3 mask at τ = 0 drops every row
    // whose ratio is not exactly 1, which the stale step's rows are not.
    // Bounds tight enough that one step of drift crosses them (IcePop's authors use [0.5, 5]).
    for (mc, extra, masks) in [
        ("icepop", "algorithm.mismatch_low=0.999", true),
        ("geometric-truncate", "algorithm.mismatch_cap=1.0", false),
        ("geometric-mask", "algorithm.mismatch_low=0.999", true),
        (
            "sequence-k3-mask",
            "algorithm.mismatch_k3_threshold=0.0",
            true,
        ),
    ] {
        let set = format!("algorithm.mismatch_correction=\"{mc}\"");
        let cap = if masks && mc != "sequence-k3-mask" {
            "algorithm.mismatch_cap=1.001"
        } else {
            "train.epochs=1"
        };
        let d = run(tmp.path(), mc, &[&set, extra, cap]);
        check_common(&d);
        for l in &d {
            for k in ["mismatch/masked_frac", "mismatch/masked_rows_frac"] {
                frac(l, k).unwrap_or_else(|| panic!("{mc}: {k} null"));
            }
            frac(l, "mismatch/truncated_frac").unwrap();
        }
        if masks {
            assert!(frac(&d[1], "mismatch/masked_frac").unwrap() > 0.0, "{mc}");
        } else {
            assert!(
                frac(&d[1], "mismatch/truncated_rows_frac").unwrap() > 0.0,
                "{mc}"
            );
        }
        if mc == "sequence-k3-mask" {
            assert_eq!(frac(&d[1], "mismatch/masked_rows_frac"), Some(1.0));
        }
    }
    // OPSM with δ = 0 and RED-Drop as first written: their shares.
    let d = run(
        tmp.path(),
        "opsm",
        &[
            "algorithm.preset=\"red_drop_bernoulli\"",
            "algorithm.opsm_delta=0.0",
        ],
    );
    check_common(&d);
    for l in &d {
        frac(l, "opsm/masked_frac").unwrap();
        frac(l, "opsm/masked_rows_frac").unwrap();
        let f = frac(l, "red_drop/dropped_frac").unwrap();
        assert_eq!(
            f * 16.0,
            l["red_drop/dropped"].as_f64().unwrap(),
            "dropped share of the 16 scored rows"
        );
    }

    // The heat map of the ratio histogram over the steps, one panel per run.
    let out = tmp.path().join("heat.png");
    let args = rlvr_train::plot::PlotArgs {
        runs: vec![tmp.path().join("plain"), tmp.path().join("icepop")],
        metrics: vec!["diagnostics/hist/ratio".into()],
        out: out.clone(),
        width: 800,
        panel_height: 300,
        labels: vec![],
        smooth: None,
        title: None,
        facet: false,
        heatmap: true,
        mean_over_seeds: false,
        ignore_keys: vec![],
    };
    let cells = rlvr_train::plot::plot(&args).unwrap();
    assert_eq!(cells, 2 * 2 * rlvr_algo::RATIO_BUCKETS);
    assert!(std::fs::metadata(&out).unwrap().len() > 1000);
    // A scalar key is not a histogram.
    let bad = rlvr_train::plot::PlotArgs {
        metrics: vec!["diagnostics/updates".into()],
        ..args
    };
    let e = rlvr_train::plot::plot(&bad).unwrap_err().to_string();
    assert!(e.contains("hist"), "{e}");
}
