//! The chunked lm_head + log-prob/entropy head (`rlvr_model::chunked`, the path off the CPU's
//! f32 fused kernel) equals the unfused reference (`h·Wᵀ`, then `Model::logprobs_unfused`) in
//! value and in the gradients w.r.t. the hidden states and the head weight, in f32 and f64, at
//! several temperatures, chunk widths (one column, ragged, whole vocabulary) and loss weightings;
//! and a tied model forced onto the chunked path on the CPU gives the fused path's log-probs,
//! entropies and every parameter's gradient.

use candle_core::{DType, Device, Tensor, Var};
use rlvr_model::chunked::{chunk_width, chunked_logprobs, force_on_cpu, CHUNK_ELEMS};
use rlvr_model::ops::linear;
use rlvr_model::Model;

fn uniform(len: usize, seed: u64, scale: f64) -> Vec<f64> {
    let mut s = seed;
    (0..len)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f64 / (1u64 << 24) as f64 - 0.5) * scale
        })
        .collect()
}

struct Out {
    lp: Vec<f64>,
    ent: Option<Vec<f64>>,
    gh: Vec<f64>,
    gw: Vec<f64>,
}

/// `chunk`: None = unfused reference; Some(c) = the chunked head with chunk width c.
#[allow(clippy::too_many_arguments)]
fn run(
    chunk: Option<usize>,
    dtype: DType,
    (n, hd, v): (usize, usize, usize),
    h: &[f64],
    w: &[f64],
    targets: &[u32],
    temperature: f64,
    with_entropy: bool,
) -> Out {
    let dev = Device::Cpu;
    let mk = |x: &[f64], s: (usize, usize)| {
        Var::from_tensor(
            &Tensor::from_vec(x.to_vec(), s, &dev)
                .unwrap()
                .to_dtype(dtype)
                .unwrap(),
        )
        .unwrap()
    };
    let (hv, wv) = (mk(h, (n, hd)), mk(w, (v, hd)));
    let (lp, ent) = match chunk {
        Some(c) => chunked_logprobs(
            hv.as_tensor(),
            wv.as_tensor(),
            targets,
            temperature,
            with_entropy,
            c,
            true,
        )
        .unwrap(),
        None => {
            let logits =
                linear(&hv.as_tensor().unsqueeze(0).unwrap(), wv.as_tensor(), None).unwrap();
            let tt = Tensor::from_vec(targets.to_vec(), (1, n), &dev).unwrap();
            let (lp, e) = Model::logprobs_unfused(&logits, &tt, temperature, with_entropy).unwrap();
            (lp.squeeze(0).unwrap(), e.map(|e| e.squeeze(0).unwrap()))
        }
    };
    assert_eq!(lp.dtype(), dtype);
    let wl = Tensor::from_vec(
        (0..n).map(|i| (i % 4) as f64 - 1.5).collect::<Vec<_>>(),
        n,
        &dev,
    )
    .unwrap()
    .to_dtype(dtype)
    .unwrap();
    let mut loss = (&lp * &wl).unwrap().sum_all().unwrap();
    if let Some(e) = &ent {
        loss = (loss + (e * 0.3).unwrap().sum_all().unwrap()).unwrap();
    }
    let g = loss.backward().unwrap();
    let flat = |t: &Tensor| -> Vec<f64> {
        t.flatten_all()
            .unwrap()
            .to_dtype(DType::F64)
            .unwrap()
            .to_vec1()
            .unwrap()
    };
    let gh = g.get(hv.as_tensor()).expect("gradient w.r.t. h");
    let gw = g.get(wv.as_tensor()).expect("gradient w.r.t. W");
    assert_eq!((gh.dtype(), gw.dtype()), (dtype, dtype));
    Out {
        lp: flat(&lp),
        ent: ent.as_ref().map(flat),
        gh: flat(gh),
        gw: flat(gw),
    }
}

fn assert_close(what: &str, a: &[f64], b: &[f64], tol: f64) {
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    let max = b.iter().fold(0f64, |m, x| m.max(x.abs()));
    assert!(max > 0.0, "{what}: reference is all zero");
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!(
            (x - y).abs() <= tol * max.max(1.0),
            "{what}[{i}]: chunked {x} vs unfused {y} (max |ref| {max})"
        );
    }
}

#[test]
fn chunked_head_matches_unfused_in_value_and_gradients() {
    let shapes = [(5, 16, 300), (37, 24, 1000)];
    let cases = [(1.0, true, 1u64), (0.6, true, 2), (1.7, false, 3)];
    for dtype in [DType::F32, DType::F64] {
        let tol = if dtype == DType::F64 { 1e-12 } else { 2e-5 };
        for &(n, hd, v) in &shapes {
            for &(temperature, with_entropy, seed) in &cases {
                let h = uniform(n * hd, seed, 4.0);
                let w = uniform(v * hd, seed + 100, 2.0);
                let targets: Vec<u32> = (0..n).map(|i| ((i * 389 + 7) % v) as u32).collect();
                let shape = (n, hd, v);
                let u = run(
                    None,
                    dtype,
                    shape,
                    &h,
                    &w,
                    &targets,
                    temperature,
                    with_entropy,
                );
                for chunk in [1, 7, 64, v - 1, v, 4 * v] {
                    let c = run(
                        Some(chunk),
                        dtype,
                        shape,
                        &h,
                        &w,
                        &targets,
                        temperature,
                        with_entropy,
                    );
                    let ctx = format!(
                        "{dtype:?} shape {shape:?} T {temperature} entropy {with_entropy} chunk {chunk}"
                    );
                    assert_close(&format!("{ctx}: logprob"), &c.lp, &u.lp, tol);
                    if with_entropy {
                        assert_close(
                            &format!("{ctx}: entropy"),
                            c.ent.as_ref().unwrap(),
                            u.ent.as_ref().unwrap(),
                            tol,
                        );
                    }
                    assert_close(&format!("{ctx}: grad h"), &c.gh, &u.gh, tol * 5.0);
                    assert_close(&format!("{ctx}: grad W"), &c.gw, &u.gw, tol * 5.0);
                }
            }
        }
    }
}

#[test]
fn chunked_head_rejects_bad_inputs_and_gets_uniform_logits_right() {
    let dev = Device::Cpu;
    let h = Tensor::zeros((3, 4), DType::F32, &dev).unwrap();
    let w = Tensor::zeros((10, 4), DType::F32, &dev).unwrap();
    let w5 = Tensor::zeros((10, 5), DType::F32, &dev).unwrap();
    assert!(chunked_logprobs(&h, &w, &[0, 1], 1.0, true, 4, false).is_err());
    assert!(chunked_logprobs(&h, &w, &[0, 1, 10], 1.0, true, 4, false).is_err());
    assert!(chunked_logprobs(&h, &w5, &[0, 1, 2], 1.0, true, 4, false).is_err());
    assert!(chunked_logprobs(&h, &w, &[0, 1, 2], 1.0, true, 0, false).is_err());
    // Uniform logits: log-prob −ln V, entropy ln V, at any chunk width.
    for chunk in [1, 3, 10] {
        let (lp, e) = chunked_logprobs(&h, &w, &[0, 5, 9], 1.0, true, chunk, false).unwrap();
        for (a, b) in lp
            .to_vec1::<f32>()
            .unwrap()
            .into_iter()
            .zip(e.unwrap().to_vec1::<f32>().unwrap())
        {
            assert!((a + 10f32.ln()).abs() < 1e-6 && (b - 10f32.ln()).abs() < 1e-6);
        }
    }
    assert_eq!(chunk_width(1000, 151_936, CHUNK_ELEMS), 8388);
    assert_eq!(chunk_width(1, 50, CHUNK_ELEMS), 50);
    assert_eq!(chunk_width(1 << 30, 50, CHUNK_ELEMS), 1);
}

/// The model forced onto the chunked head on the CPU (f32) gives the fused head's log-probs,
/// entropies and gradients of every parameter (a tied fixture: the embedding gets both the
/// lookup's and the head's gradient), also through `token_logprobs_at`.
#[test]
fn forced_chunked_model_head_matches_the_fused_one() {
    let dir = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/qwen2_bias_tied"
    );
    let model = Model::load(std::path::Path::new(dir), DType::F32, &Device::Cpu).unwrap();
    assert!(model.config().tie_word_embeddings && model.var("lm_head.weight").is_none());
    let ids = vec![
        vec![0u32, 0, 5, 9, 30, 17, 4],
        vec![7, 8, 9, 10, 11, 12, 13],
    ];
    let mask = vec![vec![0u32, 0, 1, 1, 1, 1, 1], vec![1; 7]];
    let at = vec![vec![1, 2, 4], vec![0, 1, 2, 3, 4]];
    let pass = |chunked: bool, positions: bool| {
        force_on_cpu(chunked);
        let out = if positions {
            model.token_logprobs_at(&ids, &mask, 1, &at, 0.8, true, true)
        } else {
            model.token_logprobs(&ids, &mask, 1, 0.8, true, true)
        }
        .unwrap();
        force_on_cpu(false);
        let ent = out.entropy.unwrap();
        let loss =
            (out.logprobs.sum_all().unwrap() + (&ent * 0.5).unwrap().sum_all().unwrap()).unwrap();
        let g = loss.backward().unwrap();
        let flat = |t: &Tensor| -> Vec<f64> {
            t.flatten_all()
                .unwrap()
                .to_dtype(DType::F64)
                .unwrap()
                .to_vec1()
                .unwrap()
        };
        let grads: Vec<(String, Vec<f64>)> = model
            .named_vars()
            .into_iter()
            .map(|(n, v)| {
                let gv = g
                    .get(v.as_tensor())
                    .unwrap_or_else(|| panic!("{n}: no gradient"));
                (n, flat(gv))
            })
            .collect();
        (flat(&out.logprobs), flat(&ent), grads)
    };
    for positions in [false, true] {
        let (lf, ef, gf) = pass(false, positions);
        let (lc, ec, gc) = pass(true, positions);
        assert_close("logprobs", &lc, &lf, 2e-5);
        assert_close("entropy", &ec, &ef, 2e-5);
        for ((name, a), (_, b)) in gc.iter().zip(&gf) {
            assert_close(name, a, b, 1e-4);
        }
    }
}
