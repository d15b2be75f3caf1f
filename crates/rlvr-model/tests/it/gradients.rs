//! The training forward is differentiable end to end: every parameter receives a non-zero gradient
//! (candle-nn's fused ops would silently cut the graph: DESIGN.md section 7), and autograd agrees
//! with central finite differences in f64.

use candle_core::{DType, Device, Tensor, Var};
use rlvr_model::{Arch, Model, ModelConfig};

fn tiny(arch: Arch, tied: bool) -> ModelConfig {
    ModelConfig {
        arch,
        vocab_size: 40,
        hidden_size: 16,
        intermediate_size: 24,
        num_hidden_layers: 2,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        head_dim: if arch == Arch::Qwen3 { 8 } else { 4 },
        rms_norm_eps: 1e-6,
        rope_theta: 10000.0,
        rope_scaling: if arch == Arch::Llama {
            Some(rlvr_model::RopeScaling::Llama3 {
                factor: 8.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position_embeddings: 8.0,
            })
        } else {
            None
        },
        max_position_embeddings: 128,
        sliding_window: None,
        tie_word_embeddings: tied,
        qkv_bias: arch == Arch::Qwen2,
        o_bias: false,
        mlp_bias: false,
        stored_dtype: None,
        bos_token_id: None,
        eos_token_ids: vec![],
        gemma: rlvr_model::GemmaConfig::defaults_for(arch, if arch == Arch::Qwen3 { 8 } else { 4 }),
        partial_rotary_factor: 1.0,
    }
}

/// Perturbs norms and biases away from their 1/0 init so their gradients are generic.
fn randomise(model: &Model, seed: u64) {
    let mut s = seed;
    for (_, v) in model.named_vars() {
        let t = v.as_tensor();
        let n = t.elem_count();
        let data: Vec<f64> = (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((s >> 11) as f64 / (1u64 << 53) as f64 - 0.5) * 0.8
            })
            .collect();
        let noise = Tensor::from_vec(data, t.shape(), t.device())
            .unwrap()
            .to_dtype(t.dtype())
            .unwrap();
        v.set(&(t + noise).unwrap()).unwrap();
    }
}

fn batch() -> (Vec<Vec<u32>>, Vec<Vec<u32>>) {
    (
        vec![
            vec![0, 0, 3, 7, 11, 2, 39, 5],
            vec![1, 4, 9, 16, 25, 36, 8, 10],
            vec![12, 13, 14, 15, 0, 0, 0, 0],
        ],
        vec![
            vec![0, 0, 1, 1, 1, 1, 1, 1],
            vec![1, 1, 1, 1, 1, 1, 1, 1],
            vec![1, 1, 1, 1, 0, 0, 0, 0],
        ],
    )
}

/// A scalar loss mixing log-probs and entropy over real next-token positions:
/// Σ_t m_t · (w_t·ℓ_t + 0.1·H_t), with fixed weights w_t of both signs.
fn loss(model: &Model, temperature: f64) -> Tensor {
    let (ids, mask) = batch();
    let out = model
        .token_logprobs(&ids, &mask, 1, temperature, true, true)
        .unwrap();
    let n = out.logprobs.dim(1).unwrap();
    let dt = out.logprobs.dtype();
    let mut m = vec![];
    for (b, row) in mask.iter().enumerate() {
        for t in 0..n {
            let pos = t + 1;
            let keep = row[pos] == 1 && row[pos + 1] == 1;
            let w = ((b * 7 + t * 3) % 5) as f64 - 2.0;
            m.push(if keep { w } else { 0.0 });
        }
    }
    let wts = Tensor::from_vec(m, (ids.len(), n), &Device::Cpu)
        .unwrap()
        .to_dtype(dt)
        .unwrap();
    let ent = out.entropy.unwrap();
    let mask_t = wts.ne(0.0).unwrap().to_dtype(dt).unwrap();
    ((out.logprobs * &wts).unwrap().sum_all().unwrap()
        + (ent * mask_t).unwrap().sum_all().unwrap() * 0.1)
        .unwrap()
}

#[test]
fn every_parameter_receives_a_nonzero_gradient() {
    for (arch, tied) in [
        (Arch::Qwen2, true),
        (Arch::Qwen3, true),
        (Arch::Llama, false),
    ] {
        let model = Model::random(tiny(arch, tied), 0.3, 1, DType::F32, &Device::Cpu).unwrap();
        randomise(&model, 7);
        let grads = loss(&model, 0.9).backward().unwrap();
        let vars = model.named_vars();
        assert!(vars.len() >= 2 + 2 * 9);
        for (name, v) in vars {
            let g = grads
                .get(v.as_tensor())
                .unwrap_or_else(|| panic!("{arch:?}: no gradient for {name}"));
            let norm: f32 = g.sqr().unwrap().sum_all().unwrap().to_scalar().unwrap();
            assert!(
                norm > 0.0 && norm.is_finite(),
                "{arch:?}: {name} grad norm {norm}"
            );
        }
    }
}

#[test]
fn autograd_matches_finite_differences_in_f64() {
    for (arch, tied) in [
        (Arch::Qwen2, true),
        (Arch::Qwen3, true),
        (Arch::Llama, false),
    ] {
        finite_differences(tiny(arch, tied), &format!("{arch:?}"));
    }
}

/// Sliding-window models (the batch's rows of 4 to 8 tokens through a 3-token window): Mistral
/// with the window on both layers, Qwen2 with YaRN and the window on layer 1 only. Every
/// parameter gets a gradient and autograd agrees with finite differences.
#[test]
fn window_models_match_finite_differences_in_f64() {
    let window = |layers: Vec<bool>| Some(rlvr_model::SlidingWindow { size: 3, layers });
    let mut mistral = tiny(Arch::Mistral, false);
    mistral.sliding_window = window(vec![true, true]);
    let mut qwen2 = tiny(Arch::Qwen2, true);
    qwen2.rope_scaling = Some(rlvr_model::RopeScaling::Yarn {
        factor: 4.0,
        original_max_position_embeddings: 4.0,
        beta_fast: 32.0,
        beta_slow: 1.0,
        attention_factor: None,
        mscale: 0.0,
        mscale_all_dim: 0.0,
        truncate: true,
    });
    qwen2.sliding_window = window(vec![false, true]);
    for (what, cfg) in [("mistral window", mistral), ("qwen2 yarn window", qwen2)] {
        let model = Model::random(cfg.clone(), 0.3, 1, DType::F32, &Device::Cpu).unwrap();
        randomise(&model, 7);
        let grads = loss(&model, 0.9).backward().unwrap();
        for (name, v) in model.named_vars() {
            let norm: f32 = (grads.get(v.as_tensor()))
                .unwrap_or_else(|| panic!("{what}: no gradient for {name}"))
                .sqr()
                .unwrap()
                .sum_all()
                .unwrap()
                .to_scalar()
                .unwrap();
            assert!(norm > 0.0 && norm.is_finite(), "{what}: {name} {norm}");
        }
        finite_differences(cfg, what);
    }
}

/// Gemma 2 (attention softcap 1, final softcap 2, both bending tanh at these activations; a
/// 3-token window on layer 0) and Gemma 3 (q/k norms, a local rotary base on its windowed layer 1,
/// linear scaling on the global one): every parameter gets a gradient, autograd agrees with
/// finite differences (through the chunked head's hand-written softcapped backward, as the CPU
/// runs a softcapped model's head), and the same holds with the fused CPU head forced off.
#[test]
fn gemma_models_match_finite_differences_in_f64() {
    let window = |layers: Vec<bool>| Some(rlvr_model::SlidingWindow { size: 3, layers });
    let mut g2 = tiny(Arch::Gemma2, true);
    g2.sliding_window = window(vec![true, false]);
    let g = g2.gemma.as_mut().unwrap();
    g.attn_logit_softcapping = Some(1.0);
    g.final_logit_softcapping = Some(2.0);
    g.query_pre_attn_scalar = 6.0;
    let mut g3 = tiny(Arch::Gemma3, false);
    g3.sliding_window = window(vec![false, true]);
    g3.rope_scaling = Some(rlvr_model::RopeScaling::Linear { factor: 4.0 });
    for (what, cfg) in [("gemma2", g2), ("gemma3", g3)] {
        let model = Model::random(cfg.clone(), 0.3, 1, DType::F32, &Device::Cpu).unwrap();
        randomise(&model, 7);
        let grads = loss(&model, 0.9).backward().unwrap();
        assert!(model.named_vars().len() >= 2 + 2 * 11, "{what}");
        for (name, v) in model.named_vars() {
            let norm: f32 = (grads.get(v.as_tensor()))
                .unwrap_or_else(|| panic!("{what}: no gradient for {name}"))
                .sqr()
                .unwrap()
                .sum_all()
                .unwrap()
                .to_scalar()
                .unwrap();
            assert!(norm > 0.0 && norm.is_finite(), "{what}: {name} {norm}");
        }
        finite_differences(cfg, what);
    }
}

/// Autograd against central finite differences in f64, two coordinates per parameter tensor.
fn finite_differences(cfg: ModelConfig, what: &str) {
    {
        let model = Model::random(cfg, 0.3, 2, DType::F64, &Device::Cpu).unwrap();
        randomise(&model, 11);
        let grads = loss(&model, 0.7).backward().unwrap();
        let vars: Vec<(String, Var)> = model
            .named_vars()
            .into_iter()
            .map(|(n, v)| (n, v.clone()))
            .collect();
        let mut checked = 0;
        for (vi, (name, v)) in vars.iter().enumerate() {
            let g: Vec<f64> = grads
                .get(v.as_tensor())
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap();
            let base: Vec<f64> = v.as_tensor().flatten_all().unwrap().to_vec1().unwrap();
            // Two coordinates per parameter tensor, chosen deterministically.
            for k in 0..2 {
                let i = (vi * 31 + k * 17) % base.len();
                let h = 1e-5;
                let eval = |delta: f64| -> f64 {
                    let mut p = base.clone();
                    p[i] += delta;
                    v.set(&Tensor::from_vec(p, v.as_tensor().shape(), &Device::Cpu).unwrap())
                        .unwrap();
                    let l: f64 = loss(&model, 0.7).to_scalar().unwrap();
                    l
                };
                let fd = (eval(h) - eval(-h)) / (2.0 * h);
                v.set(
                    &Tensor::from_vec(base.clone(), v.as_tensor().shape(), &Device::Cpu).unwrap(),
                )
                .unwrap();
                let err = (fd - g[i]).abs();
                assert!(
                    err <= 1e-6 + 1e-5 * fd.abs(),
                    "{what} {name}[{i}]: autograd {} vs finite difference {fd}",
                    g[i]
                );
                checked += 1;
            }
        }
        assert!(checked >= 40);
    }
}

/// Largest |a − b| between the plain (`g0`) and checkpointed (`g1`) gradients of `var`, and the
/// largest |a| (in f64); panics naming `name` when either gradient is missing.
fn gradient_gap(
    g0: &candle_core::backprop::GradStore,
    g1: &candle_core::backprop::GradStore,
    var: &Var,
    name: &str,
) -> (f64, f64) {
    let host = |g: &candle_core::backprop::GradStore, which: &str| -> Vec<f64> {
        g.get(var)
            .unwrap_or_else(|| panic!("{name}: no {which} gradient"))
            .to_dtype(DType::F64)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap()
    };
    let (a, b) = (host(g0, "plain"), host(g1, "checkpointed"));
    let scale = a.iter().fold(0f64, |m, x| m.max(x.abs()));
    let worst = a
        .iter()
        .zip(&b)
        .fold(0f64, |m, (x, y)| m.max((x - y).abs()));
    (worst, scale)
}

/// Activation checkpointing changes where the activations live, not the math: the
/// loss and every parameter's gradient equal the plain path's (f64: to 1e-12 relative; f32: 1e-5),
/// on all three architectures, and a loss that never reaches a checkpointed layer (scoring without
/// a graph) is unaffected. Gradients come from `rlvr_model::recompute::backward`, which a plain
/// `Tensor::backward` would miss for the layers' weights: that is checked too.
#[test]
fn gradient_checkpointing_gives_the_plain_gradients() {
    for (dtype, tol) in [(DType::F64, 1e-12), (DType::F32, 1e-5)] {
        for (arch, tied) in [
            (Arch::Qwen2, true),
            (Arch::Qwen3, true),
            (Arch::Llama, false),
        ] {
            let mut model = Model::random(tiny(arch, tied), 0.3, 3, dtype, &Device::Cpu).unwrap();
            randomise(&model, 11);
            let l0 = loss(&model, 0.8);
            let g0 = rlvr_model::recompute::backward(&l0).unwrap();
            model.set_gradient_checkpointing(true);
            assert!(model.gradient_checkpointing());
            let l1 = loss(&model, 0.8);
            let v = |t: &Tensor| t.to_dtype(DType::F64).unwrap().to_scalar::<f64>().unwrap();
            assert!((v(&l0) - v(&l1)).abs() <= tol * v(&l0).abs().max(1.0));
            // A plain backward sees no layer weight through the checkpointed forward.
            let plain = loss(&model, 0.8).backward().unwrap();
            assert!(plain
                .get(model.var("model.layers.0.mlp.up_proj.weight").unwrap())
                .is_none());
            let g1 = rlvr_model::recompute::backward(&l1).unwrap();
            for (name, var) in model.named_vars() {
                let (worst, scale) = gradient_gap(&g0, &g1, var, &name);
                let scale = scale.max(1e-30);
                assert!(
                    worst <= tol * scale,
                    "{arch:?} {dtype:?} {name}: worst {worst:e} of {scale:e}"
                );
            }
        }
    }
}

/// With LoRA adapters (frozen base, so the first layer's input carries no graph) activation
/// checkpointing still gives the adapters the plain path's gradients.
#[test]
fn gradient_checkpointing_with_lora_adapters() {
    for (arch, tied) in [(Arch::Qwen2, true), (Arch::Llama, false)] {
        let mut model = Model::random(tiny(arch, tied), 0.3, 4, DType::F64, &Device::Cpu).unwrap();
        let lora = rlvr_model::LoraConfig {
            rank: 2,
            alpha: 4.0,
            targets: rlvr_model::LoraTarget::ALL.to_vec(),
            dropout: 0.0,
        };
        model.add_lora(&lora, 5).unwrap();
        randomise(&model, 13); // the adapters (B non-zero): named_vars lists only them now
        let g0 = rlvr_model::recompute::backward(&loss(&model, 1.0)).unwrap();
        model.set_gradient_checkpointing(true);
        let g1 = rlvr_model::recompute::backward(&loss(&model, 1.0)).unwrap();
        let vars = model.named_vars();
        assert_eq!(
            vars.len(),
            2 * 7 * 2,
            "A and B of 7 projections in 2 layers"
        );
        for (name, var) in vars {
            let (worst, scale) = gradient_gap(&g0, &g1, var, &name);
            assert!(scale > 0.0, "{name}");
            assert!(
                worst <= 1e-12 * scale,
                "{arch:?} {name}: {worst:e} of {scale:e}"
            );
        }
    }
}

/// LoRA dropout under activation checkpointing: the checkpointed layer's first pass (no graph) and
/// its recompute in the backward use the same masks, so loss and adapter gradients equal the plain
/// path's in the same round; masks are a function of the round (a second forward in the same round
/// draws the same ones, the next round new ones: `set_lora_dropout_round`).
#[test]
fn lora_dropout_masks_agree_between_checkpointed_passes() {
    let mut model =
        Model::random(tiny(Arch::Qwen2, true), 0.3, 4, DType::F64, &Device::Cpu).unwrap();
    let lora = rlvr_model::LoraConfig {
        rank: 2,
        alpha: 4.0,
        targets: rlvr_model::LoraTarget::ALL.to_vec(),
        dropout: 0.3,
    };
    model.add_lora(&lora, 5).unwrap();
    randomise(&model, 13);
    let scalar = |t: &Tensor| t.to_scalar::<f64>().unwrap();
    assert_eq!(model.lora_dropout_round(), Some(0));
    let l0 = loss(&model, 1.0);
    let g0 = rlvr_model::recompute::backward(&l0).unwrap();
    assert_eq!(
        model.lora_dropout_round(),
        Some(0),
        "a forward moved the round"
    );
    assert_eq!(
        scalar(&loss(&model, 1.0)),
        scalar(&l0),
        "same round, other masks"
    );
    model.set_lora_dropout_round(1);
    let l_next = loss(&model, 1.0);
    assert_ne!(
        scalar(&l0),
        scalar(&l_next),
        "the next round drew the same masks"
    );
    let no_dropout = {
        let mut m =
            Model::random(tiny(Arch::Qwen2, true), 0.3, 4, DType::F64, &Device::Cpu).unwrap();
        m.add_lora(
            &rlvr_model::LoraConfig {
                dropout: 0.0,
                ..lora.clone()
            },
            5,
        )
        .unwrap();
        randomise(&m, 13);
        scalar(&loss(&m, 1.0))
    };
    assert_ne!(scalar(&l0), no_dropout, "dropout changed nothing");

    model.set_lora_dropout_round(0);
    model.set_gradient_checkpointing(true);
    let l1 = loss(&model, 1.0);
    let g1 = rlvr_model::recompute::backward(&l1).unwrap();
    assert!(
        (scalar(&l0) - scalar(&l1)).abs() <= 1e-12 * scalar(&l0).abs(),
        "loss {} vs {}",
        scalar(&l0),
        scalar(&l1)
    );
    for (name, var) in model.named_vars() {
        let (worst, scale) = gradient_gap(&g0, &g1, var, &name);
        assert!(scale > 0.0, "{name}");
        assert!(worst <= 1e-12 * scale, "{name}: {worst:e} of {scale:e}");
    }
}

/// What the backward's store holds besides the weights' gradients stays small: candle gives
/// every operand of a binary op a gradient, also a constant one (the attention's mask and row
/// maxima, the rotary cos/sin rows), at the op's full shape, and kept it until the backward
/// ended, one `[B, heads, T, T]` f32 tensor per mask and per row maximum per layer
/// (`rlvr_model::ops::constant_operand` makes them leaf variables, whose gradients are summed
/// down to their own shape). Here, 2 rows of 24 tokens through 2 layers of 4 heads: none of the
/// other gradients is as large as one layer's scores (4 · 24 · 24 per row), and together they are
/// below three masks (24 · 24 per row) a layer (before: two of the scores' size a layer, 8 masks);
/// the unshared and the shared-prefix paths alike.
#[test]
fn the_backward_keeps_no_full_size_gradient_of_a_constant() {
    let model = Model::random(tiny(Arch::Qwen2, true), 0.02, 3, DType::F32, &Device::Cpu).unwrap();
    let weights: std::collections::HashSet<_> = model
        .named_vars()
        .into_iter()
        .map(|(_, v)| v.as_tensor().id())
        .collect();
    let (rows, t) = (2usize, 24usize);
    let ids: Vec<Vec<u32>> = (0..rows)
        .map(|r| (0..t).map(|j| ((r * 7 + j * 3) % 40) as u32).collect())
        .collect();
    let mask = vec![vec![1u32; t]; rows];
    let out = model
        .token_logprobs(&ids, &mask, 0, 1.0, true, true)
        .unwrap();
    let shared = model
        .shared_prefix_logprobs_rows(
            &[
                (&ids[0][..16], &ids[0][16..]),
                (&ids[0][..16], &ids[1][16..]),
            ],
            1.0,
            true,
            true,
        )
        .unwrap();
    for (name, lp) in [("unshared", out.logprobs), ("shared", shared.logprobs)] {
        let grads = lp.sum_all().unwrap().backward().unwrap();
        let others: Vec<usize> = grads
            .get_ids()
            .filter(|id| !weights.contains(id))
            .map(|id| grads.get_id(*id).unwrap().elem_count())
            .collect();
        let scores = rows * 4 * t * t;
        assert!(
            others.iter().all(|&n| n < scores),
            "{name}: a gradient of a constant at the scores' size: {others:?}"
        );
        let total: usize = others.iter().sum();
        assert!(
            total < 3 * 2 * rows * t * t,
            "{name}: {total} elements of constants' gradients: {others:?}"
        );
    }
}
