//! Each registered part's declared metrics ([`Part::metrics`]: "the metric keys only this value's
//! runs fill in") are what its runs write. For every choice of which some part declares metrics
//! (the policy loss, rlvr-algo's gating choices, the trainer's), tiny runs (the arithmetic task on
//! a random 2-layer model, two steps) select each of its parts; in a run, every key the selected
//! part declares is filled in (not null) on some line of metrics.jsonl or diagnostics.jsonl, and
//! no key that only the choice's other parts declare is.
//!
//! One run selects a part of every such choice at once: each run takes, choice by choice, the
//! first part not yet covered that still resolves beside the parts already picked (GSPO refuses a
//! token-level correction), so there are about as many runs as the largest choice has parts.

use crate::common;

use std::path::Path;

use rlvr_algo::config::ALGORITHM_CHOICES;
use rlvr_algo::{Part, PolicyLoss, Registered};
use rlvr_train::config::gates::TRAINER_CHOICES;
use rlvr_train::config::RawConfig;
use rlvr_train::run::{train, RunOptions};
use rlvr_train::store::metrics::read_metrics;
use serde_json::Value;

/// A choice: its dotted key and its registered parts.
struct Choice {
    key: String,
    parts: &'static [Part],
}

/// The choices of which some part declares metrics.
fn metric_choices() -> Vec<Choice> {
    let mut all = vec![Choice {
        key: format!("algorithm.{}", PolicyLoss::KEY),
        parts: PolicyLoss::PARTS,
    }];
    all.extend(ALGORITHM_CHOICES.iter().map(|c| Choice {
        key: format!("algorithm.{}", c.key),
        parts: c.parts,
    }));
    all.extend(TRAINER_CHOICES.iter().map(|c| Choice {
        key: c.key.to_string(),
        parts: c.parts,
    }));
    all.retain(|c| c.parts.iter().any(|p| !p.metrics.is_empty()));
    all
}

/// The `--set` that selects `part` of `choice`: the name as TOML (`true`, `"ppo"`), a non-zero
/// coefficient for `≠ 0`, a rank for `≥ 1`.
fn select(choice: &Choice, part: &Part) -> String {
    let value = match part.name {
        "true" | "false" | "0" => part.name.to_string(),
        "≠ 0" => "0.01".into(),
        "≥ 1" => "2".into(),
        name => format!("\"{name}\""),
    };
    format!("{}={value}", choice.key)
}

/// The overrides every run shares: two steps at sync interval 2 (step 1 on-policy, step 2 one
/// step stale), every row trained, and a soft overlong penalty over the whole length so that the
/// rewards of a group differ (a random model answers nothing right) and advantages of both signs
/// reach the loss.
fn base(model: &Path, run: &Path) -> Vec<String> {
    let mut sets = common::arithmetic_sets(model, run);
    sets.extend(
        [
            "train.steps=2",
            "sync.interval=2",
            "train.skip_zero_gradient_rows=false",
            "algorithm.exclude_zero_std=false",
            "algorithm.overlong=\"soft\"",
            "algorithm.overlong_buffer_frac=1.0",
            "output.tensorboard=false",
        ]
        .map(String::from),
    );
    sets
}

/// Whether `sets` load and resolve.
fn resolves(sets: &[String]) -> bool {
    RawConfig::load(None, sets)
        .and_then(|r| r.resolve())
        .is_ok()
}

/// The runs: for each, the part index picked of each choice, until every part is picked once.
fn plan(choices: &[Choice], base: &[String]) -> Vec<Vec<usize>> {
    let mut covered: Vec<Vec<bool>> = choices.iter().map(|c| vec![false; c.parts.len()]).collect();
    let mut runs = Vec::new();
    while covered.iter().flatten().any(|c| !c) {
        let mut sets = base.to_vec();
        let mut pick = Vec::new();
        for (ci, c) in choices.iter().enumerate() {
            let n = c.parts.len();
            let p = (0..n)
                .filter(|&p| !covered[ci][p])
                .chain(0..n)
                .find(|&p| {
                    let mut s = sets.clone();
                    s.push(select(c, &c.parts[p]));
                    resolves(&s)
                })
                .unwrap_or_else(|| panic!("no part of {} resolves beside {sets:?}", c.key));
            sets.push(select(c, &c.parts[p]));
            pick.push(p);
        }
        let new = pick.iter().enumerate().any(|(ci, &p)| !covered[ci][p]);
        assert!(new, "no run selects the parts left: {covered:?}");
        for (ci, &p) in pick.iter().enumerate() {
            covered[ci][p] = true;
        }
        runs.push(pick);
    }
    runs
}

/// Whether `key` is filled in (present and not null) on some line of `lines`.
fn filled(lines: &[serde_json::Map<String, Value>], key: &str) -> bool {
    lines
        .iter()
        .any(|l| l.get(key).is_some_and(|v| !v.is_null()))
}

/// What is wrong with one run's lines for the parts it selected: a declared key not filled in, or
/// a key only the other parts declare filled in.
fn wrong(
    choices: &[Choice],
    pick: &[usize],
    lines: &[serde_json::Map<String, Value>],
) -> Vec<String> {
    let mut out = Vec::new();
    for (c, &p) in choices.iter().zip(pick) {
        let part = &c.parts[p];
        for k in part.metrics {
            if !filled(lines, k) {
                out.push(format!(
                    "{} = {}: declares `{k}`, not filled in",
                    c.key, part.name
                ));
            }
        }
        let mut others: Vec<&str> = Vec::new();
        for k in c.parts.iter().flat_map(|o| o.metrics) {
            if !part.metrics.contains(k) && !others.contains(k) {
                others.push(k);
            }
        }
        for k in others.into_iter().filter(|k| filled(lines, k)) {
            let by: Vec<&str> = c
                .parts
                .iter()
                .filter(|o| o.metrics.contains(&k))
                .map(|o| o.name)
                .collect();
            out.push(format!(
                "{} = {}: `{k}`, declared by {} only, is filled in",
                c.key,
                part.name,
                by.join(", ")
            ));
        }
    }
    out
}

#[test]
fn each_part_fills_in_its_metrics_and_no_other_parts() {
    let tmp = tempfile::tempdir().unwrap();
    let model = common::tiny_model(&tmp.path().join("m"), 3);
    let choices = metric_choices();
    let keys: Vec<&str> = choices.iter().map(|c| c.key.as_str()).collect();
    for want in [
        "algorithm.mismatch_correction",
        "algorithm.kl_coef",
        "algorithm.red_drop",
    ] {
        assert!(keys.contains(&want), "{want} declares no metrics: {keys:?}");
    }
    let runs = plan(&choices, &base(&model, &tmp.path().join("plan")));
    let mut problems = Vec::new();
    for (i, pick) in runs.iter().enumerate() {
        let rd = tmp.path().join(format!("run{i}"));
        let mut sets = base(&model, &rd);
        sets.extend(
            choices
                .iter()
                .zip(pick)
                .map(|(c, &p)| select(c, &c.parts[p])),
        );
        let cfg = RawConfig::load(None, &sets).unwrap().resolve().unwrap();
        train(&cfg, &RunOptions::default()).unwrap();
        let mut lines = read_metrics(&rd.join("metrics.jsonl")).unwrap();
        lines.extend(read_metrics(&rd.join("diagnostics.jsonl")).unwrap());
        assert!(lines.len() >= 4, "{}: {lines:?}", rd.display());
        let chosen: Vec<String> = choices
            .iter()
            .zip(pick)
            .map(|(c, &p)| select(c, &c.parts[p]))
            .collect();
        problems.extend(
            wrong(&choices, pick, &lines)
                .into_iter()
                .map(|w| format!("run {i} ({}): {w}", chosen.join(" "))),
        );
    }
    assert!(
        problems.is_empty(),
        "declared metrics (`Part::metrics`) that runs do not bear out:\n{}",
        problems.join("\n")
    );
}
