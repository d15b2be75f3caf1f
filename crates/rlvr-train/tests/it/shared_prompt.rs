//! `train.share_prompt`: the trainer step with each group's prompt computed once equals the step
//! with every row computing its prompt, for every preset, on random models of each architecture:
//! loss, gradient norm and every parameter's gradient within 1e-5 relative in f32 (1e-6 in f64,
//! where the gradient accumulator still sums in f32), with prompts and completions of uneven
//! lengths, groups of K = 1, 2, 3 and 8 (the 8 split into parts by the micro-batch limit), rows of
//! a group whose prompts differ (an offline file can hold anything), the KL reference pass, the
//! start-of-step mismatch scoring, activation checkpointing and token-budget micro-batches.

use std::sync::{Arc, Mutex};

use candle_core::{DType, Device, Tensor};
use rlvr_model::optim::AdamWConfig;
use rlvr_model::{Model, ModelConfig};
use rlvr_train::config::TrainSection;
use rlvr_train::pack::{forward_cost, micro_batches, MicroBatchLimit};
use rlvr_train::score::score_rows;
use rlvr_train::store::experience::Experience;
use rlvr_train::update::{GradReduce, OptimizerStep, StepReport, Trainer, TrainerSettings};

/// A reduction that records each update's gradient sums (as f64, `named_vars` order) and leaves
/// them as they are.
#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<UpdateGrads>>>);

/// One update's gradient per parameter (`None`: not reached).
type UpdateGrads = Vec<Option<Vec<f64>>>;

impl GradReduce for Capture {
    fn reduce(&mut self, grads: &mut [Option<Tensor>], _finite: &mut bool) -> anyhow::Result<()> {
        let g = grads
            .iter()
            .map(|g| {
                g.as_ref()
                    .map(|t| t.flatten_all()?.to_dtype(DType::F64)?.to_vec1::<f64>())
                    .transpose()
            })
            .collect::<candle_core::Result<Vec<_>>>()?;
        self.0.lock().unwrap().push(g);
        Ok(())
    }
}

fn model(arch: &str, dtype: DType, seed: u64) -> Model {
    let config = ModelConfig::from_json(
        &serde_json::json!({"model_type": arch, "vocab_size": 32, "hidden_size": 16,
            "intermediate_size": 24, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 4, "max_position_embeddings": 64,
            "tie_word_embeddings": arch == "qwen2"}),
        "inline".as_ref(),
    )
    .unwrap();
    // std 0.3: peaked distributions, so ratios, clips and masks are far from their trivial values.
    Model::random(config, 0.3, seed, dtype, &Device::Cpu).unwrap()
}

/// Groups of K = 8, 1, 2, 3 with prompts of 2-6 tokens and completions of 1-6, rewards with
/// variance in every group of K ≥ 2, and behaviour log-probs near the model's; the last group's
/// third row has a prompt of its own (same group id).
fn batch() -> Vec<Experience> {
    let mut s = 11u64;
    let mut next = |m: u64| {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((s >> 33) % m) as u32
    };
    let mut out = Vec::new();
    for (g, k) in [8usize, 1, 2, 3].into_iter().enumerate() {
        let prompt: Vec<u32> = (0..2 + next(5)).map(|_| 1 + next(30)).collect();
        for j in 0..k {
            let c: Vec<u32> = (0..1 + next(6)).map(|_| 1 + next(30)).collect();
            let mut p = prompt.clone();
            if g == 3 && j == 2 {
                p.push(5);
            }
            out.push(Experience {
                prompt_ids: p,
                behaviour_logprobs: c.iter().map(|_| -3.0 + next(200) as f32 / 100.0).collect(),
                completion_ids: c,
                reward: Some(((g + j) % 3) as f64 * 0.5),
                correct: None,
                group_id: format!("g{g}"),
                version: Some(0),
                components: Vec::new(),
                truncated: j == 1 && k == 8,
                ..Default::default()
            });
        }
    }
    out
}

struct Outcome {
    report: StepReport,
    grads: Vec<UpdateGrads>,
    start_scores: Vec<Vec<f32>>,
}

fn run(
    arch: &str,
    dtype: DType,
    preset: &str,
    share: bool,
    mut train: TrainSection,
) -> anyhow::Result<Outcome> {
    train.share_prompt = share;
    let policy = model(arch, dtype, 3);
    let mut alg = rlvr_algo::AlgorithmConfig::empty(preset);
    if alg.kl_coef.is_none() {
        alg.kl_coef = Some(0.05); // the reference pass too, where the preset leaves KL unset
    }
    let algorithm = alg.resolve()?;
    let reference = algorithm.needs_reference().then(|| model(arch, dtype, 4));
    let settings = TrainerSettings {
        algorithm,
        train: (&train).into(),
        temperature: 0.8,
        max_new_tokens: 6,
        pad_id: 0,
    };
    let start_scores = score_rows(&policy, &batch(), 4, 0.8, 0, share)?;
    let mut t = Trainer::new(policy, reference, settings)?;
    let cap = Capture::default();
    let cfg = AdamWConfig {
        lr: 1e-3,
        beta1: train.beta1,
        beta2: train.beta2,
        eps: train.adam_eps,
        weight_decay: train.weight_decay,
    };
    t.optimizer =
        OptimizerStep::new(&t.model, cfg, train.grad_clip)?.with_reduce(Box::new(cap.clone()))?;
    let report = t.step(&batch(), 1, 1e-3, 0)?;
    let grads = cap.0.lock().unwrap().clone();
    Ok(Outcome {
        report,
        grads,
        start_scores,
    })
}

fn rel(a: f64, b: f64) -> f64 {
    (a - b).abs() / b.abs().max(1e-12)
}

/// Relative L2 distance of two gradients (0 when both are exactly zero).
fn rel_l2(a: &[f64], b: &[f64]) -> f64 {
    let d: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y) * (x - y))
        .sum::<f64>()
        .sqrt();
    let n: f64 = b.iter().map(|y| y * y).sum::<f64>().sqrt();
    if n == 0.0 {
        d
    } else {
        d / n
    }
}

fn check(arch: &str, dtype: DType, preset: &str, train: TrainSection, tol: f64) {
    let what = format!("{arch} {dtype:?} {preset}");
    let s = run(arch, dtype, preset, true, train.clone()).unwrap();
    let u = run(arch, dtype, preset, false, train).unwrap();
    let (ls, lu) = (
        s.report.loss.as_ref().unwrap(),
        u.report.loss.as_ref().unwrap(),
    );
    assert!(lu.loss != 0.0, "{what}: a zero loss checks nothing");
    assert!(
        rel(ls.loss, lu.loss) < tol,
        "{what}: loss {} vs {}",
        ls.loss,
        lu.loss
    );
    let (gs, gu) = (s.report.grad_norm.unwrap(), u.report.grad_norm.unwrap());
    assert!(
        gu > 0.0 && rel(gs, gu) < tol,
        "{what}: grad norm {gs} vs {gu}"
    );
    assert_eq!(
        (s.report.updates, s.report.tokens, s.report.rows_skipped),
        (u.report.updates, u.report.tokens, u.report.rows_skipped),
        "{what}"
    );
    assert_eq!(s.grads.len(), u.grads.len());
    let mut reached = 0;
    for (update, (a, b)) in s.grads.iter().zip(&u.grads).enumerate() {
        for (k, (x, y)) in a.iter().zip(b).enumerate() {
            match (x, y) {
                (Some(x), Some(y)) => {
                    reached += 1;
                    let e = rel_l2(x, y);
                    assert!(
                        e < tol,
                        "{what}: update {update} parameter {k}: rel. L2 {e:e}"
                    );
                }
                (None, None) => {}
                _ => panic!("{what}: parameter {k} reached on one path only"),
            }
        }
    }
    assert!(reached > 0, "{what}: no gradient compared");
    for (i, (a, b)) in s.start_scores.iter().zip(&u.start_scores).enumerate() {
        assert_eq!(a.len(), b.len(), "{what}: row {i}");
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).abs() < 1e-5, "{what}: row {i} score {x} vs {y}");
        }
    }
}

fn base() -> TrainSection {
    TrainSection {
        micro_batch_size: 4, // the group of 8 is split into two parts
        grad_clip: 0.0,
        skip_zero_gradient_rows: false,
        ..Default::default()
    }
}

#[test]
fn every_preset_gives_the_same_step_with_the_prompt_shared() {
    // The micro-batches of 4 rows really share: fewer decoder positions than rows × length.
    let b = batch();
    let limit = MicroBatchLimit {
        rows: 4,
        tokens: None,
        share_prompt: true,
    };
    let mbs = micro_batches(&b, &(0..b.len()).collect::<Vec<_>>(), limit);
    assert_eq!(mbs.iter().map(Vec::len).collect::<Vec<_>>(), [4, 4, 3, 3]);
    let cost = |share| {
        mbs.iter()
            .map(|m| forward_cost(&b, m, share))
            .sum::<usize>()
    };
    assert!(
        cost(true) * 10 < cost(false) * 8,
        "{} vs {}",
        cost(true),
        cost(false)
    );
    for p in rlvr_algo::presets() {
        check("qwen2", DType::F32, p.name, base(), 1e-5);
    }
}

#[test]
fn each_architecture_in_f32_and_f64_gives_the_same_step() {
    for arch in ["qwen2", "qwen3", "llama"] {
        for preset in ["grpo", "rec_oneside_is", "opmd"] {
            check(arch, DType::F32, preset, base(), 1e-5);
        }
        check(arch, DType::F64, "grpo", base(), 1e-6);
    }
}

#[test]
fn checkpointing_mini_batches_and_token_budgets_keep_the_step_the_same() {
    let variants = [
        TrainSection {
            gradient_checkpointing: true,
            ..base()
        },
        TrainSection {
            mini_batches: 2,
            epochs: 2,
            grad_clip: 0.5,
            ..base()
        },
        TrainSection {
            micro_batch_tokens: Some(40),
            ..base()
        },
        TrainSection {
            micro_batch_size: 1,
            ..base()
        },
        TrainSection {
            skip_zero_gradient_rows: true,
            ..base()
        },
    ];
    for v in variants {
        check("qwen2", DType::F32, "grpo", v, 1e-5);
    }
}
