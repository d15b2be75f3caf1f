//! The fused lm_head + log-prob/entropy op (`LmHeadLogprobOp`) equals the unfused reference
//! (`Model::lm_head`-style `h·Wᵀ`, then `Model::logprobs_unfused`) in value and in gradient
//! w.r.t. both the hidden states and the head weight, at several temperatures, loss weightings
//! and shapes (vocabulary and row counts that are not multiples of the op's chunk sizes), with the
//! logits kept for the backward or recomputed, and a tied model's embedding gradient is the same
//! through either head (the model's training forward keeps the logits).

use candle_core::{DType, Device, Tensor, Var};
use rlvr_kernels::LmHeadLogprobOp;
use rlvr_model::ops::linear;
use rlvr_model::Model;

fn uniform(len: usize, seed: u64, scale: f32) -> Vec<f32> {
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

struct Out {
    lp: Vec<f32>,
    ent: Option<Vec<f32>>,
    gh: Vec<f32>,
    gw: Vec<f32>,
}

/// `fused`: None = unfused reference; Some(stash) = the fused op, keeping the logits or not.
/// `softcap`: Gemma 2's final-logit softcapping (the reference applies `cap · tanh(z / cap)` to
/// the logits with candle's ops before `Model::logprobs_unfused`).
#[allow(clippy::too_many_arguments)]
fn run(
    fused: Option<bool>,
    softcap: Option<f32>,
    (n, hd, v): (usize, usize, usize),
    h: &[f32],
    w: &[f32],
    targets: &[u32],
    temperature: f64,
    with_entropy: bool,
) -> Out {
    let dev = Device::Cpu;
    let hv = Var::from_tensor(&Tensor::from_vec(h.to_vec(), (n, hd), &dev).unwrap()).unwrap();
    let wv = Var::from_tensor(&Tensor::from_vec(w.to_vec(), (v, hd), &dev).unwrap()).unwrap();
    let (lp, ent) = if let Some(stash) = fused {
        let op = LmHeadLogprobOp {
            targets: std::sync::Arc::new(targets.to_vec()),
            inv_t: (1.0 / temperature) as f32,
            entropy: with_entropy,
            stash: stash.then(Default::default),
            softcap,
        };
        let out = hv.as_tensor().apply_op2(wv.as_tensor(), op).unwrap();
        let lp = out.narrow(1, 0, 1).unwrap().squeeze(1).unwrap();
        let e = with_entropy.then(|| out.narrow(1, 1, 1).unwrap().squeeze(1).unwrap());
        (lp, e)
    } else {
        let logits = linear(&hv.as_tensor().unsqueeze(0).unwrap(), wv.as_tensor(), None).unwrap();
        let logits = match softcap {
            None => logits,
            Some(cap) => ((logits / cap as f64).unwrap().tanh().unwrap() * cap as f64).unwrap(),
        };
        let tt = Tensor::from_vec(targets.to_vec(), (1, n), &dev).unwrap();
        let (lp, e) = Model::logprobs_unfused(&logits, &tt, temperature, with_entropy).unwrap();
        (lp.squeeze(0).unwrap(), e.map(|e| e.squeeze(0).unwrap()))
    };
    let wl = Tensor::from_vec(
        (0..n).map(|i| (i % 4) as f32 - 1.5).collect::<Vec<_>>(),
        n,
        &dev,
    )
    .unwrap();
    let mut loss = (&lp * &wl).unwrap().sum_all().unwrap();
    if let Some(e) = &ent {
        loss = (loss + (e * 0.3).unwrap().sum_all().unwrap()).unwrap();
    }
    let g = loss.backward().unwrap();
    let flat = |t: &Tensor| -> Vec<f32> { t.flatten_all().unwrap().to_vec1().unwrap() };
    Out {
        lp: flat(&lp),
        ent: ent.as_ref().map(flat),
        gh: flat(g.get(hv.as_tensor()).unwrap()),
        gw: flat(g.get(wv.as_tensor()).unwrap()),
    }
}

fn assert_close(what: &str, a: &[f32], b: &[f32], tol_rel_max: f32) {
    assert_eq!(a.len(), b.len());
    let max = b.iter().fold(0f32, |m, x| m.max(x.abs()));
    assert!(max > 0.0, "{what}: reference is all zero");
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!(
            (x - y).abs() <= 1e-6 + tol_rel_max * max,
            "{what}[{i}]: fused {x} vs unfused {y} (max |ref| {max})"
        );
    }
}

#[test]
fn fused_lm_head_matches_unfused_in_value_and_gradients() {
    // (rows, hidden, vocab): one block and one chunk; several of each with ragged tails.
    let shapes = [(5, 16, 300), (37, 24, 1000), (600, 8, 700)];
    let cases = [(1.0, true, 1u64), (0.6, true, 2), (1.7, false, 3)];
    for &(n, hd, v) in &shapes {
        for &(temperature, with_entropy, seed) in &cases {
            let h = uniform(n * hd, seed, 4.0);
            let w = uniform(v * hd, seed + 100, 2.0);
            let targets: Vec<u32> = (0..n).map(|i| ((i * 389 + 7) % v) as u32).collect();
            let shape = (n, hd, v);
            let u = run(
                None,
                None,
                shape,
                &h,
                &w,
                &targets,
                temperature,
                with_entropy,
            );
            for stash in [false, true] {
                let f = run(
                    Some(stash),
                    None,
                    shape,
                    &h,
                    &w,
                    &targets,
                    temperature,
                    with_entropy,
                );
                let ctx = format!(
                    "shape {shape:?}, T {temperature}, entropy {with_entropy}, stash {stash}"
                );
                for (a, b) in f.lp.iter().zip(&u.lp) {
                    assert!((a - b).abs() < 2e-5, "{ctx}: logprob {a} vs {b}");
                }
                if with_entropy {
                    for (a, b) in f.ent.as_ref().unwrap().iter().zip(u.ent.as_ref().unwrap()) {
                        assert!((a - b).abs() < 2e-5, "{ctx}: entropy {a} vs {b}");
                    }
                }
                assert_close(&format!("{ctx}: grad h"), &f.gh, &u.gh, 1e-4);
                assert_close(&format!("{ctx}: grad W"), &f.gw, &u.gw, 1e-4);
            }
        }
    }
}

/// Gemma 2's final-logit softcapping in the fused op: values and both gradients against the
/// reference (candle's `cap · tanh(z / cap)` then the unfused head), with logits both inside the
/// cap's linear range and well into its saturation (|z| up to ~3·cap, where 1 − tanh² ≈ 0.01).
#[test]
fn softcapped_fused_lm_head_matches_unfused_in_value_and_gradients() {
    let shapes = [(5, 16, 300), (37, 24, 1000), (600, 8, 700)];
    let cases = [
        (1.0, true, 4u64, 30f32),
        (0.6, true, 5, 2.0),
        (1.7, false, 6, 5.0),
    ];
    for &(n, hd, v) in &shapes {
        for &(temperature, with_entropy, seed, cap) in &cases {
            let h = uniform(n * hd, seed, 4.0);
            let w = uniform(v * hd, seed + 100, 2.0);
            let targets: Vec<u32> = (0..n).map(|i| ((i * 389 + 7) % v) as u32).collect();
            let shape = (n, hd, v);
            let sc = Some(cap);
            let u = run(None, sc, shape, &h, &w, &targets, temperature, with_entropy);
            for stash in [false, true] {
                let f = run(
                    Some(stash),
                    sc,
                    shape,
                    &h,
                    &w,
                    &targets,
                    temperature,
                    with_entropy,
                );
                let ctx = format!(
                    "shape {shape:?}, T {temperature}, cap {cap}, entropy {with_entropy}, \
                     stash {stash}"
                );
                for (a, b) in f.lp.iter().zip(&u.lp) {
                    assert!((a - b).abs() < 2e-5, "{ctx}: logprob {a} vs {b}");
                }
                if with_entropy {
                    for (a, b) in f.ent.as_ref().unwrap().iter().zip(u.ent.as_ref().unwrap()) {
                        assert!((a - b).abs() < 2e-5, "{ctx}: entropy {a} vs {b}");
                    }
                }
                assert_close(&format!("{ctx}: grad h"), &f.gh, &u.gh, 1e-4);
                assert_close(&format!("{ctx}: grad W"), &f.gw, &u.gw, 1e-4);
            }
        }
    }
}

#[test]
fn fused_lm_head_rejects_bad_inputs() {
    let dev = Device::Cpu;
    let h = Tensor::zeros((3, 4), DType::F32, &dev).unwrap();
    let w = Tensor::zeros((10, 4), DType::F32, &dev).unwrap();
    let op = |t: Vec<u32>| LmHeadLogprobOp {
        targets: std::sync::Arc::new(t),
        inv_t: 1.0,
        entropy: false,
        stash: None,
        softcap: None,
    };
    assert!(h.apply_op2(&w, op(vec![0, 1])).is_err(), "target count");
    assert!(
        h.apply_op2(&w, op(vec![0, 1, 10])).is_err(),
        "target out of range"
    );
    let w5 = Tensor::zeros((10, 5), DType::F32, &dev).unwrap();
    assert!(
        h.apply_op2(&w5, op(vec![0, 1, 2])).is_err(),
        "hidden mismatch"
    );
    // Uniform logits: log-prob −ln V, entropy ln V.
    let out = h
        .apply_op2(
            &w,
            LmHeadLogprobOp {
                targets: std::sync::Arc::new(vec![0, 5, 9]),
                inv_t: 1.0,
                entropy: true,
                stash: None,
                softcap: None,
            },
        )
        .unwrap()
        .to_vec2::<f32>()
        .unwrap();
    for r in out {
        assert!((r[0] + 10f32.ln()).abs() < 1e-6 && (r[1] - 10f32.ln()).abs() < 1e-6);
    }
}

#[test]
fn tied_model_gradients_match_through_either_head() {
    // A tied Qwen2 fixture: the embedding receives both the lookup's and the head's gradient.
    let dir = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/qwen2_bias_tied"
    );
    let model = Model::load(std::path::Path::new(dir), DType::F32, &Device::Cpu).unwrap();
    assert!(model.var("lm_head.weight").is_none());
    let ids = vec![
        vec![0u32, 0, 5, 9, 30, 17, 4],
        vec![7, 8, 9, 10, 11, 12, 13],
    ];
    let mask = vec![vec![0u32, 0, 1, 1, 1, 1, 1], vec![1; 7]];
    let out = model
        .token_logprobs(&ids, &mask, 1, 0.8, true, true)
        .unwrap();
    let loss_fused = (out.logprobs.sum_all().unwrap()
        + (out.entropy.unwrap() * 0.5).unwrap().sum_all().unwrap())
    .unwrap();
    let g_fused = loss_fused.backward().unwrap();
    // Reference: same hidden states through Model::lm_head + Model::logprobs_unfused.
    let ids_t = Tensor::new(ids.clone(), &Device::Cpu).unwrap();
    let pos = rlvr_model::model::position_ids(&mask);
    let bias = model.attention_bias(&mask, 0, 7).unwrap();
    let hidden = model
        .forward_hidden(&ids_t, &pos, &bias, None, true)
        .unwrap();
    let logits = model
        .lm_head(&hidden.narrow(1, 1, 5).unwrap(), true)
        .unwrap();
    let targets = ids_t.narrow(1, 2, 5).unwrap().contiguous().unwrap();
    let (lp, ent) = Model::logprobs_unfused(&logits, &targets, 0.8, true).unwrap();
    let loss_ref =
        (lp.sum_all().unwrap() + (ent.unwrap() * 0.5).unwrap().sum_all().unwrap()).unwrap();
    let g_ref = loss_ref.backward().unwrap();
    let (a, b) = (
        loss_fused.to_scalar::<f32>().unwrap(),
        loss_ref.to_scalar::<f32>().unwrap(),
    );
    assert!((a - b).abs() < 1e-4 * b.abs().max(1.0), "loss {a} vs {b}");
    for (name, var) in model.named_vars() {
        let gf: Vec<f32> = g_fused
            .get(var.as_tensor())
            .unwrap_or_else(|| panic!("{name}: no gradient through the fused head"))
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        let gr: Vec<f32> = g_ref
            .get(var.as_tensor())
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        assert_close(&name, &gf, &gr, 1e-4);
    }
}

/// `token_logprobs_at` equals `token_logprobs` at the listed positions, in value and in every
/// parameter's gradient of a weighted sum, and is exactly 0 after each row's last position; for
/// the fused CPU head (f32) and the unfused path (f64, also what CUDA runs).
#[test]
fn logprobs_at_positions_match_the_full_forward() {
    let dir = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/qwen2_bias_tied"
    );
    for dtype in [DType::F32, DType::F64] {
        let model = Model::load(std::path::Path::new(dir), dtype, &Device::Cpu).unwrap();
        let ids = vec![
            vec![3u32, 5, 9, 30, 17, 4, 0, 0],
            vec![7, 8, 9, 10, 11, 12, 13, 14],
            vec![2, 6, 1, 0, 0, 0, 0, 0],
        ];
        let mask = vec![
            vec![1u32, 1, 1, 1, 1, 1, 0, 0],
            vec![1; 8],
            vec![1, 1, 1, 0, 0, 0, 0, 0],
        ];
        let start = 1;
        // Positions relative to start (scored positions 0..6): uneven lengths, one row empty-ish.
        let at: Vec<Vec<usize>> = vec![vec![1, 2, 3, 4], vec![0, 1, 2, 3, 4, 5], vec![1]];
        let w: Vec<f64> = (0..18).map(|i| 0.3 + 0.1 * i as f64).collect();
        let weighted = |lp: &Tensor, pick: &dyn Fn(usize, usize) -> Option<usize>| -> Tensor {
            let (b, c) = lp.dims2().unwrap();
            let mut wt = vec![0f64; b * c];
            for r in 0..b {
                for j in 0..c {
                    if let Some(k) = pick(r, j) {
                        wt[r * c + j] = w[k];
                    }
                }
            }
            let wt = Tensor::from_vec(wt, (b, c), &Device::Cpu)
                .unwrap()
                .to_dtype(lp.dtype())
                .unwrap();
            (lp * wt).unwrap().sum_all().unwrap()
        };
        let full = model
            .token_logprobs(&ids, &mask, start, 0.9, true, true)
            .unwrap();
        let part = model
            .token_logprobs_at(&ids, &mask, start, &at, 0.9, true, true)
            .unwrap();
        assert_eq!(part.logprobs.dims(), &[3, 6]);
        let f64s =
            |t: &Tensor| -> Vec<Vec<f64>> { t.to_dtype(DType::F64).unwrap().to_vec2().unwrap() };
        let (fl, pl) = (f64s(&full.logprobs), f64s(&part.logprobs));
        let (fe, pe) = (
            f64s(full.entropy.as_ref().unwrap()),
            f64s(part.entropy.as_ref().unwrap()),
        );
        let mut k = 0;
        let mut index = vec![vec![None; 6]; 3];
        for (r, row) in at.iter().enumerate() {
            for (j, &p) in row.iter().enumerate() {
                assert!((fl[r][p] - pl[r][j]).abs() < 1e-6, "{dtype:?} lp r{r} p{p}");
                assert!(
                    (fe[r][p] - pe[r][j]).abs() < 1e-6,
                    "{dtype:?} entropy r{r} p{p}"
                );
                index[r][p] = Some(k);
                k += 1;
            }
            for j in row.len()..6 {
                assert_eq!(
                    (pl[r][j], pe[r][j]),
                    (0.0, 0.0),
                    "{dtype:?} padding r{r} j{j}"
                );
            }
        }
        let mut kk = 0;
        let mut index_part = vec![vec![None; 6]; 3];
        for (r, row) in at.iter().enumerate() {
            for slot in index_part[r].iter_mut().take(row.len()) {
                *slot = Some(kk);
                kk += 1;
            }
        }
        let g_full = weighted(&full.logprobs, &|r, j| index[r][j])
            .backward()
            .unwrap();
        let g_part = weighted(&part.logprobs, &|r, j| index_part[r][j])
            .backward()
            .unwrap();
        let grad = |g: &candle_core::backprop::GradStore, v: &candle_core::Var| -> Vec<f32> {
            let g = g.get(v.as_tensor()).unwrap().to_dtype(DType::F32).unwrap();
            g.flatten_all().unwrap().to_vec1().unwrap()
        };
        for (name, var) in model.named_vars() {
            let (a, b) = (grad(&g_full, var), grad(&g_part, var));
            assert_close(&format!("{dtype:?} {name}"), &b, &a, 1e-4);
        }
    }
}
