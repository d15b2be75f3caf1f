//! End-to-end runs of `rlvr train` on a tiny random model (CPU, seconds).

mod common;

use std::path::Path;

use rlvr_train::config::RawConfig;
use rlvr_train::metrics::{read_metrics, METRIC_KEYS};
use rlvr_train::run::{train, RunOptions};

fn run(sets: &[String]) -> rlvr_train::run::RunSummary {
    let cfg = RawConfig::load(None, sets).unwrap().resolve().unwrap();
    train(&cfg, &RunOptions::default()).unwrap()
}

fn metrics(run_dir: &Path) -> Vec<serde_json::Map<String, serde_json::Value>> {
    read_metrics(&run_dir.join("metrics.jsonl")).unwrap()
}

#[test]
fn on_policy_run_writes_the_run_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let model = common::tiny_model(tmp.path(), 0);
    let rd = tmp.path().join("run");
    let mut sets = common::arithmetic_sets(&model, &rd);
    sets.extend([
        "train.steps=3".to_string(),
        "train.eval_every=2".into(),
        "train.save_every=1".into(),
        "train.keep_last=1".into(),
    ]);
    let s = run(&sets);
    assert_eq!(s.steps, 3);
    for f in [
        "config.toml",
        "run.json",
        "metrics.jsonl",
        "rollouts.jsonl",
        "eval.jsonl",
    ] {
        assert!(rd.join(f).exists(), "{f} missing");
    }
    let m = metrics(&rd);
    // Step 0 (eval only), then steps 1..3.
    let steps: Vec<u64> = m.iter().map(|l| l["step"].as_u64().unwrap()).collect();
    assert_eq!(steps, vec![0, 1, 2, 3]);
    for l in &m {
        for k in METRIC_KEYS {
            assert!(l.contains_key(k), "key {k} missing in {l:?}");
        }
        let extra: Vec<&String> = l
            .keys()
            .filter(|k| !METRIC_KEYS.contains(&k.as_str()) && !k.starts_with("eval/"))
            .collect();
        assert!(extra.is_empty(), "unexpected keys {extra:?}");
    }
    assert!(m[0]["eval/accuracy"].is_number());
    assert!(m[2]["eval/accuracy"].is_number());
    assert!(m[1].get("eval/accuracy").is_none());
    // On-policy: the ratio is 1 (sampler and trainer log-probs agree) on the first update.
    let r = m[1]["ratio/mean"].as_f64().unwrap();
    assert!((r - 1.0).abs() < 1e-4, "ratio/mean at staleness 0 = {r}");
    assert_eq!(m[1]["staleness/max"].as_f64(), Some(0.0));
    assert_eq!(m[1]["skipped"], serde_json::Value::Bool(false));
    // keep_last = 1 keeps the newest and the best.
    let latest = std::fs::read_to_string(rd.join("checkpoints/latest")).unwrap();
    assert_eq!(latest.trim(), "step-3");
    assert!(rd.join("checkpoints/step-3/model.safetensors").exists());
    assert!(rd
        .join("checkpoints/step-3/trainer_state/optimizer.safetensors")
        .exists());
    assert!(!rd.join("checkpoints/step-1").exists());
    let diag = std::fs::read_to_string(rd.join("diagnostics.jsonl")).unwrap();
    let d0: serde_json::Value = serde_json::from_str(diag.lines().next().unwrap()).unwrap();
    let diff = d0["logprob_diff/staleness0"].as_f64().unwrap();
    assert!(diff < 1e-4, "|l_sampler - l_trainer| = {diff}");
}
