//! Checks against `tests/reference/reference.json`, produced by `tests/reference/make_reference.py`
//! (NumPy advantages, PyTorch autograd losses and gradients, written independently from the formulas).

// 0.7071 is DESIGN.md section 5's rounded hand value, on purpose.
#![allow(clippy::approx_constant)]

use candle_core::{Device, Tensor, Var};
use rlvr_algo::{
    compute_advantages, policy_loss, AlgorithmConfig, LossInputs, RowInfo, UpdateNormaliser,
};
use serde::Deserialize;

#[derive(Deserialize)]
struct Fixture {
    advantage_cases: Vec<AdvCase>,
    loss_batch: Batch,
    loss_cases: Vec<LossCase>,
}

#[derive(Deserialize)]
struct AdvCase {
    name: String,
    rewards: Vec<Option<f64>>,
    groups: Vec<String>,
    config: AlgorithmConfig,
    values: Vec<f64>,
    in_normaliser: Vec<bool>,
}

#[derive(Deserialize)]
#[allow(non_snake_case, dead_code)]
struct Batch {
    B: usize,
    T: usize,
    mask: Vec<Vec<f64>>,
    logp: Vec<Vec<f64>>,
    logp_old: Vec<Vec<f64>>,
    logp_ref: Vec<Vec<f64>>,
    entropy: Vec<Vec<f64>>,
    advantages: Vec<f64>,
    in_normaliser: Vec<bool>,
    truncated: Vec<bool>,
    max_new_tokens: usize,
}

#[derive(Deserialize)]
struct LossCase {
    name: String,
    config: AlgorithmConfig,
    loss: f64,
    grad_logp: Vec<Vec<f64>>,
    grad_advantages: Vec<f64>,
    grad_entropy: Vec<Vec<f64>>,
}

fn fixture() -> Fixture {
    let text = include_str!("../reference/reference.json");
    serde_json::from_str(text).expect("reference.json parses")
}

fn t2(v: &[Vec<f64>]) -> Tensor {
    let (b, t) = (v.len(), v[0].len());
    Tensor::from_vec(v.concat(), (b, t), &Device::Cpu).unwrap()
}

fn close(got: f64, want: f64, tol: f64) -> bool {
    (got - want).abs() <= tol * (1.0 + want.abs())
}

#[test]
fn advantages_match_reference() {
    let fx = fixture();
    assert!(fx.advantage_cases.len() >= 14);
    for case in &fx.advantage_cases {
        let alg = case
            .config
            .resolve()
            .unwrap_or_else(|e| panic!("{}: {e}", case.name));
        let adv = compute_advantages(&case.rewards, &case.groups, &alg, 0).unwrap();
        for (i, (&got, &want)) in adv.values.iter().zip(&case.values).enumerate() {
            assert!(
                close(got, want, 1e-12),
                "{} row {i}: got {got}, want {want}",
                case.name
            );
        }
        assert_eq!(adv.in_normaliser, case.in_normaliser, "{}", case.name);
    }
}

#[test]
fn design_section5_hand_values() {
    // DESIGN.md section 5: binary rewards, Bessel std, eps 1e-6.
    let fx = fixture();
    let get = |name: &str| {
        let c = fx.advantage_cases.iter().find(|c| c.name == name).unwrap();
        let alg = c.config.resolve().unwrap();
        compute_advantages(&c.rewards, &c.groups, &alg, 0)
            .unwrap()
            .values
    };
    let r4 = |x: f64| (x * 1e4).round() / 1e4;
    let v = get("design_1_of_8");
    assert_eq!((r4(v[0]), r4(v[1])), (2.4749, -0.3536));
    let v = get("design_3_of_8");
    assert_eq!((r4(v[0]), r4(v[7])), (1.2076, -0.7246));
    let v = get("design_pair_sample");
    assert_eq!((r4(v[0]), r4(v[1])), (0.7071, -0.7071));
    let v = get("design_pair_population");
    assert_eq!((r4(v[0]), r4(v[1])), (1.0, -1.0));
}

#[test]
fn losses_and_gradients_match_pytorch() {
    let fx = fixture();
    let b = &fx.loss_batch;
    assert!(fx.loss_cases.len() >= 36);
    for case in &fx.loss_cases {
        let alg = case
            .config
            .resolve()
            .unwrap_or_else(|e| panic!("{}: {e}", case.name));
        let mask = t2(&b.mask);
        let rows: Vec<RowInfo> = (0..b.B)
            .map(|i| RowInfo {
                completion_tokens: b.mask[i].iter().sum::<f64>() as usize,
                truncated: b.truncated[i],
                in_normaliser: b.in_normaliser[i],
            })
            .collect();
        let norm = UpdateNormaliser::new(&alg, &rows, b.max_new_tokens).unwrap();
        let logp = Var::from_tensor(&t2(&b.logp)).unwrap();
        let adv =
            Var::from_tensor(&Tensor::new(b.advantages.as_slice(), &Device::Cpu).unwrap()).unwrap();
        let ent = Var::from_tensor(&t2(&b.entropy)).unwrap();
        let (old, rf) = (t2(&b.logp_old), t2(&b.logp_ref));
        let weights = norm.range(0..b.B);
        let inputs = LossInputs {
            logp: logp.as_tensor(),
            logp_behaviour: &old,
            logp_ref: Some(&rf),
            entropy: Some(ent.as_tensor()),
            mask: &mask,
            advantages: adv.as_tensor(),
            row_weights: &weights,
            is_weights: None,
        };
        let (loss, stats) = policy_loss(&alg, &inputs).unwrap();
        let got = loss.to_scalar::<f64>().unwrap();
        assert!(
            close(got, case.loss, 1e-10),
            "{}: loss {got} vs {}",
            case.name,
            case.loss
        );
        assert!(
            close(stats.loss, case.loss, 1e-10),
            "{}: stats.loss",
            case.name
        );
        let grads = loss.backward().unwrap();
        let check2 = |what: &str, var: &Var, want: &[Vec<f64>]| {
            let g = grads
                .get(var.as_tensor())
                .map(|g| g.to_vec2::<f64>().unwrap())
                .unwrap_or_else(|| vec![vec![0.0; b.T]; b.B]);
            for i in 0..b.B {
                for t in 0..b.T {
                    assert!(
                        close(g[i][t], want[i][t], 1e-9),
                        "{}: d loss/d {what}[{i},{t}] = {} vs {}",
                        case.name,
                        g[i][t],
                        want[i][t]
                    );
                }
            }
        };
        check2("logp", &logp, &case.grad_logp);
        check2("entropy", &ent, &case.grad_entropy);
        let ga = grads
            .get(adv.as_tensor())
            .map(|g| g.to_vec1::<f64>().unwrap())
            .unwrap_or_else(|| vec![0.0; b.B]);
        for (i, (&got, &want)) in ga.iter().zip(&case.grad_advantages).enumerate() {
            assert!(
                close(got, want, 1e-9),
                "{}: d loss/d A[{i}] = {got} vs {want}",
                case.name
            );
        }
    }
}
