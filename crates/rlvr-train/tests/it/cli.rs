//! `rlvr train` through its CLI function: `--set` only (no file), then `--resume RUN_DIR` with an
//! override that extends the run; and a bf16 run.

use crate::common;

use clap::Parser;
use rlvr_train::cli::{run_train, TrainArgs};

#[derive(Parser)]
struct W {
    #[command(flatten)]
    a: TrainArgs,
}

fn args(v: Vec<String>) -> TrainArgs {
    let mut argv = vec!["x".to_string()];
    argv.extend(v);
    W::parse_from(argv).a
}

fn sets(list: &[String]) -> Vec<String> {
    list.iter()
        .flat_map(|s| ["--set".to_string(), s.clone()])
        .collect()
}

#[test]
fn train_then_resume_through_the_cli() {
    let tmp = tempfile::tempdir().unwrap();
    let model = common::tiny_model(tmp.path(), 8);
    let rd = tmp.path().join("run");
    let mut s = common::arithmetic_sets(&model, &rd);
    s.push("train.steps=2".into());
    let mut out = Vec::new();
    run_train(&args(sets(&s)), &mut out).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(v["steps"], 2);
    assert_eq!(v["interrupted"], false);
    let mut argv = vec!["--resume".to_string(), rd.display().to_string()];
    argv.extend(sets(&["train.steps=3".to_string()]));
    let mut out = Vec::new();
    run_train(&args(argv), &mut out).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(v["steps"], 3);
    let lines = std::fs::read_to_string(rd.join("metrics.jsonl")).unwrap();
    assert_eq!(lines.lines().count(), 3);
    let run: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(rd.join("run.json")).unwrap()).unwrap();
    for k in ["git_commit", "seed", "host", "start_time", "version"] {
        assert!(run.get(k).is_some(), "run.json lacks {k}");
    }
    assert_eq!(run["resumed_at"].as_array().unwrap().len(), 1);
}

#[test]
fn bf16_run() {
    let tmp = tempfile::tempdir().unwrap();
    let model = common::tiny_model(tmp.path(), 8);
    let rd = tmp.path().join("run");
    let mut s = common::arithmetic_sets(&model, &rd);
    s.extend([
        "train.steps=2".to_string(),
        "model.dtype=\"bf16\"".into(),
        "train.save_every=1".into(),
    ]);
    run_train(&args(sets(&s)), &mut Vec::new()).unwrap();
    let lines = std::fs::read_to_string(rd.join("metrics.jsonl")).unwrap();
    for l in lines.lines() {
        let v: serde_json::Value = serde_json::from_str(l).unwrap();
        assert_eq!(v["skipped"], false);
    }
    let cfg: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(rd.join("checkpoints/step-2/config.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(cfg["torch_dtype"], "bfloat16");
}
