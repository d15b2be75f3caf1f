//! Every parallel reduction of the kernels sums in an order fixed by the data: the fused lm_head's
//! values and gradients (w.r.t. the hidden states and the head weight), with and without the
//! logit stash, are bit-identical in rayon pools of 1, 2 and 4 threads at the Qwen2.5 vocabulary
//! size (151936: 594 vocabulary chunks, so the backward's ∂h sum spans many tasks; a tiny
//! vocabulary fits one chunk and would hide an order that depends on work stealing).

use std::sync::Arc;

use candle_core::{Device, Tensor, Var};
use rlvr_kernels::{LmHeadLogprobOp, LogitStash};

const VOCAB: usize = 151_936;

fn data(len: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut s = seed;
    (0..len)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * scale
        })
        .collect()
}

/// (log-probs and entropies `[N, 2]`, ∂h, ∂W) of a weighted loss of the fused head.
fn run(n: usize, hd: usize, stash: bool, softcap: Option<f32>) -> (Vec<u32>, Vec<u32>, Vec<u32>) {
    let dev = Device::Cpu;
    let h =
        Var::from_tensor(&Tensor::from_vec(data(n * hd, 1, 2.0), (n, hd), &dev).unwrap()).unwrap();
    let w =
        Var::from_tensor(&Tensor::from_vec(data(VOCAB * hd, 2, 0.5), (VOCAB, hd), &dev).unwrap())
            .unwrap();
    let targets: Vec<u32> = (0..n).map(|i| ((i * 7919 + 13) % VOCAB) as u32).collect();
    let op = LmHeadLogprobOp {
        targets: Arc::new(targets),
        inv_t: 1.0 / 0.7,
        entropy: true,
        stash: if stash {
            LogitStash::within(n, VOCAB, usize::MAX)
        } else {
            None
        },
        softcap,
    };
    let out = h.as_tensor().apply_op2(w.as_tensor(), op).unwrap();
    let wl: Vec<f32> = (0..n * 2)
        .map(|i| {
            if i % 2 == 0 {
                (i % 5) as f32 - 2.0
            } else {
                0.1
            }
        })
        .collect();
    let wl = Tensor::from_vec(wl, (n, 2), &dev).unwrap();
    let loss = (&out * &wl).unwrap().sum_all().unwrap();
    let g = loss.backward().unwrap();
    let bits = |t: &Tensor| -> Vec<u32> {
        t.flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap()
            .iter()
            .map(|x| x.to_bits())
            .collect()
    };
    (
        bits(&out),
        bits(g.get(h.as_tensor()).unwrap()),
        bits(g.get(w.as_tensor()).unwrap()),
    )
}

fn check(n: usize, hd: usize, stash: bool, softcap: Option<f32>) {
    let in_pool = |threads: usize| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap()
            .install(|| run(n, hd, stash, softcap))
    };
    let one = in_pool(1);
    for threads in [2, 4] {
        let other = in_pool(threads);
        assert!(one.0 == other.0, "values differ at {threads} threads");
        assert!(one.1 == other.1, "∂h differs at {threads} threads");
        assert!(one.2 == other.2, "∂W differs at {threads} threads");
    }
}

#[test]
fn fused_head_is_bit_identical_at_1_2_and_4_threads_with_the_stash() {
    check(24, 32, true, None);
}

#[test]
fn fused_head_is_bit_identical_at_1_2_and_4_threads_recomputing() {
    check(24, 32, false, None);
}

/// The same through Gemma 2's final-logit softcap (cap 30; the logits of `run` reach ±40).
#[test]
fn softcapped_fused_head_is_bit_identical_at_1_2_and_4_threads() {
    check(24, 32, true, Some(30.0));
    check(24, 32, false, Some(30.0));
}
