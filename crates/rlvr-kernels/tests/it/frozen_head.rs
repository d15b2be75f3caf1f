//! `FrozenHeadLogprobOp` (LoRA's frozen lm_head): the same values as `LmHeadLogprobOp`, the same
//! `∂h` bit for bit, and no `∂W`; with and without a final-logit softcap.

use candle_core::{Device, Tensor, Var};
use rlvr_kernels::{FrozenHeadLogprobOp, LmHeadLogprobOp, LogitStash};

fn check(n: usize, hd: usize, v: usize, stash: bool, softcap: Option<f32>) {
    let dev = Device::Cpu;
    let h = Var::from_tensor(&Tensor::randn(0f32, 1.0, (n, hd), &dev).unwrap()).unwrap();
    let w = Var::from_tensor(&Tensor::randn(0f32, 0.3, (v, hd), &dev).unwrap()).unwrap();
    let targets: Vec<u32> = (0..n).map(|i| ((i * 7919) % v) as u32).collect();
    let op = || LmHeadLogprobOp {
        targets: std::sync::Arc::new(targets.clone()),
        inv_t: 1.0 / 0.7,
        entropy: true,
        stash: if stash {
            LogitStash::within(n, v, 1 << 30)
        } else {
            None
        },
        softcap,
    };
    let full = h.as_tensor().apply_op2(w.as_tensor(), op()).unwrap();
    let frozen = h
        .as_tensor()
        .apply_op2(w.as_tensor(), FrozenHeadLogprobOp(op()))
        .unwrap();
    let a = full.to_vec2::<f32>().unwrap();
    let b = frozen.to_vec2::<f32>().unwrap();
    assert_eq!(a, b, "forward values");
    // A loss using both columns: Σ ℓ·c₁ + Σ H·c₂.
    let wts = Tensor::randn(0f32, 1.0, (n, 2), &dev).unwrap();
    let gf = (full * &wts)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    let gz = (frozen * &wts)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    let dh_full = gf.get(h.as_tensor()).unwrap().to_vec2::<f32>().unwrap();
    let dh_frozen = gz.get(h.as_tensor()).unwrap().to_vec2::<f32>().unwrap();
    assert_eq!(dh_full, dh_frozen, "∂h bit-identical");
    assert!(gf.get(w.as_tensor()).is_some());
    assert!(gz.get(w.as_tensor()).is_none(), "no ∂W for a frozen head");
}

#[test]
fn frozen_head_gives_the_same_values_and_hidden_gradient_without_a_weight_gradient() {
    // Vocabulary sizes not multiples of the 256-row chunk, several chunk groups; with and
    // without the logit stash.
    for &(n, hd, v) in &[(5, 16, 300), (33, 24, 2053), (3, 8, 100)] {
        for softcap in [None, Some(3.0)] {
            check(n, hd, v, false, softcap);
            check(n, hd, v, true, softcap);
        }
    }
}
