//! The fused CPU log-prob/entropy op equals the unfused reference (log_softmax + gather, entropy
//! from p·log p) in value and in gradient, at several temperatures and loss weightings.

use candle_core::{DType, Device, Tensor, Var};
use rlvr_model::Model;

fn logits(b: usize, n: usize, v: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    (0..b * n * v)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 12.0
        })
        .collect()
}

#[test]
fn fused_head_matches_unfused_in_value_and_gradient() {
    let (b, n, v) = (3, 5, 1000);
    for (temperature, with_entropy, seed) in [(1.0, true, 1), (0.6, true, 2), (1.7, false, 3)] {
        let data = logits(b, n, v, seed);
        let targets: Vec<u32> = (0..b * n).map(|i| ((i * 389) % v) as u32).collect();
        let tt = Tensor::from_vec(targets.clone(), (b, n), &Device::Cpu).unwrap();
        let wl = Tensor::from_vec(
            (0..b * n).map(|i| (i % 4) as f32 - 1.5).collect::<Vec<_>>(),
            (b, n),
            &Device::Cpu,
        )
        .unwrap();
        let run = |fused: bool| -> (Vec<f32>, Option<Vec<f32>>, Vec<f32>) {
            let z =
                Var::from_tensor(&Tensor::from_vec(data.clone(), (b, n, v), &Device::Cpu).unwrap())
                    .unwrap();
            let (lp, ent) = if fused {
                let op = rlvr_kernels::TokenLogprobOp {
                    targets: std::sync::Arc::new(targets.clone()),
                    inv_t: (1.0 / temperature) as f32,
                    entropy: with_entropy,
                };
                let out = z
                    .as_tensor()
                    .reshape((b * n, v))
                    .unwrap()
                    .apply_op1(op)
                    .unwrap()
                    .reshape((b, n, 2))
                    .unwrap();
                let lp = out.narrow(2, 0, 1).unwrap().squeeze(2).unwrap();
                let e = with_entropy.then(|| out.narrow(2, 1, 1).unwrap().squeeze(2).unwrap());
                (lp, e)
            } else {
                Model::logprobs_unfused(z.as_tensor(), &tt, temperature, with_entropy).unwrap()
            };
            let mut loss = (&lp * &wl).unwrap().sum_all().unwrap();
            if let Some(e) = &ent {
                loss = (loss + (e * 0.3).unwrap().sum_all().unwrap()).unwrap();
            }
            let g = loss.backward().unwrap();
            let grad: Vec<f32> = g
                .get(z.as_tensor())
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap();
            (
                lp.flatten_all().unwrap().to_vec1().unwrap(),
                ent.map(|e| e.flatten_all().unwrap().to_vec1().unwrap()),
                grad,
            )
        };
        let (lf, ef, gf) = run(true);
        let (lu, eu, gu) = run(false);
        for (a, b) in lf.iter().zip(&lu) {
            assert!((a - b).abs() < 2e-5, "logprob {a} vs {b}");
        }
        if with_entropy {
            for (a, b) in ef.unwrap().iter().zip(&eu.unwrap()) {
                assert!((a - b).abs() < 2e-5, "entropy {a} vs {b}");
            }
        }
        let max_g = gu.iter().fold(0f32, |m, x| m.max(x.abs()));
        assert!(max_g > 1e-3);
        for (i, (a, b)) in gf.iter().zip(&gu).enumerate() {
            assert!((a - b).abs() < 1e-6 + 1e-4 * max_g, "grad[{i}] {a} vs {b}");
        }
    }
}

#[test]
fn model_logprobs_are_the_same_through_either_head() {
    let dir = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/llama_gqa_untied_rope3"
    );
    let model = Model::load(std::path::Path::new(dir), DType::F32, &Device::Cpu).unwrap();
    let ids = vec![vec![0u32, 0, 5, 9, 300, 17], vec![7, 8, 9, 10, 11, 12]];
    let mask = vec![vec![0u32, 0, 1, 1, 1, 1], vec![1; 6]];
    let out = model
        .token_logprobs(&ids, &mask, 1, 0.9, true, false)
        .unwrap();
    let ids_t = Tensor::new(ids.clone(), &Device::Cpu).unwrap();
    // Reference: the same hidden states through the unfused head.
    let pos = rlvr_model::model::position_ids(&mask);
    let bias = model.attention_bias(&mask, 0, 6).unwrap();
    let hidden = model
        .forward_hidden(&ids_t, &pos, &bias, None, false)
        .unwrap();
    let logits = model
        .lm_head(&hidden.narrow(1, 1, 4).unwrap(), false)
        .unwrap();
    let targets = ids_t.narrow(1, 2, 4).unwrap().contiguous().unwrap();
    let (lp, ent) = Model::logprobs_unfused(&logits, &targets, 0.9, true).unwrap();
    let a: Vec<Vec<f32>> = out.logprobs.to_vec2().unwrap();
    let b: Vec<Vec<f32>> = lp.to_vec2().unwrap();
    let ea: Vec<Vec<f32>> = out.entropy.unwrap().to_vec2().unwrap();
    let eb: Vec<Vec<f32>> = ent.unwrap().to_vec2().unwrap();
    for r in 0..2 {
        for t in 0..4 {
            assert!((a[r][t] - b[r][t]).abs() < 1e-5);
            assert!((ea[r][t] - eb[r][t]).abs() < 1e-5);
        }
    }
}
