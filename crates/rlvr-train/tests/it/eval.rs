//! `rlvr eval`: `{"task", "n", "accuracy", "mean@k", "pass@k"}`, per-item `--out`, `--limit`.

use crate::common;

use clap::Parser;
use rlvr_train::cli::{run_eval, EvalArgs};

#[derive(Parser)]
struct W {
    #[command(flatten)]
    a: EvalArgs,
}

fn check_eval(extra: &[&str]) -> (serde_json::Value, Vec<serde_json::Value>) {
    let tmp = tempfile::tempdir().unwrap();
    let model = common::tiny_model(tmp.path(), 7);
    let out = tmp.path().join("items.jsonl");
    let mut argv = vec![
        "x".to_string(),
        "--model".into(),
        model.display().to_string(),
        "--task".into(),
        "arithmetic".into(),
        "--set".into(),
        "data.arithmetic.max_digits=1".into(),
        "--set".into(),
        "data.arithmetic.min_digits=1".into(),
        "--set".into(),
        "data.style=\"plain\"".into(),
        "--set".into(),
        "data.arithmetic.train_size=64".into(),
        "--set".into(),
        "data.arithmetic.test_size=8".into(),
        "--limit".into(),
        "5".into(),
        "--max-new-tokens".into(),
        "3".into(),
        "--out".into(),
        out.display().to_string(),
    ];
    argv.extend(extra.iter().map(|s| s.to_string()));
    let a = W::parse_from(argv).a;
    let mut buf = Vec::new();
    run_eval(&a, &mut buf).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&buf).unwrap();
    let items = std::fs::read_to_string(&out)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    (v, items)
}

#[test]
fn eval_greedy_and_sampled() {
    let (v, items) = check_eval(&[]);
    let keys: Vec<&String> = v.as_object().unwrap().keys().collect();
    assert_eq!(keys, ["accuracy", "mean@k", "n", "pass@k", "task"]);
    assert_eq!(v["task"], "arithmetic");
    assert_eq!(v["n"], 5);
    assert_eq!(items.len(), 5);
    assert_eq!(
        v["accuracy"], v["pass@k"],
        "greedy n = 1: pass@1 = accuracy"
    );
    let (v, items) = check_eval(&["--n", "4"]);
    assert_eq!(items.len(), 20);
    assert!(v["pass@k"].as_f64() >= v["mean@k"].as_f64());
    let correct = items.iter().filter(|i| i["correct"] == true).count() as f64;
    assert!((v["mean@k"].as_f64().unwrap() - correct / 20.0).abs() < 1e-12);
}

/// Without --device/--dtype, `rlvr eval` takes the config's model.device and model.dtype (a GPU
/// config evaluates on the GPU); the flags override them. On a CPU-only build a config that names
/// cuda:0 fails with the device named, and `--device cpu` makes the same call succeed.
#[cfg(not(feature = "cuda"))]
#[test]
fn eval_takes_device_and_dtype_from_the_config() {
    let tmp = tempfile::tempdir().unwrap();
    let model = common::tiny_model(tmp.path(), 7);
    let argv = |extra: &[&str]| -> EvalArgs {
        let mut v: Vec<String> = [
            "x",
            "--model",
            model.to_str().unwrap(),
            "--task",
            "arithmetic",
            "--set",
            "data.arithmetic.max_digits=1",
            "--set",
            "data.arithmetic.min_digits=1",
            "--set",
            "data.style=\"plain\"",
            "--set",
            "data.arithmetic.train_size=64",
            "--set",
            "data.arithmetic.test_size=4",
            "--set",
            "model.device=\"cuda:0\"",
            "--set",
            "model.dtype=\"bf16\"",
            "--max-new-tokens",
            "2",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        v.extend(extra.iter().map(|s| s.to_string()));
        W::parse_from(v).a
    };
    let err = run_eval(&argv(&[]), &mut Vec::new()).unwrap_err();
    assert!(format!("{err:#}").contains("cuda:0"), "{err:#}");
    let mut buf = Vec::new();
    run_eval(&argv(&["--device", "cpu"]), &mut buf).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&buf).unwrap();
    assert_eq!(v["n"], 4);
    let err = run_eval(
        &argv(&["--device", "cpu", "--dtype", "f8"]),
        &mut Vec::new(),
    )
    .unwrap_err();
    assert!(format!("{err:#}").contains("f8"), "{err:#}");
}
