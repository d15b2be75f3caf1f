//! Offline mode (experiences JSONL), a hand-checkable trainer step, and micro-batch invariance of the
//! whole trainer step's update.

use crate::common;

use std::path::Path;

use candle_core::{DType, Device};
use rlvr_model::Model;
use rlvr_train::config::{RawConfig, TrainSection};
use rlvr_train::run::{train, RunOptions};
use rlvr_train::score::completion_logprobs;
use rlvr_train::store::experience::{read_experiences, Experience};
use rlvr_train::store::metrics::read_metrics;
use rlvr_train::update::{Trainer, TrainerSettings};

fn write(path: &Path, lines: &[String]) {
    std::fs::write(path, lines.join("\n") + "\n").unwrap();
}

fn check_bad_line(line: &str, field: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let p = tmp.path().join("exp.jsonl");
    let good = r#"{"prompt_ids": [1, 2], "completion_ids": [3], "behaviour_logprobs": [-1.0], "reward": 1.0, "group_id": "a"}"#;
    write(&p, &[good.to_string(), line.to_string()]);
    let err = read_experiences(&p).unwrap_err().to_string();
    assert!(err.contains("exp.jsonl:2"), "no file:line in {err}");
    assert!(
        err.contains(&format!("`{field}`")),
        "no field `{field}` in {err}"
    );
}

#[test]
fn malformed_experience_lines_name_file_line_and_field() {
    check_bad_line(
        r#"{"completion_ids": [3], "behaviour_logprobs": [-1.0], "reward": 1.0, "group_id": "a"}"#,
        "prompt_ids",
    );
    check_bad_line(
        r#"{"prompt_ids": [1], "completion_ids": [3, 4], "behaviour_logprobs": [-1.0], "reward": 1.0, "group_id": "a"}"#,
        "behaviour_logprobs",
    );
    check_bad_line(
        r#"{"prompt_ids": [1], "completion_ids": [3], "behaviour_logprobs": [-1.0], "reward": "yes", "group_id": "a"}"#,
        "reward",
    );
    check_bad_line(
        r#"{"prompt_ids": [1], "completion_ids": [3], "behaviour_logprobs": [-1.0], "reward": 1.0}"#,
        "group_id",
    );
    check_bad_line(
        r#"{"prompt_ids": [1], "completion_ids": [-3], "behaviour_logprobs": [-1.0], "reward": 1.0, "group_id": "a"}"#,
        "completion_ids",
    );
    check_bad_line(
        r#"{"prompt_ids": [1], "completion_ids": [3], "behaviour_logprobs": [-1.0], "reward": 1.0, "group_id": "a", "finish_reason": "stop"}"#,
        "finish_reason",
    );
    check_bad_line(
        r#"{"prompt_ids": [1], "completion_ids": [3], "behaviour_logprobs": [-1.0], "reward": 1.0, "group_id": "a", "version": -1}"#,
        "version",
    );
    check_bad_line("{not json", "-");
}

/// The error of an experiences file whose line 2 is `line` (line 1 is good).
fn bad_line_error(line: &str) -> String {
    let tmp = tempfile::tempdir().unwrap();
    let p = tmp.path().join("exp.jsonl");
    let good = r#"{"prompt_ids": [1, 2], "completion_ids": [3], "behaviour_logprobs": [-1.0], "reward": 1.0, "group_id": "a"}"#;
    write(&p, &[good.to_string(), line.to_string()]);
    read_experiences(&p).unwrap_err().to_string()
}

#[test]
fn nan_and_infinity_in_an_experiences_line_name_their_field() {
    // Not JSON at all, so the JSON parser refuses them; the error names the field being read
    // (it was `-`, the whole line) and says what to write instead.
    let nan = r#"{"prompt_ids": [1], "completion_ids": [3], "behaviour_logprobs": [-1.0], "reward": NaN, "group_id": "a"}"#;
    // (line, what the error says, the bare word it names, if any)
    let cases = [
        (
            nan,
            "exp.jsonl:2: field `reward`: invalid JSON: expected value at line 1 column 84",
            Some("NaN"),
        ),
        (
            r#"{"prompt_ids": [1], "completion_ids": [3, 4], "behaviour_logprobs": [-1.0, -Infinity], "reward": 1.0, "group_id": "a"}"#,
            "exp.jsonl:2: field `behaviour_logprobs`: invalid JSON: invalid number",
            Some("-Infinity"),
        ),
        (
            r#"{"prompt_ids": [1], "completion_ids": [3], "behaviour_logprobs": [nan], "reward": 1.0, "group_id": "a"}"#,
            "exp.jsonl:2: field `behaviour_logprobs`: invalid JSON: expected ident",
            Some("nan"),
        ),
        (
            // A value that is a string with a colon is not taken for a key.
            r#"{"group_id": "a:b", "prompt_ids": [1], "completion_ids": [3], "behaviour_logprobs": [-1.0], "reward": 1e400}"#,
            "exp.jsonl:2: field `reward`: invalid JSON: number out of range",
            None,
        ),
    ];
    for (line, want, word) in cases {
        let err = bad_line_error(line);
        assert!(err.contains(want), "{want}\nnot in\n{err}");
        if let Some(w) = word {
            let hint =
                format!("(`{w}` is not a JSON number: NaN and infinities cannot be trained on");
            assert!(err.contains(&hint), "{hint}\nnot in\n{err}");
        }
    }
    // Trailing text after a whole object is the line's fault, not a field's.
    let err = bad_line_error(&format!("{} x", nan.replace("NaN", "1.0")));
    assert!(
        err.contains("exp.jsonl:2: field `-`: invalid JSON: trailing characters"),
        "{err}"
    );
}

#[test]
fn impossible_log_probs_and_split_groups_are_refused_naming_file_line_and_field() {
    for lp in ["0.5", "-20000.0", "1e400"] {
        let line = format!(
            r#"{{"prompt_ids": [1], "completion_ids": [3], "behaviour_logprobs": [{lp}], "reward": 1.0, "group_id": "a"}}"#
        );
        // 1e400 is not a JSON number serde accepts; the error still names the field it is in.
        check_bad_line(&line, "behaviour_logprobs");
    }
    let tmp = tempfile::tempdir().unwrap();
    let p = tmp.path().join("exp.jsonl");
    let row = |g: &str, lp: &str| {
        format!(
            r#"{{"prompt_ids": [1], "completion_ids": [3], "behaviour_logprobs": [{lp}], "reward": 1.0, "group_id": "{g}"}}"#
        )
    };
    // The edges of the log-prob range are accepted.
    write(
        &p,
        &[row("a", "0.0"), row("a", "-10000.0"), row("b", "-1.0")],
    );
    assert_eq!(read_experiences(&p).unwrap().len(), 3);
    let err = {
        write(&p, &[row("a", "-1"), row("b", "-1"), row("a", "-1")]);
        read_experiences(&p).unwrap_err().to_string()
    };
    assert!(
        err.contains("exp.jsonl:3: field `group_id`")
            && err.contains("began at line 1")
            && err.contains("consecutive"),
        "{err}"
    );
}

/// An offline run over `lines` with B = 1 group per step for `steps` steps; its error, if any.
fn offline_run(lines: &[String], steps: u64) -> Option<String> {
    let tmp = tempfile::tempdir().unwrap();
    let model_dir = common::tiny_model(tmp.path(), 4);
    let file = tmp.path().join("exp.jsonl");
    write(&file, lines);
    let sets: Vec<String> = vec![
        format!("model.path={}", model_dir.display()),
        format!("output.dir={}", tmp.path().join("run").display()),
        format!("data.experiences={}", file.display()),
        "data.prompts_per_step=1".into(),
        format!("train.steps={steps}"),
    ];
    let cfg = RawConfig::load(None, &sets).unwrap().resolve().unwrap();
    train(&cfg, &RunOptions::default())
        .err()
        .map(|e| format!("{e:#}"))
}

/// Issue 49 item 15: a token id past the model's vocabulary used to fail late, in the forward
/// pass, without the file's line; it is refused at start naming file, line and field. A reward of
/// 1e308 trained without the warning an online verifier's reward gets; train.log now has it,
/// naming the first such line and the count.
#[test]
fn out_of_vocabulary_ids_are_refused_and_huge_rewards_warned_naming_the_line() {
    let row = |g: &str, prompt: &str, completion: u32, reward: &str| {
        format!(
            r#"{{"prompt_ids": [{prompt}], "completion_ids": [{completion}], "behaviour_logprobs": [-1.0], "reward": {reward}, "group_id": "{g}"}}"#
        )
    };
    let lines = vec![row("a", "1, 2", 3, "1.0"), row("a", "1, 999999", 4, "0.0")];
    let err = offline_run(&lines, 1).expect("an id past the vocabulary is refused");
    assert!(
        err.contains("exp.jsonl:2: field `prompt_ids`: token id 999999 (position 1) is not in the model's vocabulary of"),
        "{err}"
    );
    let lines = vec![row("a", "1", 999_999, "1.0"), row("a", "1", 4, "0.0")];
    let err = offline_run(&lines, 1).expect("an id past the vocabulary is refused");
    assert!(
        err.contains("exp.jsonl:1: field `completion_ids`: token id 999999"),
        "{err}"
    );

    let tmp = tempfile::tempdir().unwrap();
    let model_dir = common::tiny_model(tmp.path(), 4);
    let file = tmp.path().join("exp.jsonl");
    write(
        &file,
        &[
            row("a", "1", 3, "1.0"),
            row("a", "1", 4, "1e308"),
            row("b", "1", 3, "-2e7"),
            row("b", "1", 4, "0.0"),
        ],
    );
    let run = tmp.path().join("run");
    let sets: Vec<String> = vec![
        format!("model.path={}", model_dir.display()),
        format!("output.dir={}", run.display()),
        format!("data.experiences={}", file.display()),
        "data.prompts_per_step=1".into(),
        "train.steps=1".into(),
    ];
    let cfg = RawConfig::load(None, &sets).unwrap().resolve().unwrap();
    train(&cfg, &RunOptions::default()).unwrap();
    let log = std::fs::read_to_string(run.join("train.log")).unwrap();
    assert!(
        log.contains(&format!(
            "warning: {}:2: field `reward`: 1e308 exceeds 1e6 in magnitude (2 rows of the file)",
            file.display()
        )),
        "{log}"
    );
}

#[test]
fn rows_from_the_future_or_longer_than_the_model_are_refused_naming_file_line_and_field() {
    let row = |g: &str, version: u64, completion: &str| {
        format!(
            r#"{{"prompt_ids": [1, 2], "completion_ids": [{completion}], "behaviour_logprobs": [{}], "reward": {}, "group_id": "{g}", "version": {version}}}"#,
            completion
                .split(',')
                .map(|_| "-1.0")
                .collect::<Vec<_>>()
                .join(","),
            if completion == "3" { 1.0 } else { 0.0 },
        )
    };
    // Step 2 takes group b, sampled by version 1 (staleness 0: fine); step 3 takes group c, whose
    // second row claims version 3, the weights after step 3.
    let lines = vec![
        row("a", 0, "3"),
        row("a", 0, "4"),
        row("b", 1, "3"),
        row("b", 1, "4"),
        row("c", 2, "3"),
        row("c", 3, "4"),
    ];
    let err = offline_run(&lines, 3).expect("version 3 at step 3 is refused");
    assert!(
        err.contains("exp.jsonl:6: field `version`: 3 is from the future: step 3"),
        "{err}"
    );
    assert!(offline_run(&lines[..4], 2).is_none());
    // tiny_model has 128 positions: 2 prompt + 127 completion tokens do not fit.
    let long = vec!["3"; 127].join(",");
    let lines = vec![row("a", 0, "3"), row("a", 0, &long)];
    let err = offline_run(&lines, 1).expect("a row longer than the model is refused");
    assert!(
        err.contains("exp.jsonl:2: field `completion_ids`")
            && err.contains("129 tokens")
            && err.contains("max_position_embeddings (128)"),
        "{err}"
    );
}

#[test]
fn experience_fields_parse() {
    let tmp = tempfile::tempdir().unwrap();
    let p = tmp.path().join("exp.jsonl");
    write(
        &p,
        &[
            r#"{"prompt_ids": [1], "completion_ids": [3, 5], "behaviour_logprobs": [-1.0, -2.5], "reward": null, "group_id": 7, "version": 3, "finish_reason": "length"}"#.into(),
            String::new(),
            r#"{"prompt_ids": [1], "completion_ids": [], "behaviour_logprobs": [], "reward": 0.5, "group_id": "7"}"#.into(),
        ],
    );
    let e = read_experiences(&p).unwrap();
    assert_eq!(e.len(), 2);
    assert_eq!(e[0].group_id, "7");
    assert_eq!(e[1].group_id, "7", "group ids compare as strings");
    assert_eq!(e[0].reward, None);
    assert_eq!(e[0].version, Some(3));
    assert!(e[0].truncated && !e[1].truncated);
    assert_eq!(e[1].version, None);
    assert_eq!(e[0].staleness(5), Some(1));
    assert_eq!(e[1].staleness(5), None);
}

fn exp(prompt: Vec<u32>, completion: Vec<u32>, reward: f64, group: &str) -> Experience {
    let n = completion.len();
    Experience {
        prompt_ids: prompt,
        completion_ids: completion,
        behaviour_logprobs: vec![-3.0; n],
        reward: Some(reward),
        correct: None,
        group_id: group.into(),
        version: None,
        truncated: false,
        components: Vec::new(),
        ..Default::default()
    }
}

fn json_line(e: &Experience) -> String {
    serde_json::json!({
        "prompt_ids": e.prompt_ids, "completion_ids": e.completion_ids,
        "behaviour_logprobs": e.behaviour_logprobs, "reward": e.reward, "group_id": e.group_id,
    })
    .to_string()
}

/// One offline REINFORCE step checked by hand: loss = −Σ_i A_i Σ_t ℓ_it / Σ_i n_i (token-mean) with
/// A = ±0.5 (group mean baseline, no std), ℓ from the initial model; and AdamW's first update moves
/// every weight by lr·g/(|g| + ε) (weight decay 0), i.e. by at most lr and by ≈ lr where |g| ≫ ε.
#[test]
fn hand_checked_offline_reinforce_step() {
    let tmp = tempfile::tempdir().unwrap();
    let model_dir = common::tiny_model(tmp.path(), 4);
    let exps = vec![
        exp(vec![1, 2, 3], vec![4, 5], 1.0, "g0"),
        exp(vec![1, 2, 3], vec![6, 7, 8], 0.0, "g0"),
        exp(vec![9, 10], vec![11], 0.0, "g1"),
        exp(vec![9, 10], vec![12, 13, 2, 18], 1.0, "g1"),
    ];
    let file = tmp.path().join("exp.jsonl");
    write(&file, &exps.iter().map(json_line).collect::<Vec<_>>());
    let rd = tmp.path().join("run");
    let lr = 1e-3;
    let sets: Vec<String> = vec![
        format!("model.path={}", model_dir.display()),
        format!("output.dir={}", rd.display()),
        format!("data.experiences={}", file.display()),
        "data.prompts_per_step=2".into(),
        "algorithm.preset=\"reinforce\"".into(),
        "train.steps=1".into(),
        format!("train.lr={lr}"),
        "train.weight_decay=0".into(),
        "train.grad_clip=0".into(),
        "train.micro_batch_size=3".into(),
    ];
    let cfg = RawConfig::load(None, &sets).unwrap().resolve().unwrap();
    train(&cfg, &RunOptions::default()).unwrap();

    let before = Model::load(&model_dir, DType::F32, &Device::Cpu).unwrap();
    let lp = completion_logprobs(&before, &exps, &[0, 1, 2, 3], 1.0, 0, false).unwrap();
    let adv = [0.5, -0.5, -0.5, 0.5];
    let tokens: usize = exps.iter().map(|e| e.completion_ids.len()).sum();
    let want: f64 = -lp
        .iter()
        .zip(adv)
        .map(|(l, a)| a * l.iter().map(|&x| x as f64).sum::<f64>())
        .sum::<f64>()
        / tokens as f64;
    let m = read_metrics(&rd.join("metrics.jsonl")).unwrap();
    let got = m[0]["loss"].as_f64().unwrap();
    assert!((got - want).abs() < 1e-5, "loss {got} vs hand value {want}");
    assert_eq!(m[0]["reward/mean"].as_f64(), Some(0.5));
    assert_eq!(m[0]["accuracy"].as_f64(), Some(0.5));
    assert_eq!(m[0]["completion_len/mean"].as_f64(), Some(2.5));
    assert!(
        m[0]["staleness/mean"].is_null(),
        "no version: staleness null"
    );
    assert_eq!(m[0]["zero_std_frac"].as_f64(), Some(0.0));

    let after = Model::load(&rd.join("checkpoints/step-1"), DType::F32, &Device::Cpu).unwrap();
    let mut max_step = 0f64;
    for ((_, a), (_, b)) in before.named_vars().iter().zip(after.named_vars().iter()) {
        let d = (b.as_tensor() - a.as_tensor())
            .unwrap()
            .abs()
            .unwrap()
            .flatten_all()
            .unwrap()
            .max(0)
            .unwrap()
            .to_scalar::<f32>()
            .unwrap() as f64;
        assert!(d <= lr * (1.0 + 1e-4), "a weight moved by {d} > lr");
        max_step = max_step.max(d);
    }
    assert!(
        (max_step - lr).abs() < 1e-5,
        "largest move {max_step}, expected ≈ lr"
    );
}

fn batch() -> Vec<Experience> {
    let mut out = Vec::new();
    let mut s = 7u64;
    let mut next = |m: u64| {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((s >> 33) % m) as u32
    };
    for g in 0..4 {
        let p: Vec<u32> = (0..2 + next(3)).map(|_| next(19)).collect();
        for k in 0..4 {
            let c: Vec<u32> = (0..1 + next(5)).map(|_| next(19)).collect();
            let mut e = exp(p.clone(), c, ((g + k) % 3) as f64, &format!("g{g}"));
            e.behaviour_logprobs = e
                .completion_ids
                .iter()
                .map(|_| -2.0 - next(100) as f32 / 100.0)
                .collect();
            out.push(e);
        }
    }
    out
}

/// A trainer over the model in `model_dir` with `preset` (no KL) and `train`.
fn trainer(model_dir: &Path, preset: &str, train: TrainSection) -> Trainer {
    let model = Model::load(model_dir, DType::F32, &Device::Cpu).unwrap();
    let mut alg = rlvr_algo::AlgorithmConfig::empty(preset);
    alg.kl_coef = None;
    let settings = TrainerSettings {
        algorithm: alg.resolve().unwrap(),
        train: (&train).into(),
        temperature: 0.7,
        max_new_tokens: 5,
        pad_id: 0,
    };
    Trainer::new(model, None, settings).unwrap()
}

/// Every parameter of the trainer's model, flattened, in `named_vars` order.
fn weights(t: &Trainer) -> Vec<Vec<f32>> {
    t.model
        .named_vars()
        .iter()
        .map(|(_, v)| {
            v.as_tensor()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap()
        })
        .collect()
}

fn check_step(model_dir: &Path, preset: &str, train: TrainSection) -> (Vec<Vec<f32>>, f64) {
    let mut t = trainer(model_dir, preset, train);
    let rep = t.step(&batch(), 1, 1e-3, 0).unwrap();
    (weights(&t), rep.grad_norm.unwrap())
}

/// The whole trainer step (advantages, normaliser, micro-batches, clipping, AdamW, two mini-batches
/// and two epochs) gives the same update whether each update runs as 1, 2, 3 or 16 micro-batches or
/// by token budget, for every aggregation mode, with and without the shared prompt: gradient norms
/// within 1e-5 relative, weights within 1e-2 × lr (the data-parallel bound: the float sums are
/// reassociated with the micro-batch layout, and four AdamW updates magnify that where gradients
/// are near zero; 2e-6 = 2e-3 × lr was seen).
#[test]
fn trainer_step_is_micro_batch_invariant() {
    let tmp = tempfile::tempdir().unwrap();
    let model_dir = common::tiny_model(tmp.path(), 5);
    for (preset, share_prompt) in ["grpo", "dapo", "reinforce", "dr_grpo", "rec_oneside_is"]
        .into_iter()
        .flat_map(|p| [(p, false), (p, true)])
    {
        let tol = 1e-2 * 1e-3;
        let base = TrainSection {
            mini_batches: 2,
            epochs: 2,
            grad_clip: 0.5,
            weight_decay: 0.01,
            share_prompt,
            ..Default::default()
        };
        let (w0, g0) = check_step(
            &model_dir,
            preset,
            TrainSection {
                micro_batch_size: 16,
                ..base.clone()
            },
        );
        for mb in [
            TrainSection {
                micro_batch_size: 1,
                ..base.clone()
            },
            TrainSection {
                micro_batch_size: 3,
                ..base.clone()
            },
            TrainSection {
                micro_batch_tokens: Some(20),
                ..base.clone()
            },
        ] {
            let (w, g) = check_step(&model_dir, preset, mb.clone());
            assert!(
                (g - g0).abs() < 1e-5 * (1.0 + g0),
                "{preset}: grad norm {g} vs {g0}"
            );
            for (a, b) in w.iter().zip(&w0) {
                for (x, y) in a.iter().zip(b) {
                    assert!(
                        (x - y).abs() < tol,
                        "{preset} share {share_prompt} {:?}: weight {x} vs {y}",
                        mb.micro_batch_tokens
                    );
                }
            }
        }
    }
}

/// [`batch`] with group g0's rewards all equal (zero variance) and group g1's rewards 0, 1, 2, 1
/// (two rows with advantage exactly 0); `all_flat` makes every group zero-variance.
fn batch_with_zero_gradient_rows(all_flat: bool) -> Vec<Experience> {
    let mut b = batch();
    for (i, e) in b.iter_mut().enumerate() {
        let (g, k) = (i / 4, i % 4);
        e.reward = Some(if all_flat || g == 0 {
            1.0
        } else if g == 1 {
            [0.0, 1.0, 2.0, 1.0][k]
        } else {
            e.reward.unwrap()
        });
    }
    b
}

fn step_weights(
    model_dir: &Path,
    preset: &str,
    skip: bool,
    b: &[Experience],
) -> (Vec<Vec<f32>>, Option<f64>, usize) {
    let mut t = trainer(
        model_dir,
        preset,
        TrainSection {
            micro_batch_size: 3,
            weight_decay: 0.1,
            skip_zero_gradient_rows: skip,
            ..Default::default()
        },
    );
    // Two steps, so the second has non-zero moments to decay.
    let mut rep = t.step(b, 1, 1e-2, 0).unwrap();
    let mut skipped = rep.rows_skipped;
    rep = t.step(b, 2, 1e-2, 0).unwrap();
    skipped += rep.rows_skipped;
    let w = weights(&t);
    (w, rep.grad_norm, skipped)
}

/// Leaving zero-gradient rows out of forward/backward does not change the update: zero-variance
/// groups (weight 0) and zero-advantage rows of a pure policy-gradient loss are skipped, rows of a
/// loss with a regulariser (OPMD) are not; a step where every row is skipped still decays the
/// AdamW moments and applies weight decay exactly like a step that computed zero gradients.
#[test]
fn skipping_zero_gradient_rows_keeps_the_update() {
    let tmp = tempfile::tempdir().unwrap();
    let model_dir = common::tiny_model(tmp.path(), 9);
    for (preset, all_flat, want_skipped) in [
        ("grpo", false, 2 * 6),    // g0 (4 rows, weight 0) + g1's two A = 0 rows
        ("dr_grpo", false, 2 * 6), // same rows
        ("rec_oneside_is", false, 2 * 6), // keep-masked REINFORCE: A = 0 rows too
        ("opmd", false, 0),        // the regulariser has gradient at A = 0
        ("grpo", true, 2 * 16),    // every row: the update is moments + weight decay
    ] {
        let b = batch_with_zero_gradient_rows(all_flat);
        let (w0, g0, s0) = step_weights(&model_dir, preset, false, &b);
        let (w1, g1, s1) = step_weights(&model_dir, preset, true, &b);
        assert_eq!(s0, 0, "{preset}");
        assert_eq!(s1, want_skipped, "{preset} all_flat={all_flat}");
        let (g0, g1) = (g0.unwrap(), g1.unwrap());
        assert!(
            (g0 - g1).abs() < 1e-6 * (1.0 + g0),
            "{preset}: grad norm {g1} vs {g0}"
        );
        for (a, b) in w1.iter().zip(&w0) {
            for (x, y) in a.iter().zip(b) {
                assert!(
                    (x - y).abs() < 1e-6,
                    "{preset} all_flat={all_flat}: {x} vs {y}"
                );
            }
        }
    }
}

/// `algorithm.mismatch_correction` (the sampler/trainer IS correction) against reference values: with every
/// behaviour log-prob ln 4 below the trainer's start-of-step log-prob (ρ_mismatch = 4 on every
/// token), truncation at C = 2 (token or sequence: 4^n > 2) weighs every token's loss term by 2,
/// so the loss is exactly twice the uncorrected loss on the same inputs; the masks with C = 2
/// drop every token (loss 0); with ρ = 1 every correction leaves the loss as it is.
#[test]
fn mismatch_corrections_weigh_the_loss_by_reference_values() {
    use rlvr_algo::MismatchCorrection as M;
    let tmp = tempfile::tempdir().unwrap();
    let model_dir = common::tiny_model(tmp.path(), 6);
    // (loss, gradient norm before clipping) of one trainer step.
    let loss_with = |b: &[Experience], mc: M| -> (f64, f64) {
        let model = Model::load(&model_dir, DType::F32, &Device::Cpu).unwrap();
        let mut alg = rlvr_algo::AlgorithmConfig::empty("grpo");
        alg.kl_coef = None;
        alg.mismatch_correction = Some(mc);
        alg.mismatch_cap = Some(2.0);
        let settings = TrainerSettings {
            algorithm: alg.resolve().unwrap(),
            train: (&TrainSection::default()).into(),
            temperature: 0.7,
            max_new_tokens: 5,
            pad_id: 0,
        };
        let mut t = Trainer::new(model, None, settings).unwrap();
        let rep = t.step(b, 1, 1e-3, 0).unwrap();
        (rep.loss.unwrap().loss, rep.grad_norm.unwrap())
    };
    let model = Model::load(&model_dir, DType::F32, &Device::Cpu).unwrap();
    let mut b = batch();
    let rows: Vec<usize> = (0..b.len()).collect();
    let lp = completion_logprobs(&model, &b, &rows, 0.7, 0, false).unwrap();
    for (e, l) in b.iter_mut().zip(&lp) {
        e.behaviour_logprobs = l.clone();
    }
    // ρ = 1: no change (the same update).
    let plain = loss_with(&b, M::None);
    assert!(plain.1 > 1e-6, "{plain:?}");
    for mc in [
        M::TokenTruncate,
        M::SequenceTruncate,
        M::TokenMask,
        M::SequenceMask,
    ] {
        let l = loss_with(&b, mc);
        assert!((l.0 - plain.0).abs() <= 1e-6, "{mc:?}: {l:?} vs {plain:?}");
        assert!(
            (l.1 - plain.1).abs() <= 1e-6 * plain.1,
            "{mc:?}: {l:?} vs {plain:?}"
        );
    }
    // ρ = 4 on every token.
    for e in &mut b {
        for x in &mut e.behaviour_logprobs {
            *x -= 4f32.ln();
        }
    }
    let plain = loss_with(&b, M::None);
    assert!(plain.0.abs() > 1e-4 && plain.1 > 1e-6, "{plain:?}");
    for mc in [M::TokenTruncate, M::SequenceTruncate] {
        let l = loss_with(&b, mc);
        assert!(
            (l.0 - 2.0 * plain.0).abs() <= 1e-5 * plain.0.abs(),
            "{mc:?}: {l:?} vs 2 × {plain:?}"
        );
        assert!(
            (l.1 - 2.0 * plain.1).abs() <= 1e-5 * plain.1,
            "{mc:?}: {l:?} vs 2 × {plain:?}"
        );
    }
    for mc in [M::TokenMask, M::SequenceMask] {
        assert_eq!(loss_with(&b, mc), (0.0, 0.0), "{mc:?}");
    }
    // gspo reads a sequence ratio over the mask: token-level corrections are refused.
    let mut alg = rlvr_algo::AlgorithmConfig::empty("gspo");
    alg.mismatch_correction = Some(M::TokenTruncate);
    let err = alg.resolve().unwrap_err().to_string();
    assert!(err.contains("mismatch_correction"), "{err}");
}
