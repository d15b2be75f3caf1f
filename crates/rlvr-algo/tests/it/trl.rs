//! rlvr's TRL-named presets against TRL 1.16's own GRPOTrainer code (issue 47):
//! `tests/reference/trl_grpo.json`, written by `tests/reference/make_trl_fixtures.py`, which runs
//! GRPOTrainer's `_generate_and_score_completions` (advantages) and `_compute_loss` (per
//! micro-batch, summed as gradient accumulation does) in float64 on a tiny checkpoint, with fixed
//! completions, rewards and per-token log-probs. Each case names the rlvr preset (and keys) that
//! must give TRL's advantages, loss and d loss / d log-prob.

use candle_core::{Device, Tensor, Var};
use rlvr_algo::{
    compute_advantages, policy_loss, AlgorithmConfig, LossInputs, RowInfo, UpdateNormaliser,
};
use serde::Deserialize;

#[derive(Deserialize)]
struct Fixture {
    source: String,
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    name: String,
    preset: String,
    set: serde_json::Map<String, serde_json::Value>,
    micro_batches: usize,
    differs: bool,
    rewards: Vec<f64>,
    groups: Vec<usize>,
    advantages: Vec<f64>,
    mask: Vec<Vec<f64>>,
    logp: Vec<Vec<f64>>,
    logp_old: Vec<Vec<f64>>,
    max_new_tokens: usize,
    loss: f64,
    grad_logp: Vec<Vec<f64>>,
}

fn fixture() -> Fixture {
    serde_json::from_str(include_str!("../reference/trl_grpo.json")).expect("trl_grpo.json parses")
}

fn t2(v: &[Vec<f64>]) -> Tensor {
    Tensor::from_vec(v.concat(), (v.len(), v[0].len()), &Device::Cpu).unwrap()
}

/// rlvr's advantages, loss and ℓ-gradient for a case (the whole update, split into the case's
/// micro-batches, each with the update's normaliser weights).
fn rlvr_step(case: &Case) -> (Vec<f64>, f64, Vec<Vec<f64>>) {
    let mut cfg = serde_json::Map::new();
    cfg.insert("preset".into(), case.preset.clone().into());
    cfg.extend(case.set.clone());
    let cfg: AlgorithmConfig = serde_json::from_value(cfg.into()).unwrap();
    let alg = cfg
        .resolve()
        .unwrap_or_else(|e| panic!("{}: {e}", case.name));
    let rewards: Vec<Option<f64>> = case.rewards.iter().map(|&r| Some(r)).collect();
    let adv = compute_advantages(&rewards, &case.groups, &alg, 0).unwrap();
    let n = case.rewards.len();
    let t = case.mask[0].len();
    let rows: Vec<RowInfo> = (0..n)
        .map(|i| {
            let len = case.mask[i].iter().sum::<f64>() as usize;
            RowInfo {
                completion_tokens: len,
                // No EOS in the fixture's completions: TRL counts every row; a full-length row is
                // truncated, which no case's config reads.
                truncated: len == t,
                in_normaliser: adv.in_normaliser[i],
            }
        })
        .collect();
    let norm = UpdateNormaliser::new(&alg, &rows, case.max_new_tokens).unwrap();
    let per = n / case.micro_batches;
    let mut loss = 0.0;
    let mut grad = Vec::new();
    for m in 0..case.micro_batches {
        let r = m * per..(m + 1) * per;
        let logp = Var::from_tensor(&t2(&case.logp[r.clone()])).unwrap();
        let old = t2(&case.logp_old[r.clone()]);
        let mask = t2(&case.mask[r.clone()]);
        let a = Tensor::new(&adv.values[r.clone()], &Device::Cpu).unwrap();
        let w = norm.range(r.clone());
        let (l, _) = policy_loss(
            &alg,
            &LossInputs {
                logp: logp.as_tensor(),
                logp_behaviour: &old,
                logp_ref: None,
                entropy: None,
                mask: &mask,
                advantages: &a,
                row_weights: &w,
                is_weights: None,
            },
        )
        .unwrap();
        loss += l.to_scalar::<f64>().unwrap();
        let g = l.backward().unwrap();
        grad.extend(
            g.get(logp.as_tensor())
                .map(|g| g.to_vec2::<f64>().unwrap())
                .unwrap_or_else(|| vec![vec![0.0; t]; per]),
        );
    }
    (adv.values, loss, grad)
}

fn rel(got: f64, want: f64) -> f64 {
    (got - want).abs() / (1e-12 + want.abs())
}

#[test]
fn presets_equal_trl_grpo_trainer() {
    let fx = fixture();
    assert!(
        fx.source.starts_with("TRL 1.16.0 GRPOTrainer"),
        "{}",
        fx.source
    );
    assert!(fx.cases.len() >= 12);
    for case in fx.cases.iter().filter(|c| !c.differs) {
        let (adv, loss, grad) = rlvr_step(case);
        for (i, (&g, &w)) in adv.iter().zip(&case.advantages).enumerate() {
            assert!(
                (g - w).abs() <= 1e-12 * (1.0 + w.abs()),
                "{} A[{i}]: {g} vs TRL {w}",
                case.name
            );
        }
        assert!(
            rel(loss, case.loss) < 1e-10,
            "{}: loss {loss} vs TRL {}",
            case.name,
            case.loss
        );
        for (i, (gr, wr)) in grad.iter().zip(&case.grad_logp).enumerate() {
            for (j, (&g, &w)) in gr.iter().zip(wr).enumerate() {
                assert!(
                    (g - w).abs() <= 1e-10 * (1e-3 + w.abs()),
                    "{} d loss/d logp[{i},{j}]: {g} vs TRL {w}",
                    case.name
                );
            }
        }
    }
}

/// The `grpo` preset as it is differs from TRL's loss_type "grpo" by exactly what its follows line
/// names: std + 1e-6 (a relative change of about 1e-4 / std) and zero-variance groups out of the
/// normaliser (their rows carry A = 0, so the per-sequence mean counts 8 rows, not 12).
#[test]
fn grpo_preset_differs_from_trl_by_its_named_differences() {
    let fx = fixture();
    let case = fx
        .cases
        .iter()
        .find(|c| c.name == "grpo_preset_as_is")
        .unwrap();
    let (adv, loss, _) = rlvr_step(case);
    // Mixed binary group [1, 0, 0, 1]: unbiased var = 4·0.25/3, std = 0.57735; A = 0.5/(std + ε).
    let sd = (1.0f64 / 3.0).sqrt();
    assert!((adv[0] - 0.5 / (sd + 1e-6)).abs() < 1e-12);
    assert!((case.advantages[0] - 0.5 / (sd + 1e-4)).abs() < 1e-12);
    let r = rel(adv[0], case.advantages[0]);
    assert!((r - (1e-4 - 1e-6) / (sd + 1e-6)).abs() < 1e-9, "{r}");
    // 12 rows in TRL's mean over sequences, 8 in rlvr's (the zero-variance group left out), and
    // the advantages 1.7e-4 larger: loss ≈ TRL · 12/8 · (1 + 1.7e-4).
    let want = case.loss * 12.0 / 8.0;
    assert!(
        rel(loss, want) < 5e-4 && rel(loss, want) > 1e-5,
        "{loss} vs {want}"
    );
}
