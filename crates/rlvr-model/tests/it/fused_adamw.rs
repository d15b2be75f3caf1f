//! The fused in-place AdamW update (CPU, f32) equals torch.optim.AdamW's formula computed on the
//! host in f64, over several steps with parameters lacking a gradient left untouched; the
//! candle-op path (taken for f64 parameters) gives the same result.

use candle_core::{DType, Device, Tensor, Var};
use rlvr_model::optim::{AdamW, AdamWConfig};

fn seq(len: usize, seed: u64) -> Vec<f64> {
    let mut s = seed;
    (0..len)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (s >> 40) as f64 / (1u64 << 24) as f64 - 0.5
        })
        .collect()
}

/// Host reference: `steps` AdamW updates of `theta` with gradient `grad(t)`.
fn reference(theta: &[f64], grads: &[Vec<f64>], c: AdamWConfig, lr: f64) -> Vec<f64> {
    let mut th = theta.to_vec();
    let (mut m, mut v) = (vec![0f64; th.len()], vec![0f64; th.len()]);
    for (t, g) in grads.iter().enumerate() {
        let t = t as i32 + 1;
        let (bc1, bc2) = (1.0 - c.beta1.powi(t), 1.0 - c.beta2.powi(t));
        for i in 0..th.len() {
            m[i] = c.beta1 * m[i] + (1.0 - c.beta1) * g[i];
            v[i] = c.beta2 * v[i] + (1.0 - c.beta2) * g[i] * g[i];
            th[i] = th[i] * (1.0 - lr * c.weight_decay)
                - lr * (m[i] / bc1) / ((v[i] / bc2).sqrt() + c.eps);
        }
    }
    th
}

#[test]
fn fused_adamw_matches_reference_over_steps() {
    let c = AdamWConfig {
        lr: 1e-2,
        weight_decay: 0.1,
        ..Default::default()
    };
    let lr = 3e-2;
    // Large enough for several parallel chunks, with a ragged tail.
    let n = 100_003;
    let theta = seq(n, 1);
    let grads: Vec<Vec<f64>> = (0..4).map(|s| seq(n, 10 + s)).collect();
    let want = reference(&theta, &grads, c, lr);
    for dtype in [DType::F32, DType::F64] {
        let dev = Device::Cpu;
        let p = Var::from_tensor(
            &Tensor::from_vec(theta.clone(), n, &dev)
                .unwrap()
                .to_dtype(dtype)
                .unwrap(),
        )
        .unwrap();
        // A second parameter that never gets a gradient.
        let q = Var::from_tensor(&Tensor::ones(7, dtype, &dev).unwrap()).unwrap();
        let mut opt = AdamW::new(vec![p.clone(), q.clone()], c).unwrap();
        for g in &grads {
            // loss = Σ θ·g gives ∂loss/∂θ = g.
            let gt = Tensor::from_vec(g.clone(), n, &dev)
                .unwrap()
                .to_dtype(dtype)
                .unwrap();
            let loss = (p.as_tensor() * &gt).unwrap().sum_all().unwrap();
            let grads = loss.backward().unwrap();
            opt.step(&grads, lr).unwrap();
        }
        assert_eq!(opt.step, 4);
        let got: Vec<f64> = p
            .as_tensor()
            .to_dtype(DType::F64)
            .unwrap()
            .to_vec1()
            .unwrap();
        // Both paths compute in f32 (the moments are f32 whatever the parameter dtype).
        let tol = 2e-6;
        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
            assert!((a - b).abs() < tol, "{dtype:?} θ[{i}]: {a} vs {b}");
        }
        let qv: Vec<f64> = q
            .as_tensor()
            .to_dtype(DType::F64)
            .unwrap()
            .to_vec1()
            .unwrap();
        assert!(qv.iter().all(|&x| x == 1.0));
        let (m, v) = opt.moments();
        assert_eq!(
            m[1].to_dtype(DType::F64)
                .unwrap()
                .sum_all()
                .unwrap()
                .to_scalar::<f64>()
                .unwrap(),
            0.0
        );
        assert!(
            v[0].to_dtype(DType::F64)
                .unwrap()
                .sum_all()
                .unwrap()
                .to_scalar::<f64>()
                .unwrap()
                > 0.0
        );
    }
}
