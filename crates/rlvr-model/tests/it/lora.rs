//! LoRA adapters (`rlvr_model::lora`): a fresh adapter (B = 0) leaves log-probs bit-identical;
//! A's and B's gradients match central finite differences in f64; the base gets no gradient and
//! its bytes do not change under AdamW steps; the adapter-off model equals the base; save/load
//! round-trips PEFT's files; the merged model equals the adapted one.

use candle_core::{DType, Device, Tensor};
use rlvr_model::optim::{AdamW, AdamWConfig};
use rlvr_model::{LoraConfig, LoraTarget, Model, ModelConfig};

fn config(arch: &str, tied: bool) -> ModelConfig {
    ModelConfig::from_json(
        &serde_json::json!({"model_type": arch, "vocab_size": 40, "hidden_size": 16,
            "intermediate_size": 24, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "max_position_embeddings": 64, "head_dim": 4,
            "tie_word_embeddings": tied}),
        "inline".as_ref(),
    )
    .unwrap()
}

fn lora(rank: usize) -> LoraConfig {
    LoraConfig {
        rank,
        alpha: 2.0 * rank as f64,
        targets: LoraTarget::ALL.to_vec(),
        dropout: 0.0,
    }
}

fn batch() -> (Vec<Vec<u32>>, Vec<Vec<u32>>) {
    (
        vec![
            vec![0, 0, 3, 7, 11, 2, 5, 9],
            vec![4, 8, 15, 16, 23, 1, 2, 3],
        ],
        vec![vec![0, 0, 1, 1, 1, 1, 1, 1], vec![1; 8]],
    )
}

/// Log-probs of the batch, flattened to f64.
fn logprobs(m: &Model) -> Vec<f64> {
    let (ids, mask) = batch();
    let out = m.token_logprobs(&ids, &mask, 1, 0.8, false, false).unwrap();
    out.logprobs
        .to_dtype(DType::F64)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap()
}

/// Sets every B to small random values (so A has a gradient and the adapters change outputs).
fn randomise_b(m: &Model, seed: u64) {
    let w: Vec<(String, Tensor)> = m
        .named_vars()
        .into_iter()
        .filter(|(n, _)| n.contains("lora_B"))
        .map(|(n, v)| {
            let k = v.elem_count();
            let x: Vec<f32> = (0..k)
                .map(|i| 0.3 * ((i as u64 * 7 + seed * 13) as f32 * 0.71).sin())
                .collect();
            (n, Tensor::from_vec(x, v.dims(), &Device::Cpu).unwrap())
        })
        .collect();
    m.load_named(&w).unwrap();
}

#[test]
fn fresh_adapters_give_bit_identical_logprobs() {
    for dtype in [DType::F32, DType::BF16] {
        for (arch, tied) in [("qwen2", true), ("qwen3", false), ("llama", false)] {
            let base = Model::random(config(arch, tied), 0.1, 3, dtype, &Device::Cpu).unwrap();
            let mut m = base.clone();
            m.add_lora(&lora(4), 7).unwrap();
            assert_eq!(logprobs(&m), logprobs(&base), "{arch} {dtype:?}");
            // Names and shapes as PEFT writes them; the adapters are f32 over a bf16 base.
            let named = m.named_vars();
            assert_eq!(named.len(), 2 * 7 * 2);
            assert_eq!(
                named[0].0,
                "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
            );
            assert_eq!(named[0].1.dims(), &[4, 16]);
            assert_eq!(
                named[1].0,
                "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"
            );
            assert_eq!(named[1].1.dims(), &[16, 4]);
            assert!(named.iter().all(|(_, v)| v.dtype() == DType::F32));
            // Kaiming-uniform (a = √5): |A| ≤ 1/√in.
            let a: Vec<f32> = named[0]
                .1
                .as_tensor()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap();
            assert!(a.iter().all(|x| x.abs() <= 0.25) && a.iter().any(|x| x.abs() > 0.1));
        }
    }
}

#[test]
fn adapter_off_model_equals_the_base_and_adapters_change_outputs() {
    let base = Model::random(config("qwen2", true), 0.1, 3, DType::F32, &Device::Cpu).unwrap();
    let reference = logprobs(&base);
    let mut m = base.clone();
    m.add_lora(&lora(2), 1).unwrap();
    randomise_b(&m, 1);
    let adapted = logprobs(&m);
    assert!(adapted
        .iter()
        .zip(&reference)
        .any(|(a, b)| (a - b).abs() > 1e-4));
    assert_eq!(logprobs(&m.without_adapters()), reference);
    // try_clone copies the adapters only: the clone shares the base storage.
    let c = m.try_clone().unwrap();
    assert_eq!(logprobs(&c), adapted);
    randomise_b(&c, 2);
    assert_eq!(logprobs(&m), adapted, "the clone's adapters are its own");
    // ... and its base is the same storage: a write to the original's base shows in the clone.
    let (name, w) = m
        .base_vars()
        .into_iter()
        .find(|(n, _)| n.ends_with("q_proj.weight"))
        .unwrap();
    let before = logprobs(&c);
    w.set(&(w.as_tensor() * 1.5).unwrap()).unwrap();
    assert_ne!(logprobs(&c), before, "{name} is shared");
}

/// ∂(Σ w·ℓ)/∂θ for every adapter entry vs central differences, in f64: Qwen3, and Gemma 2 (its
/// frozen, softcapped head: the chunked head's backward without ∂W).
#[test]
fn adapter_gradients_match_finite_differences_in_f64() {
    adapter_gradients("qwen3");
    adapter_gradients("gemma2");
}

fn adapter_gradients(arch: &str) {
    let mut m = Model::random(config(arch, false), 0.2, 5, DType::F64, &Device::Cpu).unwrap();
    if arch == "gemma2" {
        assert_eq!(m.final_logit_softcap(), Some(30.0));
    }
    let cfg = LoraConfig {
        targets: vec![LoraTarget::Q, LoraTarget::V, LoraTarget::Down],
        ..lora(2)
    };
    m.add_lora(&cfg, 9).unwrap();
    let w: Vec<(String, Tensor)> = m
        .named_vars()
        .into_iter()
        .filter(|(n, _)| n.contains("lora_B"))
        .map(|(n, v)| (n, Tensor::randn(0f64, 0.5, v.dims(), &Device::Cpu).unwrap()))
        .collect();
    m.load_named(&w).unwrap();
    let (ids, mask) = batch();
    let loss = |m: &Model, grad: bool| -> Tensor {
        let out = m.token_logprobs(&ids, &mask, 1, 0.8, true, grad).unwrap();
        // Row 0's first scored position is padding (its attention is a constant there: the
        // −1e30 bias absorbs the scores), so it gets weight 0, as in tests/it/gradients.rs.
        let keep: Vec<f64> = (0..12).map(|i| if i == 0 { 0.0 } else { 1.0 }).collect();
        let wts: Vec<f64> = (0..12).map(|i| keep[i] * (i as f64 * 0.37).sin()).collect();
        let wts = Tensor::from_vec(wts, (2, 6), &Device::Cpu).unwrap();
        let keep = Tensor::from_vec(keep, (2, 6), &Device::Cpu).unwrap();
        ((out.logprobs * &wts).unwrap().sum_all().unwrap()
            + (out.entropy.unwrap() * &keep).unwrap().sum_all().unwrap())
        .unwrap()
    };
    let grads = loss(&m, true).backward().unwrap();
    for (_, v) in m.base_vars() {
        assert!(
            grads.get(v.as_tensor()).is_none(),
            "the base gets no gradient"
        );
    }
    let h = 1e-6;
    for (name, v) in m.named_vars() {
        let g: Vec<f64> = grads
            .get(v.as_tensor())
            .unwrap_or_else(|| panic!("{name} has a gradient"))
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        let x0: Vec<f64> = v.as_tensor().flatten_all().unwrap().to_vec1().unwrap();
        for i in (0..x0.len()).step_by(5) {
            let at = |d: f64| {
                let mut x = x0.clone();
                x[i] += d;
                v.set(&Tensor::from_vec(x, v.dims(), &Device::Cpu).unwrap())
                    .unwrap();
                let l: f64 = loss(&m, false).to_scalar().unwrap();
                l
            };
            let fd = (at(h) - at(-h)) / (2.0 * h);
            at(0.0);
            assert!(
                (fd - g[i]).abs() <= 1e-6 * (1.0 + fd.abs()),
                "{arch} {name}[{i}]: autograd {} vs finite difference {fd}",
                g[i]
            );
        }
    }
}

#[test]
fn adamw_steps_move_the_adapters_and_leave_the_base_bytes_unchanged() {
    for dtype in [DType::F32, DType::BF16] {
        let mut m = Model::random(config("llama", false), 0.1, 3, dtype, &Device::Cpu).unwrap();
        let before: Vec<Vec<u8>> = m
            .base_vars()
            .iter()
            .map(|(_, v)| bytes(v.as_tensor()))
            .collect();
        m.add_lora(&lora(4), 1).unwrap();
        let vars: Vec<_> = m.named_vars().into_iter().map(|(_, v)| v.clone()).collect();
        let mut opt = AdamW::new(
            vars,
            AdamWConfig {
                lr: 1e-2,
                ..Default::default()
            },
        )
        .unwrap();
        assert!(
            opt.masters().iter().all(Option::is_none),
            "no masters for f32 adapters"
        );
        let (ids, mask) = batch();
        let lp0 = logprobs(&m);
        for _ in 0..3 {
            let out = m.token_logprobs(&ids, &mask, 1, 1.0, false, true).unwrap();
            let g = out
                .logprobs
                .sum_all()
                .unwrap()
                .neg()
                .unwrap()
                .backward()
                .unwrap();
            opt.step(&g, 1e-2).unwrap();
        }
        let after: Vec<Vec<u8>> = m
            .base_vars()
            .iter()
            .map(|(_, v)| bytes(v.as_tensor()))
            .collect();
        assert_eq!(before, after, "{dtype:?}: base bytes unchanged");
        let lp1 = logprobs(&m);
        let sum = |v: &[f64]| v.iter().sum::<f64>();
        assert!(sum(&lp1) > sum(&lp0), "{dtype:?}: the adapters learn");
    }
}

fn bytes(t: &Tensor) -> Vec<u8> {
    let t = t.flatten_all().unwrap();
    match t.dtype() {
        DType::BF16 => t
            .to_vec1::<half::bf16>()
            .unwrap()
            .iter()
            .flat_map(|x| x.to_bits().to_le_bytes())
            .collect(),
        _ => t
            .to_dtype(DType::F32)
            .unwrap()
            .to_vec1::<f32>()
            .unwrap()
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect(),
    }
}

#[test]
fn saved_adapters_load_back_and_merge_to_the_same_model() {
    let dir = tempfile::tempdir().unwrap();
    let base_dir = dir.path().join("base");
    let base = Model::random(config("qwen2", true), 0.1, 3, DType::F32, &Device::Cpu).unwrap();
    base.save(&base_dir, DType::F32).unwrap();
    let mut m = Model::load(&base_dir, DType::F32, &Device::Cpu).unwrap();
    let cfg = LoraConfig {
        targets: vec![LoraTarget::Q, LoraTarget::K, LoraTarget::Up],
        alpha: 3.0,
        ..lora(3)
    };
    m.add_lora(&cfg, 4).unwrap();
    randomise_b(&m, 3);
    let ckpt = dir.path().join("ckpt");
    m.save(&ckpt, DType::F32).unwrap();
    assert!(
        !ckpt.join("model.safetensors").exists(),
        "the base is referenced"
    );
    let acfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(ckpt.join("adapter/adapter_config.json")).unwrap())
            .unwrap();
    assert_eq!(acfg["peft_type"], "LORA");
    assert_eq!(acfg["task_type"], "CAUSAL_LM");
    assert_eq!(acfg["r"], 3);
    assert_eq!(acfg["lora_alpha"], 3);
    assert_eq!(acfg["bias"], "none");
    assert_eq!(
        acfg["target_modules"],
        serde_json::json!(["q_proj", "k_proj", "up_proj"])
    );
    assert_eq!(
        acfg["base_model_name_or_path"],
        std::fs::canonicalize(&base_dir)
            .unwrap()
            .display()
            .to_string()
    );
    let back = Model::load(&ckpt, DType::F32, &Device::Cpu).unwrap();
    assert_eq!(back.lora_config(), Some(&cfg));
    assert_eq!(logprobs(&back), logprobs(&m));
    let merged = m.merged().unwrap();
    assert!(merged.lora_config().is_none());
    for (a, b) in logprobs(&merged).iter().zip(logprobs(&m)) {
        assert!((a - b).abs() < 1e-5, "merged {a} vs adapted {b}");
    }
    // A random base (no directory) is written beside the adapter.
    let mut r = base.clone();
    r.add_lora(&cfg, 4).unwrap();
    randomise_b(&r, 5);
    let own = dir.path().join("own");
    r.save(&own, DType::F32).unwrap();
    assert_eq!(
        logprobs(&Model::load(&own, DType::F32, &Device::Cpu).unwrap()),
        logprobs(&r)
    );
}

#[test]
fn invalid_settings_are_refused_with_the_reason() {
    let mut m = Model::random(config("qwen2", true), 0.1, 3, DType::F32, &Device::Cpu).unwrap();
    let e = m.add_lora(&lora(0), 0).unwrap_err().to_string();
    assert!(e.contains("rank"), "{e}");
    let e = m
        .add_lora(
            &LoraConfig {
                dropout: 1.0,
                ..lora(2)
            },
            0,
        )
        .unwrap_err()
        .to_string();
    assert!(e.contains("dropout"), "{e}");
    let e = "fc1".parse::<LoraTarget>().unwrap_err();
    assert!(e.contains("valid: q, k, v"), "{e}");
    assert_eq!("gate_proj".parse::<LoraTarget>(), Ok(LoraTarget::Gate));
}
