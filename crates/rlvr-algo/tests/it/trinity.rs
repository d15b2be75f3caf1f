//! rlvr's Trinity-named presets against Trinity-RFT 0.6.0's own classes (issue 47):
//! `tests/reference/trinity.json`, written by `tests/reference/make_trinity_fixtures.py`, which
//! runs Trinity's `RECGroupedAdvantage` / `GRPOGroupedAdvantage` (advantages, in float32 as
//! Trinity computes them) and `RECPolicyLossFn` / `PPOPolicyLossFn` (loss and d loss / d log-prob,
//! in float64) on fixed rewards, masks and log-probs. Each case names the rlvr preset that must
//! give Trinity's numbers.
//!
//! One difference is held, not hidden: Trinity's `masked_mean` divides by
//! `count + 1e-8`, rlvr's normaliser by `count` (DESIGN.md section 4). So Trinity's loss is rlvr's with each
//! row's term scaled by `n/(n + 1e-8)`, where n is the update's token count (token mean) or the
//! row's length (sequence mean of token means): a relative change of 1e-8/n. The test applies that
//! factor per row and then asks for 1e-10.

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
    preset: String,
    set: serde_json::Map<String, serde_json::Value>,
    policy_loss_args: serde_json::Map<String, serde_json::Value>,
    rewards: Vec<f64>,
    groups: Vec<usize>,
    advantages: Vec<f64>,
    mask: Vec<Vec<f64>>,
    logp: Vec<Vec<f64>>,
    logp_old: Vec<Vec<f64>>,
    loss: f64,
    grad_logp: Vec<Vec<f64>>,
}

fn fixture() -> Fixture {
    serde_json::from_str(include_str!("../reference/trinity.json")).expect("trinity.json parses")
}

fn row(v: &[f64]) -> Tensor {
    Tensor::from_vec(v.to_vec(), (1, v.len()), &Device::Cpu).unwrap()
}

/// Trinity's `masked_mean` denominator epsilon (trinity/algorithm/utils.py).
const MASKED_MEAN_EPS: f64 = 1e-8;

struct Step {
    /// rlvr's advantages from the case's rewards.
    advantages: Vec<f64>,
    /// rlvr's loss with each row's term scaled by Trinity's `n/(n + 1e-8)`.
    loss_as_trinity: f64,
    /// rlvr's d loss / d logp, each row scaled the same way.
    grad_as_trinity: Vec<Vec<f64>>,
    /// rlvr's loss as it is.
    loss: f64,
}

/// rlvr's advantages for the case, and its loss and ℓ-gradient on Trinity's advantages (so the
/// loss comparison does not inherit Trinity's float32 advantages' rounding), row by row (the
/// loss is linear in the rows' terms: Σ_i w_i Σ_t m_it L_it).
fn rlvr_step(case: &Case) -> Step {
    let mut cfg = serde_json::Map::new();
    cfg.insert("preset".into(), case.preset.clone().into());
    cfg.extend(case.set.clone());
    let cfg: AlgorithmConfig = serde_json::from_value(cfg.into()).unwrap();
    let alg = cfg
        .resolve()
        .unwrap_or_else(|e| panic!("{}: {e}", case.preset));
    let rewards: Vec<Option<f64>> = case.rewards.iter().map(|&r| Some(r)).collect();
    let adv = compute_advantages(&rewards, &case.groups, &alg, 0).unwrap();
    let t = case.mask[0].len();
    let lens: Vec<f64> = case.mask.iter().map(|m| m.iter().sum()).collect();
    let rows: Vec<RowInfo> = lens
        .iter()
        .enumerate()
        .map(|(i, &len)| RowInfo {
            completion_tokens: len as usize,
            truncated: len as usize == t,
            in_normaliser: adv.in_normaliser[i],
        })
        .collect();
    let norm = UpdateNormaliser::new(&alg, &rows, t).unwrap();
    let seq_mean =
        case.policy_loss_args.get("clip_mode") == Some(&serde_json::Value::from("gspo-one-side"));
    let total: f64 = lens.iter().sum();
    let mut step = Step {
        advantages: adv.values,
        loss_as_trinity: 0.0,
        grad_as_trinity: Vec::new(),
        loss: 0.0,
    };
    for (i, &len) in lens.iter().enumerate() {
        let n = if seq_mean { len } else { total };
        let scale = n / (n + MASKED_MEAN_EPS);
        let logp = Var::from_tensor(&row(&case.logp[i])).unwrap();
        let old = row(&case.logp_old[i]);
        let mask = row(&case.mask[i]);
        let a = Tensor::new(&case.advantages[i..=i], &Device::Cpu).unwrap();
        let (l, _) = policy_loss(
            &alg,
            &LossInputs {
                logp: logp.as_tensor(),
                logp_behaviour: &old,
                logp_ref: None,
                entropy: None,
                mask: &mask,
                advantages: &a,
                row_weights: &norm.range(i..i + 1),
                is_weights: None,
            },
        )
        .unwrap();
        let li = l.to_scalar::<f64>().unwrap();
        step.loss += li;
        step.loss_as_trinity += li * scale;
        let g = l.backward().unwrap();
        let gi = g
            .get(logp.as_tensor())
            .map(|g| g.to_vec2::<f64>().unwrap().remove(0))
            .unwrap_or_else(|| vec![0.0; t]);
        step.grad_as_trinity
            .push(gi.iter().map(|g| g * scale).collect());
    }
    step
}

fn rel(got: f64, want: f64) -> f64 {
    (got - want).abs() / (1e-12 + want.abs())
}

#[test]
fn presets_equal_trinity_rft_classes() {
    let fx = fixture();
    assert!(fx.source.starts_with("Trinity-RFT 0.6.0"), "{}", fx.source);
    let names: Vec<&str> = fx.cases.iter().map(|c| c.preset.as_str()).collect();
    for p in [
        "reinforce",
        "rec_oneside_nois",
        "rec_oneside_is",
        "rec_twoside_nois",
        "rec_twoside_is",
        "rec_ring_nois",
        "rec_ring_is",
        "rec_gspo_nois",
        "rec_gspo_is",
        "opmd",
        "asymre",
        "red_weight",
        "grpo_rec",
        "grpo_verl",
    ] {
        assert!(names.contains(&p), "no Trinity case for {p}");
    }
    for case in &fx.cases {
        let step = rlvr_step(case);
        // Trinity's advantages are float32: equal to rlvr's f64 ones within float32 rounding
        // (exact for the no-std presets, whose dyadic rewards and means are exact in float32).
        for (i, (&g, &w)) in step.advantages.iter().zip(&case.advantages).enumerate() {
            assert!(
                (g - w).abs() <= 2e-7 * (1.0 + w.abs()),
                "{} A[{i}]: {g} vs Trinity {w}",
                case.preset
            );
        }
        assert!(
            rel(step.loss_as_trinity, case.loss) < 1e-10,
            "{}: loss {} (as Trinity) vs Trinity {}",
            case.preset,
            step.loss_as_trinity,
            case.loss
        );
        for (i, (gr, wr)) in step.grad_as_trinity.iter().zip(&case.grad_logp).enumerate() {
            for (j, (&g, &w)) in gr.iter().zip(wr).enumerate() {
                assert!(
                    (g - w).abs() <= 1e-10 * (1e-3 + w.abs()),
                    "{} d loss/d logp[{i},{j}]: {g} vs Trinity {w}",
                    case.preset
                );
            }
        }
    }
}

/// The no-std presets' advantages are exact in float32 (dyadic rewards, dyadic means), so there
/// rlvr equals Trinity bit for bit; the std presets differ from Trinity only by float32 rounding.
#[test]
fn trinity_advantages_exact_where_float32_is_exact() {
    let fx = fixture();
    let mut exact = 0;
    for case in fx
        .cases
        .iter()
        .filter(|c| !matches!(c.preset.as_str(), "grpo_rec" | "grpo_verl"))
    {
        assert_eq!(
            rlvr_step(case).advantages,
            case.advantages,
            "{}",
            case.preset
        );
        exact += 1;
    }
    assert_eq!(exact, 12);
    // grpo_verl: sample std of [1, 0, 0, 1] = sqrt(1/3); A = 0.5/(std + 1e-6) in f64 vs Trinity's
    // float32, which differ by float32 rounding (~1e-8 here) and no more.
    let verl = fx.cases.iter().find(|c| c.preset == "grpo_verl").unwrap();
    let want = 0.5 / ((1.0f64 / 3.0).sqrt() + 1e-6);
    let got = rlvr_step(verl).advantages[0];
    assert!((got - want).abs() < 1e-15, "{got} vs {want}");
    let d = (verl.advantages[0] - want).abs();
    assert!(
        d < 1e-7,
        "Trinity's float32 A {} vs {want}",
        verl.advantages[0]
    );
}

/// The `count + 1e-8` denominator is the only difference in the loss: without the correction rlvr's
/// loss differs from Trinity's by about 1e-8/n relative (n ≈ 43 tokens), above the 1e-10 the test
/// asks for, and with it the difference vanishes.
#[test]
fn trinity_masked_mean_epsilon_is_the_named_difference() {
    let fx = fixture();
    let case = fx.cases.iter().find(|c| c.preset == "reinforce").unwrap();
    let step = rlvr_step(case);
    let n: f64 = case.mask.iter().flatten().sum();
    let r = (step.loss - case.loss) / case.loss;
    assert!(
        (r - MASKED_MEAN_EPS / n).abs() < 1e-12,
        "relative difference {r}, expected 1e-8/{n}"
    );
    assert!(rel(step.loss_as_trinity, case.loss) < 1e-13);
}
