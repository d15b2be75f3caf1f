//! End-to-end learning signal: on a task whose answer is always 5, RL raises the reward of a tiny
//! random model within 80 steps (about a second), on-policy and off-policy (v = 4, o = 1). Guards the
//! sign and plumbing of the whole loop (sampling, scoring, advantages, loss, optimizer, sync).

use crate::common;

use rlvr_train::config::RawConfig;
use rlvr_train::run::{train, RunOptions};
use rlvr_train::store::metrics::read_metrics;

fn check_learns(extra: &[&str]) -> (f64, f64) {
    let tmp = tempfile::tempdir().unwrap();
    let model = common::tiny_model(tmp.path(), 3);
    let rd = tmp.path().join("run");
    let data = tmp.path().join("five.jsonl");
    let rows: Vec<String> = (0..20)
        .map(|i| {
            serde_json::json!({"question": format!("{}+{}=", i % 10, (i + 3) % 10), "answer": "5"})
                .to_string()
        })
        .collect();
    std::fs::write(&data, rows.join("\n")).unwrap();
    let mut sets = common::arithmetic_sets(&model, &rd);
    sets.extend([
        format!("data.train={}", data.display()),
        "data.task=\"jsonl\"".into(),
        "data.verifier={ kind = \"arithmetic\" }".into(),
        "train.steps=80".into(),
        "data.prompts_per_step=8".into(),
        "rollout.max_new_tokens=2".into(),
        "train.lr=3e-3".into(),
        "train.micro_batch_size=64".into(),
        "train.weight_decay=0".into(),
    ]);
    sets.extend(extra.iter().map(|s| s.to_string()));
    let cfg = RawConfig::load(None, &sets).unwrap().resolve().unwrap();
    train(&cfg, &RunOptions::default()).unwrap();
    let m = read_metrics(&rd.join("metrics.jsonl")).unwrap();
    let mean = |l: &[serde_json::Map<String, serde_json::Value>]| {
        l.iter()
            .map(|x| x["reward/mean"].as_f64().unwrap())
            .sum::<f64>()
            / l.len() as f64
    };
    (mean(&m[..10]), mean(&m[70..]))
}

#[test]
fn rl_raises_the_reward_on_policy() {
    let (first, last) = check_learns(&[]);
    assert!(
        last > 0.3 && last > 2.0 * first,
        "reward {first:.3} -> {last:.3}"
    );
}

#[test]
fn rl_raises_the_reward_off_policy() {
    let (first, last) = check_learns(&["sync.interval=4", "sync.offset=1"]);
    assert!(
        last > 0.3 && last > 2.0 * first,
        "reward {first:.3} -> {last:.3}"
    );
}
