//! End-to-end runs of `rlvr train` on a tiny random model (CPU, seconds).

use crate::common;

use std::path::Path;

use rlvr_train::config::RawConfig;
use rlvr_train::run::{train, RunOptions};
use rlvr_train::store::metrics::{read_metrics, METRIC_KEYS};

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
        // Train every row so that the sampler-vs-trainer check below sees the first step's rows
        // (most groups of a fresh model have zero variance and would be skipped).
        "train.skip_zero_gradient_rows=false".into(),
        // Every rollout logged, for the clipped share below.
        "train.log_rollouts=1000".into(),
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
        // Beside the standard keys (in the reader's sorted order): the one reward component's mean
        // and share, and the lengths' and advantages' extra statistics (steps 1..3).
        let want: Vec<&str> = if l["step"] == 0 {
            vec![]
        } else {
            vec![
                "advantage/max",
                "advantage/mean",
                "advantage/min",
                "clip_frac/dual",
                "completion_len/clipped_frac",
                "completion_len/max",
                "pg_loss",
                "reg_loss",
                "reward/arithmetic/mean",
                "reward/arithmetic/share",
            ]
        };
        assert_eq!(extra, want, "unexpected keys");
        if l["step"] != 0 {
            assert_eq!(l["reward/arithmetic/mean"], l["reward/mean"]);
            // GRPO's advantages sum to zero in every group (zero-variance groups: all zero).
            let f = |k: &str| l[k].as_f64().unwrap();
            assert!(f("advantage/mean").abs() < 1e-9, "{l:?}");
            assert!(
                f("advantage/min") <= 0.0 && f("advantage/max") >= 0.0,
                "{l:?}"
            );
            assert!(f("completion_len/max") >= f("completion_len/mean"), "{l:?}");
            // Plain GRPO adds nothing to its surrogate, and has no dual clip.
            assert_eq!(f("reg_loss"), 0.0, "{l:?}");
            assert_eq!(f("pg_loss"), f("loss"), "{l:?}");
            assert!(l["clip_frac/dual"].is_null(), "{l:?}");
        }
    }
    // The clipped share is the share of the step's rollouts cut at max_new_tokens.
    let rollouts: Vec<serde_json::Value> = std::fs::read_to_string(rd.join("rollouts.jsonl"))
        .unwrap()
        .lines()
        .map(|x| serde_json::from_str(x).unwrap())
        .collect();
    for l in &m[1..] {
        let step = l["step"].as_u64().unwrap();
        let rows: Vec<&serde_json::Value> = rollouts
            .iter()
            .filter(|r| r["step"].as_u64() == Some(step))
            .collect();
        if rows.is_empty() {
            continue;
        }
        let cut = rows
            .iter()
            .filter(|r| r["finish_reason"] == "length")
            .count();
        let want = cut as f64 / rows.len() as f64;
        assert_eq!(
            l["completion_len/clipped_frac"].as_f64(),
            Some(want),
            "step {step}"
        );
    }
    assert!(m[0]["eval/accuracy"].is_number());
    assert!(m[2]["eval/accuracy"].is_number());
    assert!(m[1].get("eval/accuracy").is_none());
    // On-policy: the ratio is 1 (sampler and trainer log-probs agree) on every first update.
    for l in &m[1..] {
        if let Some(r) = l["ratio/mean"].as_f64() {
            assert!((r - 1.0).abs() < 1e-4, "ratio/mean at staleness 0 = {r}");
        }
    }
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
    // `best` names a kept checkpoint (or the initial weights, step 0, which have none).
    if let Ok(b) = std::fs::read_to_string(rd.join("checkpoints/best")) {
        assert!(
            rd.join("checkpoints").join(b.trim()).is_dir(),
            "best {b} was rotated away"
        );
    }
    let best_step = std::fs::read_to_string(rd.join("eval.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .fold((f64::MIN, 0), |acc, v| {
            let a = v["accuracy"].as_f64().unwrap();
            if a > acc.0 {
                (a, v["step"].as_u64().unwrap())
            } else {
                acc
            }
        })
        .1;
    if best_step > 0 {
        assert!(rd.join(format!("checkpoints/step-{best_step}")).is_dir());
    }
    let diag = std::fs::read_to_string(rd.join("diagnostics.jsonl")).unwrap();
    let d0: serde_json::Value = serde_json::from_str(diag.lines().next().unwrap()).unwrap();
    let diff = d0["logprob_diff/staleness0"].as_f64().unwrap();
    assert!(diff < 1e-4, "|l_sampler - l_trainer| = {diff}");
    assert_eq!(d0["rows_skipped_zero_gradient"], 0);
}

/// Staleness per step for interval v and offset o: (t−1) − v·⌊(t−1−o)/v⌋ (0 while t−1 < o), with the
/// explorer inline (o = 0) or on its own thread (o ≥ 1).
#[test]
fn staleness_follows_interval_and_offset() {
    let tmp = tempfile::tempdir().unwrap();
    let model = common::tiny_model(tmp.path(), 2);
    for (v, o, want) in [
        (1u64, 0u64, vec![0.0, 0.0, 0.0, 0.0, 0.0, 0.0]),
        (4, 0, vec![0.0, 1.0, 2.0, 3.0, 0.0, 1.0]),
        (1, 1, vec![0.0, 1.0, 1.0, 1.0, 1.0, 1.0]),
        (2, 1, vec![0.0, 1.0, 2.0, 1.0, 2.0, 1.0]),
        (1, 2, vec![0.0, 1.0, 2.0, 2.0, 2.0, 2.0]),
    ] {
        let rd = tmp.path().join(format!("run-{v}-{o}"));
        let mut sets = common::arithmetic_sets(&model, &rd);
        sets.extend([
            "train.steps=6".to_string(),
            format!("sync.interval={v}"),
            format!("sync.offset={o}"),
        ]);
        run(&sets);
        let m = metrics(&rd);
        let got: Vec<f64> = m
            .iter()
            .map(|l| l["staleness/max"].as_f64().unwrap())
            .collect();
        assert_eq!(got, want, "v={v} o={o}");
        let mean: Vec<f64> = m
            .iter()
            .map(|l| l["staleness/mean"].as_f64().unwrap())
            .collect();
        assert_eq!(
            mean, want,
            "v={v} o={o}: every row of a step has the same staleness"
        );
        for (t, w) in (1..=6u64).zip(&want) {
            assert_eq!(
                (t - 1 - rlvr_train::feed::behaviour_version(t, v, o)) as f64,
                *w
            );
        }
        // train.log times each sync: one line per step that v divides, none for the others.
        let log = std::fs::read_to_string(rd.join("train.log")).unwrap();
        let synced: Vec<u64> = log
            .lines()
            .filter_map(|l| l.strip_prefix("sync: version "))
            .map(|l| l.split_whitespace().next().unwrap().parse().unwrap())
            .collect();
        let every_v: Vec<u64> = (1..=6u64).filter(|t| t % v == 0).collect();
        assert_eq!(synced, every_v, "v={v} o={o}:\n{log}");
    }
}

/// The threaded explorer (o ≥ 1) gives the same batches as the inline one would with the same
/// versions: two runs with o = 1 agree on every non-time metric (determinism under threads).
#[test]
fn threaded_explorer_is_deterministic() {
    let tmp = tempfile::tempdir().unwrap();
    let model = common::tiny_model(tmp.path(), 3);
    let mut lines = Vec::new();
    for k in 0..2 {
        let rd = tmp.path().join(format!("run-{k}"));
        let mut sets = common::arithmetic_sets(&model, &rd);
        sets.extend(["train.steps=5".to_string(), "sync.offset=1".into()]);
        run(&sets);
        lines.push(metrics(&rd));
    }
    for (a, b) in lines[0].iter().zip(&lines[1]) {
        for (k, v) in a {
            if !rlvr_train::store::metrics::TIME_KEYS.contains(&k.as_str()) {
                assert_eq!(v, &b[k], "{k}");
            }
        }
    }
}

#[test]
fn max_staleness_drops_old_experiences_and_warns() {
    let tmp = tempfile::tempdir().unwrap();
    let model = common::tiny_model(tmp.path(), 2);
    let rd = tmp.path().join("run");
    let mut sets = common::arithmetic_sets(&model, &rd);
    sets.extend([
        "train.steps=4".to_string(),
        "sync.interval=2".into(),
        "sync.max_staleness=0".into(),
    ]);
    let cfg = RawConfig::load(None, &sets).unwrap().resolve().unwrap();
    assert!(
        cfg.warnings[0].contains("max_staleness = 0 is below"),
        "{:?}",
        cfg.warnings
    );
    train(&cfg, &RunOptions::default()).unwrap();
    let m = metrics(&rd);
    // Steps 2 and 4 hold only staleness-1 data: all dropped, nothing left to measure.
    assert!(m[1]["staleness/max"].is_null() && m[1]["reward/mean"].is_null());
    assert_eq!(m[2]["staleness/max"].as_f64(), Some(0.0));
    let diag = std::fs::read_to_string(rd.join("diagnostics.jsonl")).unwrap();
    let d: Vec<serde_json::Value> = diag
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(d[1]["stale_dropped"].as_u64(), Some(16));
    assert_eq!(d[0]["stale_dropped"].as_u64(), Some(0));
}

/// Ctrl-C (the stop flag) saves a checkpoint after the current step and returns cleanly; a resume
/// continues to the end.
#[test]
fn stop_flag_saves_and_resume_finishes() {
    let tmp = tempfile::tempdir().unwrap();
    let model = common::tiny_model(tmp.path(), 2);
    let rd = tmp.path().join("run");
    let mut sets = common::arithmetic_sets(&model, &rd);
    sets.push("train.steps=3".into());
    let cfg = RawConfig::load(None, &sets).unwrap().resolve().unwrap();
    let opts = RunOptions::default();
    opts.stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let s = train(&cfg, &opts).unwrap();
    assert!(s.interrupted);
    assert_eq!(s.steps, 1);
    assert!(rd
        .join("checkpoints/step-1/trainer_state/state.json")
        .exists());
    // A fresh `train` into the same directory refuses to overwrite it.
    let err = train(&cfg, &RunOptions::default()).unwrap_err().to_string();
    assert!(err.contains("--resume"), "{err}");
    let cfg = rlvr_train::config::ResolvedConfig::from_run_dir(&rd, &[]).unwrap();
    let s = train(
        &cfg,
        &RunOptions {
            resume: true,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(s.steps, 3);
    assert_eq!(metrics(&rd).len(), 3);
}

/// Non-finite steps are skipped (`skipped: true`, no update) and M in a row abort with a clear
/// message: the step whose weights the run still has, its checkpoint, and the save after it (it
/// used to name "the last good checkpoint" and then save a later one).
#[test]
fn non_finite_steps_are_skipped_then_abort() {
    let tmp = tempfile::tempdir().unwrap();
    let model = common::tiny_model(tmp.path(), 2);
    let rd = tmp.path().join("run");
    let mut sets = common::arithmetic_sets(&model, &rd);
    sets.extend([
        "train.steps=8".to_string(),
        "train.lr=1e30".into(),
        "train.grad_clip=0".into(),
        "train.max_skipped_in_row=2".into(),
        "train.save_every=1".into(),
    ]);
    let cfg = RawConfig::load(None, &sets).unwrap().resolve().unwrap();
    let err = format!("{:#}", train(&cfg, &RunOptions::default()).unwrap_err());
    assert!(err.contains("2 steps in a row"), "{err}");
    let m = metrics(&rd);
    let skipped: Vec<bool> = m.iter().map(|l| l["skipped"].as_bool().unwrap()).collect();
    assert_eq!(&skipped[skipped.len() - 2..], &[true, true]);
    // The message names the step whose weights the run still has (the last one not skipped) and
    // its checkpoint, then where the save after the error put the last skipped step's state.
    let (last, good) = (m.len(), m.len() - 2);
    assert!(
        err.contains(&format!(
            "the weights are still step {good}'s (the last checkpoint written: {})",
            rd.join(format!("checkpoints/step-{good}")).display()
        )),
        "{err}"
    );
    let saved = rd.join(format!("checkpoints/step-{last}"));
    assert!(
        err.contains(&format!("its state was saved to {}", saved.display())),
        "{err}"
    );
    assert!(saved.join("trainer_state/state.json").exists());
}

/// With an explorer thread (`sync.offset = 1`) a diverging run's huge weights reach the sampler
/// before two non-finite steps can: its error says the training diverged and what to do, not
/// only the sampler's advice about a checkpoint. The weights stay finite for three steps (weight
/// decay's factor 1 − lr·λ = 1 − 10¹⁰ scales them by 10¹⁰ a step, past f32's range at step 4,
/// where the trainer's weight check would stop the run), while the attention scores of the
/// weights after step 1 already overflow.
#[test]
fn a_diverged_policy_that_the_explorer_samples_says_the_training_diverged() {
    let tmp = tempfile::tempdir().unwrap();
    let model = common::tiny_model(tmp.path(), 2);
    let rd = tmp.path().join("run");
    let mut sets = common::arithmetic_sets(&model, &rd);
    sets.extend([
        "train.steps=8".to_string(),
        "train.lr=1e30".into(),
        "train.weight_decay=1e-20".into(),
        "train.grad_clip=0".into(),
        "train.max_skipped_in_row=2".into(),
        "sync.offset=1".into(),
    ]);
    let cfg = RawConfig::load(None, &sets).unwrap().resolve().unwrap();
    let err = format!("{:#}", train(&cfg, &RunOptions::default()).unwrap_err());
    assert!(err.contains("non-finite logits"), "{err}");
    let v = err
        .split("the explorer samples with version ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse::<u64>().ok())
        .unwrap_or_else(|| panic!("{err}"));
    assert!(v >= 1, "{err}");
    assert!(
        err.contains(&format!(
            "(the trainer's weights after step {v}), whose logits are not finite: the training \
             diverged. Lower train.lr or set train.grad_clip"
        )),
        "{err}"
    );
}

/// A finite loss and gradient whose update makes a weight NaN or infinite (a learning rate past
/// f32's range, given on `--resume` after two sane steps) ends the run at that step with one
/// short error: the training diverged, the step is not saved, the last checkpoint holds step 2's
/// weights, and what to change. Before, the step completed with NaN weights, the next step's
/// sampling failed on them, and the save after that error failed too ("saving its state failed
/// too: weight … holds a non-finite value …").
#[test]
fn an_update_that_makes_a_weight_non_finite_stops_the_run_with_a_short_error() {
    let tmp = tempfile::tempdir().unwrap();
    let model = common::tiny_model(tmp.path(), 2);
    let rd = tmp.path().join("run");
    let mut sets = common::arithmetic_sets(&model, &rd);
    sets.extend([
        "train.steps=2".to_string(),
        "train.save_every=1".into(),
        "train.eval_every=0".into(),
    ]);
    let cfg = RawConfig::load(None, &sets).unwrap().resolve().unwrap();
    train(&cfg, &RunOptions::default()).unwrap();
    let over = ["train.steps=4".to_string(), "train.lr=1e45".into()];
    let cfg = rlvr_train::config::ResolvedConfig::from_run_dir(&rd, &over).unwrap();
    let resume = RunOptions {
        resume: true,
        ..Default::default()
    };
    let err = format!("{:#}", train(&cfg, &resume).unwrap_err());
    let want = "the training diverged at step 3: its update made weight ";
    assert!(err.starts_with(want), "{err}");
    let tail = format!(
        " NaN or infinite, so step 3 is not saved; the last checkpoint, {}, holds step 2's \
         weights (`rlvr train --resume` continues from it). Lower train.lr or lower \
         train.grad_clip (now 1)",
        rd.join("checkpoints/step-2").display()
    );
    assert!(err.ends_with(&tail), "{err}");
    assert!(err.len() < want.len() + tail.len() + 60, "{err}");
    assert!(!rd.join("checkpoints/step-3").exists());
    let steps: Vec<u64> = metrics(&rd)
        .iter()
        .map(|l| l["step"].as_u64().unwrap())
        .collect();
    assert_eq!(steps, [1, 2]);
}

/// One non-finite step with `train.max_skipped_in_row = 1` is said in the singular ("1 step in a
/// row", not "1 steps").
#[test]
fn one_non_finite_step_is_said_in_the_singular() {
    let tmp = tempfile::tempdir().unwrap();
    let model = common::tiny_model(tmp.path(), 2);
    let rd = tmp.path().join("run");
    let mut sets = common::arithmetic_sets(&model, &rd);
    sets.extend([
        "train.steps=2".to_string(),
        "train.lr=1e30".into(),
        "train.grad_clip=0".into(),
        "train.max_skipped_in_row=1".into(),
    ]);
    let cfg = RawConfig::load(None, &sets).unwrap().resolve().unwrap();
    let err = format!("{:#}", train(&cfg, &RunOptions::default()).unwrap_err());
    assert!(err.contains("1 step in a row"), "{err}");
    assert!(!err.contains("1 steps"), "{err}");
}

fn diagnostics(run_dir: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(run_dir.join("diagnostics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// DAPO dynamic sampling drops zero-variance groups and samples more (up to the cap): no trained
/// group has zero variance.
#[test]
fn dynamic_sampling_drops_zero_variance_groups() {
    let tmp = tempfile::tempdir().unwrap();
    let model = common::tiny_model(tmp.path(), 2);
    let rd = tmp.path().join("run");
    let mut sets = common::arithmetic_sets(&model, &rd);
    sets.extend([
        "train.steps=3".to_string(),
        "algorithm.preset=\"dapo\"".into(),
        "train.dynamic_sampling_max_rounds=2".into(),
    ]);
    run(&sets);
    let m = metrics(&rd);
    for l in &m {
        assert!(
            l["zero_std_frac"].is_null() || l["zero_std_frac"].as_f64() == Some(0.0),
            "{l:?}"
        );
    }
    let d = diagnostics(&rd);
    assert!(d
        .iter()
        .any(|x| x["dynamic_sampling/dropped_groups"].as_u64().unwrap() > 0));
    // At most B groups of K rows are trained, and a short batch says so: rows = (B − short)·K.
    for x in &d {
        let short = x["dynamic_sampling/short_groups"].as_u64().unwrap();
        assert!(short <= 2, "{x:?}");
        assert_eq!(x["rows"].as_u64().unwrap(), (2 - short) * 8, "{x:?}");
    }
}

/// `train.dynamic_sampling_short_batch = "error"` stops a run whose refill rounds end short of B
/// groups with reward variance (verl's behaviour), naming the key; `train` (the default) trains the
/// short batch and counts the missing groups.
#[test]
fn dynamic_sampling_short_batch_is_explicit() {
    let tmp = tempfile::tempdir().unwrap();
    let model = common::tiny_model(tmp.path(), 2);
    let base = |rd: &Path, short: &str| {
        let mut sets = common::arithmetic_sets(&model, rd);
        sets.extend([
            "train.steps=2".to_string(),
            "algorithm.preset=\"dapo\"".into(),
            "algorithm.overlong=\"none\"".into(),
            // Near-greedy sampling: the K completions of a prompt are equal, so are their rewards.
            "rollout.temperature=0.001".into(),
            "train.dynamic_sampling_max_rounds=1".into(),
            format!("train.dynamic_sampling_short_batch=\"{short}\""),
        ]);
        sets
    };
    let rd = tmp.path().join("err");
    let cfg = RawConfig::load(None, &base(&rd, "error"))
        .unwrap()
        .resolve()
        .unwrap();
    let err = format!("{:#}", train(&cfg, &RunOptions::default()).unwrap_err());
    assert!(
        err.contains("train.dynamic_sampling_short_batch") && err.contains("only 0 of 2 groups"),
        "{err}"
    );
    let rd = tmp.path().join("train");
    run(&base(&rd, "train"));
    let d = diagnostics(&rd);
    assert_eq!(d.len(), 2);
    for x in &d {
        assert_eq!(
            x["dynamic_sampling/short_groups"].as_u64(),
            Some(2),
            "{x:?}"
        );
        assert_eq!(
            x["dynamic_sampling/dropped_groups"].as_u64(),
            Some(4),
            "{x:?}"
        );
        assert_eq!(x["rows"].as_u64(), Some(0), "{x:?}");
    }
    // Refused values name the key.
    let bad = RawConfig::load(
        None,
        &["train.dynamic_sampling_short_batch=\"skip\"".to_string()],
    );
    let msg = match bad.and_then(|r| r.resolve()) {
        Ok(_) => panic!("\"skip\" accepted"),
        Err(e) => format!("{e:#}"),
    };
    assert!(msg.contains("dynamic_sampling_short_batch"), "{msg}");
}

/// With a KL term the frozen reference is loaded: KL is 0 while the policy equals it (step 1) and
/// positive once it has moved.
#[test]
fn kl_to_reference_is_zero_then_positive() {
    let tmp = tempfile::tempdir().unwrap();
    let model = common::tiny_model(tmp.path(), 2);
    let rd = tmp.path().join("run");
    let mut sets = common::arithmetic_sets(&model, &rd);
    sets.extend([
        "train.steps=4".to_string(),
        "algorithm.kl_coef=0.1".into(),
        "algorithm.exclude_zero_std=false".into(),
    ]);
    run(&sets);
    let m = metrics(&rd);
    let kl: Vec<f64> = m.iter().map(|l| l["kl_ref"].as_f64().unwrap()).collect();
    assert!(kl[0].abs() < 1e-6, "{kl:?}");
    assert!(kl[3] > 1e-6, "{kl:?}");
}

/// Recomputing behaviour log-probs with the training forward keeps staleness-0 ratios at 1.
#[test]
fn recompute_behaviour_logprobs() {
    let tmp = tempfile::tempdir().unwrap();
    let model = common::tiny_model(tmp.path(), 2);
    let rd = tmp.path().join("run");
    let mut sets = common::arithmetic_sets(&model, &rd);
    sets.extend([
        "train.steps=2".to_string(),
        "train.recompute_behaviour=true".into(),
        // Every row, so that the diagnostic covers zero-variance groups too.
        "train.skip_zero_gradient_rows=false".into(),
    ]);
    run(&sets);
    for d in diagnostics(&rd) {
        let x = d["logprob_diff/staleness0"].as_f64().unwrap();
        assert!(
            x < 1e-6,
            "recomputed l_old differs from the trainer's l by {x}"
        );
    }
}

/// With o ≥ 1 a resumed run continues to the end (not bit-identical by design).
#[test]
fn offset_run_resumes() {
    let tmp = tempfile::tempdir().unwrap();
    let model = common::tiny_model(tmp.path(), 2);
    let rd = tmp.path().join("run");
    let mut sets = common::arithmetic_sets(&model, &rd);
    sets.extend(["train.steps=2".to_string(), "sync.offset=1".into()]);
    run(&sets);
    let cfg =
        rlvr_train::config::ResolvedConfig::from_run_dir(&rd, &["train.steps=4".into()]).unwrap();
    let s = train(
        &cfg,
        &RunOptions {
            resume: true,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(s.steps, 4);
    let m = metrics(&rd);
    assert_eq!(m.len(), 4);
    assert!(m
        .iter()
        .all(|l| l["staleness/max"].as_f64().unwrap() <= 1.0));
}

/// `--resume` on a run that died before its first checkpoint starts over cleanly (no duplicate lines).
#[test]
fn resume_without_checkpoint_starts_over() {
    let tmp = tempfile::tempdir().unwrap();
    let model = common::tiny_model(tmp.path(), 2);
    let rd = tmp.path().join("run");
    let mut sets = common::arithmetic_sets(&model, &rd);
    sets.extend(["train.steps=2".to_string(), "train.eval_every=1".into()]);
    let cfg = RawConfig::load(None, &sets).unwrap().resolve().unwrap();
    train(&cfg, &RunOptions::default()).unwrap();
    std::fs::remove_dir_all(rd.join("checkpoints")).unwrap();
    let cfg = rlvr_train::config::ResolvedConfig::from_run_dir(&rd, &[]).unwrap();
    train(
        &cfg,
        &RunOptions {
            resume: true,
            ..Default::default()
        },
    )
    .unwrap();
    let steps: Vec<u64> = metrics(&rd)
        .iter()
        .map(|l| l["step"].as_u64().unwrap())
        .collect();
    assert_eq!(steps, vec![0, 1, 2]);
}

/// With a KL penalty, an entropy bonus and a dual clip on, metrics.jsonl splits `loss` into
/// `pg_loss` and `reg_loss` (their sum is `loss`, and the regulariser is not 0), and logs the dual
/// clip's share (a share no larger than `clip_frac/high`, which counts its tokens too), after
/// DESIGN.md section 10's keys.
#[test]
fn the_loss_is_split_into_pg_loss_and_reg_loss() {
    let tmp = tempfile::tempdir().unwrap();
    let model = common::tiny_model(tmp.path(), 0);
    let rd = tmp.path().join("run");
    let mut sets = common::arithmetic_sets(&model, &rd);
    sets.extend([
        "train.steps=2".to_string(),
        "train.skip_zero_gradient_rows=false".into(),
        "train.mini_batches=2".into(),
        "algorithm.kl_coef=0.1".into(),
        "algorithm.entropy_coef=0.01".into(),
        "algorithm.dual_clip=3.0".into(),
        // The fresh model's groups all score 0: A = −0.5 on every row (the baseline shifted, no
        // std division, zero-variance groups kept), so that the PG term is not 0 either.
        "algorithm.std_norm=\"none\"".into(),
        "algorithm.baseline_shift=0.5".into(),
        "algorithm.exclude_zero_std=false".into(),
    ]);
    run(&sets);
    let m = metrics(&rd);
    let mut trained = 0;
    for l in m.iter().filter(|l| l["loss"].is_number()) {
        let f = |k: &str| l[k].as_f64().unwrap();
        let (loss, pg, reg) = (f("loss"), f("pg_loss"), f("reg_loss"));
        assert!(
            (pg + reg - loss).abs() <= 1e-5 * (1.0 + loss.abs()),
            "{pg} + {reg} vs {loss}"
        );
        assert!(reg != 0.0 && pg != 0.0, "{l:?}");
        let dual = f("clip_frac/dual");
        assert!((0.0..=f("clip_frac/high")).contains(&dual), "{l:?}");
        trained += 1;
    }
    assert_eq!(trained, 2);
    // In the file, after the last of DESIGN.md section 10's keys, in this order.
    let text = std::fs::read_to_string(rd.join("metrics.jsonl")).unwrap();
    for line in text.lines().filter(|l| l.contains("\"pg_loss\"")) {
        let at = |k: &str| line.find(&format!("\"{k}\":")).unwrap();
        assert!(at("tokens_per_s") < at("pg_loss"), "{line}");
        assert!(at("pg_loss") < at("reg_loss") && at("reg_loss") < at("clip_frac/dual"));
    }
}
